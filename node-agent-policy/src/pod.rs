//! A pod as the policy sees it: plain data, filled by the daemon from the API server and the
//! kubelet's stats, by `simulate` from a file. The modules that judge pods (eligibility,
//! requests, local storage limits, ranking, the eviction message) read these types; this module
//! reads none of theirs, so imports run one way.

use std::collections::BTreeMap;

use crate::quantity::Quantity;

/// Resource requests (or limits) of one container, in Kubernetes quantities so that the
/// eviction message prints them as written (`1Gi`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Resources {
    pub memory: Option<Quantity>,
    pub ephemeral_storage: Option<Quantity>,
}

/// What one container uses: for the eviction message's per-container lines and its own
/// ephemeral-storage limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ContainerUsage {
    pub memory_working_set_bytes: Option<u64>,
    /// Its writable layer (the summary's `rootfs.usedBytes`).
    pub rootfs_bytes: Option<u64>,
    /// Its logs (the summary's `logs.usedBytes`).
    pub logs_bytes: Option<u64>,
}

impl ContainerUsage {
    /// Writable layer plus logs, as the kubelet's eviction message counts a container's
    /// ephemeral storage: only when both are known.
    pub fn ephemeral_storage_bytes(&self) -> Option<u64> {
        self.rootfs_bytes
            .zip(self.logs_bytes)
            .map(|(a, b)| a.saturating_add(b))
    }
}

/// A container of a pod.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ContainerInfo {
    pub name: String,
    pub requests: Resources,
    pub limits: Resources,
    /// `None` when no stats are known for this container.
    pub usage: Option<ContainerUsage>,
}

/// Disk use on one filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FsUsage {
    pub bytes: u64,
    pub inodes: u64,
}

/// What a pod uses, as the kubelet's stats summary reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodUsage {
    pub memory_working_set_bytes: u64,
    pub processes: u64,
    /// Use on the node filesystem: logs and local volumes, and also container writable layers
    /// when the node has no dedicated imagefs.
    pub nodefs: FsUsage,
    /// Use on a dedicated imagefs: container writable layers. Unused without an imagefs.
    pub imagefs: FsUsage,
    /// The pod's ephemeral storage in all (the summary's `ephemeral-storage.usedBytes`:
    /// writable layers, logs, local volumes), against its ephemeral-storage limit.
    pub ephemeral_storage_bytes: Option<u64>,
    /// Bytes used by each of its volumes the summary reports, by volume name (emptyDir
    /// volumes against their `sizeLimit`).
    pub volumes: BTreeMap<String, u64>,
}

/// An init container of a pod, for the pod's request and limit totals.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct InitContainerInfo {
    pub name: String,
    pub requests: Resources,
    pub limits: Resources,
    /// `restartPolicy: Always`: a sidecar that keeps running beside the containers.
    pub restartable: bool,
}

/// An emptyDir volume of a pod (`spec.volumes[].emptyDir`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EmptyDirInfo {
    /// The volume's name, as the stats summary names its usage.
    pub name: String,
    /// `sizeLimit`, if set.
    pub size_limit: Option<Quantity>,
}

/// A pod the policy may rank and evict.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
    /// `metadata.labels`, for the exclusions' label selector.
    pub labels: BTreeMap<String, String>,
    /// Deletion was requested (`metadata.deletionTimestamp` is set): the pod is on its way out
    /// and is never chosen again.
    pub terminating: bool,
    /// `spec.priority`; 0 when unset.
    pub priority: i32,
    /// A static pod (from a manifest file on the node).
    pub is_static: bool,
    /// A mirror pod (the API server's copy of a static pod).
    pub is_mirror: bool,
    /// `spec.terminationGracePeriodSeconds`, if set.
    pub termination_grace_period_seconds: Option<i64>,
    pub containers: Vec<ContainerInfo>,
    /// `spec.initContainers`, for the request total ([`PodInfo::request_nanos`]).
    pub init_containers: Vec<InitContainerInfo>,
    /// Pod-level requests (`spec.resources.requests`) when the pod sets pod-level resources
    /// (cpu or memory in its requests or limits): they replace the containers' requests.
    pub pod_level_requests: Option<Resources>,
    /// `spec.overhead`: what the RuntimeClass adds to a pod's non-zero request.
    pub overhead: Resources,
    /// Its emptyDir volumes, for their size limits (local storage eviction).
    pub empty_dirs: Vec<EmptyDirInfo>,
    /// `None` when the kubelet would have no stats for the pod: such pods rank first.
    pub usage: Option<PodUsage>,
}

impl PodInfo {
    /// How the executor's reports name the pod: its UID, else `namespace/name` (standalone
    /// workloads have no UID).
    pub fn id(&self) -> String {
        self.uid
            .clone()
            .unwrap_or_else(|| format!("{}/{}", self.namespace, self.name))
    }
}
