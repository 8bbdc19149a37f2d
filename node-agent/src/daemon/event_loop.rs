//! The loop: one `select!` over kernel events, the executor's outcomes, timers and signals.
//! Every branch ends in at most one evaluation.

use std::time::Duration;

use node_agent_kube::executor::{Action, Outcome};

use super::{DaemonError, Trigger};
use crate::{
    cgroup::attribution::{attribute, Happened, NoNames, PodNames},
    ebpf::KernelEvent,
    trace::Record,
};

/// How often ring-buffer losses, cgroup rescans and the config file are checked.
const HOUSEKEEPING: Duration = Duration::from_secs(1);
/// How often the runtime's images are detected for node-level reclaim (the kubelet's image GC
/// period, when it runs `detectImages`).
const IMAGE_DETECT_PERIOD: Duration = Duration::from_secs(300);

pub(super) struct Signals {
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    pub(super) fn new() -> std::io::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }
}

/// Pod names from the latest snapshot, for attribution.
struct SnapshotNames<'a>(Option<&'a node_agent_kube::pods::PodSnapshot>);

impl PodNames for SnapshotNames<'_> {
    fn pod(&self, uid: &str) -> Option<(String, String)> {
        let p = self.0.as_ref()?.by_uid(uid)?;
        Some((p.namespace.clone(), p.name.clone()))
    }
    fn container(&self, id: &str) -> Option<String> {
        Some(self.0.as_ref()?.containers.get(id)?.name.clone())
    }
}

impl super::Daemon {
    pub(super) async fn run_loop(
        &mut self,
        mut events: crate::ebpf::EventStream,
        mut signals: Signals,
    ) -> Result<(), DaemonError> {
        let mut housekeeping = tokio::time::interval(HOUSEKEEPING);
        let mut lost_before = 0u64;
        self.evaluate(Trigger::named("start")).await;
        self.telemetry.health.set_ready(true);
        loop {
            self.telemetry.health.beat();
            let now = self.now();
            let paced = self.acts.state.paced_until(now);
            let wait_paced = async {
                match paced {
                    Some(at) => tokio::time::sleep(at.saturating_sub(now)).await,
                    None => std::future::pending().await,
                }
            };
            let polling = self.pressure || self.acts.state.in_flight().is_some();
            tokio::select! {
                batch = events.next_batch() => {
                    let mut trigger = None;
                    for record in batch.map_err(DaemonError::Events)? {
                        match record {
                            Ok(event) => {
                                if let Some(t) = self.on_kernel_event(&event).await {
                                    trigger.get_or_insert(t);
                                }
                            }
                            Err(e) => {
                                self.telemetry.metrics.decode_error();
                                tracing::warn!(error = %e, "undecodable kernel record");
                            }
                        }
                    }
                    if let Some(t) = trigger {
                        self.evaluate(t).await;
                    }
                }
                outcome = self.acts.outcomes.recv() => {
                    let outcome = outcome.ok_or(DaemonError::ExecutorStopped)?;
                    let trigger = match outcome {
                        Outcome::Reclaim(_) => "reclaim_outcome",
                        _ => "eviction_outcome",
                    };
                    if self.on_outcome(outcome) {
                        self.evaluate(Trigger::named(trigger)).await;
                    }
                }
                () = wait_paced, if self.pressure => self.evaluate(Trigger::named("pacing")).await,
                _ = self.timers.poll.tick(), if polling => self.evaluate(Trigger::named("pressure_poll")).await,
                _ = self.timers.resync.tick() => self.evaluate(Trigger::named("resync")).await,
                () = super::allocatable::changed(&mut self.allocatable) => self.node_allocatable_changed().await,
                _ = housekeeping.tick() => {
                    let per_cpu = self.kernel.programs.lost_events()?;
                    let total: u64 = per_cpu.iter().sum();
                    if total > lost_before {
                        self.telemetry.metrics.ring_lost(total - lost_before);
                        tracing::warn!(lost = total - lost_before, "kernel events lost: ring buffer full");
                        let rec = Record::EventsLost { time: crate::sys::now_rfc3339(), lost: total - lost_before, total_per_cpu: per_cpu };
                        self.telemetry.live.publish(&rec);
                        lost_before = total;
                    }
                    self.export_kernel_counters();
                    self.rescan_if_due();
                    self.detect_images_if_due().await;
                    if self.local_storage_due() {
                        self.evaluate(Trigger::named("local_storage")).await;
                    }
                    if self.config_changed() {
                        self.reload("config file changed").await;
                    }
                }
                _ = signals.hup.recv() => self.reload("SIGHUP").await,
                _ = signals.term.recv() => break,
                _ = tokio::signal::ctrl_c() => break,
            }
        }
        tracing::info!("shutting down: detaching kernel programs");
        Ok(())
    }

    /// Attributes, records and publishes a kernel event; returns a trigger when it touches a
    /// signal.
    async fn on_kernel_event(&mut self, event: &KernelEvent) -> Option<Trigger> {
        if let KernelEvent::CgroupChange(_) = event {
            self.kernel.tracker.mark_changed();
            return None;
        }
        // A cgroup newer than the last rescan (a pod that just started): rescan before
        // attributing, so the event names its pod.
        let cgroup = match event {
            KernelEvent::OomKill(e) => Some(e.cgroup_id),
            KernelEvent::ForkStorm(e) => Some(e.cgroup_id),
            _ => None,
        };
        if cgroup.is_some_and(|id| self.kernel.tracker.index().lookup(id).is_none()) {
            self.rescan();
        }
        let (index, page_size) = (self.kernel.tracker.index(), crate::sys::page_size());
        let attributed = match &self.cluster {
            Some(c) => {
                let snapshot = c.snapshots.borrow();
                attribute(event, index, &SnapshotNames(snapshot.as_ref()), page_size)
            }
            None => attribute(event, index, &NoNames, page_size),
        }?;
        let record = Record::event(&attributed, crate::sys::ktime_rfc3339(attributed.ktime_ns));
        self.telemetry.metrics.kernel_event(record.kind());
        self.telemetry.live.publish(&record);
        let ktime_ns = Some(attributed.ktime_ns);
        match attributed.what {
            Happened::MemoryThreshold {
                cgroup, direction, ..
            } => {
                if direction == crate::cgroup::attribution::Direction::Up {
                    self.kernel.triggers.crossed(cgroup.cgroup_id);
                }
                Some(Trigger::at("memory_threshold", ktime_ns))
            }
            Happened::PidThreshold { .. } => Some(Trigger::at("pid_threshold", ktime_ns)),
            Happened::OomKill(kill) => {
                let pod = kill
                    .victim
                    .pod_name()
                    .map(|(ns, name)| (ns.to_string(), name.to_string()));
                self.telemetry
                    .metrics
                    .oom_kill(pod.as_ref().map(|(ns, _)| ns.as_str()).unwrap_or(""));
                let kill = node_agent_kube::events::OomKill {
                    pid: kill.pid,
                    comm: kill.comm,
                    pod,
                };
                let actions =
                    super::acting::oom_kill_actions(self.config.kubernetes.as_ref(), kill);
                self.act(actions).await;
                Some(Trigger::at("oom_kill", ktime_ns))
            }
            Happened::ForkStorm { .. } => None,
        }
    }

    /// Hands actions to the executor (it works through them in order).
    pub(super) async fn act(&mut self, actions: Vec<Action>) {
        for action in actions {
            if self.acts.actions.send(action).await.is_err() {
                tracing::error!("the executor stopped; its actions are lost");
            }
        }
    }

    /// The kernel programs' own counters (records sent, sampler ticks) onto /metrics. A map
    /// that cannot be read leaves the last values: logged, never fatal to the loop.
    fn export_kernel_counters(&mut self) {
        let programs = &mut self.kernel.programs;
        match (programs.sent_events(), programs.sampler_stats()) {
            (Ok(sent), Ok(sampler)) => self
                .telemetry
                .metrics
                .set_kernel_counters(sent.iter().sum(), sampler),
            (Err(error), _) | (_, Err(error)) => {
                tracing::debug!(%error, "the kernel programs' counters could not be read");
            }
        }
    }

    /// Records what the executor reports; true when the loop should decide again now.
    fn on_outcome(&mut self, outcome: Outcome) -> bool {
        let metrics = &self.telemetry.metrics;
        match outcome {
            Outcome::Eviction(report) => {
                let result = report.attempt.result;
                metrics.eviction(report.eviction.signal, result);
                if let Some(error) = &report.event_error {
                    metrics.kube_error("pod event");
                    tracing::warn!(%error, "the pod's Evicted event was not recorded");
                }
                tracing::info!(
                    pod = %format!("{}/{}", report.eviction.namespace, report.eviction.name),
                    signal = %report.eviction.signal, result = result.as_str(),
                    reason = report.attempt.detail.as_deref().unwrap_or(""),
                    retry_after = ?report.attempt.retry_after, "eviction outcome"
                );
                self.telemetry
                    .live
                    .publish(&Record::eviction(&report, crate::sys::now_rfc3339()));
                let timing = self.timing();
                let now = self.now();
                self.acts.state.reported(&report, &timing, now);
                // The next pod goes as soon as the pacing allows: decide again now.
                !result.pod_goes()
            }
            Outcome::NodeEvent { reason, error } => {
                if let Some(error) = error {
                    metrics.kube_error(reason);
                    tracing::warn!(reason, %error, "node event not recorded");
                }
                false
            }
            Outcome::Condition { pressure, error } => {
                if let Some(error) = error {
                    metrics.kube_error("node condition");
                    tracing::warn!(pressure, %error, "node condition not written");
                }
                false
            }
            Outcome::Taint { wanted, result } => {
                if let Err(error) = result {
                    metrics.kube_error("node taint");
                    tracing::warn!(wanted, %error, "node taint not written");
                }
                false
            }
            Outcome::Reclaim(outcome) => {
                self.on_reclaim(&outcome);
                // Observe the node again now: evict only if the threshold is still met.
                true
            }
            Outcome::ImagesDetected(result) => {
                match result {
                    Ok(images) => {
                        tracing::debug!(images, "container runtime images detected");
                        self.runtime_reachable(None);
                    }
                    Err(error) => self.runtime_reachable(Some(error)),
                }
                false
            }
        }
    }

    /// Counts, logs and publishes a node-level reclaim, with the signal observed after it.
    fn on_reclaim(&mut self, outcome: &node_agent_kube::reclaim::ReclaimOutcome) {
        use node_agent_kube::reclaim::ReclaimResult;
        let metrics = &self.telemetry.metrics;
        metrics.reclaim().record(outcome);
        if let Some(error) = &outcome.event_error {
            metrics.kube_error("reclaim event");
            tracing::warn!(%error, "the node's reclaim event was not recorded");
        }
        match outcome.result {
            ReclaimResult::RuntimeUnavailable => {
                self.runtime_reachable(outcome.error.clone().or(Some(String::new())));
            }
            ReclaimResult::Partial => {
                self.runtime_reachable(None);
                tracing::warn!(signal = %outcome.signal, "{}", outcome.summary());
            }
            ReclaimResult::NothingToReclaim => {
                // Under lasting pressure this comes every resync: not worth a line each time.
                self.runtime_reachable(None);
                tracing::debug!(signal = %outcome.signal, "{}", outcome.summary());
            }
            ReclaimResult::Reclaimed | ReclaimResult::DryRun => {
                self.runtime_reachable(None);
                tracing::info!(signal = %outcome.signal, "{}", outcome.summary());
            }
        }
        let after = super::observe::read_node(&self.node)
            .observations
            .get(&outcome.signal)
            .map(|o| o.available);
        self.telemetry
            .live
            .publish(&Record::reclaim(outcome, after, crate::sys::now_rfc3339()));
        let now = self.now();
        self.acts.state.reclaimed(now);
    }

    /// Logs when the container runtime becomes unreachable and when it is back; the gauge
    /// follows.
    fn runtime_reachable(&mut self, error: Option<String>) {
        self.telemetry
            .metrics
            .reclaim()
            .set_runtime_unavailable(error.is_some());
        match (&self.acts.runtime_error, &error) {
            (None, Some(error)) => tracing::warn!(%error,
                "container runtime unavailable: node-level reclaim is skipped and disk pressure evicts pods directly"),
            (Some(_), None) => {
                tracing::info!("container runtime reachable again: node-level reclaim resumes")
            }
            _ => {}
        }
        self.acts.runtime_error = error;
    }

    /// The kubelet's periodic image detection, through the executor, when reclaim is on.
    async fn detect_images_if_due(&mut self) {
        if self.config.runtime.is_none() {
            return;
        }
        let now = self.now();
        if self
            .acts
            .images_detected_at
            .is_some_and(|t| now < t + IMAGE_DETECT_PERIOD)
        {
            return;
        }
        self.acts.images_detected_at = Some(now);
        self.act(vec![Action::DetectImages]).await;
    }

    /// Rescans the cgroups now (a cgroup named by an event is not known yet).
    fn rescan(&mut self) {
        self.kernel.tracker.mark_changed();
        self.rescan_if_due();
    }

    fn rescan_if_due(&mut self) {
        match self
            .kernel
            .tracker
            .refresh_if_due(&mut self.kernel.programs)
        {
            Ok(Some(t)) => {
                self.telemetry.metrics.set_tracked_cgroups(
                    t.tracked as i64,
                    t.untracked as i64,
                    t.cap_reached,
                );
                self.kernel
                    .triggers
                    .refresh_targets(self.kernel.tracker.index());
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "rescanning cgroups"),
        }
    }
}
