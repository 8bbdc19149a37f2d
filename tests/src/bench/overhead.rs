//! Probe overhead: a fork+exit loop and a page-fault loop in a bench cgroup, with and without
//! the kernel programs, alternated (ABBA) in one run. "With" means `KernelPrograms` loaded and
//! the bench cgroup tracked, with a fork limit and a memory threshold (never reached) set, so
//! the fork/exit accounting and the in-kernel memcg walk both run on every event.

use std::time::Duration;

use anyhow::Context as _;
use node_agent::ebpf::KernelPrograms;

use super::{cgroups::BenchCgroup, median, report::Row};
use crate::Helper;

const SECTION: &str = "overhead";
const FORKS: usize = 2000;
const FAULT_MIB: usize = 64;
const FAULT_ROUNDS: usize = 8;

/// Runs one loop in a fresh helper inside `cgroup`; returns its own timing in ns.
fn timed(cgroup: &BenchCgroup, args: &[&str]) -> anyhow::Result<f64> {
    let exe = std::env::current_exe().context("finding the bench binary")?;
    let mut all = vec!["child".to_string()];
    all.extend(args.iter().map(|a| a.to_string()));
    let mut helper = Helper::spawn(&exe.to_string_lossy(), &all)?;
    cgroup.add(helper.pid())?;
    helper.go()?;
    let answer = helper.read_line()?;
    helper.wait(Duration::from_secs(60))?;
    answer
        .strip_prefix("ns ")
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("loop helper {args:?} said {answer:?}, expected `ns N`"))
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
    // Per loop: (without, with) times of each round.
    let mut fork: Vec<(f64, f64)> = Vec::new();
    let mut fault: Vec<(f64, f64)> = Vec::new();
    // One warm-up of each so page cache and allocator state match from the first round.
    timed(&cgroup, &["fork", &fork_n])?;
    timed(&cgroup, &fault_args)?;
    for round in 0..rounds {
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        let (mut fk, mut ft) = ((0.0, 0.0), (0.0, 0.0));
        for with in order {
            let programs = if with {
                let mut p = KernelPrograms::load().context("loading the kernel programs")?;
                p.track_cgroup(id)?;
                p.set_fork_limit(id, 1_000_000, Duration::from_secs(1))?;
                p.set_memory_threshold(id, 1 << 40, 0)?;
                Some(p)
            } else {
                None
            };
            let a = timed(&cgroup, &["fork", &fork_n])?;
            let b = timed(&cgroup, &fault_args)?;
            if with {
                (fk.1, ft.1) = (a, b);
            } else {
                (fk.0, ft.0) = (a, b);
            }
            drop(programs);
        }
        fork.push(fk);
        fault.push(ft);
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
            (FAULT_ROUNDS * FAULT_MIB * 256) as f64,
            "ns",
            &fault,
        ),
    ] {
        let ratios: Vec<f64> = pairs.iter().map(|(off, on)| on / off).collect();
        let r = median(&ratios).unwrap_or(f64::NAN);
        let off = median(&pairs.iter().map(|p| p.0).collect::<Vec<_>>()).unwrap_or(f64::NAN);
        let on = median(&pairs.iter().map(|p| p.1).collect::<Vec<_>>()).unwrap_or(f64::NAN);
        let scale = if unit == "µs" { 1e3 } else { 1.0 };
        let pct = (r - 1.0) * 100.0;
        rows.push(
            Row::info(
                SECTION,
                format!("{name}: with ÷ without programs"),
                format!("{r:.3} ({pct:+.1} %)"),
            )
            .value(pct, "%")
            .target("≤ +3 %", pct <= 3.0)
            .note(format!(
                "median of {} alternated rounds; per {per}: {:.1} {unit} without, {:.1} {unit} with",
                pairs.len(),
                off / unit_count / scale,
                on / unit_count / scale,
            )),
        );
    }
    Ok(())
}
