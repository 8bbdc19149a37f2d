//! The table rendering of records: one row per record, for people, within [`ROW_WIDTH`]
//! characters, in human units. JSON Lines (`--output json`) keep every field and raw figures.

use node_agent_executor::reclaim::ReclaimResult;
use node_agent_policy::{EvictionSignal, Resource};

use super::record::Record;
use crate::probes::parts::bytes;

/// The widest row the table prints (a terminal of 120 columns shows it whole).
pub const ROW_WIDTH: usize = 120;
const TIME: usize = 15;
const KIND: usize = 16;
const WHO: usize = 28;
const PID: usize = 7;

impl Record {
    pub const TABLE_HEADER: &'static str =
        "TIME            KIND             POD/CGROUP                   PID     DETAILS";

    pub fn table_row(&self) -> String {
        let (time, who, pid, details) = self.columns();
        let row = format!(
            "{:<TIME$} {:<KIND$} {:<WHO$} {:<PID$} {details}",
            time_of_day(time),
            self.kind(),
            tail(&who, WHO),
            tail(&pid, PID),
        );
        head(&row, ROW_WIDTH)
    }

    /// One line without the time: the kind, who it concerns and what happened, whole
    /// (`kubectl node-agent explain` lists a pod's records with their own times).
    pub fn describe(&self) -> String {
        let (_, who, pid, details) = self.columns();
        match pid.as_str() {
            "-" => format!("{} {who}: {details}", self.kind()),
            pid => format!("{} {who} (pid {pid}): {details}", self.kind()),
        }
    }

    /// The table's columns: time, pod or cgroup, PID and details.
    fn columns(&self) -> (&str, String, String, String) {
        match self {
            Record::OomKill(r) => r.columns(),
            Record::MemoryThreshold(r) => r.columns(),
            Record::PidThreshold(r) => r.columns(),
            Record::ForkStorm(r) => r.columns(),
            Record::Eviction {
                time,
                namespace,
                name,
                signal,
                observed,
                threshold,
                result,
                reason,
                grace_period_seconds,
                early,
                ..
            } => {
                let resource = signal
                    .threshold()
                    .map_or(Resource::EphemeralStorage, |s| s.resource());
                let unit = |v: i64| match resource {
                    Resource::Memory | Resource::EphemeralStorage => {
                        bytes(u64::try_from(v).unwrap_or(0))
                    }
                    Resource::Inodes | Resource::Pids => v.to_string(),
                };
                // A threshold is met below its line (or ahead of it, falling faster than
                // relief could follow); a local storage limit is passed above it.
                let relation = match (signal.threshold().is_some(), early) {
                    (true, false) => "<",
                    (true, true) => "falling fast towards",
                    (false, _) => ">",
                };
                (
                    time,
                    format!("{namespace}/{name}"),
                    "-".into(),
                    format!(
                        "{}: {signal} {} {relation} {}, grace {grace_period_seconds}s{}",
                        result.as_str(),
                        unit(*observed),
                        unit(*threshold),
                        reason
                            .as_deref()
                            .map(|r| format!("; {r}"))
                            .unwrap_or_default()
                    ),
                )
            }
            Record::Reclaim {
                time,
                signal,
                result,
                containers_removed,
                images_removed,
                failed,
                skipped,
                expected_bytes,
                available_after,
                summary,
                steps,
            } => {
                (time, signal.as_str().into(), "-".into(), {
                    let after = available_after
                        .map(|v| match signal.resource() {
                            Resource::Inodes | Resource::Pids => format!("; {v} after"),
                            _ => format!("; {} after", bytes(u64::try_from(v).unwrap_or(0))),
                        })
                        .unwrap_or_default();
                    let expected = bytes(*expected_bytes);
                    match result {
                        ReclaimResult::Reclaimed | ReclaimResult::Partial => format!(
                        "{}: {containers_removed} ctr, {images_removed} img, {expected}{}{}{after}",
                        result.as_str(),
                        if *failed > 0 { format!("; {failed} failed") } else { String::new() },
                        if *skipped > 0 { format!(", {skipped} skipped") } else { String::new() },
                    ),
                        ReclaimResult::DryRun => {
                            format!("dry_run: would remove {}, {expected}{after}", steps.len())
                        }
                        ReclaimResult::NothingToReclaim => {
                            format!("nothing_to_reclaim{after}")
                        }
                        ReclaimResult::RuntimeUnavailable => {
                            format!("runtime_unavailable: {summary}")
                        }
                    }
                })
            }
            Record::EventsLost {
                time,
                lost,
                total_per_cpu,
                ..
            } => (
                time,
                "-".into(),
                "-".into(),
                format!(
                    "{lost} kernel events lost (ring buffer full); {} since start",
                    total_per_cpu.iter().sum::<u64>()
                ),
            ),
            Record::StreamLost { time, lost } => (
                time,
                "-".into(),
                "-".into(),
                format!(
                    "{lost} records not sent to this reader: it read more slowly than they came"
                ),
            ),
        }
    }
}

/// A signal's value in its unit: bytes in binary units for memory and disk space (and a local
/// storage limit), a plain count for inodes and PIDs; a name no signal has, as given.
pub fn signal_value(signal: &str, value: i64) -> String {
    match signal.parse::<EvictionSignal>() {
        Ok(s) => match s
            .threshold()
            .map_or(Resource::EphemeralStorage, |s| s.resource())
        {
            Resource::Memory | Resource::EphemeralStorage => {
                bytes(u64::try_from(value).unwrap_or(0))
            }
            Resource::Inodes | Resource::Pids => value.to_string(),
        },
        Err(_) => value.to_string(),
    }
}

/// `23:05:25.123456` from `2026-11-22T23:05:25.123456Z` (the date is in the JSON).
fn time_of_day(rfc3339: &str) -> &str {
    rfc3339
        .split_once('T')
        .map_or(rfc3339, |(_, t)| t.trim_end_matches('Z'))
}

/// At most `width` characters, the end kept (a path's or pod's distinguishing part).
fn tail(s: &str, width: usize) -> String {
    let n = s.chars().count();
    if n <= width {
        return s.to_string();
    }
    let keep: String = s.chars().skip(n - (width - 1)).collect();
    format!("…{keep}")
}

/// At most `width` characters, the start kept.
fn head(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.trim_end().to_string();
    }
    let keep: String = s.chars().take(width - 1).collect();
    format!("{keep}…")
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use node_agent_common::{
        ForkStormEvent, MemoryThresholdEvent, DIRECTION_UP, KIND_MEMORY_THRESHOLD,
    };
    use node_agent_executor::Report;
    use node_agent_kube::evict::{Attempt, EvictionResult};
    use node_agent_policy::{Format, Quantity, Resource, Signal};

    use super::*;
    use crate::{
        cgroup::CgroupIndex,
        ebpf::KernelEvent,
        probes::{attribute, NoNames},
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
                signal: Signal::MemoryAvailable.into(),
                resource: Resource::Memory,
                hard: true,
                grace_period_seconds: 1,
                message: "The node was low on resource: memory. ".into(),
                offending_containers: vec![],
                threshold_quantity: Quantity::from_int(100 << 20, Format::BinarySi),
                available: Quantity::from_int(60 << 20, Format::BinarySi),
                early: false,
            },
            trigger_ktime_ns: Some(5),
            attempt: Attempt::new(
                EvictionResult::BlockedByPdb,
                "Cannot evict pod as it would violate the pod's disruption budget.",
            ),
            killed: None,
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
        assert!(
            rec.table_row()
                .contains("blocked_by_pdb: memory.available 60.0Mi < 100.0Mi"),
            "{}",
            rec.table_row()
        );
        assert!(
            serde_json::from_str::<Record>(&rec.json().replace("blocked_by_pdb", "vanished"))
                .is_err(),
            "an unknown result is refused"
        );
    }

    #[test]
    fn rows_stay_within_the_width_aligned_under_the_header() {
        let long = "x".repeat(300);
        let rows = [
            serde_json::json!({"kind": "eviction", "time": "2026-11-22T23:05:25.123456Z",
                "namespace": long, "name": "web", "uid": "u", "signal": "nodefs.inodesFree",
                "hard": true, "observed": 10, "threshold": 20, "grace_period_seconds": 0,
                "result": "failed", "reason": long, "message": "m"}),
            serde_json::json!({"kind": "fork_storm", "time": "2026-11-22T23:05:25.123456Z",
                "ktime_ns": 1, "cgroup": {"id": 1, "path": format!("/kubepods/{long}/tail")},
                "pid": 4_194_304, "comm": "sh", "forks_in_window": 9, "window_ms": 1000,
                "max_forks": 8}),
            serde_json::json!({"kind": "reclaim", "time": "2026-11-22T23:05:25.123456Z",
                "signal": "imagefs.inodesFree", "result": "partial", "containers_removed": 12345,
                "images_removed": 67890, "failed": 11111, "skipped": 22222,
                "expected_bytes": u64::MAX, "available_after": i64::MAX, "summary": long, "steps": []}),
            serde_json::json!({"kind": "reclaim", "time": "2026-11-22T23:05:25.123456Z",
                "signal": "nodefs.available", "result": "runtime_unavailable", "containers_removed": 0,
                "images_removed": 0, "failed": 0, "skipped": 0, "expected_bytes": 0, "summary": long}),
        ];
        let header_columns: Vec<usize> = column_starts(Record::TABLE_HEADER);
        assert!(Record::TABLE_HEADER.chars().count() <= ROW_WIDTH);
        for v in rows {
            let rec: Record = serde_json::from_value(v).unwrap();
            let row = rec.table_row();
            assert!(row.chars().count() <= ROW_WIDTH, "{row}");
            let cells: Vec<char> = row.chars().collect();
            for &c in &header_columns[1..] {
                assert!(
                    cells[c - 1] == ' ' && cells[c] != ' ',
                    "column at {c}: {row}"
                );
            }
            assert!(row.starts_with("23:05:25.123456 "), "{row}");
            if let Record::Eviction { .. } = rec {
                assert_eq!(row.chars().count(), ROW_WIDTH, "{row}");
                assert!(row.ends_with('…'), "a long reason is cut: {row}");
            }
        }
        let tail_kept = serde_json::from_value::<Record>(serde_json::json!({"kind": "fork_storm",
            "time": "t", "ktime_ns": 1, "cgroup": {"id": 1, "path": format!("/a/{long}/tail")},
            "pid": 1, "comm": "sh", "forks_in_window": 9, "window_ms": 1000, "max_forks": 8}))
        .unwrap()
        .table_row();
        assert!(
            tail_kept.contains(" …xxx") && tail_kept.contains("xxx/tail "),
            "the end of a long path is kept: {tail_kept}"
        );
    }

    fn column_starts(header: &str) -> Vec<usize> {
        let chars: Vec<char> = header.chars().collect();
        (0..chars.len())
            .filter(|&i| chars[i] != ' ' && (i == 0 || chars[i - 1] == ' '))
            .collect()
    }

    #[test]
    fn a_reclaim_row_says_what_was_removed_and_what_is_available_after() {
        let row = |v: serde_json::Value| serde_json::from_value::<Record>(v).unwrap().table_row();
        let done = row(
            serde_json::json!({"kind": "reclaim", "time": "2026-11-22T23:05:25.123456Z",
            "signal": "nodefs.available", "result": "reclaimed", "containers_removed": 1,
            "images_removed": 2, "failed": 0, "skipped": 0, "expected_bytes": 23_383_244,
            "available_after": 1_073_741_824_i64, "summary": "s", "steps": []}),
        );
        assert!(
            done.ends_with(
                "nodefs.available             -       reclaimed: 1 ctr, 2 img, 22.3Mi; 1.0Gi after"
            ),
            "{done}"
        );
        let dry = row(
            serde_json::json!({"kind": "reclaim", "time": "t", "signal": "imagefs.inodesFree",
            "result": "dry_run", "containers_removed": 0, "images_removed": 0, "failed": 0, "skipped": 0,
            "expected_bytes": 2048, "available_after": 500, "summary": "s", "steps": [{}, {}]}),
        );
        assert!(
            dry.ends_with(
                "imagefs.inodesFree           -       dry_run: would remove 2, 2.0Ki; 500 after"
            ),
            "{dry}"
        );
        let partial = row(
            serde_json::json!({"kind": "reclaim", "time": "t", "signal": "nodefs.available",
            "result": "partial", "containers_removed": 0, "images_removed": 1, "failed": 1, "skipped": 2,
            "expected_bytes": 0, "summary": "s"}),
        );
        assert!(
            partial.ends_with("partial: 0 ctr, 1 img, 0B; 1 failed, 2 skipped"),
            "{partial}"
        );
    }

    #[test]
    fn byte_figures_in_binary_units() {
        for (b, want) in [
            (0, "0B"),
            (1023, "1023B"),
            (1024, "1.0Ki"),
            (80 << 20, "80.0Mi"),
            (3 << 29, "1.5Gi"),
            (u64::MAX, "16384.0Pi"),
        ] {
            assert_eq!(bytes(b), want, "{b}");
        }
    }
}
