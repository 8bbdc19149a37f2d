//! `node-agent run`: the event-driven pressure loop.
//!
//! Data flows one way: kernel event (or a slow re-sync tick) → node reading → policy
//! evaluation among the pods the agent may act on → the acting plan (actions as data, pacing
//! included) → the one executor (`node_agent_executor`), whose every outcome comes back to the
//! loop. Kernel memory and PID crossings trigger an evaluation at once; while a threshold is
//! met or a memory trigger has fired, the node is re-read every `pressurePollInterval`;
//! otherwise only every `resyncInterval`, which just guards against drift and missed events.
//!
//! [`core`] holds the daemon and its one loop, [`evaluate`] the one evaluation the loop asks
//! for; its parts: the acting half (`node_agent_executor::Acts`: the plan and the executor,
//! started from the config by [`acting_config`]), [`kernel_side`] (the kernel feed and the lines it
//! arms, [`triggers`]), [`node`] (the node's layout and readings, with [`probe`] for
//! filesystems off the loop and [`allocatable`] for the Node's figure), [`feed`] (the
//! Kubernetes connection) and [`pods`], [`report`] (metrics, readiness, logs, the live stream
//! of [`live`]), and [`reload`] (the config watched off the loop), applied whole or refused by
//! [`reconfigure`]. What the loop does with a kernel OOM kill is in [`oom`]. [`wiring`] starts
//! everything; [`kubelet`] compares the kubelet's own thresholds with the agent's.

mod acting_config;
mod ahead;
mod allocatable;
pub mod config;
mod core;
mod error;
mod evaluate;
mod feed;
mod kernel_side;
mod kubelet;
mod live;
mod naming;
mod node;
mod oom;
mod pid_limit;
mod pods;
mod probe;
mod recent;
mod reconfigure;
mod reload;
mod report;
mod triggers;
mod wiring;

use std::path::PathBuf;

pub use error::DaemonError;
pub use wiring::run;

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The config file, a NodeAgentConfiguration (`node-agent check-config FILE` checks one).
    /// Without this flag, /etc/node-agent/config.yaml if it exists, else standalone mode with
    /// the kubelet's default thresholds.
    #[arg(long, env = "NODE_AGENT_CONFIG")]
    pub config: Option<PathBuf>,
    /// Decide and report everything, change nothing in the cluster, whatever the file's `dryRun`
    /// says (the flag can only hold the agent back; the base DaemonSet passes it).
    #[arg(long)]
    pub dry_run: bool,
    /// Address of /metrics, /healthz and /readyz (overrides `listen`).
    #[arg(long)]
    pub listen: Option<String>,
    /// Unix socket for `node-agent trace` (overrides `traceSocket`).
    #[arg(long)]
    pub trace_socket: Option<PathBuf>,
    /// Also print the live stream (kernel events and eviction decisions) on stdout.
    #[arg(long, value_enum, num_args = 0..=1, default_missing_value = "table")]
    pub trace: Option<crate::trace::OutputFormat>,
}

/// The signals the daemon reads, source by source (`telemetry` creates their counters at
/// start and checks its list against this).
#[cfg(test)]
pub(crate) fn observed_signals() -> impl Iterator<Item = node_agent_policy::Signal> {
    node::Source::ALL
        .into_iter()
        .flat_map(|source| source.signals().iter().copied())
}

/// Where the config is read from when `--config` is not given.
pub const DEFAULT_CONFIG: &str = "/etc/node-agent/config.yaml";
