//! The kubelet's local storage eviction (`localStorageEviction`, on with
//! `LocalStorageCapacityIsolation`, the default): whatever the node's state, a pod is evicted
//! when
//! 1. an emptyDir volume holds more than its `sizeLimit` (`emptyDirLimitEviction`),
//! 2. the pod's ephemeral storage (writable layers, logs, local volumes) exceeds the total of
//!    its containers' `ephemeral-storage` limits (`podEphemeralStorageLimitEviction`), or
//! 3. a container's logs, plus its writable layer when there is no dedicated imagefs, exceed
//!    its own `ephemeral-storage` limit (`containerEphemeralStorageLimitEviction`),
//!
//! checked in that order, the first that holds naming the pod's message. Usage is compared
//! strictly (more than the limit). A pod without stats is not checked.

use std::fmt;
use std::str::FromStr;

use crate::pod::{PodInfo, Resources};
use crate::quantity::{Format, Quantity};

/// Which local storage limit a pod went over, by the name the kubelet's `evictions` metric
/// gives it (`signalEmptyDirFsLimit`, `signalEphemeralPodFsLimit`,
/// `signalEphemeralContainerFsLimit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StorageLimit {
    EmptyDir,
    Pod,
    Container,
}

impl StorageLimit {
    pub const ALL: [StorageLimit; 3] = [
        StorageLimit::EmptyDir,
        StorageLimit::Pod,
        StorageLimit::Container,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            StorageLimit::EmptyDir => "emptydirfs.limit",
            StorageLimit::Pod => "ephemeralpodfs.limit",
            StorageLimit::Container => "ephemeralcontainerfs.limit",
        }
    }
}

impl fmt::Display for StorageLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A limit a pod is over, with the kubelet's message.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitExceeded {
    pub limit: StorageLimit,
    /// The limit, as the message prints it.
    pub limit_quantity: Quantity,
    /// What the pod (volume, container) uses, bytes.
    pub used: Quantity,
    /// `emptyDirMessageFmt`, `podEphemeralStorageMessageFmt` or
    /// `containerEphemeralStorageMessageFmt`.
    pub message: String,
}

/// The first local storage limit `pod` is over, in the kubelet's order, or `None`.
/// `has_imagefs`: writable layers live on a dedicated imagefs, so a container's own limit
/// counts only its logs.
pub fn limit_exceeded(pod: &PodInfo, has_imagefs: bool) -> Option<LimitExceeded> {
    let usage = pod.usage.as_ref()?;
    for volume in &pod.empty_dirs {
        let (Some(limit), Some(&used)) = (volume.size_limit, usage.volumes.get(&volume.name))
        else {
            continue;
        };
        let used = bytes(used);
        if limit.nanos() > 0 && used.cmp_value(&limit).is_gt() {
            return Some(LimitExceeded {
                limit: StorageLimit::EmptyDir,
                limit_quantity: limit,
                used,
                message: format!(
                    "Usage of EmptyDir volume {:?} exceeds the limit {:?}. ",
                    volume.name,
                    limit.to_string()
                ),
            });
        }
    }
    if let Some(limit) = pod_ephemeral_storage_limit(pod) {
        let used = bytes(usage.ephemeral_storage_bytes.unwrap_or(0));
        if used.cmp_value(&limit).is_gt() {
            return Some(LimitExceeded {
                limit: StorageLimit::Pod,
                limit_quantity: limit,
                used,
                message: format!(
                    "Pod ephemeral local storage usage exceeds the total limit of containers {limit}. "
                ),
            });
        }
    }
    for container in &pod.containers {
        let (Some(limit), Some(usage)) = (container.limits.ephemeral_storage, &container.usage)
        else {
            continue;
        };
        if limit.value() == 0 {
            continue;
        }
        let mut used = usage.logs_bytes.unwrap_or(0);
        if !has_imagefs {
            used = used.saturating_add(usage.rootfs_bytes.unwrap_or(0));
        }
        let used = bytes(used);
        if used.cmp_value(&limit).is_gt() {
            return Some(LimitExceeded {
                limit: StorageLimit::Container,
                limit_quantity: limit,
                used,
                message: format!(
                    "Container {} exceeded its local ephemeral storage limit {:?}. ",
                    container.name,
                    limit.to_string()
                ),
            });
        }
    }
    None
}

fn bytes(n: u64) -> Quantity {
    Quantity::from_int(i64::try_from(n).unwrap_or(i64::MAX), Format::BinarySi)
}

/// The pod's `ephemeral-storage` limit as the kubelet's `PodLimits` aggregates it: the
/// containers' limits summed with the sidecars' (`restartPolicy: Always` init containers),
/// raised to the largest init container's (plus the sidecars started before it), and the
/// overhead added to a non-zero total. Pod-level resources are cpu and memory only, so they
/// leave it alone. `None` when no container names the resource in its limits.
pub fn pod_ephemeral_storage_limit(pod: &PodInfo) -> Option<Quantity> {
    let limit = |r: &Resources| r.ephemeral_storage;
    let mut sum: Option<Quantity> = None;
    for c in &pod.containers {
        sum = add(sum, limit(&c.limits));
    }
    let mut sidecars: Option<Quantity> = None;
    let mut init_peak: Option<Quantity> = None;
    for c in &pod.init_containers {
        let own = limit(&c.limits);
        let while_it_runs = if c.restartable {
            sum = add(sum, own);
            sidecars = add(sidecars, own);
            sidecars
        } else {
            add(own, sidecars)
        };
        init_peak = max(init_peak, while_it_runs);
    }
    let total = max(sum, init_peak)?;
    if total.is_zero() {
        return Some(total);
    }
    Some(add(Some(total), pod.overhead.ephemeral_storage).unwrap_or(total))
}

/// `addResourceList`: absent plus a value is that value; the sum keeps the first one's format.
fn add(a: Option<Quantity>, b: Option<Quantity>) -> Option<Quantity> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.saturating_add(&b)),
        (a, b) => a.or(b),
    }
}

/// `maxResourceList`: the larger (the first on a tie), absent counting as nothing.
fn max(a: Option<Quantity>, b: Option<Quantity>) -> Option<Quantity> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b.cmp_value(&a).is_gt() { b } else { a }),
        (a, b) => a.or(b),
    }
}

impl FromStr for StorageLimit {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        StorageLimit::ALL
            .into_iter()
            .find(|l| l.as_str() == s)
            .ok_or_else(|| format!("unknown local storage limit {s:?}"))
    }
}

#[cfg(test)]
#[path = "local_storage_tests.rs"]
mod tests;
