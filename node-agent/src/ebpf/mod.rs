//! Loading and talking to the kernel programs built from `node-agent-ebpf`.

mod control;
mod error;
pub mod events;
mod object;
mod offsets;
mod ring;
mod sampler;

pub use error::{ControlError, LoadError, SamplerError};
pub use events::{DecodeError, KernelEvent};
pub use object::{
    enable_run_time_stats, KernelPrograms, LoadOptions, MemoryChoice, MemoryMechanism, ProgramStats,
};
pub use ring::EventStream;
pub use sampler::SamplerPace;
