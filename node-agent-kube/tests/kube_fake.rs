//! The crate against an in-process HTTPS fake of the kubelet and the API server, asserting the
//! exact requests made.

use std::time::{Duration, SystemTime};

use node_agent_kube::fake::{counters, fast_backoff, fixture, Fake, Reply, TEST_BOUND};
use node_agent_kube::{
    api::ApiError,
    condition::{NodeConditionReporter, CONDITION_TYPE},
    config::{Exclusions, PdbPolicy},
    evict::{EvictError, EvictionOutcome, EvictionRequest, Executor, Protected, Protection},
    pods::{
        apiserver::{ApiServerPodSource, WatchEnd},
        kubelet::KubeletClient,
        model::QosClass,
        PodSnapshot, StaleError,
    },
    transport::{Transport, TransportError},
};
use serde_json::json;

type ErrorCheck = fn(&ApiError) -> bool;

async fn bounded<T>(fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(TEST_BOUND, fut)
        .await
        .expect("test ran past its time bound")
}

fn kubelet_fake_routes(seen: &node_agent_kube::fake::Seen, _: usize) -> Reply {
    match seen.path.as_str() {
        "/pods" => Reply::json(200, fixture("pods.json")),
        "/stats/summary" => Reply::json(200, fixture("summary.json")),
        _ => Reply::status(404, "NotFound", "no such path"),
    }
}

#[tokio::test]
async fn kubelet_pods_and_summary_become_a_snapshot() {
    bounded(async {
        let fake = Fake::start(kubelet_fake_routes).await;
        let client = KubeletClient::new(fake.transport("kubelet"), fast_backoff(1), counters());
        let before = SystemTime::now();
        let snap = client.snapshot().await.unwrap();

        let seen = fake.seen();
        assert_eq!(
            fake.calls(),
            [
                ("GET".into(), "/pods".into()),
                ("GET".into(), "/stats/summary".into())
            ]
        );
        assert!(seen
            .iter()
            .all(|s| s.authorization.as_deref() == Some("Bearer token-one")));
        assert!(snap.observed_at >= before);
        assert_eq!(snap.pods.len(), 3);
        assert!(snap.skipped.is_empty());

        let web = snap.find("shop", "web-7c9f8d6b5-x2x9q").unwrap();
        assert_eq!(web.uid, "6f1f4a0e-6b39-4f0e-9a43-1b3f8d2c9e01");
        assert_eq!(web.qos, QosClass::Burstable);
        assert_eq!(web.owner_kind.as_deref(), Some("ReplicaSet"));
        assert_eq!(web.termination_grace_period_seconds, 45);
        assert!(!web.is_kubelet_critical());
        let nginx = &web.containers[0];
        assert_eq!(
            nginx.container_id.as_deref(),
            Some("containerd://4e5f6a7b8c9d")
        );
        assert_eq!(nginx.requests.memory_bytes, Some(128 << 20));
        assert_eq!(nginx.requests.cpu_millis, Some(100));
        assert_eq!(nginx.limits.memory_bytes, Some(256 << 20));
        assert_eq!(
            web.containers[1].requests.ephemeral_storage_bytes,
            Some(1 << 30)
        );
        let usage = web.usage.unwrap();
        assert_eq!(usage.memory_working_set_bytes, Some(222_298_112));
        assert_eq!(usage.memory_rss_bytes, Some(207_618_048));
        assert_eq!(usage.ephemeral_storage_bytes, Some(2_093_056));
        assert_eq!(usage.inodes_used, Some(16));
        assert_eq!(usage.process_count, Some(7));

        let apiserver = snap.find("kube-system", "kube-apiserver-worker-1").unwrap();
        assert!(apiserver.is_mirror && apiserver.is_static && apiserver.is_kubelet_critical());
        let job = snap.find("jobs", "batch-job-q7x1z").unwrap();
        assert_eq!(job.qos, QosClass::Guaranteed, "requests default to limits");
        assert_eq!(job.usage, None, "no summary entry, no usage");
    })
    .await;
}

#[tokio::test]
async fn a_token_rotated_between_requests_is_read_again() {
    bounded(async {
        let fake = Fake::start(kubelet_fake_routes).await;
        let client = KubeletClient::new(fake.transport("kubelet"), fast_backoff(1), counters());
        client.pods().await.unwrap();
        std::fs::write(&fake.token_file, "token-two").unwrap();
        client.pods().await.unwrap();
        let auth: Vec<_> = fake
            .seen()
            .into_iter()
            .map(|s| s.authorization.unwrap())
            .collect();
        assert_eq!(auth, ["Bearer token-one", "Bearer token-two"]);
    })
    .await;
}

#[tokio::test]
async fn a_5xx_is_retried_until_success() {
    bounded(async {
        let fake = Fake::start(|s, i| {
            if i < 2 {
                Reply::status(503, "ServiceUnavailable", "busy")
            } else {
                kubelet_fake_routes(s, i)
            }
        })
        .await;
        let c = counters();
        let client = KubeletClient::new(fake.transport("kubelet"), fast_backoff(4), c.clone());
        assert_eq!(client.pods().await.unwrap().len(), 3);
        assert_eq!(fake.calls().len(), 3);
        assert_eq!(c.retries.load(std::sync::atomic::Ordering::Relaxed), 2);
    })
    .await;
}

#[tokio::test]
async fn failures_give_typed_errors_after_the_last_try() {
    bounded(async {
        let rows: Vec<(&str, Reply, ErrorCheck)> = vec![
            ("401", Reply::status(401, "Unauthorized", "Unauthorized"), |e| matches!(e, ApiError::Unauthorized { .. })),
            ("403", Reply::status(403, "Forbidden", "cannot get nodes/proxy"), |e| matches!(e, ApiError::Forbidden { message, .. } if message.contains("nodes/proxy"))),
            ("500", Reply::status(500, "InternalError", "boom"), |e| matches!(e, ApiError::Status { code: 500, .. })),
            ("bad JSON", Reply::json(200, "<html>proxy error</html>"), |e| matches!(e, ApiError::Decode { expected: "v1.PodList", .. })),
            ("slow", Reply::json(200, "{}").slow(Duration::from_secs(5)), |e| matches!(e, ApiError::Transport(TransportError::Timeout { .. }))),
        ];
        for (what, reply, is_expected) in rows {
            let fake = Fake::start(move |_, _| reply.clone()).await;
            let mut endpoint = fake.endpoint("kubelet");
            endpoint.timeout = Duration::from_millis(300);
            let client = KubeletClient::new(Transport::new(endpoint).unwrap(), fast_backoff(2), counters());
            let err = client.pods().await.unwrap_err();
            assert!(is_expected(&err), "{what}: {err}");
            assert_eq!(fake.calls().len(), 2, "{what}: one retry");
        }
    })
    .await;
}

#[tokio::test]
async fn connection_refused_is_unreachable() {
    bounded(async {
        let fake = Fake::start(kubelet_fake_routes).await;
        let mut endpoint = fake.endpoint("kubelet");
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        endpoint.url = format!("https://127.0.0.1:{port}");
        let client = KubeletClient::new(
            Transport::new(endpoint).unwrap(),
            fast_backoff(2),
            counters(),
        );
        let err = client.pods().await.unwrap_err();
        assert!(
            matches!(err, ApiError::Transport(TransportError::Unreachable { .. })),
            "{err}"
        );
    })
    .await;
}

#[tokio::test]
async fn a_server_signed_by_an_unknown_ca_is_a_tls_error() {
    bounded(async {
        let fake = Fake::start(kubelet_fake_routes).await;
        let other = node_agent_kube::fake::Pki::new();
        let mut endpoint = fake.endpoint("kubelet");
        endpoint.ca_file = Some(other.ca_file.clone());
        let client = KubeletClient::new(
            Transport::new(endpoint).unwrap(),
            fast_backoff(1),
            counters(),
        );
        let err = client.pods().await.unwrap_err();
        assert!(
            matches!(err, ApiError::Transport(TransportError::Tls { .. })),
            "{err}"
        );
        assert!(fake.calls().is_empty());

        // The explicit insecure option accepts it.
        let mut endpoint = fake.endpoint("kubelet");
        endpoint.ca_file = None;
        endpoint.insecure_skip_tls_verify = true;
        let client = KubeletClient::new(
            Transport::new(endpoint).unwrap(),
            fast_backoff(1),
            counters(),
        );
        assert_eq!(client.pods().await.unwrap().len(), 3);
    })
    .await;
}

#[tokio::test]
async fn a_missing_ca_or_token_file_is_named() {
    bounded(async {
        let fake = Fake::start(kubelet_fake_routes).await;
        let mut endpoint = fake.endpoint("kubelet");
        endpoint.ca_file = Some("/nonexistent/ca.crt".into());
        let err = Transport::new(endpoint).unwrap_err();
        assert!(
            matches!(&err, TransportError::ReadCa { path, .. } if path.ends_with("ca.crt")),
            "{err}"
        );

        std::fs::remove_file(&fake.token_file).unwrap();
        let client = KubeletClient::new(fake.transport("kubelet"), fast_backoff(1), counters());
        let err = client.pods().await.unwrap_err();
        assert!(
            matches!(err, ApiError::Transport(TransportError::ReadToken { .. })),
            "{err}"
        );
        assert!(fake.calls().is_empty(), "no request without a token");
    })
    .await;
}

#[tokio::test]
async fn data_older_than_the_bound_is_refused() {
    bounded(async {
        let fake = Fake::start(kubelet_fake_routes).await;
        let client = KubeletClient::new(fake.transport("kubelet"), fast_backoff(1), counters());
        let snap = client.snapshot().await.unwrap();
        let bound = Duration::from_secs(30);
        assert_eq!(
            snap.check_fresh(snap.observed_at + Duration::from_secs(10), bound),
            Ok(())
        );
        assert!(matches!(
            snap.check_fresh(snap.observed_at + Duration::from_secs(31), bound),
            Err(StaleError::TooOld { .. })
        ));
    })
    .await;
}

#[tokio::test]
async fn api_server_source_lists_then_watches_this_node_only() {
    bounded(async {
        let watch_lines = [
            json!({"type": "ADDED", "object": {"metadata": {"name": "new-pod", "namespace": "shop", "uid": "new-uid", "resourceVersion": "48300"}, "spec": {"containers": [{"name": "c"}], "nodeName": "worker-1"}}}),
            json!({"type": "DELETED", "object": {"metadata": {"name": "batch-job-q7x1z", "namespace": "jobs", "uid": "d2c1b0a9-1111-2222-3333-444455556666", "resourceVersion": "48301"}, "spec": {"containers": [{"name": "worker"}]}}}),
            json!({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "48400"}, "spec": {"containers": []}}}),
        ]
        .map(|l| l.to_string())
        .join("\n")
            + "\n";
        let fake = Fake::start(move |s, _| {
            if s.path.contains("watch=true") {
                Reply::json(200, watch_lines.clone())
            } else {
                Reply::json(200, fixture("pods.json"))
            }
        })
        .await;
        let c = counters();
        let source = ApiServerPodSource::new(fake.transport("api server"), fast_backoff(1), c.clone(), "worker-1");
        let store = source.store();
        assert!(store.snapshot(SystemTime::now(), &c).is_none(), "nothing before the first list");
        source.relist().await.unwrap();
        assert_eq!(source.watch_once(290).await.unwrap(), WatchEnd::Closed);
        source.watch_once(290).await.unwrap();

        assert_eq!(
            fake.calls(),
            [
                ("GET".into(), "/api/v1/pods?fieldSelector=spec.nodeName%3Dworker-1".into()),
                ("GET".into(), "/api/v1/pods?fieldSelector=spec.nodeName%3Dworker-1&watch=true&resourceVersion=48213&allowWatchBookmarks=true&timeoutSeconds=290".into()),
                ("GET".into(), "/api/v1/pods?fieldSelector=spec.nodeName%3Dworker-1&watch=true&resourceVersion=48400&allowWatchBookmarks=true&timeoutSeconds=290".into()),
            ]
        );
        let snap = store.snapshot(SystemTime::now(), &c).unwrap();
        let mut names: Vec<_> = snap.pods.iter().map(|p| p.name.as_str()).collect();
        names.sort();
        assert_eq!(names, ["kube-apiserver-worker-1", "new-pod", "web-7c9f8d6b5-x2x9q"]);
    })
    .await;
}

#[tokio::test]
async fn an_expired_watch_version_asks_for_a_new_list() {
    bounded(async {
        let fake = Fake::start(|s, _| {
            if s.path.contains("watch=true") {
                Reply::json(200, json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410, "message": "too old resource version"}}).to_string() + "\n")
            } else {
                Reply::json(200, fixture("pods.json"))
            }
        })
        .await;
        let source = ApiServerPodSource::new(fake.transport("api server"), fast_backoff(1), counters(), "worker-1");
        source.relist().await.unwrap();
        assert_eq!(source.watch_once(60).await.unwrap(), WatchEnd::Relist);
    })
    .await;
}

// ---- eviction ----

const NODE: &str = "worker-1";

fn request(hard: bool) -> EvictionRequest {
    EvictionRequest {
        namespace: "shop".into(),
        name: "web-7c9f8d6b5-x2x9q".into(),
        uid: "6f1f4a0e-6b39-4f0e-9a43-1b3f8d2c9e01".into(),
        grace_period_seconds: if hard { 0 } else { 30 },
        message: "The node was low on resource: memory. Threshold quantity: 100Mi, available: 61440Ki. Container nginx was using 196608Ki, request is 128Mi, has larger consumption of memory. ".into(),
        signal: "memory.available".into(),
        hard,
        starved_resource: "memory".into(),
        offending_containers: vec!["nginx".into()],
        offending_containers_usage: vec!["196608Ki".into()],
    }
}

async fn pods_from_fixture() -> PodSnapshot {
    let fake = Fake::start(kubelet_fake_routes).await;
    KubeletClient::new(fake.transport("kubelet"), fast_backoff(1), counters())
        .snapshot()
        .await
        .unwrap()
}

fn executor(fake: &Fake, policy: PdbPolicy, dry_run: bool) -> Executor {
    let protection = Protection {
        own_namespace: "node-agent".into(),
        own_name: "node-agent-abcde".into(),
        exclusions: Exclusions::default(),
    };
    Executor::new(
        fake.transport("api server"),
        fast_backoff(2),
        counters(),
        policy,
        dry_run,
        protection,
        NODE,
    )
}

/// The API server's answers: 201 for an eviction unless `pdb_blocks`, then 429.
fn api_server(
    pdb_blocks: bool,
) -> impl Fn(&node_agent_kube::fake::Seen, usize) -> Reply + Send + Sync + 'static {
    move |s, _| {
        match (s.method.as_str(), s.path.as_str()) {
        ("POST", p) if p.ends_with("/eviction") && pdb_blocks => Reply::status(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget."),
        ("POST", p) if p.ends_with("/eviction") => Reply::json(201, json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}).to_string()),
        ("POST", p) if p.contains("/events") => Reply::json(201, s.body.to_string()),
        ("DELETE", _) => Reply::json(200, fixture_pod()),
        ("PATCH", _) => Reply::json(200, fixture_pod()),
        _ => Reply::status(404, "NotFound", "not found"),
    }
    }
}

fn fixture_pod() -> String {
    let list: serde_json::Value = serde_json::from_str(&fixture("pods.json")).unwrap();
    list["items"][0].to_string()
}

fn assert_evicted_event(seen: &node_agent_kube::fake::Seen, req: &EvictionRequest) {
    assert_eq!(seen.method, "POST");
    assert_eq!(seen.path, "/apis/events.k8s.io/v1/namespaces/shop/events");
    let e = &seen.body;
    assert_eq!(e["apiVersion"], "events.k8s.io/v1");
    assert_eq!(e["kind"], "Event");
    assert_eq!(e["reason"], "Evicted");
    assert_eq!(e["type"], "Warning");
    assert_eq!(e["note"], req.message.as_str());
    assert_eq!(e["reportingController"], "node-agent.io/node-agent");
    assert_eq!(e["reportingInstance"], "node-agent-worker-1");
    assert_eq!(
        e["regarding"],
        json!({"apiVersion": "v1", "kind": "Pod", "namespace": "shop", "name": req.name, "uid": req.uid})
    );
    assert_eq!(
        e["metadata"]["annotations"],
        json!({"offending_containers": "nginx", "offending_containers_usage": "196608Ki", "starved_resource": "memory"})
    );
    assert!(e["metadata"]["name"]
        .as_str()
        .unwrap()
        .starts_with("web-7c9f8d6b5-x2x9q."));
    assert!(e["eventTime"].as_str().unwrap().ends_with('Z'));
}

#[tokio::test]
async fn an_eviction_posts_the_exact_body_then_the_event() {
    bounded(async {
        let snap = pods_from_fixture().await;
        let fake = Fake::start(api_server(false)).await;
        let req = request(false);
        let pod = snap.find(&req.namespace, &req.name).unwrap();
        let outcome = executor(&fake, PdbPolicy::Respect, false).evict(pod, &req, SystemTime::now()).await.unwrap();
        assert_eq!(outcome, EvictionOutcome::Evicted);

        let seen = fake.seen();
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0].method, "POST");
        assert_eq!(seen[0].path, "/api/v1/namespaces/shop/pods/web-7c9f8d6b5-x2x9q/eviction");
        assert_eq!(seen[0].content_type.as_deref(), Some("application/json"));
        assert_eq!(
            seen[0].body,
            json!({
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": "web-7c9f8d6b5-x2x9q", "namespace": "shop"},
                "deleteOptions": {"gracePeriodSeconds": 30, "preconditions": {"uid": "6f1f4a0e-6b39-4f0e-9a43-1b3f8d2c9e01"}}
            })
        );
        assert_evicted_event(&seen[1], &req);
    })
    .await;
}

#[tokio::test]
async fn a_pdb_429_is_respected_without_a_delete() {
    bounded(async {
        let snap = pods_from_fixture().await;
        for (policy, hard) in [(PdbPolicy::Respect, true), (PdbPolicy::Respect, false), (PdbPolicy::Override, false)] {
            let fake = Fake::start(api_server(true)).await;
            let req = request(hard);
            let pod = snap.find(&req.namespace, &req.name).unwrap();
            let outcome = executor(&fake, policy, false).evict(pod, &req, SystemTime::now()).await.unwrap();
            assert!(matches!(&outcome, EvictionOutcome::BlockedByPdb { message } if message.contains("disruption budget")), "{policy:?} hard={hard}: {outcome:?}");
            assert_eq!(
                fake.calls(),
                [("POST".to_string(), "/api/v1/namespaces/shop/pods/web-7c9f8d6b5-x2x9q/eviction".to_string())],
                "{policy:?} hard={hard}: one eviction request, no delete, no retry of a 429"
            );
        }
    })
    .await;
}

#[tokio::test]
async fn override_for_a_hard_threshold_deletes_and_marks_the_pod_evicted() {
    bounded(async {
        let snap = pods_from_fixture().await;
        let fake = Fake::start(api_server(true)).await;
        let req = request(true);
        let pod = snap.find(&req.namespace, &req.name).unwrap();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_741_000_000);
        let outcome = executor(&fake, PdbPolicy::Override, false)
            .evict(pod, &req, now)
            .await
            .unwrap();
        assert!(
            matches!(outcome, EvictionOutcome::PdbOverridden { .. }),
            "{outcome:?}"
        );

        let seen = fake.seen();
        let calls: Vec<_> = seen
            .iter()
            .map(|s| (s.method.as_str(), s.path.as_str()))
            .collect();
        assert_eq!(
            calls,
            [
                (
                    "POST",
                    "/api/v1/namespaces/shop/pods/web-7c9f8d6b5-x2x9q/eviction"
                ),
                ("DELETE", "/api/v1/namespaces/shop/pods/web-7c9f8d6b5-x2x9q"),
                (
                    "PATCH",
                    "/api/v1/namespaces/shop/pods/web-7c9f8d6b5-x2x9q/status"
                ),
                ("POST", "/apis/events.k8s.io/v1/namespaces/shop/events"),
            ]
        );
        assert_eq!(
            seen[1].body,
            json!({"gracePeriodSeconds": 0, "preconditions": {"uid": req.uid}})
        );
        assert_eq!(
            seen[2].content_type.as_deref(),
            Some("application/strategic-merge-patch+json")
        );
        assert_eq!(
            seen[2].body,
            json!({"status": {
                "phase": "Failed",
                "reason": "Evicted",
                "message": req.message,
                "conditions": [{
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "TerminationByKubelet",
                    "message": req.message,
                    "lastTransitionTime": "2025-03-03T11:06:40Z"
                }]
            }})
        );
        assert_evicted_event(&seen[3], &req);
    })
    .await;
}

#[tokio::test]
async fn dry_run_sends_nothing_that_changes_state() {
    bounded(async {
        let snap = pods_from_fixture().await;
        let fake = Fake::start(api_server(true)).await;
        let exec = executor(&fake, PdbPolicy::Override, true);
        for hard in [false, true] {
            let req = request(hard);
            let pod = snap.find(&req.namespace, &req.name).unwrap();
            assert_eq!(
                exec.evict(pod, &req, SystemTime::now()).await.unwrap(),
                EvictionOutcome::DryRun
            );
        }
        exec.events()
            .post(&node_agent_kube::events::build_threshold_met(
                NODE,
                "memory",
                SystemTime::now(),
            ))
            .await
            .unwrap();
        let mut reporter = NodeConditionReporter::new(
            fake.transport("api server"),
            fast_backoff(1),
            counters(),
            NODE,
            true,
        );
        // The reporter reads the node first (a GET, which this fake answers 404): either way
        // nothing is patched.
        let _ = reporter
            .report(true, "MemoryPressure", "m", SystemTime::now())
            .await;
        assert!(
            fake.seen().iter().all(|s| s.method == "GET"),
            "{:?}",
            fake.calls()
        );
    })
    .await;
}

#[tokio::test]
async fn protected_pods_are_refused_before_any_request() {
    bounded(async {
        let snap = pods_from_fixture().await;
        let fake = Fake::start(api_server(false)).await;
        let exec = executor(&fake, PdbPolicy::Override, false);

        let mirror = snap.find("kube-system", "kube-apiserver-worker-1").unwrap();
        let mut req = request(true);
        (req.namespace, req.name, req.uid) = (
            mirror.namespace.clone(),
            mirror.name.clone(),
            mirror.uid.clone(),
        );
        let err = exec
            .evict(mirror, &req, SystemTime::now())
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                EvictError::Protected {
                    reason: Protected::KubeletCritical {
                        is_mirror: true,
                        ..
                    },
                    ..
                }
            ),
            "{err}"
        );

        let mut own = snap.find("shop", "web-7c9f8d6b5-x2x9q").unwrap().clone();
        (own.namespace, own.name) = ("node-agent".into(), "node-agent-abcde".into());
        let mut req = request(true);
        (req.namespace, req.name) = (own.namespace.clone(), own.name.clone());
        let err = exec.evict(&own, &req, SystemTime::now()).await.unwrap_err();
        assert!(
            matches!(
                err,
                EvictError::Protected {
                    reason: Protected::OwnPod,
                    ..
                }
            ),
            "{err}"
        );

        let web = snap.find("shop", "web-7c9f8d6b5-x2x9q").unwrap();
        let mut req = request(true);
        req.uid = "someone-else".into();
        assert!(matches!(
            exec.evict(web, &req, SystemTime::now()).await,
            Err(EvictError::WrongPod { .. })
        ));

        assert!(fake.calls().is_empty(), "{:?}", fake.calls());
    })
    .await;
}

#[tokio::test]
async fn an_eviction_that_keeps_failing_is_a_typed_error() {
    bounded(async {
        let snap = pods_from_fixture().await;
        let fake = Fake::start(|_, _| Reply::status(500, "InternalError", "etcd timeout")).await;
        let req = request(false);
        let pod = snap.find(&req.namespace, &req.name).unwrap();
        let err = executor(&fake, PdbPolicy::Respect, false)
            .evict(pod, &req, SystemTime::now())
            .await
            .unwrap_err();
        assert!(
            matches!(
                &err,
                EvictError::Api {
                    step: "eviction",
                    source: ApiError::Status { code: 500, .. },
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(fake.calls().len(), 2, "retried once");
    })
    .await;
}

// ---- node events and condition ----

#[tokio::test]
async fn node_events_name_the_node_and_the_killed_process() {
    bounded(async {
        let fake = Fake::start(api_server(false)).await;
        let exec = executor(&fake, PdbPolicy::Respect, false);
        let now = SystemTime::now();
        exec.events()
            .post(&node_agent_kube::events::build_threshold_met(
                NODE, "memory", now,
            ))
            .await
            .unwrap();
        let kill = node_agent_kube::events::OomKill {
            pid: 4242,
            comm: "java".into(),
            pod: Some(("shop".into(), "web-7c9f8d6b5-x2x9q".into())),
        };
        exec.events()
            .post(&node_agent_kube::events::build_oom_killing(
                NODE, &kill, now,
            ))
            .await
            .unwrap();

        let seen = fake.seen();
        let node_ref = json!({"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE});
        for s in &seen {
            assert_eq!(s.path, "/apis/events.k8s.io/v1/namespaces/default/events");
            assert_eq!(s.body["regarding"], node_ref);
        }
        assert_eq!(seen[0].body["reason"], "EvictionThresholdMet");
        assert_eq!(seen[0].body["note"], "Attempting to reclaim memory");
        assert_eq!(seen[1].body["reason"], "OOMKilling");
        assert_eq!(
            seen[1].body["note"],
            "Out of memory: killed process 4242 (java) in pod shop/web-7c9f8d6b5-x2x9q"
        );
    })
    .await;
}

#[tokio::test]
async fn the_node_condition_keeps_its_transition_time_across_a_restart() {
    bounded(async {
        let node = json!({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": "1f2e3d4c"},
            "status": {"conditions": [
                {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory", "lastHeartbeatTime": "2025-03-03T11:00:00Z", "lastTransitionTime": "2025-03-01T00:00:00Z"},
                {"type": CONDITION_TYPE, "status": "True", "reason": "MemoryPressure", "lastHeartbeatTime": "2025-03-03T11:00:00Z", "lastTransitionTime": "2025-03-03T10:00:00Z"}
            ]}
        })
        .to_string();
        let fake = Fake::start(move |s, _| match s.method.as_str() {
            "GET" | "PATCH" => Reply::json(200, node.clone()),
            _ => Reply::status(405, "MethodNotAllowed", "no"),
        })
        .await;
        let mut reporter = NodeConditionReporter::new(fake.transport("api server"), fast_backoff(1), counters(), NODE, false);
        let t1 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_741_000_000);
        reporter.report(true, "MemoryPressure", "memory.available below 100Mi", t1).await.unwrap();
        reporter.report(false, "NoPressure", "all signals below their thresholds", t1 + Duration::from_secs(300)).await.unwrap();

        let seen = fake.seen();
        assert_eq!(fake.calls()[0], ("GET".to_string(), "/api/v1/nodes/worker-1".to_string()));
        assert_eq!(seen[1].path, "/api/v1/nodes/worker-1/status");
        assert_eq!(seen[1].content_type.as_deref(), Some("application/strategic-merge-patch+json"));
        assert_eq!(
            seen[1].body,
            json!({"status": {"conditions": [{"type": CONDITION_TYPE, "status": "True", "reason": "MemoryPressure",
                "message": "memory.available below 100Mi",
                "lastHeartbeatTime": "2025-03-03T11:06:40Z", "lastTransitionTime": "2025-03-03T10:00:00Z"}]}})
        );
        assert_eq!(seen[2].body["status"]["conditions"][0]["status"], "False");
        assert_eq!(seen[2].body["status"]["conditions"][0]["lastTransitionTime"], "2025-03-03T11:11:40Z");
        assert_eq!(seen.len(), 3, "the node is read once");
    })
    .await;
}
