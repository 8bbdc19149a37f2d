//! Reading kernel structs through offsets from BTF.
//!
//! Two ways: [`read`] goes through `bpf_probe_read_kernel` and works on any address (a wrong
//! one yields an error, never a crash); [`load`] is a plain load, for the pointers a BTF
//! program receives as arguments and the pointer fields reached from them: the verifier knows
//! their types from the kernel's BTF and the offsets as constants (`OFFSETS` is frozen
//! read-only data), checks each access against the struct layout and makes it fault-safe (a bad
//! pointer reads as 0). A load costs one instruction where a helper call costs tens of
//! nanoseconds, which matters on paths that run on every fork and exit.

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

/// Reads a `T` at `base + offset`, where `base` is a BTF pointer (see the module comment).
/// Pointer fields come back as `u64` and may be loaded from in turn.
#[inline(always)]
pub fn load<T: Copy>(base: u64, offset: u32) -> T {
    // SAFETY: the verifier only accepts this load when `base` is a typed kernel pointer and
    // `base + offset` a field of `size_of::<T>()` bytes in its BTF type; such loads are
    // exception-handled by the JIT, so a NULL or stale pointer reads as zero.
    unsafe { core::ptr::read_volatile((base as *const u8).add(offset as usize) as *const T) }
}

/// [`task_memcg_id`] by direct loads from a BTF task pointer: `task->cgroups->subsys[memory]
/// ->cgroup->kn->id`. 0 when any link is missing.
#[inline(always)]
pub fn task_memcg_id_btf(o: &KernelOffsets, task: u64) -> u64 {
    let css_set: u64 = load(task, o.task_cgroups);
    if css_set == 0 {
        return 0;
    }
    let css: u64 = load(css_set, o.css_set_subsys + (o.memory_cgrp_id & 0x3f) * 8);
    if css == 0 {
        return 0;
    }
    let cgroup: u64 = load(css, o.css_cgroup);
    if cgroup == 0 {
        return 0;
    }
    let kn: u64 = load(cgroup, o.cgroup_kn);
    if kn == 0 {
        return 0;
    }
    load(kn, o.kernfs_node_id)
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
