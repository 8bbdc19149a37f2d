//! `cargo xtask cluster bench`: races the real kubelet on the real cluster and writes the
//! tables (docs/benchmarks.md, between the race markers), the picture (docs/race.svg) and every
//! run's record (target/bench/race-<commit>.json). Arguments: `--runs N` (5 by default),
//! `--scenario NAME` and `--config NAME` (repeatable; every one by default), `--out DIR` (the
//! workspace), `--commit SHA`; `--render RECORDS.json|.jsonl` (repeatable) writes the tables
//! and picture again from records (a partial bench's `.partial.jsonl` too), without a cluster.
//!
//! The runs go in rounds: each round runs every scenario once in every configuration, the
//! configurations in a rotated order (so no two runs in a row share one, and each comes first
//! as often), so that a drift of the shared machine falls on every configuration alike.

use std::time::Instant;

use anyhow::Context as _;
use node_agent_tests::{
    race::{report, run::Bench, Config, Scenario},
    real_cluster::RealCluster,
};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut runs = 5usize;
    let mut scenarios = Vec::new();
    let mut configs = Vec::new();
    let mut out = std::path::PathBuf::from(".");
    let mut commit = String::from("unknown");
    let mut render: Vec<String> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--runs" => runs = it.next().context("--runs N")?.parse().context("--runs N")?,
            "--scenario" => {
                let name = it.next().context("--scenario NAME")?;
                scenarios.push(Scenario::parse(name).with_context(|| {
                    format!(
                        "no scenario {name:?}; one of: {}",
                        Scenario::ALL.map(|s| s.name()).join(", ")
                    )
                })?);
            }
            "--config" => {
                let name = it.next().context("--config NAME")?;
                configs.push(Config::parse(name).with_context(|| {
                    format!(
                        "no configuration {name:?}; one of: {}",
                        Config::ALL.map(|c| c.name()).join(", ")
                    )
                })?);
            }
            "--out" => out = it.next().context("--out DIR")?.into(),
            "--commit" => commit = it.next().context("--commit SHA")?.clone(),
            "--render" => render.push(it.next().context("--render RECORDS.json")?.clone()),
            other => anyhow::bail!("unknown argument {other:?}"),
        }
    }
    if !render.is_empty() {
        // The table and the picture again from runs' records (partial ones included), without
        // a cluster. A cell (scenario × configuration) found in a later file replaces that
        // cell's earlier runs: a cell run again after a fix of the bench or the agent.
        let mut records: Vec<node_agent_tests::race::run::RunRecord> = Vec::new();
        for path in &render {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
            // A finished bench's array, or a partial one's line per run.
            let more: Vec<node_agent_tests::race::run::RunRecord> = if path.ends_with(".jsonl") {
                text.lines()
                    .filter(|l| !l.trim().is_empty())
                    .map(serde_json::from_str)
                    .collect::<Result<_, _>>()
            } else {
                serde_json::from_str(&text)
            }
            .with_context(|| format!("{path} is not a bench record"))?;
            records.retain(|r| {
                !more
                    .iter()
                    .any(|m| (m.scenario, m.config) == (r.scenario, r.config))
            });
            records.extend(more);
        }
        let meta = format!(
            "Rendered from {}: {} runs (a cell, scenario × configuration, in a later file replaces its runs in an earlier one).",
            render
                .iter()
                .map(|p| format!("`{}`", std::path::Path::new(p).file_name().map_or(p.clone(), |f| f.to_string_lossy().into_owned())))
                .collect::<Vec<_>>()
                .join(", "),
            records.len()
        );
        return write_outputs(&out, &records, &meta);
    }
    if scenarios.is_empty() {
        scenarios = Scenario::ALL.to_vec();
    }
    if configs.is_empty() {
        configs = Config::ALL.to_vec();
    }
    let rc = RealCluster::get();
    let mut bench = Bench::new(&rc);
    bench.prepare()?;
    let started = Instant::now();
    let load = || std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load_at_start = load();
    let mut records = Vec::new();
    let mut turn = 0usize;
    for round in 0..runs {
        for scenario in &scenarios {
            // Rotated: every configuration comes first as often, and consecutive runs differ.
            let order: Vec<Config> = (0..configs.len())
                .map(|i| configs[(i + turn) % configs.len()])
                .collect();
            turn += 1;
            for config in order {
                match bench.run(*scenario, config, round) {
                    Ok(r) => {
                        // Kept after every run, one line each: a bench ended early still
                        // leaves what it saw.
                        append(&out, &format!("race-{commit}.partial.jsonl"), &r)?;
                        records.push(r);
                    }
                    Err(e) => eprintln!(
                        "race: {} / {} round {round} failed: {e:#}",
                        scenario.name(),
                        config.label()
                    ),
                }
            }
        }
    }
    let meta = format!(
        "Run of {} at commit `{}`: {} runs in rounds, the configurations interleaved run by run; load average at the start {}, at the end {}; the bench took {:.0} min. Kubernetes v1.37.2 (kubelet, API server), containerd 1.6.20, kernel {}, memory on cgroup v1; the agent's memory mechanism on this host: the in-kernel sampler (this host refuses fexit); hard evictions carried out on the node.",
        jiff::Timestamp::now(),
        &commit[..commit.len().min(7)],
        records.len(),
        load_at_start.split_whitespace().take(3).collect::<Vec<_>>().join(" / "),
        load().split_whitespace().take(3).collect::<Vec<_>>().join(" / "),
        started.elapsed().as_secs_f64() / 60.0,
        std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
    );
    save(&out, &format!("race-{commit}.json"), &records)?;
    let _ = std::fs::remove_file(out.join(format!("target/bench/race-{commit}.partial.jsonl")));
    write_outputs(&out, &records, &meta)
}

/// The table between docs/benchmarks.md's race markers (also printed) and docs/race.svg.
fn write_outputs(
    out: &std::path::Path,
    records: &[node_agent_tests::race::run::RunRecord],
    meta: &str,
) -> anyhow::Result<()> {
    let table = report::markdown(records, meta);
    println!("{table}");
    std::fs::write(out.join("docs/race.svg"), report::svg(records))?;
    let doc_path = out.join("docs/benchmarks.md");
    let doc = std::fs::read_to_string(&doc_path)?;
    let (begin, end) = ("<!-- race:results:begin -->", "<!-- race:results:end -->");
    let (head, rest) = doc
        .split_once(begin)
        .context("docs/benchmarks.md has no race markers")?;
    let (_, tail) = rest
        .split_once(end)
        .context("docs/benchmarks.md has no race end marker")?;
    std::fs::write(&doc_path, format!("{head}{begin}\n{table}\n![allocatableMemory.available against time, each side's evictions and the OOM kills](race.svg)\n{end}{tail}"))?;
    Ok(())
}

/// Writes the runs' records to `target/bench/<name>` under `out`.
fn save(
    out: &std::path::Path,
    name: &str,
    records: &[node_agent_tests::race::run::RunRecord],
) -> anyhow::Result<()> {
    let dir = out.join("target/bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join(name), serde_json::to_vec_pretty(records)?)
        .with_context(|| format!("writing {}", dir.join(name).display()))
}

/// Appends one run's record as a line to `target/bench/<name>` under `out`.
fn append(
    out: &std::path::Path,
    name: &str,
    record: &node_agent_tests::race::run::RunRecord,
) -> anyhow::Result<()> {
    use std::io::Write as _;
    let dir = out.join("target/bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(name);
    let mut line = serde_json::to_vec(record)?;
    line.push(b'\n');
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(&line))
        .with_context(|| format!("appending to {}", path.display()))
}
