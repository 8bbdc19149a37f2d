//! Eviction signals, the resource each one reclaims and the node condition each one drives
//! (the kubelet's `signalToResource` and `signalToNodeCondition`).

use std::fmt;
use std::str::FromStr;

use crate::quantity::Format;

/// An eviction signal. The declaration order is the order in which non-memory thresholds are
/// acted on when several are met at once (the kubelet leaves that order unspecified).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Signal {
    MemoryAvailable,
    AllocatableMemoryAvailable,
    NodeFsAvailable,
    NodeFsInodesFree,
    ImageFsAvailable,
    ImageFsInodesFree,
    ContainerFsAvailable,
    ContainerFsInodesFree,
    PidAvailable,
}

/// The resource an eviction reclaims; its name appears in the eviction message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    Memory,
    EphemeralStorage,
    Inodes,
    Pids,
}

/// A node condition driven by eviction thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NodeCondition {
    MemoryPressure,
    DiskPressure,
    PidPressure,
}

/// The text is not one of the nine kubelet signal names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown eviction signal {0:?}; expected one of {list}", list = Signal::NAMES.join(", "))]
pub struct UnknownSignal(pub String);

impl Signal {
    /// Every signal, in declaration order.
    pub const ALL: [Signal; 9] = [
        Signal::MemoryAvailable,
        Signal::AllocatableMemoryAvailable,
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
        Signal::ContainerFsAvailable,
        Signal::ContainerFsInodesFree,
        Signal::PidAvailable,
    ];

    const NAMES: [&'static str; 9] = [
        "memory.available",
        "allocatableMemory.available",
        "nodefs.available",
        "nodefs.inodesFree",
        "imagefs.available",
        "imagefs.inodesFree",
        "containerfs.available",
        "containerfs.inodesFree",
        "pid.available",
    ];

    /// The kubelet's name for the signal, e.g. `memory.available`.
    pub fn as_str(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// The resource reclaimed when this signal's threshold is acted on.
    pub fn resource(self) -> Resource {
        match self {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => Resource::Memory,
            Signal::NodeFsAvailable | Signal::ImageFsAvailable | Signal::ContainerFsAvailable => {
                Resource::EphemeralStorage
            }
            Signal::NodeFsInodesFree
            | Signal::ImageFsInodesFree
            | Signal::ContainerFsInodesFree => Resource::Inodes,
            Signal::PidAvailable => Resource::Pids,
        }
    }

    /// The node condition reported while a threshold on this signal is met.
    pub fn node_condition(self) -> NodeCondition {
        match self.resource() {
            Resource::Memory => NodeCondition::MemoryPressure,
            Resource::EphemeralStorage | Resource::Inodes => NodeCondition::DiskPressure,
            Resource::Pids => NodeCondition::PidPressure,
        }
    }

    /// Memory signals are reclaimed before all others (`byEvictionPriority`).
    pub fn is_memory(self) -> bool {
        self.resource() == Resource::Memory
    }

    /// The format the kubelet gives the observed value: bytes are binary, counts are decimal.
    pub fn observation_format(self) -> Format {
        match self.resource() {
            Resource::Memory | Resource::EphemeralStorage => Format::BinarySi,
            Resource::Inodes | Resource::Pids => Format::DecimalSi,
        }
    }
}

impl FromStr for Signal {
    type Err = UnknownSignal;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Signal::ALL
            .into_iter()
            .find(|signal| signal.as_str() == s)
            .ok_or_else(|| UnknownSignal(s.to_string()))
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Resource {
    /// The Kubernetes resource name, as in the eviction message.
    pub fn as_str(self) -> &'static str {
        match self {
            Resource::Memory => "memory",
            Resource::EphemeralStorage => "ephemeral-storage",
            Resource::Inodes => "inodes",
            Resource::Pids => "pids",
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl NodeCondition {
    /// The condition type as it appears on the Node object.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeCondition::MemoryPressure => "MemoryPressure",
            NodeCondition::DiskPressure => "DiskPressure",
            NodeCondition::PidPressure => "PIDPressure",
        }
    }
}

impl fmt::Display for NodeCondition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_signal_round_trips_through_its_kubelet_name() {
        for signal in Signal::ALL {
            assert_eq!(signal.as_str().parse::<Signal>(), Ok(signal));
        }
        assert!("memory.Available".parse::<Signal>().is_err());
    }

    #[test]
    fn signals_map_to_resources_and_conditions_as_the_kubelet_maps_them() {
        let cases = [
            (Signal::MemoryAvailable, "memory", "MemoryPressure"),
            (
                Signal::AllocatableMemoryAvailable,
                "memory",
                "MemoryPressure",
            ),
            (Signal::NodeFsAvailable, "ephemeral-storage", "DiskPressure"),
            (Signal::NodeFsInodesFree, "inodes", "DiskPressure"),
            (
                Signal::ImageFsAvailable,
                "ephemeral-storage",
                "DiskPressure",
            ),
            (Signal::ImageFsInodesFree, "inodes", "DiskPressure"),
            (
                Signal::ContainerFsAvailable,
                "ephemeral-storage",
                "DiskPressure",
            ),
            (Signal::ContainerFsInodesFree, "inodes", "DiskPressure"),
            (Signal::PidAvailable, "pids", "PIDPressure"),
        ];
        for (signal, resource, condition) in cases {
            assert_eq!(signal.resource().as_str(), resource, "{signal}");
            assert_eq!(signal.node_condition().as_str(), condition, "{signal}");
        }
    }
}
