//! Types shared by the kernel programs (`node-agent-ebpf`) and the agent (`node-agent`).
//!
//! Rules: `#[repr(C)]`, fixed-width integers and arrays only, explicit padding, no `bool`,
//! `Option` or pointers, and a size assertion per type, so both sides agree on every byte.
#![no_std]

pub mod events;
pub mod offsets;
pub mod sampler;
pub mod tasks;
pub mod thresholds;

pub use events::*;
pub use offsets::KernelOffsets;
pub use sampler::{
    MemoryLine, SamplerControl, SamplerStats, DEFAULT_SAMPLER_MAX_PERIOD_NS,
    DEFAULT_SAMPLER_PERIOD_NS, LARGEST_SINGLE_CHARGE_BYTES, MAX_CHARGE_BYTES_PER_US_PER_CPU,
    MAX_MEMORY_LINES, SAMPLER_LATE_NS, SAMPLER_TIMERS,
};
pub use tasks::{PidLimits, TaskCounts};
pub use thresholds::{ForkRateLimit, MemoryThreshold};

/// Most cgroups the kernel side tracks at once (pods and their containers on one node,
/// plus the node-level cgroups). Sized for 1000 pods with a few containers each.
pub const MAX_TRACKED_CGROUPS: u32 = 8192;

/// Default ring buffer size in bytes (a power of two, a multiple of the page size).
pub const DEFAULT_RING_BYTES: u32 = 1 << 20;

/// Implements `aya::Pod` for user space: every type here is plain data with explicit padding.
macro_rules! user_pod {
    ($($t:ty),* $(,)?) => {
        $(
            #[cfg(feature = "user")]
            // SAFETY: `#[repr(C)]`, integers and arrays only, padding spelled out as fields.
            unsafe impl aya::Pod for $t {}
        )*
    };
}
pub(crate) use user_pod;
