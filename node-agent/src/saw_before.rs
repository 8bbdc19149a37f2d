//! What the agent saw and did in the minute before an OOM kill, as one value. The daemon
//! builds it from what it remembers (`run::recent`) and tells it in the pod's event; the
//! live stream carries it in the kill's record (`trace::Record`). It is the daemon's, and
//! both sides read it from here, so the wire format needs nothing of the daemon's.

use serde::{Deserialize, Serialize};

/// What came before an OOM kill.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SawBefore {
    /// The first pressure seen in the window, how long before the kill, and what it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pressure: Option<Pressure>,
    /// The last thing the agent did about memory in the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<String>,
    /// Evictions in flight at the kill (namespace/name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub in_flight: Vec<String>,
}

/// The first pressure seen in the window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pressure {
    /// `memory.available` (a threshold met) or a cgroup path (a kernel line crossed).
    pub what: String,
    pub before_ms: u64,
}

impl std::fmt::Display for SawBefore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.pressure {
            Some(p) => write!(
                f,
                "node-agent saw memory pressure ({}) {:.1}s before",
                p.what,
                p.before_ms as f64 / 1000.0
            )?,
            None => write!(f, "node-agent saw no memory pressure in the minute before")?,
        }
        if let Some(d) = &self.decision {
            write!(f, "; {d}")?;
        }
        match self.in_flight.as_slice() {
            [] => {}
            pods => write!(f, "; eviction in flight: {}", pods.join(", "))?,
        }
        Ok(())
    }
}
