//! Memory thresholds evaluated in the kernel on memcg stat updates.
//!
//! `tp_btf/mod_memcg_state`, `tp_btf/mod_memcg_lruvec_state` and `tp_btf/count_memcg_events`
//! receive `(struct mem_cgroup *memcg, int item, val)` (include/trace/events/memcg.h, 6.16+); they
//! fire on the charge and uncharge paths of every page, in the cgroup charged. The program does
//! not accumulate deltas: it reads the authoritative `memcg->memory` page counter
//! (mm/page_counter.c), which is exactly what `memory.current` / `memory.usage_in_bytes`
//! report, so there is no drift to correct. Usage is hierarchical, so the walk goes up the
//! page-counter parents and checks every watched ancestor (a pod cgroup, kubepods).
//!
//! Cost control: the walk runs at most once per `MIN_INTERVAL_NS` per CPU; events in between
//! only read the clock. A crossing is therefore seen within that interval of the update that
//! made it, or at the next update; user space re-checks periodically for the quiet tail.

use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{btf_tracepoint, map},
    maps::{HashMap, PerCpuArray},
    programs::BtfTracePointContext,
};
use node_agent_common::{
    MemoryThreshold, MemoryThresholdEvent, DIRECTION_DOWN, DIRECTION_UP, KIND_MEMORY_THRESHOLD,
    MAX_TRACKED_CGROUPS,
};

use crate::{
    kernel::{css_cgroup_id, read},
    maps::{emit, header, OFFSETS},
};

const MIN_INTERVAL_NS: u64 = 100_000;
const MAX_DEPTH: u32 = 8;

/// Key: memory cgroup id.
#[map]
static MEMORY_THRESHOLDS: HashMap<u64, MemoryThreshold> =
    HashMap::with_max_entries(MAX_TRACKED_CGROUPS, 0);

/// Per CPU: when the last walk ran.
#[map]
static LAST_WALK: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[btf_tracepoint(function = "mod_memcg_state")]
pub fn mod_memcg_state(ctx: BtfTracePointContext) -> i32 {
    let _ = try_memcg_update(ctx.arg(0));
    0
}

#[btf_tracepoint(function = "mod_memcg_lruvec_state")]
pub fn mod_memcg_lruvec_state(ctx: BtfTracePointContext) -> i32 {
    let _ = try_memcg_update(ctx.arg(0));
    0
}

/// `count_memcg_events` fires on the uncharge path too (`uncharge_batch()` counts PGPGOUT
/// after `page_counter_uncharge()`, mm/memcontrol.c), which is what reveals a down-crossing.
#[btf_tracepoint(function = "count_memcg_events")]
pub fn count_memcg_events(ctx: BtfTracePointContext) -> i32 {
    let _ = try_memcg_update(ctx.arg(0));
    0
}

#[inline(always)]
fn try_memcg_update(memcg: u64) -> Result<(), i64> {
    let last = LAST_WALK.get_ptr_mut(0).ok_or(-1i64)?;
    // SAFETY: helper without arguments; `last` is this CPU's slot.
    let now = unsafe { bpf_ktime_get_ns() };
    unsafe {
        if now.wrapping_sub(*last) < MIN_INTERVAL_NS {
            return Ok(());
        }
        *last = now;
    }
    let o = OFFSETS.load();
    if o.valid == 0 {
        return Err(-1);
    }
    let mut counter = memcg + u64::from(o.memcg_memory);
    for _ in 0..MAX_DEPTH {
        let css = counter - u64::from(o.memcg_memory) + u64::from(o.memcg_css);
        let id = css_cgroup_id(&o, css)?;
        if let Some(t) = MEMORY_THRESHOLDS.get_ptr_mut(id) {
            let pages: u64 = read(counter, o.page_counter_usage)?;
            check(id, pages << o.page_shift, t);
        }
        match read::<u64>(counter, o.page_counter_parent) {
            Ok(parent) if parent != 0 => counter = parent,
            _ => break,
        }
    }
    Ok(())
}

/// One event per crossing; `above` is a plain flag (no compare-and-swap before BPF cpu v3), so
/// two CPUs crossing in the same instant could both report; the per-CPU throttle makes that rare.
#[inline(always)]
fn check(cgroup: u64, usage: u64, t: *mut MemoryThreshold) {
    // SAFETY: map value valid for the program's run.
    let t = unsafe { &mut *t };
    let direction = if usage >= t.bytes && t.above == 0 {
        t.above = 1;
        DIRECTION_UP
    } else if usage < t.bytes.saturating_sub(t.hysteresis) && t.above == 1 {
        t.above = 0;
        DIRECTION_DOWN
    } else {
        return;
    };
    emit(&MemoryThresholdEvent {
        header: header(KIND_MEMORY_THRESHOLD),
        cgroup_id: cgroup,
        usage_bytes: usage,
        threshold_bytes: t.bytes,
        direction,
        _pad: 0,
    });
}
