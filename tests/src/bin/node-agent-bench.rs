//! `node-agent-bench`: the benchmark `cargo xtask bench` runs (root required). Prints a
//! markdown table and writes the JSON record and the table to the given files.
//!
//! ```text
//! node-agent-bench --agent PATH [--json FILE] [--markdown FILE] [--markdown-fexit FILE]
//!                  [--import-rows FILE] [--commit REV] [--work-dir DIR] [--quick]
//!                  [--only SECTION]
//! ```
//!
//! `--quick` takes fewer samples (a smoke run); its figures are not for the docs.
//! `--only TEXT` runs the sections whose name contains TEXT. `--import-rows` adds rows measured
//! elsewhere (the VMs' fexit rows, one JSON record a line); `--markdown-fexit` is where their
//! table goes.
//! The binary also runs its own helper processes (`node-agent-bench child ...`), the VMs' part
//! (`node-agent-bench vm-fexit ...`, see `bench::fexit`), and `node-agent-bench probes VARIANT
//! CGROUP_DIR` holds one set of kernel programs loaded (see `bench::overhead::hold`) for
//! measuring a workload by hand.

use std::{
    path::PathBuf,
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use node_agent_tests::bench::{
    cgroups, child, e2e, fexit, footprint, idle, latency, oom, overhead, policy, psi,
    report::{load_average, Machine},
    stress, throughput, Report, Rng, Row,
};

struct Args {
    agent: PathBuf,
    json: Option<PathBuf>,
    markdown: Option<PathBuf>,
    markdown_fexit: Option<PathBuf>,
    import_rows: Option<PathBuf>,
    commit: String,
    work_dir: PathBuf,
    quick: bool,
    /// Only sections whose name contains this text.
    only: Option<String>,
}

const USAGE: &str = "usage: node-agent-bench --agent PATH [--json FILE] [--markdown FILE] \
                     [--markdown-fexit FILE] [--import-rows FILE] [--commit REV] \
                     [--work-dir DIR] [--quick] [--only SECTION]";

fn parse(args: &[String]) -> anyhow::Result<Args> {
    let mut out = Args {
        agent: PathBuf::new(),
        json: None,
        markdown: None,
        markdown_fexit: None,
        import_rows: None,
        commit: "unknown".into(),
        work_dir: PathBuf::from("target/bench"),
        quick: false,
        only: None,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .with_context(|| format!("{flag} needs a value; {USAGE}"))
        };
        match flag.as_str() {
            "--agent" => out.agent = value()?.into(),
            "--json" => out.json = Some(value()?.into()),
            "--markdown" => out.markdown = Some(value()?.into()),
            "--markdown-fexit" => out.markdown_fexit = Some(value()?.into()),
            "--import-rows" => out.import_rows = Some(value()?.into()),
            "--commit" => out.commit = value()?,
            "--work-dir" => out.work_dir = value()?.into(),
            "--quick" => out.quick = true,
            "--only" => out.only = Some(value()?),
            other => anyhow::bail!("unknown argument {other:?}; {USAGE}"),
        }
    }
    anyhow::ensure!(
        !out.agent.as_os_str().is_empty(),
        "--agent is required (the node-agent binary built with its kernel programs); {USAGE}"
    );
    Ok(out)
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let result = if argv.first().map(String::as_str) == Some("child") {
        child::run(&argv[1..])
    } else if argv.first().map(String::as_str) == Some("probes") {
        overhead::hold(&argv[1..])
    } else if argv.first().map(String::as_str) == Some("vm-fexit") {
        fexit::run_in_vm(&argv[1..])
    } else {
        parse(&argv).and_then(|args| bench(&args))
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("node-agent-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn bench(args: &Args) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    anyhow::ensure!(
        unsafe { libc::geteuid() } == 0,
        "the bench loads eBPF programs and creates cgroups: run it as root (`sudo -E cargo xtask bench`)"
    );
    let started = Instant::now();
    let load_start = load_average();
    std::fs::create_dir_all(&args.work_dir)
        .with_context(|| format!("creating {}", args.work_dir.display()))?;
    let stale = cgroups::remove_stale()?;
    if stale > 0 {
        eprintln!("bench: removed {stale} stale node-agent-bench-* cgroups");
    }
    let mut rng = Rng::from_clock();
    let q = args.quick;
    let opts = latency::Options {
        fast: if q { 50 } else { 1000 },
        poll_1s: if q { 3 } else { 20 },
        poll_10s: if q { 1 } else { 3 },
    };
    let mut rows: Vec<Row> = Vec::new();
    let mut failed: Vec<&str> = Vec::new();
    let only = args.only.clone();
    let mut section =
        |name: &'static str, run: &mut dyn FnMut(&mut Vec<Row>) -> anyhow::Result<()>| {
            if only.as_ref().is_some_and(|o| !name.contains(o.as_str())) {
                return;
            }
            eprintln!("bench: {name} …");
            let t = Instant::now();
            if let Err(e) = run(&mut rows) {
                eprintln!("bench: {name} failed: {e:#}");
                rows.push(Row::not_measured(
                    "failed",
                    name,
                    format!("the section failed: {e:#}"),
                ));
                failed.push(name);
            }
            eprintln!("bench: {name} took {:.1} s", t.elapsed().as_secs_f64());
        };
    section("latency: eBPF, eventfd, pollers", &mut |rows| {
        latency::run(rows, &opts, &mut rng)
    });
    section("latency: e2e through node-agent run", &mut |rows| {
        e2e::run(
            rows,
            &args.agent,
            if q { 5 } else { 20 },
            &args.work_dir,
            &mut rng,
        )
    });
    section("latency: OOM kill events", &mut |rows| {
        oom::run(rows, if q { 3 } else { 20 })
    });
    section("latency: PSI trigger", &mut |rows| {
        psi::run(rows, if q { 2 } else { 6 }, &args.work_dir, &mut rng)
    });
    section("probe overhead: loops", &mut |rows| {
        let opts = overhead::Options {
            rounds: if q { 2 } else { 24 },
            spin_rounds: if q { 2 } else { 12 },
            charge_passes: if q { 1 } else { 5 },
        };
        overhead::run(rows, &opts)
    });
    section("probe overhead: stress-ng", &mut |rows| {
        let opts = stress::Options {
            rounds: if q { 2 } else { 20 },
            seconds: 2,
        };
        stress::run(rows, &args.agent, &args.work_dir, &opts)
    });
    section("event throughput", &mut throughput::run);
    let sample = Duration::from_secs(if q { 3 } else { 10 });
    section("footprint: node-agent trace", &mut |rows| {
        footprint::trace(rows, &args.agent, sample, &mut rng)
    });
    section("footprint: daemon in Kubernetes mode", &mut |rows| {
        footprint::kube(rows, &args.agent, &args.work_dir, sample, &mut rng)
    });
    section("footprint: daemon idle", &mut |rows| {
        let opts = idle::Options {
            pairs: if q { 2 } else { 16 },
            window: Duration::from_secs(if q { 2 } else { 5 }),
        };
        idle::daemon(rows, &args.agent, &args.work_dir, &opts)
    });
    section("footprint: wake-up meter check", &mut |rows| {
        let opts = idle::Options {
            pairs: if q { 2 } else { 8 },
            window: Duration::from_secs(if q { 2 } else { 5 }),
        };
        idle::meter(rows, &opts)
    });
    section("policy evaluation", &mut |rows| {
        policy::run(rows, if q { 200 } else { 2000 })
    });

    if let Some(path) = &args.import_rows {
        rows.extend(import(path)?);
    }
    let report = Report {
        machine: Machine::detect(args.commit.clone(), load_start),
        rows,
        duration_s: started.elapsed().as_secs_f64(),
    };
    let (table, fexit) = (report.markdown(), report.markdown_fexit());
    println!("{table}\n{fexit}");
    if let Some(path) = &args.markdown {
        std::fs::write(path, &table).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.markdown_fexit {
        std::fs::write(path, &fexit).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report.json())?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    anyhow::ensure!(failed.is_empty(), "sections failed: {}", failed.join(", "));
    Ok(())
}

/// Rows measured elsewhere, one JSON record a line (`Row::json`).
fn import(path: &std::path::Path) -> anyhow::Result<Vec<Row>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l)
                .with_context(|| format!("{}: a line is not JSON: {l:.80}", path.display()))?;
            Row::from_json(&v).with_context(|| format!("{}: a row", path.display()))
        })
        .collect()
}
