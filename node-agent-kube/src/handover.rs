//! The agent's hand-over on its node during a rollout. deploy/'s DaemonSet surges: the new pod
//! starts first and the old one is stopped only once the new one is ready, so when an agent is
//! stopped by a rollout another pod of its DaemonSet may already watch the node and own its
//! condition and taint. The stopping agent then leaves both to it, rather than mark the
//! condition `Unknown` and remove a taint the other one set (which that one would not write
//! again before its next change or heartbeat).
//!
//! A sibling takes over only if it would write what the stopping agent did: a pod of the same
//! DaemonSet (owner UID), on this node, Ready, not terminating, with the same container args
//! (a sibling that runs with `--dry-run` while this one did not writes nothing, and would
//! leave a taint behind). A config rolled out with `dryRun: true` is not visible here: see
//! the README's table of what the agent leaves on its node.
//!
//! One `GET` of the node's agent pods, tried once: the stop has 1.5 s for everything.

use http::StatusCode;
use serde::Deserialize;

use crate::{
    api::{call, decode, ApiError, Context},
    transport::{encode, ApiRequest},
};

/// The label every agent pod carries (both DaemonSets of deploy/).
pub const AGENT_LABEL: &str = "app.kubernetes.io/name=node-agent";

#[derive(Debug, Default, Deserialize)]
pub struct PodList {
    #[serde(default)]
    items: Vec<Pod>,
}

#[derive(Debug, Default, Deserialize)]
struct Pod {
    #[serde(default)]
    metadata: Meta,
    #[serde(default)]
    spec: Spec,
    #[serde(default)]
    status: Status,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    deletion_timestamp: Option<String>,
    #[serde(default)]
    owner_references: Vec<Owner>,
}

#[derive(Debug, Default, Deserialize)]
struct Owner {
    #[serde(default)]
    uid: String,
}

#[derive(Debug, Default, Deserialize)]
struct Spec {
    #[serde(default)]
    containers: Vec<Container>,
}

#[derive(Debug, Default, Deserialize, PartialEq)]
struct Container {
    #[serde(default)]
    args: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
struct Status {
    #[serde(default)]
    conditions: Vec<Condition>,
}

#[derive(Debug, Default, Deserialize)]
struct Condition {
    #[serde(default, rename = "type")]
    kind: String,
    #[serde(default)]
    status: String,
}

impl Pod {
    fn ready(&self) -> bool {
        self.metadata.deletion_timestamp.is_none()
            && self
                .status
                .conditions
                .iter()
                .any(|c| c.kind == "Ready" && c.status == "True")
    }
}

/// The sibling that takes the node over from `own` (the stopping agent's pod), if any. Pure.
pub fn sibling(pods: &PodList, own: &str) -> Option<String> {
    let me = pods.items.iter().find(|p| p.metadata.name == own)?;
    let my_owner = me.metadata.owner_references.first()?;
    pods.items
        .iter()
        .filter(|p| p.metadata.name != own && p.ready())
        .filter(|p| {
            p.metadata
                .owner_references
                .first()
                .is_some_and(|o| o.uid == my_owner.uid)
        })
        .find(|p| p.spec.containers.first() == me.spec.containers.first())
        .map(|p| p.metadata.name.clone())
}

/// Asks the API server for the agent pods on this node (the context's node) in `namespace`
/// and returns the sibling taking over from `own`, if any. Tried once.
pub async fn ready_sibling(
    ctx: &Context,
    namespace: &str,
    own: &str,
) -> Result<Option<String>, ApiError> {
    let req = ApiRequest::get(format!(
        "/api/v1/namespaces/{}/pods?fieldSelector={}&labelSelector={}",
        encode(namespace),
        encode(&format!("spec.nodeName={}", ctx.node)),
        encode(AGENT_LABEL),
    ));
    let resp = call(&ctx.transport, &req, &[StatusCode::OK]).await?;
    let pods: PodList = decode(ctx.transport.endpoint().name, &req, &resp, "v1.PodList")?;
    Ok(sibling(&pods, own))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(
        name: &str,
        owner: &str,
        args: &[&str],
        ready: bool,
        deleting: bool,
    ) -> serde_json::Value {
        serde_json::json!({
            "metadata": {
                "name": name,
                "ownerReferences": [{"uid": owner}],
                "deletionTimestamp": deleting.then_some("2026-11-28T10:00:00Z"),
            },
            "spec": {"containers": [{"args": args}]},
            "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
        })
    }

    #[test]
    fn only_a_ready_pod_of_the_same_daemonset_that_writes_as_this_one_takes_over() {
        let own = || pod("old", "ds-1", &[], true, true);
        // (behaviour, the node's agent pods, the sibling taking over)
        let rows: Vec<(&str, Vec<serde_json::Value>, Option<&str>)> = vec![
            (
                "the new pod of a surge takes over",
                vec![own(), pod("new", "ds-1", &[], true, false)],
                Some("new"),
            ),
            (
                "a new pod not ready yet does not",
                vec![own(), pod("new", "ds-1", &[], false, false)],
                None,
            ),
            (
                "a terminating one does not",
                vec![own(), pod("new", "ds-1", &[], true, true)],
                None,
            ),
            (
                "the other DaemonSet's pod does not",
                vec![own(), pod("other", "ds-2", &[], true, false)],
                None,
            ),
            (
                "a sibling in dry run while this one enforced does not",
                vec![own(), pod("new", "ds-1", &["--dry-run"], true, false)],
                None,
            ),
            ("alone on the node: nobody", vec![own()], None),
            (
                "its own pod missing from the list: nobody",
                vec![pod("new", "ds-1", &[], true, false)],
                None,
            ),
        ];
        for (behaviour, pods, want) in rows {
            let list: PodList = serde_json::from_value(serde_json::json!({"items": pods})).unwrap();
            assert_eq!(sibling(&list, "old").as_deref(), want, "{behaviour}");
        }
    }
}
