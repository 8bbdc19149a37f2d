//! `node-agent check-config FILE [--kubelet-config FILE] [--on-node]`: the config checked by
//! the code the agent runs ([`AgentConfig::load`], and with `--on-node` the same checks against
//! the node as at start), then printed with every default filled in, the thresholds in force,
//! the comparison with the kubelet's, and what could not be checked where it ran. Exit status 0
//! when the agent would take the file, 1 when it would refuse it (or the kubelet's file asked
//! for cannot be read), for CI and pre-commit hooks.

use std::{fmt::Write as _, path::PathBuf};

use node_agent_policy::{
    beside::{kubelet_acts_first, Finding},
    Signal,
};

use crate::{
    cgroup,
    config::{
        kubelet::{self, KubeletConfig},
        read_file, AgentConfig, ConfigError, NodeAgentConfiguration, Overrides,
    },
    observe::node::{Filesystems, Node, NodeLayout},
};

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// The config file (a NodeAgentConfiguration), as `node-agent run --config` reads it.
    pub file: PathBuf,
    /// The kubelet's config file (a KubeletConfiguration) whose eviction thresholds to compare
    /// with the agent's. Without it, `--on-node` compares with the file's `kubeletConfig` as
    /// the agent does; otherwise nothing is compared.
    #[arg(long)]
    pub kubelet_config: Option<PathBuf>,
    /// Also make the checks that need the node (its cgroups, paths, memory in use, the agent's
    /// own memory limit), as `node-agent run` makes them before it loads anything: for use on
    /// the node itself, e.g. in the agent's pod.
    #[arg(long)]
    pub on_node: bool,
}

/// Why `check-config` says no.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The agent would refuse this file.
    #[error("{}: refused", .path.display())]
    Refused {
        path: PathBuf,
        #[source]
        source: ConfigError,
    },
    #[error("the node's cgroups cannot be read")]
    Cgroups(#[source] cgroup::HierarchyError),
    #[error("the node's filesystems cannot be watched")]
    Filesystems(#[source] std::io::Error),
    #[error("the kubelet's config file {}: {problem}", .path.display())]
    Kubelet { path: PathBuf, problem: String },
}

/// A name that stands in for `NODE_NAME` when it is not set where the check runs.
const STAND_IN_NODE: &str = "check-config-node";

/// What a check found: the report for stdout, and the refusal, if any, for stderr.
#[derive(Debug)]
pub struct Checked {
    pub report: String,
    pub refusal: Option<CheckError>,
}

/// Checks the file. A refused file has no report; the kubelet's file is compared only once
/// the agent's is valid.
pub fn check(args: &CheckArgs, env_node_name: Option<&str>) -> Checked {
    match checked(args, env_node_name) {
        Ok(done) => done,
        Err(refusal) => Checked {
            report: String::new(),
            refusal: Some(refusal),
        },
    }
}

fn checked(args: &CheckArgs, env_node_name: Option<&str>) -> Result<Checked, CheckError> {
    let refused = |source| CheckError::Refused {
        path: args.file.clone(),
        source,
    };
    let overrides = Overrides {
        node_name: Some(env_node_name.unwrap_or(STAND_IN_NODE).to_string()),
        cri_endpoint: Overrides::cri_endpoint_from_env(),
        ..Overrides::default()
    };
    // The very path of `run` and of every reload: read once, then validated.
    let file = read_file(&args.file).map_err(refused)?;
    let config = AgentConfig::from_file(&file, &overrides).map_err(refused)?;
    let node = match args.on_node {
        false => None,
        true => {
            let layout = cgroup::detect().map_err(CheckError::Cgroups)?;
            let node_dir =
                crate::config::plausible::on_this_machine(&config, &layout).map_err(refused)?;
            // The node as the agent reads it at start, for the capacities the comparison with
            // the kubelet's percentages needs.
            let s = &config.settings;
            let fs = Filesystems::new(&s.nodefs_path, s.imagefs_path.as_deref())
                .map_err(CheckError::Filesystems)?;
            Some(Node::new(
                NodeLayout::new(layout.memory.clone(), node_dir),
                s.memory_capacity,
                fs,
            ))
        }
    };

    let mut out = String::new();
    let _ = writeln!(
        out,
        "# node-agent check-config: {} is valid{}.",
        args.file.display(),
        if args.on_node { " on this node" } else { "" }
    );
    let _ = writeln!(out, "# {}", mode(&config));
    let _ = writeln!(
        out,
        "# The effective configuration, every default filled in (it reads back as the same):"
    );
    out.push_str(&file.effective().to_yaml());
    thresholds(&mut out, &config);
    let compared = compare(&mut out, args, &config, node.as_ref());
    not_checked(&mut out, args, &file, &config, env_node_name.is_none());
    Ok(Checked {
        report: out,
        refusal: compared.err(),
    })
}

fn mode(config: &AgentConfig) -> &'static str {
    match (&config.kubernetes, config.settings.dry_run) {
        (None, _) => "Mode: standalone (no kubernetes section): decides and reports, never acts.",
        (Some(_), true) => "Mode: dry run (dryRun: true): decides and reports, changes nothing in the cluster.",
        (Some(_), false) => "Mode: enforcing (dryRun: false): evicts, taints and reports, unless the agent runs with --dry-run (the base DaemonSet's does).",
    }
}

fn thresholds(out: &mut String, config: &AgentConfig) {
    let _ = writeln!(
        out,
        "# Thresholds in force (hard, then soft, then those derived for allocatableMemory.available):"
    );
    for t in config.eviction.thresholds() {
        let value = match t.value {
            node_agent_policy::ThresholdValue::Quantity(q) => q.to_string(),
            node_agent_policy::ThresholdValue::Percentage(p) => {
                format!("{}%", (f64::from(p) * 100_000.0).round() / 1000.0)
            }
        };
        let kind = match t.is_hard() {
            true => "hard".to_string(),
            false => format!(
                "soft, grace {}",
                node_agent_policy::GoDuration::try_from(t.grace_period).unwrap_or_default()
            ),
        };
        let _ = writeln!(out, "#   {}<{value} ({kind})", t.signal);
    }
    if config.eviction.thresholds().is_empty() {
        let _ = writeln!(out, "#   none: the agent never evicts for a signal");
    }
}

/// The comparison with the kubelet's thresholds, as the agent logs it at start.
fn compare(
    out: &mut String,
    args: &CheckArgs,
    config: &AgentConfig,
    node: Option<&Node>,
) -> Result<(), CheckError> {
    let path = match (&args.kubelet_config, args.on_node) {
        (Some(p), _) => p.clone(),
        (None, true) => match &config.settings.kubelet_config {
            Some(p) => p.clone(),
            None => {
                let _ = writeln!(
                    out,
                    "# Beside the kubelet: not compared (kubeletConfig: null)."
                );
                return Ok(());
            }
        },
        (None, false) => {
            let _ = writeln!(
                out,
                "# Beside the kubelet: not compared (give --kubelet-config FILE)."
            );
            return Ok(());
        }
    };
    let kubelet = match kubelet::read(Some(&path)) {
        KubeletConfig::Read(k) => k,
        KubeletConfig::Missing if args.kubelet_config.is_none() => {
            let _ = writeln!(
                out,
                "# Beside the kubelet: no kubelet config file at {}: not compared (the agent says the same at start).",
                path.display()
            );
            return Ok(());
        }
        KubeletConfig::Missing => {
            return Err(CheckError::Kubelet {
                path,
                problem: "no such file".into(),
            })
        }
        KubeletConfig::Unreadable(problem) => return Err(CheckError::Kubelet { path, problem }),
        KubeletConfig::NotSet => return Ok(()),
    };
    let reading = node.map(Node::read);
    let capacity = |s: Signal| {
        reading
            .as_ref()
            .and_then(|r| r.observations.get(&s).map(|o| o.capacity))
    };
    let found: Vec<Finding> = kubelet_acts_first(&kubelet, &config.eviction, &capacity);
    if found.is_empty() {
        let _ = writeln!(
            out,
            "# Beside the kubelet ({}): every kubelet eviction threshold is met after one of the agent's.",
            path.display()
        );
    } else {
        let _ = writeln!(
            out,
            "# Beside the kubelet ({}): warnings, as the agent logs them at start:",
            path.display()
        );
        for f in &found {
            let _ = writeln!(out, "#   WARNING: {f}");
        }
    }
    Ok(())
}

/// What this run could not check, and who does.
fn not_checked(
    out: &mut String,
    args: &CheckArgs,
    file: &NodeAgentConfiguration,
    config: &AgentConfig,
    stand_in_node: bool,
) {
    let s = &config.settings;
    let mut lines: Vec<String> = Vec::new();
    if !args.on_node {
        lines.push(format!(
            "nodeCgroup {}: a cgroup in the node's memory hierarchy",
            s.node_cgroup.display()
        ));
        let nodefs = match &file.nodefs_path {
            Some(p) => format!("nodefsPath {}: an existing directory", p.display()),
            None => {
                "nodefsPath (unset): /var/lib/kubelet where it exists on the node, else /".into()
            }
        };
        lines.push(nodefs);
        if let Some(p) = &file.imagefs_path {
            lines.push(format!(
                "imagefsPath {}: an existing directory",
                p.display()
            ));
        }
        if let Some(c) = &file.memory_capacity {
            lines.push(format!(
                "memoryCapacity {c}: not below the memory the node already uses"
            ));
        }
        lines.push(format!(
            "ringBufferSize {}: at most half of the agent's own memory limit",
            file.ring_buffer_size
        ));
    }
    if config.kubernetes.is_some() {
        if stand_in_node {
            lines.push(format!(
                "kubernetes.nodeName: NODE_NAME is not set here (the DaemonSet sets it); checked with {STAND_IN_NODE:?}"
            ));
        }
        lines.push("kubernetes: the API server and the kubelet answer (the kubelet at its Node's address unless kubelet.url, or through the node proxy), its certificate verifies, apiServer.caFile and tokenPath are readable (checked when the agent connects: at start, and on a reload that changes them)".into());
        if let Some(runtime) = &config.runtime {
            lines.push(format!(
                "cri.endpoint {}{}: the runtime answers on its socket (checked at start for its ImageFsInfo and at each node-level reclaim, and said then)",
                runtime.settings.endpoint,
                if Overrides::cri_endpoint_from_env().is_some() {
                    format!(" (from {})", crate::config::CRI_ENDPOINT_VAR)
                } else {
                    String::new()
                }
            ));
        }
    }
    lines.push(format!(
        "listen {}: free to bind (checked at start)",
        s.listen
    ));
    let _ = writeln!(
        out,
        "# Not checked here{}:",
        if args.on_node {
            ""
        } else {
            " (the agent checks these on the node at start and on every reload; `--on-node` checks them there)"
        }
    );
    for line in lines {
        let _ = writeln!(out, "#   {line}");
    }
}

/// `node-agent check-config`: the report on stdout, a refusal on stderr; the exit status.
pub fn run(args: &CheckArgs) -> std::process::ExitCode {
    let env_node = std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty());
    let checked = check(args, env_node.as_deref());
    print!("{}", checked.report);
    match checked.refusal {
        None => std::process::ExitCode::SUCCESS,
        Some(e) => {
            let chain = crate::error_chain(&e);
            eprintln!("node-agent: check-config: {chain}");
            std::process::ExitCode::FAILURE
        }
    }
}
