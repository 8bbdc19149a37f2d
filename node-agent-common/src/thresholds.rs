//! Thresholds user space writes into maps; the kernel compares against them on every event.

/// A memory threshold on one cgroup (key: the cgroup's memory-controller id).
///
/// Up-crossing: usage >= `bytes` while not above. Down-crossing: usage < `bytes - hysteresis`
/// while above. Each crossing emits one event; between crossings nothing is emitted, so a
/// value hovering at the line cannot flood the ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryThreshold {
    pub bytes: u64,
    pub hysteresis: u64,
    /// 1 while at or above the threshold, else 0. Written by the kernel with compare-exchange.
    pub above: u32,
    pub _pad: u32,
}

const _: () = assert!(core::mem::size_of::<MemoryThreshold>() == 24);

/// Fork-rate limit of one cgroup: more than `max_forks` forks within `window_ns` is a fork
/// storm, reported once until a whole window passes under the limit.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForkRateLimit {
    pub max_forks: u64,
    pub window_ns: u64,
    /// Kernel-owned state: start of the current window and forks in it.
    pub window_start_ns: u64,
    pub forks_in_window: u64,
    /// 1 while a storm is reported, else 0.
    pub storming: u32,
    pub _pad: u32,
}

const _: () = assert!(core::mem::size_of::<ForkRateLimit>() == 40);

/// Most memory lines the in-kernel sampler watches at once.
pub const MAX_MEMORY_LINES: u32 = 256;

/// The sampler's default period: a crossing is seen at most this long after the charge.
pub const DEFAULT_SAMPLER_PERIOD_NS: u64 = 1_000_000;

/// One line the in-kernel sampler watches. User space writes `cgroup_id` with `counter` 0; the
/// kernel's cgroup iterator fills `counter` with the address of that memcg's `memory` page
/// counter, which the sampler reads every period. The threshold itself is the cgroup's
/// [`MemoryThreshold`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryLine {
    pub cgroup_id: u64,
    /// Kernel-owned: a kernel address, never dereferenced by user space; 0 until resolved.
    pub counter: u64,
}

const _: () = assert!(core::mem::size_of::<MemoryLine>() == 16);

/// What user space tells the sampler: its period and how many line slots are in use.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SamplerControl {
    pub period_ns: u64,
    /// Slots `0..lines` of the line array are checked; 0 stops the timer at its next tick.
    pub lines: u32,
    pub _pad: u32,
}

const _: () = assert!(core::mem::size_of::<SamplerControl>() == 16);

/// What the sampler did: ticks so far and the time spent in them (kernel-measured).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SamplerStats {
    pub ticks: u64,
    pub busy_ns: u64,
}

const _: () = assert!(core::mem::size_of::<SamplerStats>() == 16);

crate::user_pod!(
    MemoryThreshold,
    ForkRateLimit,
    MemoryLine,
    SamplerControl,
    SamplerStats
);
