//! The node track: a hard memory or PID eviction carried out on the node, unpaced, one at a
//! time for only as long as the kill takes; and an urgent eviction through the API that ends
//! once the pod's memory is freed.

use std::{
    cell::RefCell,
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use node_agent_kube::evict::{Attempt, EvictionResult};
use node_agent_policy::{
    Decision, Eligibility, Eviction, Format, MetThreshold, NodeCondition, NotEvictableNow, PodInfo,
    PodUsage, Quantity, Resource, Signal,
};

use super::{Acting, Cgroups, PodCgroup, Rates, Timing};
use crate::action::{Action, Report};

const TIMING: Timing = Timing {
    pass_over: Duration::from_secs(30),
    wait_timeout: Duration::from_secs(30),
    failed: Duration::from_secs(10),
};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn pod(name: &str, working_set_mib: u64) -> PodInfo {
    PodInfo {
        namespace: "shop".into(),
        name: name.into(),
        uid: Some(format!("uid-{name}")),
        usage: Some(PodUsage {
            memory_working_set_bytes: working_set_mib << 20,
            ..PodUsage::default()
        }),
        ..PodInfo::default()
    }
}

fn pods() -> Vec<PodInfo> {
    vec![pod("a", 900), pod("b", 700), pod("lost", 500)]
}

fn eviction(name: &str, signal: Signal, hard: bool) -> Eviction {
    Eviction {
        namespace: "shop".into(),
        name: name.into(),
        uid: Some(format!("uid-{name}")),
        signal: signal.into(),
        resource: if signal == Signal::PidAvailable {
            Resource::Pids
        } else {
            Resource::Memory
        },
        hard,
        grace_period_seconds: 1,
        message: "m".into(),
        offending_containers: vec![],
        threshold_quantity: Quantity::from_int(200, Format::BinarySi),
        available: Quantity::from_int(150, Format::BinarySi),
        early: false,
    }
}

fn decision(evict: &str, signal: Signal, hard: bool) -> Decision {
    Decision {
        thresholds_met: vec![MetThreshold {
            index: 0,
            signal,
            hard,
            held_by_min_reclaim: false,
            grace_period_passed: true,
            early: false,
        }],
        conditions: vec![NodeCondition::MemoryPressure],
        reclaim: Some(signal),
        evictions: vec![eviction(evict, signal, hard)],
        passed_over: Vec::new(),
        over_limit_passed_over: Vec::new(),
    }
}

fn hard(evict: &str) -> Decision {
    decision(evict, Signal::MemoryAvailable, true)
}

/// Every pod's cgroup is found, but for the pod named `lost`.
fn cgroup(p: &PodInfo) -> Option<PodCgroup> {
    (p.name != "lost").then(|| PodCgroup {
        path: PathBuf::from(format!("/cg/{}", p.name)),
        id: 100 + p.name.len() as u64,
    })
}

fn report(e: Eviction, result: EvictionResult) -> Report {
    Report {
        eviction: e,
        trigger_ktime_ns: None,
        attempt: Attempt::new(result, "why"),
        killed: None,
        event_error: None,
        at: SystemTime::now(),
    }
}

/// The node's cgroups as a test sets them: which are gone, their working sets, which hold
/// processes.
#[derive(Default)]
struct Node {
    gone: BTreeSet<PathBuf>,
    working_sets: BTreeMap<PathBuf, u64>,
    busy: BTreeSet<PathBuf>,
}

impl Cgroups for RefCell<Node> {
    fn exists(&self, c: &Path) -> bool {
        !self.borrow().gone.contains(c)
    }
    fn working_set(&self, c: &Path) -> Option<u64> {
        self.borrow().working_sets.get(c).copied()
    }
    fn has_processes(&self, c: &Path) -> bool {
        self.borrow().busy.contains(c)
    }
}

/// What the plan hands over, as `kill <pod>` / `evict <pod>`.
fn acts(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Kill(k) => Some(format!("kill {}", k.evict.eviction.name)),
            Action::Evict(e) => Some(format!("evict {}", e.eviction.name)),
            _ => None,
        })
        .collect()
}

fn paced_acting(node_kill: bool) -> Acting {
    let mut acting = Acting::default();
    acting.set_node_kill(node_kill);
    // One token a minute, spent by nothing yet.
    acting.set_pacing(
        Some(Rates {
            per_minute: 1,
            burst: 1,
        }),
        ms(0),
    );
    acting
}

#[test]
fn which_evictions_go_on_the_node() {
    let rows = [
        (
            "hard memory, node kills on: killed",
            true,
            hard("a"),
            "kill a",
        ),
        (
            "hard PID, node kills on: killed",
            true,
            decision("a", Signal::PidAvailable, true),
            "kill a",
        ),
        (
            "hard allocatable memory: killed",
            true,
            decision("a", Signal::AllocatableMemoryAvailable, true),
            "kill a",
        ),
        (
            "soft memory: through the API with its grace period",
            true,
            decision("a", Signal::MemoryAvailable, false),
            "evict a",
        ),
        (
            "hard disk: through the API (killing frees no disk)",
            true,
            decision("a", Signal::NodeFsAvailable, true),
            "evict a",
        ),
        (
            "no cgroup found for the pod: nothing to kill, the API carries it out",
            true,
            hard("lost"),
            "evict lost",
        ),
        (
            "node kills off: through the API",
            false,
            hard("a"),
            "evict a",
        ),
    ];
    for (what, node_kill, decision, want) in rows {
        let mut acting = paced_acting(node_kill);
        let plan = acting.plan(&decision, &pods(), true, None, &cgroup, ms(0));
        assert_eq!(acts(&plan.actions), [want], "{what}");
        if let Some(Action::Kill(k)) = plan.actions.first() {
            assert_eq!(
                (
                    k.target.pod_uid.as_str(),
                    k.target.cgroup.as_path(),
                    k.target.cgroup_id
                ),
                ("uid-a", Path::new("/cg/a"), 101),
                "{what}: the target is the pod's cgroup, by its UID and id"
            );
        }
    }
}

#[test]
fn kills_are_unpaced_one_at_a_time_and_the_next_goes_once_the_last_is_done() {
    let node = RefCell::new(Node::default());
    let mut acting = paced_acting(true);
    let first = acting.plan(&hard("a"), &pods(), true, None, &cgroup, ms(0));
    assert_eq!(acts(&first.actions), ["kill a"]);
    let meanwhile = acting.plan(&hard("b"), &pods(), true, None, &cgroup, ms(1));
    assert!(
        acts(&meanwhile.actions).is_empty(),
        "one kill at a time: the node is read anew after it before another"
    );
    // The API server's own wish to wait holds no kill.
    acting.reported(
        &report(
            eviction("x", Signal::MemoryAvailable, false),
            EvictionResult::ApiRateLimited,
        ),
        &TIMING,
        ms(2),
    );
    acting.reported(
        &report(
            eviction("a", Signal::MemoryAvailable, true),
            EvictionResult::Killed,
        ),
        &TIMING,
        ms(5),
    );
    assert!(
        acting.awaits_freed_memory(),
        "killed: its memory not back yet"
    );
    let a = PathBuf::from("/cg/a");
    node.borrow_mut().working_sets.insert(a.clone(), 850 << 20);
    assert!(acting.settle(ms(5), &node).is_empty());
    let early = acting.plan(&hard("b"), &pods(), true, None, &cgroup, ms(5));
    assert!(
        acts(&early.actions).is_empty(),
        "never a second kill on a reading from before the first one's memory came back"
    );
    node.borrow_mut().working_sets.insert(a, 40 << 20);
    assert_eq!(acting.settle(ms(60), &node).len(), 1, "its memory is back");
    assert!(!acting.has_in_flight());
    assert_eq!(acting.paced_until(ms(60)), Some(ms(1002)), "the API's wait");
    let next = acting.plan(&hard("b"), &pods(), true, None, &cgroup, ms(61));
    assert_eq!(
        acts(&next.actions),
        ["kill b"],
        "no token, no wait for the cgroup's removal or the API server"
    );
    // The killed pod is not evictable while its processes die (still listed in its cgroup),
    // nor once its cgroup is empty; started again in place by the kubelet, it is.
    node.borrow_mut().busy.insert(PathBuf::from("/cg/a"));
    let held = |acting: &Acting, at| {
        acting
            .eligibility(&Eligibility::default(), ms(at), &node)
            .not_evictable_now
            .get("uid-a")
            .copied()
    };
    assert_eq!(held(&acting, 6), Some(NotEvictableNow::Terminating));
    node.borrow_mut().busy.clear();
    assert_eq!(held(&acting, 1006), Some(NotEvictableNow::Terminating));
    node.borrow_mut().busy.insert(PathBuf::from("/cg/a"));
    assert_eq!(held(&acting, 1004), Some(NotEvictableNow::Terminating));
    assert_eq!(held(&acting, 1006), None);
    // Gone from the pod source: forgotten.
    node.borrow_mut().busy.clear();
    acting.forget_absent(&["uid-b".to_string()].into());
    assert_eq!(held(&acting, 1007), None);
}

#[test]
fn a_kill_that_did_not_happen_holds_the_pod_as_an_eviction_would() {
    let node = RefCell::new(Node::default());
    let rows = [
        (
            "nothing left in its cgroup: terminating while listed",
            EvictionResult::AlreadyGone,
            Some(NotEvictableNow::Terminating),
        ),
        (
            "not the verified cgroup: refused, passed over",
            EvictionResult::Refused,
            Some(NotEvictableNow::Refused),
        ),
        (
            "the kill failed: passed over until the next attempt may go",
            EvictionResult::Failed,
            Some(NotEvictableNow::Failed),
        ),
        (
            "dry run: in flight while the eviction wait lasts",
            EvictionResult::DryRun,
            Some(NotEvictableNow::Evicting),
        ),
    ];
    for (what, result, hold) in rows {
        let mut acting = paced_acting(true);
        acting.plan(&hard("a"), &pods(), true, None, &cgroup, ms(0));
        acting.reported(
            &report(eviction("a", Signal::MemoryAvailable, true), result),
            &TIMING,
            ms(1),
        );
        let e = acting.eligibility(&Eligibility::default(), ms(1), &node);
        assert_eq!(e.not_evictable_now.get("uid-a").copied(), hold, "{what}");
        let next = acting.plan(&hard("b"), &pods(), true, None, &cgroup, ms(2));
        let want: &[&str] = if result == EvictionResult::DryRun {
            &[]
        } else {
            &["kill b"]
        };
        assert_eq!(acts(&next.actions), want, "{what}: the next pod");
    }
}

#[test]
fn an_urgent_eviction_through_the_api_ends_once_the_pods_memory_is_freed() {
    let node = RefCell::new(Node::default());
    let mut acting = paced_acting(false);
    acting.plan(&hard("a"), &pods(), true, None, &cgroup, ms(0));
    acting.reported(
        &report(
            eviction("a", Signal::MemoryAvailable, true),
            EvictionResult::Evicted,
        ),
        &TIMING,
        ms(50),
    );
    let a = PathBuf::from("/cg/a");
    let rows = [
        ("still most of its 900 MiB", 600u64 << 20, false),
        ("a tenth of it: freed", 90 << 20, true),
    ];
    for (what, working_set, ended) in rows {
        node.borrow_mut()
            .working_sets
            .insert(a.clone(), working_set);
        let done = acting.settle(ms(100), &node);
        assert_eq!(done.len(), usize::from(ended), "{what}");
    }
    let next = acting.plan(&hard("b"), &pods(), true, None, &cgroup, ms(101));
    assert_eq!(
        acts(&next.actions),
        ["evict b"],
        "no token taken, and none waited for: the cgroup may still be there"
    );
    // A soft eviction still waits for the cgroup to go, and for its token.
    let mut acting = paced_acting(false);
    let soft = decision("a", Signal::MemoryAvailable, false);
    acting.plan(&soft, &pods(), true, None, &cgroup, ms(0));
    acting.reported(
        &report(
            eviction("a", Signal::MemoryAvailable, false),
            EvictionResult::Evicted,
        ),
        &TIMING,
        ms(50),
    );
    node.borrow_mut().working_sets.insert(a.clone(), 0);
    assert!(
        acting.settle(ms(100), &node).is_empty(),
        "cgroup still there"
    );
    node.borrow_mut().gone.insert(a);
    assert_eq!(acting.settle(ms(200), &node).len(), 1, "cgroup gone");
    let next = acting.plan(
        &decision("b", Signal::MemoryAvailable, false),
        &pods(),
        true,
        None,
        &cgroup,
        ms(201),
    );
    assert!(acts(&next.actions).is_empty(), "paced: one a minute");
}
