//! Figures as rows, the machine they were measured on, and their two renderings: a markdown
//! table for people and a JSON record for comparing runs across commits.

use serde_json::json;

use super::stats::Interval;

/// The section of the fexit rows measured inside the VMs: their own table in the docs.
pub const FEXIT_SECTION: &str = "fexit (emulated)";

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

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Met => "met",
            Verdict::Missed => "missed",
            Verdict::Info => "",
            Verdict::NotMeasured => "not measured",
        }
    }
}

/// One figure.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub section: String,
    pub measure: String,
    /// The figure as shown, e.g. `0.31 / 1.52 ms`.
    pub result: String,
    /// The headline number in `unit`, for comparisons across runs.
    pub value: Option<f64>,
    pub unit: String,
    /// The headline number's 95 % interval, in `unit`, when the row has one: its target is
    /// judged against the interval's unfavourable end.
    pub interval: Option<Interval>,
    pub target: Option<String>,
    pub verdict: Verdict,
    pub note: String,
}

impl Row {
    pub fn info(section: impl Into<String>, measure: impl Into<String>, result: String) -> Self {
        Self {
            section: section.into(),
            measure: measure.into(),
            result,
            value: None,
            unit: String::new(),
            interval: None,
            target: None,
            verdict: Verdict::Info,
            note: String::new(),
        }
    }

    pub fn value(mut self, value: f64, unit: impl Into<String>) -> Self {
        self.value = Some(value);
        self.unit = unit.into();
        self
    }

    /// The headline figure is `ci.estimate` in `unit`, with its interval.
    pub fn estimate(mut self, ci: Interval, unit: impl Into<String>) -> Self {
        self.value = Some(ci.estimate);
        self.unit = unit.into();
        self.interval = Some(ci);
        self
    }

    /// A target met when the interval's upper end is at most `bound` (or, with no interval,
    /// the value).
    pub fn at_most(self, target: impl Into<String>, bound: f64) -> Self {
        let worst = self.interval.map(|c| c.hi).or(self.value);
        self.target(target, worst.is_some_and(|w| w <= bound))
    }

    /// A target met when the interval's upper end is below `bound`.
    pub fn below(self, target: impl Into<String>, bound: f64) -> Self {
        let worst = self.interval.map(|c| c.hi).or(self.value);
        self.target(target, worst.is_some_and(|w| w < bound))
    }

    /// A target met when the interval's lower end is above `bound`.
    pub fn above(self, target: impl Into<String>, bound: f64) -> Self {
        let worst = self.interval.map(|c| c.lo).or(self.value);
        self.target(target, worst.is_some_and(|w| w > bound))
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
    pub fn not_measured(
        section: impl Into<String>,
        measure: impl Into<String>,
        why: String,
    ) -> Self {
        Self {
            section: section.into(),
            measure: measure.into(),
            result: "—".into(),
            value: None,
            unit: String::new(),
            interval: None,
            target: None,
            verdict: Verdict::NotMeasured,
            note: why,
        }
    }

    pub fn json(&self) -> serde_json::Value {
        json!({
            "section": self.section,
            "measure": self.measure,
            "result": self.result,
            "value": self.value,
            "unit": self.unit,
            "interval": self.interval.map(|c| json!({
                "estimate": c.estimate, "lo": c.lo, "hi": c.hi, "coverage": c.coverage, "n": c.n,
            })),
            "target": self.target,
            "verdict": match self.verdict {
                Verdict::Info => "info",
                v => v.as_str(),
            },
            "note": self.note,
        })
    }

    /// A row from [`Row::json`]'s record (the VMs send theirs that way).
    pub fn from_json(v: &serde_json::Value) -> anyhow::Result<Self> {
        let text = |k: &str| -> anyhow::Result<String> {
            v[k].as_str()
                .map(str::to_string)
                .ok_or_else(|| anyhow::anyhow!("bench row without a text `{k}`: {v}"))
        };
        let verdict = match v["verdict"].as_str() {
            Some("met") => Verdict::Met,
            Some("missed") => Verdict::Missed,
            Some("info") => Verdict::Info,
            Some("not measured") => Verdict::NotMeasured,
            other => anyhow::bail!("bench row with verdict {other:?}: {v}"),
        };
        let interval = match &v["interval"] {
            serde_json::Value::Null => None,
            c => {
                let f = |k: &str| -> anyhow::Result<f64> {
                    c[k].as_f64()
                        .ok_or_else(|| anyhow::anyhow!("bench row interval without `{k}`: {v}"))
                };
                Some(Interval {
                    estimate: f("estimate")?,
                    lo: f("lo")?,
                    hi: f("hi")?,
                    coverage: f("coverage")?,
                    n: c["n"].as_u64().unwrap_or(0) as usize,
                })
            }
        };
        Ok(Self {
            section: text("section")?,
            measure: text("measure")?,
            result: text("result")?,
            value: v["value"].as_f64(),
            unit: text("unit")?,
            interval,
            target: v["target"].as_str().map(str::to_string),
            verdict,
            note: text("note")?,
        })
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
    /// `/proc/loadavg`'s 1, 5 and 15 minute averages when the run started and ended: the
    /// machine is shared, and figures taken under load are noisy.
    pub load_start: String,
    pub load_end: String,
}

/// The 1, 5 and 15 minute load averages, as `/proc/loadavg` gives them.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" / ")
}

impl Machine {
    pub fn detect(commit: String, load_start: String) -> Self {
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
            load_start,
            load_end: load_average(),
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
    /// The host's table: every row but the VMs' fexit rows.
    pub fn markdown(&self) -> String {
        let m = &self.machine;
        let mut out = format!(
            "Run of {date} at commit `{commit}` on Linux {kernel}, {cpus} × {model}, {mem} MiB, \
             cgroups: {cg}; load average (1 / 5 / 15 min) {start} at the start, {end} at the \
             end; the bench took {secs:.0} s.\n\n",
            date = m.date,
            commit = m.commit,
            kernel = m.kernel,
            cpus = m.cpus,
            model = m.cpu_model,
            mem = m.memory_mib,
            cg = m.cgroups,
            start = m.load_start,
            end = m.load_end,
            secs = self.duration_s,
        );
        out.push_str(&table(
            self.rows.iter().filter(|r| r.section != FEXIT_SECTION),
        ));
        out
    }

    /// The fexit rows measured inside the VMs, as a table of their own; empty without any.
    pub fn markdown_fexit(&self) -> String {
        let rows: Vec<&Row> = self
            .rows
            .iter()
            .filter(|r| r.section == FEXIT_SECTION)
            .collect();
        if rows.is_empty() {
            return String::new();
        }
        format!(
            "Run of {} at commit `{}`, in the same run as the table above; every figure in this \
             table is **emulated** (QEMU TCG, 1 vCPU, cgroup v2).\n\n{}",
            self.machine.date,
            self.machine.commit,
            table(rows.into_iter())
        )
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
            "load_average": {"start": m.load_start, "end": m.load_end},
            "duration_s": self.duration_s,
            "rows": self.rows.iter().map(Row::json).collect::<Vec<_>>(),
        })
    }
}

fn table<'a>(rows: impl Iterator<Item = &'a Row>) -> String {
    let mut out = String::from("| section | measure | result | target | met | notes |\n");
    out.push_str("| --- | --- | --- | --- | --- | --- |\n");
    for r in rows {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::stats::mean_ci;

    #[test]
    fn targets_are_judged_at_the_unfavourable_end_of_the_interval() {
        // Estimate 1.0 with an interval reaching 3.5: under 3 by the estimate, not by the bound.
        let ci = Interval {
            estimate: 1.0,
            lo: -1.5,
            hi: 3.5,
            coverage: 0.95,
            n: 24,
        };
        let row = || Row::info("overhead", "x", String::new()).estimate(ci, "%");
        let cases = [
            (
                "upper end over the bound",
                row().at_most("≤ 3 %", 3.0),
                Verdict::Missed,
            ),
            (
                "upper end at the bound",
                row().at_most("≤ 3.5 %", 3.5),
                Verdict::Met,
            ),
            (
                "strictly below",
                row().below("< 3.5 %", 3.5),
                Verdict::Missed,
            ),
            ("lower end above", row().above("> -2", -2.0), Verdict::Met),
            (
                "lower end not above",
                row().above("> 0", 0.0),
                Verdict::Missed,
            ),
            (
                "no interval: the value",
                Row::info("s", "m", String::new())
                    .value(2.0, "x")
                    .at_most("≤ 3", 3.0),
                Verdict::Met,
            ),
        ];
        for (why, row, want) in cases {
            assert_eq!(row.verdict, want, "{why}");
        }
    }

    #[test]
    fn a_row_survives_its_json_record() {
        let row = Row::info("fexit (emulated)", "per fork", "640 ns".into())
            .estimate(mean_ci(&[1.0, 2.0, 3.0]).unwrap(), "ns")
            .at_most("≤ 10", 10.0)
            .note("n = 3");
        assert_eq!(Row::from_json(&row.json()).unwrap(), row);
        let bare = Row::not_measured("fexit (emulated)", "m", "no VM".into());
        assert_eq!(Row::from_json(&bare.json()).unwrap(), bare);
        assert!(Row::from_json(&serde_json::json!({"section": "x"})).is_err());
    }
}
