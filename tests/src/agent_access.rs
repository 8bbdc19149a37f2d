//! What the agent's service account may do, asked of the real API server: requests made with
//! its token (bound to the agent's pod, as the kubelet mounts it, or bound to nothing), and the
//! API server's audit log of what the agent itself asked and how it was answered.

use std::{path::PathBuf, time::Duration};

use anyhow::{bail, Context as _};
use http::Method;
use node_agent_kube::transport::{ApiRequest, Endpoint, Tls, Transport};
use serde_json::Value;

use crate::real_cluster::{RealCluster, AGENT_NS, AGENT_SA};

/// The agent's service account's token, and a client that sends it to the API server.
pub struct AgentToken {
    transport: Transport,
    runtime: tokio::runtime::Runtime,
    /// The node the token speaks for (its `authentication.kubernetes.io/node-name`), if any.
    pub node: Option<String>,
}

/// One answer of the API server.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    /// The body as JSON (a `Status` for a refusal), `Null` when it is not JSON.
    pub body: Value,
    pub text: String,
}

impl Answer {
    /// The `Status` message of a refusal.
    pub fn message(&self) -> &str {
        self.body["message"].as_str().unwrap_or("")
    }
}

impl AgentToken {
    /// A token bound to the agent's pod `pod`, as the kubelet mounts one: the API server adds
    /// the pod's node to the user's extra info, the claim the admission policy keys on.
    pub fn bound_to(rc: &RealCluster, pod: &str) -> anyhow::Result<Self> {
        let node = rc.kubectl.run(&[
            "-n",
            AGENT_NS,
            "get",
            "pod",
            pod,
            "-o",
            "jsonpath={.spec.nodeName}",
        ])?;
        let token = rc.kubectl.run(&[
            "create",
            "token",
            "node-agent",
            "-n",
            AGENT_NS,
            "--bound-object-kind",
            "Pod",
            "--bound-object-name",
            pod,
            "--duration=1h",
        ])?;
        Self::new(rc, &format!("bound-{pod}"), token.trim(), Some(node.trim()))
    }

    /// A token of the same service account bound to nothing: no node claim.
    pub fn unbound(rc: &RealCluster) -> anyhow::Result<Self> {
        let token = rc.kubectl.run(&[
            "create",
            "token",
            "node-agent",
            "-n",
            AGENT_NS,
            "--duration=1h",
        ])?;
        Self::new(rc, "unbound", token.trim(), None)
    }

    fn new(rc: &RealCluster, name: &str, token: &str, node: Option<&str>) -> anyhow::Result<Self> {
        if token.split('.').count() != 3 {
            bail!("kubectl create token printed no JWT: {token:?}");
        }
        let dir = rc.cluster.layout.dir.join("tokens");
        std::fs::create_dir_all(&dir)?;
        let path: PathBuf = dir.join(name);
        std::fs::write(&path, token).with_context(|| format!("writing {}", path.display()))?;
        let runtime = crate::runtime();
        let endpoint = Endpoint {
            name: "api server",
            url: rc.cluster.layout.host_server(),
            tls: Tls::ca(rc.cluster.layout.pki().join("ca.crt")),
            token_path: Some(path),
            timeout: Duration::from_secs(20),
        };
        let transport = {
            let _entered = runtime.enter();
            Transport::new(endpoint)?
        };
        Ok(Self {
            transport,
            runtime,
            node: node.map(str::to_string),
        })
    }

    /// Sends `method path` with a JSON `body` of `content_type` (none for `None`).
    pub fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<(&'static str, &Value)>,
    ) -> anyhow::Result<Answer> {
        let req = match body {
            Some((content_type, body)) => ApiRequest::with_json(method, path, content_type, body),
            None => ApiRequest {
                method,
                ..ApiRequest::get(path)
            },
        };
        let resp = self
            .runtime
            .block_on(self.transport.send(&req))
            .with_context(|| format!("{} {path}", req.method))?;
        let text = String::from_utf8_lossy(&resp.body).into_owned();
        Ok(Answer {
            status: resp.status.as_u16(),
            body: serde_json::from_str(&text).unwrap_or(Value::Null),
            text,
        })
    }

    /// A JSON merge patch.
    pub fn merge_patch(&self, path: &str, body: &Value) -> anyhow::Result<Answer> {
        self.request(
            Method::PATCH,
            path,
            Some(("application/merge-patch+json", body)),
        )
    }

    pub fn post(&self, path: &str, body: &Value) -> anyhow::Result<Answer> {
        self.request(Method::POST, path, Some(("application/json", body)))
    }
}

/// The policy/v1 Eviction of pod `namespace/name`, with its UID as a precondition when given
/// (as the agent always sends it).
pub fn eviction(namespace: &str, name: &str, uid: Option<&str>) -> Value {
    let mut e = serde_json::json!({"apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace}});
    if let Some(uid) = uid {
        e["deleteOptions"] = serde_json::json!({"preconditions": {"uid": uid}});
    }
    e
}

/// The answer the API server gives when the node agent's admission policy refuses a request:
/// `403 Forbidden`, the policy and binding named before the validation's own message.
pub fn policy_denial(message: &str) -> String {
    format!("ValidatingAdmissionPolicy 'node-agent-own-node' with binding 'node-agent-own-node' denied request: {message}")
}

/// One request in the API server's audit log.
#[derive(Debug, Clone)]
pub struct Audited {
    pub at: jiff::Timestamp,
    pub verb: String,
    pub uri: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
    pub code: u16,
    /// The user's name; empty for a request that was not authenticated.
    pub user: String,
    /// `authentication.kubernetes.io/pod-name` of a pod-bound token.
    pub pod: String,
    pub source_ips: Vec<String>,
    /// The request body (Request level: the agent's service account only).
    pub body: Value,
    pub message: String,
}

impl Audited {
    fn from(e: &Value) -> Option<Self> {
        let text = |v: &Value| v.as_str().unwrap_or("").to_string();
        Some(Self {
            at: e["stageTimestamp"].as_str()?.parse().ok()?,
            verb: text(&e["verb"]),
            uri: text(&e["requestURI"]),
            resource: text(&e["objectRef"]["resource"]),
            subresource: text(&e["objectRef"]["subresource"]),
            name: text(&e["objectRef"]["name"]),
            code: e["responseStatus"]["code"].as_u64().unwrap_or(0) as u16,
            user: text(&e["user"]["username"]),
            pod: text(&e["user"]["extra"]["authentication.kubernetes.io/pod-name"][0]),
            source_ips: e["sourceIPs"]
                .as_array()
                .into_iter()
                .flatten()
                .map(text)
                .collect(),
            body: e["requestObject"].clone(),
            message: text(&e["responseStatus"]["message"]),
        })
    }

    /// `verb resource[/subresource] name -> code`, for messages.
    pub fn line(&self) -> String {
        let sub = if self.subresource.is_empty() {
            String::new()
        } else {
            format!("/{}", self.subresource)
        };
        format!(
            "{} {} {}{sub} {} -> {} {}",
            self.at, self.verb, self.resource, self.name, self.code, self.message
        )
    }
}

/// Every completed request since `since` (the stage the answer is known at; watches end
/// later and are counted when they start answering).
pub fn audited_since(rc: &RealCluster, since: jiff::Timestamp) -> anyhow::Result<Vec<Audited>> {
    Ok(rc
        .audit_events()?
        .iter()
        .filter(|e| e["stage"] == "ResponseComplete" || e["stage"] == "ResponseStarted")
        .filter_map(Audited::from)
        .filter(|a| a.at >= since)
        .collect())
}

/// The agent's own requests since `since`.
pub fn agent_requests_since(
    rc: &RealCluster,
    since: jiff::Timestamp,
) -> anyhow::Result<Vec<Audited>> {
    Ok(audited_since(rc, since)?
        .into_iter()
        .filter(|a| a.user == AGENT_SA)
        .collect())
}
