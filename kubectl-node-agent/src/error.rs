//! What can go wrong, each naming what was wrong and what to do; a refusal by RBAC names the
//! verb, the resource and the namespace the user lacks, and the file that grants them.

/// Where the grants the plugin needs are shipped.
pub const GRANTS: &str = "deploy/operator-rbac.yaml";

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("no cluster to talk to: {0}")]
    Kubeconfig(String),
    #[error(
        "forbidden: you need {verb} on {resource} {scope} ({grant})\n  the API server said: {said}"
    )]
    Forbidden {
        verb: &'static str,
        resource: &'static str,
        /// `in namespace node-agent`, or `(cluster-wide)`.
        scope: String,
        /// Which file or which of the user's own grants gives it.
        grant: String,
        said: String,
    },
    #[error("{what}: {error}")]
    Api { what: String, error: String },
    #[error("pod {namespace}/{name} not found")]
    PodNotFound { namespace: String, name: String },
    #[error("pod {namespace}/{name} is not scheduled to a node yet: no agent has seen it")]
    NotScheduled { namespace: String, name: String },
    #[error("no node-agent pod runs on node {node} (namespace {namespace}, label app.kubernetes.io/name=node-agent): the agent is not installed there, or --agent-namespace names another namespace")]
    NoAgentOnNode { node: String, namespace: String },
    #[error("no node-agent pods in namespace {namespace} (label app.kubernetes.io/name=node-agent){selected}: is the agent installed (kubectl apply -k deploy/)? --agent-namespace names another namespace")]
    NoAgents { namespace: String, selected: String },
    #[error("the agent on node {node} ({pod}): {problem}")]
    Agent {
        node: String,
        pod: String,
        problem: String,
    },
    #[error("--{flag} {value:?}: {problem}")]
    Flag {
        flag: &'static str,
        value: String,
        problem: String,
    },
    #[error("writing the output")]
    Output(#[source] std::io::Error),
}

/// One API call's scope, for the refusal message.
#[derive(Debug, Clone)]
pub struct Call {
    pub verb: &'static str,
    pub resource: &'static str,
    /// `None`: cluster-scoped.
    pub namespace: Option<String>,
    /// What grants it: [`GRANTS`] for the agent's namespace and nodes, else the user's own
    /// access to that namespace.
    pub grant: String,
    /// For other errors: what was being done.
    pub what: String,
}

impl Call {
    pub fn new(
        verb: &'static str,
        resource: &'static str,
        namespace: Option<&str>,
        what: impl Into<String>,
    ) -> Self {
        Self {
            verb,
            resource,
            namespace: namespace.map(String::from),
            grant: GRANTS.to_string(),
            what: what.into(),
        }
    }

    /// The grant is the user's own access (explain reads the pod it is asked about).
    pub fn users_own(mut self) -> Self {
        self.grant = "your own access to that namespace".into();
        self
    }

    /// The error for a failed call: a refusal names what is missing.
    pub fn failed(&self, error: kube::Error) -> PluginError {
        match &error {
            kube::Error::Api(status) if status.code == 403 => PluginError::Forbidden {
                verb: self.verb,
                resource: self.resource,
                scope: match &self.namespace {
                    Some(ns) => format!("in namespace {ns}"),
                    None => "(cluster-wide)".into(),
                },
                grant: self.grant.clone(),
                said: status.message.clone(),
            },
            kube::Error::Api(status) if status.code == 401 => PluginError::Api {
                what: self.what.clone(),
                error: format!(
                    "unauthorized: the API server did not accept your credentials ({})",
                    status.message
                ),
            },
            _ => PluginError::Api {
                what: self.what.clone(),
                error: chain(&error),
            },
        }
    }
}

/// An error and its sources, as one line.
pub fn chain(error: &dyn std::error::Error) -> String {
    node_agent_policy::error_chain(error)
}

impl PluginError {
    /// A refusal is the user's to fix and stops the whole command.
    pub fn is_forbidden(&self) -> bool {
        matches!(self, PluginError::Forbidden { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            message: message.into(),
            ..Default::default()
        }))
    }

    #[test]
    fn a_refusal_names_the_verb_resource_namespace_and_grant() {
        let rows = [
            (
                Call::new("get and create", "pods/portforward", Some("node-agent"), "x"),
                api(403, "pods \"a\" is forbidden: User \"u\" cannot get resource \"pods/portforward\""),
                "forbidden: you need get and create on pods/portforward in namespace node-agent (deploy/operator-rbac.yaml)\n  the API server said: pods \"a\" is forbidden",
            ),
            (
                Call::new("list", "nodes", None, "x"),
                api(403, "nodes is forbidden"),
                "forbidden: you need list on nodes (cluster-wide) (deploy/operator-rbac.yaml)",
            ),
            (
                Call::new("get", "pods", Some("shop"), "x").users_own(),
                api(403, "no"),
                "forbidden: you need get on pods in namespace shop (your own access to that namespace)",
            ),
            (
                Call::new("list", "pods", Some("node-agent"), "listing the agents"),
                api(401, "Unauthorized"),
                "listing the agents: unauthorized: the API server did not accept your credentials",
            ),
            (
                Call::new("list", "pods", Some("node-agent"), "listing the agents"),
                api(500, "etcd is down"),
                "listing the agents: ApiError: etcd is down",
            ),
        ];
        for (call, error, want) in rows {
            let got = call.failed(error).to_string();
            assert!(got.starts_with(want), "{got}\n  wanted {want}");
        }
    }
}
