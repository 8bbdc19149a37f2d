//! How the kubelet is reached, and the pod source that reads it there (`podSource: kubelet`)
//! or through the API server's node proxy (`podSource: nodeProxy`).
//!
//! - **Where.** The agent's own Node names its kubelet's addresses (`status.addresses`) and
//!   port (`status.daemonEndpoints.kubeletEndpoint.Port`): the first address of
//!   `kubelet.preferredAddressTypes` is dialled ([`address`]), `InternalIP` first by default.
//!   A fixed `kubelet.url` replaces that.
//! - **Trusted.** The kubelet's serving certificate must chain to `kubelet.caFile` (where
//!   kubeadm and kind leave a kubelet's self-signed certificate, `kubelet.crt`: that
//!   certificate and the CA that signed it) or to the cluster CA (`kubelet.clusterCA`: kubelets
//!   with `serverTLSBootstrap`, k3s, EKS), and name the address dialled or, failing that, one of
//!   the Node's `Hostname` addresses: a self-signed kubelet certificate names the kubelet's
//!   hostname only. A `kubelet.caFile` that does not exist is passed over (and said so) while the
//!   cluster CA is trusted too, so one config serves both kinds of kubelet. Not checking at all
//!   takes `kubelet.insecureSkipTLSVerify: true`, said explicitly.
//! - **Worked out again** after a failed read (at most every [`Timing::after_failure`]) and
//!   every [`Timing::every`], never per request: a changed address, a renewed certificate or CA
//!   file is picked up without a restart. While the Node cannot be read again, the kubelet is
//!   read where it was found.
//! - **The node proxy** (`/api/v1/nodes/<node>/proxy/pods`, `/stats/summary`): the API server
//!   reaches the kubelet for the agent (RBAC `nodes/proxy get`), so no kubelet certificate is
//!   involved at all; it answers exactly what the kubelet would.
//!
//! Whichever way, the kubelet must say it is this node's: `/stats/summary` names its node,
//! and an answer for another node is refused (an address the Node no longer owns).

pub mod address;

use std::{
    fmt,
    io::ErrorKind,
    path::PathBuf,
    time::{Duration, Instant},
};

use http::StatusCode;

pub use address::{AddressError, Chosen, NodeAddressType};

use crate::{
    api::{call, decode, node_path, ApiError, Context},
    config::KubeConfig,
    pods::{kubelet::KubeletClient, PodSnapshot},
    transport::{ApiRequest, Endpoint, Tls, Transport, TransportError},
};

/// When the kubelet's address and trust are worked out again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// After a failed read, at most this often (a wrong CA: one Node read per period, not one
    /// per refresh).
    pub after_failure: Duration,
    /// While reads succeed.
    pub every: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            after_failure: Duration::from_secs(10),
            every: Duration::from_secs(300),
        }
    }
}

/// What the kubelet's certificate is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    /// `kubelet.caFile` and, with `kubelet.clusterCA`, the API server's CA file.
    Verify {
        ca_file: Option<PathBuf>,
        cluster_ca: Option<PathBuf>,
    },
    /// `kubelet.insecureSkipTLSVerify: true`.
    Insecure,
}

impl Trust {
    /// The kubelet section's trust; the cluster CA is the API server's.
    pub fn of(config: &KubeConfig) -> Self {
        let k = &config.kubelet;
        if k.insecure_skip_tls_verify {
            return Self::Insecure;
        }
        Self::Verify {
            ca_file: k.ca_file.clone(),
            cluster_ca: k.cluster_ca.then(|| config.api_server.ca_file.clone()),
        }
    }

    /// The TLS check for a kubelet that may also be named `also_named`; a `caFile` passed
    /// over is noted in `notes`.
    fn tls(&self, also_named: Vec<String>, notes: &mut Vec<String>) -> Tls {
        let Self::Verify {
            ca_file,
            cluster_ca,
        } = self
        else {
            return Tls::Insecure;
        };
        let mut ca_files = Vec::new();
        if let Some(path) = ca_file {
            match std::fs::metadata(path) {
                Err(e) if e.kind() == ErrorKind::NotFound && cluster_ca.is_some() => {
                    notes.push(format!(
                        "kubelet.caFile {} does not exist: not trusted",
                        path.display()
                    ))
                }
                // Any other problem is the transport's to name when it reads the file.
                _ => ca_files.push(path.clone()),
            }
        }
        ca_files.extend(cluster_ca.iter().cloned());
        Tls::Verify {
            ca_files,
            also_named,
        }
    }
}

/// Where the kubelet was found and how its certificate is checked, as the log and `/readyz`
/// say it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub url: String,
    /// Where the URL came from: `the InternalIP of node n1`, `kubelet.url`, the node proxy.
    pub from: String,
    /// How its certificate is checked; None through the node proxy (the API server's
    /// connection, checked as every request of the agent's).
    pub tls: Option<Tls>,
    /// What else the agent should say: a CA file passed over, Node entries left aside, no
    /// port published.
    pub notes: Vec<String>,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}, {}", self.url, self.from)?;
        match &self.tls {
            None => {}
            Some(Tls::Insecure) => {
                f.write_str("; its certificate NOT checked (kubelet.insecureSkipTLSVerify: true)")?
            }
            Some(Tls::Verify {
                ca_files,
                also_named,
            }) => {
                let files: Vec<String> = ca_files.iter().map(|p| p.display().to_string()).collect();
                let host = self
                    .url
                    .trim_start_matches("https://")
                    .rsplit_once(':')
                    .map_or(self.url.as_str(), |(h, _)| h)
                    .trim_matches(|c| c == '[' || c == ']');
                let names: Vec<&str> = std::iter::once(host)
                    .chain(also_named.iter().map(String::as_str))
                    .collect();
                write!(
                    f,
                    "; its certificate must chain to {} and name {}",
                    files.join(" or "),
                    names.join(" or ")
                )?;
            }
        }
        for note in &self.notes {
            write!(f, "; {note}")?;
        }
        Ok(())
    }
}

/// Why the kubelet could not be worked out.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("reading node {node} for the kubelet's address: {error}")]
    Node { node: String, error: ApiError },
    #[error(transparent)]
    Address(#[from] AddressError),
    #[error("{}", chain(.0))]
    Transport(#[from] TransportError),
}

/// Why the pod source delivered nothing.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    /// The kubelet could not be worked out, and was never found before.
    #[error("cannot find the kubelet: {0}")]
    Resolve(String),
    #[error("{error} (kubelet at {target})")]
    Read { target: String, error: ApiError },
}

/// An error and its sources, as one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let more = s.to_string();
        if !text.contains(&more) {
            text += ": ";
            text += &more;
        }
        cur = s.source();
    }
    text
}

enum How {
    /// The Node's addresses, read through the API server (`api`).
    Node {
        api: Box<Context>,
        preferred: Vec<NodeAddressType>,
    },
    /// `kubelet.url`.
    Url(String),
    /// Through the API server: found once, at the start.
    NodeProxy,
}

struct Current {
    client: KubeletClient,
    target: Target,
}

/// The pod source over the kubelet: pods and usage as [`KubeletClient::snapshot`] reads them,
/// from wherever the kubelet was last found.
pub struct KubeletSource {
    how: How,
    trust: Trust,
    /// What every kubelet client shares (its transport replaced): retries, counters, node.
    base: Context,
    token_path: Option<PathBuf>,
    timeout: Duration,
    timing: Timing,
    current: Option<Current>,
    /// When the kubelet was last worked out, successfully or not.
    resolved_at: Option<Instant>,
    /// Why the last attempt to work it out failed, until one succeeds.
    resolve_error: Option<String>,
    /// Whether the last read failed.
    failing: bool,
}

impl KubeletSource {
    /// `podSource: kubelet` as `config` says; `api` reaches the API server (the Node is read
    /// through it).
    pub fn kubelet(config: &KubeConfig, api: &Context) -> Self {
        let how = if config.kubelet.url.is_empty() {
            How::Node {
                api: Box::new(api.clone()),
                preferred: config.kubelet.preferred_address_types.clone(),
            }
        } else {
            How::Url(config.kubelet.url.clone())
        };
        Self {
            how,
            trust: Trust::of(config),
            base: api.clone(),
            token_path: Some(config.token_path.clone()),
            timeout: config.request_timeout(),
            timing: Timing::default(),
            current: None,
            resolved_at: None,
            resolve_error: None,
            failing: false,
        }
    }

    /// `podSource: nodeProxy`: `proxy` reaches the API server (give it a transport of its own,
    /// so that what the node proxy answers does not speak for the API server connection).
    pub fn node_proxy(proxy: Context) -> Self {
        let target = Target {
            url: format!(
                "{}{}",
                proxy.transport.endpoint().url,
                KubeletClient::node_proxy_prefix(&proxy.node)
            ),
            from: "the API server's node proxy".into(),
            tls: None,
            notes: Vec::new(),
        };
        Self {
            how: How::NodeProxy,
            trust: Trust::Verify {
                ca_file: None,
                cluster_ca: None,
            },
            token_path: None,
            timeout: Duration::ZERO,
            timing: Timing::default(),
            current: Some(Current {
                client: KubeletClient::through_node_proxy(proxy.clone()),
                target,
            }),
            base: proxy,
            resolved_at: Some(Instant::now()),
            resolve_error: None,
            failing: false,
        }
    }

    pub fn with_timing(mut self, timing: Timing) -> Self {
        self.timing = timing;
        self
    }

    /// Where the kubelet was last found, if it was.
    pub fn target(&self) -> Option<&Target> {
        self.current.as_ref().map(|c| &c.target)
    }

    /// Pods and usage, read where the kubelet is (worked out again first when that is due).
    pub async fn snapshot(&mut self) -> Result<PodSnapshot, KubeletError> {
        if self.due(Instant::now()) {
            self.resolve().await;
        }
        let Some(current) = &self.current else {
            return Err(KubeletError::Resolve(
                self.resolve_error.clone().unwrap_or_default(),
            ));
        };
        match current.client.snapshot().await {
            Ok(snapshot) => {
                self.failing = false;
                Ok(snapshot)
            }
            Err(error) => {
                self.failing = true;
                Err(KubeletError::Read {
                    target: current.target.to_string(),
                    error,
                })
            }
        }
    }

    /// The pods alone, at once, with `last`'s usage ([`KubeletClient::pods_now`]): a pod cgroup
    /// the snapshot does not know is named without waiting for the next refresh.
    pub async fn pods_now(&mut self, last: &PodSnapshot) -> Result<PodSnapshot, KubeletError> {
        let Some(current) = &self.current else {
            return Err(KubeletError::Resolve(
                self.resolve_error.clone().unwrap_or_default(),
            ));
        };
        current
            .client
            .pods_now(last)
            .await
            .map_err(|error| KubeletError::Read {
                target: current.target.to_string(),
                error,
            })
    }

    fn due(&self, now: Instant) -> bool {
        if matches!(self.how, How::NodeProxy) {
            return false;
        }
        let Some(at) = self.resolved_at else {
            return true;
        };
        let age = now.saturating_duration_since(at);
        let troubled = self.failing || self.current.is_none();
        (troubled && age >= self.timing.after_failure) || age >= self.timing.every
    }

    async fn resolve(&mut self) {
        self.resolved_at = Some(Instant::now());
        match self.find().await {
            Ok((target, client)) => {
                if self.target() != Some(&target) {
                    tracing::info!(kubelet = %target, "reading the kubelet at this address");
                }
                if self.resolve_error.take().is_some() && self.current.is_some() {
                    tracing::info!("the kubelet's address can be worked out again");
                }
                self.current = Some(Current { client, target });
            }
            Err(e) => {
                let e = e.to_string();
                if self.resolve_error.is_none() {
                    if let Some(current) = &self.current {
                        tracing::warn!(error = %e, kubelet = %current.target,
                            "cannot work out the kubelet's address again: reading it where it was found");
                    }
                }
                self.resolve_error = Some(e);
            }
        }
    }

    /// Where the kubelet is now, and a client for it (its CA files read now).
    async fn find(&self) -> Result<(Target, KubeletClient), ResolveError> {
        let mut notes = Vec::new();
        let (url, from, also_named) = match &self.how {
            How::Url(url) => (url.clone(), "kubelet.url".to_string(), Vec::new()),
            How::Node { api, preferred } => {
                let node = read_node(api).await?;
                let chosen = address::choose(&api.node, node.status.as_ref(), preferred)?;
                if !chosen.port_published {
                    notes.push(format!(
                        "the Node publishes no kubelet port: {}",
                        address::DEFAULT_PORT
                    ));
                }
                if !chosen.refused.is_empty() {
                    notes.push(format!(
                        "status.addresses left aside: {}",
                        chosen.refused.join(", ")
                    ));
                }
                let from = format!("the {} of node {}", chosen.kind, api.node);
                (chosen.url(), from, chosen.hostnames)
            }
            How::NodeProxy => unreachable!("the node proxy is found once, at the start"),
        };
        let tls = self.trust.tls(also_named, &mut notes);
        let endpoint = Endpoint {
            name: "kubelet",
            url: url.clone(),
            tls: tls.clone(),
            token_path: self.token_path.clone(),
            timeout: self.timeout,
        };
        let transport = Transport::new(endpoint)?;
        let client = KubeletClient::new(Context {
            transport,
            ..self.base.clone()
        });
        Ok((
            Target {
                url,
                from,
                tls: Some(tls),
                notes,
            },
            client,
        ))
    }
}

/// The agent's Node, as much as [`address::choose`] reads (from the API server's cache).
async fn read_node(api: &Context) -> Result<address::NodePart, ResolveError> {
    let req = ApiRequest::get(format!("{}?resourceVersion=0", node_path(&api.node)));
    api.backoff
        .run(&api.counters, "node read (kubelet address)", || async {
            let resp = call(&api.transport, &req, &[StatusCode::OK]).await?;
            decode(api.transport.endpoint().name, &req, &resp, "v1.Node")
        })
        .await
        .map_err(|error| ResolveError::Node {
            node: api.node.clone(),
            error,
        })
}
