//! `node-agent simulate`: replays a scenario through the policy core and prints one JSON line
//! per step. Needs no root and no kernel: all the logic is in `node_agent_policy::scenario`.

use std::io::{self, Read, Write};
use std::path::PathBuf;

use node_agent_policy::scenario::{self, ScenarioError};

/// Arguments of `node-agent simulate`.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// Scenario file, YAML or JSON; `-` reads standard input.
    #[arg(long, value_name = "FILE")]
    pub scenario: PathBuf,
}

/// Why a simulation produced no output.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    #[error("cannot read scenario {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("invalid scenario {path}: {source}")]
    Invalid {
        path: String,
        #[source]
        source: ScenarioError,
    },
    #[error("cannot write the output: {source}")]
    Write {
        #[source]
        source: io::Error,
    },
}

impl SimulateError {
    /// 2 for bad input (as for a usage error), 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            SimulateError::Read { .. } | SimulateError::Invalid { .. } => 2,
            SimulateError::Write { .. } => 1,
        }
    }
}

/// The JSON Lines output for a scenario text, newline-terminated; nothing if it is invalid.
pub fn render(text: &str) -> Result<String, ScenarioError> {
    let steps = scenario::run(text)?;
    Ok(steps
        .iter()
        .map(|step| step.to_json_line() + "\n")
        .collect())
}

/// Reads the scenario, replays it, and prints the steps to standard output.
pub fn run(args: &SimulateArgs) -> Result<(), SimulateError> {
    let path = args.scenario.display().to_string();
    let mut text = String::new();
    let read = if path == "-" {
        io::stdin().read_to_string(&mut text).map(drop)
    } else {
        std::fs::read_to_string(&args.scenario).map(|t| text = t)
    };
    read.map_err(|source| SimulateError::Read {
        path: path.clone(),
        source,
    })?;
    let output = render(&text).map_err(|source| SimulateError::Invalid { path, source })?;
    let mut stdout = io::stdout().lock();
    stdout
        .write_all(output.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|source| SimulateError::Write { source })
}
