//! `cargo xtask bench`: builds the agent and the bench (release), measures the fexit path
//! inside the VMs (`vm::bench`), runs the bench as root with those rows imported, keeps its
//! JSON record per commit and writes its two tables into `docs/benchmarks.md`.

use std::{path::Path, process::Command};

use anyhow::Context as _;

use crate::{
    agent::{agent, cargo_with_object, ebpf, workspace_root},
    toolchain::{describe, is_root, run as run_cmd, EbpfToolchain},
};

/// Where the results go, relative to the workspace root.
const OUT_DIR: &str = "target/bench";
const DOC: &str = "docs/benchmarks.md";
const BEGIN: &str = "<!-- bench:results:begin -->";
const END: &str = "<!-- bench:results:end -->";
const FEXIT_BEGIN: &str = "<!-- bench:fexit:begin -->";
const FEXIT_END: &str = "<!-- bench:fexit:end -->";

/// Real workloads the bench runs: (program, Debian package).
const BENCH_TOOLS: &[(&str, &str)] = &[("stress-ng", "stress-ng")];

pub fn bench(tc: &EbpfToolchain, quick: bool, vms: bool) -> anyhow::Result<()> {
    install_bench_tools()?;
    let root = workspace_root();
    let agent_bin = agent(tc, true)?;
    let object = ebpf(tc)?;
    let mut build = cargo_with_object(&object, "build");
    build.args([
        "--release",
        "--package",
        "node-agent-tests",
        "--bins",
        "--locked",
    ]);
    run_cmd(&mut build).context("building the bench")?;
    let bench_bin = root.join("target/release/node-agent-bench");

    let out = root.join(OUT_DIR);
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let commit = commit(&root)?;
    let (json, table) = (out.join("latest.json"), out.join("latest.md"));
    let fexit_table = out.join("latest-fexit.md");
    let imported = out.join("vm-rows.jsonl");
    let vm_rows = if vms {
        crate::vm::bench::rows(&object, &bench_bin, crate::vm::bench::Plan::new(quick))?
    } else {
        eprintln!("xtask: --no-vm: the fexit rows are left out");
        Vec::new()
    };
    std::fs::write(&imported, vm_rows.join("\n") + "\n")
        .with_context(|| format!("writing {}", imported.display()))?;
    let mut cmd = if is_root() {
        Command::new(&bench_bin)
    } else {
        eprintln!(
            "xtask: the bench loads kernel programs and creates cgroups; running it through sudo"
        );
        let mut c = Command::new("sudo");
        c.arg(&bench_bin);
        c
    };
    cmd.arg("--agent")
        .arg(&agent_bin)
        .arg("--json")
        .arg(&json)
        .arg("--markdown")
        .arg(&table)
        .arg("--markdown-fexit")
        .arg(&fexit_table)
        .arg("--import-rows")
        .arg(&imported)
        .args(["--commit", &commit])
        .arg("--work-dir")
        .arg(&out)
        .current_dir(&root);
    if quick {
        cmd.arg("--quick");
    }
    let status = cmd
        .status()
        .with_context(|| format!("starting {}", describe(&cmd)))?;
    anyhow::ensure!(
        status.success(),
        "the bench failed ({status}); partial results in {}",
        json.display()
    );
    let kept = out.join(format!("bench-{commit}.json"));
    std::fs::copy(&json, &kept).with_context(|| format!("copying to {}", kept.display()))?;
    eprintln!(
        "xtask: results in {} and {}",
        json.display(),
        kept.display()
    );
    if quick {
        eprintln!("xtask: --quick run: {DOC} left as it was");
        return Ok(());
    }
    let read =
        |p: &Path| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()));
    let doc = root.join(DOC);
    update_doc(&doc, BEGIN, END, &read(&table)?)?;
    if vms {
        update_doc(&doc, FEXIT_BEGIN, FEXIT_END, &read(&fexit_table)?)?;
    }
    eprintln!("xtask: updated {DOC}");
    Ok(())
}

/// Installs the workloads the bench runs when they are missing (Debian packages).
fn install_bench_tools() -> anyhow::Result<()> {
    let on_path = |program: &str| {
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .chain([std::path::PathBuf::from("/usr/bin")])
            .any(|dir| dir.join(program).is_file())
    };
    let missing: Vec<&str> = BENCH_TOOLS
        .iter()
        .filter(|(program, _)| !on_path(program))
        .map(|(_, package)| *package)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    anyhow::ensure!(
        is_root() && Path::new("/usr/bin/apt-get").exists(),
        "the bench runs {}: install it (`apt-get install -y {}`) and run again",
        missing.join(", "),
        missing.join(" ")
    );
    eprintln!("xtask: installing {}", missing.join(", "));
    run_cmd(
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .context("installing the bench's workloads")
}

/// `git rev-parse --short HEAD`, with `-dirty` when tracked files have uncommitted changes.
fn commit(root: &Path) -> anyhow::Result<String> {
    let git = |args: &[&str]| -> anyhow::Result<String> {
        let out = Command::new("git")
            .args(args)
            .current_dir(root)
            .output()
            .with_context(|| format!("running git {}", args.join(" ")))?;
        anyhow::ensure!(out.status.success(), "git {} failed", args.join(" "));
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let head = git(&["rev-parse", "--short", "HEAD"])?;
    let dirty = !git(&["status", "--porcelain", "--untracked-files=no"])?.is_empty();
    Ok(if dirty { format!("{head}-dirty") } else { head })
}

/// Replaces what lies between the markers `begin` and `end` of the doc with `table`.
fn update_doc(doc: &Path, begin: &str, end: &str, table: &str) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(doc).with_context(|| format!("reading {}", doc.display()))?;
    let updated = replace_between(&text, begin, end, table)
        .with_context(|| format!("updating {}", doc.display()))?;
    std::fs::write(doc, updated).with_context(|| format!("writing {}", doc.display()))
}

fn replace_between(text: &str, begin: &str, end: &str, table: &str) -> anyhow::Result<String> {
    let (Some(b), Some(e)) = (text.find(begin), text.find(end)) else {
        anyhow::bail!("the markers {begin} and {end} are missing");
    };
    anyhow::ensure!(b < e, "{begin} must come before {end}");
    Ok(format!(
        "{}{begin}\n{}\n{}",
        &text[..b],
        table.trim_end(),
        &text[e..]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_table_goes_between_its_own_markers() {
        let doc =
            format!("intro\n{BEGIN}\nold\n{END}\nmiddle\n{FEXIT_BEGIN}\nold\n{FEXIT_END}\nend\n");
        let one = replace_between(&doc, BEGIN, END, "main\n").unwrap();
        let two = replace_between(&one, FEXIT_BEGIN, FEXIT_END, "fexit").unwrap();
        assert_eq!(
            two,
            format!(
                "intro\n{BEGIN}\nmain\n{END}\nmiddle\n{FEXIT_BEGIN}\nfexit\n{FEXIT_END}\nend\n"
            )
        );
        assert!(replace_between("no markers", BEGIN, END, "x").is_err());
        assert!(replace_between(&format!("{END}{BEGIN}"), BEGIN, END, "x").is_err());
    }
}
