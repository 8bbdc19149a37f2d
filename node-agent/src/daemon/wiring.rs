//! Wiring: the config checked, everything bound and loaded, then the loop started.

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    time::{Duration, Instant},
};

use node_agent_policy::PolicyState;
use tokio::sync::mpsc;

use super::{
    config::{AgentConfig, Overrides},
    kube::KubeSide,
    live::Live,
    observe::NodeSources,
    triggers::Triggers,
    Daemon, RunArgs, Signals, DEFAULT_CONFIG,
};
use crate::{
    cgroup::{self, CgroupIndex, Layout},
    ebpf::{KernelPrograms, LoadOptions},
    telemetry::{self, Health, Metrics},
};

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let overrides = Overrides {
        dry_run: args.dry_run,
        listen: args.listen.clone(),
        trace_socket: args.trace_socket.clone(),
        node_name: std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()),
    };
    // The whole config is validated before anything is loaded or bound.
    let config_path = match args.config {
        Some(path) => Some(path),
        None => Some(PathBuf::from(DEFAULT_CONFIG)).filter(|p| p.exists()),
    };
    let config = match &config_path {
        Some(path) => AgentConfig::load(path, &overrides)?,
        None => {
            tracing::info!("no config file ({DEFAULT_CONFIG} does not exist): standalone mode with the kubelet's default thresholds");
            AgentConfig::parse("", &overrides)?
        }
    };
    let layout = cgroup::detect()?;
    let node_dir = layout.memory.mount().join(
        config
            .settings
            .node_cgroup
            .strip_prefix("/")
            .unwrap_or(&config.settings.node_cgroup),
    );
    anyhow::ensure!(
        node_dir.is_dir(),
        "config: agent.node_cgroup: no cgroup at {} in the memory hierarchy",
        node_dir.display()
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(Daemon::start(
        config,
        config_path,
        overrides,
        layout,
        node_dir,
        args.trace,
    ))
}
impl Daemon {
    pub(super) async fn start(
        config: AgentConfig,
        config_path: Option<PathBuf>,
        overrides: Overrides,
        layout: Layout,
        node_dir: PathBuf,
        print: Option<crate::trace::OutputFormat>,
    ) -> anyhow::Result<()> {
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
        })?;
        let index = CgroupIndex::scan(layout.memory.mount())?;
        let kube = match &config.kubernetes {
            Some(k) => Some(KubeSide::start(
                k.clone(),
                config.dry_run(),
                config.settings.pod_refresh_interval,
                metrics.clone(),
            )?),
            None => None,
        };
        let bucket = match &config.kubernetes {
            Some(k) => node_agent_kube::pacing::TokenBucket::new(
                k.evictions_per_minute,
                k.eviction_burst,
                Instant::now(),
            ),
            None => node_agent_kube::pacing::TokenBucket::new(6, 1, Instant::now()),
        };
        let events = programs.events()?;
        // Signal handlers before anything says "running": a SIGHUP or SIGTERM from then on is
        // handled, never the default action.
        let signals = Signals {
            term: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?,
            hup: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?,
        };
        let sources = NodeSources {
            memory: layout.memory.clone(),
            node_dir: node_dir.clone(),
            is_root: node_dir == layout.memory.mount(),
            memory_capacity: config.settings.memory_capacity,
            nodefs: config.settings.nodefs_path.clone(),
            imagefs: config.settings.imagefs_path.clone(),
        };
        tracing::info!(
            %layout,
            memory = %programs.memory_mechanism(),
            mode = if config.kubernetes.is_some() { "kubernetes" } else { "standalone" },
            dry_run = config.dry_run(),
            node_cgroup = %node_dir.display(),
            "node-agent running"
        );
        let (finished_tx, finished_rx) = mpsc::channel(4);
        let config_mtime = config_path
            .as_ref()
            .and_then(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
        let mut daemon = Daemon {
            triggers: Triggers::new(&node_dir, layout.memory.mount()),
            config,
            config_path,
            config_mtime,
            overrides,
            layout,
            sources,
            programs,
            index,
            tracked: HashSet::new(),
            rescan: crate::cgroup::RescanSchedule::new(Duration::from_secs(60), Instant::now()),
            state: PolicyState::default(),
            started: Instant::now(),
            metrics,
            health: health.clone(),
            live,
            kube,
            bucket,
            in_flight: None,
            recently_decided: HashMap::new(),
            finished_tx,
            last_conditions: Vec::new(),
            last_met: HashSet::new(),
            pressure: false,
        };
        daemon.track_new_cgroups()?;
        daemon.set_pid_trigger()?;

        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(server.serve(async {
            let _ = stop_rx.await;
        }));
        let result = daemon.run_loop(events, finished_rx, signals).await;
        let _ = stop_tx.send(());
        let _ = serving.await;
        let _ = std::fs::remove_file(&socket_path);
        // Dropping the daemon detaches every program.
        drop(daemon);
        result
    }

    pub(super) fn now(&self) -> Duration {
        self.started.elapsed()
    }
}
