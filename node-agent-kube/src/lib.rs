//! The node agent's Kubernetes side: the pods bound to this node and their usage (from the
//! kubelet, found from the node's own addresses ([`kubelet`]), through the API server's node
//! proxy, or from the API server's watch), the node's allocatable memory (from its Node
//! object), and the requests that change the cluster — evictions, events, the agent's node condition and its
//! pressure taint — which only the executor (`node-agent-executor`) sends.
//!
//! Data flows one way: a pod source hands out [`pods::PodSnapshot`]s of the policy's `PodInfo`,
//! stamped with the time they were observed; the daemon's policy decides; the executor acts
//! through [`evict`], [`events`], [`condition`] and [`taint`].

pub mod access;
pub mod allocatable;
pub mod api;
pub mod condition;
pub mod config;
pub mod events;
pub mod evict;
#[cfg(feature = "fake")]
pub mod fake;
pub mod handover;
pub mod kubelet;
pub mod pods;
pub mod taint;
mod time;
pub mod transport;
