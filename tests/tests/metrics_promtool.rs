//! `/metrics` as Prometheus' own linter reads it: the text format 0.0.4 of a registry with a
//! sample in every family, piped to the real `promtool check metrics` (Debian's `prometheus`
//! package; `cargo xtask setup` installs it and `cargo xtask test` names it in PROMTOOL). The
//! test fails, never skips, when promtool is missing.

use std::{
    io::Write as _,
    process::{Command, Stdio},
    time::Duration,
};

use node_agent::{
    ebpf::MemoryMechanism,
    telemetry::{Format, KubeOperation, Metrics, Trigger},
};
use node_agent_kube::evict::EvictionResult;
use node_agent_policy::Signal;

/// promtool gets this long.
const BOUND: Duration = Duration::from_secs(60);

fn promtool() -> String {
    std::env::var("PROMTOOL").unwrap_or_else(|_| {
        panic!("PROMTOOL names promtool (set by `cargo xtask test`; `cargo xtask setup` installs Debian's `prometheus`)")
    })
}

/// Runs `promtool check metrics` on `text`: (exit success, its stdout and stderr).
fn check_metrics(text: &str) -> (bool, String) {
    let mut child = Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {}: {e}", promtool()));
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out =
        node_agent_tests::output_within(child, BOUND, "promtool").unwrap_or_else(|e| panic!("{e}"));
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

fn populated() -> std::sync::Arc<Metrics> {
    let m = Metrics::new();
    for signal in [
        Signal::MemoryAvailable,
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        Signal::PidAvailable,
    ] {
        m.set_signal_available(signal, 1 << 20);
        m.set_threshold_met(signal, true, false);
        m.set_signal_unknown(signal, false);
    }
    m.set_memory_mechanism(MemoryMechanism::CounterSampler);
    m.set_condition("MemoryPressure", true);
    m.eviction(Signal::MemoryAvailable.into(), EvictionResult::Evicted);
    m.oom_kill("default", "app", "cgroup_limit", true);
    m.oom_kill("", "", "node", false);
    m.kernel_event("memory_threshold");
    m.ring_lost(3);
    m.decode_error();
    m.decision_latency(Trigger::MemoryThreshold, 0.0015);
    m.decision_latency(Trigger::Resync, f64::NAN);
    m.evaluation(Trigger::Resync);
    m.stale_data("pods");
    m.config_reload("ok");
    m.set_tracked_cgroups(12, 0, false);
    m.kube_error(KubeOperation::PodEvent);
    m.set_no_evictable_pod(Some(Signal::MemoryAvailable));
    m.telemetry_connection_closed("idle");
    m.set_kernel_counters(
        9,
        Some(node_agent_common::SamplerStats {
            ticks: 100,
            busy_ns: 5_000,
            late_ticks: 0,
            max_late_ns: 0,
            alone_ticks: 0,
            ..Default::default()
        }),
    );
    m
}

#[test]
fn promtool_finds_nothing_to_say_about_the_text_format() {
    let text = populated()
        .encode_as(Format::Text)
        .expect("the text format");
    // What the test feeds promtool holds what it means to check.
    for needle in [
        "# TYPE node_agent_evictions_total counter",
        "# TYPE node_agent_signal_available_bytes gauge",
        "# TYPE process_cpu_seconds_total counter",
        "node_agent_build_info{",
    ] {
        assert!(text.contains(needle), "{needle} in\n{text}");
    }
    let (ok, said) = check_metrics(&text);
    assert!(
        ok && said.trim().is_empty(),
        "promtool check metrics: {said}\non\n{text}"
    );
}

#[test]
fn promtool_still_flags_what_it_flags() {
    // The check is live: a family without help and a counter without `_total` are reported,
    // so a clean result above means something.
    let (ok, said) = check_metrics("# TYPE bad_counter counter\nbad_counter 1\n");
    assert!(
        !ok,
        "promtool passed a counter without help or _total: {said}"
    );
    assert!(said.contains("bad_counter no help text"), "{said}");
    assert!(said.contains("should have \"_total\" suffix"), "{said}");
}
