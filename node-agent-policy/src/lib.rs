//! The eviction policy core (kubelet parity). Pure: no I/O, `now` is always an argument.
//!
//! Data flows one way: [`config::EvictionConfig`] and [`observe::Observations`] go into
//! [`evaluate::evaluate`], which returns the thresholds met, the node conditions and at most
//! one pod to evict as a [`evaluate::Decision`]. [`scenario::run`] replays a timeline through it.

pub mod config;
pub mod duration;
pub mod evaluate;
pub mod message;
pub mod observe;
pub mod quantity;
pub mod rank;
pub mod scenario;
pub mod signal;
mod yaml;

pub use config::{ConfigError, EvictionConfig, EvictionFlags, Threshold, ThresholdValue};
pub use duration::{parse_go_duration, DurationError};
pub use evaluate::{evaluate, Decision, Eviction, MetThreshold, PolicyState, SkippedPod};
pub use observe::{
    ContainerInfo, ContainerUsage, FsUsage, NodeCapacity, Observation, Observations, PodInfo,
    PodUsage, Resources,
};
pub use quantity::{Format, Quantity, QuantityError};
pub use signal::{NodeCondition, Resource, Signal, UnknownSignal};
