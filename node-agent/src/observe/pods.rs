//! The workloads the policy ranks: Kubernetes pods (from the kubelet or the API server, with
//! memory read fresh from their cgroups when a pod is about to be chosen) or, in standalone
//! mode, the cgroups that stand in for pods.

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    time::SystemTime,
};

use node_agent_kube::{
    config::KubeConfig,
    pods::{model::ContainerRef, PodSnapshot},
};
use node_agent_policy::{ContainerInfo, ContainerUsage, PodInfo, PodUsage};

use crate::observe::feed::Cluster;
use crate::{
    cgroup::{paths, CgroupIndex, CgroupVersion, PodScope},
    kernel::PodNames,
};

/// The node's cgroups as the acting plan asks about them (it does no I/O itself).
pub struct NodeCgroups {
    pub version: CgroupVersion,
}

impl node_agent_executor::plan::Cgroups for NodeCgroups {
    fn exists(&self, cgroup: &Path) -> bool {
        cgroup.exists()
    }

    fn working_set(&self, cgroup: &Path) -> Option<u64> {
        working_set(cgroup, self.version)
    }

    fn has_processes(&self, cgroup: &Path) -> bool {
        node_agent_executor::kill::host::has_processes(cgroup)
    }
}

/// The pod cgroup of the pod with this UID under the node cgroup, with its id, which a kill
/// on the node verifies.
pub fn pod_cgroup(
    index: &CgroupIndex,
    node_cgroup: &Path,
    uid: &str,
) -> Option<node_agent_executor::plan::PodCgroup> {
    let below = node_cgroup.strip_prefix("/").unwrap_or(node_cgroup);
    index
        .pods()
        .find(|(_, path, pod)| {
            pod.scope == PodScope::Pod && pod.pod_uid == uid && path.starts_with(below)
        })
        .map(|(id, path, _)| node_agent_executor::plan::PodCgroup {
            path: index.root().join(path),
            id,
        })
}

/// Pod names from the latest snapshot, for attribution.
pub struct SnapshotNames<'a>(pub Option<&'a PodSnapshot>);

impl PodNames for SnapshotNames<'_> {
    fn pod(&self, uid: &str) -> Option<(String, String)> {
        let p = self.0?.by_uid(uid)?;
        Some((p.namespace.clone(), p.name.clone()))
    }
    fn container(&self, id: &str) -> Option<String> {
        Some(self.0?.containers.get(id)?.name.clone())
    }
}

/// The pods to rank, whether they may be acted on, and the ids the pod source lists.
pub struct Pods {
    pub pods: Vec<PodInfo>,
    pub fresh: bool,
    pub listed: Option<HashSet<String>>,
    /// Every UID the pod source listed, terminal pods' too (Kubernetes mode).
    pub listed_uids: Option<HashSet<String>>,
}

/// The pods to rank now: the pod source's (fresh enough to act on or not), or in standalone
/// mode the workload cgroups.
pub fn current(
    cluster: Option<(&Cluster, &KubeConfig)>,
    index: &CgroupIndex,
    node_cgroup: &Path,
) -> Pods {
    let Some((cluster, kube)) = cluster else {
        return Pods {
            pods: standalone_workloads(index, node_cgroup)
                .into_iter()
                .map(|(name, _)| standalone_pod(&name, None))
                .collect(),
            fresh: true,
            listed: None,
            listed_uids: None,
        };
    };
    let snapshot = cluster.snapshots.borrow();
    let Some(snapshot) = snapshot.as_ref() else {
        return Pods {
            pods: Vec::new(),
            fresh: false,
            listed: None,
            listed_uids: None,
        };
    };
    let fresh = match snapshot.check_fresh(SystemTime::now(), kube.staleness_bound()) {
        Ok(()) => true,
        Err(e) => {
            tracing::debug!(error = %e, "pod data");
            false
        }
    };
    Pods {
        listed: Some(snapshot.pods.iter().map(PodInfo::id).collect()),
        listed_uids: Some(snapshot.listed_uids.clone()),
        pods: snapshot.pods.clone(),
        fresh,
    }
}

/// `ranked` with memory read now from their cgroups (standalone: the workloads read anew).
pub fn with_memory_now(
    cluster: Option<&Cluster>,
    ranked: &[PodInfo],
    index: &CgroupIndex,
    node_cgroup: &Path,
    version: CgroupVersion,
) -> Vec<PodInfo> {
    match cluster {
        Some(cluster) => {
            let snapshot = cluster.snapshots.borrow();
            let containers = snapshot.as_ref().map(|s| &s.containers);
            let empty = Default::default();
            with_fresh_memory(
                ranked,
                index,
                node_cgroup,
                version,
                containers.unwrap_or(&empty),
            )
        }
        None => standalone_workloads(index, node_cgroup)
            .into_iter()
            .map(|(name, dir)| standalone_pod(&name, working_set(&dir, version)))
            .collect(),
    }
}

/// The namespace standalone workloads are reported in.
pub const STANDALONE_NAMESPACE: &str = "standalone";

/// Pod-level cgroup directories by pod UID, for the pods under the node cgroup.
pub fn pod_cgroups(index: &CgroupIndex, node_cgroup: &Path) -> HashMap<String, PathBuf> {
    let below = node_cgroup.strip_prefix("/").unwrap_or(node_cgroup);
    index
        .pods()
        .filter(|(_, path, pod)| pod.scope == PodScope::Pod && path.starts_with(below))
        .map(|(_, path, pod)| (pod.pod_uid.clone(), index.root().join(path)))
        .collect()
}

/// The pod cgroups of this node's kubelet: those below its pods cgroup (`kubepods` or
/// `kubepods.slice` right under the node cgroup, the one allocatable memory is measured on)
/// where there is one, so that another kubelet's pods nested below the node cgroup (a node in
/// a container, two kubelets on one host) are never taken for pods this one has not listed
/// yet, each costing an eviction the name wait ([`crate::observe::naming::NAME_WAIT`]); else every pod
/// cgroup below the node cgroup.
fn own_pod_cgroups(index: &CgroupIndex, node_cgroup: &Path) -> HashMap<String, PathBuf> {
    let all = pod_cgroups(index, node_cgroup);
    let below = node_cgroup.strip_prefix("/").unwrap_or(node_cgroup);
    match crate::cgroup::kubepods::kubepods_dir(&index.root().join(below)) {
        Some(pods) => all
            .into_iter()
            .filter(|(_, dir)| dir.starts_with(&pods))
            .collect(),
        None => all,
    }
}

/// The pod cgroups of this node's kubelet ([`own_pod_cgroups`]) whose pod the source has not
/// listed (`listed`: every UID it listed), with their working sets: `(uid, working set)`.
pub fn unlisted_pods(
    index: &CgroupIndex,
    node_cgroup: &Path,
    listed: &HashSet<String>,
    version: CgroupVersion,
) -> Vec<(String, u64)> {
    own_pod_cgroups(index, node_cgroup)
        .into_iter()
        .filter(|(uid, _)| !listed.contains(uid))
        .map(|(uid, dir)| {
            let ws = working_set(&dir, version).unwrap_or(0);
            (uid, ws)
        })
        .collect()
}

/// The pods of this node's kubelet ([`own_pod_cgroups`]) that the source has not listed.
pub fn unlisted_uids(
    index: &CgroupIndex,
    node_cgroup: &Path,
    listed: &HashSet<String>,
) -> std::collections::BTreeSet<String> {
    own_pod_cgroups(index, node_cgroup)
        .into_keys()
        .filter(|uid| !listed.contains(uid))
        .collect()
}

/// Container cgroup directories by (pod UID, runtime container id), under the node cgroup.
fn container_cgroups(index: &CgroupIndex, node_cgroup: &Path) -> Vec<(String, String, PathBuf)> {
    let below = node_cgroup.strip_prefix("/").unwrap_or(node_cgroup);
    index
        .pods()
        .filter(|(_, path, pod)| pod.scope == PodScope::Container && path.starts_with(below))
        .filter_map(|(_, path, pod)| {
            let id = pod.container_id.clone()?;
            Some((pod.pod_uid.clone(), id, index.root().join(path)))
        })
        .collect()
}

/// The standalone workloads: pod cgroups when the kubelet layout is present under the node
/// cgroup, else the node cgroup's direct children; `(name, directory)`.
pub fn standalone_workloads(index: &CgroupIndex, node_cgroup: &Path) -> Vec<(String, PathBuf)> {
    let pods = pod_cgroups(index, node_cgroup);
    if !pods.is_empty() {
        let mut v: Vec<_> = pods.into_iter().collect();
        v.sort();
        return v;
    }
    let below = node_cgroup.strip_prefix("/").unwrap_or(node_cgroup);
    let mut v: Vec<(String, PathBuf)> = index
        .entries()
        .filter(|(_, e)| e.path.parent() == Some(below) && !e.path.as_os_str().is_empty())
        .map(|(_, e)| (format!("/{}", e.path.display()), index.root().join(&e.path)))
        .collect();
    v.sort();
    v
}

/// A standalone workload as a pod: no requests, priority 0, its cgroup's working set.
pub fn standalone_pod(name: &str, working_set: Option<u64>) -> PodInfo {
    PodInfo {
        namespace: STANDALONE_NAMESPACE.into(),
        name: name.into(),
        termination_grace_period_seconds: Some(30),
        containers: vec![ContainerInfo {
            name: "main".into(),
            ..ContainerInfo::default()
        }],
        usage: working_set.map(|ws| PodUsage {
            memory_working_set_bytes: ws,
            ..PodUsage::default()
        }),
        ..PodInfo::default()
    }
}

/// Working set of a cgroup, `None` if it cannot be read (gone, or no memory controller).
pub fn working_set(dir: &Path, version: CgroupVersion) -> Option<u64> {
    paths::read_memory(dir, version)
        .ok()
        .map(|r| r.working_set())
}

/// The same pods with their memory read now from their cgroups: the pod's working set, and
/// each container's (named through the pod source's container ids), so ranking and the
/// eviction message use the figures of this moment, not the kubelet's of up to its
/// housekeeping interval ago. Pods whose cgroup is not found keep the pod source's figures.
pub fn with_fresh_memory(
    pods: &[PodInfo],
    index: &CgroupIndex,
    node_cgroup: &Path,
    version: CgroupVersion,
    containers: &HashMap<String, ContainerRef>,
) -> Vec<PodInfo> {
    let pod_dirs = pod_cgroups(index, node_cgroup);
    let container_dirs = container_cgroups(index, node_cgroup);
    pods.iter()
        .map(|pod| {
            let mut pod = pod.clone();
            let Some(uid) = pod.uid.clone() else {
                return pod;
            };
            let Some(fresh) = pod_dirs.get(&uid).and_then(|d| working_set(d, version)) else {
                return pod;
            };
            pod.usage
                .get_or_insert_with(PodUsage::default)
                .memory_working_set_bytes = fresh;
            for (_, id, dir) in container_dirs.iter().filter(|(u, _, _)| *u == uid) {
                let Some(name) = containers.get(id).map(|c| c.name.as_str()) else {
                    continue;
                };
                let Some(container) = pod.containers.iter_mut().find(|c| c.name == name) else {
                    continue;
                };
                if let Some(ws) = working_set(dir, version) {
                    container
                        .usage
                        .get_or_insert_with(ContainerUsage::default)
                        .memory_working_set_bytes = Some(ws);
                }
            }
            pod
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0c4a2c5e-7f0b-4f4e-9a55-3b1c1d2e3f40";
    const CID: &str = "8d3b6f1c0a9e4b7d2c5f8a1e3b6d9c0f2a4e7b1d5c8f0a3e6b9d2c4f7a1e3b5d";

    /// A v1-style memory cgroup with the files `read_memory` reads.
    fn memcg(dir: &Path, usage: u64, inactive_file: u64) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("memory.usage_in_bytes"), usage.to_string()).unwrap();
        std::fs::write(dir.join("memory.limit_in_bytes"), "9223372036854771712").unwrap();
        std::fs::write(
            dir.join("memory.stat"),
            format!("total_inactive_file {inactive_file}\ninactive_file {inactive_file}\n"),
        )
        .unwrap();
    }

    #[test]
    fn fresh_cgroup_memory_replaces_the_pod_sources_figures() {
        let tmp = tempfile::tempdir().unwrap();
        let pod_dir = tmp.path().join(format!("node/kubepods/burstable/pod{UID}"));
        memcg(&pod_dir, 90 << 20, 10 << 20);
        memcg(&pod_dir.join(CID), 70 << 20, 0);
        let index = CgroupIndex::scan(tmp.path()).unwrap();
        let pod = PodInfo {
            namespace: "shop".into(),
            name: "web".into(),
            uid: Some(UID.into()),
            containers: vec![
                ContainerInfo {
                    name: "app".into(),
                    ..ContainerInfo::default()
                },
                ContainerInfo {
                    name: "sidecar".into(),
                    ..ContainerInfo::default()
                },
            ],
            usage: Some(PodUsage {
                memory_working_set_bytes: 100,
                processes: 7,
                ..PodUsage::default()
            }),
            ..PodInfo::default()
        };
        let other = PodInfo {
            uid: Some("elsewhere".into()),
            ..pod.clone()
        };
        let untouched = pod.clone();
        let containers: HashMap<String, ContainerRef> = [(
            CID.to_string(),
            ContainerRef {
                pod_uid: UID.into(),
                name: "app".into(),
            },
        )]
        .into_iter()
        .collect();
        let fresh = with_fresh_memory(
            &[pod, other],
            &index,
            Path::new("/node"),
            CgroupVersion::V1,
            &containers,
        );
        let usage = fresh[0].usage.clone().unwrap();
        assert_eq!(
            (usage.memory_working_set_bytes, usage.processes),
            (80 << 20, 7),
            "working set = usage - inactive_file; the rest kept"
        );
        assert_eq!(
            fresh[0].containers[0]
                .usage
                .and_then(|u| u.memory_working_set_bytes),
            Some(70 << 20),
            "the container, by its id"
        );
        assert_eq!(fresh[0].containers[1].usage, None, "no cgroup, no figure");
        assert_eq!(
            fresh[1].usage.clone().unwrap().memory_working_set_bytes,
            100,
            "no cgroup found: the pod source's figure"
        );
        let outside = with_fresh_memory(
            &[untouched],
            &index,
            Path::new("/other-node"),
            CgroupVersion::V1,
            &containers,
        );
        assert_eq!(
            outside[0].usage.clone().unwrap().memory_working_set_bytes,
            100,
            "only cgroups below the node cgroup are read"
        );
    }

    /// Unlisted pods are this kubelet's: below the pods cgroup right under the node cgroup
    /// when there is one (a second kubelet nested below, as on the real-cluster tests' host,
    /// cost every eviction the 250 ms name wait for the other node's agent pod); anywhere
    /// below the node cgroup when there is none.
    #[test]
    fn unlisted_pods_are_this_kubelets_own() {
        const NESTED: &str = "1b4e28ba-2fa1-11d2-883f-0016d3cca427";
        type Row = (
            &'static str,
            &'static [&'static str],
            &'static [&'static str],
        );
        let rows: &[Row] = &[
            (
                "a second kubelet's pods nested below the node cgroup are not this one's",
                &["kubepods/burstable/pod{UID}", "node-1/kubepods/pod{NESTED}"],
                &[UID],
            ),
            (
                "systemd's pods slice",
                &[
                    "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice",
                    "node-1/kubepods/pod{NESTED}",
                ],
                &[UID],
            ),
            (
                "no pods cgroup right below: every pod cgroup below the node cgroup",
                &["kubelet/kubepods/pod{UID}", "node-1/kubepods/pod{NESTED}"],
                &[UID, NESTED],
            ),
        ];
        for (what, dirs, want) in rows {
            let tmp = tempfile::tempdir().unwrap();
            for dir in *dirs {
                let dir = dir
                    .replace("{UID}", UID)
                    .replace("{UID_}", &UID.replace('-', "_"))
                    .replace("{NESTED}", NESTED);
                memcg(&tmp.path().join(dir), 64 << 20, 0);
            }
            let index = CgroupIndex::scan(tmp.path()).unwrap();
            let unlisted: std::collections::BTreeSet<String> =
                unlisted_pods(&index, Path::new("/"), &HashSet::new(), CgroupVersion::V1)
                    .into_iter()
                    .map(|(uid, _)| uid)
                    .collect();
            let want: std::collections::BTreeSet<String> =
                want.iter().map(|u| u.to_string()).collect();
            assert_eq!(unlisted, want, "{what}");
            assert_eq!(
                unlisted_uids(&index, Path::new("/"), &HashSet::new()),
                want,
                "{what}"
            );
        }
    }
}
