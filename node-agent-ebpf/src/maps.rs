//! Maps and globals shared by all programs, and the one way events leave the kernel.

use aya_ebpf::{
    helpers::{bpf_get_smp_processor_id, bpf_ktime_get_ns},
    macros::map,
    maps::{PerCpuArray, RingBuf},
    Global,
};
use node_agent_common::{EventHeader, KernelOffsets, DEFAULT_RING_BYTES};

/// The one ring buffer every event goes through. User space may resize it at load time.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(DEFAULT_RING_BYTES, 0);

/// Records that did not fit into `EVENTS`, per CPU (index 0). Nothing is dropped silently.
#[map]
pub static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Records the programs tried to write, per CPU (index 0): written = sent − lost.
#[map]
pub static SENT: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Kernel struct offsets from BTF; all zero (and `valid == 0`) until user space sets them.
#[unsafe(no_mangle)]
pub static OFFSETS: Global<KernelOffsets> = Global::new(KernelOffsets {
    valid: 0,
    memory_cgrp_id: 0,
    task_pid: 0,
    task_tgid: 0,
    task_comm: 0,
    task_cgroups: 0,
    task_mm: 0,
    task_signal: 0,
    css_set_subsys: 0,
    css_cgroup: 0,
    cgroup_kn: 0,
    cgroup_subsys: 0,
    kernfs_node_id: 0,
    signal_oom_score_adj: 0,
    mm_total_vm: 0,
    mm_rss_base: 0,
    mm_rss_stride: 0,
    mm_filepages: 0,
    mm_anonpages: 0,
    mm_shmempages: 0,
    memcg_css: 0,
    memcg_memory: 0,
    page_counter_usage: 0,
    page_counter_max: 0,
    page_counter_parent: 0,
    mark_victim_has_uid: 0,
    page_shift: 12,
    task_thread_pid: 0,
    pid_numbers: 0,
    upid_ns: 0,
    pidns_pid_allocated: 0,
    pidns_pid_max: 0,
});

/// A header for an event of `kind` seen now on this CPU.
#[inline(always)]
pub fn header(kind: u32) -> EventHeader {
    EventHeader {
        kind,
        // SAFETY: helpers without arguments, available to every tracing program.
        cpu: unsafe { bpf_get_smp_processor_id() },
        ktime_ns: unsafe { bpf_ktime_get_ns() },
    }
}

/// Writes one event into the ring buffer, or counts it as lost when the buffer is full.
#[inline(always)]
pub fn emit<T: 'static>(event: &T) {
    if let Some(sent) = SENT.get_ptr_mut(0) {
        // SAFETY: this CPU's slot of a per-CPU array; no other CPU writes it.
        unsafe { *sent += 1 };
    }
    if EVENTS.output::<T>(event, 0).is_err() {
        if let Some(lost) = LOST.get_ptr_mut(0) {
            // SAFETY: this CPU's slot of a per-CPU array; no other CPU writes it.
            unsafe { *lost += 1 };
        }
    }
}
