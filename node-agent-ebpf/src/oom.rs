//! OOM victims: `tp_btf/mark_victim` receives `(struct task_struct *victim, uid_t uid)`
//! (include/trace/events/oom.h, `TRACE_EVENT(mark_victim, TP_PROTO(struct task_struct *task,
//! uid_t uid))`; the uid argument exists since 6.8 and in Debian's 6.1 backport). It fires in
//! `mark_oom_victim()` (mm/oom_kill.c) before the kill, while the victim's mm is still there.

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};
use node_agent_common::{
    KernelOffsets, OomKillEvent, COMM_LEN, KIND_OOM_KILL, OOM_CGROUP_LIMIT, OOM_SYSTEM,
};

use crate::{
    kernel::{css_cgroup_id, read, task_memcg_css},
    maps::{emit, header, OFFSETS},
};

/// Levels of the memcg hierarchy checked for a cgroup at its limit.
const MAX_DEPTH: u32 = 16;
/// A charge that fails leaves usage below the limit by less than the charge: up to one THP (512
/// pages) for a user page fault (mm/memcontrol.c `try_charge_memcg()` retries the single folio
/// after the batch fails). A counter within this many pages of its max is "at its limit".
const LIMIT_MARGIN_PAGES: u64 = 512;

#[btf_tracepoint(function = "mark_victim")]
pub fn mark_victim(ctx: BtfTracePointContext) -> i32 {
    let _ = try_mark_victim(&ctx);
    0
}

fn try_mark_victim(ctx: &BtfTracePointContext) -> Result<(), i64> {
    let o = OFFSETS.load();
    if o.valid == 0 {
        return Err(-1);
    }
    let task: u64 = ctx.arg(0);
    let mut ev = OomKillEvent {
        header: header(KIND_OOM_KILL),
        ..OomKillEvent::default()
    };
    ev.pid = read::<i32>(task, o.task_pid)? as u32;
    ev.tgid = read::<i32>(task, o.task_tgid)? as u32;
    ev.comm = read::<[u8; COMM_LEN]>(task, o.task_comm)?;
    if o.mark_victim_has_uid != 0 {
        ev.uid = ctx.arg::<u64>(1) as u32;
    }
    if let Ok(signal) = read::<u64>(task, o.task_signal) {
        ev.oom_score_adj = i32::from(read::<i16>(signal, o.signal_oom_score_adj).unwrap_or(0));
    }
    if let Ok(mm) = read::<u64>(task, o.task_mm) {
        ev.total_vm = read(mm, o.mm_total_vm).unwrap_or(0);
        ev.file_rss = rss(&o, mm, o.mm_filepages);
        ev.anon_rss = rss(&o, mm, o.mm_anonpages);
        ev.shmem_rss = rss(&o, mm, o.mm_shmempages);
    }
    if let Ok(css) = task_memcg_css(&o, task) {
        ev.cgroup_id = css_cgroup_id(&o, css).unwrap_or(0);
        let (constraint, limit_cgroup) = constraint(&o, css);
        ev.constraint = constraint;
        ev.limit_cgroup_id = limit_cgroup;
    }
    emit(&ev);
    Ok(())
}

/// An RSS counter in pages, as `get_mm_counter()` reads it (include/linux/mm.h).
#[inline(always)]
fn rss(o: &KernelOffsets, mm: u64, counter: u32) -> u64 {
    let v: i64 = read(mm, o.mm_rss_base + counter * o.mm_rss_stride).unwrap_or(0);
    if v < 0 {
        0
    } else {
        v as u64
    }
}

/// Walks from the victim's memcg towards the root looking for a page_counter at its max
/// (mm/page_counter.c), within the size of the charge that failed: one found means a
/// cgroup-limit OOM, none a system-wide one. (`usage >= max` alone misses the common case of a
/// charge refused a few pages short of the max, which then reads as a system-wide OOM.)
#[inline(always)]
fn constraint(o: &KernelOffsets, css: u64) -> (u32, u64) {
    // struct mem_cgroup embeds its css; the css pointer is the memcg plus that offset.
    let memcg = css - u64::from(o.memcg_css);
    let mut counter = memcg + u64::from(o.memcg_memory);
    for _ in 0..MAX_DEPTH {
        let (Ok(usage), Ok(max)) = (
            read::<u64>(counter, o.page_counter_usage),
            read::<u64>(counter, o.page_counter_max),
        ) else {
            break;
        };
        if usage.saturating_add(LIMIT_MARGIN_PAGES) >= max {
            let css_of_counter = counter - u64::from(o.memcg_memory) + u64::from(o.memcg_css);
            return (
                OOM_CGROUP_LIMIT,
                css_cgroup_id(o, css_of_counter).unwrap_or(0),
            );
        }
        match read::<u64>(counter, o.page_counter_parent) {
            Ok(parent) if parent != 0 => counter = parent,
            _ => break,
        }
    }
    (OOM_SYSTEM, 0)
}
