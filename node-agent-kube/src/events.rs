//! `events.k8s.io/v1` events: what happened, on the pod (`Evicted`) or the node
//! (`EvictionThresholdMet`, [`OOM_KILL_REASON`]), worded as the kubelet words them.
//!
//! The `build_*` functions are pure; [`post`] sends what they build.

use std::{collections::BTreeMap, time::SystemTime};

use http::{Method, StatusCode};
use k8s_openapi::{
    api::{core::v1::ObjectReference, events::v1::Event},
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
    /// `namespace/name` of its pod, when it belonged to one.
    pub pod: Option<(String, String)>,
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
            // client-go's naming: the object's name and the time in hex nanoseconds.
            name: Some(format!("{object_name}.{:x}", unix_nanos(now))),
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

/// An event about the node, to be given its reason and note (node-level reclaim).
pub fn node_event(node: &str, now: SystemTime) -> Event {
    base(NODE_EVENT_NAMESPACE, node, node, now, node_ref(node))
}

/// `Evicted` on the pod, with the decision's own message and the annotations the kubelet
/// derives from the same figures (the containers the message names, their usage, the
/// resource the node is short of). An eviction for a local storage limit has no annotations,
/// as the kubelet's has none.
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
    e.note = Some(decision.message.clone());
    e
}

/// `EvictionThresholdMet` on the node: "Attempting to reclaim <resource>", as the kubelet says.
pub fn build_threshold_met(node: &str, starved_resource: &str, now: SystemTime) -> Event {
    let mut e = base(NODE_EVENT_NAMESPACE, node, node, now, node_ref(node));
    e.action = Some("Reclaiming".into());
    e.reason = Some("EvictionThresholdMet".into());
    e.note = Some(format!("Attempting to reclaim {starved_resource}"));
    e
}

/// The reason of the agent's node event for a kernel OOM kill: its own, so that it never
/// duplicates node-problem-detector's `OOMKilling` (which reads the same kill from the kernel
/// log) in alerts and dashboards keyed on that reason.
pub const OOM_KILL_REASON: &str = "NodeAgentOOMKill";

/// [`OOM_KILL_REASON`] on the node, naming the killed process and its pod.
pub fn build_oom_kill(node: &str, kill: &OomKill, now: SystemTime) -> Event {
    let mut e = base(NODE_EVENT_NAMESPACE, node, node, now, node_ref(node));
    e.action = Some("OOMKilling".into());
    e.reason = Some(OOM_KILL_REASON.into());
    let pod = match &kill.pod {
        Some((ns, name)) => format!(" in pod {ns}/{name}"),
        None => String::new(),
    };
    e.note = Some(format!(
        "Out of memory: killed process {} ({}){pod}",
        kill.pid, kill.comm
    ));
    e
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
    );
    let result = call(&ctx.transport, &req, &[StatusCode::OK, StatusCode::CREATED]).await;
    if let Err(e) = &result {
        Counters::bump(&ctx.counters.request_failures);
        tracing::warn!(error = %e, reason = ?event.reason, "event not recorded");
    }
    result.map(|_| ())
}
