//! Kernel events attributed to what they concern: the cgroup, and when it is a pod's, the pod
//! (UID, QoS, and from Kubernetes its namespace and name) and the container. One type for the
//! daemon, which knows pod names from its pod source, and for `trace`, which may not; what is
//! printed or sent (`trace::Record`) is built from it last.

use super::{Happened, KernelEvent};
use crate::cgroup::{CgroupIndex, QosClass};

/// The cgroup an event concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    pub cgroup_id: u64,
    /// The path below the hierarchy's root, `/`-prefixed; `None` when the cgroup is unknown
    /// (gone before the event was read).
    pub path: Option<String>,
    pub pod: Option<PodSubject>,
}

/// The pod (and container) a cgroup belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSubject {
    pub uid: String,
    pub qos: QosClass,
    /// The runtime's container id, when the cgroup is a container's.
    pub container_id: Option<String>,
    /// From the pod source, when the agent knows the pod.
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub container: Option<String>,
}

/// A kernel event with what it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributed {
    /// The kernel's timestamp (CLOCK_MONOTONIC).
    pub ktime_ns: u64,
    pub what: Happened,
}

/// Pod names from the pod source: by pod UID, and containers by runtime id.
pub trait PodNames {
    /// `(namespace, name)` of the pod with this UID.
    fn pod(&self, uid: &str) -> Option<(String, String)>;
    /// The name of the container with this runtime id.
    fn container(&self, container_id: &str) -> Option<String>;
}

/// No pod source (`trace` on its own, standalone mode): UIDs only.
pub struct NoNames;

impl PodNames for NoNames {
    fn pod(&self, _: &str) -> Option<(String, String)> {
        None
    }
    fn container(&self, _: &str) -> Option<String> {
        None
    }
}

impl Subject {
    pub fn resolve(index: &CgroupIndex, names: &dyn PodNames, cgroup_id: u64) -> Self {
        let entry = index.lookup(cgroup_id);
        let pod = entry.and_then(|e| e.pod.as_ref()).map(|p| {
            let known = names.pod(&p.pod_uid);
            PodSubject {
                uid: p.pod_uid.clone(),
                qos: p.qos,
                container_id: p.container_id.clone(),
                namespace: known.as_ref().map(|(ns, _)| ns.clone()),
                name: known.map(|(_, name)| name),
                container: p.container_id.as_deref().and_then(|id| names.container(id)),
            }
        });
        Self {
            cgroup_id,
            path: entry.map(|e| format!("/{}", e.path.display())),
            pod,
        }
    }

    /// `namespace/name` of its pod, when known.
    pub fn pod_name(&self) -> Option<(&str, &str)> {
        let pod = self.pod.as_ref()?;
        Some((pod.namespace.as_deref()?, pod.name.as_deref()?))
    }
}

/// What attributing an event needs: the cgroups known, the pod names known, and the page size
/// (the OOM victim's page counts in bytes).
pub struct Context<'a> {
    index: &'a CgroupIndex,
    names: &'a dyn PodNames,
    pub page_size: u64,
}

impl Context<'_> {
    /// The cgroup with this id, and its pod.
    pub fn subject(&self, cgroup_id: u64) -> Subject {
        Subject::resolve(self.index, self.names, cgroup_id)
    }
}

/// Attributes a kernel event; `None` for the cgroup index's own bookkeeping (a cgroup came or
/// went), which concerns nobody. Each probe attributes its own (see [`crate::probes`]).
pub fn attribute(
    event: &KernelEvent,
    index: &CgroupIndex,
    names: &dyn PodNames,
    page_size: u64,
) -> Option<Attributed> {
    let context = Context {
        index,
        names,
        page_size,
    };
    Some(Attributed {
        ktime_ns: event.header().ktime_ns,
        what: event.attribute(&context)?,
    })
}

#[cfg(test)]
mod tests {
    use node_agent_common::{OomKillEvent, KIND_OOM_KILL, OOM_CGROUP_LIMIT};

    use super::*;
    use crate::probes::oom_kill::Constraint;

    struct Names;

    impl PodNames for Names {
        fn pod(&self, uid: &str) -> Option<(String, String)> {
            (uid == UID).then(|| ("shop".into(), "web".into()))
        }
        fn container(&self, id: &str) -> Option<String> {
            (id == CID).then(|| "nginx".into())
        }
    }

    const UID: &str = "0c4a2c5e-7f0b-4f4e-9a55-3b1c1d2e3f40";
    const CID: &str = "8d3b6f1c0a9e4b7d2c5f8a1e3b6d9c0f2a4e7b1d5c8f0a3e6b9d2c4f7a1e3b5d";

    #[test]
    fn an_oom_kill_names_its_cgroup_pod_and_container() {
        let tmp = tempfile::tempdir().unwrap();
        let container = tmp
            .path()
            .join(format!("kubepods/burstable/pod{UID}/{CID}"));
        std::fs::create_dir_all(&container).unwrap();
        let index = CgroupIndex::scan(tmp.path()).unwrap();
        let mut e = OomKillEvent::default();
        e.header.kind = KIND_OOM_KILL;
        e.header.ktime_ns = 42;
        e.cgroup_id = crate::cgroup::cgroup_id(&container).unwrap();
        e.constraint = OOM_CGROUP_LIMIT;
        e.anon_rss = 3;
        e.comm[..4].copy_from_slice(b"java");
        type Row<'a> = (
            &'a str,
            &'a dyn PodNames,
            Option<(&'a str, &'a str)>,
            Option<&'a str>,
        );
        let rows: [Row; 2] = [
            (
                "the daemon knows the pod",
                &Names,
                Some(("shop", "web")),
                Some("nginx"),
            ),
            ("trace alone knows the UID only", &NoNames, None, None),
        ];
        for (what, names, pod, container_name) in rows {
            let a = attribute(&KernelEvent::OomKill(e), &index, names, 4096).unwrap();
            let Happened::OomKill(kill) = &a.what else {
                panic!("{what}")
            };
            assert_eq!(a.ktime_ns, 42);
            assert_eq!(
                (kill.comm.as_str(), kill.constraint, kill.anon_rss_bytes),
                ("java", Constraint::CgroupLimit, 3 * 4096),
                "{what}"
            );
            let p = kill.victim.pod.as_ref().expect("a pod's cgroup");
            assert_eq!(
                (p.uid.as_str(), p.qos, p.container_id.as_deref()),
                (UID, QosClass::Burstable, Some(CID)),
                "{what}"
            );
            assert_eq!(kill.victim.pod_name(), pod, "{what}");
            assert_eq!(p.container.as_deref(), container_name, "{what}");
            assert_eq!(
                kill.victim.path.as_deref(),
                Some(&*format!("/kubepods/burstable/pod{UID}/{CID}"))
            );
            assert_eq!(kill.victim.cgroup_id, e.cgroup_id);
        }
        let gone = Subject::resolve(&index, &Names, 1);
        assert_eq!(
            (gone.path, gone.pod),
            (None, None),
            "an unknown cgroup is named by id only"
        );
    }
}
