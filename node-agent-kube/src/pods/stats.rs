//! The kubelet's `/stats/summary` (`stats/v1alpha1`), only the parts ranking needs: the pod
//! entries, each read on its own (`records::decode_summary`). Field names follow the kubelet's
//! JSON tags (`ephemeral-storage`, `process_stats`, `process_count`). Of the node part,
//! `records::decode_summary` reads only its name and task limit: the agent measures the rest
//! of the node itself.

use serde::Deserialize;

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodReference {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    pub pod_ref: PodReference,
    #[serde(default)]
    pub containers: Vec<ContainerStats>,
    pub memory: Option<MemoryStats>,
    #[serde(rename = "ephemeral-storage")]
    pub ephemeral_storage: Option<FsStats>,
    // The kubelet's tag is snake_case here, unlike the rest of the summary.
    #[serde(rename = "process_stats")]
    pub process_stats: Option<ProcessStats>,
    /// The pod's volumes the kubelet measures (emptyDir among them), as `volume`.
    #[serde(default, rename = "volume")]
    pub volumes: Vec<VolumeStats>,
}

/// One volume's use (`VolumeStats`: the `FsStats` fields inline, plus its name).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStats {
    pub name: String,
    pub used_bytes: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct ProcessStats {
    pub process_count: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    pub name: String,
    pub memory: Option<MemoryStats>,
    pub rootfs: Option<FsStats>,
    pub logs: Option<FsStats>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    pub available_bytes: Option<u64>,
    pub usage_bytes: Option<u64>,
    pub working_set_bytes: Option<u64>,
    pub rss_bytes: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FsStats {
    pub available_bytes: Option<u64>,
    pub capacity_bytes: Option<u64>,
    pub used_bytes: Option<u64>,
    pub inodes_free: Option<u64>,
    pub inodes: Option<u64>,
    pub inodes_used: Option<u64>,
}
