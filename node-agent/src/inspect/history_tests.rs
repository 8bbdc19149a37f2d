//! The per-pod window: what is kept, merged, shown and forgotten.

use node_agent_kube::evict::EvictionResult;
use node_agent_policy::{EvictionSignal, NotEvictableNow, PassReason, Signal, StorageLimit};

use super::*;
use crate::{
    probes::oom_kill::{OomConstraint, OomKillRecord},
    trace::{CgroupRef, PodRef, Qos, Record},
};

const S: i128 = 1_000_000_000;

fn pod(ns: &str, name: &str) -> PodId {
    PodId::Named {
        namespace: ns.into(),
        name: name.into(),
    }
}

fn chosen(observed: i64) -> Seen {
    Seen::Chosen {
        signal: EvictionSignal::from(Signal::MemoryAvailable),
        hard: true,
        observed,
        threshold: 200 << 20,
    }
}

fn passed(reason: PassReason) -> Seen {
    Seen::PassedOver {
        signal: Signal::MemoryAvailable,
        reason,
    }
}

fn eviction(result: EvictionResult, reason: Option<String>) -> Seen {
    Seen::Record(Box::new(Record::Eviction {
        time: "t".into(),
        trigger_ktime_ns: None,
        namespace: "shop".into(),
        name: "web".into(),
        uid: None,
        signal: Signal::MemoryAvailable.into(),
        hard: true,
        observed: 1,
        threshold: 2,
        grace_period_seconds: 1,
        result,
        reason,
        message: "m".into(),
        early: false,
    }))
}

fn oom(cgroup_id: u64, comm: &str) -> Seen {
    Seen::Record(Box::new(Record::OomKill(OomKillRecord {
        time: "t".into(),
        ktime_ns: 0,
        cgroup: CgroupRef {
            id: cgroup_id,
            path: Some("/kubepods/podx/c".into()),
            pod: Some(PodRef {
                uid: "x".into(),
                qos: Qos::Burstable,
                container_id: None,
                namespace: Some("shop".into()),
                name: Some("web".into()),
                container: Some("main".into()),
            }),
        },
        pid: 1,
        tgid: 1,
        comm: comm.into(),
        uid: 0,
        oom_score_adj: 0,
        constraint: OomConstraint::CgroupLimit,
        limit_cgroup: None,
        total_vm_bytes: 0,
        anon_rss_bytes: 0,
        file_rss_bytes: 0,
        shmem_rss_bytes: 0,
        saw_before: None,
    })))
}

/// (first, last, count, fact kind) of each entry shown.
fn shape(entries: &[Stored]) -> Vec<(i128, i128, u32, &'static str)> {
    entries
        .iter()
        .map(|e| {
            let what = match &e.seen {
                Seen::Chosen { .. } => "chosen",
                Seen::PassedOver { .. } => "passed_over",
                Seen::OverLimitKept { .. } => "over_limit_kept",
                Seen::Record(r) => r.kind(),
            };
            (e.first / S, e.last / S, e.count, what)
        })
        .collect()
}

#[test]
fn a_pod_history_keeps_merges_and_forgets_as_each_row_says() {
    type Fill = Box<dyn Fn(&mut History)>;
    type Shape = Vec<(i128, i128, u32, &'static str)>;
    let w = WINDOW.as_secs() as i128;
    let rows: Vec<(&str, Fill, i128, Shape)> = vec![
        ("nothing noted", Box::new(|_| {}), 10, vec![]),
        (
            "chosen at every evaluation is one entry from the first to the last time",
            Box::new(|h| {
                for t in 1..=5 {
                    h.note(pod("shop", "web"), chosen(t as i64), t * S);
                }
            }),
            6,
            vec![(1, 5, 5, "chosen")],
        ),
        (
            "facts of different kinds stay apart, in order of first sight",
            Box::new(|h| {
                h.note(pod("shop", "web"), passed(PassReason::CriticalPriority), S);
                h.note(pod("shop", "web"), chosen(1), 2 * S);
                h.note(
                    pod("shop", "web"),
                    passed(PassReason::CriticalPriority),
                    3 * S,
                );
            }),
            4,
            vec![(1, 3, 2, "passed_over"), (2, 2, 1, "chosen")],
        ),
        (
            "passed over for another reason is another entry",
            Box::new(|h| {
                h.note(pod("shop", "web"), passed(PassReason::CriticalPriority), S);
                h.note(
                    pod("shop", "web"),
                    passed(PassReason::NotEvictableNow(
                        NotEvictableNow::BlockedByDisruptionBudget,
                    )),
                    2 * S,
                );
            }),
            3,
            vec![(1, 1, 1, "passed_over"), (2, 2, 1, "passed_over")],
        ),
        (
            "eviction outcomes merge by result: dry runs every pacing period are one entry",
            Box::new(|h| {
                for t in [1, 11, 21] {
                    h.note(
                        pod("shop", "web"),
                        eviction(EvictionResult::DryRun, None),
                        t * S,
                    );
                }
                h.note(
                    pod("shop", "web"),
                    eviction(EvictionResult::BlockedByPdb, None),
                    31 * S,
                );
            }),
            40,
            vec![(1, 21, 3, "eviction"), (31, 31, 1, "eviction")],
        ),
        (
            "kills of one command in one cgroup merge; another cgroup's do not",
            Box::new(|h| {
                h.note(pod("shop", "web"), oom(7, "hog"), S);
                h.note(pod("shop", "web"), oom(7, "hog"), 2 * S);
                h.note(pod("shop", "web"), oom(8, "hog"), 3 * S);
            }),
            4,
            vec![(1, 2, 2, "oom_kill"), (3, 3, 1, "oom_kill")],
        ),
        (
            "another pod's facts are not this pod's",
            Box::new(|h| {
                h.note(pod("shop", "cart"), chosen(1), S);
                h.note(pod("other", "web"), chosen(1), S);
            }),
            2,
            vec![],
        ),
        (
            "past the window: forgotten",
            Box::new(move |h| {
                h.note(pod("shop", "web"), chosen(1), S);
                h.note(pod("shop", "web"), passed(PassReason::OwnPod), 100 * S);
            }),
            100 + w,
            vec![(100, 100, 1, "passed_over")],
        ),
        (
            "at most MAX_ENTRIES kinds of fact, the oldest dropped",
            Box::new(|h| {
                for i in 0..(MAX_ENTRIES as i128 + 3) {
                    h.note(pod("shop", "web"), oom(i as u64, "hog"), (i + 1) * S);
                }
            }),
            100,
            (4..=(MAX_ENTRIES as i128 + 3))
                .map(|t| (t, t, 1, "oom_kill"))
                .collect(),
        ),
    ];
    for (what, fill, now, want) in rows {
        let mut h = History::default();
        fill(&mut h);
        assert_eq!(shape(&h.of("shop", "web", None, now * S)), want, "{what}");
    }
}

#[test]
fn a_pod_known_only_by_uid_is_found_by_its_uid_too() {
    let mut h = History::default();
    h.note(PodId::Uid("0a1b".into()), oom(7, "hog"), S);
    h.note(pod("shop", "web"), chosen(1), 2 * S);
    assert_eq!(
        shape(&h.of("shop", "web", Some("0a1b"), 3 * S)),
        [(1, 1, 1, "oom_kill"), (2, 2, 1, "chosen")]
    );
    assert_eq!(
        shape(&h.of("shop", "web", None, 3 * S)),
        [(2, 2, 1, "chosen")]
    );
}

#[test]
fn a_node_of_many_pods_never_grows_it_past_max_pods() {
    let mut h = History::default();
    for i in 0..(3 * MAX_PODS as i128) {
        h.note(pod("shop", &format!("p{i}")), chosen(1), i * S);
    }
    assert_eq!(h.pods(), MAX_PODS);
    // The most recently touched are the ones kept.
    let last = 3 * MAX_PODS as i128 - 1;
    assert_eq!(h.of("shop", &format!("p{last}"), None, last * S).len(), 1);
    assert!(h.of("shop", "p0", None, last * S).is_empty());
}

#[test]
fn others_chosen_are_the_latest_choices_of_other_pods() {
    let mut h = History::default();
    h.note(pod("shop", "a"), chosen(1), S);
    h.note(pod("shop", "b"), chosen(1), 2 * S);
    h.note(pod("shop", "c"), passed(PassReason::OwnPod), 3 * S);
    h.note(pod("shop", "web"), chosen(1), 4 * S);
    h.note(
        pod("shop", "d"),
        Seen::OverLimitKept {
            limit: StorageLimit::Pod,
            reason: PassReason::ExcludedNamespace,
        },
        5 * S,
    );
    let others: Vec<(PodId, i128)> = h
        .chosen_others("shop", "web", 6 * S, 5)
        .into_iter()
        .map(|(id, e)| (id, e.last / S))
        .collect();
    assert_eq!(others, [(pod("shop", "b"), 2), (pod("shop", "a"), 1)]);
    assert_eq!(h.chosen_others("shop", "web", 6 * S, 1).len(), 1);
}

#[test]
fn a_long_reason_from_the_api_server_is_cut() {
    let mut h = History::default();
    h.note(
        pod("shop", "web"),
        eviction(EvictionResult::Refused, Some("x".repeat(100_000))),
        S,
    );
    let shown = h.of("shop", "web", None, 2 * S);
    let Seen::Record(r) = &shown[0].seen else {
        panic!("a record")
    };
    let Record::Eviction {
        reason: Some(reason),
        ..
    } = r.as_ref()
    else {
        panic!("an eviction")
    };
    assert!(reason.len() <= 512 + '…'.len_utf8(), "{}", reason.len());
}
