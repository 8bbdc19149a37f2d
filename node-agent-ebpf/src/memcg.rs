//! Memory thresholds evaluated in the kernel on the memcg page counter (`usage`), exactly the
//! figure `memory.current` / `memory.usage_in_bytes` report, so there is no drift to correct.
//!
//! Two ways in, chosen by user space by cost (see `node-agent/src/ebpf/object.rs`):
//!
//! - **fexit on the page counter** (`page_counter_try_charge()`, `page_counter_charge()`,
//!   `page_counter_uncharge()`, mm/page_counter.c, whose first argument is the counter). Memory
//!   cgroups charge their `memory` counter in batches (the per-CPU stock refills
//!   `MEMCG_CHARGE_BATCH` pages at a time, mm/memcontrol.c), so the program runs about once per
//!   64 pages, right after the counter and all its ancestors moved. Usage is hierarchical: the
//!   walk goes up the page-counter parents and checks every watched ancestor (a pod cgroup,
//!   kubepods). Counters that are not a memcg's `memory` counter (memsw, kmem, hugetlb) map to
//!   no watched cgroup id and are skipped.
//! - **An in-kernel sampler**, where fexit cannot attach: a `bpf_timer` reads each watched
//!   line's page counter and nothing runs on the fault path at all. It reads a line again once
//!   the charge-rate bound could have closed its headroom beyond one largest single charge,
//!   plus 1 ms (the shortest period), and at least every 250 ms (`SamplerControl::wait_ns`):
//!   every 1 ms near a line, a few times a second while all are far, since each tick costs an
//!   interrupt and wakes an idle CPU. A BPF program on the `memcg:*` tracepoints, which fire
//!   several times per page, costs more than the 3 % budget before it does anything
//!   (measured: an empty program on `mod_memcg_lruvec_state` alone slows a page-fault loop by
//!   about 6 %), and it cannot see a crossing that no later memory event follows. The timer
//!   sees every crossing within the bound one shortest period after it whatever the workload
//!   does next, at the cost of one short callback per period while a line is set, and none
//!   while none is. It lives in [`crate::sampler`].
//!
//! Both end in [`check`], which reports each crossing once.

use aya_ebpf::{
    macros::{fexit, map},
    maps::HashMap,
    programs::FExitContext,
};
use node_agent_common::{
    KernelOffsets, MemoryThreshold, MemoryThresholdEvent, DIRECTION_DOWN, DIRECTION_UP,
    KIND_MEMORY_THRESHOLD, MAX_TRACKED_CGROUPS,
};

use crate::{
    kernel::{css_cgroup_id, read},
    maps::{emit, header, OFFSETS},
};

const MAX_DEPTH: u32 = 8;

/// Key: memory cgroup id.
#[map]
pub(crate) static MEMORY_THRESHOLDS: HashMap<u64, MemoryThreshold> =
    HashMap::with_max_entries(MAX_TRACKED_CGROUPS, 0);

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

/// Checks the thresholds of the memcg owning `counter` and of each ancestor.
#[inline(always)]
fn walk_from_counter(mut counter: u64) -> Result<(), i64> {
    let o = OFFSETS.load();
    if o.valid == 0 {
        return Err(-1);
    }
    for _ in 0..MAX_DEPTH {
        let id = counter_cgroup_id(&o, counter)?;
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

/// The cgroup id of the memcg whose `memory` counter this is: struct mem_cgroup embeds both its
/// css and that counter (include/linux/memcontrol.h).
#[inline(always)]
pub(crate) fn counter_cgroup_id(o: &KernelOffsets, counter: u64) -> Result<u64, i64> {
    let css = counter - u64::from(o.memcg_memory) + u64::from(o.memcg_css);
    css_cgroup_id(o, css)
}

/// One event per crossing. The plain read of `above` keeps the common case free of atomics;
/// the flip is an atomic exchange, so when two CPUs (two timers, or fexit on two CPUs) see
/// the same crossing at once only the one that flips the flag reports it.
#[inline(always)]
pub(crate) fn check(cgroup: u64, usage: u64, t: *mut MemoryThreshold) {
    // SAFETY: map value valid for the program's run.
    let t = unsafe { &mut *t };
    let direction = if usage >= t.bytes && t.above == 0 {
        if exchange(&mut t.above, 1) != 0 {
            return;
        }
        DIRECTION_UP
    } else if usage < t.bytes.saturating_sub(t.hysteresis) && t.above == 1 {
        if exchange(&mut t.above, 0) != 1 {
            return;
        }
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

/// Stores `value` and returns what was there, atomically (BPF_XCHG).
#[inline(always)]
fn exchange(flag: &mut u64, value: u64) -> u64 {
    // SAFETY: `flag` is a valid, aligned u64 in a map value.
    unsafe {
        core::intrinsics::atomic_xchg::<u64, { core::intrinsics::AtomicOrdering::SeqCst }>(
            flag, value,
        )
    }
}
