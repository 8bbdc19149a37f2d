//! The policy core, one row per behaviour of the kubelet's eviction manager.

use std::time::Duration;

use node_agent_policy::{
    evaluate, evaluate_among, ContainerInfo, ContainerUsage, Decision, Eligibility, EvictionConfig,
    FsUsage, NodeCapacity, NodeCondition, NotEvictableNow, Observation, Observations, PassReason,
    PodInfo, PodUsage, PolicyState, Resources, Signal,
};

const MI: i64 = 1 << 20;
const GI: i64 = 1 << 30;

fn node() -> NodeCapacity {
    NodeCapacity {
        memory_bytes: Some(10 * GI),
        ephemeral_storage_bytes: Some(100 * GI),
        inodes: Some(1_000_000),
        pids: Some(32768),
        has_imagefs: false,
    }
}

fn config(yaml: &str) -> EvictionConfig {
    EvictionConfig::from_kubelet_yaml(yaml).unwrap_or_else(|e| panic!("{yaml}: {e}"))
}

fn observe(signals: &[(Signal, i64)]) -> Observations {
    signals
        .iter()
        .map(|&(signal, available)| {
            let capacity = node().capacity_for(signal).unwrap();
            (
                signal,
                Observation {
                    available,
                    capacity,
                    lead: 0,
                },
            )
        })
        .collect()
}

/// A one-container pod using `memory` bytes against a `request`.
fn pod(name: &str, priority: i32, memory: i64, request: Option<&str>) -> PodInfo {
    PodInfo {
        namespace: "default".into(),
        name: name.into(),
        priority,
        termination_grace_period_seconds: Some(30),
        containers: vec![ContainerInfo {
            name: "app".into(),
            requests: Resources {
                memory: request.map(|r| r.parse().unwrap()),
                ephemeral_storage: None,
            },
            limits: Resources::default(),
            usage: Some(ContainerUsage {
                memory_working_set_bytes: Some(memory as u64),
                rootfs_bytes: None,
                logs_bytes: None,
            }),
        }],
        usage: Some(PodUsage {
            memory_working_set_bytes: memory as u64,
            ..PodUsage::default()
        }),
        ..PodInfo::default()
    }
}

/// Runs a timeline of (seconds, observations) and returns each step's decision.
fn timeline(
    config: &EvictionConfig,
    pods: &[PodInfo],
    steps: &[(u64, &[(Signal, i64)])],
) -> Vec<Decision> {
    let mut state = PolicyState::default();
    steps
        .iter()
        .map(|(at, signals)| {
            let (decision, next) = evaluate(
                config,
                &node(),
                &observe(signals),
                pods,
                Duration::from_secs(*at),
                &state,
            );
            state = next;
            decision
        })
        .collect()
}

fn evicted(decision: &Decision) -> Option<&str> {
    decision.evictions.first().map(|e| e.name.as_str())
}

const MEM: Signal = Signal::MemoryAvailable;

#[test]
fn thresholds_and_grace_periods() {
    let soft = "evictionHard: {}\nevictionSoft: {memory.available: 1Gi}\nevictionSoftGracePeriod: {memory.available: 30s}";
    let pods = [pod("web", 0, 2 * GI, Some("1Gi"))];
    // (behaviour, config, timeline, expected eviction per step)
    type Row<'a> = (&'a str, &'a str, Vec<(u64, &'a [(Signal, i64)])>, Vec<bool>);
    let rows: Vec<Row> = vec![
        (
            "hard threshold is acted on as soon as it is met",
            "evictionHard: {memory.available: 500Mi}",
            vec![(0, &[(MEM, 400 * MI)])],
            vec![true],
        ),
        (
            "available equal to the threshold does not meet it",
            "evictionHard: {memory.available: 500Mi}",
            vec![(0, &[(MEM, 500 * MI)])],
            vec![false],
        ),
        (
            "soft threshold waits for its grace period and acts at exactly the grace period",
            soft,
            vec![(0, &[(MEM, 900 * MI)]), (29, &[(MEM, 900 * MI)]), (30, &[(MEM, 900 * MI)])],
            vec![false, false, true],
        ),
        (
            "an observation where the soft threshold is not met resets its clock",
            soft,
            vec![
                (0, &[(MEM, 900 * MI)]),
                (10, &[(MEM, 2 * GI)]),
                (20, &[(MEM, 900 * MI)]),
                (45, &[(MEM, 900 * MI)]),
                (50, &[(MEM, 900 * MI)]),
            ],
            vec![false, false, false, false, true],
        ),
        (
            "a soft threshold with a 0s grace period behaves as a hard one",
            "evictionHard: {}\nevictionSoft: {memory.available: 1Gi}\nevictionSoftGracePeriod: {memory.available: 0s}",
            vec![(0, &[(MEM, 900 * MI)])],
            vec![true],
        ),
        (
            "a signal never observed meets no threshold",
            "evictionHard: {memory.available: 500Mi}",
            vec![(0, &[(Signal::NodeFsAvailable, 1)])],
            vec![false],
        ),
        (
            "percentage thresholds are taken of the capacity with the kubelet's float32 rounding",
            "evictionHard: {memory.available: 10%}",
            // float32(0.1) * 10Gi truncates to 1Gi + 16 bytes, not 1Gi.
            vec![(0, &[(MEM, GI + 16)]), (1, &[(MEM, GI + 15)])],
            vec![false, true],
        ),
    ];
    for (behaviour, yaml, steps, expected) in rows {
        let decisions = timeline(&config(yaml), &pods, &steps);
        let got: Vec<bool> = decisions.iter().map(|d| !d.evictions.is_empty()).collect();
        assert_eq!(got, expected, "{behaviour}");
    }
}

#[test]
fn minimum_reclaim_holds_a_threshold_that_was_acted_on() {
    let pods = [pod("web", 0, 2 * GI, Some("1Gi"))];
    let hard = config(
        "evictionHard: {memory.available: 500Mi}\nevictionMinimumReclaim: {memory.available: 200Mi}",
    );
    let decisions = timeline(
        &hard,
        &pods,
        &[
            (0, &[(MEM, 400 * MI)]),
            (10, &[(MEM, 600 * MI)]),
            (20, &[(MEM, 699 * MI)]),
            (30, &[(MEM, 700 * MI)]),
            (40, &[(MEM, 600 * MI)]),
        ],
    );
    let met: Vec<(bool, bool)> = decisions
        .iter()
        .map(|d| {
            let held = d.thresholds_met.iter().any(|t| t.held_by_min_reclaim);
            (!d.thresholds_met.is_empty(), held)
        })
        .collect();
    assert_eq!(
        met,
        vec![
            (true, false),
            (true, true),
            (true, true),
            (false, false),
            (false, false)
        ],
        "held until available reaches threshold plus minimum reclaim, then released"
    );
    assert!(
        !decisions[1].evictions.is_empty(),
        "a held threshold still drives eviction"
    );

    // A soft threshold still inside its grace period was never acted on: nothing holds it.
    let soft = config(
        "evictionHard: {}\nevictionSoft: {memory.available: 1Gi}\nevictionSoftGracePeriod: {memory.available: 1m}\nevictionMinimumReclaim: {memory.available: 1Gi}",
    );
    let decisions = timeline(
        &soft,
        &pods,
        &[(0, &[(MEM, 900 * MI)]), (10, &[(MEM, 1100 * MI)])],
    );
    assert!(
        decisions[1].thresholds_met.is_empty(),
        "not acted on, not held"
    );
}

#[test]
fn node_conditions() {
    let pods: [PodInfo; 0] = [];
    let transition = config("evictionHard: {memory.available: 500Mi, nodefs.available: 10%, pid.available: 1000}\nevictionSoft: {nodefs.inodesFree: 20%}\nevictionSoftGracePeriod: {nodefs.inodesFree: 10m}");
    type Row<'a> = (&'a str, Vec<(u64, &'a [(Signal, i64)])>, Vec<NodeCondition>);
    use NodeCondition::*;
    let rows: Vec<Row> = vec![
        (
            "memory signals drive MemoryPressure",
            vec![(0, &[(MEM, 400 * MI)])],
            vec![MemoryPressure],
        ),
        (
            "fs signals drive DiskPressure and pid.available drives PIDPressure",
            vec![(
                0,
                &[(Signal::NodeFsAvailable, GI), (Signal::PidAvailable, 10)],
            )],
            vec![DiskPressure, PidPressure],
        ),
        (
            "a soft threshold within its grace period already sets the condition",
            vec![(0, &[(Signal::NodeFsInodesFree, 1000)])],
            vec![DiskPressure],
        ),
        (
            "the condition is held during the transition period after the last observation",
            vec![
                (0, &[(MEM, 400 * MI)]),
                (60, &[(MEM, GI)]),
                (299, &[(MEM, GI)]),
            ],
            vec![MemoryPressure],
        ),
        (
            "at exactly the transition period the condition clears",
            vec![
                (0, &[(MEM, 400 * MI)]),
                (60, &[(MEM, GI)]),
                (300, &[(MEM, GI)]),
            ],
            vec![],
        ),
        (
            "the transition period counts from the last observation that met a threshold",
            vec![
                (0, &[(MEM, 400 * MI)]),
                (200, &[(MEM, 400 * MI)]),
                (300, &[(MEM, GI)]),
            ],
            vec![MemoryPressure],
        ),
    ];
    for (behaviour, steps, expected) in rows {
        let decisions = timeline(&transition, &pods, &steps);
        assert_eq!(
            decisions.last().unwrap().conditions,
            expected,
            "{behaviour}"
        );
    }
}

fn order(signal: Signal, pods: &[PodInfo], has_imagefs: bool) -> Vec<String> {
    node_agent_policy::rank::rank(pods, signal, has_imagefs)
        .into_iter()
        .map(|i| pods[i].name.clone())
        .collect()
}

fn disk_pod(
    name: &str,
    priority: i32,
    nodefs: u64,
    imagefs: u64,
    inodes: u64,
    request: Option<&str>,
) -> PodInfo {
    PodInfo {
        name: name.into(),
        priority,
        containers: vec![ContainerInfo {
            name: "app".into(),
            requests: Resources {
                memory: None,
                ephemeral_storage: request.map(|r| r.parse().unwrap()),
            },
            ..ContainerInfo::default()
        }],
        usage: Some(PodUsage {
            nodefs: FsUsage {
                bytes: nodefs,
                inodes,
            },
            imagefs: FsUsage {
                bytes: imagefs,
                inodes,
            },
            ..PodUsage::default()
        }),
        ..PodInfo::default()
    }
}

#[test]
fn ranking() {
    let g = GI as u64;
    let pid_pod = |name: &str, priority: i32, processes: u64| PodInfo {
        name: name.into(),
        priority,
        usage: Some(PodUsage {
            processes,
            ..PodUsage::default()
        }),
        ..PodInfo::default()
    };
    let no_stats = PodInfo {
        name: "no-stats".into(),
        priority: 100,
        ..PodInfo::default()
    };
    type Row = (&'static str, Signal, bool, Vec<PodInfo>, Vec<&'static str>);
    let rows: Vec<Row> = vec![
        (
            "memory: pods using more than their request come first, whatever their priority",
            MEM,
            false,
            vec![
                pod("within", -10, GI / 2, Some("1Gi")),
                pod("above", 1000, 2 * GI, Some("1Gi")),
            ],
            vec!["above", "within"],
        ),
        (
            "memory: then lower priority first",
            MEM,
            false,
            vec![
                pod("high", 10, 3 * GI, Some("1Gi")),
                pod("low", 0, 2 * GI, Some("1Gi")),
            ],
            vec!["low", "high"],
        ),
        (
            "memory: then larger usage above request first",
            MEM,
            false,
            vec![
                pod("small", 0, 3 * GI, Some("2Gi")),
                pod("large", 0, 3 * GI, Some("1Gi")),
                pod("no-request", 0, GI + MI, None),
            ],
            vec!["large", "no-request", "small"],
        ),
        (
            "memory: a pod without stats comes first",
            Signal::AllocatableMemoryAvailable,
            false,
            vec![pod("above", 0, 2 * GI, None), no_stats.clone()],
            vec!["no-stats", "above"],
        ),
        (
            "pids: lower priority first, then more processes first",
            Signal::PidAvailable,
            false,
            vec![
                pid_pod("many-high", 5, 900),
                pid_pod("few", 0, 10),
                pid_pod("many", 0, 500),
            ],
            vec!["many", "few", "many-high"],
        ),
        (
            "disk: usage above the ephemeral-storage request first, then priority, then usage",
            Signal::NodeFsAvailable,
            false,
            vec![
                disk_pod("within", -5, g, 0, 0, Some("2Gi")),
                disk_pod("above-high", 10, 3 * g, 0, 0, Some("1Gi")),
                disk_pod("above-low-small", 0, 2 * g, 0, 0, None),
                disk_pod("above-low-large", 0, 5 * g, 0, 0, None),
            ],
            vec!["above-low-large", "above-low-small", "above-high", "within"],
        ),
        (
            "disk with a dedicated imagefs: imagefs signals count writable layers only",
            Signal::ImageFsAvailable,
            true,
            vec![
                disk_pod("logs", 0, 9 * g, g, 0, None),
                disk_pod("layers", 0, g, 9 * g, 0, None),
            ],
            vec!["layers", "logs"],
        ),
        (
            "disk with a dedicated imagefs: nodefs signals count logs and volumes only",
            Signal::NodeFsAvailable,
            true,
            vec![
                disk_pod("layers", 0, g, 9 * g, 0, None),
                disk_pod("logs", 0, 9 * g, g, 0, None),
            ],
            vec!["logs", "layers"],
        ),
        (
            "inodes: priority, then inode usage",
            Signal::NodeFsInodesFree,
            false,
            vec![
                disk_pod("few", 0, 0, 0, 10, None),
                disk_pod("many-high", 7, 0, 0, 9000, None),
                disk_pod("many", 0, 0, 0, 5000, None),
            ],
            vec!["many", "few", "many-high"],
        ),
    ];
    for (behaviour, signal, has_imagefs, pods, expected) in rows {
        assert_eq!(order(signal, &pods, has_imagefs), expected, "{behaviour}");
    }
}

#[test]
fn selection() {
    let both = config("evictionHard: {memory.available: 500Mi, nodefs.available: 10%}");
    let disk_hog = disk_pod("disk-hog", 0, 50 * GI as u64, 0, 0, None);
    let memory_hog = pod("memory-hog", 0, 3 * GI, Some("1Gi"));
    let pressure: &[(Signal, i64)] = &[(Signal::NodeFsAvailable, GI), (MEM, 100 * MI)];

    let d = &timeline(
        &both,
        &[disk_hog.clone(), memory_hog.clone()],
        &[(0, pressure)],
    )[0];
    assert_eq!(
        (d.reclaim, evicted(d)),
        (Some(MEM), Some("memory-hog")),
        "when several thresholds are met, memory is reclaimed first"
    );
    assert_eq!(d.signals_met(), vec![MEM, Signal::NodeFsAvailable]);

    let d = &timeline(
        &both,
        &[pod("a", 0, 3 * GI, None), pod("b", 0, 2 * GI, None)],
        &[(0, pressure)],
    )[0];
    assert_eq!(
        evicted(d),
        Some("a"),
        "at most one pod per evaluation: the top-ranked one"
    );

    let protected = |name: &str, f: &dyn Fn(&mut PodInfo)| {
        let mut p = pod(name, 0, 9 * GI, None);
        f(&mut p);
        p
    };
    let rows: Vec<(&str, PodInfo, Option<&str>)> = vec![
        (
            "a static pod is never selected",
            protected("static", &|p| p.is_static = true),
            Some("next"),
        ),
        (
            "a mirror pod is never selected",
            protected("mirror", &|p| p.is_mirror = true),
            Some("next"),
        ),
        (
            "a pod at system-critical priority is never selected",
            protected("critical", &|p| p.priority = 2_000_000_000),
            Some("next"),
        ),
        (
            "a pod just below system-critical priority may be selected",
            protected("high", &|p| p.priority = 1_999_999_999),
            Some("high"),
        ),
    ];
    for (behaviour, top, expected) in rows {
        // Within its request, so it ranks after any protected pod using more than it requests.
        let next = pod("next", 0, 2 * GI, Some("4Gi"));
        let d = &timeline(&both, &[top, next], &[(0, &[(MEM, 100 * MI)])])[0];
        assert_eq!(
            evicted(d),
            expected,
            "{behaviour}: the next ranked pod is chosen in the same evaluation"
        );
        assert_eq!(
            d.passed_over.len(),
            usize::from(expected == Some("next")),
            "{behaviour}"
        );
    }
    let only_static = protected("static", &|p| p.is_static = true);
    let d = &timeline(&both, &[only_static], &[(0, &[(MEM, 100 * MI)])])[0];
    assert_eq!(
        (d.reclaim, evicted(d)),
        (Some(MEM), None),
        "only critical pods: none evicted"
    );
    assert!(d.no_evictable_pod(), "and the decision says so");
}

/// One evaluation among the pods the agent may act on: ranked "top" (far over its request),
/// "middle", then "last" (within its request).
fn among(eligibility: &Eligibility, tweak: &dyn Fn(&mut Vec<PodInfo>)) -> Decision {
    let mut pods = vec![
        pod("top", 0, 6 * GI, Some("1Gi")),
        pod("middle", 0, 3 * GI, Some("1Gi")),
        pod("last", 0, 512 * MI, Some("1Gi")),
    ];
    for p in &mut pods {
        p.uid = Some(format!("uid-{}", p.name));
        p.labels = [("app".to_string(), p.name.clone())].into_iter().collect();
    }
    tweak(&mut pods);
    let c = config("evictionHard: {memory.available: 500Mi}");
    let (d, _) = evaluate_among(
        &c,
        &node(),
        &observe(&[(MEM, 100 * MI)]),
        &pods,
        eligibility,
        Duration::ZERO,
        &PolicyState::default(),
    );
    d
}

#[test]
fn the_next_ranked_pod_is_chosen_when_the_top_one_may_not_go() {
    let excluding = |yaml: &str| Eligibility {
        exclusions: serde_yaml_ng::from_str(yaml).unwrap(),
        ..Eligibility::default()
    };
    let not_now = |entries: &[(&str, NotEvictableNow)]| Eligibility {
        not_evictable_now: entries.iter().map(|(id, n)| (id.to_string(), *n)).collect(),
        ..Eligibility::default()
    };
    let none = |_: &mut Vec<PodInfo>| {};
    type Tweak = fn(&mut Vec<PodInfo>);
    type Row<'a> = (
        &'a str,
        Eligibility,
        Tweak,
        &'a str,
        Vec<(&'a str, PassReason)>,
    );
    let rows: Vec<Row> = vec![
        (
            "every pod a candidate: the top one",
            Eligibility::default(),
            none,
            "top",
            vec![],
        ),
        (
            "top pod in an excluded namespace",
            excluding("{namespaces: [kube-system]}"),
            |p| p[0].namespace = "kube-system".into(),
            "middle",
            vec![("top", PassReason::ExcludedNamespace)],
        ),
        (
            "top pod matches the excluding label selector",
            excluding("{labelSelector: {matchLabels: {app: top}}}"),
            none,
            "middle",
            vec![("top", PassReason::ExcludedByLabelSelector)],
        ),
        (
            "top pod is the agent's own",
            Eligibility {
                own_pod: Some(("default".into(), "top".into())),
                ..Eligibility::default()
            },
            none,
            "middle",
            vec![("top", PassReason::OwnPod)],
        ),
        (
            "top pod blocked by its disruption budget",
            not_now(&[("uid-top", NotEvictableNow::BlockedByDisruptionBudget)]),
            none,
            "middle",
            vec![(
                "top",
                PassReason::NotEvictableNow(NotEvictableNow::BlockedByDisruptionBudget),
            )],
        ),
        (
            "top pod refused, middle failed: the last one",
            not_now(&[
                ("uid-top", NotEvictableNow::Refused),
                ("uid-middle", NotEvictableNow::Failed),
            ]),
            none,
            "last",
            vec![
                ("top", PassReason::NotEvictableNow(NotEvictableNow::Refused)),
                (
                    "middle",
                    PassReason::NotEvictableNow(NotEvictableNow::Failed),
                ),
            ],
        ),
        (
            "top pod evicted already and still terminating",
            not_now(&[("uid-top", NotEvictableNow::Terminating)]),
            none,
            "middle",
            vec![(
                "top",
                PassReason::NotEvictableNow(NotEvictableNow::Terminating),
            )],
        ),
        (
            "top pod's deletion requested (deletionTimestamp)",
            Eligibility::default(),
            |p| p[0].terminating = true,
            "middle",
            vec![(
                "top",
                PassReason::NotEvictableNow(NotEvictableNow::Terminating),
            )],
        ),
        (
            "a critical pod and an excluded one ahead of the candidate, in rank order",
            excluding(
                "{labelSelector: {matchExpressions: [{key: app, operator: In, values: [middle]}]}}",
            ),
            |p| p[0].is_static = true,
            "last",
            vec![
                ("top", PassReason::Static),
                ("middle", PassReason::ExcludedByLabelSelector),
            ],
        ),
        (
            "a pod ranked below the chosen one is not listed as passed over",
            not_now(&[("uid-last", NotEvictableNow::Refused)]),
            none,
            "top",
            vec![],
        ),
    ];
    for (behaviour, eligibility, tweak, want, want_passed) in rows {
        let d = among(&eligibility, &tweak);
        assert_eq!(evicted(&d), Some(want), "{behaviour}");
        let passed: Vec<(&str, PassReason)> = d
            .passed_over
            .iter()
            .map(|p| (p.name.as_str(), p.reason))
            .collect();
        assert_eq!(passed, want_passed, "{behaviour}");
        assert!(!d.no_evictable_pod(), "{behaviour}");
    }
}

#[test]
fn no_evictable_pod_is_a_decision_of_its_own() {
    let all_out = Eligibility {
        exclusions: serde_yaml_ng::from_str("{namespaces: [default]}").unwrap(),
        ..Eligibility::default()
    };
    let d = among(&all_out, &|_| {});
    assert_eq!(d.reclaim, Some(MEM));
    assert_eq!(evicted(&d), None);
    assert!(d.no_evictable_pod());
    let names: Vec<&str> = d.passed_over.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["top", "middle", "last"], "every pod, in rank order");
    assert!(d
        .passed_over
        .iter()
        .all(|p| p.reason == PassReason::ExcludedNamespace && p.uid.is_some()));

    let calm = timeline(
        &config("evictionHard: {memory.available: 500Mi}"),
        &[],
        &[(0, &[(MEM, 5 * GI)])],
    );
    assert!(
        !calm[0].no_evictable_pod(),
        "no threshold met: nothing to say"
    );
}

#[test]
fn pod_grace_periods() {
    let soft = |max: i64| {
        config(&format!(
            "evictionHard: {{}}\nevictionSoft: {{memory.available: 1Gi}}\nevictionSoftGracePeriod: {{memory.available: 10s}}\nevictionMaxPodGracePeriod: {max}"
        ))
    };
    let with_tgps = |tgps: Option<i64>| PodInfo {
        termination_grace_period_seconds: tgps,
        ..pod("web", 0, 2 * GI, None)
    };
    let steps: &[(u64, &[(Signal, i64)])] = &[(0, &[(MEM, 900 * MI)]), (10, &[(MEM, 900 * MI)])];
    let rows: Vec<(&str, EvictionConfig, PodInfo, i64)> = vec![
        (
            "hard threshold: the kubelet's immediate 1s, whatever the pod asks",
            config("evictionHard: {memory.available: 1Gi}\nevictionMaxPodGracePeriod: 60"),
            with_tgps(Some(300)),
            1,
        ),
        (
            "soft: the pod's own period when it is shorter",
            soft(60),
            with_tgps(Some(30)),
            30,
        ),
        (
            "soft: evictionMaxPodGracePeriod when it is shorter",
            soft(20),
            with_tgps(Some(30)),
            20,
        ),
        (
            "soft: evictionMaxPodGracePeriod when the pod sets none",
            soft(20),
            with_tgps(None),
            20,
        ),
        (
            "soft with evictionMaxPodGracePeriod 0 (unset): the pod's own period",
            soft(0),
            with_tgps(Some(30)),
            30,
        ),
        (
            "soft with a 0s pod period: the kubelet's floor of 1s",
            soft(60),
            with_tgps(Some(0)),
            1,
        ),
    ];
    for (behaviour, config, pod, expected) in rows {
        let decisions = timeline(&config, &[pod], steps);
        let eviction = decisions
            .last()
            .unwrap()
            .evictions
            .first()
            .expect(behaviour);
        assert_eq!(eviction.grace_period_seconds, expected, "{behaviour}");
    }
}

#[test]
fn eviction_messages_match_the_kubelet_wording() {
    let mut two = pod("two", 0, 3 * GI, Some("1Gi"));
    two.containers.push(ContainerInfo {
        name: "sidecar".into(),
        requests: Resources::default(),
        limits: Resources::default(),
        usage: Some(ContainerUsage {
            memory_working_set_bytes: Some(100 * MI as u64),
            rootfs_bytes: None,
            logs_bytes: None,
        }),
    });
    let within = pod("within", 0, 512 * MI, Some("1Gi"));
    let no_stats = PodInfo {
        usage: None,
        ..pod("no-stats", 0, 0, Some("1Gi"))
    };
    type Row<'a> = (
        &'a str,
        &'a str,
        PodInfo,
        &'a [(Signal, i64)],
        &'a str,
        &'a [(&'a str, &'a str)],
    );
    let rows: Vec<Row> = vec![
        (
            "memory: threshold, available and each container above its request",
            "evictionHard: {memory.available: 500Mi}",
            pod("web", 0, 1536 * MI, Some("1Gi")),
            &[(MEM, 400 * MI)],
            "The node was low on resource: memory. Threshold quantity: 500Mi, available: 400Mi. Container app was using 1536Mi, request is 1Gi, has larger consumption of memory. ",
            &[("app", "1536Mi")],
        ),
        (
            "a container without a request is reported with request 0",
            "evictionHard: {memory.available: 500Mi}",
            two,
            &[(MEM, 400 * MI)],
            "The node was low on resource: memory. Threshold quantity: 500Mi, available: 400Mi. Container app was using 3Gi, request is 1Gi, has larger consumption of memory. Container sidecar was using 100Mi, request is 0, has larger consumption of memory. ",
            &[("app", "3Gi"), ("sidecar", "100Mi")],
        ),
        (
            "containers within their request are not named",
            "evictionHard: {memory.available: 500Mi}",
            within,
            &[(MEM, 400 * MI)],
            "The node was low on resource: memory. Threshold quantity: 500Mi, available: 400Mi. ",
            &[],
        ),
        (
            "a pod without stats gets no container lines",
            "evictionHard: {memory.available: 500Mi}",
            no_stats,
            &[(MEM, 400 * MI)],
            "The node was low on resource: memory. Threshold quantity: 500Mi, available: 400Mi. ",
            &[],
        ),
        (
            "percentage thresholds print the quantity the kubelet computes",
            "evictionHard: {nodefs.inodesFree: 5%}",
            pod("web", 0, 0, None),
            &[(Signal::NodeFsInodesFree, 1000)],
            "The node was low on resource: inodes. Threshold quantity: 50000, available: 1k. ",
            &[],
        ),
        (
            "pids",
            "evictionHard: {pid.available: 1000}",
            pod("web", 0, 0, None),
            &[(Signal::PidAvailable, 900)],
            "The node was low on resource: pids. Threshold quantity: 1k, available: 900. ",
            &[],
        ),
    ];
    for (behaviour, yaml, pod, signals, expected, offending) in rows {
        let d = &timeline(&config(yaml), &[pod], &[(0, signals)])[0];
        let eviction = d.evictions.first().expect(behaviour);
        assert_eq!(eviction.message, expected, "{behaviour}");
        let named: Vec<(String, String)> = eviction
            .offending_containers
            .iter()
            .map(|c| (c.name.clone(), c.usage.to_string()))
            .collect();
        let want: Vec<(String, String)> = offending
            .iter()
            .map(|(n, u)| (n.to_string(), u.to_string()))
            .collect();
        assert_eq!(
            named, want,
            "{behaviour}: the annotations name what the message names"
        );
    }
}

/// A hard memory threshold is met early when the signal falls so fast that the headroom left
/// would be gone before relief arrives (its lead, rate × time to relief, is beyond the
/// threshold and within reach); a soft one never is.
#[test]
fn a_fast_fall_meets_a_hard_threshold_ahead_of_itself() {
    let config = config(
        "evictionHard: {memory.available: 200Mi}\nevictionSoft: {memory.available: 1Gi}\nevictionSoftGracePeriod: {memory.available: 1m}\n",
    );
    let pods = [pod("grower", 0, 3 * GI, Some("64Mi"))];
    // (behaviour, available MiB, lead MiB, hard met, early, a pod evicted)
    let rows = [
        (
            "no lead: the threshold as the kubelet has it",
            300,
            0,
            false,
            false,
            false,
        ),
        (
            "a lead within the threshold changes nothing",
            300,
            150,
            false,
            false,
            false,
        ),
        (
            "a lead short of the headroom left: not yet",
            300,
            280,
            false,
            false,
            false,
        ),
        (
            "the headroom left within the lead: met early, evicted",
            300,
            320,
            true,
            true,
            true,
        ),
        (
            "past the threshold: met, not early",
            150,
            320,
            true,
            false,
            true,
        ),
    ];
    for (what, available, lead, hard_met, early, evicted) in rows {
        let mut observations = observe(&[(Signal::MemoryAvailable, available * MI)]);
        observations.get_mut(&Signal::MemoryAvailable).unwrap().lead = lead * MI;
        let (decision, _) = evaluate(
            &config,
            &node(),
            &observations,
            &pods,
            Duration::from_secs(100),
            &PolicyState::default(),
        );
        let hard = decision.thresholds_met.iter().find(|t| t.hard);
        assert_eq!(hard.is_some(), hard_met, "{what}");
        assert_eq!(hard.is_some_and(|t| t.early), early, "{what}");
        assert_eq!(!decision.evictions.is_empty(), evicted, "{what}");
        let soft = decision.thresholds_met.iter().find(|t| !t.hard);
        assert!(
            soft.is_some_and(|t| !t.early),
            "{what}: the soft one is met, never early"
        );
    }
}
