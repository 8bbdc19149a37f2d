//! Embeds the eBPF object that `cargo xtask build` produced.
//!
//! xtask builds `node-agent-ebpf` first (cargo's own change tracking rebuilds it when any of its
//! sources change) and passes the object's path in `NODE_AGENT_EBPF_OBJECT`. This script re-runs
//! whenever that variable or the object itself changes, so a stale object is never embedded.
//!
//! A plain `cargo build` sets no path: the agent is then built without kernel programs, and any
//! command that needs them says so at run time. That keeps `cargo build`/`cargo test` working on
//! machines without the eBPF toolchain.
//!
//! It also records the commit the agent is built from (`node-agent --version`,
//! `node_agent_build_info{commit}`): `NODE_AGENT_GIT_COMMIT` when set (a build from a source
//! archive), else what git says HEAD is; with neither, the version says so.

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=NODE_AGENT_EBPF_OBJECT");
    rustc_version();
    commit();
    println!("cargo::rustc-check-cfg=cfg(node_agent_ebpf)");
    let out = PathBuf::from(env::var("OUT_DIR")?).join("node-agent-ebpf.o");
    match env::var_os("NODE_AGENT_EBPF_OBJECT") {
        Some(path) => {
            let path = PathBuf::from(path);
            wait_for_object()?;
            println!("cargo:rerun-if-changed={}", path.display());
            fs::copy(&path, &out)
                .map_err(|e| anyhow::anyhow!("NODE_AGENT_EBPF_OBJECT={}: {e}", path.display()))?;
            println!("cargo:rustc-cfg=node_agent_ebpf");
        }
        None => {
            println!(
                "cargo:warning=building node-agent without kernel programs; `cargo xtask build` embeds them"
            );
            fs::write(&out, b"")?;
        }
    }
    Ok(())
}

/// `cargo xtask` may build the object while cargo compiles the agent's dependencies; it then
/// names a marker in NODE_AGENT_EBPF_READY that it creates once the object is complete (or
/// `<marker>.failed` when its build failed). Not a rerun trigger: only when to read.
fn wait_for_object() -> anyhow::Result<()> {
    let Some(ready) = env::var_os("NODE_AGENT_EBPF_READY").map(PathBuf::from) else {
        return Ok(());
    };
    let failed = ready.with_extension("failed");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30 * 60);
    while !ready.exists() {
        anyhow::ensure!(
            !failed.exists(),
            "the eBPF object's build failed (its error is above)"
        );
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "no eBPF object after 30 minutes ({} never appeared)",
            ready.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    Ok(())
}

/// The compiler's version (`rustc 1.89.0 (…)` → `1.89.0`) for `node_agent_build_info`, or
/// `unknown` when cargo's `RUSTC` cannot say.
fn rustc_version() {
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let version = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| {
            let text = String::from_utf8(out.stdout).ok()?;
            text.split_whitespace().nth(1).map(str::to_owned)
        })
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=NODE_AGENT_RUSTC={version}");
}

/// The commit as `NODE_AGENT_COMMIT` (40 hex digits, or a sentence saying why there is none).
/// The script re-runs when HEAD moves: a commit, a checkout, a fetch that updates packed refs.
fn commit() {
    println!("cargo:rerun-if-env-changed=NODE_AGENT_GIT_COMMIT");
    let given = env::var("NODE_AGENT_GIT_COMMIT")
        .ok()
        .map(|c| c.trim().to_string())
        .filter(|c| !c.is_empty());
    let commit = match given {
        Some(commit) => commit,
        None => {
            let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
            match git(&manifest, &["rev-parse", "--verify", "HEAD"]) {
                Some(commit) => {
                    watch_head(&manifest);
                    commit
                }
                None => "unknown: not built from a git checkout, and NODE_AGENT_GIT_COMMIT not set"
                    .to_string(),
            }
        }
    };
    println!("cargo:rustc-env=NODE_AGENT_COMMIT={commit}");
}

/// `git ARGS` in `dir`: its output's first line, or `None` when git is missing or says no.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()
        .filter(|out| out.status.success())?;
    let text = String::from_utf8(out.stdout).ok()?;
    let line = text.lines().next()?.trim().to_string();
    (!line.is_empty()).then_some(line)
}

/// Re-runs this script when HEAD or the branch it names moves (worktrees included: HEAD is in
/// the worktree's git dir, branches in the common one).
fn watch_head(manifest: &Path) {
    let absolute = |p: String| {
        let p = PathBuf::from(p);
        if p.is_absolute() {
            p
        } else {
            manifest.join(p)
        }
    };
    let Some(git_dir) = git(manifest, &["rev-parse", "--git-dir"]).map(absolute) else {
        return;
    };
    let common = git(manifest, &["rev-parse", "--git-common-dir"])
        .map(absolute)
        .unwrap_or_else(|| git_dir.clone());
    let mut watched = vec![git_dir.join("HEAD"), common.join("packed-refs")];
    if let Some(branch) = git(manifest, &["symbolic-ref", "-q", "HEAD"]) {
        watched.push(common.join(branch));
    }
    for path in watched.iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}
