//! Eviction signals, the resource each one reclaims and the node condition each one drives
//! (the kubelet's `signalToResource` and `signalToNodeCondition`).

use std::fmt;
use std::str::FromStr;

use crate::local_storage::StorageLimit;
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

/// Why a pod is evicted, by the name the kubelet's `evictions` metric gives it: the signal
/// of the threshold being reclaimed, or the local storage limit the pod went over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EvictionSignal {
    Threshold(Signal),
    Limit(StorageLimit),
}

/// The text is neither a kubelet signal nor a local storage limit name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown eviction signal {0:?}; expected one of {signals}, {limits}",
    signals = Signal::NAMES.join(", "),
    limits = StorageLimit::ALL.map(StorageLimit::as_str).join(", ")
)]
pub struct UnknownEvictionSignal(pub String);

impl EvictionSignal {
    /// Every threshold signal, then every local storage limit.
    pub fn all() -> impl Iterator<Item = EvictionSignal> {
        Signal::ALL
            .into_iter()
            .map(EvictionSignal::Threshold)
            .chain(StorageLimit::ALL.into_iter().map(EvictionSignal::Limit))
    }

    pub fn as_str(self) -> &'static str {
        match self {
            EvictionSignal::Threshold(s) => s.as_str(),
            EvictionSignal::Limit(l) => l.as_str(),
        }
    }

    /// The threshold signal, if this is one.
    pub fn threshold(self) -> Option<Signal> {
        match self {
            EvictionSignal::Threshold(s) => Some(s),
            EvictionSignal::Limit(_) => None,
        }
    }
}

impl From<Signal> for EvictionSignal {
    fn from(signal: Signal) -> Self {
        EvictionSignal::Threshold(signal)
    }
}

impl FromStr for EvictionSignal {
    type Err = UnknownEvictionSignal;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EvictionSignal::all()
            .find(|e| e.as_str() == s)
            .ok_or_else(|| UnknownEvictionSignal(s.to_string()))
    }
}

impl fmt::Display for EvictionSignal {
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
        for e in EvictionSignal::all() {
            assert_eq!(e.as_str().parse::<EvictionSignal>(), Ok(e));
        }
        assert_eq!(EvictionSignal::all().count(), 12);
        assert!("emptydir.limit"
            .parse::<EvictionSignal>()
            .unwrap_err()
            .to_string()
            .contains("emptydirfs.limit"));
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
