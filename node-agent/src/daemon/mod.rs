//! `node-agent run`: the event-driven pressure loop.
//!
//! Data flows one way: kernel event (or a slow re-sync tick) → node reading → policy
//! evaluation among the pods the agent may act on → actions (as data, from [`acting`]) → the
//! one executor (`node_agent_kube::executor`), whose every outcome comes back to the loop.
//! Kernel memory and PID crossings trigger an evaluation at once; while a threshold is met or a
//! memory trigger has fired, the node is re-read every `pressure_poll_interval`; otherwise only
//! every `resync_interval`, which just guards against drift and missed events.
//!
//! By role: [`wiring`] checks the config and starts everything, [`event_loop`] is the one
//! `select!`, [`evaluation`] reads, decides and reports, [`acting`] turns decisions and
//! outcomes into actions, [`reload`] applies a new config whole or refuses it, [`feed`] is the
//! Kubernetes connection, [`observe`], [`pods`] and [`triggers`] read the node, the pods and
//! arm the kernel, [`allocatable`] keeps the Node's allocatable memory (an input of the loop),
//! [`kubelet`] compares the kubelet's own thresholds with the agent's.

mod acting;
#[cfg(test)]
mod acting_reclaim_tests;
#[cfg(test)]
mod acting_tests;
mod allocatable;
pub mod config;
mod evaluation;
mod event_loop;
mod feed;
mod kubelet;
mod live;
mod observe;
mod pods;
mod reload;
mod triggers;
mod wiring;

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::Arc,
    time::{Instant, SystemTime},
};

pub use wiring::{run, DaemonError};

use node_agent_kube::{
    api::Counters,
    executor::{Action, Outcome, Settings},
};
use node_agent_policy::PolicyState;
use tokio::sync::{mpsc, watch};

use self::{
    acting::Acting,
    config::{AgentConfig, Overrides},
    feed::Cluster,
    live::Live,
    observe::{NodeSources, Source},
    triggers::Triggers,
};
use crate::{
    cgroup::{CgroupTracker, Layout},
    ebpf::KernelPrograms,
    telemetry::{Health, Metrics},
};

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
    observe::Source::ALL
        .into_iter()
        .flat_map(|source| source.signals().iter().copied())
}

/// Where the config is read from when `--config` is not given.
pub const DEFAULT_CONFIG: &str = "/etc/node-agent/config.yaml";

/// What triggered an evaluation: the kernel event's timestamp feeds the latency histogram.
#[derive(Debug, Clone, Copy)]
struct Trigger {
    name: &'static str,
    ktime_ns: Option<u64>,
}

impl Trigger {
    fn named(name: &'static str) -> Self {
        Self::at(name, None)
    }

    /// Every name is one of `telemetry::metrics::TRIGGERS`, whose counters exist from the
    /// start (checked in debug builds, which the end-to-end tests run).
    fn at(name: &'static str, ktime_ns: Option<u64>) -> Self {
        debug_assert!(
            crate::telemetry::TRIGGERS.contains(&name),
            "trigger {name} is missing from telemetry::TRIGGERS"
        );
        Self { name, ktime_ns }
    }
}

/// Where the config comes from, and what the file looked like when last read.
struct ConfigSource {
    path: Option<PathBuf>,
    mtime: Option<SystemTime>,
    overrides: Overrides,
}

/// The kernel side: programs, the cgroups they track, the memory and PID lines.
struct Kernel {
    programs: KernelPrograms,
    tracker: CgroupTracker,
    triggers: Triggers,
}

/// The acting side: the executor's channels and settings, and what the loop remembers.
struct Acts {
    actions: mpsc::Sender<Action>,
    outcomes: mpsc::Receiver<Outcome>,
    settings: watch::Sender<Settings>,
    state: Acting,
    /// When the runtime's images were last detected (the kubelet's `detectImages`).
    images_detected_at: Option<std::time::Duration>,
    /// Why the container runtime could not be reached the last time it was asked.
    runtime_error: Option<String>,
}

/// What operators see: metrics, health, the live stream.
struct Telemetry {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    live: Live,
}

/// The timers of the loop; rebuilt when a reload changes their intervals.
struct Timers {
    resync: tokio::time::Interval,
    poll: tokio::time::Interval,
}

struct Daemon {
    config: AgentConfig,
    source: ConfigSource,
    layout: Layout,
    node: NodeSources,
    kernel: Kernel,
    /// `None` in standalone mode.
    cluster: Option<Cluster>,
    /// The Node's allocatable memory, read while the config does not give it.
    allocatable: allocatable::AllocatableFeed,
    /// Failure counts of every Kubernetes client, across reconnects (exported to /metrics).
    kube_counters: Arc<Counters>,
    acts: Acts,
    policy: PolicyState,
    started: Instant,
    telemetry: Telemetry,
    timers: Timers,
    /// Re-read the node every `pressure_poll_interval`.
    pressure: bool,
    /// Sources that could not be read at the last evaluation.
    degraded: BTreeMap<Source, String>,
    /// The last decision to evict was refused for stale pod data.
    stale: bool,
}
