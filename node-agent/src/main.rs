use std::process::ExitCode;

use clap::{Parser, Subcommand};
use node_agent::{error_chain, logging::LogLevel};

/// eBPF-accelerated node pressure monitor for Kubernetes.
#[derive(Debug, Parser)]
#[command(name = "node-agent", version = node_agent::VERSION)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log lines on stderr as text or as JSON lines with the same fields; wins over the config
    /// file's `logFormat` (default: text).
    #[arg(long, global = true, value_enum, value_name = "FORMAT")]
    log_format: Option<node_agent::logging::LogFormat>,
    /// A level (error, warn, info, debug, trace, off) or RUST_LOG directives such as
    /// `info,node_agent::run=debug`; wins over RUST_LOG, and both over the config file's
    /// `logLevel` (default: info).
    #[arg(long, global = true, value_name = "LEVEL")]
    log_level: Option<LogLevel>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the agent: kernel events → policy → evictions, with metrics and health endpoints.
    Run(node_agent::run::RunArgs),
    /// Show what the kernel reports, live.
    Trace(node_agent::trace::TraceArgs),
    /// Replay a scenario through the eviction policy and print one JSON line per step.
    Simulate(node_agent::simulate::SimulateArgs),
    /// Check a config file as the agent reads it, and print it with every default filled in
    /// and the comparison with the kubelet's thresholds. Exit status 0: valid; 1: refused.
    CheckConfig(node_agent::check_config::CheckArgs),
    /// The agent's own helper process for filesystem calls that may hang (not for people).
    #[command(name = "fs-helper", hide = true)]
    FsHelper,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::FsHelper => return node_agent::fs_helper::serve(),
        // A filesystem call stuck in the kernel must not hold the agent's own process.
        Command::Run(_) | Command::CheckConfig(_) => {
            node_agent::fs_helper::use_helper("/proc/self/exe".into());
        }
        Command::Trace(_) | Command::Simulate(_) => {}
    }
    // check-config's report is its output: only warnings besides it, unless asked.
    let default_level = match cli.command {
        Command::CheckConfig(_) => "warn",
        _ => "info",
    };
    let level = match (cli.log_level, std::env::var("RUST_LOG")) {
        (Some(level), _) => Some(level),
        (None, Ok(text)) if !text.trim().is_empty() => match LogLevel::from_rust_log(&text) {
            Ok(level) => Some(level),
            Err(e) => {
                eprintln!("node-agent: RUST_LOG: {e}");
                return ExitCode::from(2);
            }
        },
        (None, _) => None,
    };
    node_agent::logging::init(
        node_agent::logging::CommandLine {
            format: cli.log_format,
            level,
        },
        default_level,
    );
    let result: Result<(), Box<dyn std::error::Error>> = match cli.command {
        Command::Run(args) => node_agent::run::run(args).map_err(Into::into),
        Command::Trace(args) => node_agent::trace::run(args).map_err(Into::into),
        Command::CheckConfig(args) => return node_agent::check_config::run(&args),
        Command::FsHelper => unreachable!("answered above"),
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
            let chain = error_chain(e.as_ref());
            // Whatever ships the agent's JSON lines gets its last words as one too.
            if node_agent::logging::is_json() {
                tracing::error!(error = %chain, "node-agent stopped");
            } else {
                eprintln!("node-agent: {chain}");
            }
            ExitCode::FAILURE
        }
    }
}
