//! `cargo xtask cluster`: a real Kubernetes on this machine (the `node-agent-cluster` crate,
//! `cluster/`), and the real-cluster tests (`tests/tests/cluster_*.rs`).

use std::{path::PathBuf, time::Instant};

use anyhow::Context as _;
use clap::{Args, Subcommand};
use node_agent_cluster::{
    compile, down::HostSnapshot, images::Archive, node_components::KubeletOptions, Cluster,
    UpOptions,
};

use crate::{
    agent::{cargo_with_object, ebpf, workspace_root},
    toolchain::{is_root, run as run_cmd, EbpfToolchain},
};

/// The real-cluster test files: `tests/tests/cluster_*.rs`. `cluster_lifecycle` goes last: it
/// ends the cluster and compares the host with how `up` found it.
pub const TEST_PREFIX: &str = "cluster_";
const LIFECYCLE_TEST: &str = "cluster_lifecycle";

#[derive(Debug, Args)]
pub struct ClusterArgs {
    #[command(subcommand)]
    command: ClusterCommand,
}

#[derive(Debug, Subcommand)]
enum ClusterCommand {
    /// Builds kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, kubelet,
    /// kubectl and etcd from their Go modules at the release cluster/go/go.mod pins, into
    /// target/cluster/bin (seconds when nothing changed).
    Build,
    /// Writes cluster/go/go.mod for another Kubernetes release, its replace lines generated
    /// from that release's own go.mod, and go.sum by `go mod tidy`.
    Pin {
        /// A release such as v1.37.2.
        version: String,
    },
    /// One node (and --extra-nodes more) set up as kubeadm sets one up, then the agent's image
    /// imported and deploy/ applied through cluster/overlay (in dry run); ends with the node
    /// and the agent's pod Ready. Cleans up what an earlier run left first.
    Up {
        /// Nodes besides the first, each in namespaces of its own.
        #[arg(long, default_value_t = 0)]
        extra_nodes: u8,
        /// The cluster alone, without the agent.
        #[arg(long)]
        no_agent: bool,
    },
    /// Ends the cluster: every process, mount, cgroup and namespace it made.
    Down,
    /// What runs, the nodes and the agent's pods.
    Status,
    /// Races the real kubelet (docs/benchmarks.md, "Racing the kubelet on a real node"): every
    /// scenario in every configuration, interleaved run by run, writes the tables,
    /// docs/race.svg and target/bench/race-<commit>.json. Brings a one-node cluster up (or
    /// uses the one that is up with --reuse) and ends it after.
    Bench {
        /// Runs per cell: rounds, each running every scenario in every configuration.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Only these scenarios (slow-ramp, fast-ramp, fastest-ramp, burst, many-small-pods,
        /// ignores-sigterm, fork-storm, disk-fill, emptydir-over-limit).
        #[arg(long = "scenario")]
        scenarios: Vec<String>,
        /// Only these configurations (kubelet-kubeadm, kubelet-agent-thresholds,
        /// kubelet-and-agent): a cell run again after a change to the agent.
        #[arg(long = "config")]
        configs: Vec<String>,
        /// Use the cluster that is up, and leave it up.
        #[arg(long)]
        reuse: bool,
    },
    /// One agent's requests to the API server beside its node's kubelet's, phase by phase
    /// (idle, under pressure, 100 pods churned, an API server restart, the agent's rollout),
    /// from the audit log (tests/src/load.rs says the method); writes
    /// target/bench/load-<commit>.json. Brings a one-node cluster up (or uses the one that is up
    /// with --reuse) and ends it after.
    Load {
        /// Each phase at least this many minutes.
        #[arg(long, default_value_t = 3.0)]
        minutes: f64,
        /// Use the cluster that is up, and leave it up.
        #[arg(long)]
        reuse: bool,
    },
    /// Brings a cluster of two nodes up, runs the real-cluster tests (tests/tests/cluster_*.rs) against
    /// it, then ends it and checks the host is as it was.
    Test {
        /// Only these test files (e.g. cluster_memory); default: every cluster_* file.
        #[arg(long = "file")]
        files: Vec<String>,
        /// Run against the cluster that is up (bring one up if none is), and leave it up: for
        /// working on one test. The lifecycle test, which ends the cluster, is left out.
        #[arg(long)]
        reuse: bool,
        /// Extra arguments for the test binaries, e.g. a test name filter.
        #[arg(last = true)]
        args: Vec<String>,
    },
}

fn cluster() -> Cluster {
    Cluster::new(workspace_root())
}

pub fn run(args: &ClusterArgs) -> anyhow::Result<()> {
    let root = workspace_root();
    match &args.command {
        ClusterCommand::Build => {
            let started = Instant::now();
            let c = cluster();
            compile::build(&root.join("cluster/go"), &c.layout.bin())?;
            eprintln!(
                "xtask: cluster build took {:.1} s",
                started.elapsed().as_secs_f64()
            );
            Ok(())
        }
        ClusterCommand::Pin { version } => compile::pin(&root.join("cluster/go"), version),
        ClusterCommand::Up {
            extra_nodes,
            no_agent,
        } => {
            let tc = crate::toolchain::setup()?;
            up(&tc, *extra_nodes, !*no_agent).map(drop)
        }
        ClusterCommand::Down => {
            let started = Instant::now();
            cluster().down()?;
            eprintln!(
                "xtask: cluster down in {:.1} s",
                started.elapsed().as_secs_f64()
            );
            Ok(())
        }
        ClusterCommand::Status => status(),
        ClusterCommand::Bench {
            runs,
            scenarios,
            configs,
            reuse,
        } => {
            let tc = crate::toolchain::setup()?;
            bench(&tc, *runs, scenarios, configs, *reuse)
        }
        ClusterCommand::Load { minutes, reuse } => {
            let tc = crate::toolchain::setup()?;
            load(&tc, *minutes, *reuse)
        }
        ClusterCommand::Test { files, reuse, args } => {
            let tc = crate::toolchain::setup()?;
            test(&tc, files, *reuse, args)
        }
    }
}

/// Installs what the cluster needs on this host (Debian packages), then brings it up.
fn up(
    tc: &EbpfToolchain,
    extra_nodes: u8,
    agent: bool,
) -> anyhow::Result<(Cluster, Option<Archive>)> {
    if !is_root() {
        anyhow::bail!("the cluster needs root (namespaces, mounts, cgroups): run `sudo -E cargo xtask cluster up`");
    }
    crate::image::setup_runtime()?;
    let missing = node_agent_cluster::up::missing_packages();
    if !missing.is_empty() {
        crate::toolchain::apt_install(&missing)?;
    }
    let agent_image = if agent {
        let image = crate::image::image(tc)?;
        Some(Archive {
            reference: image.reference,
            path: image.archive,
        })
    } else {
        None
    };
    let c = cluster();
    c.up(&UpOptions {
        extra_nodes,
        kubelet: KubeletOptions::default(),
        agent_image: agent_image.clone(),
    })?;
    Ok((c, agent_image))
}

fn status() -> anyhow::Result<()> {
    let c = cluster();
    let state = node_agent_cluster::state::State::load(&c.layout.state())?;
    let Some(state) = state else {
        println!(
            "no cluster is up ({} has no state file)",
            c.layout.dir.display()
        );
        return Ok(());
    };
    println!("processes:");
    let mut all_running = true;
    for p in &state.processes {
        let running = p.is_running();
        all_running &= running;
        println!(
            "  {:<32} pid {:<8} {}",
            p.name,
            p.pid,
            if running { "running" } else { "NOT RUNNING" }
        );
    }
    let kubectl = c.kubectl();
    match kubectl.run(&["get", "nodes", "-o", "wide"]) {
        Ok(text) => println!("{text}"),
        Err(e) => println!("nodes: {e:#}"),
    }
    match kubectl.run(&["-n", "node-agent", "get", "daemonsets,pods", "-o", "wide"]) {
        Ok(text) => println!("{text}"),
        Err(e) => println!("agent: {e:#}"),
    }
    println!(
        "kubectl: {} --kubeconfig {}",
        c.layout.binary("kubectl").display(),
        c.layout.admin_kubeconfig().display()
    );
    if !all_running {
        anyhow::bail!(
            "a process of the cluster is not running: `cargo xtask cluster up` starts it afresh"
        );
    }
    Ok(())
}

/// The real-cluster test files, the lifecycle test last.
pub fn test_files() -> anyhow::Result<Vec<String>> {
    let dir = workspace_root().join("tests/tests");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix(TEST_PREFIX)?;
            Some(name.strip_suffix(".rs")?.to_string())
        })
        .collect();
    files.sort_by_key(|f| (f == LIFECYCLE_TEST, f.clone()));
    Ok(files)
}

/// `cargo xtask cluster test`.
fn test(tc: &EbpfToolchain, only: &[String], reuse: bool, extra: &[String]) -> anyhow::Result<()> {
    let started = Instant::now();
    crate::tools::nextest()?;
    // The chart's tests install it with Helm.
    let helm = crate::tools::helm()?;
    let object = ebpf(tc)?;
    let c = cluster();
    let snapshot_file: PathBuf = c.layout.dir.join("host-before-up.json");
    let running = reuse && c.layout.state().exists() && c.kubectl().run(&["get", "nodes"]).is_ok();
    let agent_image = if running {
        eprintln!(
            "xtask: using the cluster that is up ({})",
            c.layout.dir.display()
        );
        let image = crate::image::image(tc)?;
        let archive = Archive {
            reference: image.reference,
            path: image.archive,
        };
        c.refresh_agent_image(&archive)?;
        archive
    } else {
        // What the host looks like before any cluster: the lifecycle test compares with it.
        c.down().context("ending an earlier cluster")?;
        let snapshot = HostSnapshot::take(&c.layout)?;
        std::fs::create_dir_all(&c.layout.dir)?;
        std::fs::write(&snapshot_file, serde_json::to_vec_pretty(&snapshot)?)?;
        // Two nodes: the plugin's fan-out (tests/tests/cluster_plugin.rs) is across both.
        up(tc, 1, true)?.1.context("the agent's image")?
    };
    // kubectl node-agent, which the cluster's kubectl finds through NODE_AGENT_PLUGIN's
    // directory on PATH.
    run_cmd(cargo_with_object(&object, "build").args([
        "--package",
        "kubectl-node-agent",
        "--locked",
    ]))
    .context("building kubectl-node_agent")?;
    let plugin = workspace_root().join("target/debug/kubectl-node_agent");
    let up_took = started.elapsed();
    let mut failed = Vec::new();
    let mut took = vec![("cluster up".to_string(), up_took)];
    let files: Vec<String> = test_files()?
        .into_iter()
        .filter(|f| only.is_empty() || only.contains(f))
        .filter(|f| !(reuse && f == LIFECYCLE_TEST))
        .collect();
    if files.is_empty() {
        anyhow::bail!("no real-cluster test file matches {only:?}");
    }
    for file in files {
        eprintln!("xtask: real-cluster tests: {file}");
        let step = Instant::now();
        let mut cmd = cargo_with_object(&object, "nextest");
        cmd.args([
            "run",
            "--package",
            "node-agent-tests",
            "--test",
            &file,
            "--locked",
            "--no-fail-fast",
            "--no-tests=fail",
            "--profile",
            "cluster",
            "--",
        ])
        .args(extra)
        .env("NODE_AGENT_CLUSTER_DIR", &c.layout.dir)
        .env("NODE_AGENT_HOST_BEFORE_UP", &snapshot_file)
        .env("NODE_AGENT_IMAGE", &agent_image.reference)
        .env("NODE_AGENT_IMAGE_ARCHIVE", &agent_image.path)
        .env("NODE_AGENT_PLUGIN", &plugin)
        .env("HELM", &helm);
        if let Err(e) = run_cmd(&mut cmd) {
            eprintln!("xtask: {file} failed: {e:#}");
            failed.push(file.clone());
        }
        took.push((file, step.elapsed()));
    }
    if !reuse {
        // Whatever the tests did, nothing of the cluster stays.
        if let Err(e) = c.down() {
            eprintln!("xtask: cluster down failed: {e:#}");
            failed.push("cluster down".into());
        }
    }
    eprintln!("xtask: time taken:");
    for (step, d) in &took {
        eprintln!("xtask:   {:>6.1} s  {step}", d.as_secs_f64());
    }
    eprintln!(
        "xtask:   {:>6.1} s  in all",
        started.elapsed().as_secs_f64()
    );
    if !failed.is_empty() {
        anyhow::bail!("failed: {}", failed.join(", "));
    }
    Ok(())
}

/// A one-node cluster for a measurement tool (the one that is up, with `reuse`, its agent's
/// image refreshed), and the tool (`bin` of node-agent-tests) built: the command to run it
/// with `--out` and `--commit` set, and the cluster.
fn measurement(
    tc: &EbpfToolchain,
    reuse: bool,
    bin: &str,
) -> anyhow::Result<(std::process::Command, Cluster)> {
    let object = ebpf(tc)?;
    let c = cluster();
    let running = reuse && c.layout.state().exists() && c.kubectl().run(&["get", "nodes"]).is_ok();
    if running {
        let image = crate::image::image(tc)?;
        c.refresh_agent_image(&Archive {
            reference: image.reference,
            path: image.archive,
        })?;
    } else {
        up(tc, 0, true)?;
    }
    run_cmd(cargo_with_object(&object, "build").args([
        "--package",
        "node-agent-tests",
        "--bin",
        bin,
        "--locked",
    ]))
    .with_context(|| format!("building {bin}"))?;
    let root = workspace_root();
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(&root)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let mut cmd = std::process::Command::new(root.join("target/debug").join(bin));
    cmd.arg("--out")
        .arg(&root)
        .args(["--commit", &commit])
        .env("NODE_AGENT_CLUSTER_DIR", &c.layout.dir);
    Ok((cmd, c))
}

/// `cargo xtask cluster load`.
fn load(tc: &EbpfToolchain, minutes: f64, reuse: bool) -> anyhow::Result<()> {
    let (mut cmd, c) = measurement(tc, reuse, "control-plane-load")?;
    let result = run_cmd(cmd.args(["--minutes", &minutes.to_string()]));
    if !reuse {
        c.down()?;
    }
    result
}

/// `cargo xtask cluster bench`.
fn bench(
    tc: &EbpfToolchain,
    runs: usize,
    scenarios: &[String],
    configs: &[String],
    reuse: bool,
) -> anyhow::Result<()> {
    let (mut cmd, c) = measurement(tc, reuse, "race-kubelet")?;
    cmd.args(["--runs", &runs.to_string()]);
    for s in scenarios {
        cmd.args(["--scenario", s]);
    }
    for c in configs {
        cmd.args(["--config", c]);
    }
    let result = run_cmd(&mut cmd);
    if !reuse {
        c.down()?;
    }
    result
}
