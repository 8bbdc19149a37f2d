//! Per-cgroup task accounting kept by the fork/exit programs.

/// Forks and exits seen in one cgroup, on one CPU. The map holding it is per-CPU, so the
/// kernel side never contends; user space sums the values of all CPUs.
///
/// Both counts include threads: `sched_process_fork` and `sched_process_exit` fire for every
/// task, which is also what the pids controller counts.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskCounts {
    /// Tasks created by a task of this cgroup (the parent's cgroup at fork time).
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

#[cfg(feature = "user")]
// SAFETY: plain old data: two u64, no padding, every bit pattern valid.
unsafe impl aya::Pod for TaskCounts {}
