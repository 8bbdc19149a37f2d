//! Loading and talking to the kernel programs built from `node-agent-ebpf`.

mod control;
pub mod events;
mod object;
mod offsets;
mod ring;
mod sampler;

pub use control::ControlError;
pub use events::{DecodeError, KernelEvent};
pub use object::{KernelPrograms, LoadError, LoadOptions, MemoryChoice, MemoryMechanism};
pub use ring::EventStream;
pub use sampler::SamplerError;
