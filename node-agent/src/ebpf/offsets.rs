//! Filling `KernelOffsets` from the running kernel's BTF, so the programs read the right bytes
//! on every kernel (the layouts of task_struct, mm_struct and mem_cgroup move between releases).

use node_agent_common::KernelOffsets;

use crate::btf::{Btf, BtfError, MemberKind};

/// Offsets for this kernel. Every lookup that fails names the struct and member.
pub fn from_btf(btf: &Btf) -> Result<KernelOffsets, BtfError> {
    let (mm_rss_base, mm_rss_stride) = rss_layout(btf)?;
    let counter = |name: &str| -> Result<u32, BtfError> {
        let v = btf.enumerator(name)?;
        u32::try_from(v)
            .map_err(|_| BtfError::NoEnumerator(format!("{name} (value {v} out of range)")))
    };
    Ok(KernelOffsets {
        valid: 1,
        memory_cgrp_id: counter("memory_cgrp_id")?,
        task_pid: btf.member_offset("task_struct", "pid")?,
        task_tgid: btf.member_offset("task_struct", "tgid")?,
        task_comm: btf.member_offset("task_struct", "comm")?,
        task_cgroups: btf.member_offset("task_struct", "cgroups")?,
        task_mm: btf.member_offset("task_struct", "mm")?,
        task_signal: btf.member_offset("task_struct", "signal")?,
        css_set_subsys: btf.member_offset("css_set", "subsys")?,
        css_cgroup: btf.member_offset("cgroup_subsys_state", "cgroup")?,
        cgroup_kn: btf.member_offset("cgroup", "kn")?,
        cgroup_subsys: btf.member_offset("cgroup", "subsys")?,
        kernfs_node_id: btf.member_offset("kernfs_node", "id")?,
        signal_oom_score_adj: btf.member_offset("signal_struct", "oom_score_adj")?,
        mm_total_vm: btf.member_offset("mm_struct", "total_vm")?,
        mm_rss_base,
        mm_rss_stride,
        mm_filepages: counter("MM_FILEPAGES")?,
        mm_anonpages: counter("MM_ANONPAGES")?,
        mm_shmempages: counter("MM_SHMEMPAGES")?,
        memcg_css: btf.member_offset("mem_cgroup", "css")?,
        memcg_memory: btf.member_offset("mem_cgroup", "memory")?,
        page_counter_usage: btf.member_offset("page_counter", "usage")?,
        page_counter_max: btf.member_offset("page_counter", "max")?,
        page_counter_parent: btf.member_offset("page_counter", "parent")?,
        mark_victim_has_uid: u32::from(btf.tracepoint_args("mark_victim") == Some(2)),
        page_shift: crate::sys::page_size().trailing_zeros(),
        task_thread_pid: btf.member_offset("task_struct", "thread_pid")?,
        pid_numbers: btf.member_offset("pid", "numbers")?,
        upid_ns: btf.member_offset("upid", "ns")?,
        pidns_pid_allocated: btf.member_offset("pid_namespace", "pid_allocated")?,
        // Only since 6.14; a member at offset 0 (the namespace's idr) is never it.
        pidns_pid_max: btf.member_offset("pid_namespace", "pid_max").unwrap_or(0),
    })
}

/// Where RSS counter `i` of an mm lives: since 6.2 `rss_stat` is an array of
/// `struct percpu_counter` whose `count` is the figure `get_mm_counter()` reads; before, it is
/// `struct mm_rss_stat { atomic_long_t count[NR_MM_COUNTERS]; }`.
fn rss_layout(btf: &Btf) -> Result<(u32, u32), BtfError> {
    let base = btf.member_offset("mm_struct", "rss_stat")?;
    match btf.member_kind("mm_struct", "rss_stat")? {
        MemberKind::Array {
            elem_struct: Some(elem),
            elem_size: Some(size),
        } => Ok((base + btf.member_offset(&elem, "count")?, size)),
        MemberKind::Struct(name) => Ok((base + btf.member_offset(&name, "count")?, 8)),
        _ => Err(BtfError::NoMember {
            strukt: "mm_struct".into(),
            member: "rss_stat (of a known layout)".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn resolves_every_offset_on_the_running_kernel() {
        let btf = crate::btf::Btf::from_kernel().expect("kernel BTF");
        let o = super::from_btf(&btf).expect("all offsets");
        assert_eq!(o.valid, 1);
        assert!(o.task_tgid > o.task_pid);
        assert!(o.mm_rss_stride >= 8);
        assert_eq!(
            (o.mm_filepages, o.mm_anonpages),
            (0, 1),
            "MM_FILEPAGES, MM_ANONPAGES"
        );
        assert!(o.page_shift >= 12);
    }
}
