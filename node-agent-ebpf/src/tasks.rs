//! Fork and exit counting per memory cgroup, the node's live task count for `pid.available`,
//! and fork-storm detection.
//!
//! - `tp_btf/sched_process_fork` receives `(struct task_struct *parent, struct task_struct
//!   *child)` (include/trace/events/sched.h); it fires in `kernel_clone()` after
//!   `copy_process()` succeeded, for processes and threads alike, with the child already in its
//!   cgroups (so `clone3(CLONE_INTO_CGROUP)` is charged to the right one).
//! - `tp_btf/sched_process_exit` receives the exiting task as its first argument; it fires in
//!   `do_exit()` (kernel/exit.c) for every task.
//!
//! Tasks are charged to their memory cgroup (the id the memory thresholds use), which on v1
//! and v2 alike is the pod or container cgroup the kubelet created.

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map},
    maps::{Array, HashMap, PerCpuHashMap},
    programs::BtfTracePointContext,
};
use node_agent_common::{
    ForkRateLimit, ForkStormEvent, KernelOffsets, PidLimits, PidThresholdEvent, TaskCounts,
    DIRECTION_DOWN, DIRECTION_UP, KIND_FORK_STORM, KIND_PID_THRESHOLD, MAX_TRACKED_CGROUPS,
};

use crate::{
    kernel::{load, task_memcg_id_btf},
    maps::{emit, header, OFFSETS},
};

/// Key: memory cgroup id. Only cgroups user space inserted are counted (a miss is the filter).
#[map]
static TASK_COUNTS: PerCpuHashMap<u64, TaskCounts> =
    PerCpuHashMap::with_max_entries(MAX_TRACKED_CGROUPS, 0);

/// Key: memory cgroup id. Fork-rate limits of watched cgroups.
#[map]
static FORK_LIMITS: HashMap<u64, ForkRateLimit> = HashMap::with_max_entries(MAX_TRACKED_CGROUPS, 0);

/// Index 0: the node's PID limit and the `pid.available` threshold.
#[map]
static PID_LIMITS: Array<PidLimits> = Array::with_max_entries(1, 0);

/// Index 0: the initial PID namespace's `pid_max` as the last fork or exit saw it, on kernels
/// where each namespace has its own (6.14 and later; 0 elsewhere, and before the first). An
/// agent in a pod's PID namespace reads its own namespace's figure from /proc, and the host's
/// here: the host's is what a fork anywhere on the node runs out of.
#[map]
static HOST_PID_MAX: Array<u32> = Array::with_max_entries(1, 0);

#[btf_tracepoint(function = "sched_process_fork")]
pub fn sched_process_fork(ctx: BtfTracePointContext) -> i32 {
    let child: u64 = ctx.arg(1);
    let _ = try_task_event(child, 1);
    0
}

#[btf_tracepoint(function = "sched_process_exit")]
pub fn sched_process_exit(ctx: BtfTracePointContext) -> i32 {
    let task: u64 = ctx.arg(0);
    let _ = try_task_event(task, -1);
    0
}

#[inline(always)]
fn try_task_event(task: u64, delta: i64) -> Result<(), i64> {
    let o = OFFSETS.load();
    if o.valid == 0 {
        return Err(-1);
    }
    if let Some(ns) = initial_pid_namespace(&o, task) {
        check_pid_limit(&o, ns);
        host_pid_max(&o, ns);
    }
    let cgroup = task_memcg_id_btf(&o, task);
    let Some(counts) = TASK_COUNTS.get_ptr_mut(cgroup) else {
        return Ok(());
    };
    // SAFETY: this CPU's slot of a per-CPU map value, valid for the program's run.
    let counts = unsafe { &mut *counts };
    if delta > 0 {
        counts.forks += 1;
        fork_rate(cgroup);
    } else {
        counts.exits += 1;
    }
    Ok(())
}

/// The initial PID namespace, reached through the task: `task->thread_pid->numbers[0].ns`
/// (level 0 of every PID is the initial namespace's). Direct loads from the BTF task pointer
/// (see `kernel::load`).
#[inline(always)]
fn initial_pid_namespace(o: &KernelOffsets, task: u64) -> Option<u64> {
    let pid: u64 = load(task, o.task_thread_pid);
    if pid == 0 {
        return None;
    }
    let ns: u64 = load(pid, o.pid_numbers + o.upid_ns);
    (ns != 0).then_some(ns)
}

/// Keeps `HOST_PID_MAX` at the initial namespace's `pid_max`, written only when it changed.
#[inline(always)]
fn host_pid_max(o: &KernelOffsets, ns: u64) {
    if o.pidns_pid_max == 0 {
        return;
    }
    let Some(slot) = HOST_PID_MAX.get_ptr_mut(0) else {
        return;
    };
    let pid_max: u32 = load(ns, o.pidns_pid_max);
    // SAFETY: the array value lives as long as the map.
    unsafe {
        if *slot != pid_max {
            *slot = pid_max;
        }
    }
}

/// Reports `pid.available` crossings, once each. Live PIDs are the initial PID namespace's
/// `pid_allocated` (kernel/pid.c: `alloc_pid()`/`free_pid()`), which counts every allocated
/// PID, zombies included: what `pid_max` runs out of.
///
/// BPF before cpu v3 has no compare-and-swap, so `below` is a plain flag: two CPUs crossing in
/// the same instant could both report. Crossings are rare; duplicates are harmless downstream.
#[inline(always)]
fn check_pid_limit(o: &KernelOffsets, ns: u64) {
    let Some(limits) = PID_LIMITS.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: the array value lives as long as the map.
    let limits = unsafe { &mut *limits };
    if limits.threshold == 0 {
        return;
    }
    let live = live_pids(o, ns);
    let available = limits.limit as i64 - live;
    let direction = if available < limits.threshold as i64 && limits.below == 0 {
        limits.below = 1;
        DIRECTION_UP
    } else if available > (limits.threshold + limits.hysteresis) as i64 && limits.below == 1 {
        limits.below = 0;
        DIRECTION_DOWN
    } else {
        return;
    };
    emit(&PidThresholdEvent {
        header: header(KIND_PID_THRESHOLD),
        live,
        limit: limits.limit,
        threshold: limits.threshold,
        direction,
        _pad: 0,
    });
}

/// PIDs allocated in the namespace, without its `PIDNS_ADDING` flag bit.
#[inline(always)]
fn live_pids(o: &KernelOffsets, ns: u64) -> i64 {
    let allocated: u32 = load(ns, o.pidns_pid_allocated);
    i64::from(allocated & 0x7fff_ffff)
}

/// Counts a fork against the cgroup's rate window; the first fork over the limit in a window
/// reports a storm, and the storm clears when a whole window stays at or under the limit, a
/// quiet one (no fork at all) included, so the next storm is reported again. Plain
/// (non-atomic) updates: concurrent forks on several CPUs can undercount slightly, which only
/// delays a report by a few forks.
#[inline(always)]
fn fork_rate(cgroup: u64) {
    let Some(limit) = FORK_LIMITS.get_ptr_mut(cgroup) else {
        return;
    };
    // SAFETY: map value valid for the program's run.
    let limit = unsafe { &mut *limit };
    // SAFETY: helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let elapsed = now.wrapping_sub(limit.window_start_ns);
    if elapsed >= limit.window_ns {
        // The window that just ended was calm, or a whole window passed with no fork at all
        // (the first fork after a silence lands here with `elapsed` of two windows or more).
        if limit.forks_in_window <= limit.max_forks || elapsed >= limit.window_ns.saturating_mul(2)
        {
            limit.storming = 0;
        }
        limit.window_start_ns = now;
        limit.forks_in_window = 0;
    }
    limit.forks_in_window += 1;
    if limit.forks_in_window > limit.max_forks && limit.storming == 0 {
        limit.storming = 1;
        emit(&ForkStormEvent {
            header: header(KIND_FORK_STORM),
            cgroup_id: cgroup,
            forks_in_window: limit.forks_in_window,
            window_ns: limit.window_ns,
            max_forks: limit.max_forks,
            pid: (bpf_get_current_pid_tgid() >> 32) as u32,
            _pad: 0,
            comm: bpf_get_current_comm().unwrap_or_default(),
        });
    }
}
