//! Pods that are never evicted, decided before any request is made.

use crate::{config::Exclusions, pods::model::NodePod};

/// Why a pod may not be evicted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Protected {
    /// The agent's own pod.
    OwnPod,
    /// The kubelet's `IsCriticalPod`: static, mirror, or priority at least system-critical.
    KubeletCritical {
        is_static: bool,
        is_mirror: bool,
        priority: i32,
    },
    ExcludedNamespace,
    ExcludedByLabelSelector,
}

impl std::fmt::Display for Protected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::OwnPod => f.write_str("it is the agent's own pod"),
            Self::KubeletCritical { is_static, is_mirror, priority } => write!(
                f,
                "the kubelet treats it as critical (static: {is_static}, mirror: {is_mirror}, priority: {priority})"
            ),
            Self::ExcludedNamespace => f.write_str("its namespace is in exclusions.namespaces"),
            Self::ExcludedByLabelSelector => f.write_str("it matches exclusions.label_selector"),
        }
    }
}

/// The agent's own pod (from the downward API) and the configured exclusions.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Protection {
    pub own_namespace: String,
    pub own_name: String,
    pub exclusions: Exclusions,
}

impl Protection {
    /// Why `pod` must not be evicted, or None when it may be.
    pub fn check(&self, pod: &NodePod) -> Option<Protected> {
        if pod.namespace == self.own_namespace && pod.name == self.own_name {
            return Some(Protected::OwnPod);
        }
        if pod.is_kubelet_critical() {
            return Some(Protected::KubeletCritical {
                is_static: pod.is_static,
                is_mirror: pod.is_mirror,
                priority: pod.priority,
            });
        }
        if self.exclusions.namespaces.contains(&pod.namespace) {
            return Some(Protected::ExcludedNamespace);
        }
        if self.exclusions.label_selector.matches(&pod.labels) {
            return Some(Protected::ExcludedByLabelSelector);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::model::QosClass;

    fn pod(ns: &str, name: &str) -> NodePod {
        NodePod {
            namespace: ns.into(),
            name: name.into(),
            uid: "u".into(),
            labels: [("app".to_string(), "web".to_string())]
                .into_iter()
                .collect(),
            phase: None,
            priority: 0,
            qos: QosClass::BestEffort,
            is_static: false,
            is_mirror: false,
            owner_kind: None,
            termination_grace_period_seconds: 30,
            containers: vec![],
            usage: None,
        }
    }

    #[test]
    fn protection_rows() {
        let protection = Protection {
            own_namespace: "node-agent".into(),
            own_name: "node-agent-x1".into(),
            exclusions: serde_yaml_ng::from_str(
                "{namespaces: [kube-system], label_selector: {match_labels: {app: db}}}",
            )
            .unwrap(),
        };
        let critical = |f: fn(&mut NodePod)| {
            let mut p = pod("apps", "p");
            f(&mut p);
            p
        };
        let rows: Vec<(&str, NodePod, Option<Protected>)> = vec![
            ("ordinary pod", pod("apps", "p"), None),
            (
                "own pod",
                pod("node-agent", "node-agent-x1"),
                Some(Protected::OwnPod),
            ),
            ("same name elsewhere", pod("apps", "node-agent-x1"), None),
            (
                "static",
                critical(|p| p.is_static = true),
                Some(Protected::KubeletCritical {
                    is_static: true,
                    is_mirror: false,
                    priority: 0,
                }),
            ),
            (
                "mirror",
                critical(|p| p.is_mirror = true),
                Some(Protected::KubeletCritical {
                    is_static: false,
                    is_mirror: true,
                    priority: 0,
                }),
            ),
            (
                "system-node-critical",
                critical(|p| p.priority = 2_000_001_000),
                Some(Protected::KubeletCritical {
                    is_static: false,
                    is_mirror: false,
                    priority: 2_000_001_000,
                }),
            ),
            (
                "just below critical",
                critical(|p| p.priority = 1_999_999_999),
                None,
            ),
            (
                "excluded namespace",
                pod("kube-system", "p"),
                Some(Protected::ExcludedNamespace),
            ),
            (
                "excluded label",
                critical(|p| {
                    p.labels.insert("app".into(), "db".into());
                }),
                Some(Protected::ExcludedByLabelSelector),
            ),
        ];
        for (what, p, want) in rows {
            assert_eq!(protection.check(&p), want, "{what}");
        }
    }
}
