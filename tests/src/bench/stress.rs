//! What the agent costs a real workload: stress-ng's `vm` stressor (mmap, write, munmap in a
//! loop: page-fault heavy) and its `fork` stressor, each in a bench cgroup of its own, with and
//! without `node-agent run` as deployed (the daemon, standalone, default thresholds, so the
//! bench cgroup is one of the workloads it watches), alternated ABBA over rounds. The figure is
//! the median over rounds of the ratio of bogo-ops per second, wall clock (what the workload
//! feels), with the quartiles beside it; the ratio per CPU second is in the note.
//!
//! The expected cost is a fraction of a percent (the overhead rows give each program's time),
//! while two identical back-to-back runs on a shared VM differ by about 10 %; so the method
//! removes what it can of that noise without hiding any of the agent's cost:
//! - stress-ng runs on one CPU (the last, like the loops) and the daemon keeps every CPU: the
//!   programs run in the workload's own context wherever it is, and one of the two sampler
//!   timers ticks on its CPU. Unpinned, the worker and its children wander between the CPUs
//!   and the pair-to-pair spread doubles.
//! - `vm` maps 4 MiB at a time: as page-fault heavy as 64 MiB (about 500 k faults/s here), but
//!   the freed pages are reused by the guest at once, whereas 64 MiB frees blocks large enough
//!   for the hypervisor's free-page reporting to take back, and re-faulting those on the host
//!   side added ±10 % to single runs.
//! - many short rounds (2 s runs) rather than a few long ones: the median's spread falls with
//!   the number of rounds, and each pair of runs lies close together in time.

use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::Context as _;

use super::{cgroups::BenchCgroup, median, quantile, report::Row, PinnedCpu};

const SECTION: &str = "overhead";

/// Bogo-ops per second of one run: (wall clock, per CPU second).
type Rate = (f64, f64);

pub struct Options {
    pub rounds: usize,
    pub seconds: u64,
}

/// `node-agent run`, standalone; SIGTERM on stop, killed on drop.
pub struct Daemon(Child);

impl Daemon {
    pub fn start(agent: &Path, work_dir: &Path) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let socket = work_dir.join(format!("stress-{}.sock", std::process::id()));
        let mut child = Command::new(agent)
            .args([
                "run",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--trace-socket",
            ])
            .arg(&socket)
            .env("RUST_LOG", "info")
            .env_remove("NODE_AGENT_CONFIG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", agent.display()))?;
        let stderr = child.stderr.take().context("agent stderr")?;
        let daemon = Self(child);
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("node-agent running") {
                    let _ = tx.send(());
                }
                if line.contains("ERROR") {
                    eprintln!("agent: {line}");
                }
            }
        });
        rx.recv_timeout(Duration::from_secs(30))
            .context("`node-agent run` did not say it was running within 30 s")?;
        // Let the first evaluation arm the memory lines.
        std::thread::sleep(Duration::from_millis(500));
        Ok(daemon)
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    pub fn stop(mut self) -> anyhow::Result<()> {
        // SAFETY: signals the process we started.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.0.try_wait()?.is_none() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the agent ignored SIGTERM for 5 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Bogo-ops per second of one stress-ng run, on the last CPU: (wall clock, user + system CPU).
fn stress(
    cgroup: &BenchCgroup,
    stressor: &[&str],
    seconds: u64,
    yaml: &Path,
) -> anyhow::Result<(f64, f64)> {
    let procs = cgroup.path().join("cgroup.procs");
    // The shell joins the cgroup, then becomes stress-ng: every worker starts inside it.
    let script = format!(
        "echo $$ > '{}' && exec stress-ng {} --timeout {seconds}s --metrics-brief --yaml '{}'",
        procs.display(),
        stressor.join(" "),
        yaml.display()
    );
    let pinned = PinnedCpu::last()?;
    let out = Command::new("sh")
        .args(["-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .context("running stress-ng (`cargo xtask setup` installs it)")?;
    drop(pinned);
    anyhow::ensure!(
        out.status.success(),
        "stress-ng {stressor:?} failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let text =
        std::fs::read_to_string(yaml).with_context(|| format!("reading {}", yaml.display()))?;
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(key))
            .and_then(|v| v.trim_start_matches(':').trim().parse::<f64>().ok())
            .with_context(|| format!("no `{key}` in stress-ng's YAML output"))
    };
    Ok((
        field("bogo-ops-per-second-real-time")?,
        field("bogo-ops-per-second-usr-sys-time")?,
    ))
}

pub fn run(
    rows: &mut Vec<Row>,
    agent: &Path,
    work_dir: &Path,
    opts: &Options,
) -> anyhow::Result<()> {
    let yaml = work_dir.join(format!("stress-{}.yaml", std::process::id()));
    for (name, stressor) in [
        (
            "vm",
            ["--vm", "1", "--vm-bytes", "4M", "--vm-method", "write64"].as_slice(),
        ),
        ("fork", ["--fork", "1"].as_slice()),
    ] {
        let cgroup = BenchCgroup::memory(&format!("stress-{name}"))?;
        // Per round: (without, with) as (wall, cpu) rates.
        let mut pairs: Vec<(Rate, Rate)> = Vec::new();
        stress(&cgroup, stressor, 1, &yaml)?;
        for round in 0..opts.rounds {
            let order = if round % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            };
            let mut got = [(0.0, 0.0); 2];
            for with in order {
                let daemon = if with {
                    Some(Daemon::start(agent, work_dir)?)
                } else {
                    None
                };
                got[usize::from(with)] = stress(&cgroup, stressor, opts.seconds, &yaml)?;
                if let Some(d) = daemon {
                    d.stop()?;
                }
            }
            pairs.push((got[0], got[1]));
        }
        // Per round: without ÷ with, minus one, in percent.
        let slowdowns = |f: fn(&Rate) -> f64| -> Vec<f64> {
            pairs
                .iter()
                .map(|(off, on)| (f(off) / f(on) - 1.0) * 100.0)
                .collect()
        };
        let (walls, cpus) = (slowdowns(|p| p.0), slowdowns(|p| p.1));
        let q = |v: &[f64], at: f64| quantile(v, at).unwrap_or(f64::NAN);
        let (wall, cpu) = (q(&walls, 0.5), q(&cpus, 0.5));
        let rate = |f: fn(&(Rate, Rate)) -> f64| {
            median(&pairs.iter().map(f).collect::<Vec<_>>()).unwrap_or(f64::NAN)
        };
        rows.push(
            Row::info(
                SECTION,
                format!("stress-ng {name}: slowdown with `node-agent run`"),
                format!("{wall:+.1} %"),
            )
            .value(wall, "%")
            .target("≤ 3 %", wall <= 3.0)
            .note(format!(
                "stress-ng {} on one CPU, {} s per run, median of {} ABBA rounds of bogo-ops/s \
                 (wall; quartiles {:+.1} … {:+.1} %): {:.0} without, {:.0} with; per CPU second \
                 {cpu:+.1} %",
                stressor.join(" "),
                opts.seconds,
                pairs.len(),
                q(&walls, 0.25),
                q(&walls, 0.75),
                rate(|p| p.0 .0),
                rate(|p| p.1 .0),
            )),
        );
    }
    let _ = std::fs::remove_file(&yaml);
    Ok(())
}
