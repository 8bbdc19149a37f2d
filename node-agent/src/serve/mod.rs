//! What the agent serves, each listener bounding what its clients may hold: [`metrics`] (HTTP
//! `/metrics`, `/healthz`, `/readyz` for Prometheus and the kubelet, with [`access`] deciding
//! who may read what and [`connections`] keeping `/healthz` from being starved), [`inspect`]
//! (the loopback endpoint `kubectl node-agent` reads) and [`live`] (the trace socket), sharing
//! what they bound alike ([`limits`]). What
//! they serve is recorded elsewhere ([`crate::telemetry`], [`crate::inspect`], the loop's live
//! stream).

pub mod access;
mod connections;
pub mod inspect;
mod limits;
pub mod live;
pub mod metrics;
#[cfg(test)]
mod starvation_tests;

pub use access::{Gate, MetricsAccess};
pub use metrics::{bind, TelemetryError};
