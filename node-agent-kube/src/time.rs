//! `SystemTime` to the timestamps Kubernetes objects carry.

use std::time::SystemTime;

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{MicroTime, Time},
    jiff::Timestamp,
};

/// jiff covers years −9999..=9999, so any clock reading a node can have converts; a reading
/// outside that (a broken clock) becomes the epoch rather than a panic.
pub fn timestamp(now: SystemTime) -> Timestamp {
    Timestamp::try_from(now).unwrap_or(Timestamp::UNIX_EPOCH)
}

pub fn time(now: SystemTime) -> Time {
    Time(timestamp(now))
}

pub fn micro_time(now: SystemTime) -> MicroTime {
    MicroTime(timestamp(now))
}

/// Nanoseconds since the epoch, for unique event names as client-go makes them.
pub fn unix_nanos(now: SystemTime) -> u128 {
    now.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}
