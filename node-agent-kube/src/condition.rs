//! The agent's own node condition, patched on `nodes/status`. The kubelet owns `MemoryPressure`,
//! `DiskPressure` and `PIDPressure`; this agent reports [`CONDITION_TYPE`] next to them.
//!
//! `lastTransitionTime` changes only when the status flips, `lastHeartbeatTime` on every report,
//! as for the kubelet's own conditions. When to report pressure and when to clear it (after the
//! transition period) is the policy's decision; this module only writes it.

use std::time::SystemTime;

use http::{Method, StatusCode};
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use serde_json::json;

use crate::{
    api::{call, decode, node_path, ApiError, Context},
    time::time,
    transport::ApiRequest,
};

/// The condition type this agent owns on its node.
pub const CONDITION_TYPE: &str = "NodeAgentPressure";

/// The condition's status: pressure seen, none seen, or nobody watching (the agent stopped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

impl ConditionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }
}

/// The condition to write, given the one on the node now (if any). Pure.
pub fn next_condition(
    previous: Option<&NodeCondition>,
    status: ConditionStatus,
    reason: &str,
    message: &str,
    now: SystemTime,
) -> NodeCondition {
    let status = status.as_str();
    let last_transition_time = match previous {
        Some(p) if p.status == status => p.last_transition_time.clone().or_else(|| Some(time(now))),
        _ => Some(time(now)),
    };
    NodeCondition {
        type_: CONDITION_TYPE.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_heartbeat_time: Some(time(now)),
        last_transition_time,
    }
}

/// A strategic merge patch of `status.conditions`, merged by `type` so the kubelet's own
/// conditions are left alone.
pub fn condition_patch(condition: &NodeCondition) -> serde_json::Value {
    json!({ "status": { "conditions": [condition] } })
}

/// Writes the condition and remembers what it wrote: one owner (the executor), so the node is
/// read once, at the first report, and patches go out in the order they were decided.
#[derive(Debug, Default)]
pub struct NodeConditionReporter {
    /// The condition as last written (or found on the node at the first report).
    last: Option<NodeCondition>,
    /// The node was read (its existing condition, if any, is in `last`).
    read: bool,
}

impl NodeConditionReporter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Writes the condition; in dry run only says what it would write. The first report reads
    /// the node so that an agent restart keeps the condition's transition time.
    pub async fn report(
        &mut self,
        ctx: &Context,
        status: ConditionStatus,
        reason: &str,
        message: &str,
        now: SystemTime,
        dry_run: bool,
    ) -> Result<NodeCondition, ApiError> {
        if !self.read {
            let req = ApiRequest::get(node_path(&ctx.node));
            let node: Node = ctx
                .backoff
                .run(&ctx.counters, "node read", || async {
                    let resp = call(&ctx.transport, &req, &[StatusCode::OK]).await?;
                    decode(ctx.transport.endpoint().name, &req, &resp, "v1.Node")
                })
                .await?;
            self.last = node
                .status
                .and_then(|s| s.conditions)
                .and_then(|cs| cs.into_iter().find(|c| c.type_ == CONDITION_TYPE));
            self.read = true;
        }
        let condition = next_condition(self.last.as_ref(), status, reason, message, now);
        if dry_run {
            tracing::info!(status = %condition.status, reason, "dry run: node condition not patched");
            return Ok(condition);
        }
        let req = ApiRequest::with_json(
            Method::PATCH,
            format!("{}/status", node_path(&ctx.node)),
            "application/strategic-merge-patch+json",
            &condition_patch(&condition),
        );
        ctx.backoff
            .run(&ctx.counters, "node condition patch", || {
                call(&ctx.transport, &req, &[StatusCode::OK])
            })
            .await?;
        self.last = Some(condition.clone());
        Ok(condition)
    }

    /// Forgets what was written (another cluster connection: read the node again).
    pub fn reset(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn transition_time_moves_only_when_status_flips() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let t1 = t0 + Duration::from_secs(10);
        let first = next_condition(None, ConditionStatus::True, "MemoryPressure", "m", t0);
        let rows = [
            ("same status keeps t0", ConditionStatus::True, t0),
            ("flip takes t1", ConditionStatus::False, t1),
            ("unknown is a flip too", ConditionStatus::Unknown, t1),
        ];
        for (what, status, want) in rows {
            let next = next_condition(Some(&first), status, "r", "m", t1);
            assert_eq!(next.last_transition_time, Some(time(want)), "{what}");
            assert_eq!(next.last_heartbeat_time, Some(time(t1)), "{what}");
        }
        assert_eq!(first.status, "True");
        assert_eq!(first.type_, CONDITION_TYPE);
    }
}
