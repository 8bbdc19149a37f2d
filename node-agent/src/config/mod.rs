//! The agent's one config file, a versioned [`NodeAgentConfiguration`] (see [`file`]), and
//! what the daemon runs on, [`AgentConfig`]: read once, validated completely before anything
//! is loaded. `node-agent run`, every reload and `node-agent check-config` go through the same
//! [`AgentConfig::load`]. What refuses settings that parse but cannot be meant, on the values
//! alone or against the node itself, is in [`plausible`]; the `check-config` command that
//! reports all of it is [`crate::check_config`]. [`reload`] watches the file off the loop and takes a
//! new one whole or refuses it whole; [`kubelet`] reads the kubelet's own config file beside
//! it (its thresholds, its cgroup root).

pub mod file;
pub mod kubelet;
pub mod legacy;
pub mod plausible;
pub mod reload;

/// Where the config is read from when `--config` is not given.
pub const DEFAULT_CONFIG: &str = "/etc/node-agent/config.yaml";

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use node_agent_executor::reclaim::Runtime;
use node_agent_kube::config::KubeConfig;
use node_agent_policy::EvictionConfig;

pub use self::file::{
    NodeAgentConfiguration, API_VERSION, DEFAULT_KUBELET_CONFIG, DEFAULT_NODEFS, KIND,
};
use self::legacy::OldKey;
/// Who may read `/metrics` (`metricsAccess`), as the listener enforces it.
pub use crate::serve::MetricsAccess;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file itself could not be read (its message names it).
    #[error(transparent)]
    Read(#[from] crate::fs_helper::read::ReadError),
    #[error("config is not UTF-8 text")]
    NotText,
    #[error("config is not YAML")]
    Yaml(#[source] serde_yaml_ng::Error),
    #[error("config is not read")]
    TooDeep(#[source] crate::yaml::TooDeep),
    #[error("config file is empty: give at least apiVersion: {API_VERSION} and kind: {KIND} (without a file, the agent runs standalone with the kubelet's defaults)")]
    Empty,
    #[error("config is not a mapping of fields; expected a {KIND} document")]
    NotAMapping,
    #[error("config is in the format before {API_VERSION}: {}{}", keys.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "), if *versioned { "" } else { "; and begin the file with apiVersion: node-agent.io/v1alpha1 and kind: NodeAgentConfiguration" })]
    OldFormat { keys: Vec<OldKey>, versioned: bool },
    #[error("config: apiVersion: {}; expected {API_VERSION}", .0.as_deref().map_or("missing".to_string(), |v| format!("{v} is not a version this agent reads")))]
    ApiVersion(Option<String>),
    #[error("config: kind: {}; expected {KIND}", .0.as_deref().map_or("missing".to_string(), |k| format!("{k} is not this agent's")))]
    Kind(Option<String>),
    /// A field that does not read as its type, or one the format does not have: its path and
    /// what was expected there.
    #[error("config: {path}: {message}")]
    Field { path: String, message: String },
    /// The source names the field's path (`eviction.evictionHard[memory.available]`).
    #[error("config")]
    Eviction(#[source] node_agent_policy::ConfigError),
    #[error("config")]
    Kubernetes(#[source] node_agent_kube::config::ConfigError),
    #[error("config")]
    Cri(#[source] node_agent_cri::CriConfigError),
    /// A value that reads but cannot be meant (here or on this machine).
    #[error("config: {path}: {problem}")]
    Invalid { path: &'static str, problem: String },
    #[error("config: nodeCgroup: no cgroup at {0} in the memory hierarchy")]
    NodeCgroup(PathBuf),
}

/// Validated settings with parsed values, as the daemon uses them.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub dry_run: bool,
    pub listen: SocketAddr,
    /// `metricsAccess`, its default resolved.
    pub metrics_access: MetricsAccess,
    pub trace_socket: PathBuf,
    /// `inspectListen`: the loopback address `kubectl node-agent` reads; `None`: not served.
    pub inspect_listen: Option<SocketAddr>,
    pub node_cgroup: PathBuf,
    pub memory_capacity: Option<i64>,
    pub allocatable_memory: Option<i64>,
    /// `nodefsPath`, or where the default points on this machine.
    pub nodefs_path: PathBuf,
    pub imagefs_path: Option<PathBuf>,
    pub kubelet_config: Option<PathBuf>,
    pub resync_interval: Duration,
    pub pressure_poll_interval: Duration,
    /// `kubernetes.podRefreshInterval` (its default standalone, where nothing is refreshed).
    pub pod_refresh_interval: Duration,
    pub fork_limit: u64,
    pub fork_window: Duration,
    pub ring_bytes: u32,
    /// `logFormat` and `logLevel` as the file says them (the command line may win:
    /// [`crate::logging::configure`]).
    pub log_format: crate::logging::LogFormat,
    pub log_level: crate::logging::LogLevel,
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
    /// `--dry-run`: dry run whatever the file says (it can only make the agent safer).
    pub dry_run: bool,
    pub listen: Option<String>,
    pub trace_socket: Option<PathBuf>,
    pub node_name: Option<String>,
    /// The agent's own pod, `(namespace, name)`, from the downward API (`POD_NAMESPACE`,
    /// `POD_NAME`): never evicted.
    pub own_pod: Option<(String, String)>,
    /// `CONTAINER_RUNTIME_ENDPOINT` (crictl's variable; the DaemonSet sets it for the runtime
    /// its component names): wins over `cri.endpoint`.
    pub cri_endpoint: Option<String>,
}

/// The variable that names the runtime's socket, as crictl reads it.
pub const CRI_ENDPOINT_VAR: &str = "CONTAINER_RUNTIME_ENDPOINT";

impl Overrides {
    /// `CONTAINER_RUNTIME_ENDPOINT` from the environment, when set and not empty.
    pub fn cri_endpoint_from_env() -> Option<String> {
        std::env::var(CRI_ENDPOINT_VAR)
            .ok()
            .map(|e| e.trim().to_string())
            .filter(|e| !e.is_empty())
    }
}

/// Reads and parses the file at `path` once (a regular file of at most
/// [`crate::fs_helper::read::MAX_CONFIG_BYTES`]).
pub fn read_file(path: &Path) -> Result<NodeAgentConfiguration, ConfigError> {
    NodeAgentConfiguration::from_bytes(&crate::fs_helper::read::read_capped(path)?)
}

impl AgentConfig {
    /// The config the daemon runs on, from the file at `path`: what `run`, every reload and
    /// `check-config` read.
    pub fn load(path: &Path, overrides: &Overrides) -> Result<Self, ConfigError> {
        Self::from_file(&read_file(path)?, overrides)
    }

    /// Standalone mode without a file: the kubelet's default thresholds, the agent's defaults.
    pub fn standalone(overrides: &Overrides) -> Result<Self, ConfigError> {
        Self::from_file(&NodeAgentConfiguration::default(), overrides)
    }

    /// Parses and validates a whole file's text; nothing partial is ever returned. A file with
    /// nothing in it is refused: an empty ConfigMap must not silently mean "defaults".
    pub fn parse(text: &str, overrides: &Overrides) -> Result<Self, ConfigError> {
        Self::from_file(&NodeAgentConfiguration::parse(text)?, overrides)
    }

    /// As [`AgentConfig::parse`], from the file's bytes as read ([`crate::fs_helper::read::read_capped`]): what
    /// start, the reload watcher and `check-config` all go through.
    pub fn from_bytes(bytes: &[u8], overrides: &Overrides) -> Result<Self, ConfigError> {
        Self::from_file(&NodeAgentConfiguration::from_bytes(bytes)?, overrides)
    }

    /// Validates every section of a parsed file, in the file's order of importance: the
    /// thresholds, the cluster, the agent's own settings, the runtime.
    pub fn from_file(
        file: &NodeAgentConfiguration,
        overrides: &Overrides,
    ) -> Result<Self, ConfigError> {
        let eviction = EvictionConfig::from_fields(&file.eviction, "eviction.")
            .map_err(ConfigError::Eviction)?;
        let kubernetes = file
            .kubernetes
            .clone()
            .map(|k| k.resolve(overrides.node_name.as_deref()))
            .transpose()
            .map_err(ConfigError::Kubernetes)?;
        let settings = validate(file, kubernetes.as_ref(), overrides)?;
        let mut cri = file.cri.clone().unwrap_or_default();
        if let Some(text) = &overrides.cri_endpoint {
            cri.endpoint = node_agent_cri::Endpoint::parse(text)
                .map_err(|e| invalid(CRI_ENDPOINT_VAR, e.to_string()))?;
        }
        let runtime = Runtime {
            settings: cri.validate().map_err(ConfigError::Cri)?,
            gc: cri.gc_policy().map_err(ConfigError::Cri)?,
        };
        Ok(Self {
            eviction,
            cri_unused: kubernetes.is_none() && file.cri.is_some(),
            runtime: kubernetes.is_some().then_some(runtime),
            kubernetes,
            settings,
        })
    }

    /// True when nothing may be changed in the cluster.
    pub fn dry_run(&self) -> bool {
        self.settings.dry_run || self.kubernetes.is_none()
    }

    /// Pacing of evictions: `(per minute, burst)`; standalone reports at the kubelet's pace.
    pub fn pacing(&self) -> (u32, u32) {
        self.kubernetes
            .as_ref()
            .map_or((6, 1), |k| (k.evictions_per_minute, k.eviction_burst))
    }
}

fn invalid(path: &'static str, problem: String) -> ConfigError {
    ConfigError::Invalid { path, problem }
}

/// A duration the loop waits on: 0 would spin.
fn positive(path: &'static str, d: node_agent_policy::GoDuration) -> Result<Duration, ConfigError> {
    if d.is_zero() {
        return Err(invalid(path, "0s: must be longer than 0".into()));
    }
    Ok(d.get())
}

/// A path the agent will statvfs or read: absolute (whether it exists is for the node,
/// [`plausible::check_on_machine`]).
fn absolute(path: &'static str, p: &Path) -> Result<(), ConfigError> {
    if !p.is_absolute() {
        return Err(invalid(
            path,
            format!("{} is not an absolute path", p.display()),
        ));
    }
    Ok(())
}

/// The agent's own settings, checked on their own (the node is asked nothing here).
fn validate(
    f: &NodeAgentConfiguration,
    kubernetes: Option<&KubeConfig>,
    o: &Overrides,
) -> Result<Settings, ConfigError> {
    let listen = match &o.listen {
        None => f.listen,
        Some(text) => text.parse().map_err(|e| {
            invalid(
                "--listen",
                format!("{text:?} is not an address such as 0.0.0.0:9464 ({e})"),
            )
        })?,
    };
    let memory_capacity = f
        .memory_capacity
        .map(|size| plausible::memory_bytes("memoryCapacity", size))
        .transpose()?;
    let allocatable_memory = f
        .allocatable_memory
        .map(|size| plausible::memory_bytes("allocatableMemory", size))
        .transpose()?;
    if let (Some(capacity), Some(allocatable)) = (memory_capacity, allocatable_memory) {
        if allocatable > capacity {
            return Err(invalid(
                "allocatableMemory",
                format!(
                    "{allocatable} bytes is more than memoryCapacity ({capacity} bytes): allocatable is capacity minus what is reserved"
                ),
            ));
        }
    }
    if !f.node_cgroup.starts_with('/') || f.node_cgroup.split('/').any(|c| c == "..") {
        return Err(invalid(
            "nodeCgroup",
            format!(
                "{:?} must be an absolute cgroup path without `..`",
                f.node_cgroup
            ),
        ));
    }
    if let Some(p) = &f.nodefs_path {
        absolute("nodefsPath", p)?;
    }
    if let Some(p) = &f.imagefs_path {
        absolute("imagefsPath", p)?;
    }
    // May be absent on the node (a node without a kubelet, or one configured by flags): only
    // said at start.
    if let Some(p) = &f.kubelet_config {
        absolute("kubeletConfig", p)?;
    }
    let trace_socket = o
        .trace_socket
        .clone()
        .unwrap_or_else(|| f.trace_socket.clone());
    if trace_socket.as_os_str().is_empty() {
        return Err(invalid("traceSocket", "empty".into()));
    }
    let ring_bytes = plausible::ring_bytes(f.ring_buffer_size)?;
    let metrics_access = match (f.metrics_access, kubernetes) {
        (Some(MetricsAccess::Kubernetes), None) => {
            return Err(invalid(
                "metricsAccess",
                "kubernetes needs the kubernetes section: the API server reviews the callers' tokens (standalone: loopback or open)".into(),
            ))
        }
        (Some(access), _) => access,
        (None, Some(_)) => MetricsAccess::Kubernetes,
        (None, None) => MetricsAccess::Loopback,
    };
    if let Some(addr) = f.inspect_listen.filter(|a| !a.ip().is_loopback()) {
        return Err(invalid(
            "inspectListen",
            format!("{addr} is not a loopback address: the endpoint has no authentication of its own; give 127.0.0.1:PORT (kubectl node-agent reaches it through pods/portforward)"),
        ));
    }
    Ok(Settings {
        dry_run: f.dry_run || o.dry_run,
        listen,
        metrics_access,
        trace_socket,
        inspect_listen: f.inspect_listen,
        node_cgroup: PathBuf::from(&f.node_cgroup),
        memory_capacity,
        allocatable_memory,
        // The default is where the kubelet keeps its root on this machine, else `/`.
        // One that does not answer is there, hung: taken all the same.
        nodefs_path: f.nodefs_path.clone().unwrap_or_else(|| {
            let default = PathBuf::from(DEFAULT_NODEFS);
            match plausible::is_dir(&default) {
                Ok(false) => PathBuf::from("/"),
                Ok(true) | Err(_) => default,
            }
        }),
        imagefs_path: f.imagefs_path.clone(),
        kubelet_config: f.kubelet_config.clone(),
        resync_interval: positive("resyncInterval", f.resync_interval)?,
        pressure_poll_interval: positive("pressurePollInterval", f.pressure_poll_interval)?,
        pod_refresh_interval: kubernetes.map_or_else(
            || KubeConfig::default().pod_refresh_interval(),
            KubeConfig::pod_refresh_interval,
        ),
        fork_limit: f.fork_limit,
        fork_window: positive("forkWindow", f.fork_window)?,
        ring_bytes,
        log_format: f.log_format,
        log_level: f.log_level.clone(),
    })
}

#[cfg(test)]
mod tests;
