//! The eviction policy core (kubelet parity). Pure: no I/O, `now` is always an argument.
//!
//! Data flows one way: [`config::EvictionConfig`] and [`observe::Observations`] go into
//! [`evaluate::evaluate_among`] with the pods and which of them the agent may act on
//! ([`eligible::Eligibility`]); it returns the thresholds met, the node conditions and the
//! pods to evict as a [`evaluate::Decision`]. [`scenario::simulate`] replays a timeline
//! through it.

pub mod beside;
pub mod config;
pub mod duration;
pub mod eligible;
pub mod evaluate;
pub mod local_storage;
pub mod message;
pub mod node_reclaim;
pub mod observe;
pub mod pod;
pub mod quantity;
pub mod rank;
pub mod requests;
pub mod scenario;
pub mod signal;

/// An error with its chain of sources, `outer: inner: innermost`: how every error of the agent
/// is said, in logs, `/readyz` and refusals.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    std::iter::successors(Some(e), |e| e.source())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}

/// `text` as a message shows it: whole when it is at most `max` bytes, else its first `max`
/// bytes (at a character boundary) and how long it was. For what comes from outside (names,
/// answers) and ends up in a log line, an error or an event.
pub fn shown(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!("{}…({} bytes)", &text[..end], text.len()))
}

pub use config::{
    ConfigError, EvictionConfig, EvictionFields, EvictionFlags, SignalMap, Threshold,
    ThresholdValue,
};
pub use duration::{parse_go_duration, DurationError, GoDuration};
pub use eligible::{
    Eligibility, Exclusions, LabelOperator, LabelRequirement, LabelSelector, NotEvictableNow,
    PassReason,
};
pub use evaluate::{
    evaluate, evaluate_among, over_local_storage_limits, Decision, Eviction, MetThreshold,
    OverLimits, PassedOver, PolicyState,
};
pub use local_storage::{LimitExceeded, StorageLimit};
pub use message::OffendingContainer;
pub use observe::{NodeCapacity, Observation, Observations};
pub use pod::{
    ContainerInfo, ContainerUsage, EmptyDirInfo, FsUsage, InitContainerInfo, PodInfo, PodUsage,
    Resources,
};
pub use quantity::{ByteSize, ByteSizeError, Format, Quantity, QuantityError};
pub use signal::{
    EvictionSignal, NodeCondition, Resource, Signal, UnknownEvictionSignal, UnknownSignal,
};
