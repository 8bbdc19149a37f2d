//! Local storage eviction inside one evaluation: every pod over a limit, beside the threshold's
//! eviction, under the same rules for who may be evicted.

use std::time::Duration;

use node_agent_policy::{
    evaluate_among, ContainerInfo, Eligibility, EmptyDirInfo, EvictionConfig, EvictionSignal,
    NodeCapacity, NodeCondition, NotEvictableNow, Observation, Observations, PassReason, PodInfo,
    PodUsage, PolicyState, Resources, Signal, StorageLimit,
};

const MI: u64 = 1 << 20;

/// `name` using `memory` MiB, with an emptyDir `cache` limited to 100Mi holding `cache` MiB.
fn pod(name: &str, memory: u64, cache: u64) -> PodInfo {
    PodInfo {
        namespace: "default".into(),
        name: name.into(),
        uid: Some(format!("uid-{name}")),
        termination_grace_period_seconds: Some(30),
        containers: vec![ContainerInfo {
            name: "app".into(),
            requests: Resources::default(),
            ..Default::default()
        }],
        empty_dirs: vec![EmptyDirInfo {
            name: "cache".into(),
            size_limit: Some("100Mi".parse().unwrap()),
        }],
        usage: Some(PodUsage {
            memory_working_set_bytes: memory * MI,
            ephemeral_storage_bytes: Some(cache * MI),
            volumes: [("cache".to_string(), cache * MI)].into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Who a decision evicts, and for what, in order.
fn evicted(d: &node_agent_policy::Decision) -> Vec<(&str, EvictionSignal)> {
    d.evictions
        .iter()
        .map(|e| (e.name.as_str(), e.signal))
        .collect()
}

/// One evaluation with `memory.available<500Mi` met (100Mi available) or not (5Gi).
fn evaluate(
    pods: &[PodInfo],
    eligibility: &Eligibility,
    memory_met: bool,
) -> node_agent_policy::Decision {
    let config =
        EvictionConfig::from_kubelet_yaml("evictionHard: {memory.available: 500Mi}").unwrap();
    let node = NodeCapacity {
        memory_bytes: Some(10 << 30),
        ..Default::default()
    };
    let available = if memory_met { 100 * MI } else { 5 << 30 };
    let observations: Observations = [(
        Signal::MemoryAvailable,
        Observation {
            available: available as i64,
            capacity: 10 << 30,
            lead: 0,
        },
    )]
    .into();
    evaluate_among(
        &config,
        &node,
        &observations,
        pods,
        eligibility,
        Duration::ZERO,
        &PolicyState::default(),
    )
    .0
}

/// As the kubelet's eviction manager, every pod over a limit goes in one evaluation, and the
/// thresholds are still acted on in that same evaluation (the kubelet's memory notifier
/// synchronizes beside its local storage round): the threshold's pod is ranked among the
/// others, a pod already going for its limit passed over.
#[test]
fn the_threshold_eviction_goes_beside_the_pods_over_a_limit_never_after_them() {
    let pods = [
        pod("hungry", 4000, 150),
        pod("filler", 10, 150),
        pod("next", 3000, 0),
    ];
    let d = evaluate(&pods, &Eligibility::default(), true);
    let goes = evicted(&d);
    assert_eq!(
        goes,
        [
            ("hungry", EvictionSignal::Limit(StorageLimit::EmptyDir)),
            ("filler", EvictionSignal::Limit(StorageLimit::EmptyDir)),
            ("next", EvictionSignal::Threshold(Signal::MemoryAvailable)),
        ],
        "every pod over its limit, and for memory the next-ranked pod, not one going already"
    );
    assert_eq!(d.reclaim, Some(Signal::MemoryAvailable));
    assert!(!d.no_evictable_pod());
    let passed: Vec<(&str, PassReason)> = d
        .passed_over
        .iter()
        .map(|p| (p.name.as_str(), p.reason))
        .collect();
    assert_eq!(
        passed,
        [(
            "hungry",
            PassReason::NotEvictableNow(NotEvictableNow::Evicting)
        )]
    );
    // Only pods over a limit left for the threshold: none may go for it, said as such.
    let d = evaluate(&pods[..2], &Eligibility::default(), true);
    assert_eq!(d.evictions.len(), 2);
    assert!(d.no_evictable_pod(), "{:?}", d.evictions);
}

#[test]
fn a_pod_over_a_limit_goes_whatever_the_node() {
    let pods = [pod("hungry", 4000, 0), pod("filler", 10, 150)];
    for memory_met in [true, false] {
        let d = evaluate(&pods, &Eligibility::default(), memory_met);
        let e = d.evictions.first().expect("an eviction");
        assert_eq!(e.name, "filler", "memory met: {memory_met}");
        assert_eq!(
            d.evictions.get(1).map(|e| e.name.as_str()),
            memory_met.then_some("hungry"),
            "and for memory, when met, the pod the threshold ranks first"
        );
        assert_eq!(e.signal, EvictionSignal::Limit(StorageLimit::EmptyDir));
        assert_eq!(
            e.grace_period_seconds, 1,
            "the kubelet's immediate grace period"
        );
        assert!(e.hard);
        assert_eq!(
            e.message,
            "Usage of EmptyDir volume \"cache\" exceeds the limit \"100Mi\". "
        );
        assert!(e.offending_containers.is_empty());
        assert_eq!(e.available.value(), (150 * MI) as i64, "the usage");
        assert_eq!(e.threshold_quantity.value(), (100 * MI) as i64, "the limit");
        // The thresholds and conditions are still those of the node.
        assert_eq!(d.reclaim, memory_met.then_some(Signal::MemoryAvailable));
        assert_eq!(!d.thresholds_met.is_empty(), memory_met);
        assert_eq!(d.conditions == [NodeCondition::MemoryPressure], memory_met);
    }
}

#[test]
fn pods_over_a_limit_that_may_not_go_are_passed_over_and_noted() {
    type Row<'a> = (
        &'a str,
        Eligibility,
        fn(&mut [PodInfo]),
        Vec<&'a str>,
        Vec<(&'a str, PassReason)>,
    );
    let excluded = Eligibility {
        exclusions: serde_yaml_ng::from_str("{labelSelector: {matchLabels: {keep: 'yes'}}}")
            .unwrap(),
        ..Eligibility::default()
    };
    let blocked = Eligibility {
        not_evictable_now: [(
            "uid-first".to_string(),
            NotEvictableNow::BlockedByDisruptionBudget,
        )]
        .into(),
        ..Eligibility::default()
    };
    let evicting = Eligibility {
        not_evictable_now: [("uid-first".to_string(), NotEvictableNow::Evicting)].into(),
        ..Eligibility::default()
    };
    let rows: Vec<Row> = vec![
        (
            "a pod whose eviction is on its way is neither evicted again nor said to be kept",
            evicting,
            |_| {},
            vec!["second"],
            vec![],
        ),
        (
            "every pod over its limit, in pod order, in one evaluation (the kubelet's localStorageEviction)",
            Eligibility::default(),
            |_| {},
            vec!["first", "second"],
            vec![],
        ),
        (
            "a static pod over its limit stays; the next one over goes",
            Eligibility::default(),
            |p| p[1].is_static = true,
            vec!["second"],
            vec![("first", PassReason::Static)],
        ),
        (
            "a static pod after the one that goes is noted too",
            Eligibility::default(),
            |p| p[2].is_static = true,
            vec!["first"],
            vec![("second", PassReason::Static)],
        ),
        (
            "a pod at the critical priority stays",
            Eligibility::default(),
            |p| {
                p[1].priority = 2_000_000_000;
                p[2].is_mirror = true;
            },
            vec![],
            vec![
                ("first", PassReason::CriticalPriority),
                ("second", PassReason::Mirror),
            ],
        ),
        (
            "an excluded pod stays",
            excluded,
            |p| {
                p[1].labels = [("keep".to_string(), "yes".to_string())].into();
            },
            vec!["second"],
            vec![("first", PassReason::ExcludedByLabelSelector)],
        ),
        (
            "a pod its budget blocks stays for now",
            blocked,
            |_| {},
            vec!["second"],
            vec![(
                "first",
                PassReason::NotEvictableNow(NotEvictableNow::BlockedByDisruptionBudget),
            )],
        ),
    ];
    for (behaviour, eligibility, tweak, want, want_passed) in rows {
        let mut pods = vec![
            pod("hungry", 4000, 0),
            pod("first", 10, 150),
            pod("second", 10, 120),
        ];
        tweak(&mut pods);
        let d = evaluate(&pods, &eligibility, true);
        let evicted: Vec<&str> = d
            .evictions
            .iter()
            .filter(|e| e.signal.threshold().is_none())
            .map(|e| e.name.as_str())
            .collect();
        assert_eq!(evicted, want, "{behaviour}");
        let passed: Vec<(&str, PassReason)> = d
            .over_limit_passed_over
            .iter()
            .map(|(p, limit)| {
                assert_eq!(*limit, StorageLimit::EmptyDir, "{behaviour}");
                (p.name.as_str(), p.reason)
            })
            .collect();
        assert_eq!(passed, want_passed, "{behaviour}");
    }
}

#[test]
fn with_no_pod_over_a_limit_may_go_the_threshold_eviction_proceeds() {
    let mut pods = vec![pod("hungry", 4000, 0), pod("filler", 10, 150)];
    pods[1].is_static = true;
    let d = evaluate(&pods, &Eligibility::default(), true);
    let e = d.evictions.first().expect("the memory eviction");
    assert_eq!(e.name, "hungry");
    assert_eq!(e.signal, EvictionSignal::Threshold(Signal::MemoryAvailable));
    assert_eq!(d.reclaim, Some(Signal::MemoryAvailable));
    assert_eq!(d.over_limit_passed_over.len(), 1);
}

/// The kubelet's sync that evicts for local storage makes no threshold eviction: with
/// `nodefs.available` met and a pod over its emptyDir limit, only that pod goes, and the
/// threshold waits for the next evaluation (the limit's eviction is what relieves the disk;
/// issue 41's round 4 saw a second, ranked pod evicted in the same step). With no pod over a
/// limit, the threshold acts.
#[test]
fn a_disk_threshold_waits_while_pods_go_for_their_limits() {
    let config =
        EvictionConfig::from_kubelet_yaml("evictionHard: {nodefs.available: 10%}").unwrap();
    let node = NodeCapacity::default();
    let observations: Observations = [(
        Signal::NodeFsAvailable,
        Observation {
            available: 5 << 30,
            capacity: 100 << 30,
            lead: 0,
        },
    )]
    .into();
    let decide = |pods: &[PodInfo]| {
        evaluate_among(
            &config,
            &node,
            &observations,
            pods,
            &Eligibility::default(),
            Duration::ZERO,
            &PolicyState::default(),
        )
        .0
    };
    let d = decide(&[pod("filler", 10, 150), pod("writer", 10, 90)]);
    let goes = evicted(&d);
    assert_eq!(
        goes,
        [("filler", EvictionSignal::Limit(StorageLimit::EmptyDir))],
        "the pod over its limit, and no nodefs eviction beside it"
    );
    assert_eq!(d.reclaim, None, "no threshold acted on in this step");
    assert!(
        d.thresholds_met
            .iter()
            .any(|t| t.signal == Signal::NodeFsAvailable),
        "the threshold is met all the same"
    );
    assert_eq!(d.conditions, [NodeCondition::DiskPressure]);

    // Next step, the pod over its limit gone: the threshold acts.
    let d = decide(&[pod("writer", 10, 90)]);
    let goes = evicted(&d);
    assert_eq!(
        goes,
        [("writer", EvictionSignal::Threshold(Signal::NodeFsAvailable))]
    );
}
