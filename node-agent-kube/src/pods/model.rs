//! A `v1.Pod` read as the policy's [`PodInfo`] (one pod model for the whole agent), and the
//! usage `/stats/summary` gives it.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{Container, Pod},
    apimachinery::pkg::api::resource::Quantity as KubeQuantity,
};
use node_agent_policy::{
    ContainerInfo, ContainerUsage, FsUsage, PodInfo, PodUsage, Quantity, Resources,
};

use super::stats::PodStats;

/// The kubelet marks a mirror pod with this annotation (`kubetypes.ConfigMirrorAnnotationKey`).
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// Where the kubelet got a pod from; anything but `api` is a static pod
/// (`kubetypes.ConfigSourceAnnotationKey`).
pub const SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
/// The API server's default for `terminationGracePeriodSeconds`.
pub const DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS: i64 = 30;

/// A running container of a pod, by the id its runtime gave it (the part after `<runtime>://`
/// of `status.containerStatuses[].containerID`), which is how its cgroup names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerRef {
    pub pod_uid: String,
    pub name: String,
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum PodError {
    #[error("a pod has no {field}")]
    Missing { field: &'static str },
    #[error("pod {namespace}/{name}: container {container}: {field} {value:?} is not a quantity that is not negative")]
    BadQuantity {
        namespace: String,
        name: String,
        container: String,
        field: String,
        value: String,
    },
}

/// What a pod in a snapshot is: a candidate for the policy, or no longer holding anything.
#[derive(Debug, Clone, PartialEq)]
pub enum Read {
    Active {
        pod: Box<PodInfo>,
        /// Its running containers by runtime id.
        containers: Vec<(String, ContainerRef)>,
    },
    /// Succeeded or Failed: the kubelet leaves terminal pods out of its active pods.
    Terminal,
}

/// Reads one `v1.Pod`.
pub fn read(pod: &Pod) -> Result<Read, PodError> {
    let meta = &pod.metadata;
    let namespace = meta.namespace.clone().ok_or(PodError::Missing {
        field: "metadata.namespace",
    })?;
    let name = meta.name.clone().ok_or(PodError::Missing {
        field: "metadata.name",
    })?;
    let uid = meta.uid.clone().ok_or(PodError::Missing {
        field: "metadata.uid",
    })?;
    let spec = pod
        .spec
        .as_ref()
        .ok_or(PodError::Missing { field: "spec" })?;
    let status = pod.status.as_ref();
    if matches!(
        status.and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    ) {
        return Ok(Read::Terminal);
    }
    let annotations = meta.annotations.clone().unwrap_or_default();
    let mut containers = Vec::with_capacity(spec.containers.len());
    for c in &spec.containers {
        let (requests, limits) = container_resources(&namespace, &name, c)?;
        containers.push(ContainerInfo {
            name: c.name.clone(),
            requests,
            limits,
            usage: None,
        });
    }
    let running = status
        .and_then(|s| s.container_statuses.as_deref())
        .unwrap_or_default()
        .iter()
        .filter_map(|s| {
            let id = s.container_id.as_deref()?;
            let id = id.split_once("://").map_or(id, |(_, id)| id);
            (!id.is_empty()).then(|| {
                (
                    id.to_string(),
                    ContainerRef {
                        pod_uid: uid.clone(),
                        name: s.name.clone(),
                    },
                )
            })
        })
        .collect();
    Ok(Read::Active {
        pod: Box::new(PodInfo {
            labels: meta.labels.clone().unwrap_or_default(),
            terminating: meta.deletion_timestamp.is_some(),
            priority: spec.priority.unwrap_or(0),
            is_static: annotations
                .get(SOURCE_ANNOTATION)
                .is_some_and(|s| s != "api"),
            is_mirror: annotations.contains_key(MIRROR_ANNOTATION),
            termination_grace_period_seconds: Some(
                spec.termination_grace_period_seconds
                    .unwrap_or(DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS),
            ),
            containers,
            usage: None,
            namespace,
            name,
            uid: Some(uid),
        }),
        containers: running,
    })
}

/// Memory and ephemeral-storage requests and limits (the only resources eviction looks at).
fn container_resources(
    ns: &str,
    pod: &str,
    c: &Container,
) -> Result<(Resources, Resources), PodError> {
    let read = |kind: &str, map: Option<&BTreeMap<String, KubeQuantity>>| {
        let mut r = Resources::default();
        for (key, slot) in [
            ("memory", &mut r.memory),
            ("ephemeral-storage", &mut r.ephemeral_storage),
        ] {
            if let Some(q) = map.and_then(|m| m.get(key)) {
                let parsed = q.0.parse::<Quantity>().ok().filter(|q| !q.is_negative());
                *slot = Some(parsed.ok_or_else(|| PodError::BadQuantity {
                    namespace: ns.to_string(),
                    name: pod.to_string(),
                    container: c.name.clone(),
                    field: format!("resources.{kind}.{key}"),
                    value: q.0.clone(),
                })?);
            }
        }
        Ok(r)
    };
    let res = c.resources.as_ref();
    let limits = read("limits", res.and_then(|r| r.limits.as_ref()))?;
    let mut requests = read("requests", res.and_then(|r| r.requests.as_ref()))?;
    // The API server defaults an unset request to the limit.
    requests.memory = requests.memory.or(limits.memory);
    requests.ephemeral_storage = requests.ephemeral_storage.or(limits.ephemeral_storage);
    Ok((requests, limits))
}

/// Fills the pod's usage from its `/stats/summary` entry: the pod's working set, processes
/// and ephemeral storage, and each container's working set and writable layer plus logs (the
/// figures the kubelet's eviction message uses).
pub fn apply_stats(pod: &mut PodInfo, stats: &PodStats) {
    let storage = stats.ephemeral_storage.as_ref();
    pod.usage = Some(PodUsage {
        memory_working_set_bytes: stats
            .memory
            .as_ref()
            .and_then(|m| m.working_set_bytes)
            .unwrap_or(0),
        processes: stats
            .process_stats
            .as_ref()
            .and_then(|p| p.process_count)
            .unwrap_or(0),
        nodefs: FsUsage {
            bytes: storage.and_then(|f| f.used_bytes).unwrap_or(0),
            inodes: storage.and_then(|f| f.inodes_used).unwrap_or(0),
        },
        imagefs: FsUsage::default(),
    });
    for container in &mut pod.containers {
        let Some(c) = stats.containers.iter().find(|c| c.name == container.name) else {
            continue;
        };
        let used = |f: &Option<super::stats::FsStats>| f.as_ref().and_then(|f| f.used_bytes);
        container.usage = Some(ContainerUsage {
            memory_working_set_bytes: c.memory.as_ref().and_then(|m| m.working_set_bytes),
            // The kubelet counts a container's ephemeral storage only when both are known.
            ephemeral_storage_bytes: used(&c.rootfs)
                .zip(used(&c.logs))
                .map(|(a, b)| a.saturating_add(b)),
        });
    }
}
