//! `node-agent simulate`: replays a scenario through the policy core and prints one JSON line
//! per step. Needs no root and no kernel: the file format ([`format`]) builds pods with the
//! daemon's own pod model, the replay is `node_agent_policy::scenario`.

pub mod format;

use std::io::{self, Read, Write};
use std::path::PathBuf;

use format::FormatError;
use node_agent_policy::scenario;

/// The largest scenario read: a timeline of a few thousand steps and pods.
pub const MAX_SCENARIO_BYTES: u64 = 16 << 20;

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
    #[error("invalid scenario {path}: {}", crate::error_chain(source))]
    Invalid {
        path: String,
        #[source]
        source: FormatError,
    },
    #[error("scenario {path} is larger than {max} bytes")]
    TooLarge { path: String, max: u64 },
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
            SimulateError::Read { .. }
            | SimulateError::Invalid { .. }
            | SimulateError::TooLarge { .. } => 2,
            SimulateError::Write { .. } => 1,
        }
    }
}

/// The JSON Lines output for a scenario text, newline-terminated; nothing if it is invalid.
pub fn render(text: &str) -> Result<String, FormatError> {
    let steps = scenario::simulate(&format::parse(text)?);
    Ok(steps
        .iter()
        .map(|step| step.to_json_line() + "\n")
        .collect())
}

/// Reads the scenario, replays it, and prints the steps to standard output.
pub fn run(args: &SimulateArgs) -> Result<(), SimulateError> {
    let path = args.scenario.display().to_string();
    let mut bytes = Vec::new();
    let read = if path == "-" {
        io::stdin()
            .take(MAX_SCENARIO_BYTES + 1)
            .read_to_end(&mut bytes)
    } else {
        std::fs::File::open(&args.scenario)
            .and_then(|f| f.take(MAX_SCENARIO_BYTES + 1).read_to_end(&mut bytes))
    };
    read.map_err(|source| SimulateError::Read {
        path: path.clone(),
        source,
    })?;
    if bytes.len() as u64 > MAX_SCENARIO_BYTES {
        return Err(SimulateError::TooLarge {
            path,
            max: MAX_SCENARIO_BYTES,
        });
    }
    let text = String::from_utf8_lossy(&bytes);
    let output = render(&text).map_err(|source| SimulateError::Invalid { path, source })?;
    let mut stdout = io::stdout().lock();
    stdout
        .write_all(output.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|source| SimulateError::Write { source })
}
