//! A hard memory threshold carried out on the node (`kubernetes.hardEviction: node`), end to
//! end: real cgroups in the kubelet's layout under a test node cgroup, real memory, the real
//! kernel (cgroup v1 on this host; v2 in the VM tests), the agent in the host's PID namespace
//! as the DaemonSet runs it, and the fake kubelet and API server. The ranked pod's processes
//! are killed (SIGKILL, whatever they do with SIGTERM), its record written through the API
//! (`Failed`, `Evicted`, the kubelet's condition, bound to its UID), no Eviction asked; the
//! other pod is left alone.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    time::Instant,
};

use node_agent_kube::fake::{Reply, Seen};
use node_agent_tests::{
    fake_cluster::{attach_trace, wait_until, PodSpec},
    move_into, require_root,
    world::{wait, World},
    Helper,
};

const MEM_HELPER: &str = env!("CARGO_BIN_EXE_mem-helper");
const HOG_UID: &str = "3f2c1e0a-5b4d-4c6e-8f7a-9b0c1d2e3f4a";
const CALM_UID: &str = "7a6b5c4d-3e2f-4a1b-8c9d-0e1f2a3b4c5d";
const NODE_KILLS: &str = "  hardEviction: node\n";

/// hog: far over its 16Mi request (ranked first); calm: within its 512Mi request.
fn hog() -> PodSpec {
    PodSpec::new("shop", "hog", HOG_UID, "16Mi", 'c')
}

fn calm() -> PodSpec {
    PodSpec::new("shop", "calm", CALM_UID, "512Mi", 'd')
}

fn status_patches(w: &World, name: &str) -> Vec<serde_json::Value> {
    let path = format!("/api/v1/namespaces/shop/pods/{name}/status");
    w.cluster()
        .answered
        .iter()
        .filter(|a| a.method == "PATCH" && a.path == path && a.status == 200)
        .map(|a| a.body.clone())
        .collect()
}

/// A helper growing to `mib` MiB in the named pod's container cgroup, not waited for: it may
/// be killed before it holds them all.
fn grow(w: &World, name: &str, mib: u32) -> anyhow::Result<Helper> {
    let mut helper = Helper::spawn(MEM_HELPER, &["hold".into(), mib.to_string()])?;
    move_into(w.dir_of(name), helper.pid())?;
    helper.go()?;
    Ok(helper)
}

fn alive(helper: &Helper) -> bool {
    // SAFETY: kill(2) with signal 0 only checks.
    unsafe { libc::kill(helper.pid() as i32, 0) == 0 }
}

#[test]
fn a_hard_memory_threshold_kills_the_ranked_pod_on_the_node_and_records_it_evicted(
) -> anyhow::Result<()> {
    require_root();
    let w = World::new("e2e-kill", &[hog(), calm()], MEM_HELPER)?;
    let daemon = w.start(NODE_KILLS, "")?;
    let trace = attach_trace(&w.socket, &["--kind", "eviction"])?;
    assert_eq!(
        daemon.metric("node_agent_hard_evictions_on_node")?,
        Some(1.0),
        "the agent can kill on the node here (host PID namespace, root)"
    );
    let calm_helper = w.load("calm", 120)?;
    let mut hog_helper = grow(&w, "hog", 100)?;
    let signal = hog_helper.wait_killed(wait())?;
    let killed_at = Instant::now();
    assert_eq!(
        signal,
        libc::SIGKILL,
        "killed outright, as the kubelet kills for a hard threshold"
    );
    let eviction = trace.json.recv_timeout(wait())?;
    assert_eq!(
        (eviction["name"].as_str(), eviction["result"].as_str()),
        (Some("hog"), Some("killed"))
    );
    wait_until(wait(), "the hog's record", || {
        !status_patches(&w, "hog").is_empty()
    })?;
    eprintln!("killed → record written: {:?}", killed_at.elapsed());
    let patch = &status_patches(&w, "hog")[0];
    assert_eq!(patch["metadata"]["uid"], HOG_UID, "bound to the pod's UID");
    assert_eq!(patch["status"]["phase"], "Failed");
    assert_eq!(patch["status"]["reason"], "Evicted");
    assert_eq!(patch["status"]["message"], eviction["message"]);
    assert_eq!(patch["status"]["conditions"][0]["type"], "DisruptionTarget");
    assert_eq!(
        patch["status"]["conditions"][0]["reason"],
        "TerminationByKubelet"
    );
    // The pod's Evicted event, with the decision's own words.
    let event = w.evicted_event()?;
    assert_eq!(event.body["note"], eviction["message"]);
    assert!(
        w.evictions().is_empty(),
        "no Eviction through the API: {:?}",
        w.evictions()
    );
    assert!(alive(&calm_helper), "the other pod is left alone");
    assert!(status_patches(&w, "calm").is_empty());
    assert_eq!(
        daemon.metric(
            "node_agent_evictions_total{eviction_signal=\"memory.available\",result=\"killed\"}"
        )?,
        Some(1.0)
    );
    wait_until(wait(), "the record counted", || {
        daemon
            .metric("node_agent_eviction_records_total{result=\"written\"}")
            .ok()
            .flatten()
            == Some(1.0)
    })?;
    w.assert_nothing_refused();
    daemon.stop()
}

#[test]
fn in_dry_run_nothing_is_killed_and_the_log_says_what_would_be() -> anyhow::Result<()> {
    require_root();
    let w = World::new("e2e-kill-dry", &[hog(), calm()], MEM_HELPER)?;
    let mut daemon = w.start(NODE_KILLS, "dryRun: true\n")?;
    let _calm = w.load("calm", 120)?;
    let hog_helper = w.load("hog", 100)?;
    daemon.wait_log("dry run: would kill the pod on the node", wait())?;
    daemon.wait_evaluations(3.0, wait())?;
    assert!(alive(&hog_helper), "dry run touches nothing");
    assert!(status_patches(&w, "hog").is_empty());
    assert!(w.evictions().is_empty());
    daemon.stop()
}

/// The API server answers nothing for the pods' status (down): the hog is killed all the
/// same, its record waits and is written once the API server is back.
#[test]
fn with_the_api_server_away_the_pod_is_killed_and_its_record_written_once_it_is_back(
) -> anyhow::Result<()> {
    require_root();
    let w = World::new("e2e-kill-away", &[hog(), calm()], MEM_HELPER)?;
    let away = Arc::new(AtomicBool::new(true));
    let refused = Arc::new(AtomicUsize::new(0));
    {
        let (away, refused) = (away.clone(), refused.clone());
        w.cluster().hook = Some(Arc::new(move |seen: &Seen| {
            (away.load(Ordering::SeqCst)
                && seen.path.ends_with("/status")
                && seen.path.contains("/pods/"))
            .then(|| {
                refused.fetch_add(1, Ordering::SeqCst);
                Reply::status(503, "ServiceUnavailable", "the API server is away")
            })
        }));
    }
    let mut daemon = w.start(NODE_KILLS, "")?;
    let _calm = w.load("calm", 120)?;
    let mut hog_helper = grow(&w, "hog", 100)?;
    assert_eq!(hog_helper.wait_killed(wait())?, libc::SIGKILL);
    daemon.wait_log("its record waits for the API server", wait())?;
    assert_eq!(
        daemon.metric("node_agent_eviction_records_waiting")?,
        Some(1.0)
    );
    assert!(refused.load(Ordering::SeqCst) >= 1);
    away.store(false, Ordering::SeqCst);
    daemon.wait_log("eviction recorded", wait())?;
    let patch = &status_patches(&w, "hog")[0];
    assert_eq!(patch["status"]["reason"], "Evicted");
    assert_eq!(
        daemon.metric("node_agent_eviction_records_waiting")?,
        Some(0.0)
    );
    daemon.stop()
}

/// The hog's cgroup exists and grows before the pod source lists it (a pod admitted since
/// the last refresh): the agent asks the pod source at once and ranks it, rather than killing
/// calm, the only pod it knew.
#[test]
fn a_pod_the_pod_source_has_not_listed_yet_is_named_before_the_pods_are_ranked(
) -> anyhow::Result<()> {
    require_root();
    let w = World::new("e2e-kill-unlisted", &[hog(), calm()], MEM_HELPER)?;
    // The kubelet lists calm alone until the test says otherwise.
    w.cluster().pods = vec![calm().json()];
    // Pods refreshed every 10 minutes: only an ask at once can name the hog in time.
    let text = w
        .config(NODE_KILLS, "")
        .replace("podRefreshInterval: 200ms", "podRefreshInterval: 10m");
    assert!(text.contains("podRefreshInterval: 10m"), "{text}");
    let mut daemon = w.start_text_listed_once(&text)?;
    let calm_helper = w.load("calm", 120)?;
    let lists = w.cluster().pod_lists;
    // The hog's cgroup holds memory; the kubelet now lists it (a pod admitted just now), but
    // the agent hears of it only if it asks.
    w.cluster().pods = vec![calm().json(), hog().json()];
    let mut hog_helper = grow(&w, "hog", 100)?;
    assert_eq!(hog_helper.wait_killed(wait())?, libc::SIGKILL);
    assert!(
        w.cluster().pod_lists > lists,
        "the pod source was asked again before the pods were ranked"
    );
    assert!(
        alive(&calm_helper),
        "calm, the only pod listed before, is left alone"
    );
    assert!(status_patches(&w, "calm").is_empty());
    let _ = daemon.wait_log("eviction recorded", wait())?;
    daemon.stop()
}

/// Without the host's PID namespace (a pod without `hostPID`) the pods' processes are out of
/// sight: the agent says so, and a hard eviction goes through the API.
#[test]
fn outside_the_host_pid_namespace_hard_evictions_go_through_the_api() -> anyhow::Result<()> {
    require_root();
    let w = World::new("e2e-kill-pidns", &[hog(), calm()], MEM_HELPER)?;
    let mut daemon = w.start_text_in_pid_namespace(&w.config(NODE_KILLS, ""))?;
    daemon.wait_log("cannot be carried out on the node here", wait())?;
    assert_eq!(
        daemon.metric("node_agent_hard_evictions_on_node")?,
        Some(0.0)
    );
    let _calm = w.load("calm", 120)?;
    let hog_helper = w.load("hog", 100)?;
    wait_until(wait(), "the eviction request", || !w.evictions().is_empty())?;
    assert_eq!(w.evictions()[0].0, hog().eviction_path());
    assert!(alive(&hog_helper), "nothing was killed on the node");
    daemon.stop()
}
