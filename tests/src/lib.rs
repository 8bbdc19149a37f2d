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

/// How many times slower than hardware the tests run: the whole number in
/// `NODE_AGENT_TEST_TIME_SCALE`, 1 when unset. `cargo xtask vm-test` sets it, since under
/// QEMU's software emulation the guest kernel and the agent run ten times slower or more.
pub fn time_scale() -> u32 {
    match std::env::var("NODE_AGENT_TEST_TIME_SCALE") {
        Err(_) => 1,
        Ok(v) => v.parse().ok().filter(|&n| n >= 1).unwrap_or_else(|| {
            panic!("NODE_AGENT_TEST_TIME_SCALE={v:?} is not a whole number of at least 1")
        }),
    }
}

/// A time bound, wait or collection window of a test, stretched by [`time_scale`]. Only what
/// guards against a hang or waits for something to happen is scaled: on the host, where the
/// scale is 1, every test keeps its figures.
pub fn scaled(d: Duration) -> Duration {
    d * time_scale()
}

/// A fresh cgroup directory owned by one test, in the hierarchy that holds the memory
/// controller (cgroup v1 on this development host, v2 on most production nodes and in the VM
/// tests). Dropping it kills whatever is still inside and removes the directory.
pub struct TestCgroup {
    path: PathBuf,
}

impl TestCgroup {
    /// A fresh cgroup in the hierarchy that holds the memory controller: the kernel programs
    /// key everything by memory cgroup.
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
        let cgroup = Self { path };
        // On v2 the memory files appear only where the parent enables the controller; the
        // test does not change the host's root cgroup, it says what is missing.
        MemoryFiles::of(&cgroup.path).usage_file(&cgroup.path)?;
        Ok(cgroup)
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
        set_memory_limit(&self.path, bytes)
    }

    /// Current memory usage in bytes (v1 `memory.usage_in_bytes`, v2 `memory.current`).
    pub fn memory_usage(&self) -> anyhow::Result<u64> {
        let file = MemoryFiles::of(&self.path).usage_file(&self.path)?;
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        text.trim()
            .parse()
            .with_context(|| format!("{} holds {text:?}, not a byte count", file.display()))
    }

    /// Creates a cgroup below this one (`rel` may have several components); removed with it.
    /// On cgroup v2 every level from this cgroup down to the new one's parent gets `+memory`
    /// and `+pids` in `cgroup.subtree_control`, as the kubelet does along its `kubepods`
    /// tree, so the new cgroup has its own memory and pids files. (v2 then allows processes
    /// only in leaves: put them into the deepest cgroups.)
    pub fn child(&self, rel: &str) -> anyhow::Result<PathBuf> {
        let dir = self.path.join(rel);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        if MemoryFiles::of(&self.path) == MemoryFiles::V2 {
            let mut levels: Vec<&Path> = dir
                .ancestors()
                .skip(1)
                .take_while(|a| a.starts_with(&self.path))
                .collect();
            levels.reverse();
            for level in levels {
                enable_controllers(level)?;
            }
        }
        Ok(dir)
    }

    /// The path below the hierarchy's root, as `nodeCgroup` wants it.
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

/// The memory controller's file names on the hierarchy a cgroup belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryFiles {
    /// `memory.limit_in_bytes`, `memory.usage_in_bytes`.
    V1,
    /// `memory.max`, `memory.current`.
    V2,
}

impl MemoryFiles {
    /// Every v2 cgroup directory has `cgroup.controllers`; no v1 one has.
    pub fn of(dir: &Path) -> Self {
        if dir.join("cgroup.controllers").exists() {
            Self::V2
        } else {
            Self::V1
        }
    }

    pub fn limit(self) -> &'static str {
        match self {
            Self::V1 => "memory.limit_in_bytes",
            Self::V2 => "memory.max",
        }
    }

    pub fn usage(self) -> &'static str {
        match self {
            Self::V1 => "memory.usage_in_bytes",
            Self::V2 => "memory.current",
        }
    }

    /// `dir`'s usage file, or an error saying why the cgroup has none.
    fn usage_file(self, dir: &Path) -> anyhow::Result<PathBuf> {
        self.existing(dir, self.usage())
    }

    fn existing(self, dir: &Path, name: &str) -> anyhow::Result<PathBuf> {
        let file = dir.join(name);
        if file.exists() {
            return Ok(file);
        }
        match self {
            Self::V1 => bail!(
                "{} is missing: {} is not on the memory controller's v1 hierarchy",
                file.display(),
                dir.display()
            ),
            Self::V2 => bail!(
                "{} is missing: the memory controller is not enabled for {} (its parent's \
                 cgroup.subtree_control lacks +memory)",
                file.display(),
                dir.display()
            ),
        }
    }
}

/// Sets the memory limit of the cgroup at `dir` (v1 `memory.limit_in_bytes`, v2 `memory.max`).
pub fn set_memory_limit(dir: &Path, bytes: u64) -> anyhow::Result<()> {
    let files = MemoryFiles::of(dir);
    let file = files.existing(dir, files.limit())?;
    std::fs::write(&file, bytes.to_string()).with_context(|| format!("writing {}", file.display()))
}

/// cgroup v2: lets the children of `dir` have the memory and pids controllers.
fn enable_controllers(dir: &Path) -> anyhow::Result<()> {
    let file = dir.join("cgroup.subtree_control");
    for controller in ["+memory", "+pids"] {
        std::fs::write(&file, controller)
            .with_context(|| format!("writing {controller} to {}", file.display()))?;
    }
    Ok(())
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

    /// Waits for the helper to be killed by a signal, at most `limit` ([`scaled`]); returns
    /// the signal number.
    pub fn wait_killed(&mut self, limit: Duration) -> anyhow::Result<i32> {
        use std::os::unix::process::ExitStatusExt as _;
        let limit = scaled(limit);
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

    /// Waits for the helper to exit, at most `limit` ([`scaled`]); an error if it failed or
    /// took longer.
    pub fn wait(&mut self, limit: Duration) -> anyhow::Result<()> {
        let limit = scaled(limit);
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
    /// The agent's own PID when it runs below `child` (in a PID namespace of its own).
    pub inner: Option<u32>,
    pub json: std::sync::mpsc::Receiver<serde_json::Value>,
    pub log: std::sync::mpsc::Receiver<String>,
}

impl AgentProcess {
    pub fn spawn(args: &[&std::ffi::OsStr]) -> anyhow::Result<Self> {
        Self::spawn_in(None, args)
    }

    /// Spawns it inside the cgroup at `cgroup` (it joins between fork and exec, so all of its
    /// memory is charged there), or where the test runs.
    pub fn spawn_in(cgroup: Option<&Path>, args: &[&std::ffi::OsStr]) -> anyhow::Result<Self> {
        Self::spawn_with(cgroup, false, args)
    }

    /// Spawns it as PID 1 of a PID namespace of its own, as in a pod without `hostPID`. The
    /// process started (`child`) makes the namespace, forks the agent into it and waits for
    /// it, exiting with its status; the agent dies with it (`PR_SET_PDEATHSIG`), and signals go
    /// to the agent itself ([`Self::signal`]).
    pub fn spawn_in_pid_namespace(args: &[&std::ffi::OsStr]) -> anyhow::Result<Self> {
        let mut process = Self::spawn_with(None, true, args)?;
        let outer = process.child.id();
        let deadline = Instant::now() + Duration::from_secs(10);
        process.inner = loop {
            if let Some(pid) = child_of(outer) {
                break Some(pid);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the agent forked into its PID namespace did not appear below {outer}"
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        Ok(process)
    }

    fn spawn_with(
        cgroup: Option<&Path>,
        pid_namespace: bool,
        args: &[&std::ffi::OsStr],
    ) -> anyhow::Result<Self> {
        use std::os::unix::{ffi::OsStrExt as _, process::CommandExt as _};
        let mut command = Command::new(agent_bin());
        command
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(dir) = cgroup {
            let procs = std::ffi::CString::new(dir.join("cgroup.procs").as_os_str().as_bytes())?;
            // SAFETY: between fork and exec only async-signal-safe calls: open, write, close
            // on a path prepared before the fork.
            unsafe {
                command.pre_exec(move || {
                    let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    // "0" moves the writing process.
                    let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                    libc::close(fd);
                    if written != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        if pid_namespace {
            // SAFETY: between fork and exec only async-signal-safe calls (unshare, fork,
            // prctl, close_range, waitpid, _exit); the waiting process never returns to exec.
            unsafe {
                command.pre_exec(|| {
                    if libc::unshare(libc::CLONE_NEWPID) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    match libc::fork() {
                        -1 => Err(std::io::Error::last_os_error()),
                        0 => {
                            // PID 1 of the new namespace: it goes on to exec the agent, and
                            // dies with the process that waits for it.
                            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                            Ok(())
                        }
                        agent => {
                            // Never to exec: its copy of the pipe std's spawn waits on (closed
                            // at exec) is closed here, or spawn would wait for the agent's end.
                            libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
                            let mut status = 0;
                            while libc::waitpid(agent, &mut status, 0) != agent {
                                if *libc::__errno_location() != libc::EINTR {
                                    libc::_exit(127);
                                }
                            }
                            let code = if libc::WIFEXITED(status) {
                                libc::WEXITSTATUS(status)
                            } else {
                                128 + libc::WTERMSIG(status)
                            };
                            libc::_exit(code)
                        }
                    }
                });
            }
        }
        let mut child = command.spawn().context("starting the agent")?;
        let json = lines(child.stdout.take().context("stdout")?, |line| {
            serde_json::from_str::<serde_json::Value>(&line).ok()
        });
        let log = lines(child.stderr.take().context("stderr")?, |line| {
            eprintln!("agent: {line}");
            Some(line)
        });
        Ok(Self {
            child,
            inner: None,
            json,
            log,
        })
    }

    pub fn signal(&self, sig: i32) {
        let pid = self.inner.unwrap_or(self.child.id());
        // SAFETY: signals the process we started (or the agent it forked).
        unsafe { libc::kill(pid as i32, sig) };
    }

    /// Waits at most `limit` for the process to exit.
    pub fn wait_exit(&mut self, limit: Duration) -> anyhow::Result<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "the agent did not exit within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A child of process `parent`, from `/proc/*/stat`.
fn child_of(parent: u32) -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            let ppid: u32 = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == parent).then_some(pid)
        })
}

/// Each line of `reader` that `map` keeps, on a channel fed by a thread.
pub(crate) fn lines<T: Send + 'static>(
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
/// A child's whole output once it exits within `limit`, read while it runs (output larger than
/// a pipe's 64 KiB would otherwise hold the child until the reader came); killed past `limit`,
/// and then an error naming `what`.
pub fn output_within(
    mut child: std::process::Child,
    limit: Duration,
    what: &str,
) -> anyhow::Result<std::process::Output> {
    fn drain(
        from: Option<impl std::io::Read + Send + 'static>,
    ) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut all = Vec::new();
            if let Some(mut from) = from {
                let _ = from.read_to_end(&mut all);
            }
            all
        })
    }
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{what} still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok(std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Requests made with the agent's service account token, and the API server's audit of the
/// agent's own requests (real-cluster tests).
pub mod agent_access;
/// A real containerd for the CRI tests, started and removed by the test.
pub mod containerd;
/// The daemon's end-to-end harness: a fake cluster whose pods and answers a test sets, and the
/// daemon as a subprocess to wait on (the real cluster is [`real_cluster`]).
pub mod fake_cluster;
/// A FUSE filesystem whose `statfs` never answers (a hung filesystem).
pub mod fuse;
/// `kubectl node-agent` on the real cluster, and guards for what its tests change there.
pub mod kubectl_plugin;
/// The agent's load on the control plane, on the real cluster (`cargo xtask cluster load`).
pub mod load;
/// OCI image tars written by the tests.
pub mod oci;
/// The DaemonSet's pod template as CRI requests.
pub mod podspec;
/// Racing the real kubelet on the real cluster (`cargo xtask cluster bench`).
pub mod race;
/// The real cluster of `cargo xtask cluster test`: kubectl, namespaces, workload pods, the
/// agent's pods, metrics and the audit log.
pub mod real_cluster;
/// A real node beyond kubectl: its kubelet restarted with other settings, the agent's process,
/// memory pressure sized from the agent's figure, Nodes without a kubelet.
pub mod real_node;
/// One end-to-end test's world over that harness, shared by the daemon's test files.
pub mod world;

/// `cargo xtask bench`: detection latency, probe overhead, event throughput and footprint,
/// measured on the real kernel by the `node-agent-bench` binary (see `docs/benchmarks.md`).
pub mod bench;
