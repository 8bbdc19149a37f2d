//! `cargo xtask cluster load`: one agent's requests to the API server beside its node's
//! kubelet's, phase by phase, on the real cluster (the method: `node_agent_tests::load`).
//! Arguments: `--minutes M` (each phase at least this long; 3 by default), `--out DIR` (the
//! workspace: writes target/bench/load-<commit>.json), `--commit SHA`.

use anyhow::Context as _;
use node_agent_tests::{load, real_cluster::RealCluster};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut minutes = 3.0f64;
    let mut out = std::path::PathBuf::from(".");
    let mut commit = String::from("unknown");
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--minutes" => {
                minutes = it
                    .next()
                    .context("--minutes M")?
                    .parse()
                    .context("--minutes M: a number of minutes")?;
                anyhow::ensure!(
                    minutes.is_finite() && (0.5..=60.0).contains(&minutes),
                    "--minutes {minutes}: between 0.5 and 60"
                );
            }
            "--out" => out = it.next().context("--out DIR")?.into(),
            "--commit" => commit = it.next().context("--commit SHA")?.clone(),
            other => anyhow::bail!(
                "unknown argument {other:?}: control-plane-load [--minutes M] [--out DIR] [--commit SHA]"
            ),
        }
    }
    let rc = RealCluster::get();
    let phases = load::run(&rc, minutes)?;
    println!("{}", load::table(&phases));
    let dir = out.join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let file = dir.join(format!("load-{commit}.json"));
    std::fs::write(&file, serde_json::to_vec_pretty(&phases)?)
        .with_context(|| format!("writing {}", file.display()))?;
    eprintln!("load: written {}", file.display());
    Ok(())
}
