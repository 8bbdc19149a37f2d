//! Where the runtime listens and how long a call may take: the `cri:` settings, validated before
//! anything connects.
//!
//! ```yaml
//! cri:
//!   endpoint: unix:///run/containerd/containerd.sock   # the kubelet's --container-runtime-endpoint
//!   timeout: 10s                                       # per call (Go duration)
//!   image_minimum_gc_age: 2m                           # the kubelet's imageMinimumGCAge
//!   keep_images: [registry.k8s.io/pause:3.6]           # never removed (the sandbox image)
//! ```

use std::{path::PathBuf, time::Duration};

use serde::Deserialize;

use crate::reclaim::{ContainerGcPolicy, GcPolicy, ImageGcPolicy};

/// containerd's socket, the most common runtime endpoint.
pub const DEFAULT_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";
/// Per call. The kubelet waits up to 2 minutes (`runtimeRequestTimeout`), but the agent asks
/// under pressure and would rather report a slow runtime than wait for it.
pub const DEFAULT_TIMEOUT: &str = "10s";
/// The kubelet's `imageMinimumGCAge` default.
pub const DEFAULT_IMAGE_MINIMUM_GC_AGE: &str = "2m";
/// containerd 1.6's default `sandbox_image`: containerd before 1.7 does not pin it, and a node
/// without registry access cannot start pods once it is gone (the kubelet kept its own
/// `--pod-infra-container-image` out of image GC for the same reason).
pub const DEFAULT_KEEP_IMAGES: &[&str] = &["registry.k8s.io/pause:3.6"];

/// The settings as written (`cri:`), every field optional.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CriConfig {
    /// `unix:///path/to/socket`, as the kubelet's `containerRuntimeEndpoint`.
    pub endpoint: String,
    /// Longest wait for one call (Go duration, > 0).
    pub timeout: String,
    /// Images first seen less than this ago are not removed by node-level reclaim (Go
    /// duration, >= 0; the kubelet's `imageMinimumGCAge`).
    pub image_minimum_gc_age: String,
    /// Images never removed by node-level reclaim, by ID, tag or digest.
    pub keep_images: Vec<String>,
}

impl Default for CriConfig {
    fn default() -> Self {
        Self {
            endpoint: DEFAULT_ENDPOINT.into(),
            timeout: DEFAULT_TIMEOUT.into(),
            image_minimum_gc_age: DEFAULT_IMAGE_MINIMUM_GC_AGE.into(),
            keep_images: DEFAULT_KEEP_IMAGES.iter().map(|s| s.to_string()).collect(),
        }
    }
}

/// A refused `cri:` setting; the message names the field and what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CriConfigError {
    #[error("cri.endpoint: {endpoint:?} is not a unix socket endpoint; expected unix:///absolute/path (the kubelet's --container-runtime-endpoint form)")]
    Endpoint { endpoint: String },
    #[error("cri.timeout: {value:?}: {source}")]
    Timeout {
        value: String,
        #[source]
        source: node_agent_policy::duration::DurationError,
    },
    #[error("cri.timeout: {value:?} must be longer than 0")]
    TimeoutNotPositive { value: String },
    #[error("cri.image_minimum_gc_age: {value:?}: {problem}")]
    ImageMinimumGcAge { value: String, problem: String },
    #[error("cri.keep_images: an empty name is not an image reference")]
    KeepImageEmpty,
}

/// The runtime's unix socket.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    path: PathBuf,
}

impl Endpoint {
    /// Parses `unix:///absolute/path`. TCP endpoints and Windows named pipes are refused: the
    /// agent runs on Linux beside the kubelet, which only uses unix sockets there.
    pub fn parse(text: &str) -> Result<Self, CriConfigError> {
        let refused = || CriConfigError::Endpoint {
            endpoint: text.to_string(),
        };
        let path = text.strip_prefix("unix://").ok_or_else(refused)?;
        if !path.starts_with('/') || path.len() < 2 || path.contains('\0') {
            return Err(refused());
        }
        Ok(Self {
            path: PathBuf::from(path),
        })
    }

    /// A socket path (tests start runtimes on their own sockets).
    pub fn from_path(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unix://{}", self.path.display())
    }
}

/// Validated settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CriSettings {
    pub endpoint: Endpoint,
    pub timeout: Duration,
}

impl CriConfig {
    pub fn validate(&self) -> Result<CriSettings, CriConfigError> {
        let endpoint = Endpoint::parse(&self.endpoint)?;
        let nanos =
            node_agent_policy::duration::parse_go_duration(&self.timeout).map_err(|source| {
                CriConfigError::Timeout {
                    value: self.timeout.clone(),
                    source,
                }
            })?;
        let nanos = u64::try_from(nanos)
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| CriConfigError::TimeoutNotPositive {
                value: self.timeout.clone(),
            })?;
        Ok(CriSettings {
            endpoint,
            timeout: Duration::from_nanos(nanos),
        })
    }
}

impl CriConfig {
    /// The node-level reclaim settings of this section: the image GC's minimum age and the
    /// images it never removes; the container GC keeps the kubelet's defaults.
    pub fn gc_policy(&self) -> Result<GcPolicy, CriConfigError> {
        let refused = |problem: String| CriConfigError::ImageMinimumGcAge {
            value: self.image_minimum_gc_age.clone(),
            problem,
        };
        let nanos = node_agent_policy::duration::parse_go_duration(&self.image_minimum_gc_age)
            .map_err(|e| refused(e.to_string()))?;
        let nanos = u64::try_from(nanos).map_err(|_| refused("must not be negative".into()))?;
        if self.keep_images.iter().any(|k| k.trim().is_empty()) {
            return Err(CriConfigError::KeepImageEmpty);
        }
        Ok(GcPolicy {
            containers: ContainerGcPolicy::default(),
            images: ImageGcPolicy {
                min_age: Duration::from_nanos(nanos),
                keep: self.keep_images.clone(),
            },
        })
    }
}

impl Default for CriSettings {
    fn default() -> Self {
        CriConfig::default()
            .validate()
            .expect("the built-in defaults are valid")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<CriSettings, String> {
        let config: CriConfig = serde_yaml_ng::from_str(yaml).map_err(|e| e.to_string())?;
        config.validate().map_err(|e| e.to_string())
    }

    /// The endpoint path and timeout, or a fragment of the refusal.
    type Expected = Result<(&'static str, Duration), &'static str>;

    #[test]
    fn table() {
        let cases: &[(&str, &str, Expected)] = &[
            ("an empty section takes containerd's socket and 10s", "{}",
             Ok(("/run/containerd/containerd.sock", Duration::from_secs(10)))),
            ("a CRI-O socket and a Go duration", "{endpoint: 'unix:///var/run/crio/crio.sock', timeout: 1m30s}",
             Ok(("/var/run/crio/crio.sock", Duration::from_secs(90)))),
            ("a bare path is refused, naming the field", "{endpoint: /run/containerd/containerd.sock}",
             Err("cri.endpoint: \"/run/containerd/containerd.sock\" is not a unix socket endpoint")),
            ("tcp is refused", "{endpoint: 'tcp://127.0.0.1:1234'}",
             Err("cri.endpoint: \"tcp://127.0.0.1:1234\"")),
            ("a relative unix path is refused", "{endpoint: 'unix://run/containerd.sock'}",
             Err("cri.endpoint: \"unix://run/containerd.sock\"")),
            ("an empty unix path is refused", "{endpoint: 'unix://'}", Err("cri.endpoint: \"unix://\"")),
            ("a timeout without unit is refused", "{timeout: '10'}", Err("cri.timeout: \"10\": missing unit")),
            ("a zero timeout is refused", "{timeout: 0s}", Err("cri.timeout: \"0s\" must be longer than 0")),
            ("a negative timeout is refused", "{timeout: -1s}", Err("cri.timeout: \"-1s\" must be longer than 0")),
            ("an unknown field is refused", "{endpoint_path: x}", Err("unknown field `endpoint_path`")),
        ];
        for (behaviour, yaml, expected) in cases {
            let got = parse(yaml);
            match (expected, &got) {
                (Ok((path, timeout)), Ok(s)) => {
                    assert_eq!(s.endpoint.path(), std::path::Path::new(path), "{behaviour}");
                    assert_eq!(s.timeout, *timeout, "{behaviour}");
                }
                (Err(needle), Err(message)) => {
                    assert!(
                        message.contains(needle),
                        "{behaviour}: {message:?} lacks {needle:?}"
                    )
                }
                _ => panic!("{behaviour}: expected {expected:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn gc_policy_table() {
        /// The policy's minimum age and kept images, or a fragment of the refusal.
        type Expected = Result<(Duration, &'static [&'static str]), &'static str>;
        let cases: &[(&str, &str, Expected)] = &[
            (
                "defaults: the kubelet's 2 minutes, containerd 1.6's sandbox image kept",
                "{}",
                Ok((Duration::from_secs(120), &["registry.k8s.io/pause:3.6"])),
            ),
            (
                "a zero age and no kept image",
                "{image_minimum_gc_age: 0s, keep_images: []}",
                Ok((Duration::ZERO, &[])),
            ),
            (
                "a negative age is refused",
                "{image_minimum_gc_age: -1m}",
                Err("cri.image_minimum_gc_age: \"-1m\": must not be negative"),
            ),
            (
                "an age without unit is refused",
                "{image_minimum_gc_age: '5'}",
                Err("cri.image_minimum_gc_age: \"5\""),
            ),
            (
                "an empty kept name is refused",
                "{keep_images: ['']}",
                Err("cri.keep_images: an empty name"),
            ),
        ];
        for (behaviour, yaml, expected) in cases {
            let config: CriConfig = serde_yaml_ng::from_str(yaml).unwrap();
            match (expected, config.gc_policy()) {
                (Ok((age, keep)), Ok(p)) => {
                    assert_eq!(p.images.min_age, *age, "{behaviour}");
                    assert_eq!(p.images.keep, *keep, "{behaviour}");
                    assert_eq!(p.containers, ContainerGcPolicy::default(), "{behaviour}");
                }
                (Err(needle), Err(e)) => {
                    assert!(e.to_string().contains(needle), "{behaviour}: {e}")
                }
                (_, got) => panic!("{behaviour}: expected {expected:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn an_endpoint_prints_as_written() {
        let e = Endpoint::parse("unix:///run/containerd/containerd.sock").unwrap();
        assert_eq!(e.to_string(), "unix:///run/containerd/containerd.sock");
    }
}
