//! The executor's lanes, as named in what it reports: the one thing both the executor and its
//! runtime sink say about a lane that could not take an action.

/// The lanes' names, as [`Refused::lane`] gives them.
pub const LANES: [&str; 4] = ["eviction", "event", "status", "runtime"];

/// An action the executor did not take: the lane that carries it was full. Only actions the
/// plan does not hold in flight can meet a full lane (node events in a burst, an image
/// detection while a reclaim runs), so this is load shedding, counted and logged, never an
/// eviction lost silently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the executor's {lane} lane is full ({capacity} queued): {action} not taken")]
pub struct Refused {
    pub lane: &'static str,
    pub capacity: usize,
    pub action: &'static str,
}
