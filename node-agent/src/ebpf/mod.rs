//! Loading and talking to the kernel programs built from `node-agent-ebpf`.

mod control;
mod error;
mod object;
mod offsets;
mod ring;
mod sampler;

/// What the ring yields: each record decoded by its probe's module.
pub use crate::probes::{DecodeError, KernelEvent};
pub use error::{ControlError, LoadError, SamplerError};
pub use object::{
    enable_run_time_stats, KernelPrograms, LoadOptions, MemoryChoice, MemoryMechanism, ProgramStats,
};
pub use ring::EventStream;
pub use sampler::SamplerPace;
