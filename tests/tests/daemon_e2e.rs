//! `node-agent run` end to end: real cgroups in the kubelet's layout, real memory pressure, the
//! real kernel, and a fake kubelet/API server speaking HTTPS and the real JSON.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use node_agent_kube::fake::{Fake, Reply, Seen};
use node_agent_tests::{
    move_into, require_root, scaled, set_memory_limit, time_scale, AgentProcess, Helper, TestCgroup,
};
use serde_json::{json, Value};

const MEM_HELPER: &str = env!("CARGO_BIN_EXE_mem-helper");
const HOG_UID: &str = "1b4e28ba-2fa1-11d2-883f-0016d3cca427";
const CALM_UID: &str = "6ba7b810-9dad-11d1-80b4-00c04fd430c8";
const NODE: &str = "test-node";

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn pod(name: &str, uid: &str, memory_request: &str, container_id: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "shop", "uid": uid,
                     "annotations": {"kubernetes.io/config.source": "api"}},
        "spec": {"nodeName": NODE, "priority": 0, "terminationGracePeriodSeconds": 30,
                 "containers": [{"name": "app", "image": "app:1",
                                 "resources": {"requests": {"memory": memory_request}}}]},
        "status": {"phase": "Running", "qosClass": "Burstable",
                   "containerStatuses": [{"name": "app", "containerID": format!("containerd://{container_id}"),
                                          "ready": true, "restartCount": 0, "image": "app:1", "imageID": ""}]}
    })
}

/// The fake cluster: the kubelet's /pods and /stats/summary, and the API server's eviction,
/// events and node endpoints. Eviction requests are stamped with CLOCK_MONOTONIC on arrival.
fn cluster(
    evictions: Arc<Mutex<Vec<(String, u64)>>>,
) -> impl Fn(&Seen, usize) -> Reply + Send + Sync + 'static {
    move |seen: &Seen, _| {
        let path = seen.path.split('?').next().unwrap_or("");
        match (seen.method.as_str(), path) {
            ("GET", "/pods") => Reply::json(
                200,
                json!({"kind": "PodList", "apiVersion": "v1", "metadata": {},
                       "items": [pod("hog", HOG_UID, "16Mi", &"a".repeat(64)), pod("calm", CALM_UID, "512Mi", &"b".repeat(64))]})
                .to_string(),
            ),
            ("GET", "/stats/summary") => Reply::json(200, json!({"node": {"nodeName": NODE}, "pods": []}).to_string()),
            ("POST", p) if p.ends_with("/eviction") => {
                evictions.lock().unwrap().push((p.to_string(), monotonic_ns()));
                Reply::json(201, json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}).to_string())
            }
            ("POST", p) if p.contains("/events") => Reply::json(201, seen.body.to_string()),
            ("GET", p) if p == format!("/api/v1/nodes/{NODE}") => Reply::json(
                200,
                json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": NODE}, "status": {"conditions": []}}).to_string(),
            ),
            ("PATCH", _) => Reply::json(200, json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": NODE}}).to_string()),
            _ => Reply::status(404, "NotFound", "not served by the fake"),
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Setup {
    node: TestCgroup,
    hog_dir: PathBuf,
    calm_dir: PathBuf,
    dir: PathBuf,
    config: PathBuf,
    socket: PathBuf,
    port: u16,
}

/// Cgroups in the kubelet's cgroupfs layout below a test "node" cgroup, and a config file.
fn setup(fake: &Fake, label: &str) -> anyhow::Result<Setup> {
    let node = TestCgroup::new(label)?;
    let hog_dir = node.child(&format!(
        "kubepods/burstable/pod{HOG_UID}/{}",
        "a".repeat(64)
    ))?;
    let calm_dir = node.child(&format!(
        "kubepods/burstable/pod{CALM_UID}/{}",
        "b".repeat(64)
    ))?;
    let dir = std::env::temp_dir().join(format!("node-agent-e2e-{label}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let socket = dir.join("trace.sock");
    let port = free_port();
    let config = dir.join("config.yaml");
    std::fs::write(&config, config_text(fake, &node, &socket, port, "824Mi"))?;
    Ok(Setup {
        node,
        hog_dir,
        calm_dir,
        dir,
        config,
        socket,
        port,
    })
}

/// Node capacity 1Gi and memory.available<824Mi: the node crosses once its pods use 200Mi.
fn config_text(
    fake: &Fake,
    node: &TestCgroup,
    socket: &Path,
    port: u16,
    threshold: &str,
) -> String {
    format!(
        "eviction:\n  evictionHard: {{memory.available: {threshold}}}\n\
         kubernetes:\n  pod_source: kubelet\n  node_name: {NODE}\n  kubelet: {{url: '{url}', ca_file: '{ca}'}}\n  \
         api_server: {{url: '{url}', ca_file: '{ca}'}}\n  token_path: '{token}'\n  evictions_per_minute: 60\n\
         agent:\n  listen: '127.0.0.1:{port}'\n  trace_socket: '{socket}'\n  node_cgroup: '{cg}'\n  memory_capacity: 1Gi\n  \
         resync_interval: 60s\n  pod_refresh_interval: 500ms\n  fork_limit: 0\n",
        url = fake.url(),
        ca = fake.pki.ca_file.display(),
        token = fake.token_file.display(),
        socket = socket.display(),
        cg = node.cgroup_path(),
    )
}

/// The daemon as a subprocess, with the log lines seen so far. Killed on drop.
struct Agent {
    process: AgentProcess,
    seen_log: Vec<String>,
}

impl Agent {
    fn start(config: &Path) -> anyhow::Result<Agent> {
        let process =
            AgentProcess::spawn(&["run".as_ref(), "--config".as_ref(), config.as_os_str()])?;
        let mut agent = Agent {
            process,
            seen_log: Vec::new(),
        };
        agent.wait_log("node-agent running", scaled(Duration::from_secs(20)))?;
        Ok(agent)
    }

    fn wait_log(&mut self, needle: &str, limit: Duration) -> anyhow::Result<String> {
        let deadline = Instant::now() + limit;
        if let Some(line) = self.seen_log.iter().find(|l| l.contains(needle)) {
            return Ok(line.clone());
        }
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.process.log.recv_timeout(left) {
                Ok(line) => {
                    self.seen_log.push(line.clone());
                    if line.contains(needle) {
                        return Ok(line);
                    }
                }
                Err(_) => break,
            }
        }
        anyhow::bail!("the agent did not log {needle:?} within {limit:?}")
    }
}

/// `node-agent trace` attached to the daemon's socket.
fn attach_trace(socket: &Path) -> anyhow::Result<AgentProcess> {
    AgentProcess::spawn(&[
        "trace".as_ref(),
        "--output".as_ref(),
        "json".as_ref(),
        "--socket".as_ref(),
        socket.as_os_str(),
    ])
}

fn http_get(port: u16, path: &str) -> anyhow::Result<String> {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(scaled(Duration::from_secs(5))))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

#[test]
fn memory_pressure_evicts_the_pod_the_kubelet_ranking_selects_within_100ms() -> anyhow::Result<()> {
    require_root();
    let rt = tokio::runtime::Runtime::new()?;
    let evictions = Arc::new(Mutex::new(Vec::new()));
    let fake = rt.block_on(Fake::start(cluster(evictions.clone())));
    let s = setup(&fake, "e2e-evict")?;
    let mut agent = Agent::start(&s.config)?;
    let trace = attach_trace(&s.socket)?;
    std::thread::sleep(Duration::from_millis(1500)); // pods fetched, trace attached

    // calm: 120Mi, well under its 512Mi request; hog: 100Mi, far over its 16Mi request.
    // Together they take the node past 200Mi used: memory.available < 824Mi.
    let mut calm = Helper::spawn(MEM_HELPER, &["hold".into(), "120".into()])?;
    move_into(&s.calm_dir, calm.pid())?;
    calm.go()?;
    assert_eq!(calm.read_line()?, "held");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        evictions.lock().unwrap().is_empty(),
        "no eviction before the threshold is crossed"
    );
    let mut hog = Helper::spawn(MEM_HELPER, &["hold".into(), "100".into()])?;
    move_into(&s.hog_dir, hog.pid())?;
    hog.go()?;
    assert_eq!(hog.read_line()?, "held");
    std::thread::sleep(Duration::from_secs(2));

    let evicted = evictions.lock().unwrap().clone();
    assert_eq!(evicted.len(), 1, "exactly one eviction: {evicted:?}");
    assert_eq!(
        evicted[0].0, "/api/v1/namespaces/shop/pods/hog/eviction",
        "the pod over its request goes first"
    );
    let request_at = evicted[0].1;

    // The trace client saw the kernel's crossing and the eviction.
    let mut crossing_ktime = None;
    let mut eviction = None;
    let deadline = Instant::now() + scaled(Duration::from_secs(3));
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let Ok(v) = trace.json.recv_timeout(left) else {
            break;
        };
        match v["kind"].as_str() {
            Some("memory_threshold") if v["direction"] == "up" && crossing_ktime.is_none() => {
                crossing_ktime = v["ktime_ns"].as_u64();
            }
            Some("eviction") => {
                eviction = Some(v);
                break;
            }
            _ => {}
        }
    }
    let crossing = crossing_ktime.expect("trace saw the memory_threshold crossing");
    let eviction = eviction.expect("trace saw the eviction");
    assert_eq!(
        (eviction["name"].as_str(), eviction["result"].as_str()),
        (Some("hog"), Some("evicted"))
    );
    assert_eq!(eviction["signal"], "memory.available");
    let latency_ms = (request_at.saturating_sub(crossing)) as f64 / 1e6;
    eprintln!("kernel crossing → eviction request: {latency_ms:.2} ms");
    assert!(request_at > crossing, "the request follows the crossing");
    // A latency figure means something on hardware only: under emulation (`time_scale` > 1,
    // the VM tests) it measures the emulator, so there it is printed above, not asserted.
    if time_scale() == 1 {
        assert!(
            latency_ms < 100.0,
            "kernel crossing → eviction request took {latency_ms:.2} ms"
        );
    }

    let metrics = http_get(s.port, "/metrics")?;
    assert!(
        metrics.contains(
            r#"node_agent_evictions_total{signal="memory.available",result="evicted"} 1"#
        ),
        "evictions are counted: {metrics}"
    );
    drop(trace);
    hog.go().ok();
    calm.go().ok();
    agent.process.signal(libc::SIGTERM);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = agent.process.child.try_wait()? {
            break status;
        }
        assert!(
            started.elapsed() < scaled(Duration::from_secs(2)),
            "the agent exits within 2 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "exit 0 on SIGTERM: {status}");
    let _ = std::fs::remove_dir_all(&s.dir);
    drop(s.node);
    Ok(())
}

#[test]
fn an_oom_kill_in_a_pod_is_reported_on_the_node_as_oomkilling() -> anyhow::Result<()> {
    require_root();
    let rt = tokio::runtime::Runtime::new()?;
    let fake = rt.block_on(Fake::start(cluster(Arc::new(Mutex::new(Vec::new())))));
    let s = setup(&fake, "e2e-oom")?;
    // The pod's own limit: the OOM killer acts inside the pod, not the agent.
    set_memory_limit(s.hog_dir.parent().unwrap(), 32 << 20)?;
    let _agent = Agent::start(&s.config)?;
    std::thread::sleep(Duration::from_millis(1500));

    let mut helper = Helper::spawn(MEM_HELPER, &["oom".into()])?;
    move_into(&s.hog_dir, helper.pid())?;
    helper.go()?;
    helper.wait_killed(Duration::from_secs(20))?;

    let deadline = Instant::now() + scaled(Duration::from_secs(3));
    let event = loop {
        let found = fake
            .seen()
            .into_iter()
            .find(|r| r.method == "POST" && r.body["reason"] == "OOMKilling");
        if let Some(e) = found {
            break e;
        }
        assert!(
            Instant::now() < deadline,
            "an OOMKilling event was posted: {:?}",
            fake.calls()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let note = event.body["note"].as_str().unwrap_or_default().to_string();
    assert!(
        note.contains("mem-helper"),
        "names the killed process: {note}"
    );
    assert!(
        note.contains("shop/hog") || note.contains("hog"),
        "names the pod: {note}"
    );
    assert_eq!(event.body["regarding"]["kind"], "Node");
    let _ = std::fs::remove_dir_all(&s.dir);
    Ok(())
}

#[test]
fn an_invalid_reload_keeps_the_agent_on_its_old_config() -> anyhow::Result<()> {
    require_root();
    let rt = tokio::runtime::Runtime::new()?;
    let fake = rt.block_on(Fake::start(cluster(Arc::new(Mutex::new(Vec::new())))));
    let s = setup(&fake, "e2e-reload")?;
    let mut agent = Agent::start(&s.config)?;

    std::fs::write(
        &s.config,
        "eviction:\n  evictionHard: {memory.available: '<lots'}\n",
    )?;
    agent.process.signal(libc::SIGHUP);
    let line = agent.wait_log(
        "invalid config; keeping the previous one",
        scaled(Duration::from_secs(5)),
    )?;
    assert!(
        line.contains("memory.available"),
        "says what was wrong: {line}"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(agent.process.child.try_wait()?.is_none(), "still running");
    let health = http_get(s.port, "/healthz")?;
    assert!(
        health.starts_with("HTTP/1.1 200"),
        "healthy on the old config: {health}"
    );
    // SIGHUP and the file watcher may both have read the bad file: each refusal counts.
    let metrics = http_get(s.port, "/metrics")?;
    let count = |result: &str| -> u64 {
        let key = format!("node_agent_config_reloads_total{{result=\"{result}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(key.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    assert!(count("invalid") >= 1, "the refusal is counted: {metrics}");
    assert_eq!(count("ok"), 0, "nothing invalid was taken");

    // A valid change is then taken.
    std::fs::write(
        &s.config,
        config_text(&fake, &s.node, &s.socket, s.port, "700Mi"),
    )?;
    agent.process.signal(libc::SIGHUP);
    agent.wait_log("config reloaded", scaled(Duration::from_secs(5)))?;
    let _ = std::fs::remove_dir_all(&s.dir);
    Ok(())
}

#[test]
fn standalone_mode_decides_in_dry_run_and_shows_it_on_stdout() -> anyhow::Result<()> {
    require_root();
    // No cluster: the node cgroup's children are the workloads.
    let node = TestCgroup::new("e2e-standalone")?;
    let big = node.child("big")?;
    let _small = node.child("small")?;
    let dir =
        std::env::temp_dir().join(format!("node-agent-e2e-standalone-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "eviction:\n  evictionHard: {{memory.available: 900Mi}}\nagent:\n  listen: '127.0.0.1:{}'\n  \
             trace_socket: '{}'\n  node_cgroup: '{}'\n  memory_capacity: 1Gi\n  resync_interval: 60s\n",
            free_port(),
            dir.join("trace.sock").display(),
            node.cgroup_path()
        ),
    )?;
    let mut agent = Agent {
        process: AgentProcess::spawn(&[
            "run".as_ref(),
            "--trace".as_ref(),
            "json".as_ref(),
            "--config".as_ref(),
            config.as_os_str(),
        ])?,
        seen_log: Vec::new(),
    };
    agent.wait_log("node-agent running", scaled(Duration::from_secs(20)))?;

    let mut hog = Helper::spawn(MEM_HELPER, &["hold".into(), "150".into()])?;
    move_into(&big, hog.pid())?;
    hog.go()?;
    assert_eq!(hog.read_line()?, "held");

    let deadline = Instant::now() + scaled(Duration::from_secs(5));
    let mut decision = None;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let Ok(v) = agent.process.json.recv_timeout(left) else {
            break;
        };
        if v["kind"] == "eviction" {
            decision = Some(v);
            break;
        }
    }
    let decision = decision.expect("a dry-run eviction decision on stdout");
    assert_eq!(decision["result"], "dry_run", "standalone never acts");
    assert_eq!(
        decision["name"].as_str(),
        Some(format!("{}/big", node.cgroup_path()).as_str()),
        "the workload using the memory"
    );
    assert!(hog.go().is_ok() && big.exists(), "nothing was killed");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
