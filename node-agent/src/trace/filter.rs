//! `trace`'s filters (`--kind`, `--cgroup`, `--pod`, `--namespace`) and output formats.

use super::record::Record;

/// The kinds of the agent's own records, after the probes' ([`crate::probes::NAMES`]).
const OWN_KINDS: [&str; 4] = ["eviction", "reclaim", "events_lost", "stream_lost"];

/// Every kind `--kind` takes.
pub fn known_kinds() -> Vec<&'static str> {
    crate::probes::NAMES.into_iter().chain(OWN_KINDS).collect()
}

/// The kinds that the help of `command`'s `--kind` (written by hand, here and in the kubectl
/// plugin) does not name; all of them when it has no such flag or help. For both CLIs' tests.
pub fn kinds_left_out_of_help(command: &clap::Command) -> Vec<&'static str> {
    let help = command
        .get_arguments()
        .find(|a| a.get_id() == "kind")
        .and_then(|a| a.get_help())
        .map(ToString::to_string)
        .unwrap_or_default();
    known_kinds()
        .into_iter()
        .filter(|kind| !help.contains(kind))
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    Table,
    Json,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FilterError {
    #[error("--kind {0:?} is not one of {kinds:?}", kinds = known_kinds())]
    UnknownKind(String),
}

#[derive(Debug, Default)]
pub struct Filter {
    kinds: Vec<String>,
    cgroup: Option<String>,
    pod: Option<String>,
    namespace: Option<String>,
}

/// The pod a record is about, as far as it is known.
struct PodOf<'a> {
    uid: Option<&'a str>,
    namespace: Option<&'a str>,
    name: Option<&'a str>,
}

impl PodOf<'_> {
    /// `--pod`: the UID or a prefix of it, the pod's name, or `NAMESPACE/NAME`.
    fn is(&self, want: &str) -> bool {
        if self.uid.is_some_and(|u| u.starts_with(want)) {
            return true;
        }
        match (self.namespace, self.name, want.split_once('/')) {
            (Some(ns), Some(name), Some((want_ns, want_name))) => {
                ns == want_ns && name == want_name
            }
            (_, Some(name), None) => name == want,
            _ => false,
        }
    }
}

impl Filter {
    pub fn new(
        kinds: &[String],
        cgroup: Option<String>,
        pod: Option<String>,
        namespace: Option<String>,
    ) -> Result<Self, FilterError> {
        for k in kinds {
            if !known_kinds().contains(&k.as_str()) {
                return Err(FilterError::UnknownKind(k.clone()));
            }
        }
        Ok(Self {
            kinds: kinds.to_vec(),
            cgroup,
            pod,
            namespace,
        })
    }

    /// Kind filters select kinds; cgroup, pod and namespace filters keep only events of
    /// matching cgroups or pods (events about the whole node, like `pid_threshold` and
    /// `events_lost`, always pass them: a loss may hide an event of the filtered pod). A
    /// `stream_lost` line passes every filter, kinds included: it says this reader's copy of
    /// the stream has a gap, whatever it asked for.
    /// Pod and namespace filters drop events that cannot be attributed to a pod.
    pub fn matches(&self, record: &Record) -> bool {
        if matches!(record, Record::StreamLost { .. }) {
            return true;
        }
        if !self.kinds.is_empty() && !self.kinds.iter().any(|k| k == record.kind()) {
            return false;
        }
        let pod = match record {
            Record::Eviction {
                uid,
                namespace,
                name,
                ..
            } => Some(PodOf {
                // An eviction names a pod, not a cgroup: cgroup filters pass it.
                uid: uid.as_deref(),
                namespace: Some(namespace),
                name: Some(name),
            }),
            _ => {
                let Some(cgroup) = record.cgroup() else {
                    return true;
                };
                if let Some(want) = &self.cgroup {
                    let by_path = cgroup
                        .path
                        .as_deref()
                        .is_some_and(|p| p.contains(want.as_str()));
                    let by_id = want.parse::<u64>().is_ok_and(|id| id == cgroup.id);
                    if !by_path && !by_id {
                        return false;
                    }
                }
                cgroup.pod.as_ref().map(|p| PodOf {
                    uid: Some(&p.uid),
                    namespace: p.namespace.as_deref(),
                    name: p.name.as_deref(),
                })
            }
        };
        let pod_ok = self
            .pod
            .as_ref()
            .is_none_or(|want| pod.as_ref().is_some_and(|p| p.is(want)));
        let namespace_ok = self.namespace.as_ref().is_none_or(|want| {
            pod.as_ref()
                .is_some_and(|p| p.namespace == Some(want.as_str()))
        });
        pod_ok && namespace_ok
    }

    pub fn render(&self, record: &Record, format: OutputFormat) -> String {
        match format {
            OutputFormat::Table => record.table_row(),
            OutputFormat::Json => record.json(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        probes::fork_storm::ForkStormRecord,
        trace::record::{CgroupRef, PodRef, Qos},
    };

    fn storm(path: &str, pod: Option<&str>) -> Record {
        Record::ForkStorm(ForkStormRecord {
            time: "t".into(),
            ktime_ns: 0,
            cgroup: CgroupRef {
                id: 42,
                path: Some(path.into()),
                pod: pod.map(|uid| PodRef {
                    uid: uid.into(),
                    qos: Qos::Burstable,
                    container_id: None,
                    namespace: None,
                    name: None,
                    container: None,
                }),
            },
            pid: 1,
            comm: "sh".into(),
            forks_in_window: 10,
            window_ms: 1000,
            max_forks: 5,
        })
    }

    #[test]
    fn filters_by_kind_cgroup_and_pod() {
        let lost = Record::EventsLost {
            time: "t".into(),
            lost: 1,
            total_per_cpu: vec![1],
        };
        let pod_storm = storm("/kubepods/burstable/podabc/123", Some("abc-def"));
        let eviction = |uid: &str| -> Record {
            serde_json::from_value(serde_json::json!({"kind": "eviction", "time": "t", "namespace": "shop", "name": "web",
                "uid": uid, "signal": "memory.available", "hard": true, "observed": 1, "threshold": 2,
                "grace_period_seconds": 1, "result": "evicted", "message": "m"}))
            .unwrap()
        };
        let (ours, theirs) = (eviction("abc-def"), eviction("fff"));
        let plain_storm = storm("/system.slice", None);
        let mut named_storm = storm("/kubepods/burstable/podabc/123", Some("abc-def"));
        if let Record::ForkStorm(storm) = &mut named_storm {
            let pod = storm.cgroup.pod.as_mut().expect("a pod cgroup");
            pod.namespace = Some("shop".into());
            pod.name = Some("cart".into());
        }
        let f = |kinds: &[&str], cgroup: Option<&str>, pod: Option<&str>| {
            Filter::new(
                &kinds.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                cgroup.map(String::from),
                pod.map(String::from),
                None,
            )
            .unwrap()
        };
        let ns = |namespace: &str| Filter::new(&[], None, None, Some(namespace.into())).unwrap();
        let cases: &[(&str, Filter, &Record, bool)] = &[
            (
                "no filter keeps everything",
                f(&[], None, None),
                &plain_storm,
                true,
            ),
            (
                "kind filter drops other kinds",
                f(&["oom_kill"], None, None),
                &plain_storm,
                false,
            ),
            (
                "kind filter keeps its kind",
                f(&["fork_storm"], None, None),
                &plain_storm,
                true,
            ),
            (
                "cgroup text matches the path",
                f(&[], Some("kubepods"), None),
                &pod_storm,
                true,
            ),
            (
                "cgroup text that does not match",
                f(&[], Some("kubepods"), None),
                &plain_storm,
                false,
            ),
            (
                "cgroup id matches",
                f(&[], Some("42"), None),
                &plain_storm,
                true,
            ),
            (
                "pod prefix matches the uid",
                f(&[], None, Some("abc")),
                &pod_storm,
                true,
            ),
            (
                "pod filter drops non-pod cgroups",
                f(&[], None, Some("abc")),
                &plain_storm,
                false,
            ),
            (
                "node-wide records pass cgroup filters",
                f(&[], Some("kubepods"), Some("abc")),
                &lost,
                true,
            ),
            (
                "--kind eviction keeps evictions",
                f(&["eviction"], None, None),
                &ours,
                true,
            ),
            (
                "--kind eviction drops kernel events",
                f(&["eviction"], None, None),
                &pod_storm,
                false,
            ),
            (
                "an eviction of the filtered pod",
                f(&[], None, Some("abc")),
                &ours,
                true,
            ),
            (
                "an eviction of another pod",
                f(&[], None, Some("abc")),
                &theirs,
                false,
            ),
            (
                "an eviction by pod name",
                f(&[], None, Some("web")),
                &ours,
                true,
            ),
            (
                "an eviction by namespace/name",
                f(&[], None, Some("shop/web")),
                &ours,
                true,
            ),
            (
                "an eviction in another namespace",
                f(&[], None, Some("other/web")),
                &ours,
                false,
            ),
            (
                "a kernel event by pod name",
                f(&[], None, Some("shop/cart")),
                &named_storm,
                true,
            ),
            (
                "a kernel event of another pod name",
                f(&[], None, Some("web")),
                &named_storm,
                false,
            ),
            (
                "--namespace keeps its pods' kernel events",
                ns("shop"),
                &named_storm,
                true,
            ),
            ("--namespace keeps its evictions", ns("shop"), &ours, true),
            (
                "--namespace drops other namespaces",
                ns("kube-system"),
                &named_storm,
                false,
            ),
            (
                "--namespace drops unattributed cgroups",
                ns("shop"),
                &plain_storm,
                false,
            ),
            (
                "--namespace drops pods whose names are unknown",
                ns("shop"),
                &pod_storm,
                false,
            ),
            (
                "--namespace keeps node-wide records",
                ns("shop"),
                &lost,
                true,
            ),
        ];
        for (name, filter, record, want) in cases {
            assert_eq!(filter.matches(record), *want, "{name}");
        }
        assert_eq!(
            Filter::new(&["bogus".into()], None, None, None).unwrap_err(),
            FilterError::UnknownKind("bogus".into())
        );
    }
}
