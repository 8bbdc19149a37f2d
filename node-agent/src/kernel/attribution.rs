//! Kernel events attributed to what they concern: the cgroup, and when it is a pod's, the pod
//! (UID, QoS, and from Kubernetes its namespace and name) and the container. One type for the
//! daemon, which knows pod names from its pod source, and for `trace`, which may not; what is
//! printed or sent (`trace::Record`) is built from it last.

use node_agent_common::{DIRECTION_UP, OOM_CGROUP_LIMIT, OOM_SYSTEM};

use crate::cgroup::{CgroupIndex, QosClass};
use crate::ebpf::{events::comm, KernelEvent};

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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    Up,
    Down,
}

/// Why the OOM killer ran, as far as the kernel side can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Constraint {
    /// A cgroup's memory limit.
    CgroupLimit,
    /// The whole node ran out.
    System,
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomKill {
    pub victim: Subject,
    /// The cgroup whose limit was hit, when a limit was.
    pub limit: Option<Subject>,
    pub pid: u32,
    pub tgid: u32,
    pub comm: String,
    pub uid: u32,
    pub oom_score_adj: i32,
    pub constraint: Constraint,
    pub total_vm_bytes: u64,
    pub anon_rss_bytes: u64,
    pub file_rss_bytes: u64,
    pub shmem_rss_bytes: u64,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Happened {
    OomKill(OomKill),
    MemoryThreshold {
        cgroup: Subject,
        direction: Direction,
        usage_bytes: u64,
        threshold_bytes: u64,
    },
    PidThreshold {
        direction: Direction,
        available: i64,
        threshold: u64,
        live: i64,
        limit: u64,
    },
    ForkStorm {
        cgroup: Subject,
        pid: u32,
        comm: String,
        forks_in_window: u64,
        window_ms: u64,
        max_forks: u64,
    },
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

fn direction(d: u32) -> Direction {
    if d == DIRECTION_UP {
        Direction::Up
    } else {
        Direction::Down
    }
}

/// Attributes a kernel event; `None` for the cgroup index's own bookkeeping (a cgroup came or
/// went), which concerns nobody. `page_size` turns the OOM victim's page counts into bytes.
pub fn attribute(
    event: &KernelEvent,
    index: &CgroupIndex,
    names: &dyn PodNames,
    page_size: u64,
) -> Option<Attributed> {
    let subject = |id| Subject::resolve(index, names, id);
    let what = match event {
        KernelEvent::OomKill(e) => Happened::OomKill(OomKill {
            victim: subject(e.cgroup_id),
            limit: (e.limit_cgroup_id != 0).then(|| subject(e.limit_cgroup_id)),
            pid: e.pid,
            tgid: e.tgid,
            comm: comm(&e.comm),
            uid: e.uid,
            oom_score_adj: e.oom_score_adj,
            constraint: match e.constraint {
                OOM_CGROUP_LIMIT => Constraint::CgroupLimit,
                OOM_SYSTEM => Constraint::System,
                _ => Constraint::Unknown,
            },
            total_vm_bytes: e.total_vm.saturating_mul(page_size),
            anon_rss_bytes: e.anon_rss.saturating_mul(page_size),
            file_rss_bytes: e.file_rss.saturating_mul(page_size),
            shmem_rss_bytes: e.shmem_rss.saturating_mul(page_size),
        }),
        KernelEvent::MemoryThreshold(e) => Happened::MemoryThreshold {
            cgroup: subject(e.cgroup_id),
            direction: direction(e.direction),
            usage_bytes: e.usage_bytes,
            threshold_bytes: e.threshold_bytes,
        },
        KernelEvent::PidThreshold(e) => Happened::PidThreshold {
            direction: direction(e.direction),
            available: i64::try_from(e.limit)
                .unwrap_or(i64::MAX)
                .saturating_sub(e.live),
            threshold: e.threshold,
            live: e.live,
            limit: e.limit,
        },
        KernelEvent::ForkStorm(e) => Happened::ForkStorm {
            cgroup: subject(e.cgroup_id),
            pid: e.pid,
            comm: comm(&e.comm),
            forks_in_window: e.forks_in_window,
            window_ms: e.window_ns / 1_000_000,
            max_forks: e.max_forks,
        },
        KernelEvent::CgroupChange(_) => return None,
    };
    Some(Attributed {
        ktime_ns: event.header().ktime_ns,
        what,
    })
}

impl Attributed {
    /// The cgroup the event names, if it names one (OOM kills: the victim's).
    pub fn cgroup_id(&self) -> Option<u64> {
        match &self.what {
            Happened::OomKill(k) => Some(k.victim.cgroup_id),
            Happened::MemoryThreshold { cgroup, .. } | Happened::ForkStorm { cgroup, .. } => {
                Some(cgroup.cgroup_id)
            }
            Happened::PidThreshold { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use node_agent_common::{OomKillEvent, KIND_OOM_KILL};

    use super::*;

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
            assert_eq!(a.cgroup_id(), Some(e.cgroup_id));
        }
        let gone = Subject::resolve(&index, &Names, 1);
        assert_eq!(
            (gone.path, gone.pod),
            (None, None),
            "an unknown cgroup is named by id only"
        );
    }
}
