//! cgroup filesystem helpers: where the hierarchies are mounted and how cgroups are identified.

mod mounts;

pub use mounts::{cgroup2_mount, parse_cgroup2_mount, MountError};

use std::{io, os::unix::fs::MetadataExt as _, path::Path};

/// The id the kernel gives a cgroup v2 directory (`bpf_get_current_cgroup_id()`, the memcg
/// tracepoints' `id`): the inode number of the directory in cgroupfs (kernfs node id).
pub fn cgroup_id(dir: &Path) -> io::Result<u64> {
    Ok(std::fs::metadata(dir)?.ino())
}
