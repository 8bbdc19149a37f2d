//! `events.k8s.io/v1` events: what happened, on the pod (`Evicted`) or the node
//! (`EvictionThresholdMet`, [`OOM_KILL_REASON`]), worded as the kubelet words them.
//!
//! The `build_*` functions are pure; [`post`] sends what they build.

use std::{collections::BTreeMap, time::SystemTime};

use http::{Method, StatusCode};
use k8s_openapi::{
    api::{
        core::v1::ObjectReference,
        events::v1::{Event, EventSeries},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use node_agent_policy::Eviction;

use crate::{
    api::{call, events_path, ApiError, Context, Counters},
    time::{micro_time, unix_nanos},
    transport::ApiRequest,
};

/// `reportingController` of every event this agent writes.
pub const REPORTING_CONTROLLER: &str = "node-agent.io/node-agent";
/// The kubelet records node events in this namespace.
pub const NODE_EVENT_NAMESPACE: &str = "default";

/// Annotation keys the kubelet puts on its `Evicted` events (`eviction_manager` helpers).
pub const OFFENDING_CONTAINERS: &str = "offending_containers";
pub const OFFENDING_CONTAINERS_USAGE: &str = "offending_containers_usage";
pub const STARVED_RESOURCE: &str = "starved_resource";

/// A process the kernel's OOM killer chose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomKill {
    pub pid: u32,
    pub comm: String,
    /// The UID of the pod whose cgroup the process ran in, when it ran in one that neither the
    /// pod source nor the container runtime could name (a kill in a named pod is told on the
    /// pod, never on the node; a pod is never guessed).
    pub pod_uid: Option<String>,
}

/// The most an event's note may hold: events.k8s.io refuses a longer one (`NoteLengthLimit`,
/// in bytes).
pub const NOTE_LIMIT: usize = 1024;

/// `text` as an event's note: whole when it fits [`NOTE_LIMIT`], else cut at a character
/// boundary and ended with `…`, so the API server takes the event instead of refusing it. Every
/// note this agent writes goes through here.
pub fn note(mut text: String) -> String {
    const MORE: char = '…';
    if text.len() <= NOTE_LIMIT {
        return text;
    }
    let mut end = NOTE_LIMIT - MORE.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push(MORE);
    text
}

/// An event's name as client-go gives it: the object's name and the time in hex nanoseconds.
pub fn event_name(object_name: &str, at: SystemTime) -> String {
    format!("{object_name}.{:x}", unix_nanos(at))
}

fn base(
    namespace: &str,
    object_name: &str,
    node: &str,
    now: SystemTime,
    regarding: ObjectReference,
) -> Event {
    Event {
        metadata: ObjectMeta {
            name: Some(event_name(object_name, now)),
            namespace: Some(namespace.to_string()),
            ..ObjectMeta::default()
        },
        event_time: Some(micro_time(now)),
        reporting_controller: Some(REPORTING_CONTROLLER.to_string()),
        reporting_instance: Some(format!("node-agent-{node}")),
        type_: Some("Warning".to_string()),
        regarding: Some(regarding),
        ..Event::default()
    }
}

fn node_ref(node: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.into()),
        // The kubelet refers to its node with the node's name as UID.
        uid: Some(node.into()),
        ..ObjectReference::default()
    }
}

/// A Warning about the node, to be given its action, reason and note.
fn node_event(node: &str, now: SystemTime) -> Event {
    base(NODE_EVENT_NAMESPACE, node, node, now, node_ref(node))
}

/// `Evicted` on the pod, with the decision's own message and the annotations the kubelet
/// derives from the same figures (the containers the message names, their usage, the
/// resource the node is short of). An eviction for a local storage limit has no annotations,
/// as the kubelet's has none. The node it happened on is the event's `related` object (which
/// the admission policy checks for every event about a pod).
pub fn build_pod_evicted(decision: &Eviction, node: &str, now: SystemTime) -> Event {
    let regarding = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(decision.namespace.clone()),
        name: Some(decision.name.clone()),
        uid: decision.uid.clone(),
        ..ObjectReference::default()
    };
    let mut e = base(&decision.namespace, &decision.name, node, now, regarding);
    e.related = Some(node_ref(node));
    let join = |f: &dyn Fn(&node_agent_policy::OffendingContainer) -> String| {
        decision
            .offending_containers
            .iter()
            .map(f)
            .collect::<Vec<_>>()
            .join(",")
    };
    let annotations: BTreeMap<String, String> = [
        (OFFENDING_CONTAINERS, join(&|c| c.name.clone())),
        (OFFENDING_CONTAINERS_USAGE, join(&|c| c.usage.to_string())),
        (STARVED_RESOURCE, decision.resource.as_str().to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    if decision.signal.threshold().is_some() {
        e.metadata.annotations = Some(annotations);
    }
    e.action = Some("Evicting".into());
    e.reason = Some("Evicted".into());
    // The pod's status keeps the whole message; the event's note is what events.k8s.io takes.
    e.note = Some(note(decision.message.clone()));
    e
}

/// `EvictionThresholdMet` on the node: "Attempting to reclaim <resource>", as the kubelet says.
pub fn build_threshold_met(node: &str, starved_resource: &str, now: SystemTime) -> Event {
    let mut e = node_event(node, now);
    e.action = Some("Reclaiming".into());
    e.reason = Some("EvictionThresholdMet".into());
    e.note = Some(note(format!("Attempting to reclaim {starved_resource}")));
    e
}

/// How a node-level reclaim (dead containers and unused images removed through the container
/// runtime) ended, as its node event tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeReclaim {
    /// It removed something and nothing failed: `FreedDiskSpace` (Normal).
    Freed,
    /// A removal failed or the runtime could not be reached: the kubelet's
    /// `FreeDiskSpaceFailed` (Warning).
    Failed,
}

/// The node event a node-level reclaim leaves, its note the reclaim's own summary.
pub fn build_node_reclaim(
    node: &str,
    ended: NodeReclaim,
    summary: String,
    now: SystemTime,
) -> Event {
    let (type_, reason) = match ended {
        NodeReclaim::Freed => ("Normal", "FreedDiskSpace"),
        NodeReclaim::Failed => ("Warning", "FreeDiskSpaceFailed"),
    };
    let mut e = node_event(node, now);
    e.type_ = Some(type_.into());
    e.action = Some("Reclaiming".into());
    e.reason = Some(reason.into());
    e.note = Some(note(summary));
    e
}

/// The reason of the agent's node event for a kernel OOM kill: its own, so that it never
/// duplicates node-problem-detector's `OOMKilling` (which reads the same kill from the kernel
/// log) in alerts and dashboards keyed on that reason.
pub const OOM_KILL_REASON: &str = "NodeAgentOOMKill";

/// [`OOM_KILL_REASON`] on the node, naming the killed process (and the UID of a pod nobody
/// could name).
pub fn build_oom_kill(node: &str, kill: &OomKill, now: SystemTime) -> Event {
    let mut e = node_event(node, now);
    e.action = Some("OOMKilling".into());
    e.reason = Some(OOM_KILL_REASON.into());
    let pod = match &kill.pod_uid {
        Some(uid) => format!(
            " in the cgroup of pod UID {uid}, which neither the pod source nor the container runtime names"
        ),
        None => String::new(),
    };
    e.note = Some(note(format!(
        "Out of memory: killed process {} ({}){pod}",
        kill.pid, kill.comm
    )));
    e
}

/// A kernel OOM kill in a pod, as its event tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodOomKill {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The container the killed process ran in, when the agent can name it.
    pub container: Option<String>,
    pub pid: u32,
    pub comm: String,
    /// Why the OOM killer ran: the whole node, or whose limit was hit and how much was in use.
    pub cause: OomCause,
    /// What the agent saw and did before (one sentence).
    pub saw_before: String,
    /// Named by the container runtime: the pod source had not listed the pod or container yet.
    pub named_late: bool,
}

/// Why the OOM killer ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OomCause {
    /// A cgroup's limit: the container's or the pod's, with the memory in use against it.
    Limit {
        of: &'static str,
        usage_bytes: Option<u64>,
        limit_bytes: Option<u64>,
    },
    /// The whole node ran out of memory.
    Node,
    Unknown,
}

impl OomCause {
    /// The metric label of the cause.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Limit { .. } => "cgroup_limit",
            Self::Node => "node",
            Self::Unknown => "unknown",
        }
    }
}

fn human(bytes: u64) -> String {
    node_agent_policy::Quantity::from_int(
        i64::try_from(bytes).unwrap_or(i64::MAX),
        node_agent_policy::Format::BinarySi,
    )
    .to_string()
}

/// [`OOM_KILL_REASON`] on the pod: the container, the process, what ran out (the memory in use
/// against the limit that was hit, or the whole node), and what the agent saw before. The
/// node it happened on is the event's `related` object. `repeats` (count, last seen) when
/// the event is posted again after a failed write, its kills since counted in its `series`
/// from the start, as client-go creates an event its series update could not find.
pub fn build_pod_oom_kill(
    node: &str,
    kill: &PodOomKill,
    at: SystemTime,
    repeats: Option<(u32, SystemTime)>,
) -> Event {
    let regarding = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(kill.namespace.clone()),
        name: Some(kill.name.clone()),
        uid: Some(kill.uid.clone()),
        field_path: kill
            .container
            .as_ref()
            .map(|c| format!("spec.containers{{{c}}}")),
        ..ObjectReference::default()
    };
    let mut e = base(&kill.namespace, &kill.name, node, at, regarding);
    e.related = Some(node_ref(node));
    e.action = Some("OOMKilling".into());
    e.reason = Some(OOM_KILL_REASON.into());
    let container = match &kill.container {
        Some(c) => format!("container {c}"),
        None => "a container".into(),
    };
    let cause = match &kill.cause {
        OomCause::Limit {
            of,
            usage_bytes,
            limit_bytes,
        } => match (usage_bytes, limit_bytes) {
            (Some(u), Some(l)) => format!("{} in use of the {of}'s {} limit", human(*u), human(*l)),
            (_, Some(l)) => format!("the {of}'s {} limit reached", human(*l)),
            _ => format!("the {of}'s memory limit reached"),
        },
        OomCause::Node => "the node ran out of memory".into(),
        OomCause::Unknown => "cause not known".into(),
    };
    let late = if kill.named_late {
        " (named by the container runtime: the pod source had not listed it yet)"
    } else {
        ""
    };
    e.note = Some(note(format!(
        "Out of memory: killed process {} ({}) in {container}{late}: {cause}. {}",
        kill.pid, kill.comm, kill.saw_before
    )));
    e.series = repeats
        .filter(|(count, _)| *count >= 2)
        .map(|(count, last)| EventSeries {
            count: i32::try_from(count).unwrap_or(i32::MAX),
            last_observed_time: micro_time(last),
        });
    e
}

/// Counts one more occurrence of an event, as client-go's event series does: a merge patch of
/// `series` (`count`, `lastObservedTime`) on the event first posted.
pub async fn patch_series(
    ctx: &Context,
    namespace: &str,
    name: &str,
    count: u32,
    last_observed: SystemTime,
) -> Result<(), ApiError> {
    let body = serde_json::json!({"series": {
        "count": count,
        "lastObservedTime": micro_time(last_observed),
    }});
    let req = ApiRequest::with_json(
        Method::PATCH,
        format!(
            "{}/{}",
            crate::api::events_path(namespace),
            crate::transport::encode(name)
        ),
        "application/merge-patch+json",
        &body,
    )
    .status_decides();
    let result = call(&ctx.transport, &req, &[StatusCode::OK]).await;
    if let Err(e) = &result {
        Counters::bump(&ctx.counters.request_failures);
        tracing::warn!(error = %e, event = name, "event series not updated");
    }
    result.map(|_| ())
}

/// Posts an event. A failure is logged, counted and returned; it never stops an eviction.
pub async fn post(ctx: &Context, event: &Event) -> Result<(), ApiError> {
    let namespace = event
        .metadata
        .namespace
        .as_deref()
        .unwrap_or(NODE_EVENT_NAMESPACE);
    let body = serde_json::to_value(event).expect("an Event always serializes");
    let req = ApiRequest::with_json(
        Method::POST,
        events_path(namespace),
        "application/json",
        &body,
    )
    .status_decides();
    let result = call(&ctx.transport, &req, &[StatusCode::OK, StatusCode::CREATED]).await;
    if let Err(e) = &result {
        Counters::bump(&ctx.counters.request_failures);
        // Said by whoever asked for it (once per episode, the agent's reporter), not per call.
        tracing::debug!(error = %e, reason = ?event.reason, "event POST failed");
    }
    result.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_fits_what_events_k8s_io_takes() {
        let rows: [(&str, String, usize, bool); 5] = [
            ("short: whole", "a".repeat(10), 10, false),
            ("at the limit: whole", "a".repeat(1024), 1024, false),
            ("one past: cut", "a".repeat(1025), 1024, true),
            (
                "cut between the bytes of a character",
                format!("{}é{}", "a".repeat(1020), "b".repeat(10)),
                1020 + 3,
                true,
            ),
            ("far past", "x".repeat(1 << 20), 1024, true),
        ];
        for (what, text, len, cut) in rows {
            let got = note(text.clone());
            assert_eq!(got.len(), len, "{what}");
            assert_eq!(got.ends_with('…'), cut, "{what}");
            assert!(text.starts_with(got.trim_end_matches('…')), "{what}");
        }
    }
}
