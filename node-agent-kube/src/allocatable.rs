//! The node's allocatable memory as its kubelet publishes it: `status.allocatable.memory` of the
//! agent's own Node object, the figure `allocatableMemory.available` is measured against when
//! the agent's config does not give one.
//!
//! The kubelet writes it as capacity minus `systemReserved`, `kubeReserved` and the hard
//! `memory.available` threshold (`GetNodeAllocatableReservation`), minus pre-allocated huge
//! pages (the `MachineInfo` status setter); its eviction manager measures the signal against the
//! same figure without the huge pages.
//!
//! Read with a plain `GET /api/v1/nodes/<name>` (RBAC: `get` on `nodes`, which the taint's
//! read-modify-write already needs); [`node_memory`] is the pure half, tested on its own.

use std::collections::BTreeMap;

use http::StatusCode;
use node_agent_policy::{Quantity, QuantityError};
use serde::Deserialize;
use serde_json::Value;

use crate::{
    api::{call, decode, node_path, ApiError, Context},
    transport::ApiRequest,
};

/// The field read, as operators find it in `kubectl get node -o yaml`.
pub const FIELD: &str = "status.allocatable.memory";

#[derive(Debug, thiserror::Error)]
pub enum AllocatableError {
    #[error("reading node {node}'s {FIELD}")]
    Api {
        node: String,
        #[source]
        source: Box<ApiError>,
    },
    #[error(
        "node {node}: {FIELD} is absent (the kubelet publishes it once it has registered the node)"
    )]
    Absent { node: String },
    #[error("node {node}: {FIELD} is {found}, not a quantity string")]
    NotAString { node: String, found: String },
    #[error("node {node}: {FIELD} {value:?} is not a quantity")]
    Quantity {
        node: String,
        value: String,
        #[source]
        source: QuantityError,
    },
    #[error("node {node}: {FIELD} {value:?} is negative")]
    Negative { node: String, value: String },
    #[error("node {node}: {FIELD} {value:?} is beyond what 64 bits of bytes hold")]
    OutOfRange { node: String, value: String },
}

impl AllocatableError {
    /// Whether the API could not be asked (the last figure read stays good), as opposed to a
    /// Node whose field is missing or wrong (the figure is unknown).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Self::Api { .. })
    }
}

/// The part of a Node this reads; everything else in the object is ignored.
#[derive(Debug, Default, Deserialize)]
pub struct NodeStatusPart {
    #[serde(default)]
    status: Option<StatusPart>,
}

#[derive(Debug, Default, Deserialize)]
struct StatusPart {
    #[serde(default)]
    allocatable: Option<BTreeMap<String, Value>>,
}

/// `status.allocatable.memory` of `node` in bytes, rounded up to a whole byte as
/// `Quantity.Value()` does. Zero is a figure (a node reserving all its memory), not an absence.
/// Pure.
pub fn node_memory(name: &str, node: &NodeStatusPart) -> Result<i64, AllocatableError> {
    let node_name = || name.to_string();
    let value = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get("memory"))
        .filter(|v| !v.is_null())
        .ok_or_else(|| AllocatableError::Absent { node: node_name() })?;
    let text = value.as_str().ok_or_else(|| AllocatableError::NotAString {
        node: node_name(),
        found: value.to_string(),
    })?;
    let quantity: Quantity = text.parse().map_err(|source| AllocatableError::Quantity {
        node: node_name(),
        value: text.to_string(),
        source,
    })?;
    if quantity.is_negative() {
        return Err(AllocatableError::Negative {
            node: node_name(),
            value: text.to_string(),
        });
    }
    quantity
        .checked_value()
        .map_err(|_| AllocatableError::OutOfRange {
            node: node_name(),
            value: text.to_string(),
        })
}

/// Reads the agent's Node and returns its allocatable memory in bytes (tries as the context's
/// backoff says; each failure is counted there).
pub async fn read(ctx: &Context) -> Result<i64, AllocatableError> {
    let get = ApiRequest::get(node_path(&ctx.node));
    let node: NodeStatusPart = ctx
        .backoff
        .run(&ctx.counters, "node read (allocatable memory)", || async {
            let resp = call(&ctx.transport, &get, &[StatusCode::OK]).await?;
            decode(ctx.transport.endpoint().name, &get, &resp, "v1.Node")
        })
        .await
        .map_err(|source| AllocatableError::Api {
            node: ctx.node.clone(),
            source: Box::new(source),
        })?;
    node_memory(&ctx.node, &node)
}

#[cfg(test)]
mod tests {
    use super::*;

    use node_agent_policy::error_chain as chain;

    #[test]
    fn allocatable_memory_is_read_in_bytes_or_refused_naming_the_field() {
        let gib = 1i64 << 30;
        // (behaviour, the Node's JSON, bytes or the words the error must contain)
        let rows: [(&str, &str, Result<i64, &str>); 12] = [
            (
                "binary suffix, as the kubelet writes it",
                r#"{"status": {"allocatable": {"cpu": "2", "memory": "3920072Ki"}}}"#,
                Ok(3920072 * 1024),
            ),
            (
                "decimal suffix",
                r#"{"status": {"allocatable": {"memory": "4G"}}}"#,
                Ok(4_000_000_000),
            ),
            (
                "plain bytes",
                r#"{"status": {"allocatable": {"memory": "1073741824"}}}"#,
                Ok(gib),
            ),
            (
                "a fraction of a byte rounds up, as Quantity.Value()",
                r#"{"status": {"allocatable": {"memory": "1500m"}}}"#,
                Ok(2),
            ),
            (
                "zero is a figure",
                r#"{"status": {"allocatable": {"memory": "0"}}}"#,
                Ok(0),
            ),
            (
                "no status",
                r#"{"metadata": {"name": "n1"}}"#,
                Err("node n1: status.allocatable.memory is absent"),
            ),
            (
                "allocatable without memory",
                r#"{"status": {"allocatable": {"cpu": "2"}}}"#,
                Err("status.allocatable.memory is absent"),
            ),
            (
                "null memory",
                r#"{"status": {"allocatable": {"memory": null}}}"#,
                Err("status.allocatable.memory is absent"),
            ),
            (
                "a number, not a quantity string",
                r#"{"status": {"allocatable": {"memory": 4096}}}"#,
                Err("status.allocatable.memory is 4096, not a quantity string"),
            ),
            (
                "not a quantity",
                r#"{"status": {"allocatable": {"memory": "lots"}}}"#,
                Err("status.allocatable.memory \"lots\" is not a quantity: quantities must match"),
            ),
            (
                "negative",
                r#"{"status": {"allocatable": {"memory": "-1Gi"}}}"#,
                Err("status.allocatable.memory \"-1Gi\" is negative"),
            ),
            (
                "beyond int64",
                r#"{"status": {"allocatable": {"memory": "100E"}}}"#,
                Err("\"100E\" is beyond what 64 bits of bytes hold"),
            ),
        ];
        for (what, json, want) in rows {
            let node: NodeStatusPart = serde_json::from_str(json).unwrap();
            match (node_memory("n1", &node), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{what}"),
                (Err(e), Err(needle)) => {
                    let text = chain(&e);
                    assert!(text.contains(needle), "{what}: {text}");
                    assert!(!e.is_unreachable(), "{what}: the Node answered");
                }
                (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
            }
        }
    }
}
