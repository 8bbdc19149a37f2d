//! The agent's own `NoSchedule` taint on its node, [`TAINT_KEY`], kept while the agent reports
//! pressure (its `NodeAgentPressure` condition is `True`), so the scheduler stops placing pods
//! on a node the agent is evicting from; it goes when the condition clears, that is after the
//! eviction pressure transition period, as the policy decides it.
//!
//! `spec.taints` has no merge key: any patch replaces the whole list. So the taint is written as
//! the kubelet's and the node lifecycle controller's helpers write theirs (`PatchNodeTaints`):
//! read the node, change only our entry, and send the whole list with the `resourceVersion`
//! read, so that a concurrent change of another taint makes the API server answer 409 Conflict
//! instead of being overwritten; on a conflict the node is read again and the change made anew.
//! Other taints are never touched: their order, values and `timeAdded` stay as read.

use http::{Method, StatusCode};
use k8s_openapi::api::core::v1::{Node, Taint};
use node_agent_policy::NodeCondition;
use serde_json::json;

use crate::{
    api::{call, decode, node_path, ApiError, Context},
    transport::ApiRequest,
};

/// The key of the agent's taint, in the agent's domain (as its events' reporting controller).
pub const TAINT_KEY: &str = "node-agent.io/pressure";
/// The effect: new pods stay away; the pods running are the policy's to evict, not the taint's.
pub const TAINT_EFFECT: &str = "NoSchedule";
/// A conflict is resolved by reading the node again at most this many times.
pub const CONFLICT_ATTEMPTS: u32 = 5;

#[derive(Debug, thiserror::Error)]
pub enum TaintError {
    #[error("node taint: {0}")]
    Api(#[from] ApiError),
    #[error("node taint: the node {node} changed under each of {attempts} attempts (409 Conflict every time)")]
    Conflict { node: String, attempts: u32 },
}

/// What became of the taint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaintChange {
    /// The node already had the taint as wanted (or had none, none being wanted).
    Unchanged,
    Added,
    /// The taint's value changed (other pressure kinds).
    Updated,
    Removed,
}

/// The taint wanted for the node conditions the agent reports: none without pressure. Its value
/// names the conditions (`MemoryPressure.PIDPressure`), a valid label value (at most 41
/// characters from these names). Pure.
pub fn wanted(conditions: &[NodeCondition]) -> Option<Taint> {
    if conditions.is_empty() {
        return None;
    }
    let mut names: Vec<&str> = conditions.iter().map(|c| c.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    Some(Taint {
        key: TAINT_KEY.into(),
        effect: TAINT_EFFECT.into(),
        value: Some(names.join(".")),
        time_added: None,
    })
}

fn ours(t: &Taint) -> bool {
    t.key == TAINT_KEY && t.effect == TAINT_EFFECT
}

/// The node's taint list with ours as `want` says, or `None` when the list already is so.
/// Every other taint stays as it was, in its place; ours keeps its place when it changes. Pure.
pub fn next_taints(current: &[Taint], want: Option<&Taint>) -> Option<(Vec<Taint>, TaintChange)> {
    let existing = current.iter().position(ours);
    match (existing, want) {
        (None, None) => None,
        (Some(i), Some(w)) if current[i].value == w.value => None,
        (Some(i), Some(w)) => {
            let mut next = current.to_vec();
            next[i] = w.clone();
            Some((next, TaintChange::Updated))
        }
        (None, Some(w)) => {
            let mut next = current.to_vec();
            next.push(w.clone());
            Some((next, TaintChange::Added))
        }
        (Some(_), None) => {
            let next = current.iter().filter(|t| !ours(t)).cloned().collect();
            Some((next, TaintChange::Removed))
        }
    }
}

/// A JSON merge patch of the whole taint list, made conditional on the node's
/// `resourceVersion` as read (409 Conflict if it changed since). Pure.
pub fn taints_patch(resource_version: &str, taints: &[Taint]) -> serde_json::Value {
    json!({
        "metadata": { "resourceVersion": resource_version },
        "spec": { "taints": taints },
    })
}

/// Makes the node's taint as `want` says (`None`: no taint of ours), by read-modify-write.
/// `dry_run` is asked before every write: once it holds, nothing more is sent (`Ok(None)`).
pub async fn apply(
    ctx: &Context,
    want: Option<&Taint>,
    dry_run: &(dyn Fn() -> bool + Sync),
) -> Result<Option<TaintChange>, TaintError> {
    let path = node_path(&ctx.node);
    for _ in 0..CONFLICT_ATTEMPTS {
        let get = ApiRequest::get(path.clone());
        let node: Node = ctx
            .backoff
            .run(&ctx.counters, "node read (taint)", || async {
                let resp = call(&ctx.transport, &get, &[StatusCode::OK]).await?;
                decode(ctx.transport.endpoint().name, &get, &resp, "v1.Node")
            })
            .await?;
        let current = node.spec.and_then(|s| s.taints).unwrap_or_default();
        let Some((next, change)) = next_taints(&current, want) else {
            return Ok(Some(TaintChange::Unchanged));
        };
        if dry_run() {
            return Ok(None);
        }
        let version = node.metadata.resource_version.unwrap_or_default();
        let patch = ApiRequest::with_json(
            Method::PATCH,
            path.clone(),
            "application/merge-patch+json",
            &taints_patch(&version, &next),
        );
        let sent = ctx
            .backoff
            .run(&ctx.counters, "node taint patch", || {
                call(&ctx.transport, &patch, &[StatusCode::OK])
            })
            .await;
        match sent {
            Ok(_) => return Ok(Some(change)),
            Err(e) if e.code() == Some(409) => {
                tracing::info!(node = %ctx.node, "node changed while its taint was written; reading it again");
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(TaintError::Conflict {
        node: ctx.node.clone(),
        attempts: CONFLICT_ATTEMPTS,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str, effect: &str, value: Option<&str>) -> Taint {
        Taint {
            key: key.into(),
            effect: effect.into(),
            value: value.map(Into::into),
            time_added: None,
        }
    }

    #[test]
    fn the_wanted_taint_names_the_conditions_or_is_none() {
        assert_eq!(wanted(&[]), None);
        let t = wanted(&[NodeCondition::PidPressure, NodeCondition::MemoryPressure]).unwrap();
        assert_eq!(
            (t.key.as_str(), t.effect.as_str(), t.value.as_deref()),
            (TAINT_KEY, "NoSchedule", Some("MemoryPressure.PIDPressure"))
        );
    }

    #[test]
    fn only_our_taint_changes_and_the_others_keep_their_place() {
        let other = taint("dedicated", "NoSchedule", Some("gpu"));
        let ours_exec = taint(TAINT_KEY, "NoExecute", None);
        let mem = taint(TAINT_KEY, TAINT_EFFECT, Some("MemoryPressure"));
        let disk = taint(TAINT_KEY, TAINT_EFFECT, Some("DiskPressure"));
        /// (behaviour, the node's taints, ours wanted, the list to write and the change)
        type Row<'a> = (
            &'a str,
            Vec<Taint>,
            Option<&'a Taint>,
            Option<(Vec<Taint>, TaintChange)>,
        );
        let rows: Vec<Row> = vec![
            ("nothing, none wanted", vec![other.clone()], None, None),
            (
                "added after the others",
                vec![other.clone()],
                Some(&mem),
                Some((vec![other.clone(), mem.clone()], TaintChange::Added)),
            ),
            (
                "already there",
                vec![mem.clone(), other.clone()],
                Some(&mem),
                None,
            ),
            (
                "value updated in place",
                vec![mem.clone(), other.clone()],
                Some(&disk),
                Some((vec![disk.clone(), other.clone()], TaintChange::Updated)),
            ),
            (
                "removed, the others kept",
                vec![other.clone(), mem.clone(), ours_exec.clone()],
                None,
                Some((vec![other.clone(), ours_exec.clone()], TaintChange::Removed)),
            ),
            (
                "our key with another effect is not ours",
                vec![ours_exec.clone()],
                None,
                None,
            ),
        ];
        for (what, current, want, expected) in rows {
            assert_eq!(next_taints(&current, want), expected, "{what}");
        }
    }

    #[test]
    fn the_patch_is_conditional_on_the_version_read() {
        let patch = taints_patch("42", &[]);
        assert_eq!(
            patch,
            json!({"metadata": {"resourceVersion": "42"}, "spec": {"taints": []}})
        );
    }
}
