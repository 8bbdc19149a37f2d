//! What the agent reads from the runtime, as plain data: the client converts the CRI's protobuf
//! messages into these (checking what it relies on), and the reclaim planner takes them as input.

use jiff::Timestamp;
use serde::Serialize;

/// The label the kubelet puts on every container and sandbox it creates.
pub const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";
pub const POD_NAME_LABEL: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE_LABEL: &str = "io.kubernetes.pod.namespace";

/// `Version`: who answers on the endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RuntimeVersion {
    /// e.g. `containerd`.
    pub runtime_name: String,
    /// e.g. `1.6.20~ds1`.
    pub runtime_version: String,
    /// e.g. `v1`.
    pub runtime_api_version: String,
}

/// The pod a container or sandbox belongs to, from the kubelet's labels. All empty for objects
/// the kubelet did not create.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct PodRef {
    pub uid: String,
    pub namespace: String,
    pub name: String,
}

/// `PodSandboxState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    Ready,
    NotReady,
}

/// One entry of `ListPodSandbox`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodSandbox {
    pub id: String,
    /// From the sandbox metadata (the kubelet sets it from the pod).
    pub pod: PodRef,
    pub attempt: u32,
    pub state: SandboxState,
    pub created_at: Timestamp,
}

/// `ContainerState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ContainerState {
    Created,
    Running,
    Exited,
    Unknown,
}

impl ContainerState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Running => "running",
            Self::Exited => "exited",
            Self::Unknown => "unknown",
        }
    }
}

/// One entry of `ListContainers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Container {
    pub id: String,
    pub pod_sandbox_id: String,
    /// The container's name in its pod (`metadata.name`).
    pub name: String,
    /// Restart count: the kubelet creates attempt N+1 when attempt N died.
    pub attempt: u32,
    /// From the kubelet's labels on the container.
    pub pod: PodRef,
    /// The image as the pod spec names it.
    pub image: String,
    /// The image ID the container runs (`image_id`, or `image_ref` on runtimes that predate
    /// it): what `ListImages` calls `id`, and what the kubelet matches images in use by.
    pub image_id: String,
    pub state: ContainerState,
    pub created_at: Timestamp,
}

/// One entry of `ListImages`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Image {
    pub id: String,
    pub repo_tags: Vec<String>,
    pub repo_digests: Vec<String>,
    /// As the runtime reports it (containerd: the image's content, compressed); the kubelet
    /// counts this when it frees images.
    pub size_bytes: u64,
    /// The runtime asks that it never be garbage collected (containerd 1.7+: the sandbox image).
    pub pinned: bool,
}

impl Image {
    /// Whether `reference` names this image: its ID, a tag or a digest.
    pub fn is_named(&self, reference: &str) -> bool {
        self.id == reference
            || self.repo_tags.iter().any(|t| t == reference)
            || self.repo_digests.iter().any(|d| d == reference)
    }
}

/// A filesystem's usage as the runtime measures it (`FilesystemUsage`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FilesystemUsage {
    /// Where the runtime keeps the data (`fs_id.mountpoint`): a directory, not necessarily a
    /// mount point.
    pub mountpoint: String,
    /// Bytes the runtime's data there takes; `None` when the runtime did not say.
    pub used_bytes: Option<u64>,
    pub inodes_used: Option<u64>,
    pub timestamp: Timestamp,
}

/// `ImageFsInfo`: the filesystems holding images, and (runtimes that split them) those holding
/// containers' writable layers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ImageFsInfo {
    pub image_filesystems: Vec<FilesystemUsage>,
    pub container_filesystems: Vec<FilesystemUsage>,
}

impl ImageFsInfo {
    /// Total bytes used on the image filesystems, if the runtime reported any.
    pub fn image_bytes_used(&self) -> Option<u64> {
        self.image_filesystems
            .iter()
            .map(|f| f.used_bytes)
            .sum::<Option<u64>>()
    }
}

/// One entry of `ContainerStats`/`ListContainerStats`: what the agent uses of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContainerStats {
    pub id: String,
    /// The container's writable layer (its ephemeral storage outside volumes and logs).
    pub writable_layer: Option<FilesystemUsage>,
    pub memory_working_set_bytes: Option<u64>,
}
