//! Wiring: the config checked, everything bound and loaded, the executor started, then the
//! loop; on the way out, everything detached.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use node_agent_cri::reclaim::FsLayout;
use node_agent_kube::{api::Counters, executor};
use node_agent_policy::{Eligibility, PolicyState};

use super::{
    acting::{Acting, NodeReclaim, Timing},
    config::{AgentConfig, ConfigError, Overrides},
    feed::{Cluster, KubeSetupError},
    live::{Live, LiveError},
    observe::NodeSources,
    triggers::Triggers,
    Acts, ConfigSource, Daemon, Kernel, RunArgs, Telemetry, Timers, DEFAULT_CONFIG,
};
use crate::{
    cgroup::{self, CgroupTracker, ForkLimit, Layout},
    ebpf::{KernelPrograms, LoadOptions},
    telemetry::{self, Health, Metrics},
};

/// Why the daemon could not start or had to stop. Each names what was wrong.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("config: agent.node_cgroup: no cgroup at {0} in the memory hierarchy")]
    NodeCgroup(PathBuf),
    #[error(transparent)]
    Hierarchy(#[from] cgroup::HierarchyError),
    #[error("starting the runtime or the signal handlers")]
    Runtime(#[source] std::io::Error),
    #[error(transparent)]
    Telemetry(#[from] telemetry::TelemetryError),
    #[error(transparent)]
    Live(#[from] LiveError),
    #[error(transparent)]
    Load(#[from] crate::ebpf::LoadError),
    #[error(transparent)]
    Control(#[from] crate::ebpf::ControlError),
    #[error(transparent)]
    Track(#[from] cgroup::TrackError),
    #[error(transparent)]
    Kube(#[from] KubeSetupError),
    #[error("reading the kernel programs' ring buffer")]
    Events(#[source] std::io::Error),
    #[error("the executor stopped")]
    ExecutorStopped,
}

pub fn run(args: RunArgs) -> Result<(), DaemonError> {
    let own_pod = match (std::env::var("POD_NAMESPACE"), std::env::var("POD_NAME")) {
        (Ok(ns), Ok(name)) if !ns.is_empty() && !name.is_empty() => Some((ns, name)),
        _ => None,
    };
    let overrides = Overrides {
        dry_run: args.dry_run,
        listen: args.listen.clone(),
        trace_socket: args.trace_socket.clone(),
        node_name: std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()),
        own_pod,
    };
    // The whole config is validated before anything is loaded or bound.
    let path = args
        .config
        .or_else(|| Some(PathBuf::from(DEFAULT_CONFIG)).filter(|p| p.exists()));
    let config = match &path {
        Some(path) => AgentConfig::load(path, &overrides)?,
        None => {
            tracing::info!("no config file ({DEFAULT_CONFIG} does not exist): standalone mode with the kubelet's default thresholds");
            AgentConfig::standalone(&overrides)?
        }
    };
    let layout = cgroup::detect()?;
    let node_dir = node_dir(&layout, &config);
    if !node_dir.is_dir() {
        return Err(DaemonError::NodeCgroup(node_dir));
    }
    // Settings that parse but cannot be meant on this machine: refused before anything loads.
    super::config::checks::check_on_machine(&config.settings, &layout.memory, &node_dir)?;
    // The workers read the ring buffer: a short slice lets one woken by a kernel event run at
    // once on a CPU a memory-hungry task keeps busy (see `sys::ask_for_short_slice`).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .on_thread_start(|| {
            if let Err(e) = crate::sys::ask_for_short_slice() {
                tracing::debug!(error = %e, "the scheduler refused a short slice for a runtime thread");
            }
        })
        .enable_all()
        .build()
        .map_err(DaemonError::Runtime)?;
    let mtime = path
        .as_ref()
        .and_then(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
    let source = ConfigSource {
        path,
        mtime,
        overrides,
    };
    runtime.block_on(Daemon::start(config, source, layout, node_dir, args.trace))
}

fn node_dir(layout: &Layout, config: &AgentConfig) -> PathBuf {
    let cg = &config.settings.node_cgroup;
    layout
        .memory
        .mount()
        .join(cg.strip_prefix("/").unwrap_or(cg))
}

/// The fork limit the settings ask for (0: none).
pub(super) fn fork_limit(config: &AgentConfig) -> Option<ForkLimit> {
    (config.settings.fork_limit > 0).then_some(ForkLimit {
        max_forks: config.settings.fork_limit,
        window: config.settings.fork_window,
    })
}

impl Daemon {
    async fn start(
        config: AgentConfig,
        source: ConfigSource,
        layout: Layout,
        node_dir: PathBuf,
        print: Option<crate::trace::OutputFormat>,
    ) -> Result<(), DaemonError> {
        let metrics = Metrics::new();
        let health = Health::new(Duration::from_secs(30));
        let server =
            telemetry::bind(config.settings.listen, metrics.clone(), health.clone()).await?;
        let (live, _accept) = Live::bind(&config.settings.trace_socket).await?;
        if let Some(format) = print {
            live.print(format);
        }
        let socket_path = config.settings.trace_socket.clone();

        let mut programs = KernelPrograms::load_with(&LoadOptions {
            ring_bytes: config.settings.ring_bytes,
            ..LoadOptions::default()
        })?;
        let mut tracker = CgroupTracker::new(layout.memory.mount(), fork_limit(&config))?;
        let kube_counters = Arc::new(Counters::default());
        metrics.export_kube_counters(kube_counters.clone());
        let cluster = match &config.kubernetes {
            Some(k) => Some(Cluster::connect(
                k,
                config.settings.pod_refresh_interval,
                kube_counters.clone(),
                metrics.clone(),
                health.clone(),
            )?),
            None => None,
        };
        let (settings_tx, settings_rx) = tokio::sync::watch::channel(executor_settings(
            &config,
            cluster.as_ref(),
            &source.overrides,
            0,
        ));
        let (actions, outcomes, _executor) = executor::spawn(settings_rx, 16);
        let events = programs.events()?;
        // Signal handlers before anything says "running": a SIGHUP or SIGTERM from then on is
        // handled, never the default action.
        let signals = super::event_loop::Signals::new().map_err(DaemonError::Runtime)?;
        let node = NodeSources {
            memory: layout.memory.clone(),
            is_root: node_dir == layout.memory.mount(),
            node_dir: node_dir.clone(),
            memory_capacity: config.settings.memory_capacity,
            allocatable: super::allocatable::Allocatable::NotObserved,
            nodefs: config.settings.nodefs_path.clone(),
            imagefs: config.settings.imagefs_path.clone(),
        };
        tracing::info!(
            %layout,
            memory = %programs.memory_mechanism(),
            mode = if config.kubernetes.is_some() { "kubernetes" } else { "standalone" },
            dry_run = config.dry_run(),
            node_cgroup = %node_dir.display(),
            nodefs = %node.nodefs.display(),
            "node-agent running"
        );
        metrics.set_memory_mechanism(programs.memory_mechanism());
        super::kubelet::warn_if_kubelet_acts_first(&config, &node);
        match &config.runtime {
            Some(r) => tracing::info!(endpoint = %r.settings.endpoint,
                "node-level reclaim through the container runtime before evicting for disk pressure"),
            None if config.cri_unused => tracing::warn!(
                "cri: is set but not used: node-level reclaim needs the pod list (kubernetes:)"
            ),
            None => {}
        }
        let tracked = tracker.refresh(&mut programs)?;
        metrics.set_tracked_cgroups(
            tracked.tracked as i64,
            tracked.untracked as i64,
            tracked.cap_reached,
        );
        let mut daemon = Daemon {
            kernel: Kernel {
                triggers: Triggers::new(&node_dir, layout.memory.mount()),
                programs,
                tracker,
            },
            timers: Timers::new(&config),
            cluster,
            allocatable: Default::default(),
            kube_counters,
            acts: Acts {
                actions,
                outcomes,
                settings: settings_tx,
                state: Acting::with_node_reclaim(node_reclaim(&config)),
                images_detected_at: None,
                runtime_error: None,
            },
            config,
            source,
            layout,
            node,
            policy: PolicyState::default(),
            started: Instant::now(),
            telemetry: Telemetry {
                metrics,
                health: health.clone(),
                live,
            },
            pressure: false,
            degraded: BTreeMap::new(),
            stale: false,
        };
        daemon.sync_allocatable();
        daemon
            .kernel
            .triggers
            .refresh_targets(daemon.kernel.tracker.index());
        daemon.set_pid_trigger();

        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(server.serve(async {
            let _ = stop_rx.await;
        }));
        let result = daemon.run_loop(events, signals).await;
        let _ = stop_tx.send(());
        let _ = serving.await;
        let _ = std::fs::remove_file(&socket_path);
        // Dropping the daemon detaches every program and stops the executor.
        drop(daemon);
        result
    }

    pub(super) fn now(&self) -> Duration {
        self.started.elapsed()
    }

    /// The agent's own pod and the exclusions: who must never be evicted, whatever happens.
    pub(super) fn base_eligibility(&self) -> Eligibility {
        base_eligibility(&self.config, &self.source.overrides)
    }

    pub(super) fn timing(&self) -> Timing {
        timing(&self.config)
    }
}

fn base_eligibility(config: &AgentConfig, overrides: &Overrides) -> Eligibility {
    Eligibility {
        own_pod: overrides.own_pod.clone(),
        exclusions: config
            .kubernetes
            .as_ref()
            .map(|k| k.exclusions.clone())
            .unwrap_or_default(),
        ..Eligibility::default()
    }
}

fn timing(config: &AgentConfig) -> Timing {
    let (per_minute, _) = config.pacing();
    let k = config.kubernetes.as_ref();
    Timing {
        pass_over: k.map_or(Duration::from_secs(30), |k| k.pass_over()),
        wait_timeout: k.map_or(Duration::from_secs(30), |k| k.eviction_wait_timeout()),
        failed: Duration::from_secs(60) / per_minute.max(1),
    }
}

/// What the executor works with, from the config (and the cluster connection).
pub(super) fn executor_settings(
    config: &AgentConfig,
    cluster: Option<&Cluster>,
    overrides: &Overrides,
    generation: u64,
) -> executor::Settings {
    let (evictions_per_minute, eviction_burst) = config.pacing();
    executor::Settings {
        cluster: cluster.map(|c| c.api.clone()),
        generation,
        dry_run: config.dry_run(),
        pdb_policy: config
            .kubernetes
            .as_ref()
            .map_or(node_agent_kube::config::PdbPolicy::Respect, |k| {
                k.pdb_policy
            }),
        evictions_per_minute,
        eviction_burst,
        eligibility: base_eligibility(config, overrides),
        taint: config.kubernetes.as_ref().is_some_and(|k| k.taint),
        runtime: config.runtime.clone(),
    }
}

/// Node-level reclaim from the config: with a runtime (Kubernetes mode), at most once per
/// resync interval, images on `imagefs` when it is configured.
pub(super) fn node_reclaim(config: &AgentConfig) -> Option<NodeReclaim> {
    config.runtime.as_ref()?;
    Some(NodeReclaim {
        layout: if config.settings.imagefs_path.is_some() {
            FsLayout::SeparateImageFs
        } else {
            FsLayout::Shared
        },
        interval: config.settings.resync_interval,
    })
}

impl Timers {
    pub(super) fn new(config: &AgentConfig) -> Self {
        let mut resync = tokio::time::interval(config.settings.resync_interval);
        let mut poll = tokio::time::interval(config.settings.pressure_poll_interval);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self { resync, poll }
    }
}
