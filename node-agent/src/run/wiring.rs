//! Wiring: the config checked, everything bound and loaded, the executor started, then the
//! loop; on the way out, everything detached.

use std::{path::PathBuf, sync::Arc, time::Duration};

use node_agent_kube::{access::Reviewer, api::Counters};

use crate::{
    cgroup::{self, Layout},
    ebpf::LoadOptions,
    inspect::{Identity, Inspect},
    kernel::KernelFeed,
    telemetry::{Health, Metrics},
};
use crate::{
    config::reload::{read_capped, Checks, ConfigWatcher},
    config::DEFAULT_CONFIG,
    config::{AgentConfig, Overrides},
    observe::feed::Cluster,
    observe::node::{Filesystems, Node, NodeLayout, NodeReading},
    run::acting_config,
    run::core::{Clock, Config, Daemon, Kube, Signals},
    run::error::DaemonError,
    run::kernel_side::{fork_limit, KernelSide},
    run::report::{inspect_mode, Reporter},
    run::RunArgs,
    serve::live::Live,
};

/// Compares the kubelet's thresholds with the agent's, off the loop (at start and after each
/// reload).
pub(super) fn check_kubelet(config: &AgentConfig, reading: &NodeReading) {
    crate::config::kubelet::check_off_loop(
        config.eviction.clone(),
        config.settings.kubelet_config.clone(),
        reading.capacities(),
    );
}

/// How long the runtime is given to wind down after the loop stops: a request in flight is
/// dropped, a filesystem probe hung in the kernel is left behind.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

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
        cri_endpoint: Overrides::cri_endpoint_from_env(),
    };
    // The whole config is validated before anything is loaded or bound.
    let path = args
        .config
        .or_else(|| Some(PathBuf::from(DEFAULT_CONFIG)).filter(|p| p.exists()));
    let (config, bytes) = match &path {
        Some(path) => {
            let bytes = read_capped(path)?;
            let config = AgentConfig::from_bytes(&bytes, &overrides)?;
            (config, bytes)
        }
        None => {
            tracing::info!("no config file ({DEFAULT_CONFIG} does not exist): standalone mode with the kubelet's default thresholds");
            (AgentConfig::standalone(&overrides)?, Vec::new())
        }
    };
    // The file's log format and level, where the command line leaves them to it.
    crate::logging::configure(config.settings.log_format, &config.settings.log_level);
    let layout = cgroup::detect()?;
    // Settings that parse but cannot be meant on this machine: refused before anything loads
    // (the same checks as `check-config --on-node`).
    let node_dir = crate::config::plausible::on_this_machine(&config, &layout)?;
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
    let watcher = match path {
        Some(path) => {
            let checks = Checks {
                overrides: overrides.clone(),
                memory: layout.memory.clone(),
                node_dir: node_dir.clone(),
            };
            Some(ConfigWatcher::start(path, bytes, checks).map_err(DaemonError::Runtime)?)
        }
        None => None,
    };
    let config = Config {
        current: config,
        overrides,
        watcher,
    };
    let result = runtime.block_on(start(config, layout, node_dir, args.trace));
    // Whatever is still running (a request, a probe's thread in the kernel) does not hold the
    // exit up.
    runtime.shutdown_timeout(SHUTDOWN_GRACE);
    result
}

async fn start(
    config: Config,
    layout: Layout,
    node_dir: PathBuf,
    print: Option<crate::trace::OutputFormat>,
) -> Result<(), DaemonError> {
    let settings = &config.current.settings;
    let metrics = Metrics::new();
    let health = Health::new(Duration::from_secs(30));
    // Who may read /metrics: under `kubernetes`, reviewed through the API server connection
    // once it is made (and again after a reload makes a new one).
    let (reviewer, reviewer_rx) = tokio::sync::watch::channel(None);
    let gate = crate::serve::Gate::new(settings.metrics_access, reviewer_rx, metrics.clone());
    let server = crate::serve::bind(settings.listen, metrics.clone(), health.clone())
        .await?
        .guarded_by(gate);
    let (live, _accept) = Live::bind(&settings.trace_socket).await?;
    if let Some(format) = print {
        live.print(format);
    }
    let inspect = Inspect::new(
        Identity {
            node: config
                .current
                .kubernetes
                .as_ref()
                .map(|k| k.node_name.clone()),
            pod: config
                .overrides
                .own_pod
                .as_ref()
                .map(|(ns, n)| format!("{ns}/{n}")),
        },
        inspect_mode(&config.current),
        health.clone(),
    );
    let inspect_server = match settings.inspect_listen {
        Some(addr) => {
            let subscribe: crate::serve::inspect::Subscribe = {
                let live = live.clone();
                Arc::new(move || live.subscribe())
            };
            Some(
                crate::serve::inspect::bind(addr, inspect.clone(), subscribe, metrics.clone())
                    .await?,
            )
        }
        None => None,
    };
    let socket_path = settings.trace_socket.clone();
    let options = LoadOptions {
        ring_bytes: settings.ring_bytes,
        ..LoadOptions::default()
    };
    let (feed, tracked) =
        KernelFeed::start(&options, layout.memory.mount(), fork_limit(&config.current))?;
    let kube = match &config.current.kubernetes {
        Some(k) => {
            let counters = Arc::new(Counters::default());
            metrics.export_kube_counters(counters.clone());
            let cluster = Cluster::connect(
                k,
                config.current.settings.pod_refresh_interval,
                counters.clone(),
                metrics.clone(),
                health.clone(),
            )?;
            reviewer.send_replace(Some(Arc::new(Reviewer::new(cluster.api.clone()))));
            Some(Kube {
                cluster,
                counters,
                reviewer,
                naming: Default::default(),
            })
        }
        None => None,
    };
    crate::observe::pid_limit::say_namespace();
    let clock = Clock::new(&config.current);
    let acts = acting_config::start(
        &config.current,
        kube.as_ref().map(|k| &k.cluster),
        &config.overrides,
        clock.now(),
    );
    // Signal handlers before anything says "running": a SIGHUP or SIGTERM from then on is
    // handled, never the default action.
    let signals = Signals::new().map_err(DaemonError::Runtime)?;
    let settings = &config.current.settings;
    let mut node_layout = NodeLayout::new(layout.memory.clone(), node_dir);
    // The kubelet's pods cgroup is below its cgroupRoot (kind's /kubelet, not kubeadm's /).
    if let Some(root) =
        crate::config::kubelet::cgroup_root(config.current.settings.kubelet_config.as_deref())
    {
        node_layout = match node_layout.clone().with_kubelet_root(&root) {
            Ok(l) => {
                tracing::info!(cgroup_root = %root, pods_parent = %l.pods_parent.display(), "the kubelet's pods cgroup is below its cgroupRoot");
                l
            }
            Err(outside) => {
                tracing::warn!(cgroup_root = %root, dir = %outside.display(), "the kubelet's cgroupRoot is outside nodeCgroup: its pods cgroup is looked for below nodeCgroup instead");
                node_layout
            }
        };
    }
    let fs = Filesystems::new(&settings.nodefs_path, settings.imagefs_path.as_deref())
        .map_err(DaemonError::Runtime)?;
    let node = Node::new(node_layout, settings.memory_capacity, fs);
    let kernel = KernelSide::new(feed, &node.layout);
    tracing::info!(
        %layout,
        memory = %kernel.feed.memory_mechanism(),
        mode = if kube.is_some() { "kubernetes" } else { "standalone" },
        dry_run = config.current.dry_run(),
        node_cgroup = %node.layout.node_dir.display(),
        nodefs = %node.fs.nodefs().display(),
        "node-agent running"
    );
    metrics.set_memory_mechanism(kernel.feed.memory_mechanism());
    inspect.set_memory_mechanism(kernel.feed.memory_mechanism().short_name());
    check_kubelet(&config.current, &node.read());
    match &config.current.runtime {
        Some(r) => tracing::info!(endpoint = %r.settings.endpoint,
            from = if config.overrides.cri_endpoint.is_some() { crate::config::CRI_ENDPOINT_VAR } else { "cri.endpoint" },
            "node-level reclaim through the container runtime before evicting for disk pressure; the runtime's ImageFsInfo decides the filesystem layout"),
        None if config.current.cri_unused => tracing::warn!(
            "cri: is set but not used: node-level reclaim needs the pod list (kubernetes:)"
        ),
        None => {}
    }
    metrics.set_hard_evictions_on_node(acts.kills_on_node());
    let report = Reporter::new(metrics, health, live, inspect);
    let mut daemon = Daemon {
        config,
        node,
        ahead: Default::default(),
        kernel,
        kube,
        acts,
        policy: Default::default(),
        report,
        clock,
    };
    daemon.kernel.rescanned(tracked, &daemon.report);

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.serve(async {
        let _ = stop_rx.await;
    }));
    let (inspect_stop, inspect_stopped) = tokio::sync::oneshot::channel::<()>();
    let inspecting = inspect_server.map(|s| {
        tokio::spawn(s.serve(async {
            let _ = inspect_stopped.await;
        }))
    });
    let result = daemon.run(signals).await;
    let _ = stop_tx.send(());
    let _ = inspect_stop.send(());
    let _ = serving.await;
    if let Some(inspecting) = inspecting {
        let _ = inspecting.await;
    }
    let _ = std::fs::remove_file(&socket_path);
    // Dropping the daemon detaches every program and stops the executor.
    drop(daemon);
    result
}
