//! From a decision to actions, as data: what the loop remembers about acting (the eviction in
//! flight, pods not evictable now, pacing, what was last reported) and the pure functions that
//! turn a decision, and each outcome the executor reports, into the next actions.
//!
//! Node-level reclaim goes before an eviction for a disk signal, as the kubelet's
//! `reclaimNodeLevelResources` does: when the signal being reclaimed has node-level reclaim
//! functions (by filesystem layout), the plan hands a [`Reclaim`] action to the executor and
//! holds every eviction until its outcome is back and the loop has observed the node again;
//! from then on, until `interval` has passed, the pods are ranked and evicted as before. So at
//! most one reclaim runs per `interval` (the kubelet: once per synchronize).
//!
//! At most one eviction is in flight: from the moment it is handed to the executor until its
//! outcome says nothing is going (refused, blocked, failed, paced), or until the pod's cgroup
//! is gone (the kubelet's wait for pod cleanup) or `eviction_wait_timeout` passed.

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
    executor::{Action, Evict, NodeEvent, Report},
    reclaim::Reclaim,
};
use node_agent_policy::{
    Decision, Eligibility, NodeCondition, NotEvictableNow, PassedOver, PodInfo, Signal,
    StorageLimit,
};

/// The actions for a kernel OOM kill: a node event under the agent's own reason, naming the
/// process and its pod, unless `kubernetes.node_oom_events: off` leaves kills to
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

/// The eviction in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlight {
    pub pod_id: String,
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
    /// A decision to evict was not acted on: the pod data is stale (every time).
    Stale,
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
    in_flight: Option<InFlight>,
    holds: BTreeMap<String, Hold>,
    paced_until: Option<Duration>,
    last_met: BTreeSet<Signal>,
    last_conditions: Option<Vec<NodeCondition>>,
    no_evictable: Option<Signal>,
    over_limit_kept: Vec<(PassedOver, StorageLimit)>,
    node_reclaim: Option<NodeReclaim>,
    reclaim: ReclaimState,
}

impl Acting {
    /// The pods over a local storage limit kept (not evictable) at the last fresh plan.
    pub fn over_limit_kept(&self) -> &[(PassedOver, StorageLimit)] {
        &self.over_limit_kept
    }

    pub fn in_flight(&self) -> Option<&InFlight> {
        self.in_flight.as_ref()
    }

    /// When the pacing (or the API server) allows the next attempt, if it does not now.
    pub fn paced_until(&self, now: Duration) -> Option<Duration> {
        self.paced_until.filter(|t| *t > now)
    }

    /// `base` (own pod, exclusions) with the pods not evictable at `now`.
    pub fn eligibility(&self, base: &Eligibility, now: Duration) -> Eligibility {
        let mut e = base.clone();
        e.not_evictable_now = self
            .holds
            .iter()
            .filter(|(_, h)| h.until.is_none_or(|u| now < u))
            .map(|(id, h)| (id.clone(), h.reason))
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
        cgroup_of: &dyn Fn(&PodInfo) -> Option<PathBuf>,
        now: Duration,
    ) -> Plan {
        let mut plan = Plan::default();
        // The eviction (or the node-level reclaim that goes before it) leaves first: it is what
        // the node is waiting for; the events and the condition that describe the same moment
        // follow it.
        if let Some(reclaim) = self.node_reclaim(decision, pods, fresh, now) {
            plan.actions.push(reclaim);
        } else if self.reclaim.in_flight.is_some() {
            // Nothing is evicted until the reclaim's outcome is back and the node observed again.
        } else if let Some(evict) =
            self.eviction(decision, pods, fresh, trigger_ktime_ns, cgroup_of, now)
        {
            plan.actions.push(evict);
        } else if decision.evict.is_some() && !fresh {
            plan.notes.push(Note::Stale);
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
            plan.actions.push(Action::Condition {
                pressure: !decision.conditions.is_empty(),
                conditions: decision.conditions.clone(),
            });
            // The taint follows the condition: on while it is True, off when it clears (after
            // the transition period, as the policy decides it). Whether taints are wanted at
            // all is the executor's setting, so a reload applies it with the next report.
            plan.actions.push(Action::Taint {
                conditions: decision.conditions.clone(),
            });
            self.last_conditions = Some(decision.conditions.clone());
        }
        self.last_met = met;

        let starving = decision.reclaim.filter(|_| decision.no_evictable_pod());
        match (self.no_evictable, starving) {
            (before, Some(signal)) if before != Some(signal) => {
                plan.notes.push(Note::NoEvictablePod {
                    signal,
                    passed_over: decision.passed_over.clone(),
                });
            }
            (Some(_), None) => plan.notes.push(Note::EvictablePodAgain),
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

    /// The eviction to hand over, if the decision has one and nothing holds it back (stale
    /// data, one in flight, pacing).
    fn eviction(
        &mut self,
        decision: &Decision,
        pods: &[PodInfo],
        fresh: bool,
        trigger_ktime_ns: Option<u64>,
        cgroup_of: &dyn Fn(&PodInfo) -> Option<PathBuf>,
        now: Duration,
    ) -> Option<Action> {
        let eviction = decision.evict.as_ref().filter(|_| fresh)?;
        if self.in_flight.is_some() || self.paced_until(now).is_some() {
            return None;
        }
        let id = eviction.pod_id();
        let pod = pods.iter().find(|p| p.id() == id)?;
        self.in_flight = Some(InFlight {
            pod_id: id,
            since: now,
            cgroup: cgroup_of(pod),
            going_until: None,
        });
        Some(Action::Evict(Box::new(Evict {
            eviction: eviction.clone(),
            pod: pod.clone(),
            trigger_ktime_ns,
        })))
    }

    /// What the executor reported about an eviction.
    pub fn reported(&mut self, report: &Report, timing: &Timing, now: Duration) {
        let id = report.eviction.pod_id();
        let attempt = &report.attempt;
        let hold = |reason, until| Hold { reason, until };
        let is_ours = self.in_flight.as_ref().is_some_and(|f| f.pod_id == id);
        match attempt.result {
            EvictionResult::Evicted | EvictionResult::PdbOverridden | EvictionResult::DryRun => {
                if attempt.result != EvictionResult::DryRun {
                    self.holds
                        .insert(id, hold(NotEvictableNow::Terminating, None));
                }
                if let Some(f) = self.in_flight.as_mut().filter(|_| is_ours) {
                    f.going_until = Some(now + timing.wait_timeout);
                }
                return;
            }
            EvictionResult::RateLimited => {
                self.paced_until = Some(now + attempt.retry_after.unwrap_or(timing.failed));
            }
            EvictionResult::ApiRateLimited => {
                self.paced_until =
                    Some(now + attempt.retry_after.unwrap_or(Duration::from_secs(1)));
            }
            EvictionResult::AlreadyGone => {
                self.holds
                    .insert(id, hold(NotEvictableNow::Terminating, None));
            }
            EvictionResult::BlockedByPdb => {
                let wait = timing
                    .pass_over
                    .max(attempt.retry_after.unwrap_or_default());
                self.holds.insert(
                    id,
                    hold(NotEvictableNow::BlockedByDisruptionBudget, Some(now + wait)),
                );
            }
            EvictionResult::Refused => {
                self.holds.insert(
                    id,
                    hold(NotEvictableNow::Refused, Some(now + timing.pass_over)),
                );
            }
            EvictionResult::Failed => {
                self.holds
                    .insert(id, hold(NotEvictableNow::Failed, Some(now + timing.failed)));
            }
        }
        if is_ours {
            self.in_flight = None;
        }
    }

    /// Ends the eviction in flight once its pod's cgroup is gone (or the wait ran out); drops
    /// expired holds. Returns the eviction that ended, and whether its cgroup went.
    pub fn settle(
        &mut self,
        now: Duration,
        exists: &dyn Fn(&Path) -> bool,
    ) -> Option<(InFlight, bool)> {
        self.holds.retain(|_, h| h.until.is_none_or(|u| now < u));
        let f = self.in_flight.as_ref()?;
        let until = f.going_until?;
        let gone = f.cgroup.as_deref().is_some_and(|c| !exists(c));
        if gone || now >= until {
            return self.in_flight.take().map(|f| (f, gone));
        }
        None
    }

    /// Forgets holds "while listed" of pods the pod source no longer lists.
    pub fn forget_absent(&mut self, listed: &HashSet<String>) {
        self.holds
            .retain(|id, h| h.until.is_some() || listed.contains(id));
    }

    /// After a config reload: the pacing is the executor's again, and what was reported is
    /// reported anew under the new settings.
    pub fn reset_reported(&mut self) {
        self.paced_until = None;
        self.last_conditions = None;
        self.last_met.clear();
    }
}
