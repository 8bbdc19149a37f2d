//! Types shared by the kernel programs (`node-agent-ebpf`) and the agent (`node-agent`).
//!
//! Rules: `#[repr(C)]`, fixed-width integers and arrays only, explicit padding, no `bool`,
//! `Option` or pointers, and a size assertion per type, so both sides agree on every byte.
#![no_std]

pub mod tasks;

pub use tasks::TaskCounts;

/// Most cgroups the kernel side tracks at once (pods and their containers on one node,
/// plus the node-level cgroups). Sized for 1000 pods with a few containers each.
pub const MAX_TRACKED_CGROUPS: u32 = 8192;
