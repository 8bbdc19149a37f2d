//! Probe overhead on the bench's own loops: a fork+exit loop and a page-fault loop in a bench
//! cgroup, with no programs, with the programs and every line far (the sampler at its slowest
//! pace), and with the programs and a line within reach (the sampler at its near-line pace,
//! 1 ms), alternated in one run (ABC, then CBA). "With" means `KernelPrograms` loaded (the
//! cheapest memory mechanism this kernel offers) and the bench cgroup tracked, with a fork
//! limit and a memory line that is never reached, so the fork/exit accounting and the memory
//! mechanism both run as they would for a pod. Each row is the median of the per-round ratios
//! with its 95 % interval ([`super::stats`]), judged at the interval's upper end.
//!
//! A helper spinning on the loops' CPU measures the same variants more finely: the time the
//! CPU spends away from it (interrupts, softirqs, the sampler's callback). Then one more pass
//! with the kernel's BPF statistics on (they cost time of their own, so the ratios are measured
//! without them) gives each program's invocations per fork and per page and its time per
//! invocation, and the sampler's ticks per second with lines far and near.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use node_agent::ebpf::{KernelPrograms, LoadOptions, MemoryMechanism, ProgramStats};

use super::{
    cgroups::BenchCgroup,
    median,
    report::Row,
    stats::{mean_ci, median_ci},
    PinnedCpu,
};
use crate::Helper;

const SECTION: &str = "overhead";

/// The line that keeps the sampler at its near-line pace: this far above the usage of an idle
/// bench cgroup of its own, less than one largest single charge (a 2 MiB transparent huge
/// page), so a charge could cross it at any moment. Nothing charges that cgroup, so it is
/// never crossed and no event is sent.
pub const NEAR_HEADROOM: u64 = 1 << 20;
/// The loops' own line: far above anything they charge.
const FAR_LINE: u64 = 1 << 40;

/// What is attached in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probes {
    None,
    /// Everything, as the daemon runs it, with every line far.
    Far,
    /// Everything, and a line within reach on another cgroup: the near-line pace.
    Near,
}

impl Probes {
    pub fn label(self) -> &'static str {
        match self {
            Probes::None => "none",
            Probes::Far => "lines far",
            Probes::Near => "a line near",
        }
    }
}

/// The cgroups the programs watch: the workload's (far line, fork limit) and, for
/// [`Probes::Near`], an idle one with the near line.
pub struct Lines {
    pub workload: u64,
    near: BenchCgroup,
}

impl Lines {
    pub fn new(workload: u64) -> anyhow::Result<Self> {
        Ok(Self {
            workload,
            near: BenchCgroup::memory("near")?,
        })
    }

    /// Loads the programs for `probes` (nothing for [`Probes::None`]).
    pub fn load(&self, probes: Probes) -> anyhow::Result<Option<KernelPrograms>> {
        self.load_with(probes, LoadOptions::default())
    }

    pub fn load_with(
        &self,
        probes: Probes,
        options: LoadOptions,
    ) -> anyhow::Result<Option<KernelPrograms>> {
        if probes == Probes::None {
            return Ok(None);
        }
        let mut p = KernelPrograms::load_with(&options).context("loading the kernel programs")?;
        let id = self.workload;
        p.track_cgroup(id)?;
        p.set_fork_limit(id, 1_000_000, Duration::from_secs(1))?;
        p.set_memory_threshold(id, FAR_LINE, 0)?;
        if probes == Probes::Near {
            let near = self.near.id()?;
            p.set_memory_threshold(near, self.near.usage()? + NEAR_HEADROOM, 0)?;
        }
        Ok(Some(p))
    }
}

/// The sizes of the two loops.
#[derive(Debug, Clone, Copy)]
pub struct Loops {
    pub forks: usize,
    pub fault_mib: usize,
    pub fault_rounds: usize,
    /// Measured passes of each loop per variant and round (summed), after one discarded pass.
    pub repeats: usize,
}

impl Loops {
    pub const HOST: Loops = Loops {
        forks: 4000,
        fault_mib: 64,
        fault_rounds: 8,
        repeats: 2,
    };

    pub fn pages(&self) -> usize {
        self.fault_rounds * self.fault_mib * 256
    }

    fn fork_name(&self) -> String {
        format!("fork+exit loop ({} forks)", self.forks)
    }

    fn fault_name(&self) -> String {
        format!(
            "page-fault loop ({} × map, touch, unmap {} MiB)",
            self.fault_rounds, self.fault_mib
        )
    }
}

/// Wall and CPU time of one loop, ns.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timing {
    pub wall: f64,
    pub cpu: f64,
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
fn timed(cgroup: &BenchCgroup, args: &[String]) -> anyhow::Result<Timing> {
    let (wall, cpu) = ask(cgroup, args, "ns")?;
    Ok(Timing { wall, cpu })
}

/// Runs `node-agent-bench child ARGS` inside `cgroup` and reads its answer, `WORD A B`.
fn ask(cgroup: &BenchCgroup, args: &[String], word: &str) -> anyhow::Result<(f64, f64)> {
    let exe = std::env::current_exe().context("finding the bench binary")?;
    let mut all = vec!["child".to_string()];
    all.extend(args.iter().cloned());
    let mut helper = Helper::spawn(&exe.to_string_lossy(), &all)?;
    cgroup.add(helper.pid())?;
    helper.go()?;
    let answer = helper.read_line()?;
    helper.wait(Duration::from_secs(600))?;
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

/// Runs one loop (`fork N`, `fault MIB ROUNDS`) in a fresh helper inside `cgroup`.
pub fn run_loop(cgroup: &BenchCgroup, mode: &str, params: &[usize]) -> anyhow::Result<Timing> {
    let mut a = vec![mode.to_string()];
    a.extend(params.iter().map(|p| p.to_string()));
    timed(cgroup, &a)
}

fn args(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

/// Per loop and round, the timing of each variant (in `variants` order).
pub struct Measured {
    pub variants: Vec<Probes>,
    pub fork: Vec<Vec<Timing>>,
    pub fault: Vec<Vec<Timing>>,
    pub mechanism: MemoryMechanism,
    /// Sampler ticks per second during the [`Probes::Near`] passes, if the sampler ran.
    pub near_ticks_per_s: Option<f64>,
}

/// Runs both loops under every variant, `rounds` times, the order reversed every other round.
pub fn measure(
    cgroup: &BenchCgroup,
    lines: &Lines,
    variants: &[Probes],
    rounds: usize,
    loops: Loops,
) -> anyhow::Result<Measured> {
    let fork = args(&["fork", &loops.forks.to_string()]);
    let fault = args(&[
        "fault",
        &loops.fault_mib.to_string(),
        &loops.fault_rounds.to_string(),
    ]);
    let warm_fork = args(&["fork", &(loops.forks / 4).max(1).to_string()]);
    let warm_fault = args(&["fault", &loops.fault_mib.to_string(), "2"]);
    let mut out = Measured {
        variants: variants.to_vec(),
        fork: Vec::new(),
        fault: Vec::new(),
        mechanism: MemoryMechanism::Unavailable,
        near_ticks_per_s: None,
    };
    let (mut near_ticks, mut near_secs) = (0u64, 0.0);
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..variants.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        let (mut a, mut b) = (
            vec![Timing::default(); variants.len()],
            vec![Timing::default(); variants.len()],
        );
        for at in order {
            let probes = variants[at];
            let mut programs = lines.load(probes)?;
            if let Some(p) = programs.as_ref() {
                out.mechanism = p.memory_mechanism();
            }
            // A short discarded pass of each loop first, for every variant alike: loading the
            // programs (or not) and freeing the previous ones leave the vCPUs and the allocator
            // in a different state, and without this the first loop after it runs up to ~10 %
            // off.
            timed(cgroup, &warm_fork)?;
            timed(cgroup, &warm_fault)?;
            let before = sampler_ticks(programs.as_mut());
            let started = Instant::now();
            for _ in 0..loops.repeats {
                a[at] = a[at].plus(timed(cgroup, &fork)?);
                b[at] = b[at].plus(timed(cgroup, &fault)?);
            }
            if probes == Probes::Near {
                if let (Some(t0), Some(t1)) = (before, sampler_ticks(programs.as_mut())) {
                    near_ticks += t1.saturating_sub(t0);
                    near_secs += started.elapsed().as_secs_f64();
                }
            }
            drop(programs);
        }
        out.fork.push(a);
        out.fault.push(b);
    }
    if near_secs > 0.0 {
        out.near_ticks_per_s = Some(near_ticks as f64 / near_secs);
    }
    Ok(out)
}

fn sampler_ticks(programs: Option<&mut KernelPrograms>) -> Option<u64> {
    programs?.sampler_stats().ok().flatten().map(|s| s.ticks)
}

/// The loop rows of `measured`: each variant against no programs.
pub fn loop_rows(
    section: &str,
    label: &str,
    measured: &Measured,
    loops: Loops,
    target: bool,
) -> Vec<Row> {
    let mut rows = Vec::new();
    for (name, per, units, unit, runs) in [
        (
            loops.fork_name(),
            "fork+exit",
            loops.forks as f64,
            "µs",
            &measured.fork,
        ),
        (
            loops.fault_name(),
            "page",
            loops.pages() as f64,
            "ns",
            &measured.fault,
        ),
    ] {
        let Some(none) = measured.variants.iter().position(|v| *v == Probes::None) else {
            continue;
        };
        let per_unit = |at: usize| {
            let scale = if unit == "µs" { 1e3 } else { 1.0 };
            let v: Vec<f64> = runs.iter().map(|t| t[at].wall).collect();
            median(&v).unwrap_or(f64::NAN) / (units * loops.repeats as f64) / scale
        };
        for (at, probes) in measured.variants.iter().enumerate() {
            if *probes == Probes::None {
                continue;
            }
            let ratio = |f: fn(&Timing) -> f64| -> Vec<f64> {
                runs.iter()
                    .map(|t| (f(&t[at]) / f(&t[none]) - 1.0) * 100.0)
                    .collect()
            };
            let Some(wall) = median_ci(&ratio(|t| t.wall)) else {
                continue;
            };
            let cpu = median(&ratio(|t| t.cpu)).unwrap_or(f64::NAN);
            let pace = match (probes, measured.near_ticks_per_s) {
                (Probes::Near, Some(t)) => format!(" (sampler {t:.0} ticks/s meanwhile)"),
                _ => String::new(),
            };
            let mut row = Row::info(
                section,
                format!("{label}{name}: with ÷ without programs, {}", probes.label()),
                format!("{} %", wall.show(1, true)),
            )
            .estimate(wall, "%")
            .note(format!(
                "{}; per-round slowdown of wall time, {} alternated rounds (order reversed \
                 every other round), each variant after one short discarded pass, {} measured \
                 passes summed; per {per}: {:.1} {unit} without, {:.1} {unit} with; median CPU \
                 time slowdown {cpu:+.1} %; memory mechanism: {}{pace}",
                wall.describe("median"),
                runs.len(),
                loops.repeats,
                per_unit(none),
                per_unit(at),
                measured.mechanism,
            ));
            if target {
                row = row.at_most("≤ +3 % (upper end)", 3.0);
            }
            rows.push(row);
        }
    }
    rows
}

/// Options of the host's overhead section.
pub struct Options {
    pub rounds: usize,
    pub spin_rounds: usize,
    /// Passes of each kind of the charge-rate check.
    pub charge_passes: usize,
}

pub fn run(rows: &mut Vec<Row>, opts: &Options) -> anyhow::Result<()> {
    let cgroup = BenchCgroup::memory("overhead")?;
    let lines = Lines::new(cgroup.id()?)?;
    // Everything on one CPU: the loops, their children, and the programs' loading, so the
    // sampler's timer (armed where it was loaded, re-armed where it fires) interrupts the loop
    // it is measured against, and a fork's child and parent never wait on each other across
    // vCPUs (that alone made single passes vary by 12–26 % here, 8 % pinned).
    let _pinned = PinnedCpu::last()?;
    let variants = [Probes::None, Probes::Far, Probes::Near];
    let measured = measure(&cgroup, &lines, &variants, opts.rounds, Loops::HOST)?;
    rows.extend(loop_rows(SECTION, "", &measured, Loops::HOST, true));
    interruptions(rows, &cgroup, &lines, opts.spin_rounds)?;
    per_program(rows, &cgroup, &lines, Loops::HOST)?;
    charge_rate(rows, &cgroup, opts.charge_passes)
}

/// MiB charged per pass of the charge-rate check.
const CHARGE_MIB: usize = 512;

/// The sampler's charge-rate bound, checked on this machine: the fastest one CPU charges
/// memory, in transparent huge pages (each fault zeroes and charges 2 MiB) and page by page,
/// best of `passes`. The bound must lie above both.
fn charge_rate(rows: &mut Vec<Row>, cgroup: &BenchCgroup, passes: usize) -> anyhow::Result<()> {
    let gib = (1u64 << 30) as f64;
    let bound = node_agent_common::MAX_CHARGE_BYTES_PER_US_PER_CPU as f64 * 1e6 / gib;
    let mut best = [0.0f64; 2];
    let mut huge_share = 0.0f64;
    for _ in 0..passes {
        for (at, huge) in [(0, true), (1, false)] {
            let words = [
                "charge",
                &CHARGE_MIB.to_string(),
                if huge { "1" } else { "0" },
            ];
            let (ns, huge_bytes) = ask(cgroup, &args(&words), "charge")?;
            let rate = (CHARGE_MIB << 20) as f64 / (ns / 1e9) / gib;
            best[at] = best[at].max(rate);
            if huge {
                huge_share = huge_share.max(huge_bytes / (CHARGE_MIB << 20) as f64);
            }
        }
    }
    let fastest = best[0].max(best[1]);
    rows.push(
        Row::info(
            SECTION,
            "the sampler's charge-rate bound, checked: fastest charge on one CPU",
            format!(
                "{:.2} GiB/s (huge pages) / {:.2} GiB/s (4 KiB pages)",
                best[0], best[1]
            ),
        )
        .value(fastest, "GiB/s")
        .below(format!("< {bound:.0} GiB/s (the bound)"), bound)
        .note(format!(
            "best of {passes} passes each of {CHARGE_MIB} MiB touched by one pinned thread in a \
             bench cgroup: one byte per 2 MiB with MADV_HUGEPAGE ({:.0} % given as huge pages), \
             one byte per 4 KiB page with MADV_NOHUGEPAGE; a maximum, no interval",
            huge_share * 100.0
        )),
    );
    Ok(())
}

/// How long each spin runs, ms.
const SPIN_MS: u64 = 2000;

/// The finer measure of what the programs take from a busy CPU that neither forks nor
/// faults: a helper spins on the (pinned) CPU summing the gaps in its clock reads, with no
/// programs, lines far, and a line near, alternated. The difference is the sampler's timer
/// (interrupt, softirq and callback) and anything else the programs make the CPU do.
fn interruptions(
    rows: &mut Vec<Row>,
    cgroup: &BenchCgroup,
    lines: &Lines,
    rounds: usize,
) -> anyhow::Result<()> {
    let spin = |probes: Probes| -> anyhow::Result<f64> {
        let programs = lines.load(probes)?;
        let (elapsed, lost) = ask(cgroup, &args(&["spin", &SPIN_MS.to_string()]), "spin")?;
        drop(programs);
        anyhow::ensure!(elapsed > 0.0, "the spin helper spun for {elapsed} ns");
        Ok(lost / elapsed * 100.0)
    };
    let variants = [Probes::None, Probes::Far, Probes::Near];
    // Per round, the share lost under each variant.
    let mut lost: Vec<[f64; 3]> = Vec::new();
    for round in 0..rounds {
        let mut got = [0.0; 3];
        let mut order = [0, 1, 2];
        if round % 2 == 1 {
            order.reverse();
        }
        for at in order {
            got[at] = spin(variants[at])?;
        }
        lost.push(got);
    }
    for at in [1, 2] {
        let diffs: Vec<f64> = lost.iter().map(|l| l[at] - l[0]).collect();
        let Some(ci) = mean_ci(&diffs) else {
            continue;
        };
        let mean = |i: usize| lost.iter().map(|l| l[i]).sum::<f64>() / lost.len() as f64;
        let mut row = Row::info(
            SECTION,
            format!(
                "busy CPU taken by interruptions: with − without programs, {}",
                variants[at].label()
            ),
            format!("{} % of the CPU", ci.show(3, true)),
        )
        .estimate(ci, "% of a CPU")
        .note(format!(
            "{}; a helper spinning {:.0} s on the loops' CPU sums the gaps over 1 µs between \
             its clock reads, per round with − without, {rounds} alternated rounds; {:.3} % \
             without, {:.3} % with (means); no forks or faults, so this is the memory \
             sampler's timer and whatever else the loaded programs take from a busy CPU",
            ci.describe("mean"),
            SPIN_MS as f64 / 1e3,
            mean(0),
            mean(at),
        ));
        if variants[at] == Probes::Near {
            row = row.at_most("≤ 3 % (upper end)", 3.0);
        }
        rows.push(row);
    }
    Ok(())
}

/// One pass of each loop with BPF statistics on: invocations per fork / per page and time per
/// invocation of each program; then the sampler's ticks per second, idle, lines far and a
/// line near.
pub fn per_program(
    rows: &mut Vec<Row>,
    cgroup: &BenchCgroup,
    lines: &Lines,
    loops: Loops,
) -> anyhow::Result<()> {
    let _stats =
        node_agent::ebpf::enable_run_time_stats().context("enabling BPF run-time statistics")?;
    let mut programs = lines
        .load(Probes::Far)?
        .context("loading the kernel programs")?;
    let fork = args(&["fork", &loops.forks.to_string()]);
    let fault = args(&[
        "fault",
        &loops.fault_mib.to_string(),
        &loops.fault_rounds.to_string(),
    ]);
    let s0 = programs.program_stats();
    timed(cgroup, &fork)?;
    let s1 = programs.program_stats();
    timed(cgroup, &fault)?;
    let s2 = programs.program_stats();
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
                fork_runs as f64 / loops.forks as f64,
                fault_runs as f64 / loops.pages() as f64,
            )),
        );
    }
    let Some(pace) = programs.sampler_pace() else {
        return Ok(());
    };
    // The sampler alone, nothing else running in the bench: ticks per second and time per
    // tick with every line far, then with a line near.
    let idle = |programs: &mut KernelPrograms| -> anyhow::Result<(f64, f64)> {
        let a = programs.sampler_stats()?.unwrap_or_default();
        let t = Instant::now();
        std::thread::sleep(Duration::from_secs(2));
        let b = programs.sampler_stats()?.unwrap_or_default();
        let ticks = b.ticks.saturating_sub(a.ticks);
        let busy = b.busy_ns.saturating_sub(a.busy_ns) as f64;
        Ok((
            ticks as f64 / t.elapsed().as_secs_f64(),
            busy / ticks.max(1) as f64,
        ))
    };
    let (far_rate, far_ns) = idle(&mut programs)?;
    drop(programs);
    let mut near = lines
        .load(Probes::Near)?
        .context("loading the kernel programs")?;
    let (near_rate, near_ns) = idle(&mut near)?;
    drop(near);
    rows.push(
        Row::info(
            SECTION,
            "memory sampler: ticks per second, lines far / a line near",
            format!("{far_rate:.1} / {near_rate:.0}"),
        )
        .value(far_rate, "ticks/s")
        .note(format!(
            "2 s idle each, one CPU (the bench is pinned, so one timer); time in the callback \
             {far_ns:.0} / {near_ns:.0} ns per tick (kernel-measured, timer interrupt not \
             included); pace {:?} near a line, up to {:?} while all are far; lines far: the \
             loops' cgroup 1 TiB below its line; near: an idle cgroup {} MiB below its line",
            pace.period,
            pace.max_period,
            NEAR_HEADROOM >> 20,
        )),
    );
    Ok(())
}

/// `node-agent-bench probes none|far|near CGROUP_DIR [PERIOD_US]`: loads one variant for the
/// memory cgroup at CGROUP_DIR as the loops above do (with a fixed sampler pace if given), says
/// `ready`, and holds it until stdin closes; for measuring other workloads by hand.
pub fn hold(args: &[String]) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    let usage = "usage: node-agent-bench probes none|far|near CGROUP_DIR [PERIOD_US]";
    let (variant, dir) = match args {
        [v, d] | [v, d, _] => (v.as_str(), d),
        _ => anyhow::bail!("{usage}"),
    };
    let probes = match variant {
        "none" => Probes::None,
        "far" => Probes::Far,
        "near" => Probes::Near,
        other => anyhow::bail!("unknown variant {other:?}; {usage}"),
    };
    let id = std::fs::metadata(dir)
        .with_context(|| format!("reading {dir}"))?
        .ino();
    let lines = Lines::new(id)?;
    let mut options = LoadOptions::default();
    if let Some(us) = args.get(2) {
        let us: u64 = us
            .parse()
            .with_context(|| format!("PERIOD_US {us:?}; {usage}"))?;
        options.sampler.period = Duration::from_micros(us);
        options.sampler.max_period = Duration::from_micros(us);
        options.sampler.charge_bytes_per_us = Some(0);
    }
    let programs = lines.load_with(probes, options)?;
    println!("ready");
    let mut sink = String::new();
    while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {
        sink.clear();
    }
    drop(programs);
    Ok(())
}
