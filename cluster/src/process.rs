//! Running the cluster's processes: commands that finish (with their output), and daemons that
//! outlive `cargo xtask cluster up`, each in the node's namespaces, in a session of its own,
//! writing to a log file; a daemon that fails is reported with the last lines of that log.

use std::{
    fs,
    io::{Read as _, Seek as _, SeekFrom},
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};

/// Runs `cmd` to its end with the terminal's output; a failure names the command.
pub fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("starting {}", describe(cmd)))?;
    if !status.success() {
        bail!("{} failed ({status})", describe(cmd));
    }
    Ok(())
}

/// Runs `cmd` to its end and returns its stdout; a failure names it with its stderr.
pub fn output_of(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("starting {}", describe(cmd)))?;
    if !out.status.success() {
        bail!(
            "{} failed ({}): {}",
            describe(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `program arg…` for messages.
pub fn describe(cmd: &Command) -> String {
    let mut text = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args().take(6) {
        text.push(' ');
        text.push_str(&arg.to_string_lossy());
    }
    if cmd.get_args().len() > 6 {
        text.push_str(" …");
    }
    text
}

/// The last `lines` lines of a log file (at most its last 64 KiB are read).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let Ok(mut f) = fs::File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 << 10)));
    let mut buf = Vec::new();
    let _ = f.take(64 << 10).read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The namespaces a node's processes join: those of its holder process.
#[derive(Debug, Clone, Copy)]
pub struct Namespaces {
    pub holder: u32,
}

/// The namespace descriptors a command was told to enter: held open in this process until
/// the command has been started, then closed (an open descriptor of a node's mount namespace
/// would keep that namespace, and the node's disk mounted in it, alive after the node ends).
#[must_use = "keep it until the command has been spawned"]
pub struct Entered {
    _net: std::os::fd::OwnedFd,
    _mnt: std::os::fd::OwnedFd,
}

impl Namespaces {
    /// Makes `cmd` start inside the holder's network and mount namespaces; keep the returned
    /// value until `cmd` has been spawned.
    pub fn enter(self, cmd: &mut Command) -> anyhow::Result<Entered> {
        use std::os::fd::AsRawFd as _;
        let net = open_ns(self.holder, "net")?;
        let mnt = open_ns(self.holder, "mnt")?;
        let (net_fd, mnt_fd) = (net.as_raw_fd(), mnt.as_raw_fd());
        // SAFETY: between fork and exec only async-signal-safe calls: setns(2). The
        // descriptors are close-on-exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(net_fd, libc::CLONE_NEWNET) != 0
                    || libc::setns(mnt_fd, libc::CLONE_NEWNS) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Ok(Entered {
            _net: net,
            _mnt: mnt,
        })
    }
}

fn open_ns(pid: u32, kind: &str) -> anyhow::Result<std::os::fd::OwnedFd> {
    let path = format!("/proc/{pid}/ns/{kind}");
    let file = fs::File::open(&path).with_context(|| {
        format!("opening {path} (the node's holder process is gone: run `cargo xtask cluster down` and `up` again)")
    })?;
    Ok(std::os::fd::OwnedFd::from(file))
}

/// A long-running component started in the background.
#[derive(Debug, Clone)]
pub struct Daemon {
    pub name: String,
    pub pid: u32,
    pub log: PathBuf,
}

/// Starts `cmd` detached: in `ns`, in a new session, stdin from /dev/null, stdout and stderr
/// appended to `log`, and reparented to init at once (a double fork), so that a long-lived
/// caller (`cargo xtask cluster test`) never holds its zombie. It outlives this process;
/// [`crate::down`] ends it.
pub fn spawn_daemon(
    name: &str,
    cmd: &mut Command,
    ns: Option<Namespaces>,
    log: &Path,
) -> anyhow::Result<Daemon> {
    let file = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    cmd.stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file);
    let _entered = ns.map(|ns| ns.enter(cmd)).transpose()?;
    // The daemon's PID, written by the intermediate process.
    let mut fds = [0i32; 2];
    // SAFETY: pipe2(2) into a two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        bail!("pipe2: {}", std::io::Error::last_os_error());
    }
    let (read_fd, write_fd) = (fds[0], fds[1]);
    // SAFETY: between fork and exec only async-signal-safe calls: setsid(2), fork(2),
    // write(2), _exit(2).
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            match libc::fork() {
                -1 => Err(std::io::Error::last_os_error()),
                0 => Ok(()),
                pid => {
                    let bytes = pid.to_ne_bytes();
                    libc::write(write_fd, bytes.as_ptr().cast(), bytes.len());
                    libc::_exit(0)
                }
            }
        });
    }
    let spawned = cmd.spawn();
    // SAFETY: the write end is ours to close; the children have their own copies.
    unsafe { libc::close(write_fd) };
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            // SAFETY: closing our read end.
            unsafe { libc::close(read_fd) };
            return Err(e).with_context(|| format!("starting {name} ({})", describe(cmd)));
        }
    };
    let _ = child.wait();
    let mut bytes = [0u8; 4];
    // SAFETY: reading into a 4-byte buffer from our read end, then closing it.
    let n = unsafe { libc::read(read_fd, bytes.as_mut_ptr().cast(), bytes.len()) };
    unsafe { libc::close(read_fd) };
    if n != 4 {
        bail!("starting {name}: its PID never came back from the intermediate process");
    }
    let pid = i32::from_ne_bytes(bytes);
    Ok(Daemon {
        name: name.to_string(),
        pid: pid as u32,
        log: log.to_path_buf(),
    })
}

/// Whether `pid` is alive (and not a zombie).
pub fn alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // The state follows the command name's closing parenthesis.
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next());
            !matches!(state, Some('Z') | Some('X') | None)
        }
        Err(_) => false,
    }
}

impl Daemon {
    /// Waits up to `limit` for `ready` to hold; fails, with the log's last lines, if the daemon
    /// exits first or the time runs out.
    pub fn wait_until(
        &self,
        what: &str,
        limit: Duration,
        mut ready: impl FnMut() -> bool,
    ) -> anyhow::Result<()> {
        let start = Instant::now();
        loop {
            if ready() {
                return Ok(());
            }
            if !alive(self.pid) {
                bail!(
                    "{} exited before {what}; the last lines of {}:\n{}",
                    self.name,
                    self.log.display(),
                    log_tail(&self.log, 20)
                );
            }
            if start.elapsed() > limit {
                bail!(
                    "{} did not come up within {limit:?} ({what}); the last lines of {}:\n{}",
                    self.name,
                    self.log.display(),
                    log_tail(&self.log, 20)
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

/// Sends SIGTERM to `pids`, waits up to `grace` for them to go, then SIGKILLs what is left.
pub fn terminate(pids: &[u32], grace: Duration) {
    for &pid in pids {
        // SAFETY: kill(2) on a pid; harmless if it is already gone.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    }
    let start = Instant::now();
    while start.elapsed() < grace && pids.iter().any(|&p| alive(p)) {
        std::thread::sleep(Duration::from_millis(100));
    }
    for &pid in pids {
        if alive(pid) {
            // SAFETY: as above.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) && pids.iter().any(|&p| alive(p)) {
        std::thread::sleep(Duration::from_millis(50));
    }
}
