//! `kubectl-node_agent`, the kubectl plugin: `kubectl node-agent status | trace | explain`.
//! One binary on PATH (kubectl finds it by its name), or installed with krew.

mod cli;
mod cluster;
mod error;
mod explain;
mod forward;
mod status;
mod stop;
mod trace;

use std::process::ExitCode;

use clap::Parser as _;

use crate::{
    cli::{Cli, Command},
    cluster::{Access, Cluster},
    error::PluginError,
};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the command; `Ok(false)` when it ran but found an agent not ready.
async fn run(cli: Cli) -> Result<bool, PluginError> {
    let access = Access {
        kubeconfig: cli.global.kubeconfig.clone(),
        context: cli.global.context.clone(),
        agent_namespace: cli.global.agent_namespace.clone(),
        request_timeout: cli.global.request_timeout,
    };
    let cluster = Cluster::connect(&access).await?;
    match &cli.command {
        Command::Status(args) => status::run(&cluster, args).await,
        Command::Trace(args) => trace::run(cluster, args).await.map(|()| true),
        Command::Explain(args) => explain::run(&cluster, args).await.map(|()| true),
    }
}
