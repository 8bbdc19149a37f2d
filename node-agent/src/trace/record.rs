//! The wire format of the live stream: one record per attributed kernel event, eviction
//! outcome or loss, as a JSON line (`kind` is the tag) or a table row. Built last, from the
//! typed [`Attributed`] event or the executor's [`Report`]; the daemon never reads facts back
//! out of it. Attached `trace` clients parse these lines back.

use serde::{Deserialize, Serialize};

use node_agent_executor::{
    reclaim::{ReclaimOutcome, ReclaimResult},
    Report,
};
use node_agent_kube::evict::EvictionResult;
use node_agent_policy::{EvictionSignal, Signal};

pub use crate::probes::parts::{CgroupRef, Crossing, PodRef, Qos};
use crate::{
    probes::{
        fork_storm::ForkStormRecord, memory_threshold::MemoryThresholdRecord,
        oom_kill::OomKillRecord, pid_threshold::PidThresholdRecord, Attributed, ForkStorm,
        Happened, MemoryThreshold, OomKill, PidThreshold, Probe as _,
    },
    saw_before::SawBefore,
};

/// `Signal` and `EvictionResult` travel by their names (`memory.available`, `evicted`).
mod by_name {
    use serde::{de::Error as _, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer, T: Named>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(v.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>, T: Named>(d: D) -> Result<T, D::Error> {
        let text = String::deserialize(d)?;
        T::from_name(&text).map_err(D::Error::custom)
    }

    pub trait Named: Sized {
        fn name(&self) -> &'static str;
        fn from_name(s: &str) -> Result<Self, String>;
    }

    impl Named for node_agent_policy::EvictionSignal {
        fn name(&self) -> &'static str {
            self.as_str()
        }
        fn from_name(s: &str) -> Result<Self, String> {
            s.parse()
                .map_err(|e: node_agent_policy::UnknownEvictionSignal| e.to_string())
        }
    }

    impl Named for node_agent_policy::Signal {
        fn name(&self) -> &'static str {
            self.as_str()
        }
        fn from_name(s: &str) -> Result<Self, String> {
            s.parse()
                .map_err(|e: node_agent_policy::UnknownSignal| e.to_string())
        }
    }

    impl Named for node_agent_executor::reclaim::ReclaimResult {
        fn name(&self) -> &'static str {
            self.as_str()
        }
        fn from_name(s: &str) -> Result<Self, String> {
            s.parse()
        }
    }

    impl Named for node_agent_kube::evict::EvictionResult {
        fn name(&self) -> &'static str {
            self.as_str()
        }
        fn from_name(s: &str) -> Result<Self, String> {
            s.parse()
        }
    }
}

/// One line of the live stream. `kind` is the JSON tag.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    /// The kernel probes' events (see [`crate::probes`]).
    OomKill(OomKillRecord),
    MemoryThreshold(MemoryThresholdRecord),
    PidThreshold(PidThresholdRecord),
    ForkStorm(ForkStormRecord),
    /// A pod chosen for eviction, and what became of it, with why.
    Eviction {
        time: String,
        /// Kernel timestamp of the event that triggered the evaluation, if one did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        trigger_ktime_ns: Option<u64>,
        namespace: String,
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        uid: Option<String>,
        /// The threshold's signal, or the local storage limit the pod went over
        /// (`emptydirfs.limit`, `ephemeralpodfs.limit`, `ephemeralcontainerfs.limit`).
        #[serde(with = "by_name")]
        signal: EvictionSignal,
        hard: bool,
        /// The signal's observed value (available bytes, inodes or PIDs) and its threshold,
        /// as the decision saw them; for a local storage limit, the bytes used and the limit.
        observed: i64,
        threshold: i64,
        grace_period_seconds: i64,
        #[serde(with = "by_name")]
        result: EvictionResult,
        /// Why: the API server's words, the error, or the pacing.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        message: String,
        /// For a hard threshold met early: the signal fell faster than relief could follow
        /// from the threshold itself (the headroom left was within its fall until relief).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        early: bool,
    },
    /// Node-level reclaim before an eviction for a disk signal: dead containers and unused
    /// images removed through the container runtime (or, in dry run, what would be).
    Reclaim {
        time: String,
        #[serde(with = "by_name")]
        signal: Signal,
        #[serde(with = "by_name")]
        result: ReclaimResult,
        containers_removed: u64,
        images_removed: u64,
        /// Removals that failed, and those skipped because a container they waited on stayed.
        failed: u64,
        skipped: u64,
        /// Bytes the removed objects were expected to free (the runtime's sizes); in dry run,
        /// what the plan would free.
        expected_bytes: u64,
        /// The signal's available amount observed right after the reclaim.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        available_after: Option<i64>,
        /// The one-line summary (with the first error, if any).
        summary: String,
        /// Each step: what was (or would be) removed and how it went.
        #[serde(default)]
        steps: Vec<serde_json::Value>,
    },
    EventsLost {
        time: String,
        /// Records lost since the previous `events_lost` line.
        lost: u64,
        /// Records lost since the programs were loaded, per CPU.
        total_per_cpu: Vec<u64>,
    },
    /// Records of the daemon's stream this reader missed: it read more slowly than they came
    /// (a `trace` client of the socket, a `kubectl node-agent trace`). The daemon decided and
    /// counted them all the same; only this copy was cut short.
    StreamLost {
        time: String,
        /// Records skipped since the previous line this reader got.
        lost: u64,
    },
}

impl Record {
    /// What a reader of the daemon's stream that fell `lost` records behind is told, now.
    pub fn stream_lost(lost: u64) -> Record {
        Record::StreamLost {
            time: crate::sys::now_rfc3339(),
            lost,
        }
    }

    /// An OOM kill's record with what the agent saw before it.
    pub fn with_saw_before(mut self, saw: SawBefore) -> Record {
        if let Record::OomKill(kill) = &mut self {
            kill.saw_before = Some(Box::new(saw));
        }
        self
    }

    /// The record of an attributed kernel event (its probe's own record); `time` renders its
    /// kernel timestamp.
    pub fn event(a: &Attributed, time: String) -> Record {
        let k = a.ktime_ns;
        match &a.what {
            Happened::OomKill(e) => Record::OomKill(e.record(time, k)),
            Happened::MemoryThreshold(e) => Record::MemoryThreshold(e.record(time, k)),
            Happened::PidThreshold(e) => Record::PidThreshold(e.record(time, k)),
            Happened::ForkStorm(e) => Record::ForkStorm(e.record(time, k)),
        }
    }

    /// The record of an eviction outcome: the decision's own figures and the executor's result.
    pub fn eviction(report: &Report, time: String) -> Record {
        let e = &report.eviction;
        Record::Eviction {
            time,
            trigger_ktime_ns: report.trigger_ktime_ns,
            namespace: e.namespace.clone(),
            name: e.name.clone(),
            uid: e.uid.clone(),
            signal: e.signal,
            hard: e.hard,
            observed: e.available.value(),
            threshold: e.threshold_quantity.value(),
            grace_period_seconds: e.grace_period_seconds,
            result: report.attempt.result,
            reason: report.attempt.detail.clone(),
            message: e.message.clone(),
            early: e.early,
        }
    }

    /// The record of a node-level reclaim, with the signal's value observed after it.
    pub fn reclaim(outcome: &ReclaimOutcome, available_after: Option<i64>, time: String) -> Record {
        let (c, i) = outcome.tallies();
        let steps: Vec<serde_json::Value> = match (outcome.result, &outcome.plan) {
            (ReclaimResult::DryRun, Some(plan)) if outcome.report.outcomes.is_empty() => plan
                .containers
                .iter()
                .map(to_value)
                .chain(plan.images.iter().map(to_value))
                .collect(),
            _ => outcome.report.outcomes.iter().map(to_value).collect(),
        };
        Record::Reclaim {
            time,
            signal: outcome.signal,
            result: outcome.result,
            containers_removed: c.removed,
            images_removed: i.removed,
            failed: c.failed + i.failed,
            skipped: c.skipped + i.skipped,
            expected_bytes: outcome.expected_bytes(),
            available_after,
            summary: outcome.summary(),
            steps,
        }
    }

    /// The JSON tag of this record's kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Record::OomKill(_) => OomKill::NAME,
            Record::MemoryThreshold(_) => MemoryThreshold::NAME,
            Record::PidThreshold(_) => PidThreshold::NAME,
            Record::ForkStorm(_) => ForkStorm::NAME,
            Record::Eviction { .. } => "eviction",
            Record::Reclaim { .. } => "reclaim",
            Record::EventsLost { .. } => "events_lost",
            Record::StreamLost { .. } => "stream_lost",
        }
    }

    /// The pod UID the record concerns, if any.
    pub fn pod_uid(&self) -> Option<&str> {
        match self {
            Record::Eviction { uid, .. } => uid.as_deref(),
            other => other
                .cgroup()
                .and_then(|c| c.pod.as_ref())
                .map(|p| p.uid.as_str()),
        }
    }

    pub fn cgroup(&self) -> Option<&CgroupRef> {
        match self {
            Record::OomKill(r) => Some(&r.cgroup),
            Record::MemoryThreshold(r) => Some(&r.cgroup),
            Record::ForkStorm(r) => Some(&r.cgroup),
            Record::PidThreshold(_)
            | Record::Eviction { .. }
            | Record::Reclaim { .. }
            | Record::EventsLost { .. }
            | Record::StreamLost { .. } => None,
        }
    }

    /// When it happened (RFC 3339).
    pub fn time(&self) -> &str {
        match self {
            Record::OomKill(r) => &r.time,
            Record::MemoryThreshold(r) => &r.time,
            Record::PidThreshold(r) => &r.time,
            Record::ForkStorm(r) => &r.time,
            Record::Eviction { time, .. }
            | Record::Reclaim { time, .. }
            | Record::EventsLost { time, .. }
            | Record::StreamLost { time, .. } => time,
        }
    }

    pub fn json(&self) -> String {
        serde_json::to_string(self).expect("records serialise: plain strings and numbers")
    }
}

/// A plan's or report's step as JSON (plain data: serialising cannot fail).
fn to_value<T: Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}
