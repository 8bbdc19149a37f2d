//! Where the runtime listens and how long a call may take: the `cri:` section of the agent's
//! config, validated before anything connects.
//!
//! ```yaml
//! cri:
//!   endpoint: unix:///run/containerd/containerd.sock   # the kubelet's containerRuntimeEndpoint
//!   timeout: 10s                                       # per call (Go duration)
//!   imageMinimumGCAge: 2m                              # the kubelet's imageMinimumGCAge
//!   keepImages: [registry.k8s.io/pause:3.6]            # never removed (the sandbox image)
//! ```

use std::{fmt, path::PathBuf, time::Duration};

use node_agent_policy::GoDuration;
use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

use crate::reclaim::{ContainerGcPolicy, GcPolicy, ImageGcPolicy};

/// containerd's socket, the most common runtime endpoint.
pub const DEFAULT_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";
/// Per call. The kubelet waits up to 2 minutes (`runtimeRequestTimeout`), but the agent asks
/// under pressure and would rather report a slow runtime than wait for it.
pub const DEFAULT_TIMEOUT: GoDuration = GoDuration::from_secs(10);
/// The kubelet's `imageMinimumGCAge` default.
pub const DEFAULT_IMAGE_MINIMUM_GC_AGE: GoDuration = GoDuration::from_secs(120);
/// containerd 1.6's default `sandbox_image`: containerd before 1.7 does not pin it, and a node
/// without registry access cannot start pods once it is gone (the kubelet kept its own
/// `--pod-infra-container-image` out of image GC for the same reason).
pub const DEFAULT_KEEP_IMAGES: &[&str] = &["registry.k8s.io/pause:3.6"];

/// The `cri:` section, every field with its default.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CriConfig {
    /// `unix:///path/to/socket`, as the kubelet's `containerRuntimeEndpoint`.
    pub endpoint: Endpoint,
    /// Longest wait for one call (> 0).
    pub timeout: GoDuration,
    /// Images first seen less than this ago are not removed by node-level reclaim (the
    /// kubelet's `imageMinimumGCAge`).
    #[serde(rename = "imageMinimumGCAge")]
    pub image_minimum_gc_age: GoDuration,
    /// Images never removed by node-level reclaim, by ID, tag or digest.
    pub keep_images: Vec<String>,
}

impl Default for CriConfig {
    fn default() -> Self {
        Self {
            endpoint: Endpoint::parse(DEFAULT_ENDPOINT).expect("the default endpoint is valid"),
            timeout: DEFAULT_TIMEOUT,
            image_minimum_gc_age: DEFAULT_IMAGE_MINIMUM_GC_AGE,
            keep_images: DEFAULT_KEEP_IMAGES.iter().map(|s| s.to_string()).collect(),
        }
    }
}

/// The longest `cri.timeout` taken: the kubelet's `--runtime-request-timeout` default. A call
/// runs on the executor's runtime lane, never in the way of a memory eviction, but a disk
/// eviction waits for the reclaim before it.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(120);

/// A refused `cri:` setting; the message names the field and what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CriConfigError {
    #[error("cri.timeout: must be longer than 0 (a Go duration such as 10s)")]
    TimeoutNotPositive,
    #[error("cri.timeout: {0:?} is longer than {MAX_TIMEOUT:?}, the kubelet's own runtime request timeout: a longer one would hold a disk eviction back that long behind a runtime that does not answer")]
    TimeoutTooLong(Duration),
    #[error("cri.keepImages: an empty name is not an image reference")]
    KeepImageEmpty,
}

/// An endpoint that is not `unix:///absolute/path`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{endpoint:?} is not a unix socket endpoint; expected unix:///absolute/path (the kubelet's --container-runtime-endpoint form)")]
pub struct EndpointError {
    pub endpoint: String,
}

/// The runtime's unix socket.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    path: PathBuf,
}

impl Endpoint {
    /// Parses `unix:///absolute/path`. TCP endpoints and Windows named pipes are refused: the
    /// agent runs on Linux beside the kubelet, which only uses unix sockets there.
    pub fn parse(text: &str) -> Result<Self, EndpointError> {
        let refused = || EndpointError {
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

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unix://{}", self.path.display())
    }
}

impl Serialize for Endpoint {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Endpoint {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Endpoint::parse(&text).map_err(de::Error::custom)
    }
}

/// Validated settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CriSettings {
    pub endpoint: Endpoint,
    pub timeout: Duration,
}

impl CriConfig {
    /// The client's settings: a call must be given some time.
    pub fn validate(&self) -> Result<CriSettings, CriConfigError> {
        if self.timeout.is_zero() {
            return Err(CriConfigError::TimeoutNotPositive);
        }
        if self.timeout.get() > MAX_TIMEOUT {
            return Err(CriConfigError::TimeoutTooLong(self.timeout.get()));
        }
        Ok(CriSettings {
            endpoint: self.endpoint.clone(),
            timeout: self.timeout.get(),
        })
    }

    /// The node-level reclaim settings of this section: the image GC's minimum age and the
    /// images it never removes; the container GC keeps the kubelet's defaults.
    pub fn gc_policy(&self) -> Result<GcPolicy, CriConfigError> {
        if self.keep_images.iter().any(|k| k.trim().is_empty()) {
            return Err(CriConfigError::KeepImageEmpty);
        }
        Ok(GcPolicy {
            containers: ContainerGcPolicy::default(),
            images: ImageGcPolicy {
                min_age: self.image_minimum_gc_age.get(),
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

    /// The section read as the agent reads it, errors with their path below `cri.`.
    fn section(yaml: &str) -> Result<CriConfig, String> {
        let value: serde_yaml_ng::Value = serde_yaml_ng::from_str(yaml).unwrap();
        serde_path_to_error::deserialize(value)
            .map_err(|e| format!("cri.{}: {}", e.path(), e.inner()))
    }

    fn parse(yaml: &str) -> Result<CriSettings, String> {
        section(yaml)?.validate().map_err(|e| e.to_string())
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
            ("a timeout without unit is refused", "{timeout: 10}", Err("cri.timeout: 10 has no unit; expected a Go duration such as 10s")),
            ("a zero timeout is refused", "{timeout: 0s}", Err("cri.timeout: must be longer than 0")),
            ("a timeout past the kubelet's is refused", "{timeout: 10m}", Err("cri.timeout: 600s is longer than 120s")),
            ("the kubelet's own timeout is taken", "{timeout: 2m}", Ok(("/run/containerd/containerd.sock", Duration::from_secs(120)))),
            ("a negative timeout is refused", "{timeout: -1s}", Err("cri.timeout: \"-1s\" is not a Go duration such as 30s, 1m30s or 100ms: must not be negative")),
            ("an unknown field is refused", "{endpoint_path: x}", Err("cri.endpoint_path: unknown field `endpoint_path`")),
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
                "{imageMinimumGCAge: 0s, keepImages: []}",
                Ok((Duration::ZERO, &[])),
            ),
            (
                "a negative age is refused",
                "{imageMinimumGCAge: -1m}",
                Err("cri.imageMinimumGCAge: \"-1m\" is not a Go duration such as 30s, 1m30s or 100ms: must not be negative"),
            ),
            (
                "an age without unit is refused",
                "{imageMinimumGCAge: '5'}",
                Err("cri.imageMinimumGCAge: \"5\" is not a Go duration"),
            ),
            (
                "the kubelet's own spelling is the only one",
                "{imageMinimumGcAge: 5m}",
                Err("cri.imageMinimumGcAge: unknown field `imageMinimumGcAge`, expected one of `endpoint`, `timeout`, `imageMinimumGCAge`, `keepImages`"),
            ),
            (
                "an empty kept name is refused",
                "{keepImages: ['']}",
                Err("cri.keepImages: an empty name"),
            ),
        ];
        for (behaviour, yaml, expected) in cases {
            let policy = section(yaml).and_then(|c| c.gc_policy().map_err(|e| e.to_string()));
            match (expected, policy) {
                (Ok((age, keep)), Ok(p)) => {
                    assert_eq!(p.images.min_age, *age, "{behaviour}");
                    assert_eq!(p.images.keep, *keep, "{behaviour}");
                    assert_eq!(p.containers, ContainerGcPolicy::default(), "{behaviour}");
                }
                (Err(needle), Err(e)) => {
                    assert!(e.contains(needle), "{behaviour}: {e}")
                }
                (_, got) => panic!("{behaviour}: expected {expected:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn an_endpoint_prints_as_written_and_the_section_reads_back() {
        let e = Endpoint::parse("unix:///run/containerd/containerd.sock").unwrap();
        assert_eq!(e.to_string(), "unix:///run/containerd/containerd.sock");
        let printed = serde_yaml_ng::to_string(&CriConfig::default()).unwrap();
        assert_eq!(
            printed,
            "endpoint: unix:///run/containerd/containerd.sock\ntimeout: 10s\nimageMinimumGCAge: 2m0s\nkeepImages:\n- registry.k8s.io/pause:3.6\n"
        );
        assert_eq!(section(&printed), Ok(CriConfig::default()));
    }
}
