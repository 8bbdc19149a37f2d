//! What the fake answers: JSON objects, `metav1.Status` errors in the API server's shapes,
//! API Priority and Fairness' plain-text 429, and watch streams split across frames.

use std::time::Duration;

use hyper::body::Bytes;
use serde_json::json;

/// The body of an answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    Full(String),
    /// Chunks sent one after the other, each after its pause; `keep_open` leaves the stream
    /// open afterwards (a watch the server has not timed out yet).
    Stream {
        frames: Vec<(Duration, String)>,
        keep_open: bool,
    },
    /// The same chunk again and again, each after its pause, never ending (a hostile
    /// server's endless line). The fake holds one chunk, whatever the client reads.
    Endless {
        chunk: String,
        pause: Duration,
    },
    /// A large body shared by every answer (cloning it copies nothing): with its
    /// `Content-Length`, or `chunked` in 64 KiB frames without one.
    Shared {
        data: Bytes,
        chunked: bool,
    },
}

/// One answer of the fake.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub headers: Vec<(&'static str, String)>,
    pub body: Body,
    /// Pause before the answer's headers.
    pub delay: Duration,
}

impl Reply {
    pub fn json(status: u16, body: impl Into<String>) -> Self {
        Self {
            status,
            content_type: "application/json",
            headers: Vec::new(),
            body: Body::Full(body.into()),
            delay: Duration::ZERO,
        }
    }

    /// A `metav1.Status` failure, as every API server error is written.
    pub fn status(status: u16, reason: &str, message: &str) -> Self {
        Self::status_with(status, reason, message, json!({}))
    }

    /// A `metav1.Status` failure with `details` (causes, retryAfterSeconds, ...).
    pub fn status_with(
        status: u16,
        reason: &str,
        message: &str,
        details: serde_json::Value,
    ) -> Self {
        let mut body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": status});
        if details.as_object().is_some_and(|d| !d.is_empty()) {
            body["details"] = details;
        }
        Self::json(status, body.to_string())
    }

    /// The eviction handler's 429 when a PodDisruptionBudget allows no disruption: Status
    /// reason `TooManyRequests`, cause `DisruptionBudget` (`checkAndDecrement`).
    pub fn pdb_blocked(pdb: &str) -> Self {
        Self::status_with(
            429,
            "TooManyRequests",
            "Cannot evict pod as it would violate the pod's disruption budget.",
            json!({"causes": [{"reason": "DisruptionBudget",
                "message": format!("The disruption budget {pdb} needs 2 healthy pods and has 2 currently")}]}),
        )
    }

    /// API Priority and Fairness shedding load: a plain-text 429 with `Retry-After`, before
    /// the request reaches any handler (`tooManyRequests` in the apiserver's filters).
    pub fn rate_limited(retry_after_seconds: u64) -> Self {
        Self {
            status: 429,
            content_type: "text/plain; charset=utf-8",
            headers: vec![("retry-after", retry_after_seconds.to_string())],
            body: Body::Full("Too many requests, please try again later.\n".into()),
            delay: Duration::ZERO,
        }
    }

    /// A watch answer: events (one JSON object each) split into the given frames.
    pub fn watch(frames: Vec<(Duration, String)>, keep_open: bool) -> Self {
        Self {
            body: Body::Stream { frames, keep_open },
            ..Self::json(200, "")
        }
    }

    /// A 200 with a large JSON body that every answer shares (see [`Body::Shared`]).
    pub fn shared(data: Bytes, chunked: bool) -> Self {
        Self {
            body: Body::Shared { data, chunked },
            ..Self::json(200, "")
        }
    }

    /// A 200 whose body repeats `chunk` forever, `pause` between chunks.
    pub fn endless(chunk: String, pause: Duration) -> Self {
        Self {
            body: Body::Endless { chunk, pause },
            ..Self::json(200, "")
        }
    }

    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    pub fn slow(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

/// 400 BadRequest with `message`, as the API server refuses a body it cannot take.
pub(super) fn bad_request(message: &str) -> Reply {
    Reply::status(400, "BadRequest", message)
}

/// A merge patch must be an object, a JSON patch a list of operations (else 400).
pub(super) fn merge_patch_object(body: &serde_json::Value, media: &str) -> Result<(), Reply> {
    if media == "application/json-patch+json" {
        return if body.is_array() {
            Ok(())
        } else {
            Err(bad_request("a JSON patch is a list of operations"))
        };
    }
    if !body.is_object() {
        return Err(bad_request("a merge patch is an object"));
    }
    Ok(())
}
