//! `node-agent run`: the event-driven pressure loop.
//!
//! Data flows one way: kernel event (or a slow re-sync tick) → node reading → policy
//! evaluation among the pods the agent may act on → the acting plan (actions as data, pacing
//! included) → the one executor (`node_agent_executor`), whose every outcome comes back to the
//! loop. Kernel memory and PID crossings trigger an evaluation at once; while a threshold is
//! met or a memory trigger has fired, the node is re-read every `pressurePollInterval`;
//! otherwise only every `resyncInterval`, which just guards against drift and missed events.
//!
//! The agent is cut by part: [`crate::config`] (the file read, checked and watched),
//! [`crate::observe`] (the node's sources: readings, pods, the Kubernetes connection, the lines
//! armed in the kernel), [`crate::serve`] (what listens: the trace socket), and this module, the
//! loop and what it reports. [`core`] holds the daemon and its one loop, [`evaluate`] the one
//! evaluation the loop asks for, handing the plan to the acting half
//! (`node_agent_executor::Acts`, started from the config by [`acting_config`]); [`kernel_side`]
//! is the loop's hold on the kernel feed and the lines it arms; [`report`]
//! says what the loop did (metrics, readiness, logs, the live stream); [`reconfigure`] applies a
//! reload whole or refuses it; [`oom`] is what the loop does with a kernel OOM kill, with
//! [`recent`] what it saw before and [`ahead`] how fast memory falls. [`wiring`] starts
//! everything.

mod acting_config;
mod ahead;
mod core;
mod error;
mod evaluate;
mod kernel_side;
mod oom;
mod recent;
mod reconfigure;
mod report;
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
    crate::observe::node::Source::ALL
        .into_iter()
        .flat_map(|source| source.signals().iter().copied())
}
