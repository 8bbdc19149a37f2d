//! The inspection endpoint's clients (`kubectl node-agent`, [`crate::inspect`]) on
//! `/metrics`, kept apart from the other families. Families (prefix `node_agent_`):
//! - `inspect_clients_closed_total{reason}`: clients the endpoint turned away or let go:
//!   `busy` (every connection or trace-stream slot taken), `slow_reader` (a trace reader that
//!   took nothing for the write timeout), `timeout` (a request that did not finish in time);
//! - `inspect_records_skipped_total`: records of the live stream a trace reader missed because
//!   it read more slowly than they came (each reader is told how many, as `stream_lost`).

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

/// Why the endpoint closed a client.
pub const CLOSED_REASONS: [&str; 3] = ["busy", "slow_reader", "timeout"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Debug, Default)]
pub struct InspectMetrics {
    closed: Family<ReasonLabels, Counter>,
    skipped: Counter,
}

impl InspectMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        for reason in CLOSED_REASONS {
            self.closed.get_or_create_owned(&ReasonLabels { reason });
        }
        r.register(
            "inspect_clients_closed",
            "Clients of the inspection endpoint (kubectl node-agent) turned away or let go, by reason (busy, slow_reader, timeout)",
            self.closed.clone(),
        );
        r.register(
            "inspect_records_skipped",
            "Live-stream records a trace reader of the inspection endpoint missed because it read more slowly than they came",
            self.skipped.clone(),
        );
    }

    /// `node_agent_inspect_clients_closed_total{reason}`; `reason` is one of
    /// [`CLOSED_REASONS`].
    pub fn closed(&self, reason: &'static str) {
        self.closed.get_or_create(&ReasonLabels { reason }).inc();
    }

    /// `node_agent_inspect_records_skipped_total`.
    pub fn skipped(&self, records: u64) {
        self.skipped.inc_by(records);
    }
}
