//! The `node_agent_*` metric families and the methods the daemon records them through.

mod kube;
mod reclaim;
mod record;

use std::sync::{Arc, OnceLock};

use kube::KubeCounters;
use node_agent_kube::api::Counters;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::{Registry, Unit},
};

/// Upper bounds of the decision latency buckets, in seconds: 1-2-5 steps from 100 µs to 10 s
/// (×2.15 per step on average, so exponential in effect). The p99 target (2 ms) and the
/// kubelet's housekeeping interval (10 s) are bucket bounds themselves, so "share of decisions
/// within target" is one bucket divided by the count, without interpolation.
pub const DECISION_LATENCY_BUCKETS: [f64; 16] = [
    0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
    10.0,
];

/// What [`Metrics::encode`] produces: `prometheus-client` writes OpenMetrics text.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SignalLabels {
    signal: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ThresholdLabels {
    signal: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConditionLabels {
    condition: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EvictionLabels {
    signal: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NamespaceLabels {
    namespace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TriggerLabels {
    trigger: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation: String,
}

type LatencyFamily = Family<TriggerLabels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new(DECISION_LATENCY_BUCKETS)
}

/// Every metric the daemon exports, registered once in one registry. Recording is a lock-free
/// atomic update once a label set exists (a read lock on the family to find it); label values
/// are escaped by the encoder, so any string is safe.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    signal_available: Family<SignalLabels, Gauge>,
    threshold_met: Family<ThresholdLabels, Gauge>,
    node_condition: Family<ConditionLabels, Gauge>,
    evictions: Family<EvictionLabels, Counter>,
    oom_kills: Family<NamespaceLabels, Counter>,
    kernel_events: Family<KindLabels, Counter>,
    ringbuf_lost_events: Counter,
    ringbuf_decode_errors: Counter,
    decision_latency: LatencyFamily,
    decision_latency_invalid: Family<TriggerLabels, Counter>,
    evaluations: Family<TriggerLabels, Counter>,
    stale_data: Family<SourceLabels, Counter>,
    config_reloads: Family<ResultLabels, Counter>,
    tracked_cgroups: Gauge,
    untracked_cgroups: Gauge,
    tracking_cap_reached: Counter,
    kube_errors: Family<OperationLabels, Counter>,
    signal_unknown: Family<SignalLabels, Gauge>,
    no_evictable_pod: Family<SignalLabels, Gauge>,
    no_evictable_pod_events: Family<SignalLabels, Counter>,
    kube_counters: Arc<OnceLock<Arc<Counters>>>,
    telemetry_connections_closed: Family<ReasonLabels, Counter>,
    /// Node-level reclaim's families, in their own module.
    reclaim: reclaim::ReclaimMetrics,
}

impl Metrics {
    pub fn new() -> Arc<Metrics> {
        let metrics = Metrics {
            registry: Registry::with_prefix("node_agent"),
            signal_available: Family::default(),
            threshold_met: Family::default(),
            node_condition: Family::default(),
            evictions: Family::default(),
            oom_kills: Family::default(),
            kernel_events: Family::default(),
            ringbuf_lost_events: Counter::default(),
            ringbuf_decode_errors: Counter::default(),
            decision_latency: Family::new_with_constructor(latency_histogram),
            decision_latency_invalid: Family::default(),
            evaluations: Family::default(),
            stale_data: Family::default(),
            config_reloads: Family::default(),
            tracked_cgroups: Gauge::default(),
            untracked_cgroups: Gauge::default(),
            tracking_cap_reached: Counter::default(),
            kube_errors: Family::default(),
            signal_unknown: Family::default(),
            no_evictable_pod: Family::default(),
            no_evictable_pod_events: Family::default(),
            kube_counters: Arc::default(),
            telemetry_connections_closed: Family::default(),
            reclaim: reclaim::ReclaimMetrics::default(),
        };
        // Every reload result exists from the start, so `rate()` and alerts see a 0, not nothing.
        for result in ["ok", "invalid", "refused"] {
            metrics
                .config_reloads
                .get_or_create_owned(&ResultLabels { result });
        }
        Arc::new(metrics.registered())
    }

    /// The registry holds clones of the families (they share their storage), so recording
    /// through the fields shows up in [`Metrics::encode`].
    fn registered(mut self) -> Self {
        let r = &mut self.registry;
        self.reclaim.register(r);
        // prometheus-client appends `_total` to counter names and the unit to the histogram's,
        // and a full stop to each help text.
        r.register(
            "signal_available",
            "Available amount of each eviction signal, in the kubelet's unit for it (bytes, inodes or PIDs)",
            self.signal_available.clone(),
        );
        r.register(
            "threshold_met",
            "Whether the signal's eviction threshold of this kind (hard or soft) is met (1) or not (0)",
            self.threshold_met.clone(),
        );
        r.register(
            "node_condition",
            "Whether the node condition (MemoryPressure, DiskPressure, PIDPressure) is reported (1) or not (0)",
            self.node_condition.clone(),
        );
        r.register(
            "evictions",
            "Eviction decisions by the signal that drove them and their result",
            self.evictions.clone(),
        );
        r.register(
            "oom_kills",
            "Kernel OOM kills by pod namespace (none for cgroups outside pods)",
            self.oom_kills.clone(),
        );
        r.register(
            "kernel_events",
            "Events read from the kernel programs' ring buffer, by kind",
            self.kernel_events.clone(),
        );
        r.register(
            "ringbuf_lost_events",
            "Events the kernel programs could not write because the ring buffer was full",
            self.ringbuf_lost_events.clone(),
        );
        r.register(
            "ringbuf_decode_errors",
            "Ring buffer records that could not be decoded",
            self.ringbuf_decode_errors.clone(),
        );
        r.register_with_unit(
            "decision_latency",
            "Time from the kernel timestamp of the triggering event to the decision, by trigger",
            Unit::Seconds,
            self.decision_latency.clone(),
        );
        r.register(
            "decision_latency_invalid",
            "Decision latencies not recorded because they were negative or not finite, by trigger",
            self.decision_latency_invalid.clone(),
        );
        r.register(
            "evaluations",
            "Evaluations of the eviction policy, by what triggered them",
            self.evaluations.clone(),
        );
        r.register(
            "stale_data",
            "Decisions refused because the data they needed was too old, by data source",
            self.stale_data.clone(),
        );
        r.register(
            "config_reloads",
            "Configuration reloads by result (ok, or invalid and the old configuration kept)",
            self.config_reloads.clone(),
        );
        r.register(
            "tracked_cgroups",
            "Cgroups the agent currently tracks",
            self.tracked_cgroups.clone(),
        );
        r.register(
            "untracked_cgroups",
            "Cgroups left untracked because the kernel maps are full (tracked as soon as room frees)",
            self.untracked_cgroups.clone(),
        );
        r.register(
            "tracking_cap_reached",
            "Times the kernel maps' cgroup cap was reached",
            self.tracking_cap_reached.clone(),
        );
        r.register(
            "kube_errors",
            "Failed Kubernetes API or kubelet requests, by operation",
            self.kube_errors.clone(),
        );
        r.register(
            "signal_unknown",
            "Whether the signal could not be read at the last evaluation (1): its source is degraded and it meets no threshold",
            self.signal_unknown.clone(),
        );
        r.register(
            "no_evictable_pod",
            "Whether a threshold on this signal is past its grace period with no pod that may be evicted (1)",
            self.no_evictable_pod.clone(),
        );
        r.register(
            "no_evictable_pod_events",
            "Times a threshold on this signal was found past its grace period with no pod that may be evicted",
            self.no_evictable_pod_events.clone(),
        );
        r.register(
            "telemetry_connections_closed",
            "Connections to this listener closed by the agent, by reason (client_limit, capacity, idle)",
            self.telemetry_connections_closed.clone(),
        );
        r.register_collector(Box::new(KubeCounters(self.kube_counters.clone())));
        self
    }

    /// Exports the Kubernetes clients' failure counts (set once, at start).
    /// Node-level reclaim's counters.
    pub fn reclaim(&self) -> &reclaim::ReclaimMetrics {
        &self.reclaim
    }

    pub fn export_kube_counters(&self, counters: Arc<Counters>) {
        let _ = self.kube_counters.set(counters);
    }

    /// The whole exposition in OpenMetrics text ([`METRICS_CONTENT_TYPE`]), ending in `# EOF`.
    ///
    /// Encoding into a `String` cannot fail with these metric types; if it ever did, the error
    /// is logged and the text is returned without its `# EOF`, which scrapers reject as a
    /// failed scrape rather than reading a truncated exposition as complete.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        if let Err(error) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            tracing::error!(%error, "encoding the metrics failed; the exposition is incomplete");
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    fn lines(text: &str) -> Vec<&str> {
        text.lines().collect()
    }

    #[test]
    fn each_recorder_writes_its_sample() {
        type Record = fn(&Metrics);
        #[rustfmt::skip]
        let rows: &[(&str, Record, &str)] = &[
            ("signal available is a gauge set to the value",
             |m| { m.set_signal_available("memory.available", 5); m.set_signal_available("memory.available", 1 << 40) },
             "node_agent_signal_available{signal=\"memory.available\"} 1099511627776"),
            ("a met hard threshold is 1",
             |m| m.set_threshold_met("nodefs.available", true, true),
             "node_agent_threshold_met{signal=\"nodefs.available\",kind=\"hard\"} 1"),
            ("an unmet soft threshold is 0",
             |m| { m.set_threshold_met("pid.available", false, true); m.set_threshold_met("pid.available", false, false) },
             "node_agent_threshold_met{signal=\"pid.available\",kind=\"soft\"} 0"),
            ("an active condition is 1",
             |m| m.set_condition("MemoryPressure", true),
             "node_agent_node_condition{condition=\"MemoryPressure\"} 1"),
            ("an inactive condition is 0",
             |m| m.set_condition("PIDPressure", false),
             "node_agent_node_condition{condition=\"PIDPressure\"} 0"),
            ("an eviction counts by signal and result",
             |m| m.eviction("memory.available", "evicted"),
             "node_agent_evictions_total{signal=\"memory.available\",result=\"evicted\"} 1"),
            ("evictions accumulate per label set",
             |m| { m.eviction("memory.available", "dry_run"); m.eviction("memory.available", "dry_run"); m.eviction("memory.available", "failed") },
             "node_agent_evictions_total{signal=\"memory.available\",result=\"dry_run\"} 2"),
            ("an OOM kill counts by namespace",
             |m| m.oom_kill("default"),
             "node_agent_oom_kills_total{namespace=\"default\"} 1"),
            ("an OOM kill outside pods counts as namespace none",
             |m| m.oom_kill(""),
             "node_agent_oom_kills_total{namespace=\"none\"} 1"),
            ("kernel events count by kind",
             |m| m.kernel_event("fork_storm"),
             "node_agent_kernel_events_total{kind=\"fork_storm\"} 1"),
            ("ring buffer losses add their deltas",
             |m| { m.ring_lost(3); m.ring_lost(0); m.ring_lost(4) },
             "node_agent_ringbuf_lost_events_total 7"),
            ("decode errors count",
             |m| m.decode_error(),
             "node_agent_ringbuf_decode_errors_total 1"),
            ("a decision latency is observed",
             |m| m.decision_latency("memory_threshold", 0.0015),
             "node_agent_decision_latency_seconds_count{trigger=\"memory_threshold\"} 1"),
            ("a negative decision latency is counted as invalid",
             |m| m.decision_latency("resync", -0.5),
             "node_agent_decision_latency_invalid_total{trigger=\"resync\"} 1"),
            ("evaluations count by trigger",
             |m| m.evaluation("resync"),
             "node_agent_evaluations_total{trigger=\"resync\"} 1"),
            ("stale data counts by source",
             |m| m.stale_data("kubelet_pods"),
             "node_agent_stale_data_total{source=\"kubelet_pods\"} 1"),
            ("a good reload counts as ok",
             |m| m.config_reload("ok"),
             "node_agent_config_reloads_total{result=\"ok\"} 1"),
            ("a bad reload counts as invalid",
             |m| m.config_reload("invalid"),
             "node_agent_config_reloads_total{result=\"invalid\"} 1"),
            ("a reload changing what cannot change counts as refused",
             |m| m.config_reload("refused"),
             "node_agent_config_reloads_total{result=\"refused\"} 1"),
            ("reload results start at zero",
             |_| {},
             "node_agent_config_reloads_total{result=\"invalid\"} 0"),
            ("tracked cgroups is a gauge",
             |m| m.set_tracked_cgroups(42, 0, false),
             "node_agent_tracked_cgroups 42"),
            ("cgroups over the cap are a gauge",
             |m| m.set_tracked_cgroups(8192, 17, true),
             "node_agent_untracked_cgroups 17"),
            ("reaching the cap is counted",
             |m| { m.set_tracked_cgroups(8192, 17, true); m.set_tracked_cgroups(8192, 17, false) },
             "node_agent_tracking_cap_reached_total 1"),
            ("an unreadable signal is 1",
             |m| m.set_signal_unknown("imagefs.available", true),
             "node_agent_signal_unknown{signal=\"imagefs.available\"} 1"),
            ("no evictable pod is a gauge per signal",
             |m| m.set_no_evictable_pod(Some("memory.available")),
             "node_agent_no_evictable_pod{signal=\"memory.available\"} 1"),
            ("and counted on entry",
             |m| { m.set_no_evictable_pod(Some("memory.available")); m.set_no_evictable_pod(None); m.set_no_evictable_pod(Some("memory.available")) },
             "node_agent_no_evictable_pod_events_total{signal=\"memory.available\"} 2"),
            ("cleared to 0",
             |m| { m.set_no_evictable_pod(Some("pid.available")); m.set_no_evictable_pod(None) },
             "node_agent_no_evictable_pod{signal=\"pid.available\"} 0"),
            ("the kube clients' counts are exported",
             |m| {
                 let c = Arc::new(Counters::default());
                 c.retries.fetch_add(3, Ordering::Relaxed);
                 m.export_kube_counters(c);
             },
             "node_agent_kube_retries_total 3"),
            ("and read as zero before a cluster is connected",
             |_| {},
             "node_agent_kube_request_failures_total 0"),
            ("kube errors count by operation",
             |m| m.kube_error("list_pods"),
             "node_agent_kube_errors_total{operation=\"list_pods\"} 1"),
        ];
        for (name, record, expected) in rows {
            let metrics = Metrics::new();
            record(&metrics);
            let text = metrics.encode();
            assert!(
                lines(&text).contains(expected),
                "{name}: no line `{expected}` in\n{text}"
            );
            assert!(
                text.ends_with("# EOF\n"),
                "{name}: exposition not terminated"
            );
        }
    }

    #[test]
    fn every_family_is_prefixed_and_has_help() {
        let metrics = Metrics::new();
        metrics.set_signal_available("memory.available", 1);
        metrics.set_threshold_met("memory.available", true, false);
        metrics.set_condition("MemoryPressure", false);
        metrics.eviction("memory.available", "evicted");
        metrics.oom_kill("");
        metrics.kernel_event("oom_kill");
        metrics.decision_latency("memory_threshold", 0.001);
        metrics.decision_latency("memory_threshold", f64::NAN);
        metrics.evaluation("resync");
        metrics.stale_data("cgroup");
        metrics.kube_error("evict");
        metrics.set_tracked_cgroups(1, 0, true);
        metrics.set_signal_unknown("imagefs.available", false);
        metrics.set_no_evictable_pod(Some("memory.available"));
        let text = metrics.encode();

        let mut families: Vec<&str> = lines(&text)
            .into_iter()
            .filter_map(|line| line.strip_prefix("# TYPE "))
            .filter_map(|rest| rest.split(' ').next())
            .collect();
        families.sort_unstable();
        assert_eq!(
            families,
            [
                "node_agent_config_reloads",
                "node_agent_decision_latency_invalid",
                "node_agent_decision_latency_seconds",
                "node_agent_evaluations",
                "node_agent_evictions",
                "node_agent_kernel_events",
                "node_agent_kube_errors",
                "node_agent_kube_pods_skipped",
                "node_agent_kube_request_failures",
                "node_agent_kube_retries",
                "node_agent_kube_watch_events_dropped",
                "node_agent_no_evictable_pod",
                "node_agent_no_evictable_pod_events",
                "node_agent_node_condition",
                // Node-level reclaim's gauge (its counters appear with their first reclaim).
                "node_agent_node_reclaim_runtime_unavailable",
                "node_agent_oom_kills",
                "node_agent_ringbuf_decode_errors",
                "node_agent_ringbuf_lost_events",
                "node_agent_signal_available",
                "node_agent_signal_unknown",
                "node_agent_stale_data",
                "node_agent_threshold_met",
                "node_agent_tracked_cgroups",
                "node_agent_tracking_cap_reached",
                "node_agent_untracked_cgroups",
            ]
        );
        for family in families {
            let help = format!("# HELP {family} ");
            assert!(
                text.lines()
                    .any(|line| line.starts_with(&help) && line.len() > help.len() + 10),
                "{family} has no help text"
            );
        }
        assert!(lines(&text).contains(&"# UNIT node_agent_decision_latency_seconds seconds"));
    }

    #[test]
    fn decision_latency_buckets_span_100us_to_10s() {
        assert_eq!(DECISION_LATENCY_BUCKETS.first(), Some(&0.0001));
        assert_eq!(DECISION_LATENCY_BUCKETS.last(), Some(&10.0));
        assert!(
            DECISION_LATENCY_BUCKETS.contains(&0.002),
            "the 2 ms target is a bucket bound"
        );
        for pair in DECISION_LATENCY_BUCKETS.windows(2) {
            let ratio = pair[1] / pair[0];
            assert!(
                (2.0..=2.5).contains(&ratio),
                "{pair:?}: steps grow by 2 to 2.5"
            );
        }
    }

    #[test]
    fn decision_latency_lands_in_the_right_buckets() {
        let metrics = Metrics::new();
        for seconds in [0.00005, 0.0015, 0.002, 0.0021, 3.0, 60.0] {
            metrics.decision_latency("t", seconds);
        }
        let text = metrics.encode();
        let bucket = |le: &str| -> String {
            let prefix =
                format!("node_agent_decision_latency_seconds_bucket{{le=\"{le}\",trigger=\"t\"}} ");
            let line = text.lines().find(|line| line.starts_with(&prefix));
            let line = line.unwrap_or_else(|| panic!("no bucket le={le} in\n{text}"));
            line[prefix.len()..].to_owned()
        };
        #[rustfmt::skip]
        let rows = [
            ("0.0001", "1"), // 50 µs
            ("0.001", "1"),
            ("0.002", "3"), // 1.5 ms and exactly 2 ms (bounds are inclusive)
            ("0.005", "4"),
            ("2.0", "4"),
            ("5.0", "5"),
            ("10.0", "5"),
            ("+Inf", "6"), // a minute: beyond the last bound
        ];
        for (le, cumulative) in rows {
            assert_eq!(bucket(le), cumulative, "bucket le={le}");
        }
        let buckets = text
            .lines()
            .filter(|line| line.starts_with("node_agent_decision_latency_seconds_bucket{"))
            .count();
        assert_eq!(
            buckets,
            DECISION_LATENCY_BUCKETS.len() + 1,
            "the bounds plus +Inf"
        );
    }

    #[test]
    fn invalid_decision_latencies_are_counted_not_observed() {
        let metrics = Metrics::new();
        for seconds in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.001] {
            metrics.decision_latency("t", seconds);
        }
        metrics.decision_latency("t", 0.0);
        let text = metrics.encode();
        let text = lines(&text);
        assert!(text.contains(&"node_agent_decision_latency_invalid_total{trigger=\"t\"} 4"));
        assert!(text.contains(&"node_agent_decision_latency_seconds_count{trigger=\"t\"} 1"));
        assert!(text.contains(&"node_agent_decision_latency_seconds_sum{trigger=\"t\"} 0.0"));
    }

    #[test]
    fn label_values_are_escaped() {
        let metrics = Metrics::new();
        metrics.eviction("odd\"signal\\with\nnewline", "évicté");
        let text = metrics.encode();
        assert!(
            lines(&text).contains(
                &r#"node_agent_evictions_total{signal="odd\"signal\\with\nnewline",result="évicté"} 1"#
            ),
            "{text}"
        );
    }
}
