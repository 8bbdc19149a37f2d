//! Memory lines: a watched cgroup's memory usage crossed the line the daemon (or `trace
//! --memory-threshold`) set on it (kernel side: `node-agent-ebpf/src/memcg.rs`).

use node_agent_common::{MemoryThresholdEvent, KIND_MEMORY_THRESHOLD};
use serde::{Deserialize, Serialize};

use super::{
    parts::{bytes, crossing, CgroupRef, Crossing},
    Context, Direction, Probe, Subject,
};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryThreshold {
    pub cgroup: Subject,
    pub direction: Direction,
    pub usage_bytes: u64,
    pub threshold_bytes: u64,
}

/// A memory line's crossing in the live stream.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MemoryThresholdRecord {
    pub time: String,
    pub ktime_ns: u64,
    pub cgroup: CgroupRef,
    pub direction: Crossing,
    pub usage_bytes: u64,
    pub threshold_bytes: u64,
}

impl Probe for MemoryThreshold {
    const KIND: u32 = KIND_MEMORY_THRESHOLD;
    const NAME: &'static str = "memory_threshold";
    type Raw = MemoryThresholdEvent;
    type Record = MemoryThresholdRecord;

    /// None: a line is only ever set on a cgroup the index already holds.
    fn new_cgroup(_: &MemoryThresholdEvent) -> Option<u64> {
        None
    }

    fn attribute(raw: &MemoryThresholdEvent, context: &Context<'_>) -> Self {
        MemoryThreshold {
            cgroup: context.subject(raw.cgroup_id),
            direction: Direction::of(raw.direction),
            usage_bytes: raw.usage_bytes,
            threshold_bytes: raw.threshold_bytes,
        }
    }

    fn record(&self, time: String, ktime_ns: u64) -> MemoryThresholdRecord {
        MemoryThresholdRecord {
            time,
            ktime_ns,
            cgroup: (&self.cgroup).into(),
            direction: self.direction.into(),
            usage_bytes: self.usage_bytes,
            threshold_bytes: self.threshold_bytes,
        }
    }
}

impl MemoryThresholdRecord {
    /// Its table row's columns: time, pod or cgroup, PID and details.
    pub(crate) fn columns(&self) -> (&str, String, String, String) {
        (
            &self.time,
            self.cgroup.label(),
            "-".into(),
            format!(
                "{}: usage {} vs threshold {}",
                crossing(self.direction),
                bytes(self.usage_bytes),
                bytes(self.threshold_bytes)
            ),
        )
    }
}
