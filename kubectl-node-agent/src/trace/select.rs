//! Which agents a trace follows and which of their lines it shows: `--node` and `-l` pick
//! nodes; `--kind`, `-n` and `--pod` pick records, the agent's own trace filter applied on
//! the agent (so only what is asked for crosses the API server) and again here. Pure.

use std::collections::BTreeSet;

use node_agent::trace::{Filter, Record};

use crate::error::PluginError;

/// The nodes to follow.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Nodes {
    /// `--node`: these names only.
    pub named: Option<BTreeSet<String>>,
    /// `-l`: the nodes the selector picks now (kept current by a watch of the nodes).
    pub labelled: Option<BTreeSet<String>>,
}

impl Nodes {
    pub fn selects(&self, node: &str) -> bool {
        self.named.as_ref().is_none_or(|n| n.contains(node))
            && self.labelled.as_ref().is_none_or(|l| l.contains(node))
    }

    /// For messages: ` on nodes a, b`, ` on nodes -l x picks`, or nothing.
    pub fn said(&self, selector: Option<&str>) -> String {
        let mut parts = Vec::new();
        if let Some(named) = &self.named {
            parts.push(format!(
                "on node{} {}",
                if named.len() == 1 { "" } else { "s" },
                named.iter().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
        if let Some(selector) = selector {
            parts.push(format!("on the nodes -l {selector} picks"));
        }
        match parts.is_empty() {
            true => String::new(),
            false => format!(" {}", parts.join(" and ")),
        }
    }
}

/// `--node a,b --node c`: the names, each a Kubernetes name.
pub fn node_names(values: &[String]) -> Result<Option<BTreeSet<String>>, PluginError> {
    if values.is_empty() {
        return Ok(None);
    }
    let mut names = BTreeSet::new();
    for value in values {
        for name in value.split(',').map(str::trim) {
            if !is_name(name) {
                return Err(PluginError::Flag {
                    flag: "node",
                    value: value.clone(),
                    problem: format!(
                        "{name:?} is not a node name (lowercase letters, digits, '-' and '.')"
                    ),
                });
            }
            names.insert(name.to_string());
        }
    }
    Ok(Some(names))
}

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// The records to show.
#[derive(Debug)]
pub struct Records {
    kinds: Vec<String>,
    namespace: Option<String>,
    pod: Option<String>,
    filter: Filter,
}

impl Records {
    /// `--kind` (repeatable, comma-separated), `-n`, `--pod`; refused as `node-agent trace`
    /// refuses them, before anything is asked of the cluster.
    pub fn new(
        kinds: &[String],
        namespace: Option<&str>,
        pod: Option<&str>,
    ) -> Result<Records, PluginError> {
        let kinds: Vec<String> = kinds
            .iter()
            .flat_map(|k| k.split(','))
            .map(|k| k.trim().to_string())
            .filter(|k| !k.is_empty())
            .collect();
        for (flag, value) in [("namespace", namespace), ("pod", pod)] {
            if let Some(v) = value {
                if !is_name(v) {
                    return Err(PluginError::Flag {
                        flag,
                        value: v.into(),
                        problem: "not a Kubernetes name (lowercase letters, digits, '-' and '.')"
                            .into(),
                    });
                }
            }
        }
        let filter = Filter::new(
            &kinds,
            None,
            pod.map(String::from),
            namespace.map(String::from),
        )
        .map_err(|e| PluginError::Flag {
            flag: "kind",
            value: kinds.join(","),
            problem: e.to_string(),
        })?;
        Ok(Records {
            kinds,
            namespace: namespace.map(String::from),
            pod: pod.map(String::from),
            filter,
        })
    }

    /// The agent's trace request with these filters.
    pub fn target(&self) -> String {
        let mut params = Vec::new();
        if !self.kinds.is_empty() {
            params.push(format!("kind={}", self.kinds.join(",")));
        }
        if let Some(ns) = &self.namespace {
            params.push(format!("namespace={ns}"));
        }
        if let Some(pod) = &self.pod {
            params.push(format!("pod={pod}"));
        }
        match params.is_empty() {
            true => node_agent::inspect::wire::TRACE_PATH.to_string(),
            false => format!(
                "{}?{}",
                node_agent::inspect::wire::TRACE_PATH,
                params.join("&")
            ),
        }
    }

    pub fn keeps(&self, record: &Record) -> bool {
        self.filter.matches(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> Option<BTreeSet<String>> {
        Some(names.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn nodes_are_picked_by_name_and_by_label_both_when_both_are_given() {
        let rows = [
            ("no flag: every node", Nodes::default(), "n1", true),
            (
                "--node n1",
                Nodes {
                    named: set(&["n1"]),
                    labelled: None,
                },
                "n1",
                true,
            ),
            (
                "--node n1, another node",
                Nodes {
                    named: set(&["n1"]),
                    labelled: None,
                },
                "n2",
                false,
            ),
            (
                "-l picks n2",
                Nodes {
                    named: None,
                    labelled: set(&["n2"]),
                },
                "n2",
                true,
            ),
            (
                "-l picks none yet",
                Nodes {
                    named: None,
                    labelled: set(&[]),
                },
                "n2",
                false,
            ),
            (
                "--node n1 -l picks n2: neither is both",
                Nodes {
                    named: set(&["n1"]),
                    labelled: set(&["n2"]),
                },
                "n1",
                false,
            ),
            (
                "--node n1 -l picks n1",
                Nodes {
                    named: set(&["n1"]),
                    labelled: set(&["n1", "n2"]),
                },
                "n1",
                true,
            ),
        ];
        for (what, nodes, node, want) in rows {
            assert_eq!(nodes.selects(node), want, "{what}");
        }
    }

    #[test]
    fn node_names_are_split_and_checked() {
        assert_eq!(node_names(&[]).unwrap(), None);
        assert_eq!(
            node_names(&["a,b".into(), "c".into()]).unwrap(),
            set(&["a", "b", "c"])
        );
        let err = node_names(&["a,,b".into()]).unwrap_err().to_string();
        assert!(err.contains("\"\" is not a node name"), "{err}");
        let err = node_names(&["Node_1".into()]).unwrap_err().to_string();
        assert!(err.starts_with("--node \"Node_1\""), "{err}");
    }

    fn record(json: serde_json::Value) -> Record {
        serde_json::from_value(json).expect("a record")
    }

    #[test]
    fn records_are_kept_as_the_agent_keeps_them() {
        let eviction = |ns: &str, name: &str| {
            record(
                serde_json::json!({"kind": "eviction", "time": "t", "namespace": ns, "name": name,
                "signal": "memory.available", "hard": true, "observed": 1, "threshold": 2,
                "grace_period_seconds": 1, "result": "dry_run", "message": "m"}),
            )
        };
        let oom = |ns: &str, name: &str| {
            record(
                serde_json::json!({"kind": "oom_kill", "time": "t", "ktime_ns": 1,
                "cgroup": {"id": 7, "path": "/p", "pod": {"uid": "u", "qos": "Burstable", "namespace": ns, "name": name}},
                "pid": 1, "tgid": 1, "comm": "c", "uid": 0, "oom_score_adj": 0, "constraint": "cgroup_limit",
                "total_vm_bytes": 0, "anon_rss_bytes": 0, "file_rss_bytes": 0, "shmem_rss_bytes": 0}),
            )
        };
        let lost = record(serde_json::json!({"kind": "stream_lost", "time": "t", "lost": 3}));
        let pids = record(
            serde_json::json!({"kind": "pid_threshold", "time": "t", "ktime_ns": 1,
            "direction": "up", "available": 1, "threshold": 2, "live": 3, "limit": 4}),
        );
        type Row<'a> = (
            &'a str,
            &'a [&'a str],
            Option<&'a str>,
            Option<&'a str>,
            Record,
            bool,
        );
        let rows: Vec<Row> = vec![
            (
                "no filter keeps all",
                &[],
                None,
                None,
                eviction("shop", "web"),
                true,
            ),
            (
                "--kind eviction keeps evictions",
                &["eviction"],
                None,
                None,
                eviction("shop", "web"),
                true,
            ),
            (
                "--kind eviction drops kills",
                &["eviction"],
                None,
                None,
                oom("shop", "web"),
                false,
            ),
            (
                "--kind oom_kill,eviction keeps kills",
                &["oom_kill,eviction"],
                None,
                None,
                oom("shop", "web"),
                true,
            ),
            (
                "-n shop keeps shop's",
                &[],
                Some("shop"),
                None,
                oom("shop", "web"),
                true,
            ),
            (
                "-n shop drops another namespace's",
                &[],
                Some("shop"),
                None,
                oom("bank", "web"),
                false,
            ),
            (
                "-n shop --pod web: that pod",
                &[],
                Some("shop"),
                Some("web"),
                eviction("shop", "web"),
                true,
            ),
            (
                "-n shop --pod web: not another pod",
                &[],
                Some("shop"),
                Some("web"),
                eviction("shop", "cart"),
                false,
            ),
            (
                "--pod web alone: any namespace",
                &[],
                None,
                Some("web"),
                eviction("bank", "web"),
                true,
            ),
            (
                "a node-wide record passes pod filters",
                &[],
                Some("shop"),
                Some("web"),
                pids.clone(),
                true,
            ),
            (
                "but not a kind filter",
                &["eviction"],
                None,
                None,
                pids,
                false,
            ),
            (
                "a gap in the stream passes everything",
                &["eviction"],
                Some("shop"),
                Some("web"),
                lost,
                true,
            ),
        ];
        for (what, kinds, ns, pod, rec, want) in rows {
            let kinds: Vec<String> = kinds.iter().map(|s| s.to_string()).collect();
            let r = Records::new(&kinds, ns, pod).unwrap();
            assert_eq!(r.keeps(&rec), want, "{what}");
        }
    }

    #[test]
    fn the_agent_is_asked_for_what_the_flags_say_and_bad_flags_are_refused_first() {
        let kinds = |k: &[&str]| k.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(Records::new(&[], None, None).unwrap().target(), "/v1/trace");
        assert_eq!(
            Records::new(&kinds(&["oom_kill", "eviction"]), Some("shop"), Some("web"))
                .unwrap()
                .target(),
            "/v1/trace?kind=oom_kill,eviction&namespace=shop&pod=web"
        );
        for (k, ns, pod, words) in [
            (
                kinds(&["oom"]),
                None,
                None,
                "--kind \"oom\": --kind \"oom\" is not one of",
            ),
            (
                kinds(&[]),
                Some("Shop"),
                None,
                "--namespace \"Shop\": not a Kubernetes name",
            ),
            (
                kinds(&[]),
                None,
                Some("a/b"),
                "--pod \"a/b\": not a Kubernetes name",
            ),
        ] {
            let err = Records::new(&k, ns, pod).unwrap_err().to_string();
            assert!(err.starts_with(words), "{err}");
        }
    }
}
