//! `node-agent run`: the event-driven pressure loop.
//!
//! Data flows one way: kernel event (or a slow re-sync tick) → node reading → policy
//! evaluation → decision → the one executor. Kernel memory and PID crossings trigger an
//! evaluation at once; while a threshold is met or a memory trigger has fired, the node is
//! re-read every `pressure_poll_interval`; otherwise only every `resync_interval`, which just
//! guards against drift and missed events.

pub mod config;
mod kube;
mod live;
mod observe;
mod pods;
mod triggers;

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use node_agent_kube::{events as kube_events, evict::EvictionOutcome, pods::PodSnapshot};
use node_agent_policy::{evaluate, Decision, PodInfo, PolicyState};
use tokio::sync::mpsc;

use self::{
    config::{AgentConfig, Overrides},
    kube::KubeSide,
    live::Live,
    observe::{read_node, NodeReading, NodeSources},
    triggers::Triggers,
};
use crate::{
    cgroup::{self, CgroupIndex, Layout},
    ebpf::{KernelEvent, KernelPrograms, LoadOptions},
    telemetry::{self, Health, Metrics},
    trace::Record,
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
    // Settings that parse but cannot be meant on this machine (issue 12): refused before
    // anything is loaded.
    config::checks::check_on_machine(&config.settings, &layout.memory, &node_dir)?;
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

impl Daemon {
    async fn start(
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
            ..LoadOptions::default()
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

    fn now(&self) -> Duration {
        self.started.elapsed()
    }

    async fn run_loop(
        &mut self,
        mut events: crate::ebpf::EventStream,
        mut finished_rx: mpsc::Receiver<Finished>,
        mut signals: Signals,
    ) -> anyhow::Result<()> {
        let mut resync = tokio::time::interval(self.config.settings.resync_interval);
        let mut poll = tokio::time::interval(self.config.settings.pressure_poll_interval);
        let mut housekeeping = tokio::time::interval(Duration::from_secs(1));
        let mut lost_before = 0u64;
        self.evaluate(Trigger {
            name: "start",
            ktime_ns: None,
        })
        .await;
        self.health.set_ready(true);
        loop {
            self.health.beat();
            tokio::select! {
                batch = events.next_batch() => {
                    let mut trigger = None;
                    for record in batch? {
                        match record {
                            Ok(event) => {
                                if let Some(t) = self.on_kernel_event(&event).await {
                                    trigger.get_or_insert(t);
                                }
                            }
                            Err(e) => {
                                self.metrics.decode_error();
                                tracing::warn!(error = %e, "undecodable kernel record");
                            }
                        }
                    }
                    if let Some(t) = trigger {
                        self.evaluate(t).await;
                    }
                }
                _ = poll.tick(), if self.pressure => self.evaluate(Trigger { name: "pressure_poll", ktime_ns: None }).await,
                _ = resync.tick() => self.evaluate(Trigger { name: "resync", ktime_ns: None }).await,
                Some(done) = finished_rx.recv() => {
                    if self.in_flight.as_deref() == Some(done.uid.as_str()) {
                        self.in_flight = None;
                    }
                    self.evaluate(Trigger { name: "eviction_done", ktime_ns: None }).await;
                }
                _ = housekeeping.tick() => {
                    let per_cpu = self.programs.lost_events()?;
                    let total: u64 = per_cpu.iter().sum();
                    if total > lost_before {
                        self.metrics.ring_lost(total - lost_before);
                        let rec = Record::EventsLost { time: crate::sys::now_rfc3339(), lost: total - lost_before, total_per_cpu: per_cpu };
                        tracing::warn!(lost = total - lost_before, "kernel events lost: ring buffer full");
                        self.live.publish(&rec);
                        lost_before = total;
                    }
                    if self.rescan.due(Instant::now()) {
                        if let Err(e) = self.track_new_cgroups() {
                            tracing::warn!(error = %e, "rescanning cgroups");
                        }
                    }
                    if self.config_changed() {
                        self.reload("config file changed");
                    }
                }
                _ = signals.hup.recv() => self.reload("SIGHUP"),
                _ = signals.term.recv() => break,
                _ = tokio::signal::ctrl_c() => break,
            }
        }
        tracing::info!("shutting down: detaching kernel programs");
        Ok(())
    }

    /// Records and publishes a kernel event; returns a trigger when it touches a signal.
    async fn on_kernel_event(&mut self, event: &KernelEvent) -> Option<Trigger> {
        let ktime_ns = event.header().ktime_ns;
        // A cgroup newer than the last rescan (a pod that just started): rescan before
        // attributing, so the event names its pod.
        let cgroup = match event {
            KernelEvent::OomKill(e) => Some(e.cgroup_id),
            KernelEvent::ForkStorm(e) => Some(e.cgroup_id),
            KernelEvent::MemoryThreshold(_)
            | KernelEvent::PidThreshold(_)
            | KernelEvent::CgroupChange(_) => None,
        };
        if cgroup.is_some_and(|id| self.index.lookup(id).is_none()) {
            if let Err(e) = self.track_new_cgroups() {
                tracing::warn!(error = %e, "rescanning cgroups");
            }
        }
        let Some(record) = Record::from_event(
            event,
            &self.index,
            crate::sys::ktime_rfc3339(ktime_ns),
            crate::sys::page_size(),
        ) else {
            // A cgroup came or went: rescan at the next housekeeping tick.
            self.rescan.mark();
            return None;
        };
        self.metrics.kernel_event(record.kind());
        self.live.publish(&record);
        match event {
            KernelEvent::MemoryThreshold(m) => {
                if m.direction == node_agent_common::DIRECTION_UP {
                    self.triggers.crossed(m.cgroup_id);
                }
                Some(Trigger {
                    name: "memory_threshold",
                    ktime_ns: Some(ktime_ns),
                })
            }
            KernelEvent::PidThreshold(_) => Some(Trigger {
                name: "pid_threshold",
                ktime_ns: Some(ktime_ns),
            }),
            KernelEvent::OomKill(oom) => {
                self.on_oom(&record, oom).await;
                Some(Trigger {
                    name: "oom_kill",
                    ktime_ns: Some(ktime_ns),
                })
            }
            KernelEvent::ForkStorm(_) | KernelEvent::CgroupChange(_) => None,
        }
    }

    /// An OOM kill: counted by namespace and, with a cluster, reported on the node as
    /// `OOMKilling` naming the process and its pod.
    async fn on_oom(&mut self, record: &Record, oom: &node_agent_common::OomKillEvent) {
        let uid = record.pod_uid().map(str::to_string);
        let pod = uid.as_deref().and_then(|uid| {
            self.snapshot()
                .and_then(|s| s.pods.iter().find(|p| p.uid == uid).cloned())
        });
        self.metrics
            .oom_kill(pod.as_ref().map(|p| p.namespace.as_str()).unwrap_or(""));
        if let Some(kube) = &self.kube {
            let kill = kube_events::OomKill {
                pid: oom.pid,
                comm: crate::ebpf::events::comm(&oom.comm),
                pod: pod.map(|p| (p.namespace, p.name)),
            };
            let event =
                kube_events::build_oom_killing(&kube.config.node_name, &kill, SystemTime::now());
            let executor = kube.executor.clone();
            let metrics = self.metrics.clone();
            tokio::spawn(async move {
                if executor.events().post(&event).await.is_err() {
                    metrics.kube_error("oom event");
                }
            });
        }
    }

    fn snapshot(&self) -> Option<PodSnapshot> {
        self.kube
            .as_ref()
            .and_then(|k| k.snapshots.borrow().clone())
    }

    /// Reads the node, runs the policy, reports, and hands at most one eviction to the
    /// executor.
    async fn evaluate(&mut self, trigger: Trigger) {
        self.metrics.evaluation(trigger.name);
        let reading = match read_node(&self.sources) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "reading the node; no decision this time");
                return;
            }
        };
        let (pods, usable) = self.pods();
        let now = self.now();
        let (mut decision, mut state) = evaluate(
            &self.config.eviction,
            &reading.capacity,
            &reading.observations,
            &pods,
            now,
            &self.state,
        );
        // Ranking needs current usage: when a pod is to go, re-read every pod's cgroup and
        // decide again from the same starting state.
        if decision.evict.is_some() {
            let fresh = self.pods_with_fresh_usage(&pods);
            (decision, state) = evaluate(
                &self.config.eviction,
                &reading.capacity,
                &reading.observations,
                &fresh,
                now,
                &self.state,
            );
        }
        self.state = state;
        if let Some(k) = trigger.ktime_ns {
            let latency = crate::sys::monotonic_ns().saturating_sub(k) as f64 / 1e9;
            self.metrics.decision_latency(trigger.name, latency);
        }
        self.report(&reading, &decision);
        self.rearm_memory_trigger(&reading);
        // Without the memcg tracepoints the kernel cannot report memory growth: the node is
        // then re-read every pressure_poll_interval all the time (cheap: a few cgroupfs reads).
        self.pressure = !decision.thresholds_met.is_empty()
            || self.triggers.memory_fired()
            || self.programs.memory_mechanism() == crate::ebpf::MemoryMechanism::Unavailable;
        if let Some(eviction) = decision.evict.clone() {
            if !usable {
                self.metrics.stale_data("pods");
                tracing::warn!(
                    "a threshold is met but the pod data is stale or missing: not evicting"
                );
            } else {
                self.execute(eviction, &pods, trigger);
            }
        }
    }

    /// The pods to rank, and whether they are fresh enough to act on.
    fn pods(&self) -> (Vec<PodInfo>, bool) {
        match &self.kube {
            Some(kube) => {
                let Some(snapshot) = self.snapshot() else {
                    return (Vec::new(), false);
                };
                let fresh = snapshot
                    .check_fresh(SystemTime::now(), kube.config.staleness_bound())
                    .is_ok();
                let infos = snapshot
                    .pods
                    .iter()
                    .map(|p| pods::pod_info(p, None))
                    .collect();
                (infos, fresh)
            }
            None => {
                let infos =
                    pods::standalone_workloads(&self.index, &self.config.settings.node_cgroup)
                        .into_iter()
                        .map(|(name, _)| pods::standalone_pod(&name, None))
                        .collect();
                (infos, true)
            }
        }
    }

    /// The same pods with memory working sets read now from their cgroups.
    fn pods_with_fresh_usage(&self, pods_in: &[PodInfo]) -> Vec<PodInfo> {
        let version = self.layout.memory.version();
        match &self.kube {
            Some(_) => {
                let cgroups = pods::pod_cgroups(&self.index, &self.config.settings.node_cgroup);
                let snapshot = self.snapshot();
                pods_in
                    .iter()
                    .map(|info| {
                        let fresh = info
                            .uid
                            .as_ref()
                            .and_then(|u| cgroups.get(u))
                            .and_then(|d| pods::working_set(d, version));
                        match (
                            snapshot.as_ref().and_then(|s| {
                                s.pods.iter().find(|p| Some(&p.uid) == info.uid.as_ref())
                            }),
                            fresh,
                        ) {
                            (Some(pod), Some(_)) => pods::pod_info(pod, fresh),
                            _ => info.clone(),
                        }
                    })
                    .collect()
            }
            None => pods::standalone_workloads(&self.index, &self.config.settings.node_cgroup)
                .into_iter()
                .map(|(name, dir)| pods::standalone_pod(&name, pods::working_set(&dir, version)))
                .collect(),
        }
    }

    /// Metrics, node condition and node events for this decision.
    fn report(&mut self, reading: &NodeReading, decision: &Decision) {
        for (signal, obs) in &reading.observations {
            self.metrics
                .set_signal_available(signal.as_str(), obs.available);
        }
        let met: HashSet<_> = decision.thresholds_met.iter().map(|t| t.signal).collect();
        for t in self.config.eviction.thresholds() {
            let is_met = decision
                .thresholds_met
                .iter()
                .any(|m| m.signal == t.signal && m.hard == t.is_hard());
            self.metrics
                .set_threshold_met(t.signal.as_str(), t.is_hard(), is_met);
        }
        for c in [
            node_agent_policy::NodeCondition::MemoryPressure,
            node_agent_policy::NodeCondition::DiskPressure,
            node_agent_policy::NodeCondition::PidPressure,
        ] {
            self.metrics
                .set_condition(c.as_str(), decision.conditions.contains(&c));
        }
        if let Some(kube) = &self.kube {
            for signal in met.difference(&self.last_met) {
                let event = kube_events::build_threshold_met(
                    &kube.config.node_name,
                    signal.resource().as_str(),
                    SystemTime::now(),
                );
                let executor = kube.executor.clone();
                let metrics = self.metrics.clone();
                tokio::spawn(async move {
                    if executor.events().post(&event).await.is_err() {
                        metrics.kube_error("threshold event");
                    }
                });
            }
            if decision.conditions != self.last_conditions {
                let pressure = !decision.conditions.is_empty();
                let names: Vec<_> = decision.conditions.iter().map(|c| c.as_str()).collect();
                let message = if pressure {
                    format!("node-agent sees {}", names.join(", "))
                } else {
                    "node-agent sees no pressure".to_string()
                };
                let reason = if pressure {
                    "PressureDetected"
                } else {
                    "NoPressure"
                };
                let mut reporter = kube.conditions.clone();
                let metrics = self.metrics.clone();
                tokio::spawn(async move {
                    if reporter
                        .report(pressure, reason, &message, SystemTime::now())
                        .await
                        .is_err()
                    {
                        metrics.kube_error("node condition");
                    }
                });
            }
        }
        if met != self.last_met {
            tracing::info!(thresholds_met = ?met, conditions = ?decision.conditions, "pressure changed");
        }
        self.last_met = met;
        self.last_conditions = decision.conditions.clone();
    }

    /// Hands one eviction to the executor, or reports it in dry-run/standalone mode.
    fn execute(&mut self, e: node_agent_policy::Eviction, pods: &[PodInfo], trigger: Trigger) {
        let key = e
            .uid
            .clone()
            .unwrap_or_else(|| format!("{}/{}", e.namespace, e.name));
        if self.in_flight.is_some() {
            return;
        }
        let wait = self
            .config
            .kubernetes
            .as_ref()
            .map_or(Duration::from_secs(30), |k| k.eviction_wait_timeout());
        if self
            .recently_decided
            .get(&key)
            .is_some_and(|at| at.elapsed() < wait)
        {
            return;
        }
        if let Err(wait) = self.bucket.try_take(Instant::now()) {
            self.metrics.eviction(e.signal.as_str(), "rate_limited");
            tracing::info!(pod = %key, ?wait, "eviction rate limit reached; waiting");
            return;
        }
        self.recently_decided.retain(|_, at| at.elapsed() < wait);
        self.recently_decided.insert(key.clone(), Instant::now());
        let observed = self.state_observed(&e);
        let base = Record::Eviction {
            time: crate::sys::now_rfc3339(),
            trigger_ktime_ns: trigger.ktime_ns,
            namespace: e.namespace.clone(),
            name: e.name.clone(),
            uid: e.uid.clone(),
            signal: e.signal.as_str().to_string(),
            hard: e.hard,
            observed,
            threshold: e.threshold_quantity.value(),
            grace_period_seconds: e.grace_period_seconds,
            result: String::new(),
            message: e.message.clone(),
        };
        let Some(kube) = &self.kube else {
            self.publish_eviction(base, "dry_run");
            return;
        };
        let Some(pod) = self
            .snapshot()
            .and_then(|s| s.pods.into_iter().find(|p| Some(&p.uid) == e.uid.as_ref()))
        else {
            self.publish_eviction(base, "failed");
            return;
        };
        let Some(info) = pods.iter().find(|p| p.uid == e.uid) else {
            return;
        };
        let request = kube::eviction_request(&e, &pod, info);
        let executor = kube.executor.clone();
        let metrics = self.metrics.clone();
        let live = self.live.clone();
        let finished = self.finished_tx.clone();
        let cgroup_dir = pods::pod_cgroups(&self.index, &self.config.settings.node_cgroup)
            .get(&pod.uid)
            .cloned();
        let uid = pod.uid.clone();
        self.in_flight = Some(uid.clone());
        tokio::spawn(async move {
            let (result, gone_wait) = match executor.evict(&pod, &request, SystemTime::now()).await
            {
                Ok(EvictionOutcome::Evicted) => ("evicted", true),
                Ok(EvictionOutcome::PdbOverridden { .. }) => ("pdb_overridden", true),
                Ok(EvictionOutcome::AlreadyGone) => ("already_gone", false),
                Ok(EvictionOutcome::BlockedByPdb { message }) => {
                    tracing::info!(pod = %uid, %message, "eviction blocked by a PodDisruptionBudget");
                    ("blocked_by_pdb", false)
                }
                Ok(EvictionOutcome::DryRun) => ("dry_run", false),
                Err(node_agent_kube::evict::EvictError::Protected { reason, .. }) => {
                    tracing::warn!(pod = %uid, %reason, "eviction refused: protected pod");
                    ("refused", false)
                }
                Err(err) => {
                    tracing::warn!(pod = %uid, error = %err, "eviction failed");
                    ("failed", false)
                }
            };
            metrics.eviction(request.signal.as_str(), result);
            let mut record = base;
            if let Record::Eviction {
                result: r, time, ..
            } = &mut record
            {
                *r = result.to_string();
                *time = crate::sys::now_rfc3339();
            }
            live.publish(&record);
            // As the kubelet does: wait for the pod's cgroup to go before the next eviction.
            if gone_wait {
                if let Some(dir) = cgroup_dir {
                    let _ = node_agent_kube::pacing::wait_until_gone(
                        || {
                            let dir = dir.clone();
                            async move { !dir.exists() }
                        },
                        wait,
                        Duration::from_millis(100),
                    )
                    .await;
                }
            }
            let _ = finished.send(Finished { uid }).await;
        });
    }

    fn publish_eviction(&self, mut record: Record, result: &str) {
        if let Record::Eviction {
            result: r,
            signal,
            namespace,
            name,
            ..
        } = &mut record
        {
            *r = result.to_string();
            self.metrics.eviction(signal, result);
            tracing::info!(pod = %format!("{namespace}/{name}"), signal = %signal, result, "eviction decision");
        }
        self.live.publish(&record);
    }

    /// The observed value of the eviction's signal at the last reading.
    fn state_observed(&self, e: &node_agent_policy::Eviction) -> i64 {
        e.available.value()
    }

    /// Tracks cgroups that appeared (fork counts and fork-storm limits for workloads) and
    /// forgets those that went away.
    fn track_new_cgroups(&mut self) -> anyhow::Result<()> {
        let changes = self.index.refresh()?;
        for id in &changes.removed {
            self.programs.untrack_cgroup(*id)?;
            self.tracked.remove(id);
        }
        let ids: Vec<u64> = if self.tracked.is_empty() {
            self.index.entries().map(|(id, _)| id).collect()
        } else {
            changes.added
        };
        for id in ids {
            if self.tracked.len() >= node_agent_common::MAX_TRACKED_CGROUPS as usize / 2 {
                break;
            }
            let Some(entry) = self.index.lookup(id) else {
                continue;
            };
            if entry.path.as_os_str().is_empty() {
                continue;
            }
            self.programs.track_cgroup(id)?;
            if self.config.settings.fork_limit > 0 {
                self.programs.set_fork_limit(
                    id,
                    self.config.settings.fork_limit,
                    self.config.settings.fork_window,
                )?;
            }
            self.tracked.insert(id);
        }
        self.metrics.set_tracked_cgroups(self.tracked.len() as i64);
        self.triggers.refresh_targets(&self.index);
        Ok(())
    }

    /// The in-kernel `pid.available` check, at the most lenient configured threshold.
    fn set_pid_trigger(&mut self) -> anyhow::Result<()> {
        let reading = read_node(&self.sources)?;
        let Some(limit) = reading.capacity.pids else {
            return Ok(());
        };
        let threshold = triggers::most_lenient(
            &self.config.eviction,
            node_agent_policy::Signal::PidAvailable,
            limit,
        );
        let threshold = threshold.map_or(0, |t| t.max(1) as u64);
        self.programs
            .set_pid_threshold(limit as u64, threshold, (threshold / 20).max(10))?;
        Ok(())
    }

    fn rearm_memory_trigger(&mut self, reading: &NodeReading) {
        let version = self.layout.memory.version();
        if let Err(e) =
            self.triggers
                .rearm(&mut self.programs, &self.config.eviction, reading, version)
        {
            tracing::warn!(error = %e, "setting the kernel memory trigger");
        }
    }

    fn config_changed(&mut self) -> bool {
        let Some(path) = &self.config_path else {
            return false;
        };
        let mtime = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        if mtime != self.config_mtime {
            self.config_mtime = mtime;
            return true;
        }
        false
    }

    /// Re-reads the config; an invalid one is refused whole and the old one stays.
    fn reload(&mut self, why: &str) {
        let Some(path) = self.config_path.clone() else {
            tracing::info!(
                reason = why,
                "no config file to reload (standalone defaults)"
            );
            return;
        };
        // This reading covers the file as it is now: the change watcher need not read it again.
        self.config_mtime = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
        // The same machine checks as at start, against the node cgroup in use.
        let loaded = AgentConfig::load(&path, &self.overrides).and_then(|new| {
            config::checks::check_on_machine(
                &new.settings,
                &self.layout.memory,
                &self.sources.node_dir,
            )?;
            Ok(new)
        });
        match loaded {
            Ok(new) => {
                let restart_needed = new.settings.listen != self.config.settings.listen
                    || new.settings.trace_socket != self.config.settings.trace_socket
                    || new.settings.ring_bytes != self.config.settings.ring_bytes
                    || new.settings.node_cgroup != self.config.settings.node_cgroup
                    || new.kubernetes.is_some() != self.config.kubernetes.is_some();
                if restart_needed {
                    tracing::warn!("config reloaded; listen, trace_socket, ring_bytes, node_cgroup and the kubernetes section take effect on restart");
                }
                let mut applied = new;
                applied.settings.listen = self.config.settings.listen;
                applied.settings.trace_socket = self.config.settings.trace_socket.clone();
                applied.settings.ring_bytes = self.config.settings.ring_bytes;
                applied.settings.node_cgroup = self.config.settings.node_cgroup.clone();
                if self.config.kubernetes.is_some() != applied.kubernetes.is_some() {
                    applied.kubernetes = self.config.kubernetes.clone();
                }
                self.sources.memory_capacity = applied.settings.memory_capacity;
                self.sources.nodefs = applied.settings.nodefs_path.clone();
                self.sources.imagefs = applied.settings.imagefs_path.clone();
                self.config = applied;
                self.triggers.forget();
                if let Err(e) = self.set_pid_trigger() {
                    tracing::warn!(error = %e, "re-arming the PID trigger");
                }
                self.metrics.config_reload(true);
                tracing::info!(reason = why, "config reloaded");
            }
            Err(e) => {
                self.metrics.config_reload(false);
                let chain =
                    std::iter::successors(Some(&e as &dyn std::error::Error), |e| e.source())
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(": ");
                tracing::error!(reason = why, error = %chain, "invalid config; keeping the previous one");
            }
        }
    }
}
