//! The in-kernel memory sampler, where fexit on the page counter cannot attach (see
//! [`crate::memcg`]): `bpf_timer`s read each watched line's page counter and report crossings
//! through [`check`], so nothing runs on the fault path at all. After each tick they wait as
//! long as the charge-rate bound allows (`SamplerControl::wait_ns` in node-agent-common, the
//! one pacing rule): one shortest period (1 ms) near a line, up to the longest (250 ms) while
//! every line is far, so an idle node with far lines is woken a few times a second.
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
    macros::{btf_map, map},
    maps::Array,
};
use node_agent_common::{
    KernelOffsets, MemoryLine, SamplerControl, SamplerStats, MAX_MEMORY_LINES, SAMPLER_LATE_NS,
    SAMPLER_TIMERS,
};

use crate::{
    kernel::read,
    maps::OFFSETS,
    memcg::{check, counter_cgroup_id, MEMORY_THRESHOLDS},
};

/// `CLOCK_MONOTONIC` for `bpf_timer_init()` (include/uapi/linux/time.h).
const CLOCK_MONOTONIC: u64 = 1;
/// `BPF_F_TIMER_CPU_PIN` (6.7+, include/uapi/linux/bpf.h): the timer fires on the CPU that
/// started it. Older kernels refuse the flag; there a timer re-armed from its own callback
/// stays on its CPU anyway (hrtimers do not switch base while their callback runs).
const BPF_F_TIMER_CPU_PIN: u64 = 1 << 1;

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
    let control = *control;
    let (lines, period) = (control.lines, control.period_ns);
    // With no line to read, the longest wait.
    let mut next = control.max_period_ns.max(period);
    let o = OFFSETS.load();
    if o.valid != 0 {
        for slot in 0..MAX_MEMORY_LINES {
            if slot >= lines {
                break;
            }
            if let Some(line) = MEMORY_LINES.get(slot) {
                if let Ok(wait) = check_line(&o, line.cgroup_id, line.counter, &control) {
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

/// Checks one line; returns how long it may wait for the next check. Lines that cannot be
/// read (unresolved, removed cgroup, no threshold) set no bound (`Err`).
#[inline(always)]
fn check_line(
    o: &KernelOffsets,
    id: u64,
    counter: u64,
    control: &SamplerControl,
) -> Result<u64, i64> {
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
        return Ok(control.period_ns);
    }
    Ok(control.wait_ns(t.bytes.saturating_sub(usage)))
}
