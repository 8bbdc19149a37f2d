//! The bench's cgroups: named `node-agent-bench-<pid>-<label>` so a later run can tell stale
//! ones (their pid is gone) from a concurrent run's, removed with everything below them on drop.

use std::{
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use anyhow::Context as _;

use super::Rng;

const PREFIX: &str = "node-agent-bench-";

/// The memory controller's hierarchy (v1 here) and, if mounted, the v2 hierarchy (for PSI).
pub fn roots() -> anyhow::Result<(PathBuf, Option<PathBuf>)> {
    let layout = node_agent::cgroup::detect().context("finding the cgroup hierarchies")?;
    let memory = layout.memory.mount().to_path_buf();
    let v2 = node_agent::cgroup::cgroup2_mount().ok();
    Ok((memory, v2))
}

/// Removes `node-agent-bench-*` cgroups left by runs whose process is gone. Returns how many.
pub fn remove_stale() -> anyhow::Result<usize> {
    let (memory, v2) = roots()?;
    let mut removed = 0;
    for root in std::iter::once(memory).chain(v2) {
        let Ok(entries) = std::fs::read_dir(&root) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix(PREFIX) else {
                continue;
            };
            let owner: Option<u32> = rest.split('-').next().and_then(|p| p.parse().ok());
            let alive = owner.is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
            if alive && owner != Some(std::process::id()) {
                continue;
            }
            remove_tree(&entry.path())
                .with_context(|| format!("removing stale {}", entry.path().display()))?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// Kills every task below `dir`, then removes its cgroups, deepest first.
pub fn remove_tree(dir: &Path) -> anyhow::Result<()> {
    let children: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    for child in children {
        remove_tree(&child)?;
    }
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
        // SAFETY: sending a signal has no memory-safety preconditions.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if Instant::now() > deadline => {
                return Err(e).with_context(|| format!("removing {}", dir.display()))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// A cgroup (and anything created below it) owned by the bench; removed on drop.
pub struct BenchCgroup {
    path: PathBuf,
}

impl BenchCgroup {
    /// A fresh cgroup in the hierarchy of the memory controller.
    pub fn memory(label: &str) -> anyhow::Result<Self> {
        Self::under(&roots()?.0, label)
    }

    /// A fresh cgroup directly below `root`.
    pub fn under(root: &Path, label: &str) -> anyhow::Result<Self> {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "{PREFIX}{}-{label}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let path = root.join(name);
        std::fs::create_dir(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The id the kernel programs key this cgroup by.
    pub fn id(&self) -> anyhow::Result<u64> {
        node_agent::cgroup::cgroup_id(&self.path)
            .with_context(|| format!("reading the id of {}", self.path.display()))
    }

    pub fn write(&self, file: &str, value: &str) -> anyhow::Result<()> {
        let p = self.path.join(file);
        std::fs::write(&p, value).with_context(|| format!("writing {value:?} to {}", p.display()))
    }

    pub fn add(&self, pid: u32) -> anyhow::Result<()> {
        self.write("cgroup.procs", &pid.to_string())
    }

    /// v1 `memory.usage_in_bytes` or v2 `memory.current`.
    pub fn usage_file(&self) -> anyhow::Result<PathBuf> {
        ["memory.usage_in_bytes", "memory.current"]
            .into_iter()
            .map(|f| self.path.join(f))
            .find(|p| p.exists())
            .with_context(|| format!("no memory usage file in {}", self.path.display()))
    }

    /// v1 `memory.limit_in_bytes` or v2 `memory.max`.
    pub fn set_memory_limit(&self, bytes: u64) -> anyhow::Result<()> {
        let file = if self.path.join("memory.limit_in_bytes").exists() {
            "memory.limit_in_bytes"
        } else {
            "memory.max"
        };
        self.write(file, &bytes.to_string())
    }

    pub fn usage(&self) -> anyhow::Result<u64> {
        let p = self.usage_file()?;
        let text =
            std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        text.trim()
            .parse()
            .with_context(|| format!("{}: expected a number, found {text:?}", p.display()))
    }
}

impl Drop for BenchCgroup {
    fn drop(&mut self) {
        if let Err(e) = remove_tree(&self.path) {
            eprintln!("bench: could not remove {}: {e:#}", self.path.display());
        }
    }
}

/// `n` pods in the kubelet's cgroupfs layout below a bench cgroup:
/// `kubepods/burstable/pod<uuid>/<64-hex container id>`, one container each.
pub struct PodTree {
    pub root: BenchCgroup,
    pub pods: usize,
}

impl PodTree {
    pub fn create(n: usize, rng: &mut Rng) -> anyhow::Result<Self> {
        let root = BenchCgroup::memory(&format!("pods{n}"))?;
        let qos = root.path().join("kubepods/burstable");
        std::fs::create_dir_all(&qos).with_context(|| format!("creating {}", qos.display()))?;
        for _ in 0..n {
            let uid = rng.uuid();
            let container = qos.join(format!("pod{uid}")).join(rng.hex(64));
            std::fs::create_dir_all(&container)
                .with_context(|| format!("creating {}", container.display()))?;
        }
        Ok(Self { root, pods: n })
    }
}
