//! The node agent: loads the kernel programs, reads what they report, and (in later stages)
//! turns pressure into eviction decisions through the policy core in `node-agent-policy`.

pub mod btf;
pub mod cgroup;
pub mod daemon;
pub mod ebpf;
pub mod simulate;
pub mod sys;
pub mod telemetry;
pub mod trace;
