//! The daemon's Kubernetes connection: the API server's context (for the executor) and the
//! task that keeps the latest pod snapshot, from the kubelet or a watch of the API server.
//! A reload that changes how the cluster is reached builds a new one; dropping the old one
//! stops its tasks.

use std::{sync::Arc, time::Duration};

use node_agent_kube::{
    api::{Backoff, Context, Counters},
    config::{KubeConfig, PodSourceKind},
    pods::{apiserver::ApiServerPodSource, kubelet::KubeletClient, PodSnapshot},
    transport::Transport,
};
use tokio::{sync::watch, task::JoinHandle};

use crate::telemetry::Metrics;

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
}

impl Cluster {
    /// Builds the clients (the CA files are read now) and starts the pod refresh task.
    pub fn connect(
        config: &KubeConfig,
        refresh: Duration,
        counters: Arc<Counters>,
        metrics: Arc<Metrics>,
    ) -> Result<Self, KubeSetupError> {
        let backoff = Backoff::from(&config.retry);
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
        let mut tasks = Vec::new();
        match config.pod_source {
            PodSourceKind::Kubelet => {
                let client =
                    KubeletClient::new(context(transport("kubelet", config.kubelet_endpoint())?));
                tasks.push(tokio::spawn(async move {
                    let mut tick = tokio::time::interval(refresh);
                    loop {
                        tick.tick().await;
                        match client.snapshot().await {
                            Ok(snapshot) => {
                                if tx.send(Some(snapshot)).is_err() {
                                    return;
                                }
                            }
                            Err(e) => {
                                metrics.kube_error(crate::telemetry::KubeOperation::KubeletPods);
                                tracing::warn!(error = %e, "refreshing pods from the kubelet");
                            }
                        }
                    }
                }));
            }
            PodSourceKind::Apiserver => {
                let source = ApiServerPodSource::new(api.clone());
                let store = source.store();
                tasks.push(tokio::spawn(source.run(300)));
                let counters = counters.clone();
                tasks.push(tokio::spawn(async move {
                    let mut tick = tokio::time::interval(refresh);
                    loop {
                        tick.tick().await;
                        let snapshot = store.snapshot(std::time::SystemTime::now(), &counters);
                        if snapshot.is_some() && tx.send(snapshot).is_err() {
                            return;
                        }
                    }
                }));
            }
        }
        Ok(Self {
            api,
            snapshots,
            tasks,
        })
    }
}
