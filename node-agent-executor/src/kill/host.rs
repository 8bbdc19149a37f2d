//! The real [`Processes`](super::Processes): cgroupfs for who is in the pod's cgroup, pidfds
//! (`pidfd_open(2)`, Linux 5.3) to pin each process, `pidfd_send_signal(2)` to kill it and
//! `process_mrelease(2)` (5.15) to give its memory back.
//!
//! Process ids in `cgroup.procs` are those of the reader's PID namespace: the agent must share
//! the host's (`hostPID: true`), or it would see none of the pods' processes (cgroup v1 leaves
//! the others out, v2 lists them as 0). [`Host::new`] refuses to start elsewhere.

use std::{
    collections::BTreeSet,
    fs::File,
    io::{self, Read as _},
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::fs::MetadataExt as _,
    },
    path::{Path, PathBuf},
};

use super::KillError;

/// The inode of the initial PID namespace (`PROC_PID_INIT_INO`, include/linux/proc_ns.h):
/// `/proc/self/ns/pid` names it when this process shares the host's PID namespace.
const PROC_PID_INIT_INO: u64 = 0xEFFF_FFFC;
/// How deep below the pod's cgroup processes are looked for (the kubelet's layout puts them
/// one level down, in a cgroup per container; runtimes that nest go one or two further).
const MAX_DEPTH: usize = 4;
/// One `cgroup.procs` is read up to this size (an id is at most 8 characters and a newline).
const MAX_PROCS_FILE: u64 = 1 << 20;

/// `CAP_KILL` (include/uapi/linux/capability.h): signalling processes of other users.
const CAP_KILL: u32 = 5;

/// Why the node sink cannot kill here.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("the agent is not in the host's PID namespace (it needs hostPID: true), so the pods' processes are not visible to it")]
    NotHostPid,
    #[error("the agent lacks CAP_KILL, so it cannot kill the processes of pods that run as another user")]
    NoCapKill,
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Whether this process shares the host's PID namespace.
pub fn in_host_pid_namespace() -> Result<bool, HostError> {
    let path = Path::new("/proc/self/ns/pid");
    let meta = std::fs::metadata(path).map_err(|source| HostError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(meta.ino() == PROC_PID_INIT_INO)
}

/// Whether this process may kill the pods' processes: it sees them (the host's PID namespace)
/// and may signal any user's (`CAP_KILL` effective).
pub fn node_kill_available() -> Result<(), HostError> {
    if !in_host_pid_namespace()? {
        return Err(HostError::NotHostPid);
    }
    let path = Path::new("/proc/self/status");
    let status = std::fs::read_to_string(path).map_err(|source| HostError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let effective = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    if effective & (1 << CAP_KILL) == 0 {
        return Err(HostError::NoCapKill);
    }
    Ok(())
}

/// Whether the cgroup `dir`, or one below it, holds a process this process can see (a cgroup
/// that is gone holds none).
pub fn has_processes(dir: &Path) -> bool {
    let mut pids = BTreeSet::new();
    collect(dir, MAX_DEPTH, &mut pids).is_ok() && !pids.is_empty()
}

/// The host's processes, seen from the host's PID namespace.
#[derive(Debug)]
pub struct Host {
    own_pid: u32,
}

impl Host {
    /// Refuses unless the agent shares the host's PID namespace.
    pub fn new() -> Result<Self, HostError> {
        if !in_host_pid_namespace()? {
            return Err(HostError::NotHostPid);
        }
        Ok(Self {
            own_pid: std::process::id(),
        })
    }
}

fn read_err(path: &Path) -> impl FnOnce(io::Error) -> KillError + '_ {
    move |source| KillError::Read {
        path: path.to_path_buf(),
        source,
    }
}

fn gone(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENODEV)
}

/// Appends the ids in `dir/cgroup.procs` and walks its child cgroups.
fn collect(dir: &Path, depth: usize, into: &mut BTreeSet<u32>) -> Result<(), KillError> {
    let procs = dir.join("cgroup.procs");
    let mut text = String::new();
    match File::open(&procs) {
        Ok(f) => {
            f.take(MAX_PROCS_FILE)
                .read_to_string(&mut text)
                .map_err(read_err(&procs))?;
        }
        // Removed while walking: its processes have exited.
        Err(e) if gone(&e) => return Ok(()),
        Err(e) => return Err(read_err(&procs)(e)),
    }
    // cgroup v2 lists a process outside the reader's PID namespace as 0: never a target.
    into.extend(
        text.lines()
            .filter_map(|l| l.trim().parse::<u32>().ok())
            .filter(|pid| *pid > 1),
    );
    if depth == 0 {
        return Ok(());
    }
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if gone(&e) => return Ok(()),
        Err(e) => return Err(read_err(dir)(e)),
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            collect(&entry.path(), depth - 1, into)?;
        }
    }
    Ok(())
}

// SAFETY (all four): the syscalls take plain integers and a null siginfo; the return value is
// checked before anything is made of it.
fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new file descriptor the kernel just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn pidfd_signal(fd: &OwnedFd, signal: i32) -> io::Result<()> {
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn mrelease(fd: &OwnedFd) -> io::Result<()> {
    let rc = unsafe { libc::syscall(libc::SYS_process_mrelease, fd.as_raw_fd(), 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl super::Processes for Host {
    type Pinned = OwnedFd;

    fn cgroup_id(&mut self, cgroup: &Path) -> Result<Option<u64>, KillError> {
        match std::fs::metadata(cgroup) {
            Ok(m) => Ok(Some(m.ino())),
            Err(e) if gone(&e) => Ok(None),
            Err(e) => Err(read_err(cgroup)(e)),
        }
    }

    fn list(&mut self, cgroup: &Path) -> Result<BTreeSet<u32>, KillError> {
        let mut pids = BTreeSet::new();
        collect(cgroup, MAX_DEPTH, &mut pids)?;
        // Never the agent itself, whatever a cgroup says.
        pids.remove(&self.own_pid);
        Ok(pids)
    }

    fn pin(&mut self, pid: u32) -> Option<OwnedFd> {
        pidfd_open(pid).ok()
    }

    fn alive(&mut self, pinned: &OwnedFd) -> bool {
        // Signal 0 checks without sending: ESRCH once the process is reaped (a zombie, whose id
        // nobody else can have yet, still answers).
        pidfd_signal(pinned, 0).is_ok()
    }

    fn kill(&mut self, _pid: u32, pinned: &OwnedFd) -> io::Result<bool> {
        match pidfd_signal(pinned, libc::SIGKILL) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn release(&mut self, pinned: &OwnedFd) -> Result<bool, i32> {
        match mrelease(pinned) {
            Ok(()) => Ok(true),
            Err(e) => match e.raw_os_error() {
                // Gone already, or exiting without an address space left to reap (or with
                // its lock held by its own exit).
                Some(libc::ESRCH | libc::EINVAL | libc::EAGAIN | libc::EINTR) => Ok(false),
                Some(errno) => Err(errno),
                None => Err(0),
            },
        }
    }
}
