//! Building and running the agent: eBPF object first, then user space embedding it.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
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
