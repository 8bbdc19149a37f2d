//! The loop: one `select!` over kernel events, timers, finished evictions and signals.

use std::time::{Duration, Instant, SystemTime};

use node_agent_kube::events as kube_events;
use tokio::sync::mpsc;

use super::{Daemon, Finished, Signals, Trigger};
use crate::{ebpf::KernelEvent, trace::Record};

impl Daemon {
    pub(super) async fn run_loop(
        &mut self,
        mut events: crate::ebpf::EventStream,
        mut finished_rx: mpsc::Receiver<Finished>,
        mut signals: Signals,
    ) -> anyhow::Result<()> {
        let mut resync = tokio::time::interval(self.config.settings.resync_interval);
        let mut poll = tokio::time::interval(self.config.settings.pressure_poll_interval);
        let mut housekeeping = tokio::time::interval(Duration::from_secs(1));
        let mut lost_before = 0u64;
        self.evaluate(Trigger {
            name: "start",
            ktime_ns: None,
        })
        .await;
        self.health.set_ready(true);
        loop {
            self.health.beat();
            tokio::select! {
                batch = events.next_batch() => {
                    let mut trigger = None;
                    for record in batch? {
                        match record {
                            Ok(event) => {
                                if let Some(t) = self.on_kernel_event(&event).await {
                                    trigger.get_or_insert(t);
                                }
                            }
                            Err(e) => {
                                self.metrics.decode_error();
                                tracing::warn!(error = %e, "undecodable kernel record");
                            }
                        }
                    }
                    if let Some(t) = trigger {
                        self.evaluate(t).await;
                    }
                }
                _ = poll.tick(), if self.pressure => self.evaluate(Trigger { name: "pressure_poll", ktime_ns: None }).await,
                _ = resync.tick() => self.evaluate(Trigger { name: "resync", ktime_ns: None }).await,
                Some(done) = finished_rx.recv() => {
                    if self.in_flight.as_deref() == Some(done.uid.as_str()) {
                        self.in_flight = None;
                    }
                    self.evaluate(Trigger { name: "eviction_done", ktime_ns: None }).await;
                }
                _ = housekeeping.tick() => {
                    let per_cpu = self.programs.lost_events()?;
                    let total: u64 = per_cpu.iter().sum();
                    if total > lost_before {
                        self.metrics.ring_lost(total - lost_before);
                        let rec = Record::EventsLost { time: crate::sys::now_rfc3339(), lost: total - lost_before, total_per_cpu: per_cpu };
                        tracing::warn!(lost = total - lost_before, "kernel events lost: ring buffer full");
                        self.live.publish(&rec);
                        lost_before = total;
                    }
                    if self.rescan.due(Instant::now()) {
                        if let Err(e) = self.track_new_cgroups() {
                            tracing::warn!(error = %e, "rescanning cgroups");
                        }
                    }
                    if self.config_changed() {
                        self.reload("config file changed");
                    }
                }
                _ = signals.hup.recv() => self.reload("SIGHUP"),
                _ = signals.term.recv() => break,
                _ = tokio::signal::ctrl_c() => break,
            }
        }
        tracing::info!("shutting down: detaching kernel programs");
        Ok(())
    }

    /// Records and publishes a kernel event; returns a trigger when it touches a signal.
    pub(super) async fn on_kernel_event(&mut self, event: &KernelEvent) -> Option<Trigger> {
        let ktime_ns = event.header().ktime_ns;
        // A cgroup newer than the last rescan (a pod that just started): rescan before
        // attributing, so the event names its pod.
        let cgroup = match event {
            KernelEvent::OomKill(e) => Some(e.cgroup_id),
            KernelEvent::ForkStorm(e) => Some(e.cgroup_id),
            KernelEvent::MemoryThreshold(_)
            | KernelEvent::PidThreshold(_)
            | KernelEvent::CgroupChange(_) => None,
        };
        if cgroup.is_some_and(|id| self.index.lookup(id).is_none()) {
            if let Err(e) = self.track_new_cgroups() {
                tracing::warn!(error = %e, "rescanning cgroups");
            }
        }
        let Some(record) = Record::from_event(
            event,
            &self.index,
            crate::sys::ktime_rfc3339(ktime_ns),
            crate::sys::page_size(),
        ) else {
            // A cgroup came or went: rescan at the next housekeeping tick.
            self.rescan.mark();
            return None;
        };
        self.metrics.kernel_event(record.kind());
        self.live.publish(&record);
        match event {
            KernelEvent::MemoryThreshold(m) => {
                if m.direction == node_agent_common::DIRECTION_UP {
                    self.triggers.crossed(m.cgroup_id);
                }
                Some(Trigger {
                    name: "memory_threshold",
                    ktime_ns: Some(ktime_ns),
                })
            }
            KernelEvent::PidThreshold(_) => Some(Trigger {
                name: "pid_threshold",
                ktime_ns: Some(ktime_ns),
            }),
            KernelEvent::OomKill(oom) => {
                self.on_oom(&record, oom).await;
                Some(Trigger {
                    name: "oom_kill",
                    ktime_ns: Some(ktime_ns),
                })
            }
            KernelEvent::ForkStorm(_) | KernelEvent::CgroupChange(_) => None,
        }
    }

    /// An OOM kill: counted by namespace and, with a cluster, reported on the node as
    /// `OOMKilling` naming the process and its pod.
    pub(super) async fn on_oom(&mut self, record: &Record, oom: &node_agent_common::OomKillEvent) {
        let uid = record.pod_uid().map(str::to_string);
        let pod = uid.as_deref().and_then(|uid| {
            self.snapshot()
                .and_then(|s| s.pods.iter().find(|p| p.uid == uid).cloned())
        });
        self.metrics
            .oom_kill(pod.as_ref().map(|p| p.namespace.as_str()).unwrap_or(""));
        if let Some(kube) = &self.kube {
            let kill = kube_events::OomKill {
                pid: oom.pid,
                comm: crate::ebpf::events::comm(&oom.comm),
                pod: pod.map(|p| (p.namespace, p.name)),
            };
            let event =
                kube_events::build_oom_killing(&kube.config.node_name, &kill, SystemTime::now());
            let executor = kube.executor.clone();
            let metrics = self.metrics.clone();
            tokio::spawn(async move {
                if executor.events().post(&event).await.is_err() {
                    metrics.kube_error("oom event");
                }
            });
        }
    }
}
