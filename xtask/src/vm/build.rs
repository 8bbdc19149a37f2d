//! What the VM runs, built on the host: the eBPF object, the agent, and the binaries of the
//! `node-agent-tests` package (test binaries and helpers), found through cargo's JSON messages.

use std::{
    io::BufRead as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{bail, Context as _};

use crate::{
    agent::{agent_with, cargo_with_object, ebpf},
    toolchain::{describe, EbpfToolchain},
};

/// Host paths of everything the initramfs holds besides busybox.
pub struct Built {
    pub object: PathBuf,
    pub agent: PathBuf,
    /// Integration test binaries: (target name, path), e.g. `kernel_memory`.
    pub tests: Vec<(String, PathBuf)>,
    /// Binary targets: (name, path), e.g. `mem-helper`.
    pub bins: Vec<(String, PathBuf)>,
}

/// Builds the same debug binaries `cargo xtask test` builds (a cache hit after it).
pub fn build(tc: &EbpfToolchain) -> anyhow::Result<Built> {
    let object = ebpf(tc)?;
    let agent = agent_with(&object, false)?;
    let mut cmd = cargo_with_object(&object, "test");
    cmd.args([
        "--package",
        "node-agent-tests",
        "--locked",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ])
    .stdout(Stdio::piped());
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", describe(&cmd)))?;
    let stdout = child.stdout.take().context("cargo's stdout")?;
    let mut tests = Vec::new();
    let mut bins = Vec::new();
    for line in std::io::BufReader::new(stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(&line?) else {
            continue;
        };
        if let Some((kind, name, path)) = artifact(&message) {
            match kind.as_str() {
                "test" => tests.push((name, path)),
                "bin" => bins.push((name, path)),
                _ => {}
            }
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("building the tests failed: {} ({status})", describe(&cmd));
    }
    if tests.is_empty() {
        bail!("cargo built no test binaries for node-agent-tests");
    }
    tests.sort();
    bins.sort();
    Ok(Built {
        object,
        agent,
        tests,
        bins,
    })
}

/// (target kind, target name, executable) of a `compiler-artifact` message with an executable.
fn artifact(message: &serde_json::Value) -> Option<(String, String, PathBuf)> {
    if message["reason"] != "compiler-artifact" {
        return None;
    }
    let path = PathBuf::from(message["executable"].as_str()?);
    let target = &message["target"];
    let kind = target["kind"].as_array()?.first()?.as_str()?.to_string();
    // A binary target is also built as its own unit-test harness: not the one the tests run.
    if kind == "bin" && message["profile"]["test"] != false {
        return None;
    }
    let name = target["name"].as_str()?.to_string();
    Some((kind, name, path))
}

/// The tests a libtest binary holds (`--list`), without running any.
pub fn list_tests(binary: &Path) -> anyhow::Result<Vec<String>> {
    let out = Command::new(binary)
        .args(["--list", "--format", "terse"])
        .output()
        .with_context(|| format!("listing the tests of {}", binary.display()))?;
    if !out.status.success() {
        bail!(
            "{} --list failed: {}",
            binary.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(parse_list(&String::from_utf8_lossy(&out.stdout)))
}

fn parse_list(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(String::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_target_artifact_gives_its_name_and_executable() {
        let message = serde_json::json!({
            "reason": "compiler-artifact",
            "target": {"kind": ["test"], "name": "kernel_memory"},
            "profile": {"test": true},
            "executable": "/t/debug/deps/kernel_memory-0123"
        });
        assert_eq!(
            artifact(&message),
            Some((
                "test".into(),
                "kernel_memory".into(),
                PathBuf::from("/t/debug/deps/kernel_memory-0123")
            ))
        );
        let library = serde_json::json!({
            "reason": "compiler-artifact",
            "target": {"kind": ["lib"], "name": "node_agent_tests"},
            "executable": null
        });
        assert_eq!(artifact(&library), None);
        let helper = |test: bool| {
            serde_json::json!({
                "reason": "compiler-artifact",
                "target": {"kind": ["bin"], "name": "mem-helper"},
                "profile": {"test": test},
                "executable": "/t/debug/mem-helper"
            })
        };
        assert!(artifact(&helper(false)).is_some());
        assert_eq!(
            artifact(&helper(true)),
            None,
            "the helper's own unit-test harness"
        );
    }

    #[test]
    fn list_output_gives_the_test_names_only() {
        let text = "an_oom: test\nsome_bench: bench\npid_available: test\n";
        assert_eq!(parse_list(text), ["an_oom", "pid_available"]);
    }
}
