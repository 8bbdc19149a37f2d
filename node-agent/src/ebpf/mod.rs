//! Loading and talking to the kernel programs built from `node-agent-ebpf`.

mod object;
mod tasks;

pub use object::{KernelPrograms, LoadError};
pub use tasks::TaskCountsError;
