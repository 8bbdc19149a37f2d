//! The node's PID line: `pid.available` (the PID limit minus live PIDs) crossed the line the
//! daemon (or `trace --pid-available-below`) set (kernel side: `node-agent-ebpf/src/tasks.rs`).
//! It concerns the node, not a cgroup.

use node_agent_common::{PidThresholdEvent, KIND_PID_THRESHOLD};
use serde::{Deserialize, Serialize};

use super::{
    parts::{crossing, Crossing},
    Context, Direction, Probe,
};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PidThreshold {
    pub direction: Direction,
    pub available: i64,
    pub threshold: u64,
    pub live: i64,
    pub limit: u64,
}

/// A crossing of the node's PID line in the live stream.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PidThresholdRecord {
    pub time: String,
    pub ktime_ns: u64,
    pub direction: Crossing,
    pub available: i64,
    pub threshold: u64,
    pub live: i64,
    pub limit: u64,
}

impl Probe for PidThreshold {
    const KIND: u32 = KIND_PID_THRESHOLD;
    const NAME: &'static str = "pid_threshold";
    type Raw = PidThresholdEvent;
    type Record = PidThresholdRecord;

    fn new_cgroup(_: &PidThresholdEvent) -> Option<u64> {
        None
    }

    fn attribute(raw: &PidThresholdEvent, _: &Context<'_>) -> Self {
        PidThreshold {
            direction: Direction::of(raw.direction),
            available: i64::try_from(raw.limit)
                .unwrap_or(i64::MAX)
                .saturating_sub(raw.live),
            threshold: raw.threshold,
            live: raw.live,
            limit: raw.limit,
        }
    }

    fn record(&self, time: String, ktime_ns: u64) -> PidThresholdRecord {
        PidThresholdRecord {
            time,
            ktime_ns,
            direction: self.direction.into(),
            available: self.available,
            threshold: self.threshold,
            live: self.live,
            limit: self.limit,
        }
    }
}

impl PidThresholdRecord {
    /// Its table row's columns: time, `node`, no PID, and details.
    pub(crate) fn columns(&self) -> (&str, String, String, String) {
        let Self {
            time,
            direction,
            available,
            threshold,
            live,
            limit,
            ..
        } = self;
        (
            time,
            "node".into(),
            "-".into(),
            format!(
                "{}: {available} PIDs available vs {threshold} ({live} of {limit} used)",
                crossing(*direction)
            ),
        )
    }
}
