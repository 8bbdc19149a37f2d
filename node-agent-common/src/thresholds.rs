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
    /// 1 while at or above the threshold, else 0. The kernel flips it with an atomic exchange,
    /// so of two CPUs that see the same crossing at once only one reports it.
    pub above: u64,
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

crate::user_pod!(MemoryThreshold, ForkRateLimit);
