//! What one VM said, read from the `@vmtest` lines of its first serial port.

use std::fmt;

use super::Mechanism;

/// The init script's boot line: the kernel release and how the guest was set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Boot {
    pub release: String,
    pub cpus: String,
    pub cgroup_v1_mounts: String,
    pub subtree_control: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    Passed,
    Failed {
        rc: i32,
    },
    /// Killed by the VM's per-test time limit.
    TimedOut,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TestResult {
    /// `binary::test`, or a `run` step's label.
    pub name: String,
    pub status: Status,
    pub secs: f64,
    /// What the test printed between its start and result lines.
    pub output: Vec<String>,
}

/// Everything one VM reported.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Report {
    pub boot: Option<Boot>,
    /// The agent's own words at load, and what they mean.
    pub mechanism: Option<(Option<Mechanism>, String)>,
    pub probe_rc: Option<i32>,
    pub setup_failed: Option<String>,
    pub results: Vec<TestResult>,
    /// Started but never finished: the guest died or hung inside it.
    pub unfinished: Option<String>,
    pub done: bool,
}

impl Report {
    pub fn parse(lines: &[String], timeout_rc: i32) -> Self {
        let mut report = Report::default();
        let mut current: Option<(String, Vec<String>)> = None;
        for line in lines {
            let Some(at) = line.find("@vmtest ") else {
                if let Some((_, output)) = current.as_mut() {
                    output.push(line.clone());
                }
                continue;
            };
            let marker = &line[at + "@vmtest ".len()..];
            let (word, rest) = marker.split_once(' ').unwrap_or((marker, ""));
            match word {
                "boot" => report.boot = Some(parse_boot(rest)),
                "setup-failed" => report.setup_failed = Some(rest.to_string()),
                "mechanism" => {
                    let (rc, said) = rest.split_once(' ').unwrap_or((rest, ""));
                    report.probe_rc = rc.strip_prefix("rc=").and_then(|n| n.parse().ok());
                    report.mechanism = Some((Mechanism::from_log(said), said.to_string()));
                }
                "start" => current = Some((rest.to_string(), Vec::new())),
                "result" => {
                    let output = current.take().map(|(_, o)| o).unwrap_or_default();
                    if let Some(result) = parse_result(rest, output, timeout_rc) {
                        report.results.push(result);
                    }
                }
                "done" => report.done = true,
                _ => {}
            }
        }
        report.unfinished = current.map(|(name, _)| name);
        report
    }

    pub fn passed(&self) -> usize {
        self.results
            .iter()
            .filter(|r| r.status == Status::Passed)
            .count()
    }

    pub fn failed(&self) -> usize {
        self.results.len() - self.passed()
    }
}

fn field<'a>(text: &'a str, key: &str) -> &'a str {
    text.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .unwrap_or("?")
}

fn parse_boot(rest: &str) -> Boot {
    Boot {
        release: field(rest, "kernel").to_string(),
        cpus: field(rest, "cpus").to_string(),
        cgroup_v1_mounts: field(rest, "cgroup_v1_mounts").to_string(),
        subtree_control: field(rest, "subtree_control").to_string(),
    }
}

/// `kernel_memory an_oom rc=0 start=12.5 end=20.0` (a `run` step has `-` for the test).
fn parse_result(rest: &str, output: Vec<String>, timeout_rc: i32) -> Option<TestResult> {
    let mut words = rest.split_whitespace();
    let (binary, test) = (words.next()?, words.next()?);
    let rc: i32 = field(rest, "rc").parse().ok()?;
    let secs = match (
        field(rest, "start").parse::<f64>(),
        field(rest, "end").parse::<f64>(),
    ) {
        (Ok(start), Ok(end)) => end - start,
        _ => f64::NAN,
    };
    let name = if test == "-" {
        binary.to_string()
    } else {
        format!("{binary}::{test}")
    };
    let status = match rc {
        0 => Status::Passed,
        rc if rc == timeout_rc => Status::TimedOut,
        rc => Status::Failed { rc },
    };
    Some(TestResult {
        name,
        status,
        secs,
        output,
    })
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Passed => f.write_str("ok"),
            Self::Failed { rc } => write!(f, "FAILED (exit {rc})"),
            Self::TimedOut => f.write_str("TIMED OUT"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(String::from).collect()
    }

    #[test]
    fn a_full_run_yields_boot_mechanism_results_and_outputs() {
        let report = Report::parse(
            &lines(
                "Booting from ROM..\n\
                 @vmtest boot kernel=6.1.0-56-cloud-amd64 cpus=2 memory_kib=2000000 cgroup_v1_mounts=0 subtree_control=memory,pids\n\
                 probe: INFO kernel programs attached memory=fexit on page_counter\n\
                 @vmtest mechanism rc=0 2026 INFO node_agent: kernel programs attached memory=fexit on page_counter charge/uncharge\n\
                 @vmtest start kernel_memory an_oom\n\
                 test an_oom ... ok\n\
                 @vmtest result kernel_memory an_oom rc=0 start=10.50 end=12.00\n\
                 @vmtest start kernel_tasks storm\n\
                 assertion failed\n\
                 @vmtest result kernel_tasks storm rc=101 start=12.00 end=13.00\n\
                 @vmtest start kernel_tasks hang\n\
                 @vmtest result kernel_tasks hang rc=137 start=13.00 end=313.00\n\
                 @vmtest done\n",
            ),
            137,
        );
        let boot = report.boot.as_ref().unwrap();
        assert_eq!(
            (
                boot.release.as_str(),
                boot.cgroup_v1_mounts.as_str(),
                boot.subtree_control.as_str()
            ),
            ("6.1.0-56-cloud-amd64", "0", "memory,pids")
        );
        assert_eq!(report.mechanism.as_ref().unwrap().0, Some(Mechanism::Fexit));
        assert_eq!(report.probe_rc, Some(0));
        assert_eq!(report.results.len(), 3);
        assert_eq!(report.results[0].name, "kernel_memory::an_oom");
        assert_eq!(report.results[0].status, Status::Passed);
        assert!((report.results[0].secs - 1.5).abs() < 1e-9);
        assert_eq!(report.results[1].status, Status::Failed { rc: 101 });
        assert_eq!(report.results[1].output, ["assertion failed"]);
        assert_eq!(report.results[2].status, Status::TimedOut);
        assert_eq!((report.passed(), report.failed()), (1, 2));
        assert!(report.done && report.unfinished.is_none());
    }

    #[test]
    fn a_guest_that_dies_inside_a_test_leaves_it_unfinished_and_not_done() {
        let report = Report::parse(
            &lines(
                "@vmtest boot kernel=6.18 cpus=1\n\
                 @vmtest start kernel_memory an_oom\n\
                 half a line",
            ),
            137,
        );
        assert_eq!(report.unfinished.as_deref(), Some("kernel_memory an_oom"));
        assert!(!report.done);
        assert!(report.results.is_empty());
    }

    #[test]
    fn a_marker_glued_to_unterminated_output_is_still_read() {
        let report = Report::parse(&lines("partial output@vmtest done"), 137);
        assert!(report.done);
    }
}
