//! Why the daemon could not start or had to stop.

use crate::{cgroup, kernel::FeedError};
use crate::{
    config::reload::ReadError, config::ConfigError, observe::feed::KubeSetupError,
    serve::live::LiveError,
};

/// Why the daemon could not start or had to stop. Each names what was wrong.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    ReadConfig(#[from] ReadError),
    #[error(transparent)]
    Hierarchy(#[from] cgroup::HierarchyError),
    #[error("starting the runtime, its threads or the signal handlers")]
    Runtime(#[source] std::io::Error),
    #[error(transparent)]
    Telemetry(#[from] crate::serve::TelemetryError),
    #[error(transparent)]
    Live(#[from] LiveError),
    #[error(transparent)]
    Inspect(#[from] crate::serve::inspect::InspectError),
    #[error(transparent)]
    Feed(#[from] FeedError),
    #[error(transparent)]
    Kube(#[from] KubeSetupError),
    #[error("the executor stopped")]
    ExecutorStopped,
}
