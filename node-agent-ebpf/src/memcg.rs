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
//!   line's page counter and nothing runs on the fault path at all. It ticks every 1 ms while
//!   some line is near enough for a plausible charge rate to reach it sooner, and stretches to
//!   at most 5 ms while every line is far (`SamplerControl`): each tick costs its interrupt on
//!   whichever CPU it lands, so a node whose lines are all far pays a fifth. A BPF program on
//!   the `memcg:*` tracepoints, which fire several times per page, costs more than the 3 %
//!   budget before it does anything (measured: an empty program on `mod_memcg_lruvec_state`
//!   alone slows a page-fault loop by about 6 %), and it cannot see a crossing that no later
//!   memory event follows. The timer sees every crossing within one period whatever the
//!   workload does next, at the cost of one short callback per period while a line is set, and
//!   none while none is.
//!
//! The sampler learns where each watched cgroup's page counter lives from a cgroup iterator
//! (`iter/cgroup`, 6.1+) that user space runs per new line on that cgroup's directory: it
//! fills the line's `counter` and starts a timer on the CPU it runs on. User space runs it
//! once per timer ([`SAMPLER_TIMERS`]), each time from another CPU: a timer is pinned where it
//! starts, so when the host deschedules one vCPU (steal, often 10 ms and more on a shared
//! machine) the other timer still ticks. While both tick they take turns, each waiting until
//! one pace after its partner's next tick, so the node ticks as often as with one timer; a
//! timer whose partner is overdue by a whole pace ticks alone at the full pace until the
//! partner is back.
//!
//! Each tick re-checks that the counter still belongs to the line's cgroup
//! (`css->cgroup->kn->id`) before trusting it, so a cgroup removed and freed under a stale line
//! is skipped, never misreported.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::bpf_timer,
    btf_maps,
    helpers::{
        bpf_get_smp_processor_id, bpf_ktime_get_ns,
        generated::{bpf_timer_init, bpf_timer_set_callback, bpf_timer_start},
    },
    macros::{btf_map, fexit, map},
    maps::{Array, HashMap},
    programs::FExitContext,
};
use node_agent_common::{
    KernelOffsets, MemoryLine, MemoryThreshold, MemoryThresholdEvent, SamplerControl, SamplerStats,
    DIRECTION_DOWN, DIRECTION_UP, KIND_MEMORY_THRESHOLD, MAX_MEMORY_LINES, MAX_TRACKED_CGROUPS,
    SAMPLER_LATE_NS, SAMPLER_TIMERS,
};

use crate::{
    kernel::{css_cgroup_id, read},
    maps::{emit, header, OFFSETS},
};

const MAX_DEPTH: u32 = 8;
/// `CLOCK_MONOTONIC` for `bpf_timer_init()` (include/uapi/linux/time.h).
const CLOCK_MONOTONIC: u64 = 1;
/// `BPF_F_TIMER_CPU_PIN` (6.7+, include/uapi/linux/bpf.h): the timer fires on the CPU that
/// started it. Older kernels refuse the flag; there a timer re-armed from its own callback
/// stays on its CPU anyway (hrtimers do not switch base while their callback runs).
const BPF_F_TIMER_CPU_PIN: u64 = 1 << 1;

/// Key: memory cgroup id.
#[map]
static MEMORY_THRESHOLDS: HashMap<u64, MemoryThreshold> =
    HashMap::with_max_entries(MAX_TRACKED_CGROUPS, 0);

/// The sampler's lines, in slots user space allocates; `SAMPLER_CONTROL.lines` bounds the
/// slots in use.
#[map]
static MEMORY_LINES: Array<MemoryLine> = Array::with_max_entries(MAX_MEMORY_LINES, 0);

/// Index 0: the periods, the number of slots in use and the timer to start, written by user
/// space.
#[map]
static SAMPLER_CONTROL: Array<SamplerControl> = Array::with_max_entries(1, 0);

/// One per timer: ticks and time spent in them, for the benchmark and `/metrics`. Each timer
/// writes only its own.
#[map]
static SAMPLER_STATS: Array<SamplerStats> = Array::with_max_entries(SAMPLER_TIMERS, 0);

/// A timer lives in a map value whose BTF names `struct bpf_timer`, as the kernel requires.
#[repr(C)]
pub struct SamplerTimer {
    timer: bpf_timer,
    /// When the next tick is due (`bpf_ktime_get_ns()`); 0 before the first start. The
    /// partner reads it to take turns and to notice this timer is overdue.
    due_ns: u64,
    /// When the last tick started; the partner reads it to tell a gap from a late timer.
    last_ns: u64,
    /// The flags `bpf_timer_start()` took: `BPF_F_TIMER_CPU_PIN`, or 0 where refused.
    flags: u64,
}

#[btf_map]
static SAMPLER_TIMER: btf_maps::Array<SamplerTimer, { SAMPLER_TIMERS as usize }, 0> =
    btf_maps::Array::new();

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
fn counter_cgroup_id(o: &KernelOffsets, counter: u64) -> Result<u64, i64> {
    let css = counter - u64::from(o.memcg_memory) + u64::from(o.memcg_css);
    css_cgroup_id(o, css)
}

/// `iter/cgroup` context (kernel/bpf/cgroup_iter.c: `struct bpf_iter__cgroup`).
#[repr(C)]
pub struct IterCgroupCtx {
    meta: *const c_void,
    cgroup: u64,
}

/// Run by user space (one `read()` of the iterator) on a newly watched cgroup's directory:
/// records where that cgroup's memory page counter lives and (re)starts the timer
/// `SamplerControl::timer` on this CPU.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/cgroup")]
pub extern "C" fn memory_sampler_attach(ctx: *mut IterCgroupCtx) -> i32 {
    // SAFETY: the iterator passes a valid context; `cgroup` is NULL once iteration ends.
    let cgroup = unsafe { (*ctx).cgroup };
    if cgroup != 0 {
        let _ = try_attach(cgroup);
    }
    0
}

#[inline(always)]
fn try_attach(cgroup: u64) -> Result<(), i64> {
    let o = OFFSETS.load();
    if o.valid == 0 {
        return Err(-1);
    }
    // `cgroup->subsys[memory_cgrp_id]` is the cgroup's memcg css (NULL on a v2 cgroup whose
    // parent does not enable the memory controller), `cgroup->kn->id` its id.
    let index = o.memory_cgrp_id & 0x3f;
    let css: u64 = read(cgroup, o.cgroup_subsys + index * 8)?;
    if css == 0 {
        return Err(-1);
    }
    let kn: u64 = read(cgroup, o.cgroup_kn)?;
    let id: u64 = read(kn, o.kernfs_node_id)?;
    let counter = css - u64::from(o.memcg_css) + u64::from(o.memcg_memory);
    let Some(control) = SAMPLER_CONTROL.get(0) else {
        return Err(-1);
    };
    let lines = control.lines;
    for slot in 0..MAX_MEMORY_LINES {
        if slot >= lines {
            break;
        }
        let Some(line) = MEMORY_LINES.get_ptr_mut(slot) else {
            break;
        };
        // SAFETY: array values live as long as the map.
        let line = unsafe { &mut *line };
        if line.cgroup_id == id {
            line.counter = counter;
        }
    }
    start_timer(control.timer, control.period_ns)
}

#[inline(always)]
fn start_timer(index: u32, period_ns: u64) -> Result<(), i64> {
    let t = SAMPLER_TIMER.get_ptr_mut(index).ok_or(-1i64)?;
    // SAFETY: `t` points at the map value holding the timer; the helpers validate it.
    unsafe {
        let timer = &mut (*t).timer as *mut bpf_timer;
        // -EBUSY once initialised: harmless, the callback and map stay the same.
        let _ = bpf_timer_init(
            timer,
            &SAMPLER_TIMER as *const _ as *mut c_void,
            CLOCK_MONOTONIC,
        );
        bpf_timer_set_callback(timer, sample as *mut c_void);
        let mut flags = BPF_F_TIMER_CPU_PIN;
        let mut r = bpf_timer_start(timer, period_ns, flags);
        if r != 0 {
            flags = 0;
            r = bpf_timer_start(timer, period_ns, flags);
        }
        if r != 0 {
            return Err(r);
        }
        (*t).flags = flags;
        (*t).due_ns = bpf_ktime_get_ns() + period_ns;
    }
    Ok(())
}

/// One tick: checks every line, then re-arms while any line is set, after the shortest wait
/// any line allows (see `SamplerControl`), taking turns with the partner timer.
#[inline(never)]
extern "C" fn sample(_map: *mut c_void, key: *mut u32, t: *mut SamplerTimer) -> i32 {
    // SAFETY: helper without arguments.
    let started = unsafe { bpf_ktime_get_ns() };
    let Some(control) = SAMPLER_CONTROL.get(0) else {
        return 0;
    };
    let (lines, period) = (control.lines, control.period_ns);
    let pace = Pace {
        period,
        max_period: control.max_period_ns.max(period),
        bytes_per_us: control.charge_bytes_per_us,
    };
    let mut next = pace.max_period;
    let o = OFFSETS.load();
    if o.valid != 0 {
        for slot in 0..MAX_MEMORY_LINES {
            if slot >= lines {
                break;
            }
            if let Some(line) = MEMORY_LINES.get(slot) {
                if let Ok(wait) = check_line(&o, line.cgroup_id, line.counter, &pace) {
                    next = next.min(wait);
                }
            }
        }
    }
    // SAFETY: helper without arguments.
    let ended = unsafe { bpf_ktime_get_ns() };
    // SAFETY: the kernel passes this timer's key.
    let index = unsafe { *key };
    // The partner's schedule: read without a lock, as plain aligned words a tick writes.
    let (partner_due, partner_last) = match SAMPLER_TIMER.get_ptr(index ^ 1) {
        // SAFETY: array values live as long as the map.
        Some(p) => unsafe { ((*p).due_ns, (*p).last_ns) },
        None => (0, 0),
    };
    // SAFETY: `t` is the map value the timer lives in, passed by the kernel.
    let due = unsafe { (*t).due_ns };
    // Late only if the node went unsampled: the partner did not tick since this one was due.
    let gap = started.saturating_sub(due.max(partner_last));
    let late = partner_last < due && gap > SAMPLER_LATE_NS;
    let (wait, alone) = turn(next.max(period), period, ended, partner_due);
    if let Some(stats) = SAMPLER_STATS.get_ptr_mut(index) {
        // SAFETY: each timer writes only its own stats, and its callback runs once at a time.
        unsafe {
            (*stats).ticks += 1;
            (*stats).cpu = bpf_get_smp_processor_id();
            if alone {
                (*stats).alone_ticks += 1;
            }
            (*stats).busy_ns += ended.wrapping_sub(started);
            if late {
                (*stats).late_ticks += 1;
                if gap > (*stats).max_late_ns {
                    (*stats).max_late_ns = gap;
                }
            }
        }
    }
    if lines > 0 {
        // SAFETY: as above.
        unsafe {
            (*t).due_ns = ended + wait;
            (*t).last_ns = started;
            bpf_timer_start(&mut (*t).timer, wait, (*t).flags);
        }
    }
    0
}

/// How long a timer waits for its next tick, given the pace `wait` and its partner's next due
/// time (0: never started), and whether it ticks alone because the partner is overdue.
/// While the partner's tick comes within one pace (or is overdue by less than one), this
/// timer ticks one pace after it, so the two alternate and the node is sampled every `wait`.
/// A partner due later than one pace leaves this timer the full pace (as right after a
/// start); one overdue by a whole pace or more is descheduled or far behind, and this timer
/// keeps the full pace alone until it is back.
#[inline(always)]
fn turn(wait: u64, period: u64, now: u64, partner_due: u64) -> (u64, bool) {
    if partner_due == 0 || partner_due > now + wait {
        return (wait, false);
    }
    if partner_due + wait <= now {
        return (wait, true);
    }
    ((partner_due + wait - now).max(period), false)
}

/// How long lines may wait between ticks.
struct Pace {
    period: u64,
    max_period: u64,
    bytes_per_us: u64,
}

impl Pace {
    /// The time the plausible charge rate needs to cover `headroom` bytes, within the periods.
    #[inline(always)]
    fn wait(&self, headroom: u64) -> u64 {
        if self.bytes_per_us == 0 {
            return self.period;
        }
        let max_us = self.max_period / 1000;
        let us = (headroom / self.bytes_per_us).min(max_us);
        (us * 1000).clamp(self.period, self.max_period)
    }
}

/// Checks one line; returns how long it may wait for the next check. Lines that cannot be
/// read (unresolved, removed cgroup, no threshold) set no bound (`Err`).
#[inline(always)]
fn check_line(o: &KernelOffsets, id: u64, counter: u64, pace: &Pace) -> Result<u64, i64> {
    if id == 0 || counter == 0 {
        return Err(-1);
    }
    // A counter whose memcg no longer is the line's cgroup (removed, freed, reused) is skipped.
    if counter_cgroup_id(o, counter)? != id {
        return Err(-1);
    }
    let Some(t) = MEMORY_THRESHOLDS.get_ptr_mut(id) else {
        return Err(-1);
    };
    let pages: u64 = read(counter, o.page_counter_usage)?;
    let usage = pages << o.page_shift;
    check(id, usage, t);
    // SAFETY: map value valid for the program's run.
    let t = unsafe { &*t };
    if t.above != 0 {
        // Waiting for the down-crossing: memory can be freed at once (a process exits).
        return Ok(pace.period);
    }
    Ok(pace.wait(t.bytes.saturating_sub(usage)))
}

/// One event per crossing. The plain read of `above` keeps the common case free of atomics;
/// the flip is an atomic exchange, so when two CPUs (two timers, or fexit on two CPUs) see
/// the same crossing at once only the one that flips the flag reports it.
#[inline(always)]
fn check(cgroup: u64, usage: u64, t: *mut MemoryThreshold) {
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
