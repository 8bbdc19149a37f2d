//! The families as they are written: one row per recorder, the OpenMetrics exposition.

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
        ("bytes available are a gauge set to the value",
         |m| { m.set_signal_available(Signal::MemoryAvailable, 5); m.set_signal_available(Signal::MemoryAvailable, 1 << 40) },
         "node_agent_signal_available_bytes{eviction_signal=\"memory.available\"} 1099511627776"),
        ("disk bytes go with the bytes",
         |m| m.set_signal_available(Signal::ImageFsAvailable, 7),
         "node_agent_signal_available_bytes{eviction_signal=\"imagefs.available\"} 7"),
        ("inodes have their own family",
         |m| m.set_signal_available(Signal::NodeFsInodesFree, 9000),
         "node_agent_signal_available_inodes{eviction_signal=\"nodefs.inodesFree\"} 9000"),
        ("PIDs have their own family",
         |m| m.set_signal_available(Signal::PidAvailable, 31000),
         "node_agent_signal_available_pids{eviction_signal=\"pid.available\"} 31000"),
        ("the build is 1 with its version",
         |_| {},
         concat!("node_agent_build_info{version=\"", env!("CARGO_PKG_VERSION"), "\",commit=\"", env!("NODE_AGENT_COMMIT"), "\",rustc=\"", env!("NODE_AGENT_RUSTC"), "\"} 1")),
        ("the memory mechanism is 1 under its short name",
         |m| m.set_memory_mechanism(crate::ebpf::MemoryMechanism::CounterSampler),
         "node_agent_memory_mechanism{mechanism=\"sampler\"} 1"),
        ("evictions start at 0 for every observed signal and result",
         |_| {},
         "node_agent_evictions_total{eviction_signal=\"pid.available\",result=\"blocked_by_pdb\"} 0"),
        ("evictions for local storage limits start at 0 under the kubelet's names",
         |_| {},
         "node_agent_evictions_total{eviction_signal=\"emptydirfs.limit\",result=\"evicted\"} 0"),
        ("evaluations start at 0 for every trigger",
         |_| {},
         "node_agent_evaluations_total{trigger=\"pressure_poll\"} 0"),
        ("kernel events start at 0 for every kind",
         |_| {},
         "node_agent_kernel_events_total{kind=\"oom_kill\"} 0"),
        ("stale pod data starts at 0",
         |_| {},
         "node_agent_stale_data_total{source=\"pods\"} 0"),
        ("closed connections start at 0 for every reason",
         |_| {},
         "node_agent_telemetry_connections_closed_total{reason=\"idle\"} 0"),
        ("signals start known",
         |_| {},
         "node_agent_signal_unknown{eviction_signal=\"nodefs.available\"} 0"),
        ("records sent to the ring buffer are copied from the kernel",
         |m| m.set_kernel_counters(40, None),
         "node_agent_ringbuf_sent_events_total 40"),
        ("the sampler's ticks are copied when it runs",
         |m| m.set_kernel_counters(0, Some(node_agent_common::SamplerStats { ticks: 1000, busy_ns: 2_500_000, late_ticks: 2, max_late_ns: 7_000_000, alone_ticks: 5, ..Default::default() })),
         "node_agent_memory_sampler_ticks_total 1000"),
        ("and its time in seconds",
         |m| m.set_kernel_counters(0, Some(node_agent_common::SamplerStats { ticks: 1000, busy_ns: 2_500_000, late_ticks: 2, max_late_ns: 7_000_000, alone_ticks: 5, ..Default::default() })),
         "node_agent_memory_sampler_busy_seconds_total 0.0025"),
        ("and its ticks that came late",
         |m| m.set_kernel_counters(0, Some(node_agent_common::SamplerStats { ticks: 1000, busy_ns: 2_500_000, late_ticks: 2, max_late_ns: 7_000_000, alone_ticks: 5, ..Default::default() })),
         "node_agent_memory_sampler_late_ticks_total 2"),
        ("and its ticks alone while the other timer was overdue",
         |m| m.set_kernel_counters(0, Some(node_agent_common::SamplerStats { ticks: 1000, busy_ns: 2_500_000, late_ticks: 2, max_late_ns: 7_000_000, alone_ticks: 5, ..Default::default() })),
         "node_agent_memory_sampler_alone_ticks_total 5"),
        ("the ring buffer counters start at 0",
         |_| {},
         "node_agent_ringbuf_lost_events_total 0"),
        ("a met hard threshold is 1",
         |m| m.set_threshold_met(Signal::NodeFsAvailable, true, true),
         "node_agent_threshold_met{eviction_signal=\"nodefs.available\",kind=\"hard\"} 1"),
        ("an unmet soft threshold is 0",
         |m| { m.set_threshold_met(Signal::PidAvailable, false, true); m.set_threshold_met(Signal::PidAvailable, false, false) },
         "node_agent_threshold_met{eviction_signal=\"pid.available\",kind=\"soft\"} 0"),
        ("an active condition is 1",
         |m| m.set_condition("MemoryPressure", true),
         "node_agent_node_condition{condition=\"MemoryPressure\"} 1"),
        ("an inactive condition is 0",
         |m| m.set_condition("PIDPressure", false),
         "node_agent_node_condition{condition=\"PIDPressure\"} 0"),
        ("an eviction counts by signal and result",
         |m| m.eviction(Signal::MemoryAvailable.into(), EvictionResult::Evicted),
         "node_agent_evictions_total{eviction_signal=\"memory.available\",result=\"evicted\"} 1"),
        ("evictions accumulate per label set",
         |m| { m.eviction(Signal::MemoryAvailable.into(), EvictionResult::DryRun); m.eviction(Signal::MemoryAvailable.into(), EvictionResult::DryRun); m.eviction(Signal::MemoryAvailable.into(), EvictionResult::Failed) },
         "node_agent_evictions_total{eviction_signal=\"memory.available\",result=\"dry_run\"} 2"),
        ("an OOM kill counts by namespace",
         |m| m.oom_kill("default", "app", "cgroup_limit", false),
         "node_agent_oom_kills_total{namespace=\"default\",container=\"app\",reason=\"cgroup_limit\"} 1"),
        ("a kill the agent saw coming is counted apart",
         |m| m.oom_kill("default", "app", "node", true),
         "node_agent_oom_kills_foreseen_total{reason=\"node\"} 1"),
        ("foreseen kills start at zero",
         |_| {},
         "node_agent_oom_kills_foreseen_total{reason=\"cgroup_limit\"} 0"),
        ("an OOM kill outside pods counts as namespace none",
         |m| m.oom_kill("", "", "unknown", false),
         "node_agent_oom_kills_total{namespace=\"none\",container=\"none\",reason=\"unknown\"} 1"),
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
         |m| m.decision_latency(Trigger::MemoryThreshold, 0.0015),
         "node_agent_decision_latency_seconds_count{trigger=\"memory_threshold\"} 1"),
        ("a negative decision latency is counted as invalid",
         |m| m.decision_latency(Trigger::Resync, -0.5),
         "node_agent_decision_latency_invalid_total{trigger=\"resync\"} 1"),
        ("evaluations count by trigger",
         |m| m.evaluation(Trigger::Resync),
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
        ("a file that could not be read for now counts as retrying",
         |m| m.config_reload("retrying"),
         "node_agent_config_reloads_total{result=\"retrying\"} 1"),
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
         |m| m.set_signal_unknown(Signal::ImageFsAvailable, true),
         "node_agent_signal_unknown{eviction_signal=\"imagefs.available\"} 1"),
        ("no evictable pod is a gauge per signal",
         |m| m.set_no_evictable_pod(Some(Signal::MemoryAvailable)),
         "node_agent_no_evictable_pod{eviction_signal=\"memory.available\"} 1"),
        ("and counted on entry",
         |m| { m.set_no_evictable_pod(Some(Signal::MemoryAvailable)); m.set_no_evictable_pod(None); m.set_no_evictable_pod(Some(Signal::MemoryAvailable)) },
         "node_agent_no_evictable_pod_events_total{eviction_signal=\"memory.available\"} 2"),
        ("cleared to 0",
         |m| { m.set_no_evictable_pod(Some(Signal::PidAvailable)); m.set_no_evictable_pod(None) },
         "node_agent_no_evictable_pod{eviction_signal=\"pid.available\"} 0"),
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
        ("a source's readiness is a gauge by source",
         |m| m.sources().set_ready("cluster", false),
         "node_agent_kube_source_ready{source=\"cluster\"} 0"),
        ("the pod watch's pause is in seconds",
         |m| {
             let c = Arc::new(Counters::default());
             c.pod_watch_backoff_millis.store(2500, Ordering::Relaxed);
             m.export_kube_counters(c);
         },
         "node_agent_kube_pod_watch_backoff_seconds 2.5"),
        ("kube errors count by operation",
         |m| m.kube_error(KubeOperation::NodeTaint),
         "node_agent_kube_errors_total{operation=\"node taint\"} 1"),
        ("every operation starts at zero",
         |_| {},
         "node_agent_kube_errors_total{operation=\"NodeAgentOOMKill\"} 0"),
        ("every trigger starts at zero",
         |_| {},
         "node_agent_evaluations_total{trigger=\"allocatable\"} 0"),
        ("a full executor lane is counted",
         |m| m.executor_refused("event"),
         "node_agent_executor_refused_total{lane=\"event\"} 1"),
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

/// A registry with a sample in every family.
fn populated() -> Arc<Metrics> {
    let metrics = Metrics::new();
    metrics.set_signal_available(Signal::MemoryAvailable, 1);
    metrics.set_signal_available(Signal::NodeFsInodesFree, 1);
    metrics.set_signal_available(Signal::PidAvailable, 1);
    metrics.set_memory_mechanism(crate::ebpf::MemoryMechanism::PageCounterFexit);
    metrics.set_threshold_met(Signal::MemoryAvailable, true, false);
    metrics.set_condition("MemoryPressure", false);
    metrics.eviction(Signal::MemoryAvailable.into(), EvictionResult::Evicted);
    metrics.oom_kill("", "", "node", true);
    metrics.kernel_event("oom_kill");
    metrics.decision_latency(Trigger::MemoryThreshold, 0.001);
    metrics.decision_latency(Trigger::MemoryThreshold, f64::NAN);
    metrics.evaluation(Trigger::Resync);
    metrics.stale_data("pods");
    metrics.kube_error(KubeOperation::PodEvent);
    metrics.executor_refused("event");
    metrics.set_tracked_cgroups(1, 0, true);
    metrics.set_signal_unknown(Signal::ImageFsAvailable, false);
    metrics.set_no_evictable_pod(Some(Signal::MemoryAvailable));
    metrics.sources().set_ready("pods", false);
    metrics.sources().accept_error();
    metrics.set_kernel_counters(
        5,
        Some(node_agent_common::SamplerStats {
            ticks: 1,
            busy_ns: 1,
            late_ticks: 1,
            max_late_ns: 6_000_000,
            alone_ticks: 1,
            ..Default::default()
        }),
    );
    metrics
}

/// The families named on `# TYPE` lines, sorted.
fn families(text: &str) -> Vec<&str> {
    let mut families: Vec<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split(' ').next())
        .collect();
    families.sort_unstable();
    families
}

/// Every family has a help text of some length in `text`.
fn assert_helped(text: &str, families: &[&str]) {
    for family in families {
        let help = format!("# HELP {family} ");
        assert!(
            text.lines()
                .any(|line| line.starts_with(&help) && line.len() > help.len() + 10),
            "{family} has no help text"
        );
    }
}

const COUNTERS: [&str; 33] = [
    "node_agent_config_reloads",
    "node_agent_decision_latency_invalid",
    "node_agent_evaluations",
    "node_agent_eviction_records",
    "node_agent_evictions",
    "node_agent_executor_refused",
    "node_agent_inspect_clients_closed",
    "node_agent_inspect_records_skipped",
    "node_agent_kernel_events",
    "node_agent_kube_errors",
    "node_agent_kube_fields_invalid",
    "node_agent_kube_pod_relists",
    "node_agent_kube_pods_skipped",
    "node_agent_kube_request_failures",
    "node_agent_kube_retries",
    "node_agent_kube_stats_skipped",
    "node_agent_kube_watch_events_dropped",
    "node_agent_memory_sampler_busy_seconds",
    "node_agent_memory_sampler_late_ticks",
    "node_agent_memory_sampler_alone_ticks",
    "node_agent_memory_sampler_ticks",
    "node_agent_no_evictable_pod_events",
    "node_agent_oom_kills",
    "node_agent_oom_kills_foreseen",
    "node_agent_node_reclaims",
    "node_agent_ringbuf_decode_errors",
    "node_agent_ringbuf_lost_events",
    "node_agent_ringbuf_sent_events",
    "node_agent_stale_data",
    "node_agent_telemetry_accept_errors",
    "node_agent_telemetry_authorizations",
    "node_agent_telemetry_connections_closed",
    "node_agent_tracking_cap_reached",
];

const OTHERS: [&str; 23] = [
    "node_agent_build_info",
    "node_agent_decision_latency_seconds",
    "node_agent_eviction_records_waiting",
    "node_agent_hard_evictions_on_node",
    "node_agent_kube_kubelet_tls_verified",
    "node_agent_kube_pod_watch_backoff_seconds",
    "node_agent_kube_source_ready",
    "node_agent_memory_mechanism",
    "node_agent_no_evictable_pod",
    "node_agent_node_condition",
    // Node-level reclaim's gauge (its reclaims count from 0; objects and bytes appear with the
    // first reclaim).
    "node_agent_node_reclaim_runtime_unavailable",
    "node_agent_signal_available_bytes",
    "node_agent_signal_available_inodes",
    "node_agent_signal_available_pids",
    "node_agent_signal_unknown",
    "node_agent_threshold_met",
    "node_agent_tracked_cgroups",
    "node_agent_untracked_cgroups",
    "process_max_fds",
    "process_open_fds",
    "process_resident_memory_bytes",
    "process_start_time_seconds",
    // Sorted after the others only for readability: the assertion sorts.
    "process_cpu_seconds",
];

#[test]
fn every_family_is_named_and_has_help_in_openmetrics() {
    let text = populated().encode();
    let found = families(&text);
    let mut expected: Vec<&str> = COUNTERS.iter().chain(&OTHERS).copied().collect();
    expected.sort_unstable();
    assert_eq!(found, expected);
    assert_helped(&text, &found);
    assert!(lines(&text).contains(&"# UNIT node_agent_decision_latency_seconds seconds"));
    assert!(lines(&text).contains(&"# UNIT node_agent_signal_available_bytes bytes"));
    assert!(text.ends_with("# EOF\n"));
}

#[test]
fn the_text_format_has_every_family_with_counters_named_total() {
    let metrics = populated();
    let text = metrics.encode_as(Format::Text).expect("text format");
    let found = families(&text);
    let mut expected: Vec<String> = COUNTERS
        .iter()
        .map(|c| format!("{c}_total"))
        .chain(OTHERS.iter().map(|o| {
            if *o == "process_cpu_seconds" {
                "process_cpu_seconds_total".to_owned()
            } else {
                (*o).to_owned()
            }
        }))
        .collect();
    expected.sort_unstable();
    assert_eq!(found, expected);
    assert_helped(&text, &found);
    for counter in COUNTERS {
        assert!(
            lines(&text).contains(&format!("# TYPE {counter}_total counter").as_str()),
            "{counter}: {text}"
        );
    }
    for absent in ["# EOF", "# UNIT", "_created"] {
        assert!(!text.contains(absent), "{absent} in\n{text}");
    }
    // Every sample belongs to the family declared last before it.
    let mut family = "";
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            family = rest.split(' ').next().unwrap_or("");
        } else if !line.starts_with('#') {
            assert!(line.starts_with(family), "{line} outside {family}");
        }
    }
    assert!(lines(&text).contains(
        &"node_agent_evictions_total{eviction_signal=\"memory.available\",result=\"evicted\"} 1"
    ));
}

#[test]
fn the_observed_signals_are_those_the_daemon_reads() {
    let read: Vec<Signal> = crate::run::observed_signals().collect();
    assert_eq!(read, OBSERVED_SIGNALS);
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
        metrics.decision_latency(Trigger::Pacing, seconds);
    }
    let text = metrics.encode();
    let bucket = |le: &str| -> String {
        let prefix = format!(
            "node_agent_decision_latency_seconds_bucket{{le=\"{le}\",trigger=\"pacing\"}} "
        );
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
        .filter(|line| line.contains("trigger=\"pacing\""))
        .count();
    assert_eq!(
        buckets,
        DECISION_LATENCY_BUCKETS.len() + 1,
        "the bounds plus +Inf"
    );
}

#[test]
fn the_kernel_triggers_latency_exists_from_the_start_at_zero() {
    let text = Metrics::new().encode();
    for trigger in ["memory_threshold", "pid_threshold", "oom_kill"] {
        let count = format!("node_agent_decision_latency_seconds_count{{trigger=\"{trigger}\"}} 0");
        assert!(text.lines().any(|l| l == count), "{count} in\n{text}");
    }
    // Evaluations without a kernel timestamp record no latency: no series for them.
    assert!(!text.contains("node_agent_decision_latency_seconds_count{trigger=\"resync\"}"));
}

#[test]
fn invalid_decision_latencies_are_counted_not_observed() {
    let metrics = Metrics::new();
    for seconds in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.001] {
        metrics.decision_latency(Trigger::Pacing, seconds);
    }
    metrics.decision_latency(Trigger::Pacing, 0.0);
    let text = metrics.encode();
    let text = lines(&text);
    assert!(text.contains(&"node_agent_decision_latency_invalid_total{trigger=\"pacing\"} 4"));
    assert!(text.contains(&"node_agent_decision_latency_seconds_count{trigger=\"pacing\"} 1"));
    assert!(text.contains(&"node_agent_decision_latency_seconds_sum{trigger=\"pacing\"} 0.0"));
}

#[test]
fn label_values_are_escaped() {
    let metrics = Metrics::new();
    metrics.oom_kill("odd\"namespace\\with\nnewline, évitée", "c", "node", false);
    let text = metrics.encode();
    assert!(
        lines(&text).contains(
            &r#"node_agent_oom_kills_total{namespace="odd\"namespace\\with\nnewline, évitée",container="c",reason="node"} 1"#
        ),
        "{text}"
    );
}

#[test]
fn the_sampler_counters_are_left_out_when_another_mechanism_runs() {
    let metrics = Metrics::new();
    let sampler = node_agent_common::SamplerStats {
        ticks: 3,
        busy_ns: 9,
        late_ticks: 0,
        max_late_ns: 0,
        ..Default::default()
    };
    metrics.set_kernel_counters(1, Some(sampler));
    assert!(metrics
        .encode()
        .contains("node_agent_memory_sampler_ticks_total 3"));
    metrics.set_kernel_counters(2, None);
    let text = metrics.encode();
    assert!(!text.contains("memory_sampler"), "{text}");
    assert!(lines(&text).contains(&"node_agent_ringbuf_sent_events_total 2"));
}
