//! rustfmt and clippy (warnings denied) over every crate, the eBPF one included.

use anyhow::Context as _;

use crate::{
    agent::{cargo_with_object, ebpf, workspace_root},
    toolchain::{run, EbpfToolchain},
};

pub fn all(tc: &EbpfToolchain) -> anyhow::Result<()> {
    let root = workspace_root();
    let object = ebpf(tc)?;

    run(cargo_with_object(&object, "fmt").args(["--all", "--", "--check"]))
        .context("rustfmt: run `cargo fmt --all` (and for the eBPF crate `rustfmt node-agent-ebpf/src/main.rs`)")?;
    // `cargo fmt` would read the eBPF crate's unstable build config; rustfmt itself follows `mod`s.
    run(std::process::Command::new("rustfmt")
        .args(["--check", "--edition", "2021"])
        .arg(root.join("node-agent-ebpf/src/main.rs")))
    .context("rustfmt on node-agent-ebpf")?;
    // The fuzz targets are their own workspace (built by `cargo xtask fuzz`, which also
    // compiles them): formatting is checked here.
    let mut fuzz_targets: Vec<_> = std::fs::read_dir(root.join("fuzz/fuzz_targets"))
        .context("listing fuzz/fuzz_targets")?
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "rs"))
        .collect();
    fuzz_targets.sort();
    run(std::process::Command::new("rustfmt")
        .args(["--check", "--edition", "2021"])
        .args(&fuzz_targets))
    .context("rustfmt on fuzz/fuzz_targets")?;

    run(cargo_with_object(&object, "clippy").args([
        "--workspace",
        "--all-targets",
        "--locked",
        "--",
        "-D",
        "warnings",
    ]))
    .context("clippy")?;

    let mut ebpf_clippy = tc.cargo("clippy");
    ebpf_clippy
        .current_dir(root.join("node-agent-ebpf"))
        .args(["--release", "--locked", "--", "-D", "warnings"])
        .env("CARGO_TARGET_DIR", root.join("target/ebpf-clippy"));
    run(&mut ebpf_clippy).context("clippy on node-agent-ebpf")?;
    Ok(())
}
