//! The one executor that changes the cluster for an eviction: checks protection, posts the
//! policy/v1 Eviction, handles a PodDisruptionBudget's 429 per `pdb_policy`, records the event.

pub mod protect;

use std::{sync::Arc, time::SystemTime};

use http::{Method, StatusCode};
use k8s_openapi::{
    api::{core::v1::PodCondition, policy::v1::Eviction},
    apimachinery::pkg::apis::meta::v1::{DeleteOptions, ObjectMeta, Preconditions},
};
use serde_json::json;

use crate::{
    api::{call, status_message, ApiError, Backoff, Counters},
    config::PdbPolicy,
    events::{build_pod_evicted, EventRecorder},
    pods::model::NodePod,
    time::time,
    transport::{ApiRequest, Transport},
};
pub use protect::{Protected, Protection};

/// What the daemon's policy decided for one pod, mirroring what the kubelet's eviction manager
/// knows when it evicts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvictionRequest {
    pub namespace: String,
    pub name: String,
    /// The pod must still be this one (sent as a UID precondition).
    pub uid: String,
    pub grace_period_seconds: i64,
    /// The kubelet's wording: "The node was low on resource: memory. ...".
    pub message: String,
    /// The eviction signal, e.g. `memory.available`.
    pub signal: String,
    /// Whether a hard threshold (no grace period) was crossed: only then may `override` apply.
    pub hard: bool,
    /// The resource the node is short of, e.g. `memory` (event annotation `starved_resource`).
    pub starved_resource: String,
    /// Containers using more than requested, and their usage (event annotations).
    pub offending_containers: Vec<String>,
    pub offending_containers_usage: Vec<String>,
}

/// What the executor did (or in dry-run mode, would have done).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictionOutcome {
    /// The API server accepted the eviction.
    Evicted,
    /// The pod no longer exists (404): nothing to do.
    AlreadyGone,
    /// A PodDisruptionBudget refused (429) and policy says respect it (or the threshold is
    /// soft): move on to the next candidate or retry later.
    BlockedByPdb { message: String },
    /// A PodDisruptionBudget refused, the threshold is hard and policy says override: the pod
    /// was deleted and marked Evicted as the kubelet does.
    PdbOverridden { message: String },
    /// Dry run: nothing was sent.
    DryRun,
}

#[derive(Debug, thiserror::Error)]
pub enum EvictError {
    #[error("refusing to evict {namespace}/{name}: {reason}")]
    Protected {
        namespace: String,
        name: String,
        reason: Protected,
    },
    #[error("eviction request for {namespace}/{name} does not match the pod (request uid {requested}, pod uid {actual})")]
    WrongPod {
        namespace: String,
        name: String,
        requested: String,
        actual: String,
    },
    #[error("evicting {namespace}/{name}: {step} failed")]
    Api {
        namespace: String,
        name: String,
        step: &'static str,
        #[source]
        source: ApiError,
    },
}

/// Reason and condition the kubelet sets on a pod it evicts.
pub const EVICTED_REASON: &str = "Evicted";
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";
pub const TERMINATION_BY_KUBELET: &str = "TerminationByKubelet";

/// The policy/v1 Eviction body: grace period and the pod's UID as precondition.
pub fn eviction_body(req: &EvictionRequest) -> Eviction {
    Eviction {
        metadata: ObjectMeta {
            name: Some(req.name.clone()),
            namespace: Some(req.namespace.clone()),
            ..ObjectMeta::default()
        },
        delete_options: Some(delete_options(req)),
    }
}

fn delete_options(req: &EvictionRequest) -> DeleteOptions {
    DeleteOptions {
        grace_period_seconds: Some(req.grace_period_seconds),
        preconditions: Some(Preconditions {
            uid: Some(req.uid.clone()),
            resource_version: None,
        }),
        ..DeleteOptions::default()
    }
}

/// The strategic merge patch of `pods/status` the kubelet's eviction amounts to.
pub fn evicted_status_patch(req: &EvictionRequest, now: SystemTime) -> serde_json::Value {
    let condition = PodCondition {
        type_: DISRUPTION_TARGET.into(),
        status: "True".into(),
        reason: Some(TERMINATION_BY_KUBELET.into()),
        message: Some(req.message.clone()),
        last_transition_time: Some(time(now)),
        ..PodCondition::default()
    };
    json!({
        "status": {
            "phase": "Failed",
            "reason": EVICTED_REASON,
            "message": req.message,
            "conditions": [condition],
        }
    })
}

#[derive(Debug, Clone)]
pub struct Executor {
    transport: Transport,
    backoff: Backoff,
    counters: Arc<Counters>,
    pdb_policy: PdbPolicy,
    dry_run: bool,
    protection: Protection,
    node: String,
    events: EventRecorder,
}

impl Executor {
    pub fn new(
        transport: Transport,
        backoff: Backoff,
        counters: Arc<Counters>,
        pdb_policy: PdbPolicy,
        dry_run: bool,
        protection: Protection,
        node: impl Into<String>,
    ) -> Self {
        let events = EventRecorder::new(transport.clone(), counters.clone(), dry_run);
        Self {
            transport,
            backoff,
            counters,
            pdb_policy,
            dry_run,
            protection,
            node: node.into(),
            events,
        }
    }

    pub fn events(&self) -> &EventRecorder {
        &self.events
    }

    /// Evicts `pod` as `req` says. Protected pods are refused before any request; in dry-run
    /// mode the decision is logged and nothing is sent.
    pub async fn evict(
        &self,
        pod: &NodePod,
        req: &EvictionRequest,
        now: SystemTime,
    ) -> Result<EvictionOutcome, EvictError> {
        let (namespace, name) = (req.namespace.clone(), req.name.clone());
        if pod.namespace != req.namespace || pod.name != req.name || pod.uid != req.uid {
            return Err(EvictError::WrongPod {
                namespace,
                name,
                requested: req.uid.clone(),
                actual: pod.uid.clone(),
            });
        }
        if let Some(reason) = self.protection.check(pod) {
            tracing::warn!(%namespace, %name, %reason, "eviction refused: protected pod");
            return Err(EvictError::Protected {
                namespace,
                name,
                reason,
            });
        }
        if self.dry_run {
            tracing::info!(%namespace, %name, signal = %req.signal, hard = req.hard,
                grace = req.grace_period_seconds, message = %req.message, "dry run: would evict");
            return Ok(EvictionOutcome::DryRun);
        }
        let api_err = |step, source| EvictError::Api {
            namespace: namespace.clone(),
            name: name.clone(),
            step,
            source,
        };

        let body = serde_json::to_value(eviction_body(req)).expect("an Eviction always serializes");
        let post = ApiRequest::with_json(
            Method::POST,
            format!(
                "/api/v1/namespaces/{}/pods/{}/eviction",
                req.namespace, req.name
            ),
            "application/json",
            &body,
        );
        let ok = [
            StatusCode::OK,
            StatusCode::CREATED,
            StatusCode::NOT_FOUND,
            StatusCode::TOO_MANY_REQUESTS,
        ];
        let resp = self
            .backoff
            .run(&self.counters, "eviction", || {
                call(&self.transport, &post, &ok)
            })
            .await
            .map_err(|e| api_err("eviction", e))?;
        let outcome = match resp.status {
            StatusCode::NOT_FOUND => return Ok(EvictionOutcome::AlreadyGone),
            StatusCode::TOO_MANY_REQUESTS => {
                let message = status_message(&resp);
                if self.pdb_policy == PdbPolicy::Override && req.hard {
                    tracing::warn!(%namespace, %name, %message, "PodDisruptionBudget overridden for a hard threshold");
                    self.delete_and_mark_evicted(req, now)
                        .await
                        .map_err(|(step, e)| api_err(step, e))?;
                    EvictionOutcome::PdbOverridden { message }
                } else {
                    tracing::info!(%namespace, %name, %message, hard = req.hard, "eviction blocked by a PodDisruptionBudget");
                    return Ok(EvictionOutcome::BlockedByPdb { message });
                }
            }
            _ => EvictionOutcome::Evicted,
        };
        // The eviction happened; a lost event is logged and counted by the recorder.
        let _ = self
            .events
            .post(&build_pod_evicted(req, &self.node, now))
            .await;
        Ok(outcome)
    }

    /// What the kubelet does: delete with the grace period, then set phase Failed, reason
    /// Evicted, its message and a DisruptionTarget condition.
    async fn delete_and_mark_evicted(
        &self,
        req: &EvictionRequest,
        now: SystemTime,
    ) -> Result<(), (&'static str, ApiError)> {
        let path = format!("/api/v1/namespaces/{}/pods/{}", req.namespace, req.name);
        let delete = ApiRequest::with_json(
            Method::DELETE,
            path.clone(),
            "application/json",
            &serde_json::to_value(delete_options(req)).expect("DeleteOptions always serialize"),
        );
        self.backoff
            .run(&self.counters, "pod delete", || {
                call(
                    &self.transport,
                    &delete,
                    &[StatusCode::OK, StatusCode::ACCEPTED],
                )
            })
            .await
            .map_err(|e| ("delete", e))?;
        let patch = ApiRequest::with_json(
            Method::PATCH,
            format!("{path}/status"),
            "application/strategic-merge-patch+json",
            &evicted_status_patch(req, now),
        );
        let ok = [StatusCode::OK, StatusCode::NOT_FOUND];
        let resp = self
            .backoff
            .run(&self.counters, "pod status patch", || {
                call(&self.transport, &patch, &ok)
            })
            .await
            .map_err(|e| ("status patch", e))?;
        if resp.status == StatusCode::NOT_FOUND {
            tracing::info!(namespace = %req.namespace, name = %req.name, "pod gone before its status was marked Evicted");
        }
        Ok(())
    }
}
