//! The acting plan: which actions a decision and each outcome lead to (tables), and that at
//! most one eviction is ever in flight (property).

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use node_agent_kube::evict::{Attempt, EvictionResult};
use node_agent_policy::{
    Decision, Eligibility, Eviction, Format, MetThreshold, NodeCondition, NotEvictableNow,
    PassReason, PassedOver, PodInfo, Quantity, Resource, Signal,
};
use proptest::prelude::*;

use super::{oom_kill_actions, Acting, Cgroups, Note, PodCgroup, Rates, Timing};
use crate::action::{Action, NodeEvent, Report};

const TIMING: Timing = Timing {
    pass_over: Duration::from_secs(30),
    wait_timeout: Duration::from_secs(30),
    failed: Duration::from_secs(10),
};

fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

fn pod(name: &str) -> PodInfo {
    PodInfo {
        namespace: "shop".into(),
        name: name.into(),
        uid: Some(format!("uid-{name}")),
        ..PodInfo::default()
    }
}

fn eviction(name: &str) -> Eviction {
    Eviction {
        namespace: "shop".into(),
        name: name.into(),
        uid: Some(format!("uid-{name}")),
        signal: Signal::MemoryAvailable.into(),
        resource: Resource::Memory,
        hard: true,
        grace_period_seconds: 1,
        message: "m".into(),
        offending_containers: vec![],
        threshold_quantity: Quantity::from_int(100, Format::BinarySi),
        available: Quantity::from_int(10, Format::BinarySi),
        early: false,
    }
}

/// Memory met past its grace period; `evict` chosen (or none).
fn decision(evict: Option<&str>) -> Decision {
    Decision {
        thresholds_met: vec![MetThreshold {
            index: 0,
            signal: Signal::MemoryAvailable,
            hard: true,
            held_by_min_reclaim: false,
            grace_period_passed: true,
            early: false,
        }],
        conditions: vec![NodeCondition::MemoryPressure],
        reclaim: Some(Signal::MemoryAvailable),
        evictions: evict.map(eviction).into_iter().collect(),
        passed_over: Vec::new(),
        over_limit_passed_over: Vec::new(),
    }
}

/// The same decision for a soft threshold (past its grace period): paced, unlike a hard
/// memory one.
fn soft(mut d: Decision) -> Decision {
    for t in &mut d.thresholds_met {
        t.hard = false;
    }
    for e in &mut d.evictions {
        e.hard = false;
    }
    d
}

fn soft_report(mut r: Report) -> Report {
    r.eviction.hard = false;
    r
}

fn report(name: &str, result: EvictionResult, retry_after: Option<u64>) -> Report {
    Report {
        eviction: eviction(name),
        trigger_ktime_ns: None,
        attempt: Attempt {
            result,
            detail: Some("why".into()),
            retry_after: retry_after.map(Duration::from_secs),
        },
        killed: None,
        event_error: None,
        at: SystemTime::now(),
    }
}

fn pods() -> Vec<PodInfo> {
    vec![pod("a"), pod("b")]
}

fn cgroup(p: &PodInfo) -> Option<PodCgroup> {
    Some(PodCgroup {
        path: PathBuf::from(format!("/cg/{}", p.name)),
        id: 1000 + p.name.len() as u64,
    })
}

/// The node's cgroups as a test has them: which exist (and hold processes), by path; no
/// working sets.
pub(super) struct Exists<F>(pub F);

impl<F: Fn(&Path) -> bool> Cgroups for Exists<F> {
    fn exists(&self, cgroup: &Path) -> bool {
        (self.0)(cgroup)
    }
    fn working_set(&self, _: &Path) -> Option<u64> {
        None
    }
    fn has_processes(&self, cgroup: &Path) -> bool {
        (self.0)(cgroup)
    }
}

/// Every cgroup there, each with processes.
pub(super) const ALL: Exists<fn(&Path) -> bool> = Exists(|_| true);

fn evicts(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Evict(e) => Some(e.eviction.name.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn the_first_decision_reports_pressure_and_evicts() {
    let mut acting = Acting::default();
    let plan = acting.plan(&decision(Some("a")), &pods(), true, Some(9), &cgroup, s(0));
    // The eviction first (the node waits for it), then what describes the moment.
    let Action::Evict(e) = &plan.actions[0] else {
        panic!("{:?}", plan.actions)
    };
    assert!(matches!(
        plan.actions[1],
        Action::NodeEvent(NodeEvent::ThresholdMet(Resource::Memory))
    ));
    assert!(
        matches!(&plan.actions[2], Action::Status { conditions } if conditions == &[NodeCondition::MemoryPressure])
    );
    assert_eq!(plan.actions.len(), 3, "{:?}", plan.actions);
    assert_eq!(
        (
            e.eviction.name.as_str(),
            e.pod.name.as_str(),
            e.trigger_ktime_ns
        ),
        ("a", "a", Some(9))
    );
    assert_eq!(
        acting
            .in_flight()
            .map(|f| f.cgroup.clone())
            .collect::<Vec<_>>(),
        [Some(PathBuf::from("/cg/a"))]
    );
    let again = acting.plan(&decision(Some("a")), &pods(), true, None, &cgroup, s(1));
    assert!(
        again.actions.is_empty(),
        "nothing new to report, one eviction in flight: {:?}",
        again.actions
    );
}

#[test]
fn oom_kills_are_reported_under_our_reason_or_not_at_all() {
    let kill = node_agent_kube::events::OomKill {
        pid: 7,
        comm: "java".into(),
        pod_uid: None,
    };
    let kube =
        |yaml: &str| node_agent_kube::config::KubeConfig::from_yaml(yaml, Some("n1")).unwrap();
    let rows = [
        ("standalone", None, 1),
        ("the default: our own reason", Some(kube("{}")), 1),
        ("own", Some(kube("{nodeOOMEvents: own}")), 1),
        (
            "off: node-problem-detector reports kills",
            Some(kube("{nodeOOMEvents: off}")),
            0,
        ),
    ];
    for (what, config, n) in rows {
        let actions = oom_kill_actions(config.as_ref(), kill.clone());
        assert_eq!(actions.len(), n, "{what}");
        for a in &actions {
            let Action::NodeEvent(e) = a else {
                panic!("{what}: {a:?}")
            };
            assert_eq!(e.reason(), "NodeAgentOOMKill", "{what}");
        }
    }
}

/// The taint follows the node condition as the policy decides it: on with the first condition,
/// rewritten when the conditions change, off only when they clear (the policy keeps them for
/// the transition period), and sent anew after a reload.
#[test]
fn the_taint_follows_the_condition_and_clears_with_it() {
    let taints = |actions: &[Action]| -> Vec<Vec<NodeCondition>> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Status { conditions } => Some(conditions.clone()),
                _ => None,
            })
            .collect()
    };
    let with = |conditions: Vec<NodeCondition>| Decision {
        conditions,
        evictions: Vec::new(),
        ..decision(None)
    };
    let (mem, pid) = (NodeCondition::MemoryPressure, NodeCondition::PidPressure);
    let mut acting = Acting::default();
    let rows: Vec<(&str, Decision, Vec<Vec<NodeCondition>>)> = vec![
        (
            "pressure: the taint comes",
            with(vec![mem]),
            vec![vec![mem]],
        ),
        ("unchanged: nothing sent", with(vec![mem]), vec![]),
        (
            "another condition: rewritten",
            with(vec![mem, pid]),
            vec![vec![mem, pid]],
        ),
        (
            "threshold gone, conditions held (transition period): kept",
            Decision {
                thresholds_met: vec![],
                reclaim: None,
                ..with(vec![mem, pid])
            },
            vec![],
        ),
        (
            "conditions cleared: the taint goes",
            Decision {
                thresholds_met: vec![],
                reclaim: None,
                ..with(vec![])
            },
            vec![vec![]],
        ),
    ];
    for (i, (what, decision, want)) in rows.into_iter().enumerate() {
        let plan = acting.plan(&decision, &pods(), true, None, &cgroup, s(i as u64));
        assert_eq!(taints(&plan.actions), want, "{what}");
    }
    acting.reset_reported();
    let plan = acting.plan(&with(vec![]), &pods(), true, None, &cgroup, s(9));
    assert_eq!(
        taints(&plan.actions),
        vec![Vec::<NodeCondition>::new()],
        "after a reload"
    );
}

#[test]
fn each_outcome_leads_where_the_kubelet_would_go() {
    type Row = (
        &'static str,
        EvictionResult,
        Option<u64>,
        bool,
        Option<NotEvictableNow>,
        Option<u64>,
    );
    let rows: Vec<Row> = vec![
        (
            "evicted: in flight until the cgroup goes; never chosen again while listed",
            EvictionResult::Evicted,
            None,
            true,
            Some(NotEvictableNow::Terminating),
            None,
        ),
        (
            "overridden: the same",
            EvictionResult::PdbOverridden,
            None,
            true,
            Some(NotEvictableNow::Terminating),
            None,
        ),
        (
            "dry run: waited out like an eviction (in flight meanwhile), chosen again after",
            EvictionResult::DryRun,
            None,
            true,
            Some(NotEvictableNow::Evicting),
            None,
        ),
        (
            "blocked by its budget: the next pod now",
            EvictionResult::BlockedByPdb,
            None,
            false,
            Some(NotEvictableNow::BlockedByDisruptionBudget),
            None,
        ),
        (
            "refused: the next pod now",
            EvictionResult::Refused,
            None,
            false,
            Some(NotEvictableNow::Refused),
            None,
        ),
        (
            "failed: the next pod when pacing allows",
            EvictionResult::Failed,
            None,
            false,
            Some(NotEvictableNow::Failed),
            None,
        ),
        (
            "already gone: not chosen again while listed",
            EvictionResult::AlreadyGone,
            None,
            false,
            Some(NotEvictableNow::Terminating),
            None,
        ),
        (
            "paced (only the plan paces; reported anyway): nothing until then",
            EvictionResult::RateLimited,
            Some(4),
            false,
            None,
            Some(4),
        ),
        (
            "the API server sheds load: wait as told",
            EvictionResult::ApiRateLimited,
            Some(3),
            false,
            None,
            Some(3),
        ),
    ];
    for (what, result, retry_after, in_flight, hold, paced) in rows {
        let mut acting = Acting::default();
        acting.plan(&decision(Some("a")), &pods(), true, None, &cgroup, s(0));
        acting.reported(&report("a", result, retry_after), &TIMING, s(1));
        assert_eq!(acting.has_in_flight(), in_flight, "{what}");
        let e = acting.eligibility(&Eligibility::default(), s(1), &ALL);
        assert_eq!(e.not_evictable_now.get("uid-a").copied(), hold, "{what}");
        assert_eq!(acting.paced_until(s(1)), paced.map(|p| s(1 + p)), "{what}");
        let next = acting.plan(&decision(Some("b")), &pods(), true, None, &cgroup, s(1));
        let want: Vec<String> = if in_flight || paced.is_some() {
            vec![]
        } else {
            vec!["b".into()]
        };
        assert_eq!(
            evicts(&next.actions),
            want,
            "{what}: the next pod at once unless waiting"
        );
    }
}

#[test]
fn holds_end_when_they_say() {
    let mut acting = Acting::default();
    acting.plan(&decision(Some("a")), &pods(), true, None, &cgroup, s(0));
    acting.reported(
        &report("a", EvictionResult::BlockedByPdb, Some(60)),
        &TIMING,
        s(0),
    );
    let held = |acting: &Acting, at| {
        acting
            .eligibility(&Eligibility::default(), s(at), &ALL)
            .not_evictable_now
            .contains_key("uid-a")
    };
    assert!(held(&acting, 59), "Retry-After longer than pass_over wins");
    assert!(!held(&acting, 60));

    acting.plan(&decision(Some("b")), &pods(), true, None, &cgroup, s(61));
    acting.reported(&report("b", EvictionResult::Evicted, None), &TIMING, s(61));
    let exists = |p: &Path| p == Path::new("/cg/b");
    assert_eq!(
        acting.settle(s(62), &Exists(exists)),
        [],
        "the cgroup is still there"
    );
    let ended = acting.settle(s(63), &Exists(|_: &Path| false));
    let [(done, gone)] = ended.as_slice() else {
        panic!("the cgroup went: {ended:?}")
    };
    assert_eq!((done.pod_id.as_str(), *gone), ("uid-b", true));
    assert!(
        acting
            .eligibility(&Eligibility::default(), s(63), &ALL)
            .not_evictable_now
            .contains_key("uid-b"),
        "still listed: still terminating"
    );
    acting.forget_absent(&HashSet::from(["uid-a".to_string()]));
    assert!(
        !acting
            .eligibility(&Eligibility::default(), s(63), &ALL)
            .not_evictable_now
            .contains_key("uid-b"),
        "gone from the pod source: forgotten"
    );

    acting.plan(&decision(Some("a")), &pods(), true, None, &cgroup, s(70));
    acting.reported(&report("a", EvictionResult::DryRun, None), &TIMING, s(70));
    assert_eq!(acting.settle(s(99), &Exists(|_: &Path| true)), []);
    assert_eq!(
        acting.settle(s(100), &Exists(|_: &Path| true)).len(),
        1,
        "the wait runs out"
    );
}

#[test]
fn no_evictable_pod_and_stale_data_are_noted() {
    let mut acting = Acting::default();
    let mut starving = decision(None);
    starving.passed_over = vec![PassedOver {
        namespace: "kube-system".into(),
        name: "etcd".into(),
        uid: None,
        reason: PassReason::Mirror,
    }];
    let first = acting.plan(&starving, &pods(), true, None, &cgroup, s(0));
    assert!(first.notes.iter().any(|n| matches!(n, Note::NoEvictablePod { signal: Signal::MemoryAvailable, passed_over } if passed_over.len() == 1)));
    let second = acting.plan(&starving, &pods(), true, None, &cgroup, s(1));
    assert!(
        second.notes.is_empty(),
        "once per transition: {:?}",
        second.notes
    );
    let back = acting.plan(&decision(Some("a")), &pods(), false, None, &cgroup, s(2));
    assert_eq!(
        back.notes,
        [Note::Stale],
        "stale: nothing known of the pods, so nothing said of them either"
    );
    assert!(
        evicts(&back.actions).is_empty(),
        "stale data is never acted on"
    );
    assert!(!acting.has_in_flight());
}

/// An agent that cannot read its pod source (or has not read it yet) decides on no pods: it
/// says it is blind, never that no pod may be evicted, whose alert would page for the wrong
/// thing. Once it sees again, a threshold with no candidate is said as before.
#[test]
fn a_blind_plan_says_it_is_blind_never_that_no_pod_may_go() {
    let mut acting = Acting::default();
    let no_pods: Vec<PodInfo> = Vec::new();
    let blind = acting.plan(&decision(None), &no_pods, false, None, &cgroup, s(0));
    assert_eq!(
        blind
            .notes
            .iter()
            .filter(|n| matches!(n, Note::Stale))
            .count(),
        1,
        "{:?}",
        blind.notes
    );
    assert!(
        !blind
            .notes
            .iter()
            .any(|n| matches!(n, Note::NoEvictablePod { .. })),
        "blind is not 'no pod may be evicted': {:?}",
        blind.notes
    );
    let still = acting.plan(&decision(None), &no_pods, false, None, &cgroup, s(1));
    assert!(!still
        .notes
        .iter()
        .any(|n| matches!(n, Note::NoEvictablePod { .. })));
    // Seeing again, with every candidate passed over: now it is said.
    let seeing = acting.plan(&decision(None), &pods(), true, None, &cgroup, s(2));
    assert!(
        seeing
            .notes
            .iter()
            .any(|n| matches!(n, Note::NoEvictablePod { .. })),
        "{:?}",
        seeing.notes
    );
    // Blind again: said as blind, and the earlier claim is not kept up.
    let again = acting.plan(&decision(None), &no_pods, false, None, &cgroup, s(3));
    assert_eq!(again.notes, [Note::Stale]);
    let seeing = acting.plan(&decision(None), &pods(), true, None, &cgroup, s(4));
    assert!(
        seeing
            .notes
            .iter()
            .any(|n| matches!(n, Note::NoEvictablePod { .. })),
        "said anew once the pods are seen: {:?}",
        seeing.notes
    );
}

#[derive(Debug, Clone)]
enum Step {
    Decide {
        pod: Option<usize>,
        fresh: bool,
    },
    Report {
        result: usize,
        retry_after: Option<u64>,
    },
    Wait {
        secs: u64,
        cgroup_gone: bool,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (proptest::option::of(0usize..3), any::<bool>())
            .prop_map(|(pod, fresh)| Step::Decide { pod, fresh }),
        (
            0usize..EvictionResult::ALL.len(),
            proptest::option::of(0u64..40)
        )
            .prop_map(|(result, retry_after)| Step::Report {
                result,
                retry_after
            }),
        (0u64..40, any::<bool>()).prop_map(|(secs, cgroup_gone)| Step::Wait { secs, cgroup_gone }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Whatever the decisions, outcomes and timing: never a second eviction while one is in
    /// flight, and an outcome is only ever owed for the one in flight.
    #[test]
    fn at_most_one_eviction_is_in_flight(steps in proptest::collection::vec(step(), 1..60)) {
        let names = ["a", "b", "c"];
        let pods: Vec<PodInfo> = names.iter().map(|n| pod(n)).collect();
        let mut acting = Acting::default();
        let mut now = s(0);
        // Evictions handed over whose outcome has not come back.
        let mut owed: Vec<String> = Vec::new();
        for step in steps {
            match step {
                Step::Decide { pod, fresh } => {
                    let was_in_flight = acting.has_in_flight();
                    let plan = acting.plan(&decision(pod.map(|i| names[i])), &pods, fresh, None, &cgroup, now);
                    let sent = evicts(&plan.actions);
                    prop_assert!(sent.len() <= 1);
                    if !sent.is_empty() {
                        prop_assert!(!was_in_flight, "evicted {:?} while one was in flight", sent);
                        prop_assert!(owed.is_empty(), "evicted {:?} with {:?} owed", sent, owed);
                        prop_assert!(fresh);
                    }
                    owed.extend(sent);
                }
                Step::Report { result, retry_after } => {
                    // The executor answers only what it was handed.
                    if let Some(name) = owed.pop() {
                        acting.reported(&report(&name, EvictionResult::ALL[result], retry_after), &TIMING, now);
                    }
                }
                Step::Wait { secs, cgroup_gone } => {
                    now += s(secs);
                    acting.settle(now, &Exists(|_: &Path| !cgroup_gone));
                }
            }
            prop_assert!(owed.len() <= 1);
            if !owed.is_empty() {
                prop_assert!(acting.has_in_flight(), "an owed outcome keeps the eviction in flight");
            }
        }
    }
}

/// With the policy itself: the taint comes when the threshold is met and goes only once the
/// condition clears, `evictionPressureTransitionPeriod` after the threshold was last seen met
/// (the kubelet's `nodeConditionsLastObservedAt`).
#[test]
fn the_taint_goes_after_the_transition_period_with_the_real_policy() {
    use node_agent_policy::{evaluate, EvictionConfig, NodeCapacity, Observation, PolicyState};
    let config = EvictionConfig::from_kubelet_yaml(
        "{evictionHard: {memory.available: 100Mi}, evictionPressureTransitionPeriod: 5m}",
    )
    .unwrap();
    let node = NodeCapacity {
        memory_bytes: Some(4 << 30),
        ..NodeCapacity::default()
    };
    let mib = 1i64 << 20;
    let mut state = PolicyState::default();
    let mut acting = Acting::default();
    let taint = |actions: &[Action]| {
        actions.iter().find_map(|a| match a {
            Action::Status { conditions } => Some(conditions.clone()),
            _ => None,
        })
    };
    let rows: Vec<(&str, u64, i64, Option<Vec<NodeCondition>>)> = vec![
        (
            "met: the taint comes",
            0,
            50,
            Some(vec![NodeCondition::MemoryPressure]),
        ),
        ("met again: kept", 20, 50, None),
        ("recovered, within the period: kept", 30, 1024, None),
        ("just before the period ends: kept", 20 + 299, 1024, None),
        (
            "the period over: the taint goes",
            20 + 300,
            1024,
            Some(vec![]),
        ),
    ];
    for (what, at, available_mib, want) in rows {
        let observations = [(
            Signal::MemoryAvailable,
            Observation {
                available: available_mib * mib,
                capacity: 4 << 30,
                lead: 0,
            },
        )]
        .into();
        let (decision, next) = evaluate(&config, &node, &observations, &[], s(at), &state);
        state = next;
        let plan = acting.plan(&decision, &[], true, None, &cgroup, s(at));
        assert_eq!(taint(&plan.actions), want, "{what}");
    }
}

/// The pacing is the plan's: an eviction without a token is never handed over; the plan says
/// until when, notes it once per wait, and a token refunded for a refusal goes to the next pod.
#[test]
fn the_plan_paces_and_never_hands_over_what_the_pacing_holds() {
    let mut acting = Acting::default();
    acting.set_pacing(
        Some(Rates {
            per_minute: 6,
            burst: 1,
        }),
        s(0),
    );
    let decide = |acting: &mut Acting, name, at| {
        acting.plan(
            &soft(decision(Some(name))),
            &pods(),
            true,
            None,
            &cgroup,
            s(at),
        )
    };
    let first = decide(&mut acting, "a", 0);
    assert_eq!(evicts(&first.actions), ["a"]);
    acting.reported(
        &soft_report(report("a", EvictionResult::Evicted, None)),
        &TIMING,
        s(0),
    );
    acting.settle(s(1), &Exists(|_: &Path| false));
    let held = decide(&mut acting, "b", 1);
    assert_eq!(evicts(&held.actions), Vec::<String>::new());
    assert!(
        held.notes
            .iter()
            .any(|n| matches!(n, Note::Paced { until, .. } if *until == s(10))),
        "one token every 10 s: {:?}",
        held.notes
    );
    assert_eq!(acting.paced_until(s(1)), Some(s(10)));
    let again = decide(&mut acting, "b", 5);
    assert!(
        again.notes.iter().all(|n| !matches!(n, Note::Paced { .. })),
        "noted once per wait: {:?}",
        again.notes
    );
    assert_eq!(evicts(&decide(&mut acting, "b", 10).actions), ["b"]);
    // Blocked by its budget: nothing was done, the token comes back for the next pod.
    acting.reported(
        &soft_report(report("b", EvictionResult::BlockedByPdb, None)),
        &TIMING,
        s(10),
    );
    assert_eq!(evicts(&decide(&mut acting, "a", 10).actions), ["a"]);
    // New rates on reload hold from that moment: the next token comes at the new pace, within
    // a second rather than ten (and no fresh burst is granted).
    acting.reported(
        &soft_report(report("a", EvictionResult::Failed, None)),
        &TIMING,
        s(10),
    );
    assert_eq!(
        evicts(&decide(&mut acting, "b", 11).actions),
        Vec::<String>::new()
    );
    assert_eq!(acting.paced_until(s(11)), Some(s(20)));
    acting.set_pacing(
        Some(Rates {
            per_minute: 60,
            burst: 1,
        }),
        s(11),
    );
    assert_eq!(
        evicts(&decide(&mut acting, "b", 11).actions),
        Vec::<String>::new()
    );
    assert_eq!(evicts(&decide(&mut acting, "b", 12).actions), ["b"]);
}

fn limit(name: &str) -> Eviction {
    Eviction {
        signal: node_agent_policy::EvictionSignal::Limit(node_agent_policy::StorageLimit::EmptyDir),
        ..eviction(name)
    }
}

/// Pods over local storage limits go together, as the kubelet evicts them in one synchronize,
/// and the threshold's eviction goes beside them: neither waits for the other. The pacing is
/// the threshold's (one at a time, a token each); a pod over its limit takes no token and
/// goes as soon as it is seen, whatever is in flight.
#[test]
fn local_storage_and_threshold_evictions_never_wait_for_one_another() {
    let pods: Vec<PodInfo> = ["a", "b", "c", "d", "m", "n"]
        .iter()
        .map(|n| pod(n))
        .collect();
    let with = |limits: &[&str], threshold: Option<&str>| Decision {
        evictions: limits
            .iter()
            .map(|n| limit(n))
            .chain(threshold.map(eviction))
            .collect(),
        ..decision(None)
    };
    let mut acting = Acting::default();
    acting.set_pacing(
        Some(Rates {
            per_minute: 6,
            burst: 1,
        }),
        s(0),
    );
    let first = acting.plan(
        &with(&["a", "b", "c"], Some("m")),
        &pods,
        true,
        None,
        &cgroup,
        s(0),
    );
    assert_eq!(evicts(&first.actions), ["a", "b", "c", "m"], "all at once");
    assert!(
        !first.notes.iter().any(|n| matches!(n, Note::Paced { .. })),
        "{:?}",
        first.notes
    );
    // Pods in flight are not evictable now: the policy passes them over.
    let e = acting.eligibility(&Eligibility::default(), s(0), &ALL);
    assert_eq!(
        e.not_evictable_now.get("uid-a"),
        Some(&NotEvictableNow::Evicting)
    );
    assert_eq!(
        e.not_evictable_now.get("uid-m"),
        Some(&NotEvictableNow::Evicting)
    );
    // A new pod over its limit goes at once, while the threshold's is in flight.
    let more = acting.plan(&with(&["d"], Some("n")), &pods, true, None, &cgroup, s(1));
    assert_eq!(
        evicts(&more.actions),
        ["d"],
        "the threshold's one at a time"
    );
    // The memory eviction ends (its cgroup gone) while the local ones still wait for theirs:
    // the next threshold eviction, a hard memory one, takes no token and goes at once.
    acting.reported(&report("m", EvictionResult::Evicted, None), &TIMING, s(1));
    acting.settle(s(2), &Exists(|p: &Path| p != Path::new("/cg/m")));
    assert_eq!(acting.in_flight().count(), 4);
    let next = acting.plan(&with(&[], Some("n")), &pods, true, None, &cgroup, s(2));
    assert_eq!(
        evicts(&next.actions),
        ["n"],
        "unpaced, never queued behind a, b, c and d"
    );
    assert_eq!(acting.paced_until(s(2)), None);
}

/// At most [`super::LOCAL_STORAGE_IN_FLIGHT`] evictions for local storage limits are out at
/// once, so the executor's lane always has room for the threshold's.
#[test]
fn pods_over_their_limits_beyond_what_may_be_in_flight_go_as_earlier_ones_settle() {
    let names: Vec<String> = (0..super::LOCAL_STORAGE_IN_FLIGHT + 5)
        .map(|i| format!("p{i}"))
        .collect();
    let pods: Vec<PodInfo> = names.iter().map(|n| pod(n)).chain([pod("m")]).collect();
    let all = Decision {
        evictions: names
            .iter()
            .map(|n| limit(n))
            .chain([eviction("m")])
            .collect(),
        ..decision(None)
    };
    let mut acting = Acting::default();
    let first = acting.plan(&all, &pods, true, None, &cgroup, s(0));
    assert_eq!(
        evicts(&first.actions).len(),
        super::LOCAL_STORAGE_IN_FLIGHT + 1,
        "and the threshold's"
    );
    acting.reported(
        &Report {
            eviction: limit("p0"),
            ..report("p0", EvictionResult::Failed, None)
        },
        &TIMING,
        s(1),
    );
    let rest = Decision {
        evictions: names[super::LOCAL_STORAGE_IN_FLIGHT..]
            .iter()
            .map(|n| limit(n))
            .collect(),
        ..decision(None)
    };
    let second = acting.plan(&rest, &pods, true, None, &cgroup, s(1));
    assert_eq!(
        evicts(&second.actions).len(),
        1,
        "one came back: one more goes"
    );
}

/// An eviction the executor's lane could not take was never attempted: it is not a failure of
/// the pod (no pause on it), its token comes back, and it is tried again within moments, not
/// after a pacing interval.
#[test]
fn an_eviction_the_lane_sheds_is_tried_again_promptly_with_its_token_back() {
    let mut acting = Acting::default();
    acting.set_pacing(
        Some(Rates {
            per_minute: 6,
            burst: 1,
        }),
        s(0),
    );
    let first = acting.plan(&decision(Some("a")), &pods(), true, None, &cgroup, s(0));
    assert_eq!(evicts(&first.actions), ["a"]);
    acting.shed(&eviction("a"), s(0));
    assert!(!acting.has_in_flight());
    let e = acting.eligibility(&Eligibility::default(), s(0), &ALL);
    assert!(e.not_evictable_now.is_empty(), "no pause on the pod: {e:?}");
    let retry = acting.paced_until(s(0)).expect("a retry is due");
    assert!(retry <= Duration::from_secs(1), "{retry:?}");
    assert!(
        evicts(
            &acting
                .plan(&decision(Some("a")), &pods(), true, None, &cgroup, s(0))
                .actions
        )
        .is_empty(),
        "not at once: the lane needs a moment"
    );
    let again = acting.plan(&decision(Some("a")), &pods(), true, None, &cgroup, retry);
    assert_eq!(evicts(&again.actions), ["a"], "the token came back");
}
