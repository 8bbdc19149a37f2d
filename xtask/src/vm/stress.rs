//! `cargo xtask vm-stress`: boots each kernel with one and with two vCPUs and runs
//! `attach-stress` (tests/src/bin/attach-stress.rs) inside: the agent's programs attached and
//! detached many times while processes start and fault pages. `oops=panic` ends a boot at the
//! first oops, whose text is reported with the round it happened in.

use std::time::Duration;

use anyhow::{bail, Context as _};

use super::{
    build, initramfs, kernels, qemu, report::Report, selected, setup_tools, vm_dir, Ended, Step,
    Vm, MEMORY_MIB, TIMEOUT_RC,
};
use crate::toolchain::EbpfToolchain;

#[derive(Debug, clap::Args)]
pub struct StressArgs {
    /// Kernel to boot, repeatable: 6.1, 6.12, 6.18 (default: all three).
    #[arg(long = "kernel", value_name = "SERIES")]
    kernels: Vec<String>,
    /// vCPU counts to boot with, repeatable (default: 1 and 2).
    #[arg(long = "cpus", value_parser = clap::value_parser!(u32).range(1..=8))]
    cpus: Vec<u32>,
    /// Boots per kernel and vCPU count.
    #[arg(long, default_value_t = 1)]
    boots: u32,
    /// Rounds per boot of attaching and detaching the programs (loaded once).
    #[arg(long, default_value_t = 2000)]
    rounds: u32,
    /// Rounds per boot of the agent's whole load, attach and detach (`KernelPrograms::load`).
    #[arg(long, default_value_t = 3)]
    reloads: u32,
    /// Only these programs in the toggle rounds, comma-separated (default: every program).
    #[arg(long)]
    programs: Option<String>,
}

pub fn stress(tc: &EbpfToolchain, args: &StressArgs) -> anyhow::Result<()> {
    let kernels = selected(&args.kernels)?;
    let cpus = if args.cpus.is_empty() {
        vec![1, 2]
    } else {
        args.cpus.clone()
    };
    setup_tools()?;
    let built = build::build(tc)?;
    let (_, stress_bin) = built
        .bins
        .iter()
        .find(|(name, _)| name == "attach-stress")
        .context("the tests package built no attach-stress binary")?;
    let stress = stress_bin.display().to_string();
    let mut toggle = vec![
        stress.clone(),
        "toggle".into(),
        initramfs::GUEST_OBJECT.into(),
        args.rounds.to_string(),
    ];
    toggle.extend(args.programs.clone());
    let plan = [
        Step::Run {
            label: "toggle".into(),
            argv: toggle,
        },
        Step::Run {
            label: "reload".into(),
            argv: vec![stress, "reload".into(), args.reloads.to_string()],
        },
    ];
    let dir = vm_dir();
    let fetched = kernels::fetch_all(&kernels, &dir)?;
    let initramfs = initramfs::build(
        &dir.join("stress-initramfs"),
        &initramfs::Contents {
            agent: &built.agent,
            object: &built.object,
            tests: &[],
            helpers: &built
                .bins
                .iter()
                .map(|(_, p)| p.clone())
                .collect::<Vec<_>>(),
            plan: &plan,
            test_timeout_secs: super::TEST_TIMEOUT.as_secs(),
        },
    )?;

    let mut rows = Vec::new();
    let mut oopses = 0;
    for (kernel, fetched) in kernels.iter().zip(&fetched) {
        for &n in &cpus {
            for boot in 1..=args.boots {
                let label = format!("{}-{n}cpu-{boot}", kernel.series);
                eprintln!("xtask: vm-stress: booting {label}");
                let vm = Vm {
                    bzimage: &fetched.bzimage,
                    initramfs: &initramfs,
                    cpus: n,
                    memory_mib: MEMORY_MIB,
                    cmdline_extra: "oops=panic",
                    logs: dir.join("stress-logs").join(&label),
                    boot_timeout: super::BOOT_TIMEOUT,
                    silence_timeout: Duration::from_secs(600),
                };
                let outcome = vm.run(|line| {
                    if line.contains("attach-stress:") || line.contains("@vmtest ") {
                        eprintln!("[{label}] {line}");
                    }
                })?;
                let report = Report::parse(&outcome.lines, TIMEOUT_RC);
                let trouble = qemu::kernel_trouble(&outcome.kernel_log, 40);
                oopses += usize::from(!trouble.is_empty());
                let last = |step: &str| {
                    outcome
                        .lines
                        .iter()
                        .rev()
                        .find(|l| l.contains(&format!("attach-stress: {step} round")))
                        .map_or("no round finished".to_string(), |l| {
                            l.trim_start_matches("attach-stress: ").to_string()
                        })
                };
                let verdict = if let Some(first) = trouble.first() {
                    format!("KERNEL TROUBLE:\n{first}")
                } else if let Ended::TimedOut(why) = &outcome.ended {
                    format!("STOPPED: {why}")
                } else if !report.done || report.failed() > 0 {
                    format!(
                        "INCOMPLETE: {:?}",
                        report
                            .results
                            .iter()
                            .map(|r| (&r.name, r.status.to_string()))
                            .collect::<Vec<_>>()
                    )
                } else {
                    "clean".into()
                };
                rows.push(format!(
                    "{label:<14} {:>5.0} s  {} | {} | {verdict}",
                    outcome.wall.as_secs_f64(),
                    last("toggle"),
                    last("reload"),
                ));
            }
        }
    }
    println!(
        "vm-stress: {} toggle rounds and {} reloads per boot",
        args.rounds, args.reloads
    );
    for row in &rows {
        println!("  {row}");
    }
    if oopses > 0 || rows.iter().any(|r| !r.ends_with("clean")) {
        bail!(
            "vm-stress: {oopses} boot(s) of {} saw the kernel go wrong",
            rows.len()
        );
    }
    Ok(())
}
