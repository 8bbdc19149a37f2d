//! `cargo xtask fuzz`: builds the cargo-fuzz targets in fuzz/ and runs each for a bounded time.
//!
//! The route that works with the machine's stable toolchain: cargo-fuzz from crates.io, and
//! `RUSTC_BOOTSTRAP=1` so that stable rustc accepts the `-Z` flags cargo-fuzz passes for a
//! sanitizer. By default no sanitizer is used: the parsers are safe Rust, the instrumented
//! build of the agent's dependencies is several times quicker without AddressSanitizer, and
//! what is looked for (panics, overflows with debug assertions on, hangs) needs none;
//! `--sanitizer address` adds it.
//!
//! Each target reads its committed corpus (fuzz/corpus/<target>, seeded from the test
//! fixtures) and writes what it finds to target/fuzz/corpus/<target>, so a run leaves the
//! repository untouched; a crash is written to target/fuzz/artifacts/<target>/ and fails the
//! run, naming the file and the command that replays it.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};

use crate::{agent::workspace_root, toolchain::describe};

/// Past `--seconds`, a target gets this much longer (start-up, the final corpus merge) before
/// it is killed and counted as hung.
const GRACE: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Sanitizer {
    None,
    Address,
}

impl Sanitizer {
    fn flag(self) -> &'static str {
        match self {
            Sanitizer::None => "none",
            Sanitizer::Address => "address",
        }
    }
}

fn cargo_fuzz(root: &Path, subcommand: &str, sanitizer: Sanitizer) -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(root)
        .args([
            "fuzz",
            subcommand,
            "--fuzz-dir",
            "fuzz",
            "--target-dir",
            "target/fuzz",
        ])
        .args(["-O", "--debug-assertions", "--sanitizer", sanitizer.flag()])
        // cargo-fuzz's default of 1 makes the instrumented build of the agent's dependencies
        // several times slower; runs are bounded by time, so build time counts more.
        .args(["--codegen-units", "16"])
        .env("RUSTC_BOOTSTRAP", "1");
    cmd
}

/// The targets named in fuzz/Cargo.toml, in file order.
fn targets(root: &Path) -> anyhow::Result<Vec<String>> {
    let manifest = root.join("fuzz/Cargo.toml");
    let text = std::fs::read_to_string(&manifest)
        .with_context(|| format!("reading {}", manifest.display()))?;
    let mut names = Vec::new();
    let mut in_bin = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_bin = line == "[[bin]]";
        } else if let Some(value) = line.strip_prefix("name = ").filter(|_| in_bin) {
            names.push(value.trim_matches('"').to_string());
        }
    }
    anyhow::ensure!(
        !names.is_empty(),
        "{} lists no [[bin]] targets",
        manifest.display()
    );
    Ok(names)
}

pub fn fuzz(seconds: u64, only: &[String], sanitizer: Sanitizer) -> anyhow::Result<()> {
    crate::tools::cargo_fuzz()?;
    let root = workspace_root();
    let all = targets(&root)?;
    let chosen: Vec<String> = if only.is_empty() {
        all.clone()
    } else {
        for name in only {
            anyhow::ensure!(
                all.contains(name),
                "no fuzz target {name:?}; targets: {}",
                all.join(", ")
            );
        }
        only.to_vec()
    };

    eprintln!("xtask: building the fuzz targets (instrumented, release with debug assertions)");
    let mut build = cargo_fuzz(&root, "build", sanitizer);
    crate::toolchain::run(&mut build).context("building the fuzz targets")?;

    let mut failed = Vec::new();
    for target in &chosen {
        eprintln!("xtask: fuzzing {target} for {seconds} s");
        let seeds = root.join("fuzz/corpus").join(target);
        let work = root.join("target/fuzz/corpus").join(target);
        let artifacts = root.join("target/fuzz/artifacts").join(target);
        for dir in [&work, &artifacts] {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        anyhow::ensure!(seeds.is_dir(), "no seed corpus at {}", seeds.display());
        let before = crash_files(&artifacts);
        let mut run = cargo_fuzz(&root, "run", sanitizer);
        run.arg(target)
            .arg(&work)
            .arg(&seeds)
            .arg("--")
            .arg(format!("-max_total_time={seconds}"))
            .arg(format!("-artifact_prefix={}/", artifacts.display()))
            // One input taking this long is a hang, reported like a crash.
            .arg("-timeout=10")
            .arg("-rss_limit_mb=2048")
            .arg("-print_final_stats=1");
        match run_bounded(&mut run, Duration::from_secs(seconds) + GRACE) {
            Ok(()) => {}
            Err(e) => {
                let found: Vec<PathBuf> = crash_files(&artifacts)
                    .into_iter()
                    .filter(|f| !before.contains(f))
                    .collect();
                eprintln!("xtask: fuzz target {target} failed: {e:#}");
                for file in &found {
                    eprintln!(
                        "xtask:   replay with: RUSTC_BOOTSTRAP=1 cargo fuzz run --fuzz-dir fuzz --target-dir target/fuzz -O --debug-assertions --codegen-units 16 --sanitizer {} {target} {}",
                        sanitizer.flag(),
                        file.display()
                    );
                }
                failed.push(target.clone());
            }
        }
    }
    if !failed.is_empty() {
        bail!("fuzzing found failures in: {}", failed.join(", "));
    }
    eprintln!(
        "xtask: {} fuzz targets ran {seconds} s each without a failure",
        chosen.len()
    );
    Ok(())
}

fn crash_files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// Runs `cmd` with inherited output; kills it (and its children, in their own process group)
/// past `limit`.
fn run_bounded(cmd: &mut Command, limit: Duration) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt as _;
    let shown = describe(cmd);
    let mut child = cmd
        .stdin(Stdio::null())
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {shown}"))?;
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait()? {
            if status.success() {
                return Ok(());
            }
            bail!("{shown} failed ({status})");
        }
        if Instant::now() > deadline {
            let pgid = i32::try_from(child.id()).context("pid")?;
            // SAFETY: signals the process group this function created.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
            let _ = child.wait();
            bail!("{shown} still running after {limit:?}: killed");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
