//! Acting, owned in one place: the pure [`plan`] that turns each decision of the policy, and
//! each outcome reported back, into the next actions (what is in flight, pods not evictable
//! now, the eviction pacing), and the one [`Executor`] that carries those actions out through
//! its two sinks, the Kubernetes API and the container runtime.
//!
//! [`Acts`] owns both: the loop hands it each decision, outcome and OOM kill, and it plans and
//! submits itself. Data flows one way: decision → [`Acts::act_on`] → [`plan::Acting::plan`]
//! (`now` passed in) → [`Action`]s → [`Executor::submit`] → side effects → [`Outcome`]s (typed
//! errors, never strings) → [`Acts::learn`] → [`plan::Acting::reported`]. The plan owns every rule about when to act, pacing included, so
//! the executor never refuses an action for a rule of the plan's; it only applies what is
//! true at the moment a request leaves (dry run, exclusions, the cluster connection), read
//! from its [`Settings`] before every request.
//!
//! Neither side ever waits on the other: [`Executor::submit`] never blocks (every lane's
//! capacity is bounded by what the plan can have in flight, and a lane that is full refuses at
//! once with an outcome of its own), and the executor reports on an unbounded channel whose
//! length is bounded by the actions it accepted. So the loop that decides and the lanes that
//! act cannot wait on each other in a cycle.

mod action;
mod acts;
pub mod journal;
pub mod kill;
mod lanes;
pub mod node;
pub mod plan;
pub mod reclaim;
mod run;

pub use action::{
    Action, Evict, Kill, NodeEvent, OomCounted, OomTold, Outcome, PodOomEvent, Report,
    StatusReport, Unnamed,
};
pub use acts::{Acts, Decided, Handed};
pub use journal::Journal;
pub use lanes::{Refused, LANES};
pub use reclaim::Identity;
pub use run::{
    Executor, Settings, CONDITION_HEARTBEAT, EVENT_BACKLOG, EVICTION_CAPACITY, STOPPED_REASON,
};
