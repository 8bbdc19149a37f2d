//! The daemon's end-to-end harness: a fake cluster (kubelet and API server, the strict fake of
//! `node_agent_kube::fake`) whose pods and eviction answers a test sets, real pod cgroups in
//! the kubelet's layout below a test "node" cgroup, and the daemon as a subprocess whose logs,
//! live stream and `/metrics` the test waits on — never a fixed sleep.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use node_agent_kube::fake::{Fake, NodeStore, Reply, Seen};
use serde_json::{json, Value};

use crate::{AgentProcess, TestCgroup};

pub const NODE: &str = "test-node";

/// A pod of the fake kubelet's list, with one container.
#[derive(Debug, Clone)]
pub struct PodSpec {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub memory_request: String,
    pub container_id: String,
    pub priority: i32,
    /// `kubernetes.io/config.source`: `api`, or `file` for a static pod.
    pub source: &'static str,
}

impl PodSpec {
    pub fn new(
        namespace: &str,
        name: &str,
        uid: &str,
        memory_request: &str,
        id_char: char,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
            memory_request: memory_request.into(),
            container_id: id_char.to_string().repeat(64),
            priority: 0,
            source: "api",
        }
    }

    pub fn json(&self) -> Value {
        json!({
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid,
                         "labels": {"app": self.name},
                         "annotations": {"kubernetes.io/config.source": self.source}},
            "spec": {"nodeName": NODE, "priority": self.priority, "terminationGracePeriodSeconds": 30,
                     "containers": [{"name": "app", "image": "app:1",
                                     "resources": {"requests": {"memory": self.memory_request}}}]},
            "status": {"phase": "Running", "qosClass": "Burstable",
                       "containerStatuses": [{"name": "app", "containerID": format!("containerd://{}", self.container_id),
                                              "ready": true, "restartCount": 0, "image": "app:1", "imageID": ""}]}
        })
    }

    /// The pod's container cgroup (cgroupfs layout, Burstable) below `node`.
    pub fn cgroup(&self, node: &TestCgroup) -> anyhow::Result<PathBuf> {
        node.child(&format!(
            "kubepods/burstable/pod{}/{}",
            self.uid, self.container_id
        ))
    }

    pub fn eviction_path(&self) -> String {
        format!(
            "/api/v1/namespaces/{}/pods/{}/eviction",
            self.namespace, self.name
        )
    }
}

/// One request the fake answered, stamped with CLOCK_MONOTONIC on arrival.
#[derive(Debug, Clone)]
pub struct Answered {
    pub method: String,
    pub path: String,
    pub body: Value,
    pub at_ns: u64,
    pub status: u16,
}

type EvictReply = Arc<dyn Fn(&str) -> Reply + Send + Sync>;
/// A test's own answer to a request, before the fake cluster's (`None`: the usual answer).
pub type Hook = Arc<dyn Fn(&Seen) -> Option<Reply> + Send + Sync>;

/// What the fake cluster serves; tests change it while the daemon runs.
pub struct ClusterState {
    pub pods: Vec<Value>,
    pub pod_lists: usize,
    /// Eviction, delete and patch requests of pods, taint patches of the node, and events, in
    /// order.
    pub answered: Vec<Answered>,
    /// How an eviction of the named pod is answered; default 201.
    pub evict_reply: Option<EvictReply>,
    /// The node (its taints, read and patched with their resourceVersion).
    pub node: NodeStore,
    /// The kubelet's `/stats/summary` pods; none by default.
    pub summary_pods: Vec<Value>,
    /// The summary's `node.rlimit` (the kubelet's task figures); none by default.
    pub summary_rlimit: Option<Value>,
    /// Answers the test gives itself (a hostile kubelet or API server), first.
    pub hook: Option<Hook>,
    /// How long every event POST takes to be answered (a slow API server); none by default.
    pub event_delay: Duration,
}

impl Default for ClusterState {
    fn default() -> Self {
        Self {
            pods: Vec::new(),
            pod_lists: 0,
            answered: Vec::new(),
            evict_reply: None,
            summary_pods: Vec::new(),
            summary_rlimit: None,
            hook: None,
            event_delay: Duration::ZERO,
            node: NodeStore::new(json!({"kind": "Node", "apiVersion": "v1",
                "metadata": {"name": NODE, "resourceVersion": "1"},
                "spec": {"taints": [{"key": "dedicated", "value": "e2e", "effect": "NoSchedule"}]},
                "status": {"conditions": []}})),
        }
    }
}

pub type SharedCluster = Arc<Mutex<ClusterState>>;

impl ClusterState {
    pub fn evictions(&self) -> Vec<&Answered> {
        self.answered
            .iter()
            .filter(|a| a.path.ends_with("/eviction"))
            .collect()
    }
}

pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The fake's responder over `state`.
pub fn responder(state: SharedCluster) -> impl Fn(&Seen, usize) -> Reply + Send + Sync + 'static {
    move |seen: &Seen, _| {
        let at_ns = monotonic_ns();
        let path = seen.path.split('?').next().unwrap_or("");
        // The API server's node proxy answers exactly what the kubelet would.
        let proxy = format!("/api/v1/nodes/{NODE}/proxy");
        let path = path.strip_prefix(proxy.as_str()).unwrap_or(path);
        let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(reply) = s.hook.clone().and_then(|hook| hook(seen)) {
            return reply;
        }
        let reply = match (seen.method.as_str(), path) {
            // The API server as pod source: the pods as a list, a watch that stays open.
            ("GET", "/api/v1/pods") if seen.path.contains("watch=true") => {
                return Reply::watch(Vec::new(), true)
            }
            ("GET", "/api/v1/pods") => {
                s.pod_lists += 1;
                return Reply::json(
                    200,
                    json!({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": s.pods})
                        .to_string(),
                );
            }
            ("GET", "/pods") => {
                s.pod_lists += 1;
                return Reply::json(
                    200,
                    json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": s.pods})
                        .to_string(),
                );
            }
            ("GET", "/stats/summary") => {
                let mut node = json!({"nodeName": NODE});
                if let Some(rlimit) = &s.summary_rlimit {
                    node["rlimit"] = rlimit.clone();
                }
                return Reply::json(
                    200,
                    json!({"node": node, "pods": s.summary_pods}).to_string(),
                );
            }
            ("GET", p) if p == format!("/api/v1/nodes/{NODE}") => {
                return s
                    .node
                    .answer(seen)
                    .expect("the node store answers for its node")
            }
            ("PATCH", p) if p == format!("/api/v1/nodes/{NODE}") => s
                .node
                .answer(seen)
                .expect("the node store answers for its node"),
            ("PATCH", p) if p == format!("/api/v1/nodes/{NODE}/status") => {
                return Reply::json(
                    200,
                    json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": NODE}})
                        .to_string(),
                )
            }
            ("POST", p) if p.ends_with("/eviction") => {
                let name = p.rsplit('/').nth(1).unwrap_or("").to_string();
                match &s.evict_reply {
                    Some(f) => f(&name),
                    None => Reply::json(201, json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}).to_string()),
                }
            }
            ("POST", p) if p.ends_with("/events") => Reply {
                delay: s.event_delay,
                ..Reply::json(201, seen.body.to_string())
            },
            // An event's series: only an event the fake took (as the API server has only
            // those).
            ("PATCH", p) if p.contains("/events/") => {
                let name = p.rsplit('/').next().unwrap_or("");
                let exists = s.answered.iter().any(|a| {
                    a.method == "POST"
                        && a.status == 201
                        && a.path.ends_with("/events")
                        && a.body["metadata"]["name"] == name
                });
                if exists {
                    Reply {
                        delay: s.event_delay,
                        ..Reply::json(200, "{}")
                    }
                } else {
                    Reply::status(
                        404,
                        "NotFound",
                        &format!("events.events.k8s.io \"{name}\" not found"),
                    )
                }
            }
            ("DELETE" | "PATCH", _) => Reply::json(200, "{}"),
            _ => Reply::status(404, "NotFound", "not served by the fake cluster"),
        };
        s.answered.push(Answered {
            method: seen.method.clone(),
            path: path.to_string(),
            body: seen.body.clone(),
            at_ns,
            status: reply.status,
        });
        reply
    }
}

pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The agent's config for a test: capacity 1Gi, `memory.available<threshold`, Kubernetes
/// mode against `fake`, plus the test's own lines for `kubernetes:` and the top level.
pub struct Config<'a> {
    pub fake: &'a Fake,
    pub node: &'a TestCgroup,
    pub socket: &'a Path,
    pub port: u16,
    pub threshold: &'a str,
    /// Extra `kubernetes:` lines, each indented by two spaces.
    pub kube: &'a str,
    /// Extra top-level lines (the agent's own settings), not indented.
    pub agent: &'a str,
}

impl Config<'_> {
    pub fn text(&self) -> String {
        format!(
            "apiVersion: node-agent.io/v1alpha1\nkind: NodeAgentConfiguration\n\
             eviction:\n  evictionHard: {{memory.available: {threshold}}}\n\
             kubernetes:\n  podSource: kubelet\n  nodeName: {NODE}\n  podRefreshInterval: 200ms\n  \
             kubelet: {{url: '{url}', caFile: '{ca}', clusterCA: false}}\n  \
             apiServer: {{url: '{url}', caFile: '{ca}'}}\n  tokenPath: '{token}'\n{kube}\
             listen: '127.0.0.1:{port}'\nmetricsAccess: loopback\ntraceSocket: '{socket}'\nnodeCgroup: '{cg}'\nmemoryCapacity: 1Gi\n\
             resyncInterval: 60s\nforkLimit: 0\n{agent}",
            threshold = self.threshold,
            url = self.fake.url(),
            ca = self.fake.pki.ca_file.display(),
            token = self.fake.token_file.display(),
            port = self.port,
            socket = self.socket.display(),
            cg = self.node.cgroup_path(),
            kube = self.kube,
            agent = self.agent,
        )
    }
}

/// Polls `done` until it holds, at most `limit`; an error naming `what` otherwise.
pub fn wait_until(
    limit: Duration,
    what: &str,
    mut done: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    while !done() {
        if Instant::now() > deadline {
            bail!("{what} did not happen within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// The daemon as a subprocess, with the log lines seen so far. Killed on drop.
pub struct Daemon {
    pub process: AgentProcess,
    pub port: u16,
    log: Vec<String>,
}

impl Daemon {
    pub fn start(config: &Path, port: u16) -> anyhow::Result<Daemon> {
        Self::start_in(config, port, None)
    }

    /// Starts it as a member of `cgroup` from its first instruction (its memory is charged
    /// there), or where the test runs.
    pub fn start_in(config: &Path, port: u16, cgroup: Option<&Path>) -> anyhow::Result<Daemon> {
        let process = AgentProcess::spawn_in(
            cgroup,
            &["run".as_ref(), "--config".as_ref(), config.as_os_str()],
        )?;
        Self::running(process, port)
    }

    /// Starts it as PID 1 of a PID namespace of its own, as in a pod without `hostPID`.
    pub fn start_in_pid_namespace(config: &Path, port: u16) -> anyhow::Result<Daemon> {
        let process = AgentProcess::spawn_in_pid_namespace(&[
            "run".as_ref(),
            "--config".as_ref(),
            config.as_os_str(),
        ])?;
        Self::running(process, port)
    }

    /// The daemon once it says it runs.
    fn running(process: AgentProcess, port: u16) -> anyhow::Result<Daemon> {
        let mut daemon = Daemon {
            process,
            port,
            log: Vec::new(),
        };
        if let Err(e) =
            daemon.wait_log("node-agent running", crate::scaled(Duration::from_secs(20)))
        {
            let status = daemon.process.child.try_wait()?;
            let tail = daemon
                .log
                .iter()
                .rev()
                .take(5)
                .rev()
                .cloned()
                .collect::<Vec<_>>();
            bail!("{e}; exit status {status:?}; last lines: {tail:#?}");
        }
        Ok(daemon)
    }

    fn drain(&mut self) {
        while let Ok(line) = self.process.log.try_recv() {
            self.log.push(line);
        }
    }

    /// Waits for a log line containing `needle` (seen before or arriving within `limit`).
    pub fn wait_log(&mut self, needle: &str, limit: Duration) -> anyhow::Result<String> {
        self.wait_logs(needle, 1, limit)
    }

    /// Waits until `n` log lines contain `needle`; returns the last.
    pub fn wait_logs(&mut self, needle: &str, n: usize, limit: Duration) -> anyhow::Result<String> {
        let deadline = Instant::now() + limit;
        loop {
            self.drain();
            let found: Vec<&String> = self.log.iter().filter(|l| l.contains(needle)).collect();
            if found.len() >= n {
                return Ok(found[n - 1].clone());
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                bail!("the agent did not log {needle:?} {n} time(s) within {limit:?}");
            };
            if let Ok(line) = self.process.log.recv_timeout(left) {
                self.log.push(line);
            }
        }
    }

    /// Every log line so far, in order.
    pub fn lines(&mut self) -> Vec<String> {
        self.drain();
        self.log.clone()
    }

    /// How many log lines so far contain `needle`.
    pub fn log_count(&mut self, needle: &str) -> usize {
        self.drain();
        self.log.iter().filter(|l| l.contains(needle)).count()
    }

    pub fn get(&self, path: &str) -> anyhow::Result<String> {
        http_get(self.port, path)
    }

    /// `GET path` with a bearer token.
    pub fn get_as(&self, path: &str, token: &str) -> anyhow::Result<String> {
        http_get_with(
            self.port,
            path,
            &format!("Authorization: Bearer {token}\r\n"),
        )
    }

    /// The value of the first `/metrics` sample line starting with `series` (name and labels).
    pub fn metric(&self, series: &str) -> anyhow::Result<Option<f64>> {
        let text = self.get("/metrics")?;
        Ok(text
            .lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok()))
    }

    /// Waits until the daemon has evaluated `n` more times (`node_agent_evaluations_total`).
    pub fn wait_evaluations(&self, n: f64, limit: Duration) -> anyhow::Result<()> {
        let total = |d: &Daemon| -> f64 {
            d.get("/metrics")
                .map(|t| {
                    t.lines()
                        .filter(|l| l.starts_with("node_agent_evaluations_total{"))
                        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                        .sum()
                })
                .unwrap_or(0.0)
        };
        let start = total(self);
        wait_until(limit, "further evaluations", || total(self) >= start + n)
    }

    /// Stops it with SIGTERM and waits (at most 2 s) for exit 0.
    pub fn stop(mut self) -> anyhow::Result<()> {
        self.process.signal(libc::SIGTERM);
        let started = Instant::now();
        loop {
            if let Some(status) = self.process.child.try_wait()? {
                anyhow::ensure!(status.success(), "exit 0 on SIGTERM: {status}");
                return Ok(());
            }
            // The 2 s promise is a figure of hardware. Under emulation (the VM tests) detaching
            // the programs takes as long as attaching them, 15 s and more at 1 vCPU: there the
            // bound only catches a hang.
            let bound = match crate::time_scale() {
                1 => Duration::from_secs(2),
                _ => crate::scaled(Duration::from_secs(6)),
            };
            if started.elapsed() > bound {
                bail!("the agent did not exit within {bound:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

pub fn http_get(port: u16, path: &str) -> anyhow::Result<String> {
    http_get_with(port, path, "")
}

/// `GET path` with extra header lines (each ending in CRLF).
pub fn http_get_with(port: u16, path: &str, headers: &str) -> anyhow::Result<String> {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))
        .context("connecting to the agent's listener")?;
    s.set_read_timeout(Some(crate::scaled(Duration::from_secs(5))))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\n{headers}Connection: close\r\n\r\n"
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// `node-agent trace --output json` attached to the daemon's socket, with extra arguments;
/// ready once it logged that it attached.
pub fn attach_trace(socket: &Path, extra: &[&str]) -> anyhow::Result<AgentProcess> {
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "trace".as_ref(),
        "--output".as_ref(),
        "json".as_ref(),
        "--socket".as_ref(),
        socket.as_os_str(),
    ];
    args.extend(extra.iter().map(|a| std::ffi::OsStr::new(*a)));
    let trace = AgentProcess::spawn(&args)?;
    let deadline = Instant::now() + crate::scaled(Duration::from_secs(10));
    loop {
        let left = deadline
            .checked_duration_since(Instant::now())
            .context("trace did not attach within 10 s")?;
        if trace
            .log
            .recv_timeout(left)
            .is_ok_and(|l| l.contains("attached to the running node-agent"))
        {
            return Ok(trace);
        }
    }
}

/// The kernel time (`ktime_ns`) of the first upward memory line crossing a trace client
/// reports, within `limit`. When none comes, the error lists what the trace did say: a
/// `stream_lost` among it means the client fell behind and the crossing may be in the gap.
pub fn first_crossing_up(trace: &AgentProcess, limit: Duration) -> anyhow::Result<u64> {
    let deadline = Instant::now() + limit;
    let mut seen = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let Ok(v) = trace.json.recv_timeout(left) else {
            break;
        };
        if v["kind"] == "memory_threshold" && v["direction"] == "up" {
            return v["ktime_ns"]
                .as_u64()
                .with_context(|| format!("a crossing without its time: {v}"));
        }
        seen.push(v.to_string());
    }
    bail!(
        "no upward memory line crossing within {limit:?}; the trace said: {}",
        if seen.is_empty() {
            "nothing".to_string()
        } else {
            seen.join("; ")
        }
    )
}

/// The next JSON record of `kind` from a trace client (others skipped), within `limit`.
pub fn next_record(trace: &AgentProcess, kind: &str, limit: Duration) -> anyhow::Result<Value> {
    let deadline = Instant::now() + limit;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let Ok(v) = trace.json.recv_timeout(left) else {
            break;
        };
        if v["kind"] == kind {
            return Ok(v);
        }
    }
    bail!("no {kind} record within {limit:?}")
}
