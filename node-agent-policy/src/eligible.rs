//! Which pods the agent may act on. The kubelet passes over critical pods while ranking; the
//! agent also passes over its own pod, the pods its configuration excludes, and the pods the
//! executor reported as not evictable now. All of that is decided here, in the evaluation, so
//! that the next-ranked pod is chosen at once instead of the same refused pod again.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::pod::PodInfo;

/// Pods never evicted, on top of the agent's own pod and the kubelet's critical pods
/// (`kubernetes.exclusions` in the agent's config).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Exclusions {
    pub namespaces: BTreeSet<String>,
    /// A pod matching this selector is excluded. Empty selects nothing.
    pub label_selector: LabelSelector,
}

/// The `metav1.LabelSelector` shape, spelt as Kubernetes spells it (`matchLabels`,
/// `matchExpressions`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LabelSelector {
    pub match_labels: BTreeMap<String, String>,
    pub match_expressions: Vec<LabelRequirement>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelRequirement {
    pub key: String,
    pub operator: LabelOperator,
    #[serde(default)]
    pub values: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LabelOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

impl LabelSelector {
    /// Whether the selector has no requirement at all (and so selects nothing here).
    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.match_expressions.is_empty()
    }

    /// Whether `labels` satisfy every requirement. An empty selector matches nothing, so that
    /// an absent `labelSelector` excludes no pod.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        if self.is_empty() {
            return false;
        }
        let labels_ok = self
            .match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v));
        let exprs_ok = self.match_expressions.iter().all(|r| {
            let value = labels.get(&r.key);
            match r.operator {
                LabelOperator::In => value.is_some_and(|v| r.values.contains(v)),
                LabelOperator::NotIn => value.is_none_or(|v| !r.values.contains(v)),
                LabelOperator::Exists => value.is_some(),
                LabelOperator::DoesNotExist => value.is_none(),
            }
        });
        labels_ok && exprs_ok
    }
}

/// Why the executor cannot evict a pod now (reported back by it, kept by the daemon's loop
/// for as long as it holds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NotEvictableNow {
    /// Its eviction is on its way: handed over and not answered yet, or chosen in this very
    /// evaluation for a local storage limit.
    Evicting,
    /// Evicted already, and still terminating.
    Terminating,
    /// The Eviction API answered that a PodDisruptionBudget forbids it.
    BlockedByDisruptionBudget,
    /// The API server refused this pod's eviction (forbidden, invalid, conflicting).
    Refused,
    /// The last attempt failed; the next attempt goes to the next-ranked pod, as the
    /// kubelet moves on within one pass.
    Failed,
}

impl NotEvictableNow {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Evicting => "evicting",
            Self::Terminating => "terminating",
            Self::BlockedByDisruptionBudget => "blocked_by_pdb",
            Self::Refused => "refused",
            Self::Failed => "failed",
        }
    }
}

/// Why a pod ranked ahead of the chosen one (or ahead of none) was passed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PassReason {
    /// The kubelet's `IsCriticalPod`: a static pod.
    Static,
    /// The kubelet's `IsCriticalPod`: a mirror pod.
    Mirror,
    /// The kubelet's `IsCriticalPod`: priority at or above system-critical.
    CriticalPriority,
    /// The agent's own pod.
    OwnPod,
    ExcludedNamespace,
    ExcludedByLabelSelector,
    NotEvictableNow(NotEvictableNow),
}

impl PassReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Static => "static",
            Self::Mirror => "mirror",
            Self::CriticalPriority => "critical_priority",
            Self::OwnPod => "own_pod",
            Self::ExcludedNamespace => "excluded_namespace",
            Self::ExcludedByLabelSelector => "excluded_by_label_selector",
            Self::NotEvictableNow(n) => n.as_str(),
        }
    }
}

impl std::fmt::Display for PassReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Static => "a static pod (the kubelet never evicts it)",
            Self::Mirror => "a mirror pod (the kubelet never evicts it)",
            Self::CriticalPriority => "priority at or above system-critical",
            Self::OwnPod => "the agent's own pod",
            Self::ExcludedNamespace => "its namespace is in kubernetes.exclusions.namespaces",
            Self::ExcludedByLabelSelector => "it matches kubernetes.exclusions.labelSelector",
            Self::NotEvictableNow(NotEvictableNow::Evicting) => "its eviction is on its way",
            Self::NotEvictableNow(NotEvictableNow::Terminating) => "already terminating",
            Self::NotEvictableNow(NotEvictableNow::BlockedByDisruptionBudget) => {
                "its PodDisruptionBudget blocked the last eviction"
            }
            Self::NotEvictableNow(NotEvictableNow::Refused) => {
                "the API server refused its last eviction"
            }
            Self::NotEvictableNow(NotEvictableNow::Failed) => "its last eviction attempt failed",
        })
    }
}

/// The kubelet's critical priority (`scheduling.SystemCriticalPriority`): pods at or above it
/// are never evicted.
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

impl PodInfo {
    /// The kubelet's `IsCriticalPod`: static, mirror, or priority at or above
    /// [`SYSTEM_CRITICAL_PRIORITY`]. Critical pods are never evicted.
    pub fn is_critical(&self) -> bool {
        self.critical_reason().is_some()
    }

    /// Which of the kubelet's critical-pod rules applies, if any.
    pub fn critical_reason(&self) -> Option<PassReason> {
        if self.is_static {
            Some(PassReason::Static)
        } else if self.is_mirror {
            Some(PassReason::Mirror)
        } else if self.priority >= SYSTEM_CRITICAL_PRIORITY {
            Some(PassReason::CriticalPriority)
        } else {
            None
        }
    }
}

/// Which pods the agent may evict: everything not critical to the kubelet, minus its own pod,
/// the configured exclusions and the pods not evictable now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Eligibility {
    /// The agent's own pod, `(namespace, name)` (from the downward API), when it runs in one.
    pub own_pod: Option<(String, String)>,
    pub exclusions: Exclusions,
    /// By [`PodInfo::id`].
    pub not_evictable_now: BTreeMap<String, NotEvictableNow>,
}

impl Eligibility {
    /// Why `pod` must be passed over, or None when it may be evicted. One rule for the policy
    /// and for the executor's last check before a request.
    pub fn check(&self, pod: &PodInfo) -> Option<PassReason> {
        if let Some(reason) = pod.critical_reason() {
            return Some(reason);
        }
        if self
            .own_pod
            .as_ref()
            .is_some_and(|(ns, name)| *ns == pod.namespace && *name == pod.name)
        {
            return Some(PassReason::OwnPod);
        }
        if self.exclusions.namespaces.contains(&pod.namespace) {
            return Some(PassReason::ExcludedNamespace);
        }
        if self.exclusions.label_selector.matches(&pod.labels) {
            return Some(PassReason::ExcludedByLabelSelector);
        }
        if pod.terminating {
            return Some(PassReason::NotEvictableNow(NotEvictableNow::Terminating));
        }
        self.not_evictable_now
            .get(&pod.id())
            .map(|n| PassReason::NotEvictableNow(*n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str) -> PodInfo {
        PodInfo {
            namespace: ns.into(),
            name: name.into(),
            uid: Some(format!("uid-{name}")),
            labels: [("app".to_string(), "web".to_string())]
                .into_iter()
                .collect(),
            ..PodInfo::default()
        }
    }

    #[test]
    fn each_reason_to_pass_a_pod_over() {
        let eligibility = Eligibility {
            own_pod: Some(("node-agent".into(), "node-agent-x1".into())),
            exclusions: serde_yaml_ng::from_str(
                "{namespaces: [kube-system], labelSelector: {matchLabels: {app: db}}}",
            )
            .unwrap(),
            not_evictable_now: [
                (
                    "uid-blocked".to_string(),
                    NotEvictableNow::BlockedByDisruptionBudget,
                ),
                ("uid-refused".to_string(), NotEvictableNow::Refused),
                ("shop/no-uid".to_string(), NotEvictableNow::Failed),
            ]
            .into_iter()
            .collect(),
        };
        let with = |f: fn(&mut PodInfo)| {
            let mut p = pod("apps", "p");
            f(&mut p);
            p
        };
        let rows: Vec<(&str, PodInfo, Option<PassReason>)> = vec![
            ("an ordinary pod may go", pod("apps", "p"), None),
            (
                "own pod",
                pod("node-agent", "node-agent-x1"),
                Some(PassReason::OwnPod),
            ),
            (
                "the same name elsewhere may go",
                pod("apps", "node-agent-x1"),
                None,
            ),
            (
                "static",
                with(|p| p.is_static = true),
                Some(PassReason::Static),
            ),
            (
                "mirror",
                with(|p| p.is_mirror = true),
                Some(PassReason::Mirror),
            ),
            (
                "system-critical priority",
                with(|p| p.priority = SYSTEM_CRITICAL_PRIORITY),
                Some(PassReason::CriticalPriority),
            ),
            (
                "just below critical may go",
                with(|p| p.priority = SYSTEM_CRITICAL_PRIORITY - 1),
                None,
            ),
            (
                "excluded namespace",
                pod("kube-system", "p"),
                Some(PassReason::ExcludedNamespace),
            ),
            (
                "excluded by labels",
                with(|p| {
                    p.labels.insert("app".into(), "db".into());
                }),
                Some(PassReason::ExcludedByLabelSelector),
            ),
            (
                "terminating (deletion requested)",
                with(|p| p.terminating = true),
                Some(PassReason::NotEvictableNow(NotEvictableNow::Terminating)),
            ),
            (
                "blocked by its disruption budget",
                pod("apps", "blocked"),
                Some(PassReason::NotEvictableNow(
                    NotEvictableNow::BlockedByDisruptionBudget,
                )),
            ),
            (
                "refused by the API server",
                pod("apps", "refused"),
                Some(PassReason::NotEvictableNow(NotEvictableNow::Refused)),
            ),
            (
                "a pod without UID is known by namespace/name",
                PodInfo {
                    uid: None,
                    ..pod("shop", "no-uid")
                },
                Some(PassReason::NotEvictableNow(NotEvictableNow::Failed)),
            ),
        ];
        for (what, p, want) in rows {
            assert_eq!(eligibility.check(&p), want, "{what}");
        }
    }

    #[test]
    fn label_selector_matches_like_kubernetes() {
        let labels: BTreeMap<String, String> = [("app".to_string(), "db".to_string())]
            .into_iter()
            .collect();
        let sel = |yaml: &str| serde_yaml_ng::from_str::<LabelSelector>(yaml).unwrap();
        let rows = [
            ("{}", false),
            ("matchLabels: {app: db}", true),
            ("matchLabels: {app: web}", false),
            (
                "matchExpressions: [{key: app, operator: In, values: [db, x]}]",
                true,
            ),
            (
                "matchExpressions: [{key: app, operator: NotIn, values: [db]}]",
                false,
            ),
            (
                "matchExpressions: [{key: tier, operator: NotIn, values: [db]}]",
                true,
            ),
            ("matchExpressions: [{key: app, operator: Exists}]", true),
            (
                "matchExpressions: [{key: app, operator: DoesNotExist}]",
                false,
            ),
        ];
        for (yaml, want) in rows {
            assert_eq!(sel(yaml).matches(&labels), want, "{yaml}");
        }
    }
}
