//! This crate's section of the agent config (`kubernetes:`), its defaults and its validation.
//!
//! Every field has a default that works inside a pod started by the DaemonSet in `deploy/`; the
//! one value that cannot have a default, the node name, comes from the `NODE_NAME` environment
//! variable (the downward API) when the file leaves it out. Keys are camelCase as in Kubernetes
//! component configs, durations are Go durations ([`GoDuration`]). Each endpoint validates
//! itself, so a new way to reach the kubelet or the API server is one more field there.

use std::{path::PathBuf, time::Duration};

use node_agent_policy::GoDuration;
pub use node_agent_policy::{Exclusions, LabelOperator, LabelRequirement, LabelSelector};
use serde::{Deserialize, Serialize};

pub use crate::kubelet::address::NodeAddressType;

/// Where the service account's files are mounted in every pod.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Where kubeadm and kind leave a kubelet's self-signed serving certificate (its certificate,
/// then the CA that signed it), below the kubelet's root the DaemonSet mounts.
pub const KUBELET_SELF_SIGNED_CERT: &str = "/var/lib/kubelet/pki/kubelet.crt";

/// The `kubernetes:` section of the agent config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct KubeConfig {
    /// Where the pods bound to this node are read from.
    pub pod_source: PodSourceKind,
    /// The node this agent runs on; empty means "take `NODE_NAME` from the environment".
    pub node_name: String,
    /// How often the pod list and stats are refreshed from Kubernetes.
    pub pod_refresh_interval: GoDuration,
    pub kubelet: KubeletEndpoint,
    pub api_server: ApiServerEndpoint,
    /// The service account token, re-read from disk before each request so rotated tokens work.
    pub token_path: PathBuf,
    /// One HTTP request (connect, send, read the whole answer) may take this long.
    pub request_timeout: GoDuration,
    pub retry: RetryConfig,
    /// How a hard memory or PID threshold's eviction is carried out.
    pub hard_eviction: HardEviction,
    /// What to do when a PodDisruptionBudget blocks an eviction (HTTP 429).
    pub pdb_policy: PdbPolicy,
    /// Token bucket: evictions allowed per minute, and how many may go at once.
    pub evictions_per_minute: u32,
    pub eviction_burst: u32,
    /// After an eviction, wait at most this long for the pod's cgroup to disappear.
    pub eviction_wait_timeout: GoDuration,
    /// A pod whose eviction a PodDisruptionBudget blocked, or the API server refused, is passed
    /// over for this long (or as long as the server's Retry-After, if longer); the next-ranked
    /// pod goes meanwhile.
    pub pass_over: GoDuration,
    /// Pod and usage data older than this is not acted upon.
    pub staleness_bound: GoDuration,
    pub exclusions: Exclusions,
    /// Keep a `NoSchedule` taint (`node-agent.io/pressure`) on the node while the agent
    /// reports pressure, so no new pod is scheduled onto it. Off: never added, and one left
    /// from before is removed.
    pub taint: bool,
    /// The node event for a kernel OOM kill.
    #[serde(rename = "nodeOOMEvents")]
    pub node_oom_events: NodeOomEvents,
}

impl Default for KubeConfig {
    fn default() -> Self {
        Self {
            pod_source: PodSourceKind::Kubelet,
            node_name: String::new(),
            pod_refresh_interval: GoDuration::from_secs(2),
            kubelet: KubeletEndpoint::default(),
            api_server: ApiServerEndpoint::default(),
            token_path: PathBuf::from(SERVICE_ACCOUNT_DIR).join("token"),
            request_timeout: GoDuration::from_secs(10),
            retry: RetryConfig::default(),
            hard_eviction: HardEviction::Node,
            pdb_policy: PdbPolicy::Respect,
            // The kubelet evicts at most one pod per 10 s housekeeping pass.
            evictions_per_minute: 6,
            eviction_burst: 1,
            // The kubelet's own wait for a pod's cleanup after an eviction.
            eviction_wait_timeout: GoDuration::from_secs(30),
            pass_over: GoDuration::from_secs(30),
            // Three kubelet housekeeping periods.
            staleness_bound: GoDuration::from_secs(30),
            exclusions: Exclusions::default(),
            taint: true,
            node_oom_events: NodeOomEvents::Own,
        }
    }
}

/// Whether the agent posts a node event for each kernel OOM kill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeOomEvents {
    /// Under the agent's own reason, `NodeAgentOOMKill` (never node-problem-detector's
    /// `OOMKilling`, so nothing keyed on that reason sees a kill twice).
    Own,
    /// None: node-problem-detector (or nothing) reports OOM kills on this node.
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PodSourceKind {
    /// The local kubelet's `/pods` and `/stats/summary`, reached as `kubelet:` says.
    Kubelet,
    /// A list+watch of the API server with `fieldSelector=spec.nodeName=<node>` (no usage).
    Apiserver,
    /// The kubelet's `/pods` and `/stats/summary` through the API server's node proxy
    /// (`/api/v1/nodes/<node>/proxy/...`, RBAC `nodes/proxy get`): no kubelet certificate
    /// involved.
    #[serde(rename = "nodeProxy")]
    NodeProxy,
}

/// How a hard memory or PID threshold's eviction is carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HardEviction {
    /// On the node, as the kubelet evicts for a hard threshold: the pod's processes killed at
    /// once and their memory given back, then its record (`Failed`, `Evicted`) written through
    /// the API. Needs the host's PID namespace and `CAP_KILL`; without them, through the API.
    Node,
    /// A policy/v1 Eviction through the API with a 1 s grace period (PodDisruptionBudgets as
    /// `pdbPolicy` says).
    Api,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PdbPolicy {
    /// A blocked eviction is reported; the caller moves on to the next candidate or retries later.
    Respect,
    /// For hard thresholds only: delete the pod and mark it Evicted, as the kubelet does.
    Override,
}

/// How the kubelet is reached (`podSource: kubelet`; see `crate::kubelet`): where, and what
/// its serving certificate is checked against.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct KubeletEndpoint {
    /// A fixed `https://host:port`. Empty: the agent's Node's `status.addresses`, the first of
    /// `preferredAddressTypes`, at its `status.daemonEndpoints.kubeletEndpoint.Port`.
    pub url: String,
    /// The order in which the Node's address types are tried (as metrics-server's
    /// `--kubelet-preferred-address-types`).
    pub preferred_address_types: Vec<NodeAddressType>,
    /// A PEM file the kubelet's serving certificate may chain to. The default is where kubeadm
    /// and kind leave the kubelet's self-signed certificate; while `clusterCA` is true, a file
    /// that does not exist is passed over (and said so).
    pub ca_file: Option<PathBuf>,
    /// The cluster CA (`apiServer.caFile`) is trusted too: kubelets whose serving certificates
    /// the cluster signs (`serverTLSBootstrap`, k3s, EKS).
    #[serde(rename = "clusterCA")]
    pub cluster_ca: bool,
    /// Do not check the kubelet's certificate at all. Explicit only: with `caFile: null` and
    /// `clusterCA: false`, and logged at start.
    #[serde(rename = "insecureSkipTLSVerify")]
    pub insecure_skip_tls_verify: bool,
}

impl Default for KubeletEndpoint {
    fn default() -> Self {
        Self {
            url: String::new(),
            preferred_address_types: NodeAddressType::DEFAULT_ORDER.to_vec(),
            ca_file: Some(PathBuf::from(KUBELET_SELF_SIGNED_CERT)),
            cluster_ca: true,
            insecure_skip_tls_verify: false,
        }
    }
}

impl KubeletEndpoint {
    /// `uses_it`: the pod source reads from the kubelet, so its certificate must be checkable.
    fn validate(&self, uses_it: bool) -> Result<(), ConfigError> {
        if !self.url.is_empty() && !self.url.starts_with("https://") {
            return Err(invalid(
                "kubelet.url",
                format!("{:?} must start with https://", self.url),
            ));
        }
        if self.preferred_address_types.is_empty() {
            return Err(invalid(
                "kubelet.preferredAddressTypes",
                "empty: name the Node address types to try, in order (InternalIP, Hostname, \
                 InternalDNS, ExternalDNS, ExternalIP)",
            ));
        }
        for (i, t) in self.preferred_address_types.iter().enumerate() {
            if self.preferred_address_types[..i].contains(t) {
                return Err(invalid(
                    "kubelet.preferredAddressTypes",
                    format!("{t} is listed twice"),
                ));
            }
        }
        if self
            .ca_file
            .as_ref()
            .is_some_and(|p| p.as_os_str().is_empty())
        {
            return Err(invalid(
                "kubelet.caFile",
                "empty: give a path, or null for none",
            ));
        }
        if self.insecure_skip_tls_verify && (self.ca_file.is_some() || self.cluster_ca) {
            return Err(invalid(
                "kubelet.insecureSkipTLSVerify",
                "true while kubelet.caFile or kubelet.clusterCA would check the certificate: \
                 to skip the check, set caFile: null and clusterCA: false as well (explicitly)",
            ));
        }
        if uses_it && self.ca_file.is_none() && !self.cluster_ca && !self.insecure_skip_tls_verify {
            return Err(invalid(
                "kubelet.caFile",
                "null and kubelet.clusterCA false: nothing to check the kubelet's certificate \
                 against; give its CA, set clusterCA: true, or set insecureSkipTLSVerify: true \
                 explicitly",
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
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

impl ApiServerEndpoint {
    fn validate(&self) -> Result<(), ConfigError> {
        if !self.url.is_empty() && !self.url.starts_with("https://") {
            return Err(invalid(
                "apiServer.url",
                format!("{:?} must start with https://", self.url),
            ));
        }
        if self.ca_file.as_os_str().is_empty() {
            return Err(invalid("apiServer.caFile", "empty"));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Tries per call, the first included.
    pub attempts: u32,
    pub initial_backoff: GoDuration,
    pub max_backoff: GoDuration,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            attempts: 4,
            initial_backoff: GoDuration::from_millis(200),
            max_backoff: GoDuration::from_secs(5),
        }
    }
}

impl RetryConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=20).contains(&self.attempts) {
            return Err(invalid(
                "retry.attempts",
                format!("{} is outside 1..=20", self.attempts),
            ));
        }
        if self.initial_backoff.is_zero() || self.initial_backoff > self.max_backoff {
            return Err(invalid(
                "retry.initialBackoff",
                format!(
                    "{} must be above 0s and at most retry.maxBackoff ({})",
                    self.initial_backoff, self.max_backoff
                ),
            ));
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The section does not read as this type: the path and what was expected there.
    #[error("kubernetes.{path}: {message}")]
    Parse { path: String, message: String },
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

/// `value` within `range`, said as Go durations when it is not.
fn within(
    field: &'static str,
    value: GoDuration,
    range: std::ops::RangeInclusive<GoDuration>,
) -> Result<(), ConfigError> {
    if range.contains(&value) {
        return Ok(());
    }
    Err(invalid(
        field,
        format!("{value} is outside {} to {}", range.start(), range.end()),
    ))
}

impl KubeConfig {
    /// Parses the section alone from YAML, then as [`KubeConfig::resolve`].
    pub fn from_yaml(yaml: &str, env_node_name: Option<&str>) -> Result<Self, ConfigError> {
        let value: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(yaml).map_err(|e| ConfigError::Parse {
                path: String::new(),
                message: e.to_string(),
            })?;
        let config: Self =
            serde_path_to_error::deserialize(value).map_err(|e| ConfigError::Parse {
                path: e.path().to_string(),
                message: e.inner().to_string(),
            })?;
        config.resolve(env_node_name)
    }

    /// Fills the node name from `env_node_name` (the `NODE_NAME` variable) when the file
    /// leaves it empty, and validates.
    pub fn resolve(mut self, env_node_name: Option<&str>) -> Result<Self, ConfigError> {
        if self.node_name.is_empty() {
            self.node_name = env_node_name.unwrap_or_default().to_string();
        }
        self.validate()?;
        Ok(self)
    }

    /// Checks every field; the error names the first bad one and what was expected.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.node_name.is_empty() {
            return Err(invalid(
                "nodeName",
                "empty, and NODE_NAME is not set either: set one (the DaemonSet sets NODE_NAME \
                 from spec.nodeName)",
            ));
        }
        if !is_dns_subdomain(&self.node_name) {
            return Err(invalid(
                "nodeName",
                format!(
                    "{:?} is not a valid node name (DNS subdomain)",
                    self.node_name
                ),
            ));
        }
        within(
            "podRefreshInterval",
            self.pod_refresh_interval,
            GoDuration::from_millis(100)..=GoDuration::from_secs(3600),
        )?;
        self.kubelet
            .validate(self.pod_source == PodSourceKind::Kubelet)?;
        self.api_server.validate()?;
        if self.token_path.as_os_str().is_empty() {
            return Err(invalid("tokenPath", "empty"));
        }
        within(
            "requestTimeout",
            self.request_timeout,
            GoDuration::from_secs(1)..=GoDuration::from_secs(300),
        )?;
        self.retry.validate()?;
        if self.evictions_per_minute == 0 {
            return Err(invalid(
                "evictionsPerMinute",
                "0 would never evict; use dryRun to change nothing",
            ));
        }
        if self.eviction_burst == 0 {
            return Err(invalid("evictionBurst", "must be at least 1"));
        }
        within(
            "evictionWaitTimeout",
            self.eviction_wait_timeout,
            GoDuration::from_secs(1)..=GoDuration::from_secs(600),
        )?;
        within(
            "passOver",
            self.pass_over,
            GoDuration::from_secs(1)..=GoDuration::from_secs(3600),
        )?;
        within(
            "stalenessBound",
            self.staleness_bound,
            GoDuration::from_secs(1)..=GoDuration::from_secs(3600),
        )?;
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
                    "exclusions.labelSelector.matchExpressions",
                    "a requirement has an empty key",
                ));
            }
            if needs_values == r.values.is_empty() {
                return Err(invalid(
                    "exclusions.labelSelector.matchExpressions",
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

    /// How often the pod list and stats are refreshed.
    pub fn pod_refresh_interval(&self) -> Duration {
        self.pod_refresh_interval.get()
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
                        "apiServer.url",
                        "empty, and KUBERNETES_SERVICE_HOST/PORT are not set (not in a pod?)",
                    ))
                }
            }
        };
        Ok(crate::transport::Endpoint {
            name: "api server",
            url,
            tls: crate::transport::Tls::ca(self.api_server.ca_file.clone()),
            token_path: Some(self.token_path.clone()),
            timeout: self.request_timeout(),
        })
    }

    pub fn request_timeout(&self) -> Duration {
        self.request_timeout.get()
    }

    pub fn eviction_wait_timeout(&self) -> Duration {
        self.eviction_wait_timeout.get()
    }

    pub fn pass_over(&self) -> Duration {
        self.pass_over.get()
    }

    pub fn staleness_bound(&self) -> Duration {
        self.staleness_bound.get()
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
        assert_eq!(c.hard_eviction, HardEviction::Node);
        assert!(
            c.kubelet.url.is_empty(),
            "the kubelet is found from the Node"
        );
        assert_eq!(
            c.kubelet.preferred_address_types,
            NodeAddressType::DEFAULT_ORDER
        );
        assert_eq!(
            (c.kubelet.ca_file.as_deref(), c.kubelet.cluster_ca),
            (Some(std::path::Path::new(KUBELET_SELF_SIGNED_CERT)), true)
        );
        assert!(c.taint, "the pressure taint is on by default");
        assert_eq!(c.node_oom_events, NodeOomEvents::Own);
        assert_eq!(c.request_timeout(), Duration::from_secs(10));
        assert_eq!(c.pod_refresh_interval(), Duration::from_secs(2));
        assert_eq!(
            (c.retry.initial_backoff.get(), c.retry.max_backoff.get()),
            (Duration::from_millis(200), Duration::from_secs(5))
        );
    }

    #[test]
    fn invalid_values_name_their_field() {
        #[rustfmt::skip]
        let rows: &[(&str, &str)] = &[
            ("{}", "kubernetes.nodeName: empty"),
            ("nodeName: Node_A", "kubernetes.nodeName: \"Node_A\" is not a valid node name"),
            ("nodeName: n\nkubelet: {url: 'http://n:10250'}", "kubernetes.kubelet.url"),
            ("nodeName: n\nkubelet: {caFile: null, clusterCA: false}", "kubernetes.kubelet.caFile: null and kubelet.clusterCA false"),
            ("nodeName: n\nkubelet: {caFile: ''}", "kubernetes.kubelet.caFile: empty"),
            ("nodeName: n\nkubelet: {insecureSkipTLSVerify: true}", "kubernetes.kubelet.insecureSkipTLSVerify: true while"),
            ("nodeName: n\nkubelet: {insecureSkipTLSVerify: true, caFile: null}", "kubernetes.kubelet.insecureSkipTLSVerify: true while"),
            ("nodeName: n\nkubelet: {insecureSkipTLSVerify: true, clusterCA: false}", "kubernetes.kubelet.insecureSkipTLSVerify: true while"),
            ("nodeName: n\nkubelet: {preferredAddressTypes: []}", "kubernetes.kubelet.preferredAddressTypes: empty"),
            ("nodeName: n\nkubelet: {preferredAddressTypes: [InternalIP, Hostname, InternalIP]}", "kubernetes.kubelet.preferredAddressTypes: InternalIP is listed twice"),
            ("nodeName: n\napiServer: {url: 'http://10.0.0.1'}", "kubernetes.apiServer.url"),
            ("nodeName: n\nretry: {attempts: 0}", "kubernetes.retry.attempts"),
            ("nodeName: n\nretry: {initialBackoff: 10s, maxBackoff: 1s}", "kubernetes.retry.initialBackoff: 10s must be above 0s and at most retry.maxBackoff (1s)"),
            ("nodeName: n\nevictionsPerMinute: 0", "kubernetes.evictionsPerMinute"),
            ("nodeName: n\nstalenessBound: 0s", "kubernetes.stalenessBound: 0s is outside 1s to 1h0m0s"),
            ("nodeName: n\nrequestTimeout: 10m", "kubernetes.requestTimeout: 10m0s is outside 1s to 5m0s"),
            ("nodeName: n\npodRefreshInterval: 1ms", "kubernetes.podRefreshInterval: 1ms is outside 100ms to 1h0m0s"),
            ("nodeName: n\nexclusions: {namespaces: ['Kube System']}", "kubernetes.exclusions.namespaces"),
            ("nodeName: n\nexclusions: {labelSelector: {matchExpressions: [{key: a, operator: In}]}}", "kubernetes.exclusions.labelSelector.matchExpressions"),
        ];
        for (yaml, want) in rows {
            let err = KubeConfig::from_yaml(yaml, None).unwrap_err().to_string();
            assert!(err.starts_with(want), "{yaml:?}: {err}");
        }
    }

    #[test]
    fn each_way_to_the_kubelet_validates() {
        #[rustfmt::skip]
        let rows: &[(&str, &str, PodSourceKind)] = &[
            ("the default: the Node's InternalIP, kubelet.crt or the cluster CA", "{}", PodSourceKind::Kubelet),
            ("another order", "kubelet: {preferredAddressTypes: [Hostname, InternalIP]}", PodSourceKind::Kubelet),
            ("a fixed URL and one CA", "kubelet: {url: 'https://127.0.0.1:10250', caFile: /etc/kubelet-ca.crt, clusterCA: false}", PodSourceKind::Kubelet),
            ("the cluster CA only", "kubelet: {caFile: null}", PodSourceKind::Kubelet),
            ("explicitly unchecked", "kubelet: {insecureSkipTLSVerify: true, caFile: null, clusterCA: false}", PodSourceKind::Kubelet),
            ("the node proxy needs no kubelet trust", "podSource: nodeProxy\nkubelet: {caFile: null, clusterCA: false}", PodSourceKind::NodeProxy),
            ("the API server's watch", "podSource: apiserver", PodSourceKind::Apiserver),
        ];
        for (what, yaml, source) in rows {
            let c =
                KubeConfig::from_yaml(yaml, Some("n")).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(c.pod_source, *source, "{what}");
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
    fn unknown_fields_and_bad_values_are_parse_errors_with_their_path() {
        #[rustfmt::skip]
        let rows: &[(&str, &str)] = &[
            ("nodeName: n\ndryrun: true", "kubernetes.dryrun: unknown field `dryrun`"),
            ("nodeName: n\npdbPolicy: ignore", "kubernetes.pdbPolicy: unknown variant `ignore`, expected `respect` or `override`"),
            ("nodeName: n\nhardEviction: kill", "kubernetes.hardEviction: unknown variant `kill`, expected `node` or `api`"),
            ("nodeName: n\ntaint: maybe", "kubernetes.taint: invalid type: string \"maybe\", expected a boolean"),
            ("nodeName: n\nnodeOOMEvents: OOMKilling", "kubernetes.nodeOOMEvents: unknown variant `OOMKilling`, expected `own` or `off`"),
            ("nodeName: n\nrequestTimeout: 10", "kubernetes.requestTimeout: 10 has no unit; expected a Go duration such as 10s or 10ms"),
            ("nodeName: n\nretry: {maxBackof: 1s}", "kubernetes.retry.maxBackof: unknown field `maxBackof`, expected one of `attempts`, `initialBackoff`, `maxBackoff`"),
            ("nodeName: n\nkubelet: {insecureSkipTlsVerify: true}", "kubernetes.kubelet.insecureSkipTlsVerify: unknown field"),
            ("nodeName: n\nkubelet: {clusterCa: true}", "kubernetes.kubelet.clusterCa: unknown field"),
            ("nodeName: n\nkubelet: {preferredAddressTypes: [InternalIp]}", "kubernetes.kubelet.preferredAddressTypes[0]: unknown variant `InternalIp`, expected one of `Hostname`, `InternalIP`"),
            ("nodeName: n\nkubelet: {preferredAddressTypes: InternalIP}", "kubernetes.kubelet.preferredAddressTypes: invalid type: string \"InternalIP\", expected a sequence"),
            ("nodeName: n\npodSource: node-proxy", "kubernetes.podSource: unknown variant `node-proxy`, expected one of `kubelet`, `apiserver`, `nodeProxy`"),
        ];
        for (yaml, want) in rows {
            let result = KubeConfig::from_yaml(yaml, None);
            assert!(
                matches!(result, Err(ConfigError::Parse { .. })),
                "{yaml}: {result:?}"
            );
            let err = result.unwrap_err().to_string();
            assert!(err.starts_with(want), "{yaml:?}: {err}");
        }
    }

    #[test]
    fn the_section_prints_as_it_reads() {
        let c = KubeConfig::from_yaml("{}", Some("node-a")).unwrap();
        let printed = serde_yaml_ng::to_string(&c).unwrap();
        for line in [
            "podSource: kubelet",
            "nodeName: node-a",
            "podRefreshInterval: 2s",
            "requestTimeout: 10s",
            "  initialBackoff: 200ms",
            "  insecureSkipTLSVerify: false",
            "  clusterCA: true",
            "  - InternalIP",
            "evictionWaitTimeout: 30s",
            "nodeOOMEvents: own",
            "  labelSelector:",
        ] {
            assert!(printed.lines().any(|l| l == line), "{line:?} in\n{printed}");
        }
        assert_eq!(KubeConfig::from_yaml(&printed, None).unwrap(), c);
    }
}
