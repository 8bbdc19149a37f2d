//! Probe overhead on the bench's own loops: a fork+exit loop and a page-fault loop in a bench
//! cgroup, with and without the kernel programs, alternated (ABBA) in one run. "With" means
//! `KernelPrograms` loaded (the cheapest memory mechanism this kernel offers) and the bench
//! cgroup tracked, with a fork limit and a memory line that is never reached, so the fork/exit
//! accounting and the memory mechanism both run as they would for a pod. Single passes vary by
//! ~9 % on a shared VM, so the rows give the quartiles of the per-round ratios beside the median.
//!
//! Then one more pass with the kernel's BPF statistics on (they cost time of their own, so the
//! ratios are measured without them) gives each program's invocations per fork and per page and
//! its time per invocation, and the sampler's ticks and time per tick.

use std::time::Duration;

use anyhow::Context as _;
use node_agent::ebpf::{KernelPrograms, LoadOptions, MemoryChoice, MemoryMechanism, ProgramStats};

use super::{cgroups::BenchCgroup, median, quantile, report::Row, PinnedCpu};
use crate::Helper;

const SECTION: &str = "overhead";
const FORKS: usize = 4000;
const FAULT_MIB: usize = 64;
const FAULT_ROUNDS: usize = 8;
const PAGES: usize = FAULT_ROUNDS * FAULT_MIB * 256;

/// Measured passes of each loop per variant and round, after one discarded pass.
const REPEATS: usize = 2;

/// Wall and CPU time of one loop, ns.
#[derive(Debug, Clone, Copy)]
struct Timing {
    wall: f64,
    cpu: f64,
}

impl Timing {
    fn plus(self, other: Timing) -> Timing {
        Timing {
            wall: self.wall + other.wall,
            cpu: self.cpu + other.cpu,
        }
    }
}

/// Runs one loop in a fresh helper inside `cgroup`.
fn timed(cgroup: &BenchCgroup, args: &[&str]) -> anyhow::Result<Timing> {
    let (wall, cpu) = ask(cgroup, args, "ns")?;
    Ok(Timing { wall, cpu })
}

/// Runs `node-agent-bench child ARGS` inside `cgroup` and reads its answer, `WORD A B`.
fn ask(cgroup: &BenchCgroup, args: &[&str], word: &str) -> anyhow::Result<(f64, f64)> {
    let exe = std::env::current_exe().context("finding the bench binary")?;
    let mut all = vec!["child".to_string()];
    all.extend(args.iter().map(|a| a.to_string()));
    let mut helper = Helper::spawn(&exe.to_string_lossy(), &all)?;
    cgroup.add(helper.pid())?;
    helper.go()?;
    let answer = helper.read_line()?;
    helper.wait(Duration::from_secs(60))?;
    let mut fields = answer
        .strip_prefix(word)
        .and_then(|rest| rest.strip_prefix(' '))
        .unwrap_or("")
        .split(' ');
    let mut next = || fields.next().and_then(|n| n.parse::<f64>().ok());
    match (next(), next()) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => anyhow::bail!("helper {args:?} said {answer:?}, expected `{word}` and two numbers"),
    }
}

/// What is attached in a run: nothing, one half of the programs, or all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probes {
    None,
    /// The fork/exit programs and the other tracepoints, no memory mechanism.
    Tasks,
    /// The memory mechanism with one line, no fork/exit programs.
    Memory,
    /// Everything, as the daemon runs it.
    All,
}

const VARIANTS: [Probes; 4] = [Probes::None, Probes::Tasks, Probes::Memory, Probes::All];

fn load(cgroup_id: u64, probes: Probes) -> anyhow::Result<Option<KernelPrograms>> {
    let options = match probes {
        Probes::None => return Ok(None),
        Probes::Tasks => LoadOptions {
            memory: MemoryChoice::Polling,
            ..LoadOptions::default()
        },
        Probes::Memory => LoadOptions {
            task_accounting: false,
            ..LoadOptions::default()
        },
        Probes::All => LoadOptions::default(),
    };
    let mut p = KernelPrograms::load_with(&options).context("loading the kernel programs")?;
    p.track_cgroup(cgroup_id)?;
    p.set_fork_limit(cgroup_id, 1_000_000, Duration::from_secs(1))?;
    if probes != Probes::Tasks {
        p.set_memory_threshold(cgroup_id, 1 << 40, 0)?;
    }
    Ok(Some(p))
}

pub fn run(rows: &mut Vec<Row>, rounds: usize) -> anyhow::Result<()> {
    let cgroup = BenchCgroup::memory("overhead")?;
    let id = cgroup.id()?;
    let fault_args = [
        "fault".to_string(),
        FAULT_MIB.to_string(),
        FAULT_ROUNDS.to_string(),
    ];
    let fault_args: Vec<&str> = fault_args.iter().map(String::as_str).collect();
    let fork_n = FORKS.to_string();
    let warm_forks = (FORKS / 4).to_string();
    let warm_mib = FAULT_MIB.to_string();
    let warm_fault = ["fault", &warm_mib, "2"];
    // Everything on one CPU: the loops, their children, and the programs' loading, so the
    // sampler's timer (armed where it was loaded, re-armed where it fires) interrupts the loop
    // it is measured against, and a fork's child and parent never wait on each other across
    // vCPUs (that alone made single passes vary by 12–26 % here, 8 % pinned).
    let _pinned = PinnedCpu::last()?;
    // Per loop and round: the timing of each variant, in `VARIANTS` order.
    let mut fork: Vec<[Timing; 4]> = Vec::new();
    let mut fault: Vec<[Timing; 4]> = Vec::new();
    let mut mechanism = MemoryMechanism::Unavailable;
    let zero = Timing {
        wall: 0.0,
        cpu: 0.0,
    };
    for round in 0..rounds {
        // ABCD, then DCBA: each variant sees every position over two rounds.
        let mut order = VARIANTS;
        if round % 2 == 1 {
            order.reverse();
        }
        let (mut a, mut b) = ([zero; 4], [zero; 4]);
        for probes in order {
            let programs = load(id, probes)?;
            if let Some(p) = programs.as_ref().filter(|_| probes == Probes::All) {
                mechanism = p.memory_mechanism();
            }
            let at = VARIANTS.iter().position(|v| *v == probes).unwrap_or(0);
            // A short discarded pass of each loop first, for every variant alike: loading the
            // programs (or not) and freeing the previous ones leave the vCPUs and the allocator
            // in a different state, and without this the first loop after it runs up to ~10 %
            // off.
            timed(&cgroup, &["fork", &warm_forks])?;
            timed(&cgroup, &warm_fault)?;
            for _ in 0..REPEATS {
                a[at] = a[at].plus(timed(&cgroup, &["fork", &fork_n])?);
                b[at] = b[at].plus(timed(&cgroup, &fault_args)?);
            }
            drop(programs);
        }
        fork.push(a);
        fault.push(b);
    }
    for (name, per, unit_count, unit, runs) in [
        (
            format!("fork+exit loop ({FORKS} forks)"),
            "fork+exit",
            FORKS as f64,
            "µs",
            &fork,
        ),
        (
            format!("page-fault loop ({FAULT_ROUNDS} × map, touch, unmap {FAULT_MIB} MiB)"),
            "page",
            PAGES as f64,
            "ns",
            &fault,
        ),
    ] {
        // Quantile `q` over rounds of (variant ÷ no programs) in the same round.
        let ratio_at = |at: usize, q: f64, f: fn(&Timing) -> f64| {
            let r: Vec<f64> = runs.iter().map(|t| f(&t[at]) / f(&t[0])).collect();
            quantile(&r, q).unwrap_or(f64::NAN)
        };
        let ratio = |at: usize, f: fn(&Timing) -> f64| ratio_at(at, 0.5, f);
        let per_unit = |at: usize| {
            let scale = if unit == "µs" { 1e3 } else { 1.0 };
            let v: Vec<f64> = runs.iter().map(|t| t[at].wall).collect();
            median(&v).unwrap_or(f64::NAN) / (unit_count * REPEATS as f64) / scale
        };
        let all = VARIANTS.len() - 1;
        let (wall, cpu) = (ratio(all, |t| t.wall), ratio(all, |t| t.cpu));
        let pct = (wall - 1.0) * 100.0;
        let spread = |at: usize| {
            let pct = |q: f64| (ratio_at(at, q, |t| t.wall) - 1.0) * 100.0;
            format!("{:+.1} … {:+.1} %", pct(0.25), pct(0.75))
        };
        rows.push(
            Row::info(
                SECTION,
                format!("{name}: with ÷ without programs"),
                format!("{wall:.3} ({pct:+.1} %)"),
            )
            .value(pct, "%")
            .target("≤ +3 %", pct <= 3.0)
            .note(format!(
                "median of {} alternated rounds (quartiles {}), each variant after one short \
                 discarded pass, {REPEATS} measured passes summed; wall time; CPU time ratio {:.3}; per \
                 {per}: {:.1} {unit} without, {:.1} {unit} with; memory mechanism: {mechanism}",
                runs.len(),
                spread(all),
                cpu,
                per_unit(0),
                per_unit(all),
            )),
        );
        let part = |at: usize| (ratio(at, |t| t.wall) - 1.0) * 100.0;
        let (tasks, memory) = (part(1), part(2));
        rows.push(
            Row::info(
                SECTION,
                format!("{name}: fork/exit programs only / memory mechanism only"),
                format!("{tasks:+.1} % / {memory:+.1} %"),
            )
            .value(tasks.max(memory), "%")
            .note(format!(
                "same rounds, each ÷ no programs in its round (order ABCD then DCBA), \
                 quartiles {} / {}; fork/exit only: the tracepoint programs with the cgroup \
                 tracked and a fork limit, no memory line; memory only: {mechanism} with one \
                 line, no fork/exit programs",
                spread(1),
                spread(2),
            )),
        );
    }
    interruptions(rows, &cgroup, id, rounds.div_ceil(2))?;
    per_program(rows, &cgroup, id, &fork_n, &fault_args)
}

/// How long each spin runs, ms.
const SPIN_MS: u64 = 2000;

/// The steadier measure of what the programs take from a busy CPU when it neither forks nor
/// faults: a helper spins on the (pinned) CPU summing the gaps in its clock reads, with no
/// programs and with everything loaded, alternated ABBA. The difference is the sampler's timer
/// (interrupt, softirq and callback) and anything else the programs make the CPU do.
fn interruptions(
    rows: &mut Vec<Row>,
    cgroup: &BenchCgroup,
    id: u64,
    rounds: usize,
) -> anyhow::Result<()> {
    let spin = |probes: Probes| -> anyhow::Result<f64> {
        let programs = load(id, probes)?;
        let ms = SPIN_MS.to_string();
        let (elapsed, lost) = ask(cgroup, &["spin", &ms], "spin")?;
        drop(programs);
        anyhow::ensure!(elapsed > 0.0, "the spin helper spun for {elapsed} ns");
        Ok(lost / elapsed * 100.0)
    };
    let (mut without, mut with, mut diff) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let (a, b) = if round % 2 == 0 {
            let a = spin(Probes::None)?;
            (a, spin(Probes::All)?)
        } else {
            let b = spin(Probes::All)?;
            (spin(Probes::None)?, b)
        };
        without.push(a);
        with.push(b);
        diff.push(b - a);
    }
    let q = |v: &[f64], at: f64| quantile(v, at).unwrap_or(f64::NAN);
    let d = q(&diff, 0.5);
    rows.push(
        Row::info(
            SECTION,
            "busy CPU taken by interruptions: with − without programs",
            format!("{d:+.2} % of the CPU"),
        )
        .value(d, "%")
        .note(format!(
            "a helper spinning {:.0} s on the loops' CPU sums the gaps over 1 µs between its \
             clock reads; median of {rounds} alternated pairs (quartiles {:+.2} … {:+.2}); \
             {:.2} % without, {:.2} % with (median); no forks or faults, so this is the \
             memory sampler's timer and whatever else the loaded programs take from a busy \
             CPU that neither forks nor faults",
            SPIN_MS as f64 / 1e3,
            q(&diff, 0.25),
            q(&diff, 0.75),
            q(&without, 0.5),
            q(&with, 0.5),
        )),
    );
    Ok(())
}

/// One pass of each loop with BPF statistics on: invocations per fork / per page and time per
/// invocation of each program, and the sampler's ticks.
fn per_program(
    rows: &mut Vec<Row>,
    cgroup: &BenchCgroup,
    id: u64,
    fork_n: &str,
    fault_args: &[&str],
) -> anyhow::Result<()> {
    let _stats =
        node_agent::ebpf::enable_run_time_stats().context("enabling BPF run-time statistics")?;
    let mut programs = load(id, Probes::All)?.context("loading the kernel programs")?;
    let t = std::time::Instant::now();
    let sampler0 = programs.sampler_stats()?;
    let s0 = programs.program_stats();
    timed(cgroup, &["fork", fork_n])?;
    let s1 = programs.program_stats();
    timed(cgroup, fault_args)?;
    let s2 = programs.program_stats();
    let sampler1 = programs.sampler_stats()?;
    let elapsed = t.elapsed();
    let delta = |a: &[ProgramStats], b: &[ProgramStats], name: &str| -> (u64, f64) {
        let find = |s: &[ProgramStats]| {
            s.iter()
                .find(|p| p.name == name)
                .map(|p| (p.run_count, p.run_time.as_nanos() as f64))
                .unwrap_or((0, 0.0))
        };
        let ((c0, t0), (c1, t1)) = (find(a), find(b));
        (c1.saturating_sub(c0), t1 - t0)
    };
    for p in &s2 {
        let (fork_runs, fork_ns) = delta(&s0, &s1, &p.name);
        let (fault_runs, fault_ns) = delta(&s1, &s2, &p.name);
        let (runs, ns) = (fork_runs + fault_runs, fork_ns + fault_ns);
        if runs == 0 {
            continue;
        }
        rows.push(
            Row::info(
                SECTION,
                format!("program {}: ns per invocation", p.name),
                format!("{:.0} ns", ns / runs as f64),
            )
            .value(ns / runs as f64, "ns")
            .note(format!(
                "{:.3} per fork (fork+exit loop), {:.4} per page (page-fault loop); \
                 kernel.bpf_stats run_time_ns / run_cnt, which includes the statistics' own clock reads",
                fork_runs as f64 / FORKS as f64,
                fault_runs as f64 / PAGES as f64,
            )),
        );
    }
    let pace = programs.sampler_pace();
    if let (Some(a), Some(b)) = (sampler0, sampler1) {
        let ticks = b.ticks.saturating_sub(a.ticks);
        let busy = b.busy_ns.saturating_sub(a.busy_ns) as f64;
        let per_s = ticks as f64 / elapsed.as_secs_f64();
        rows.push(
            Row::info(
                SECTION,
                "memory sampler: ns per tick (one line)",
                format!("{:.0} ns", busy / ticks.max(1) as f64),
            )
            .value(busy / ticks.max(1) as f64, "ns")
            .note(format!(
                "{per_s:.0} ticks/s (every {:?} near a line, up to every {:?} while all are \
                 far: this line is far), nothing per page; kernel-measured time in the \
                 callback: {:.3} % of one CPU, timer interrupt not included",
                pace.map(|p| p.period).unwrap_or_default(),
                pace.map(|p| p.max_period).unwrap_or_default(),
                busy / elapsed.as_nanos().max(1) as f64 * 100.0,
            )),
        );
    }
    Ok(())
}

/// `node-agent-bench probes VARIANT CGROUP_DIR [PERIOD_US]`: loads one variant (`none`,
/// `tasks`, `memory`, `all`) for the memory cgroup at CGROUP_DIR as the loops above do, says
/// `ready`, and holds it until stdin closes; for measuring other workloads by hand the same way.
pub fn hold(args: &[String]) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    let usage = "usage: node-agent-bench probes none|tasks|memory|all CGROUP_DIR [PERIOD_US]";
    let (variant, dir) = match args {
        [v, d] | [v, d, _] => (v.as_str(), d),
        _ => anyhow::bail!("{usage}"),
    };
    let probes = match variant {
        "none" => Probes::None,
        "tasks" => Probes::Tasks,
        "memory" => Probes::Memory,
        "all" => Probes::All,
        other => anyhow::bail!("unknown variant {other:?}; {usage}"),
    };
    let id = std::fs::metadata(dir)
        .with_context(|| format!("reading {dir}"))?
        .ino();
    let programs = match args.get(2) {
        Some(us) => {
            let us: u64 = us
                .parse()
                .with_context(|| format!("PERIOD_US {us:?}; {usage}"))?;
            let mut p = KernelPrograms::load_with(&LoadOptions {
                sampler: node_agent::ebpf::SamplerPace {
                    period: Duration::from_micros(us),
                    max_period: Duration::from_micros(us),
                    charge_bytes_per_us: Some(0),
                },
                task_accounting: probes != Probes::Memory,
                memory: if probes == Probes::Tasks {
                    MemoryChoice::Polling
                } else {
                    MemoryChoice::Auto
                },
                ..LoadOptions::default()
            })?;
            p.track_cgroup(id)?;
            p.set_fork_limit(id, 1_000_000, Duration::from_secs(1))?;
            if probes != Probes::Tasks {
                p.set_memory_threshold(id, 1 << 40, 0)?;
            }
            Some(p)
        }
        None => load(id, probes)?,
    };
    println!("ready");
    let mut sink = String::new();
    while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {
        sink.clear();
    }
    drop(programs);
    Ok(())
}
