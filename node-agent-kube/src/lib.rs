//! The node agent's Kubernetes side: the pods bound to this node and their usage (from the
//! kubelet or the API server), the node's allocatable memory (from its Node object), and the
//! one executor that changes the cluster: evictions, events,
//! the agent's node condition and its pressure taint.
//!
//! Data flows one way: a pod source hands out [`pods::PodSnapshot`]s of the policy's `PodInfo`,
//! stamped with the time they were observed; the daemon's policy decides; the one
//! [`executor::Executor`] acts (or in dry-run mode only says what it would do) and reports each
//! outcome back.

pub mod allocatable;
pub mod api;
pub mod condition;
pub mod config;
pub mod events;
pub mod evict;
pub mod executor;
#[cfg(feature = "fake")]
pub mod fake;
pub mod pacing;
pub mod pods;
pub mod reclaim;
pub mod taint;
mod time;
pub mod transport;
