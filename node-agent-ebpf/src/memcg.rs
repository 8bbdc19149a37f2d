//! Memory thresholds evaluated in the kernel whenever a memory cgroup's page counter moves.
//!
//! Preferred hook: `fexit` on `page_counter_try_charge()`, `page_counter_charge()` and
//! `page_counter_uncharge()` (mm/page_counter.c), whose first argument is the counter. Memory
//! cgroups charge their `memory` counter there in batches (the per-CPU stock refills
//! `MEMCG_CHARGE_BATCH` pages at a time, mm/memcontrol.c), so the program runs about once per
//! 64 pages instead of once per page, on every kernel with BTF and trampolines. By the time
//! fexit runs, the function has updated the counter and all its ancestors.
//!
//! Fallback hooks, when fexit cannot attach: `tp_btf/mod_memcg_state`,
//! `tp_btf/mod_memcg_lruvec_state` and `tp_btf/count_memcg_events` (6.16+), which receive
//! `(struct mem_cgroup *memcg, int item, val)` and fire on every page; there a per-CPU
//! throttle bounds the cost (`MIN_INTERVAL_NS`).
//!
//! Either way the program reads the authoritative page counter (`usage`), exactly the figure
//! `memory.current` / `memory.usage_in_bytes` report, so there is no drift to correct. Usage
//! is hierarchical: the walk goes up the page-counter parents and checks every watched
//! ancestor (a pod cgroup, kubepods). Counters that are not a memcg's `memory` counter (memsw,
//! kmem, hugetlb) map to no watched cgroup id and are skipped.

use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{btf_tracepoint, fexit, map},
    maps::{HashMap, PerCpuArray},
    programs::{BtfTracePointContext, FExitContext},
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

/// Per CPU: when the last walk ran (tracepoint fallback only).
#[map]
static LAST_WALK: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[fexit(function = "page_counter_try_charge")]
pub fn page_counter_try_charge(ctx: FExitContext) -> i32 {
    let _ = walk_from_counter(ctx.arg(0));
    0
}

#[fexit(function = "page_counter_charge")]
pub fn page_counter_charge(ctx: FExitContext) -> i32 {
    let _ = walk_from_counter(ctx.arg(0));
    0
}

#[fexit(function = "page_counter_uncharge")]
pub fn page_counter_uncharge(ctx: FExitContext) -> i32 {
    let _ = walk_from_counter(ctx.arg(0));
    0
}

#[btf_tracepoint(function = "mod_memcg_state")]
pub fn mod_memcg_state(ctx: BtfTracePointContext) -> i32 {
    let _ = throttled_memcg_update(ctx.arg(0));
    0
}

#[btf_tracepoint(function = "mod_memcg_lruvec_state")]
pub fn mod_memcg_lruvec_state(ctx: BtfTracePointContext) -> i32 {
    let _ = throttled_memcg_update(ctx.arg(0));
    0
}

/// `count_memcg_events` fires on the uncharge path too (`uncharge_batch()` counts PGPGOUT
/// after `page_counter_uncharge()`, mm/memcontrol.c), which is what reveals a down-crossing.
#[btf_tracepoint(function = "count_memcg_events")]
pub fn count_memcg_events(ctx: BtfTracePointContext) -> i32 {
    let _ = throttled_memcg_update(ctx.arg(0));
    0
}

#[inline(always)]
fn throttled_memcg_update(memcg: u64) -> Result<(), i64> {
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
    walk_from_counter(memcg + u64::from(o.memcg_memory))
}

/// Checks the thresholds of the memcg owning `counter` and of each ancestor.
#[inline(always)]
fn walk_from_counter(mut counter: u64) -> Result<(), i64> {
    let o = OFFSETS.load();
    if o.valid == 0 {
        return Err(-1);
    }
    for _ in 0..MAX_DEPTH {
        // struct mem_cgroup embeds both its css and its `memory` counter.
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
/// two CPUs crossing in the same instant could both report, which is rare and harmless.
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
