//! `NodePod`: what ranking and protection need from one pod, read from a `v1.Pod`, plus its
//! live usage from `/stats/summary`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::{quantity, stats::PodStats};

/// The kubelet marks a mirror pod with this annotation (`kubetypes.ConfigMirrorAnnotationKey`).
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// Where the kubelet got a pod from; anything but `api` is a static pod
/// (`kubetypes.ConfigSourceAnnotationKey`).
pub const SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
/// `scheduling.SystemCriticalPriority`: pods at or above it are critical to the kubelet.
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;
/// The API server's default for `terminationGracePeriodSeconds`.
pub const DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS: i64 = 30;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

/// Requests or limits of one container; `None` where unset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resources {
    pub cpu_millis: Option<u64>,
    pub memory_bytes: Option<u64>,
    pub ephemeral_storage_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerInfo {
    pub name: String,
    /// `containerd://<id>` etc., from the status; absent until the container was created.
    pub container_id: Option<String>,
    pub requests: Resources,
    pub limits: Resources,
}

/// Live usage of one pod, from the kubelet's summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodUsage {
    pub memory_working_set_bytes: Option<u64>,
    pub memory_rss_bytes: Option<u64>,
    pub ephemeral_storage_bytes: Option<u64>,
    pub inodes_used: Option<u64>,
    pub process_count: Option<u64>,
}

impl From<&PodStats> for PodUsage {
    fn from(s: &PodStats) -> Self {
        Self {
            memory_working_set_bytes: s.memory.as_ref().and_then(|m| m.working_set_bytes),
            memory_rss_bytes: s.memory.as_ref().and_then(|m| m.rss_bytes),
            ephemeral_storage_bytes: s.ephemeral_storage.as_ref().and_then(|f| f.used_bytes),
            inodes_used: s.ephemeral_storage.as_ref().and_then(|f| f.inodes_used),
            process_count: s.process_stats.as_ref().and_then(|p| p.process_count),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub labels: BTreeMap<String, String>,
    pub phase: Option<String>,
    pub priority: i32,
    pub qos: QosClass,
    /// Static pod: the kubelet read it from a file or URL (source annotation is not `api`).
    pub is_static: bool,
    /// Mirror pod: the API server's copy of a static pod.
    pub is_mirror: bool,
    /// Kind of the controller owner (`ReplicaSet`, `DaemonSet`, `Node`...), if any.
    pub owner_kind: Option<String>,
    pub termination_grace_period_seconds: i64,
    pub containers: Vec<ContainerInfo>,
    /// None when the kubelet's summary has no entry for the pod (or the source gives none).
    pub usage: Option<PodUsage>,
}

impl NodePod {
    /// The kubelet's `IsCriticalPod`: static, mirror, or priority at least system-critical.
    pub fn is_kubelet_critical(&self) -> bool {
        self.is_static || self.is_mirror || self.priority >= SYSTEM_CRITICAL_PRIORITY
    }
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum PodError {
    #[error("a pod has no {field}")]
    Missing { field: &'static str },
    #[error("pod {namespace}/{name}: container {container}: {field} {value:?} is not a quantity")]
    BadQuantity {
        namespace: String,
        name: String,
        container: String,
        field: String,
        value: String,
    },
}

impl TryFrom<&Pod> for NodePod {
    type Error = PodError;

    fn try_from(pod: &Pod) -> Result<Self, PodError> {
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
        let annotations = meta.annotations.clone().unwrap_or_default();

        let statuses = status
            .and_then(|s| s.container_statuses.as_deref())
            .unwrap_or_default();
        let mut containers = Vec::with_capacity(spec.containers.len());
        for c in &spec.containers {
            let (requests, limits) = container_resources(&namespace, &name, c)?;
            let container_id = statuses
                .iter()
                .find(|s| s.name == c.name)
                .and_then(|s| s.container_id.clone());
            containers.push(ContainerInfo {
                name: c.name.clone(),
                container_id,
                requests,
                limits,
            });
        }
        let qos = match status.and_then(|s| s.qos_class.as_deref()) {
            Some("Guaranteed") => QosClass::Guaranteed,
            Some("Burstable") => QosClass::Burstable,
            Some("BestEffort") => QosClass::BestEffort,
            _ => compute_qos(&containers),
        };
        Ok(Self {
            labels: meta.labels.clone().unwrap_or_default(),
            phase: status.and_then(|s| s.phase.clone()),
            priority: spec.priority.unwrap_or(0),
            qos,
            is_static: annotations
                .get(SOURCE_ANNOTATION)
                .is_some_and(|s| s != "api"),
            is_mirror: annotations.contains_key(MIRROR_ANNOTATION),
            owner_kind: meta
                .owner_references
                .as_deref()
                .unwrap_or_default()
                .iter()
                .find(|o| o.controller == Some(true))
                .map(|o| o.kind.clone()),
            termination_grace_period_seconds: spec
                .termination_grace_period_seconds
                .unwrap_or(DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS),
            containers,
            usage: None,
            namespace,
            name,
            uid,
        })
    }
}

fn container_resources(
    ns: &str,
    pod: &str,
    c: &Container,
) -> Result<(Resources, Resources), PodError> {
    let read = |kind: &str,
                map: Option<
        &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >| {
        let mut r = Resources::default();
        for (key, slot, millis) in [
            ("cpu", &mut r.cpu_millis, true),
            ("memory", &mut r.memory_bytes, false),
            ("ephemeral-storage", &mut r.ephemeral_storage_bytes, false),
        ] {
            if let Some(q) = map.and_then(|m| m.get(key)) {
                let parsed = if millis {
                    quantity::parse_millis(&q.0)
                } else {
                    quantity::parse_units(&q.0)
                };
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
    requests.cpu_millis = requests.cpu_millis.or(limits.cpu_millis);
    requests.memory_bytes = requests.memory_bytes.or(limits.memory_bytes);
    requests.ephemeral_storage_bytes = requests
        .ephemeral_storage_bytes
        .or(limits.ephemeral_storage_bytes);
    Ok((requests, limits))
}

/// `qos.GetPodQOS` for pods whose status has no class yet.
fn compute_qos(containers: &[ContainerInfo]) -> QosClass {
    let any_set = containers.iter().any(|c| {
        c.requests.cpu_millis.is_some()
            || c.requests.memory_bytes.is_some()
            || c.limits.cpu_millis.is_some()
            || c.limits.memory_bytes.is_some()
    });
    if !any_set {
        return QosClass::BestEffort;
    }
    let guaranteed = containers.iter().all(|c| {
        c.limits.cpu_millis.is_some()
            && c.limits.memory_bytes.is_some()
            && c.requests.cpu_millis == c.limits.cpu_millis
            && c.requests.memory_bytes == c.limits.memory_bytes
    });
    if guaranteed {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}
