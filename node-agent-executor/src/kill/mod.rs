//! Killing a pod on the node, the executor's node sink: what the kubelet does itself for a hard
//! eviction threshold, without the API round trip. Every process in the pod's cgroup (its
//! containers and its sandbox) is sent SIGKILL, then each one's memory is given back at once
//! with `process_mrelease(2)` (mm/oom_kill.c: it unmaps a dying process's address space in the
//! caller, as the kernel's OOM reaper does), instead of when the dying process is next
//! scheduled.
//!
//! A kill touches only what was verified: the pod's cgroup directory must still be the one
//! the decision found (the same id, see [`KillTarget`]), and a process is signalled only if it
//! is in that cgroup's subtree while the kill holds a handle that pins it (a pidfd): each round
//! lists the subtree, pins every process not yet signalled, lists the subtree again, and
//! signals the pinned processes the second listing still shows. A process id reused between
//! the first listing and the pin names a process outside the cgroup, which the second listing
//! does not show. A process with SIGKILL pending cannot fork, so rounds end once one finds
//! nothing new: a fork storm is over within a few.
//!
//! Nothing is held back from the kernel: no freezer, no limit. If the agent stops halfway, the
//! processes already signalled die anyway and the rest run on.
//!
//! [`kill_pod`] is the round logic, over [`Processes`]; [`host::Host`] is the real one
//! (pidfds, cgroupfs), tested against the real kernel in `tests/tests/kernel_kill.rs`.

pub mod host;

use std::{
    collections::{BTreeMap, BTreeSet},
    io,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// Rounds of list, pin, list, signal at most: a fork storm's children are all signalled within
/// a few (a process with SIGKILL pending cannot fork).
pub const MAX_ROUNDS: u32 = 32;
/// Processes one kill signals at most (the pods' process count is bounded by the kubelet's
/// `podPidsLimit` and the node's `pid_max` far below this).
pub const MAX_PROCESSES: usize = 1 << 16;

/// A pod's cgroup, as the decision verified it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KillTarget {
    /// The pod's UID, which the cgroup's name carries.
    pub pod_uid: String,
    /// The pod's cgroup directory in the hierarchy that holds the memory controller.
    pub cgroup: PathBuf,
    /// Its id (the directory's inode) when it was verified: a directory made anew at the same
    /// path is another cgroup, and is not touched.
    pub cgroup_id: u64,
}

/// What a kill did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Killed {
    /// Processes sent SIGKILL (0: nothing was left to kill).
    pub signalled: usize,
    pub rounds: u32,
    /// From the kill's start until the last process was signalled: the pod's growth stopped.
    pub signalled_in: Duration,
    /// Every process the cgroup held was signalled; `false`: new ones still appeared after
    /// [`MAX_ROUNDS`] rounds or the deadline (a storm the next decision may kill again).
    pub complete: bool,
}

/// A kill's processes, signalled and still pinned, for [`release`].
pub struct Signalled<P: Processes> {
    pub killed: Killed,
    pinned: Vec<P::Pinned>,
    started: Instant,
}

impl<P: Processes> std::fmt::Debug for Signalled<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signalled")
            .field("killed", &self.killed)
            .field("pinned", &self.pinned.len())
            .finish()
    }
}

/// How the signalled processes' memory was given back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// `process_mrelease` returned for every process, this long after the kill's start:
    /// `reaped` had their memory unmapped by it, `skipped` not (they had exited already, had
    /// no memory of their own left, or were busy exiting: they give it back themselves).
    Released {
        reaped: usize,
        skipped: usize,
        after: Duration,
    },
    /// The kernel (before 5.15) or a seccomp profile refused `process_mrelease` (the errno):
    /// the processes give their memory back as they exit.
    Unavailable(i32),
    /// Nothing was signalled.
    Nothing,
}

#[derive(Debug, thiserror::Error)]
pub enum KillError {
    #[error("the pod's cgroup {} is gone", .path.display())]
    Gone { path: PathBuf },
    #[error("{} is not the cgroup verified for the pod (its id is {found}, the verified one {expected})", .path.display())]
    NotVerified {
        path: PathBuf,
        expected: u64,
        found: u64,
    },
    #[error("reading {}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("signalling process {pid}")]
    Signal {
        pid: u32,
        #[source]
        source: io::Error,
    },
    #[error("the pod's cgroup holds more than {MAX_PROCESSES} processes")]
    TooMany,
}

/// The processes of a cgroup subtree and what may be done to them; [`host::Host`] on a real
/// node, a table in tests.
pub trait Processes {
    /// Pins one process (a pidfd): the handle keeps naming it even after its id is reused.
    type Pinned;
    /// The cgroup's id (its directory's inode), `Ok(None)` when it is gone.
    fn cgroup_id(&mut self, cgroup: &Path) -> Result<Option<u64>, KillError>;
    /// Every process id in the cgroup and below it, now.
    fn list(&mut self, cgroup: &Path) -> Result<BTreeSet<u32>, KillError>;
    /// Pins the process with this id; `None` when it has gone.
    fn pin(&mut self, pid: u32) -> Option<Self::Pinned>;
    /// Whether the pinned process has not been reaped yet (its id is still its own).
    fn alive(&mut self, pinned: &Self::Pinned) -> bool;
    /// SIGKILL; `Ok(false)` when it had gone already.
    fn kill(&mut self, pid: u32, pinned: &Self::Pinned) -> io::Result<bool>;
    /// `process_mrelease(2)`: `Ok(true)` reaped, `Ok(false)` nothing to reap (gone, or
    /// exiting on its own); `Err(errno)` when the kernel refuses the call itself (absent, or a
    /// seccomp profile).
    fn release(&mut self, pinned: &Self::Pinned) -> Result<bool, i32>;
}

/// Kills every process of `target`'s cgroup: each is sent SIGKILL, and its growth stops. The
/// processes stay pinned for [`release`]. `deadline` bounds the rounds.
pub fn kill_pod<P: Processes>(
    procs: &mut P,
    target: &KillTarget,
    deadline: Duration,
) -> Result<Signalled<P>, KillError> {
    let start = Instant::now();
    let path = target.cgroup.as_path();
    match procs.cgroup_id(path)? {
        None => {
            return Err(KillError::Gone {
                path: path.to_path_buf(),
            })
        }
        Some(found) if found != target.cgroup_id => {
            return Err(KillError::NotVerified {
                path: path.to_path_buf(),
                expected: target.cgroup_id,
                found,
            })
        }
        Some(_) => {}
    }
    let mut signalled: BTreeMap<u32, P::Pinned> = BTreeMap::new();
    let mut rounds = 0;
    let mut complete = true;
    loop {
        let listed = match procs.list(path) {
            Ok(l) => l,
            // Gone while killing: every process in it has exited.
            Err(_) if procs.cgroup_id(path)?.is_none() => break,
            Err(e) => return Err(e),
        };
        let mut fresh: Vec<u32> = Vec::new();
        for pid in listed {
            let known = match signalled.get(&pid) {
                Some(pinned) => procs.alive(pinned),
                None => false,
            };
            if !known {
                fresh.push(pid);
            }
        }
        if fresh.is_empty() {
            break;
        }
        rounds += 1;
        if rounds > MAX_ROUNDS || start.elapsed() > deadline {
            complete = false;
            break;
        }
        if signalled.len() + fresh.len() > MAX_PROCESSES {
            return Err(KillError::TooMany);
        }
        let pinned: Vec<(u32, P::Pinned)> = fresh
            .into_iter()
            .filter_map(|pid| procs.pin(pid).map(|p| (pid, p)))
            .collect();
        let confirmed = procs.list(path).unwrap_or_default();
        for (pid, p) in pinned {
            if !confirmed.contains(&pid) {
                continue;
            }
            match procs.kill(pid, &p) {
                Ok(_) => {
                    signalled.insert(pid, p);
                }
                Err(source) => return Err(KillError::Signal { pid, source }),
            }
        }
    }
    Ok(Signalled {
        killed: Killed {
            signalled: signalled.len(),
            rounds,
            signalled_in: start.elapsed(),
            complete,
        },
        pinned: signalled.into_values().collect(),
        started: start,
    })
}

/// Gives the signalled processes' memory back at once (`process_mrelease`), rather than as
/// each exits. Helps most where a victim is slow to run its own exit (a CPU-throttled
/// container); one already exiting has taken its address space with it, and is skipped.
pub fn release<P: Processes>(procs: &mut P, signalled: Signalled<P>) -> Release {
    if signalled.pinned.is_empty() {
        return Release::Nothing;
    }
    let (mut reaped, mut skipped) = (0, 0);
    for p in &signalled.pinned {
        match procs.release(p) {
            Ok(true) => reaped += 1,
            Ok(false) => skipped += 1,
            Err(errno) => return Release::Unavailable(errno),
        }
    }
    Release::Released {
        reaped,
        skipped,
        after: signalled.started.elapsed(),
    }
}

#[cfg(test)]
mod tests;
