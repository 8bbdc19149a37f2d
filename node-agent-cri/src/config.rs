//! Where the runtime listens and how long a call may take: the `cri:` settings, validated before
//! anything connects.
//!
//! ```yaml
//! cri:
//!   endpoint: unix:///run/containerd/containerd.sock   # the kubelet's --container-runtime-endpoint
//!   timeout: 10s                                       # per call (Go duration)
//! ```

use std::{path::PathBuf, time::Duration};

use serde::Deserialize;

/// containerd's socket, the most common runtime endpoint.
pub const DEFAULT_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";
/// Per call. The kubelet waits up to 2 minutes (`runtimeRequestTimeout`), but the agent asks
/// under pressure and would rather report a slow runtime than wait for it.
pub const DEFAULT_TIMEOUT: &str = "10s";

/// The settings as written (`cri:`), every field optional.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CriConfig {
    /// `unix:///path/to/socket`, as the kubelet's `containerRuntimeEndpoint`.
    pub endpoint: String,
    /// Longest wait for one call (Go duration, > 0).
    pub timeout: String,
}

impl Default for CriConfig {
    fn default() -> Self {
        Self {
            endpoint: DEFAULT_ENDPOINT.into(),
            timeout: DEFAULT_TIMEOUT.into(),
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
    fn an_endpoint_prints_as_written() {
        let e = Endpoint::parse("unix:///run/containerd/containerd.sock").unwrap();
        assert_eq!(e.to_string(), "unix:///run/containerd/containerd.sock");
    }
}
