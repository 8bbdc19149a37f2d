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
    /// A fresh cgroup in the hierarchy that holds the memory controller (v1 here, v2 on most
    /// production nodes): the kernel programs key everything by memory cgroup.
    pub fn new(label: &str) -> anyhow::Result<Self> {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let layout = node_agent::cgroup::detect()?;
        let root = layout.memory.mount().to_path_buf();
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

    /// Sets the memory limit (v1 `memory.limit_in_bytes`, v2 `memory.max`).
    pub fn set_memory_limit(&self, bytes: u64) -> anyhow::Result<()> {
        let file = ["memory.max", "memory.limit_in_bytes"]
            .into_iter()
            .map(|f| self.path.join(f))
            .find(|p| p.exists())
            .context("no memory limit file: is the memory controller enabled here?")?;
        std::fs::write(&file, bytes.to_string())
            .with_context(|| format!("writing {}", file.display()))
    }

    /// Current memory usage in bytes (v1 `memory.usage_in_bytes`, v2 `memory.current`).
    pub fn memory_usage(&self) -> anyhow::Result<u64> {
        let file = ["memory.current", "memory.usage_in_bytes"]
            .into_iter()
            .map(|f| self.path.join(f))
            .find(|p| p.exists())
            .context("no memory usage file")?;
        Ok(std::fs::read_to_string(&file)?.trim().parse()?)
    }

    /// Creates a cgroup below this one (`rel` may have several components); removed with it.
    pub fn child(&self, rel: &str) -> anyhow::Result<PathBuf> {
        let dir = self.path.join(rel);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(dir)
    }

    /// The path below the hierarchy's root, as `agent.node_cgroup` wants it.
    pub fn cgroup_path(&self) -> String {
        format!(
            "/{}",
            self.path
                .file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default()
        )
    }

    /// Moves a process into this cgroup.
    pub fn add(&self, pid: u32) -> anyhow::Result<()> {
        move_into(&self.path, pid)
    }
}

/// Moves a process into the cgroup at `dir`.
pub fn move_into(dir: &Path, pid: u32) -> anyhow::Result<()> {
    let procs = dir.join("cgroup.procs");
    std::fs::write(&procs, pid.to_string())
        .with_context(|| format!("moving pid {pid} into {}", procs.display()))
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        remove_tree(&self.path);
    }
}

/// Kills whatever runs in a cgroup tree and removes it, deepest directories first.
pub(crate) fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&entry.path());
            }
        }
    }
    // cgroup.kill (v2, 5.14+) kills everything at once; otherwise signal each process.
    if std::fs::write(dir.join("cgroup.kill"), "1").is_err() {
        let pids: Vec<i32> = std::fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        for pid in pids {
            // SAFETY: sending a signal has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while let Err(e) = std::fs::remove_dir(dir) {
        if e.kind() == std::io::ErrorKind::NotFound {
            return;
        }
        if Instant::now() > deadline {
            eprintln!("could not remove test cgroup {}: {e}", dir.display());
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A helper process that waits on its stdin before doing its work, so the test can move it
/// into a cgroup first. Killed on drop if still running.
pub struct Helper {
    child: Child,
    stdin: Option<std::process::ChildStdin>,
    /// The helper's stdout lines, read by a thread so that waiting for one is bounded.
    stdout: Option<std::sync::mpsc::Receiver<String>>,
}

/// [`Helper::read_line`] waits at most this long for a line: a helper that hangs fails the
/// test instead of holding it forever.
pub const HELPER_LINE_BOUND: Duration = Duration::from_secs(120);

impl Helper {
    /// Starts `program args...`, stopped at its "go" read.
    pub fn spawn(program: &str, args: &[String]) -> anyhow::Result<Self> {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {program}"))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().map(|out| lines(out, Some));
        Ok(Self {
            child,
            stdin,
            stdout,
        })
    }

    /// Reads the helper's next line of output, trimmed; `""` once the helper closed its
    /// stdout (it exited). An error after [`HELPER_LINE_BOUND`] without a line.
    pub fn read_line(&mut self) -> anyhow::Result<String> {
        use std::sync::mpsc::RecvTimeoutError;
        match self
            .stdout
            .as_ref()
            .context("helper stdout")?
            .recv_timeout(HELPER_LINE_BOUND)
        {
            Ok(line) => Ok(line.trim().to_string()),
            Err(RecvTimeoutError::Disconnected) => Ok(String::new()),
            Err(RecvTimeoutError::Timeout) => bail!(
                "helper {} printed no line within {HELPER_LINE_BOUND:?}",
                self.child.id()
            ),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Lets the helper go on to its next phase.
    pub fn go(&mut self) -> anyhow::Result<()> {
        let stdin = self.stdin.as_mut().context("helper stdin closed")?;
        stdin.write_all(b"go\n")?;
        stdin.flush()?;
        Ok(())
    }

    /// Waits for the helper to be killed by a signal; returns the signal number.
    pub fn wait_killed(&mut self, limit: Duration) -> anyhow::Result<i32> {
        use std::os::unix::process::ExitStatusExt as _;
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return status
                    .signal()
                    .with_context(|| format!("helper was not killed: {status}"));
            }
            if Instant::now() > deadline {
                bail!("helper still running after {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
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

/// The agent binary built with its kernel programs (`cargo xtask test` sets NODE_AGENT_BIN).
pub fn agent_bin() -> String {
    std::env::var("NODE_AGENT_BIN").expect(
        "NODE_AGENT_BIN names the agent binary built with its kernel programs (set by `cargo xtask test`)",
    )
}

/// An agent subprocess (`node-agent ARGS...`) whose stdout JSON lines arrive on a channel
/// and whose stderr lines (logs) on another. Killed when dropped, so a failing test leaves
/// nothing running.
pub struct AgentProcess {
    pub child: Child,
    pub json: std::sync::mpsc::Receiver<serde_json::Value>,
    pub log: std::sync::mpsc::Receiver<String>,
}

impl AgentProcess {
    pub fn spawn(args: &[&std::ffi::OsStr]) -> anyhow::Result<Self> {
        let mut child = Command::new(agent_bin())
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting the agent")?;
        let json = lines(child.stdout.take().context("stdout")?, |line| {
            serde_json::from_str::<serde_json::Value>(&line).ok()
        });
        let log = lines(child.stderr.take().context("stderr")?, |line| {
            eprintln!("agent: {line}");
            Some(line)
        });
        Ok(Self { child, json, log })
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: signals the process we started.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Each line of `reader` that `map` keeps, on a channel fed by a thread.
fn lines<T: Send + 'static>(
    reader: impl std::io::Read + Send + 'static,
    map: impl Fn(String) -> Option<T> + Send + 'static,
) -> std::sync::mpsc::Receiver<T> {
    use std::io::BufRead as _;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(reader)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(v) = map(line) {
                if tx.send(v).is_err() {
                    return;
                }
            }
        }
    });
    rx
}

/// Collects decoded kernel events matching `keep` for at most `limit`, stopping early once
/// `done` says the collection is complete. Undecodable records fail the test.
pub async fn collect_events(
    stream: &mut node_agent::ebpf::EventStream,
    limit: Duration,
    keep: impl Fn(&node_agent::ebpf::KernelEvent) -> bool,
    done: impl Fn(&[node_agent::ebpf::KernelEvent]) -> bool,
) -> anyhow::Result<Vec<(node_agent::ebpf::KernelEvent, Instant)>> {
    let deadline = tokio::time::Instant::now() + limit;
    let mut kept: Vec<(node_agent::ebpf::KernelEvent, Instant)> = Vec::new();
    loop {
        let events: Vec<_> = kept.iter().map(|(e, _)| *e).collect();
        if done(&events) {
            return Ok(kept);
        }
        match tokio::time::timeout_at(deadline, stream.next_batch()).await {
            Err(_) => return Ok(kept),
            Ok(batch) => {
                let received = Instant::now();
                for record in batch? {
                    let event = record?;
                    if keep(&event) {
                        kept.push((event, received));
                    }
                }
            }
        }
    }
}

/// A current-thread tokio runtime for one test.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// The daemon's end-to-end harness: a fake cluster whose pods and answers a test sets, and the
/// daemon as a subprocess to wait on.
pub mod cluster;
/// A real containerd for the CRI tests, started and removed by the test.
pub mod containerd;
/// OCI image tars written by the tests.
pub mod oci;
/// The DaemonSet's pod template as CRI requests.
pub mod podspec;

/// `cargo xtask bench`: detection latency, probe overhead, event throughput and footprint,
/// measured on the real kernel by the `node-agent-bench` binary (see `docs/benchmarks.md`).
pub mod bench;
