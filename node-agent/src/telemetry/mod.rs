//! What the daemon shows operators over HTTP: `/metrics` (OpenMetrics text from
//! `prometheus-client`, or the Prometheus text format 0.0.4, as the scraper's `Accept` header
//! asks), `/healthz` (the main loop is still beating) and `/readyz` (programs
//! attached, first evaluation done).
//!
//! The daemon records into [`Metrics`] and [`Health`] (plain atomics, no I/O) and runs the
//! [`Server`] from [`bind`]; the listener is the only I/O in this module.

pub mod access;
mod connections;
mod health;
mod labels;
mod metrics;
mod server;
#[cfg(test)]
mod starvation_tests;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;

pub use access::{Gate, MetricsAccess};
pub use health::Health;
pub use labels::{KubeOperation, Trigger};
pub use metrics::{ConvertError, Format, Metrics, DECISION_LATENCY_BUCKETS};
pub use server::{bind, Server};

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("cannot listen for metrics and health on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the local address of the metrics listener bound to {addr}")]
    LocalAddr {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}
