//! The acting half behind one handle: the pure [`plan`](crate::plan) and the [`Executor`] that
//! carries its actions out, owned together. The loop hands [`Acts`] each decision
//! ([`Acts::act_on`]), each outcome ([`Acts::learn`]) and each OOM kill ([`Acts::oom_kill`]);
//! it plans, and submits what the plan says itself, so an action never travels back through
//! the loop to be handed over. What the loop gets back is for reporting only: the plan's notes,
//! the evictions handed over, what an OOM kill is counted as.

use std::{
    collections::{BTreeMap, HashSet},
    time::{Duration, SystemTime},
};

use node_agent_kube::{config::KubeConfig, evict::EvictionResult};
use node_agent_policy::{Decision, Eligibility, Eviction, PodInfo};
use tokio::sync::{mpsc, watch};

use crate::{
    action::{Action, OomCounted, OomTold, Outcome, StatusReport, Unnamed},
    plan::{
        oom_kill_actions, Acting, Cgroups, InFlight, NodeReclaim, Note, PodCgroup, Rates, Timing,
    },
    reclaim::{Identity, RuntimeError},
    run::{Executor, Settings},
};

/// How often the runtime's images (and where it keeps them) are asked about: the kubelet's
/// image GC period, when it runs `detectImages`.
const IMAGE_DETECT_PERIOD: Duration = Duration::from_secs(300);

/// Containers being named by the runtime at once, and kills held for each.
const MAX_IDENTIFYING: usize = 64;

pub struct Acts {
    executor: Executor,
    outcomes: mpsc::UnboundedReceiver<Outcome>,
    settings: watch::Sender<Settings>,
    plan: Acting,
    timing: Timing,
    /// When the runtime was last asked (the kubelet's `detectImages`); `None`: ask now.
    images_asked_at: Option<Duration>,
    /// OOM kills waiting for the runtime to name their container, by container id.
    identifying: BTreeMap<String, Vec<Unnamed>>,
    /// Whether this agent can kill on the node, and why not: decided once at start.
    node_kill: Result<(), String>,
    /// What the config last asked for hard evictions (on the node or not), to say it once.
    hard_eviction_wanted: Option<bool>,
}

/// A decision of the policy, as the loop hands it over: the pods it was made among, whether
/// their data may be acted on (`fresh`), and the kernel timestamp of what triggered it.
#[derive(Debug, Clone, Copy)]
pub struct Decided<'a> {
    pub decision: &'a Decision,
    pub pods: &'a [PodInfo],
    pub fresh: bool,
    pub trigger_ktime_ns: Option<u64>,
}

/// What acting on a decision handed over, for the loop to report: the evictions (each with
/// whether it is carried out on the node), and the plan's notes.
#[derive(Debug, Default)]
pub struct Handed {
    pub evictions: Vec<(Eviction, bool)>,
    pub notes: Vec<Note>,
}

impl Acts {
    /// Starts the executor's lanes with `settings`, and the plan with its pacing. `node_kill`
    /// says whether this agent can kill on the node (see [`crate::kill::host`]), or why not.
    pub fn start(
        settings: Settings,
        rates: Rates,
        timing: Timing,
        node_kill: Result<(), String>,
        now: Duration,
    ) -> Self {
        let (settings, settings_rx) = watch::channel(settings);
        let (executor, outcomes) = Executor::spawn(settings_rx);
        let mut plan = Acting::default();
        plan.set_pacing(Some(rates), now);
        Self {
            executor,
            outcomes,
            settings,
            plan,
            timing,
            images_asked_at: None,
            identifying: BTreeMap::new(),
            node_kill,
            hard_eviction_wanted: None,
        }
    }

    /// Carries hard memory and PID evictions out on the node when `wanted` (the config) and
    /// this agent can; else through the API. Says which, and why, when it changes.
    pub fn set_hard_eviction(&mut self, wanted: bool) {
        let on = wanted && self.node_kill.is_ok();
        if self.hard_eviction_wanted.replace(wanted) != Some(wanted) {
            match (&self.node_kill, wanted) {
                (Ok(()), true) => tracing::info!(
                    "hard memory and PID evictions are carried out on the node: the pod killed at once, its record written through the API after"
                ),
                (Err(why), true) => tracing::warn!(reason = %why,
                    "hard memory and PID evictions cannot be carried out on the node here: they go through the API (slower: the OOM killer may act first)"),
                (_, false) => tracing::info!(
                    "hard memory and PID evictions go through the API (kubernetes.hardEviction: api)"
                ),
            }
        }
        self.plan.set_node_kill(on);
    }

    /// Whether hard memory and PID evictions are carried out on the node now.
    pub fn kills_on_node(&self) -> bool {
        self.plan.node_kill()
    }

    /// The executor's next outcome; `None` once it has stopped.
    pub async fn outcome(&mut self) -> Option<Outcome> {
        self.outcomes.recv().await
    }

    /// The generation of the executor's cluster connection.
    pub fn generation(&self) -> u64 {
        self.settings.borrow().generation
    }

    /// A reload: the executor's settings first (dry run and exclusions hold from this moment),
    /// then the plan's pacing and timing; what was reported is reported anew.
    pub fn reconfigure(&mut self, settings: Settings, rates: Rates, timing: Timing, now: Duration) {
        self.settings.send_replace(settings);
        self.plan.set_pacing(Some(rates), now);
        self.timing = timing;
        self.plan.reset_reported();
    }

    /// Holds every threshold's eviction until `until` (`None`: no longer) while the pod source
    /// names a pod it has not listed yet that may rank first.
    pub fn hold_for_names(&mut self, until: Option<Duration>) {
        self.plan.hold_for_names(until);
    }

    /// Sets (or, `None`, turns off) node-level reclaim: the layout may change at any reading.
    pub fn set_node_reclaim(&mut self, reclaim: Option<NodeReclaim>) {
        self.plan.set_node_reclaim(reclaim);
    }

    /// When the pacing (or the API server, or a lane that shed an eviction) allows the next
    /// eviction, if it does not now.
    pub fn paced_until(&self, now: Duration) -> Option<Duration> {
        self.plan.paced_until(now)
    }

    pub fn has_in_flight(&self) -> bool {
        self.plan.has_in_flight()
    }

    /// A pod killed on the node waits for its memory to come back before the next may go.
    pub fn awaits_freed_memory(&self) -> bool {
        self.plan.awaits_freed_memory()
    }

    /// The pods whose eviction is in flight, `namespace/name`.
    pub fn in_flight_pods(&self) -> Vec<String> {
        self.plan.in_flight().map(|f| f.pod.clone()).collect()
    }

    /// Ends each eviction in flight whose pod is done with (its cgroup gone, or an urgent
    /// one's memory freed, or its wait run out), and drops expired holds: the evictions that
    /// ended, and whether each one's pod was done with.
    pub fn settle(&mut self, now: Duration, cgroups: &dyn Cgroups) -> Vec<(InFlight, bool)> {
        self.plan.settle(now, cgroups)
    }

    /// Forgets holds "while listed" of pods the pod source no longer lists.
    pub fn forget_absent(&mut self, listed: &HashSet<String>) {
        self.plan.forget_absent(listed);
    }

    /// Who may be evicted now: never the agent's own pod nor an excluded one (the executor's
    /// settings), nor a pod held after an outcome or whose eviction is in flight, nor a pod
    /// killed on the node with nothing left in its cgroup.
    pub fn eligibility(&self, now: Duration, cgroups: &dyn Cgroups) -> Eligibility {
        self.plan
            .eligibility(&self.settings.borrow().eligibility, now, cgroups)
    }

    /// Whether the pods over a local storage limit call for a decision now: one the agent may
    /// evict, while the plan has room for it, or the ones it may not evict changed.
    pub fn local_storage_due(
        &self,
        pods: &[PodInfo],
        has_imagefs: bool,
        now: Duration,
        cgroups: &dyn Cgroups,
    ) -> bool {
        if !self.plan.local_storage_room(now) {
            return false;
        }
        let eligibility = self.eligibility(now, cgroups);
        let over = node_agent_policy::over_local_storage_limits(pods, has_imagefs, &eligibility);
        !over.evict.is_empty() || over.kept != self.plan.over_limit_kept()
    }

    /// Plans a decision and hands the plan's actions over (in order; never waits).
    /// `cgroup_of` finds a pod's cgroup, to see it go after its eviction.
    pub fn act_on(
        &mut self,
        decided: Decided<'_>,
        cgroup_of: &dyn Fn(&PodInfo) -> Option<PodCgroup>,
        now: Duration,
    ) -> Handed {
        let Decided {
            decision,
            pods,
            fresh,
            trigger_ktime_ns,
        } = decided;
        let plan = self
            .plan
            .plan(decision, pods, fresh, trigger_ktime_ns, cgroup_of, now);
        let evictions = plan
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Evict(e) => Some((e.eviction.clone(), false)),
                Action::Kill(k) => Some((k.evict.eviction.clone(), true)),
                _ => None,
            })
            .collect();
        self.submit(plan.actions);
        Handed {
            evictions,
            notes: plan.notes,
        }
    }

    /// What the plan learns from an outcome: an eviction's result, an eviction the lane shed,
    /// a reclaim ended, a pod's OOM event not written. A kill on the node says how long relief
    /// took: from the decision to the victim's growth stopped.
    pub fn learn(&mut self, outcome: &Outcome, now: Duration) -> Option<Duration> {
        let mut relieved = None;
        match outcome {
            Outcome::Eviction(report) => {
                if report.attempt.result == EvictionResult::Killed {
                    let id = report.eviction.pod_id();
                    relieved = self
                        .plan
                        .in_flight()
                        .find(|f| f.pod_id == id)
                        .map(|f| now.saturating_sub(f.since));
                }
                self.plan.reported(report, &self.timing, now)
            }
            Outcome::EvictionShed { evict, .. } => self.plan.shed(&evict.eviction, now),
            Outcome::Reclaim(_) => self.plan.reclaimed(now),
            Outcome::PodOomEvent {
                namespace,
                name,
                result: Err(_),
            } => self.plan.oom_event_failed(namespace, name),
            _ => {}
        }
        relieved
    }

    /// An OOM kill, its victim named as far as it can be: its pod's event (or nothing while it
    /// joins a series), or the node's (as `kube` says: see [`oom_kill_actions`]).
    pub fn oom_kill(&mut self, told: OomTold, kube: Option<&KubeConfig>, now: Duration) {
        let actions = match told {
            OomTold::Pod(kill) => self
                .plan
                .pod_oom_kill(kill, now, SystemTime::now())
                .into_iter()
                .collect(),
            OomTold::Node(kill) => oom_kill_actions(kube, kill),
        };
        self.submit(actions);
    }

    /// The OOM series whose count is due, written.
    pub fn flush_oom(&mut self, now: Duration) {
        let series = self.plan.flush_oom(now);
        self.submit(series);
    }

    /// An OOM kill in a container the pod source has not named: the runtime is asked once per
    /// container; kills meanwhile wait for its answer (a bounded few; beyond, they are dropped
    /// and said so, the series still counts the ones kept).
    pub fn identify(&mut self, kill: Unnamed) {
        let id = kill.container_id.clone();
        if let Some(waiting) = self.identifying.get_mut(&id) {
            if waiting.len() < MAX_IDENTIFYING {
                waiting.push(kill);
            } else {
                tracing::warn!(container = %id, "OOM kills waiting for the runtime to name their container: one dropped");
            }
            return;
        }
        if self.identifying.len() >= MAX_IDENTIFYING {
            tracing::warn!(container = %id, "too many containers waiting to be named by the runtime: an OOM kill dropped");
            return;
        }
        self.identifying.insert(id, Vec::new());
        self.executor.submit(Action::Identify(Box::new(kill)));
    }

    /// The runtime named the container of `kill` (and of the kills that waited for it), or
    /// could not: each kill told, on the pod it names, else on the pod known, else on the node.
    /// Returns how each is counted.
    pub fn identified(
        &mut self,
        kill: Unnamed,
        who: &Result<Identity, RuntimeError>,
        kube: Option<&KubeConfig>,
        now: Duration,
    ) -> Vec<OomCounted> {
        let waiting = self
            .identifying
            .remove(&kill.container_id)
            .unwrap_or_default();
        let mut counted = Vec::new();
        for kill in std::iter::once(kill).chain(waiting) {
            let (told, count) = kill.told(who.as_ref().ok());
            self.oom_kill(told, kube, now);
            counted.push(count);
        }
        counted
    }

    /// Asks the runtime about its images and filesystems when the period has passed (or it has
    /// never been asked, or `now_please` says it restarted); never without a runtime.
    pub fn detect_images_if_due(&mut self, now: Duration, now_please: bool) {
        if self.settings.borrow().runtime.is_none() {
            return;
        }
        let due = now_please
            || self
                .images_asked_at
                .is_none_or(|t| now >= t + IMAGE_DETECT_PERIOD);
        if due {
            self.images_asked_at = Some(now);
            self.executor.submit(Action::DetectImages);
        }
    }

    /// The agent stops: its condition `Unknown` and its taint removed, waited for at most
    /// `deadline` (see [`Executor::stop`]).
    pub async fn stop(&mut self, deadline: Duration) -> Option<StatusReport> {
        self.executor.stop(&mut self.outcomes, deadline).await
    }

    /// Hands actions over (in order; never waits).
    fn submit(&self, actions: Vec<Action>) {
        for action in actions {
            self.executor.submit(action);
        }
    }
}
