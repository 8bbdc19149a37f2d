//! `events.k8s.io/v1` events: what happened, on the pod (`Evicted`) or the node
//! (`EvictionThresholdMet`, `OOMKilling`), worded as the kubelet words them.
//!
//! The `build_*` functions are pure; [`EventRecorder`] posts what they build.

use std::{collections::BTreeMap, sync::Arc, time::SystemTime};

use http::{Method, StatusCode};
use k8s_openapi::{
    api::{core::v1::ObjectReference, events::v1::Event},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

use crate::{
    api::{call, ApiError, Counters},
    evict::EvictionRequest,
    time::{micro_time, unix_nanos},
    transport::{ApiRequest, Transport},
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

/// `Evicted` on the pod, with the kubelet's message and annotations.
pub fn build_pod_evicted(req: &EvictionRequest, node: &str, now: SystemTime) -> Event {
    let regarding = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(req.namespace.clone()),
        name: Some(req.name.clone()),
        uid: Some(req.uid.clone()),
        ..ObjectReference::default()
    };
    let mut e = base(&req.namespace, &req.name, node, now, regarding);
    let annotations: BTreeMap<String, String> = [
        (OFFENDING_CONTAINERS, req.offending_containers.join(",")),
        (
            OFFENDING_CONTAINERS_USAGE,
            req.offending_containers_usage.join(","),
        ),
        (STARVED_RESOURCE, req.starved_resource.clone()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    e.metadata.annotations = Some(annotations);
    e.action = Some("Evicting".into());
    e.reason = Some("Evicted".into());
    e.note = Some(req.message.clone());
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

/// `OOMKilling` on the node, naming the killed process and its pod.
pub fn build_oom_killing(node: &str, kill: &OomKill, now: SystemTime) -> Event {
    let mut e = base(NODE_EVENT_NAMESPACE, node, node, now, node_ref(node));
    e.action = Some("OOMKilling".into());
    e.reason = Some("OOMKilling".into());
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

/// Posts events. A failure is logged, counted and returned; it never stops an eviction.
#[derive(Debug, Clone)]
pub struct EventRecorder {
    transport: Transport,
    counters: Arc<Counters>,
    /// Send nothing (dry run): log the event instead.
    dry_run: bool,
}

impl EventRecorder {
    pub fn new(transport: Transport, counters: Arc<Counters>, dry_run: bool) -> Self {
        Self {
            transport,
            counters,
            dry_run,
        }
    }

    pub async fn post(&self, event: &Event) -> Result<(), ApiError> {
        let namespace = event
            .metadata
            .namespace
            .as_deref()
            .unwrap_or(NODE_EVENT_NAMESPACE);
        if self.dry_run {
            tracing::info!(reason = ?event.reason, note = ?event.note, "dry run: event not posted");
            return Ok(());
        }
        let body = serde_json::to_value(event).expect("an Event always serializes");
        let req = ApiRequest::with_json(
            Method::POST,
            format!("/apis/events.k8s.io/v1/namespaces/{namespace}/events"),
            "application/json",
            &body,
        );
        let result = call(
            &self.transport,
            &req,
            &[StatusCode::OK, StatusCode::CREATED],
        )
        .await;
        if let Err(e) = &result {
            Counters::bump(&self.counters.request_failures);
            tracing::warn!(error = %e, reason = ?event.reason, "event not recorded");
        }
        result.map(|_| ())
    }
}
