//! What the policy is evaluated on besides the pods ([`crate::pod`]): the node's capacity and
//! the observed signal values. Plain data; the daemon fills it from the kernel and the API
//! server, `simulate` from a file.

use std::collections::BTreeMap;

use crate::signal::{Resource, Signal};

/// The node's capacities and filesystem layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeCapacity {
    pub memory_bytes: Option<i64>,
    pub ephemeral_storage_bytes: Option<i64>,
    pub inodes: Option<i64>,
    pub pids: Option<i64>,
    /// Whether images and container writable layers live on a dedicated filesystem (imagefs).
    /// Decides which pod usage counts when ranking for nodefs and imagefs signals.
    pub has_imagefs: bool,
}

impl NodeCapacity {
    /// The capacity percentage thresholds on `signal` are taken of, if known.
    pub fn capacity_for(&self, signal: Signal) -> Option<i64> {
        match signal.resource() {
            Resource::Memory => self.memory_bytes,
            Resource::EphemeralStorage => self.ephemeral_storage_bytes,
            Resource::Inodes => self.inodes,
            Resource::Pids => self.pids,
        }
    }
}

/// One observed signal value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// Available bytes, free inodes or available PIDs. May be negative for memory.
    pub available: i64,
    /// The capacity percentage thresholds are taken of.
    pub capacity: i64,
    /// How far the signal is expected to fall before relief could arrive if it were asked for
    /// now (its rate of fall times the time relief takes): a hard threshold of this signal is
    /// met early, while `available` is at most this, even above the threshold itself. The
    /// headroom left would be gone before relief arrives. 0: not moving, or not known.
    pub lead: i64,
}

impl Observation {
    /// A value with no lead (not falling, or not known to be).
    pub fn new(available: i64, capacity: i64) -> Self {
        Self {
            available,
            capacity,
            lead: 0,
        }
    }
}

/// The latest value of each observed signal. A signal absent here meets no threshold.
pub type Observations = BTreeMap<Signal, Observation>;
