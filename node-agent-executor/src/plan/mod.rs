//! The acting plan, pure: from a decision to actions, as data, and what the plan remembers
//! about acting (the evictions in flight, pods not evictable now, the pacing, what was last
//! reported); each outcome the executor reports comes back through [`Acting::reported`] and
//! [`Acting::reclaimed`]. Time is always the caller's `now`.
//!
//! Node-level reclaim goes before an eviction for a disk signal, as the kubelet's
//! `reclaimNodeLevelResources` does: when the signal being reclaimed has node-level reclaim
//! functions (by filesystem layout), the plan hands a [`Reclaim`] action to the executor and
//! holds every eviction for a disk signal until its outcome is back and the loop has observed
//! the node again; from then on, until `interval` has passed, the pods are ranked and evicted as
//! before. So at most one reclaim runs per `interval` (the kubelet: once per synchronize). An
//! eviction for memory or PIDs never waits for the runtime: a hung runtime must not delay it
//! (the kubelet would not be reclaiming disk while memory is the signal to reclaim either).
//!
//! Evictions go on three tracks that never wait for one another ([`Track`]).
//! - [`Track::Node`]: a hard memory or PID threshold's eviction, carried out on the node (the
//!   pod killed at once, as the kubelet does; its record written through the API after): one
//!   at a time, in flight until the killed pod's memory is back (its working set collapsed,
//!   or its cgroup gone: as for an urgent eviction through the API, below), then the next may
//!   go at once if the node, read anew, still needs one: never on a reading from before the
//!   memory came back, which would evict a second pod for the same pressure. No pacing
//!   token: a hard threshold is never held behind a token bucket. The killed pod is not
//!   evictable again while it settles ([`KILL_SETTLE`]) or while its cgroup holds no process
//!   ([`Acting::eligibility`]): a pod the kubelet restarted in place can be chosen again.
//! - [`Track::Threshold`]: any other threshold's eviction, through the API: one at a time, in
//!   flight from the moment it is handed to the executor until its outcome says nothing is
//!   going (refused, blocked, failed), or until it is done: the pod's cgroup gone (the
//!   kubelet's wait for pod cleanup), or for a hard memory or PID threshold the pod's memory
//!   freed (its working set collapsed: the next victim need not wait for the cleanup), or
//!   `eviction_wait_timeout` passed. Each takes a token of the pacing
//!   ([`pacing::TokenBucket`]) except a hard memory or PID one; without one the plan holds it
//!   and says until when ([`Acting::paced_until`]).
//! - [`Track::LocalStorage`]: every pod over a local storage limit goes as soon as it is seen,
//!   as the kubelet's `localStorageEviction` evicts them all in one synchronize: no token, each
//!   pod in flight on its own, at most [`LOCAL_STORAGE_IN_FLIGHT`] at once (so the executor's
//!   lane, [`crate::EVICTION_CAPACITY`], always has room for the threshold's).
//!
//! A pod in flight is not evictable now ([`NotEvictableNow::Evicting`]) for any track. The API
//! server's own `Retry-After` holds the two API tracks.

#[cfg(test)]
mod node_tests;
mod oom;
mod pacing;
#[cfg(test)]
mod reclaim_tests;
#[cfg(test)]
mod tests;

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    path::{Path, PathBuf},
    time::Duration,
};

use node_agent_cri::reclaim::{reclaim_kinds, FsLayout, PodPhase, PodStates};
use node_agent_kube::{
    config::{KubeConfig, NodeOomEvents},
    events::OomKill,
    evict::EvictionResult,
};
use node_agent_policy::{
    Decision, Eligibility, Eviction, EvictionSignal, NodeCondition, NotEvictableNow, PassedOver,
    PodInfo, Signal, StorageLimit,
};

pub use oom::{OomSeries, FLUSH_EVERY, SERIES_WINDOW};

/// Evictions for local storage limits out at once, at most: half the executor's lane, the
/// rest room for the threshold's (and what the lane may still be finishing).
pub const LOCAL_STORAGE_IN_FLIGHT: usize = crate::EVICTION_CAPACITY / 2;
const _: () = assert!(
    LOCAL_STORAGE_IN_FLIGHT < crate::EVICTION_CAPACITY,
    "the lane must keep room for the threshold's eviction"
);

/// A pod killed on the node is not chosen again for this long, whatever its cgroup holds:
/// processes with SIGKILL pending are still listed there until they have exited, and the
/// kubelet starts a pod again in place no sooner than its next relist (1 s).
pub const KILL_SETTLE: Duration = Duration::from_secs(1);

/// After the executor's lane shed an eviction (full), it is tried again this much later: soon,
/// as nothing was attempted, but not in a spin while the lane drains.
pub const SHED_RETRY: Duration = Duration::from_millis(250);

/// The tracks evictions go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Track {
    /// A hard memory or PID threshold, carried out on the node: one at a time, unpaced.
    Node,
    /// Any other threshold, through the API: one at a time, paced unless urgent.
    Threshold,
    /// A local storage limit: every pod over one at once.
    LocalStorage,
}

impl Track {
    /// The track of `eviction`; `node_kill`: hard memory and PID evictions are carried out on
    /// the node.
    pub fn of(eviction: &Eviction, node_kill: bool) -> Self {
        match eviction.signal.threshold() {
            None => Self::LocalStorage,
            Some(_) if node_kill && urgent(eviction) => Self::Node,
            Some(_) => Self::Threshold,
        }
    }
}

/// A hard memory or PID threshold's eviction: the node is near the OOM killer or out of PIDs,
/// so it is never paced, and the next one may go once the pod's memory is freed.
pub fn urgent(eviction: &Eviction) -> bool {
    eviction.hard
        && eviction
            .signal
            .threshold()
            .is_some_and(|s| s.is_memory() || s == Signal::PidAvailable)
}

/// A pod's cgroup as the loop found it: its directory and its id, which a kill verifies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodCgroup {
    pub path: PathBuf,
    pub id: u64,
}

/// What the plan asks of the node's cgroups, which the loop reads for it (the plan does no
/// I/O).
pub trait Cgroups {
    fn exists(&self, cgroup: &Path) -> bool;
    /// The cgroup's working set now, `None` when it cannot be read (gone).
    fn working_set(&self, cgroup: &Path) -> Option<u64>;
    /// The cgroup, or one below it, holds a process.
    fn has_processes(&self, cgroup: &Path) -> bool;
}

/// An urgent eviction's pod has freed its memory once its working set is at most this part of
/// what it was when it was chosen (the kubelet waits for the pod's cleanup; the memory is back
/// long before).
pub const FREED_FRACTION: u64 = 10;
pub use pacing::TokenBucket;

use crate::{
    action::{Action, Evict, Kill, NodeEvent, Report},
    kill::KillTarget,
    reclaim::Reclaim,
};

/// The actions for a kernel OOM kill: a node event under the agent's own reason, naming the
/// process and its pod, unless `kubernetes.nodeOOMEvents: off` leaves kills to
/// node-problem-detector. (Standalone, the executor only logs it.)
pub fn oom_kill_actions(kube: Option<&KubeConfig>, kill: OomKill) -> Vec<Action> {
    match kube.map_or(NodeOomEvents::Own, |k| k.node_oom_events) {
        NodeOomEvents::Own => vec![Action::NodeEvent(NodeEvent::OomKill(kill))],
        NodeOomEvents::Off => Vec::new(),
    }
}

/// How long outcomes hold; from the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// A pod blocked by its disruption budget or refused is passed over this long.
    pub pass_over: Duration,
    /// After an eviction, the wait for the pod's cgroup to go.
    pub wait_timeout: Duration,
    /// A pod whose attempt failed is passed over until the next attempt may go (one pacing
    /// interval), as the kubelet moves on to the next pod within one pass.
    pub failed: Duration,
}

/// An eviction in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlight {
    pub pod_id: String,
    /// `namespace/name`, as it is shown.
    pub pod: String,
    pub signal: EvictionSignal,
    pub track: Track,
    /// Done once the pod's memory is freed, not only once its cgroup is gone ([`urgent`]).
    pub urgent: bool,
    /// The pod's working set when it was chosen.
    pub working_set: Option<u64>,
    pub since: Duration,
    /// The pod's cgroup, to see it go.
    pub cgroup: Option<PathBuf>,
    /// Set once the executor said the pod goes: wait until its cgroup is gone or until then.
    pub going_until: Option<Duration>,
}

/// Node-level reclaim, when a container runtime is configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeReclaim {
    /// Where images and writable layers live relative to `nodefs`.
    pub layout: FsLayout,
    /// At most one reclaim per this long (the resync interval: the kubelet's synchronize).
    pub interval: Duration,
}

/// The reclaim in flight and when the last one was handed over or ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct ReclaimState {
    in_flight: Option<Signal>,
    last: Option<Duration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hold {
    reason: NotEvictableNow,
    /// `None`: for as long as the pod source lists the pod.
    until: Option<Duration>,
}

/// Evictions per minute and the burst allowed (`evictionsPerMinute`, `evictionBurst`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rates {
    pub per_minute: u32,
    pub burst: u32,
}

/// Something for the loop to log or count.
#[derive(Debug, Clone, PartialEq)]
pub enum Note {
    /// Thresholds met or node conditions changed.
    Pressure {
        met: BTreeSet<Signal>,
        conditions: Vec<NodeCondition>,
    },
    /// A threshold is past its grace period and no pod may be evicted for it (entered, or the
    /// signal changed).
    NoEvictablePod {
        signal: Signal,
        passed_over: Vec<PassedOver>,
    },
    /// A pod may be evicted again, or no threshold needs one any more.
    EvictablePodAgain,
    /// A decision to evict, or a threshold past its grace period, was not acted on: the pod
    /// data is stale or not read yet (every time). Blind, the agent cannot say whether a pod
    /// may go: an earlier [`Note::NoEvictablePod`] no longer holds.
    Stale,
    /// A decision to evict is held by the pacing until `until` (once per wait).
    Paced {
        signal: EvictionSignal,
        until: Duration,
    },
    /// The pods over a local storage limit that may not be evicted (critical, excluded, not
    /// evictable now) changed; empty when none is left.
    OverLimitKept(Vec<(PassedOver, StorageLimit)>),
}

/// The actions to hand to the executor and the notes for the loop.
#[derive(Debug, Default)]
pub struct Plan {
    pub actions: Vec<Action>,
    pub notes: Vec<Note>,
}

#[derive(Debug, Default)]
pub struct Acting {
    /// By pod id.
    in_flight: BTreeMap<String, InFlight>,
    holds: BTreeMap<String, Hold>,
    /// Hard memory and PID evictions are carried out on the node ([`Track::Node`]).
    node_kill: bool,
    /// Pods killed on the node, by pod id, with their cgroup and when: not evictable again
    /// for [`KILL_SETTLE`], nor while it holds no process.
    killed: BTreeMap<String, (PathBuf, Duration)>,
    /// `None`: no pacing (tests, and `simulate`).
    bucket: Option<TokenBucket>,
    /// When the pacing allows the next eviction, while it does not now.
    paced_until: Option<Duration>,
    /// When the API server (shedding load) allows the next eviction, while it does not now.
    server_until: Option<Duration>,
    /// When an eviction the executor's lane shed is tried again.
    shed_until: Option<Duration>,
    last_met: BTreeSet<Signal>,
    last_conditions: Option<Vec<NodeCondition>>,
    no_evictable: Option<Signal>,
    over_limit_kept: Vec<(PassedOver, StorageLimit)>,
    node_reclaim: Option<NodeReclaim>,
    reclaim: ReclaimState,
    /// OOM kills in pods, by series.
    oom: OomSeries,
    /// A threshold's eviction waits until then for the pod source to name a pod it has not
    /// listed yet, which holds more memory than the pod chosen (the loop decides that).
    names_until: Option<Duration>,
}

impl Acting {
    /// The pods over a local storage limit kept (not evictable) at the last fresh plan.
    pub fn over_limit_kept(&self) -> &[(PassedOver, StorageLimit)] {
        &self.over_limit_kept
    }

    /// The evictions in flight, by pod id.
    pub fn in_flight(&self) -> impl Iterator<Item = &InFlight> {
        self.in_flight.values()
    }

    pub fn has_in_flight(&self) -> bool {
        !self.in_flight.is_empty()
    }

    /// A pod killed on the node is in flight until its memory is back: the loop looks often.
    pub fn awaits_freed_memory(&self) -> bool {
        self.in_flight
            .values()
            .any(|f| f.track == Track::Node && f.going_until.is_some())
    }

    /// The evictions in flight on `track`.
    fn in_flight_on(&self, track: Track) -> usize {
        self.in_flight.values().filter(|f| f.track == track).count()
    }

    /// Carries hard memory and PID evictions out on the node (`true`), or through the API;
    /// from config and what the node allows, at start and on reload.
    pub fn set_node_kill(&mut self, on: bool) {
        self.node_kill = on;
    }

    pub fn node_kill(&self) -> bool {
        self.node_kill
    }

    /// Whether another eviction for a local storage limit may be handed over now.
    pub fn local_storage_room(&self, now: Duration) -> bool {
        self.in_flight_on(Track::LocalStorage) < LOCAL_STORAGE_IN_FLIGHT
            && self.held_for_all(now).is_none()
    }

    /// What holds every eviction, both tracks: the API server's wish, a lane that shed one.
    fn held_for_all(&self, now: Duration) -> Option<Duration> {
        [self.server_until, self.shed_until]
            .into_iter()
            .flatten()
            .filter(|t| *t > now)
            .max()
    }

    /// When the pacing (or the API server, or a lane that shed an eviction) allows the next
    /// attempt, if it does not now.
    pub fn paced_until(&self, now: Duration) -> Option<Duration> {
        [
            self.paced_until.filter(|t| *t > now),
            self.held_for_all(now),
        ]
        .into_iter()
        .flatten()
        .max()
    }

    /// `base` (own pod, exclusions) with the pods not evictable at `now`: those held after an
    /// outcome, those whose eviction is in flight, and those killed on the node within
    /// [`KILL_SETTLE`] or whose cgroup holds no process now (nothing is left to kill, the
    /// kubelet is ending the pod). A killed pod the kubelet started again in place may be
    /// chosen again.
    pub fn eligibility(
        &self,
        base: &Eligibility,
        now: Duration,
        cgroups: &dyn Cgroups,
    ) -> Eligibility {
        let mut e = base.clone();
        // A hold says more than "in flight" (an evicted pod still waited for is terminating).
        e.not_evictable_now = self
            .in_flight
            .keys()
            .map(|id| (id.clone(), NotEvictableNow::Evicting))
            .chain(
                self.killed
                    .iter()
                    .filter(|(_, (cgroup, at))| {
                        now < *at + KILL_SETTLE || !cgroups.has_processes(cgroup)
                    })
                    .map(|(id, _)| (id.clone(), NotEvictableNow::Terminating)),
            )
            .chain(
                self.holds
                    .iter()
                    .filter(|(_, h)| h.until.is_none_or(|u| now < u))
                    .map(|(id, h)| (id.clone(), h.reason)),
            )
            .collect();
        e
    }

    /// The actions for `decision`. `fresh`: the pod data may be acted on. `cgroup_of` finds a
    /// pod's cgroup, to see it go after its eviction.
    pub fn plan(
        &mut self,
        decision: &Decision,
        pods: &[PodInfo],
        fresh: bool,
        trigger_ktime_ns: Option<u64>,
        cgroup_of: &dyn Fn(&PodInfo) -> Option<PodCgroup>,
        now: Duration,
    ) -> Plan {
        let mut plan = Plan::default();
        // The evictions (or the node-level reclaim that goes before a disk signal's) leave
        // first: they are what the node is waiting for; the events and the condition that
        // describe the same moment follow them.
        let reclaim = self.node_reclaim(decision, pods, fresh, now);
        // Nothing is evicted for a disk signal until the reclaim's outcome is back and the
        // node observed again; pods over their local storage limits still go.
        let naming = self.names_until.is_some_and(|t| now < t);
        let threshold_held = reclaim.is_some()
            || naming
            || (self.reclaim.in_flight.is_some()
                && decision
                    .reclaim
                    .is_some_and(|s| !s.is_memory() && s != Signal::PidAvailable));
        plan.actions.extend(reclaim);
        if !fresh && (!decision.evictions.is_empty() || decision.reclaim.is_some()) {
            // Blind: the pods are not known (the source unusable, or not read yet), so neither
            // is whether one may go.
            plan.notes.push(Note::Stale);
        } else {
            self.evictions(
                decision,
                pods,
                threshold_held,
                trigger_ktime_ns,
                cgroup_of,
                now,
                &mut plan,
            );
        }
        let met: BTreeSet<Signal> = decision.thresholds_met.iter().map(|t| t.signal).collect();
        let mut resources = BTreeSet::new();
        for signal in met.difference(&self.last_met) {
            if resources.insert(signal.resource()) {
                plan.actions.push(Action::NodeEvent(NodeEvent::ThresholdMet(
                    signal.resource(),
                )));
            }
        }
        let conditions_changed = self.last_conditions.as_ref() != Some(&decision.conditions);
        if met != self.last_met || conditions_changed {
            plan.notes.push(Note::Pressure {
                met: met.clone(),
                conditions: decision.conditions.clone(),
            });
        }
        if conditions_changed {
            // The condition, and the taint that follows it: on while it is True, off when it
            // clears (after the transition period, as the policy decides it). Whether taints
            // are wanted at all is the executor's setting, so a reload applies it with the
            // next report.
            plan.actions.push(Action::Status {
                conditions: decision.conditions.clone(),
            });
            self.last_conditions = Some(decision.conditions.clone());
        }
        self.last_met = met;

        // Only pods seen fresh can say that none may go: blind, [`Note::Stale`] says so instead
        // (and takes back an earlier claim).
        let starving = decision
            .reclaim
            .filter(|_| fresh && !naming && decision.no_evictable_pod());
        match (self.no_evictable, starving) {
            (before, Some(signal)) if before != Some(signal) => {
                plan.notes.push(Note::NoEvictablePod {
                    signal,
                    passed_over: decision.passed_over.clone(),
                });
            }
            (Some(_), None) if fresh => plan.notes.push(Note::EvictablePodAgain),
            _ => {}
        }
        self.no_evictable = starving;
        if fresh && decision.over_limit_passed_over != self.over_limit_kept {
            self.over_limit_kept = decision.over_limit_passed_over.clone();
            plan.notes
                .push(Note::OverLimitKept(self.over_limit_kept.clone()));
        }
        plan
    }

    pub fn with_node_reclaim(node_reclaim: Option<NodeReclaim>) -> Self {
        Self {
            node_reclaim,
            ..Self::default()
        }
    }

    /// A kernel OOM kill in a pod: its pod event, or nothing while it joins a series.
    pub fn pod_oom_kill(
        &mut self,
        kill: node_agent_kube::events::PodOomKill,
        now: Duration,
        wall: std::time::SystemTime,
    ) -> Option<Action> {
        self.oom.kill(kill, now, wall)
    }

    /// The OOM series whose count is due to be written.
    pub fn flush_oom(&mut self, now: Duration) -> Vec<Action> {
        self.oom.flush(now)
    }

    /// A pod's OOM event (`namespace`/`name`) was not written: posted again when more kills
    /// of its series come.
    pub fn oom_event_failed(&mut self, namespace: &str, name: &str) {
        self.oom.failed(namespace, name);
    }

    /// Sets (or, `None`, turns off) the pacing; from config, at start and on reload. The tokens
    /// held stay (up to the new burst): a reload neither grants a fresh burst nor takes one
    /// away.
    pub fn set_pacing(&mut self, rates: Option<Rates>, now: Duration) {
        self.bucket = match (self.bucket.take(), rates) {
            (_, None) => None,
            (None, Some(r)) => Some(TokenBucket::new(r.per_minute, r.burst, now)),
            (Some(mut b), Some(r)) => {
                b.reconfigure(r.per_minute, r.burst, now);
                Some(b)
            }
        };
        // Asked anew at the next decision, at the new rates.
        self.paced_until = None;
    }

    /// Holds every threshold's eviction until `until` (or, `None`, no longer): the pod source
    /// is naming a pod that may rank first.
    pub fn hold_for_names(&mut self, until: Option<Duration>) {
        self.names_until = until;
    }

    /// Sets (or, `None`, turns off) node-level reclaim; from config, at start and on reload.
    pub fn set_node_reclaim(&mut self, node_reclaim: Option<NodeReclaim>) {
        self.node_reclaim = node_reclaim;
    }

    /// The reclaim to hand over: the signal being reclaimed has node-level reclaim functions,
    /// none is in flight, and the last one is at least `interval` old.
    fn node_reclaim(
        &mut self,
        decision: &Decision,
        pods: &[PodInfo],
        fresh: bool,
        now: Duration,
    ) -> Option<Action> {
        let config = self.node_reclaim?;
        let signal = decision.reclaim?;
        if reclaim_kinds(signal, config.layout).is_empty() || self.reclaim.in_flight.is_some() {
            return None;
        }
        if self.reclaim.last.is_some_and(|t| now < t + config.interval) {
            return None;
        }
        self.reclaim = ReclaimState {
            in_flight: Some(signal),
            last: Some(now),
        };
        // Pods the source lists keep their newest dead container per name; the dead
        // containers of pods it does not list may all go, once the list is fresh.
        let states = PodStates {
            sources_ready: fresh,
            pods: pods
                .iter()
                .filter_map(|p| Some((p.uid.clone()?, PodPhase::Active)))
                .collect(),
        };
        Some(Action::Reclaim(Box::new(Reclaim {
            signal,
            layout: config.layout,
            pods: states,
        })))
    }

    /// The executor reported the reclaim's outcome: evictions may go again once the node has
    /// been observed anew (the caller evaluates now); the next reclaim not before `interval`.
    pub fn reclaimed(&mut self, now: Duration) {
        self.reclaim = ReclaimState {
            in_flight: None,
            last: Some(now),
        };
    }

    /// The evictions to hand over, each on its track unless something holds it back: for a
    /// local storage limit, the room in flight; for a threshold, its eviction still in flight,
    /// `threshold_held` (a node-level reclaim first) or the pacing (each takes a token); for
    /// both, the API server's wish and a lane that shed one.
    #[expect(
        clippy::too_many_arguments,
        reason = "the plan's inputs for one decision, passed through from `plan`"
    )]
    fn evictions(
        &mut self,
        decision: &Decision,
        pods: &[PodInfo],
        threshold_held: bool,
        trigger_ktime_ns: Option<u64>,
        cgroup_of: &dyn Fn(&PodInfo) -> Option<PodCgroup>,
        now: Duration,
        plan: &mut Plan,
    ) {
        let held_for_all = self.held_for_all(now).is_some();
        for eviction in &decision.evictions {
            let id = eviction.pod_id();
            if self.in_flight.contains_key(&id) {
                continue;
            }
            let Some(pod) = pods.iter().find(|p| p.id() == id) else {
                continue;
            };
            let urgent = urgent(eviction);
            let cgroup = cgroup_of(pod);
            // On the node only a pod whose cgroup was found by its UID: what the kill may
            // touch. Without one, the API carries the eviction out.
            let target = match (Track::of(eviction, self.node_kill), &cgroup, &pod.uid) {
                (Track::Node, Some(found), Some(uid)) => Some(KillTarget {
                    pod_uid: uid.clone(),
                    cgroup: found.path.clone(),
                    cgroup_id: found.id,
                }),
                _ => None,
            };
            let track = match Track::of(eviction, self.node_kill) {
                Track::Node if target.is_none() => Track::Threshold,
                track => track,
            };
            match track {
                // On the node: nothing of the API server's holds it, nor any pacing; one at a
                // time, and only a pod whose cgroup was found (the kill's target).
                Track::Node => {
                    if threshold_held || self.in_flight_on(Track::Node) > 0 {
                        continue;
                    }
                }
                Track::LocalStorage => {
                    if held_for_all
                        || self.in_flight_on(Track::LocalStorage) >= LOCAL_STORAGE_IN_FLIGHT
                    {
                        continue;
                    }
                }
                Track::Threshold => {
                    if held_for_all
                        || threshold_held
                        || self.in_flight_on(Track::Threshold) > 0
                        || (!urgent && self.paced_until.is_some_and(|t| t > now))
                    {
                        continue;
                    }
                    if let (false, Some(bucket)) = (urgent, &mut self.bucket) {
                        if let Err(wait) = bucket.try_take(now) {
                            let until = now.saturating_add(wait);
                            self.paced_until = Some(until);
                            plan.notes.push(Note::Paced {
                                signal: eviction.signal,
                                until,
                            });
                            continue;
                        }
                    }
                }
            }
            let evict = Evict {
                eviction: eviction.clone(),
                pod: pod.clone(),
                trigger_ktime_ns,
            };
            let action = match target {
                Some(target) => Action::Kill(Box::new(Kill { evict, target })),
                None => Action::Evict(Box::new(evict)),
            };
            self.in_flight.insert(
                id.clone(),
                InFlight {
                    pod_id: id,
                    pod: format!("{}/{}", eviction.namespace, eviction.name),
                    signal: eviction.signal,
                    track,
                    urgent,
                    working_set: pod.usage.as_ref().map(|u| u.memory_working_set_bytes),
                    since: now,
                    cgroup: cgroup.map(|c| c.path),
                    going_until: None,
                },
            );
            plan.actions.push(action);
        }
    }

    /// What the executor reported about an eviction.
    pub fn reported(&mut self, report: &Report, timing: &Timing, now: Duration) {
        let id = report.eviction.pod_id();
        let attempt = &report.attempt;
        let hold = |reason, until| Hold { reason, until };
        let track = self.in_flight.get(&id).map(|f| f.track);
        if attempt.result.nothing_done() && track == Some(Track::Threshold) {
            // The server said plainly nothing was done: the pacing token goes back (an urgent
            // eviction took none, and the bucket is full then anyway).
            if let (false, Some(bucket)) = (urgent(&report.eviction), &mut self.bucket) {
                bucket.refund(now);
            }
        }
        match attempt.result {
            // Killed on the node: its processes are dying and give their memory back as they
            // exit (hundreds of milliseconds for gigabytes); the next may go once it is back
            // (`settle`), never on a reading from before. Not evictable again while it settles
            // or its cgroup holds no process (see `eligibility`).
            EvictionResult::Killed => {
                if let Some(f) = self.in_flight.get_mut(&id) {
                    f.going_until = Some(now + timing.wait_timeout);
                    if let Some(cgroup) = &f.cgroup {
                        self.killed.insert(id, (cgroup.clone(), now));
                    }
                }
                return;
            }
            EvictionResult::Evicted | EvictionResult::PdbOverridden | EvictionResult::DryRun => {
                if attempt.result != EvictionResult::DryRun {
                    self.holds
                        .insert(id.clone(), hold(NotEvictableNow::Terminating, None));
                }
                if let Some(f) = self.in_flight.get_mut(&id) {
                    f.going_until = Some(now + timing.wait_timeout);
                }
                return;
            }
            // Only the plan paces; an executor never reports this, but were one to, it is
            // waited out like the server's own pacing.
            EvictionResult::RateLimited => {
                self.server_until = Some(now + attempt.retry_after.unwrap_or(timing.failed));
            }
            EvictionResult::ApiRateLimited => {
                self.server_until =
                    Some(now + attempt.retry_after.unwrap_or(Duration::from_secs(1)));
            }
            EvictionResult::AlreadyGone => {
                self.holds
                    .insert(id.clone(), hold(NotEvictableNow::Terminating, None));
            }
            EvictionResult::BlockedByPdb => {
                let wait = timing
                    .pass_over
                    .max(attempt.retry_after.unwrap_or_default());
                self.holds.insert(
                    id.clone(),
                    hold(NotEvictableNow::BlockedByDisruptionBudget, Some(now + wait)),
                );
            }
            EvictionResult::Refused => {
                self.holds.insert(
                    id.clone(),
                    hold(NotEvictableNow::Refused, Some(now + timing.pass_over)),
                );
            }
            EvictionResult::Failed => {
                self.holds.insert(
                    id.clone(),
                    hold(NotEvictableNow::Failed, Some(now + timing.failed)),
                );
            }
        }
        self.in_flight.remove(&id);
    }

    /// The executor's lane could not take this eviction (full): it was never attempted, so
    /// nothing holds the pod, its pacing token comes back, and it goes again after
    /// [`SHED_RETRY`].
    pub fn shed(&mut self, eviction: &Eviction, now: Duration) {
        let Some(f) = self.in_flight.remove(&eviction.pod_id()) else {
            return;
        };
        if f.track == Track::Threshold && !f.urgent {
            if let Some(bucket) = &mut self.bucket {
                bucket.refund(now);
            }
        }
        self.shed_until = Some(now + SHED_RETRY);
    }

    /// Ends each eviction in flight whose pod is done with: its cgroup gone, or for an urgent
    /// one its memory freed (its working set at most 1/[`FREED_FRACTION`] of what it was when
    /// it was chosen), or its wait run out; drops expired holds. Returns the evictions that
    /// ended, and whether each one's pod was done with.
    pub fn settle(&mut self, now: Duration, cgroups: &dyn Cgroups) -> Vec<(InFlight, bool)> {
        self.holds.retain(|_, h| h.until.is_none_or(|u| now < u));
        let mut ended = Vec::new();
        self.in_flight.retain(|_, f| {
            let Some(until) = f.going_until else {
                return true;
            };
            let freed = |c: &Path| match (f.working_set, cgroups.working_set(c)) {
                (Some(before), Some(now)) => now.saturating_mul(FREED_FRACTION) <= before,
                _ => false,
            };
            let done = f
                .cgroup
                .as_deref()
                .is_some_and(|c| !cgroups.exists(c) || (f.urgent && freed(c)));
            if done || now >= until {
                ended.push((f.clone(), done));
                return false;
            }
            true
        });
        ended
    }

    /// Forgets holds "while listed", and pods killed on the node, that the pod source no
    /// longer lists.
    pub fn forget_absent(&mut self, listed: &HashSet<String>) {
        self.holds
            .retain(|id, h| h.until.is_some() || listed.contains(id));
        self.killed.retain(|id, _| listed.contains(id));
    }

    /// After a config reload: what was reported is reported anew under the new settings.
    pub fn reset_reported(&mut self) {
        self.last_conditions = None;
        self.last_met.clear();
    }
}
