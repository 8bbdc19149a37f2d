//! `node-agent run` in Kubernetes mode for the bench: the in-process strict fake of the kubelet
//! and the API server ([`node_agent_kube::fake`]), pods whose cgroups are real (the kubelet's
//! cgroupfs layout below a bench "node" cgroup), and the daemon started with a config file.
//!
//! The bench's config texts for the daemon are written here and nowhere else:
//! [`DaemonConfig::text`] for every section that runs it in Kubernetes mode (the end-to-end
//! latency, the footprint), [`standalone_config_text`] for those that run it standalone
//! (stress-ng, the idle cost).

use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{mpsc, Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use node_agent_kube::fake::{Fake, Reply, Seen};
use serde_json::{json, Value};

use super::{cgroups::remove_tree, mono_ns, Rng};

pub const NODE: &str = "bench-node";
pub const NAMESPACE: &str = "bench";
const MIB: u64 = 1 << 20;

/// A pod of the fake kubelet's list with its cgroups (`pod<uid>/<container id>`); the pod's
/// cgroup, and everything running in it, goes on drop.
pub struct Pod {
    pub name: String,
    pub uid: String,
    pub container: String,
    pub request: u64,
    pub priority: i32,
    pub pod_dir: PathBuf,
    pub container_dir: PathBuf,
}

impl Pod {
    pub fn create(
        qos: &Path,
        name: &str,
        request_mib: u64,
        priority: i32,
        rng: &mut Rng,
    ) -> anyhow::Result<Self> {
        let uid = rng.uuid();
        let container = rng.hex(64);
        let pod_dir = qos.join(format!("pod{uid}"));
        let container_dir = pod_dir.join(&container);
        std::fs::create_dir_all(&container_dir)
            .with_context(|| format!("creating {}", container_dir.display()))?;
        Ok(Self {
            name: name.into(),
            uid,
            container,
            request: request_mib * MIB,
            priority,
            pod_dir,
            container_dir,
        })
    }

    pub fn json(&self) -> Value {
        json!({
            "metadata": {"name": self.name, "namespace": NAMESPACE, "uid": self.uid,
                         "annotations": {"kubernetes.io/config.source": "api"}},
            "spec": {"nodeName": NODE, "priority": self.priority, "terminationGracePeriodSeconds": 30,
                     "containers": [{"name": "app", "image": "app:1",
                                     "resources": {"requests": {"memory": format!("{}Mi", self.request / MIB)}}}]},
            "status": {"phase": "Running", "qosClass": "Burstable",
                       "containerStatuses": [{"name": "app", "containerID": format!("containerd://{}", self.container),
                                              "ready": true, "restartCount": 0, "image": "app:1", "imageID": ""}]}
        })
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        if let Err(e) = remove_tree(&self.pod_dir) {
            eprintln!("bench: could not remove {}: {e:#}", self.pod_dir.display());
        }
    }
}

/// What the fake kubelet lists and how often it was asked.
pub struct Cluster {
    pub pods: Vec<Value>,
    pub pod_lists: u64,
}

/// The fake's answers over `cluster`; eviction requests go to `evictions` with the
/// `CLOCK_MONOTONIC` at which the fake had read them whole.
pub fn responder(
    cluster: Arc<Mutex<Cluster>>,
    evictions: Mutex<mpsc::Sender<(String, u64)>>,
) -> impl Fn(&Seen, usize) -> Reply + Send + Sync + 'static {
    move |seen: &Seen, _| {
        // Stamped first: the fake has just read the whole request.
        let arrived = mono_ns();
        let path = seen.path.split('?').next().unwrap_or("");
        match (seen.method.as_str(), path) {
            ("GET", "/pods") => {
                let mut c = cluster.lock().unwrap_or_else(|e| e.into_inner());
                c.pod_lists += 1;
                Reply::json(
                    200,
                    json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": c.pods})
                        .to_string(),
                )
            }
            ("GET", "/stats/summary") => Reply::json(
                200,
                json!({"node": {"nodeName": NODE}, "pods": []}).to_string(),
            ),
            ("POST", p) if p.ends_with("/eviction") => {
                let tx = evictions.lock().unwrap_or_else(|e| e.into_inner());
                let _ = tx.send((p.to_string(), arrived));
                Reply::json(
                    201,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}).to_string(),
                )
            }
            ("POST", p) if p.contains("/events") => Reply::json(201, seen.body.to_string()),
            ("GET", p) if p == format!("/api/v1/nodes/{NODE}") => Reply::json(
                200,
                json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": NODE},
                       "status": {"conditions": []}})
                .to_string(),
            ),
            ("PATCH", _) => Reply::json(
                200,
                json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": NODE}}).to_string(),
            ),
            _ => Reply::status(404, "NotFound", "not served by the bench's fake"),
        }
    }
}

/// The daemon's config for a bench section. Fields left `None` keep the agent's defaults.
pub struct DaemonConfig<'a> {
    pub fake: &'a Fake,
    /// The node cgroup, named from the memory hierarchy's root (`/name`).
    pub node_cgroup: String,
    pub socket: &'a Path,
    pub port: u16,
    /// `evictionHard: {memory.available: ...}`.
    pub memory_available: &'a str,
    /// `memoryCapacity` (default: the node's MemTotal).
    pub memory_capacity: Option<&'a str>,
    /// `kubernetes.podRefreshInterval`.
    pub pod_refresh_interval: Option<&'a str>,
    /// `resyncInterval`.
    pub resync_interval: Option<&'a str>,
    /// Evictions paced for a bench that evicts every round rather than as deployed.
    pub fast_evictions: bool,
}

impl DaemonConfig<'_> {
    /// The one config text of the bench's Kubernetes-mode daemons.
    pub fn text(&self) -> String {
        let mut kube = String::new();
        if let Some(v) = self.pod_refresh_interval {
            kube.push_str(&format!("  podRefreshInterval: {v}\n"));
        }
        if self.fast_evictions {
            kube.push_str(
                "  evictionsPerMinute: 600\n  evictionBurst: 10\n  evictionWaitTimeout: 10s\n",
            );
        }
        let mut top = format!(
            "listen: '127.0.0.1:{port}'\nmetricsAccess: loopback\ntraceSocket: '{socket}'\nnodeCgroup: '{node}'\nforkLimit: 0\n",
            port = self.port,
            socket = self.socket.display(),
            node = self.node_cgroup,
        );
        for (key, value) in [
            ("memoryCapacity", self.memory_capacity),
            ("resyncInterval", self.resync_interval),
        ] {
            if let Some(v) = value {
                top.push_str(&format!("{key}: {v}\n"));
            }
        }
        format!(
            "{HEADER}eviction:\n  evictionHard: {{memory.available: {available}}}\n\
             kubernetes:\n  podSource: kubelet\n  nodeName: {NODE}\n  kubelet: {{url: '{url}', caFile: '{ca}'}}\n  \
             apiServer: {{url: '{url}', caFile: '{ca}'}}\n  tokenPath: '{token}'\n{kube}{top}",
            available = self.memory_available,
            url = self.fake.url(),
            ca = self.fake.pki.ca_file.display(),
            token = self.fake.token_file.display(),
        )
    }
}

/// The config file's version header (`NodeAgentConfiguration`, README "The config file").
const HEADER: &str = "apiVersion: node-agent.io/v1alpha1\nkind: NodeAgentConfiguration\n";

/// The standalone daemon's config: the kubelet's default memory threshold and nothing else.
/// The kubelet's disk thresholds are left out on purpose: the shared development host's disk
/// is often past `nodefs.available<10%`, which keeps a daemon with the defaults re-reading the
/// node every 100 ms as under pressure, and these rows measure it idle, lines far.
pub fn standalone_config_text(port: u16, socket: &Path) -> String {
    format!(
        "{HEADER}eviction:\n  evictionHard: {{memory.available: 100Mi}}\n\
         listen: '127.0.0.1:{port}'\ntraceSocket: '{}'\n",
        socket.display()
    )
}

/// `node-agent run --config FILE`; stopped (SIGTERM, then SIGKILL after 2 s) on drop.
pub struct Daemon {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl Daemon {
    pub fn start(agent: &Path, config: &Path) -> anyhow::Result<Self> {
        let mut child = Command::new(agent)
            .args(["run", "--config"])
            .arg(config)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", agent.display()))?;
        let stderr = child.stderr.take().context("agent stderr")?;
        let mut daemon = Self {
            child,
            log: Arc::new(Mutex::new(Vec::new())),
        };
        let (tx, rx) = mpsc::channel();
        let log = daemon.log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("node-agent running") {
                    let _ = tx.send(());
                }
                if line.contains("WARN") || line.contains("ERROR") {
                    eprintln!("agent: {line}");
                }
                let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
                if log.len() >= 200 {
                    log.remove(0);
                }
                log.push(line);
            }
        });
        if rx.recv_timeout(Duration::from_secs(30)).is_err() {
            let why = match daemon.child.try_wait() {
                Ok(Some(status)) => format!("exited ({status})"),
                _ => "did not log `node-agent running` within 30 s".into(),
            };
            bail!(
                "the daemon {} {why}; its last lines:\n{}",
                agent.display(),
                daemon.tail(10)
            );
        }
        Ok(daemon)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn tail(&self, n: usize) -> String {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log[log.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: signals the daemon this guard started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Removes a bench section's work directory (config, socket) on drop.
pub struct WorkDir(pub PathBuf);

impl WorkDir {
    pub fn create(path: PathBuf) -> anyhow::Result<Self> {
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self(path))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The node cgroup as the agent's config names it: `/name` from the memory hierarchy's root.
pub fn node_cgroup_name(dir: &Path) -> String {
    format!(
        "/{}",
        dir.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    )
}
