//! `node-agent trace`: what the kernel reports, live — OOM kills, memory and PID threshold
//! crossings, fork storms and lost events — attributed to cgroups and pods.

mod filter;
mod record;

use std::{collections::HashSet, io::Write as _, path::PathBuf, time::Duration};

use anyhow::Context as _;
pub use filter::{Filter, OutputFormat};
pub use record::{CgroupRef, PodRef, Record};

use crate::{
    cgroup::{self, CgroupIndex},
    ebpf::{KernelEvent, KernelPrograms, LoadOptions},
};

#[derive(Debug, clap::Args)]
pub struct TraceArgs {
    /// Output format: a readable table, or JSON Lines (one object per event, with `kind`).
    #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
    /// Only these kinds (repeatable or comma-separated): oom_kill, memory_threshold,
    /// pid_threshold, fork_storm, eviction (from a running daemon), events_lost.
    #[arg(long, value_delimiter = ',')]
    pub kind: Vec<String>,
    /// Only events of cgroups whose path contains this text (or whose id is this number).
    #[arg(long)]
    pub cgroup: Option<String>,
    /// Only events of this pod (UID, or a prefix of it).
    #[arg(long)]
    pub pod: Option<String>,
    /// Stop after this long (e.g. `30s`, `5m`); default: until Ctrl-C or SIGTERM.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Memory threshold on a cgroup, `PATH=QUANTITY` with PATH below the memory hierarchy's
    /// root (e.g. `/kubepods=6Gi`); repeatable.
    #[arg(long = "memory-threshold", value_name = "PATH=QUANTITY")]
    pub memory_thresholds: Vec<String>,
    /// Hysteresis of memory thresholds: a down-crossing needs usage this far below the line.
    #[arg(long, default_value = "16Mi")]
    pub memory_hysteresis: String,
    /// Fork-storm limit per cgroup: more than N forks within `--fork-window`; 0 disables.
    #[arg(long, default_value_t = 1000)]
    pub fork_limit: u64,
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub fork_window: Duration,
    /// Report `pid.available` (min(pid_max, threads-max) minus live PIDs) dropping below this;
    /// 0 disables.
    #[arg(long, default_value_t = 1000)]
    pub pid_available_below: u64,
    /// Ring buffer size in bytes (a power of two).
    #[arg(long, default_value_t = node_agent_common::DEFAULT_RING_BYTES)]
    pub ring_bytes: u32,
    /// The running daemon's trace socket: when a daemon listens there, `trace` shows its
    /// stream (including evictions) instead of loading the programs a second time.
    #[arg(long, default_value = "/run/node-agent/trace.sock")]
    pub socket: PathBuf,
    /// Load the programs even if a daemon is running.
    #[arg(long)]
    pub no_attach: bool,
}

/// A positive Go-style duration (`30s`, `1m30s`).
fn parse_duration(s: &str) -> Result<Duration, String> {
    let ns = node_agent_policy::parse_go_duration(s).map_err(|e| e.to_string())?;
    match u64::try_from(ns) {
        Ok(ns) if ns > 0 => Ok(Duration::from_nanos(ns)),
        _ => Err(format!("{s:?} must be a positive duration")),
    }
}

/// A memory threshold from the command line, validated before anything is loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MemoryThresholdArg {
    path: PathBuf,
    bytes: u64,
}

fn parse_threshold(spec: &str, root: &std::path::Path) -> anyhow::Result<MemoryThresholdArg> {
    let (path, quantity) = spec.split_once('=').with_context(|| {
        format!("--memory-threshold {spec:?}: expected PATH=QUANTITY, e.g. /kubepods=6Gi")
    })?;
    let bytes = quantity_bytes(quantity).with_context(|| format!("--memory-threshold {spec:?}"))?;
    let relative = std::path::Path::new(path.trim_start_matches('/'));
    anyhow::ensure!(
        relative
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_) | std::path::Component::CurDir)),
        "--memory-threshold {spec:?}: {path:?} leaves the cgroup hierarchy; give a path below {} without `..`",
        root.display()
    );
    let path = root.join(relative);
    anyhow::ensure!(
        path.is_dir(),
        "--memory-threshold {spec:?}: no cgroup at {}",
        path.display()
    );
    // `..` is not the only way out: a symbolic link could lead elsewhere too.
    let resolved = path
        .canonicalize()
        .with_context(|| format!("--memory-threshold {spec:?}: resolving {}", path.display()))?;
    let root_resolved = root
        .canonicalize()
        .with_context(|| format!("resolving {}", root.display()))?;
    anyhow::ensure!(
        resolved.starts_with(&root_resolved),
        "--memory-threshold {spec:?}: {} leaves the cgroup hierarchy (it is {})",
        path.display(),
        resolved.display()
    );
    Ok(MemoryThresholdArg { path, bytes })
}

fn quantity_bytes(text: &str) -> anyhow::Result<u64> {
    let q: node_agent_policy::Quantity = text
        .parse()
        .with_context(|| format!("{text:?} is not a quantity such as 512Mi"))?;
    let value = q
        .checked_value()
        .with_context(|| format!("{text:?} is beyond what 64 bits of bytes hold"))?;
    u64::try_from(value)
        .ok()
        .filter(|v| *v > 0)
        .with_context(|| format!("{text:?} must be positive"))
}

/// How often losses are checked and, when the kernel reported cgroups created or removed, the
/// cgroup index is rescanned (new pods tracked, gone ones dropped).
const HOUSEKEEPING: Duration = Duration::from_secs(1);
/// Full cgroupfs walk when no cgroup change was reported for this long.
const SAFETY_RESCAN: Duration = Duration::from_secs(60);

pub fn run(args: TraceArgs) -> anyhow::Result<()> {
    // Everything from the command line is validated before any program is loaded.
    let filter = Filter::new(&args.kind, args.cgroup.clone(), args.pod.clone())?;
    let hysteresis = quantity_bytes(&args.memory_hysteresis).context("--memory-hysteresis")?;
    let layout = cgroup::detect()?;
    let root = layout.memory.mount().to_path_buf();
    let thresholds: Vec<MemoryThresholdArg> = args
        .memory_thresholds
        .iter()
        .map(|spec| parse_threshold(spec, &root))
        .collect::<anyhow::Result<_>>()?;
    let pid_limit = crate::sys::pid_limit()? as u64;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if !args.no_attach {
        if let Some(stream) = runtime.block_on(connect(&args.socket)) {
            return runtime.block_on(attach(stream, &args, &filter));
        }
    }
    runtime.block_on(async move {
        let mut programs = KernelPrograms::load_with(&LoadOptions { ring_bytes: args.ring_bytes, ..LoadOptions::default() })?;
        tracing::info!(%layout, memory = %programs.memory_mechanism(), "tracing");
        if !thresholds.is_empty() && programs.memory_mechanism() == crate::ebpf::MemoryMechanism::Unavailable {
            tracing::warn!("no in-kernel memory mechanism attaches on this kernel: --memory-threshold is not evaluated");
        }
        let mut index = CgroupIndex::scan(&root)?;
        let mut tracked = HashSet::new();
        track(&mut programs, &index, index.entries().map(|(id, _)| id).collect(), &mut tracked, &args)?;
        for t in &thresholds {
            let id = cgroup::cgroup_id(&t.path)?;
            programs.set_memory_threshold(id, t.bytes, hysteresis)?;
        }
        programs.set_pid_threshold(pid_limit, args.pid_available_below, args.pid_available_below / 10)?;
        let mut events = programs.events()?;

        let page_size = crate::sys::page_size();
        let mut out = std::io::stdout().lock();
        if args.output == OutputFormat::Table {
            writeln!(out, "{}", Record::TABLE_HEADER)?;
        }
        let mut stop = Stop::new(args.duration)?;
        let mut housekeeping = tokio::time::interval(HOUSEKEEPING);
        let mut rescan = cgroup::RescanSchedule::new(SAFETY_RESCAN, std::time::Instant::now());
        let mut cgroups_changed = false;
        let mut lost_before: u64 = programs.lost_events()?.iter().sum();
        loop {
            tokio::select! {
                batch = events.next_batch() => {
                    for record in batch? {
                        match record {
                            Ok(KernelEvent::CgroupChange(_)) => cgroups_changed = true,
                            Ok(event) => {
                                let rec = Record::from_event(&event, &index, crate::sys::ktime_rfc3339(event.header().ktime_ns), page_size);
                                if let Some(rec) = rec.filter(|r| filter.matches(r)) {
                                    writeln!(out, "{}", filter.render(&rec, args.output))?;
                                }
                            }
                            Err(e) => tracing::warn!(error = %e, "undecodable kernel record"),
                        }
                    }
                    out.flush()?;
                }
                _ = housekeeping.tick() => {
                    let per_cpu = programs.lost_events()?;
                    let total: u64 = per_cpu.iter().sum();
                    if total > lost_before {
                        let rec = Record::EventsLost { time: crate::sys::now_rfc3339(), lost: total - lost_before, total_per_cpu: per_cpu };
                        lost_before = total;
                        if filter.matches(&rec) {
                            writeln!(out, "{}", filter.render(&rec, args.output))?;
                            out.flush()?;
                        }
                    }
                    if std::mem::take(&mut cgroups_changed) {
                        rescan.mark();
                    }
                    if rescan.due(std::time::Instant::now()) {
                        match index.refresh() {
                            Ok(changes) => {
                                for id in &changes.removed {
                                    programs.untrack_cgroup(*id)?;
                                    tracked.remove(id);
                                }
                                track(&mut programs, &index, changes.added, &mut tracked, &args)?;
                            }
                            Err(e) => tracing::warn!(error = %e, "rescanning cgroups"),
                        }
                    }
                }
                () = stop.wait() => break,
            }
        }
        // Dropping `programs` detaches every program.
        anyhow::Ok(())
    })
}

/// When `trace` stops: after `--duration`, on Ctrl-C, or on SIGTERM.
struct Stop {
    deadline: Option<tokio::time::Instant>,
    sigterm: tokio::signal::unix::Signal,
}

impl Stop {
    fn new(duration: Option<Duration>) -> std::io::Result<Self> {
        Ok(Self {
            deadline: duration.map(|d| tokio::time::Instant::now() + d),
            sigterm: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?,
        })
    }

    async fn wait(&mut self) {
        let until_deadline = async {
            match self.deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = until_deadline => {}
            _ = tokio::signal::ctrl_c() => {}
            _ = self.sigterm.recv() => {}
        }
    }
}

async fn connect(path: &std::path::Path) -> Option<tokio::net::UnixStream> {
    tokio::net::UnixStream::connect(path).await.ok()
}

/// Shows the running daemon's stream: the same records, evictions included.
async fn attach(
    stream: tokio::net::UnixStream,
    args: &TraceArgs,
    filter: &Filter,
) -> anyhow::Result<()> {
    use tokio::io::AsyncBufReadExt as _;
    tracing::info!(socket = %args.socket.display(), "tracing: attached to the running node-agent");
    if !args.memory_thresholds.is_empty() {
        tracing::warn!(
            "--memory-threshold applies only when trace loads its own programs (--no-attach)"
        );
    }
    let mut lines = tokio::io::BufReader::new(stream).lines();
    let mut out = std::io::stdout().lock();
    if args.output == OutputFormat::Table {
        writeln!(out, "{}", Record::TABLE_HEADER)?;
    }
    let mut stop = Stop::new(args.duration)?;
    loop {
        tokio::select! {
            line = lines.next_line() => {
                let Some(line) = line? else {
                    anyhow::bail!("the node-agent daemon closed the trace stream (it stopped)");
                };
                match serde_json::from_str::<Record>(&line) {
                    Ok(rec) if filter.matches(&rec) => {
                        writeln!(out, "{}", filter.render(&rec, args.output))?;
                        out.flush()?;
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "unreadable line from the daemon"),
                }
            }
            () = stop.wait() => return Ok(()),
        }
    }
}

/// Starts counting forks in these cgroups (and watching their fork rate), up to the map's size.
fn track(
    programs: &mut KernelPrograms,
    index: &CgroupIndex,
    ids: Vec<u64>,
    tracked: &mut HashSet<u64>,
    args: &TraceArgs,
) -> anyhow::Result<()> {
    for id in ids {
        if tracked.len() >= node_agent_common::MAX_TRACKED_CGROUPS as usize {
            tracing::warn!(
                tracked = tracked.len(),
                "tracking no more cgroups: the kernel maps are full"
            );
            return Ok(());
        }
        // The root's fork rate is the whole node's; storms are about one workload.
        let is_root = index
            .lookup(id)
            .is_some_and(|e| e.path.as_os_str().is_empty());
        programs.track_cgroup(id)?;
        if args.fork_limit > 0 && !is_root {
            programs.set_fork_limit(id, args.fork_limit, args.fork_window)?;
        }
        tracked.insert(id);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn refuses_bad_threshold_specs_before_loading_anything() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("kubepods")).unwrap();
        // A link out of the hierarchy: `..` is not the only way out.
        std::os::unix::fs::symlink("/etc", root.path().join("escape")).unwrap();
        let ok = super::parse_threshold("/kubepods=6Gi", root.path()).unwrap();
        assert_eq!(ok.bytes, 6 << 30);
        for (spec, needle) in [
            ("kubepods", "expected PATH=QUANTITY"),
            ("/kubepods=lots", "not a quantity"),
            ("/kubepods=0", "must be positive"),
            ("/missing=1Gi", "no cgroup at"),
            ("/../../etc=1Gi", "leaves the cgroup hierarchy"),
            ("/kubepods/../..=1Gi", "leaves the cgroup hierarchy"),
            ("/escape=1Gi", "leaves the cgroup hierarchy"),
            ("/kubepods=20E", "beyond"),
        ] {
            let err = format!(
                "{:#}",
                super::parse_threshold(spec, root.path()).unwrap_err()
            );
            assert!(err.contains(needle), "{spec}: {err}");
        }
    }
}
