//! The pod sources (the kubelet, the API server's list and watch) against the strict
//! in-process HTTPS fake, asserting the exact requests made and every answer's handling.

use std::{
    sync::atomic::Ordering,
    time::{Duration, SystemTime},
};

use node_agent_kube::{
    api::ApiError,
    fake::{fixture, Fake, Reply, Seen, TEST_BOUND},
    pods::{
        apiserver::{ApiServerPodSource, RelistReason, WatchEnd, WatchTiming},
        kubelet::KubeletClient,
        records::ProblemKind,
        StaleError,
    },
    transport::{Tls, Transport, TransportError},
};
use serde_json::json;

type ErrorCheck = fn(&ApiError) -> bool;

async fn bounded<T>(fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(TEST_BOUND, fut)
        .await
        .expect("test ran past its time bound")
}

fn kubelet_routes(seen: &Seen, _: usize) -> Reply {
    match seen.path.as_str() {
        "/pods" => Reply::json(200, fixture("pods.json")),
        "/stats/summary" => Reply::json(200, fixture("summary.json")),
        _ => Reply::status(404, "NotFound", "no such path"),
    }
}

fn kubelet(fake: &Fake, attempts: u32) -> KubeletClient {
    KubeletClient::new(fake.context("kubelet", attempts, "worker-1"))
}

#[tokio::test]
async fn kubelet_pods_and_summary_become_the_policys_pods() {
    bounded(async {
        let fake = Fake::start(kubelet_routes).await;
        let before = SystemTime::now();
        let snap = kubelet(&fake, 1).snapshot().await.unwrap();

        assert_eq!(
            fake.calls(),
            [
                ("GET".into(), "/pods".into()),
                ("GET".into(), "/stats/summary".into())
            ]
        );
        assert!(fake.rejected().is_empty(), "{:?}", fake.rejected());
        assert!(snap.observed_at >= before);
        assert!(snap.problems.is_empty(), "{:?}", snap.problems);
        assert_eq!(snap.listed, 3);
        assert_eq!(
            snap.pods.len(),
            3,
            "the Pending pod is active; none is terminal"
        );

        let web = snap.find("shop", "web-7c9f8d6b5-x2x9q").unwrap();
        assert_eq!(
            web.uid.as_deref(),
            Some("6f1f4a0e-6b39-4f0e-9a43-1b3f8d2c9e01")
        );
        assert_eq!(web.labels.get("app").map(String::as_str), Some("web"));
        assert_eq!(web.termination_grace_period_seconds, Some(45));
        assert!(!web.is_critical() && !web.terminating);
        let nginx = &web.containers[0];
        assert_eq!(nginx.requests.memory.unwrap().value(), 128 << 20);
        assert_eq!(
            nginx.requests.memory.unwrap().to_string(),
            "128Mi",
            "quantities print as written"
        );
        assert_eq!(nginx.limits.memory.unwrap().value(), 256 << 20);
        assert_eq!(
            web.containers[1]
                .requests
                .ephemeral_storage
                .unwrap()
                .value(),
            1 << 30
        );
        let usage = web.usage.clone().unwrap();
        assert_eq!(usage.memory_working_set_bytes, 222_298_112);
        assert_eq!(usage.ephemeral_storage_bytes, Some(2_093_056));
        assert_eq!(
            usage.volumes.get("kube-api-access-8x2lz"),
            Some(&4096),
            "volume use by name"
        );
        assert_eq!(usage.nodefs.bytes, 2_093_056);
        assert_eq!(usage.nodefs.inodes, 16);
        assert_eq!(usage.processes, 7);
        let nginx_usage = nginx.usage.unwrap();
        assert_eq!(nginx_usage.memory_working_set_bytes, Some(201_326_592));
        assert_eq!(
            nginx_usage.ephemeral_storage_bytes(),
            Some(40_960 + 2_048_000),
            "rootfs + logs"
        );
        assert_eq!(
            (nginx_usage.rootfs_bytes, nginx_usage.logs_bytes),
            (Some(40_960), Some(2_048_000))
        );
        assert_eq!(
            web.containers[1].usage.unwrap().ephemeral_storage_bytes(),
            None,
            "no rootfs figures"
        );
        let by_id = &snap.containers["4e5f6a7b8c9d"];
        assert_eq!(
            (by_id.pod_uid.as_str(), by_id.name.as_str()),
            ("6f1f4a0e-6b39-4f0e-9a43-1b3f8d2c9e01", "nginx")
        );

        let apiserver = snap.find("kube-system", "kube-apiserver-worker-1").unwrap();
        assert!(apiserver.is_mirror && apiserver.is_static && apiserver.is_critical());
        let job = snap.find("jobs", "batch-job-q7x1z").unwrap();
        assert_eq!(
            job.containers[0].requests.memory.unwrap().value(),
            1 << 30,
            "requests default to limits"
        );
        assert_eq!(job.usage, None, "no summary entry, no usage");
    })
    .await;
}

#[tokio::test]
async fn terminal_and_terminating_pods_are_read_as_the_kubelet_reads_them() {
    bounded(async {
        let mut list: serde_json::Value = serde_json::from_str(&fixture("pods.json")).unwrap();
        list["items"][0]["metadata"]["deletionTimestamp"] = json!("2025-03-02T10:00:00Z");
        list["items"][2]["status"]["phase"] = json!("Succeeded");
        let body = list.to_string();
        let fake = Fake::start(move |s, _| match s.path.as_str() {
            "/pods" => Reply::json(200, body.clone()),
            _ => Reply::json(200, fixture("summary.json")),
        })
        .await;
        let snap = kubelet(&fake, 1).snapshot().await.unwrap();
        let names: Vec<_> = snap
            .pods
            .iter()
            .map(|p| (p.name.as_str(), p.terminating))
            .collect();
        assert_eq!(
            names,
            [
                ("web-7c9f8d6b5-x2x9q", true),
                ("kube-apiserver-worker-1", false)
            ],
            "terminal pods are left out"
        );
        assert_eq!(snap.listed, 3);
    })
    .await;
}

/// The kubelet's pods with `edit` applied to the list and `summary` as its stats.
async fn kubelet_answering(
    edit: impl FnOnce(&mut serde_json::Value),
    summary: serde_json::Value,
) -> (Fake, node_agent_kube::pods::PodSnapshot) {
    let mut list: serde_json::Value = serde_json::from_str(&fixture("pods.json")).unwrap();
    edit(&mut list);
    let (body, summary) = (list.to_string(), summary.to_string());
    let fake = Fake::start(move |s, _| match s.path.as_str() {
        "/pods" => Reply::json(200, body.clone()),
        _ => Reply::json(200, summary.clone()),
    })
    .await;
    let snap = kubelet(&fake, 1).snapshot().await.unwrap();
    (fake, snap)
}

fn problems(snap: &node_agent_kube::pods::PodSnapshot) -> Vec<(&str, ProblemKind)> {
    snap.problems
        .iter()
        .map(|p| (p.pod.as_str(), p.kind))
        .collect()
}

#[tokio::test]
async fn one_bad_pod_is_named_and_left_out_and_its_neighbours_are_read() {
    bounded(async {
        let (_, snap) = kubelet_answering(
            |l| l["items"][1]["spec"]["priority"] = json!("very high"),
            serde_json::from_str(&fixture("summary.json")).unwrap(),
        )
        .await;
        let mut names: Vec<_> = snap.pods.iter().map(|p| p.name.as_str()).collect();
        names.sort();
        assert_eq!(names, ["batch-job-q7x1z", "web-7c9f8d6b5-x2x9q"]);
        assert_eq!(
            problems(&snap),
            [(
                "kube-system/kube-apiserver-worker-1",
                ProblemKind::PodUnreadable
            )]
        );
        assert_eq!(snap.listed, 3, "the unreadable pod was listed");
        let web = snap.find("shop", "web-7c9f8d6b5-x2x9q").unwrap();
        assert_eq!(
            web.usage.as_ref().map(|u| u.memory_working_set_bytes),
            Some(222_298_112),
            "its neighbours keep their stats"
        );
    })
    .await;
}

#[tokio::test]
async fn a_bad_stats_entry_leaves_its_pod_without_usage_and_the_others_with_theirs() {
    bounded(async {
        for (what, value) in [
            ("negative", json!(-1)),
            ("beyond 64 bits", json!(1e30)),
            ("a string", json!("lots")),
        ] {
            let mut summary: serde_json::Value =
                serde_json::from_str(&fixture("summary.json")).unwrap();
            let web = summary["pods"]
                .as_array_mut()
                .unwrap()
                .iter_mut()
                .find(|p| p["podRef"]["name"] == "web-7c9f8d6b5-x2x9q")
                .unwrap();
            web["ephemeral-storage"]["usedBytes"] = value;
            let (_, snap) = kubelet_answering(|_| {}, summary).await;
            assert_eq!(
                problems(&snap),
                [("shop/web-7c9f8d6b5-x2x9q", ProblemKind::StatsUnreadable)],
                "{what}"
            );
            let web = snap.find("shop", "web-7c9f8d6b5-x2x9q").unwrap();
            assert_eq!(
                web.usage, None,
                "{what}: no usage, so it ranks as the kubelet ranks a pod without stats"
            );
            assert_eq!(snap.pods.len(), 3, "{what}: every pod stays");
            let ranked = node_agent_policy::rank::rank(
                &snap.pods,
                node_agent_policy::Signal::MemoryAvailable,
                false,
            );
            assert_eq!(
                snap.pods[ranked[0]].name, "web-7c9f8d6b5-x2x9q",
                "{what}: first, as pods without stats are"
            );
        }
    })
    .await;
}

#[tokio::test]
async fn a_request_that_is_not_a_quantity_keeps_its_pod_in_the_ranking() {
    bounded(async {
        let (_, snap) = kubelet_answering(
            |l| {
                l["items"][0]["spec"]["containers"][0]["resources"]["requests"]["memory"] =
                    json!("-1Mi");
                l["items"][0]["spec"]["containers"][1]["resources"]["limits"] =
                    json!({"ephemeral-storage": "plenty"});
            },
            serde_json::from_str(&fixture("summary.json")).unwrap(),
        )
        .await;
        assert_eq!(
            problems(&snap),
            [
                ("shop/web-7c9f8d6b5-x2x9q", ProblemKind::FieldInvalid),
                ("shop/web-7c9f8d6b5-x2x9q", ProblemKind::FieldInvalid)
            ]
        );
        assert!(
            snap.problems[0]
                .detail
                .contains("container nginx: resources.requests.memory \"-1Mi\""),
            "{}",
            snap.problems[0].detail
        );
        let web = snap
            .find("shop", "web-7c9f8d6b5-x2x9q")
            .expect("the pod stays a candidate");
        assert_eq!(
            web.containers[0].requests.memory.map(|q| q.value()),
            Some(0),
            "read as no request at all: it ranks as using more than it asked for"
        );
        assert_eq!(
            web.containers[1].limits.ephemeral_storage, None,
            "read as no limit"
        );
    })
    .await;
}

#[tokio::test]
async fn two_pods_sharing_a_uid_are_both_refused_and_neither_gets_the_others_usage() {
    bounded(async {
        let (_, snap) = kubelet_answering(
            |l| {
                let uid = l["items"][0]["metadata"]["uid"].clone();
                l["items"][2]["metadata"]["uid"] = uid;
            },
            serde_json::from_str(&fixture("summary.json")).unwrap(),
        )
        .await;
        let names: Vec<_> = snap.pods.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["kube-apiserver-worker-1"]);
        assert_eq!(
            problems(&snap),
            [
                ("shop/web-7c9f8d6b5-x2x9q", ProblemKind::DuplicateUid),
                ("jobs/batch-job-q7x1z", ProblemKind::DuplicateUid)
            ]
        );
        assert!(
            snap.containers
                .values()
                .all(|c| c.pod_uid != "6f1f4a0e-6b39-4f0e-9a43-1b3f8d2c9e01"),
            "no container is attributed to the shared UID"
        );
    })
    .await;
}

#[tokio::test]
async fn a_rotated_token_is_read_again_and_a_wrong_one_is_refused() {
    bounded(async {
        let fake = Fake::start(kubelet_routes).await;
        let client = kubelet(&fake, 1);
        client.pods().await.unwrap();
        fake.rotate_token("token-two");
        client.pods().await.unwrap();
        std::fs::write(&fake.token_file, "stolen").unwrap();
        let err = client.pods().await.unwrap_err();
        assert!(matches!(err, ApiError::Unauthorized { .. }), "{err}");
        let auth: Vec<_> = fake
            .seen()
            .into_iter()
            .map(|s| s.authorization.unwrap())
            .collect();
        assert_eq!(
            auth,
            ["Bearer token-one", "Bearer token-two", "Bearer stolen"]
        );
        assert_eq!(
            fake.rejected().len(),
            1,
            "the fake refused the unknown token as a 401"
        );
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
                kubelet_routes(s, i)
            }
        })
        .await;
        let ctx = fake.context("kubelet", 4, "worker-1");
        let c = ctx.counters.clone();
        assert_eq!(KubeletClient::new(ctx).pods().await.unwrap().items.len(), 3);
        assert_eq!(fake.calls().len(), 3);
        assert_eq!(c.retries.load(Ordering::Relaxed), 2);
    })
    .await;
}

#[tokio::test]
async fn a_retry_waits_as_long_as_retry_after_says() {
    bounded(async {
        let fake = Fake::start(|s, i| {
            if i == 0 {
                Reply::rate_limited(1)
            } else {
                kubelet_routes(s, i)
            }
        })
        .await;
        let started = std::time::Instant::now();
        kubelet(&fake, 2).pods().await.unwrap();
        assert!(
            started.elapsed() >= Duration::from_secs(1),
            "came back after {:?}",
            started.elapsed()
        );
        assert_eq!(fake.calls().len(), 2);
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
            let ctx = node_agent_kube::api::Context { transport: Transport::new(endpoint).unwrap(), ..fake.context("kubelet", 2, "worker-1") };
            let err = KubeletClient::new(ctx).pods().await.unwrap_err();
            assert!(is_expected(&err), "{what}: {err}");
            assert_eq!(fake.calls().len(), 2, "{what}: one retry");
        }
    })
    .await;
}

#[tokio::test]
async fn unreachable_untrusted_and_unreadable_setups_are_named() {
    bounded(async {
        let fake = Fake::start(kubelet_routes).await;
        let with = |endpoint| node_agent_kube::api::Context {
            transport: Transport::new(endpoint).unwrap(),
            ..fake.context("kubelet", 1, "worker-1")
        };
        let mut refused = fake.endpoint("kubelet");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        refused.url = format!("https://127.0.0.1:{port}");
        let err = KubeletClient::new(with(refused)).pods().await.unwrap_err();
        assert!(
            matches!(err, ApiError::Transport(TransportError::Unreachable { .. })),
            "{err}"
        );

        let other = node_agent_kube::fake::Pki::new();
        let mut untrusted = fake.endpoint("kubelet");
        untrusted.tls = Tls::ca(other.ca_file.clone());
        let err = KubeletClient::new(with(untrusted))
            .pods()
            .await
            .unwrap_err();
        assert!(
            matches!(err, ApiError::Transport(TransportError::Tls { .. })),
            "{err}"
        );
        assert!(fake.calls().is_empty());

        let mut insecure = fake.endpoint("kubelet");
        insecure.tls = Tls::Insecure;
        assert_eq!(
            KubeletClient::new(with(insecure))
                .pods()
                .await
                .unwrap()
                .items
                .len(),
            3,
            "explicitly insecure"
        );

        let mut no_ca = fake.endpoint("kubelet");
        no_ca.tls = Tls::ca("/nonexistent/ca.crt");
        let err = Transport::new(no_ca).unwrap_err();
        assert!(
            matches!(&err, TransportError::ReadCa { path, .. } if path.ends_with("ca.crt")),
            "{err}"
        );

        std::fs::remove_file(&fake.token_file).unwrap();
        let before = fake.calls().len();
        let err = kubelet(&fake, 1).pods().await.unwrap_err();
        assert!(
            matches!(err, ApiError::Transport(TransportError::ReadToken { .. })),
            "{err}"
        );
        assert_eq!(fake.calls().len(), before, "no request without a token");
    })
    .await;
}

#[tokio::test]
async fn data_older_than_the_bound_is_refused() {
    bounded(async {
        let fake = Fake::start(kubelet_routes).await;
        let snap = kubelet(&fake, 1).snapshot().await.unwrap();
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

// ---- the API server: list and watch ----

const LIST: &str = "/api/v1/pods?fieldSelector=spec.nodeName%3Dworker-1";

fn watch_path(rv: &str, timeout: u32) -> String {
    format!(
        "{LIST}&watch=true&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds={timeout}"
    )
}

fn apiserver(fake: &Fake) -> ApiServerPodSource {
    ApiServerPodSource::new(fake.context("api server", 1, "worker-1"))
}

/// Watches of 290 s, silent for at most `silence`.
fn timing(silence: Duration) -> WatchTiming {
    WatchTiming {
        timeout_seconds: 290,
        silence,
        max_pause: Duration::from_secs(15),
    }
}

fn watch_event(kind: &str, name: &str, uid: &str, rv: &str) -> String {
    watch_event_in(kind, "shop", name, uid, rv)
}

fn watch_event_in(kind: &str, namespace: &str, name: &str, uid: &str, rv: &str) -> String {
    json!({"type": kind, "object": {"kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": rv},
        "spec": {"containers": [{"name": "c"}], "nodeName": "worker-1"}}})
    .to_string()
        + "\n"
}

fn list_or(watch: Reply) -> impl Fn(&Seen, usize) -> Reply + Send + Sync + 'static {
    move |s, _| {
        if s.path.contains("watch=true") {
            watch.clone()
        } else {
            Reply::json(200, fixture("pods.json"))
        }
    }
}

#[tokio::test]
async fn the_api_server_source_lists_then_watches_this_node_only() {
    bounded(async {
        let events = [
            watch_event("ADDED", "new-pod", "new-uid", "48300"),
            watch_event_in("DELETED", "jobs", "batch-job-q7x1z", "d2c1b0a9-1111-2222-3333-444455556666", "48301"),
            json!({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "48400"}, "spec": {"containers": []}}}).to_string() + "\n",
        ]
        .concat();
        let fake = Fake::start(list_or(Reply::watch(vec![(Duration::ZERO, events)], false))).await;
        let source = apiserver(&fake);
        let store = source.store();
        assert!(store.snapshot().is_none(), "nothing before the first list");
        source.relist().await.unwrap();
        let t = timing(Duration::from_secs(10));
        assert_eq!(source.watch_once(&t).await.unwrap(), WatchEnd::Closed { lines: 3 });
        source.watch_once(&t).await.unwrap();
        assert_eq!(
            fake.calls(),
            [("GET".into(), LIST.into()), ("GET".into(), watch_path("48213", 290)), ("GET".into(), watch_path("48400", 290))]
        );
        let snap = store.snapshot().unwrap();
        let mut names: Vec<_> = snap.pods.iter().map(|p| p.name.as_str()).collect();
        names.sort();
        assert_eq!(names, ["kube-apiserver-worker-1", "new-pod", "web-7c9f8d6b5-x2x9q"]);
        assert!(fake.rejected().is_empty(), "{:?}", fake.rejected());
    })
    .await;
}

#[tokio::test]
async fn a_watch_split_across_frames_is_applied_as_it_arrives_and_silence_refreshes_nothing() {
    bounded(async {
        let event = watch_event("ADDED", "late-pod", "late-uid", "48500");
        let (head, tail) = event.split_at(event.len() / 2);
        let ms = Duration::from_millis;
        let fake = Fake::start(list_or(Reply::watch(
            vec![(ms(0), head.to_string()), (ms(150), tail.to_string())],
            true,
        )))
        .await;
        let source = apiserver(&fake);
        let store = source.store();
        source.relist().await.unwrap();
        let opened = SystemTime::now();
        let watching = tokio::spawn({
            let source = source.clone();
            async move { source.watch_once(&timing(Duration::from_secs(60))).await }
        });
        let found = loop {
            let snap = store.snapshot().unwrap();
            if let Some(p) = snap.find("shop", "late-pod") {
                break (p.uid.clone(), snap.observed_at);
            }
            tokio::time::sleep(ms(20)).await;
        };
        assert_eq!(
            found.0.as_deref(),
            Some("late-uid"),
            "half an event is held until its line ends"
        );
        assert!(
            found.1 >= opened + ms(100),
            "observed when the event's line ended"
        );
        tokio::time::sleep(ms(300)).await;
        assert_eq!(
            store.snapshot().unwrap().observed_at,
            found.1,
            "an open watch that says nothing vouches for nothing"
        );
        assert!(!watching.is_finished(), "the stream is still open");
        watching.abort();
    })
    .await;
}

#[tokio::test]
async fn an_expired_version_asks_for_a_new_list_as_an_event_or_a_410() {
    bounded(async {
        let expired = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410, "message": "too old resource version"}}).to_string() + "\n";
        let rows = [
            ("an ERROR event with 410", Reply::watch(vec![(Duration::ZERO, expired)], true)),
            ("a 410 answer to the watch", Reply::status(410, "Gone", "too old resource version: 48213 (48900)")),
        ];
        for (what, reply) in rows {
            let fake = Fake::start(list_or(reply)).await;
            let source = apiserver(&fake);
            source.relist().await.unwrap();
            let end = source.watch_once(&timing(Duration::from_secs(10))).await.unwrap();
            assert_eq!(end, WatchEnd::Relist { reason: RelistReason::Expired, lines: 0 }, "{what}");
        }
    })
    .await;
}

#[tokio::test]
async fn an_unreadable_watch_line_is_counted_and_lists_again_but_an_unreadable_pod_is_only_named() {
    bounded(async {
        let bad_pod = json!({"type": "MODIFIED", "object": {"kind": "Pod", "apiVersion": "v1",
            "metadata": {"namespace": "shop", "name": "web-7c9f8d6b5-x2x9q", "resourceVersion": "48600"},
            "spec": {"containers": 7}}}).to_string() + "\n";
        let rows = [
            ("not JSON", "{\"type\": \"ADDED\", \"object\": \n".to_string(), Some(RelistReason::Unreadable)),
            ("an unreadable pod", bad_pod, None),
        ];
        for (what, line, relist) in rows {
            let fake = Fake::start(list_or(Reply::watch(vec![(Duration::ZERO, line)], false))).await;
            let ctx = fake.context("api server", 1, "worker-1");
            let c = ctx.counters.clone();
            let source = ApiServerPodSource::new(ctx);
            source.relist().await.unwrap();
            let end = source.watch_once(&timing(Duration::from_secs(10))).await.unwrap();
            assert_eq!(c.watch_events_dropped.load(Ordering::Relaxed), 1, "{what}");
            match relist {
                Some(reason) => assert!(matches!(end, WatchEnd::Relist { reason: r, .. } if r == reason), "{what}: {end:?}"),
                None => {
                    assert_eq!(end, WatchEnd::Closed { lines: 1 }, "{what}: the watch goes on");
                    let snap = source.store().snapshot().unwrap();
                    assert!(snap.find("shop", "web-7c9f8d6b5-x2x9q").is_none(), "{what}: its old object is not kept as if current");
                    assert_eq!(snap.pods.len(), 2, "{what}: the others stay");
                    assert_eq!(problems(&snap), [("shop/web-7c9f8d6b5-x2x9q", ProblemKind::PodUnreadable)], "{what}");
                }
            }
        }
    })
    .await;
}

#[tokio::test]
async fn an_endless_line_a_slow_line_and_a_silent_watch_are_given_up() {
    bounded(async {
        let ms = Duration::from_millis;
        let rows: Vec<(&str, Reply, RelistReason)> = vec![
            // 8 MiB without a newline, in 64 KiB frames, then the stream stays open.
            (
                "an endless line",
                Reply::endless("x".repeat(64 << 10), Duration::ZERO),
                RelistReason::LineTooLarge,
            ),
            (
                "a line that never ends",
                Reply::watch(vec![(ms(0), "{\"type\": \"ADD".into())], true),
                RelistReason::LineTooSlow,
            ),
            (
                "a silent watch",
                Reply::watch(Vec::new(), true),
                RelistReason::Silent,
            ),
        ];
        for (what, reply, reason) in rows {
            let fake = Fake::start(list_or(reply)).await;
            let mut endpoint = fake.endpoint("api server");
            endpoint.timeout = ms(300);
            let ctx = node_agent_kube::api::Context {
                transport: Transport::new(endpoint).unwrap(),
                ..fake.context("api server", 1, "worker-1")
            };
            let c = ctx.counters.clone();
            let source = ApiServerPodSource::new(ctx);
            source.relist().await.unwrap();
            let listed_at = source.store().snapshot().unwrap().observed_at;
            let end = source.watch_once(&timing(ms(600))).await.unwrap();
            assert_eq!(end, WatchEnd::Relist { reason, lines: 0 }, "{what}");
            assert_eq!(c.watch_events_dropped.load(Ordering::Relaxed), 1, "{what}");
            let seen = source.store().snapshot().unwrap().observed_at;
            assert!(
                seen >= listed_at && seen < listed_at + ms(300),
                "{what}: only the watch's opening vouched for the data"
            );
        }
    })
    .await;
}

/// Requests in the first `window` of `run` against a watch answered with `watch`.
async fn requests_while_running(watch: Reply, window: Duration) -> (usize, u64) {
    let fake = Fake::start(list_or(watch)).await;
    let ctx = fake.context("api server", 1, "worker-1");
    let c = ctx.counters.clone();
    let running = tokio::spawn(
        ApiServerPodSource::new(ctx).run(WatchTiming::for_bound(Duration::from_secs(30))),
    );
    tokio::time::sleep(window).await;
    let paused = c.pod_watch_backoff_millis.load(Ordering::Relaxed);
    running.abort();
    (fake.calls().len(), paused)
}

#[tokio::test]
async fn relists_back_off_for_a_persistent_410_and_for_a_watch_that_closes_at_once() {
    bounded(async {
        // Pauses of 250 ms doubling, each drawn from half to one and a half of it: at most six
        // rounds (a list and a watch each) fit in 3 s, whatever the machine's speed. Without
        // backoff the same 3 s held about 135 requests.
        let window = Duration::from_secs(3);
        let rows = [
            (
                "a persistent 410",
                Reply::status(410, "Gone", "too old resource version"),
            ),
            (
                "a watch that answers 200 and closes at once",
                Reply::watch(Vec::new(), false),
            ),
        ];
        for (what, reply) in rows {
            let (requests, paused) = requests_while_running(reply, window).await;
            eprintln!("{what}: {requests} requests in {window:?}");
            assert!(
                (4..=12).contains(&requests),
                "{what}: {requests} requests in {window:?}"
            );
            assert!(
                paused >= 250,
                "{what}: the pause is on /metrics: {paused} ms"
            );
        }
        // A healthy watch (its events arrive, it closes at its timeout) never waits.
        let events = watch_event("ADDED", "new-pod", "new-uid", "48300");
        let ms = Duration::from_millis;
        let healthy = Reply::watch(vec![(ms(0), events), (ms(400), String::new())], false);
        let (requests, paused) = requests_while_running(healthy, Duration::from_secs(1)).await;
        assert!(
            requests >= 3,
            "a healthy watch is opened again at once: {requests}"
        );
        assert_eq!(paused, 0);
    })
    .await;
}

#[tokio::test]
async fn a_forbidden_list_is_a_typed_error() {
    bounded(async {
        let fake = Fake::start(|_, _| Reply::status(403, "Forbidden", "pods is forbidden: User \"system:serviceaccount:node-agent:node-agent\" cannot list resource \"pods\"")).await;
        let source = apiserver(&fake);
        let err = source.relist().await.unwrap_err();
        assert!(matches!(&err, ApiError::Forbidden { message, .. } if message.contains("cannot list")), "{err}");
        assert!(source.store().last_error().is_some_and(|e| e.contains("403 Forbidden")), "kept for readiness");
    })
    .await;
}
