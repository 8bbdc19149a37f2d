//! The fexit rows of `cargo xtask bench`: each kernel of [`kernels::KERNELS`] booted under
//! emulation with the release bench binary, which measures the page-counter fexit programs
//! (`node-agent-bench vm-fexit`, tests/src/bench/fexit.rs) and prints one `@bench-row {json}`
//! line per row. The rows come back as JSON lines for the host bench to import; a kernel that
//! gives none gets a row saying why.

use std::{path::Path, time::Duration};

use super::{
    initramfs, kernels, qemu, report::Report, setup_tools, vm_dir, Ended, Step, Vm, MEMORY_MIB,
    TIMEOUT_RC,
};
use crate::agent::agent_with;

/// Prefix of a row line on the VM's console (`bench::fexit::ROW_MARKER`).
const ROW_MARKER: &str = "@bench-row ";
/// The section of the rows (`bench::report::FEXIT_SECTION`).
const SECTION: &str = "fexit (emulated)";

/// What the VMs run: rounds of the with/without loops and their sizes. Smaller than the
/// host's: emulation runs the guest ten to fifty times slower.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub rounds: usize,
    pub forks: usize,
    pub fault_mib: usize,
    pub fault_rounds: usize,
}

impl Plan {
    pub fn new(quick: bool) -> Self {
        Self {
            rounds: if quick { 2 } else { 12 },
            forks: 500,
            fault_mib: 16,
            fault_rounds: 4,
        }
    }
}

/// Boots every kernel in turn and returns the rows, one JSON record a line.
pub fn rows(object: &Path, bench: &Path, plan: Plan) -> anyhow::Result<Vec<String>> {
    setup_tools()?;
    let agent = agent_with(object, true)?;
    let dir = vm_dir();
    let kernels: Vec<&'static kernels::Kernel> = kernels::KERNELS.iter().collect();
    let fetched = kernels::fetch_all(&kernels, &dir)?;
    let argv = vec![
        bench.display().to_string(),
        "vm-fexit".into(),
        plan.rounds.to_string(),
        plan.forks.to_string(),
        plan.fault_mib.to_string(),
        plan.fault_rounds.to_string(),
    ];
    let initramfs = initramfs::build(
        &dir.join("bench-initramfs"),
        &initramfs::Contents {
            agent: &agent,
            object,
            tests: &[],
            helpers: &[bench.to_path_buf()],
            plan: &[Step::Run {
                label: "bench-fexit".into(),
                argv,
            }],
            test_timeout_secs: super::TEST_TIMEOUT.as_secs(),
        },
    )?;
    let mut rows = Vec::new();
    for (kernel, fetched) in kernels.iter().zip(&fetched) {
        eprintln!(
            "xtask: bench: fexit rows on {} ({} {}), emulated",
            kernel.series, kernel.package, fetched.version
        );
        let vm = Vm {
            bzimage: &fetched.bzimage,
            initramfs: &initramfs,
            cpus: 1,
            memory_mib: MEMORY_MIB,
            cmdline_extra: "",
            logs: dir.join("bench-logs").join(kernel.series),
            boot_timeout: super::BOOT_TIMEOUT,
            // The bench prints its rows at the end: a long silence is its loops, not a hang.
            silence_timeout: Duration::from_secs(1800),
        };
        let outcome = vm.run(|line| {
            if let Some(at) = line.find("@vmtest ") {
                eprintln!("[{}] {}", kernel.series, &line[at + 8..]);
            }
        })?;
        let found: Vec<String> = outcome
            .lines
            .iter()
            .filter_map(|l| {
                l.find(ROW_MARKER)
                    .map(|at| l[at + ROW_MARKER.len()..].to_string())
            })
            .collect();
        let report = Report::parse(&outcome.lines, TIMEOUT_RC);
        let trouble = qemu::kernel_trouble(&outcome.kernel_log, 40);
        let failed = report.failed() > 0 || !report.done;
        let why = if let Some(first) = trouble.first() {
            Some(format!("the guest kernel reported: {first}"))
        } else if let Ended::TimedOut(why) = &outcome.ended {
            Some(format!("the VM was stopped: {why}"))
        } else if found.is_empty() {
            Some(format!(
                "the VM printed no rows (bench step {}); logs in {}",
                if failed { "failed" } else { "finished" },
                dir.join("bench-logs").display()
            ))
        } else {
            None
        };
        rows.extend(found);
        if let Some(why) = why {
            rows.push(not_measured(kernel.series, &why));
        }
    }
    Ok(rows)
}

/// A row saying a kernel's figures are missing, in the bench's JSON row format.
fn not_measured(series: &str, why: &str) -> String {
    serde_json::json!({
        "section": SECTION,
        "measure": format!("{series}: fexit rows"),
        "result": "—",
        "value": null,
        "unit": "",
        "interval": null,
        "target": null,
        "verdict": "not measured",
        "note": why,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_kernel_becomes_a_not_measured_row() {
        let row: serde_json::Value = serde_json::from_str(&not_measured("6.1", "no rows")).unwrap();
        assert_eq!(row["section"], SECTION);
        assert_eq!(row["verdict"], "not measured");
        assert_eq!(row["measure"], "6.1: fexit rows");
    }
}
