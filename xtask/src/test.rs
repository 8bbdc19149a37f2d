//! `cargo xtask test`: every test of every crate, then the kernel and end-to-end tests with the
//! agent, its image and the real tools they drive.

use std::time::Instant;

use anyhow::Context as _;

use crate::{
    agent::{agent_with, cargo_with_object, ebpf, workspace_root},
    toolchain::{is_root, run as run_cmd, EbpfToolchain},
};

/// The test that runs the image; it goes last, so its image builds while the others run.
const IMAGE_TEST: &str = "image_container";

/// The kernel and end-to-end test files (tests/tests/*.rs), by name, the image's test last;
/// not the real-cluster tests (`cluster_*`), which `cargo xtask cluster test` runs.
fn kernel_test_files() -> anyhow::Result<Vec<String>> {
    let dir = workspace_root().join("tests/tests");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .flatten()
        .filter_map(|entry| {
            let path = entry.path();
            (path.extension()? == "rs").then(|| path.file_stem()?.to_str().map(str::to_string))?
        })
        .filter(|f| !f.starts_with(crate::cluster::TEST_PREFIX))
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
            .env("HELM", &tools.helm)
            .env("REGISTRY", &tools.registry)
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
