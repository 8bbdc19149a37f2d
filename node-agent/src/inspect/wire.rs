//! What the inspection endpoint answers, as JSON: the agent's status, one pod's explanation,
//! and (on `/v1/trace`) the live stream's own [`Record`]s. The agent serialises these types
//! and `kubectl node-agent` deserialises the same ones, so the two cannot drift apart.
//! Presentation only: built last, from the typed state [`super::Inspect`] keeps.

use serde::{Deserialize, Serialize};

use crate::trace::Record;

/// The paths the endpoint serves (one request per connection, `GET` only).
pub const STATUS_PATH: &str = "/v1/status";
pub const TRACE_PATH: &str = "/v1/trace";
pub const EXPLAIN_PATH: &str = "/v1/explain";

/// Whether the agent may act.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Decides and reports, changes nothing (`--dry-run` or `dryRun: true`).
    DryRun,
    /// Evicts, taints and writes its condition and events.
    Enforcing,
    /// No `kubernetes:` section: nothing to act on.
    Standalone,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::DryRun => "dry-run",
            Mode::Enforcing => "enforcing",
            Mode::Standalone => "standalone",
        }
    }
}

/// A threshold met at the agent's last evaluation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetThreshold {
    /// `memory.available`, `nodefs.available`, ...
    pub signal: String,
    pub hard: bool,
    /// Met for its whole grace period (a hard threshold's is 0): it drives evictions.
    pub grace_period_passed: bool,
    /// The signal's value observed then (bytes, inodes or PIDs available).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<i64>,
    /// The threshold at the observed capacity, in the same unit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<i64>,
}

impl MetThreshold {
    /// `memory.available` (hard) or `memory.available (soft, grace period running)`.
    pub fn label(&self) -> String {
        match (self.hard, self.grace_period_passed) {
            (true, _) => self.signal.clone(),
            (false, true) => format!("{} (soft)", self.signal),
            (false, false) => format!("{} (soft, in grace)", self.signal),
        }
    }
}

/// `GET /v1/status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusReply {
    /// The crate version (`0.1.0`).
    pub version: String,
    /// The commit the binary was built from, or why that is not known.
    pub commit: String,
    /// The node the agent runs on (`kubernetes.nodeName` / `NODE_NAME`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Its own pod, `namespace/name` (`POD_NAMESPACE`, `POD_NAME`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    pub mode: Mode,
    /// What `/readyz` answers: ready, or why not.
    pub ready: bool,
    pub readiness: String,
    /// `fexit`, `sampler` or `polling`.
    pub memory_mechanism: String,
    pub thresholds_met: Vec<MetThreshold>,
    /// The last eviction decided and what became of it (a trace `eviction` record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_eviction: Option<Record>,
    /// The last OOM kill on this node (a trace `oom_kill` record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_oom_kill: Option<Record>,
    /// When the agent started, and its clock now (RFC 3339): ages are taken against the
    /// agent's clock, not the reader's.
    pub started: String,
    pub now: String,
}

/// `GET /v1/explain?namespace=NS&pod=NAME[&uid=UID]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Explanation {
    pub namespace: String,
    pub pod: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub mode: Mode,
    /// How far back the agent remembers, seconds.
    pub window_seconds: u64,
    /// What the agent saw and decided about this pod, oldest first.
    pub entries: Vec<Entry>,
    /// The node's thresholds met at the last evaluation.
    pub thresholds_met: Vec<MetThreshold>,
    /// Other pods the agent chose for eviction in the window, newest first (at most a few):
    /// what it did instead, when this pod was not chosen.
    pub others_chosen: Vec<Entry>,
    pub now: String,
}

/// One thing the agent saw or decided, and when: the same fact repeated at consecutive
/// evaluations is one entry, from `first` to `last`, `count` times.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub first: String,
    pub last: String,
    pub count: u32,
    pub namespace: String,
    pub pod: String,
    #[serde(flatten)]
    pub fact: Fact,
}

/// What an entry says. `what` is the JSON tag.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "what", rename_all = "snake_case")]
pub enum Fact {
    /// Ranked first among the pods the agent may evict, for a threshold past its grace
    /// period (or over a local storage limit): handed to the executor unless the pacing or
    /// stale pod data held it (the `eviction` record that follows says what came of it).
    Chosen {
        signal: String,
        hard: bool,
        /// The signal's value and its threshold as the decision saw them (for a local
        /// storage limit, the bytes used and the limit).
        observed: i64,
        threshold: i64,
    },
    /// Ranked ahead of the pod chosen (or of none) and passed over.
    PassedOver {
        signal: String,
        /// `critical_priority`, `excluded_namespace`, `blocked_by_pdb`, ...
        reason: String,
        /// The reason in words.
        why: String,
    },
    /// Over a local storage limit, and not evicted.
    OverLimitKept {
        limit: String,
        reason: String,
        why: String,
    },
    /// A trace record about this pod: an eviction's outcome, an OOM kill in it, a memory line
    /// crossed on its cgroup, a fork storm.
    Record { record: Box<Record> },
}

impl Fact {
    /// One line for people.
    pub fn describe(&self) -> String {
        match self {
            Fact::Chosen {
                signal,
                hard,
                observed,
                threshold,
            } => format!(
                "chosen for eviction: {signal} {} threshold met ({} observed, threshold {})",
                if *hard { "hard" } else { "soft" },
                crate::trace::signal_value(signal, *observed),
                crate::trace::signal_value(signal, *threshold),
            ),
            Fact::PassedOver { signal, why, .. } => {
                format!("passed over for {signal}: {why}")
            }
            Fact::OverLimitKept { limit, why, .. } => {
                format!("over its {limit} but kept: {why}")
            }
            Fact::Record { record } => record.describe(),
        }
    }
}
