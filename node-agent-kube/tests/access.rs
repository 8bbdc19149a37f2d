//! Who may read the agent's `/metrics`, against the strict fake: the exact TokenReview and
//! SubjectAccessReview sent, each verdict, the cache, and an agent RBAC does not let review.

use std::time::{Duration, Instant};

use node_agent_kube::{
    access::{
        ReviewError, Reviewer, Verdict, ACCESS_REVIEWS, ALLOWED_FOR, REFUSED_FOR, TOKEN_REVIEWS,
    },
    api::ApiError,
    fake::{Fake, Reply, TEST_BOUND},
};
use serde_json::json;

async fn bounded<T>(fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(TEST_BOUND, fut)
        .await
        .expect("test ran past its time bound")
}

const PROMETHEUS: &str = "system:serviceaccount:monitoring:prometheus-k8s";

async fn fake() -> Fake {
    let fake = Fake::start(|_, _| Reply::status(404, "NotFound", "not here")).await;
    fake.add_user(
        "scraper-token",
        PROMETHEUS,
        &["system:serviceaccounts", "system:authenticated"],
    );
    fake.add_user(
        "nobody-token",
        "system:serviceaccount:shop:web",
        &["system:authenticated"],
    );
    fake.grant_url(PROMETHEUS, "get", "/metrics");
    fake
}

#[tokio::test]
async fn a_token_is_reviewed_then_its_user_asked_about_the_path() {
    bounded(async {
        let fake = fake().await;
        let reviewer = Reviewer::new(fake.context("api server", 1, "worker-1"));
        let now = Instant::now();
        let verdict = reviewer.review("scraper-token", "/metrics", now).await.unwrap();
        assert_eq!(verdict, Verdict::Allowed { user: PROMETHEUS.into() });
        assert!(fake.rejected().is_empty(), "{:?}", fake.rejected());
        let seen = fake.seen();
        assert_eq!(
            seen.iter().map(|s| (s.method.as_str(), s.path.as_str())).collect::<Vec<_>>(),
            [("POST", TOKEN_REVIEWS), ("POST", ACCESS_REVIEWS)]
        );
        assert_eq!(
            seen[0].body,
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "metadata": {},
                   "spec": {"token": "scraper-token"}})
        );
        assert_eq!(
            seen[1].body,
            json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "metadata": {},
                   "spec": {"user": PROMETHEUS, "uid": format!("uid-{PROMETHEUS}"),
                            "groups": ["system:serviceaccounts", "system:authenticated"],
                            "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}})
        );
        // The agent's own token authenticates it to the API server; the caller's is only a
        // field of the review.
        assert_eq!(seen[0].authorization.as_deref(), Some("Bearer token-one"));

        let rows = [
            ("an unknown token", "forged", "/metrics", "Unauthenticated"),
            ("a user RBAC grants nothing", "nobody-token", "/metrics", "Forbidden"),
            ("another path", "scraper-token", "/readyz", "Forbidden"),
            ("an empty token", "", "/metrics", "Unauthenticated"),
        ];
        for (what, token, path, want) in rows {
            let v = reviewer.review(token, path, now).await.unwrap();
            assert!(format!("{v:?}").starts_with(want), "{what}: {v:?}");
        }
        assert!(fake.rejected().is_empty(), "{:?}", fake.rejected());
    })
    .await;
}

#[tokio::test]
async fn verdicts_are_cached_as_controller_runtime_caches_them() {
    bounded(async {
        let fake = fake().await;
        let reviewer = Reviewer::new(fake.context("api server", 1, "worker-1"));
        let t0 = Instant::now();
        let asked = || fake.calls().len();
        reviewer
            .review("scraper-token", "/metrics", t0)
            .await
            .unwrap();
        reviewer
            .review("nobody-token", "/metrics", t0)
            .await
            .unwrap();
        let after_first = asked();
        assert_eq!(after_first, 4);
        reviewer
            .review("scraper-token", "/metrics", t0 + Duration::from_secs(60))
            .await
            .unwrap();
        reviewer
            .review("nobody-token", "/metrics", t0 + Duration::from_secs(20))
            .await
            .unwrap();
        assert_eq!(asked(), after_first, "both within their time: no request");
        reviewer
            .review(
                "nobody-token",
                "/metrics",
                t0 + REFUSED_FOR + Duration::from_secs(1),
            )
            .await
            .unwrap();
        assert_eq!(
            asked(),
            after_first + 2,
            "a refusal is asked again after {REFUSED_FOR:?}"
        );
        reviewer
            .review(
                "scraper-token",
                "/metrics",
                t0 + ALLOWED_FOR + Duration::from_secs(1),
            )
            .await
            .unwrap();
        assert_eq!(
            asked(),
            after_first + 4,
            "an allowance after {ALLOWED_FOR:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn an_agent_rbac_does_not_let_review_says_so_and_caches_nothing() {
    bounded(async {
        let fake = fake().await;
        fake.deny("tokenreviews");
        let reviewer = Reviewer::new(fake.context("api server", 1, "worker-1"));
        let err = reviewer
            .review("scraper-token", "/metrics", Instant::now())
            .await
            .unwrap_err();
        assert!(
            matches!(err, ReviewError::TokenReview(ApiError::Forbidden { .. })),
            "{err:?}"
        );
        fake.grant("tokenreviews");
        let v = reviewer
            .review("scraper-token", "/metrics", Instant::now())
            .await
            .unwrap();
        assert_eq!(
            v,
            Verdict::Allowed {
                user: PROMETHEUS.into()
            },
            "nothing was cached"
        );
    })
    .await;
}
