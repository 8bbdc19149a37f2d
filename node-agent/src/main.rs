use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// eBPF-accelerated node pressure monitor for Kubernetes.
#[derive(Debug, Parser)]
#[command(name = "node-agent", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the agent: kernel events → policy → evictions, with metrics and health endpoints.
    Run(node_agent::daemon::RunArgs),
    /// Show what the kernel reports, live.
    Trace(node_agent::trace::TraceArgs),
    /// Replay a scenario through the eviction policy and print one JSON line per step.
    Simulate(node_agent::simulate::SimulateArgs),
    /// Check a config file as the agent reads it, and print it with every default filled in
    /// and the comparison with the kubelet's thresholds. Exit status 0: valid; 1: refused.
    CheckConfig(node_agent::daemon::config::check::CheckArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // check-config's report is its output: only warnings besides it, unless RUST_LOG asks.
    let default_level = match cli.command {
        Command::CheckConfig(_) => "warn",
        _ => "info",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result: Result<(), Box<dyn std::error::Error>> = match cli.command {
        Command::Run(args) => node_agent::daemon::run(args).map_err(Into::into),
        Command::Trace(args) => node_agent::trace::run(args).map_err(Into::into),
        Command::CheckConfig(args) => return node_agent::daemon::config::check::run(&args),
        // Its own exit codes: 2 for an invalid scenario, as for any other bad input.
        Command::Simulate(args) => {
            return match node_agent::simulate::run(&args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("node-agent: {e}");
                    ExitCode::from(e.exit_code())
                }
            };
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("node-agent: {}", error_chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// One line: the error and its causes, so an operator sees the root cause without a backtrace.
fn error_chain(e: &dyn std::error::Error) -> String {
    std::iter::successors(Some(e), |e| e.source())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}
