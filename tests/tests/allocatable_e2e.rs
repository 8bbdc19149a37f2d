//! `allocatableMemory.available` against the Node's own `status.allocatable.memory`, end to
//! end: `allocatableMemory` is not set, the figure lives only on the fake API server's
//! Node object (strict wire format), the memory is real, in pod cgroups of the kubelet's layout,
//! and the kernel line on kubepods reports the crossing. An absent field makes the signal
//! unknown, naming it; a change of the Node's figure moves the kernel line at once. Where the
//! pods cgroup has a memory limit of its own (the kubelet sets one), that limit is what the
//! kubelet measures against, and so does the agent.

use node_agent_tests::{
    fake_cluster::{attach_trace, wait_until, ClusterState, Daemon, PodSpec},
    require_root, set_memory_limit,
    world::{eviction_after_kubepods_crossing, wait, World},
};
use serde_json::{json, Value};

const MEM_HELPER: &str = env!("CARGO_BIN_EXE_mem-helper");
const AVAILABLE: &str =
    "node_agent_signal_available_bytes{eviction_signal=\"allocatableMemory.available\"}";
const UNKNOWN: &str = "node_agent_signal_unknown{eviction_signal=\"allocatableMemory.available\"}";

/// hog: far over its 16Mi request (ranked first); calm: within its 512Mi request.
fn pods() -> [PodSpec; 2] {
    [
        PodSpec::new(
            "shop",
            "hog",
            "1b4e28ba-2fa1-11d2-883f-0016d3cca427",
            "16Mi",
            'a',
        ),
        PodSpec::new(
            "shop",
            "calm",
            "6ba7b810-9dad-11d1-80b4-00c04fd430c8",
            "512Mi",
            'b',
        ),
    ]
}

/// The world of these tests: the pods, and the Node's `status.allocatable.memory` (absent when
/// `None`).
fn world(label: &str, allocatable: Option<&str>) -> anyhow::Result<World> {
    let w = World::new(label, &pods(), MEM_HELPER)?;
    set_allocatable(&w.cluster(), allocatable);
    Ok(w)
}

/// The agent on a 1Gi node whose own `memory.available<1Mi` is never met here; the kubelet
/// copies that hard threshold onto `allocatableMemory.available`. No
/// `allocatableMemory`: the Node's figure is read every `resync`.
fn start(w: &World, resync: &str) -> anyhow::Result<Daemon> {
    let text = w
        .config_with_threshold("1Mi", "", "")
        .replace("resyncInterval: 60s", &format!("resyncInterval: {resync}"));
    let mut daemon = w.start_text(&text)?;
    daemon.wait_log(
        "against the Node's status.allocatable.memory while that cgroup has none",
        wait(),
    )?;
    Ok(daemon)
}

/// Sets (or removes) the Node's `status.allocatable.memory` as the kubelet would.
fn set_allocatable(state: &ClusterState, memory: Option<&str>) {
    state.node.change(|n| {
        n["status"]["allocatable"] = match memory {
            Some(m) => json!({"cpu": "2", "memory": m, "pods": "110"}),
            None => json!({"cpu": "2", "pods": "110"}),
        };
    });
}

/// calm's 120Mi and hog's 100Mi in kubepods, once the agent's figure shows them (below
/// `against` less 200Mi). The helpers hold the memory until dropped.
fn hold_220mi(
    w: &World,
    daemon: &Daemon,
    against_mib: u64,
) -> anyhow::Result<[node_agent_tests::Helper; 2]> {
    let held = [w.load("calm", 120)?, w.load("hog", 100)?];
    wait_until(wait(), "the 220Mi in kubepods observed", || {
        daemon
            .metric(AVAILABLE)
            .ok()
            .flatten()
            .is_some_and(|a| a < (against_mib - 200) as f64 * 1048576.0)
    })?;
    Ok(held)
}

/// hog evicted for `allocatableMemory.available` below `threshold` bytes.
fn assert_evicted_hog_for_allocatable(eviction: &Value, threshold: i64) {
    assert_eq!(
        (
            eviction["name"].as_str(),
            eviction["signal"].as_str(),
            eviction["result"].as_str()
        ),
        (
            Some("hog"),
            Some("allocatableMemory.available"),
            Some("evicted")
        ),
        "{eviction}"
    );
    assert_eq!(
        eviction["threshold"].as_i64(),
        Some(threshold),
        "{eviction}"
    );
    // Below the threshold, or met ahead of itself where memory fell faster than relief could
    // follow (early action: the trace says `early`; a loaded host's slower relief makes it
    // likelier).
    assert!(
        eviction["observed"].as_i64().unwrap() < threshold || eviction["early"] == true,
        "{eviction}"
    );
}

#[test]
fn pods_beyond_the_nodes_own_allocatable_memory_are_evicted_for_allocatable_memory_available(
) -> anyhow::Result<()> {
    require_root();
    let w = world("e2e-node-alloc", Some("200Mi"))?;
    let daemon = start(&w, "60s")?;
    // Met past 199Mi in kubepods: the figure comes from the Node alone.
    wait_until(wait(), "allocatableMemory.available observed", || {
        daemon.metric(AVAILABLE).ok().flatten().is_some()
    })?;
    assert!(w.node_reads() >= 1, "the Node was read");
    let trace = attach_trace(&w.socket, &["--kind", "eviction,memory_threshold"])?;

    let _calm = w.load("calm", 120)?;
    assert!(
        w.evictions().is_empty(),
        "120Mi of 200Mi allocatable: no eviction"
    );
    let _hog = w.load("hog", 100)?;
    wait_until(wait(), "the eviction request", || !w.evictions().is_empty())?;
    let (eviction, crossed_on_kubepods) = eviction_after_kubepods_crossing(&trace)?;
    assert!(crossed_on_kubepods, "the kernel line on kubepods fired");
    assert_evicted_hog_for_allocatable(&eviction, 1 << 20);
    w.assert_nothing_refused();
    daemon.stop()
}

#[test]
fn an_absent_allocatable_is_unknown_and_a_change_of_the_nodes_figure_moves_the_kernel_line(
) -> anyhow::Result<()> {
    require_root();
    let w = world("e2e-node-alloc-change", None)?;
    let mut daemon = start(&w, "1s")?;
    // Absent: unknown, named, never 0.
    let warned = daemon.wait_log("the Node's status.allocatable.memory is unknown", wait())?;
    assert!(warned.contains("is absent"), "names the field: {warned}");
    // (Other sources may be unreadable here too: no container runtime.)
    let said = daemon.wait_log("source=\"allocatable\"", wait())?;
    assert!(
        said.contains("signal source unreadable")
            && said.contains("status.allocatable.memory is absent"),
        "names the source and the field: {said}"
    );
    wait_until(wait(), "the signal marked unknown", || {
        daemon.metric(UNKNOWN).ok().flatten() == Some(1.0)
    })?;
    assert_eq!(daemon.metric(AVAILABLE)?, None, "no figure made up");
    let ready = daemon.get("/readyz")?;
    assert!(
        ready.starts_with("HTTP/1.1 503") && ready.contains("status.allocatable.memory"),
        "{ready}"
    );

    // The kubelet publishes it: known at the next read.
    set_allocatable(&w.cluster(), Some("600Mi"));
    daemon.wait_log("the Node's status.allocatable.memory read", wait())?;
    assert_eq!(daemon.metric(UNKNOWN)?, Some(0.0));
    let _held = hold_220mi(&w, &daemon, 600)?;
    assert!(
        w.evictions().is_empty(),
        "220Mi of 600Mi allocatable: no eviction"
    );

    // The kubelet restarts with more reserved: 300Mi. The line on kubepods moves down with it
    // at once; 100Mi more then crosses it, where the old figure's line was 300Mi further up.
    set_allocatable(&w.cluster(), Some("300Mi"));
    let changed = daemon.wait_log("the Node's status.allocatable.memory changed", wait())?;
    assert!(
        changed.contains(&format!("was={}", 600 << 20))
            && changed.contains(&format!("bytes={}", 300 << 20)),
        "{changed}"
    );
    assert!(
        w.evictions().is_empty(),
        "220Mi of 300Mi allocatable: no eviction"
    );
    let trace = attach_trace(&w.socket, &["--kind", "eviction,memory_threshold"])?;
    let _more = w.load("hog", 100)?;
    wait_until(wait(), "the eviction request", || !w.evictions().is_empty())?;
    let (eviction, crossed_on_kubepods) = eviction_after_kubepods_crossing(&trace)?;
    assert!(
        crossed_on_kubepods,
        "the moved kernel line on kubepods fired"
    );
    assert_evicted_hog_for_allocatable(&eviction, 1 << 20);
    w.assert_nothing_refused();
    daemon.stop()
}

/// The kubelet measures `allocatableMemory.available` against its pods cgroup's own memory
/// limit (capacity less the reservations; the Node's figure is that less the hard eviction
/// threshold too). With a 600Mi limit on kubepods and the Node saying 1Gi, 320Mi in kubepods
/// leaves 280Mi, under the 300Mi threshold: the hog goes, where the Node's figure would leave
/// 704Mi.
#[test]
fn the_pods_cgroups_own_limit_is_measured_against_as_the_kubelet_does() -> anyhow::Result<()> {
    require_root();
    let w = world("e2e-pods-limit", Some("1Gi"))?;
    set_memory_limit(&w.node.path().join("kubepods"), 600 << 20)?;
    // Re-read every second: nothing crosses a line on the way to 220Mi.
    let text = w
        .config_with_threshold("300Mi", "", "")
        .replace("resyncInterval: 60s", "resyncInterval: 1s");
    let mut daemon = w.start_text(&text)?;
    daemon.wait_log("the Node's status.allocatable.memory read", wait())?;
    let _held = hold_220mi(&w, &daemon, 600)?;
    assert!(
        w.evictions().is_empty(),
        "220Mi of the pods cgroup's 600Mi: no eviction"
    );
    let trace = attach_trace(&w.socket, &["--kind", "eviction,memory_threshold"])?;
    let _more = w.load("hog", 100)?;
    wait_until(wait(), "the eviction request", || !w.evictions().is_empty())?;
    let (eviction, crossed_on_kubepods) = eviction_after_kubepods_crossing(&trace)?;
    assert!(crossed_on_kubepods, "the kernel line on kubepods fired");
    assert_evicted_hog_for_allocatable(&eviction, 300 << 20);
    let observed = eviction["observed"].as_i64().expect("observed");
    assert!(
        observed > 200 << 20,
        "measured against the pods cgroup's 600Mi, not the Node's 1Gi: {eviction}"
    );
    w.assert_nothing_refused();
    daemon.stop()
}

/// The pods cgroup's limit needs nothing of the Node: with the Node's figure absent, the signal
/// is measured against that limit all the same, and `/readyz` does not name it; the log names
/// the field.
#[test]
fn an_unknown_node_figure_leaves_the_signal_known_where_the_pods_cgroup_has_a_limit(
) -> anyhow::Result<()> {
    require_root();
    let w = world("e2e-pods-limit-no-node", None)?;
    set_memory_limit(&w.node.path().join("kubepods"), 600 << 20)?;
    let mut daemon = start(&w, "1s")?;
    let warned = daemon.wait_log("the Node's status.allocatable.memory is unknown", wait())?;
    assert!(warned.contains("is absent"), "names the field: {warned}");
    let _held = hold_220mi(&w, &daemon, 600)?;
    let available = daemon.metric(AVAILABLE)?.expect("observed");
    assert!(
        available > 300.0 * 1048576.0,
        "600Mi less 220Mi in kubepods, from the pods cgroup's limit: {available}"
    );
    assert_eq!(daemon.metric(UNKNOWN)?, Some(0.0), "known");
    let ready = daemon.get("/readyz")?;
    assert!(
        !ready.contains("allocatable"),
        "the allocatable source is not what /readyz names: {ready}"
    );
    assert_eq!(
        daemon.log_count("source=\"allocatable\""),
        0,
        "the allocatable source is never said unreadable"
    );
    w.assert_nothing_refused();
    daemon.stop()
}
