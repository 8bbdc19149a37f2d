//! `node-agent run`: the event-driven pressure loop.
//!
//! Data flows one way: kernel event (or a slow re-sync tick) → node reading → policy
//! evaluation → decision → the one executor. Kernel memory and PID crossings trigger an
//! evaluation at once; while a threshold is met or a memory trigger has fired, the node is
//! re-read every `pressure_poll_interval`; otherwise only every `resync_interval`, which just
//! guards against drift and missed events.

mod acting;
pub mod config;
mod evaluation;
mod event_loop;
mod kube;
mod live;
mod observe;
mod pods;
mod reload;
mod tracking;
mod triggers;
mod wiring;

pub use wiring::run;

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::Arc,
    time::{Instant, SystemTime},
};

use node_agent_policy::PolicyState;
use tokio::sync::mpsc;

use self::{
    config::{AgentConfig, Overrides},
    kube::KubeSide,
    live::Live,
    observe::NodeSources,
    triggers::Triggers,
};
use crate::{
    cgroup::{CgroupIndex, Layout},
    ebpf::KernelPrograms,
    telemetry::{Health, Metrics},
};

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The config file: eviction fields, `kubernetes:` (absent: standalone) and `agent:`.
    /// Without this flag, /etc/node-agent/config.yaml if it exists, else standalone mode with
    /// the kubelet's default thresholds.
    #[arg(long, env = "NODE_AGENT_CONFIG")]
    pub config: Option<PathBuf>,
    /// Decide and report everything, change nothing in the cluster.
    #[arg(long)]
    pub dry_run: bool,
    /// Address of /metrics, /healthz and /readyz (overrides `agent.listen`).
    #[arg(long)]
    pub listen: Option<String>,
    /// Unix socket for `node-agent trace` (overrides `agent.trace_socket`).
    #[arg(long)]
    pub trace_socket: Option<PathBuf>,
    /// Also print the live stream (kernel events and eviction decisions) on stdout.
    #[arg(long, value_enum, num_args = 0..=1, default_missing_value = "table")]
    pub trace: Option<crate::trace::OutputFormat>,
}

/// Where the config is read from when `--config` is not given.
pub const DEFAULT_CONFIG: &str = "/etc/node-agent/config.yaml";

/// What triggered an evaluation: the kernel event's timestamp feeds the latency histogram.
#[derive(Debug, Clone, Copy)]
struct Trigger {
    name: &'static str,
    ktime_ns: Option<u64>,
}

struct Signals {
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

/// A finished eviction attempt, reported back to the loop by the task that ran it.
struct Finished {
    uid: String,
}

struct Daemon {
    config: AgentConfig,
    config_path: Option<PathBuf>,
    config_mtime: Option<SystemTime>,
    overrides: Overrides,
    layout: Layout,
    sources: NodeSources,
    programs: KernelPrograms,
    index: CgroupIndex,
    tracked: HashSet<u64>,
    rescan: crate::cgroup::RescanSchedule,
    triggers: Triggers,
    state: PolicyState,
    started: Instant,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    live: Live,
    kube: Option<KubeSide>,
    bucket: node_agent_kube::pacing::TokenBucket,
    /// The pod being evicted (one at a time), and dry-run decisions recently reported, so a
    /// pod that is not going away is not reported again on every poll.
    in_flight: Option<String>,
    recently_decided: HashMap<String, Instant>,
    finished_tx: mpsc::Sender<Finished>,
    /// Conditions and met thresholds at the last evaluation, to report transitions once.
    last_conditions: Vec<node_agent_policy::NodeCondition>,
    last_met: HashSet<node_agent_policy::Signal>,
    pressure: bool,
}
