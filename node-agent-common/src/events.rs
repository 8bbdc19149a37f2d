//! Records the kernel programs write into the one ring buffer. Each starts with an
//! [`EventHeader`] whose `kind` says which struct follows; user space checks the record's
//! length against that struct's size before reading it.

pub const KIND_OOM_KILL: u32 = 1;
pub const KIND_MEMORY_THRESHOLD: u32 = 2;
pub const KIND_PID_THRESHOLD: u32 = 3;
pub const KIND_FORK_STORM: u32 = 4;
pub const KIND_CGROUP_CHANGE: u32 = 5;

/// Crossing directions.
pub const DIRECTION_DOWN: u32 = 0;
pub const DIRECTION_UP: u32 = 1;

/// OOM constraint as far as the kernel side can tell.
pub const OOM_UNKNOWN: u32 = 0;
/// A memory cgroup (the victim's or an ancestor) was at its limit.
pub const OOM_CGROUP_LIMIT: u32 = 1;
/// No cgroup on the victim's path was at its limit: a system-wide OOM.
pub const OOM_SYSTEM: u32 = 2;

pub const COMM_LEN: usize = 16;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventHeader {
    pub kind: u32,
    pub cpu: u32,
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) when the kernel saw it.
    pub ktime_ns: u64,
}

const _: () = assert!(core::mem::size_of::<EventHeader>() == 16);

/// `oom:mark_victim`: the kernel chose a victim and is about to kill it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OomKillEvent {
    pub header: EventHeader,
    /// The victim's memory cgroup id (not the allocating task's).
    pub cgroup_id: u64,
    /// The cgroup found at its limit (`OOM_CGROUP_LIMIT`), else 0.
    pub limit_cgroup_id: u64,
    pub pid: u32,
    pub tgid: u32,
    pub uid: u32,
    /// One of `OOM_UNKNOWN`, `OOM_CGROUP_LIMIT`, `OOM_SYSTEM`.
    pub constraint: u32,
    pub oom_score_adj: i32,
    pub _pad: u32,
    /// Pages.
    pub total_vm: u64,
    pub anon_rss: u64,
    pub file_rss: u64,
    pub shmem_rss: u64,
    pub comm: [u8; COMM_LEN],
}

const _: () = assert!(core::mem::size_of::<OomKillEvent>() == 104);

/// A watched cgroup's memory usage crossed its threshold.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryThresholdEvent {
    pub header: EventHeader,
    pub cgroup_id: u64,
    /// Usage (bytes) that made the crossing.
    pub usage_bytes: u64,
    pub threshold_bytes: u64,
    /// `DIRECTION_UP` or `DIRECTION_DOWN`.
    pub direction: u32,
    pub _pad: u32,
}

const _: () = assert!(core::mem::size_of::<MemoryThresholdEvent>() == 48);

/// The node's `pid.available` crossed its threshold.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PidThresholdEvent {
    pub header: EventHeader,
    pub live: i64,
    pub limit: u64,
    pub threshold: u64,
    pub direction: u32,
    pub _pad: u32,
}

const _: () = assert!(core::mem::size_of::<PidThresholdEvent>() == 48);

/// A cgroup forked faster than its limit.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForkStormEvent {
    pub header: EventHeader,
    pub cgroup_id: u64,
    pub forks_in_window: u64,
    pub window_ns: u64,
    pub max_forks: u64,
    /// The forking parent at the moment of the crossing.
    pub pid: u32,
    pub _pad: u32,
    pub comm: [u8; COMM_LEN],
}

const _: () = assert!(core::mem::size_of::<ForkStormEvent>() == 72);

/// A cgroup was created or removed (any hierarchy): user space rescans its cgroup index
/// instead of walking cgroupfs on a timer. Rate-limited per CPU in the kernel.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupChangeEvent {
    pub header: EventHeader,
    pub cgroup_id: u64,
    /// 1 for mkdir, 0 for rmdir.
    pub created: u32,
    pub _pad: u32,
}

const _: () = assert!(core::mem::size_of::<CgroupChangeEvent>() == 32);

crate::user_pod!(
    EventHeader,
    OomKillEvent,
    MemoryThresholdEvent,
    PidThresholdEvent,
    ForkStormEvent,
    CgroupChangeEvent
);
