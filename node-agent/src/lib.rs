//! The node agent: loads the kernel programs, reads what they report ([`kernel`], each probe's
//! records decoded and attributed by its module in [`probes`]), and turns pressure into
//! eviction decisions through the policy core in `node-agent-policy`, acted on by the one
//! executor in `node-agent-executor` ([`run`], cut by part: [`config`], [`observe`], [`serve`]).

pub mod btf;
pub mod cgroup;
pub mod check_config;
pub mod config;
pub mod ebpf;
pub mod fs_helper;
pub mod inspect;
pub mod kernel;
pub mod logging;
mod observe;
pub mod probes;
pub mod run;
pub mod saw_before;
mod serve;
pub mod simulate;
pub mod sys;
pub mod telemetry;
pub mod trace;
pub mod yaml;

/// `node-agent --version`: the crate's version, the commit it was built from (or why that is
/// not known) and the compiler.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("NODE_AGENT_COMMIT"),
    ", rustc ",
    env!("NODE_AGENT_RUSTC"),
    ")"
);

pub use node_agent_policy::error_chain;
