//! Who may read what the listener serves beyond the kubelet's probes. `/healthz` and `/readyz`
//! answer anyone (the kubelet probes them without credentials); `/metrics` names namespaces and
//! containers (the OOM series) and answers only callers the configured [`MetricsAccess`] lets
//! in; `/readyz` gives the whole reason (URLs, addresses and paths in errors) only to them too.
//!
//! - `kubernetes`: a bearer token the API server authenticates (TokenReview) whose user RBAC
//!   lets `get` the path (SubjectAccessReview on the non-resource URL), as controller-runtime's
//!   secure metrics and kube-rbac-proxy do ([`node_agent_kube::access`]). A caller whose
//!   verdict is cached is answered from the cache before anything else, so a flood of made-up
//!   tokens never stands in the way of the real scraper. Reviews that must be asked are at
//!   most [`REVIEWS_AT_ONCE`] at once and [`REVIEWS_PER_SECOND`] a second (burst
//!   [`REVIEW_BURST`]), each answered within [`REVIEW_DEADLINE`]: a flood costs the API server
//!   that much, and is answered 429 beyond it; a review that does not come in time is a 503,
//!   never a dropped connection. A review that fails is logged once until one succeeds again.
//! - `loopback`: callers in the agent's own network namespace (a sidecar in the pod; the host
//!   itself, standalone); the kubelet's probes, from the node, still reach `/healthz` and
//!   `/readyz`.
//! - `open`: anyone who reaches `listen` (a NetworkPolicy may still narrow who that is).

use std::{
    net::IpAddr,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use node_agent_kube::access::{Reviewer, Verdict};
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Semaphore};

use crate::telemetry::Metrics;

/// Reviews asked of the API server at once, at most.
pub const REVIEWS_AT_ONCE: usize = 4;
/// Reviews asked of the API server per second, at most, on average.
pub const REVIEWS_PER_SECOND: f64 = 5.0;
/// Reviews that may be asked at once after a quiet spell.
pub const REVIEW_BURST: f64 = 10.0;
/// How long a caller waits for its review: within the listener's own deadline.
pub const REVIEW_DEADLINE: Duration = Duration::from_secs(3);

/// A token bucket: reviews left, and when it was last filled.
#[derive(Debug)]
struct Bucket {
    left: f64,
    at: Instant,
}

impl Bucket {
    fn take(&mut self, now: Instant) -> bool {
        let refill = now.saturating_duration_since(self.at).as_secs_f64() * REVIEWS_PER_SECOND;
        self.left = (self.left + refill).min(REVIEW_BURST);
        self.at = now;
        if self.left >= 1.0 {
            self.left -= 1.0;
            true
        } else {
            false
        }
    }
}

/// `metricsAccess`: who may read `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricsAccess {
    Kubernetes,
    Loopback,
    Open,
}

impl MetricsAccess {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kubernetes => "kubernetes",
            Self::Loopback => "loopback",
            Self::Open => "open",
        }
    }
}

/// Why a caller was not let in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No bearer token, or one the API server does not accept: 401.
    Unauthenticated(String),
    /// A user RBAC does not let `get` the path, or a caller from outside the agent's network
    /// namespace under `loopback`: 403.
    Forbidden(String),
    /// The API server could not be asked (not connected yet, unreachable, the agent's own RBAC
    /// missing its `create` on the reviews): 503.
    Unavailable(String),
    /// [`REVIEWS_AT_ONCE`] reviews are out already, or [`REVIEWS_PER_SECOND`] were asked:
    /// 429.
    Busy,
}

impl Refusal {
    /// The metric label.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Unauthenticated(_) => "unauthenticated",
            Self::Forbidden(_) => "forbidden",
            Self::Unavailable(_) => "unavailable",
            Self::Busy => "busy",
        }
    }
}

/// Lets callers in, or says why not.
#[derive(Debug, Clone)]
pub struct Gate {
    mode: MetricsAccess,
    /// The API server connection to review callers through (none yet: not connected).
    reviewer: watch::Receiver<Option<Arc<Reviewer>>>,
    reviews: Arc<Semaphore>,
    rate: Arc<Mutex<Bucket>>,
    /// A review failed and was said; said again once one succeeds.
    failing: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
}

impl Gate {
    pub fn new(
        mode: MetricsAccess,
        reviewer: watch::Receiver<Option<Arc<Reviewer>>>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            mode,
            reviewer,
            reviews: Arc::new(Semaphore::new(REVIEWS_AT_ONCE)),
            rate: Arc::new(Mutex::new(Bucket {
                left: REVIEW_BURST,
                at: Instant::now(),
            })),
            failing: Arc::new(AtomicBool::new(false)),
            metrics,
        }
    }

    /// May this caller (`authorization`: its header, `peer`: its address) `get` `path`?
    /// Counted by result.
    pub async fn check(
        &self,
        authorization: Option<&str>,
        peer: IpAddr,
        path: &str,
    ) -> Result<(), Refusal> {
        let verdict = self.decide(authorization, peer, path).await;
        self.metrics.telemetry_authorization(match &verdict {
            Ok(()) => "allowed",
            Err(refusal) => refusal.as_str(),
        });
        verdict
    }

    /// Whether a caller may see `/readyz`'s whole reason: one `check` would let in, asked of the
    /// API server only when it shows a token (the kubelet's probes show none and cost nothing).
    pub async fn sees_details(&self, authorization: Option<&str>, peer: IpAddr) -> bool {
        match self.mode {
            MetricsAccess::Kubernetes if authorization.is_none() => false,
            MetricsAccess::Open => false,
            _ => self.check(authorization, peer, "/readyz").await.is_ok(),
        }
    }

    async fn decide(
        &self,
        authorization: Option<&str>,
        peer: IpAddr,
        path: &str,
    ) -> Result<(), Refusal> {
        match self.mode {
            MetricsAccess::Open => Ok(()),
            MetricsAccess::Loopback => {
                let local = match peer {
                    IpAddr::V6(v6) => v6
                        .to_ipv4_mapped()
                        .map_or(v6.is_loopback(), |v4| v4.is_loopback()),
                    IpAddr::V4(v4) => v4.is_loopback(),
                };
                if local {
                    Ok(())
                } else {
                    Err(Refusal::Forbidden(format!(
                        "{path} answers only the agent's own network namespace (metricsAccess: loopback)"
                    )))
                }
            }
            MetricsAccess::Kubernetes => {
                let token = authorization
                    .and_then(|a| a.strip_prefix("Bearer "))
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| {
                        Refusal::Unauthenticated(format!(
                            "{path} needs a bearer token (metricsAccess: kubernetes): the API server reviews it"
                        ))
                    })?;
                let reviewer = self.reviewer.borrow().clone().ok_or_else(|| {
                    Refusal::Unavailable(
                        "not connected to the API server yet: no token can be reviewed".into(),
                    )
                })?;
                let now = Instant::now();
                let verdict = match reviewer.cached(token, path, now) {
                    Some(verdict) => Ok(verdict),
                    None => {
                        let Ok(_slot) = self.reviews.try_acquire() else {
                            return Err(Refusal::Busy);
                        };
                        if !self
                            .rate
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .take(now)
                        {
                            return Err(Refusal::Busy);
                        }
                        let review = reviewer.review(token, path, now);
                        let verdict = match tokio::time::timeout(REVIEW_DEADLINE, review).await {
                            Ok(verdict) => verdict.map_err(|e| crate::error_chain(&e)),
                            Err(_) => Err(format!(
                                "the API server did not answer the review within {REVIEW_DEADLINE:?}"
                            )),
                        };
                        match &verdict {
                            Err(why) => {
                                if !self.failing.swap(true, Ordering::AcqRel) {
                                    tracing::warn!(error = %why, "a caller of {path} could not be reviewed (further failures are counted in node_agent_telemetry_authorizations_total{{result=\"unavailable\"}}, not logged, until a review succeeds)");
                                }
                            }
                            Ok(_) => {
                                if self.failing.swap(false, Ordering::AcqRel) {
                                    tracing::info!("callers are reviewed again");
                                }
                            }
                        }
                        verdict
                    }
                };
                match verdict {
                    Ok(Verdict::Allowed { .. }) => Ok(()),
                    Ok(Verdict::Unauthenticated { why }) => Err(Refusal::Unauthenticated(format!(
                        "the API server does not accept the token: {why}"
                    ))),
                    Ok(Verdict::Forbidden { user, why }) => Err(Refusal::Forbidden(format!(
                        "{user} may not get {path}: {why}"
                    ))),
                    Err(_) => Err(Refusal::Unavailable(
                        "the API server could not review the token now (the agent's log says why)"
                            .into(),
                    )),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use node_agent_kube::fake::{Fake, Reply};

    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn gate(mode: MetricsAccess, reviewer: Option<Reviewer>) -> (Gate, Arc<Metrics>) {
        let metrics = Metrics::new();
        let (_tx, rx) = watch::channel(reviewer.map(Arc::new));
        (Gate::new(mode, rx, metrics.clone()), metrics)
    }

    #[tokio::test]
    async fn each_mode_lets_in_whom_it_says() {
        let fake = Fake::start(|_, _| Reply::status(404, "NotFound", "not here")).await;
        fake.add_user(
            "scraper",
            "system:serviceaccount:monitoring:prometheus-k8s",
            &["system:authenticated"],
        );
        fake.add_user(
            "web",
            "system:serviceaccount:shop:web",
            &["system:authenticated"],
        );
        fake.grant_url(
            "system:serviceaccount:monitoring:prometheus-k8s",
            "get",
            "/metrics",
        );
        let reviewer = || Some(Reviewer::new(fake.context("api server", 1, "n1")));
        type Row = (
            &'static str,
            MetricsAccess,
            bool,
            Option<&'static str>,
            &'static str,
            &'static str,
        );
        let rows: Vec<Row> = vec![
            (
                "open: anyone",
                MetricsAccess::Open,
                false,
                None,
                "10.1.2.3",
                "allowed",
            ),
            (
                "loopback: the agent's own namespace",
                MetricsAccess::Loopback,
                false,
                None,
                "127.0.0.1",
                "allowed",
            ),
            (
                "loopback: IPv6 and mapped",
                MetricsAccess::Loopback,
                false,
                None,
                "::ffff:127.0.0.1",
                "allowed",
            ),
            (
                "loopback: anyone else",
                MetricsAccess::Loopback,
                false,
                Some("Bearer scraper"),
                "10.1.2.3",
                "forbidden",
            ),
            (
                "kubernetes: no token",
                MetricsAccess::Kubernetes,
                true,
                None,
                "127.0.0.1",
                "unauthenticated",
            ),
            (
                "kubernetes: a token nobody knows",
                MetricsAccess::Kubernetes,
                true,
                Some("Bearer forged"),
                "10.1.2.3",
                "unauthenticated",
            ),
            (
                "kubernetes: a user RBAC grants nothing",
                MetricsAccess::Kubernetes,
                true,
                Some("Bearer web"),
                "10.1.2.3",
                "forbidden",
            ),
            (
                "kubernetes: Prometheus",
                MetricsAccess::Kubernetes,
                true,
                Some("Bearer scraper"),
                "10.1.2.3",
                "allowed",
            ),
            (
                "kubernetes: not connected yet",
                MetricsAccess::Kubernetes,
                false,
                Some("Bearer scraper"),
                "10.1.2.3",
                "unavailable",
            ),
        ];
        for (what, mode, connected, authorization, peer, want) in rows {
            let (gate, metrics) = gate(mode, if connected { reviewer() } else { None });
            let got = gate.check(authorization, ip(peer), "/metrics").await;
            let label = got.as_ref().map_or_else(Refusal::as_str, |()| "allowed");
            assert_eq!(label, want, "{what}: {got:?}");
            let text = metrics.encode();
            assert!(
                text.contains(&format!(
                    "node_agent_telemetry_authorizations_total{{result=\"{want}\"}} 1"
                )),
                "{what}: counted"
            );
        }
        assert!(fake.rejected().is_empty(), "{:?}", fake.rejected());
    }

    /// A flood of made-up tokens (issue 41, round 4: a cached scraper got 429 on 19 of 20
    /// scrapes, and one client drove about 90 TokenReviews a second): the scraper whose verdict
    /// is cached is answered from the cache whatever the flood, and the flood costs the API
    /// server at most the burst and the rate.
    #[tokio::test]
    async fn a_flood_of_made_up_tokens_never_starves_the_scraper_nor_floods_the_api_server() {
        let fake = Fake::start(|_, _| Reply::status(404, "NotFound", "not here")).await;
        fake.add_user("scraper", "prom", &[]);
        fake.grant_url("prom", "get", "/metrics");
        let (kube, _) = gate(
            MetricsAccess::Kubernetes,
            Some(Reviewer::new(fake.context("api server", 1, "n1"))),
        );
        let peer = ip("10.1.2.3");
        let scrape = || kube.check(Some("Bearer scraper"), peer, "/metrics");
        assert_eq!(scrape().await, Ok(()));
        let started = Instant::now();
        let mut busy = 0;
        for i in 0..200 {
            let made_up = format!("Bearer made-up-{i}");
            if kube.check(Some(&made_up), peer, "/metrics").await == Err(Refusal::Busy) {
                busy += 1;
            }
            assert_eq!(scrape().await, Ok(()), "the scraper, {i} made-up tokens in");
        }
        let reviews = fake
            .calls()
            .iter()
            .filter(|(_, path)| path.contains("tokenreviews"))
            .count();
        let most = 1.0 + REVIEW_BURST + REVIEWS_PER_SECOND * started.elapsed().as_secs_f64();
        eprintln!(
            "{reviews} token reviews for 200 made-up tokens in {:?}; {busy} answered busy",
            started.elapsed()
        );
        assert!(
            reviews as f64 <= most.ceil(),
            "{reviews} reviews, at most {most}"
        );
        assert!(busy > 0, "the flood was answered 429 beyond the rate");
    }

    /// `/readyz`'s whole reason: never for a caller without a token under `kubernetes` (the
    /// kubelet's probes: no review asked), never under `open`.
    #[tokio::test]
    async fn details_go_to_callers_let_in_and_cost_a_probe_nothing() {
        let fake = Fake::start(|_, _| Reply::status(404, "NotFound", "not here")).await;
        fake.add_user("sre", "jane", &[]);
        fake.grant_url("jane", "get", "/readyz");
        let (kube, _) = gate(
            MetricsAccess::Kubernetes,
            Some(Reviewer::new(fake.context("api server", 1, "n1"))),
        );
        assert!(!kube.sees_details(None, ip("10.1.2.3")).await);
        assert!(
            fake.calls().is_empty(),
            "a probe costs the API server nothing"
        );
        assert!(kube.sees_details(Some("Bearer sre"), ip("10.1.2.3")).await);
        let (open, _) = gate(MetricsAccess::Open, None);
        assert!(!open.sees_details(None, ip("127.0.0.1")).await);
        let (local, _) = gate(MetricsAccess::Loopback, None);
        assert!(local.sees_details(None, ip("127.0.0.1")).await);
        assert!(!local.sees_details(None, ip("10.1.2.3")).await);
    }
}
