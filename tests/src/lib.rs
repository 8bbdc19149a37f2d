//! Support for the kernel tests: root checks that fail (never skip), cgroups that clean
//! themselves up even when a test fails, and bounded waits on helper processes.

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};

/// Kernel tests are required: without root they fail with this message instead of skipping.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "kernel tests need root (they load eBPF programs and create cgroups): run `sudo -E cargo xtask test`"
    );
}

/// A fresh cgroup v2 directory owned by one test. Dropping it kills whatever is still inside
/// and removes the directory.
pub struct TestCgroup {
    path: PathBuf,
}

impl TestCgroup {
    pub fn new(label: &str) -> anyhow::Result<Self> {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let root = node_agent::cgroup::cgroup2_mount()?;
        let name = format!(
            "node-agent-test-{label}-{}-{}",
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

    /// The v2 cgroup id, as the kernel programs see it.
    pub fn id(&self) -> u64 {
        node_agent::cgroup::cgroup_id(&self.path).expect("test cgroup exists while the guard lives")
    }

    /// Moves a process into this cgroup.
    pub fn add(&self, pid: u32) -> anyhow::Result<()> {
        let procs = self.path.join("cgroup.procs");
        std::fs::write(&procs, pid.to_string())
            .with_context(|| format!("moving pid {pid} into {}", procs.display()))
    }

    fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.path.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // cgroup.kill (5.14+) kills everything at once; otherwise signal each process.
        if std::fs::write(self.path.join("cgroup.kill"), "1").is_err() {
            for pid in self.pids() {
                // SAFETY: sending a signal has no memory-safety preconditions.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while let Err(e) = std::fs::remove_dir(&self.path) {
            if Instant::now() > deadline {
                eprintln!("could not remove test cgroup {}: {e}", self.path.display());
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A helper process that waits on its stdin before doing its work, so the test can move it
/// into a cgroup first. Killed on drop if still running.
pub struct Helper {
    child: Child,
}

impl Helper {
    /// Starts `program args...`, stopped at its "go" read.
    pub fn spawn(program: &str, args: &[String]) -> anyhow::Result<Self> {
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {program}"))?;
        Ok(Self { child })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Lets the helper go.
    pub fn go(&mut self) -> anyhow::Result<()> {
        let mut stdin = self
            .child
            .stdin
            .take()
            .context("helper stdin already used")?;
        stdin.write_all(b"go\n")?;
        Ok(())
    }

    /// Waits for the helper to exit, at most `limit`; an error if it failed or took longer.
    pub fn wait(&mut self, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait()? {
                if !status.success() {
                    bail!("helper exited with {status}");
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("helper still running after {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
