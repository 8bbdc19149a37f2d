//! Which cgroup hierarchy holds the memory and pids controllers on this host.
//!
//! A controller is bound to exactly one hierarchy: a cgroup v1 mount that names it in its
//! options, or else the v2 (unified) hierarchy, whose root lists it in `cgroup.controllers`.
//! Hosts come in three shapes: unified (only cgroup2, at `/sys/fs/cgroup`), hybrid (v1
//! controllers at `/sys/fs/cgroup/<name>` plus cgroup2 at `/sys/fs/cgroup/unified`, usually
//! without controllers) and legacy (v1 only).

use std::{
    fmt, io,
    path::{Path, PathBuf},
};

use super::mounts::{parse_cgroup2_mount, MountLine};

const MOUNTINFO: &str = "/proc/self/mountinfo";

/// The controllers a cgroup v1 hierarchy can bind (`/proc/cgroups`); other v1 mount options
/// (`rw`, `name=systemd`, `xattr`, `clone_children`, ...) are not controllers.
const V1_CONTROLLERS: [&str; 14] = [
    "cpuset",
    "cpu",
    "cpuacct",
    "blkio",
    "memory",
    "devices",
    "freezer",
    "net_cls",
    "net_prio",
    "perf_event",
    "hugetlb",
    "pids",
    "rdma",
    "misc",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CgroupVersion {
    V1,
    V2,
}

/// A hierarchy holding a controller, and where it is mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hierarchy {
    V1 { mount: PathBuf },
    V2 { mount: PathBuf },
}

impl Hierarchy {
    pub fn mount(&self) -> &Path {
        match self {
            Self::V1 { mount } | Self::V2 { mount } => mount,
        }
    }

    pub fn version(&self) -> CgroupVersion {
        match self {
            Self::V1 { .. } => CgroupVersion::V1,
            Self::V2 { .. } => CgroupVersion::V2,
        }
    }
}

impl fmt::Display for Hierarchy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::V1 { mount } => write!(f, "cgroup v1 at {}", mount.display()),
            Self::V2 { mount } => write!(f, "cgroup v2 at {}", mount.display()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostMode {
    /// Only cgroup2 is mounted.
    Unified,
    /// v1 controller hierarchies and a cgroup2 mount side by side.
    Hybrid,
    /// Only cgroup v1.
    Legacy,
}

/// Where the agent finds the controllers it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub memory: Hierarchy,
    pub pids: Hierarchy,
    pub mode: HostMode,
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "memory on {}, pids on {} ({:?} host)",
            self.memory, self.pids, self.mode
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HierarchyError {
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("mountinfo line {line_no} does not have mountinfo's shape (`... - fstype source options`): {line:?}")]
    MalformedMountinfo { line_no: usize, line: String },
    #[error("no cgroup or cgroup2 filesystem is mounted (looked in {MOUNTINFO})")]
    NoCgroupMounts,
    #[error(
        "no hierarchy holds the {controller} controller: cgroup v1 mounts bind [{}], {}",
        .v1_controllers.join(" "),
        describe_v2(.v2)
    )]
    ControllerMissing {
        controller: &'static str,
        v1_controllers: Vec<String>,
        v2: Option<(PathBuf, Vec<String>)>,
    },
}

fn describe_v2(v2: &Option<(PathBuf, Vec<String>)>) -> String {
    match v2 {
        Some((mount, controllers)) => format!(
            "the cgroup2 root at {} offers [{}]",
            mount.display(),
            controllers.join(" ")
        ),
        None => "and no cgroup2 filesystem is mounted".to_owned(),
    }
}

/// Reads `/proc/self/mountinfo` and the cgroup2 root's `cgroup.controllers`, works out the
/// layout and logs it.
pub fn detect() -> Result<Layout, HierarchyError> {
    let read = |path: PathBuf| {
        std::fs::read_to_string(&path).map_err(|source| HierarchyError::Read { path, source })
    };
    let mountinfo = read(PathBuf::from(MOUNTINFO))?;
    let controllers = match parse_cgroup2_mount(&mountinfo) {
        Some(mount) => read(mount.join("cgroup.controllers"))?,
        None => String::new(),
    };
    let layout = parse_layout(&mountinfo, &controllers)?;
    tracing::info!(%layout, "cgroup hierarchies");
    Ok(layout)
}

/// Works out the layout from mountinfo text (proc(5)) and the content of the first cgroup2
/// mount's `cgroup.controllers` (ignored when no cgroup2 is mounted). When a hierarchy is
/// mounted more than once, the first mount wins, as in [`parse_cgroup2_mount`].
pub fn parse_layout(mountinfo: &str, v2_controllers: &str) -> Result<Layout, HierarchyError> {
    let mut v1: Vec<(PathBuf, Vec<&str>)> = Vec::new();
    let mut v2: Option<PathBuf> = None;
    for (index, line) in mountinfo.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mount = MountLine::parse(line).ok_or_else(|| HierarchyError::MalformedMountinfo {
            line_no: index + 1,
            line: line.to_owned(),
        })?;
        match mount.fstype {
            "cgroup" => {
                let controllers: Vec<&str> = mount
                    .super_options
                    .split(',')
                    .filter(|option| V1_CONTROLLERS.contains(option))
                    .collect();
                if !controllers.is_empty() {
                    v1.push((mount.mount_point, controllers));
                }
            }
            "cgroup2" if v2.is_none() => v2 = Some(mount.mount_point),
            _ => {}
        }
    }
    let mode = match (v1.is_empty(), v2.is_some()) {
        (false, true) => HostMode::Hybrid,
        (false, false) => HostMode::Legacy,
        (true, true) => HostMode::Unified,
        (true, false) => return Err(HierarchyError::NoCgroupMounts),
    };
    let v2_offers: Vec<&str> = v2_controllers.split_whitespace().collect();
    let find = |controller: &'static str| {
        if let Some((mount, _)) = v1.iter().find(|(_, bound)| bound.contains(&controller)) {
            return Ok(Hierarchy::V1 {
                mount: mount.clone(),
            });
        }
        match &v2 {
            Some(mount) if v2_offers.contains(&controller) => Ok(Hierarchy::V2 {
                mount: mount.clone(),
            }),
            _ => Err(HierarchyError::ControllerMissing {
                controller,
                v1_controllers: v1
                    .iter()
                    .flat_map(|(_, bound)| bound.iter().map(|c| (*c).to_owned()))
                    .collect(),
                v2: v2.as_ref().map(|mount| {
                    let offers = v2_offers.iter().map(|c| (*c).to_owned()).collect();
                    (mount.clone(), offers)
                }),
            }),
        }
    };
    Ok(Layout {
        memory: find("memory")?,
        pids: find("pids")?,
        mode,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine: v1 controllers each on their own mount, cgroup2 at `unified` offering only
    /// `hugetlb`.
    const HYBRID: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    /// A systemd unified host (Ubuntu 22.04+, RHEL 9, COS).
    const UNIFIED: &str = "\
22 1 0:21 / / rw - ext4 /dev/vda rw
30 22 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

    /// A legacy host (CentOS 7): systemd's named hierarchy, combined `cpu,cpuacct` and
    /// `net_cls,net_prio` mounts, no cgroup2 at all.
    const LEGACY: &str = "\
24 18 0:21 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:8 - tmpfs tmpfs ro,mode=755
25 24 0:22 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:9 - cgroup cgroup rw,xattr,release_agent=/usr/lib/systemd/systemd-cgroups-agent,name=systemd
27 24 0:24 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:10 - cgroup cgroup rw,seclabel,cpu,cpuacct
28 24 0:25 / /sys/fs/cgroup/net_cls,net_prio rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,net_cls,net_prio
29 24 0:26 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:12 - cgroup cgroup rw,seclabel,memory
30 24 0:27 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,pids
";

    /// A hybrid host whose memory controller is bound with others on one v1 mount and whose pids
    /// controller was left to the unified hierarchy.
    const COMBINED_V1_PIDS_ON_V2: &str = "\
25 24 0:22 / /sys/fs/cgroup/unified rw,nosuid shared:5 - cgroup2 cgroup2 rw,nsdelegate
26 24 0:23 / /sys/fs/cgroup/memory,hugetlb rw,nosuid shared:6 - cgroup cgroup rw,hugetlb,memory
";

    const NO_CGROUPS: &str = "22 1 0:21 / / rw - ext4 /dev/vda rw\n";
    const ONLY_SYSTEMD_NAMED: &str =
        "25 24 0:22 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd\n";

    fn v1(mount: &str) -> Hierarchy {
        Hierarchy::V1 {
            mount: PathBuf::from(mount),
        }
    }

    fn v2(mount: &str) -> Hierarchy {
        Hierarchy::V2 {
            mount: PathBuf::from(mount),
        }
    }

    #[test]
    fn finds_the_hierarchy_of_memory_and_pids_on_each_host_shape() {
        let all_v2 = "cpuset cpu io memory hugetlb pids rdma misc\n";
        #[rustfmt::skip]
        let rows = [
            ("hybrid host binds both to v1", HYBRID, "hugetlb\n",
                v1("/sys/fs/cgroup/memory"), v1("/sys/fs/cgroup/pids"), HostMode::Hybrid),
            ("unified host offers both on v2", UNIFIED, all_v2,
                v2("/sys/fs/cgroup"), v2("/sys/fs/cgroup"), HostMode::Unified),
            ("legacy host with combined mounts", LEGACY, "",
                v1("/sys/fs/cgroup/memory"), v1("/sys/fs/cgroup/pids"), HostMode::Legacy),
            ("memory on a combined v1 mount, pids on v2", COMBINED_V1_PIDS_ON_V2, "pids\n",
                v1("/sys/fs/cgroup/memory,hugetlb"), v2("/sys/fs/cgroup/unified"), HostMode::Hybrid),
        ];
        for (name, mountinfo, controllers, memory, pids, mode) in rows {
            let layout =
                parse_layout(mountinfo, controllers).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(layout, Layout { memory, pids, mode }, "{name}");
        }
    }

    #[test]
    fn names_what_is_missing() {
        #[rustfmt::skip]
        let rows = [
            ("no cgroup mounts", NO_CGROUPS, "", "no cgroup or cgroup2 filesystem is mounted (looked in /proc/self/mountinfo)"),
            ("named hierarchy binds no controller", ONLY_SYSTEMD_NAMED, "",
                "no cgroup or cgroup2 filesystem is mounted (looked in /proc/self/mountinfo)"),
            ("hybrid host whose v2 lacks memory and v1 lacks it too",
                "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n\
                 32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu,cpuacct\n",
                "hugetlb",
                "no hierarchy holds the memory controller: cgroup v1 mounts bind [cpu cpuacct], \
                 the cgroup2 root at /sys/fs/cgroup/unified offers [hugetlb]"),
            ("legacy host without pids", "29 24 0:26 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n", "",
                "no hierarchy holds the pids controller: cgroup v1 mounts bind [memory], \
                 and no cgroup2 filesystem is mounted"),
            ("unified host without memory delegated", UNIFIED, "cpu pids",
                "no hierarchy holds the memory controller: cgroup v1 mounts bind [], \
                 the cgroup2 root at /sys/fs/cgroup offers [cpu pids]"),
            ("malformed line", "this is not mountinfo\n", "",
                "mountinfo line 1 does not have mountinfo's shape (`... - fstype source options`): \
                 \"this is not mountinfo\""),
        ];
        for (name, mountinfo, controllers, want) in rows {
            match parse_layout(mountinfo, controllers) {
                Ok(layout) => panic!("{name}: expected an error, got {layout}"),
                Err(e) => assert_eq!(e.to_string(), want, "{name}"),
            }
        }
    }
}
