//! OOM kills where users look, end to end: real kills in a pod's container cgroup on the real
//! kernel, the daemon against the strict fake cluster. A kill becomes a Warning event on the
//! pod (what `kubectl describe pod` lists), a storm in one container one event with its series,
//! and each says what the agent saw and did before it.

use std::{sync::Arc, time::Duration};

use node_agent_kube::fake::Reply;
use node_agent_tests::{
    cluster::{attach_trace, next_record, wait_until, Answered, PodSpec, NODE},
    move_into, require_root, scaled, set_memory_limit,
    world::{wait, World},
    Helper,
};

const MEM_HELPER: &str = env!("CARGO_BIN_EXE_mem-helper");
const HOG_UID: &str = "5c6d7e8f-9a0b-4c1d-8e2f-3a4b5c6d7e8f";
const CALM_UID: &str = "0f1e2d3c-4b5a-4968-8776-655443322110";

fn pods() -> [PodSpec; 2] {
    [
        PodSpec::new("shop", "hog", HOG_UID, "16Mi", 'e'),
        PodSpec::new("shop", "calm", CALM_UID, "512Mi", 'f'),
    ]
}

/// Kills a process that grows past the 32Mi limit of `pod`'s container, `times` times.
fn kill_in(w: &World, pod: &str, times: usize) -> anyhow::Result<()> {
    let container = w.dir_of(pod).to_path_buf();
    set_memory_limit(&container, 32 << 20)?;
    for _ in 0..times {
        let mut helper = Helper::spawn(MEM_HELPER, &["oom".into()])?;
        move_into(&container, helper.pid())?;
        helper.go()?;
        helper.wait_killed(scaled(Duration::from_secs(20)))?;
    }
    Ok(())
}

fn oom_events(w: &World) -> Vec<Answered> {
    w.cluster()
        .answered
        .iter()
        .filter(|a| a.body["reason"] == "NodeAgentOOMKill")
        .cloned()
        .collect()
}

#[test]
fn an_oom_kill_in_a_container_is_an_event_on_its_pod() -> anyhow::Result<()> {
    require_root();
    let w = World::new("oom-pod", &pods(), MEM_HELPER)?;
    let daemon = w.start("", "")?;
    let trace = attach_trace(&w.socket, &["--kind", "oom_kill"])?;
    kill_in(&w, "hog", 1)?;
    wait_until(wait(), "the pod's OOM event", || !oom_events(&w).is_empty())?;
    // Every OOM kill the agent saw (one per victim process the kernel chose).
    let mut records = vec![next_record(&trace, "oom_kill", wait())?];
    while let Ok(r) = next_record(&trace, "oom_kill", Duration::from_millis(500)) {
        records.push(r);
    }
    for r in &records {
        eprintln!("oom_kill record: {r}");
    }
    let event = &oom_events(&w)[0];
    assert_eq!(event.path, "/apis/events.k8s.io/v1/namespaces/shop/events");
    let e = &event.body;
    assert_eq!(
        e["regarding"],
        serde_json::json!({"apiVersion": "v1", "kind": "Pod", "namespace": "shop", "name": "hog",
            "uid": HOG_UID, "fieldPath": "spec.containers{app}"})
    );
    assert_eq!(
        (e["related"]["kind"].as_str(), e["related"]["name"].as_str()),
        (Some("Node"), Some(NODE))
    );
    assert_eq!(
        (e["type"].as_str(), e["action"].as_str()),
        (Some("Warning"), Some("OOMKilling"))
    );
    let note = e["note"].as_str().unwrap_or_default();
    assert!(note.contains("(mem-helper) in container app:"), "{note}");
    assert!(note.contains("of the container's 32Mi limit"), "{note}");
    assert!(
        note.contains("node-agent saw no memory pressure in the minute before"),
        "{note}"
    );
    let record = &records[0];
    assert_eq!(record["cgroup"]["pod"]["container"], "app", "{record}");
    assert!(record["saw_before"].is_object(), "{record}");
    assert_eq!(
        daemon.metric("node_agent_oom_kills_total{namespace=\"shop\",container=\"app\",reason=\"cgroup_limit\"}")?,
        Some(records.len() as f64)
    );
    assert!(
        !w.cluster().answered.iter().any(
            |a| a.body["reason"] == "NodeAgentOOMKill" && a.body["regarding"]["kind"] == "Node"
        ),
        "a kill in a pod is told on the pod, not the node"
    );
    w.assert_nothing_refused();
    daemon.stop()
}

#[test]
fn an_oom_storm_in_one_container_is_one_event_counted_in_its_series() -> anyhow::Result<()> {
    require_root();
    const KILLS: usize = 12;
    let w = World::new("oom-storm", &pods(), MEM_HELPER)?;
    let daemon = w.start("", "")?;
    kill_in(&w, "hog", KILLS)?;
    let count = |w: &World| -> Option<u64> {
        w.fake
            .seen()
            .iter()
            .filter(|s| s.method == "PATCH" && s.path.contains("/events/"))
            .filter_map(|s| s.body["series"]["count"].as_u64())
            .max()
    };
    wait_until(wait(), "the series counting every kill", || {
        count(&w) == Some(KILLS as u64)
    })?;
    assert_eq!(oom_events(&w).len(), 1, "one event for the whole storm");
    let name = oom_events(&w)[0].body["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        w.fake
            .seen()
            .iter()
            .filter(|s| s.method == "PATCH" && s.path.contains("/events/"))
            .all(|s| s.path.ends_with(&format!("/events/{name}"))),
        "every update is of that event"
    );
    w.assert_nothing_refused();
    daemon.stop()
}

/// The last thing done before the kill: the hog's eviction blocked, or (every pod blocked in
/// turn) no pod left to evict, the hog named among those passed over and why.
fn says_hog_was_blocked(said: &str) -> bool {
    said.contains("eviction of shop/hog blocked by its PodDisruptionBudget")
        || (said.contains("but no pod may be evicted")
            && said.contains("shop/hog (blocked_by_pdb)"))
}

/// Pressure first: the memory threshold crossed and the hog chosen, but its disruption budget
/// blocks it; then a kill in the hog's container. Its event and trace record say so.
#[test]
fn the_event_says_what_the_agent_saw_and_did_before() -> anyhow::Result<()> {
    require_root();
    let w = World::new("oom-before", &pods(), MEM_HELPER)?;
    w.cluster().evict_reply = Some(Arc::new(|_name: &str| Reply::pdb_blocked("hog-budget")));
    let daemon = w.start("", "")?;
    let trace = attach_trace(&w.socket, &["--kind", "oom_kill"])?;
    let _calm = w.load("calm", 120)?;
    let hog = w.load("hog", 100)?;
    wait_until(wait(), "the blocked eviction", || !w.evictions().is_empty())?;
    // The hog lets go (so its container can be given a small limit), then a process in it
    // grows past that limit.
    drop(hog);
    std::thread::sleep(Duration::from_millis(300));
    kill_in(&w, "hog", 1)?;
    wait_until(wait(), "the pod's OOM event", || !oom_events(&w).is_empty())?;
    let note = oom_events(&w)[0].body["note"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(note.contains("node-agent saw memory pressure ("), "{note}");
    assert!(says_hog_was_blocked(&note), "{note}");
    let record = next_record(&trace, "oom_kill", wait())?;
    let saw = &record["saw_before"];
    assert!(
        saw["pressure"]["before_ms"]
            .as_u64()
            .is_some_and(|ms| ms >= 300),
        "{record}"
    );
    assert!(
        says_hog_was_blocked(saw["decision"].as_str().unwrap_or_default()),
        "{record}"
    );
    assert_eq!(
        daemon.metric("node_agent_oom_kills_foreseen_total{reason=\"cgroup_limit\"}")?,
        Some(1.0)
    );
    w.assert_nothing_refused();
    daemon.stop()
}
