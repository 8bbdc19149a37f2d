//! Pod ranking for eviction, as the kubelet's `rankMemoryPressure`, `rankPIDPressure` and
//! `rankDiskPressureFunc`. The first pod in the returned order is evicted first. The sort is
//! stable, so pods that compare equal keep their input order.

use std::cmp::Reverse;

use crate::pod::{FsUsage, PodInfo};
use crate::quantity::NANOS;
use crate::signal::{Resource, Signal};

/// Indices into `pods`, in the order the kubelet would evict them for `signal`.
pub fn rank(pods: &[PodInfo], signal: Signal, has_imagefs: bool) -> Vec<usize> {
    let mut order: Vec<usize> = (0..pods.len()).collect();
    match signal.resource() {
        Resource::Memory => order.sort_by_key(|&i| memory_key(&pods[i])),
        Resource::Pids => order.sort_by_key(|&i| pid_key(&pods[i])),
        Resource::EphemeralStorage | Resource::Inodes => {
            order.sort_by_key(|&i| disk_key(&pods[i], signal, has_imagefs))
        }
    }
    order
}

/// `orderedBy(exceedMemoryRequests, priority, memory)`: pods without stats first, then pods
/// using more than they request, then lower priority, then more usage above request.
fn memory_key(pod: &PodInfo) -> (bool, bool, i32, Reverse<i128>) {
    match &pod.usage {
        None => (false, false, pod.priority, Reverse(0)),
        Some(usage) => {
            let above_request = (i128::from(usage.memory_working_set_bytes) * NANOS)
                .saturating_sub(pod.request_nanos(Resource::Memory));
            (
                true,
                above_request <= 0,
                pod.priority,
                Reverse(above_request),
            )
        }
    }
}

/// `orderedBy(priority, process)`: lower priority first, then (pods without stats first) more
/// processes first.
fn pid_key(pod: &PodInfo) -> (i32, bool, Reverse<u64>) {
    match &pod.usage {
        None => (pod.priority, false, Reverse(0)),
        Some(usage) => (pod.priority, true, Reverse(usage.processes)),
    }
}

/// `orderedBy(exceedDiskRequests, priority, disk)`. As in the kubelet, "exceeds" compares the
/// measured amount with the pod's request for the same resource (pods never request inodes,
/// so any inode use exceeds), while the final comparison subtracts the ephemeral-storage
/// request in both cases.
fn disk_key(pod: &PodInfo, signal: Signal, has_imagefs: bool) -> (bool, bool, i32, Reverse<i128>) {
    let Some(usage) = &pod.usage else {
        return (false, false, pod.priority, Reverse(0));
    };
    let fs: FsUsage = match signal {
        Signal::ImageFsAvailable
        | Signal::ImageFsInodesFree
        | Signal::ContainerFsAvailable
        | Signal::ContainerFsInodesFree
            if has_imagefs =>
        {
            usage.imagefs
        }
        _ => usage.nodefs,
    };
    let (measured, own_request) = match signal.resource() {
        Resource::Inodes => (fs.inodes, 0),
        _ => (fs.bytes, pod.request_nanos(Resource::EphemeralStorage)),
    };
    let measured = i128::from(measured) * NANOS;
    let exceeds = measured > own_request;
    let above_request = measured.saturating_sub(pod.request_nanos(Resource::EphemeralStorage));
    (true, !exceeds, pod.priority, Reverse(above_request))
}
