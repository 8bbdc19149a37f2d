//! One eviction through the API: the policy/v1 Eviction, and under `pdbPolicy: override` for
//! a hard threshold the kubelet's own delete-and-mark. Every answer the API server may give is
//! turned into an [`Attempt`]: what happened, why, and how long the server asked to wait.
//!
//! A 429 is a PodDisruptionBudget block only when its Status names the `DisruptionBudget`
//! cause (the eviction REST handler's `checkAndDecrement`); any other 429 is the API server
//! shedding load (API Priority and Fairness, with `Retry-After`): it is waited out, never
//! overridden with a DELETE.

mod answer;

use std::time::{Duration, SystemTime};

use http::{Method, StatusCode};
use k8s_openapi::{
    api::{core::v1::PodCondition, policy::v1::Eviction as EvictionBody},
    apimachinery::pkg::apis::meta::v1::{DeleteOptions, ObjectMeta, Preconditions},
};
use node_agent_policy::Eviction;
use serde_json::json;

pub use answer::{classify, Classified};

use crate::{
    api::{status_message, ApiError, Context},
    config::PdbPolicy,
    time::time,
    transport::{ApiRequest, HttpResponse},
};

/// Reason and condition the kubelet sets on a pod it evicts.
pub const EVICTED_REASON: &str = "Evicted";
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";
pub const TERMINATION_BY_KUBELET: &str = "TerminationByKubelet";

/// What became of one eviction decision. The wire and metric names are [`Self::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EvictionResult {
    /// The API server accepted the eviction.
    Evicted,
    /// Carried out on the node: the pod's processes were killed (its record, `Failed` and
    /// `Evicted`, is written through the API after).
    Killed,
    /// A PodDisruptionBudget refused, the threshold is hard and policy says override: the pod
    /// was deleted and marked Evicted as the kubelet does.
    PdbOverridden,
    /// Dry run: nothing was sent.
    DryRun,
    /// A PodDisruptionBudget refused (and policy respects it, or the threshold is soft).
    BlockedByPdb,
    /// The agent's own pacing (`evictionsPerMinute`) has no token now; nothing was sent.
    RateLimited,
    /// The API server answered 429 without naming a disruption budget: it sheds load.
    ApiRateLimited,
    /// The pod is gone, or its name belongs to another pod now.
    AlreadyGone,
    /// The pod may not be evicted: the executor's last check, or the API server's refusal
    /// (forbidden, invalid, more than one disruption budget).
    Refused,
    /// The request failed after its retries (outage, timeout, server error).
    Failed,
}

impl EvictionResult {
    pub const ALL: [EvictionResult; 10] = [
        Self::Evicted,
        Self::Killed,
        Self::PdbOverridden,
        Self::DryRun,
        Self::BlockedByPdb,
        Self::RateLimited,
        Self::ApiRateLimited,
        Self::AlreadyGone,
        Self::Refused,
        Self::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Evicted => "evicted",
            Self::Killed => "killed",
            Self::PdbOverridden => "pdb_overridden",
            Self::DryRun => "dry_run",
            Self::BlockedByPdb => "blocked_by_pdb",
            Self::RateLimited => "rate_limited",
            Self::ApiRateLimited => "api_rate_limited",
            Self::AlreadyGone => "already_gone",
            Self::Refused => "refused",
            Self::Failed => "failed",
        }
    }

    /// The pod is on its way out (or would be, in dry run): wait for it before the next.
    pub fn pod_goes(self) -> bool {
        matches!(
            self,
            Self::Evicted | Self::Killed | Self::PdbOverridden | Self::DryRun
        )
    }

    /// The server said plainly that nothing was done: the pacing token is given back.
    /// (A failure after retries may have been done; its token stays spent.)
    pub fn nothing_done(self) -> bool {
        matches!(
            self,
            Self::BlockedByPdb
                | Self::ApiRateLimited
                | Self::AlreadyGone
                | Self::Refused
                | Self::RateLimited
        )
    }
}

impl std::str::FromStr for EvictionResult {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| format!("unknown eviction result {s:?}"))
    }
}

/// One eviction attempt's result, with the server's words and wishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub result: EvictionResult,
    /// Why: the Status message, the error, or what was checked.
    pub detail: Option<String>,
    /// How long the server asked to wait (`Retry-After`, `retryAfterSeconds`).
    pub retry_after: Option<Duration>,
}

impl Attempt {
    pub fn new(result: EvictionResult, detail: impl Into<String>) -> Self {
        Self {
            result,
            detail: Some(detail.into()),
            retry_after: None,
        }
    }
}

/// The policy/v1 Eviction body: grace period and the pod's UID as precondition.
pub fn eviction_body(e: &Eviction) -> EvictionBody {
    EvictionBody {
        metadata: ObjectMeta {
            name: Some(e.name.clone()),
            namespace: Some(e.namespace.clone()),
            ..ObjectMeta::default()
        },
        delete_options: Some(delete_options(e)),
    }
}

fn delete_options(e: &Eviction) -> DeleteOptions {
    DeleteOptions {
        grace_period_seconds: Some(e.grace_period_seconds),
        preconditions: Some(Preconditions {
            uid: e.uid.clone(),
            resource_version: None,
        }),
        ..DeleteOptions::default()
    }
}

/// The strategic merge patch of `pods/status` the kubelet's eviction amounts to. The
/// `DisruptionTarget` condition goes with a threshold eviction only: the kubelet's local
/// storage eviction sets none. With the pod's UID as a precondition where it is known (as the
/// kubelet's status manager writes it: a pod of the same name made since is refused, 422).
pub fn evicted_status_patch(e: &Eviction, now: SystemTime) -> serde_json::Value {
    let mut status = json!({
        "phase": "Failed",
        "reason": EVICTED_REASON,
        "message": e.message,
    });
    if e.signal.threshold().is_some() {
        let condition = PodCondition {
            type_: DISRUPTION_TARGET.into(),
            status: "True".into(),
            reason: Some(TERMINATION_BY_KUBELET.into()),
            message: Some(e.message.clone()),
            last_transition_time: Some(time(now)),
            ..PodCondition::default()
        };
        status["conditions"] = json!([condition]);
    }
    match &e.uid {
        Some(uid) => json!({ "metadata": { "uid": uid }, "status": status }),
        None => json!({ "status": status }),
    }
}

/// What writing the record of an eviction carried out on the node came to.
#[derive(Debug)]
pub enum Recorded {
    /// The pod is `Failed`, `Evicted`, with the kubelet's message and condition.
    Written,
    /// The pod is gone, or its name is another pod's now: nothing left to record.
    Gone,
    /// Dry run was set before the request.
    DryRun,
    /// The API server refused the write (invalid): trying again will not help.
    Refused(ApiError),
    /// No answer, or a server error, after the retries: worth trying again later.
    Failed(ApiError),
}

/// Writes the record of an eviction carried out on the node: the pod's status as the kubelet's
/// own eviction leaves it (`phase: Failed`, `reason: Evicted`, its message, the
/// `DisruptionTarget` condition), bound to the pod's UID. The kubelet, seeing the terminal
/// phase, never restarts the killed pod in place and ends what is left of it; its controller
/// makes a new one.
pub async fn record_evicted(
    ctx: &Context,
    e: &Eviction,
    dry_run: &(dyn Fn() -> bool + Sync),
    now: SystemTime,
) -> Recorded {
    let patch = ApiRequest::with_json(
        Method::PATCH,
        format!("{}/status", pod_path(e)),
        "application/strategic-merge-patch+json",
        &evicted_status_patch(e, now),
    )
    .status_decides();
    let resp = match send(ctx, "pod status patch", &patch, dry_run).await {
        Ok(Some(resp)) => resp,
        Ok(None) => return Recorded::DryRun,
        Err(err) if err.is_retryable() => return Recorded::Failed(err),
        Err(err) => return Recorded::Refused(err),
    };
    let err = || ApiError::from_response(ctx.transport.endpoint().name, &patch, &resp);
    match resp.status {
        StatusCode::OK => Recorded::Written,
        StatusCode::NOT_FOUND | StatusCode::CONFLICT => Recorded::Gone,
        // The UID precondition: the name is another pod's now.
        StatusCode::UNPROCESSABLE_ENTITY if status_message(&resp).contains("metadata.uid") => {
            Recorded::Gone
        }
        s if s.is_server_error() || s == StatusCode::TOO_MANY_REQUESTS => Recorded::Failed(err()),
        // An API server starting answers 403 until its RBAC caches are filled (seen on the
        // real cluster: the record of a kill made while it was down was refused once, then
        // lost): tried again like a 5xx, and a lasting 403 waits as long as any failure.
        StatusCode::FORBIDDEN => Recorded::Failed(err()),
        _ => Recorded::Refused(err()),
    }
}

fn pod_path(e: &Eviction) -> String {
    crate::api::pod_path(&e.namespace, &e.name)
}

/// Sends `req` with the context's retries, asking `dry_run` before every try: dry run holds
/// from the moment it is set, between retries too. `Ok(None)`: dry run was set meanwhile.
async fn send(
    ctx: &Context,
    what: &str,
    req: &ApiRequest,
    dry_run: &(dyn Fn() -> bool + Sync),
) -> Result<Option<HttpResponse>, ApiError> {
    ctx.backoff
        .run(&ctx.counters, what, || async {
            if dry_run() {
                return Ok(None);
            }
            let resp = ctx.transport.send(req).await?;
            // Server errors and 401 are worth another try; everything else is an answer.
            let code = resp.status;
            if code.is_server_error() || code == StatusCode::UNAUTHORIZED {
                let err = ApiError::from_response(ctx.transport.endpoint().name, req, &resp);
                if err.is_retryable() && !answer::is_pod_specific(&resp) {
                    return Err(err);
                }
            }
            Ok(Some(resp))
        })
        .await
}

/// Evicts the pod `e` names. `dry_run` is asked before every request that changes anything.
pub async fn evict(
    ctx: &Context,
    e: &Eviction,
    pdb_policy: PdbPolicy,
    dry_run: &(dyn Fn() -> bool + Sync),
    now: SystemTime,
) -> Attempt {
    let (namespace, name) = (&e.namespace, &e.name);
    let body = serde_json::to_value(eviction_body(e)).expect("an Eviction always serializes");
    let post = ApiRequest::with_json(
        Method::POST,
        format!("{}/eviction", pod_path(e)),
        "application/json",
        &body,
    )
    .status_decides();
    let resp = match send(ctx, "eviction", &post, dry_run).await {
        Ok(Some(resp)) => resp,
        Ok(None) => return Attempt::new(EvictionResult::DryRun, "dry run set before the request"),
        Err(err) => return Attempt::new(EvictionResult::Failed, err.to_string()),
    };
    let attempt = match classify(&resp) {
        Classified::Done(attempt) => attempt,
        Classified::DisruptionBudget {
            message,
            retry_after,
        } => {
            if pdb_policy == PdbPolicy::Override && e.hard {
                tracing::warn!(%namespace, %name, %message, "PodDisruptionBudget overridden for a hard threshold");
                match delete_and_mark_evicted(ctx, e, dry_run, now).await {
                    Ok(true) => Attempt::new(EvictionResult::PdbOverridden, message),
                    Ok(false) => {
                        Attempt::new(EvictionResult::DryRun, "dry run set before the delete")
                    }
                    Err((step, err)) => {
                        Attempt::new(EvictionResult::Failed, format!("override: {step}: {err}"))
                    }
                }
            } else {
                Attempt {
                    result: EvictionResult::BlockedByPdb,
                    detail: Some(message),
                    retry_after,
                }
            }
        }
    };
    tracing::info!(%namespace, %name, result = attempt.result.as_str(), detail = ?attempt.detail,
        retry_after = ?attempt.retry_after, "eviction request answered");
    attempt
}

/// What the kubelet does: delete with the grace period, then set phase Failed, reason
/// Evicted, its message and a DisruptionTarget condition. `Ok(false)`: dry run was set.
async fn delete_and_mark_evicted(
    ctx: &Context,
    e: &Eviction,
    dry_run: &(dyn Fn() -> bool + Sync),
    now: SystemTime,
) -> Result<bool, (&'static str, String)> {
    let path = pod_path(e);
    let delete = ApiRequest::with_json(
        Method::DELETE,
        path.clone(),
        "application/json",
        &serde_json::to_value(delete_options(e)).expect("DeleteOptions always serialize"),
    )
    .status_decides();
    let resp = match send(ctx, "pod delete", &delete, dry_run).await {
        Ok(Some(resp)) => resp,
        Ok(None) => return Ok(false),
        Err(err) => return Err(("delete", err.to_string())),
    };
    match resp.status {
        StatusCode::OK | StatusCode::ACCEPTED => {}
        StatusCode::NOT_FOUND => return Ok(true),
        _ => {
            let err = ApiError::from_response(ctx.transport.endpoint().name, &delete, &resp);
            return Err(("delete", err.to_string()));
        }
    }
    let patch = ApiRequest::with_json(
        Method::PATCH,
        format!("{path}/status"),
        "application/strategic-merge-patch+json",
        &evicted_status_patch(e, now),
    )
    .status_decides();
    match send(ctx, "pod status patch", &patch, dry_run).await {
        // Deleted already: marking it is what remains of the kubelet's sequence.
        Ok(None) => Ok(true),
        Ok(Some(resp)) if resp.status == StatusCode::OK => Ok(true),
        Ok(Some(resp)) if resp.status == StatusCode::NOT_FOUND => {
            tracing::info!(namespace = %e.namespace, name = %e.name, "pod gone before its status was marked Evicted");
            Ok(true)
        }
        Ok(Some(resp)) => {
            let err = ApiError::from_response(ctx.transport.endpoint().name, &patch, &resp);
            Err(("status patch", err.to_string()))
        }
        Err(err) => Err(("status patch", err.to_string())),
    }
}
