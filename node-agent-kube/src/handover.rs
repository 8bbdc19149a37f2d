//! The agent's hand-over on its node during a rollout. deploy/'s DaemonSet surges: the new pod
//! starts first and the old one is stopped only once the new one is ready, so when an agent is
//! stopped by a rollout another pod of its DaemonSet may already watch the node and own its
//! condition and taint. The stopping agent then leaves both to it, rather than mark the
//! condition `Unknown` and remove a taint the other one set (which that one would not write
//! again before its next change or heartbeat).
//!
//! A sibling takes over only if it would write what the stopping agent did: a pod whose
//! controller is the same DaemonSet (the owner reference marked `controller`, by UID), bound
//! to this node, `Running`, Ready, not terminating, with the same containers (image, command
//! and args: a sibling that runs with `--dry-run` while this one did not writes nothing, and
//! would leave a taint behind). A pod that names the same owner without being its controller,
//! one on another node, one `Failed` that still says Ready, or another image with the same
//! args is not one. A config rolled out with `dryRun: true` is not visible here: see
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
    uid: String,
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
    #[serde(default)]
    controller: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    #[serde(default)]
    node_name: String,
    #[serde(default)]
    containers: Vec<Container>,
}

#[derive(Debug, Default, Deserialize, PartialEq)]
struct Container {
    #[serde(default)]
    image: String,
    #[serde(default)]
    command: Vec<String>,
    #[serde(default)]
    args: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
struct Status {
    #[serde(default)]
    phase: String,
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
    /// Its controller's UID (the owner reference marked `controller: true`).
    fn controller(&self) -> Option<&str> {
        self.metadata
            .owner_references
            .iter()
            .find(|o| o.controller == Some(true))
            .map(|o| o.uid.as_str())
            .filter(|uid| !uid.is_empty())
    }

    fn ready(&self) -> bool {
        self.metadata.deletion_timestamp.is_none()
            && self.status.phase == "Running"
            && self
                .status
                .conditions
                .iter()
                .any(|c| c.kind == "Ready" && c.status == "True")
    }
}

/// The sibling that takes the node over from `own` (the stopping agent's pod, bound to
/// `node`), if any. Pure.
pub fn sibling(pods: &PodList, own: &str, node: &str) -> Option<String> {
    let me = pods
        .items
        .iter()
        .find(|p| p.metadata.name == own && p.spec.node_name == node)?;
    let controller = me.controller()?;
    pods.items
        .iter()
        .filter(|p| p.metadata.name != own && p.metadata.uid != me.metadata.uid)
        .filter(|p| p.spec.node_name == node && p.ready())
        .filter(|p| p.controller() == Some(controller))
        .find(|p| !p.spec.containers.is_empty() && p.spec.containers == me.spec.containers)
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
    Ok(sibling(&pods, own, &ctx.node))
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
                "uid": format!("uid-{name}"),
                "ownerReferences": [{"uid": owner, "controller": true}],
                "deletionTimestamp": deleting.then_some("2026-11-28T10:00:00Z"),
            },
            "spec": {"nodeName": "n1", "containers": [{"image": "node-agent:1", "args": args}]},
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
            },
        })
    }

    /// `pod(name, "ds-1", [], ready, not deleting)` with `change` applied.
    fn changed(name: &str, change: impl FnOnce(&mut serde_json::Value)) -> serde_json::Value {
        let mut p = pod(name, "ds-1", &[], true, false);
        change(&mut p);
        p
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
            // Impostors (issue 41, round 4): each once made a stopping agent leave its taint.
            (
                "a sibling bound to another node does not",
                vec![
                    own(),
                    changed("new", |p| p["spec"]["nodeName"] = "n2".into()),
                ],
                None,
            ),
            (
                "one naming the DaemonSet without it as controller does not",
                vec![
                    own(),
                    changed("new", |p| {
                        p["metadata"]["ownerReferences"][0]["controller"] = false.into()
                    }),
                ],
                None,
            ),
            (
                "one Failed that still says Ready does not",
                vec![
                    own(),
                    changed("new", |p| p["status"]["phase"] = "Failed".into()),
                ],
                None,
            ),
            (
                "another image with the same args does not",
                vec![
                    own(),
                    changed("new", |p| {
                        p["spec"]["containers"][0]["image"] = "impostor:1".into()
                    }),
                ],
                None,
            ),
            (
                "another command with the same args does not",
                vec![
                    own(),
                    changed("new", |p| {
                        p["spec"]["containers"][0]["command"] = serde_json::json!(["/bin/sh"])
                    }),
                ],
                None,
            ),
            (
                "a second container beside the same one does not",
                vec![
                    own(),
                    changed("new", |p| {
                        p["spec"]["containers"]
                            .as_array_mut()
                            .unwrap()
                            .push(serde_json::json!({"image": "sidecar:1"}))
                    }),
                ],
                None,
            ),
            (
                "its own pod with the same name under another UID is not a sibling",
                vec![
                    own(),
                    changed("old", |p| p["metadata"]["uid"] = "uid-other".into()),
                ],
                None,
            ),
        ];
        for (behaviour, pods, want) in rows {
            let list: PodList = serde_json::from_value(serde_json::json!({"items": pods})).unwrap();
            assert_eq!(sibling(&list, "old", "n1").as_deref(), want, "{behaviour}");
        }
    }
}
