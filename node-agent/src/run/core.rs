//! The daemon: its parts, and the one loop that drives them. One `select!` over kernel events,
//! the executor's outcomes, timers, the config watcher and signals; every branch ends in at
//! most one evaluation, and no branch waits on anything the loop does not own (handing actions
//! to the executor never waits, files are read off the loop).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use node_agent_executor::{Acts, Outcome};
use node_agent_kube::api::Counters;
use node_agent_policy::PolicyState;

use crate::{
    config::reload::{Change, ConfigWatcher},
    config::{AgentConfig, Overrides},
    observe::allocatable,
    observe::feed::Cluster,
    observe::node::Node,
    observe::pods::SnapshotNames,
    run::error::DaemonError,
    run::kernel_side::KernelSide,
    run::report::Reporter,
};
use crate::{
    error_chain,
    kernel::{Attributed, NoNames, Records},
    probes::{Direction, Happened, MemoryThreshold},
    saw_before::SawBefore,
    telemetry::Trigger,
};

/// How often ring-buffer losses, cgroup rescans, runtime detection and local storage limits
/// are looked at.
const HOUSEKEEPING: Duration = Duration::from_secs(1);
/// How often a pod killed on the node is looked at until its memory is back: the next pod may
/// go then, and not before.
const FREED_POLL: Duration = Duration::from_millis(5);
/// How long a stopping agent waits for its condition and taint to be written: short enough
/// that SIGTERM still ends it within 2 s, whatever the API server does.
const STOP_DEADLINE: Duration = Duration::from_millis(1500);

/// The config in force and where it comes from.
pub struct Config {
    pub current: AgentConfig,
    pub overrides: Overrides,
    /// `None`: no file (standalone defaults).
    pub watcher: Option<ConfigWatcher>,
}

/// The cluster connection, and the failure counts of its clients across reconnects.
pub struct Kube {
    pub cluster: Cluster,
    pub counters: Arc<Counters>,
    /// Who reviews the callers of `/metrics` (`metricsAccess: kubernetes`): this connection.
    pub reviewer: tokio::sync::watch::Sender<Option<Arc<node_agent_kube::access::Reviewer>>>,
    /// A threshold's eviction waiting for the pod source to name an unlisted pod.
    pub naming: crate::observe::naming::Naming,
}

/// Time: since start (the policy's `now`), and the loop's timers.
pub struct Clock {
    started: Instant,
    resync: tokio::time::Interval,
    poll: tokio::time::Interval,
    housekeeping: tokio::time::Interval,
    /// Re-read the node every `pressurePollInterval`.
    pub(super) polling: bool,
}

impl Clock {
    pub fn new(config: &AgentConfig) -> Self {
        let mut housekeeping = tokio::time::interval(HOUSEKEEPING);
        housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (resync, poll) = intervals(config);
        Self {
            started: Instant::now(),
            resync,
            poll,
            housekeeping,
            polling: false,
        }
    }

    pub fn now(&self) -> Duration {
        self.started.elapsed()
    }

    /// A reload changed the intervals: the timers started anew.
    pub fn set_intervals(&mut self, config: &AgentConfig) {
        (self.resync, self.poll) = intervals(config);
    }
}

fn intervals(config: &AgentConfig) -> (tokio::time::Interval, tokio::time::Interval) {
    let every = |d| {
        let mut i = tokio::time::interval(d);
        i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        i
    };
    (
        every(config.settings.resync_interval),
        every(config.settings.pressure_poll_interval),
    )
}

pub struct Signals {
    pub term: tokio::signal::unix::Signal,
    pub hup: tokio::signal::unix::Signal,
}

impl Signals {
    pub fn new() -> std::io::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }
}

pub struct Daemon {
    pub config: Config,
    pub node: Node,
    /// How fast memory falls and how long relief takes: a hard threshold met early.
    pub ahead: crate::run::ahead::Ahead,
    pub kernel: KernelSide,
    /// `None` in standalone mode.
    pub kube: Option<Kube>,
    pub acts: Acts,
    pub policy: PolicyState,
    pub report: Reporter,
    pub clock: Clock,
}

async fn next_change(watcher: &mut Option<ConfigWatcher>) -> Option<Change> {
    match watcher {
        Some(w) => w.next().await,
        None => std::future::pending().await,
    }
}

impl Daemon {
    pub(super) fn now(&self) -> Duration {
        self.clock.now()
    }

    /// Runs until SIGTERM or Ctrl-C.
    pub async fn run(&mut self, mut signals: Signals) -> Result<(), DaemonError> {
        self.sync_allocatable();
        // The host's pid_max before the first evaluation where a fork since load gave it: a
        // restart under PID pressure keeps the taint it left.
        let pid_max = self.kernel.host_pid_max();
        self.node.take_host_pid_max(pid_max);
        let reading = self.node.read();
        self.kernel
            .set_pid_trigger(&self.config.current.eviction, &reading);
        self.acts.detect_images_if_due(self.now(), false);
        self.evaluate(Trigger::Start, None);
        self.report.health.set_ready(true);
        loop {
            self.report.health.beat();
            let now = self.now();
            let paced = self.acts.paced_until(now);
            let wait_paced = async {
                match paced {
                    Some(at) => tokio::time::sleep(at.saturating_sub(now)).await,
                    None => std::future::pending().await,
                }
            };
            let pressure = self.clock.polling;
            let polling = pressure || self.acts.has_in_flight();
            tokio::select! {
                records = self.kernel.feed.recv() => {
                    let records = records.map_err(DaemonError::Feed)?;
                    self.on_records(records);
                }
                outcome = self.acts.outcome() => {
                    self.on_outcome(outcome.ok_or(DaemonError::ExecutorStopped)?);
                }
                () = wait_paced, if pressure => self.evaluate(Trigger::Pacing, None),
                () = tokio::time::sleep(FREED_POLL), if self.acts.awaits_freed_memory() => {
                    self.freed_memory();
                }
                () = tokio::time::sleep(FREED_POLL), if self.kube.as_ref().is_some_and(|k| k.naming.waiting()) => {
                    self.evaluate(Trigger::PressurePoll, None);
                }
                _ = self.clock.poll.tick(), if polling => self.evaluate(Trigger::PressurePoll, None),
                _ = self.clock.resync.tick() => self.evaluate(Trigger::Resync, None),
                () = self.node.allocatable_feed.changed() => self.allocatable_changed(),
                change = next_change(&mut self.config.watcher) => match change {
                    Some(Change::DryRunFirst) => self.dry_run_first(),
                    Some(Change::Whole(c)) => self.reload(c),
                    None => {
                        tracing::error!("the config watcher stopped: config changes are no longer seen");
                        self.config.watcher = None;
                    }
                },
                _ = self.clock.housekeeping.tick() => self.housekeeping(),
                _ = signals.hup.recv() => match &self.config.watcher {
                    Some(w) => w.ask(),
                    None => tracing::info!(reason = "SIGHUP", "no config file to reload (standalone defaults)"),
                },
                _ = signals.term.recv() => break,
                _ = tokio::signal::ctrl_c() => break,
            }
        }
        let asked = std::time::Instant::now();
        if let Some(sibling) = self.taking_over().await {
            tracing::info!(sibling = %sibling, "shutting down: another agent of this DaemonSet watches the node (a rollout); its condition and taint are left to it");
        } else if self.kube.is_some() {
            tracing::info!("shutting down: the agent's condition to Unknown, its taint removed");
            match self
                .acts
                .stop(STOP_DEADLINE.saturating_sub(asked.elapsed()))
                .await
            {
                Some(report) => self.report.side_effect(&Outcome::Status(Box::new(report))),
                None => tracing::warn!(deadline = ?STOP_DEADLINE,
                    "the node's condition and taint were not written in time: the taint stays until the next start removes it (or remove it by hand)"),
            }
        }
        tracing::info!("shutting down: detaching kernel programs");
        Ok(())
    }

    /// The agent pod of this DaemonSet that takes the node over from this one (a rollout's
    /// surge: see `node_agent_kube::handover`), asked once within a third of the stop's time;
    /// none when it cannot be known (standalone, no pod name, no answer).
    async fn taking_over(&self) -> Option<String> {
        let kube = self.kube.as_ref()?;
        let (namespace, pod) = self.config.overrides.own_pod.as_ref()?;
        let asked = tokio::time::timeout(
            STOP_DEADLINE / 3,
            node_agent_kube::handover::ready_sibling(&kube.cluster.api, namespace, pod),
        )
        .await;
        match asked {
            Ok(Ok(sibling)) => sibling,
            Ok(Err(e)) => {
                tracing::debug!(error = %error_chain(&e), "could not ask for a sibling agent on this node");
                None
            }
            Err(_) => None,
        }
    }

    /// Attributes and publishes a batch of kernel events; evaluates once if any touches a
    /// signal (with the first such event's timestamp, for the latency histogram).
    fn on_records(&mut self, records: Records) {
        let batch = match &self.kube {
            Some(k) => {
                let snapshot = k.cluster.snapshots.borrow();
                self.kernel
                    .feed
                    .attribute(records, &SnapshotNames(snapshot.as_ref()))
            }
            None => self.kernel.feed.attribute(records, &NoNames),
        };
        for e in &batch.undecodable {
            self.report.metrics.decode_error();
            tracing::warn!(error = %e, "undecodable kernel record");
        }
        if let Some(t) = batch.rescanned {
            self.kernel.rescanned(t, &self.report);
        }
        let mut first = None;
        for event in &batch.events {
            let saw_before = match &event.what {
                Happened::OomKill(kill) => match self.before_oom_kill(event.ktime_ns, kill) {
                    Some(saw) => Some(saw),
                    None => continue,
                },
                Happened::MemoryThreshold(MemoryThreshold {
                    cgroup,
                    direction: Direction::Up,
                    ..
                }) => {
                    if let Some(path) = &cgroup.path {
                        self.report
                            .recent
                            .line_crossed(event.ktime_ns, path.clone());
                    }
                    None
                }
                _ => None,
            };
            self.report.kernel_event(event, saw_before.clone());
            if let Some(trigger) = self.on_kernel_event(event, saw_before.as_ref()) {
                first.get_or_insert((trigger, event.ktime_ns));
            }
        }
        if let Some((trigger, ktime_ns)) = first {
            self.evaluate(trigger, Some(ktime_ns));
        }
    }

    /// What a kernel event asks for: an evaluation (and for an OOM kill, its event: see
    /// [`Daemon::on_oom_kill`]).
    fn on_kernel_event(&mut self, event: &Attributed, saw: Option<&SawBefore>) -> Option<Trigger> {
        match &event.what {
            Happened::MemoryThreshold(crossing) => {
                if crossing.direction == Direction::Up {
                    self.kernel.triggers.crossed(crossing.cgroup.cgroup_id);
                }
                Some(Trigger::MemoryThreshold)
            }
            Happened::PidThreshold(_) => Some(Trigger::PidThreshold),
            Happened::OomKill(kill) => {
                self.on_oom_kill(kill, saw);
                Some(Trigger::OomKill)
            }
            Happened::ForkStorm(_) => None,
        }
    }

    /// Records what the executor reports, and decides again when the next step may go now.
    fn on_outcome(&mut self, outcome: Outcome) {
        let now = self.now();
        if let Some(after) = self.acts.learn(&outcome, now) {
            self.ahead.relieved(true, after);
        }
        match outcome {
            Outcome::Eviction(report) => {
                self.report.eviction(&report);
                // The next pod goes as soon as the pacing allows: decide again now. (After a
                // kill on the node, once its memory is back: `freed_memory`.)
                if !report.attempt.result.pod_goes() {
                    self.evaluate(Trigger::EvictionOutcome, None);
                }
            }
            Outcome::Recorded(record) => self.report.recorded(&record),
            Outcome::EvictionShed { refused, .. } => {
                // Never attempted: a refusal of the lane, counted as such; tried again shortly.
                self.report.side_effect(&Outcome::Refused(refused));
            }
            Outcome::Reclaim(outcome) => {
                let after = Reporter::reading_after(&self.node.read(), outcome.signal);
                let back = outcome.result
                    != node_agent_executor::reclaim::ReclaimResult::RuntimeUnavailable
                    && self.report.runtime(None);
                self.report.reclaim(&outcome, after);
                // A runtime back from an outage may have restarted elsewhere: ask it anew.
                self.acts.detect_images_if_due(now, back);
                // Observe the node again now: evict only if the threshold is still met.
                self.evaluate(Trigger::ReclaimOutcome, None);
            }
            Outcome::ImagesDetected(Ok(detected)) => {
                tracing::debug!(images = detected.images, image_fs = ?detected.image_fs,
                    container_fs = ?detected.container_fs, "container runtime images detected");
                let back = self.report.runtime(None);
                let fs = &mut self.node.fs;
                if fs.runtime_says(
                    detected.image_fs.as_deref(),
                    detected.container_fs.as_deref(),
                ) {
                    tracing::info!(nodefs = %fs.nodefs().display(), image_fs = ?detected.image_fs,
                        container_fs = ?detected.container_fs,
                        "the container runtime's filesystems: the layout is decided by their devices");
                }
                if back {
                    self.acts.detect_images_if_due(now, true);
                }
            }
            Outcome::ImagesDetected(Err(error)) => {
                if matches!(error, node_agent_executor::reclaim::RuntimeError::Busy(_)) {
                    // A reclaim holds the runtime lane: asked again next period.
                    tracing::debug!(error = %error, "image detection skipped");
                    return;
                }
                let why = error_chain(&error);
                self.node.fs.runtime_unavailable(why.clone());
                self.report.runtime(Some(why));
            }
            Outcome::Identified { kill, who } => self.on_identified(*kill, who, now),
            other => {
                if matches!(
                    other,
                    Outcome::NodeEvent { .. } | Outcome::PodOomEvent { .. }
                ) {
                    self.report.lanes_clear();
                }
                self.report.side_effect(&other);
            }
        }
    }

    /// A pod killed on the node: once its memory is back, the node is decided again at once.
    fn freed_memory(&mut self) {
        let cgroups = crate::observe::pods::NodeCgroups {
            version: self.node.layout.version(),
        };
        let now = self.now();
        let ended = self.acts.settle(now, &cgroups);
        if !ended.is_empty() {
            self.settled(&ended, now);
            self.evaluate(Trigger::EvictionOutcome, None);
        }
    }

    /// Evictions done with: an urgent one through the API says how long relief took (to its
    /// memory freed).
    pub(super) fn settled(
        &mut self,
        ended: &[(node_agent_executor::plan::InFlight, bool)],
        now: Duration,
    ) {
        use node_agent_executor::plan::Track;
        for (f, done) in ended {
            tracing::debug!(pod = %f.pod, done_with = done, "eviction settled");
            if *done && f.urgent && f.track == Track::Threshold {
                self.ahead.relieved(false, now.saturating_sub(f.since));
            }
        }
    }

    /// Every second: losses, rescans, the runtime's images when due, local storage limits.
    fn housekeeping(&mut self) {
        self.host_pid_max();
        self.kubelet_pid_limit();
        self.kernel.housekeeping(&self.report);
        self.name_unlisted_pods();
        self.acts.flush_oom(self.now());
        self.report.recent.expire(crate::sys::monotonic_ns());
        self.acts.detect_images_if_due(self.now(), false);
        if self.local_storage_due() {
            self.evaluate(Trigger::LocalStorage, None);
        }
    }

    /// A pod cgroup the pod source has not listed (a pod admitted since its last refresh): it
    /// is asked at once, rather than at its next refresh (see `naming`).
    fn name_unlisted_pods(&mut self) {
        let Some(kube) = &mut self.kube else {
            return;
        };
        let unlisted = {
            let snapshot = kube.cluster.snapshots.borrow();
            let Some(snapshot) = snapshot.as_ref() else {
                return;
            };
            crate::observe::pods::unlisted_uids(
                self.kernel.feed.index(),
                &self.config.current.settings.node_cgroup,
                &snapshot.listed_uids,
            )
        };
        if kube.naming.any_new(unlisted) {
            kube.cluster.name_pods_now();
        }
    }

    /// Whether the latest pod snapshot has a pod over a local storage limit that the agent may
    /// evict now, or the pods over one that it may not evict changed: checked every
    /// housekeeping tick, so such a pod goes (or is said to stay) within about a second of the
    /// stats showing it (the kubelet: at its next synchronize), not at the next resync. A
    /// threshold's eviction in flight or paced never holds it up.
    fn local_storage_due(&self) -> bool {
        let Some(kube) = &self.kube else {
            return false;
        };
        let snapshot = kube.cluster.snapshots.borrow();
        let Some(snapshot) = snapshot.as_ref() else {
            return false;
        };
        let cgroups = crate::observe::pods::NodeCgroups {
            version: self.node.layout.version(),
        };
        self.acts.local_storage_due(
            &snapshot.pods,
            self.node.has_imagefs(),
            self.now(),
            &cgroups,
        )
    }

    /// At start and after each reload: where allocatable memory comes from, and its figure.
    pub(super) fn sync_allocatable(&mut self) {
        let settings = &self.config.current.settings;
        let changed = self.node.allocatable_feed.sync(
            settings.allocatable_memory,
            self.kube.as_ref().map(|k| &k.cluster),
            settings.resync_interval,
            self.acts.generation(),
            &mut self.node.allocatable,
            &self.report.metrics,
        );
        if changed {
            self.kernel.triggers.forget();
        }
    }

    /// The host's `pid_max` from the kernel programs: when it changes, as for the kubelet's.
    fn host_pid_max(&mut self) {
        let pid_max = self.kernel.host_pid_max();
        if self.node.take_host_pid_max(pid_max) {
            self.pid_limit_changed();
        }
    }

    /// The kubelet's task limit from the latest summary: when it changes, the kernel's
    /// `pid.available` line is set again against it and the node decided again at once.
    fn kubelet_pid_limit(&mut self) {
        let Some(kube) = &self.kube else {
            return;
        };
        let figure = kube
            .cluster
            .snapshots
            .borrow()
            .as_ref()
            .and_then(|s| s.kubelet_max_pids.clone());
        if self.node.take_kubelet_pid_limit(figure.as_ref()) {
            self.pid_limit_changed();
        }
    }

    /// The kernel's `pid.available` line set again against the new limit, and the node decided
    /// again at once.
    fn pid_limit_changed(&mut self) {
        let reading = self.node.read();
        self.kernel
            .set_pid_trigger(&self.config.current.eviction, &reading);
        self.evaluate(Trigger::PidLimit, None);
    }

    /// The Node's figure changed: taken at once, the kernel lines re-armed by an evaluation now.
    fn allocatable_changed(&mut self) {
        let feed = &mut self.node.allocatable_feed;
        if let Some(was) = feed.take_change(&mut self.node.allocatable) {
            self.kernel.triggers.forget();
            self.evaluate(Trigger::Allocatable, None);
            allocatable::say_changed(&was, &self.node.allocatable);
        }
    }
}
