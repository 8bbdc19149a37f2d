//! One record at a time: a pod list and a stats summary are decoded item by item, so one bad
//! pod or stats entry is named, counted and left aside, and never rejects its neighbours. What
//! was left aside travels with the snapshot as [`Problem`]s; [`ProblemLog`] says each one once,
//! when it appears and when it is gone, not at every refresh.
//!
//! What is kept is bounded too. A `v1.Pod` decodes into far more memory than its JSON (a
//! `Pod` is 2.2 KiB before any field is set, a `Container` 2.1 KiB: 30 000 small pods in a
//! 32 MiB list took 200 MiB and got the agent OOM-killed), so each pod is read into the
//! policy's model ([`Item`]) as soon as it is decoded and its `Pod` dropped; one pod's JSON
//! may weigh at most [`POD_OBJECT_CAP`]; and what is kept is charged against a budget
//! ([`POD_MODEL_BUDGET`], [`STATS_MODEL_BUDGET`]) that no real node comes near: a pod's model
//! takes a few KiB (250 pods: about 1 MiB), its stats entry under 1 KiB.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::Pod;
use node_agent_policy::PodInfo;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::{
    model::{self, ContainerRef, Read},
    stats::PodStats,
};
use crate::api::Counters;

/// The most one pod's JSON may weigh: etcd's object limit (1.5 MiB), so no pod the API server
/// stores is refused. Decoding one at this size costs at most a few tens of MiB, once.
pub const POD_OBJECT_CAP: usize = 3 << 19;
/// What the pods kept from one list may take (their models, as [`Item::bytes`] estimates
/// them): 8 MiB, over 3000 pods of realistic size. It keeps a list of as many tiny pods as
/// the byte cap lets through (refused by it) within the DaemonSet's limit;
/// `tests/tests/hostile_e2e.rs` prints the peaks.
pub const POD_MODEL_BUDGET: usize = 8 << 20;
/// What the stats entries kept from one summary may take: 8 MiB.
pub const STATS_MODEL_BUDGET: usize = 8 << 20;

pub use crate::api::DecodeError;

/// One pod as the policy models it, read at once from its `v1.Pod`.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// `namespace/name`.
    pub name: String,
    pub uid: String,
    pub read: Read,
    /// What it holds, approximately, in bytes: its share of the model budget.
    pub bytes: usize,
}

/// Approximately what a pod's model holds in memory.
fn model_bytes(pod: &PodInfo, containers: &[(String, ContainerRef)]) -> usize {
    use std::mem::size_of;
    /// A map entry's share of its tree's nodes and the strings' own headers.
    const ENTRY: usize = 64;
    size_of::<PodInfo>()
        + pod.namespace.len()
        + pod.name.len()
        + pod.uid.as_ref().map_or(0, String::len)
        + pod
            .labels
            .iter()
            .map(|(k, v)| k.len() + v.len() + ENTRY)
            .sum::<usize>()
        + pod
            .containers
            .iter()
            .map(|c| size_of::<node_agent_policy::ContainerInfo>() + c.name.len())
            .sum::<usize>()
        + pod
            .init_containers
            .iter()
            .map(|c| size_of::<node_agent_policy::InitContainerInfo>() + c.name.len())
            .sum::<usize>()
        + pod
            .empty_dirs
            .iter()
            .map(|v| size_of::<node_agent_policy::EmptyDirInfo>() + v.name.len())
            .sum::<usize>()
        + containers
            .iter()
            .map(|(id, c)| id.len() + c.pod_uid.len() + c.name.len() + ENTRY)
            .sum::<usize>()
}

/// Approximately what a stats entry holds in memory.
fn stats_bytes(s: &PodStats) -> usize {
    use std::mem::size_of;
    size_of::<PodStats>()
        + s.pod_ref.name.len()
        + s.pod_ref.namespace.len()
        + s.pod_ref.uid.len()
        + s.containers
            .iter()
            .map(|c| size_of::<super::stats::ContainerStats>() + c.name.len())
            .sum::<usize>()
        + s.volumes
            .iter()
            .map(|v| size_of::<super::stats::VolumeStats>() + v.name.len())
            .sum::<usize>()
}

/// What was wrong with one record, and what became of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProblemKind {
    /// The pod object could not be read: left out of the snapshot.
    PodUnreadable,
    /// Two pods carry one UID: both left out, so neither is measured or evicted as the other.
    DuplicateUid,
    /// The pod's stats entry could not be read (or two entries name its UID): the pod has no
    /// usage and ranks as the kubelet ranks a pod without stats (first).
    StatsUnreadable,
    /// A quantity of the pod is not one: the pod stays, the field read as the issue says
    /// (a request as zero, a limit as none), so it is not its innocent neighbour that goes.
    FieldInvalid,
}

impl ProblemKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PodUnreadable => "pod_unreadable",
            Self::DuplicateUid => "duplicate_uid",
            Self::StatsUnreadable => "stats_unreadable",
            Self::FieldInvalid => "field_invalid",
        }
    }

    /// What the agent did about it, for the log line.
    fn consequence(self) -> &'static str {
        match self {
            Self::PodUnreadable => "pod left out: its object cannot be read",
            Self::DuplicateUid => {
                "pod left out: another pod carries its UID (both are refused, neither measured as the other)"
            }
            Self::StatsUnreadable => {
                "pod kept without usage: its stats entry cannot be read, so it ranks as the kubelet ranks a pod without stats"
            }
            Self::FieldInvalid => {
                "pod kept: a quantity that is not one is read as a zero request or no limit"
            }
        }
    }
}

/// One record the agent could not take as it came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// `namespace/name` (or `uid <uid>`, or `item <n>` when the record names nothing readable).
    pub pod: String,
    pub kind: ProblemKind,
    /// What was wrong, with the field and value.
    pub detail: String,
}

/// A list as the API server and the kubelet write it, its items still raw.
#[derive(Deserialize)]
struct RawList<'a> {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(borrow, default)]
    items: Vec<&'a RawValue>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ListMeta {
    resource_version: Option<String>,
}

/// A summary, its pod entries still raw. Of the node part only its name and the task limit are
/// read: the agent measures the rest of the node itself.
#[derive(Deserialize)]
struct RawSummary<'a> {
    #[serde(default)]
    node: Option<RawSummaryNode>,
    #[serde(borrow, default)]
    pods: Vec<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawSummaryNode {
    #[serde(default)]
    node_name: Option<String>,
    /// `RlimitStats`, read leniently: a bad figure is named, never the whole summary refused.
    #[serde(default)]
    rlimit: Option<serde_json::Value>,
}

/// The node's task limit as the kubelet reads it (`node.rlimit.maxpid`: min(`pid_max`,
/// `threads-max`) in the kubelet's PID namespace, the host's): `None` when the summary has
/// none, `Err` naming what was there when it is not a positive whole number.
fn max_pids(rlimit: Option<&serde_json::Value>) -> Option<Result<i64, String>> {
    let value = rlimit?.get("maxpid")?;
    if value.is_null() {
        return None;
    }
    Some(
        value
            .as_i64()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("node.rlimit.maxpid is {value}, not a positive whole number")),
    )
}

/// What a `/stats/summary` says: the node it is of, its task limit, and its pod entries.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// `node.nodeName`: whose kubelet answered.
    pub node: Option<String>,
    /// `node.rlimit.maxpid` ([`max_pids`]).
    pub max_pids: Option<Result<i64, String>>,
    /// The entries that could be read.
    pub stats: Vec<PodStats>,
    /// The ones that could not, named.
    pub problems: Vec<Problem>,
}

/// Who a record names, read as leniently as JSON allows.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Ident {
    metadata: Option<serde_json::Value>,
    pod_ref: Option<serde_json::Value>,
}

/// A name from a record, cut to Kubernetes' longest and escaped (a line break or a terminal
/// escape in it never reaches a log raw).
fn shown_name(text: &str) -> String {
    node_agent_policy::shown(text, 253)
        .escape_debug()
        .to_string()
}

/// `namespace/name` of a record that could not be read, if it says.
fn name_of(raw: &RawValue, index: usize) -> String {
    let ident = serde_json::from_str::<Ident>(raw.get()).ok();
    let meta = ident.and_then(|i| i.metadata.or(i.pod_ref));
    // Cut: a name past Kubernetes' limits is one reason a record is refused.
    let text = |key: &str| {
        meta.as_ref()
            .and_then(|m| m.get(key))
            .and_then(|v| v.as_str())
            .map(shown_name)
    };
    match (text("namespace"), text("name"), text("uid")) {
        (Some(ns), Some(name), _) => format!("{ns}/{name}"),
        (_, _, Some(uid)) => format!("uid {uid}"),
        _ => format!("item {index}"),
    }
}

/// A pod list read record by record.
#[derive(Debug, Clone, Default)]
pub struct PodList {
    pub items: Vec<Item>,
    /// The list's `resourceVersion` (the API server's).
    pub resource_version: Option<String>,
    /// The items that could not be read, named.
    pub problems: Vec<Problem>,
}

/// The pods of a `v1.PodList`, each read into the model as soon as it is decoded; the items
/// that cannot be read are named in `problems`. `Err` when the answer is not a list, or its
/// pods would take more than [`POD_MODEL_BUDGET`].
pub fn decode_pod_list(body: &[u8]) -> Result<PodList, DecodeError> {
    let list: RawList = serde_json::from_slice(body)?;
    let mut out = PodList {
        items: Vec::with_capacity(list.items.len().min(1024)),
        resource_version: list.metadata.resource_version,
        problems: Vec::new(),
    };
    let mut kept = 0usize;
    for (index, raw) in list.items.into_iter().enumerate() {
        match decode_item(raw, index) {
            Ok(item) => {
                kept += item.bytes;
                if kept > POD_MODEL_BUDGET {
                    return Err(DecodeError::OverBudget {
                        what: "pods",
                        budget: POD_MODEL_BUDGET,
                    });
                }
                out.items.push(item);
            }
            Err(problem) => out.problems.push(problem),
        }
    }
    Ok(out)
}

/// One pod (of a list or a watch event) read into the model, or why it cannot be (naming the
/// pod when its JSON does). Its `v1.Pod` lives only while it is read.
pub fn decode_item(raw: &RawValue, index: usize) -> Result<Item, Problem> {
    let problem = |detail: String| Problem {
        pod: name_of(raw, index),
        kind: ProblemKind::PodUnreadable,
        detail,
    };
    if raw.get().len() > POD_OBJECT_CAP {
        return Err(problem(format!(
            "its object is {} bytes, above the {POD_OBJECT_CAP}-byte cap (etcd's own)",
            raw.get().len()
        )));
    }
    let pod: Pod = serde_json::from_str(raw.get()).map_err(|e| problem(e.to_string()))?;
    let read = model::read(&pod).map_err(|e| problem(e.to_string()))?;
    let meta = pod.metadata;
    let name = format!(
        "{}/{}",
        meta.namespace.unwrap_or_default(),
        meta.name.unwrap_or_default()
    );
    // `read` refuses a pod without a UID.
    let uid = meta.uid.unwrap_or_default();
    let bytes = match &read {
        Read::Active {
            pod, containers, ..
        } => model_bytes(pod, containers),
        Read::Terminal => std::mem::size_of::<Item>() + name.len() + uid.len(),
    };
    Ok(Item {
        name,
        uid,
        read,
        bytes,
    })
}

/// The node a `/stats/summary` is of, its stats entries that can be read, and the ones that
/// cannot. Entries that share a UID are refused together. `Err` when the answer is not a
/// summary, or its entries would take more than [`STATS_MODEL_BUDGET`].
pub fn decode_summary(body: &[u8]) -> Result<Summary, DecodeError> {
    let summary: RawSummary = serde_json::from_slice(body)?;
    let max_pids = max_pids(summary.node.as_ref().and_then(|n| n.rlimit.as_ref()));
    let node = summary.node.and_then(|n| n.node_name);
    let mut stats = Vec::with_capacity(summary.pods.len().min(1024));
    let mut problems = Vec::new();
    let mut kept = 0usize;
    for (index, raw) in summary.pods.into_iter().enumerate() {
        match serde_json::from_str::<PodStats>(raw.get()) {
            Ok(s) => {
                kept += stats_bytes(&s);
                if kept > STATS_MODEL_BUDGET {
                    return Err(DecodeError::OverBudget {
                        what: "stats entries",
                        budget: STATS_MODEL_BUDGET,
                    });
                }
                stats.push(s);
            }
            Err(e) => problems.push(Problem {
                pod: name_of(raw, index),
                kind: ProblemKind::StatsUnreadable,
                detail: e.to_string(),
            }),
        }
    }
    let mut seen = HashSet::new();
    let shared: HashSet<String> = stats
        .iter()
        .filter(|s| !seen.insert(s.pod_ref.uid.clone()))
        .map(|s| s.pod_ref.uid.clone())
        .collect();
    stats.retain(|s| {
        if !shared.contains(&s.pod_ref.uid) {
            return true;
        }
        problems.push(Problem {
            pod: format!(
                "{}/{}",
                shown_name(&s.pod_ref.namespace),
                shown_name(&s.pod_ref.name)
            ),
            kind: ProblemKind::StatsUnreadable,
            detail: format!(
                "another stats entry names its UID {}",
                shown_name(&s.pod_ref.uid)
            ),
        });
        false
    });
    Ok(Summary {
        node,
        max_pids,
        stats,
        problems,
    })
}

/// What the log has said about the records: each problem once when it appears, once when it
/// is gone. The counters count the appearances.
#[derive(Debug, Default)]
pub struct ProblemLog {
    known: BTreeMap<(String, ProblemKind), String>,
}

impl ProblemLog {
    /// Takes the problems of the latest snapshot.
    pub fn note(&mut self, problems: &[Problem], counters: &Counters) {
        let now: BTreeMap<(String, ProblemKind), String> = problems
            .iter()
            .map(|p| ((p.pod.clone(), p.kind), p.detail.clone()))
            .collect();
        for ((pod, kind), detail) in &now {
            if self.known.contains_key(&(pod.clone(), *kind)) {
                continue;
            }
            Counters::bump(match kind {
                ProblemKind::PodUnreadable | ProblemKind::DuplicateUid => &counters.pods_skipped,
                ProblemKind::StatsUnreadable => &counters.stats_skipped,
                ProblemKind::FieldInvalid => &counters.fields_invalid,
            });
            tracing::warn!(pod = %pod, problem = kind.as_str(), error = %detail, "{}", kind.consequence());
        }
        for (pod, kind) in self.known.keys() {
            if !now.contains_key(&(pod.clone(), *kind)) {
                tracing::info!(pod = %pod, problem = kind.as_str(), "pod record readable again (or gone)");
            }
        }
        self.known = now;
    }

    /// The problems the log holds now.
    pub fn len(&self) -> usize {
        self.known.len()
    }

    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_item_is_named_and_its_neighbours_are_read() {
        let list = serde_json::json!({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "7"},
        "items": [
            {"metadata": {"namespace": "shop", "name": "good", "uid": "u1"}, "spec": {"containers": []}},
            {"metadata": {"namespace": "shop", "name": "typed-wrong", "uid": "u2"}, "spec": {"priority": "high", "containers": []}},
            {"metadata": 7},
            {"metadata": {"uid": "u4"}, "spec": {"containers": "none"}},
        ]});
        let PodList {
            items,
            resource_version,
            problems,
        } = decode_pod_list(list.to_string().as_bytes()).unwrap();
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].name, "shop/good");
        assert_eq!(resource_version.as_deref(), Some("7"));
        let named: Vec<(&str, ProblemKind)> =
            problems.iter().map(|p| (p.pod.as_str(), p.kind)).collect();
        assert_eq!(
            named,
            [
                ("shop/typed-wrong", ProblemKind::PodUnreadable),
                ("item 2", ProblemKind::PodUnreadable),
                ("uid u4", ProblemKind::PodUnreadable),
            ]
        );
        assert!(
            problems[0].detail.contains("priority") || problems[0].detail.contains("i32"),
            "{}",
            problems[0].detail
        );
        assert!(decode_pod_list(b"<html>").is_err(), "not a list at all");

        // A record that cannot be read is named escaped (issue 41, round 4: a name with a line
        // break or a terminal escape was written raw in text logs).
        let hostile = serde_json::json!({"items": [
            {"metadata": {"namespace": "shop", "name": "evil\nFAKE \u{1b}[31m", "uid": "u5"}, "spec": {"containers": "none"}},
        ]});
        let read = decode_pod_list(hostile.to_string().as_bytes()).unwrap();
        assert!(read.items.is_empty());
        let named = &read.problems[0].pod;
        assert_eq!(named, "shop/evil\\nFAKE \\u{1b}[31m");
        assert!(
            !named.contains('\n') && !named.contains('\u{1b}'),
            "{named}"
        );
        assert!(
            decode_pod_list(b"{\"items\": 5}").is_err(),
            "items not a list"
        );
    }

    /// Names longer than Kubernetes allows (a DNS subdomain of 253 for a pod, a DNS label of
    /// 63 for a namespace or a container) come from no real API server: the pod is left out
    /// and named, its name cut, so no log line carries 10 kB of it.
    #[test]
    fn a_name_longer_than_kubernetes_allows_is_refused_and_shown_cut() {
        let long = "h".repeat(10_000);
        let pod = |ns: &str, name: &str, container: &str| {
            serde_json::json!({"metadata": {"namespace": ns, "name": name, "uid": "u1"},
                "spec": {"containers": [{"name": container}]}})
        };
        let rows = [
            (
                "a 10 kB pod name",
                pod("shop", &long, "app"),
                "metadata.name",
            ),
            (
                "a 64-character namespace",
                pod(&"n".repeat(64), "web", "app"),
                "metadata.namespace",
            ),
            (
                "a 10 kB container name",
                pod("shop", "web", &long),
                "spec.containers[0].name",
            ),
        ];
        for (what, item, field) in rows {
            let body = serde_json::json!({"items": [pod("shop", &"w".repeat(253), &"c".repeat(63)), item]});
            let read = decode_pod_list(body.to_string().as_bytes()).unwrap();
            assert_eq!(
                read.items.len(),
                1,
                "{what}: the longest names Kubernetes allows are read"
            );
            let problem = &read.problems[0];
            assert_eq!(problem.kind, ProblemKind::PodUnreadable, "{what}");
            assert!(problem.detail.contains(field), "{what}: {}", problem.detail);
            assert!(
                problem.pod.len() + problem.detail.len() < 600,
                "{what}: {} + {} bytes",
                problem.pod.len(),
                problem.detail.len()
            );
        }
    }

    #[test]
    fn what_is_kept_is_bounded_whatever_the_json_weighs() {
        // Containers as small as JSON allows: each costs a model entry.
        let containers: Vec<serde_json::Value> = (0..2000)
            .map(|i| serde_json::json!({"name": format!("c{i}")}))
            .collect();
        let pod = |i: usize| {
            serde_json::json!({"metadata": {"namespace": "bulk", "name": format!("p{i}"), "uid": format!("u{i}")},
            "spec": {"containers": containers}})
        };
        let list = |n: usize| {
            serde_json::json!({"items": (0..n).map(pod).collect::<Vec<_>>()}).to_string()
        };
        let small = decode_pod_list(list(10).as_bytes()).unwrap();
        assert_eq!(small.items.len(), 10);
        let per_pod = small.items[0].bytes;
        assert!(per_pod > 2000 * 100, "each container is charged: {per_pod}");
        let over = POD_MODEL_BUDGET / per_pod + 1;
        let err = decode_pod_list(list(over).as_bytes()).unwrap_err();
        assert!(
            matches!(err, DecodeError::OverBudget { what: "pods", .. }),
            "{err}"
        );
        // One pod above etcd's object limit is named and left out, its neighbours read.
        let huge = serde_json::json!({"metadata": {"namespace": "bulk", "name": "huge", "uid": "h"},
            "metadata2": "x".repeat(POD_OBJECT_CAP)});
        let body = serde_json::json!({"items": [pod(0), huge]}).to_string();
        let read = decode_pod_list(body.as_bytes()).unwrap();
        assert_eq!(read.items.len(), 1);
        assert_eq!(read.problems[0].pod, "bulk/huge");
        assert!(
            read.problems[0]
                .detail
                .contains("above the 1572864-byte cap"),
            "{}",
            read.problems[0].detail
        );
    }

    #[test]
    fn a_bad_stats_entry_or_a_shared_uid_refuses_only_those_entries() {
        let entry = |name: &str, uid: &str, ws: serde_json::Value| {
            serde_json::json!({"podRef": {"namespace": "shop", "name": name, "uid": uid},
                "memory": {"workingSetBytes": ws}})
        };
        let summary = serde_json::json!({"node": {"nodeName": "n", "fs": {"usedBytes": -1}}, "pods": [
            entry("ok", "u1", serde_json::json!(100)),
            entry("negative", "u2", serde_json::json!(-1)),
            entry("huge", "u3", serde_json::json!(1e30)),
            entry("twin-a", "u5", serde_json::json!(1)),
            entry("twin-b", "u5", serde_json::json!(2)),
        ]});
        let Summary {
            node,
            max_pids,
            stats,
            problems,
        } = decode_summary(summary.to_string().as_bytes()).unwrap();
        assert_eq!(node.as_deref(), Some("n"));
        assert_eq!(max_pids, None, "no rlimit in this summary");
        let kept: Vec<&str> = stats.iter().map(|s| s.pod_ref.name.as_str()).collect();
        assert_eq!(
            kept,
            ["ok"],
            "the node part is not read; bad and shared entries go"
        );
        let named: Vec<&str> = problems.iter().map(|p| p.pod.as_str()).collect();
        assert_eq!(
            named,
            ["shop/negative", "shop/huge", "shop/twin-a", "shop/twin-b"]
        );
        assert!(problems
            .iter()
            .all(|p| p.kind == ProblemKind::StatsUnreadable));
    }

    #[test]
    fn the_kubelets_task_limit_is_read_or_named_and_never_refuses_the_summary() {
        /// (behaviour, the summary's `node.rlimit`, the figure read or words of its error)
        type Row = (
            &'static str,
            serde_json::Value,
            Option<Result<i64, &'static str>>,
        );
        let rows: [Row; 7] = [
            (
                "the kubelet's figure",
                serde_json::json!({"maxpid": 32768, "curproc": 410}),
                Some(Ok(32768)),
            ),
            ("no rlimit", serde_json::Value::Null, None),
            (
                "rlimit without maxpid (both reads failed)",
                serde_json::json!({"curproc": 1}),
                None,
            ),
            ("maxpid null", serde_json::json!({"maxpid": null}), None),
            (
                "zero",
                serde_json::json!({"maxpid": 0}),
                Some(Err("node.rlimit.maxpid is 0")),
            ),
            (
                "negative",
                serde_json::json!({"maxpid": -1}),
                Some(Err("node.rlimit.maxpid is -1")),
            ),
            (
                "a string",
                serde_json::json!({"maxpid": "lots"}),
                Some(Err("node.rlimit.maxpid is \"lots\"")),
            ),
        ];
        for (behaviour, rlimit, expected) in rows {
            let mut node = serde_json::json!({"nodeName": "n"});
            if !rlimit.is_null() {
                node["rlimit"] = rlimit;
            }
            let body = serde_json::json!({"node": node, "pods": []}).to_string();
            let summary = decode_summary(body.as_bytes()).expect(behaviour);
            match (&summary.max_pids, expected) {
                (None, None) => {}
                (Some(Ok(got)), Some(Ok(want))) => assert_eq!(*got, want, "{behaviour}"),
                (Some(Err(why)), Some(Err(needle))) => {
                    assert!(why.contains(needle), "{behaviour}: {why}")
                }
                (got, want) => panic!("{behaviour}: got {got:?}, expected {want:?}"),
            }
            assert_eq!(summary.node.as_deref(), Some("n"), "{behaviour}");
        }
        // An rlimit that is not even an object is a bad figure too, not a bad summary.
        let body = r#"{"node": {"nodeName": "n", "rlimit": 7}, "pods": []}"#;
        assert_eq!(decode_summary(body.as_bytes()).unwrap().max_pids, None);
    }

    #[test]
    fn each_problem_is_counted_when_it_appears_not_at_every_refresh() {
        let counters = Counters::default();
        let mut log = ProblemLog::default();
        let p = |pod: &str, kind| Problem {
            pod: pod.into(),
            kind,
            detail: "x".into(),
        };
        let rows: [(&str, Vec<Problem>, [u64; 3]); 4] = [
            (
                "first sight",
                vec![
                    p("a/x", ProblemKind::PodUnreadable),
                    p("a/y", ProblemKind::StatsUnreadable),
                ],
                [1, 1, 0],
            ),
            (
                "the same again",
                vec![
                    p("a/x", ProblemKind::PodUnreadable),
                    p("a/y", ProblemKind::StatsUnreadable),
                ],
                [1, 1, 0],
            ),
            (
                "one gone, one new",
                vec![
                    p("a/x", ProblemKind::PodUnreadable),
                    p("a/z", ProblemKind::FieldInvalid),
                ],
                [1, 1, 1],
            ),
            (
                "back after being gone",
                vec![p("a/y", ProblemKind::StatsUnreadable)],
                [1, 2, 1],
            ),
        ];
        for (what, problems, want) in rows {
            log.note(&problems, &counters);
            let got = [
                counters
                    .pods_skipped
                    .load(std::sync::atomic::Ordering::Relaxed),
                counters
                    .stats_skipped
                    .load(std::sync::atomic::Ordering::Relaxed),
                counters
                    .fields_invalid
                    .load(std::sync::atomic::Ordering::Relaxed),
            ];
            assert_eq!(got, want, "{what}");
            assert_eq!(log.len(), problems.len(), "{what}");
        }
    }
}
