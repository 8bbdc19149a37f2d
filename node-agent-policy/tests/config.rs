//! Eviction configuration: accepted forms, kubelet defaults, and every refusal naming its field.

use std::time::Duration;

use node_agent_policy::{EvictionConfig, EvictionFlags, Quantity, Signal, ThresholdValue};

fn thresholds(config: &EvictionConfig) -> Vec<(Signal, String, Duration)> {
    config
        .thresholds()
        .iter()
        .map(|t| {
            let value = match t.value {
                ThresholdValue::Quantity(q) => q.to_string(),
                ThresholdValue::Percentage(p) => format!("{}%", (p * 100.0).round()),
            };
            (t.signal, value, t.grace_period)
        })
        .collect()
}

#[test]
fn accepted_configurations() {
    use Signal::*;
    let s = Duration::from_secs;
    type Row<'a> = (&'a str, &'a str, Vec<(Signal, &'a str, Duration)>);
    let cases: &[Row] = &[
        (
            "no evictionHard: the kubelet's default hard thresholds (memory mirrored on allocatable)",
            "evictionMaxPodGracePeriod: 30",
            vec![
                (MemoryAvailable, "100Mi", s(0)),
                (NodeFsAvailable, "10%", s(0)),
                (NodeFsInodesFree, "5%", s(0)),
                (ImageFsAvailable, "15%", s(0)),
                (AllocatableMemoryAvailable, "100Mi", s(0)),
            ],
        ),
        (
            "evictionHard given: only what it lists applies",
            "evictionHard: {nodefs.available: 5Gi}",
            vec![(NodeFsAvailable, "5Gi", s(0))],
        ),
        (
            "empty evictionHard: no hard thresholds at all",
            "evictionHard: {}",
            vec![],
        ),
        (
            "whole KubeletConfiguration: other fields are ignored",
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 110\nclusterDNS: [10.0.0.10]\nevictionHard:\n  pid.available: \"1000\"\n",
            vec![(PidAvailable, "1k", s(0))],
        ),
        (
            "soft threshold with its grace period, after the hard ones",
            "evictionHard: {memory.available: 500Mi}\nevictionSoft: {memory.available: 1Gi}\nevictionSoftGracePeriod: {memory.available: 1m30s}\nenforceNodeAllocatable: []",
            vec![(MemoryAvailable, "500Mi", s(0)), (MemoryAvailable, "1Gi", s(90))],
        ),
        (
            "0% and 100% disable a threshold, and a disabled soft one needs no grace period",
            "evictionHard: {memory.available: 0%, nodefs.available: 100%}\nevictionSoft: {nodefs.available: 0%}",
            vec![],
        ),
        (
            "a soft 0s grace period is accepted (it behaves as hard)",
            "evictionHard: {}\nevictionSoft: {nodefs.available: 20%}\nevictionSoftGracePeriod: {nodefs.available: 0s}",
            vec![(NodeFsAvailable, "20%", s(0))],
        ),
        (
            "numbers are accepted where YAML reads a plain number",
            "evictionHard: {pid.available: 1000}",
            vec![(PidAvailable, "1k", s(0))],
        ),
        (
            "JSON is accepted too",
            r#"{"evictionHard": {"memory.available": "1Gi"}, "enforceNodeAllocatable": ["pods"]}"#,
            vec![(MemoryAvailable, "1Gi", s(0)), (AllocatableMemoryAvailable, "1Gi", s(0))],
        ),
    ];
    for (behaviour, yaml, expected) in cases {
        let config =
            EvictionConfig::from_kubelet_yaml(yaml).unwrap_or_else(|e| panic!("{behaviour}: {e}"));
        let expected: Vec<_> = expected
            .iter()
            .map(|(signal, value, grace)| (*signal, value.to_string(), *grace))
            .collect();
        assert_eq!(thresholds(&config), expected, "{behaviour}");
    }
}

#[test]
fn defaults_follow_the_kubelet() {
    let config = EvictionConfig::default();
    assert_eq!(config.max_pod_grace_period_seconds(), 0);
    assert_eq!(
        config.pressure_transition_period(),
        Duration::from_secs(300)
    );
    assert_eq!(EvictionConfig::from_kubelet_yaml("{}").unwrap(), config);
    assert_eq!(
        EvictionConfig::from_flags(&EvictionFlags::default()).unwrap(),
        config
    );
}

#[test]
fn minimum_reclaim_and_periods_are_read() {
    let config = EvictionConfig::from_kubelet_yaml(
        "evictionHard: {memory.available: 500Mi, nodefs.available: 10%}\n\
         evictionMinimumReclaim: {memory.available: \"0\", nodefs.available: 5%}\n\
         evictionMaxPodGracePeriod: 60\nevictionPressureTransitionPeriod: 1m30s",
    )
    .unwrap();
    assert_eq!(config.max_pod_grace_period_seconds(), 60);
    assert_eq!(config.pressure_transition_period(), Duration::from_secs(90));
    let t = config.thresholds();
    assert_eq!(
        t[0].min_reclaim,
        Some(ThresholdValue::Quantity("0".parse::<Quantity>().unwrap()))
    );
    assert_eq!(t[1].min_reclaim, Some(ThresholdValue::Percentage(0.05)));
}

#[test]
fn flags_are_read_like_the_kubelet_flags() {
    let flags = EvictionFlags {
        eviction_hard: Some("memory.available<500Mi, nodefs.available<10%"),
        eviction_soft: Some("memory.available<1Gi"),
        eviction_soft_grace_period: Some("memory.available=1m30s"),
        eviction_minimum_reclaim: Some("memory.available=200Mi"),
        eviction_max_pod_grace_period: Some("60"),
        eviction_pressure_transition_period: Some("30s"),
        enforce_node_allocatable: Some(""),
    };
    let config = EvictionConfig::from_flags(&flags).unwrap();
    assert_eq!(
        thresholds(&config),
        vec![
            (Signal::MemoryAvailable, "500Mi".to_string(), Duration::ZERO),
            (Signal::NodeFsAvailable, "10%".to_string(), Duration::ZERO),
            (
                Signal::MemoryAvailable,
                "1Gi".to_string(),
                Duration::from_secs(90)
            ),
        ]
    );
    assert_eq!(config.max_pod_grace_period_seconds(), 60);
    assert_eq!(config.pressure_transition_period(), Duration::from_secs(30));
}

#[test]
fn refused_configurations_name_the_field() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "soft threshold without its own grace period",
            "evictionSoft: {memory.available: 1Gi}\nevictionSoftGracePeriod: {nodefs.available: 1m}",
            "evictionSoft[memory.available]: a soft threshold needs a grace period; set evictionSoftGracePeriod[memory.available]",
        ),
        (
            "unknown signal",
            "evictionHard: {memory.free: 1Gi}",
            "evictionHard[memory.free]: unknown eviction signal \"memory.free\"",
        ),
        (
            "operator inside a config value",
            "evictionHard: {memory.available: \"<500Mi\"}",
            "evictionHard[memory.available]: \"<500Mi\" holds an operator",
        ),
        (
            "malformed quantity",
            "evictionHard: {memory.available: 500MB}",
            "evictionHard[memory.available]: \"500MB\" is not a quantity",
        ),
        (
            "malformed percentage",
            "evictionHard: {nodefs.available: ten%}",
            "evictionHard[nodefs.available]: \"ten%\" is not a percentage",
        ),
        (
            "percentage above 100%",
            "evictionHard: {nodefs.available: 101%}",
            "evictionHard[nodefs.available]: \"101%\" is out of range",
        ),
        (
            "negative percentage",
            "evictionHard: {nodefs.available: -1%}",
            "evictionHard[nodefs.available]: \"-1%\" is out of range",
        ),
        (
            "zero threshold quantity",
            "evictionHard: {memory.available: \"0\"}",
            "evictionHard[memory.available]: \"0\" must be positive",
        ),
        (
            "negative threshold quantity",
            "evictionSoft: {memory.available: -1Gi}",
            "evictionSoft[memory.available]: \"-1Gi\" must be positive",
        ),
        (
            "malformed duration",
            "evictionSoft: {memory.available: 1Gi}\nevictionSoftGracePeriod: {memory.available: 90}",
            "evictionSoftGracePeriod[memory.available]: \"90\" is not a duration: missing unit",
        ),
        (
            "negative grace period",
            "evictionSoft: {memory.available: 1Gi}\nevictionSoftGracePeriod: {memory.available: -1s}",
            "evictionSoftGracePeriod[memory.available]: \"-1s\" must not be negative",
        ),
        (
            "unknown signal in a grace period",
            "evictionSoftGracePeriod: {memory: 1s}",
            "evictionSoftGracePeriod[memory]: unknown eviction signal",
        ),
        (
            "negative minimum reclaim",
            "evictionMinimumReclaim: {memory.available: -1Mi}",
            "evictionMinimumReclaim[memory.available]: \"-1Mi\" must not be negative",
        ),
        (
            "0% minimum reclaim",
            "evictionMinimumReclaim: {nodefs.available: 0%}",
            "evictionMinimumReclaim[nodefs.available]: \"0%\" must be positive",
        ),
        (
            "negative max pod grace period",
            "evictionMaxPodGracePeriod: -5",
            "evictionMaxPodGracePeriod: \"-5\" must not be negative",
        ),
        (
            // KubeletConfiguration.EvictionMaxPodGracePeriod is an int32: the kubelet cannot
            // decode a larger number.
            "max pod grace period beyond int32",
            "evictionMaxPodGracePeriod: 2147483648",
            "evictionMaxPodGracePeriod: invalid value: integer `2147483648`, expected i32",
        ),
        (
            "max pod grace period beyond any YAML integer",
            "evictionMaxPodGracePeriod: 99999999999999999999",
            "invalid YAML: evictionMaxPodGracePeriod: invalid type: integer",
        ),
        (
            "malformed pressure transition period",
            "evictionPressureTransitionPeriod: 5 minutes",
            "evictionPressureTransitionPeriod: \"5 minutes\" is not a Go duration",
        ),
        (
            "misspelt field in a bare mapping",
            "evictionhard: {memory.available: 1Gi}",
            "evictionhard: unknown field `evictionhard`, expected one of `evictionHard`",
        ),
        (
            "a document of another kind",
            "kind: KubeProxyConfiguration",
            "kind: expected KubeletConfiguration, found \"KubeProxyConfiguration\"",
        ),
        (
            "a threshold map that is not a mapping",
            "evictionHard: [memory.available]",
            "evictionHard: invalid type: sequence, expected a mapping of eviction signals",
        ),
        (
            "a signal given twice",
            "evictionHard: {memory.available: 1Gi, memory.available: 2Gi}",
            "invalid YAML: evictionHard: duplicate entry with key \"memory.available\"",
        ),
        (
            "a threshold that is not a scalar",
            "evictionSoft: {memory.available: {value: 1Gi}}",
            "evictionSoft.memory.available: invalid type: map, expected a quantity, a percentage or a Go duration",
        ),
        (
            "a negative pressure transition period",
            "evictionPressureTransitionPeriod: -1m",
            "evictionPressureTransitionPeriod: \"-1m\" is not a Go duration such as 30s, 1m30s or 100ms: must not be negative",
        ),
        ("not YAML", "evictionHard: {", "invalid YAML"),
    ];
    for (behaviour, yaml, expected) in cases {
        let error = EvictionConfig::from_kubelet_yaml(yaml)
            .map(|_| ())
            .expect_err(behaviour)
            .to_string();
        assert!(error.starts_with(expected), "{behaviour}: {error}");
    }
}

#[test]
fn refused_flags_name_the_flag() {
    let cases: &[(&str, EvictionFlags, &str)] = &[
        (
            "pair without operator",
            EvictionFlags {
                eviction_hard: Some("memory.available=500Mi"),
                ..EvictionFlags::default()
            },
            "--eviction-hard: malformed pair \"memory.available=500Mi\"; expected signal<value",
        ),
        (
            "doubled operator",
            EvictionFlags {
                eviction_hard: Some("memory.available<<500Mi"),
                ..EvictionFlags::default()
            },
            "--eviction-hard[memory.available]: \"<500Mi\" holds an operator",
        ),
        (
            "soft flag without grace period flag",
            EvictionFlags {
                eviction_soft: Some("nodefs.available<20%"),
                ..EvictionFlags::default()
            },
            "--eviction-soft[nodefs.available]: a soft threshold needs a grace period; set --eviction-soft-grace-period[nodefs.available]",
        ),
        (
            "max pod grace period that is not a number",
            EvictionFlags {
                eviction_max_pod_grace_period: Some("1m"),
                ..EvictionFlags::default()
            },
            "--eviction-max-pod-grace-period: expected a whole number of seconds",
        ),
        (
            "max pod grace period flag beyond int32",
            EvictionFlags {
                eviction_max_pod_grace_period: Some("2147483648"),
                ..EvictionFlags::default()
            },
            "--eviction-max-pod-grace-period: expected a whole number of seconds",
        ),
    ];
    for (behaviour, flags, expected) in cases {
        let error = EvictionConfig::from_flags(flags)
            .expect_err(behaviour)
            .to_string();
        assert!(error.starts_with(expected), "{behaviour}: {error}");
    }
}
