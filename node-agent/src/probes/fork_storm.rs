//! Fork storms: a cgroup forked more than its limit within a window (kernel side:
//! `node-agent-ebpf/src/tasks.rs`). Reported; the daemon evaluates nothing on it.

use node_agent_common::{ForkStormEvent, KIND_FORK_STORM};
use serde::{Deserialize, Serialize};

use super::{comm, parts::CgroupRef, Context, Probe, Subject};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForkStorm {
    pub cgroup: Subject,
    pub pid: u32,
    pub comm: String,
    pub forks_in_window: u64,
    pub window_ms: u64,
    pub max_forks: u64,
}

/// A fork storm in the live stream.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ForkStormRecord {
    pub time: String,
    pub ktime_ns: u64,
    pub cgroup: CgroupRef,
    pub pid: u32,
    pub comm: String,
    pub forks_in_window: u64,
    pub window_ms: u64,
    pub max_forks: u64,
}

impl Probe for ForkStorm {
    const KIND: u32 = KIND_FORK_STORM;
    const NAME: &'static str = "fork_storm";
    type Raw = ForkStormEvent;
    type Record = ForkStormRecord;

    fn new_cgroup(raw: &ForkStormEvent) -> Option<u64> {
        Some(raw.cgroup_id)
    }

    fn attribute(raw: &ForkStormEvent, context: &Context<'_>) -> Self {
        ForkStorm {
            cgroup: context.subject(raw.cgroup_id),
            pid: raw.pid,
            comm: comm(&raw.comm),
            forks_in_window: raw.forks_in_window,
            window_ms: raw.window_ns / 1_000_000,
            max_forks: raw.max_forks,
        }
    }

    fn record(&self, time: String, ktime_ns: u64) -> ForkStormRecord {
        ForkStormRecord {
            time,
            ktime_ns,
            cgroup: (&self.cgroup).into(),
            pid: self.pid,
            comm: self.comm.clone(),
            forks_in_window: self.forks_in_window,
            window_ms: self.window_ms,
            max_forks: self.max_forks,
        }
    }
}

impl ForkStormRecord {
    /// Its table row's columns: time, pod or cgroup, PID and details.
    pub(crate) fn columns(&self) -> (&str, String, String, String) {
        let Self {
            time,
            cgroup,
            pid,
            comm,
            forks_in_window,
            window_ms,
            max_forks,
            ..
        } = self;
        (
            time,
            cgroup.label(),
            pid.to_string(),
            format!("{comm}: {forks_in_window} forks in {window_ms} ms (limit {max_forks})"),
        )
    }
}
