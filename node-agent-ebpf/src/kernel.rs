//! Reading kernel structs through offsets from BTF. Every read goes through
//! `bpf_probe_read_kernel`, so a wrong offset yields an error, never a crash.

use aya_ebpf::helpers::bpf_probe_read_kernel;
use node_agent_common::KernelOffsets;

/// Reads a `T` at `base + offset`.
#[inline(always)]
pub fn read<T>(base: u64, offset: u32) -> Result<T, i64> {
    if base == 0 {
        return Err(-1);
    }
    // SAFETY: bpf_probe_read_kernel checks the address and fails cleanly on a bad one.
    unsafe { bpf_probe_read_kernel((base + u64::from(offset)) as *const T).map_err(i64::from) }
}

/// The id of the cgroup that owns a css (`css->cgroup->kn->id`), i.e. the inode number of the
/// cgroup's directory (include/linux/cgroup.h: `cgroup_id()`).
#[inline(always)]
pub fn css_cgroup_id(o: &KernelOffsets, css: u64) -> Result<u64, i64> {
    let cgroup: u64 = read(css, o.css_cgroup)?;
    let kn: u64 = read(cgroup, o.cgroup_kn)?;
    read(kn, o.kernfs_node_id)
}

/// The memory-controller css of a task: `task->cgroups->subsys[memory_cgrp_id]`
/// (include/linux/cgroup.h: `task_css()`).
#[inline(always)]
pub fn task_memcg_css(o: &KernelOffsets, task: u64) -> Result<u64, i64> {
    let css_set: u64 = read(task, o.task_cgroups)?;
    let index = o.memory_cgrp_id & 0x3f;
    read(css_set, o.css_set_subsys + index * 8)
}

/// The id of the task's memory cgroup, v1 or v2 alike: the same id the `memcg:*` tracepoints
/// report and the inode number of the cgroup's directory in the memory hierarchy.
#[inline(always)]
pub fn task_memcg_id(o: &KernelOffsets, task: u64) -> Result<u64, i64> {
    let css = task_memcg_css(o, task)?;
    css_cgroup_id(o, css)
}
