//! The command line, laid out as kubectl lays out its own help (a summary, examples, the
//! options, the usage line), and what every command shares: how to reach the cluster, and
//! when to stop.

use std::{path::PathBuf, time::Duration};

use clap::{Parser, Subcommand};

use crate::{explain::ExplainArgs, status::StatusArgs, stop::duration, trace::TraceArgs};

const TEMPLATE: &str = "{about}{after-help}\n{all-args}\n\nUsage:\n  {usage}\n";
const TOP_TEMPLATE: &str = "{about}{after-help}\nAvailable Commands:\n{subcommands}\n\n{all-args}\n\nUsage:\n  {usage}\n\nUse \"kubectl node-agent <command> --help\" for more information about a given command.\n";

/// Every node agent of the cluster from one terminal: their status, their live stream merged
/// across nodes, and why a pod was or was not evicted. Reaches each agent through the API
/// server's pods/portforward with your kubeconfig and RBAC (deploy/operator-rbac.yaml).
#[derive(Debug, Parser)]
#[command(
    name = "kubectl node-agent",
    bin_name = "kubectl node-agent",
    version,
    help_template = TOP_TEMPLATE,
    after_help = "Examples:
  # One row per node: mode, readiness, memory mechanism, thresholds met, last eviction and OOM kill
  kubectl node-agent status

  # Every node's live stream, merged in time order, until Ctrl-C
  kubectl node-agent trace

  # What the agent of its node decided about a pod, and why
  kubectl node-agent explain web-7d9f -n shop
"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub global: Global,
}

#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Global options")]
pub struct Global {
    /// Path to the kubeconfig file to use (default: $KUBECONFIG, then ~/.kube/config, then
    /// the in-cluster service account).
    #[arg(long, global = true, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The name of the kubeconfig context to use.
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,
    /// The namespace the agent runs in.
    #[arg(
        long,
        global = true,
        default_value = "node-agent",
        value_name = "NAMESPACE"
    )]
    pub agent_namespace: String,
    /// How long one request to the API server or one agent may take (a duration such as
    /// 10s).
    #[arg(long, global = true, default_value = "10s", value_parser = duration, value_name = "DURATION")]
    pub request_timeout: Duration,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show each node's agent: mode and DaemonSet, readiness or why not, memory mechanism,
    /// thresholds met, last eviction and OOM kill, version. Exits 1 when an agent is not ready
    /// or cannot be read.
    #[command(
        help_template = TEMPLATE,
        after_help = "Examples:
  # One row per node
  kubectl node-agent status

  # Every column (DaemonSet, start, full commit)
  kubectl node-agent status -o wide

  # The agents of one node pool, as JSON
  kubectl node-agent status -l cloud.google.com/gke-nodepool=pool-a -o json
"
    )]
    Status(StatusArgs),
    /// Follow the live stream of every selected node's agent (OOM kills, memory and PID
    /// thresholds, fork storms, evictions and reclaims), merged in time order with a node
    /// column. An agent that joins or leaves meanwhile is said so in the stream; the trace
    /// goes on until Ctrl-C or --timeout.
    #[command(
        help_template = TEMPLATE,
        after_help = "Examples:
  # Every node, until Ctrl-C
  kubectl node-agent trace

  # Evictions (dry run included) on one node pool, for ten minutes
  kubectl node-agent trace -l pool=batch --kind eviction --timeout 10m

  # What happens to one pod, wherever it runs, as JSON Lines
  kubectl node-agent trace -n shop --pod web-7d9f -o json
"
    )]
    Trace(TraceArgs),
    /// Explain what the agent of a pod's node lately saw and decided about the pod: chosen for
    /// eviction, passed over and why, its evictions' outcomes, OOM kills in it, and what the
    /// agent chose instead.
    #[command(
        help_template = TEMPLATE,
        after_help = "Examples:
  # Why was web-7d9f evicted (or not)?
  kubectl node-agent explain web-7d9f -n shop

  # The agent's answer whole
  kubectl node-agent explain web-7d9f -n shop -o json
"
    )]
    Explain(ExplainArgs),
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    #[test]
    fn help_reads_as_kubectl_help() {
        Cli::command().debug_assert();
        for (args, words) in [
            (
                vec![],
                vec![
                    "Examples:",
                    "Available Commands:",
                    "Usage:\n  kubectl node-agent",
                ],
            ),
            (
                vec!["trace"],
                vec![
                    "Examples:",
                    "--timeout <DURATION>",
                    "-l, --selector <SELECTOR>",
                    "Usage:\n  kubectl node-agent trace",
                ],
            ),
            (
                vec!["status"],
                vec![
                    "-o, --output <OUTPUT>",
                    "Usage:\n  kubectl node-agent status",
                ],
            ),
            (
                vec!["explain"],
                vec!["-n, --namespace <NAMESPACE>", "<POD>"],
            ),
        ] {
            let mut cmd = Cli::command();
            // As clap does before it prints help: subcommands learn their full name.
            cmd.build();
            let help = match args.first() {
                Some(sub) => cmd
                    .find_subcommand_mut(sub)
                    .expect("a subcommand")
                    .render_help()
                    .to_string(),
                None => cmd.render_help().to_string(),
            };
            for w in words {
                assert!(help.contains(w), "{args:?}: {w:?} in\n{help}");
            }
        }
    }
}
