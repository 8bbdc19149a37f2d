//! Who may read what the agent serves: the caller's bearer token reviewed by the API server
//! (`authentication.k8s.io/v1` TokenReview), then whether that user may `get` the path asked for
//! (`authorization.k8s.io/v1` SubjectAccessReview on a non-resource URL), as controller-runtime's
//! secure metrics and kube-rbac-proxy do. RBAC decides: a ClusterRole with
//! `nonResourceURLs: [/metrics], verbs: [get]` bound to Prometheus's service account
//! (kube-prometheus's `prometheus-k8s` role has it).
//!
//! Verdicts are cached as those two do theirs (an allowed caller [`ALLOWED_FOR`], a refused
//! one [`REFUSED_FOR`]; an answer that did not come is never cached), at most [`CACHED`]
//! callers, so a scrape every few seconds costs the API server two requests every two minutes.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use http::{Method, StatusCode};
use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec},
    authorization::v1::{NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
};

use crate::{
    api::{call, decode, ApiError, Context},
    transport::ApiRequest,
};

pub const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
pub const ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";

/// How long an allowed caller is taken at its word (controller-runtime's authenticator cache).
pub const ALLOWED_FOR: Duration = Duration::from_secs(120);
/// How long a refused one is (controller-runtime's deny cache).
pub const REFUSED_FOR: Duration = Duration::from_secs(30);
/// Callers remembered at most.
pub const CACHED: usize = 256;
/// The longest token reviewed: a service account's projected token is about 1 kB.
pub const MAX_TOKEN: usize = 4096;

/// What the API server says of a caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The token names a user who may `get` the path.
    Allowed { user: String },
    /// The token is not one the API server accepts.
    Unauthenticated { why: String },
    /// The user may not.
    Forbidden { user: String, why: String },
}

/// The API server could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("reviewing the caller's token")]
    TokenReview(#[source] ApiError),
    #[error("asking whether {user} may get {path}")]
    AccessReview {
        user: String,
        path: String,
        #[source]
        source: ApiError,
    },
}

/// Reviews callers through one API server connection, with the cache.
#[derive(Debug)]
pub struct Reviewer {
    ctx: Context,
    cache: Mutex<HashMap<(String, String), (Verdict, Instant)>>,
}

impl Reviewer {
    pub fn new(ctx: Context) -> Self {
        Self {
            ctx,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// May the bearer of `token` `get` `path`? From the cache when it is young enough, else
    /// from the API server (a TokenReview, then for an authenticated user a
    /// SubjectAccessReview).
    pub async fn review(
        &self,
        token: &str,
        path: &str,
        now: Instant,
    ) -> Result<Verdict, ReviewError> {
        if token.is_empty() || token.len() > MAX_TOKEN {
            return Ok(Verdict::Unauthenticated {
                why: format!("a bearer token of {} bytes", token.len()),
            });
        }
        if let Some(verdict) = self.cached(token, path, now) {
            return Ok(verdict);
        }
        let key = (token.to_string(), path.to_string());
        let verdict = self.ask(token, path).await?;
        let ttl = match verdict {
            Verdict::Allowed { .. } => ALLOWED_FOR,
            _ => REFUSED_FOR,
        };
        let mut cache = self.lock();
        if cache.len() >= CACHED {
            cache.retain(|_, (_, until)| now < *until);
        }
        if cache.len() >= CACHED {
            // Still full of live entries (many callers): the soonest to expire goes.
            if let Some(oldest) = cache
                .iter()
                .min_by_key(|(_, (_, until))| *until)
                .map(|(k, _)| k.clone())
            {
                cache.remove(&oldest);
            }
        }
        cache.insert(key, (verdict.clone(), now + ttl));
        Ok(verdict)
    }

    /// The cached verdict on the bearer of `token` for `path`, if young enough: asks nothing.
    pub fn cached(&self, token: &str, path: &str, now: Instant) -> Option<Verdict> {
        let key = (token.to_string(), path.to_string());
        self.lock()
            .get(&key)
            .filter(|(_, until)| now < *until)
            .map(|(verdict, _)| verdict.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), (Verdict, Instant)>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn ask(&self, token: &str, path: &str) -> Result<Verdict, ReviewError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let req = ApiRequest::with_json(
            Method::POST,
            TOKEN_REVIEWS,
            "application/json",
            &serde_json::to_value(&review).expect("a TokenReview always serializes"),
        );
        let transport = &self.ctx.transport;
        let resp = call(transport, &req, &[StatusCode::OK, StatusCode::CREATED])
            .await
            .map_err(ReviewError::TokenReview)?;
        let answered: TokenReview = decode(transport.endpoint().name, &req, &resp, "TokenReview")
            .map_err(ReviewError::TokenReview)?;
        let status = answered.status.unwrap_or_default();
        let user = status.user.unwrap_or_default();
        let Some(username) = user
            .username
            .filter(|u| status.authenticated == Some(true) && !u.is_empty())
        else {
            return Ok(Verdict::Unauthenticated {
                why: status
                    .error
                    .filter(|e| !e.is_empty())
                    .unwrap_or_else(|| "the API server does not accept the token".into()),
            });
        };
        let access = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(username.clone()),
                uid: user.uid,
                groups: user.groups,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_string()),
                    verb: Some("get".into()),
                }),
                resource_attributes: None,
            },
            ..SubjectAccessReview::default()
        };
        let req = ApiRequest::with_json(
            Method::POST,
            ACCESS_REVIEWS,
            "application/json",
            &serde_json::to_value(&access).expect("a SubjectAccessReview always serializes"),
        );
        let asked = |source| ReviewError::AccessReview {
            user: username.clone(),
            path: path.to_string(),
            source,
        };
        let resp = call(transport, &req, &[StatusCode::OK, StatusCode::CREATED])
            .await
            .map_err(asked)?;
        let answered: SubjectAccessReview = decode(
            transport.endpoint().name,
            &req,
            &resp,
            "SubjectAccessReview",
        )
        .map_err(asked)?;
        let status = answered.status.unwrap_or_default();
        Ok(if status.allowed && status.denied != Some(true) {
            Verdict::Allowed { user: username }
        } else {
            let why = [status.reason, status.evaluation_error]
                .into_iter()
                .flatten()
                .filter(|w| !w.is_empty())
                .collect::<Vec<_>>()
                .join("; ");
            Verdict::Forbidden {
                user: username,
                why: if why.is_empty() {
                    format!("RBAC grants no get on {path}")
                } else {
                    why
                },
            }
        })
    }
}
