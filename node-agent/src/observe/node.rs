//! The node, read as the kubelet reads it: `memory.available` = capacity − working set of the
//! node's cgroup (usage − inactive_file), `allocatableMemory.available` = allocatable − working
//! set of the kubepods cgroup (allocatable from the config, else the kubepods cgroup's own
//! memory limit as the kubelet takes it, else the Node's figure), `nodefs.*`/`imagefs.*`
//! from `statvfs` off the loop ([`super::probe`]), `pid.available` = min(pid_max, threads-max)
//! (capped by the kubelet's figure: [`super::pid_limit`]) − live tasks (`/proc/loadavg`'s, as
//! the kubelet counts them). Readings are taken at the moment of each evaluation.
//!
//! [`NodeLayout`] holds the facts decided once about where things are: the memory hierarchy,
//! the node cgroup and whether it is the hierarchy's root, the kubelet's pods cgroup below it.
//! [`Filesystems`] decides the filesystem layout the way the kubelet does (`hasImageFs`: the
//! runtime's image filesystem on another device than the kubelet's root; split: the
//! container filesystem on another device than the image filesystem), from the runtime's
//! `ImageFsInfo` or a configured override, and every reading carries that one [`FsLayout`] to
//! observation, ranking, reclaim and the trace.

use std::{
    cell::Cell,
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use node_agent_cri::reclaim::FsLayout;
use node_agent_policy::{NodeCapacity, Observation, Observations, Signal};

use crate::cgroup::{kubepods_dir, paths, CgroupVersion, Hierarchy};
use crate::{
    observe::allocatable::{Allocatable, AllocatableFeed},
    observe::fs_probe::{FsProbe, FsStats, ProbeError},
    observe::pid_limit::PidLimit,
};

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
    #[error(transparent)]
    Fs(#[from] ProbeError),
    /// The Node's figure is needed (the pods cgroup has no memory limit) and unknown: why.
    #[error("{0}")]
    NodeUnknown(String),
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
    /// statvfs of the kubelet's root: `nodefs.available`, `nodefs.inodesFree`.
    NodeFs,
    /// statvfs of the runtime's image filesystem: `imagefs.available`, `imagefs.inodesFree`.
    ImageFs,
    /// `pid_max`, `threads-max` (or the kubelet's figure) and `/proc/loadavg`: `pid.available`.
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
    /// Where images and writable layers live relative to `nodefs`, as decided at this reading.
    pub fs_layout: FsLayout,
}

impl NodeReading {
    /// The node's capacity per signal read this time (what a percentage resolves against).
    pub fn capacities(&self) -> BTreeMap<Signal, i64> {
        self.observations
            .iter()
            .map(|(s, o)| (*s, o.capacity))
            .collect()
    }
}

/// Facts about where the node's figures live, decided once at start.
#[derive(Debug, Clone)]
pub struct NodeLayout {
    pub memory: Hierarchy,
    /// The node cgroup's directory in the memory hierarchy.
    pub node_dir: PathBuf,
    /// The node cgroup is the hierarchy's root (the whole machine).
    pub is_root: bool,
    /// Where the kubelet puts its pods cgroup: its `cgroupRoot` (kind's `/kubelet`, a second
    /// kubelet's own directory) when its config file says one below the node cgroup, else the
    /// node cgroup itself (`/`, kubeadm's).
    pub pods_parent: PathBuf,
}

impl NodeLayout {
    pub fn new(memory: Hierarchy, node_dir: PathBuf) -> Self {
        Self {
            is_root: node_dir == memory.mount(),
            memory,
            pods_parent: node_dir.clone(),
            node_dir,
        }
    }

    /// With the kubelet's `cgroupRoot` (absolute in the hierarchy, as in its config file):
    /// its pods cgroup is looked for below it. A root outside the node cgroup is not this
    /// node's and is ignored (returned as the error, for the log).
    pub fn with_kubelet_root(mut self, cgroup_root: &str) -> Result<Self, PathBuf> {
        let dir = self
            .memory
            .mount()
            .join(cgroup_root.trim_start_matches('/'));
        if !dir.starts_with(&self.node_dir) {
            return Err(dir);
        }
        self.pods_parent = dir;
        Ok(self)
    }

    /// The kubelet's pods cgroup below the node cgroup, if there is one now.
    pub fn kubepods(&self) -> Option<PathBuf> {
        kubepods_dir(&self.pods_parent)
    }

    pub fn version(&self) -> CgroupVersion {
        self.memory.version()
    }
}

/// Where the runtime keeps images, as far as the agent knows.
#[derive(Debug)]
enum ImageFs {
    /// Not observed: standalone without `imagefsPath`, or the runtime not asked yet.
    NotObserved,
    /// Observed at a path the config gives (it wins over the runtime's word).
    Configured(FsProbe),
    /// The runtime's `ImageFsInfo`: its image filesystem, and its container filesystem when it
    /// names another directory.
    Runtime {
        image: FsProbe,
        container: Option<FsProbe>,
    },
    /// Expected but not known: why (the runtime unreachable, a path it names not mounted).
    Unknown(String),
}

/// The node's filesystems and how they are laid out.
#[derive(Debug)]
pub struct Filesystems {
    nodefs: FsProbe,
    imagefs: ImageFs,
}

impl Filesystems {
    /// `nodefs`, the kubelet's root; `imagefs`, a configured override.
    pub fn new(nodefs: &Path, imagefs: Option<&Path>) -> std::io::Result<Self> {
        Ok(Self {
            nodefs: FsProbe::new(nodefs)?,
            imagefs: match imagefs {
                Some(p) => ImageFs::Configured(FsProbe::new(p)?),
                None => ImageFs::NotObserved,
            },
        })
    }

    pub fn nodefs(&self) -> &Path {
        self.nodefs.path()
    }

    /// The runtime's `ImageFsInfo` (image and container filesystems' directories), unless the
    /// config names the image filesystem itself. Returns whether anything changed.
    pub fn runtime_says(&mut self, image: Option<&str>, container: Option<&str>) -> bool {
        if matches!(self.imagefs, ImageFs::Configured(_)) {
            return false;
        }
        let Some(image) = image else {
            return self.set_unknown(
                "the container runtime's ImageFsInfo names no image filesystem".into(),
            );
        };
        let same = |probe: &FsProbe, path: &str| probe.path() == Path::new(path);
        if let ImageFs::Runtime {
            image: i,
            container: c,
        } = &self.imagefs
        {
            let container_same = match (c, container.filter(|c| *c != image)) {
                (None, None) => true,
                (Some(p), Some(path)) => same(p, path),
                _ => false,
            };
            if same(i, image) && container_same {
                return false;
            }
        }
        let probe = |path: &str| FsProbe::new(Path::new(path));
        self.imagefs = match (probe(image), container.filter(|c| *c != image).map(probe)) {
            (Ok(image), None) => ImageFs::Runtime {
                image,
                container: None,
            },
            (Ok(image), Some(Ok(container))) => ImageFs::Runtime {
                image,
                container: Some(container),
            },
            (Err(e), _) | (_, Some(Err(e))) => {
                ImageFs::Unknown(format!("starting a filesystem probe: {e}"))
            }
        };
        true
    }

    /// The runtime could not be asked: the image filesystem is unknown (unless configured).
    pub fn runtime_unavailable(&mut self, why: String) -> bool {
        if matches!(self.imagefs, ImageFs::Configured(_)) {
            return false;
        }
        self.set_unknown(format!(
            "the container runtime did not say where images live: {why}"
        ))
    }

    fn set_unknown(&mut self, why: String) -> bool {
        if matches!(&self.imagefs, ImageFs::Unknown(w) if *w == why) {
            return false;
        }
        self.imagefs = ImageFs::Unknown(why);
        true
    }

    /// Reads both filesystems into `reading` and decides their layout from the devices.
    fn read(&self, reading: &mut NodeReading) {
        let nodefs = self.nodefs.read();
        match &nodefs {
            Ok(fs) => {
                observe_fs(fs, Source::NodeFs, reading);
                reading.capacity.ephemeral_storage_bytes = Some(fs.total_bytes);
                reading.capacity.inodes = Some(fs.total_inodes);
            }
            Err(e) => {
                reading.failed.insert(Source::NodeFs, e.to_string());
            }
        }
        let image = match &self.imagefs {
            ImageFs::NotObserved => None,
            ImageFs::Unknown(why) => {
                reading.failed.insert(Source::ImageFs, why.clone());
                None
            }
            ImageFs::Configured(image) => Some((image.read(), None)),
            ImageFs::Runtime { image, container } => {
                Some((image.read(), container.as_ref().map(FsProbe::read)))
            }
        };
        reading.fs_layout = match image {
            None => FsLayout::Shared,
            Some((Err(e), _)) | Some((_, Some(Err(e)))) => {
                // Still a dedicated imagefs as far as ranking goes: its signals are unknown,
                // not nodefs'.
                reading.failed.insert(Source::ImageFs, e.to_string());
                FsLayout::SeparateImageFs
            }
            Some((Ok(image), container)) => {
                observe_fs(&image, Source::ImageFs, reading);
                let container = container.and_then(Result::ok);
                match &nodefs {
                    Ok(nodefs) => {
                        decide_layout(nodefs.device, image.device, container.map(|c| c.device))
                    }
                    // The devices cannot be compared: as the kubelet, rank as a dedicated
                    // imagefs only when it can tell.
                    Err(_) => FsLayout::Shared,
                }
            }
        };
        reading.capacity.has_imagefs = reading.fs_layout != FsLayout::Shared;
    }
}

/// The kubelet's `HasDedicatedImageFs` (the image filesystem's device is not the root's) and
/// `IsContainerFsSeparateFromImageFs` (the container filesystem's device is not the image
/// filesystem's), as one layout.
pub fn decide_layout(nodefs: u64, image: u64, container: Option<u64>) -> FsLayout {
    match container {
        _ if image == nodefs => FsLayout::Shared,
        Some(c) if c != image => FsLayout::SplitImageFs,
        _ => FsLayout::SeparateImageFs,
    }
}

fn observe_fs(fs: &FsStats, source: Source, reading: &mut NodeReading) {
    let (bytes, inodes) = match source {
        Source::ImageFs => (Signal::ImageFsAvailable, Signal::ImageFsInodesFree),
        _ => (Signal::NodeFsAvailable, Signal::NodeFsInodesFree),
    };
    reading.observations.insert(
        bytes,
        Observation {
            available: fs.avail_bytes,
            capacity: fs.total_bytes,
            lead: 0,
        },
    );
    reading.observations.insert(
        inodes,
        Observation {
            available: fs.avail_inodes,
            capacity: fs.total_inodes,
            lead: 0,
        },
    );
}

/// Everything a reading of the node needs.
pub struct Node {
    pub layout: NodeLayout,
    /// `memoryCapacity` from the config, else MemTotal.
    pub memory_capacity: Option<i64>,
    /// What `allocatableMemory.available` is measured against.
    pub allocatable: Allocatable,
    /// The task reading the Node's allocatable memory, while the config does not give it.
    pub allocatable_feed: AllocatableFeed,
    /// The host's and the kubelet's task limits, which cap this PID namespace's own.
    pub pid_limit: PidLimit,
    pub fs: Filesystems,
    /// The filesystem layout of the last reading.
    last_layout: Cell<FsLayout>,
    /// The memory and PID files, held open: a shortage of descriptors never blinds them.
    held: crate::sys::HeldFiles,
}

impl Node {
    pub fn new(layout: NodeLayout, memory_capacity: Option<i64>, fs: Filesystems) -> Self {
        Self {
            layout,
            memory_capacity,
            allocatable: Allocatable::NotObserved,
            allocatable_feed: AllocatableFeed::default(),
            pid_limit: PidLimit::default(),
            fs,
            last_layout: Cell::new(FsLayout::Shared),
            held: crate::sys::HeldFiles::default(),
        }
    }

    /// Takes the kubelet's task limit from the latest summary ([`PidLimit::take`]); this PID
    /// namespace's own figure is read for the log only when it changed.
    pub fn take_kubelet_pid_limit(&mut self, figure: Option<&Result<i64, String>>) -> bool {
        self.pid_limit.take(figure, || own_pid_limit(&self.held))
    }

    /// Takes the host's `pid_max` as the kernel programs last saw it ([`PidLimit::take_host`]).
    pub fn take_host_pid_max(&mut self, pid_max: Option<u32>) -> bool {
        self.pid_limit
            .take_host(pid_max, || own_pid_limit(&self.held))
    }

    /// Whether images and writable layers had a filesystem of their own at the last reading.
    pub fn has_imagefs(&self) -> bool {
        self.last_layout.get() != FsLayout::Shared
    }

    /// Reads every source; each one's failure is kept apart.
    pub fn read(&self) -> NodeReading {
        let mut reading = NodeReading {
            observations: Observations::new(),
            capacity: NodeCapacity::default(),
            failed: BTreeMap::new(),
            fs_layout: FsLayout::Shared,
        };
        if let Err(e) = read_memory_source(self, &mut reading) {
            reading
                .failed
                .insert(Source::Memory, crate::error_chain(&e));
        }
        if let Err(e) = read_allocatable(&self.layout, &self.allocatable, &self.held, &mut reading)
        {
            reading
                .failed
                .insert(Source::Allocatable, crate::error_chain(&e));
        }
        self.fs.read(&mut reading);
        self.last_layout.set(reading.fs_layout);
        if let Err(e) = read_pids(&self.held, &self.pid_limit, &mut reading) {
            reading.failed.insert(Source::Pids, crate::error_chain(&e));
        }
        reading
    }
}

/// This PID namespace's own min(pid_max, threads-max), for the log when a cap changes.
fn own_pid_limit(held: &crate::sys::HeldFiles) -> Option<i64> {
    crate::sys::pid_limit_with(&|p| held.read(p)).ok()
}

fn read_memory_source(src: &Node, reading: &mut NodeReading) -> Result<(), ObserveError> {
    let meminfo_path = Path::new("/proc/meminfo");
    let meminfo = src
        .held
        .read(meminfo_path)
        .map_err(|source| ObserveError::Io {
            path: meminfo_path.into(),
            source,
        })?;
    let mem = crate::sys::parse_meminfo(&meminfo).map_err(|problem| ObserveError::Malformed {
        path: meminfo_path.into(),
        problem,
    })?;
    let capacity_bytes = src
        .memory_capacity
        .unwrap_or_else(|| i64::try_from(mem.total).unwrap_or(i64::MAX));
    // The v2 root has no memory.current: there the machine's figures stand in, as cAdvisor does.
    let layout = &src.layout;
    let working_set = if layout.is_root && layout.version() == CgroupVersion::V2 {
        mem.total
            .saturating_sub(mem.free)
            .saturating_sub(mem.inactive_file)
    } else {
        paths::read_memory_with(&|p| src.held.read(p), &layout.node_dir, layout.version())
            .map_err(ObserveError::Cgroup)?
            .working_set()
    };
    reading.observations.insert(
        Signal::MemoryAvailable,
        Observation {
            available: capacity_bytes
                .saturating_sub(i64::try_from(working_set).unwrap_or(i64::MAX)),
            capacity: capacity_bytes,
            lead: 0,
        },
    );
    reading.capacity.memory_bytes = Some(capacity_bytes);
    Ok(())
}

/// `allocatableMemory.available`, measured against the config's figure when it gives one, else
/// against the pods cgroup's own memory limit, as the kubelet measures it (its summary's `pods`
/// container: `AvailableBytes` = limit − working set), and while that cgroup has no limit,
/// against the Node's figure: nothing observed while the Node is not read yet, and unknown
/// while its figure is.
fn read_allocatable(
    layout: &NodeLayout,
    allocatable: &Allocatable,
    held: &crate::sys::HeldFiles,
    reading: &mut NodeReading,
) -> Result<(), ObserveError> {
    if *allocatable == Allocatable::NotObserved {
        return Ok(());
    }
    let dir = layout.kubepods().ok_or_else(|| ObserveError::Malformed {
        path: layout.node_dir.clone(),
        problem: "no kubepods or kubepods.slice cgroup below it: allocatableMemory.available \
                  needs the kubelet's pods cgroup"
            .into(),
    })?;
    let memory = paths::read_memory_with(&|p| held.read(p), &dir, layout.version())
        .map_err(ObserveError::Cgroup)?;
    let allocatable = match (allocatable, memory.limit) {
        (Allocatable::Bytes(figure), _) => *figure,
        (_, paths::Limit::At(limit)) => i64::try_from(limit).unwrap_or(i64::MAX),
        (Allocatable::Node(figure), _) => *figure,
        // No limit, and the Node not read yet: nothing to measure against, for now.
        (Allocatable::NodeNotRead | Allocatable::NotObserved, _) => return Ok(()),
        (Allocatable::Unknown(why), _) => return Err(ObserveError::NodeUnknown(why.clone())),
    };
    let working_set = i64::try_from(memory.working_set()).unwrap_or(i64::MAX);
    reading.observations.insert(
        Signal::AllocatableMemoryAvailable,
        Observation {
            available: allocatable.saturating_sub(working_set),
            capacity: allocatable,
            lead: 0,
        },
    );
    Ok(())
}

fn read_pids(
    held: &crate::sys::HeldFiles,
    pid_limit: &PidLimit,
    reading: &mut NodeReading,
) -> Result<(), ObserveError> {
    let (own, live) = pids(held)?;
    let limit = pid_limit.limit(own);
    reading.observations.insert(
        Signal::PidAvailable,
        Observation {
            available: limit - live,
            capacity: limit,
            lead: 0,
        },
    );
    reading.capacity.pids = Some(limit);
    Ok(())
}

/// (min(pid_max, threads-max), live tasks) — the kubelet's PID figures, read in this PID
/// namespace. Live tasks are `/proc/loadavg`'s total (the kernel's thread count, the same in
/// every namespace), as the kubelet reads them: sysinfo's `procs` is 16 bits wide and wraps
/// past 65535 tasks (kubernetes#107107).
fn pids(held: &crate::sys::HeldFiles) -> Result<(i64, i64), ObserveError> {
    let limit = crate::sys::pid_limit_with(&|p| held.read(p)).map_err(ObserveError::Sys)?;
    let path = Path::new("/proc/loadavg");
    let text = held.read(path).map_err(|source| ObserveError::Io {
        path: path.into(),
        source,
    })?;
    let live = parse_loadavg_tasks(&text).map_err(|problem| ObserveError::Malformed {
        path: path.into(),
        problem,
    })?;
    Ok((limit, live))
}

/// The task total of `/proc/loadavg` ("0.10 0.20 0.30 2/413 9999": 413).
pub fn parse_loadavg_tasks(text: &str) -> Result<i64, String> {
    let field = text
        .split_whitespace()
        .nth(3)
        .ok_or_else(|| format!("expected five fields, found {:?}", text.trim()))?;
    field
        .split_once('/')
        .and_then(|(_, total)| total.parse::<i64>().ok())
        .filter(|total| *total > 0)
        .ok_or_else(|| format!("expected running/total tasks, found {field:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_loadavgs_task_total_or_names_the_bad_field() {
        let rows: [(&str, Result<i64, &str>); 5] = [
            ("0.10 0.20 0.30 2/413 9999\n", Ok(413)),
            ("0.00 0.00 0.00 1/70000 4194303", Ok(70000)),
            ("0.10 0.20 0.30", Err("expected five fields")),
            (
                "0.10 0.20 0.30 413 9999",
                Err("expected running/total tasks"),
            ),
            (
                "0.10 0.20 0.30 2/-4 9999",
                Err("expected running/total tasks"),
            ),
        ];
        for (text, expected) in rows {
            match (parse_loadavg_tasks(text), expected) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{text}"),
                (Err(why), Err(needle)) => assert!(why.contains(needle), "{text}: {why}"),
                (got, want) => panic!("{text}: got {got:?}, expected {want:?}"),
            }
        }
    }

    /// The machine's own node: the whole memory hierarchy, `nodefs` at `/`, an optional
    /// configured `imagefs`.
    fn machine(imagefs: Option<&str>) -> Node {
        let layout = crate::cgroup::detect().expect("cgroups");
        Node::new(
            NodeLayout::new(layout.memory.clone(), layout.memory.mount().to_path_buf()),
            None,
            Filesystems::new(Path::new("/"), imagefs.map(Path::new)).unwrap(),
        )
    }

    #[test]
    fn reads_this_machine() {
        let r = machine(None).read();
        assert!(r.failed.is_empty(), "{:?}", r.failed);
        let mem = r.observations[&Signal::MemoryAvailable];
        assert!(mem.capacity > 0 && mem.available <= mem.capacity);
        let pid = r.observations[&Signal::PidAvailable];
        assert!(pid.available > 0 && pid.available < pid.capacity);
        assert!(r.observations.contains_key(&Signal::NodeFsAvailable));
        assert_eq!(r.fs_layout, FsLayout::Shared);
        assert!(
            !r.observations.contains_key(&Signal::ImageFsAvailable),
            "no image filesystem known: not observed"
        );
    }

    #[test]
    fn the_layout_is_the_kubelets_device_comparison() {
        let rows = [
            ("images on the root's device", 1, 1, None, FsLayout::Shared),
            (
                "images and containers on the root's device",
                1,
                1,
                Some(1),
                FsLayout::Shared,
            ),
            ("images elsewhere", 1, 2, None, FsLayout::SeparateImageFs),
            (
                "images and containers elsewhere, together",
                1,
                2,
                Some(2),
                FsLayout::SeparateImageFs,
            ),
            (
                "images elsewhere, containers on the root's device",
                1,
                2,
                Some(1),
                FsLayout::SplitImageFs,
            ),
        ];
        for (what, nodefs, image, container, want) in rows {
            assert_eq!(decide_layout(nodefs, image, container), want, "{what}");
        }
    }

    #[test]
    fn an_imagefs_on_the_nodefs_filesystem_is_read_but_not_dedicated() {
        // "/" against itself is one filesystem; /proc is always another.
        let rows = [
            ("the same filesystem", "/", FsLayout::Shared),
            ("another filesystem", "/proc", FsLayout::SeparateImageFs),
        ];
        for (what, imagefs, layout) in rows {
            let r = machine(Some(imagefs)).read();
            assert_eq!(r.fs_layout, layout, "{what}");
            assert_eq!(r.capacity.has_imagefs, layout != FsLayout::Shared, "{what}");
            assert!(r.failed.is_empty(), "{what}: {:?}", r.failed);
            assert!(
                r.observations.contains_key(&Signal::ImageFsAvailable),
                "{what}: still observed"
            );
        }
    }

    /// The runtime's word decides, unless the config names the image filesystem; a path the
    /// runtime names that the agent cannot see (not mounted into its container) leaves the
    /// imagefs signals unknown, naming it.
    #[test]
    fn the_runtimes_image_filesystem_is_observed_and_an_unseen_one_is_named() {
        let mut node = machine(None);
        assert!(node.fs.runtime_says(Some("/"), Some("/")));
        assert!(!node.fs.runtime_says(Some("/"), Some("/")), "unchanged");
        let r = node.read();
        assert_eq!((r.fs_layout, r.failed.len()), (FsLayout::Shared, 0));
        assert!(
            r.observations.contains_key(&Signal::ImageFsAvailable),
            "kubelet parity: observed on one disk too"
        );

        assert!(node.fs.runtime_says(Some("/proc"), Some("/")));
        assert_eq!(node.read().fs_layout, FsLayout::SplitImageFs);

        assert!(node.fs.runtime_says(
            Some("/var/lib/containerd-not-mounted/io.containerd.snapshotter.v1.overlayfs"),
            None
        ));
        let r = node.read();
        assert!(
            r.failed[&Source::ImageFs].contains("/var/lib/containerd-not-mounted"),
            "{:?}",
            r.failed
        );
        assert!(!r.observations.contains_key(&Signal::ImageFsAvailable));
        assert!(
            r.observations.contains_key(&Signal::NodeFsAvailable),
            "nodefs still read"
        );

        assert!(node
            .fs
            .runtime_unavailable("CRI ImageFsInfo: no answer within 10s".into()));
        let r = node.read();
        assert!(
            r.failed[&Source::ImageFs].contains("no answer within 10s"),
            "{:?}",
            r.failed
        );

        let mut configured = machine(Some("/"));
        assert!(
            !configured.fs.runtime_says(Some("/proc"), None),
            "the config wins"
        );
        assert!(!configured.fs.runtime_unavailable("down".into()));
        assert_eq!(configured.read().fs_layout, FsLayout::Shared);
    }

    #[test]
    fn an_unreadable_source_leaves_the_others_read() {
        let node = machine(Some("/nonexistent/imagefs"));
        let r = node.read();
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

        let broken = Node::new(
            NodeLayout::new(
                node.layout.memory.clone(),
                PathBuf::from("/nonexistent/cgroup"),
            ),
            None,
            Filesystems::new(Path::new("/"), None).unwrap(),
        );
        let r = broken.read();
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

    /// A node cgroup with a kubepods child whose memory files say `usage`, `inactive_file`
    /// and `limit` (none: unlimited), in the machine's hierarchy version.
    fn node_with_kubepods(
        usage: u64,
        inactive_file: u64,
        limit: Option<u64>,
    ) -> (tempfile::TempDir, Node) {
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
            (
                files.limit,
                limit.map_or(no_limit.to_string(), |l| l.to_string()),
            ),
            (
                files.stat,
                format!("anon 0\n{} {inactive_file}\n", files.inactive_file_key),
            ),
        ] {
            std::fs::write(pods.join(file), content + "\n").unwrap();
        }
        let mut src = Node::new(
            NodeLayout::new(layout.memory.clone(), dir.path().to_path_buf()),
            None,
            Filesystems::new(Path::new("/"), None).unwrap(),
        );
        src.allocatable = Allocatable::Bytes(1 << 30);
        (dir, src)
    }

    #[test]
    fn allocatable_memory_available_is_the_kubelets_allocatable_minus_the_pods_working_set() {
        const MIB: u64 = 1 << 20;
        // (behaviour, the pods cgroup's limit, measured against, the capacity taken; none:
        // not observed)
        let rows: [(&str, Option<u64>, Allocatable, Option<i64>); 7] = [
            (
                "the config's figure, whatever the cgroup's limit",
                Some(1200 * MIB),
                Allocatable::Bytes(1 << 30),
                Some(1 << 30),
            ),
            (
                "the pods cgroup's limit over the Node's figure, as the kubelet",
                Some(1124 * MIB),
                Allocatable::Node(1 << 30),
                Some(1124 << 20),
            ),
            (
                "the pods cgroup's limit before the Node is read (a restarted agent's first \
                 evaluation)",
                Some(1124 * MIB),
                Allocatable::NodeNotRead,
                Some(1124 << 20),
            ),
            (
                "the Node's figure while the pods cgroup has no limit",
                None,
                Allocatable::Node(1 << 30),
                Some(1 << 30),
            ),
            (
                "nothing while the pods cgroup has no limit and the Node is not read yet",
                None,
                Allocatable::NodeNotRead,
                None,
            ),
            (
                "the pods cgroup's limit while the Node cannot be read (RBAC, a missing field)",
                Some(1124 * MIB),
                Allocatable::Unknown("node n1: forbidden".into()),
                Some(1124 << 20),
            ),
            (
                "the config's figure, the cgroup unlimited",
                None,
                Allocatable::Bytes(900 << 20),
                Some(900 << 20),
            ),
        ];
        for (behaviour, limit, allocatable, capacity) in rows {
            let (_dir, src) = node_with_kubepods(700 * MIB, 100 * MIB, limit);
            let mut reading = NodeReading {
                observations: Observations::new(),
                capacity: NodeCapacity::default(),
                failed: BTreeMap::new(),
                fs_layout: FsLayout::Shared,
            };
            read_allocatable(&src.layout, &allocatable, &src.held, &mut reading).unwrap();
            assert_eq!(
                reading
                    .observations
                    .get(&Signal::AllocatableMemoryAvailable)
                    .copied(),
                capacity.map(|capacity| Observation {
                    available: capacity - (600 << 20),
                    capacity,
                    lead: 0,
                }),
                "{behaviour}"
            );
            assert!(reading.failed.is_empty(), "{behaviour}");
        }
    }

    #[test]
    fn the_kubelets_cgroup_root_says_where_its_pods_cgroup_is() {
        let root = tempfile::tempdir().unwrap();
        for dir in ["kubepods", "node-1/kubepods", "elsewhere"] {
            std::fs::create_dir_all(root.path().join(dir)).unwrap();
        }
        let memory = crate::cgroup::Hierarchy::V1 {
            mount: root.path().to_path_buf(),
        };
        let whole = || NodeLayout::new(memory.clone(), root.path().to_path_buf());
        // (behaviour, the kubelet's cgroupRoot, the pods cgroup found)
        let rows: [(&str, Option<&str>, Option<&str>); 3] = [
            (
                "kubeadm's /: directly below the node cgroup",
                Some("/"),
                Some("kubepods"),
            ),
            (
                "a cgroupRoot of its own (kind's /kubelet, a second kubelet)",
                Some("/node-1"),
                Some("node-1/kubepods"),
            ),
            (
                "no kubelet config: below the node cgroup",
                None,
                Some("kubepods"),
            ),
        ];
        for (behaviour, kubelet_root, want) in rows {
            let layout = match kubelet_root {
                Some(r) => whole().with_kubelet_root(r).unwrap(),
                None => whole(),
            };
            assert_eq!(
                layout.kubepods(),
                want.map(|w| root.path().join(w)),
                "{behaviour}"
            );
        }
        let node = NodeLayout::new(memory.clone(), root.path().join("node-1"));
        assert_eq!(
            node.with_kubelet_root("/elsewhere").unwrap_err(),
            root.path().join("elsewhere"),
            "a cgroupRoot outside the node cgroup is not this node's"
        );
    }

    #[test]
    fn without_a_kubepods_cgroup_only_that_signal_is_unknown() {
        let (dir, src) = node_with_kubepods(0, 0, None);
        std::fs::remove_dir_all(dir.path().join("kubepods")).unwrap();
        let r = src.read();
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
        let (_dir, src) = node_with_kubepods(100 << 20, 0, None);
        let why = "node n1: status.allocatable.memory is absent";
        let mut src = src;
        src.allocatable = Allocatable::Unknown(why.into());
        let r = src.read();
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
        src.allocatable = Allocatable::NotObserved;
        let not_observed = src.read();
        assert!(!not_observed.failed.contains_key(&Source::Allocatable));
        assert!(!not_observed
            .observations
            .contains_key(&Signal::AllocatableMemoryAvailable));
    }
}
