//! Cgroup creation and removal, so user space keeps its cgroup index current without walking
//! cgroupfs on a timer. `tp_btf/cgroup_mkdir` and `tp_btf/cgroup_rmdir` receive
//! `(struct cgroup *cgrp, const char *path)` (include/trace/events/cgroup.h, class
//! `cgroup`); they fire in `cgroup_mkdir()`/`cgroup_rmdir()` (kernel/cgroup/cgroup.c).
//! At most one event per CPU per `MIN_INTERVAL_NS`: user space only needs to know that
//! something changed, and a burst of cgroup creation must not crowd other events out.

use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{btf_tracepoint, map},
    maps::PerCpuArray,
    programs::BtfTracePointContext,
};
use node_agent_common::{CgroupChangeEvent, KIND_CGROUP_CHANGE};

use crate::{
    kernel::read,
    maps::{emit, header, OFFSETS},
};

const MIN_INTERVAL_NS: u64 = 1_000_000;

#[map]
static LAST_CGROUP_EVENT: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[btf_tracepoint(function = "cgroup_mkdir")]
pub fn cgroup_mkdir(ctx: BtfTracePointContext) -> i32 {
    let _ = try_cgroup_change(ctx.arg(0), 1);
    0
}

#[btf_tracepoint(function = "cgroup_rmdir")]
pub fn cgroup_rmdir(ctx: BtfTracePointContext) -> i32 {
    let _ = try_cgroup_change(ctx.arg(0), 0);
    0
}

#[inline(always)]
fn try_cgroup_change(cgroup: u64, created: u32) -> Result<(), i64> {
    let last = LAST_CGROUP_EVENT.get_ptr_mut(0).ok_or(-1i64)?;
    // SAFETY: helper without arguments; `last` is this CPU's slot.
    let now = unsafe { bpf_ktime_get_ns() };
    unsafe {
        if now.wrapping_sub(*last) < MIN_INTERVAL_NS {
            return Ok(());
        }
        *last = now;
    }
    let o = OFFSETS.load();
    let kn: u64 = read(cgroup, o.cgroup_kn)?;
    let cgroup_id = read(kn, o.kernfs_node_id)?;
    emit(&CgroupChangeEvent {
        header: header(KIND_CGROUP_CHANGE),
        cgroup_id,
        created,
        _pad: 0,
    });
    Ok(())
}
