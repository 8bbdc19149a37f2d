//! The Eviction API's answers, read as the API server writes them (the eviction REST handler
//! in `pkg/registry/core/pod/storage/eviction.go`, API Priority and Fairness in front of it).

use http::StatusCode;

use super::{Attempt, EvictionResult};
use crate::{
    api::{decode_status, names_disruption_budget, retry_after, status_message},
    transport::HttpResponse,
};

/// The 500 the eviction handler answers for a pod under several PodDisruptionBudgets: about
/// this pod, not the server, so it is not retried and the next pod goes.
const SEVERAL_BUDGETS: &str = "more than one PodDisruptionBudget";

/// How an answer to the Eviction POST reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Classified {
    /// The answer settles the attempt.
    Done(Attempt),
    /// A PodDisruptionBudget forbids the eviction: `pdbPolicy` decides what follows.
    DisruptionBudget {
        message: String,
        retry_after: Option<std::time::Duration>,
    },
}

/// Whether a server error is about the pod rather than the server.
pub fn is_pod_specific(resp: &HttpResponse) -> bool {
    resp.status == StatusCode::INTERNAL_SERVER_ERROR
        && status_message(resp).contains(SEVERAL_BUDGETS)
}

/// Reads the answer to an Eviction POST.
pub fn classify(resp: &HttpResponse) -> Classified {
    let message = status_message(resp);
    let done = |result, detail: String| {
        Classified::Done(Attempt {
            result,
            detail: Some(detail),
            retry_after: retry_after(resp),
        })
    };
    match resp.status {
        StatusCode::OK | StatusCode::CREATED => Classified::Done(Attempt {
            result: EvictionResult::Evicted,
            detail: None,
            retry_after: None,
        }),
        StatusCode::NOT_FOUND => done(EvictionResult::AlreadyGone, message),
        // The UID precondition failed: the name belongs to another pod now; ours is gone.
        StatusCode::CONFLICT => done(
            EvictionResult::AlreadyGone,
            format!("the pod was replaced by another of the same name: {message}"),
        ),
        StatusCode::TOO_MANY_REQUESTS
            if decode_status(resp).is_some_and(|s| names_disruption_budget(&s)) =>
        {
            let causes = decode_status(resp)
                .and_then(|s| s.details)
                .and_then(|d| d.causes)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|c| c.message)
                .collect::<Vec<_>>();
            let message = if causes.is_empty() {
                message
            } else {
                format!("{message} ({})", causes.join("; "))
            };
            Classified::DisruptionBudget {
                message,
                retry_after: retry_after(resp),
            }
        }
        StatusCode::TOO_MANY_REQUESTS => done(EvictionResult::ApiRateLimited, message),
        s if s.is_client_error() => done(
            EvictionResult::Refused,
            format!("HTTP {}: {message}", s.as_u16()),
        ),
        s if is_pod_specific(resp) => done(
            EvictionResult::Refused,
            format!("HTTP {}: {message}", s.as_u16()),
        ),
        s => done(
            EvictionResult::Failed,
            format!("HTTP {}: {message}", s.as_u16()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;

    fn answer(code: u16, headers: &[(&str, &str)], body: serde_json::Value) -> HttpResponse {
        let mut map = http::HeaderMap::new();
        for (k, v) in headers {
            map.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        HttpResponse {
            status: StatusCode::from_u16(code).unwrap(),
            headers: map,
            body: if body.is_null() {
                b"Too many requests, please try again later.\n".to_vec()
            } else {
                body.to_string().into_bytes()
            },
        }
    }

    fn status(
        code: u16,
        reason: &str,
        message: &str,
        details: serde_json::Value,
    ) -> serde_json::Value {
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": message, "reason": reason, "details": details, "code": code})
    }

    #[test]
    fn each_answer_of_the_eviction_api() {
        let pdb = status(
            429,
            "TooManyRequests",
            "Cannot evict pod as it would violate the pod's disruption budget.",
            json!({"causes": [{"reason": "DisruptionBudget", "message": "The disruption budget web needs 2 healthy pods and has 2 currently"}]}),
        );
        let pdb_processing = status(
            429,
            "TooManyRequests",
            "Cannot evict pod as it would violate the pod's disruption budget.",
            json!({"causes": [{"reason": "DisruptionBudget", "message": "The disruption budget web is still being processed by the server."}], "retryAfterSeconds": 10}),
        );
        let busy = status(
            429,
            "TooManyRequests",
            "the server has received too many requests",
            json!({"retryAfterSeconds": 3}),
        );
        let r = |result| Some(result);
        type Row<'a> = (&'a str, HttpResponse, Option<EvictionResult>, Option<u64>);
        let rows: Vec<Row> = vec![
            ("201 evicted", answer(201, &[], status(201, "", "", json!({}))), r(EvictionResult::Evicted), None),
            ("404 already gone", answer(404, &[], status(404, "NotFound", "pods \"web\" not found", json!({}))), r(EvictionResult::AlreadyGone), None),
            ("409 replaced", answer(409, &[], status(409, "Conflict", "Precondition failed: UID in precondition: a, UID in object meta: b", json!({}))), r(EvictionResult::AlreadyGone), None),
            ("429 naming a disruption budget", answer(429, &[], pdb), None, None),
            ("429 naming a budget still processed, with Retry-After", answer(429, &[("retry-after", "10")], pdb_processing), None, Some(10)),
            ("429 from API Priority and Fairness: plain text and Retry-After", answer(429, &[("retry-after", "2")], serde_json::Value::Null), r(EvictionResult::ApiRateLimited), Some(2)),
            ("429 Status without a budget cause", answer(429, &[], busy), r(EvictionResult::ApiRateLimited), Some(3)),
            ("403 forbidden", answer(403, &[], status(403, "Forbidden", "pods \"web\" is forbidden", json!({}))), r(EvictionResult::Refused), None),
            ("422 invalid", answer(422, &[], status(422, "Invalid", "Eviction.policy \"web\" is invalid", json!({}))), r(EvictionResult::Refused), None),
            ("500 several budgets", answer(500, &[], status(500, "", "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.", json!({}))), r(EvictionResult::Refused), None),
            ("503", answer(503, &[], status(503, "ServiceUnavailable", "etcd", json!({}))), r(EvictionResult::Failed), None),
        ];
        for (what, resp, want, wait) in rows {
            match (classify(&resp), want) {
                (Classified::Done(a), Some(want)) => {
                    assert_eq!(a.result, want, "{what}");
                    assert_eq!(a.retry_after, wait.map(Duration::from_secs), "{what}");
                }
                (
                    Classified::DisruptionBudget {
                        message,
                        retry_after,
                    },
                    None,
                ) => {
                    assert!(
                        message.contains("disruption budget web"),
                        "{what}: {message}"
                    );
                    assert_eq!(retry_after, wait.map(Duration::from_secs), "{what}");
                }
                (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn only_the_several_budgets_500_is_about_the_pod() {
        let several = answer(500, &[], status(500, "", "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.", json!({})));
        let other = answer(
            500,
            &[],
            status(500, "InternalError", "etcd timeout", json!({})),
        );
        assert!(is_pod_specific(&several));
        assert!(!is_pod_specific(&other));
    }
}
