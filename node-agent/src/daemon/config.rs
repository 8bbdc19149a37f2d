//! The agent's one config file: the kubelet's eviction fields, the Kubernetes section and the
//! agent's own settings, validated completely before anything is loaded.
//!
//! ```yaml
//! eviction: {evictionHard: {memory.available: 500Mi}}   # KubeletConfiguration fields
//! kubernetes: {pod_source: kubelet}                     # absent: standalone mode
//! cri: {endpoint: "unix:///run/containerd/containerd.sock"}  # node-level reclaim (Kubernetes mode)
//! agent: {dry_run: false, listen: "0.0.0.0:9464"}       # below, every field with its default
//! ```

pub mod checks;

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use node_agent_cri::CriConfig;
use node_agent_executor::reclaim::Runtime;
use node_agent_kube::config::KubeConfig;
use node_agent_policy::EvictionConfig;
use serde::Deserialize;
use serde_yaml_ng::Value;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading config file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config is not YAML")]
    Yaml(#[source] serde_yaml_ng::Error),
    #[error("config file is empty: give at least one of eviction, kubernetes or agent (without a file, the agent runs standalone with the kubelet's defaults)")]
    Empty,
    #[error("config: unknown top-level key {0:?}; expected eviction, kubernetes, cri or agent")]
    UnknownSection(String),
    #[error("config: eviction")]
    Eviction(#[source] node_agent_policy::ConfigError),
    #[error("config: kubernetes")]
    Kubernetes(#[source] node_agent_kube::config::ConfigError),
    #[error("config: agent")]
    Agent(#[source] serde_yaml_ng::Error),
    #[error("config: cri")]
    CriYaml(#[source] serde_yaml_ng::Error),
    #[error("config")]
    Cri(#[source] node_agent_cri::CriConfigError),
    #[error("config: agent.{field}: {problem}")]
    AgentField {
        field: &'static str,
        problem: String,
    },
}

/// The agent's own settings (`agent:`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentSettings {
    /// Decide and report everything, change nothing in the cluster.
    pub dry_run: bool,
    /// `/metrics`, `/healthz`, `/readyz`.
    pub listen: String,
    /// Unix socket where the daemon publishes its event stream for `node-agent trace`.
    pub trace_socket: PathBuf,
    /// The cgroup (in the memory hierarchy) whose usage is the node's: `/` for the whole
    /// machine; another path scopes the agent to a subtree (nested nodes, tests).
    pub node_cgroup: String,
    /// Node memory capacity (a quantity); default: MemTotal from /proc/meminfo.
    pub memory_capacity: Option<String>,
    /// The node's allocatable memory (a quantity: the Node's `status.allocatable.memory`).
    /// `allocatableMemory.available` = allocatable − the working set of the kubepods cgroup
    /// below `node_cgroup` is observed, as the kubelet does with `enforceNodeAllocatable: pods`,
    /// against this when set (it wins), else in Kubernetes mode against the Node's own field,
    /// read every `resync_interval`; standalone without it, not observed.
    pub allocatable_memory: Option<String>,
    /// Filesystem of `nodefs.*` (the kubelet's root dir). Unset: `/var/lib/kubelet`, or `/`
    /// when that does not exist; set, it must exist.
    pub nodefs_path: Option<PathBuf>,
    /// Filesystem of `imagefs.*` when the runtime keeps images on a dedicated one.
    pub imagefs_path: Option<PathBuf>,
    /// The kubelet's own config file, read at start and on reload to warn when the kubelet
    /// would evict before the agent; `null` skips the comparison. An absolute path.
    pub kubelet_config: Option<PathBuf>,
    /// Slow re-evaluation that only guards against drift and missed events (Go duration).
    pub resync_interval: String,
    /// Re-evaluation while a memory trigger is armed or a threshold is met.
    pub pressure_poll_interval: String,
    /// How often the pod list and stats are refreshed from Kubernetes.
    pub pod_refresh_interval: String,
    /// Fork-storm limit per workload cgroup: more than this many forks per `fork_window`.
    pub fork_limit: u64,
    pub fork_window: String,
    /// Kernel ring buffer size in bytes (a power of two).
    pub ring_bytes: u32,
}

impl Default for AgentSettings {
    fn default() -> Self {
        Self {
            dry_run: false,
            listen: "0.0.0.0:9464".into(),
            trace_socket: PathBuf::from("/run/node-agent/trace.sock"),
            node_cgroup: "/".into(),
            memory_capacity: None,
            allocatable_memory: None,
            nodefs_path: None,
            imagefs_path: None,
            kubelet_config: Some(PathBuf::from(DEFAULT_KUBELET_CONFIG)),
            resync_interval: "10s".into(),
            pressure_poll_interval: "100ms".into(),
            pod_refresh_interval: "2s".into(),
            fork_limit: 1000,
            fork_window: "1s".into(),
            ring_bytes: node_agent_common::DEFAULT_RING_BYTES,
        }
    }
}

/// Validated settings with parsed values.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub dry_run: bool,
    pub listen: SocketAddr,
    pub trace_socket: PathBuf,
    pub node_cgroup: PathBuf,
    pub memory_capacity: Option<i64>,
    pub allocatable_memory: Option<i64>,
    pub nodefs_path: PathBuf,
    pub imagefs_path: Option<PathBuf>,
    pub kubelet_config: Option<PathBuf>,
    pub resync_interval: Duration,
    pub pressure_poll_interval: Duration,
    pub pod_refresh_interval: Duration,
    pub fork_limit: u64,
    pub fork_window: Duration,
    pub ring_bytes: u32,
}

/// Everything the daemon runs on.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub eviction: EvictionConfig,
    /// `None`: standalone mode (no cluster; decisions are reported, never carried out).
    pub kubernetes: Option<KubeConfig>,
    /// The container runtime node-level reclaim goes through: `cri:`, or its defaults in
    /// Kubernetes mode; `None` in standalone mode (no pod list to judge dead containers by).
    pub runtime: Option<Runtime>,
    /// `cri:` was given in standalone mode, where it is not used (logged at start).
    pub cri_unused: bool,
    pub settings: Settings,
}

/// Command-line and environment overrides, applied after the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub dry_run: bool,
    pub listen: Option<String>,
    pub trace_socket: Option<PathBuf>,
    pub node_name: Option<String>,
    /// The agent's own pod, `(namespace, name)`, from the downward API (`POD_NAMESPACE`,
    /// `POD_NAME`): never evicted.
    pub own_pod: Option<(String, String)>,
}

impl AgentConfig {
    pub fn load(path: &std::path::Path, overrides: &Overrides) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, overrides)
    }

    /// Standalone mode without a file: the kubelet's default thresholds, the agent's defaults.
    pub fn standalone(overrides: &Overrides) -> Result<Self, ConfigError> {
        Self::from_value(&Value::Mapping(Default::default()), "", overrides)
    }

    /// Parses and validates the whole file; nothing partial is ever returned. A file with
    /// nothing in it is refused: an empty ConfigMap must not silently mean "defaults".
    pub fn parse(text: &str, overrides: &Overrides) -> Result<Self, ConfigError> {
        let whole: Value = serde_yaml_ng::from_str(text).map_err(ConfigError::Yaml)?;
        if whole.is_null() {
            return Err(ConfigError::Empty);
        }
        Self::from_value(&whole, text, overrides)
    }

    fn from_value(whole: &Value, text: &str, overrides: &Overrides) -> Result<Self, ConfigError> {
        let Some(map) = whole.as_mapping() else {
            return Err(ConfigError::UnknownSection(
                "(the file is not a mapping)".into(),
            ));
        };
        for key in map.keys() {
            let key = key.as_str().unwrap_or("(not a string)");
            if !matches!(key, "eviction" | "kubernetes" | "cri" | "agent") {
                return Err(ConfigError::UnknownSection(key.into()));
            }
        }
        let eviction = EvictionConfig::from_yaml_value(
            whole.get("eviction").unwrap_or(&Value::Null),
            "eviction.",
        )
        .map_err(ConfigError::Eviction)?;
        let kubernetes = match whole.get("kubernetes") {
            None => None,
            Some(_) => {
                let mut kube = KubeConfig::from_agent_yaml(text, overrides.node_name.as_deref())
                    .map_err(ConfigError::Kubernetes)?;
                kube.dry_run |= overrides.dry_run;
                Some(kube)
            }
        };
        let agent: AgentSettings = match whole.get("agent") {
            None => AgentSettings::default(),
            Some(v) => serde_yaml_ng::from_value(v.clone()).map_err(ConfigError::Agent)?,
        };
        let settings = validate(agent, overrides)?;
        let cri: CriConfig = match whole.get("cri") {
            None | Some(Value::Null) => CriConfig::default(),
            Some(v) => serde_yaml_ng::from_value(v.clone()).map_err(ConfigError::CriYaml)?,
        };
        let runtime = Runtime {
            settings: cri.validate().map_err(ConfigError::Cri)?,
            gc: cri.gc_policy().map_err(ConfigError::Cri)?,
        };
        Ok(Self {
            eviction,
            cri_unused: kubernetes.is_none() && whole.get("cri").is_some(),
            runtime: kubernetes.is_some().then_some(runtime),
            kubernetes,
            settings,
        })
    }

    /// True when nothing may be changed in the cluster.
    pub fn dry_run(&self) -> bool {
        self.settings.dry_run || self.kubernetes.as_ref().is_none_or(|k| k.dry_run)
    }

    /// Pacing of evictions: `(per minute, burst)`; standalone reports at the kubelet's pace.
    pub fn pacing(&self) -> (u32, u32) {
        self.kubernetes
            .as_ref()
            .map_or((6, 1), |k| (k.evictions_per_minute, k.eviction_burst))
    }
}

fn duration(field: &'static str, text: &str) -> Result<Duration, ConfigError> {
    let ns = node_agent_policy::parse_go_duration(text).map_err(|e| ConfigError::AgentField {
        field,
        problem: format!("{text:?}: {e}"),
    })?;
    match u64::try_from(ns) {
        Ok(ns) if ns > 0 => Ok(Duration::from_nanos(ns)),
        _ => Err(ConfigError::AgentField {
            field,
            problem: format!("{text:?} must be positive"),
        }),
    }
}

/// The kubelet's root directory, the default `nodefs_path`.
pub const DEFAULT_NODEFS: &str = "/var/lib/kubelet";
/// Where kubeadm and most installers put the kubelet's config file, the default
/// `kubelet_config`.
pub const DEFAULT_KUBELET_CONFIG: &str = "/var/lib/kubelet/config.yaml";

/// A filesystem path the agent will statvfs: it must be a directory that exists now.
fn existing_dir(field: &'static str, path: PathBuf) -> Result<PathBuf, ConfigError> {
    if !path.is_absolute() || !path.is_dir() {
        return Err(ConfigError::AgentField {
            field,
            problem: format!(
                "{} is not an existing directory (an absolute path)",
                path.display()
            ),
        });
    }
    Ok(path)
}

fn validate(a: AgentSettings, o: &Overrides) -> Result<Settings, ConfigError> {
    let listen_text = o.listen.clone().unwrap_or(a.listen);
    let listen = listen_text.parse().map_err(|e| ConfigError::AgentField {
        field: "listen",
        problem: format!("{listen_text:?} is not an address such as 0.0.0.0:9464 ({e})"),
    })?;
    let memory_capacity = a
        .memory_capacity
        .as_deref()
        .map(checks::memory_capacity)
        .transpose()?;
    let allocatable_memory = a
        .allocatable_memory
        .as_deref()
        .map(|text| checks::memory_bytes("allocatable_memory", text))
        .transpose()?;
    if let (Some(capacity), Some(allocatable)) = (memory_capacity, allocatable_memory) {
        if allocatable > capacity {
            return Err(ConfigError::AgentField {
                field: "allocatable_memory",
                problem: format!(
                    "{allocatable} bytes is more than memory_capacity ({capacity} bytes): allocatable is capacity minus what is reserved"
                ),
            });
        }
    }
    if !a.node_cgroup.starts_with('/') || a.node_cgroup.split('/').any(|c| c == "..") {
        return Err(ConfigError::AgentField {
            field: "node_cgroup",
            problem: format!(
                "{:?} must be an absolute cgroup path without `..`",
                a.node_cgroup
            ),
        });
    }
    let nodefs_path = match a.nodefs_path {
        Some(path) => existing_dir("nodefs_path", path)?,
        None => Some(PathBuf::from(DEFAULT_NODEFS))
            .filter(|p| p.is_dir())
            .unwrap_or_else(|| PathBuf::from("/")),
    };
    let imagefs_path = a
        .imagefs_path
        .map(|p| existing_dir("imagefs_path", p))
        .transpose()?;
    checks::ring_bytes(a.ring_bytes)?;
    // May be absent (a node without a kubelet, or one configured by flags): only said at start.
    if let Some(p) = a.kubelet_config.as_ref().filter(|p| !p.is_absolute()) {
        return Err(ConfigError::AgentField {
            field: "kubelet_config",
            problem: format!("{} is not an absolute path (or null to skip)", p.display()),
        });
    }
    Ok(Settings {
        dry_run: a.dry_run || o.dry_run,
        listen,
        trace_socket: o.trace_socket.clone().unwrap_or(a.trace_socket),
        node_cgroup: PathBuf::from(a.node_cgroup),
        memory_capacity,
        allocatable_memory,
        nodefs_path,
        imagefs_path,
        kubelet_config: a.kubelet_config,
        resync_interval: duration("resync_interval", &a.resync_interval)?,
        pressure_poll_interval: duration("pressure_poll_interval", &a.pressure_poll_interval)?,
        pod_refresh_interval: duration("pod_refresh_interval", &a.pod_refresh_interval)?,
        fork_limit: a.fork_limit,
        fork_window: duration("fork_window", &a.fork_window)?,
        ring_bytes: a.ring_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_whole_file_or_names_what_is_wrong() {
        let none = Overrides::default();
        let ok = AgentConfig::parse(
            "eviction: {evictionHard: {memory.available: 500Mi}}\nagent: {listen: '127.0.0.1:9999', resync_interval: 30s}\n",
            &none,
        )
        .unwrap();
        assert!(ok.kubernetes.is_none(), "no kubernetes section: standalone");
        assert!(ok.dry_run(), "standalone never acts");
        assert_eq!(ok.settings.listen.port(), 9999);
        assert_eq!(ok.settings.resync_interval, Duration::from_secs(30));
        let signals = |c: &AgentConfig| {
            let mut v: Vec<_> = c
                .eviction
                .thresholds()
                .iter()
                .map(|t| t.signal.as_str())
                .collect();
            v.sort_unstable();
            v
        };
        // The kubelet copies hard memory.available onto allocatableMemory.available.
        assert_eq!(
            signals(&ok),
            ["allocatableMemory.available", "memory.available"]
        );
        let defaults = AgentConfig::standalone(&none).unwrap();
        let want = [
            "imagefs.available",
            "memory.available",
            "nodefs.available",
            "nodefs.inodesFree",
        ];
        assert!(
            want.iter().all(|s| signals(&defaults).contains(s)),
            "the kubelet's default hard thresholds: {:?}",
            signals(&defaults)
        );

        let cases: &[(&str, &str)] = &[
            ("surprise: 1", "unknown top-level key \"surprise\""),
            (
                "eviction: {evictionHard: {memory.available: '<500Mi'}}",
                "eviction",
            ),
            ("agent: {listen: nowhere}", "agent.listen"),
            ("agent: {resync_interval: soon}", "agent.resync_interval"),
            ("agent: {pressure_poll_interval: 0s}", "must be positive"),
            ("agent: {memory_capacity: lots}", "agent.memory_capacity"),
            (
                "agent: {allocatable_memory: 1m}",
                "agent.allocatable_memory",
            ),
            (
                "agent: {memory_capacity: 1Gi, allocatable_memory: 2Gi}",
                "agent.allocatable_memory: 2147483648 bytes is more than memory_capacity",
            ),
            ("agent: {node_cgroup: relative}", "agent.node_cgroup"),
            ("agent: {ring_bytes: 1000}", "agent.ring_bytes"),
            ("agent: {no_such_field: 1}", "no_such_field"),
            ("kubernetes: {pod_source: carrier-pigeon}", "kubernetes"),
            (": : :", "not YAML"),
            ("", "config file is empty"),
            ("# only a comment\n", "config file is empty"),
            (
                "agent: {imagefs_path: /nonexistent/images}",
                "agent.imagefs_path",
            ),
            (
                "agent: {nodefs_path: /nonexistent/kubelet}",
                "agent.nodefs_path",
            ),
            ("agent: {nodefs_path: relative/dir}", "agent.nodefs_path"),
            (
                "agent: {kubelet_config: config.yaml}",
                "agent.kubelet_config",
            ),
            ("cri: {endpoint: 'tcp://127.0.0.1:1'}", "cri.endpoint"),
            ("cri: {timeout: 0s}", "cri.timeout"),
            (
                "cri: {image_minimum_gc_age: -1m}",
                "cri.image_minimum_gc_age",
            ),
            ("cri: {sandbox: x}", "config: cri: unknown field `sandbox`"),
        ];
        for (text, needle) in cases {
            let err = AgentConfig::parse(text, &none).unwrap_err();
            let chain = std::iter::successors(Some(&err as &dyn std::error::Error), |e| e.source())
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(": ");
            assert!(chain.contains(needle), "{text}: {chain}");
        }
    }

    #[test]
    fn node_level_reclaim_uses_the_runtime_in_kubernetes_mode_only() {
        let o = Overrides {
            node_name: Some("worker-1".into()),
            ..Default::default()
        };
        let kube = AgentConfig::parse("kubernetes: {}\n", &o).unwrap();
        let runtime = kube.runtime.expect("Kubernetes mode reclaims by default");
        assert_eq!(
            runtime.settings.endpoint.to_string(),
            "unix:///run/containerd/containerd.sock"
        );
        assert_eq!(runtime.gc.images.min_age, Duration::from_secs(120));
        assert!(!kube.cri_unused);
        let set = AgentConfig::parse(
            "kubernetes: {}\ncri: {endpoint: 'unix:///run/crio/crio.sock', image_minimum_gc_age: 0s, keep_images: []}\n",
            &o,
        )
        .unwrap();
        let runtime = set.runtime.unwrap();
        assert_eq!(
            runtime.settings.endpoint.to_string(),
            "unix:///run/crio/crio.sock"
        );
        assert_eq!(runtime.gc.images.min_age, Duration::ZERO);
        assert!(runtime.gc.images.keep.is_empty());
        let standalone = AgentConfig::parse("cri: {}\n", &o).unwrap();
        assert!(standalone.runtime.is_none(), "no pod list: no reclaim");
        assert!(standalone.cri_unused, "said at start");
        assert!(!AgentConfig::standalone(&o).unwrap().cri_unused);
    }

    #[test]
    fn the_shipped_configmap_is_a_valid_agent_config() {
        let manifest = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../deploy/configmap.yaml"
        ))
        .unwrap();
        let cm: Value = serde_yaml_ng::from_str(&manifest).unwrap();
        let text = cm["data"]["config.yaml"]
            .as_str()
            .expect("data.config.yaml");
        // The paths are the DaemonSet's host mounts (node-agent-kube/tests/deploy.rs checks
        // that); this machine runs no kubelet, so existing directories stand in for them.
        let stand_in = tempfile::tempdir().unwrap();
        let dir = stand_in.path().display().to_string();
        let text = text
            .replace(
                "nodefs_path: /var/lib/kubelet",
                &format!("nodefs_path: {dir}"),
            )
            .replace(
                "imagefs_path: /var/lib/containerd",
                &format!("imagefs_path: {dir}"),
            );
        assert_eq!(
            text.matches(dir.as_str()).count(),
            2,
            "both paths set: {text}"
        );
        let text = text.as_str();
        let o = Overrides {
            node_name: Some("worker-1".into()),
            ..Default::default()
        };
        let c = AgentConfig::parse(text, &o).unwrap_or_else(|e| panic!("{e:?}"));
        let kube = c
            .kubernetes
            .as_ref()
            .expect("the DaemonSet talks to the cluster");
        assert_eq!(kube.node_name, "worker-1");
        assert!(!c.dry_run(), "the shipped config acts");
        assert!(kube.taint, "the pressure taint is on");
        assert_eq!(
            c.runtime.as_ref().map(|r| r.settings.endpoint.to_string()),
            Some(node_agent_cri::config::DEFAULT_ENDPOINT.to_string()),
            "node-level reclaim through containerd's socket (the DaemonSet mounts its directory)"
        );
        assert_eq!(
            c.settings.kubelet_config.as_deref(),
            Some(std::path::Path::new(DEFAULT_KUBELET_CONFIG))
        );
        assert!(c
            .eviction
            .thresholds()
            .iter()
            .any(|t| t.signal == node_agent_policy::Signal::PidAvailable));
    }

    #[test]
    fn flags_override_the_file() {
        let o = Overrides {
            dry_run: true,
            listen: Some("127.0.0.1:1".into()),
            ..Default::default()
        };
        let c = AgentConfig::parse("agent: {dry_run: false}", &o).unwrap();
        assert!(c.settings.dry_run);
        assert_eq!(c.settings.listen.port(), 1);
    }
}
