//! The daemon's Kubernetes side: a background task keeps the latest pod snapshot; the one
//! executor evicts, writes events and the node condition. Nothing else changes the cluster.

use std::{sync::Arc, time::Duration};

use node_agent_kube::{
    api::{Backoff, Counters},
    condition::NodeConditionReporter,
    config::{KubeConfig, PodSourceKind},
    evict::{EvictionRequest, Executor, Protection},
    pods::{apiserver::ApiServerPodSource, kubelet::KubeletClient, PodSnapshot},
    transport::Transport,
};
use tokio::sync::watch;

use crate::telemetry::Metrics;

#[derive(Debug, thiserror::Error)]
pub enum KubeSetupError {
    #[error("kubernetes: {0}")]
    Config(#[from] node_agent_kube::config::ConfigError),
    #[error("kubernetes: connecting to the {what}")]
    Transport {
        what: &'static str,
        #[source]
        source: node_agent_kube::transport::TransportError,
    },
}

/// Everything the daemon uses to talk to the cluster.
pub struct KubeSide {
    pub config: KubeConfig,
    pub executor: Arc<Executor>,
    pub conditions: NodeConditionReporter,
    pub snapshots: watch::Receiver<Option<PodSnapshot>>,
}

impl KubeSide {
    /// Builds the clients and starts the pod refresh task.
    pub fn start(
        config: KubeConfig,
        dry_run: bool,
        refresh: Duration,
        metrics: Arc<Metrics>,
    ) -> Result<Self, KubeSetupError> {
        let counters = Arc::new(Counters::default());
        let backoff = Backoff::from(&config.retry);
        let host = std::env::var("KUBERNETES_SERVICE_HOST").ok();
        let port = std::env::var("KUBERNETES_SERVICE_PORT").ok();
        let api = Transport::new(config.api_server_endpoint(host.as_deref(), port.as_deref())?)
            .map_err(|source| KubeSetupError::Transport {
                what: "API server",
                source,
            })?;
        let protection = Protection {
            own_namespace: std::env::var("POD_NAMESPACE").unwrap_or_default(),
            own_name: std::env::var("POD_NAME").unwrap_or_default(),
            exclusions: config.exclusions.clone(),
        };
        let executor = Arc::new(Executor::new(
            api.clone(),
            backoff,
            counters.clone(),
            config.pdb_policy,
            dry_run,
            protection,
            config.node_name.clone(),
        ));
        let conditions = NodeConditionReporter::new(
            api.clone(),
            backoff,
            counters.clone(),
            config.node_name.clone(),
            dry_run,
        );
        let (tx, snapshots) = watch::channel(None);
        match config.pod_source {
            PodSourceKind::Kubelet => {
                let kubelet = Transport::new(config.kubelet_endpoint()).map_err(|source| {
                    KubeSetupError::Transport {
                        what: "kubelet",
                        source,
                    }
                })?;
                let client = KubeletClient::new(kubelet, backoff, counters.clone());
                tokio::spawn(async move {
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
                                metrics.kube_error("kubelet pods");
                                tracing::warn!(error = %e, "refreshing pods from the kubelet");
                            }
                        }
                    }
                });
            }
            PodSourceKind::Apiserver => {
                let source = ApiServerPodSource::new(
                    api,
                    backoff,
                    counters.clone(),
                    config.node_name.clone(),
                );
                let store = source.store();
                let snapshot_counters = counters.clone();
                tokio::spawn(source.run(300));
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(refresh);
                    loop {
                        tick.tick().await;
                        let snapshot =
                            store.snapshot(std::time::SystemTime::now(), &snapshot_counters);
                        if snapshot.is_some() && tx.send(snapshot).is_err() {
                            return;
                        }
                    }
                });
            }
        }
        Ok(Self {
            config,
            executor,
            conditions,
            snapshots,
        })
    }
}

/// The kubelet's eviction request for a policy decision on `pod`.
pub fn eviction_request(
    e: &node_agent_policy::Eviction,
    pod: &node_agent_kube::pods::model::NodePod,
    info: &node_agent_policy::PodInfo,
) -> EvictionRequest {
    let usage = info.usage.map(|u| match e.resource {
        node_agent_policy::Resource::Memory => u.memory_working_set_bytes,
        node_agent_policy::Resource::Pids => u.processes,
        node_agent_policy::Resource::EphemeralStorage => u.nodefs.bytes,
        node_agent_policy::Resource::Inodes => u.nodefs.inodes,
    });
    // The kubelet names every container with usage of the starved resource; per-container
    // usage is not tracked here, so the pod's figure stands for its single container.
    let single = pod.containers.len() == 1;
    EvictionRequest {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        uid: pod.uid.clone(),
        grace_period_seconds: e.grace_period_seconds,
        message: e.message.clone(),
        signal: e.signal.as_str().to_string(),
        hard: e.hard,
        starved_resource: e.resource.as_str().to_string(),
        offending_containers: if single {
            pod.containers.iter().map(|c| c.name.clone()).collect()
        } else {
            Vec::new()
        },
        offending_containers_usage: if single {
            usage.map(|u| u.to_string()).into_iter().collect()
        } else {
            Vec::new()
        },
    }
}
