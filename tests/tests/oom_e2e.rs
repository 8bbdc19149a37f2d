//! OOM kills where users look, end to end: real kills in a pod's container cgroup on the real
//! kernel, the daemon against the strict fake cluster. A kill becomes a Warning event on the
//! pod (what `kubectl describe pod` lists), a storm in one container one event with its series,
//! and each says what the agent saw and did before it.

use std::{sync::Arc, time::Duration};

use node_agent_cri::proto;
use node_agent_kube::fake::{Fake, Reply};
use node_agent_tests::{
    containerd::{Containerd, Options, PAUSE_IMAGE},
    fake_cluster::{
        attach_trace, free_port, next_record, responder, wait_until, Answered, Daemon, PodSpec,
        SharedCluster, NODE,
    },
    move_into,
    oci::ImageSpec,
    require_root, scaled, set_memory_limit,
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
    // The hog first, then calm (every eviction is blocked), then none left: the kill may
    // come after any of the three.
    said.contains("eviction of shop/hog blocked by its PodDisruptionBudget")
        || said.contains("eviction of shop/calm blocked by its PodDisruptionBudget")
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

/// An API server refusing events during an OOM storm: said once, every failure counted; when
/// it takes them again, the event is posted with every kill since the first in its series.
#[test]
fn refused_oom_events_are_said_once_and_posted_again_with_their_count() -> anyhow::Result<()> {
    require_root();
    let w = World::new("oom-refused", &pods(), MEM_HELPER)?;
    let refusing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let r = refusing.clone();
    w.cluster().hook = Some(Arc::new(move |seen: &node_agent_kube::fake::Seen| {
        (r.load(std::sync::atomic::Ordering::SeqCst)
            && seen.path.contains("/events")
            && seen.body["reason"] == "NodeAgentOOMKill")
            .then(|| Reply::status(403, "Forbidden", "events.events.k8s.io is forbidden"))
    }));
    let mut daemon = w.start("", "")?;
    kill_in(&w, "hog", 3)?;
    let errors = "node_agent_kube_errors_total{operation=\"pod oom event\"}";
    wait_until(wait(), "the refusals counted", || {
        daemon.metric(errors).ok().flatten().unwrap_or(0.0) >= 1.0
    })?;
    // The retry of the first three, at the next flush, is refused too.
    std::thread::sleep(scaled(Duration::from_secs(3)));
    refusing.store(false, std::sync::atomic::Ordering::SeqCst);
    kill_in(&w, "hog", 2)?;
    // Posted again with its count so far, then (a kill after that post) its series updated.
    let counted = |w: &World| -> Option<u64> {
        w.cluster()
            .answered
            .iter()
            .filter(|a| a.path.contains("/events"))
            .filter_map(|a| a.body["series"]["count"].as_u64())
            .max()
    };
    wait_until(
        wait(),
        "the series counting every kill since the first",
        || counted(&w) == Some(5),
    )?;
    let events = oom_events(&w);
    assert_eq!(events.len(), 1, "one event taken");
    let e = &events[0].body;
    assert_eq!(e["regarding"]["name"], "hog");
    assert!(
        e["series"]["count"].as_u64().is_some_and(|n| n >= 4),
        "posted again with the refused kills counted: {e}"
    );
    assert!(daemon.metric(errors)?.unwrap_or(0.0) >= 2.0);
    assert_eq!(daemon.log_count("event not recorded"), 1, "said once");
    // The agent says so once the outcome is back, after the server took the write.
    daemon.wait_log("events recorded again", wait())?;
    assert_eq!(daemon.log_count("events recorded again"), 1);
    w.assert_nothing_refused();
    daemon.stop()
}

/// A kill in a pod cgroup that neither the pod source nor a container runtime can name: the
/// node event, with the pod's UID from the cgroup path, never a guessed pod.
#[test]
fn a_kill_in_a_pod_nobody_names_is_told_on_the_node() -> anyhow::Result<()> {
    require_root();
    let w = World::new("oom-nameless", &pods(), MEM_HELPER)?;
    // The pod source lists only calm; the hog's cgroup is there all the same.
    w.cluster().pods.retain(|p| p["metadata"]["name"] != "hog");
    let mut daemon = w.start("", "")?;
    kill_in(&w, "hog", 1)?;
    wait_until(wait(), "the node's OOM event", || {
        !oom_events(&w).is_empty()
    })?;
    let e = &oom_events(&w)[0].body;
    assert_eq!(e["regarding"]["kind"], "Node", "{e}");
    let note = e["note"].as_str().unwrap_or_default();
    assert!(
        note.contains(&format!("(mem-helper) in the cgroup of pod UID {HOG_UID}, which neither the pod source nor the container runtime names")),
        "{note}"
    );
    assert!(
        !w.cluster()
            .answered
            .iter()
            .any(|a| a.body["regarding"]["kind"] == "Pod"),
        "no pod is guessed"
    );
    // Logged beside the event's posting, not before it: waited for, then counted.
    daemon.wait_log("the runtime could not name an OOM-killed container", wait())?;
    assert_eq!(
        daemon.log_count("the runtime could not name an OOM-killed container"),
        1
    );
    w.assert_nothing_refused();
    daemon.stop()
}

/// The pod source lags behind a new pod: a kill in its container, created through a real
/// containerd as the kubelet creates it, is named by the runtime (the kubelet's labels on the
/// container) and told on the pod, saying that it was named late.
#[test]
fn a_kill_in_a_container_the_pod_source_has_not_listed_is_named_by_the_runtime(
) -> anyhow::Result<()> {
    require_root();
    const UID: &str = "7d3c1b2a-5e6f-4a8b-9c0d-1e2f3a4b5c6d";
    let rt = tokio::runtime::Runtime::new()?;
    let ctrd = rt.block_on(Containerd::start(Options::default()))?;
    let image = "localhost/node-agent-test/oom:1";
    rt.block_on(ctrd.build_and_import(&ImageSpec::busybox(image)?, "oom"))?;
    // The pod source knows no pod at all yet.
    let state = SharedCluster::default();
    let fake = rt.block_on(Fake::start(responder(state.clone())));
    let dir = std::env::temp_dir().join(format!("node-agent-oom-late-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let _remove = RemoveDir(dir.clone());
    let port = free_port()?;
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: node-agent.io/v1alpha1\nkind: NodeAgentConfiguration\n\
             kubernetes:\n  podSource: kubelet\n  nodeName: {NODE}\n  podRefreshInterval: 200ms\n  \
             kubelet: {{url: '{url}', caFile: '{ca}'}}\n  \
             apiServer: {{url: '{url}', caFile: '{ca}'}}\n  tokenPath: '{token}'\n\
             cri:\n  endpoint: 'unix://{sock}'\n  keepImages: ['{PAUSE_IMAGE}']\n\
             dryRun: false\nlisten: '127.0.0.1:{port}'\nmetricsAccess: loopback\ntraceSocket: '{trace}'\nnodeCgroup: '{cg}'\n\
             memoryCapacity: 64Gi\nnodefsPath: '{fs}'\nresyncInterval: 1s\nforkLimit: 0\n",
            url = fake.url(),
            ca = fake.pki.ca_file.display(),
            token = fake.token_file.display(),
            sock = ctrd.socket().display(),
            trace = dir.join("trace.sock").display(),
            cg = ctrd.cgroup_root(),
            fs = dir.display(),
        ),
    )?;
    // The sandbox first (it makes the node's cgroups), then the agent, then the container.
    let pod = rt.block_on(ctrd.run_pod(ctrd.pod_config("shop", "late", UID, "burstable")))?;
    let daemon = Daemon::start(&config, port)?;
    let trace = attach_trace(&dir.join("trace.sock"), &["--kind", "oom_kill"])?;
    let id = rt.block_on(async {
        let mut c = Containerd::container_config(
            &pod,
            "grower",
            0,
            image,
            // dd's one 64 MiB block, filled from /dev/zero, is more than its 32 MiB limit.
            &[
                "/bin/dd",
                "if=/dev/zero",
                "of=/dev/null",
                "bs=64M",
                "count=1",
            ],
        );
        c.linux = Some(proto::LinuxContainerConfig {
            resources: Some(proto::LinuxContainerResources {
                memory_limit_in_bytes: 32 << 20,
                ..Default::default()
            }),
            ..Default::default()
        });
        ctrd.run_container(&pod, c, true).await
    })?;
    let oom_events = || -> Vec<Answered> {
        state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .answered
            .iter()
            .filter(|a| a.body["reason"] == "NodeAgentOOMKill")
            .cloned()
            .collect()
    };
    wait_until(wait(), "the pod's OOM event", || !oom_events().is_empty())?;
    let record = next_record(&trace, "oom_kill", wait())?;
    eprintln!("oom_kill record: {record}");
    let e = &oom_events()[0].body;
    assert_eq!(
        e["regarding"],
        serde_json::json!({"apiVersion": "v1", "kind": "Pod", "namespace": "shop", "name": "late",
            "uid": UID, "fieldPath": "spec.containers{grower}"}),
        "{e}"
    );
    let note = e["note"].as_str().unwrap_or_default();
    assert!(
        note.starts_with("Out of memory: killed process ")
            && note.contains(" (dd) in container grower (named by the container runtime: the pod source had not listed it yet): "),
        "{note}"
    );
    assert!(note.contains("of the container's 32Mi limit"), "{note}");
    assert_eq!(
        record["cgroup"]["pod"]["container_id"],
        id.as_str(),
        "{record}"
    );
    assert!(
        fake.rejected().is_empty(),
        "the API server refused: {:?}",
        fake.rejected()
    );
    daemon.stop()
}

struct RemoveDir(std::path::PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
