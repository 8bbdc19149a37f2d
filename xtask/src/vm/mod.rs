//! `cargo xtask vm-test`: the kernel and end-to-end tests on Debian's cloud kernels, booted
//! under QEMU's software emulation with cgroup v2 only; `cargo xtask vm-stress`: attaching and
//! detaching the memory programs under page-fault load, to look for kernel crashes.
//!
//! - [`kernels`]: which kernels, fetched through a private apt configuration and cached;
//! - [`build`]: the agent and the test binaries, built on the host;
//! - [`initramfs`]: the guest's userland and the plan its init script follows (`init.sh`);
//! - [`qemu`]: one VM, its serial ports and time limits;
//! - [`report`]: what a VM said, per test;
//! - [`stress`]: the attach/detach loop;
//! - [`bench`]: the fexit rows of `cargo xtask bench`, measured inside the VMs.

pub mod bench;
mod build;
mod initramfs;
mod kernels;
mod qemu;
mod report;
mod stress;

use std::{
    fmt,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::bail;

pub use stress::{stress, StressArgs};

use crate::{
    agent::workspace_root,
    toolchain::{apt_install, EbpfToolchain},
};
use initramfs::Step;
use kernels::{Fetched, Kernel};
use qemu::{Ended, Outcome, Vm};
use report::{Report, Status};

/// Debian packages the VM tests need: (command that shows it is there, package).
const TOOLS: &[(&str, &str)] = &[
    ("/usr/bin/qemu-system-x86_64", "qemu-system-x86"),
    (initramfs::BUSYBOX, "busybox-static"),
    ("/usr/bin/cpio", "cpio"),
    ("/usr/bin/strip", "binutils"),
];
/// busybox `timeout -s KILL` makes the command exit with 128 + 9.
const TIMEOUT_RC: i32 = 137;
const TEST_TIMEOUT: Duration = Duration::from_secs(300);
const BOOT_TIMEOUT: Duration = Duration::from_secs(180);
const MEMORY_MIB: u32 = 2048;
/// Tests the VMs leave out unless `--all-tests` is given, each with the reason (printed).
const LEFT_OUT: &[(&str, &str)] = &[(
    "kernel_memory::an_overflowed_ring_buffer_counts_its_losses",
    "300 round trips over 16 MiB take 90 s per kernel under emulation, and ring-buffer loss \
     counting is the same on every kernel (proven by `cargo xtask test` on the host)",
)];

/// Test binaries that run on the host only, each with the reason (printed): they drive real
/// user-space components the VM image does not carry, and the kernel parts they touch are
/// those of the host's kernel tests.
const HOST_ONLY: &[(&str, &str)] = &[
    (
        "cri_containerd",
        "needs containerd and runc, which the VM image does not carry",
    ),
    (
        "image_container",
        "needs containerd, runc, buildah and the image build",
    ),
    (
        "deploy_render",
        "needs kubectl, kubernetes-validate and promtool",
    ),
    (
        "kubelet_e2e",
        "reaches a fake kubelet over TLS by the Node's addresses: certificates and addresses, \
         not the kernel (the daemon's kernel side is in the other e2e tests)",
    ),
    (
        "metrics_promtool",
        "needs promtool; checks text, not the kernel",
    ),
    (
        "prometheus_e2e",
        "needs a Prometheus server, which the VM image does not carry; checks queries and \
         alerts, not the kernel",
    ),
    (
        "reclaim_e2e",
        "needs containerd and runc, which the VM image does not carry",
    ),
    (
        "trace_socket",
        "tests the daemon's socket handling (descriptors, EMFILE), which no kernel changes, \
         at 75 s per test under emulation",
    ),
];

/// Why the hung-filesystem tests run on the host only: the plan is one for every kernel, and
/// 6.1's Debian config builds FUSE as a module (`CONFIG_FUSE_FS=m`), which the VM image does
/// not carry, so /dev/fuse is missing there (6.12 and 6.18 build it in). What they test is the
/// agent's filesystem helper and reload path, not the kernel.
const NEEDS_FUSE: &str = "needs /dev/fuse for the hung filesystem; 6.1 builds FUSE as a \
    module, which the VM image does not carry";

/// Single tests that run on the host only, each with the reason (printed): the rest of their
/// binary runs in the VMs.
const HOST_ONLY_TESTS: &[(&str, &str)] = &[
    (
        "hostile_e2e::under_the_daemonsets_memory_limit_the_agent_survives_every_hostile_answer_and_names_it",
        "sends 100 MB answers and full-size pod lists nine times (about a minute on the host, \
         past the 300 s a test gets under emulation); what it bounds is the agent's reading, \
         the same on every kernel",
    ),
    (
        "daemon_wedge::a_hung_filesystem_never_stops_memory_decisions",
        NEEDS_FUSE,
    ),
    (
        "daemon_wedge::the_hung_filesystem_hangs_statfs_until_dropped",
        NEEDS_FUSE,
    ),
    (
        "daemon_wedge::a_filesystem_hung_for_stat_stops_neither_start_nor_the_emergency_dry_run",
        NEEDS_FUSE,
    ),
    (
        "oom_e2e::a_kill_in_a_container_the_pod_source_has_not_listed_is_named_by_the_runtime",
        "needs containerd and runc, which the VM image does not carry; the kill it names is the \
     same kernel event as the other OOM tests'",
    ),
];

/// How the agent watches memory thresholds on a kernel (node-agent's `MemoryMechanism`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    Fexit,
    Sampler,
    Polling,
}

impl Mechanism {
    /// From the agent's `kernel programs attached memory=...` log line.
    fn from_log(line: &str) -> Option<Self> {
        let said = &line[line.find("memory=")?..];
        if said.contains("polling") {
            Some(Self::Polling)
        } else if said.contains("fexit") {
            Some(Self::Fexit)
        } else if said.contains("sampler") {
            Some(Self::Sampler)
        } else {
            None
        }
    }
}

impl fmt::Display for Mechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Fexit => "fexit on the page counter",
            Self::Sampler => "the bpf_timer page-counter sampler",
            Self::Polling => "cgroupfs polling",
        })
    }
}

#[derive(Debug, clap::Args)]
pub struct TestArgs {
    /// Kernel to boot, repeatable: 6.1, 6.12, 6.18 (default: all three).
    #[arg(long = "kernel", value_name = "SERIES")]
    kernels: Vec<String>,
    /// vCPUs per VM. One by default: with two, QEMU's multi-threaded emulation now and then
    /// lets a vCPU run a stale int3 of the kernel's live code patching and the guest oopses
    /// (`cargo xtask vm-stress` measures it; README, *Tests on other kernels*).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=8))]
    cpus: u32,
    /// VMs booted at once (each emulated vCPU takes a host thread).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=3))]
    jobs: u64,
    /// Also run the tests left out by default for their cost under emulation.
    #[arg(long)]
    all_tests: bool,
    /// Run only tests whose `binary::test` name contains one of these.
    #[arg(last = true)]
    filters: Vec<String>,
}

/// Installs what the VM tests need and is missing (Debian packages).
pub fn setup_tools() -> anyhow::Result<()> {
    let missing: Vec<&str> = TOOLS
        .iter()
        .filter(|(path, _)| !Path::new(path).exists())
        .map(|(_, package)| *package)
        .collect();
    if !missing.is_empty() {
        apt_install(&missing)?;
    }
    Ok(())
}

fn vm_dir() -> PathBuf {
    workspace_root().join("target/vm")
}

fn selected(series: &[String]) -> anyhow::Result<Vec<&'static Kernel>> {
    if series.is_empty() {
        return Ok(kernels::KERNELS.iter().collect());
    }
    series.iter().map(|s| kernels::by_series(s)).collect()
}

pub fn test(tc: &EbpfToolchain, args: &TestArgs) -> anyhow::Result<()> {
    let kernels = selected(&args.kernels)?;
    setup_tools()?;
    let built = build::build(tc)?;
    let mut plan = Vec::new();
    let mut all = Vec::new();
    for (binary, path) in &built.tests {
        if let Some((_, why)) = HOST_ONLY.iter().find(|(b, _)| b == binary) {
            eprintln!("xtask: vm-test: {binary} runs on the host only: {why}");
            continue;
        }
        if binary.starts_with(crate::cluster::TEST_PREFIX) {
            eprintln!("xtask: vm-test: {binary} runs against the real cluster (`cargo xtask cluster test`), not in the VMs");
            continue;
        }
        for name in build::list_tests(path)? {
            let full = format!("{binary}::{name}");
            all.push(full.clone());
            if let Some((_, why)) = HOST_ONLY_TESTS.iter().find(|(t, _)| *t == full) {
                eprintln!("xtask: vm-test: {full} runs on the host only: {why}");
                continue;
            }
            if !args.all_tests {
                if let Some((_, why)) = LEFT_OUT.iter().find(|(t, _)| *t == full) {
                    eprintln!("xtask: vm-test: leaving out {full}: {why} (--all-tests runs it)");
                    continue;
                }
            }
            if args.filters.is_empty() || args.filters.iter().any(|f| full.contains(f.as_str())) {
                plan.push(Step::Test {
                    binary: binary.clone(),
                    name,
                });
            }
        }
    }
    for (left_out, _) in LEFT_OUT
        .iter()
        .chain(HOST_ONLY_TESTS)
        .filter(|(t, _)| !all.iter().any(|a| a == t))
    {
        eprintln!(
            "xtask: vm-test: warning: LEFT_OUT names {left_out}, which is no test (renamed?)"
        );
    }
    if plan.is_empty() {
        bail!("no test matches {:?}", args.filters);
    }
    let dir = vm_dir();
    let fetched = kernels::fetch_all(&kernels, &dir)?;
    let initramfs = initramfs::build(
        &dir.join("initramfs"),
        &initramfs::Contents {
            agent: &built.agent,
            object: &built.object,
            tests: &built.tests,
            helpers: &built
                .bins
                .iter()
                .map(|(_, p)| p.clone())
                .collect::<Vec<_>>(),
            plan: &plan,
            test_timeout_secs: TEST_TIMEOUT.as_secs(),
        },
    )?;
    eprintln!(
        "xtask: vm-test: {} tests on {} kernel(s), {} vCPU(s) each, {} VM(s) at a time",
        plan.len(),
        kernels.len(),
        args.cpus,
        args.jobs
    );
    for (kernel, fetched) in kernels.iter().zip(&fetched) {
        eprintln!(
            "xtask: vm-test: {}: {} {} from {}{}",
            kernel.series,
            kernel.package,
            fetched.version,
            kernel.suite,
            if fetched.cached { " (cached)" } else { "" }
        );
    }
    let outcomes = boot_all(&kernels, &fetched, args.jobs as usize, |kernel, fetched| {
        Vm {
            bzimage: &fetched.bzimage,
            initramfs: &initramfs,
            cpus: args.cpus,
            memory_mib: MEMORY_MIB,
            cmdline_extra: "",
            logs: dir.join("logs").join(kernel.series),
            boot_timeout: BOOT_TIMEOUT,
            silence_timeout: TEST_TIMEOUT + Duration::from_secs(60),
        }
    })?;

    let mut totals = (0, 0);
    let mut summary = Vec::new();
    let mut broken = Vec::new();
    // Said again after the summary, so that the end of the output (all a CI log may keep)
    // names what failed.
    let mut said_again = Vec::new();
    for ((kernel, fetched), outcome) in kernels.iter().zip(&fetched).zip(&outcomes) {
        let report = Report::parse(&outcome.lines, TIMEOUT_RC);
        let problems = problems(kernel, &report, outcome, plan.len());
        print_kernel(kernel, fetched, &report, outcome, &problems, &dir);
        totals.0 += report.passed();
        totals.1 += report.failed() + usize::from(report.unfinished.is_some());
        let mechanism = report
            .mechanism
            .as_ref()
            .and_then(|(m, _)| *m)
            .map_or("unknown".to_string(), |m| m.to_string());
        summary.push(format!(
            "  {:<5} {:<40} {:<22} {:<26} {:>3} passed {:>3} failed {:>6.0} s{}",
            kernel.series,
            kernel.package,
            fetched.version,
            mechanism,
            report.passed(),
            report.failed(),
            outcome.wall.as_secs_f64(),
            if problems.is_empty() { "" } else { "  FAILED" }
        ));
        if !problems.is_empty() {
            broken.push(kernel.series);
            said_again.push(again(kernel, &report, &problems));
        }
    }
    println!("vm-test summary ({} vCPUs per VM):", args.cpus);
    for line in summary {
        println!("{line}");
    }
    println!("vm-test: {} passed, {} failed", totals.0, totals.1);
    for lines in said_again {
        for line in lines {
            println!("{line}");
        }
    }
    if !broken.is_empty() {
        bail!("vm-test failed on {}", broken.join(", "));
    }
    Ok(())
}

/// Boots each kernel (`jobs` at a time), printing `@vmtest` progress lines as they come.
fn boot_all<'a>(
    kernels: &[&'static Kernel],
    fetched: &'a [Fetched],
    jobs: usize,
    vm: impl Fn(&'static Kernel, &'a Fetched) -> Vm<'a> + Sync,
) -> anyhow::Result<Vec<Outcome>> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut outcomes: Vec<Option<anyhow::Result<Outcome>>> =
        (0..kernels.len()).map(|_| None).collect();
    let slots = std::sync::Mutex::new(&mut outcomes);
    std::thread::scope(|scope| {
        for _ in 0..jobs.min(kernels.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(kernel) = kernels.get(i) else {
                    return;
                };
                eprintln!("xtask: vm: booting {}", kernel.series);
                let outcome = vm(kernel, &fetched[i]).run(|line| {
                    if let Some(at) = line.find("@vmtest ") {
                        eprintln!("[{}] {}", kernel.series, &line[at + 8..]);
                    }
                });
                slots.lock().expect("no thread panics holding it")[i] = Some(outcome);
            });
        }
    });
    outcomes
        .into_iter()
        .map(|o| o.expect("every kernel was run"))
        .collect()
}

/// Everything that makes a kernel's run fail, in words.
fn problems(kernel: &Kernel, report: &Report, outcome: &Outcome, planned: usize) -> Vec<String> {
    let mut problems = Vec::new();
    if let Ended::TimedOut(why) = &outcome.ended {
        problems.push(format!("the VM was stopped: {why}"));
    }
    if let Some(what) = &report.setup_failed {
        problems.push(format!("the guest's set-up failed: {what}"));
    }
    match &report.boot {
        None => problems.push("the guest never reported its boot".into()),
        Some(boot) => {
            if boot.cgroup_v1_mounts != "0" {
                problems.push(format!(
                    "cgroup v1 hierarchies are mounted ({})",
                    boot.cgroup_v1_mounts
                ));
            }
        }
    }
    match &report.mechanism {
        None => problems.push("the agent never said which memory mechanism it got".into()),
        Some((None, said)) => problems.push(format!(
            "the agent's memory mechanism is not recognised in {said:?}"
        )),
        Some((Some(m), _)) if !kernel.mechanisms.contains(m) => problems.push(format!(
            "the agent chose {m}; on {} it must be one of {:?}",
            kernel.series, kernel.mechanisms
        )),
        Some(_) => {}
    }
    if report.probe_rc.is_some_and(|rc| rc != 0) {
        problems.push(format!(
            "`node-agent trace` exited {} at load",
            report.probe_rc.unwrap_or_default()
        ));
    }
    for r in report.results.iter().filter(|r| r.status != Status::Passed) {
        problems.push(format!("{} {}", r.name, r.status));
    }
    if let Some(name) = &report.unfinished {
        problems.push(format!(
            "{name} never finished: the guest died or hung in it"
        ));
    }
    if report.results.len() != planned {
        problems.push(format!(
            "{} of {planned} tests reported",
            report.results.len()
        ));
    }
    if !report.done {
        problems.push("the guest did not reach the end of its plan".into());
    }
    for trouble in qemu::kernel_trouble(&outcome.kernel_log, 40) {
        problems.push(format!("the kernel reported:\n{trouble}"));
    }
    problems
}

/// A kernel's problems in short: each, a failing test with the last lines it printed.
fn again(kernel: &Kernel, report: &Report, problems: &[String]) -> Vec<String> {
    const TAIL: usize = 12;
    let mut lines = vec![format!("vm-test: {} failed:", kernel.series)];
    for p in problems {
        lines.push(format!("  {}: PROBLEM: {p}", kernel.series));
    }
    for r in report.results.iter().filter(|r| r.status != Status::Passed) {
        lines.push(format!(
            "  {}: {} {}, the end of its output:",
            kernel.series, r.name, r.status
        ));
        let from = r.output.len().saturating_sub(TAIL);
        lines.extend(r.output[from..].iter().map(|l| format!("     | {l}")));
    }
    lines
}

fn print_kernel(
    kernel: &Kernel,
    fetched: &Fetched,
    report: &Report,
    outcome: &Outcome,
    problems: &[String],
    dir: &Path,
) {
    let release = report.boot.as_ref().map_or("?", |b| b.release.as_str());
    let cpus = report.boot.as_ref().map_or("?", |b| b.cpus.as_str());
    let subtree = report
        .boot
        .as_ref()
        .map_or("?", |b| b.subtree_control.as_str());
    println!();
    println!(
        "== {}: {} {} (uname {release}), {cpus} vCPUs, cgroup v2 only, root subtree_control {subtree}",
        kernel.series, kernel.package, fetched.version
    );
    if let Some((m, said)) = &report.mechanism {
        let m = m.map_or("unrecognised".to_string(), |m| m.to_string());
        println!("   memory mechanism: {m}  (agent: {})", said.trim());
    }
    for r in &report.results {
        println!(
            "   {:<10} {:>6.1} s  {}",
            r.status.to_string(),
            r.secs,
            r.name
        );
        if r.status != Status::Passed {
            for line in &r.output {
                println!("       | {line}");
            }
        }
    }
    println!(
        "   {}: {} passed, {} failed in {:.0} s (QEMU wall time); logs in {}",
        kernel.series,
        report.passed(),
        report.failed(),
        outcome.wall.as_secs_f64(),
        dir.join("logs").display()
    );
    for p in problems {
        println!("   PROBLEM: {p}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_log_line_names_its_mechanism() {
        let cases = [
            ("kernel programs attached memory=fexit on page_counter charge/uncharge (in-kernel thresholds)", Some(Mechanism::Fexit)),
            ("kernel programs attached memory=in-kernel page-counter sampler (bpf_timer)", Some(Mechanism::Sampler)),
            ("kernel programs attached memory=cgroupfs polling (no in-kernel memory mechanism attaches here)", Some(Mechanism::Polling)),
            ("kernel programs attached memory=something new", None),
            ("no memory field at all", None),
        ];
        for (line, expected) in cases {
            assert_eq!(Mechanism::from_log(line), expected, "{line}");
        }
    }

    #[test]
    fn every_kernel_expects_an_in_kernel_mechanism_and_unique_series() {
        for k in kernels::KERNELS {
            assert!(!k.mechanisms.is_empty() && !k.mechanisms.contains(&Mechanism::Polling));
            assert_eq!(
                kernels::KERNELS
                    .iter()
                    .filter(|o| o.series == k.series)
                    .count(),
                1
            );
        }
        assert!(kernels::by_series("5.10").is_err());
    }
}
