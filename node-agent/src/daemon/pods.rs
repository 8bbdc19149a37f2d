//! The workloads the policy ranks: Kubernetes pods (from the kubelet or API server, with
//! memory usage read fresh from their cgroups when found) or, in standalone mode, the
//! cgroups that stand in for pods.

use std::{collections::HashMap, path::PathBuf};

use node_agent_kube::pods::model::NodePod;
use node_agent_policy::{ContainerInfo, PodInfo, PodUsage, Quantity, Resources};

use crate::cgroup::{paths, CgroupIndex, CgroupVersion, PodScope};

/// Pod-level cgroup directories by pod UID, for the pods under the node cgroup.
pub fn pod_cgroups(index: &CgroupIndex, node_cgroup: &std::path::Path) -> HashMap<String, PathBuf> {
    let below = node_cgroup.strip_prefix("/").unwrap_or(node_cgroup);
    index
        .pods()
        .filter(|(_, path, pod)| pod.scope == PodScope::Pod && path.starts_with(below))
        .map(|(_, path, pod)| (pod.pod_uid.clone(), index.root().join(path)))
        .collect()
}

/// The standalone workloads: pod cgroups when the kubelet layout is present under the node
/// cgroup, else the node cgroup's direct children.
pub fn standalone_workloads(
    index: &CgroupIndex,
    node_cgroup: &std::path::Path,
) -> Vec<(String, PathBuf)> {
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
        namespace: "standalone".into(),
        name: name.into(),
        uid: None,
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
pub fn working_set(dir: &std::path::Path, version: CgroupVersion) -> Option<u64> {
    paths::read_memory(dir, version)
        .ok()
        .map(|r| r.working_set())
}

fn quantity(bytes: Option<u64>) -> Option<Quantity> {
    bytes
        .and_then(|b| i64::try_from(b).ok())
        .map(|b| Quantity::from_int(b, node_agent_policy::Format::BinarySi))
}

/// A Kubernetes pod as the policy sees it. `fresh_memory` (from the pod's cgroup) replaces the
/// kubelet's working set, which may be up to its housekeeping interval old.
pub fn pod_info(pod: &NodePod, fresh_memory: Option<u64>) -> PodInfo {
    let usage = pod.usage.as_ref();
    let memory = fresh_memory.or_else(|| usage.and_then(|u| u.memory_working_set_bytes));
    let has_usage = memory.is_some() || usage.is_some();
    PodInfo {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        uid: Some(pod.uid.clone()),
        labels: pod.labels.clone(),
        terminating: false,
        priority: pod.priority,
        is_static: pod.is_static,
        is_mirror: pod.is_mirror,
        termination_grace_period_seconds: Some(pod.termination_grace_period_seconds),
        containers: pod
            .containers
            .iter()
            .map(|c| ContainerInfo {
                name: c.name.clone(),
                requests: Resources {
                    memory: quantity(c.requests.memory_bytes),
                    ephemeral_storage: quantity(c.requests.ephemeral_storage_bytes),
                },
                limits: Resources {
                    memory: quantity(c.limits.memory_bytes),
                    ephemeral_storage: quantity(c.limits.ephemeral_storage_bytes),
                },
                usage: None,
            })
            .collect(),
        usage: has_usage.then(|| PodUsage {
            memory_working_set_bytes: memory.unwrap_or(0),
            processes: usage.and_then(|u| u.process_count).unwrap_or(0),
            nodefs: node_agent_policy::FsUsage {
                bytes: usage.and_then(|u| u.ephemeral_storage_bytes).unwrap_or(0),
                inodes: usage.and_then(|u| u.inodes_used).unwrap_or(0),
            },
            imagefs: node_agent_policy::FsUsage::default(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_cgroup_memory_replaces_the_kubelets_figure() {
        let pod = NodePod {
            namespace: "default".into(),
            name: "web".into(),
            uid: "u1".into(),
            labels: Default::default(),
            phase: None,
            priority: 5,
            qos: node_agent_kube::pods::model::QosClass::Burstable,
            is_static: false,
            is_mirror: false,
            owner_kind: None,
            termination_grace_period_seconds: 20,
            containers: vec![node_agent_kube::pods::model::ContainerInfo {
                name: "app".into(),
                container_id: None,
                requests: node_agent_kube::pods::model::Resources {
                    memory_bytes: Some(1 << 30),
                    ..Default::default()
                },
                limits: Default::default(),
            }],
            usage: Some(node_agent_kube::pods::model::PodUsage {
                memory_working_set_bytes: Some(100),
                process_count: Some(7),
                ..Default::default()
            }),
        };
        let fresh = pod_info(&pod, Some(5000));
        assert_eq!(fresh.usage.unwrap().memory_working_set_bytes, 5000);
        assert_eq!(fresh.usage.unwrap().processes, 7);
        assert_eq!(
            fresh.containers[0].requests.memory.unwrap().value(),
            1 << 30
        );
        assert_eq!(
            pod_info(&pod, None).usage.unwrap().memory_working_set_bytes,
            100
        );
        let bare = NodePod { usage: None, ..pod };
        assert!(
            pod_info(&bare, None).usage.is_none(),
            "no stats, no cgroup: no usage"
        );
    }
}
