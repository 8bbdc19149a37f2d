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

/// Most memory lines the in-kernel sampler watches at once.
pub const MAX_MEMORY_LINES: u32 = 256;

/// The sampler's default (shortest) period: a crossing by a charge no faster than the
/// plausible rate below is seen at most this long after the charge.
pub const DEFAULT_SAMPLER_PERIOD_NS: u64 = 1_000_000;

/// The sampler's longest period: a line so far from its usage that no plausible charge could
/// reach it sooner is read this often, and any crossing, however fast the charge, is seen at
/// most this long after it. Half the 10 ms the agent promises, leaving the rest for a timer
/// that fires late on a busy machine.
pub const DEFAULT_SAMPLER_MAX_PERIOD_NS: u64 = 5_000_000;

/// The fastest a single CPU plausibly charges memory to a cgroup, bytes per microsecond
/// (16 GiB/s: faulting in transparent huge pages, which the kernel zeroes at about memory
/// bandwidth; 4 KiB faults are several times slower). The sampler assumes every online CPU
/// charges the same line at this rate when it decides how long a line may wait.
pub const PLAUSIBLE_CHARGE_BYTES_PER_US_PER_CPU: u64 = (16 << 30) / 1_000_000;

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

/// What user space tells the sampler: its periods, the charge rate it plans for and how many
/// line slots are in use.
///
/// After each tick the timer waits, for each line below its threshold, the time the plausible
/// charge rate needs to cover the line's headroom (threshold − usage), clamped to
/// `period_ns ..= max_period_ns`, and takes the shortest over all lines; a line at or above
/// its threshold (waiting for the down-crossing) waits `period_ns`. So a crossing by a charge
/// no faster than `charge_bytes_per_us` is seen within `period_ns` of the charge, any crossing
/// within `max_period_ns`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SamplerControl {
    /// The shortest wait between ticks.
    pub period_ns: u64,
    /// The longest wait between ticks.
    pub max_period_ns: u64,
    /// The plausible charge rate of the whole node (all CPUs), bytes per µs; 0 keeps the
    /// period at `period_ns`.
    pub charge_bytes_per_us: u64,
    /// Slots `0..lines` of the line array are checked; 0 stops the timers at their next tick.
    pub lines: u32,
    /// Which of the [`SAMPLER_TIMERS`] the next run of the attach iterator (re)starts, on the
    /// CPU it runs on.
    pub timer: u32,
}

const _: () = assert!(core::mem::size_of::<SamplerControl>() == 32);

/// What the sampler did: ticks so far and the time spent in them (kernel-measured), and the
/// ticks that came more than [`SAMPLER_LATE_NS`] after they were due with no tick of the other
/// timer in between, with the worst delay. Such a late tick is where the 10 ms promise can
/// break: no line was looked at for the pace (at most 5 ms) plus the delay. Timers run late
/// when softirqs are deferred or the host deschedules the vCPU they are on; a late timer whose
/// partner ticked meanwhile left no gap and is not counted. One value per timer in the kernel
/// map; user space adds them up (`+`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SamplerStats {
    pub ticks: u64,
    pub busy_ns: u64,
    pub late_ticks: u64,
    pub max_late_ns: u64,
    /// Ticks taken alone at the full pace because the partner timer was overdue by a whole
    /// pace: the gaps a descheduled vCPU would have left, covered.
    pub alone_ticks: u64,
    /// The CPU this timer's last tick ran on (per timer; a sum keeps the first timer's).
    pub cpu: u32,
    pub _pad: u32,
}

const _: () = assert!(core::mem::size_of::<SamplerStats>() == 48);

/// The figures of two timers together: counts add up, the worst delay is the larger.
impl core::ops::Add for SamplerStats {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self {
            ticks: self.ticks.saturating_add(other.ticks),
            busy_ns: self.busy_ns.saturating_add(other.busy_ns),
            late_ticks: self.late_ticks.saturating_add(other.late_ticks),
            max_late_ns: self.max_late_ns.max(other.max_late_ns),
            alone_ticks: self.alone_ticks.saturating_add(other.alone_ticks),
            cpu: self.cpu,
            _pad: 0,
        }
    }
}

/// The sampler's timers. Each is pinned to its own CPU, so a vCPU the host deschedules (steal)
/// stops only one of them: the other notices the first is overdue and samples alone at the
/// full pace. While both run they take turns, so together they tick as often as one would.
pub const SAMPLER_TIMERS: u32 = 2;

/// How late a sampler tick may start before it counts in `SamplerStats::late_ticks`: the half
/// of the 10 ms promise that the longest pace (5 ms) leaves.
pub const SAMPLER_LATE_NS: u64 = 5_000_000;

crate::user_pod!(
    MemoryThreshold,
    ForkRateLimit,
    MemoryLine,
    SamplerControl,
    SamplerStats
);
