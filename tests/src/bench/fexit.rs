//! The fexit path, measured where it runs: inside the VMs of `cargo xtask bench` (Debian's
//! 6.1, 6.12 and 6.18 cloud kernels under QEMU's software emulation, cgroup v2), where fexit on
//! the page counter attaches; this host refuses it. `node-agent-bench vm-fexit ROUNDS FORKS
//! FAULT_MIB FAULT_ROUNDS` runs there and prints each row as one line, `@bench-row {json}`,
//! which xtask collects into the run's report ([`super::report::FEXIT_SECTION`]).
//!
//! - With the kernel's BPF statistics on: BPF run time per charge (per invocation of the
//!   page-counter fexit programs) and per page faulted, and per fork+exit (the fork/exit
//!   programs, and everything together). These count guest-kernel instructions and are the
//!   figures to read: the emulator slows them like any other code.
//! - The with ÷ without ratio of the page-fault and fork+exit loops, alternated, as on the
//!   host. Under emulation the guest's clock, its timer interrupts and the cost of each
//!   instruction differ from hardware, so these ratios are labelled emulated.

use std::time::Duration;

use anyhow::Context as _;
use node_agent::ebpf::{KernelPrograms, MemoryMechanism, ProgramStats};

use super::{
    cgroups::BenchCgroup,
    overhead::{loop_rows, measure, Lines, Loops, Probes},
    report::{Row, FEXIT_SECTION},
};

/// The page-counter fexit programs (node-agent-ebpf/src/memcg.rs).
const FEXIT: &[&str] = &[
    "page_counter_try_charge",
    "page_counter_charge",
    "page_counter_uncharge",
];
/// The fork/exit accounting programs.
const TASKS: &[&str] = &["sched_process_fork", "sched_process_exit"];

/// Prefix of the lines xtask collects from the VM's console.
pub const ROW_MARKER: &str = "@bench-row ";

/// `vm-fexit ROUNDS FORKS FAULT_MIB FAULT_ROUNDS`, inside a VM.
pub fn run_in_vm(args: &[String]) -> anyhow::Result<()> {
    let usage = "usage: node-agent-bench vm-fexit ROUNDS FORKS FAULT_MIB FAULT_ROUNDS";
    let num = |i: usize| -> anyhow::Result<usize> {
        args.get(i)
            .with_context(|| usage.to_string())?
            .parse()
            .with_context(|| format!("argument {} is not a number; {usage}", i + 1))
    };
    let rounds = num(0)?;
    let loops = Loops {
        forks: num(1)?,
        fault_mib: num(2)?,
        fault_rounds: num(3)?,
        repeats: 1,
    };
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    let mut rows = Vec::new();
    let result = measure_fexit(&mut rows, &kernel, rounds, loops);
    if let Err(e) = &result {
        rows.push(Row::not_measured(
            FEXIT_SECTION,
            format!("{kernel}: fexit rows"),
            format!("{e:#}"),
        ));
    }
    for row in &rows {
        println!("{ROW_MARKER}{}", row.json());
    }
    result
}

fn measure_fexit(
    rows: &mut Vec<Row>,
    kernel: &str,
    rounds: usize,
    loops: Loops,
) -> anyhow::Result<()> {
    let mechanism = KernelPrograms::load()?.memory_mechanism();
    anyhow::ensure!(
        mechanism == MemoryMechanism::PageCounterFexit,
        "fexit on the page counter does not attach on {kernel}: the agent chose {mechanism}"
    );
    let cgroup = BenchCgroup::memory("fexit")?;
    let lines = Lines::new(cgroup.id()?)?;
    bpf_time(rows, kernel, &cgroup, &lines, loops)?;
    let measured = measure(&cgroup, &lines, &[Probes::None, Probes::Far], rounds, loops)?;
    let label = format!("{kernel}, emulated: ");
    rows.extend(loop_rows(FEXIT_SECTION, &label, &measured, loops, false));
    Ok(())
}

/// One pass of each loop with the BPF statistics on.
fn bpf_time(
    rows: &mut Vec<Row>,
    kernel: &str,
    cgroup: &BenchCgroup,
    lines: &Lines,
    loops: Loops,
) -> anyhow::Result<()> {
    let _stats =
        node_agent::ebpf::enable_run_time_stats().context("enabling BPF run-time statistics")?;
    let programs = lines
        .load(Probes::Far)?
        .context("loading the kernel programs")?;
    let s0 = programs.program_stats();
    super::overhead::run_loop(cgroup, "fork", &[loops.forks])?;
    let s1 = programs.program_stats();
    super::overhead::run_loop(cgroup, "fault", &[loops.fault_mib, loops.fault_rounds])?;
    let s2 = programs.program_stats();
    // (invocations, ns) of the named programs between two readings.
    let sum = |a: &[ProgramStats], b: &[ProgramStats], names: &[&str]| -> (u64, f64) {
        let mut out = (0, 0.0);
        for name in names {
            let find = |s: &[ProgramStats]| {
                s.iter()
                    .find(|p| p.name == *name)
                    .map(|p| (p.run_count, p.run_time.as_nanos() as f64))
                    .unwrap_or((0, 0.0))
            };
            let ((c0, t0), (c1, t1)) = (find(a), find(b));
            out.0 += c1.saturating_sub(c0);
            out.1 += t1 - t0;
        }
        out
    };
    let all: Vec<&str> = FEXIT.iter().chain(TASKS).copied().collect();
    let (charges, charge_ns) = sum(&s1, &s2, FEXIT);
    let pages = loops.pages() as f64;
    let forks = loops.forks as f64;
    let (_, fork_tasks_ns) = sum(&s0, &s1, TASKS);
    let (fork_fexit_runs, fork_fexit_ns) = sum(&s0, &s1, FEXIT);
    let (_, fork_all_ns) = sum(&s0, &s1, &all);
    let note = "kernel.bpf_stats run_time_ns, which includes the statistics' own clock reads; \
                guest-kernel time under QEMU TCG (emulated, 1 vCPU)";
    anyhow::ensure!(
        charges > 0,
        "the page-counter programs never ran during {} page faults",
        loops.pages()
    );
    rows.push(
        Row::info(
            FEXIT_SECTION,
            format!("{kernel}: fexit on the page counter, BPF time per charge"),
            format!("{:.0} ns", charge_ns / charges as f64),
        )
        .value(charge_ns / charges as f64, "ns")
        .note(format!(
            "{charges} invocations of {} over {} pages faulted ({:.4} per page: the kernel \
             charges in batches); {note}",
            FEXIT.join(", "),
            loops.pages(),
            charges as f64 / pages,
        )),
    );
    rows.push(
        Row::info(
            FEXIT_SECTION,
            format!("{kernel}: BPF time per page faulted"),
            format!("{:.1} ns", charge_ns / pages),
        )
        .value(charge_ns / pages, "ns")
        .note(format!(
            "the page-counter programs' time in the page-fault loop ÷ its pages; {note}"
        )),
    );
    rows.push(
        Row::info(
            FEXIT_SECTION,
            format!("{kernel}: BPF time per fork+exit"),
            format!(
                "{:.0} ns ({:.0} fork/exit programs + {:.0} page counter)",
                fork_all_ns / forks,
                fork_tasks_ns / forks,
                fork_fexit_ns / forks
            ),
        )
        .value(fork_all_ns / forks, "ns")
        .note(format!(
            "every program's time in the fork+exit loop ÷ {} forks: {} and the page-counter \
             programs ({:.2} charges per fork: a fork charges its page tables and stack); \
             {note}",
            loops.forks,
            TASKS.join(", "),
            fork_fexit_runs as f64 / forks,
        )),
    );
    drop(programs);
    std::thread::sleep(Duration::from_millis(100));
    Ok(())
}
