//! `cargo xtask cluster down`, and the first step of every `up`: ends what a cluster made,
//! whether it stopped cleanly or was killed, and [`HostSnapshot`], what a test compares
//! before `up` and after `down` to prove the host is left as it was found.
//!
//! Order: the kubelets first (so nothing restarts a container), then every process in the
//! pods' cgroups, then every process in a node's namespaces (containerd and its shims,
//! kube-proxy, the control plane, the holders), then the forwarder; SIGTERM, and SIGKILL
//! after a grace. The nodes' mounts (disk, `/run`, `/var/log`) exist only in their mount
//! namespaces and go with the last process in them; their loop devices detach by themselves
//! (autoclear), and are detached here if they did not. The pods' cgroups are removed
//! deepest first. Nothing of the host's own is touched: no interface, route or firewall rule
//! of the host's network namespace was ever made.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};

use crate::{
    layout::Layout,
    process::{alive, terminate},
    state::{ns_inode, State},
};

/// Where the cgroup hierarchies are mounted.
const CGROUP_FS: &str = "/sys/fs/cgroup";

/// Ends the cluster recorded in the layout's state file, if any; also a cluster whose state
/// file is unreadable, found by its namespaces' processes and binaries.
pub fn down(layout: &Layout) -> anyhow::Result<()> {
    let state = match State::load(&layout.state()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("xtask: {e:#}; ending what can be found by its binaries");
            None
        }
    };
    let state = state.unwrap_or_default();
    // 1. The kubelets, so they restart nothing.
    let kubelets: Vec<u32> = state
        .processes
        .iter()
        .filter(|p| p.name.starts_with("kubelet") && p.is_running())
        .map(|p| p.pid)
        .collect();
    terminate(&kubelets, Duration::from_secs(5));

    // 2. The pods.
    let roots = cgroup_roots(&state);
    for _ in 0..3 {
        let pids = pids_in_cgroups(&roots);
        if pids.is_empty() {
            break;
        }
        terminate(&pids, Duration::from_millis(500));
    }

    // 3. Everything else of the cluster: recorded processes, anything in a node's
    //    namespaces, anything running a binary of the cluster's.
    let mut pids: BTreeSet<u32> = state
        .processes
        .iter()
        .filter(|p| p.is_running())
        .map(|p| p.pid)
        .collect();
    pids.extend(processes_of(layout, &state));
    let pids: Vec<u32> = pids.into_iter().collect();
    terminate(&pids, Duration::from_secs(10));
    let left: Vec<u32> = processes_of(layout, &state)
        .into_iter()
        .filter(|p| alive(*p))
        .collect();
    if !left.is_empty() {
        bail!("processes of the cluster outlived SIGKILL: {left:?}");
    }

    // 4. Cgroups, deepest first (a cgroup goes once its last process is reaped).
    let start = Instant::now();
    loop {
        let remaining = remove_cgroups(&roots);
        if remaining.is_empty() {
            break;
        }
        if start.elapsed() > Duration::from_secs(20) {
            bail!(
                "cgroups of the cluster could not be removed: {}",
                remaining
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        for pid in pids_in_cgroups(&roots) {
            // SAFETY: kill(2) of a process in the cluster's pod cgroups.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(200));
    }

    // 5. Loop devices of the nodes' disks.
    let start = Instant::now();
    loop {
        let devices = loop_devices(&layout.dir);
        if devices.is_empty() {
            break;
        }
        if start.elapsed() > Duration::from_secs(10) {
            for dev in &devices {
                let _ = std::process::Command::new("losetup")
                    .arg("-d")
                    .arg(dev)
                    .status();
            }
            let still = loop_devices(&layout.dir);
            if !still.is_empty() {
                bail!(
                    "loop devices of the nodes' disks stay attached: {still:?}; mounted by: {}",
                    holders_of(&still).join(", ")
                );
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }

    // 6. What a fresh `up` makes anew.
    for path in [layout.state(), layout.etcd_data(), layout.dir.join("nodes")] {
        if path.is_dir() {
            fs::remove_dir_all(&path).with_context(|| format!("removing {}", path.display()))?;
        } else if path.exists() {
            fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    Ok(())
}

/// The pod cgroup trees of the recorded nodes (and of the first node when nothing is
/// recorded and the tree is marked as the cluster's), under every hierarchy.
fn cgroup_roots(state: &State) -> Vec<PathBuf> {
    let mut tops: BTreeSet<String> = state
        .nodes
        .iter()
        .map(|n| {
            if n.cgroup_root == "/" {
                "kubepods".to_string()
            } else {
                n.cgroup_root.trim_start_matches('/').to_string()
            }
        })
        .collect();
    if state.nodes.is_empty() {
        // A state file lost with the cluster still running: the trees no one else names.
        tops.insert("node-agent-node1".into());
    }
    let mut out = Vec::new();
    for hierarchy in hierarchies() {
        for top in &tops {
            let path = hierarchy.join(top);
            if path.is_dir() {
                out.push(path);
            }
        }
    }
    out
}

/// Every mounted cgroup hierarchy (v1 controllers, named ones, the unified one).
pub fn hierarchies() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(mountinfo) = fs::read_to_string("/proc/self/mountinfo") else {
        return out;
    };
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let fstype = right.split_whitespace().next().unwrap_or("");
        if fstype != "cgroup" && fstype != "cgroup2" {
            continue;
        }
        if let Some(mount_point) = left.split_whitespace().nth(4) {
            if mount_point.starts_with(CGROUP_FS) {
                out.push(PathBuf::from(mount_point));
            }
        }
    }
    out
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_path_buf());
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&entry.path(), out);
            }
        }
    }
}

pub fn pids_in_cgroups(roots: &[PathBuf]) -> Vec<u32> {
    let mut pids = BTreeSet::new();
    for root in roots {
        let mut dirs = Vec::new();
        walk(root, &mut dirs);
        for dir in dirs {
            if let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) {
                pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
            }
        }
    }
    pids.into_iter().collect()
}

/// Processes whose command is `kubelet`, wherever they run.
pub fn kubelet_processes() -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return out;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if fs::read_to_string(entry.path().join("comm")).is_ok_and(|c| c.trim() == "kubelet") {
            out.push(pid);
        }
    }
    out
}

/// Removes each tree deepest first; returns what could not be removed.
pub fn remove_cgroups(roots: &[PathBuf]) -> Vec<PathBuf> {
    let mut left = Vec::new();
    for root in roots {
        let mut dirs = Vec::new();
        walk(root, &mut dirs);
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for dir in dirs {
            if dir.exists() && fs::remove_dir(&dir).is_err() {
                left.push(dir);
            }
        }
    }
    left
}

/// Processes in a recorded node's namespaces, or running a binary of the cluster's bin
/// directory, or whose command line names the cluster directory.
fn processes_of(layout: &Layout, state: &State) -> Vec<u32> {
    let nets: BTreeSet<u64> = state.nodes.iter().map(|n| n.net_ns).collect();
    let mnts: BTreeSet<u64> = state.nodes.iter().map(|n| n.mnt_ns).collect();
    let dir = layout.dir.to_string_lossy().into_owned();
    let me = std::process::id();
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return out;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(pid) = name.parse::<u32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        let in_ns = ns_inode(&name, "net").is_some_and(|i| nets.contains(&i))
            || ns_inode(&name, "mnt").is_some_and(|i| mnts.contains(&i));
        let cmdline = fs::read(format!("/proc/{pid}/cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default();
        let ours = !dir.is_empty() && cmdline.contains(&dir) && !cmdline.contains("cargo");
        if in_ns || ours {
            out.push(pid);
        }
    }
    out
}

/// Processes whose mount namespace has one of `devices` mounted (`pid comm`).
fn holders_of(devices: &[String]) -> Vec<String> {
    let numbers: Vec<String> = devices
        .iter()
        .filter_map(|d| {
            let name = d.trim_start_matches("/dev/");
            fs::read_to_string(format!("/sys/block/{name}/dev")).ok()
        })
        .map(|n| format!(" {} ", n.trim()))
        .collect();
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return out;
    };
    for entry in entries.flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if pid.parse::<u32>().is_err() {
            continue;
        }
        let Ok(info) = fs::read_to_string(format!("/proc/{pid}/mountinfo")) else {
            continue;
        };
        if info
            .lines()
            .any(|l| numbers.iter().any(|n| l.contains(n.as_str())))
        {
            let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            out.push(format!("{pid} {}", comm.trim()));
        }
    }
    out
}

/// Loop devices whose backing file is under `dir`.
fn loop_devices(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir("/sys/block") else {
        return out;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        if let Ok(backing) = fs::read_to_string(entry.path().join("loop/backing_file")) {
            if Path::new(backing.trim()).starts_with(dir) {
                out.push(format!("/dev/{name}"));
            }
        }
    }
    out
}

/// What of the host a cluster could leave behind, read before `up` and after `down`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostSnapshot {
    /// The host's mount points.
    pub mounts: BTreeSet<String>,
    /// The host's network interfaces and their addresses (`ip -o addr`).
    pub interfaces: BTreeSet<String>,
    /// The host network namespace's netfilter rules (`iptables-save`, counters stripped).
    pub firewall: Vec<String>,
    /// Named network namespaces (`/run/netns`).
    pub named_netns: BTreeSet<String>,
    /// The top-level directories of every cgroup hierarchy.
    pub cgroups: BTreeSet<String>,
    /// Attached loop devices and their files.
    pub loop_devices: BTreeSet<String>,
    /// Which of the paths a kubelet node uses exist on the host.
    pub node_paths: BTreeSet<String>,
    /// Processes running a binary of the cluster's, or naming its directory.
    pub processes: BTreeSet<String>,
}

/// Paths a node of kubeadm's uses, which this cluster keeps inside its nodes' mount
/// namespaces: none may appear on the host.
const NODE_PATHS: &[&str] = &[
    "/var/lib/kubelet",
    "/var/lib/containerd",
    "/var/lib/cni",
    "/var/log/pods",
    "/var/log/containers",
    "/run/containerd",
    "/run/netns",
    "/etc/cni/net.d",
    "/etc/kubernetes",
];

impl HostSnapshot {
    pub fn take(layout: &Layout) -> anyhow::Result<Self> {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").context("reading mountinfo")?;
        let mounts = mountinfo
            .lines()
            .filter_map(|l| l.split_whitespace().nth(4).map(str::to_string))
            .collect();
        let addrs =
            crate::process::output_of(std::process::Command::new("ip").args(["-o", "addr"]))?;
        let interfaces = addrs
            .lines()
            .map(|l| {
                // Drop lifetimes and counters that change by themselves.
                l.split_whitespace()
                    .filter(|w| !w.contains("_lft") && !w.ends_with("sec"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        let firewall =
            match crate::process::output_of(&mut std::process::Command::new("iptables-save")) {
                Ok(text) => text
                    .lines()
                    .filter(|l| !l.starts_with('#'))
                    .map(|l| {
                        // `:CHAIN POLICY [packets:bytes]`: the counters move.
                        l.split(" [").next().unwrap_or(l).to_string()
                    })
                    .collect(),
                Err(e) => vec![format!("iptables-save failed: {e}")],
            };
        let named_netns = fs::read_dir("/run/netns")
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        let mut cgroups = BTreeSet::new();
        for h in hierarchies() {
            if let Ok(entries) = fs::read_dir(&h) {
                for e in entries.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        cgroups.insert(e.path().display().to_string());
                    }
                }
            }
        }
        let mut loops = BTreeSet::new();
        if let Ok(entries) = fs::read_dir("/sys/block") {
            for e in entries.flatten() {
                if let Ok(b) = fs::read_to_string(e.path().join("loop/backing_file")) {
                    loops.insert(format!("{} {}", e.file_name().to_string_lossy(), b.trim()));
                }
            }
        }
        let node_paths = NODE_PATHS
            .iter()
            .filter(|p| Path::new(p).exists())
            .map(|p| p.to_string())
            .collect();
        let state = State::default();
        let processes = processes_of(layout, &state)
            .into_iter()
            .map(|pid| {
                let cmd = fs::read(format!("/proc/{pid}/cmdline"))
                    .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
                    .unwrap_or_default();
                format!("{pid} {cmd}")
            })
            .collect();
        Ok(Self {
            mounts,
            interfaces,
            firewall,
            named_netns,
            cgroups,
            loop_devices: loops,
            node_paths,
            processes,
        })
    }

    /// What `after` has that `self` had not (and the reverse), one line each.
    pub fn differences(&self, after: &Self) -> Vec<String> {
        fn sets<T: Ord + Clone + std::fmt::Debug>(
            what: &str,
            a: &BTreeSet<T>,
            b: &BTreeSet<T>,
            out: &mut Vec<String>,
        ) {
            for x in b.difference(a) {
                out.push(format!("{what} left behind: {x:?}"));
            }
            for x in a.difference(b) {
                out.push(format!("{what} gone: {x:?}"));
            }
        }
        let mut out = Vec::new();
        sets("mount", &self.mounts, &after.mounts, &mut out);
        sets("interface", &self.interfaces, &after.interfaces, &mut out);
        let (fa, fb): (BTreeSet<_>, BTreeSet<_>) = (
            self.firewall.iter().cloned().collect(),
            after.firewall.iter().cloned().collect(),
        );
        sets("firewall rule", &fa, &fb, &mut out);
        sets(
            "named network namespace",
            &self.named_netns,
            &after.named_netns,
            &mut out,
        );
        sets("cgroup", &self.cgroups, &after.cgroups, &mut out);
        sets(
            "loop device",
            &self.loop_devices,
            &after.loop_devices,
            &mut out,
        );
        sets("node path", &self.node_paths, &after.node_paths, &mut out);
        sets("process", &self.processes, &after.processes, &mut out);
        out
    }
}
