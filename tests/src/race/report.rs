//! The race's figures: per run, per cell (scenario × configuration) with intervals, per
//! scenario for each side (never pooled across scenarios), the tables written into
//! docs/benchmarks.md and the picture `docs/race.svg`.

use std::collections::BTreeMap;

use super::{
    observe::{By, Decision},
    run::RunRecord,
    Config, Pressed, Scenario,
};
use crate::bench::stats::quantile_ci;

/// The common time origin of the picture: the first sample below this much headroom (MiB),
/// above every side's line and below every memory scenario's start.
pub const PICTURE_ORIGIN_MIB: f64 = 400.0;
/// A decision is an over-eviction when its side's signal was back above its line for this
/// long before it.
const OVER_WINDOW_NS: i64 = 100_000_000;
/// OOM kills this long after the pressure ended are not the run's (counted apart).
const AFTER_PRESSURE_NS: i64 = 2_000_000_000;

/// One side's timings in a run, ms from the crossing of its own line: its first decision,
/// that victim's growth stopped (its usage falling: it no longer grows and its memory is
/// coming back), the signal back above the line, the victim's API record
/// (`Failed`/`Evicted`, or marked deleted).
#[derive(Debug, Clone, Default)]
pub struct SideFigures {
    pub decided: Option<f64>,
    pub growth_stopped: Option<f64>,
    pub recovered: Option<f64>,
    pub recorded: Option<f64>,
}

/// A kernel OOM kill during the pressure, and whose process it took.
#[derive(Debug, Clone)]
pub struct Kill {
    pub task: String,
    /// `ramp`, `ballast`, a scenario pod's name, or `outside the run's pods`.
    pub pod: String,
}

/// One run's figures.
#[derive(Debug, Clone, Default)]
pub struct RunFigures {
    pub agent: SideFigures,
    pub kubelet: SideFigures,
    pub kills: Vec<Kill>,
    /// Kernel OOM kills more than 2 s after the pressure ended.
    pub kills_after: usize,
    pub lowest: Option<f64>,
    pub start: Option<f64>,
    pub agent_decisions: usize,
    pub kubelet_decisions: usize,
    /// Decisions whose victim is not a scenario pod (the ballast, within its request).
    pub wrong_victims: usize,
    /// Decisions made while the deciding side's signal had been back above its line for
    /// 100 ms already.
    pub over_evictions: usize,
    pub restarts: u64,
}

fn crossing(r: &RunRecord, line: f64) -> Option<i64> {
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

fn uid_of<'r>(r: &'r RunRecord, name: &str) -> Option<&'r str> {
    r.pods
        .iter()
        .chain(r.ballast.iter())
        .find(|(n, _)| n == name)
        .map(|(_, u)| u.as_str())
}

/// Each side's line on the run's axis.
fn line_of(r: &RunRecord, by: By) -> Option<f64> {
    match by {
        By::Agent => r.agent_line,
        By::Kubelet => r.kubelet_line,
    }
}

/// How long before its side's crossing a victim's usage may start falling and still count:
/// a fall before that is the pod's own (its start-up pages reclaimed), not the side's doing.
const FALLING_LOOKBACK_NS: i64 = 200_000_000;

/// When a pod's usage first fell more than 1 MiB below the highest it had reached, from
/// `since` on: it no longer grew and its memory was coming back (its processes killed or
/// gone). For a pod growing in steps this is the kill, not its last step. The points are
/// the sampler's, taken at each move of 1 MiB (to the millisecond).
fn falling_since(points: &[(i64, f64)], since: i64) -> Option<i64> {
    let mut high = f64::NEG_INFINITY;
    for &(t, mib) in points {
        if t >= since && mib < high - 1.0 {
            return Some(t);
        }
        high = high.max(mib);
    }
    None
}

fn side(r: &RunRecord, by: By) -> SideFigures {
    let pressed = r.scenario.pressed();
    let Some(first) = r.decisions.iter().find(|d| d.by == by) else {
        return SideFigures::default();
    };
    // Local storage: both sides start from the write being done (no node signal).
    let (origin, line) = match pressed {
        Pressed::LocalStorage => (r.written_ns, None),
        _ => match line_of(r, by) {
            Some(line) => (crossing(r, line), Some(line)),
            None => (None, None),
        },
    };
    let Some(origin) = origin else {
        return SideFigures::default();
    };
    let ms = |to: Option<i64>| to.map(|t| (t - origin) as f64 / 1e6);
    let victim = uid_of(r, &first.pod);
    let growth_stopped = victim
        .and_then(|u| r.sampled.pods.get(u))
        .and_then(|p| falling_since(&p.points, origin - FALLING_LOOKBACK_NS));
    let recovered = line.and_then(|line| {
        r.sampled
            .samples
            .iter()
            .find(|s| s.wall_ns > origin && s.available >= line)
            .map(|s| s.wall_ns)
    });
    SideFigures {
        decided: ms(Some(first.wall_ns)),
        growth_stopped: ms(growth_stopped.filter(|_| pressed == Pressed::Memory)),
        recovered: ms(recovered.filter(|_| pressed != Pressed::LocalStorage)),
        recorded: ms(r.records.get(&first.pod).copied()),
    }
}

pub fn figures(r: &RunRecord) -> RunFigures {
    // The pressure: from the first sample below the outermost line to the last one below it.
    let outer = [r.agent_line, r.kubelet_line]
        .into_iter()
        .flatten()
        .reduce(f64::max);
    let below: Vec<i64> = outer
        .map(|line| {
            r.sampled
                .samples
                .iter()
                .filter(|s| s.available < line)
                .map(|s| s.wall_ns)
                .collect()
        })
        .unwrap_or_default();
    let window = match (below.first(), below.last()) {
        (Some(a), Some(b)) => Some((*a, *b + AFTER_PRESSURE_NS)),
        // No line crossed (no line at all: the PID storm under kubeadm; or the kernel acted
        // first): the whole run.
        _ => None,
    };
    let name_of = |uid: &Option<String>| -> String {
        let Some(uid) = uid else {
            return "outside the run's pods".into();
        };
        r.pods
            .iter()
            .chain(r.ballast.iter())
            .find(|(_, u)| u == uid)
            .map_or("outside the run's pods".into(), |(n, _)| n.clone())
    };
    let (mut kills, mut kills_after) = (Vec::new(), 0);
    for k in &r.sampled.oom_kills {
        let inside = window.is_none_or(|(a, b)| k.wall_ns <= b && k.wall_ns >= r.started_ns.min(a));
        if inside {
            kills.push(Kill {
                task: k.task.clone(),
                pod: name_of(&k.pod_uid),
            });
        } else {
            kills_after += 1;
        }
    }
    let count = |by: By| r.decisions.iter().filter(|d| d.by == by).count();
    let wrong = |d: &&Decision| !r.pods.iter().any(|(n, _)| *n == d.pod);
    // A decision on pressure that was gone: the side's signal at or above its line for the
    // whole of the [`OVER_WINDOW_NS`] before it (a side decides on a reading taken a little
    // before it says so). An early decision (ahead of a fast fall) is above the line by
    // design: not one.
    let over = |d: &&Decision| match line_of(r, d.by) {
        Some(line) if r.scenario.pressed() != Pressed::LocalStorage && !d.early => {
            let before: Vec<f64> = r
                .sampled
                .samples
                .iter()
                .filter(|s| s.wall_ns <= d.wall_ns && s.wall_ns >= d.wall_ns - OVER_WINDOW_NS)
                .map(|s| s.available)
                .collect();
            !before.is_empty() && before.iter().all(|v| *v >= line)
        }
        _ => false,
    };
    RunFigures {
        agent: side(r, By::Agent),
        kubelet: side(r, By::Kubelet),
        kills,
        kills_after,
        lowest: r
            .sampled
            .samples
            .iter()
            .map(|s| s.available)
            .reduce(f64::min),
        start: r.start_available,
        agent_decisions: count(By::Agent),
        kubelet_decisions: count(By::Kubelet),
        wrong_victims: r.decisions.iter().filter(wrong).count(),
        over_evictions: r.decisions.iter().filter(over).count(),
        restarts: r.restarts,
    }
}

/// `p50 [lo … hi] / p99 x (n = k)` of the values, ms (seconds beyond 10 s); `—` when none.
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
    let p50 = quantile_ci(values, 0.5).expect("not empty");
    let p99 = quantile_ci(values, 0.99).expect("not empty");
    if values.len() == 1 {
        return format!("{} (n = 1)", fmt(p50.estimate));
    }
    format!(
        "{} [{} … {}] / {} (n = {})",
        fmt(p50.estimate),
        fmt(p50.lo),
        fmt(p50.hi),
        fmt(p99.estimate),
        values.len()
    )
}

/// The side whose figures a cell shows: the agent where it runs, else the kubelet.
fn acting(config: Config) -> By {
    if config.has_agent() {
        By::Agent
    } else {
        By::Kubelet
    }
}

fn of(f: &RunFigures, by: By) -> &SideFigures {
    match by {
        By::Agent => &f.agent,
        By::Kubelet => &f.kubelet,
    }
}

/// The OOM kills of a cell: `total (runs with one)`, and whose processes they took.
fn show_kills(runs: &[RunFigures]) -> String {
    let total: usize = runs.iter().map(|f| f.kills.len()).sum();
    let with = runs.iter().filter(|f| !f.kills.is_empty()).count();
    let mut whose: BTreeMap<String, usize> = BTreeMap::new();
    for k in runs.iter().flat_map(|f| &f.kills) {
        *whose.entry(format!("{} in {}", k.task, k.pod)).or_default() += 1;
    }
    let after: usize = runs.iter().map(|f| f.kills_after).sum();
    let mut text = format!("{total} ({with})");
    if !whose.is_empty() {
        let list: Vec<String> = whose.iter().map(|(w, n)| format!("{n}× {w}")).collect();
        text.push_str(&format!(": {}", list.join(", ")));
    }
    if after > 0 {
        text.push_str(&format!("; {after} after the pressure, not counted"));
    }
    text
}

fn median(values: &[f64]) -> Option<f64> {
    quantile_ci(values, 0.5).map(|c| c.estimate)
}

/// The tables of every cell, and the headline lines.
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
    out.push_str("\n\n**Memory.** Each timing is from the crossing of the acting side's own line (the agent's where it runs, else the kubelet's) on the kubepods cgroup's headroom, as p50 [its 95 % distribution-free interval] / p99 (with fewer than 100 runs, p99 is the largest). The runs start at the same headroom in every configuration (*start*).\n\n");
    out.push_str("| scenario | configuration | runs | start (median) | kernel OOM kills during the pressure (runs with one) | crossing → decision | → victim's growth stopped (its usage falling) | → headroom back above the line | → victim's API record | lowest headroom (median) | decisions: agent / kubelet (wrong victims, over-evictions) | restarts in place | conditions seen |\n");
    out.push_str(
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    let conditions_of = |scenario: Scenario, config: Config| -> String {
        let mut c: Vec<String> = records
            .iter()
            .filter(|r| r.scenario == scenario && r.config == config)
            .flat_map(|r| r.conditions.seen_true.iter().cloned())
            .collect();
        c.sort();
        c.dedup();
        if c.is_empty() {
            "—".into()
        } else {
            c.join(", ")
        }
    };
    for ((scenario, config), runs) in cells
        .iter()
        .filter(|((s, _), _)| s.pressed() == Pressed::Memory)
    {
        let by = acting(*config);
        let pick = |f: fn(&SideFigures) -> Option<f64>| -> Vec<f64> {
            runs.iter().filter_map(|r| f(of(r, by))).collect()
        };
        let starts: Vec<f64> = runs.iter().filter_map(|f| f.start).collect();
        let lowest: Vec<f64> = runs.iter().filter_map(|f| f.lowest).collect();
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} ({}, {}) | {} | {} |\n",
            scenario.label(),
            config.label(),
            runs.len(),
            median(&starts).map_or("—".into(), |m| format!("{m:.0} MiB")),
            show_kills(runs),
            show_ms(&pick(|s| s.decided)),
            show_ms(&pick(|s| s.growth_stopped)),
            show_ms(&pick(|s| s.recovered)),
            show_ms(&pick(|s| s.recorded)),
            median(&lowest).map_or("—".into(), |m| format!("{m:.0} MiB")),
            runs.iter().map(|f| f.agent_decisions).sum::<usize>(),
            runs.iter().map(|f| f.kubelet_decisions).sum::<usize>(),
            runs.iter().map(|f| f.wrong_victims).sum::<usize>(),
            runs.iter().map(|f| f.over_evictions).sum::<usize>(),
            runs.iter().map(|f| f.restarts).sum::<u64>(),
            conditions_of(*scenario, *config),
        ));
    }
    out.push_str("\n**PIDs and disk.** Timings from the crossing of the acting side's line (emptyDir: from the write being done), as above.\n\n");
    out.push_str("| scenario | configuration | runs | kernel OOM kills (runs with one) | crossing → decision: agent | crossing → decision: kubelet | → signal back above the line | lowest signal (median) | decisions: agent / kubelet (wrong victims, over-evictions) | conditions seen |\n");
    out.push_str("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for ((scenario, config), runs) in cells
        .iter()
        .filter(|((s, _), _)| s.pressed() != Pressed::Memory)
    {
        let by = acting(*config);
        let agent: Vec<f64> = runs.iter().filter_map(|f| f.agent.decided).collect();
        let kubelet: Vec<f64> = runs.iter().filter_map(|f| f.kubelet.decided).collect();
        let recovered: Vec<f64> = runs.iter().filter_map(|f| of(f, by).recovered).collect();
        let lowest: Vec<f64> = runs.iter().filter_map(|f| f.lowest).collect();
        let unit = match scenario.pressed() {
            Pressed::Disk => " MiB",
            Pressed::Pids => " PIDs",
            _ => " MiB (kubepods headroom)",
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} / {} ({}, {}) | {} |\n",
            scenario.label(),
            config.label(),
            runs.len(),
            show_kills(runs),
            show_ms(&agent),
            show_ms(&kubelet),
            show_ms(&recovered),
            median(&lowest).map_or("—".into(), |m| format!("{m:.0}{unit}")),
            runs.iter().map(|f| f.agent_decisions).sum::<usize>(),
            runs.iter().map(|f| f.kubelet_decisions).sum::<usize>(),
            runs.iter().map(|f| f.wrong_victims).sum::<usize>(),
            runs.iter().map(|f| f.over_evictions).sum::<usize>(),
            conditions_of(*scenario, *config),
        ));
    }
    out
}

/// The headline: per memory scenario, the runs with a kernel OOM kill for each configuration,
/// and the agent's crossing → headroom back above its line beside the kubelet's (kubeadm).
pub fn headline(records: &[RunRecord]) -> String {
    let mut lines = vec!["**Headline (memory scenarios, each on its own).**".to_string()];
    for scenario in Scenario::ALL
        .into_iter()
        .filter(|s| s.pressed() == Pressed::Memory)
    {
        let of_config = |c: Config| -> Vec<RunFigures> {
            records
                .iter()
                .filter(|r| r.scenario == scenario && r.config == c)
                .map(figures)
                .collect()
        };
        let kills = |c: Config| {
            let runs = of_config(c);
            format!(
                "{}/{}",
                runs.iter().filter(|f| !f.kills.is_empty()).count(),
                runs.len()
            )
        };
        if records.iter().all(|r| r.scenario != scenario) {
            continue;
        }
        let agent = of_config(Config::KubeletAndAgent);
        let kubelet = of_config(Config::KubeletKubeadm);
        let p = |runs: &[RunFigures], by: By, f: fn(&SideFigures) -> Option<f64>| {
            let v: Vec<f64> = runs.iter().filter_map(|r| f(of(r, by))).collect();
            let q = |q: f64| {
                quantile_ci(&v, q).map_or("—".into(), |c| format!("{:.0} ms", c.estimate))
            };
            format!("{} / {} (n = {})", q(0.5), q(0.99), v.len())
        };
        lines.push(format!(
            "- {}: runs with a kernel OOM kill: kubelet (kubeadm) {}, kubelet (agent's thresholds) {}, kubelet + agent {}. Crossing → growth stopped, p50 / p99: the agent {}, the kubelet {}; → headroom back above the line: the agent {}, the kubelet {}.",
            scenario.label(),
            kills(Config::KubeletKubeadm),
            kills(Config::KubeletAgentThresholds),
            kills(Config::KubeletAndAgent),
            p(&agent, By::Agent, |s| s.growth_stopped),
            p(&kubelet, By::Kubelet, |s| s.growth_stopped),
            p(&agent, By::Agent, |s| s.recovered),
            p(&kubelet, By::Kubelet, |s| s.recovered),
        ));
    }
    lines.join("\n")
}

/// `docs/race.svg`: per memory scenario, the kubepods cgroup's headroom against time from its
/// first crossing of [`PICTURE_ORIGIN_MIB`] (above every line, so every configuration shares
/// the origin), the median run of each configuration (by its lowest headroom), each side's
/// decisions (agent ▲, kubelet ●) and the kernel's OOM kills (✕).
pub fn svg(records: &[RunRecord]) -> String {
    let scenarios: Vec<Scenario> = Scenario::ALL
        .into_iter()
        .filter(|s| s.pressed() == Pressed::Memory)
        .filter(|s| records.iter().any(|r| r.scenario == *s))
        .collect();
    let colors = [
        ("#d62728", Config::KubeletKubeadm),
        ("#ff7f0e", Config::KubeletAgentThresholds),
        ("#1f77b4", Config::KubeletAndAgent),
    ];
    let (pw, ph, left, top) = (560.0, 200.0, 70.0, 50.0);
    let height = top + scenarios.len() as f64 * (ph + 60.0) + 60.0;
    let width = left + pw + 260.0;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{left}\" y=\"18\" font-size=\"15\">the kubepods cgroup's headroom (its limit less its working set, MiB) against time from its crossing of {PICTURE_ORIGIN_MIB:.0} MiB,</text>\n<text x=\"{left}\" y=\"36\" font-size=\"15\">the median run of each configuration</text>\n"
    );
    for (row, scenario) in scenarios.iter().enumerate() {
        let y0 = top + row as f64 * (ph + 60.0) + 20.0;
        out.push_str(&format!(
            "<text x=\"{left}\" y=\"{}\" font-weight=\"bold\">{}</text>\n",
            y0 - 6.0,
            scenario.label()
        ));
        let (t_min, t_max) = match scenario {
            Scenario::SlowRamp => (-5.0, 60.0),
            Scenario::ManySmallPods => (-1.0, 10.0),
            _ => (-0.3, 2.0),
        };
        let (v_min, v_max) = (-50.0, 500.0);
        let x = |t: f64| left + (t.clamp(t_min, t_max) - t_min) / (t_max - t_min) * pw;
        let y = |v: f64| y0 + ph - (v.clamp(v_min, v_max) - v_min) / (v_max - v_min) * ph;
        out.push_str(&format!("<rect x=\"{left}\" y=\"{y0}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"#999\"/>\n"));
        for (v, label) in [
            (
                super::run::AGENT_LINE_MIB,
                "agent's line; kubelet's (agent's thresholds)",
            ),
            (
                super::run::KUBELET_LINE_KUBEADM_MIB,
                "kubelet's line (kubeadm)",
            ),
            (0.0, "OOM: the kubepods limit"),
        ] {
            out.push_str(&format!(
                "<line x1=\"{left}\" x2=\"{}\" y1=\"{yy}\" y2=\"{yy}\" stroke=\"#bbb\" stroke-dasharray=\"4 3\"/><text x=\"{}\" y=\"{}\" fill=\"#666\">{label} ({v:.0})</text>\n",
                left + pw,
                left + pw + 4.0,
                y(v) + 4.0,
                yy = y(v)
            ));
        }
        let ticks: Vec<f64> = match scenario {
            Scenario::SlowRamp => vec![0.0, 20.0, 40.0, 60.0],
            Scenario::ManySmallPods => vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0],
            _ => vec![0.0, 0.5, 1.0, 1.5, 2.0],
        };
        for t in ticks {
            out.push_str(&format!(
                "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"#666\">{t} s</text>\n",
                x(t),
                y0 + ph + 14.0
            ));
        }
        for v in [0.0, 200.0, 400.0] {
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
            let mut by_lowest: Vec<(f64, &RunRecord)> = runs
                .iter()
                .map(|r| (figures(r).lowest.unwrap_or(f64::INFINITY), *r))
                .collect();
            by_lowest.sort_by(|a, b| a.0.total_cmp(&b.0));
            let Some((_, r)) = by_lowest.get(by_lowest.len() / 2) else {
                continue;
            };
            let Some(t0) = crossing(r, PICTURE_ORIGIN_MIB) else {
                continue;
            };
            let t = |ns: i64| (ns - t0) as f64 / 1e9;
            let step = (t_max - t_min) / 600.0;
            let mut points = String::new();
            let mut last_t = f64::NEG_INFINITY;
            for s in &r.sampled.samples {
                let ts = t(s.wall_ns);
                if ts < t_min || ts > t_max || ts - last_t < step {
                    continue;
                }
                last_t = ts;
                points.push_str(&format!("{:.1},{:.1} ", x(ts), y(s.available)));
            }
            out.push_str(&format!("<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{points}\"/>\n"));
            for d in &r.decisions {
                let (ex, ey) = (x(t(d.wall_ns)), y(signal_at(r, d.wall_ns).unwrap_or(0.0)));
                match d.by {
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
                let (kx, ky) = (x(t(k.wall_ns)), y(signal_at(r, k.wall_ns).unwrap_or(0.0)));
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
    out.push_str(&format!("<text x=\"{left}\" y=\"{}\">▲ agent's decision   ● kubelet's decision   ✕ kernel OOM kill</text>\n", ly + 24.0));
    out.push_str("</svg>\n");
    out
}
