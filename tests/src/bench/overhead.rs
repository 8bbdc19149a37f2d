//! Probe overhead on the bench's own loops: a fork+exit loop and a page-fault loop in a bench
//! cgroup, with and without the kernel programs, alternated (ABBA) in one run. "With" means
//! `KernelPrograms` loaded (the cheapest memory mechanism this kernel offers) and the bench
//! cgroup tracked, with a fork limit and a memory line that is never reached, so the fork/exit
//! accounting and the memory mechanism both run as they would for a pod.
//!
//! Then one more pass with the kernel's BPF statistics on (they cost time of their own, so the
//! ratios are measured without them) gives each program's invocations per fork and per page and
//! its time per invocation, and the sampler's ticks and time per tick.

use std::time::Duration;

use anyhow::Context as _;
use node_agent::ebpf::{KernelPrograms, MemoryMechanism, ProgramStats};

use super::{cgroups::BenchCgroup, median, report::Row};
use crate::Helper;

const SECTION: &str = "overhead";
const FORKS: usize = 2000;
const FAULT_MIB: usize = 64;
const FAULT_ROUNDS: usize = 8;
const PAGES: usize = FAULT_ROUNDS * FAULT_MIB * 256;

/// Wall and CPU time of one loop, ns.
#[derive(Debug, Clone, Copy)]
struct Timing {
    wall: f64,
    cpu: f64,
}

/// Runs one loop in a fresh helper inside `cgroup`.
fn timed(cgroup: &BenchCgroup, args: &[&str]) -> anyhow::Result<Timing> {
    let exe = std::env::current_exe().context("finding the bench binary")?;
    let mut all = vec!["child".to_string()];
    all.extend(args.iter().map(|a| a.to_string()));
    let mut helper = Helper::spawn(&exe.to_string_lossy(), &all)?;
    cgroup.add(helper.pid())?;
    helper.go()?;
    let answer = helper.read_line()?;
    helper.wait(Duration::from_secs(60))?;
    let mut fields = answer.strip_prefix("ns ").unwrap_or("").split(' ');
    let mut next = || fields.next().and_then(|n| n.parse::<f64>().ok());
    match (next(), next()) {
        (Some(wall), Some(cpu)) => Ok(Timing { wall, cpu }),
        _ => anyhow::bail!("loop helper {args:?} said {answer:?}, expected `ns WALL CPU`"),
    }
}

fn load(cgroup_id: u64) -> anyhow::Result<KernelPrograms> {
    let mut p = KernelPrograms::load().context("loading the kernel programs")?;
    p.track_cgroup(cgroup_id)?;
    p.set_fork_limit(cgroup_id, 1_000_000, Duration::from_secs(1))?;
    p.set_memory_threshold(cgroup_id, 1 << 40, 0)?;
    Ok(p)
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
    // Per loop: (without, with) of each round.
    let mut fork: Vec<(Timing, Timing)> = Vec::new();
    let mut fault: Vec<(Timing, Timing)> = Vec::new();
    // One warm-up of each so page cache and allocator state match from the first round.
    timed(&cgroup, &["fork", &fork_n])?;
    timed(&cgroup, &fault_args)?;
    let mut mechanism = MemoryMechanism::Unavailable;
    for round in 0..rounds {
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        let mut pair = [None, None, None, None];
        for with in order {
            let programs = if with { Some(load(id)?) } else { None };
            if let Some(p) = &programs {
                mechanism = p.memory_mechanism();
            }
            let a = timed(&cgroup, &["fork", &fork_n])?;
            let b = timed(&cgroup, &fault_args)?;
            let at = usize::from(with);
            (pair[at], pair[2 + at]) = (Some(a), Some(b));
            drop(programs);
        }
        if let [Some(f0), Some(f1), Some(p0), Some(p1)] = pair {
            fork.push((f0, f1));
            fault.push((p0, p1));
        }
    }
    for (name, per, unit_count, unit, pairs) in [
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
        let ratio = |f: fn(&Timing) -> f64| {
            let r: Vec<f64> = pairs.iter().map(|(off, on)| f(on) / f(off)).collect();
            median(&r).unwrap_or(f64::NAN)
        };
        let (wall, cpu) = (ratio(|t| t.wall), ratio(|t| t.cpu));
        let per_unit = |v: Vec<f64>| {
            let scale = if unit == "µs" { 1e3 } else { 1.0 };
            median(&v).unwrap_or(f64::NAN) / unit_count / scale
        };
        let off = per_unit(pairs.iter().map(|p| p.0.wall).collect());
        let on = per_unit(pairs.iter().map(|p| p.1.wall).collect());
        let pct = (wall - 1.0) * 100.0;
        rows.push(
            Row::info(
                SECTION,
                format!("{name}: with ÷ without programs"),
                format!("{wall:.3} ({pct:+.1} %)"),
            )
            .value(pct, "%")
            .target("≤ +3 %", pct <= 3.0)
            .note(format!(
                "median of {} alternated rounds, wall time; CPU time ratio {:.3}; per {per}: \
                 {off:.1} {unit} without, {on:.1} {unit} with; memory mechanism: {mechanism}",
                pairs.len(),
                cpu,
            )),
        );
    }
    per_program(rows, &cgroup, id, &fork_n, &fault_args)
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
    let mut programs = load(id)?;
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
                "{per_s:.0} ticks/s (period {:?}), nothing per page; kernel-measured time in the \
                 callback: {:.3} % of one CPU, timer interrupt not included",
                programs.sampler_period().unwrap_or_default(),
                busy / elapsed.as_nanos().max(1) as f64 * 100.0,
            )),
        );
    }
    Ok(())
}
