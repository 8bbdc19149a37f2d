//! This crate's section of the agent config (`kubernetes:`), its defaults and its validation.
//!
//! Every field has a default that works inside a pod started by `deploy/daemonset.yaml`; the one
//! value that cannot have a default, the node name, comes from the `NODE_NAME` environment
//! variable (the downward API) when the file leaves it out.

use std::{path::PathBuf, time::Duration};

pub use node_agent_policy::{Exclusions, LabelOperator, LabelRequirement, LabelSelector};
use serde::Deserialize;

/// Where the service account's files are mounted in every pod.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The `kubernetes:` section of the agent config.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubeConfig {
    /// Where the pods bound to this node are read from.
    pub pod_source: PodSourceKind,
    /// The node this agent runs on; empty means "take `NODE_NAME` from the environment".
    pub node_name: String,
    pub kubelet: KubeletEndpoint,
    pub api_server: ApiServerEndpoint,
    /// The service account token, re-read from disk before each request so rotated tokens work.
    pub token_path: PathBuf,
    /// One HTTP request (connect, send, read the whole answer) may take this long.
    pub request_timeout_seconds: u64,
    pub retry: RetryConfig,
    /// What to do when a PodDisruptionBudget blocks an eviction (HTTP 429).
    pub pdb_policy: PdbPolicy,
    /// Token bucket: evictions allowed per minute, and how many may go at once.
    pub evictions_per_minute: u32,
    pub eviction_burst: u32,
    /// After an eviction, wait at most this long for the pod's cgroup to disappear.
    pub eviction_wait_timeout_seconds: u64,
    /// A pod whose eviction a PodDisruptionBudget blocked, or the API server refused, is passed
    /// over for this long (or as long as the server's Retry-After, if longer); the next-ranked
    /// pod goes meanwhile.
    pub pass_over_seconds: u64,
    /// Pod and usage data older than this is not acted upon.
    pub staleness_bound_seconds: u64,
    pub exclusions: Exclusions,
    /// Decide and report everything, change nothing in the cluster.
    pub dry_run: bool,
    /// Keep a `NoSchedule` taint (`node-agent.io/pressure`) on the node while the agent
    /// reports pressure, so no new pod is scheduled onto it. Off: never added, and one left
    /// from before is removed.
    pub taint: bool,
    /// The node event for a kernel OOM kill.
    pub node_oom_events: NodeOomEvents,
}

impl Default for KubeConfig {
    fn default() -> Self {
        Self {
            pod_source: PodSourceKind::Kubelet,
            node_name: String::new(),
            kubelet: KubeletEndpoint::default(),
            api_server: ApiServerEndpoint::default(),
            token_path: PathBuf::from(SERVICE_ACCOUNT_DIR).join("token"),
            request_timeout_seconds: 10,
            retry: RetryConfig::default(),
            pdb_policy: PdbPolicy::Respect,
            // The kubelet evicts at most one pod per 10 s housekeeping pass.
            evictions_per_minute: 6,
            eviction_burst: 1,
            // The kubelet's own wait for a pod's cleanup after an eviction.
            eviction_wait_timeout_seconds: 30,
            pass_over_seconds: 30,
            // Three kubelet housekeeping periods.
            staleness_bound_seconds: 30,
            exclusions: Exclusions::default(),
            dry_run: false,
            taint: true,
            node_oom_events: NodeOomEvents::Own,
        }
    }
}

/// Whether the agent posts a node event for each kernel OOM kill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeOomEvents {
    /// Under the agent's own reason, `NodeAgentOOMKill` (never node-problem-detector's
    /// `OOMKilling`, so nothing keyed on that reason sees a kill twice).
    Own,
    /// None: node-problem-detector (or nothing) reports OOM kills on this node.
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PodSourceKind {
    /// The local kubelet's `/pods` and `/stats/summary`.
    Kubelet,
    /// A list+watch of the API server with `fieldSelector=spec.nodeName=<node>`.
    Apiserver,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PdbPolicy {
    /// A blocked eviction is reported; the caller moves on to the next candidate or retries later.
    Respect,
    /// For hard thresholds only: delete the pod and mark it Evicted, as the kubelet does.
    Override,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubeletEndpoint {
    /// Empty means `https://<node_name>:10250`.
    pub url: String,
    /// The CA that signed the kubelet's serving certificate.
    pub ca_file: Option<PathBuf>,
    /// Skip verifying the kubelet's certificate (self-signed serving certificates). Explicit only.
    pub insecure_skip_tls_verify: bool,
}

impl Default for KubeletEndpoint {
    fn default() -> Self {
        Self {
            url: String::new(),
            // Right where kubelets have serving certificates signed by the cluster CA
            // (`serverTLSBootstrap: true`).
            ca_file: Some(PathBuf::from(SERVICE_ACCOUNT_DIR).join("ca.crt")),
            insecure_skip_tls_verify: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiServerEndpoint {
    /// Empty means in-cluster: `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`.
    pub url: String,
    pub ca_file: PathBuf,
}

impl Default for ApiServerEndpoint {
    fn default() -> Self {
        Self {
            url: String::new(),
            ca_file: PathBuf::from(SERVICE_ACCOUNT_DIR).join("ca.crt"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Tries per call, the first included.
    pub attempts: u32,
    pub initial_backoff_millis: u64,
    pub max_backoff_millis: u64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            attempts: 4,
            initial_backoff_millis: 200,
            max_backoff_millis: 5_000,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("kubernetes config is not valid YAML for this section: {source}")]
    Parse {
        #[source]
        source: serde_yaml_ng::Error,
    },
    #[error("kubernetes.{field}: {problem}")]
    Invalid {
        field: &'static str,
        problem: String,
    },
}

fn invalid(field: &'static str, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field,
        problem: problem.into(),
    }
}

impl KubeConfig {
    /// Parses the section from YAML, fills the node name from `env_node_name` (the `NODE_NAME`
    /// variable) when the file leaves it empty, and validates.
    pub fn from_yaml(yaml: &str, env_node_name: Option<&str>) -> Result<Self, ConfigError> {
        let mut config: Self =
            serde_yaml_ng::from_str(yaml).map_err(|source| ConfigError::Parse { source })?;
        if config.node_name.is_empty() {
            config.node_name = env_node_name.unwrap_or_default().to_string();
        }
        config.validate()?;
        Ok(config)
    }

    /// Takes this crate's section, `kubernetes:`, out of the whole agent config file (other
    /// sections belong to other crates); an absent section means all defaults.
    pub fn from_agent_yaml(yaml: &str, env_node_name: Option<&str>) -> Result<Self, ConfigError> {
        let whole: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(yaml).map_err(|source| ConfigError::Parse { source })?;
        let section = whole
            .get("kubernetes")
            .cloned()
            .unwrap_or(serde_yaml_ng::Value::Mapping(Default::default()));
        let section =
            serde_yaml_ng::to_string(&section).map_err(|source| ConfigError::Parse { source })?;
        Self::from_yaml(&section, env_node_name)
    }

    /// Checks every field; the error names the first bad one and what was expected.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.node_name.is_empty() {
            return Err(invalid(
                "node_name",
                "empty, and NODE_NAME is not set either: set one (the DaemonSet sets NODE_NAME \
                 from spec.nodeName)",
            ));
        }
        if !is_dns_subdomain(&self.node_name) {
            return Err(invalid(
                "node_name",
                format!(
                    "{:?} is not a valid node name (DNS subdomain)",
                    self.node_name
                ),
            ));
        }
        if !self.kubelet.url.is_empty() && !self.kubelet.url.starts_with("https://") {
            return Err(invalid(
                "kubelet.url",
                format!("{:?} must start with https://", self.kubelet.url),
            ));
        }
        if !self.api_server.url.is_empty() && !self.api_server.url.starts_with("https://") {
            return Err(invalid(
                "api_server.url",
                format!("{:?} must start with https://", self.api_server.url),
            ));
        }
        if self.pod_source == PodSourceKind::Kubelet
            && self.kubelet.ca_file.is_none()
            && !self.kubelet.insecure_skip_tls_verify
        {
            return Err(invalid(
                "kubelet.ca_file",
                "unset: give the kubelet's serving CA, or set kubelet.insecure_skip_tls_verify \
                 to true explicitly",
            ));
        }
        if self.kubelet.ca_file.is_some() && self.kubelet.insecure_skip_tls_verify {
            return Err(invalid(
                "kubelet.insecure_skip_tls_verify",
                "true together with kubelet.ca_file: choose one",
            ));
        }
        if self.token_path.as_os_str().is_empty() {
            return Err(invalid("token_path", "empty"));
        }
        if !(1..=300).contains(&self.request_timeout_seconds) {
            return Err(invalid(
                "request_timeout_seconds",
                format!("{} is outside 1..=300", self.request_timeout_seconds),
            ));
        }
        if !(1..=20).contains(&self.retry.attempts) {
            return Err(invalid(
                "retry.attempts",
                format!("{} is outside 1..=20", self.retry.attempts),
            ));
        }
        if self.retry.initial_backoff_millis == 0
            || self.retry.initial_backoff_millis > self.retry.max_backoff_millis
        {
            return Err(invalid(
                "retry.initial_backoff_millis",
                format!(
                    "{} must be above 0 and at most retry.max_backoff_millis ({})",
                    self.retry.initial_backoff_millis, self.retry.max_backoff_millis
                ),
            ));
        }
        if self.evictions_per_minute == 0 {
            return Err(invalid(
                "evictions_per_minute",
                "0 would never evict; use dry_run to change nothing",
            ));
        }
        if self.eviction_burst == 0 {
            return Err(invalid("eviction_burst", "must be at least 1"));
        }
        if !(1..=600).contains(&self.eviction_wait_timeout_seconds) {
            return Err(invalid(
                "eviction_wait_timeout_seconds",
                format!("{} is outside 1..=600", self.eviction_wait_timeout_seconds),
            ));
        }
        if !(1..=3600).contains(&self.pass_over_seconds) {
            return Err(invalid(
                "pass_over_seconds",
                format!("{} is outside 1..=3600", self.pass_over_seconds),
            ));
        }
        if !(1..=3600).contains(&self.staleness_bound_seconds) {
            return Err(invalid(
                "staleness_bound_seconds",
                format!("{} is outside 1..=3600", self.staleness_bound_seconds),
            ));
        }
        if let Some(ns) = self
            .exclusions
            .namespaces
            .iter()
            .find(|ns| !is_dns_label(ns))
        {
            return Err(invalid(
                "exclusions.namespaces",
                format!("{ns:?} is not a valid namespace name"),
            ));
        }
        for r in &self.exclusions.label_selector.match_expressions {
            let needs_values = matches!(r.operator, LabelOperator::In | LabelOperator::NotIn);
            if r.key.is_empty() {
                return Err(invalid(
                    "exclusions.label_selector.match_expressions",
                    "a requirement has an empty key",
                ));
            }
            if needs_values == r.values.is_empty() {
                return Err(invalid(
                    "exclusions.label_selector.match_expressions",
                    format!(
                        "key {:?}: operator {:?} {} values",
                        r.key,
                        r.operator,
                        if needs_values { "needs" } else { "takes no" }
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The kubelet's base URL: the configured one, else `https://<node_name>:10250`.
    pub fn kubelet_url(&self) -> String {
        if self.kubelet.url.is_empty() {
            format!("https://{}:10250", self.node_name)
        } else {
            self.kubelet.url.clone()
        }
    }

    /// How to reach the kubelet.
    pub fn kubelet_endpoint(&self) -> crate::transport::Endpoint {
        crate::transport::Endpoint {
            name: "kubelet",
            url: self.kubelet_url(),
            ca_file: self.kubelet.ca_file.clone(),
            insecure_skip_tls_verify: self.kubelet.insecure_skip_tls_verify,
            token_path: Some(self.token_path.clone()),
            timeout: self.request_timeout(),
        }
    }

    /// How to reach the API server: the configured URL, else the in-cluster service from
    /// `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT` (passed in by the caller).
    pub fn api_server_endpoint(
        &self,
        service_host: Option<&str>,
        service_port: Option<&str>,
    ) -> Result<crate::transport::Endpoint, ConfigError> {
        let url = if !self.api_server.url.is_empty() {
            self.api_server.url.clone()
        } else {
            match (service_host, service_port) {
                (Some(h), Some(p)) if !h.is_empty() && !p.is_empty() => {
                    // An IPv6 service address needs brackets in a URL.
                    if h.contains(':') {
                        format!("https://[{h}]:{p}")
                    } else {
                        format!("https://{h}:{p}")
                    }
                }
                _ => {
                    return Err(invalid(
                        "api_server.url",
                        "empty, and KUBERNETES_SERVICE_HOST/PORT are not set (not in a pod?)",
                    ))
                }
            }
        };
        Ok(crate::transport::Endpoint {
            name: "api server",
            url,
            ca_file: Some(self.api_server.ca_file.clone()),
            insecure_skip_tls_verify: false,
            token_path: Some(self.token_path.clone()),
            timeout: self.request_timeout(),
        })
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout_seconds)
    }

    pub fn eviction_wait_timeout(&self) -> Duration {
        Duration::from_secs(self.eviction_wait_timeout_seconds)
    }

    pub fn pass_over(&self) -> Duration {
        Duration::from_secs(self.pass_over_seconds)
    }

    pub fn staleness_bound(&self) -> Duration {
        Duration::from_secs(self.staleness_bound_seconds)
    }
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_section_takes_defaults_and_node_name_from_env() {
        let c = KubeConfig::from_yaml("{}", Some("node-a")).unwrap();
        assert_eq!(c.node_name, "node-a");
        assert_eq!(c.pod_source, PodSourceKind::Kubelet);
        assert_eq!(c.pdb_policy, PdbPolicy::Respect);
        assert_eq!(c.kubelet_url(), "https://node-a:10250");
        assert!(!c.dry_run);
        assert!(c.taint, "the pressure taint is on by default");
        assert_eq!(c.node_oom_events, NodeOomEvents::Own);
    }

    #[test]
    fn invalid_values_name_their_field() {
        let rows: &[(&str, &str)] = &[
            ("{}", "kubernetes.node_name"),
            ("node_name: Node_A", "kubernetes.node_name"),
            ("node_name: n\nkubelet: {url: 'http://n:10250'}", "kubernetes.kubelet.url"),
            ("node_name: n\nkubelet: {ca_file: null}", "kubernetes.kubelet.ca_file"),
            ("node_name: n\nkubelet: {insecure_skip_tls_verify: true}", "kubernetes.kubelet.insecure_skip_tls_verify"),
            ("node_name: n\nretry: {attempts: 0}", "kubernetes.retry.attempts"),
            ("node_name: n\nevictions_per_minute: 0", "kubernetes.evictions_per_minute"),
            ("node_name: n\nstaleness_bound_seconds: 0", "kubernetes.staleness_bound_seconds"),
            ("node_name: n\nexclusions: {namespaces: ['Kube System']}", "kubernetes.exclusions.namespaces"),
            ("node_name: n\nexclusions: {label_selector: {match_expressions: [{key: a, operator: In}]}}", "kubernetes.exclusions.label_selector.match_expressions"),
        ];
        for (yaml, field) in rows {
            let err = KubeConfig::from_yaml(yaml, None).unwrap_err().to_string();
            assert!(err.starts_with(field), "{yaml:?}: {err}");
        }
    }

    #[test]
    fn api_server_url_from_the_service_environment() {
        let c = KubeConfig::from_yaml("{}", Some("n")).unwrap();
        let rows = [
            (
                Some("10.96.0.1"),
                Some("443"),
                Some("https://10.96.0.1:443"),
            ),
            (Some("fd00::1"), Some("443"), Some("https://[fd00::1]:443")),
            (None, Some("443"), None),
        ];
        for (host, port, want) in rows {
            let got = c.api_server_endpoint(host, port).ok().map(|e| e.url);
            assert_eq!(got.as_deref(), want, "{host:?}");
        }
    }

    #[test]
    fn unknown_fields_and_bad_enums_are_parse_errors() {
        for yaml in [
            "node_name: n\ndryrun: true",
            "node_name: n\npdb_policy: ignore",
            "node_name: n\ntaint: maybe",
            "node_name: n\nnode_oom_events: OOMKilling",
        ] {
            let result = KubeConfig::from_yaml(yaml, None);
            assert!(matches!(result, Err(ConfigError::Parse { .. })), "{yaml}");
            let field = yaml.lines().nth(1).unwrap().split(':').next().unwrap();
            let err = result.unwrap_err().to_string();
            assert!(
                err.contains(field),
                "{yaml:?}: the error names {field}: {err}"
            );
        }
    }
}
