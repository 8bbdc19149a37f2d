//! Embeds the eBPF object that `cargo xtask build` produced.
//!
//! xtask builds `node-agent-ebpf` first (cargo's own change tracking rebuilds it when any of its
//! sources change) and passes the object's path in `NODE_AGENT_EBPF_OBJECT`. This script re-runs
//! whenever that variable or the object itself changes, so a stale object is never embedded.
//!
//! A plain `cargo build` sets no path: the agent is then built without kernel programs, and any
//! command that needs them says so at run time. That keeps `cargo build`/`cargo test` working on
//! machines without the eBPF toolchain.

use std::{env, fs, path::PathBuf};

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=NODE_AGENT_EBPF_OBJECT");
    rustc_version();
    println!("cargo::rustc-check-cfg=cfg(node_agent_ebpf)");
    let out = PathBuf::from(env::var("OUT_DIR")?).join("node-agent-ebpf.o");
    match env::var_os("NODE_AGENT_EBPF_OBJECT") {
        Some(path) => {
            let path = PathBuf::from(path);
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
