//! The methods the daemon records through: one per metric family, lock-free once a label
//! set exists.

use std::sync::atomic::Ordering;

use node_agent_common::SamplerStats;
use node_agent_policy::{EvictionSignal, Resource};

use super::*;
use crate::ebpf::MemoryMechanism;

impl Metrics {
    /// Counter `node_agent_telemetry_authorizations_total{result}`: a caller let in (`allowed`)
    /// or not, and why.
    pub fn telemetry_authorization(&self, result: &'static str) {
        self.telemetry_authorizations
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Counter `node_agent_telemetry_connections_closed_total{reason}`: connections the
    /// metrics and health listener closed so that others get in (see `telemetry::connections`).
    pub fn telemetry_connection_closed(&self, reason: &'static str) {
        self.telemetry_connections_closed
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Gauge `node_agent_signal_available_{bytes,inodes,pids}{eviction_signal}`: one family
    /// per unit, chosen by the signal's resource.
    pub fn set_signal_available(&self, signal: Signal, available: i64) {
        let family = match signal.resource() {
            Resource::Memory | Resource::EphemeralStorage => &self.signal_available_bytes,
            Resource::Inodes => &self.signal_available_inodes,
            Resource::Pids => &self.signal_available_pids,
        };
        family
            .get_or_create(&SignalLabels {
                eviction_signal: signal.as_str(),
            })
            .set(available);
    }

    /// Gauge `node_agent_memory_mechanism{mechanism}`: 1 for the mechanism in use (set once,
    /// at start).
    pub fn set_memory_mechanism(&self, mechanism: MemoryMechanism) {
        let mechanism = mechanism.short_name();
        self.memory_mechanism
            .get_or_create(&MechanismLabels { mechanism })
            .set(1);
    }

    /// Gauge `node_agent_threshold_met{eviction_signal,kind="hard"|"soft"}` 1/0.
    pub fn set_threshold_met(&self, signal: Signal, hard: bool, met: bool) {
        let labels = ThresholdLabels {
            eviction_signal: signal.as_str(),
            kind: if hard { "hard" } else { "soft" },
        };
        self.threshold_met
            .get_or_create(&labels)
            .set(i64::from(met));
    }

    /// Gauge `node_agent_node_condition{condition}` 1/0 (MemoryPressure, DiskPressure,
    /// PIDPressure).
    pub fn set_condition(&self, condition: &str, active: bool) {
        self.node_condition
            .get_or_create(&ConditionLabels {
                condition: condition.to_owned(),
            })
            .set(i64::from(active));
    }

    /// Counter `node_agent_evictions_total{eviction_signal,result}` (result: evicted,
    /// pdb_overridden, dry_run, blocked_by_pdb, rate_limited, api_rate_limited, already_gone,
    /// refused, failed).
    /// The signal is a threshold's or a local storage limit's (`emptydirfs.limit`, ...), as the
    /// kubelet's `evictions` metric labels them.
    pub fn eviction(&self, signal: EvictionSignal, result: EvictionResult) {
        self.evictions
            .get_or_create(&EvictionLabels {
                eviction_signal: signal.as_str(),
                result: result.as_str(),
            })
            .inc();
    }

    /// Counter `node_agent_oom_kills_total{namespace,container,reason}` (`none` for what is
    /// not a pod's, or a container the agent cannot name); with `foreseen`, also
    /// `node_agent_oom_kills_foreseen_total{reason}`. No pod names or UIDs: the labels are as
    /// many as the namespaces and container names on the node.
    pub fn oom_kill(&self, namespace: &str, container: &str, reason: &'static str, foreseen: bool) {
        let or_none = |s: &str| {
            if s.is_empty() {
                "none".to_owned()
            } else {
                s.to_owned()
            }
        };
        self.oom_kills
            .get_or_create(&OomLabels {
                namespace: or_none(namespace),
                container: or_none(container),
                reason,
            })
            .inc();
        if foreseen {
            self.oom_kills_foreseen
                .get_or_create(&OomReasonLabels { reason })
                .inc();
        }
    }

    /// Counter `node_agent_kernel_events_total{kind}`.
    pub fn kernel_event(&self, kind: &str) {
        self.kernel_events
            .get_or_create(&KindLabels {
                kind: kind.to_owned(),
            })
            .inc();
    }

    /// Counter `node_agent_ringbuf_lost_events_total` (add the delta).
    pub fn ring_lost(&self, delta: u64) {
        self.ringbuf_lost_events.inc_by(delta);
    }

    /// Counters `node_agent_ringbuf_sent_events_total` (the kernel's per-CPU `SENT`, summed)
    /// and, when the sampler runs, `node_agent_memory_sampler_ticks_total`,
    /// `node_agent_memory_sampler_busy_seconds_total`,
    /// `node_agent_memory_sampler_late_ticks_total` and
    /// `node_agent_memory_sampler_alone_ticks_total`: totals since load, copied as they are.
    pub fn set_kernel_counters(&self, sent: u64, sampler: Option<SamplerStats>) {
        let k = &self.kernel_stats;
        k.sent.store(sent, Ordering::Relaxed);
        if let Some(stats) = sampler {
            k.sampler_ticks.store(stats.ticks, Ordering::Relaxed);
            k.sampler_busy_ns.store(stats.busy_ns, Ordering::Relaxed);
            k.sampler_late_ticks
                .store(stats.late_ticks, Ordering::Relaxed);
            k.sampler_alone_ticks
                .store(stats.alone_ticks, Ordering::Relaxed);
        }
        k.sampler.store(sampler.is_some(), Ordering::Relaxed);
    }

    /// Counter `node_agent_ringbuf_decode_errors_total`.
    pub fn decode_error(&self) {
        self.ringbuf_decode_errors.inc();
    }

    /// Histogram `node_agent_decision_latency_seconds{trigger}`: kernel timestamp of the
    /// triggering event → decision, buckets [`DECISION_LATENCY_BUCKETS`]. A negative or
    /// non-finite value (a clock mix-up upstream) would corrupt the sum for good, so it is
    /// counted in `node_agent_decision_latency_invalid_total{trigger}` instead.
    pub fn decision_latency(&self, trigger: Trigger, seconds: f64) {
        let labels = TriggerLabels {
            trigger: trigger.as_str(),
        };
        if seconds.is_finite() && seconds >= 0.0 {
            self.decision_latency
                .get_or_create(&labels)
                .observe(seconds);
        } else {
            self.decision_latency_invalid.get_or_create(&labels).inc();
        }
    }

    /// Counter `node_agent_evaluations_total{trigger}`.
    pub fn evaluation(&self, trigger: Trigger) {
        self.evaluations
            .get_or_create(&TriggerLabels {
                trigger: trigger.as_str(),
            })
            .inc();
    }

    /// Counter `node_agent_stale_data_total{source}`: a decision refused because its data was
    /// too old.
    pub fn stale_data(&self, source: &str) {
        self.stale_data
            .get_or_create(&SourceLabels {
                source: source.to_owned(),
            })
            .inc();
    }

    /// Counter `node_agent_eviction_records_total{result}` (one of [`RECORD_RESULTS`]), and
    /// gauge `node_agent_eviction_records_waiting`.
    pub fn eviction_record(&self, result: &'static str, waiting: i64) {
        self.eviction_records
            .get_or_create(&ResultLabels { result })
            .inc();
        self.eviction_records_waiting.set(waiting);
    }

    /// Gauge `node_agent_hard_evictions_on_node`.
    pub fn set_hard_evictions_on_node(&self, on: bool) {
        self.hard_evictions_on_node.set(i64::from(on));
    }

    /// Counter `node_agent_config_reloads_total{result="ok"|"invalid"|"refused"|"retrying"}`.
    pub fn config_reload(&self, result: &'static str) {
        self.config_reloads
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Gauges `node_agent_tracked_cgroups` and `node_agent_untracked_cgroups`; counter
    /// `node_agent_tracking_cap_reached_total` when the cap was just reached.
    pub fn set_tracked_cgroups(&self, tracked: i64, untracked: i64, cap_reached: bool) {
        self.tracked_cgroups.set(tracked);
        self.untracked_cgroups.set(untracked);
        if cap_reached {
            self.tracking_cap_reached.inc();
        }
    }

    /// Gauge `node_agent_signal_unknown{eviction_signal}` 1/0.
    pub fn set_signal_unknown(&self, signal: Signal, unknown: bool) {
        self.signal_unknown
            .get_or_create(&SignalLabels {
                eviction_signal: signal.as_str(),
            })
            .set(i64::from(unknown));
    }

    /// Gauge `node_agent_no_evictable_pod{eviction_signal}`: 1 for `signal` (counted in
    /// `node_agent_no_evictable_pod_events_total{eviction_signal}`), 0 for every other;
    /// `None`: all 0.
    pub fn set_no_evictable_pod(&self, signal: Option<Signal>) {
        for s in Signal::ALL {
            let labels = SignalLabels {
                eviction_signal: s.as_str(),
            };
            let on = signal == Some(s);
            self.no_evictable_pod
                .get_or_create(&labels)
                .set(i64::from(on));
            if on {
                self.no_evictable_pod_events.get_or_create(&labels).inc();
            }
        }
    }

    /// Counter `node_agent_kube_errors_total{operation}`.
    pub fn kube_error(&self, operation: KubeOperation) {
        self.kube_errors
            .get_or_create(&OperationLabels {
                operation: operation.as_str(),
            })
            .inc();
    }

    /// Counter `node_agent_executor_refused_total{lane}`.
    pub fn executor_refused(&self, lane: &'static str) {
        self.executor_refused
            .get_or_create(&LaneLabels { lane })
            .inc();
    }
}
