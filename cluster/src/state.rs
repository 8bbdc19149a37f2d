//! What a running cluster is made of, written to `<cluster>/state.json` as it is made, so that
//! `down` (or the next `up`, after a crash) can end exactly it: its processes by PID and
//! start time (a PID reused by another process is never killed), its nodes' namespaces by
//! inode, its cgroup roots.

use std::{fs, path::Path};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct State {
    pub processes: Vec<Process>,
    pub nodes: Vec<Node>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Process {
    pub name: String,
    pub pid: u32,
    /// `/proc/<pid>/stat`'s start time (clock ticks since boot).
    pub start: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Node {
    pub name: String,
    /// The holder's network and mount namespaces (`/proc/<pid>/ns/*` inodes).
    pub net_ns: u64,
    pub mnt_ns: u64,
    /// The kubelet's cgroup root, `/` or `/node-agent-nodeN`; its `kubepods` below it.
    pub cgroup_root: String,
}

/// `/proc/<pid>/stat`'s 22nd field.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    // Fields after the name start at the 3rd (state): the start time is the 22nd.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The inode of `/proc/<pid>/ns/<kind>`.
pub fn ns_inode(pid: &str, kind: &str) -> Option<u64> {
    let link = fs::read_link(format!("/proc/{pid}/ns/{kind}")).ok()?;
    let text = link.to_string_lossy();
    text.split_once('[')?.1.trim_end_matches(']').parse().ok()
}

impl Process {
    pub fn of(name: &str, pid: u32) -> Self {
        Self {
            name: name.to_string(),
            pid,
            start: start_time(pid).unwrap_or(0),
        }
    }

    /// The process is still the one recorded.
    pub fn is_running(&self) -> bool {
        crate::process::alive(self.pid) && start_time(self.pid) == Some(self.start)
    }
}

impl State {
    pub fn load(path: &Path) -> anyhow::Result<Option<Self>> {
        match fs::read_to_string(path) {
            Ok(text) => serde_json::from_str(&text)
                .map(Some)
                .with_context(|| format!("{} is not a cluster state file", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// Written after every change, so a crash at any point leaves what was made on record.
    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        let tmp = path.with_extension("json.tmp");
        fs::write(&tmp, serde_json::to_vec_pretty(self)?)
            .with_context(|| format!("writing {}", tmp.display()))?;
        fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
    }
}
