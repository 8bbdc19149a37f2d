//! cgroup filesystem helpers: where the hierarchies are mounted, which holds which controller,
//! the files the agent reads on each, and which pod a cgroup id belongs to.
//!
//! - [`hierarchy`]: memory and pids controllers → v1 or v2 mount ([`hierarchy::detect`]).
//! - [`paths`]: per-version file names and parsers (usage, limit, working set, pids).
//! - [`kubepods`]: cgroup path → pod UID, QoS class, container id (both kubelet drivers).
//! - [`index`]: cgroup id → path and pod for one hierarchy, rescanned as cgroups come and go.
//!
//! Nothing here talks to the kernel programs: the kernel feed (`crate::kernel`) tracks cgroups
//! for them and attributes their events.

pub mod hierarchy;
pub mod index;
pub mod kubepods;
mod mounts;
pub mod paths;

pub use hierarchy::{detect, CgroupVersion, Hierarchy, HierarchyError, HostMode, Layout};
pub use index::{CgroupEntry, CgroupIndex, Changes, IndexError, RescanSchedule};
pub use kubepods::{kubepods_dir, PodCgroup, PodScope, QosClass};
pub use mounts::{cgroup2_mount, parse_cgroup2_mount, MountError};

use std::{io, os::unix::fs::MetadataExt as _, path::Path};

/// The id the kernel gives a cgroup directory (`bpf_get_current_cgroup_id()` on v2, the memcg
/// tracepoints' `id` on the memory controller's hierarchy): the inode number of the directory
/// in cgroupfs (kernfs node id).
pub fn cgroup_id(dir: &Path) -> io::Result<u64> {
    Ok(std::fs::metadata(dir)?.ino())
}
