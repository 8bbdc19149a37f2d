//! Reading the node's signals as the kubelet computes them: `memory.available` = capacity −
//! working set of the node's cgroup (usage − inactive_file), `allocatableMemory.available` =
//! allocatable − working set of the kubepods cgroup (allocatable from the config or the Node),
//! `nodefs.*`/`imagefs.*` from
//! statvfs, `pid.available` = min(pid_max, threads-max) − live tasks (sysinfo's `procs`).
//! Readings are taken at the moment of each evaluation, never cached.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use node_agent_policy::{NodeCapacity, Observation, Observations, Signal};

use super::allocatable::Allocatable;
use crate::cgroup::{paths, CgroupVersion, Hierarchy};

#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    #[error("reading {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {problem}")]
    Malformed { path: PathBuf, problem: String },
    #[error("reading the node cgroup")]
    Cgroup(#[source] paths::ReadError),
    #[error(transparent)]
    Sys(#[from] crate::sys::SysError),
}

/// Where the figures of some signals come from. One source failing never blinds the others:
/// its signals are unknown for that evaluation (they meet no threshold) and the rest go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Source {
    /// `/proc/meminfo` and the node cgroup: `memory.available`.
    Memory,
    /// The kubepods cgroup against allocatable memory (from the config or the Node):
    /// `allocatableMemory.available`.
    Allocatable,
    /// statvfs of `nodefs_path`: `nodefs.available`, `nodefs.inodesFree`.
    NodeFs,
    /// statvfs of `imagefs_path`: `imagefs.available`, `imagefs.inodesFree`.
    ImageFs,
    /// `pid_max`, `threads-max` and sysinfo: `pid.available`.
    Pids,
}

impl Source {
    pub const ALL: [Source; 5] = [
        Source::Memory,
        Source::Allocatable,
        Source::NodeFs,
        Source::ImageFs,
        Source::Pids,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Source::Memory => "memory",
            Source::Allocatable => "allocatable",
            Source::NodeFs => "nodefs",
            Source::ImageFs => "imagefs",
            Source::Pids => "pids",
        }
    }

    pub fn signals(self) -> &'static [Signal] {
        match self {
            Source::Memory => &[Signal::MemoryAvailable],
            Source::Allocatable => &[Signal::AllocatableMemoryAvailable],
            Source::NodeFs => &[Signal::NodeFsAvailable, Signal::NodeFsInodesFree],
            Source::ImageFs => &[Signal::ImageFsAvailable, Signal::ImageFsInodesFree],
            Source::Pids => &[Signal::PidAvailable],
        }
    }
}

/// One reading of the node: what could be read, and why the rest could not.
#[derive(Debug, Clone)]
pub struct NodeReading {
    pub observations: Observations,
    pub capacity: NodeCapacity,
    /// Sources that could not be read this time, with the error.
    pub failed: BTreeMap<Source, String>,
}

/// Where the node's figures come from.
#[derive(Debug, Clone)]
pub struct NodeSources {
    pub memory: Hierarchy,
    /// The node cgroup's directory in the memory hierarchy.
    pub node_dir: PathBuf,
    pub is_root: bool,
    pub memory_capacity: Option<i64>,
    /// What `allocatableMemory.available` is measured against, on the kubepods cgroup below
    /// `node_dir`: `allocatableMemory`, else the Node's own figure.
    pub allocatable: Allocatable,
    pub nodefs: PathBuf,
    pub imagefs: Option<PathBuf>,
}

impl NodeSources {
    /// Whether images and writable layers have a filesystem of their own, as [`read_node`]
    /// decides it (without reading the rest).
    pub fn has_imagefs(&self) -> bool {
        self.imagefs
            .as_ref()
            .is_some_and(|imagefs| !same_device(&self.nodefs, imagefs))
    }
}

fn chain(e: &dyn std::error::Error) -> String {
    std::iter::successors(Some(e), |e| e.source())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}

/// Reads every source; each one's failure is kept apart.
pub fn read_node(src: &NodeSources) -> NodeReading {
    let mut reading = NodeReading {
        observations: Observations::new(),
        capacity: NodeCapacity::default(),
        failed: BTreeMap::new(),
    };
    let mut failed = BTreeMap::new();
    if let Err(e) = read_memory_source(src, &mut reading) {
        failed.insert(Source::Memory, chain(&e));
    }
    match &src.allocatable {
        Allocatable::NotObserved => {}
        Allocatable::Bytes(allocatable) => {
            if let Err(e) = read_allocatable(src, *allocatable, &mut reading) {
                failed.insert(Source::Allocatable, chain(&e));
            }
        }
        Allocatable::Unknown(why) => {
            failed.insert(Source::Allocatable, why.clone());
        }
    }
    if let Err(e) = read_fs(&src.nodefs, Source::NodeFs, &mut reading) {
        failed.insert(Source::NodeFs, chain(&e));
    }
    if let Some(imagefs) = &src.imagefs {
        match read_fs(imagefs, Source::ImageFs, &mut reading) {
            // Dedicated only when on another filesystem than nodefs, as the kubelet decides
            // (`HasDedicatedImageFs` compares the devices): the same filesystem gives the same
            // figures under both names, and ranking counts pod usage as on a single disk.
            Ok(()) => reading.capacity.has_imagefs = !same_device(&src.nodefs, imagefs),
            Err(e) => {
                // Still a dedicated imagefs: its signals are unknown, not nodefs'.
                reading.capacity.has_imagefs = true;
                failed.insert(Source::ImageFs, chain(&e));
            }
        }
    }
    if let Err(e) = read_pids(&mut reading) {
        failed.insert(Source::Pids, chain(&e));
    }
    reading.failed = failed;
    reading
}

fn read_memory_source(src: &NodeSources, reading: &mut NodeReading) -> Result<(), ObserveError> {
    let meminfo_path = Path::new("/proc/meminfo");
    let meminfo = std::fs::read_to_string(meminfo_path).map_err(|source| ObserveError::Io {
        path: meminfo_path.into(),
        source,
    })?;
    let mem = parse_meminfo(&meminfo).map_err(|problem| ObserveError::Malformed {
        path: meminfo_path.into(),
        problem,
    })?;
    let capacity_bytes = src
        .memory_capacity
        .unwrap_or_else(|| i64::try_from(mem.total).unwrap_or(i64::MAX));
    // The v2 root has no memory.current: there the machine's figures stand in, as cAdvisor does.
    let working_set = if src.is_root && src.memory.version() == CgroupVersion::V2 {
        mem.total
            .saturating_sub(mem.free)
            .saturating_sub(mem.inactive_file)
    } else {
        paths::read_memory(&src.node_dir, src.memory.version())
            .map_err(ObserveError::Cgroup)?
            .working_set()
    };
    reading.observations.insert(
        Signal::MemoryAvailable,
        Observation {
            available: capacity_bytes
                .saturating_sub(i64::try_from(working_set).unwrap_or(i64::MAX)),
            capacity: capacity_bytes,
        },
    );
    reading.capacity.memory_bytes = Some(capacity_bytes);
    Ok(())
}

/// The kubelet's pods cgroup below the node cgroup (`kubepods` with the cgroupfs driver,
/// `kubepods.slice` with systemd's), if there is one.
pub fn kubepods_dir(node_dir: &Path) -> Option<PathBuf> {
    ["kubepods", "kubepods.slice"]
        .iter()
        .map(|k| node_dir.join(k))
        .find(|d| d.is_dir())
}

fn read_allocatable(
    src: &NodeSources,
    allocatable: i64,
    reading: &mut NodeReading,
) -> Result<(), ObserveError> {
    let dir = kubepods_dir(&src.node_dir).ok_or_else(|| ObserveError::Malformed {
        path: src.node_dir.clone(),
        problem: "no kubepods or kubepods.slice cgroup below it: allocatableMemory.available \
                  needs the kubelet's pods cgroup"
            .into(),
    })?;
    let working_set = paths::read_memory(&dir, src.memory.version())
        .map_err(ObserveError::Cgroup)?
        .working_set();
    reading.observations.insert(
        Signal::AllocatableMemoryAvailable,
        Observation {
            available: allocatable.saturating_sub(i64::try_from(working_set).unwrap_or(i64::MAX)),
            capacity: allocatable,
        },
    );
    Ok(())
}

fn read_fs(path: &Path, source: Source, reading: &mut NodeReading) -> Result<(), ObserveError> {
    let fs = statvfs(path)?;
    let (bytes, inodes) = match source {
        Source::ImageFs => (Signal::ImageFsAvailable, Signal::ImageFsInodesFree),
        _ => (Signal::NodeFsAvailable, Signal::NodeFsInodesFree),
    };
    reading.observations.insert(
        bytes,
        Observation {
            available: fs.avail_bytes,
            capacity: fs.total_bytes,
        },
    );
    reading.observations.insert(
        inodes,
        Observation {
            available: fs.avail_inodes,
            capacity: fs.total_inodes,
        },
    );
    if source == Source::NodeFs {
        reading.capacity.ephemeral_storage_bytes = Some(fs.total_bytes);
        reading.capacity.inodes = Some(fs.total_inodes);
    }
    Ok(())
}

/// Whether both paths are on one filesystem (unknown counts as not).
fn same_device(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev(),
        _ => false,
    }
}

fn read_pids(reading: &mut NodeReading) -> Result<(), ObserveError> {
    let (limit, live) = pids()?;
    reading.observations.insert(
        Signal::PidAvailable,
        Observation {
            available: limit - live,
            capacity: limit,
        },
    );
    reading.capacity.pids = Some(limit);
    Ok(())
}

/// The fields of /proc/meminfo the agent uses, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemInfo {
    pub total: u64,
    pub free: u64,
    pub inactive_file: u64,
}

pub fn parse_meminfo(text: &str) -> Result<MemInfo, String> {
    let field = |name: &str| -> Result<u64, String> {
        let line = text
            .lines()
            .find(|l| l.split(':').next() == Some(name))
            .ok_or_else(|| format!("no {name} line"))?;
        let value = line.split(':').nth(1).unwrap_or("").trim();
        let kib = value
            .strip_suffix("kB")
            .map(str::trim)
            .ok_or_else(|| format!("{name}: expected \"<n> kB\", found {value:?}"))?;
        kib.parse::<u64>()
            .map(|k| k.saturating_mul(1024))
            .map_err(|_| format!("{name}: expected \"<n> kB\", found {value:?}"))
    };
    Ok(MemInfo {
        total: field("MemTotal")?,
        free: field("MemFree")?,
        inactive_file: field("Inactive(file)")?,
    })
}

struct FsStats {
    avail_bytes: i64,
    total_bytes: i64,
    avail_inodes: i64,
    total_inodes: i64,
}

fn statvfs(path: &Path) -> Result<FsStats, ObserveError> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        ObserveError::Malformed {
            path: path.into(),
            problem: "path contains a NUL byte".into(),
        }
    })?;
    // SAFETY: statvfs writes only into `st`; `c` is a valid NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(ObserveError::Io {
            path: path.into(),
            source: std::io::Error::last_os_error(),
        });
    }
    let frsize = st.f_frsize as i64;
    Ok(FsStats {
        avail_bytes: (st.f_bavail as i64).saturating_mul(frsize),
        total_bytes: (st.f_blocks as i64).saturating_mul(frsize),
        avail_inodes: st.f_favail as i64,
        total_inodes: st.f_files as i64,
    })
}

/// (min(pid_max, threads-max), live tasks) — the kubelet's PID figures.
fn pids() -> Result<(i64, i64), ObserveError> {
    let limit = crate::sys::pid_limit().map_err(ObserveError::Sys)?;
    // SAFETY: sysinfo writes only into `info`.
    let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
    if unsafe { libc::sysinfo(&mut info) } != 0 {
        return Err(ObserveError::Io {
            path: "sysinfo(2)".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok((limit, i64::from(info.procs)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_meminfo_or_names_the_bad_field() {
        let good = "MemTotal:       24684084 kB\nMemFree:        1000 kB\nInactive(file):   4 kB\n";
        assert_eq!(
            parse_meminfo(good),
            Ok(MemInfo {
                total: 24684084 * 1024,
                free: 1000 * 1024,
                inactive_file: 4096
            })
        );
        for (text, needle) in [
            ("MemFree: 1 kB\nInactive(file): 1 kB\n", "no MemTotal"),
            (
                "MemTotal: lots\nMemFree: 1 kB\nInactive(file): 1 kB\n",
                "MemTotal: expected",
            ),
            (
                "MemTotal: 1 MB\nMemFree: 1 kB\nInactive(file): 1 kB\n",
                "MemTotal: expected",
            ),
        ] {
            assert!(parse_meminfo(text).unwrap_err().contains(needle), "{text}");
        }
    }

    #[test]
    fn reads_this_machine() {
        let layout = crate::cgroup::detect().expect("cgroups");
        let src = NodeSources {
            node_dir: layout.memory.mount().to_path_buf(),
            memory: layout.memory.clone(),
            is_root: true,
            memory_capacity: None,
            allocatable: Allocatable::NotObserved,
            nodefs: PathBuf::from("/"),
            imagefs: None,
        };
        let r = read_node(&src);
        assert!(r.failed.is_empty(), "{:?}", r.failed);
        let mem = r.observations[&Signal::MemoryAvailable];
        assert!(mem.capacity > 0 && mem.available <= mem.capacity);
        let pid = r.observations[&Signal::PidAvailable];
        assert!(pid.available > 0 && pid.available < pid.capacity);
        assert!(r.observations.contains_key(&Signal::NodeFsAvailable));
    }

    #[test]
    fn an_imagefs_on_the_nodefs_filesystem_is_read_but_not_dedicated() {
        let layout = crate::cgroup::detect().expect("cgroups");
        // "/" against itself is one filesystem; /proc is always another.
        let rows = [
            ("the same filesystem", "/", false),
            ("another filesystem", "/proc", true),
        ];
        for (what, imagefs, dedicated) in rows {
            let src = NodeSources {
                node_dir: layout.memory.mount().to_path_buf(),
                memory: layout.memory.clone(),
                is_root: true,
                memory_capacity: None,
                allocatable: Allocatable::NotObserved,
                nodefs: PathBuf::from("/"),
                imagefs: Some(PathBuf::from(imagefs)),
            };
            let r = read_node(&src);
            assert_eq!(r.capacity.has_imagefs, dedicated, "{what}");
            assert!(r.failed.is_empty(), "{what}: {:?}", r.failed);
            assert!(
                r.observations.contains_key(&Signal::ImageFsAvailable),
                "{what}: still observed"
            );
        }
    }

    #[test]
    fn an_unreadable_source_leaves_the_others_read() {
        let layout = crate::cgroup::detect().expect("cgroups");
        let src = NodeSources {
            node_dir: layout.memory.mount().to_path_buf(),
            memory: layout.memory.clone(),
            is_root: true,
            memory_capacity: None,
            allocatable: Allocatable::NotObserved,
            nodefs: PathBuf::from("/"),
            imagefs: Some(PathBuf::from("/nonexistent/imagefs")),
        };
        let r = read_node(&src);
        assert_eq!(
            r.failed.keys().copied().collect::<Vec<_>>(),
            [Source::ImageFs]
        );
        assert!(
            r.failed[&Source::ImageFs].contains("/nonexistent/imagefs"),
            "{:?}",
            r.failed
        );
        for signal in [
            Signal::MemoryAvailable,
            Signal::PidAvailable,
            Signal::NodeFsAvailable,
        ] {
            assert!(r.observations.contains_key(&signal), "{signal} still read");
        }
        assert!(
            !r.observations.contains_key(&Signal::ImageFsAvailable),
            "unknown, not made up"
        );
        assert!(
            r.capacity.has_imagefs,
            "still ranked as a node with an imagefs"
        );

        let broken = NodeSources {
            node_dir: PathBuf::from("/nonexistent/cgroup"),
            is_root: false,
            imagefs: None,
            ..src
        };
        let r = read_node(&broken);
        assert_eq!(
            r.failed.keys().copied().collect::<Vec<_>>(),
            [Source::Memory]
        );
        assert!(
            r.observations.contains_key(&Signal::PidAvailable),
            "PID decisions go on"
        );
    }
}

#[cfg(test)]
mod allocatable_tests {
    use super::*;
    use crate::cgroup::CgroupVersion;

    /// A node cgroup with a kubepods child whose v1 memory files say `usage` and
    /// `inactive_file` (the machine's memory hierarchy is only used for its version).
    fn node_with_kubepods(usage: u64, inactive_file: u64) -> (tempfile::TempDir, NodeSources) {
        let dir = tempfile::tempdir().unwrap();
        let layout = crate::cgroup::detect().expect("cgroups");
        let pods = dir.path().join("kubepods");
        std::fs::create_dir(&pods).unwrap();
        let version = layout.memory.version();
        let files = paths::MemoryFiles::of(version);
        let no_limit = match version {
            CgroupVersion::V1 => "9223372036854771712",
            CgroupVersion::V2 => "max",
        };
        for (file, content) in [
            (files.usage, usage.to_string()),
            (files.limit, no_limit.to_string()),
            (
                files.stat,
                format!("anon 0\n{} {inactive_file}\n", files.inactive_file_key),
            ),
        ] {
            std::fs::write(pods.join(file), content + "\n").unwrap();
        }
        let src = NodeSources {
            node_dir: dir.path().to_path_buf(),
            memory: layout.memory.clone(),
            is_root: false,
            memory_capacity: None,
            allocatable: Allocatable::Bytes(1 << 30),
            nodefs: PathBuf::from("/"),
            imagefs: None,
        };
        (dir, src)
    }

    #[test]
    fn allocatable_memory_available_is_allocatable_minus_the_pods_working_set() {
        let (_dir, src) = node_with_kubepods(700 << 20, 100 << 20);
        let mut reading = NodeReading {
            observations: Observations::new(),
            capacity: NodeCapacity::default(),
            failed: BTreeMap::new(),
        };
        read_allocatable(&src, 1 << 30, &mut reading).unwrap();
        assert_eq!(
            reading.observations[&Signal::AllocatableMemoryAvailable],
            Observation {
                available: (1 << 30) - (600 << 20),
                capacity: 1 << 30
            }
        );
    }

    #[test]
    fn without_a_kubepods_cgroup_only_that_signal_is_unknown() {
        let (dir, src) = node_with_kubepods(0, 0);
        std::fs::remove_dir_all(dir.path().join("kubepods")).unwrap();
        let r = read_node(&src);
        assert!(
            r.failed[&Source::Allocatable].contains("no kubepods"),
            "{:?}",
            r.failed
        );
        assert!(!r
            .observations
            .contains_key(&Signal::AllocatableMemoryAvailable));
        assert!(r.observations.contains_key(&Signal::PidAvailable));
    }

    #[test]
    fn an_unknown_allocatable_marks_only_that_signal_unknown_with_the_reason() {
        let (_dir, src) = node_with_kubepods(100 << 20, 0);
        let why = "node n1: status.allocatable.memory is absent";
        let src = NodeSources {
            allocatable: Allocatable::Unknown(why.into()),
            ..src
        };
        let r = read_node(&src);
        assert_eq!(
            r.failed.get(&Source::Allocatable).map(String::as_str),
            Some(why)
        );
        assert!(
            !r.observations
                .contains_key(&Signal::AllocatableMemoryAvailable),
            "unknown, neither 0 nor made up"
        );
        assert!(r.observations.contains_key(&Signal::PidAvailable));
        let not_observed = read_node(&NodeSources {
            allocatable: Allocatable::NotObserved,
            ..src
        });
        assert!(!not_observed.failed.contains_key(&Source::Allocatable));
        assert!(!not_observed
            .observations
            .contains_key(&Signal::AllocatableMemoryAvailable));
    }
}
