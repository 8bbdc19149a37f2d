//! The cluster as the plugin sees it: a client from the user's kubeconfig, the agent pods (the
//! DaemonSets' pods in the agent's namespace) and the nodes a label selector picks.

use std::{collections::BTreeSet, time::Duration};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    api::ListParams,
    config::{KubeConfigOptions, Kubeconfig},
    Api, Client, Config,
};

use crate::error::{chain, Call, PluginError};

/// Every agent pod carries this label (deploy/daemonset: both DaemonSets of
/// enforce-by-node-label too).
pub const AGENT_SELECTOR: &str = "app.kubernetes.io/name=node-agent";
/// The agent's inspection endpoint inside its pod (deploy/config.yaml's `inspectListen`).
pub const INSPECT_PORT: u16 = 9465;

/// How to reach the cluster, from the command line.
#[derive(Debug, Clone, Default)]
pub struct Access {
    pub kubeconfig: Option<std::path::PathBuf>,
    pub context: Option<String>,
    pub agent_namespace: String,
    pub request_timeout: Duration,
}

/// A client and where the agents are.
#[derive(Clone)]
pub struct Cluster {
    pub client: Client,
    pub agent_namespace: String,
    pub request_timeout: Duration,
}

impl Cluster {
    /// The client of `--kubeconfig` (else `KUBECONFIG`, `~/.kube/config`, in-cluster) and
    /// `--context`.
    pub async fn connect(access: &Access) -> Result<Cluster, PluginError> {
        let options = KubeConfigOptions {
            context: access.context.clone(),
            ..Default::default()
        };
        let unusable = |e: &dyn std::error::Error| PluginError::Kubeconfig(chain(e));
        let config = match (&access.kubeconfig, &access.context) {
            (Some(path), _) => {
                let kubeconfig = Kubeconfig::read_from(path).map_err(|e| {
                    PluginError::Kubeconfig(format!(
                        "--kubeconfig {}: {}",
                        path.display(),
                        chain(&e)
                    ))
                })?;
                Config::from_custom_kubeconfig(kubeconfig, &options)
                    .await
                    .map_err(|e| unusable(&e))?
            }
            (None, Some(_)) => Config::from_kubeconfig(&options)
                .await
                .map_err(|e| unusable(&e))?,
            (None, None) => Config::infer().await.map_err(|e| unusable(&e))?,
        };
        let client = Client::try_from(config).map_err(|e| PluginError::Kubeconfig(chain(&e)))?;
        Ok(Cluster {
            client,
            agent_namespace: access.agent_namespace.clone(),
            request_timeout: access.request_timeout,
        })
    }

    pub fn agent_pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.agent_namespace)
    }

    /// Bounds one API call by `--request-timeout`.
    pub async fn bounded<T>(
        &self,
        call: &Call,
        request: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, PluginError> {
        match tokio::time::timeout(self.request_timeout, request).await {
            Ok(result) => result.map_err(|e| call.failed(e)),
            Err(_) => Err(PluginError::Api {
                what: call.what.clone(),
                error: format!(
                    "no answer within --request-timeout {:?}",
                    self.request_timeout
                ),
            }),
        }
    }

    /// The agent pods, on one node or all.
    pub async fn agents(&self, node: Option<&str>) -> Result<Vec<AgentPod>, PluginError> {
        let mut params = ListParams::default().labels(AGENT_SELECTOR);
        if let Some(node) = node {
            params = params.fields(&format!("spec.nodeName={node}"));
        }
        let call = Call::new(
            "list",
            "pods",
            Some(&self.agent_namespace),
            format!(
                "listing the agent pods in namespace {}",
                self.agent_namespace
            ),
        );
        let list = self.bounded(&call, self.agent_pods().list(&params)).await?;
        let mut agents: Vec<AgentPod> = list.items.iter().map(AgentPod::of).collect();
        agents.sort_by(|a, b| (&a.node, &a.name).cmp(&(&b.node, &b.name)));
        Ok(agents)
    }

    /// The names of the nodes `selector` picks (`-l`).
    pub async fn nodes(&self, selector: &str) -> Result<BTreeSet<String>, PluginError> {
        let call = Call::new(
            "list",
            "nodes",
            None,
            format!("listing the nodes -l {selector} picks"),
        );
        let nodes: Api<Node> = Api::all(self.client.clone());
        let list = self
            .bounded(&call, nodes.list(&ListParams::default().labels(selector)))
            .await?;
        Ok(list
            .items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect())
    }

    /// A pod by name, in the user's own access.
    pub async fn pod(&self, namespace: &str, name: &str) -> Result<Pod, PluginError> {
        let call = Call::new(
            "get",
            "pods",
            Some(namespace),
            format!("reading pod {namespace}/{name}"),
        )
        .users_own();
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        match self.bounded(&call, pods.get_opt(name)).await? {
            Some(pod) => Ok(pod),
            None => Err(PluginError::PodNotFound {
                namespace: namespace.into(),
                name: name.into(),
            }),
        }
    }
}

/// One agent pod, as far as the plugin needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentPod {
    pub name: String,
    /// `None` until the scheduler binds it.
    pub node: Option<String>,
    /// The DaemonSet that owns it (`node-agent`, or `node-agent-enforce`).
    pub daemonset: Option<String>,
    /// `Running`, `Pending`, ...
    pub phase: String,
    pub deleting: bool,
}

impl AgentPod {
    pub fn of(pod: &Pod) -> AgentPod {
        let meta = &pod.metadata;
        AgentPod {
            name: meta.name.clone().unwrap_or_default(),
            node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            daemonset: meta
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.kind == "DaemonSet")
                .map(|o| o.name.clone()),
            phase: pod
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_else(|| "Unknown".into()),
            deleting: meta.deletion_timestamp.is_some(),
        }
    }

    /// Whether its endpoint can be read: running on a node, not on its way out.
    pub fn reachable(&self) -> bool {
        self.node.is_some() && self.phase == "Running" && !self.deleting
    }

    pub fn node_name(&self) -> &str {
        self.node.as_deref().unwrap_or("<unscheduled>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_pod_is_read_from_its_pod() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "node-agent-x", "namespace": "node-agent",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "node-agent-enforce", "uid": "u"}]},
            "spec": {"nodeName": "n1", "containers": []},
            "status": {"phase": "Running"}
        }))
        .unwrap();
        let agent = AgentPod::of(&pod);
        assert_eq!(agent.daemonset.as_deref(), Some("node-agent-enforce"));
        assert!(agent.reachable());
        let rows = [
            (None, "Running", false, false),
            (Some("n1"), "Pending", false, false),
            (Some("n1"), "Running", true, false),
            (Some("n1"), "Running", false, true),
        ];
        for (node, phase, deleting, reachable) in rows {
            let a = AgentPod {
                node: node.map(String::from),
                phase: phase.into(),
                deleting,
                ..agent.clone()
            };
            assert_eq!(a.reachable(), reachable, "{a:?}");
        }
    }
}
