//! The race's figures: per run, per cell (scenario × configuration) with intervals, the
//! headline, the table written into docs/benchmarks.md and the picture `docs/race.svg`.

use std::collections::BTreeMap;

use super::{observe::By, run::RunRecord, Config, Pressed, Scenario};
use crate::bench::stats::{median_ci, quantile_ci};

/// One run's figures.
#[derive(Debug, Clone)]
pub struct RunFigures {
    /// Crossing of the side's own line → its first eviction request, ms.
    pub agent_ms: Option<f64>,
    pub kubelet_ms: Option<f64>,
    /// Crossing of the first line met → the first evicted pod's cgroup gone, ms.
    pub cgroup_gone_ms: Option<f64>,
    pub oom_kills: usize,
    pub lowest: Option<f64>,
    pub evictions: usize,
    pub over_evictions: usize,
}

fn first_crossing(r: &RunRecord, line: f64) -> Option<i64> {
    r.sampled
        .samples
        .iter()
        .find(|s| s.available < line)
        .map(|s| s.wall_ns)
}

/// The signal's sample at (or just before) `at`.
fn signal_at(r: &RunRecord, at: i64) -> Option<f64> {
    r.sampled
        .samples
        .iter()
        .take_while(|s| s.wall_ns <= at)
        .last()
        .map(|s| s.available)
}

pub fn figures(r: &RunRecord) -> RunFigures {
    let pressed = r.scenario.pressed();
    // Local storage: both sides start from the write being done (no node signal).
    let origin = |line: Option<f64>| -> Option<i64> {
        match pressed {
            Pressed::LocalStorage => r.written_ns,
            _ => first_crossing(r, line?),
        }
    };
    let first_by = |by: By| r.evictions.iter().find(|e| e.by == by).map(|e| e.wall_ns);
    let ms =
        |from: Option<i64>, to: Option<i64>| -> Option<f64> { Some((to? - from?) as f64 / 1e6) };
    let agent_ms = if matches!(pressed, Pressed::LocalStorage) {
        ms(r.written_ns, first_by(By::Agent))
    } else {
        ms(origin(r.agent_line), first_by(By::Agent))
    };
    let kubelet_ms = if matches!(pressed, Pressed::LocalStorage) {
        ms(r.written_ns, first_by(By::Kubelet))
    } else {
        ms(origin(kubelet_line(r)), first_by(By::Kubelet))
    };
    let first_line = [r.agent_line, kubelet_line(r)]
        .into_iter()
        .flatten()
        .fold(None::<f64>, |a, b| Some(a.map_or(b, |a| a.max(b))));
    let first_cross = origin(first_line);
    let first_evicted = r.evictions.first().and_then(|e| {
        let uid = r.pods.iter().find(|(n, _)| *n == e.pod).map(|(_, u)| u)?;
        r.sampled.cgroup_gone.get(uid).copied()
    });
    let over = r
        .evictions
        .iter()
        .filter(|e| {
            let line = match e.by {
                By::Agent => r.agent_line,
                By::Kubelet => kubelet_line(r),
            };
            match (line, signal_at(r, e.wall_ns)) {
                (Some(line), Some(v)) => v >= line,
                _ => false,
            }
        })
        .count();
    RunFigures {
        agent_ms,
        kubelet_ms,
        cgroup_gone_ms: ms(first_cross, first_evicted),
        oom_kills: r
            .sampled
            .oom_kills
            .iter()
            .filter(|k| {
                k.pod_uid
                    .as_ref()
                    .is_some_and(|u| r.pods.iter().any(|(_, p)| p == u))
                    || k.pod_uid.is_none()
            })
            .count(),
        lowest: r
            .sampled
            .samples
            .iter()
            .map(|s| s.available)
            .reduce(f64::min),
        evictions: r.evictions.len(),
        over_evictions: over,
    }
}

/// Where the kubelet's line lies on the bench's axis. For memory the axis is the Node's
/// allocatable less the pods' working set (what the agent measured against until the race found
/// the difference), but the kubelet measures the pods cgroup's own headroom (its limit, capacity
/// less the reservations, less the working set: `AvailableBytes` of the summary's `pods`
/// container), which is its hard `memory.available` threshold higher. Its line (that same
/// threshold) falls at 0 on the axis in both kubelet configurations: 100 − 100 with kubeadm's,
/// 200 − 200 with the agent's. The run records keep the threshold as configured; the agent's
/// line they record where it falls (`run::AGENT_LINE_MIB`).
pub fn kubelet_line(r: &RunRecord) -> Option<f64> {
    match r.scenario.pressed() {
        Pressed::Memory => r.kubelet_line.map(|_| KUBELET_LINE_ON_AXIS_MIB),
        _ => r.kubelet_line,
    }
}

/// The kubelet's memory line on the bench's axis (see [`kubelet_line`]).
pub const KUBELET_LINE_ON_AXIS_MIB: f64 = 0.0;

fn show_ms(values: &[f64]) -> String {
    if values.is_empty() {
        return "—".into();
    }
    let fmt = |v: f64| {
        if v.abs() >= 10_000.0 {
            format!("{:.1} s", v / 1000.0)
        } else {
            format!("{v:.0} ms")
        }
    };
    match median_ci(values) {
        Some(ci) if values.len() >= 2 => format!(
            "{} [{} … {}] (n = {})",
            fmt(ci.estimate),
            fmt(ci.lo),
            fmt(ci.hi),
            values.len()
        ),
        _ => format!("{} (n = {})", fmt(values[0]), values.len()),
    }
}

/// The table of every cell, and the headline lines.
pub fn markdown(records: &[RunRecord], meta: &str) -> String {
    let mut cells: BTreeMap<(Scenario, Config), Vec<RunFigures>> = BTreeMap::new();
    for r in records {
        cells
            .entry((r.scenario, r.config))
            .or_default()
            .push(figures(r));
    }
    let mut out = String::new();
    out.push_str(meta);
    out.push_str("\n\n");
    out.push_str(&headline(records));
    out.push_str("\n\n| scenario | configuration | runs | OOM kills (runs with one) | crossing → first eviction: agent | crossing → first eviction: kubelet | crossing → victim's cgroup gone | lowest signal (median) | evictions (over-evictions) | conditions seen |\n");
    out.push_str("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for ((scenario, config), runs) in &cells {
        let agent: Vec<f64> = runs.iter().filter_map(|f| f.agent_ms).collect();
        let kubelet: Vec<f64> = runs.iter().filter_map(|f| f.kubelet_ms).collect();
        let gone: Vec<f64> = runs.iter().filter_map(|f| f.cgroup_gone_ms).collect();
        let lowest: Vec<f64> = runs.iter().filter_map(|f| f.lowest).collect();
        let kills: usize = runs.iter().map(|f| f.oom_kills).sum();
        let killed_runs = runs.iter().filter(|f| f.oom_kills > 0).count();
        let evictions: usize = runs.iter().map(|f| f.evictions).sum();
        let over: usize = runs.iter().map(|f| f.over_evictions).sum();
        let unit = match scenario.pressed() {
            Pressed::Memory | Pressed::Disk => " MiB",
            Pressed::Pids => " PIDs",
            Pressed::LocalStorage => " MiB (kubepods)",
        };
        let mut conditions: Vec<String> = records
            .iter()
            .filter(|r| r.scenario == *scenario && r.config == *config)
            .flat_map(|r| r.conditions.seen_true.iter().cloned())
            .collect();
        conditions.sort();
        conditions.dedup();
        out.push_str(&format!(
            "| {} | {} | {} | {kills} ({killed_runs}) | {} | {} | {} | {} | {evictions} ({over}) | {} |\n",
            scenario.label(),
            config.label(),
            runs.len(),
            show_ms(&agent),
            show_ms(&kubelet),
            show_ms(&gone),
            median_ci(&lowest).map_or("—".into(), |c| format!("{:.0}{unit}", c.estimate)),
            if conditions.is_empty() { "—".into() } else { conditions.join(", ") },
        ));
    }
    out
}

/// The headline: OOM kills with the kubelet alone against with the agent, and each side's
/// crossing → eviction over the memory scenarios.
pub fn headline(records: &[RunRecord]) -> String {
    let memory: Vec<&RunRecord> = records
        .iter()
        .filter(|r| r.scenario.pressed() == Pressed::Memory)
        .collect();
    let kills = |c: Config| -> (usize, usize) {
        let runs: Vec<_> = memory
            .iter()
            .filter(|r| r.config == c)
            .map(|r| figures(r))
            .collect();
        (runs.iter().map(|f| f.oom_kills).sum(), runs.len())
    };
    let pooled = |c: Config, agent: bool| -> Vec<f64> {
        memory
            .iter()
            .filter(|r| r.config == c)
            .filter_map(|r| {
                let f = figures(r);
                if agent {
                    f.agent_ms
                } else {
                    f.kubelet_ms
                }
            })
            .collect()
    };
    let q = |v: &[f64], p: f64| {
        quantile_ci(v, p).map_or("—".into(), |c| format!("{:.0} ms", c.estimate))
    };
    let (k_alone, n_alone) = kills(Config::KubeletKubeadm);
    let (k_same, n_same) = kills(Config::KubeletAgentThresholds);
    let (k_agent, n_agent) = kills(Config::KubeletAndAgent);
    let agent = pooled(Config::KubeletAndAgent, true);
    let kubelet = pooled(Config::KubeletKubeadm, false);
    format!(
        "**Headline (memory scenarios).** Kernel OOM kills: {k_alone} in {n_alone} runs with the kubelet alone (kubeadm), {k_same} in {n_same} with the kubelet on the agent's thresholds, {k_agent} in {n_agent} with the agent. Crossing → first eviction request: the agent p50 {} / p99 {} (n = {}); the kubelet (kubeadm) p50 {} / p99 {} (n = {}, runs where it evicted at all). With so few runs p99 is the largest.",
        q(&agent, 0.5),
        q(&agent, 0.99),
        agent.len(),
        q(&kubelet, 0.5),
        q(&kubelet, 0.99),
        kubelet.len(),
    )
}

/// `docs/race.svg`: per memory scenario, the signal against time from the first crossing of
/// the agent's line (or the kubelet's), the median run of each configuration, each side's
/// eviction requests (agent ▲, kubelet ●) and the OOM kills (✕).
pub fn svg(records: &[RunRecord]) -> String {
    let scenarios: Vec<Scenario> = Scenario::ALL
        .into_iter()
        .filter(|s| s.pressed() == Pressed::Memory)
        .collect();
    let colors = [
        ("#d62728", Config::KubeletKubeadm),
        ("#ff7f0e", Config::KubeletAgentThresholds),
        ("#1f77b4", Config::KubeletAndAgent),
    ];
    let (pw, ph, left, top) = (560.0, 220.0, 70.0, 50.0);
    let height = top + scenarios.len() as f64 * (ph + 60.0) + 60.0;
    let width = left + pw + 300.0;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{left}\" y=\"18\" font-size=\"15\">the Node's allocatable less the pods' working set (MiB) against time from its crossing of 200 MiB,</text>\n<text x=\"{left}\" y=\"36\" font-size=\"15\">the median run of each configuration</text>\n"
    );
    for (row, scenario) in scenarios.iter().enumerate() {
        let y0 = top + row as f64 * (ph + 60.0) + 20.0;
        out.push_str(&format!(
            "<text x=\"{left}\" y=\"{}\" font-weight=\"bold\">{}</text>\n",
            y0 - 6.0,
            scenario.label()
        ));
        // The window: −5 s … +max(span) capped at 60 s (the slow ramp: 150 s).
        let (t_min, t_max) = (
            -5.0,
            if *scenario == Scenario::SlowRamp {
                150.0
            } else {
                40.0
            },
        );
        let (v_min, v_max) = (-250.0, 1200.0);
        let x = |t: f64| left + (t.clamp(t_min, t_max) - t_min) / (t_max - t_min) * pw;
        let y = |v: f64| y0 + ph - (v.clamp(v_min, v_max) - v_min) / (v_max - v_min) * ph;
        out.push_str(&format!("<rect x=\"{left}\" y=\"{y0}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"#999\"/>\n"));
        // The kubelet on the agent's thresholds reserves 200 MiB, not 100: its allocatable is
        // 100 MiB less, so on its own allocatable the kubepods limit sits at −200.
        // The agent's line as its runs recorded it (200 while it measured against the Node's
        // allocatable, one hard threshold lower since it measures the pods cgroup's headroom).
        let mut agent_lines: Vec<f64> = records
            .iter()
            .filter(|r| r.scenario == *scenario)
            .filter_map(|r| r.agent_line)
            .map(f64::round)
            .collect();
        agent_lines.sort_by(f64::total_cmp);
        agent_lines.dedup();
        let lines = agent_lines.into_iter().map(|v| (v, "agent's line")).chain([
            (KUBELET_LINE_ON_AXIS_MIB, "kubelet's line (both)"),
            (-100.0, "OOM: kubepods limit"),
            (-200.0, "OOM (agent's thresholds)"),
        ]);
        for (v, label) in lines {
            out.push_str(&format!(
                "<line x1=\"{left}\" x2=\"{}\" y1=\"{yy}\" y2=\"{yy}\" stroke=\"#bbb\" stroke-dasharray=\"4 3\"/><text x=\"{}\" y=\"{}\" fill=\"#666\">{label} ({v:.0})</text>\n",
                left + pw,
                left + pw + 4.0,
                y(v) + 4.0,
                yy = y(v)
            ));
        }
        for t in [0.0, 10.0, 20.0, 30.0, 40.0, 60.0, 90.0, 120.0, 150.0]
            .into_iter()
            .filter(|t| *t <= t_max)
        {
            out.push_str(&format!(
                "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"#666\">{t:.0} s</text>\n",
                x(t),
                y0 + ph + 14.0
            ));
        }
        for v in [0.0, 400.0, 800.0, 1200.0] {
            out.push_str(&format!(
                "<text x=\"{}\" y=\"{}\" text-anchor=\"end\" fill=\"#666\">{v:.0}</text>\n",
                left - 4.0,
                y(v) + 4.0
            ));
        }
        for (color, config) in colors {
            let runs: Vec<&RunRecord> = records
                .iter()
                .filter(|r| r.scenario == *scenario && r.config == config)
                .collect();
            // The median run by its lowest signal.
            let mut by_lowest: Vec<(f64, &RunRecord)> = runs
                .iter()
                .map(|r| (figures(r).lowest.unwrap_or(f64::INFINITY), *r))
                .collect();
            by_lowest.sort_by(|a, b| a.0.total_cmp(&b.0));
            let Some((_, r)) = by_lowest.get(by_lowest.len() / 2) else {
                continue;
            };
            // A time origin common to every configuration: the crossing of 200 MiB (the runs
            // start from the same point above it).
            let line = r.agent_line.or(kubelet_line(r)).unwrap_or(200.0);
            let Some(t0) =
                first_crossing(r, super::run::AGENT_LINE_MIB).or_else(|| first_crossing(r, line))
            else {
                continue;
            };
            let t = |ns: i64| (ns - t0) as f64 / 1e9;
            let mut points = String::new();
            let mut last_t = f64::NEG_INFINITY;
            for s in &r.sampled.samples {
                let ts = t(s.wall_ns);
                if ts < t_min || ts > t_max || ts - last_t < 0.05 {
                    continue;
                }
                last_t = ts;
                points.push_str(&format!("{:.1},{:.1} ", x(ts), y(s.available)));
            }
            out.push_str(&format!("<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{points}\"/>\n"));
            for e in &r.evictions {
                let (ex, ey) = (x(t(e.wall_ns)), y(signal_at(r, e.wall_ns).unwrap_or(0.0)));
                match e.by {
                    By::Agent => out.push_str(&format!(
                        "<path d=\"M{ex:.1},{:.1} l5,9 l-10,0 z\" fill=\"{color}\"/>\n",
                        ey - 6.0
                    )),
                    By::Kubelet => out.push_str(&format!(
                        "<circle cx=\"{ex:.1}\" cy=\"{ey:.1}\" r=\"4.5\" fill=\"{color}\"/>\n"
                    )),
                }
            }
            for k in &r.sampled.oom_kills {
                let (kx, ky) = (
                    x(t(k.wall_ns)),
                    y(signal_at(r, k.wall_ns).unwrap_or(-100.0)),
                );
                out.push_str(&format!(
                    "<path d=\"M{:.1},{:.1} l10,10 M{:.1},{:.1} l-10,10\" stroke=\"{color}\" stroke-width=\"2.5\"/>\n",
                    kx - 5.0, ky - 5.0, kx + 5.0, ky - 5.0
                ));
            }
        }
    }
    let ly = height - 44.0;
    let mut lx = left;
    for (color, config) in colors {
        out.push_str(&format!("<line x1=\"{lx}\" x2=\"{}\" y1=\"{ly}\" y2=\"{ly}\" stroke=\"{color}\" stroke-width=\"3\"/><text x=\"{}\" y=\"{}\">{}</text>\n", lx + 24.0, lx + 30.0, ly + 4.0, config.label()));
        lx += 210.0;
    }
    out.push_str(&format!("<text x=\"{left}\" y=\"{}\">▲ agent's eviction request   ● kubelet's eviction   ✕ kernel OOM kill</text>\n", ly + 24.0));
    out.push_str("</svg>\n");
    out
}
