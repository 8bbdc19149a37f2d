//! Figures as rows, the machine they were measured on, and their two renderings: a markdown
//! table for people and a JSON record for comparing runs across commits.

use serde_json::json;

/// Whether a figure reaches the product's target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Met,
    Missed,
    /// A figure without a target: context for the others.
    Info,
    /// Not measured in this run; the note says why.
    NotMeasured,
}

impl Verdict {
    pub fn from_bool(met: bool) -> Self {
        if met {
            Verdict::Met
        } else {
            Verdict::Missed
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Verdict::Met => "met",
            Verdict::Missed => "missed",
            Verdict::Info => "",
            Verdict::NotMeasured => "not measured",
        }
    }
}

/// One figure.
#[derive(Debug, Clone)]
pub struct Row {
    pub section: &'static str,
    pub measure: String,
    /// The figure as shown, e.g. `0.31 / 1.52 ms`.
    pub result: String,
    /// The headline number in `unit`, for comparisons across runs.
    pub value: Option<f64>,
    pub unit: &'static str,
    pub target: Option<String>,
    pub verdict: Verdict,
    pub note: String,
}

impl Row {
    pub fn info(section: &'static str, measure: impl Into<String>, result: String) -> Self {
        Self {
            section,
            measure: measure.into(),
            result,
            value: None,
            unit: "",
            target: None,
            verdict: Verdict::Info,
            note: String::new(),
        }
    }

    pub fn value(mut self, value: f64, unit: &'static str) -> Self {
        self.value = Some(value);
        self.unit = unit;
        self
    }

    pub fn target(mut self, target: impl Into<String>, met: bool) -> Self {
        self.target = Some(target.into());
        self.verdict = Verdict::from_bool(met);
        self
    }

    pub fn note(mut self, note: impl Into<String>) -> Self {
        self.note = note.into();
        self
    }

    /// A figure this run could not produce; `why` says so in the table.
    pub fn not_measured(section: &'static str, measure: impl Into<String>, why: String) -> Self {
        Self {
            section,
            measure: measure.into(),
            result: "—".into(),
            value: None,
            unit: "",
            target: None,
            verdict: Verdict::NotMeasured,
            note: why,
        }
    }
}

/// The machine and the code a run measured.
#[derive(Debug, Clone)]
pub struct Machine {
    pub commit: String,
    pub date: String,
    pub kernel: String,
    pub cpus: usize,
    pub cpu_model: String,
    pub memory_mib: u64,
    pub cgroups: String,
}

impl Machine {
    pub fn detect(commit: String) -> Self {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let cpuinfo = read("/proc/cpuinfo");
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, m)| m.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let memory_mib = read("/proc/meminfo")
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|l| l.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kib| kib / 1024);
        let cgroups = match node_agent::cgroup::detect() {
            Ok(layout) => layout.to_string(),
            Err(e) => format!("unknown ({e})"),
        };
        Self {
            commit,
            date: node_agent::sys::now_rfc3339(),
            kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu_model,
            memory_mib,
            cgroups,
        }
    }
}

/// Everything one run produced.
#[derive(Debug, Clone)]
pub struct Report {
    pub machine: Machine,
    pub rows: Vec<Row>,
    pub duration_s: f64,
}

impl Report {
    pub fn markdown(&self) -> String {
        let m = &self.machine;
        let mut out = format!(
            "Run of {date} at commit `{commit}` on Linux {kernel}, {cpus} × {model}, {mem} MiB, \
             cgroups: {cg}; the bench took {secs:.0} s.\n\n",
            date = m.date,
            commit = m.commit,
            kernel = m.kernel,
            cpus = m.cpus,
            model = m.cpu_model,
            mem = m.memory_mib,
            cg = m.cgroups,
            secs = self.duration_s,
        );
        out.push_str("| section | measure | result | target | met | notes |\n");
        out.push_str("| --- | --- | --- | --- | --- | --- |\n");
        for r in &self.rows {
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} |\n",
                r.section,
                cell(&r.measure),
                cell(&r.result),
                cell(r.target.as_deref().unwrap_or("")),
                r.verdict.as_str(),
                cell(&r.note),
            ));
        }
        out
    }

    pub fn json(&self) -> serde_json::Value {
        let m = &self.machine;
        json!({
            "commit": m.commit,
            "date": m.date,
            "machine": {
                "kernel": m.kernel,
                "cpus": m.cpus,
                "cpu_model": m.cpu_model,
                "memory_mib": m.memory_mib,
                "cgroups": m.cgroups,
            },
            "duration_s": self.duration_s,
            "rows": self.rows.iter().map(|r| json!({
                "section": r.section,
                "measure": r.measure,
                "result": r.result,
                "value": r.value,
                "unit": r.unit,
                "target": r.target,
                "verdict": match r.verdict {
                    super::Verdict::Info => "info",
                    v => v.as_str(),
                },
                "note": r.note,
            })).collect::<Vec<_>>(),
        })
    }
}

/// A table cell: pipes escaped, newlines flattened.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

/// Nanoseconds as milliseconds with sensible precision.
pub fn ms(ns: f64) -> String {
    let v = ns / 1e6;
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}
