//! `node-agent trace`: what the kernel reports, live — OOM kills, memory and PID threshold
//! crossings, fork storms and lost events — attributed to cgroups and pods; attached to a
//! running daemon, its eviction outcomes too.

mod filter;
mod record;
mod table;

use std::{io::Write as _, path::PathBuf, time::Duration};

pub use filter::{kinds_left_out_of_help, known_kinds, Filter, FilterError, OutputFormat};
pub use record::{CgroupRef, Crossing, PodRef, Qos, Record};
pub use table::signal_value;

use crate::{
    cgroup,
    ebpf::LoadOptions,
    kernel::{FeedError, ForkLimit, KernelFeed, NoNames},
};

/// Why `trace` stopped or could not start. Every variant names what was wrong.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error(transparent)]
    Filter(#[from] FilterError),
    #[error("--{flag} {value:?}: {problem}")]
    Flag {
        flag: &'static str,
        value: String,
        problem: String,
    },
    #[error(transparent)]
    Hierarchy(#[from] cgroup::HierarchyError),
    #[error(transparent)]
    Sys(#[from] crate::sys::SysError),
    #[error(transparent)]
    Feed(#[from] FeedError),
    #[error(transparent)]
    Control(#[from] crate::ebpf::ControlError),
    #[error("reading the id of cgroup {path}")]
    CgroupId {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the node-agent daemon closed the trace stream (it stopped)")]
    DaemonStopped,
    #[error("writing the output")]
    Output(#[source] std::io::Error),
    #[error("reading the daemon's stream")]
    Stream(#[source] std::io::Error),
    #[error("starting the runtime or the signal handlers")]
    Runtime(#[source] std::io::Error),
}

#[derive(Debug, clap::Args)]
pub struct TraceArgs {
    /// Output format: a readable table, or JSON Lines (one object per event, with `kind`).
    #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
    /// Only these kinds (repeatable or comma-separated): oom_kill, memory_threshold,
    /// pid_threshold, fork_storm, eviction and reclaim (from a running daemon), events_lost
    /// (stream_lost, a gap in this reader's copy of the stream, always passes).
    #[arg(long, value_delimiter = ',')]
    pub kind: Vec<String>,
    /// Only events of cgroups whose path contains this text (or whose id is this number).
    #[arg(long)]
    pub cgroup: Option<String>,
    /// Only events of this pod: its UID (or a prefix of it), its name, or NAMESPACE/NAME.
    #[arg(long)]
    pub pod: Option<String>,
    /// Only events of pods in this namespace.
    #[arg(long)]
    pub namespace: Option<String>,
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
    /// 0 disables. `pid_max` as this PID namespace reads it: in a pod on Linux 6.14 and later,
    /// not the host's (the running daemon takes the kubelet's figure; this standalone trace
    /// has none).
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

fn parse_threshold(spec: &str, root: &std::path::Path) -> Result<MemoryThresholdArg, TraceError> {
    let flag = |problem: String| TraceError::Flag {
        flag: "memory-threshold",
        value: spec.to_string(),
        problem,
    };
    let (path, quantity) = spec
        .split_once('=')
        .ok_or_else(|| flag("expected PATH=QUANTITY, e.g. /kubepods=6Gi".into()))?;
    let bytes = quantity_bytes(quantity).map_err(flag)?;
    let relative = std::path::Path::new(path.trim_start_matches('/'));
    let leaves = relative.components().any(|c| {
        !matches!(
            c,
            std::path::Component::Normal(_) | std::path::Component::CurDir
        )
    });
    if leaves {
        return Err(flag(format!(
            "{path:?} leaves the cgroup hierarchy; give a path below {} without `..`",
            root.display()
        )));
    }
    let path = root.join(relative);
    if !path.is_dir() {
        return Err(flag(format!("no cgroup at {}", path.display())));
    }
    // `..` is not the only way out: a symbolic link could lead elsewhere too.
    let resolve = |p: &std::path::Path| {
        p.canonicalize()
            .map_err(|e| flag(format!("resolving {}: {e}", p.display())))
    };
    let (resolved, root_resolved) = (resolve(&path)?, resolve(root)?);
    if !resolved.starts_with(&root_resolved) {
        return Err(flag(format!(
            "{} leaves the cgroup hierarchy (it is {})",
            path.display(),
            resolved.display()
        )));
    }
    Ok(MemoryThresholdArg { path, bytes })
}

fn quantity_bytes(text: &str) -> Result<u64, String> {
    let q: node_agent_policy::Quantity = text
        .parse()
        .map_err(|e| format!("{text:?} is not a quantity such as 512Mi: {e}"))?;
    let value = q
        .checked_value()
        .map_err(|_| format!("{text:?} is beyond what 64 bits of bytes hold"))?;
    u64::try_from(value)
        .ok()
        .filter(|v| *v > 0)
        .ok_or_else(|| format!("{text:?} must be positive"))
}

/// How often losses are checked and, when the kernel reported cgroups created or removed, the
/// cgroup index is rescanned (new pods tracked, gone ones dropped).
const HOUSEKEEPING: Duration = Duration::from_secs(1);

pub fn run(args: TraceArgs) -> Result<(), TraceError> {
    // Everything from the command line is validated before any program is loaded.
    let filter = Filter::new(
        &args.kind,
        args.cgroup.clone(),
        args.pod.clone(),
        args.namespace.clone(),
    )?;
    let hysteresis =
        quantity_bytes(&args.memory_hysteresis).map_err(|problem| TraceError::Flag {
            flag: "memory-hysteresis",
            value: args.memory_hysteresis.clone(),
            problem,
        })?;
    let layout = cgroup::detect()?;
    let root = layout.memory.mount().to_path_buf();
    let thresholds: Vec<MemoryThresholdArg> = args
        .memory_thresholds
        .iter()
        .map(|spec| parse_threshold(spec, &root))
        .collect::<Result<_, _>>()?;
    let pid_limit = crate::sys::pid_limit()? as u64;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(TraceError::Runtime)?;
    if !args.no_attach {
        if let Some(stream) = runtime.block_on(connect(&args.socket)) {
            return runtime.block_on(attach(stream, &args, &filter));
        }
    }
    runtime.block_on(async move {
        let fork_limit = (args.fork_limit > 0).then_some(ForkLimit { max_forks: args.fork_limit, window: args.fork_window });
        let options = LoadOptions { ring_bytes: args.ring_bytes, ..LoadOptions::default() };
        let (mut feed, _) = KernelFeed::start(&options, &root, fork_limit)?;
        tracing::info!(%layout, memory = %feed.memory_mechanism(), "tracing");
        if !thresholds.is_empty() && feed.memory_mechanism() == crate::ebpf::MemoryMechanism::Unavailable {
            tracing::warn!("no in-kernel memory mechanism attaches on this kernel: --memory-threshold is not evaluated");
        }
        for t in &thresholds {
            let id = cgroup::cgroup_id(&t.path).map_err(|source| TraceError::CgroupId { path: t.path.clone(), source })?;
            feed.programs().set_memory_threshold(id, t.bytes, hysteresis)?;
        }
        feed.programs().set_pid_threshold(pid_limit, args.pid_available_below, args.pid_available_below / 10)?;

        let mut out = std::io::stdout().lock();
        if args.output == OutputFormat::Table {
            writeln!(out, "{}", Record::TABLE_HEADER).map_err(TraceError::Output)?;
        }
        let mut stop = Stop::new(args.duration).map_err(TraceError::Runtime)?;
        let mut housekeeping = tokio::time::interval(HOUSEKEEPING);
        let print = |rec: &Record, out: &mut std::io::StdoutLock<'_>| -> Result<(), TraceError> {
            if filter.matches(rec) {
                writeln!(out, "{}", filter.render(rec, args.output)).map_err(TraceError::Output)?;
            }
            Ok(())
        };
        loop {
            tokio::select! {
                records = feed.recv() => {
                    let batch = feed.attribute(records?, &NoNames);
                    for e in &batch.undecodable {
                        tracing::warn!(error = %e, "undecodable kernel record");
                    }
                    for a in &batch.events {
                        print(&Record::event(a, crate::sys::ktime_rfc3339(a.ktime_ns)), &mut out)?;
                    }
                    out.flush().map_err(TraceError::Output)?;
                }
                _ = housekeeping.tick() => {
                    let done = feed.housekeeping();
                    if let Some(lost) = done.lost {
                        let rec = Record::EventsLost { time: crate::sys::now_rfc3339(), lost: lost.lost, total_per_cpu: lost.total_per_cpu };
                        print(&rec, &mut out)?;
                        out.flush().map_err(TraceError::Output)?;
                    }
                    for e in &done.errors {
                        tracing::warn!(error = %crate::error_chain(e), "kernel feed housekeeping");
                    }
                }
                () = stop.wait() => break,
            }
        }
        // Dropping the feed detaches every program.
        Ok(())
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
) -> Result<(), TraceError> {
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
        writeln!(out, "{}", Record::TABLE_HEADER).map_err(TraceError::Output)?;
    }
    let mut stop = Stop::new(args.duration).map_err(TraceError::Runtime)?;
    loop {
        tokio::select! {
            line = lines.next_line() => {
                let Some(line) = line.map_err(TraceError::Stream)? else {
                    return Err(TraceError::DaemonStopped);
                };
                match serde_json::from_str::<Record>(&line) {
                    Ok(rec) if filter.matches(&rec) => {
                        writeln!(out, "{}", filter.render(&rec, args.output)).map_err(TraceError::Output)?;
                        out.flush().map_err(TraceError::Output)?;
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "unreadable line from the daemon"),
                }
            }
            () = stop.wait() => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_kind_help_names_every_kind() {
        use clap::Args as _;
        let command = super::TraceArgs::augment_args(clap::Command::new("trace"));
        assert_eq!(super::kinds_left_out_of_help(&command), Vec::<&str>::new());
        let bare = clap::Command::new("bare").arg(clap::Arg::new("kind").long("kind"));
        assert_eq!(super::kinds_left_out_of_help(&bare), super::known_kinds());
    }

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
            let err = super::parse_threshold(spec, root.path())
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{spec}: {err}");
        }
    }
}
