//! The config file as written: one versioned `NodeAgentConfiguration`, camelCase throughout as
//! Kubernetes component configs are, every field with its default, read in one serde pass.
//!
//! ```yaml
//! apiVersion: node-agent.io/v1alpha1
//! kind: NodeAgentConfiguration
//! dryRun: true
//! resyncInterval: 10s                                   # every duration a Go duration
//! ringBufferSize: 1Mi                                   # every size a Kubernetes quantity
//! eviction: {evictionHard: {memory.available: 500Mi}}  # KubeletConfiguration's own fields
//! kubernetes: {podSource: kubelet}                      # absent: standalone mode
//! cri: {endpoint: "unix:///run/containerd/containerd.sock"}
//! ```
//!
//! The agent's own settings are top-level fields; `eviction`, `kubernetes` and `cri` are the
//! sections of the crates that own them ([`EvictionFields`], [`KubeConfig`], [`CriConfig`]).

use std::{fmt, net::SocketAddr, path::PathBuf};

use node_agent_cri::CriConfig;
use node_agent_kube::config::KubeConfig;
use node_agent_policy::{ByteSize, EvictionFields, GoDuration};
use serde::{de, Deserialize, Deserializer, Serialize, Serializer};
use serde_yaml_ng::Value;

use super::MetricsAccess;
use super::{legacy, ConfigError};
use crate::logging::{LogFormat, LogLevel};

/// The config format this agent reads.
pub const API_VERSION: &str = "node-agent.io/v1alpha1";
pub const KIND: &str = "NodeAgentConfiguration";

/// The kubelet's root directory, the default nodefs path.
pub const DEFAULT_NODEFS: &str = "/var/lib/kubelet";
/// Where kubeadm and most installers put the kubelet's config file, the default
/// `kubeletConfig`.
pub const DEFAULT_KUBELET_CONFIG: &str = "/var/lib/kubelet/config.yaml";

/// The whole config file. Absent fields take their defaults; unknown ones are refused with
/// their path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct NodeAgentConfiguration {
    /// `node-agent.io/v1alpha1`.
    pub api_version: String,
    /// `NodeAgentConfiguration`.
    pub kind: String,
    /// Decide and report everything, change nothing in the cluster. The one switch: it holds
    /// the moment a reload reads it, whatever else the file says.
    pub dry_run: bool,
    /// `/metrics`, `/healthz`, `/readyz`.
    #[serde(with = "address")]
    pub listen: SocketAddr,
    /// Who may read `/metrics` (and `/readyz`'s whole reason; the probes need nothing):
    /// `kubernetes`, a bearer token the API server authenticates whose user RBAC lets `get`
    /// the path; `loopback`, only the agent's own network namespace; `open`, anyone who
    /// reaches `listen`. Unset: `kubernetes` in Kubernetes mode, else `loopback`.
    pub metrics_access: Option<MetricsAccess>,
    /// Unix socket where the daemon publishes its event stream for `node-agent trace`.
    pub trace_socket: PathBuf,
    /// The loopback address `kubectl node-agent` reads (status, the live stream, explain)
    /// through the API server's `pods/portforward`; `null`: not served. Loopback only: the
    /// endpoint has no authentication of its own (deploy/ sets `127.0.0.1:9465`, inside the
    /// pod's own network namespace).
    #[serde(with = "optional_address")]
    pub inspect_listen: Option<SocketAddr>,
    /// The cgroup (in the memory hierarchy) whose usage is the node's: `/` for the whole
    /// machine; another path scopes the agent to a subtree (nested nodes, tests).
    pub node_cgroup: String,
    /// Node memory capacity; default: MemTotal from /proc/meminfo.
    pub memory_capacity: Option<ByteSize>,
    /// The node's allocatable memory. `allocatableMemory.available` = allocatable − the
    /// working set of the kubepods cgroup below `nodeCgroup` is observed, as the kubelet does
    /// with `enforceNodeAllocatable: pods`, against this when set (it wins), else in Kubernetes
    /// mode against the kubepods cgroup's own memory limit, as the kubelet measures it (the
    /// Node's `status.allocatable.memory`, read every `resyncInterval`, while that cgroup has
    /// none); standalone without it, not observed.
    pub allocatable_memory: Option<ByteSize>,
    /// Filesystem of `nodefs.*` (the kubelet's root dir). Unset: `/var/lib/kubelet`, or `/`
    /// when that does not exist; set, it must exist.
    pub nodefs_path: Option<PathBuf>,
    /// Filesystem of `imagefs.*` when the runtime keeps images on a dedicated one.
    pub imagefs_path: Option<PathBuf>,
    /// The kubelet's own config file, read at start and on reload to warn when the kubelet
    /// would evict before the agent; `null` skips the comparison. An absolute path.
    pub kubelet_config: Option<PathBuf>,
    /// Slow re-evaluation that only guards against drift and missed events.
    pub resync_interval: GoDuration,
    /// Re-evaluation while a memory trigger is armed or a threshold is met.
    pub pressure_poll_interval: GoDuration,
    /// Fork-storm limit per workload cgroup: more than this many forks per `forkWindow`
    /// (0: none).
    pub fork_limit: u64,
    pub fork_window: GoDuration,
    /// The kernel ring buffer (a power of two, 4Ki to 256Mi).
    pub ring_buffer_size: ByteSize,
    /// Log lines on stderr: `text`, or `json` (one object per line, the same fields).
    /// `--log-format` wins over it.
    pub log_format: LogFormat,
    /// A level (`error`, `warn`, `info`, `debug`, `trace`) or RUST_LOG directives
    /// (`info,node_agent::run=debug`). `--log-level`, else `RUST_LOG`, wins over it.
    pub log_level: LogLevel,
    /// The kubelet's eviction fields, by their KubeletConfiguration names.
    pub eviction: EvictionFields,
    /// How the agent talks to Kubernetes; absent: standalone mode (nothing is ever changed).
    /// Present but empty (`kubernetes:` or `kubernetes: {}`): every default.
    #[serde(deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubeConfig>,
    /// The container runtime, for node-level reclaim in Kubernetes mode; absent: its defaults.
    #[serde(deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub cri: Option<CriConfig>,
}

impl Default for NodeAgentConfiguration {
    fn default() -> Self {
        Self {
            api_version: API_VERSION.into(),
            kind: KIND.into(),
            dry_run: false,
            listen: SocketAddr::from(([0, 0, 0, 0], 9464)),
            metrics_access: None,
            trace_socket: PathBuf::from("/run/node-agent/trace.sock"),
            inspect_listen: None,
            node_cgroup: "/".into(),
            memory_capacity: None,
            allocatable_memory: None,
            nodefs_path: None,
            imagefs_path: None,
            kubelet_config: Some(PathBuf::from(DEFAULT_KUBELET_CONFIG)),
            resync_interval: GoDuration::from_secs(10),
            pressure_poll_interval: GoDuration::from_millis(100),
            fork_limit: 1000,
            fork_window: GoDuration::from_secs(1),
            ring_buffer_size: ByteSize::from_bytes(u64::from(
                node_agent_common::DEFAULT_RING_BYTES,
            )),
            log_format: LogFormat::Text,
            log_level: LogLevel::info(),
            eviction: EvictionFields::default(),
            kubernetes: None,
            cri: None,
        }
    }
}

impl NodeAgentConfiguration {
    /// Reads the file's text: YAML once, then the checks on the document (nothing in it, the
    /// old format, the version), then the one typed pass, every error naming its path.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        crate::yaml::check_nesting(text).map_err(ConfigError::TooDeep)?;
        let document: Value = serde_yaml_ng::from_str(text).map_err(ConfigError::Yaml)?;
        Self::from_document(document)
    }

    /// As [`NodeAgentConfiguration::parse`], from the file's bytes: YAML is UTF-8 text.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, ConfigError> {
        Self::parse(std::str::from_utf8(bytes).map_err(|_| ConfigError::NotText)?)
    }

    fn from_document(document: Value) -> Result<Self, ConfigError> {
        let map = match &document {
            Value::Null => return Err(ConfigError::Empty),
            Value::Mapping(map) => map,
            _ => return Err(ConfigError::NotAMapping),
        };
        let api_version = map.get("apiVersion");
        let old = legacy::old_keys(&document);
        if !old.is_empty() {
            return Err(ConfigError::OldFormat {
                keys: old,
                versioned: api_version.is_some(),
            });
        }
        match api_version {
            Some(Value::String(v)) if v == API_VERSION => {}
            found => return Err(ConfigError::ApiVersion(found.map(shown))),
        }
        match map.get("kind") {
            Some(Value::String(k)) if k == KIND => {}
            found => return Err(ConfigError::Kind(found.map(shown))),
        }
        serde_path_to_error::deserialize(document).map_err(|e| ConfigError::Field {
            path: e.path().to_string(),
            message: e.inner().to_string(),
        })
    }

    /// This configuration with every default written out: the eviction fields the kubelet's
    /// defaults fill in, and in Kubernetes mode the runtime's section. Read back, it is the
    /// same configuration.
    pub fn effective(&self) -> Self {
        let kubernetes_mode = self.kubernetes.is_some();
        Self {
            metrics_access: Some(self.metrics_access.unwrap_or(if kubernetes_mode {
                MetricsAccess::Kubernetes
            } else {
                MetricsAccess::Loopback
            })),
            eviction: self.eviction.with_kubelet_defaults(),
            cri: match &self.cri {
                None if kubernetes_mode => Some(CriConfig::default()),
                cri => cri.clone(),
            },
            ..self.clone()
        }
    }

    /// The effective configuration as YAML, with the version header first.
    pub fn to_yaml(&self) -> String {
        serde_yaml_ng::to_string(self).unwrap_or_else(|e| format!("# not printable: {e}\n"))
    }
}

/// A value found where a string was expected, as the file has it.
fn shown(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        other => serde_yaml_ng::to_string(other)
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "?".into()),
    }
}

/// A section that is present is used, even when written with nothing in it (`kubernetes:`):
/// all its defaults. Only leaving it out means "none".
fn present<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Some(
        Option::<T>::deserialize(deserializer)?.unwrap_or_default(),
    ))
}

/// `inspectListen`: an address and port, or null.
mod optional_address {
    use super::*;

    pub fn serialize<S: Serializer>(addr: &Option<SocketAddr>, s: S) -> Result<S::Ok, S::Error> {
        match addr {
            Some(addr) => s.collect_str(addr),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
        struct Visitor;
        impl<'de> de::Visitor<'de> for Visitor {
            type Value = Option<SocketAddr>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("null, or a loopback address and port such as 127.0.0.1:9465")
            }

            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(None)
            }

            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(None)
            }

            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                d.deserialize_str(self)
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                v.parse().map(Some).map_err(|_| {
                    E::custom(format_args!(
                        "{v:?} is not an address and port such as 127.0.0.1:9465"
                    ))
                })
            }
        }
        d.deserialize_option(Visitor)
    }
}

/// `listen`: an address and port, as `SocketAddr` prints it.
mod address {
    use super::*;

    pub fn serialize<S: Serializer>(addr: &SocketAddr, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(addr)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = SocketAddr;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an address and port such as 0.0.0.0:9464 or [::]:9464")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<SocketAddr, E> {
                v.parse().map_err(|_| {
                    E::custom(format_args!(
                        "{v:?} is not an address and port such as 0.0.0.0:9464 or [::]:9464"
                    ))
                })
            }
        }
        d.deserialize_str(Visitor)
    }
}
