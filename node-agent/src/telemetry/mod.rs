//! What the daemon records for operators: the `node_agent_*` metric families and the standard
//! `process_*` ones ([`Metrics`], rendered as OpenMetrics text from `prometheus-client`, or the
//! Prometheus text format 0.0.4, as the scraper's `Accept` header asks), liveness (the main
//! loop still beats) and readiness (programs attached, first evaluation done) in [`Health`].
//!
//! The daemon records into [`Metrics`] and [`Health`] (plain atomics, no I/O); what serves them
//! over HTTP (`/metrics`, `/healthz`, `/readyz`) is [`crate::serve`].

mod health;
mod labels;
mod metrics;

pub use health::Health;
pub(crate) use health::{redact, Liveness};
pub use labels::{KubeOperation, Trigger, AUTHORIZATION_RESULTS};
pub use metrics::{ConvertError, Format, Metrics, DECISION_LATENCY_BUCKETS};
