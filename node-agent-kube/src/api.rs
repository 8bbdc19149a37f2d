//! HTTP answers turned into typed errors, retrying with backoff, and the context every client
//! of one endpoint shares.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use http::{Method, StatusCode};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;

use crate::{
    config::RetryConfig,
    transport::{encode, ApiRequest, HttpResponse, Transport, TransportError},
};

/// `policyv1.DisruptionBudgetCause`: the cause the Eviction API names when a
/// PodDisruptionBudget forbids an eviction (`details.causes[].reason` of its 429 Status).
pub const DISRUPTION_BUDGET_CAUSE: &str = "DisruptionBudget";
/// A `Retry-After` longer than this is capped: a misbehaving proxy cannot park the agent.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// What every client of one endpoint shares: the transport, the retry policy, the failure
/// counters and the node this agent runs on.
#[derive(Debug, Clone)]
pub struct Context {
    pub transport: Transport,
    pub backoff: Backoff,
    pub counters: Arc<Counters>,
    pub node: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error(
        "{endpoint}: {method} {path}: 401 Unauthorized (token expired or not accepted): {message}"
    )]
    Unauthorized {
        endpoint: &'static str,
        method: Method,
        path: String,
        message: String,
    },
    #[error("{endpoint}: {method} {path}: 403 Forbidden (RBAC does not grant this): {message}")]
    Forbidden {
        endpoint: &'static str,
        method: Method,
        path: String,
        message: String,
    },
    #[error("{endpoint}: {method} {path}: HTTP {code}: {message}")]
    Status {
        endpoint: &'static str,
        method: Method,
        path: String,
        code: u16,
        message: String,
        /// The `metav1.Status` body, when the answer was one.
        status: Option<Box<Status>>,
        /// From the `Retry-After` header, else the Status' `details.retryAfterSeconds`.
        retry_after: Option<Duration>,
    },
    #[error("{endpoint}: {method} {path}: the answer cannot be used: {why}")]
    Unusable {
        endpoint: &'static str,
        method: Method,
        path: String,
        why: String,
    },
    #[error("{endpoint}: {method} {path}: the answer is not a valid {expected}")]
    Decode {
        endpoint: &'static str,
        method: Method,
        path: String,
        expected: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

impl ApiError {
    /// Whether the same request may succeed later: outages, timeouts, 5xx, 429, and 401/403
    /// (tokens rotate, RBAC bindings arrive late), and bad JSON (a proxy's error page).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Transport(e) => e.is_transient(),
            Self::Unauthorized { .. } | Self::Forbidden { .. } | Self::Decode { .. } => true,
            Self::Unusable { .. } => false,
            Self::Status { code, .. } => *code >= 500 || *code == 429 || *code == 408,
        }
    }

    /// The HTTP status, when the server answered.
    pub fn code(&self) -> Option<u16> {
        match self {
            Self::Unauthorized { .. } => Some(401),
            Self::Forbidden { .. } => Some(403),
            Self::Status { code, .. } => Some(*code),
            Self::Transport(_) | Self::Decode { .. } | Self::Unusable { .. } => None,
        }
    }

    /// How long the server asked to wait before trying again, if it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// What a decoding run on a blocking thread came to: the value, the JSON's error, the
    /// budget's refusal, or the thread's end.
    pub fn decoded<T>(
        endpoint: &'static str,
        req: &ApiRequest,
        expected: &'static str,
        joined: Result<Result<T, DecodeError>, tokio::task::JoinError>,
    ) -> Result<T, Self> {
        let unusable = |why: String| Self::Unusable {
            endpoint,
            method: req.method.clone(),
            path: req.path.clone(),
            why,
        };
        match joined {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(DecodeError::Json(source))) => Err(Self::Decode {
                endpoint,
                method: req.method.clone(),
                path: req.path.clone(),
                expected,
                source,
            }),
            Ok(Err(e @ DecodeError::OverBudget { .. })) => Err(unusable(e.to_string())),
            Err(e) => Err(unusable(format!("decoding stopped: {e}"))),
        }
    }

    /// An error for an answer whose status the caller did not expect.
    pub fn from_response(endpoint: &'static str, req: &ApiRequest, resp: &HttpResponse) -> Self {
        let message = status_message(resp);
        let (method, path) = (req.method.clone(), req.path.clone());
        match resp.status {
            StatusCode::UNAUTHORIZED => Self::Unauthorized {
                endpoint,
                method,
                path,
                message,
            },
            StatusCode::FORBIDDEN => Self::Forbidden {
                endpoint,
                method,
                path,
                message,
            },
            s => Self::Status {
                endpoint,
                method,
                path,
                code: s.as_u16(),
                message,
                status: decode_status(resp).map(Box::new),
                retry_after: retry_after(resp),
            },
        }
    }
}

/// The answer's body as a `metav1.Status`, when it is one.
pub fn decode_status(resp: &HttpResponse) -> Option<Status> {
    let status: Status = serde_json::from_slice(&resp.body).ok()?;
    (status.code.is_some() || status.reason.is_some() || status.status.is_some()).then_some(status)
}

/// Whether a Status names a PodDisruptionBudget among its causes.
pub fn names_disruption_budget(status: &Status) -> bool {
    status
        .details
        .as_ref()
        .and_then(|d| d.causes.as_ref())
        .is_some_and(|causes| {
            causes
                .iter()
                .any(|c| c.reason.as_deref() == Some(DISRUPTION_BUDGET_CAUSE))
        })
}

/// `/api/v1/nodes/<node>`, the name encoded.
pub fn node_path(node: &str) -> String {
    format!("/api/v1/nodes/{}", encode(node))
}

/// `/api/v1/namespaces/<namespace>/pods/<name>`, both encoded.
pub fn pod_path(namespace: &str, name: &str) -> String {
    format!(
        "/api/v1/namespaces/{}/pods/{}",
        encode(namespace),
        encode(name)
    )
}

/// `/apis/events.k8s.io/v1/namespaces/<namespace>/events`, the namespace encoded.
pub fn events_path(namespace: &str) -> String {
    format!(
        "/apis/events.k8s.io/v1/namespaces/{}/events",
        encode(namespace)
    )
}

/// `Retry-After` in seconds (the API server and API Priority and Fairness send seconds), else
/// the Status' `details.retryAfterSeconds`; zero and unreadable values count as none.
pub fn retry_after(resp: &HttpResponse) -> Option<Duration> {
    let header = resp
        .headers
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let seconds = header.or_else(|| {
        decode_status(resp)
            .and_then(|s| s.details)
            .and_then(|d| d.retry_after_seconds)
            .and_then(|s| u64::try_from(s).ok())
    })?;
    (seconds > 0).then(|| Duration::from_secs(seconds).min(MAX_RETRY_AFTER))
}

/// `message` of a `metav1.Status` body, else the body's start.
pub fn status_message(resp: &HttpResponse) -> String {
    serde_json::from_slice::<serde_json::Value>(&resp.body)
        .ok()
        .and_then(|v| {
            v.get("message")
                .and_then(|m| m.as_str())
                .map(|m| node_agent_policy::shown(m, crate::transport::EXCERPT).into_owned())
        })
        .unwrap_or_else(|| resp.excerpt())
}

/// Decodes a JSON answer, naming what was expected when it is not that.
pub fn decode<T: serde::de::DeserializeOwned>(
    endpoint: &'static str,
    req: &ApiRequest,
    resp: &HttpResponse,
    expected: &'static str,
) -> Result<T, ApiError> {
    serde_json::from_slice(&resp.body).map_err(|source| ApiError::Decode {
        endpoint,
        method: req.method.clone(),
        path: req.path.clone(),
        expected,
        source,
    })
}

/// Failure counts for the daemon's metrics: nothing fails silently.
#[derive(Debug, Default)]
pub struct Counters {
    /// Calls that failed after their last try.
    pub request_failures: AtomicU64,
    /// Tries that failed and were tried again.
    pub retries: AtomicU64,
    /// Pods left out of the snapshots (unreadable, or sharing their UID), each counted when it
    /// first appears.
    pub pods_skipped: AtomicU64,
    /// Stats entries refused (unreadable, or sharing a UID), each counted when it first appears.
    pub stats_skipped: AtomicU64,
    /// Quantities of pods that are not quantities, each counted when it first appears.
    pub fields_invalid: AtomicU64,
    /// Watch events that could not be decoded.
    pub watch_events_dropped: AtomicU64,
    /// Lists of the pods by the API server pod source (the first one, and every relist).
    pub pod_relists: AtomicU64,
    /// The pause before the pod source's next list or watch while it backs off, in
    /// milliseconds (0 while the watch is healthy).
    pub pod_watch_backoff_millis: AtomicU64,
}

impl Counters {
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
/// Exponential backoff between tries of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub attempts: u32,
    pub initial: Duration,
    pub max: Duration,
}

impl From<&RetryConfig> for Backoff {
    fn from(c: &RetryConfig) -> Self {
        Self {
            attempts: c.attempts,
            initial: c.initial_backoff.get(),
            max: c.max_backoff.get(),
        }
    }
}

impl Backoff {
    /// The pause before try number `retry` + 1 (`retry` counts from 1): initial · 2^(retry−1),
    /// capped at `max`.
    pub fn delay(&self, retry: u32) -> Duration {
        let factor = 1u32
            .checked_shl(retry.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// Calls `op` until it succeeds, fails with a non-retryable error, or runs out of tries.
    /// Every failed try is counted; the log lines are debug ones: what a failure means is the
    /// caller's to say, once per transition (a periodic read failing every two seconds is one
    /// line, not one per read).
    pub async fn run<T, F, Fut>(
        &self,
        counters: &Counters,
        what: &str,
        mut op: F,
    ) -> Result<T, ApiError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, ApiError>>,
    {
        let mut tried = 0;
        loop {
            tried += 1;
            match op().await {
                Ok(v) => return Ok(v),
                Err(e) if e.is_retryable() && tried < self.attempts => {
                    Counters::bump(&counters.retries);
                    // As long as the server asked, at least: a rate-limited client that comes
                    // back early only gets limited again.
                    let pause = self.delay(tried).max(e.retry_after().unwrap_or_default());
                    tracing::debug!(error = %e, try_ = tried, ?pause, "{what} failed; trying again");
                    tokio::time::sleep(pause).await;
                }
                Err(e) => {
                    Counters::bump(&counters.request_failures);
                    tracing::debug!(error = %e, tries = tried, "{what} failed");
                    return Err(e);
                }
            }
        }
    }
}

/// `d` scaled by a factor drawn from [0.5, 1.5): spreads the retries of many agents (one per
/// node) so that a recovering API server does not meet them all at once. The factor comes from
/// a per-thread xorshift seeded by the clock: jitter needs no cryptographic quality.
pub fn jitter(d: Duration) -> Duration {
    use std::cell::Cell;
    thread_local! {
        static STATE: Cell<u64> = Cell::new(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0x9E37_79B9_7F4A_7C15, |d| d.as_nanos() as u64)
                | 1,
        );
    }
    let draw = STATE.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        x
    });
    // 53 random bits as a fraction in [0, 1).
    let fraction = (draw >> 11) as f64 / (1u64 << 53) as f64;
    d.mul_f64(0.5 + fraction)
}

/// Sends `req` once and returns the answer if its status is one of `ok`, else a typed error.
pub async fn call(
    transport: &Transport,
    req: &ApiRequest,
    ok: &[StatusCode],
) -> Result<HttpResponse, ApiError> {
    let resp = transport.send(req).await?;
    if ok.contains(&resp.status) {
        Ok(resp)
    } else {
        Err(ApiError::from_response(
            transport.endpoint().name,
            req,
            &resp,
        ))
    }
}

/// A list or summary that cannot be used whole (decoded record by record, within a budget).
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error(
        "its {what} would take more than the {budget}-byte budget a node's {what} never come near"
    )]
    OverBudget { what: &'static str, budget: usize },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_then_caps() {
        let b = Backoff {
            attempts: 10,
            initial: Duration::from_millis(100),
            max: Duration::from_millis(500),
        };
        let rows = [(1, 100), (2, 200), (3, 400), (4, 500), (40, 500)];
        for (retry, millis) in rows {
            assert_eq!(
                b.delay(retry),
                Duration::from_millis(millis),
                "retry {retry}"
            );
        }
    }

    #[test]
    fn jitter_stays_within_half_and_one_and_a_half_and_varies() {
        let base = Duration::from_secs(10);
        let draws: Vec<Duration> = (0..200).map(|_| jitter(base)).collect();
        assert!(draws.iter().all(|d| *d >= base / 2 && *d < base * 3 / 2));
        let distinct: std::collections::BTreeSet<_> = draws.iter().collect();
        assert!(distinct.len() > 100, "{} distinct of 200", distinct.len());
    }

    #[test]
    fn retryable_statuses() {
        let status = |code| ApiError::Status {
            endpoint: "x",
            method: Method::GET,
            path: "/".into(),
            code,
            message: String::new(),
            status: None,
            retry_after: None,
        };
        let rows = [
            (500, true),
            (503, true),
            (429, true),
            (404, false),
            (409, false),
            (422, false),
        ];
        for (code, want) in rows {
            assert_eq!(status(code).is_retryable(), want, "{code}");
        }
    }
}
