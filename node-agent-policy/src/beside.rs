//! Running beside the kubelet: which of the kubelet's own eviction thresholds would be acted on
//! before the agent's. The kubelet's eviction manager keeps running next to the agent; for the
//! agent to act first, every kubelet threshold needs an agent threshold on the same signal that
//! is met earlier (a higher available value) and acted on no later (a grace period no longer).
//! Pure: the kubelet's thresholds and the capacities are arguments.

use std::fmt;

use crate::{config::ThresholdValue, signal::Signal, EvictionConfig, Threshold};

/// Why a kubelet threshold would be acted on before (or with) the agent's.
#[derive(Debug, Clone, PartialEq)]
pub enum KubeletFirst {
    /// The agent has no threshold on this signal at all.
    NoAgentThreshold,
    /// Every agent threshold on the signal is met later (lower), the nearest named.
    Stricter { agent: Threshold },
    /// The nearest agent threshold is met at the same value: both act on the same crossing.
    SameLevel { agent: Threshold },
    /// An agent threshold is met earlier, but waits out a longer grace period.
    LongerGrace { agent: Threshold },
}

/// One kubelet threshold the agent does not act before, or cannot be compared with.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    pub kubelet: Threshold,
    /// `None`: the comparison needs the signal's capacity (a percentage against a quantity)
    /// and it is not known.
    pub first: Option<KubeletFirst>,
}

fn value(v: &ThresholdValue) -> String {
    match v {
        ThresholdValue::Quantity(q) => q.to_string(),
        ThresholdValue::Percentage(p) => {
            format!("{}%", (f64::from(*p) * 100.0 * 1000.0).round() / 1000.0)
        }
    }
}

fn describe(t: &Threshold) -> String {
    if t.is_hard() {
        format!("hard {}<{}", t.signal, value(&t.value))
    } else {
        format!(
            "soft {}<{} (grace {:?})",
            t.signal,
            value(&t.value),
            t.grace_period
        )
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let k = describe(&self.kubelet);
        match &self.first {
            None => write!(f, "the kubelet's {k} cannot be compared with the agent's thresholds on {} (one is a percentage, the other a quantity, and the capacity is unknown)", self.kubelet.signal),
            Some(KubeletFirst::NoAgentThreshold) => write!(f, "the kubelet's {k} has no agent threshold on {}: the kubelet alone evicts for it", self.kubelet.signal),
            Some(KubeletFirst::Stricter { agent }) => write!(f, "the kubelet's {k} is met before the agent's {}: the kubelet would evict first; set the agent's above it", describe(agent)),
            Some(KubeletFirst::SameLevel { agent }) => write!(f, "the kubelet's {k} is met at the same value as the agent's {}: both act on the same crossing; set the agent's a little above it", describe(agent)),
            Some(KubeletFirst::LongerGrace { agent }) => write!(f, "the agent's {} is met before the kubelet's {k} but waits longer: the kubelet may evict first", describe(agent)),
        }
    }
}

/// The threshold's level in the signal's unit, if it can be put in one with `other`'s: two
/// percentages compare as fractions, two quantities as values, a mix through the capacity.
fn levels(a: &ThresholdValue, b: &ThresholdValue, capacity: Option<i64>) -> Option<(f64, f64)> {
    match (a, b) {
        (ThresholdValue::Percentage(x), ThresholdValue::Percentage(y)) => {
            Some((f64::from(*x), f64::from(*y)))
        }
        (ThresholdValue::Quantity(x), ThresholdValue::Quantity(y)) => {
            Some((x.value() as f64, y.value() as f64))
        }
        _ => {
            let c = capacity?;
            Some((a.resolve(c).value() as f64, b.resolve(c).value() as f64))
        }
    }
}

/// The kubelet's thresholds that the agent's do not act before, one finding each, in the
/// kubelet's order. `capacity` gives a signal's capacity (for percentages against quantities).
/// `allocatableMemory.available` is left out: the agent does not observe it.
pub fn kubelet_acts_first(
    kubelet: &EvictionConfig,
    agent: &EvictionConfig,
    capacity: &dyn Fn(Signal) -> Option<i64>,
) -> Vec<Finding> {
    let mut findings = Vec::new();
    for k in kubelet.thresholds() {
        if k.signal == Signal::AllocatableMemoryAvailable {
            continue;
        }
        let ours: Vec<&Threshold> = agent
            .thresholds()
            .iter()
            .filter(|a| a.signal == k.signal)
            .collect();
        if ours.is_empty() {
            findings.push(Finding {
                kubelet: k.clone(),
                first: Some(KubeletFirst::NoAgentThreshold),
            });
            continue;
        }
        let cap = capacity(k.signal);
        // (agent threshold, its level, the kubelet's level), for those that compare.
        let compared: Vec<(&Threshold, f64, f64)> = ours
            .iter()
            .filter_map(|a| levels(&a.value, &k.value, cap).map(|(x, y)| (*a, x, y)))
            .collect();
        let acts_first = |a: &Threshold, x: f64, y: f64| x > y && a.grace_period <= k.grace_period;
        if compared.iter().any(|(a, x, y)| acts_first(a, *x, *y)) {
            continue;
        }
        let first = if compared.len() < ours.len() {
            None
        } else if let Some((a, _, _)) = compared.iter().find(|(_, x, y)| x > y) {
            Some(KubeletFirst::LongerGrace {
                agent: (*a).clone(),
            })
        } else {
            // The nearest: the highest level among the agent's (all at or below the kubelet's).
            let (a, x, y) = compared
                .iter()
                .max_by(|p, q| {
                    p.1.total_cmp(&q.1)
                        .then(q.0.grace_period.cmp(&p.0.grace_period))
                })
                .expect("compared is not empty here");
            let agent = (*a).clone();
            Some(if x == y {
                KubeletFirst::SameLevel { agent }
            } else {
                KubeletFirst::Stricter { agent }
            })
        };
        findings.push(Finding {
            kubelet: k.clone(),
            first,
        });
    }
    findings
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(yaml: &str) -> EvictionConfig {
        EvictionConfig::from_kubelet_yaml(yaml).unwrap()
    }

    /// What each finding says, short: (signal, kind).
    fn kinds(findings: &[Finding]) -> Vec<(String, &'static str)> {
        findings
            .iter()
            .map(|f| {
                let kind = match &f.first {
                    None => "unknown",
                    Some(KubeletFirst::NoAgentThreshold) => "none",
                    Some(KubeletFirst::Stricter { .. }) => "stricter",
                    Some(KubeletFirst::SameLevel { .. }) => "same",
                    Some(KubeletFirst::LongerGrace { .. }) => "longer grace",
                };
                (f.kubelet.signal.to_string(), kind)
            })
            .collect()
    }

    #[test]
    fn kubelet_thresholds_the_agent_does_not_act_before() {
        let all_fs = "nodefs.available: 20%, nodefs.inodesFree: 10%, imagefs.available: 20%";
        let agent_mem = |m: &str| format!("{{evictionHard: {{memory.available: {m}, {all_fs}}}}}");
        let gib = 1i64 << 30;
        /// (behaviour, the agent's config, the kubelet's, the capacity, (signal, finding)s)
        type Row<'a> = (
            &'a str,
            String,
            &'a str,
            Option<i64>,
            Vec<(&'a str, &'a str)>,
        );
        let rows: Vec<Row> = vec![
            ("agent above the kubelet's defaults: nothing", agent_mem("200Mi"),
                "{kind: KubeletConfiguration}", None, vec![]),
            ("kubelet's memory threshold higher: stricter", agent_mem("200Mi"),
                "{kind: KubeletConfiguration, evictionHard: {memory.available: 500Mi}}", None,
                vec![("memory.available", "stricter")]),
            ("equal: the same crossing", agent_mem("500Mi"),
                "{kind: KubeletConfiguration, evictionHard: {memory.available: 500Mi}}", None,
                vec![("memory.available", "same")]),
            ("the kubelet's defaults when it sets no evictionHard", agent_mem("50Mi"),
                "{kind: KubeletConfiguration}", None, vec![("memory.available", "stricter")]),
            ("a signal the agent has no threshold on", "{evictionHard: {memory.available: 1Gi}}".into(),
                "{kind: KubeletConfiguration, evictionHard: {nodefs.available: 5%}}", None,
                vec![("nodefs.available", "none")]),
            ("a kubelet soft threshold is met before the agent's hard one", agent_mem("200Mi"),
                "{kind: KubeletConfiguration, evictionHard: {memory.available: 100Mi}, evictionSoft: {memory.available: 1Gi}, evictionSoftGracePeriod: {memory.available: 1m}}",
                None, vec![("memory.available", "stricter")]),
            ("an agent soft threshold earlier but with a longer grace", "{evictionHard: {memory.available: 100Mi}, evictionSoft: {memory.available: 2Gi}, evictionSoftGracePeriod: {memory.available: 5m}}".into(),
                "{kind: KubeletConfiguration, evictionHard: {memory.available: 1Gi}}", None,
                vec![("memory.available", "longer grace")]),
            ("an agent soft threshold earlier and as quick: fine", "{evictionHard: {memory.available: 100Mi}, evictionSoft: {memory.available: 2Gi}, evictionSoftGracePeriod: {memory.available: 1m}}".into(),
                "{kind: KubeletConfiguration, evictionHard: {memory.available: 50Mi}, evictionSoft: {memory.available: 1Gi}, evictionSoftGracePeriod: {memory.available: 1m}}", None,
                vec![]),
            ("a percentage against a quantity, capacity known: compared", agent_mem("5%"),
                "{kind: KubeletConfiguration, evictionHard: {memory.available: 500Mi}}", Some(16 * gib),
                vec![]),
            ("the same, on a small node: the kubelet first", agent_mem("5%"),
                "{kind: KubeletConfiguration, evictionHard: {memory.available: 500Mi}}", Some(4 * gib),
                vec![("memory.available", "stricter")]),
            ("a percentage against a quantity, capacity unknown: said so", agent_mem("5%"),
                "{kind: KubeletConfiguration, evictionHard: {memory.available: 500Mi}}", None,
                vec![("memory.available", "unknown")]),
            ("percentages compare as fractions", "{evictionHard: {memory.available: 1Gi, nodefs.available: 9%}}".into(),
                "{kind: KubeletConfiguration, evictionHard: {nodefs.available: 10%}}", None,
                vec![("nodefs.available", "stricter")]),
        ];
        for (what, agent, kubelet, cap, want) in rows {
            let findings = kubelet_acts_first(&config(kubelet), &config(&agent), &|_| cap);
            let want: Vec<(String, &str)> =
                want.into_iter().map(|(s, k)| (s.to_string(), k)).collect();
            assert_eq!(kinds(&findings), want, "{what}: {findings:?}");
        }
    }

    #[test]
    fn findings_read_as_advice() {
        let f = kubelet_acts_first(
            &config("{kind: KubeletConfiguration, evictionHard: {memory.available: 500Mi}}"),
            &config("{evictionHard: {memory.available: 200Mi, nodefs.available: 10%, nodefs.inodesFree: 5%, imagefs.available: 15%}}"),
            &|_| None,
        );
        assert_eq!(
            f[0].to_string(),
            "the kubelet's hard memory.available<500Mi is met before the agent's hard memory.available<200Mi: the kubelet would evict first; set the agent's above it"
        );
    }
}
