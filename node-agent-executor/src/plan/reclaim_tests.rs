//! Node-level reclaim in the acting plan: which decisions reclaim before evicting (disk
//! signals with reclaim functions for the layout, a runtime configured), that nothing is
//! evicted for a disk signal while a reclaim is out (memory and PIDs never wait for the
//! runtime), and that reclaims are paced.

use std::time::Duration;

use node_agent_cri::reclaim::{FsLayout, PodPhase};
use node_agent_policy::{
    Decision, Eviction, Format, MetThreshold, NodeCondition, PodInfo, Quantity, Signal,
};

use super::{Acting, NodeReclaim, PodCgroup};
use crate::action::Action;

const INTERVAL: Duration = Duration::from_secs(10);

fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

fn pods() -> Vec<PodInfo> {
    ["a", "b"]
        .into_iter()
        .map(|name| PodInfo {
            namespace: "shop".into(),
            name: name.into(),
            uid: Some(format!("uid-{name}")),
            ..PodInfo::default()
        })
        .chain(std::iter::once(PodInfo {
            namespace: "".into(),
            name: "/standalone".into(),
            uid: None,
            ..PodInfo::default()
        }))
        .collect()
}

/// `signal` met past its grace period (or not), pod `a` chosen.
fn decision(signal: Signal, past_grace: bool) -> Decision {
    Decision {
        thresholds_met: vec![MetThreshold {
            index: 0,
            signal,
            hard: true,
            held_by_min_reclaim: false,
            grace_period_passed: past_grace,
            early: false,
        }],
        conditions: vec![signal.node_condition()],
        reclaim: past_grace.then_some(signal),
        evictions: Vec::from_iter(past_grace.then(|| Eviction {
            namespace: "shop".into(),
            name: "a".into(),
            uid: Some("uid-a".into()),
            signal: signal.into(),
            resource: signal.resource(),
            hard: true,
            grace_period_seconds: 1,
            message: "m".into(),
            offending_containers: vec![],
            threshold_quantity: Quantity::from_int(100, Format::BinarySi),
            available: Quantity::from_int(10, Format::BinarySi),
            early: false,
        })),
        passed_over: Vec::new(),
        over_limit_passed_over: Vec::new(),
    }
}

fn cgroup(_: &PodInfo) -> Option<PodCgroup> {
    None
}

/// The first action that acts on the node: `reclaim <signal>`, `evict <pod>` or `none`.
fn first(actions: &[Action]) -> String {
    actions
        .iter()
        .find_map(|a| match a {
            Action::Reclaim(r) => Some(format!("reclaim {}", r.signal)),
            Action::Evict(e) => Some(format!("evict {}", e.pod.name)),
            _ => None,
        })
        .unwrap_or_else(|| "none".into())
}

fn acting(layout: Option<FsLayout>) -> Acting {
    Acting::with_node_reclaim(layout.map(|layout| NodeReclaim {
        layout,
        interval: INTERVAL,
    }))
}

#[test]
fn disk_signals_reclaim_before_evicting_memory_and_pids_evict_at_once() {
    use FsLayout::{SeparateImageFs, Shared, SplitImageFs};
    use Signal::*;
    let cases: &[(&str, Option<FsLayout>, Signal, bool, &str)] = &[
        (
            "memory evicts at once",
            Some(Shared),
            MemoryAvailable,
            true,
            "evict a",
        ),
        (
            "pids evict at once",
            Some(Shared),
            PidAvailable,
            true,
            "evict a",
        ),
        (
            "nodefs on a shared filesystem reclaims first",
            Some(Shared),
            NodeFsAvailable,
            true,
            "reclaim nodefs.available",
        ),
        (
            "nodefs inodes reclaim first",
            Some(Shared),
            NodeFsInodesFree,
            true,
            "reclaim nodefs.inodesFree",
        ),
        (
            "imagefs on its own filesystem reclaims first",
            Some(SeparateImageFs),
            ImageFsAvailable,
            true,
            "reclaim imagefs.available",
        ),
        (
            "nodefs beside a dedicated imagefs has nothing to reclaim: evicts",
            Some(SeparateImageFs),
            NodeFsAvailable,
            true,
            "evict a",
        ),
        (
            "nodefs with a split imagefs reclaims dead containers first",
            Some(SplitImageFs),
            NodeFsAvailable,
            true,
            "reclaim nodefs.available",
        ),
        (
            "without a runtime, disk evicts at once",
            None,
            NodeFsAvailable,
            true,
            "evict a",
        ),
        (
            "within the grace period, nothing is reclaimed or evicted",
            Some(Shared),
            NodeFsAvailable,
            false,
            "none",
        ),
    ];
    for (behaviour, layout, signal, past_grace, expected) in cases {
        let mut a = acting(*layout);
        let plan = a.plan(
            &decision(*signal, *past_grace),
            &pods(),
            true,
            None,
            &cgroup,
            s(0),
        );
        assert_eq!(first(&plan.actions), *expected, "{behaviour}");
        let evictions = plan
            .actions
            .iter()
            .filter(|a| matches!(a, Action::Evict(_)))
            .count();
        let reclaims = plan
            .actions
            .iter()
            .filter(|a| matches!(a, Action::Reclaim(_)))
            .count();
        assert!(
            evictions + reclaims <= 1,
            "{behaviour}: one of them at most"
        );
    }
}

#[test]
fn nothing_is_evicted_until_the_reclaim_is_back_then_reclaims_are_paced() {
    let mut a = acting(Some(FsLayout::Shared));
    let disk = decision(Signal::NodeFsAvailable, true);
    let plan =
        |a: &mut Acting, at| first(&a.plan(&disk, &pods(), true, None, &cgroup, s(at)).actions);
    assert_eq!(plan(&mut a, 0), "reclaim nodefs.available");
    // Polls while the executor works: neither a second reclaim nor an eviction.
    assert_eq!(plan(&mut a, 1), "none");
    assert_eq!(plan(&mut a, 30), "none", "however long it takes");
    // Back at 31: the loop observes again; the threshold still met evicts.
    a.reclaimed(s(31));
    assert_eq!(plan(&mut a, 31), "evict a");
    // Within the interval, no new reclaim (the eviction is in flight, so nothing).
    assert_eq!(plan(&mut a, 35), "none");
    // An interval after the last reclaim ended, the next one goes before any new eviction.
    assert_eq!(plan(&mut a, 41), "reclaim nodefs.available");
    assert_eq!(plan(&mut a, 42), "none");
}

#[test]
fn memory_and_pids_evict_at_once_while_a_disk_reclaim_runs() {
    // The kubelet would be reclaiming memory, not disk, once memory is the signal to reclaim;
    // a runtime that does not answer must never hold a memory eviction back.
    for signal in [Signal::MemoryAvailable, Signal::PidAvailable] {
        let mut a = acting(Some(FsLayout::Shared));
        let disk = decision(Signal::NodeFsAvailable, true);
        assert_eq!(
            first(&a.plan(&disk, &pods(), true, None, &cgroup, s(0)).actions),
            "reclaim nodefs.available"
        );
        assert_eq!(
            first(
                &a.plan(&decision(signal, true), &pods(), true, None, &cgroup, s(1))
                    .actions
            ),
            "evict a",
            "{signal}"
        );
        assert_eq!(
            first(&a.plan(&disk, &pods(), true, None, &cgroup, s(2)).actions),
            "none",
            "{signal}: the disk signal still waits for its reclaim"
        );
    }
}

#[test]
fn the_reclaim_carries_the_listed_pods_and_whether_the_list_is_fresh() {
    for fresh in [true, false] {
        let mut a = acting(Some(FsLayout::Shared));
        let plan = a.plan(
            &decision(Signal::ImageFsAvailable, true),
            &pods(),
            fresh,
            None,
            &cgroup,
            s(0),
        );
        let Some(Action::Reclaim(r)) = plan.actions.first() else {
            panic!("expected a reclaim first: {:?}", plan.actions);
        };
        assert_eq!(r.layout, FsLayout::Shared);
        assert_eq!(
            r.pods.sources_ready, fresh,
            "dead containers of unlisted pods go only on a fresh list"
        );
        let listed: Vec<(&str, PodPhase)> =
            r.pods.pods.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(
            listed,
            [("uid-a", PodPhase::Active), ("uid-b", PodPhase::Active)],
            "pods without a UID are not the runtime's"
        );
    }
}

#[test]
fn the_pressure_event_and_condition_still_go_with_the_reclaim() {
    let mut a = acting(Some(FsLayout::Shared));
    let plan = a.plan(
        &decision(Signal::NodeFsAvailable, true),
        &pods(),
        true,
        None,
        &cgroup,
        s(0),
    );
    assert!(
        matches!(plan.actions.first(), Some(Action::Reclaim(_))),
        "{:?}",
        plan.actions
    );
    assert!(plan
        .actions
        .iter()
        .any(|a| matches!(a, Action::NodeEvent(_))));
    assert!(plan.actions.iter().any(|a| matches!(a, Action::Status { conditions } if conditions == &[NodeCondition::DiskPressure])));
}

#[test]
fn turning_reclaim_off_on_reload_lets_the_eviction_go() {
    let mut a = acting(Some(FsLayout::Shared));
    a.set_node_reclaim(None);
    let plan = a.plan(
        &decision(Signal::NodeFsAvailable, true),
        &pods(),
        true,
        None,
        &cgroup,
        s(0),
    );
    assert_eq!(first(&plan.actions), "evict a");
}
