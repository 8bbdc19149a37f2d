//! The agent's idle footprint: `node-agent trace --output json` (the real binary) watching a
//! node with 100 and then 1000 pod cgroups in the kubelet's cgroupfs layout, sampled from
//! `/proc` while nothing happens.

use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::Context as _;

use super::{cgroups::PodTree, report::Row, Rng};

const SECTION: &str = "footprint";

/// The agent process; killed on drop.
struct Agent(Child);

impl Agent {
    fn start(binary: &Path) -> anyhow::Result<Self> {
        let mut child = Command::new(binary)
            .args(["trace", "--output", "json"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let stderr = child.stderr.take().context("agent stderr")?;
        let agent = Self(child);
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("tracing") {
                    let _ = tx.send(());
                }
                if line.contains("WARN") || line.contains("ERROR") {
                    eprintln!("agent: {line}");
                }
            }
        });
        rx.recv_timeout(Duration::from_secs(30))
            .context("the agent did not log `tracing` within 30 s")?;
        Ok(agent)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    /// CPU time of all its threads, ns.
    fn cpu_ns(&self) -> anyhow::Result<u64> {
        process_cpu_ns(self.pid())
    }

    /// VmRSS, bytes.
    fn rss(&self) -> anyhow::Result<u64> {
        let path = format!("/proc/{}/status", self.pid());
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {path}: did the agent exit?"))?;
        text.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib * 1024)
            .with_context(|| format!("no VmRSS in {path}"))
    }

    fn stop(mut self) -> anyhow::Result<()> {
        // SAFETY: signals the agent we started.
        unsafe { libc::kill(self.pid() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(status) = self.0.try_wait()? {
                anyhow::ensure!(status.success(), "the agent exited with {status}");
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the agent did not exit within 5 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Busy and total jiffies of the whole node (/proc/stat's `cpu` line).
/// The node's CPU from the first line of `/proc/stat`, in jiffies summed over CPUs.
#[derive(Debug, Clone, Copy)]
struct NodeJiffies {
    /// user, nice, system, irq, softirq: time the guest's CPUs spent working.
    busy: u64,
    /// Time a runnable vCPU waited for the hypervisor to run it (0 on bare metal).
    steal: u64,
    /// Everything, idle and iowait included.
    total: u64,
}

fn node_jiffies() -> anyhow::Result<NodeJiffies> {
    let text = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let fields: Vec<u64> = text
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("cpu "))
        .context("no cpu line in /proc/stat")?
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    let &[user, nice, system, idle, iowait, irq, softirq, steal, ..] = fields.as_slice() else {
        anyhow::bail!("short cpu line in /proc/stat (fewer than 8 fields)");
    };
    Ok(NodeJiffies {
        busy: user + nice + system + irq + softirq,
        steal,
        total: user + nice + system + idle + iowait + irq + softirq + steal,
    })
}

/// The daemon as deployed (`node-agent run`, standalone), idle: its own CPU, and the whole
/// node's CPU with it running against without, alternated, which also counts what runs in the
/// kernel on its behalf (the memory sampler's timer).
pub fn daemon(
    rows: &mut Vec<Row>,
    agent: &Path,
    work_dir: &Path,
    sample: Duration,
    rounds: usize,
) -> anyhow::Result<()> {
    // (busy, steal) in percent of one core: their share of all CPUs times the CPU count.
    let measure = || -> anyhow::Result<(f64, f64)> {
        let a = node_jiffies()?;
        std::thread::sleep(sample);
        let b = node_jiffies()?;
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let share = |x: u64| x as f64 / (b.total - a.total).max(1) as f64 * cpus * 100.0;
        Ok((share(b.busy - a.busy), share(b.steal - a.steal)))
    };
    // Per round: (without, with) busy and steal shares of the node.
    let (mut pairs, mut own) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        let mut got = [(0.0, 0.0); 2];
        for on in order {
            if on {
                let d = super::stress::Daemon::start(agent, work_dir)?;
                let c0 = process_cpu_ns(d.pid())?;
                let t = Instant::now();
                got[1] = measure()?;
                own.push(
                    (process_cpu_ns(d.pid())? - c0) as f64 / t.elapsed().as_nanos() as f64 * 100.0,
                );
                d.stop()?;
            } else {
                got[0] = measure()?;
            }
        }
        pairs.push((got[0], got[1]));
    }
    let med = |v: &[f64]| super::median(v).unwrap_or(f64::NAN);
    let own = med(&own);
    // Each round's with − without: the node's own background drifts, a pair taken together
    // cancels most of it.
    let deltas = |f: fn(&(f64, f64)) -> f64| -> Vec<f64> {
        pairs.iter().map(|(off, on)| f(on) - f(off)).collect()
    };
    let (busy, steal) = (deltas(|m| m.0), deltas(|m| m.1));
    let q = |v: &[f64], at: f64| super::quantile(v, at).unwrap_or(f64::NAN);
    let delta = q(&busy, 0.5);
    let without = med(&pairs.iter().map(|p| p.0 .0).collect::<Vec<_>>());
    rows.push(
        Row::info(
            SECTION,
            "daemon idle CPU (its own threads)",
            format!("{own:.3} % of one core"),
        )
        .value(own, "%")
        .target("< 0.5 %", own < 0.5)
        .note(format!(
            "`node-agent run`, standalone, {} × {} s",
            rounds,
            sample.as_secs()
        )),
    );
    rows.push(
        Row::info(
            SECTION,
            "daemon idle: whole node's CPU, with − without",
            format!("{delta:+.3} % of one core"),
        )
        .value(delta, "%")
        .target("< 0.5 %", delta < 0.5)
        .note(format!(
            "/proc/stat user + nice + system + irq + softirq, median over {rounds} alternated pairs \
             of windows of with − without (quartiles {:+.3} … {:+.3}; {without:.3} % without): \
             includes the kernel's work for the agent (the memory sampler's timers)",
            q(&busy, 0.25),
            q(&busy, 0.75),
        )),
    );
    let steal_delta = q(&steal, 0.5);
    rows.push(
        Row::info(
            SECTION,
            "daemon idle: host steal, with − without",
            format!("{steal_delta:+.3} % of one core"),
        )
        .value(steal_delta, "%")
        .note(format!(
            "/proc/stat steal, same windows (quartiles {:+.3} … {:+.3}): not CPU the node's \
             work loses but time idle vCPUs, woken by the sampler's ticks, waited for the \
             hypervisor to run them; it grows with the host's load and is 0 on bare metal",
            q(&steal, 0.25),
            q(&steal, 0.75),
        )),
    );
    Ok(())
}

/// CPU time of all a process's threads, ns (schedstat's first field).
fn process_cpu_ns(pid: u32) -> anyhow::Result<u64> {
    let dir = format!("/proc/{pid}/task");
    let mut total = 0;
    for task in std::fs::read_dir(&dir).with_context(|| format!("listing {dir}"))? {
        let path = task?.path().join("schedstat");
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        total += text
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok(total)
}

pub fn run(
    rows: &mut Vec<Row>,
    agent: &Path,
    sample: Duration,
    rng: &mut Rng,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        agent.is_file(),
        "no agent binary at {}: `cargo xtask bench` builds it and passes --agent",
        agent.display()
    );
    for pods in [100usize, 1000] {
        let tree = PodTree::create(pods, rng)?;
        let proc = Agent::start(agent)?;
        // Let the first scan, the tracking of every cgroup and the first housekeeping settle.
        std::thread::sleep(Duration::from_secs(2));
        let (cpu0, t0) = (proc.cpu_ns()?, Instant::now());
        let mut rss_max = proc.rss()?;
        while t0.elapsed() < sample {
            std::thread::sleep(Duration::from_millis(500));
            rss_max = rss_max.max(proc.rss()?);
        }
        let cpu = (proc.cpu_ns()? - cpu0) as f64 / t0.elapsed().as_nanos() as f64 * 100.0;
        proc.stop()?;
        drop(tree);
        let cgroups = 2 * pods + 3;
        rows.push(
            Row::info(
                SECTION,
                format!("agent idle CPU, {pods} pods"),
                format!("{cpu:.3} % of one core"),
            )
            .value(cpu, "%")
            .target("< 0.5 %", cpu < 0.5)
            .note(format!(
                "`node-agent trace --output json`, {} s sampled; {cgroups} bench cgroups \
                 (pod + container each) in the memory hierarchy",
                sample.as_secs()
            )),
        );
        let mib = rss_max as f64 / (1 << 20) as f64;
        rows.push(
            Row::info(
                SECTION,
                format!("agent RSS, {pods} pods"),
                format!("{mib:.1} MiB"),
            )
            .value(mib, "MiB")
            .target("< 50 MiB", mib < 50.0)
            .note("largest VmRSS sampled"),
        );
    }
    Ok(())
}
