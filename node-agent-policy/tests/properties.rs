//! Properties of the policy over random nodes: whatever the pods, exclusions and reports, the
//! pod chosen is never one that must not be evicted, and when one may go, one goes.

use std::{collections::BTreeMap, time::Duration};

use node_agent_policy::{
    evaluate_among, rank::rank, ContainerInfo, Eligibility, EvictionConfig, Exclusions,
    NodeCapacity, NotEvictableNow, Observation, Observations, PodInfo, PodUsage, PolicyState,
    Resources, Signal,
};
use proptest::prelude::*;

const GI: i64 = 1 << 30;
const NAMESPACES: [&str; 4] = ["default", "shop", "kube-system", "node-agent"];
const TIERS: [&str; 3] = ["web", "db", "batch"];

/// A pod with random traits; its name is its index, so names are unique.
fn pod(i: usize) -> impl Strategy<Value = PodInfo> {
    (
        0..NAMESPACES.len(),
        0..TIERS.len(),
        prop_oneof![
            Just(0),
            Just(1000),
            Just(1_999_999_999),
            Just(2_000_000_000),
            Just(2_000_001_000)
        ],
        any::<(bool, bool, bool, bool)>(),
        0u64..8 << 30,
        proptest::option::of(0i64..4 << 30),
    )
        .prop_map(
            move |(
                ns,
                tier,
                priority,
                (is_static, is_mirror, terminating, has_uid),
                memory,
                request,
            )| {
                PodInfo {
                    namespace: NAMESPACES[ns].to_string(),
                    name: format!("pod-{i}"),
                    uid: has_uid.then(|| format!("uid-{i}")),
                    labels: [("tier".to_string(), TIERS[tier].to_string())]
                        .into_iter()
                        .collect(),
                    terminating,
                    priority,
                    is_static,
                    is_mirror,
                    termination_grace_period_seconds: Some(30),
                    containers: vec![ContainerInfo {
                        name: "app".into(),
                        requests: Resources {
                            memory: request.map(|r| {
                                node_agent_policy::Quantity::from_int(
                                    r,
                                    node_agent_policy::Format::BinarySi,
                                )
                            }),
                            ephemeral_storage: None,
                        },
                        ..ContainerInfo::default()
                    }],
                    usage: Some(PodUsage {
                        memory_working_set_bytes: memory,
                        ..PodUsage::default()
                    }),
                    ..PodInfo::default()
                }
            },
        )
}

fn pods() -> impl Strategy<Value = Vec<PodInfo>> {
    (0usize..12).prop_flat_map(|n| (0..n).map(pod).collect::<Vec<_>>())
}

/// Exclusions, the agent's own pod and executor reports, drawn over the same names.
fn eligibility() -> impl Strategy<Value = Eligibility> {
    (
        proptest::sample::subsequence(NAMESPACES.to_vec(), 0..=2),
        proptest::option::of(0..TIERS.len()),
        proptest::option::of(0usize..12),
        proptest::collection::btree_map(
            (0usize..12, any::<bool>()),
            prop_oneof![
                Just(NotEvictableNow::Terminating),
                Just(NotEvictableNow::BlockedByDisruptionBudget),
                Just(NotEvictableNow::Refused),
                Just(NotEvictableNow::Failed),
            ],
            0..6,
        ),
    )
        .prop_map(|(namespaces, tier, own, reports)| {
            let mut exclusions = Exclusions {
                namespaces: namespaces.into_iter().map(String::from).collect(),
                ..Exclusions::default()
            };
            if let Some(t) = tier {
                exclusions
                    .label_selector
                    .match_labels
                    .insert("tier".into(), TIERS[t].into());
            }
            Eligibility {
                // The own pod's namespace is drawn like any other: sometimes it matches.
                own_pod: own.map(|i| {
                    (
                        NAMESPACES[i % NAMESPACES.len()].to_string(),
                        format!("pod-{i}"),
                    )
                }),
                exclusions,
                not_evictable_now: reports
                    .into_iter()
                    .map(|((i, by_uid), n)| {
                        let id = if by_uid {
                            format!("uid-{i}")
                        } else {
                            format!("{}/pod-{i}", NAMESPACES[i % NAMESPACES.len()])
                        };
                        (id, n)
                    })
                    .collect::<BTreeMap<_, _>>(),
            }
        })
}

/// Written out from the rules, apart from `Eligibility::check`, so the property tests the
/// evaluation against the rules and not against itself.
fn must_not_be_evicted(pod: &PodInfo, e: &Eligibility) -> bool {
    let own = e
        .own_pod
        .as_ref()
        .is_some_and(|(ns, name)| *ns == pod.namespace && *name == pod.name);
    let labelled = e
        .exclusions
        .label_selector
        .match_labels
        .iter()
        .next()
        .is_some_and(|(k, v)| pod.labels.get(k) == Some(v));
    let id = pod
        .uid
        .clone()
        .unwrap_or_else(|| format!("{}/{}", pod.namespace, pod.name));
    pod.is_static
        || pod.is_mirror
        || pod.priority >= 2_000_000_000
        || own
        || pod.terminating
        || e.exclusions.namespaces.contains(&pod.namespace)
        || labelled
        || e.not_evictable_now.contains_key(&id)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn never_chooses_a_pod_that_must_not_go_and_always_the_first_that_may(
        pods in pods(),
        eligibility in eligibility(),
        available in -GI..4 * GI,
    ) {
        let config = EvictionConfig::from_kubelet_yaml("evictionHard: {memory.available: 1Gi}").unwrap();
        let node = NodeCapacity { memory_bytes: Some(16 * GI), ..NodeCapacity::default() };
        let observations: Observations = [(
            Signal::MemoryAvailable,
            Observation { available, capacity: 16 * GI, lead: 0 },
        )]
        .into_iter()
        .collect();
        let (decision, _) = evaluate_among(
            &config, &node, &observations, &pods, &eligibility, Duration::ZERO, &PolicyState::default(),
        );
        let met = available < GI;
        prop_assert_eq!(decision.reclaim.is_some(), met);
        for e in &decision.evictions {
            let chosen = pods.iter().find(|p| p.name == e.name).expect("the chosen pod is one of ours");
            prop_assert!(!must_not_be_evicted(chosen, &eligibility), "chose {:?} under {:?}", chosen, eligibility);
        }
        // Liveness: the first pod in the kubelet's order that may go is the one chosen.
        let first_allowed = rank(&pods, Signal::MemoryAvailable, false)
            .into_iter()
            .map(|i| &pods[i])
            .find(|p| !must_not_be_evicted(p, &eligibility));
        let want = if met { first_allowed.map(|p| p.name.as_str()) } else { None };
        prop_assert_eq!(decision.evictions.first().map(|e| e.name.as_str()), want);
        prop_assert_eq!(decision.no_evictable_pod(), met && want.is_none());
        // Everything ranked ahead of the choice is accounted for, with a reason.
        let all_accounted = decision.passed_over.iter().all(|p| {
            let pod = pods.iter().find(|q| q.name == p.name).unwrap();
            must_not_be_evicted(pod, &eligibility)
        });
        prop_assert!(all_accounted, "passed over: {:?}", decision.passed_over);
    }
}
