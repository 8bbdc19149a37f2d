//! The daemon's Kubernetes connection: the API server's context (for the executor), the task
//! that keeps the latest pod snapshot (from the kubelet, found from the Node's addresses or
//! reached through the API server's node proxy, or from a watch of the API server), and what
//! readiness says about both. A reload that changes how the cluster is reached builds a
//! new one; dropping the old one stops its tasks.
//!
//! Two sources are assessed at every pod refresh, each with a gauge
//! (`node_agent_kube_source_ready{source}`), a `/readyz` line naming it and its last error
//! while it does not deliver, and one log line per transition (`pods::status`):
//! - `pods`: the pod source cannot be read, lists nothing usable, or its data is older than
//!   the staleness bound;
//! - `cluster`: the API server's last answer (to any request of the agent) was none
//!   (unreachable, TLS), a refusal (401, 403) or a server error. When the agent has asked
//!   nothing for [`CLUSTER_ANSWER_MAX_AGE`], or while the connection fails, it reads its Node
//!   (from the API server's cache) to find out.

use std::{
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use node_agent_kube::{
    api::{call, node_path, Backoff, Context, Counters},
    config::{KubeConfig, PodSourceKind},
    kubelet::{KubeletSource, Trust},
    pods::{
        apiserver::{ApiServerPodSource, WatchTiming},
        records::ProblemLog,
        status::{assess_cluster, assess_pods, is_old, SourceState, StateLog},
        PodSnapshot,
    },
    transport::{ApiRequest, Transport},
};
use tokio::{sync::watch, task::JoinHandle};

use crate::telemetry::{Health, Metrics};

/// How long the API server's last answer speaks for the connection: older, the agent reads
/// its Node to ask again (a `GET` served from the API server's cache).
pub const CLUSTER_ANSWER_MAX_AGE: Duration = Duration::from_secs(30);
/// How often the cluster connection's state is looked at.
const CLUSTER_CHECK_EVERY: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum KubeSetupError {
    #[error("kubernetes")]
    Config(#[from] node_agent_kube::config::ConfigError),
    #[error("kubernetes: connecting to the {what}")]
    Transport {
        what: &'static str,
        #[source]
        source: node_agent_kube::transport::TransportError,
    },
}

/// How the cluster is reached and where its pods come from.
pub struct Cluster {
    /// The API server, for the executor.
    pub api: Context,
    pub snapshots: watch::Receiver<Option<PodSnapshot>>,
    /// Asks the pod source for the pods at once (a pod cgroup it has not listed yet).
    name_now: Arc<tokio::sync::Notify>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Whether `a` and `b` reach the cluster the same way (a reload changing any of this builds a
/// new connection; the rest of the section applies to the running one).
pub fn same_connection(a: &KubeConfig, b: &KubeConfig) -> bool {
    a.pod_source == b.pod_source
        && a.node_name == b.node_name
        && a.kubelet == b.kubelet
        && a.api_server == b.api_server
        && a.token_path == b.token_path
        && a.request_timeout == b.request_timeout
        && a.retry == b.retry
        && a.staleness_bound == b.staleness_bound
}

/// Where a source's state goes: the gauge, `/readyz`, and the log on transitions.
struct Report {
    source: &'static str,
    log: StateLog,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

impl Report {
    fn new(source: &'static str, metrics: Arc<Metrics>, health: Arc<Health>) -> Self {
        Self {
            source,
            log: StateLog::new(source),
            metrics,
            health,
        }
    }

    fn state(&mut self, state: &SourceState) {
        self.log.note(state);
        self.metrics
            .sources()
            .set_ready(self.source, state.is_ready());
        self.health.set_kube_source(
            self.source,
            (!state.is_ready()).then(|| format!("{} ({})", state, state.kind())),
        );
    }
}

impl Cluster {
    /// Builds the clients (the CA files are read now) and starts the pod refresh task and the
    /// cluster connection's check.
    pub fn connect(
        config: &KubeConfig,
        refresh: Duration,
        counters: Arc<Counters>,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
    ) -> Result<Self, KubeSetupError> {
        let backoff = Backoff::from(&config.retry);
        let bound = config.staleness_bound();
        let host = std::env::var("KUBERNETES_SERVICE_HOST").ok();
        let port = std::env::var("KUBERNETES_SERVICE_PORT").ok();
        let transport = |what, endpoint| {
            Transport::new(endpoint).map_err(|source| KubeSetupError::Transport { what, source })
        };
        let context = |transport| Context {
            transport,
            backoff,
            counters: counters.clone(),
            node: config.node_name.clone(),
        };
        let api = context(transport(
            "API server",
            config.api_server_endpoint(host.as_deref(), port.as_deref())?,
        )?);
        let (tx, snapshots) = watch::channel(None);
        let name_now = Arc::new(tokio::sync::Notify::new());
        let mut pods = Report::new("pods", metrics.clone(), health.clone());
        pods.state(&SourceState::Starting);
        let mut cluster = Report::new("cluster", metrics.clone(), health.clone());
        cluster.state(&SourceState::Starting);
        let mut tasks = Vec::new();
        // 1 unless the agent reads a kubelet whose certificate it does not check.
        let unchecked =
            config.pod_source == PodSourceKind::Kubelet && Trust::of(config) == Trust::Insecure;
        metrics.sources().set_kubelet_tls_verified(!unchecked);
        if unchecked {
            tracing::warn!(
                "kubelet: its serving certificate is NOT checked (kubernetes.kubelet.insecureSkipTLSVerify: true): \
                 whoever answers at its address decides which pods the agent sees and evicts"
            );
        }
        match config.pod_source {
            PodSourceKind::Kubelet | PodSourceKind::NodeProxy => {
                let mut source = if config.pod_source == PodSourceKind::Kubelet {
                    KubeletSource::kubelet(config, &api)
                } else {
                    // A transport of its own: what the node proxy answers (a kubelet down,
                    // nodes/proxy refused) is the pod source's state, not the API server
                    // connection's.
                    KubeletSource::node_proxy(context(transport(
                        "API server",
                        config.api_server_endpoint(host.as_deref(), port.as_deref())?,
                    )?))
                };
                let counters = counters.clone();
                let asked = name_now.clone();
                tasks.push(tokio::spawn(async move {
                    let mut problems = ProblemLog::default();
                    let mut tick = ticker(refresh);
                    loop {
                        // The pods alone, at once, when asked (a pod cgroup not listed yet);
                        // pods and usage at every tick.
                        let last = tokio::select! {
                            _ = tick.tick() => None,
                            () = asked.notified() => tx.borrow().clone(),
                        };
                        let read = match &last {
                            Some(last) => source.pods_now(last).await,
                            None => source.snapshot().await,
                        };
                        let error = match read {
                            Ok(snapshot) => {
                                problems.note(&snapshot.problems, &counters);
                                if tx.send(Some(snapshot)).is_err() {
                                    return;
                                }
                                None
                            }
                            Err(e) => {
                                metrics.kube_error(crate::telemetry::KubeOperation::KubeletPods);
                                Some(e.to_string())
                            }
                        };
                        let state = assess_pods(
                            tx.borrow().as_ref(),
                            error.as_deref(),
                            SystemTime::now(),
                            bound,
                        );
                        pods.state(&state);
                    }
                }));
            }
            PodSourceKind::Apiserver => {
                let source = ApiServerPodSource::new(api.clone());
                let store = source.store();
                tasks.push(tokio::spawn(source.run(WatchTiming::for_bound(bound))));
                let counters = counters.clone();
                let asked = name_now.clone();
                tasks.push(tokio::spawn(async move {
                    let mut problems = ProblemLog::default();
                    let mut tick = ticker(refresh);
                    loop {
                        // The watch has the pods as they come: when asked, what it has now.
                        tokio::select! {
                            _ = tick.tick() => {}
                            () = asked.notified() => {}
                        }
                        let snapshot = store.snapshot();
                        if let Some(s) = &snapshot {
                            problems.note(&s.problems, &counters);
                        }
                        pods.state(&assess_pods(
                            snapshot.as_ref(),
                            store.last_error().as_deref(),
                            SystemTime::now(),
                            bound,
                        ));
                        if snapshot.is_some() && tx.send(snapshot).is_err() {
                            return;
                        }
                    }
                }));
            }
        }
        tasks.push(tokio::spawn(check_cluster(api.clone(), cluster)));
        Ok(Self {
            api,
            snapshots,
            name_now,
            tasks,
        })
    }

    /// Asks the pod source for the pods at once; asks made before it answers are one.
    pub fn name_pods_now(&self) {
        self.name_now.notify_one();
    }
}

/// A refresh timer that waits out a slow read instead of firing a burst after it.
fn ticker(every: Duration) -> tokio::time::Interval {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick
}

/// The cluster connection's state from the API server's last answer, reading the Node (one
/// try, from the API server's cache) when the agent has asked nothing for a while.
async fn check_cluster(api: Context, mut report: Report) {
    let read_node = ApiRequest::get(format!("{}?resourceVersion=0", node_path(&api.node)));
    let mut tick = ticker(CLUSTER_CHECK_EVERY);
    let mut ready = false;
    loop {
        tick.tick().await;
        // While failing, asked again at every check, so recovery shows within seconds.
        if !ready
            || is_old(
                api.transport.last_answer().as_ref(),
                Instant::now(),
                CLUSTER_ANSWER_MAX_AGE,
            )
        {
            // The answer is recorded by the transport, whatever it is.
            let _ = call(&api.transport, &read_node, &[hyper::StatusCode::OK]).await;
        }
        let state = assess_cluster(api.transport.last_answer().as_ref());
        ready = state.is_ready();
        report.state(&state);
    }
}
