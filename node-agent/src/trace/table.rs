//! The table rendering of records: one row per record, for people.

use super::record::{Crossing, OomConstraint, Record};

impl Record {
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
                    "{} oom; rss anon {} file {} shmem {}; oom_score_adj {oom_score_adj}",
                    match constraint {
                        OomConstraint::CgroupLimit => "cgroup_limit",
                        OomConstraint::System => "system",
                        OomConstraint::Unknown => "unknown",
                    },
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
                format!("{}: usage {} vs threshold {}", crossing(*direction), mib(*usage_bytes), mib(*threshold_bytes)),
            ),
            Record::PidThreshold { time, direction, available, threshold, live, limit, .. } => (
                time,
                "node".into(),
                "-".into(),
                "-".into(),
                format!("{}: pid.available {available} vs threshold {threshold} ({live} of {limit} in use)", crossing(*direction)),
            ),
            Record::ForkStorm { time, cgroup, pid, comm, forks_in_window, window_ms, max_forks, .. } => (
                time,
                cgroup.label(),
                pid.to_string(),
                comm.clone(),
                format!("{forks_in_window} forks within {window_ms} ms (limit {max_forks})"),
            ),
            Record::Eviction { time, namespace, name, signal, observed, threshold, result, reason, grace_period_seconds, .. } => (
                time,
                format!("{namespace}/{name}"),
                "-".into(),
                "-".into(),
                format!(
                    "{}: {signal} {observed} < {threshold}; grace period {grace_period_seconds}s{}",
                    result.as_str(),
                    reason.as_deref().map(|r| format!("; {r}")).unwrap_or_default()
                ),
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

fn crossing(d: Crossing) -> &'static str {
    match d {
        Crossing::Up => "up",
        Crossing::Down => "down",
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1}MiB", bytes as f64 / (1 << 20) as f64)
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use node_agent_common::{
        ForkStormEvent, MemoryThresholdEvent, DIRECTION_UP, KIND_MEMORY_THRESHOLD,
    };
    use node_agent_kube::{
        evict::{Attempt, EvictionResult},
        executor::Report,
    };
    use node_agent_policy::{Format, Quantity, Resource, Signal};

    use super::*;
    use crate::{
        cgroup::{
            attribution::{attribute, NoNames},
            CgroupIndex,
        },
        ebpf::KernelEvent,
    };

    #[test]
    fn json_lines_carry_the_kind_the_enums_and_the_figures() {
        let dir = tempfile::tempdir().unwrap();
        let index = CgroupIndex::scan(dir.path()).unwrap();
        let mut ev = MemoryThresholdEvent::default();
        ev.header.kind = KIND_MEMORY_THRESHOLD;
        ev.cgroup_id = 77;
        ev.usage_bytes = 3 << 20;
        ev.threshold_bytes = 2 << 20;
        ev.direction = DIRECTION_UP;
        let a = attribute(&KernelEvent::MemoryThreshold(ev), &index, &NoNames, 4096).unwrap();
        let rec = Record::event(&a, "t".into());
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
        assert_eq!(
            serde_json::from_str::<Record>(&rec.json()).unwrap(),
            rec,
            "clients parse it back"
        );

        let storm = ForkStormEvent {
            window_ns: 2_000_000_000,
            forks_in_window: 9,
            max_forks: 8,
            ..Default::default()
        };
        let a = attribute(&KernelEvent::ForkStorm(storm), &index, &NoNames, 4096).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&Record::event(&a, "t".into()).json()).unwrap();
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
            let a = attribute(&KernelEvent::PidThreshold(ev), &index, &NoNames, 4096).unwrap();
            let v: serde_json::Value =
                serde_json::from_str(&Record::event(&a, "t".into()).json()).unwrap();
            assert_eq!(v["available"], available, "limit {limit}, live {live}");
        }
    }

    #[test]
    fn an_eviction_record_is_the_decision_and_its_outcome() {
        let report = Report {
            eviction: node_agent_policy::Eviction {
                namespace: "shop".into(),
                name: "web".into(),
                uid: Some("u1".into()),
                signal: Signal::MemoryAvailable,
                resource: Resource::Memory,
                hard: true,
                grace_period_seconds: 1,
                message: "The node was low on resource: memory. ".into(),
                offending_containers: vec![],
                threshold_quantity: Quantity::from_int(100 << 20, Format::BinarySi),
                available: Quantity::from_int(60 << 20, Format::BinarySi),
            },
            trigger_ktime_ns: Some(5),
            attempt: Attempt::new(
                EvictionResult::BlockedByPdb,
                "Cannot evict pod as it would violate the pod's disruption budget.",
            ),
            event_error: None,
            at: SystemTime::now(),
        };
        let rec = Record::eviction(&report, "t".into());
        let v: serde_json::Value = serde_json::from_str(&rec.json()).unwrap();
        assert_eq!(
            (
                v["kind"].as_str(),
                v["signal"].as_str(),
                v["result"].as_str()
            ),
            (
                Some("eviction"),
                Some("memory.available"),
                Some("blocked_by_pdb")
            )
        );
        assert_eq!(
            (v["observed"].as_i64(), v["threshold"].as_i64()),
            (Some(60 << 20), Some(100 << 20))
        );
        assert!(v["reason"].as_str().unwrap().contains("disruption budget"));
        assert_eq!(serde_json::from_str::<Record>(&rec.json()).unwrap(), rec);
        assert!(rec.table_row().contains("blocked_by_pdb: memory.available"));
        assert!(
            serde_json::from_str::<Record>(&rec.json().replace("blocked_by_pdb", "vanished"))
                .is_err(),
            "an unknown result is refused"
        );
    }
}
