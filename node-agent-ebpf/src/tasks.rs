//! Fork and exit counting per cgroup.
//!
//! Both tracepoints fire in the context of the task concerned, so the current task's cgroup is
//! the cgroup to charge:
//! - `sched_process_fork` fires in the parent, in `kernel_clone()` after `copy_process()`
//!   succeeded (kernel/fork.c), for processes and threads alike;
//! - `sched_process_exit` fires in the exiting task, in `do_exit()` (kernel/exit.c).
//!
//! Only cgroups that user space has put into `TASK_COUNTS` are counted: a lookup miss is the
//! early filter, so untracked cgroups cost one hash lookup.

use aya_ebpf::{
    helpers::bpf_get_current_cgroup_id, macros::map, macros::tracepoint, maps::PerCpuHashMap,
    programs::TracePointContext,
};
use node_agent_common::{TaskCounts, MAX_TRACKED_CGROUPS};

/// Key: cgroup v2 id (the inode number of the cgroup's directory).
#[map]
static TASK_COUNTS: PerCpuHashMap<u64, TaskCounts> =
    PerCpuHashMap::with_max_entries(MAX_TRACKED_CGROUPS, 0);

#[tracepoint(category = "sched", name = "sched_process_fork")]
pub fn sched_process_fork(_ctx: TracePointContext) -> u32 {
    try_count(|c| c.forks += 1);
    0
}

#[tracepoint(category = "sched", name = "sched_process_exit")]
pub fn sched_process_exit(_ctx: TracePointContext) -> u32 {
    try_count(|c| c.exits += 1);
    0
}

#[inline(always)]
fn try_count(bump: impl FnOnce(&mut TaskCounts)) {
    // SAFETY: helper without arguments; available to tracepoint programs since 4.18.
    let cgroup = unsafe { bpf_get_current_cgroup_id() };
    if let Some(counts) = TASK_COUNTS.get_ptr_mut(cgroup) {
        // SAFETY: the pointer is this CPU's slot of a per-CPU map value, valid for the program's
        // run and written by no other CPU.
        bump(unsafe { &mut *counts });
    }
}
