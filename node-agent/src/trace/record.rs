//! What `trace` prints: one record per kernel event (or loss), attributed to a cgroup and pod,
//! rendered as a table row or a JSON line.

use serde::{Deserialize, Serialize};

use node_agent_common::{DIRECTION_UP, OOM_CGROUP_LIMIT, OOM_SYSTEM};

use crate::{
    cgroup::{CgroupIndex, PodCgroup},
    ebpf::{events::comm, KernelEvent},
};

/// The cgroup an event concerns, resolved through the cgroup index.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CgroupRef {
    pub id: u64,
    /// Path below the memory hierarchy's root; `None` if the cgroup is already gone.
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PodRef {
    pub uid: String,
    pub qos: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
}

impl CgroupRef {
    pub fn resolve(index: &CgroupIndex, id: u64) -> Self {
        let entry = index.lookup(id);
        CgroupRef {
            id,
            path: entry.map(|e| format!("/{}", e.path.display())),
            pod: entry.and_then(|e| e.pod.as_ref()).map(PodRef::from),
        }
    }

    fn label(&self) -> String {
        match (&self.pod, &self.path) {
            (Some(pod), _) => format!("pod {}", pod.uid),
            (None, Some(path)) => path.clone(),
            (None, None) => format!("cgroup #{}", self.id),
        }
    }
}

impl From<&PodCgroup> for PodRef {
    fn from(p: &PodCgroup) -> Self {
        PodRef {
            uid: p.pod_uid.clone(),
            qos: format!("{:?}", p.qos),
            container_id: p.container_id.clone(),
        }
    }
}

/// One line of `trace` output. `kind` is the JSON tag. The daemon sends these same JSON lines
/// to attached `trace` clients, which parse them back.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    OomKill {
        time: String,
        ktime_ns: u64,
        cgroup: CgroupRef,
        pid: u32,
        tgid: u32,
        comm: String,
        uid: u32,
        oom_score_adj: i32,
        /// `cgroup_limit`, `system` or `unknown`.
        constraint: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit_cgroup: Option<CgroupRef>,
        total_vm_bytes: u64,
        anon_rss_bytes: u64,
        file_rss_bytes: u64,
        shmem_rss_bytes: u64,
    },
    MemoryThreshold {
        time: String,
        ktime_ns: u64,
        cgroup: CgroupRef,
        direction: String,
        usage_bytes: u64,
        threshold_bytes: u64,
    },
    PidThreshold {
        time: String,
        ktime_ns: u64,
        direction: String,
        available: i64,
        threshold: u64,
        live: i64,
        limit: u64,
    },
    ForkStorm {
        time: String,
        ktime_ns: u64,
        cgroup: CgroupRef,
        pid: u32,
        comm: String,
        forks_in_window: u64,
        window_ms: u64,
        max_forks: u64,
    },
    /// A pod chosen for eviction, and what became of it (`evicted`, `dry_run`,
    /// `blocked_by_pdb`, `pdb_overridden`, `already_gone`, `refused`, `failed`).
    Eviction {
        time: String,
        /// Kernel timestamp of the event that triggered the evaluation, if one did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        trigger_ktime_ns: Option<u64>,
        namespace: String,
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        uid: Option<String>,
        signal: String,
        hard: bool,
        /// The signal's observed value (available bytes, inodes or PIDs) and its threshold.
        observed: i64,
        threshold: i64,
        grace_period_seconds: i64,
        result: String,
        message: String,
    },
    EventsLost {
        time: String,
        /// Records lost since the previous `events_lost` line.
        lost: u64,
        /// Records lost since the programs were loaded, per CPU.
        total_per_cpu: Vec<u64>,
    },
}

fn direction(d: u32) -> String {
    if d == DIRECTION_UP { "up" } else { "down" }.to_string()
}

impl Record {
    /// Builds the record for a kernel event (`None` for internal bookkeeping events). `time` is the wall-clock rendering of the event's
    /// kernel timestamp; `page_size` converts page counts.
    pub fn from_event(
        event: &KernelEvent,
        index: &CgroupIndex,
        time: String,
        page_size: u64,
    ) -> Option<Record> {
        let ktime_ns = event.header().ktime_ns;
        Some(match event {
            KernelEvent::OomKill(e) => Record::OomKill {
                time,
                ktime_ns,
                cgroup: CgroupRef::resolve(index, e.cgroup_id),
                pid: e.pid,
                tgid: e.tgid,
                comm: comm(&e.comm),
                uid: e.uid,
                oom_score_adj: e.oom_score_adj,
                constraint: match e.constraint {
                    OOM_CGROUP_LIMIT => "cgroup_limit",
                    OOM_SYSTEM => "system",
                    _ => "unknown",
                }
                .to_string(),
                limit_cgroup: (e.limit_cgroup_id != 0)
                    .then(|| CgroupRef::resolve(index, e.limit_cgroup_id)),
                total_vm_bytes: e.total_vm.saturating_mul(page_size),
                anon_rss_bytes: e.anon_rss.saturating_mul(page_size),
                file_rss_bytes: e.file_rss.saturating_mul(page_size),
                shmem_rss_bytes: e.shmem_rss.saturating_mul(page_size),
            },
            KernelEvent::MemoryThreshold(e) => Record::MemoryThreshold {
                time,
                ktime_ns,
                cgroup: CgroupRef::resolve(index, e.cgroup_id),
                direction: direction(e.direction),
                usage_bytes: e.usage_bytes,
                threshold_bytes: e.threshold_bytes,
            },
            KernelEvent::PidThreshold(e) => Record::PidThreshold {
                time,
                ktime_ns,
                direction: direction(e.direction),
                // Saturating: a corrupt record must not overflow (found by fuzzing).
                available: i64::try_from(e.limit)
                    .unwrap_or(i64::MAX)
                    .saturating_sub(e.live),
                threshold: e.threshold,
                live: e.live,
                limit: e.limit,
            },
            KernelEvent::ForkStorm(e) => Record::ForkStorm {
                time,
                ktime_ns,
                cgroup: CgroupRef::resolve(index, e.cgroup_id),
                pid: e.pid,
                comm: comm(&e.comm),
                forks_in_window: e.forks_in_window,
                window_ms: e.window_ns / 1_000_000,
                max_forks: e.max_forks,
            },
            // Bookkeeping for the cgroup index, not something to show.
            KernelEvent::CgroupChange(_) => return None,
        })
    }

    /// The JSON tag of this record's kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Record::OomKill { .. } => "oom_kill",
            Record::MemoryThreshold { .. } => "memory_threshold",
            Record::PidThreshold { .. } => "pid_threshold",
            Record::ForkStorm { .. } => "fork_storm",
            Record::Eviction { .. } => "eviction",
            Record::EventsLost { .. } => "events_lost",
        }
    }

    /// The pod UID the record concerns, if any.
    pub fn pod_uid(&self) -> Option<&str> {
        match self {
            Record::Eviction { uid, .. } => uid.as_deref(),
            other => other
                .cgroup()
                .and_then(|c| c.pod.as_ref())
                .map(|p| p.uid.as_str()),
        }
    }

    pub fn cgroup(&self) -> Option<&CgroupRef> {
        match self {
            Record::OomKill { cgroup, .. }
            | Record::MemoryThreshold { cgroup, .. }
            | Record::ForkStorm { cgroup, .. } => Some(cgroup),
            Record::PidThreshold { .. } | Record::Eviction { .. } | Record::EventsLost { .. } => {
                None
            }
        }
    }

    pub fn json(&self) -> String {
        serde_json::to_string(self).expect("records serialise: plain strings and numbers")
    }

    pub const TABLE_HEADER: &'static str =
        "TIME                      KIND              CGROUP/POD                               PID      COMM             DETAILS";

    pub fn table_row(&self) -> String {
        let (time, who, pid, comm, details) = match self {
            Record::OomKill { time, cgroup, pid, comm, constraint, anon_rss_bytes, file_rss_bytes, shmem_rss_bytes, oom_score_adj, .. } => (
                time,
                cgroup.label(),
                pid.to_string(),
                comm.clone(),
                format!(
                    "{constraint} oom; rss anon {} file {} shmem {}; oom_score_adj {oom_score_adj}",
                    mib(*anon_rss_bytes),
                    mib(*file_rss_bytes),
                    mib(*shmem_rss_bytes)
                ),
            ),
            Record::MemoryThreshold { time, cgroup, direction, usage_bytes, threshold_bytes, .. } => (
                time,
                cgroup.label(),
                "-".into(),
                "-".into(),
                format!("{direction}: usage {} vs threshold {}", mib(*usage_bytes), mib(*threshold_bytes)),
            ),
            Record::PidThreshold { time, direction, available, threshold, live, limit, .. } => (
                time,
                "node".into(),
                "-".into(),
                "-".into(),
                format!("{direction}: pid.available {available} vs threshold {threshold} ({live} of {limit} in use)"),
            ),
            Record::ForkStorm { time, cgroup, pid, comm, forks_in_window, window_ms, max_forks, .. } => (
                time,
                cgroup.label(),
                pid.to_string(),
                comm.clone(),
                format!("{forks_in_window} forks within {window_ms} ms (limit {max_forks})"),
            ),
            Record::Eviction { time, namespace, name, signal, observed, threshold, result, grace_period_seconds, .. } => (
                time,
                format!("{namespace}/{name}"),
                "-".into(),
                "-".into(),
                format!("{result}: {signal} {observed} < {threshold}; grace period {grace_period_seconds}s"),
            ),
            Record::EventsLost { time, lost, total_per_cpu, .. } => (
                time,
                "-".into(),
                "-".into(),
                "-".into(),
                format!("{lost} kernel events lost (ring buffer full); per CPU since start {total_per_cpu:?}"),
            ),
        };
        format!(
            "{time:<25} {:<17} {who:<40} {pid:<8} {comm:<16} {details}",
            self.kind()
        )
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1}MiB", bytes as f64 / (1 << 20) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use node_agent_common::{ForkStormEvent, MemoryThresholdEvent, KIND_MEMORY_THRESHOLD};

    #[test]
    fn json_lines_carry_the_kind_and_the_figures() {
        let dir = tempfile::tempdir().unwrap();
        let index = CgroupIndex::scan(dir.path()).unwrap();
        let mut ev = MemoryThresholdEvent::default();
        ev.header.kind = KIND_MEMORY_THRESHOLD;
        ev.cgroup_id = 77;
        ev.usage_bytes = 3 << 20;
        ev.threshold_bytes = 2 << 20;
        ev.direction = DIRECTION_UP;
        let rec = Record::from_event(&KernelEvent::MemoryThreshold(ev), &index, "t".into(), 4096)
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&rec.json()).unwrap();
        assert_eq!(v["kind"], "memory_threshold");
        assert_eq!(v["direction"], "up");
        assert_eq!(v["usage_bytes"], 3 << 20);
        assert_eq!(v["cgroup"]["id"], 77);
        assert_eq!(
            v["cgroup"]["path"],
            serde_json::Value::Null,
            "unknown cgroup has no path"
        );
        assert!(rec.table_row().contains("cgroup #77"));

        let storm = ForkStormEvent {
            window_ns: 2_000_000_000,
            forks_in_window: 9,
            max_forks: 8,
            ..Default::default()
        };
        let rec =
            Record::from_event(&KernelEvent::ForkStorm(storm), &index, "t".into(), 4096).unwrap();
        let v: serde_json::Value = serde_json::from_str(&rec.json()).unwrap();
        assert_eq!(
            (v["kind"].as_str(), v["window_ms"].as_u64()),
            (Some("fork_storm"), Some(2000))
        );
    }

    /// Found by the ring_record fuzz target: `limit as i64 - live` overflowed (a panic in
    /// debug builds, a wrapped figure in release ones) on figures no kernel sends but a
    /// corrupt record can hold.
    #[test]
    fn pid_figures_out_of_range_saturate_instead_of_overflowing() {
        use node_agent_common::PidThresholdEvent;
        let dir = tempfile::tempdir().unwrap();
        let index = CgroupIndex::scan(dir.path()).unwrap();
        for (limit, live, available) in [
            (32768, 30000, 2768),
            (u64::MAX, -1, i64::MAX),
            (u64::MAX, i64::MIN, i64::MAX),
            (0, i64::MAX, -i64::MAX),
            (0, i64::MIN, i64::MAX),
        ] {
            let ev = PidThresholdEvent {
                limit,
                live,
                ..Default::default()
            };
            let rec = Record::from_event(&KernelEvent::PidThreshold(ev), &index, "t".into(), 4096)
                .unwrap();
            let v: serde_json::Value = serde_json::from_str(&rec.json()).unwrap();
            assert_eq!(v["available"], available, "limit {limit}, live {live}");
        }
    }
}
