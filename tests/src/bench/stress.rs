//! What the agent costs a real workload: stress-ng's `vm` stressor (mmap, write, munmap in a
//! loop: page-fault heavy) and its `fork` stressor, each in a bench cgroup of its own, under
//! three variants alternated over rounds (ABC, then CBA): nothing loaded; `node-agent run` as
//! deployed (the daemon, standalone, the kubelet's default memory threshold, so the bench
//! cgroup is one of the workloads it watches and every line is far); and the kernel programs
//! loaded with a line within reach on another cgroup, so the sampler runs at its near-line pace
//! (1 ms). The figure
//! is the median over rounds of the slowdown in bogo-ops per second, wall clock (what the
//! workload feels), with its 95 % interval, judged at the interval's upper end; the slowdown per
//! CPU second is in the note. Each stressor runs with one worker pinned to one CPU, and, for
//! the near-line pace, with one worker per CPU, unpinned, so no tick lands on an idle CPU.
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

use super::{
    cgroups::BenchCgroup,
    median,
    overhead::{Lines, Probes},
    report::Row,
    stats::median_ci,
    PinnedCpu,
};

const SECTION: &str = "overhead";

/// Bogo-ops per second of one run: (wall clock, per CPU second).
type Rate = (f64, f64);

pub struct Options {
    pub rounds: usize,
    pub seconds: u64,
}

/// `node-agent run`, standalone, with the bench's standalone config (only the memory threshold:
/// see [`super::kube::standalone_config_text`]); SIGTERM on stop, killed on drop.
pub struct Daemon {
    child: Child,
    port: u16,
}

impl Daemon {
    pub fn start(agent: &Path, work_dir: &Path) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let socket = work_dir.join(format!("stress-{}.sock", std::process::id()));
        let config = work_dir.join(format!("standalone-{}.yaml", std::process::id()));
        std::fs::write(&config, super::kube::standalone_config_text(port, &socket))
            .with_context(|| format!("writing {}", config.display()))?;
        let mut child = Command::new(agent)
            .args(["run", "--config"])
            .arg(&config)
            .env("RUST_LOG", "info")
            .env_remove("NODE_AGENT_CONFIG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", agent.display()))?;
        let stderr = child.stderr.take().context("agent stderr")?;
        let daemon = Self { child, port };
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
        self.child.id()
    }

    /// Its listener (`/metrics`, `/healthz`) on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn stop(mut self) -> anyhow::Result<()> {
        // SAFETY: signals the process we started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.child.try_wait()?.is_none() {
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
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Bogo-ops per second of one stress-ng run, on the last CPU if `pinned`: (wall clock, user +
/// system CPU).
fn stress(
    cgroup: &BenchCgroup,
    stressor: &[String],
    seconds: u64,
    yaml: &Path,
    pinned: bool,
) -> anyhow::Result<(f64, f64)> {
    let procs = cgroup.path().join("cgroup.procs");
    // The shell joins the cgroup, then becomes stress-ng: every worker starts inside it.
    let script = format!(
        "echo $$ > '{}' && exec stress-ng {} --timeout {seconds}s --metrics-brief --yaml '{}'",
        procs.display(),
        stressor.join(" "),
        yaml.display()
    );
    let pinned = if pinned {
        Some(PinnedCpu::last()?)
    } else {
        None
    };
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

/// One stressor as the rows run it.
struct Stressor {
    name: String,
    args: Vec<String>,
    pinned: bool,
    variants: &'static [Variant],
}

/// What runs beside the stressor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Nothing,
    /// `node-agent run`, standalone, every line far.
    Daemon,
    /// The kernel programs with a line within reach: the near-line pace.
    NearLine,
}

impl Variant {
    fn label(self) -> &'static str {
        match self {
            Variant::Nothing => "nothing",
            Variant::Daemon => "`node-agent run` (lines far)",
            Variant::NearLine => "the programs with a line near (1 ms pace)",
        }
    }
}

fn stressors() -> Vec<Stressor> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let vm = |n: usize| {
        words(&[
            "--vm",
            &n.to_string(),
            "--vm-bytes",
            "4M",
            "--vm-method",
            "write64",
        ])
    };
    let fork = |n: usize| words(&["--fork", &n.to_string()]);
    const ALL: &[Variant] = &[Variant::Nothing, Variant::Daemon, Variant::NearLine];
    const NEAR: &[Variant] = &[Variant::Nothing, Variant::NearLine];
    vec![
        Stressor {
            name: "vm".into(),
            args: vm(1),
            pinned: true,
            variants: ALL,
        },
        Stressor {
            name: "fork".into(),
            args: fork(1),
            pinned: true,
            variants: ALL,
        },
        Stressor {
            name: format!("vm, {cpus} workers (one per CPU)"),
            args: vm(cpus),
            pinned: false,
            variants: NEAR,
        },
        Stressor {
            name: format!("fork, {cpus} workers (one per CPU)"),
            args: fork(cpus),
            pinned: false,
            variants: NEAR,
        },
    ]
}

pub fn run(
    rows: &mut Vec<Row>,
    agent: &Path,
    work_dir: &Path,
    opts: &Options,
) -> anyhow::Result<()> {
    let yaml = work_dir.join(format!("stress-{}.yaml", std::process::id()));
    for stressor in stressors() {
        let cgroup = BenchCgroup::memory(&format!(
            "stress-{}",
            stressor.name.replace([' ', ',', '(', ')'], "")
        ))?;
        let lines = Lines::new(cgroup.id()?)?;
        let variants = stressor.variants;
        // Per round, the (wall, cpu) rate under each variant.
        let mut rounds: Vec<Vec<Rate>> = Vec::new();
        stress(&cgroup, &stressor.args, 1, &yaml, stressor.pinned)?;
        for round in 0..opts.rounds {
            let mut order: Vec<usize> = (0..variants.len()).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            let mut got = vec![(0.0, 0.0); variants.len()];
            for at in order {
                let (daemon, programs) = match variants[at] {
                    Variant::Nothing => (None, None),
                    Variant::Daemon => (Some(Daemon::start(agent, work_dir)?), None),
                    Variant::NearLine => (None, lines.load(Probes::Near)?),
                };
                got[at] = stress(
                    &cgroup,
                    &stressor.args,
                    opts.seconds,
                    &yaml,
                    stressor.pinned,
                )?;
                drop(programs);
                if let Some(d) = daemon {
                    d.stop()?;
                }
            }
            rounds.push(got);
        }
        for (at, variant) in variants.iter().enumerate().skip(1) {
            // Per round: without ÷ with, minus one, in percent.
            let slowdowns = |f: fn(&Rate) -> f64| -> Vec<f64> {
                rounds
                    .iter()
                    .map(|r| (f(&r[0]) / f(&r[at]) - 1.0) * 100.0)
                    .collect()
            };
            let Some(wall) = median_ci(&slowdowns(|p| p.0)) else {
                continue;
            };
            let cpu = median(&slowdowns(|p| p.1)).unwrap_or(f64::NAN);
            let rate = |i: usize| {
                median(&rounds.iter().map(|r| r[i].0).collect::<Vec<_>>()).unwrap_or(f64::NAN)
            };
            rows.push(
                Row::info(
                    SECTION,
                    format!(
                        "stress-ng {}: slowdown with {}",
                        stressor.name,
                        variant.label()
                    ),
                    format!("{} %", wall.show(1, true)),
                )
                .estimate(wall, "%")
                .at_most("≤ 3 % (upper end)", 3.0)
                .note(format!(
                    "{}; stress-ng {} {}, {} s per run, {} rounds of {} alternated (order \
                     reversed every other round), bogo-ops/s wall clock: {:.0} without, {:.0} \
                     with (medians); per CPU second {cpu:+.1} %",
                    wall.describe("median"),
                    stressor.args.join(" "),
                    if stressor.pinned {
                        "on one CPU"
                    } else {
                        "unpinned"
                    },
                    opts.seconds,
                    rounds.len(),
                    variants
                        .iter()
                        .map(|v| v.label())
                        .collect::<Vec<_>>()
                        .join(", "),
                    rate(0),
                    rate(at),
                )),
            );
        }
    }
    let _ = std::fs::remove_file(&yaml);
    Ok(())
}
