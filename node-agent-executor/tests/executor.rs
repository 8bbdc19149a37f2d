//! The one executor against the strict in-process HTTPS fake: each path of an eviction (and
//! of events and the node condition), with the exact requests made; and that its lanes never
//! hold one another up (a slow event sink, a runtime that never answers).

use std::{
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use node_agent_executor::{
    reclaim::{Reclaim, ReclaimResult, Runtime, RuntimeError},
    Action, Evict, Executor, NodeEvent, Outcome, Report, Settings,
};
use node_agent_kube::{
    condition::CONDITION_TYPE,
    config::PdbPolicy,
    events::OomKill,
    evict::{self, EvictionResult},
    fake::{Fake, Reply, Seen, TEST_BOUND},
};
use node_agent_policy::{
    Eligibility, Eviction, Format, NodeCondition, OffendingContainer, PodInfo, Quantity, Resource,
    Signal,
};
use serde_json::json;
use tokio::sync::{mpsc, watch};

/// The kinds of outcome, for assertions.
fn kind(o: &Outcome) -> &'static str {
    match o {
        Outcome::Eviction(_) => "eviction",
        Outcome::NodeEvent { .. } => "event",
        Outcome::PodOomEvent { .. } => "pod event",
        Outcome::Identified { .. } => "identified",
        Outcome::Status(_) => "status",
        Outcome::Reclaim(_) => "reclaim",
        Outcome::ImagesDetected(_) => "images",
        Outcome::Refused(_) => "refused",
        Outcome::EvictionShed { .. } => "shed",
        Outcome::Recorded(_) => "recorded",
    }
}

const NODE: &str = "worker-1";
const POD_PATH: &str = "/api/v1/namespaces/shop/pods/web-7c9f8d6b5-x2x9q";
const UID: &str = "6f1f4a0e-6b39-4f0e-9a43-1b3f8d2c9e01";
const MESSAGE: &str = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 61440Ki. Container nginx was using 192Mi, request is 128Mi, has larger consumption of memory. ";

async fn bounded<T>(fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(TEST_BOUND, fut)
        .await
        .expect("test ran past its time bound")
}

fn decision(hard: bool) -> Eviction {
    Eviction {
        namespace: "shop".into(),
        name: "web-7c9f8d6b5-x2x9q".into(),
        uid: Some(UID.into()),
        signal: Signal::MemoryAvailable.into(),
        resource: Resource::Memory,
        hard,
        grace_period_seconds: if hard { 1 } else { 30 },
        message: MESSAGE.into(),
        offending_containers: vec![OffendingContainer {
            name: "nginx".into(),
            usage: Quantity::from_int(192 << 20, Format::BinarySi),
        }],
        threshold_quantity: "100Mi".parse().unwrap(),
        available: Quantity::from_int(60 << 20, Format::BinarySi),
        early: false,
    }
}

fn pod() -> PodInfo {
    PodInfo {
        namespace: "shop".into(),
        name: "web-7c9f8d6b5-x2x9q".into(),
        uid: Some(UID.into()),
        ..PodInfo::default()
    }
}

/// The API server's answers: the eviction's as given, 2xx for events, deletes and patches.
fn api(eviction: Reply) -> impl Fn(&Seen, usize) -> Reply + Send + Sync + 'static {
    move |s, _| {
        match (s.method.as_str(), s.path.as_str()) {
        ("POST", p) if p.ends_with("/eviction") => eviction.clone(),
        ("POST", p) if p.contains("/events") => Reply::json(201, s.body.to_string()),
        ("GET", p) if p == format!("/api/v1/nodes/{NODE}") => Reply::json(
            200,
            json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": NODE}, "status": {"conditions": []}}).to_string(),
        ),
        ("DELETE" | "PATCH", _) => Reply::json(200, "{}"),
        _ => Reply::status(404, "NotFound", "not found"),
    }
    }
}

fn settings(fake: &Fake, pdb_policy: PdbPolicy, dry_run: bool) -> Settings {
    Settings {
        cluster: Some(fake.context("api server", 2, NODE)),
        generation: 0,
        dry_run,
        pdb_policy,
        eligibility: Eligibility {
            own_pod: Some(("node-agent".into(), "node-agent-abcde".into())),
            exclusions: serde_yaml_ng::from_str("{namespaces: [kube-system]}").unwrap(),
            ..Eligibility::default()
        },
        taint: true,
        runtime: None,
        heartbeat: node_agent_executor::CONDITION_HEARTBEAT,
        pending_records: None,
    }
}

struct Running {
    executor: Executor,
    outcomes: mpsc::UnboundedReceiver<Outcome>,
    settings: watch::Sender<Settings>,
}

fn start(settings: Settings) -> Running {
    let (tx, rx) = watch::channel(settings);
    let (executor, outcomes) = Executor::spawn(rx);
    Running {
        executor,
        outcomes,
        settings: tx,
    }
}

impl Running {
    async fn evict(&mut self, eviction: Eviction, pod: PodInfo) -> Report {
        let action = Action::Evict(Box::new(Evict {
            eviction,
            pod,
            trigger_ktime_ns: Some(7),
        }));
        self.executor.submit(action);
        match self.outcomes.recv().await.unwrap() {
            Outcome::Eviction(report) => *report,
            other => panic!("expected an eviction report, got {other:?}"),
        }
    }

    async fn act(&mut self, action: Action) -> Outcome {
        self.executor.submit(action);
        self.outcomes.recv().await.unwrap()
    }
}

fn assert_evicted_event(seen: &Seen) {
    assert_eq!(
        (seen.method.as_str(), seen.path.as_str()),
        ("POST", "/apis/events.k8s.io/v1/namespaces/shop/events")
    );
    let e = &seen.body;
    assert_eq!(
        (e["apiVersion"].as_str(), e["kind"].as_str()),
        (Some("events.k8s.io/v1"), Some("Event"))
    );
    assert_eq!(
        (
            e["reason"].as_str(),
            e["type"].as_str(),
            e["action"].as_str()
        ),
        (Some("Evicted"), Some("Warning"), Some("Evicting"))
    );
    assert_eq!(
        e["note"], MESSAGE,
        "the decision's own message, with the per-container sentence"
    );
    assert_eq!(e["reportingController"], "node-agent.io/node-agent");
    assert_eq!(e["reportingInstance"], "node-agent-worker-1");
    assert_eq!(
        e["regarding"],
        json!({"apiVersion": "v1", "kind": "Pod", "namespace": "shop", "name": "web-7c9f8d6b5-x2x9q", "uid": UID})
    );
    assert_eq!(
        e["metadata"]["annotations"],
        json!({"offending_containers": "nginx", "offending_containers_usage": "192Mi", "starved_resource": "memory"}),
        "annotations from the decision's figures"
    );
}

#[tokio::test]
async fn an_eviction_posts_the_exact_body_then_the_decisions_event() {
    bounded(async {
        let fake = Fake::start(api(Reply::json(201, json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}).to_string()))).await;
        let mut ex = start(settings(&fake, PdbPolicy::Respect, false));
        let report = ex.evict(decision(false), pod()).await;
        assert_eq!(report.attempt.result, EvictionResult::Evicted);
        assert_eq!(report.trigger_ktime_ns, Some(7));
        assert!(report.event_error.is_none(), "{:?}", report.event_error);
        assert_eq!(report.eviction, decision(false), "the decision travels back unchanged");
        let seen = fake.seen();
        assert!(fake.rejected().is_empty(), "{:?}", fake.rejected());
        assert_eq!(seen.len(), 2);
        assert_eq!((seen[0].method.as_str(), seen[0].path.as_str()), ("POST", &*format!("{POD_PATH}/eviction")));
        assert_eq!(seen[0].content_type.as_deref(), Some("application/json"));
        assert_eq!(
            seen[0].body,
            json!({"apiVersion": "policy/v1", "kind": "Eviction",
                   "metadata": {"name": "web-7c9f8d6b5-x2x9q", "namespace": "shop"},
                   "deleteOptions": {"gracePeriodSeconds": 30, "preconditions": {"uid": UID}}})
        );
        assert_evicted_event(&seen[1]);
    })
    .await;
}

#[tokio::test]
async fn each_refusal_of_the_eviction_api_is_reported_with_no_further_request() {
    bounded(async {
        type Row = (&'static str, Reply, PdbPolicy, bool, EvictionResult, Option<u64>);
        let rows: Vec<Row> = vec![
            ("404: already gone", Reply::status(404, "NotFound", "pods \"web\" not found"), PdbPolicy::Respect, false, EvictionResult::AlreadyGone, None),
            ("409: the name is another pod's now", Reply::status(409, "Conflict", "Precondition failed: UID in precondition"), PdbPolicy::Respect, false, EvictionResult::AlreadyGone, None),
            ("429 budget, respect, hard", Reply::pdb_blocked("web"), PdbPolicy::Respect, true, EvictionResult::BlockedByPdb, None),
            ("429 budget, respect, soft", Reply::pdb_blocked("web"), PdbPolicy::Respect, false, EvictionResult::BlockedByPdb, None),
            ("429 budget, override, soft: only hard thresholds override", Reply::pdb_blocked("web"), PdbPolicy::Override, false, EvictionResult::BlockedByPdb, None),
            ("429 budget with retryAfterSeconds", Reply::status_with(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.",
                json!({"causes": [{"reason": "DisruptionBudget", "message": "The disruption budget web is still being processed by the server."}], "retryAfterSeconds": 10})).with_header("retry-after", "10"),
                PdbPolicy::Respect, true, EvictionResult::BlockedByPdb, Some(10)),
            ("429 rate limit under override, hard: waited out, never a DELETE", Reply::rate_limited(2), PdbPolicy::Override, true, EvictionResult::ApiRateLimited, Some(2)),
            ("403", Reply::status(403, "Forbidden", "pods \"web\" is forbidden: cannot create pods/eviction"), PdbPolicy::Respect, true, EvictionResult::Refused, None),
            ("422", Reply::status(422, "Invalid", "Eviction.policy \"web\" is invalid"), PdbPolicy::Respect, true, EvictionResult::Refused, None),
            ("500 several budgets: about the pod, not retried", Reply::status(500, "", "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."), PdbPolicy::Respect, true, EvictionResult::Refused, None),
        ];
        for (what, reply, policy, hard, want, wait) in rows {
            let fake = Fake::start(api(reply)).await;
            let mut ex = start(settings(&fake, policy, false));
            let report = ex.evict(decision(hard), pod()).await;
            assert_eq!(report.attempt.result, want, "{what}: {:?}", report.attempt);
            assert_eq!(report.attempt.retry_after, wait.map(Duration::from_secs), "{what}");
            assert!(report.attempt.detail.is_some(), "{what}: every outcome has its reason");
            assert_eq!(
                fake.calls(),
                [("POST".to_string(), format!("{POD_PATH}/eviction"))],
                "{what}: one request, no delete, no event"
            );
        }
    })
    .await;
}

#[tokio::test]
async fn override_for_a_hard_threshold_deletes_and_marks_the_pod_evicted() {
    bounded(async {
        let fake = Fake::start(api(Reply::pdb_blocked("web"))).await;
        let mut ex = start(settings(&fake, PdbPolicy::Override, false));
        let report = ex.evict(decision(true), pod()).await;
        assert_eq!(report.attempt.result, EvictionResult::PdbOverridden);
        assert!(report
            .attempt
            .detail
            .as_deref()
            .unwrap()
            .contains("needs 2 healthy pods"));
        let seen = fake.seen();
        let calls: Vec<_> = seen
            .iter()
            .map(|s| (s.method.as_str(), s.path.to_string()))
            .collect();
        assert_eq!(
            calls,
            [
                ("POST", format!("{POD_PATH}/eviction")),
                ("DELETE", POD_PATH.to_string()),
                ("PATCH", format!("{POD_PATH}/status")),
                (
                    "POST",
                    "/apis/events.k8s.io/v1/namespaces/shop/events".to_string()
                ),
            ]
        );
        assert!(fake.rejected().is_empty(), "{:?}", fake.rejected());
        assert_eq!(
            seen[1].body,
            json!({"gracePeriodSeconds": 1, "preconditions": {"uid": UID}})
        );
        assert_eq!(
            seen[2].content_type.as_deref(),
            Some("application/strategic-merge-patch+json")
        );
        let status = &seen[2].body["status"];
        assert_eq!(
            (status["phase"].as_str(), status["reason"].as_str()),
            (Some("Failed"), Some("Evicted"))
        );
        assert_eq!(status["conditions"][0]["type"], "DisruptionTarget");
        assert_eq!(status["conditions"][0]["reason"], "TerminationByKubelet");
        assert_evicted_event(&seen[3]);
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_741_000_000);
        assert_eq!(
            evict::evicted_status_patch(&decision(true), t)["status"]["conditions"][0]
                ["lastTransitionTime"],
            "2025-03-03T11:06:40Z"
        );
    })
    .await;
}

#[tokio::test]
async fn a_server_error_is_retried_then_reported_failed() {
    bounded(async {
        let fake = Fake::start(api(Reply::status(500, "InternalError", "etcd timeout"))).await;
        let mut ex = start(settings(&fake, PdbPolicy::Respect, false));
        let report = ex.evict(decision(false), pod()).await;
        assert_eq!(report.attempt.result, EvictionResult::Failed);
        assert!(report
            .attempt
            .detail
            .as_deref()
            .unwrap()
            .contains("etcd timeout"));
        assert_eq!(fake.calls().len(), 2, "retried once, no event");
    })
    .await;
}

#[tokio::test]
async fn dry_run_holds_from_the_moment_it_is_set_even_between_retries() {
    bounded(async {
        // The first try meets a 503; dry run is set before the retry.
        let flip: Arc<Mutex<Option<watch::Sender<Settings>>>> = Arc::default();
        let fake = Fake::start({
            let flip = flip.clone();
            move |_, _| {
                if let Some(tx) = flip.lock().unwrap().as_ref() {
                    tx.send_modify(|s| s.dry_run = true);
                }
                Reply::status(503, "ServiceUnavailable", "busy")
            }
        })
        .await;
        let ex = start(settings(&fake, PdbPolicy::Override, false));
        let Running {
            executor,
            mut outcomes,
            settings: tx,
        } = ex;
        *flip.lock().unwrap() = Some(tx);
        executor.submit(Action::Evict(Box::new(Evict {
            eviction: decision(true),
            pod: pod(),
            trigger_ktime_ns: None,
        })));
        let Some(Outcome::Eviction(report)) = outcomes.recv().await else {
            panic!("no report")
        };
        assert_eq!(report.attempt.result, EvictionResult::DryRun);
        assert_eq!(
            fake.calls().len(),
            1,
            "no retry once dry run is set: {:?}",
            fake.calls()
        );
    })
    .await;
}

#[tokio::test]
async fn dry_run_changes_nothing_evictions_events_or_the_condition() {
    bounded(async {
        let fake = Fake::start(api(Reply::pdb_blocked("web"))).await;
        let mut ex = start(settings(&fake, PdbPolicy::Override, true));
        for hard in [false, true] {
            assert_eq!(
                ex.evict(decision(hard), pod()).await.attempt.result,
                EvictionResult::DryRun
            );
        }
        let event = ex
            .act(Action::NodeEvent(NodeEvent::ThresholdMet(Resource::Memory)))
            .await;
        assert!(
            matches!(event, Outcome::NodeEvent { result: Ok(()), .. }),
            "{event:?}"
        );
        let status = ex
            .act(Action::Status {
                conditions: vec![NodeCondition::MemoryPressure],
            })
            .await;
        assert!(
            matches!(&status, Outcome::Status(r) if r.condition.is_ok() && matches!(r.taint, Ok(None))),
            "{status:?}"
        );
        // The node is read (200, a real Node), so only the dry-run check keeps the PATCH away.
        assert_eq!(
            fake.calls(),
            [("GET".to_string(), format!("/api/v1/nodes/{NODE}"))]
        );
    })
    .await;
}

#[tokio::test]
async fn the_executor_refuses_what_must_not_be_evicted_before_any_request() {
    bounded(async {
        let fake = Fake::start(api(Reply::json(201, "{}"))).await;
        let mut ex = start(settings(&fake, PdbPolicy::Override, false));
        let rows: Vec<(&str, PodInfo)> = vec![
            (
                "mirror",
                PodInfo {
                    is_mirror: true,
                    ..pod()
                },
            ),
            (
                "static",
                PodInfo {
                    is_static: true,
                    ..pod()
                },
            ),
            (
                "system-node-critical",
                PodInfo {
                    priority: 2_000_001_000,
                    ..pod()
                },
            ),
            (
                "own pod",
                PodInfo {
                    namespace: "node-agent".into(),
                    name: "node-agent-abcde".into(),
                    ..pod()
                },
            ),
            (
                "excluded namespace",
                PodInfo {
                    namespace: "kube-system".into(),
                    ..pod()
                },
            ),
            (
                "terminating",
                PodInfo {
                    terminating: true,
                    ..pod()
                },
            ),
        ];
        for (what, p) in rows {
            let report = ex.evict(decision(true), p).await;
            assert_eq!(report.attempt.result, EvictionResult::Refused, "{what}");
        }
        assert!(fake.calls().is_empty(), "{:?}", fake.calls());
    })
    .await;
}

#[tokio::test]
async fn without_a_cluster_decisions_are_only_reported() {
    bounded(async {
        let fake = Fake::start(api(Reply::json(201, "{}"))).await;
        let mut ex = start(Settings {
            cluster: None,
            ..settings(&fake, PdbPolicy::Respect, false)
        });
        assert_eq!(
            ex.evict(decision(true), pod()).await.attempt.result,
            EvictionResult::DryRun
        );
        assert!(matches!(
            ex.act(Action::NodeEvent(NodeEvent::ThresholdMet(Resource::Memory)))
                .await,
            Outcome::NodeEvent { result: Ok(()), .. }
        ));
        assert!(fake.calls().is_empty());
    })
    .await;
}

#[tokio::test]
async fn node_events_name_the_node_and_the_killed_process() {
    bounded(async {
        let fake = Fake::start(api(Reply::json(201, "{}"))).await;
        let mut ex = start(settings(&fake, PdbPolicy::Respect, false));
        ex.act(Action::NodeEvent(NodeEvent::ThresholdMet(Resource::Memory)))
            .await;
        let kill = OomKill {
            pid: 4242,
            comm: "java".into(),
            pod_uid: Some(UID.into()),
        };
        ex.act(Action::NodeEvent(NodeEvent::OomKill(kill))).await;
        let seen = fake.seen();
        assert!(fake.rejected().is_empty(), "{:?}", fake.rejected());
        let node_ref = json!({"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE});
        for s in &seen {
            assert_eq!(s.path, "/apis/events.k8s.io/v1/namespaces/default/events");
            assert_eq!(s.body["regarding"], node_ref);
        }
        assert_eq!(
            (
                seen[0].body["reason"].as_str(),
                seen[0].body["note"].as_str()
            ),
            (
                Some("EvictionThresholdMet"),
                Some("Attempting to reclaim memory")
            )
        );
        assert_eq!(
            seen[1].body["reason"], "NodeAgentOOMKill",
            "never node-problem-detector's OOMKilling"
        );
        assert_eq!(
            seen[1].body["note"],
            format!("Out of memory: killed process 4242 (java) in the cgroup of pod UID {UID}, which neither the pod source nor the container runtime names")
        );
    })
    .await;
}

#[tokio::test]
async fn a_failed_event_is_reported_and_never_stops_anything() {
    bounded(async {
        let fake = Fake::start(|s: &Seen, _| match s.method.as_str() {
            "POST" if s.path.contains("/events") => {
                Reply::status(403, "Forbidden", "cannot create events")
            }
            _ => Reply::json(201, "{}"),
        })
        .await;
        let mut ex = start(settings(&fake, PdbPolicy::Respect, false));
        let report = ex.evict(decision(false), pod()).await;
        assert_eq!(report.attempt.result, EvictionResult::Evicted);
        let error = report.event_error.expect("the event's failure is reported");
        assert_eq!(error.code(), Some(403), "typed: {error}");
        assert!(
            error.to_string().contains("cannot create events"),
            "{error}"
        );
    })
    .await;
}

#[tokio::test]
async fn the_condition_reads_the_node_once_and_patches_in_order() {
    bounded(async {
        let node = json!({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": "1f2e3d4c"},
            "status": {"conditions": [
                {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory", "lastHeartbeatTime": "2025-03-03T11:00:00Z", "lastTransitionTime": "2025-03-01T00:00:00Z"},
                {"type": CONDITION_TYPE, "status": "True", "reason": "PressureDetected", "lastHeartbeatTime": "2025-03-03T11:00:00Z", "lastTransitionTime": "2025-03-03T10:00:00Z"}
            ]}
        })
        .to_string();
        let fake = Fake::start(move |s, _| match s.method.as_str() {
            "GET" | "PATCH" => Reply::json(200, node.clone()),
            _ => Reply::status(405, "MethodNotAllowed", "no"),
        })
        .await;
        let mut ex = start(settings(&fake, PdbPolicy::Respect, false));
        for pressure in [true, false, true] {
            let conditions = if pressure { vec![NodeCondition::MemoryPressure, NodeCondition::PidPressure] } else { vec![] };
            let outcome = ex.act(Action::Status { conditions }).await;
            assert!(matches!(&outcome, Outcome::Status(r) if r.condition.is_ok() && r.pressure == pressure), "{outcome:?}");
        }
        let seen = fake.seen();
        assert!(fake.rejected().is_empty(), "{:?}", fake.rejected());
        let calls: Vec<_> = seen.iter().map(|s| (s.method.as_str(), s.path.as_str())).collect();
        let status = format!("/api/v1/nodes/{NODE}/status");
        let node = format!("/api/v1/nodes/{NODE}");
        let (get, patch_status, patch_node) = (("GET", node.as_str()), ("PATCH", status.as_str()), ("PATCH", node.as_str()));
        // The condition first, then the taint's own read-modify-write of the node; the
        // condition reads the node only once, and the taint is patched only when it changes.
        assert_eq!(calls, [get, patch_status, get, patch_node, patch_status, get, patch_status, get, patch_node]);
        let seen: Vec<&Seen> = seen.iter().filter(|s| s.path == status).collect();
        let condition = |i: usize| seen[i - 1].body["status"]["conditions"][0].clone();
        assert_eq!(condition(1)["status"], "True");
        assert_eq!(condition(1)["message"], "node-agent sees MemoryPressure, PIDPressure");
        assert_eq!(condition(1)["lastTransitionTime"], "2025-03-03T10:00:00Z", "kept across a restart");
        assert_eq!(condition(2)["status"], "False");
        assert_eq!(condition(3)["status"], "True");
        assert_ne!(condition(3)["lastTransitionTime"], "2025-03-03T10:00:00Z", "a flip moves it");
        assert_eq!(seen[0].content_type.as_deref(), Some("application/strategic-merge-patch+json"));
    })
    .await;
}

#[tokio::test]
async fn the_strict_fake_refuses_what_the_api_server_refuses() {
    bounded(async {
        use node_agent_kube::transport::ApiRequest;
        let fake = Fake::start(|_, _| Reply::json(200, "{}")).await;
        let transport = fake.transport("api server");
        let body = |v: serde_json::Value| v;
        let rows: Vec<(&str, ApiRequest, u16)> = vec![
            ("an eviction of another name than the URL's", ApiRequest::with_json(http::Method::POST, format!("{POD_PATH}/eviction"), "application/json",
                &body(json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "other", "namespace": "shop"}}))), 400),
            ("an eviction in an unknown version", ApiRequest::with_json(http::Method::POST, format!("{POD_PATH}/eviction"), "application/json",
                &body(json!({"apiVersion": "policy/v2", "kind": "Eviction", "metadata": {"name": "web-7c9f8d6b5-x2x9q"}}))), 400),
            ("a patch sent as plain JSON", ApiRequest::with_json(http::Method::PATCH, format!("/api/v1/nodes/{NODE}/status"), "application/json",
                &body(json!({"status": {}}))), 415),
            ("an event missing its required fields", ApiRequest::with_json(http::Method::POST, "/apis/events.k8s.io/v1/namespaces/shop/events", "application/json",
                &body(json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "x", "namespace": "shop"}}))), 422),
            ("an event in another namespace than the URL's", ApiRequest::with_json(http::Method::POST, "/apis/events.k8s.io/v1/namespaces/default/events", "application/json",
                &body(json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "x", "namespace": "shop"}}))), 400),
            ("a path the agent never uses", ApiRequest::get("/api/v1/secrets"), 404),
            ("a method the path does not serve", ApiRequest::with_json(http::Method::PUT, format!("/api/v1/nodes/{NODE}"), "application/json", &json!({})), 405),
            ("a pod list of every node", ApiRequest::get("/api/v1/pods"), 400),
            ("a TokenReview without a token", ApiRequest::with_json(http::Method::POST, "/apis/authentication.k8s.io/v1/tokenreviews", "application/json",
                &body(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {}}))), 422),
            ("a SubjectAccessReview of nobody, about nothing", ApiRequest::with_json(http::Method::POST, "/apis/authorization.k8s.io/v1/subjectaccessreviews", "application/json",
                &body(json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {}}))), 422),
        ];
        for (what, req, code) in rows {
            let resp = transport.send(&req).await.unwrap();
            assert_eq!(resp.status.as_u16(), code, "{what}: {}", resp.excerpt());
        }
        assert_eq!(fake.rejected().len(), 10);
    })
    .await;
}

fn kill(pid: u32) -> OomKill {
    OomKill {
        pid,
        comm: "stress".into(),
        pod_uid: Some(UID.into()),
    }
}

/// An OOM storm against an API server that takes 50 ms per event: node events wait in their
/// own lane, a burst past its backlog is refused at once (never waited for), and an eviction
/// handed over after the storm is not queued behind it.
#[tokio::test]
async fn an_event_storm_against_a_slow_api_never_delays_an_eviction() {
    bounded(async {
        let fake = Fake::start(|s: &Seen, _| {
            let mut reply = api(Reply::json(201, "{}"))(s, 0);
            if s.path.contains("/namespaces/default/events") {
                reply.delay = Duration::from_millis(50);
            }
            reply
        })
        .await;
        let mut ex = start(settings(&fake, PdbPolicy::Respect, false));
        const STORM: u32 = 100;
        for pid in 0..STORM {
            ex.executor
                .submit(Action::NodeEvent(NodeEvent::OomKill(kill(pid))));
        }
        ex.executor.submit(Action::Evict(Box::new(Evict {
            eviction: decision(true),
            pod: pod(),
            trigger_ktime_ns: None,
        })));
        // Everything reported up to the eviction's report.
        let (mut refused, mut posted) = (0, 0);
        loop {
            match ex.outcomes.recv().await.unwrap() {
                Outcome::Eviction(report) => {
                    assert_eq!(report.attempt.result, EvictionResult::Evicted);
                    break;
                }
                Outcome::Refused(r) => {
                    assert_eq!((r.lane, r.action), ("event", "NodeAgentOOMKill"));
                    refused += 1;
                }
                Outcome::NodeEvent { .. } => posted += 1,
                other => panic!("unexpected {}", kind(&other)),
            }
        }
        let backlog = node_agent_executor::EVENT_BACKLOG as u32;
        assert!(
            (STORM - backlog - 1..=STORM - backlog).contains(&refused),
            "a burst past the backlog is refused, not held: {refused}"
        );
        assert!(
            posted < 10,
            "the eviction went out while the events were still being posted ({posted} done)"
        );
    })
    .await;
}

/// A runtime socket that accepts and never answers: image detection and reclaim wait in the
/// runtime lane (each call up to the CRI timeout), and an eviction goes out meanwhile.
#[tokio::test]
async fn a_runtime_that_never_answers_never_delays_an_eviction() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("cri.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let silent = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                held.push(conn);
            }
        });
        let fake = Fake::start(api(Reply::json(201, "{}"))).await;
        let runtime = Runtime {
            settings: node_agent_cri::CriSettings {
                endpoint: node_agent_cri::Endpoint::from_path(&socket),
                timeout: Duration::from_secs(1),
            },
            gc: node_agent_cri::reclaim::GcPolicy::default(),
        };
        let mut ex = start(Settings {
            runtime: Some(runtime),
            ..settings(&fake, PdbPolicy::Respect, false)
        });
        ex.executor.submit(Action::DetectImages);
        ex.executor.submit(Action::Reclaim(Box::new(Reclaim {
            signal: Signal::NodeFsAvailable,
            layout: node_agent_cri::reclaim::FsLayout::Shared,
            pods: node_agent_cri::reclaim::PodStates::default(),
        })));
        let report = ex.evict(decision(true), pod()).await;
        assert_eq!(
            report.attempt.result,
            EvictionResult::Evicted,
            "the first outcome is the eviction's, with the runtime stuck"
        );
        let mut runtime_outcomes = Vec::new();
        while runtime_outcomes.len() < 2 {
            match ex.outcomes.recv().await.unwrap() {
                Outcome::ImagesDetected(r) => {
                    runtime_outcomes.push(format!("images: {}", r.expect_err("never answered")))
                }
                Outcome::Reclaim(o) => {
                    assert_eq!(o.result, ReclaimResult::RuntimeUnavailable);
                    assert!(
                        matches!(o.error, Some(RuntimeError::Cri(_))),
                        "typed: {:?}",
                        o.error
                    );
                    runtime_outcomes.push(format!("reclaim: {}", o.summary()));
                }
                other => panic!("unexpected {}", kind(&other)),
            }
        }
        assert!(
            runtime_outcomes
                .iter()
                .all(|o| o.contains("no answer within 1s")),
            "{runtime_outcomes:?}"
        );
        silent.abort();
    })
    .await;
}

/// An OOM storm in one container of a pod: one Warning event on the pod, as `kubectl describe
/// pod` lists it, then its count written into the event's `series`, every request as strict as
/// the API server; dry run posts nothing.
#[tokio::test]
async fn a_pod_oom_storm_is_one_event_on_the_pod_counted_in_its_series() {
    bounded(async {
        use node_agent_executor::plan::Acting;
        use node_agent_kube::events::{OomCause, PodOomKill};
        const KILLS: u32 = 50;
        let fake = Fake::start(api(Reply::json(201, "{}"))).await;
        let mut ex = start(settings(&fake, PdbPolicy::Respect, false));
        let kill = PodOomKill {
            namespace: "shop".into(),
            name: "web-7c9f8d6b5-x2x9q".into(),
            uid: UID.into(),
            container: Some("nginx".into()),
            pid: 4242,
            comm: "nginx".into(),
            cause: OomCause::Limit {
                of: "container",
                usage_bytes: Some(512 << 20),
                limit_bytes: Some(512 << 20),
            },
            saw_before: "node-agent saw memory pressure (memory.available threshold met) 1.8s before".into(),
            named_late: false,
        };
        let mut plan = Acting::default();
        let wall = SystemTime::now();
        let mut actions = Vec::new();
        for i in 0..KILLS {
            actions.extend(plan.pod_oom_kill(kill.clone(), Duration::from_millis(u64::from(i)), wall));
        }
        actions.extend(plan.flush_oom(Duration::from_secs(3)));
        assert_eq!(actions.len(), 2, "one event, one series update: {actions:?}");
        for a in actions {
            ex.executor.submit(a);
        }
        for _ in 0..2 {
            let outcome = ex.outcomes.recv().await.unwrap();
            assert!(
                matches!(outcome, Outcome::PodOomEvent { result: Ok(()), .. }),
                "{outcome:?}"
            );
        }
        assert!(fake.rejected().is_empty(), "{:?}", fake.rejected());
        let seen = fake.seen();
        let (post, patch) = (&seen[0], &seen[1]);
        assert_eq!(
            (post.method.as_str(), post.path.as_str()),
            ("POST", "/apis/events.k8s.io/v1/namespaces/shop/events")
        );
        let e = &post.body;
        assert_eq!(
            e["regarding"],
            json!({"apiVersion": "v1", "kind": "Pod", "namespace": "shop", "name": "web-7c9f8d6b5-x2x9q", "uid": UID, "fieldPath": "spec.containers{nginx}"})
        );
        assert_eq!(e["related"]["kind"], "Node");
        assert_eq!(e["related"]["name"], NODE);
        assert_eq!(
            (e["type"].as_str(), e["reason"].as_str(), e["action"].as_str()),
            (Some("Warning"), Some("NodeAgentOOMKill"), Some("OOMKilling"))
        );
        assert_eq!(e["reportingController"], "node-agent.io/node-agent");
        assert_eq!(
            e["note"],
            "Out of memory: killed process 4242 (nginx) in container nginx: 512Mi in use of the container's 512Mi limit. node-agent saw memory pressure (memory.available threshold met) 1.8s before"
        );
        assert!(e.get("series").is_none(), "the first occurrence has no series");
        let name = e["metadata"]["name"].as_str().unwrap();
        assert_eq!(
            (patch.method.as_str(), patch.path.clone()),
            ("PATCH", format!("/apis/events.k8s.io/v1/namespaces/shop/events/{name}"))
        );
        assert_eq!(patch.body["series"]["count"], KILLS);
        assert_eq!(patch.content_type.as_deref(), Some("application/merge-patch+json"));

        // Dry run: nothing posted.
        let quiet = Fake::start(api(Reply::json(201, "{}"))).await;
        let mut ex = start(settings(&quiet, PdbPolicy::Respect, true));
        let mut plan = Acting::default();
        ex.executor
            .submit(plan.pod_oom_kill(kill, Duration::ZERO, wall).expect("a new event"));
        assert!(matches!(
            ex.outcomes.recv().await.unwrap(),
            Outcome::PodOomEvent { result: Ok(()), .. }
        ));
        assert!(quiet.calls().is_empty(), "{:?}", quiet.calls());
    })
    .await;
}

/// A legitimate pod with ten containers of 63-character names: the kubelet's message names each
/// one, about 1.5 kB in all (1486 bytes in the probe's), past the 1024 bytes events.k8s.io takes in a note. The pod's status
/// gets the whole message; the `Evicted` event's note is cut (as the OOM event's is), so the API
/// server takes the event instead of refusing it.
#[tokio::test]
async fn an_evicted_events_note_is_cut_to_what_the_api_server_takes() {
    bounded(async {
        let fake = Fake::start(api(Reply::json(201, "{}"))).await;
        let mut ex = start(settings(&fake, PdbPolicy::Respect, false));
        let mut long = decision(false);
        long.message = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 61440Ki. ".into();
        long.offending_containers.clear();
        for i in 0..10 {
            let name = format!("{i}{}", "c".repeat(62));
            long.message.push_str(&format!(
                "Container {name} was using 192Mi, request is 128Mi, has larger consumption of memory. "
            ));
            long.offending_containers.push(OffendingContainer {
                name,
                usage: Quantity::from_int(192 << 20, Format::BinarySi),
            });
        }
        assert!(long.message.len() > 1400, "{} bytes", long.message.len());
        let report = ex.evict(long.clone(), pod()).await;
        assert_eq!(report.attempt.result, EvictionResult::Evicted);
        assert!(report.event_error.is_none(), "the event was refused: {:?}", report.event_error);
        assert!(fake.rejected().is_empty(), "{:?}", fake.rejected());
        let seen = fake.seen();
        let note = seen[1].body["note"].as_str().expect("a note").to_string();
        assert!(note.len() <= 1024, "{} bytes", note.len());
        assert!(note.ends_with('…'), "cut, and said so: {note}");
        assert!(
            long.message.starts_with(note.trim_end_matches('…')),
            "the message's beginning: {note}"
        );
    })
    .await;
}

/// Evictions are requests of their own, up to the lane's capacity at once: one handed over
/// while others wait on a slow API server goes out at once (a memory eviction never waits
/// behind local storage evictions); past the capacity the lane sheds, and says so as a refusal
/// of its own (counted as such), never as a failed eviction.
#[tokio::test]
async fn evictions_never_queue_behind_one_another_and_a_full_lane_sheds_as_a_refusal() {
    bounded(async {
        let fake = Fake::start(|s: &Seen, _| {
            let mut reply = api(Reply::json(201, "{}"))(s, 0);
            if s.path.contains("/pods/slow-") {
                reply.delay = Duration::from_millis(1500);
            }
            reply
        })
        .await;
        let mut ex = start(settings(&fake, PdbPolicy::Respect, false));
        let named = |name: &str| {
            let e = Eviction {
                name: name.into(),
                uid: Some(format!("uid-{name}")),
                ..decision(true)
            };
            let p = PodInfo {
                name: name.into(),
                uid: Some(format!("uid-{name}")),
                ..pod()
            };
            Action::Evict(Box::new(Evict {
                eviction: e,
                pod: p,
                trigger_ktime_ns: None,
            }))
        };
        for i in 0..5 {
            ex.executor.submit(named(&format!("slow-{i}")));
        }
        let started = std::time::Instant::now();
        ex.executor.submit(named("memory"));
        match ex.outcomes.recv().await.unwrap() {
            Outcome::Eviction(r) => assert_eq!(
                (r.eviction.name.as_str(), r.attempt.result),
                ("memory", EvictionResult::Evicted)
            ),
            other => panic!("{other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_millis(1500),
            "queued behind the slow ones: {:?}",
            started.elapsed()
        );
        // The fast one's event is its own outcome's part; fill the lane with slow ones.
        for i in 5..node_agent_executor::EVICTION_CAPACITY {
            ex.executor.submit(named(&format!("slow-{i}")));
        }
        ex.executor.submit(named("one-too-many"));
        match ex.outcomes.recv().await.unwrap() {
            Outcome::EvictionShed { evict, refused } => {
                assert_eq!(evict.eviction.name, "one-too-many");
                assert_eq!(refused.lane, "eviction");
            }
            other => panic!("a full lane sheds, as a refusal: {other:?}"),
        }
        let mut results = Vec::new();
        while results.len() < node_agent_executor::EVICTION_CAPACITY {
            if let Outcome::Eviction(r) = ex.outcomes.recv().await.unwrap() {
                results.push(r.attempt.result);
            }
        }
        assert!(
            results.iter().all(|r| *r == EvictionResult::Evicted),
            "{results:?}"
        );
        assert!(fake.rejected().is_empty(), "{:?}", fake.rejected());
    })
    .await;
}

/// A kill's record a previous run left unwritten (the agent SIGKILLed between its kill and
/// the API server's answer) is written by the next start, bound to the pod's UID, its event
/// posted, and forgotten once taken; one whose pod is gone is forgotten with no event; a 403
/// (an API server just restarted, its RBAC not loaded yet, as seen on the real cluster) waits
/// and is tried again, kept meanwhile.
#[tokio::test]
async fn a_record_left_by_a_killed_agent_is_written_by_the_next_start_and_forgotten() {
    bounded(async {
        let forbidden = Reply::status(
            403,
            "Forbidden",
            "pods \"web\" is forbidden: User \"system:serviceaccount:node-agent:node-agent\" cannot patch resource \"pods/status\"",
        );
        let ok = Reply::json(200, "{}");
        // (what, the first answer, the answers after, the outcome, requests made)
        let rows: Vec<(&str, Reply, Reply, &str, usize)> = vec![
            ("taken", ok.clone(), ok.clone(), "written", 2),
            (
                "the pod went meanwhile",
                Reply::status(404, "NotFound", "pods \"web\" not found"),
                ok.clone(),
                "gone",
                1,
            ),
            ("403 at first: waits, then taken", forbidden, ok.clone(), "written", 3),
        ];
        for (what, first, then, result, requests) in rows {
            let fake = Fake::start(move |s, n| match (s.method.as_str(), s.path.as_str()) {
                ("PATCH", p) if p.ends_with("/status") && n == 0 => first.clone(),
                ("PATCH", p) if p.ends_with("/status") => then.clone(),
                ("POST", p) if p.contains("/events") => Reply::json(201, s.body.to_string()),
                _ => Reply::status(404, "NotFound", "not found"),
            })
            .await;
            let dir = tempfile::tempdir().unwrap();
            let journal = node_agent_executor::Journal::new(dir.path().join("records"));
            let target = node_agent_executor::kill::KillTarget {
                pod_uid: UID.into(),
                cgroup: "/sys/fs/cgroup/memory/kubepods/burstable/pod-gone".into(),
                cgroup_id: 1,
            };
            journal
                .keep(
                    &decision(true),
                    &target,
                    SystemTime::now() - Duration::from_secs(5),
                )
                .unwrap();
            let mut s = settings(&fake, PdbPolicy::Respect, false);
            s.pending_records = Some(journal.clone());
            let mut ex = start(s);
            let mut next = async || match ex.outcomes.recv().await.unwrap() {
                Outcome::Recorded(r) => r,
                other => panic!("{what}: expected the record's outcome, got {other:?}"),
            };
            let mut report = next().await;
            if let node_agent_executor::node::RecordResult::Waiting(e) = &report.result {
                assert_eq!(e.code(), Some(403), "{what}");
                assert_eq!(
                    journal.pending(SystemTime::now()).len(),
                    1,
                    "{what}: kept while it waits"
                );
                report = next().await;
            }
            assert_eq!(report.eviction, decision(true), "{what}: the decision as kept");
            assert!(
                report.after_kill >= Duration::from_secs(5),
                "{what}: timed from the kill"
            );
            let got = match report.result {
                node_agent_executor::node::RecordResult::Written => "written",
                node_agent_executor::node::RecordResult::Gone => "gone",
                ref other => panic!("{what}: {other:?}"),
            };
            assert_eq!(got, result, "{what}");
            let seen = fake.seen();
            assert_eq!(seen.len(), requests, "{what}: {seen:?}");
            for patch in &seen[..requests - usize::from(result == "written")] {
                assert_eq!(
                    (patch.method.as_str(), patch.path.as_str()),
                    ("PATCH", &*format!("{POD_PATH}/status")),
                    "{what}"
                );
                assert_eq!(patch.body["metadata"]["uid"], UID, "{what}: bound to the pod's UID");
                assert_eq!(patch.body["status"]["phase"], "Failed", "{what}");
            }
            if result == "written" {
                assert_evicted_event(&seen[requests - 1]);
            }
            assert!(
                journal.pending(SystemTime::now()).is_empty(),
                "{what}: forgotten"
            );
        }
    })
    .await;
}
