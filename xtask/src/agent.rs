//! Building, running and testing the agent: eBPF object first, then user space embedding it.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::Context as _;

use crate::toolchain::{describe, is_root, run as run_cmd, EbpfToolchain};

/// The workspace root (xtask lives one level below it).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits inside the workspace")
        .to_path_buf()
}

/// Host cargo: the one that ran `cargo xtask`.
fn cargo() -> Command {
    let mut cmd = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(workspace_root());
    cmd
}

/// Builds the eBPF object (always optimised: unoptimised BPF code rarely passes the verifier).
/// cargo's change tracking makes this a no-op when nothing in `node-agent-ebpf` or
/// `node-agent-common` changed. Returns the object's path.
pub fn ebpf(tc: &EbpfToolchain) -> anyhow::Result<PathBuf> {
    let root = workspace_root();
    let target_dir = root.join("target/ebpf");
    let mut cmd = tc.cargo("build");
    cmd.current_dir(root.join("node-agent-ebpf"))
        .args(["--release", "--locked"])
        .env("CARGO_TARGET_DIR", &target_dir);
    run_cmd(&mut cmd).context("building the eBPF object")?;
    let object = target_dir.join("bpfel-unknown-none/release/node-agent-ebpf");
    anyhow::ensure!(
        object.is_file(),
        "the eBPF build produced no {}",
        object.display()
    );
    Ok(object)
}

/// A host cargo command that embeds the eBPF object.
pub fn cargo_with_object(object: &Path, subcommand: &str) -> Command {
    let mut cmd = cargo();
    cmd.arg(subcommand).env("NODE_AGENT_EBPF_OBJECT", object);
    cmd
}

/// Where [`ebpf`] leaves the object.
fn object_path() -> PathBuf {
    workspace_root().join("target/ebpf/bpfel-unknown-none/release/node-agent-ebpf")
}

/// Builds the eBPF object and `node-agent` embedding it. Returns the agent binary's path.
///
/// With an object from an earlier build, the eBPF build goes first (a second or so when
/// nothing in it changed), so cargo sees whether the object changed before it decides what
/// to rebuild. On a fresh tree (no object yet) both builds go at once: the object's compiler
/// is single-threaded for most of a minute while cargo compiles the agent's dependencies on
/// the other CPU. The agent's build script, which embeds the object, runs early and waits
/// for this process's marker that the object is complete (NODE_AGENT_EBPF_READY).
pub fn agent(tc: &EbpfToolchain, release: bool) -> anyhow::Result<PathBuf> {
    let object = object_path();
    if object.is_file() {
        return agent_with(&ebpf(tc)?, release);
    }
    let dir = workspace_root().join("target/ebpf");
    std::fs::create_dir_all(&dir)?;
    let ready = dir.join(format!("ready-{}", std::process::id()));
    let failed = ready.with_extension("failed");
    eprintln!("xtask: building the eBPF object and the agent's dependencies at once");
    let (agent, object_built) = std::thread::scope(|scope| {
        let built = scope.spawn(|| {
            let result = ebpf(tc);
            let marker = if result.is_ok() { &ready } else { &failed };
            let _ = std::fs::write(marker, b"");
            result
        });
        let agent = agent_built(&object, release, Some(&ready));
        (agent, built.join())
    });
    let _ = std::fs::remove_file(&ready);
    let _ = std::fs::remove_file(&failed);
    let object_built =
        object_built.map_err(|_| anyhow::anyhow!("the eBPF build's thread panicked"))?;
    // The object's own error first: it is why the agent's build script gave up.
    object_built?;
    agent
}

pub fn agent_with(object: &Path, release: bool) -> anyhow::Result<PathBuf> {
    agent_built(object, release, None)
}

/// `cargo build -p node-agent` embedding `object`; with `ready`, its build script waits for
/// that marker (the object is being built beside it).
fn agent_built(object: &Path, release: bool, ready: Option<&Path>) -> anyhow::Result<PathBuf> {
    let mut cmd = cargo_with_object(object, "build");
    cmd.args(["--package", "node-agent", "--locked"]);
    if let Some(ready) = ready {
        cmd.env("NODE_AGENT_EBPF_READY", ready);
    }
    if release {
        cmd.arg("--release");
    }
    run_cmd(&mut cmd).context("building node-agent")?;
    let profile = if release { "release" } else { "debug" };
    Ok(workspace_root()
        .join("target")
        .join(profile)
        .join("node-agent"))
}

/// Builds, then runs the agent as root (through sudo when not root already).
pub fn run(tc: &EbpfToolchain, release: bool, args: &[String]) -> anyhow::Result<()> {
    let binary = agent(tc, release)?;
    let mut cmd = if is_root() {
        Command::new(&binary)
    } else {
        eprintln!("xtask: the agent loads kernel programs; running it through sudo");
        let mut c = Command::new("sudo");
        c.arg("--preserve-env=RUST_LOG").arg(&binary);
        c
    };
    cmd.args(args);
    let status = cmd
        .status()
        .with_context(|| format!("starting {}", describe(&cmd)))?;
    // The agent's own exit code is the answer; pass it on.
    std::process::exit(status.code().unwrap_or(1));
}

/// The test that runs the image; it goes last, so its image builds while the others run.
const IMAGE_TEST: &str = "image_container";

/// The kernel and end-to-end test files (tests/tests/*.rs), by name, the image's test last.
fn kernel_test_files() -> anyhow::Result<Vec<String>> {
    let dir = workspace_root().join("tests/tests");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .flatten()
        .filter_map(|entry| {
            let path = entry.path();
            (path.extension()? == "rs").then(|| path.file_stem()?.to_str().map(str::to_string))?
        })
        .collect();
    files.sort_by_key(|f| (f == IMAGE_TEST, f.clone()));
    Ok(files)
}

/// Every test of every crate: unit tests, doc tests, then the kernel and end-to-end tests
/// (root; they never skip). Each step runs even when an earlier one failed, every test file
/// runs to its end (`--no-fail-fast`), and every test has a time bound (cargo-nextest,
/// `.config/nextest.toml`); the error at the end names every step that failed.
pub fn test(tc: &EbpfToolchain, extra: &[String]) -> anyhow::Result<()> {
    let object = ebpf(tc)?;
    if !is_root() {
        anyhow::bail!(
            "the kernel tests load eBPF programs and create cgroups, so they need root: \
             run `sudo -E cargo xtask test` (plain `cargo test` runs the unprivileged unit tests)"
        );
    }
    let started = Instant::now();
    let tools = crate::tools::for_tests()?;
    // The container test's image builds beside everything else; that test runs last.
    let mut image = crate::image::for_tests(tc)?;
    // The end-to-end tests run the agent binary itself, built with the same object.
    let agent_bin = agent_with(&object, false)?;
    let mut failed = Vec::new();
    let mut took = vec![("test tools and the agent".to_string(), started.elapsed())];

    eprintln!("xtask: unit tests");
    let step = Instant::now();
    let mut unit = cargo_with_object(&object, "nextest");
    unit.args([
        "run",
        "--workspace",
        "--exclude",
        "node-agent-tests",
        "--locked",
        "--no-fail-fast",
        "--no-tests=warn",
        "--",
    ])
    .args(extra);
    if let Err(e) = run_cmd(&mut unit) {
        eprintln!("xtask: unit tests failed: {e:#}");
        failed.push("unit tests".to_string());
    }
    took.push(("unit tests (build and run)".into(), step.elapsed()));

    // nextest does not run doc tests.
    if extra.is_empty() {
        eprintln!("xtask: doc tests");
        let step = Instant::now();
        let mut doc = cargo_with_object(&object, "test");
        doc.args([
            "--doc",
            "--workspace",
            "--exclude",
            "node-agent-tests",
            "--locked",
            "--no-fail-fast",
        ]);
        if let Err(e) = run_cmd(&mut doc) {
            eprintln!("xtask: doc tests failed: {e:#}");
            failed.push("doc tests".to_string());
        }
        took.push(("doc tests".into(), step.elapsed()));
    }

    // One test file at a time, as libtest runs them: the kernel tests size their margins for
    // the other tests of their own file running alongside, not for every file at once.
    for file in kernel_test_files()? {
        eprintln!("xtask: kernel and end-to-end tests: {file} (root, real kernel)");
        let step = Instant::now();
        let image_env = match file.as_str() {
            IMAGE_TEST => match image.wait() {
                Ok(env) => {
                    took.push(("waiting for the image".into(), step.elapsed()));
                    env
                }
                Err(e) => {
                    eprintln!("xtask: {file} cannot run: no image: {e:#}");
                    failed.push(format!("{file} (no image)"));
                    continue;
                }
            },
            _ => Vec::new(),
        };
        let step = Instant::now();
        let mut kernel = cargo_with_object(&object, "nextest");
        kernel
            .args([
                "run",
                "--package",
                "node-agent-tests",
                "--test",
                &file,
                "--locked",
                "--no-fail-fast",
                "--no-tests=warn",
                "--",
            ])
            .args(extra)
            .env("NODE_AGENT_BIN", &agent_bin)
            .env("KUBECTL", &tools.kubectl)
            .env("KUBERNETES_VALIDATE", &tools.kubernetes_validate)
            .env("PROMTOOL", &tools.promtool)
            .env("PROMETHEUS", &tools.prometheus)
            .envs(image_env);
        if let Err(e) = run_cmd(&mut kernel) {
            eprintln!("xtask: {file} failed: {e:#}");
            failed.push(file.clone());
        }
        took.push((file, step.elapsed()));
    }
    eprintln!("xtask: time taken:");
    for (step, d) in &took {
        eprintln!("xtask:   {:>6.1} s  {step}", d.as_secs_f64());
    }

    if !failed.is_empty() {
        anyhow::bail!(
            "failed: {} (each one's failing tests are listed above)",
            failed.join(", ")
        );
    }
    Ok(())
}
