//! Per-cgroup task accounting kept by the fork/exit programs.

/// Forks and exits seen in one cgroup, on one CPU. The map holding it is per-CPU, so the
/// kernel side never contends; user space sums the values of all CPUs.
///
/// Both counts include threads: `sched_process_fork` and `sched_process_exit` fire for every
/// task, which is also what the pids controller and `pid_max` count.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskCounts {
    /// Tasks created into this cgroup (the child's cgroup at fork time).
    pub forks: u64,
    /// Tasks of this cgroup that exited.
    pub exits: u64,
}

const _: () = assert!(core::mem::size_of::<TaskCounts>() == 16);

impl TaskCounts {
    /// Sums per-CPU values.
    pub fn sum<'a>(values: impl IntoIterator<Item = &'a TaskCounts>) -> TaskCounts {
        values
            .into_iter()
            .fold(TaskCounts::default(), |acc, v| TaskCounts {
                forks: acc.forks.wrapping_add(v.forks),
                exits: acc.exits.wrapping_add(v.exits),
            })
    }
}

/// The node's PID limit and the `pid.available` threshold, one entry in an array map.
///
/// The kernel side reads the live task count (`nr_threads`) itself on every fork and exit, so
/// `limit - nr_threads` is the kubelet's `pid.available`, evaluated without scanning `/proc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PidLimits {
    /// min(pid_max, threads-max).
    pub limit: u64,
    /// Emit `PidThreshold` when `limit - live` drops below this; 0 disables.
    pub threshold: u64,
    /// Re-arm once `limit - live` is back above `threshold + hysteresis`.
    pub hysteresis: u64,
    /// Kernel-owned: 1 while below the threshold (an event was sent), else 0.
    pub below: u32,
    pub _pad: u32,
}

const _: () = assert!(core::mem::size_of::<PidLimits>() == 32);

crate::user_pod!(TaskCounts, PidLimits);
