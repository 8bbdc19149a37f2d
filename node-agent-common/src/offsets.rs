//! Kernel struct offsets, read from the running kernel's BTF at load time and handed to the
//! programs as a global, because Rust eBPF has no CO-RE field relocations.

/// Byte offsets and indices the programs need. `valid == 1` once user space filled it in; the
/// programs do nothing with task structs while it is 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    pub valid: u32,
    /// `enum cgroup_subsys_id` value of the memory controller (`memory_cgrp_id`).
    pub memory_cgrp_id: u32,
    // struct task_struct
    pub task_pid: u32,
    pub task_tgid: u32,
    pub task_comm: u32,
    pub task_cgroups: u32,
    pub task_mm: u32,
    pub task_signal: u32,
    /// struct css_set: `subsys[]` (array of `struct cgroup_subsys_state *`).
    pub css_set_subsys: u32,
    /// struct cgroup_subsys_state: `cgroup`.
    pub css_cgroup: u32,
    /// struct cgroup: `kn`.
    pub cgroup_kn: u32,
    /// struct cgroup: `subsys[]` (array of `struct cgroup_subsys_state *`).
    pub cgroup_subsys: u32,
    /// struct kernfs_node: `id` (u64 since 5.5).
    pub kernfs_node_id: u32,
    /// struct signal_struct: `oom_score_adj` (short).
    pub signal_oom_score_adj: u32,
    /// struct mm_struct: `total_vm` (pages).
    pub mm_total_vm: u32,
    /// RSS counter `i` of an mm is the i64 at `mm + mm_rss_base + i * mm_rss_stride`
    /// (`rss_stat[i].count` of a percpu_counter array since 6.2, `rss_stat.count[i]` before).
    pub mm_rss_base: u32,
    pub mm_rss_stride: u32,
    pub mm_filepages: u32,
    pub mm_anonpages: u32,
    pub mm_shmempages: u32,
    /// struct mem_cgroup: `css` and `memory` (struct page_counter).
    pub memcg_css: u32,
    pub memcg_memory: u32,
    /// struct page_counter: `usage` (atomic_long_t, pages), `max` (pages), `parent`.
    pub page_counter_usage: u32,
    pub page_counter_max: u32,
    pub page_counter_parent: u32,
    /// 1 when `mark_victim`'s BTF tracepoint passes the uid as its second argument.
    pub mark_victim_has_uid: u32,
    /// log2 of the page size: page counters count pages.
    pub page_shift: u32,
    /// Live PIDs: `task->thread_pid->numbers[0].ns->pid_allocated` is the initial PID
    /// namespace's count of allocated PIDs (kernel/pid.c), the figure `pid_max` limits.
    pub task_thread_pid: u32,
    pub pid_numbers: u32,
    pub upid_ns: u32,
    pub pidns_pid_allocated: u32,
    /// struct pid_namespace: `pid_max`, each namespace's own since 6.14 (kernel/pid.c), 0 where
    /// the kernel has none (before 6.14 `pid_max` is one global figure, the same read from any
    /// namespace's `/proc/sys/kernel/pid_max`).
    pub pidns_pid_max: u32,
}

const _: () = assert!(core::mem::size_of::<KernelOffsets>() == 128);

crate::user_pod!(KernelOffsets);
