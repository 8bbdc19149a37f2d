//! OOM kills: the kernel's OOM killer chose a victim and is about to kill it (kernel side:
//! `node-agent-ebpf/src/oom.rs`). The daemon tells the victim's pod (see `run::oom`).

use node_agent_common::{OomKillEvent, KIND_OOM_KILL, OOM_CGROUP_LIMIT, OOM_SYSTEM};
use serde::{Deserialize, Serialize};

use super::{
    comm,
    parts::{bytes, CgroupRef},
    Context, Probe, Subject,
};
use crate::saw_before::SawBefore;

/// Why the OOM killer ran, as far as the kernel side can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Constraint {
    /// A cgroup's memory limit.
    CgroupLimit,
    /// The whole node ran out.
    System,
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomKill {
    pub victim: Subject,
    /// The cgroup whose limit was hit, when a limit was.
    pub limit: Option<Subject>,
    pub pid: u32,
    pub tgid: u32,
    pub comm: String,
    pub uid: u32,
    pub oom_score_adj: i32,
    pub constraint: Constraint,
    pub total_vm_bytes: u64,
    pub anon_rss_bytes: u64,
    pub file_rss_bytes: u64,
    pub shmem_rss_bytes: u64,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OomConstraint {
    CgroupLimit,
    System,
    Unknown,
}

/// An OOM kill in the live stream.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OomKillRecord {
    pub time: String,
    pub ktime_ns: u64,
    pub cgroup: CgroupRef,
    pub pid: u32,
    pub tgid: u32,
    pub comm: String,
    pub uid: u32,
    pub oom_score_adj: i32,
    pub constraint: OomConstraint,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_cgroup: Option<CgroupRef>,
    pub total_vm_bytes: u64,
    pub anon_rss_bytes: u64,
    pub file_rss_bytes: u64,
    pub shmem_rss_bytes: u64,
    /// What the agent saw and did in the minute before (the daemon's stream only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saw_before: Option<Box<SawBefore>>,
}

impl Probe for OomKill {
    const KIND: u32 = KIND_OOM_KILL;
    const NAME: &'static str = "oom_kill";
    type Raw = OomKillEvent;
    type Record = OomKillRecord;

    fn new_cgroup(raw: &OomKillEvent) -> Option<u64> {
        Some(raw.cgroup_id)
    }

    /// The page counts in bytes, by the context's page size.
    fn attribute(raw: &OomKillEvent, context: &Context<'_>) -> Self {
        let page_size = context.page_size;
        OomKill {
            victim: context.subject(raw.cgroup_id),
            limit: (raw.limit_cgroup_id != 0).then(|| context.subject(raw.limit_cgroup_id)),
            pid: raw.pid,
            tgid: raw.tgid,
            comm: comm(&raw.comm),
            uid: raw.uid,
            oom_score_adj: raw.oom_score_adj,
            constraint: match raw.constraint {
                OOM_CGROUP_LIMIT => Constraint::CgroupLimit,
                OOM_SYSTEM => Constraint::System,
                _ => Constraint::Unknown,
            },
            total_vm_bytes: raw.total_vm.saturating_mul(page_size),
            anon_rss_bytes: raw.anon_rss.saturating_mul(page_size),
            file_rss_bytes: raw.file_rss.saturating_mul(page_size),
            shmem_rss_bytes: raw.shmem_rss.saturating_mul(page_size),
        }
    }

    /// Without what came before it: the daemon adds that (`Record::with_saw_before`).
    fn record(&self, time: String, ktime_ns: u64) -> OomKillRecord {
        OomKillRecord {
            time,
            ktime_ns,
            cgroup: (&self.victim).into(),
            pid: self.pid,
            tgid: self.tgid,
            comm: self.comm.clone(),
            uid: self.uid,
            oom_score_adj: self.oom_score_adj,
            constraint: match self.constraint {
                Constraint::CgroupLimit => OomConstraint::CgroupLimit,
                Constraint::System => OomConstraint::System,
                Constraint::Unknown => OomConstraint::Unknown,
            },
            limit_cgroup: self.limit.as_ref().map(CgroupRef::from),
            total_vm_bytes: self.total_vm_bytes,
            anon_rss_bytes: self.anon_rss_bytes,
            file_rss_bytes: self.file_rss_bytes,
            shmem_rss_bytes: self.shmem_rss_bytes,
            saw_before: None,
        }
    }
}

impl OomKillRecord {
    /// Its table row's columns: time, pod or cgroup, PID and details.
    pub(crate) fn columns(&self) -> (&str, String, String, String) {
        let Self {
            time,
            cgroup,
            pid,
            comm,
            constraint,
            anon_rss_bytes,
            file_rss_bytes,
            shmem_rss_bytes,
            oom_score_adj,
            saw_before,
            ..
        } = self;
        (
            time,
            cgroup.label(),
            pid.to_string(),
            format!(
                "{comm} killed ({}); rss anon {} file {} shmem {}; adj {oom_score_adj}{}",
                match constraint {
                    OomConstraint::CgroupLimit => "cgroup limit",
                    OomConstraint::System => "system",
                    OomConstraint::Unknown => "unknown",
                },
                bytes(*anon_rss_bytes),
                bytes(*file_rss_bytes),
                bytes(*shmem_rss_bytes),
                saw_before
                    .as_ref()
                    .map_or(String::new(), |s| format!("; {s}")),
            ),
        )
    }
}
