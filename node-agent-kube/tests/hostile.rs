//! What a hostile or broken endpoint may send, against the strict fake: names that would
//! smuggle a query or a path into a URL, and answers too large or too slow to read. Every
//! URL is asserted as sent; every oversized answer is refused at its cap.

use std::time::{Duration, SystemTime};

use node_agent_kube::{
    allocatable,
    api::{ApiError, Context},
    condition::{ConditionStatus, NodeConditionReporter},
    config::PdbPolicy,
    events,
    evict::{self, EvictionResult},
    fake::{fixture, Fake, Reply, Seen, TEST_BOUND},
    pods::{apiserver::ApiServerPodSource, kubelet::KubeletClient},
    taint,
    transport::{Transport, TransportError, POD_LIST_CAP, SUMMARY_CAP},
};
use node_agent_policy::{Eviction, NodeCondition, Quantity, Resource, Signal};
use serde_json::json;

async fn bounded<T>(fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(TEST_BOUND, fut)
        .await
        .expect("test ran past its time bound")
}

/// A pod name a lying kubelet could report, and what it must become in a path.
const HOSTILE_POD: &str = "hog?dryRun=All&x=";
const HOSTILE_POD_IN_PATH: &str = "hog%3FdryRun%3DAll%26x%3D";
/// A node name with a query and a path in it.
const HOSTILE_NODE: &str = "n1?watch=true/../x";
const HOSTILE_NODE_IN_PATH: &str = "n1%3Fwatch%3Dtrue%2F..%2Fx";

fn hostile_eviction(hard: bool) -> Eviction {
    Eviction {
        namespace: "shop".into(),
        name: HOSTILE_POD.into(),
        uid: Some("u1".into()),
        signal: Signal::MemoryAvailable.into(),
        resource: Resource::Memory,
        hard,
        grace_period_seconds: 0,
        message: "m".into(),
        offending_containers: Vec::new(),
        threshold_quantity: "100Mi".parse::<Quantity>().unwrap(),
        available: "50Mi".parse::<Quantity>().unwrap(),
        early: false,
    }
}

/// 2xx for everything the agent writes, a Node for node reads, a disruption budget's 429 for
/// evictions when `pdb` says.
fn answers(pdb: bool) -> impl Fn(&Seen, usize) -> Reply + Send + Sync + 'static {
    move |s, _| {
        match (s.method.as_str(), s.path.split('?').next().unwrap_or("")) {
        ("POST", p) if p.ends_with("/eviction") && pdb => Reply::pdb_blocked("web"),
        ("POST", p) if p.ends_with("/eviction") => Reply::json(201, "{}"),
        ("POST", _) => Reply::json(201, s.body.to_string()),
        ("GET", p) if p.starts_with("/api/v1/nodes/") => Reply::json(
            200,
            json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": HOSTILE_NODE, "resourceVersion": "3"},
                "status": {"allocatable": {"memory": "1Gi"}, "conditions": []}})
            .to_string(),
        ),
        ("GET", _) => Reply::json(200, fixture("pods.json")),
        _ => Reply::json(200, "{}"),
    }
    }
}

#[tokio::test]
async fn every_name_in_every_url_stays_a_name() {
    bounded(async {
        let never = || false;
        // The eviction, then under override for a hard threshold the delete and the status
        // patch of the kubelet's own sequence.
        for pdb in [false, true] {
            let fake = Fake::start(answers(pdb)).await;
            let ctx = fake.context("api server", 1, "worker-1");
            let attempt = evict::evict(
                &ctx,
                &hostile_eviction(true),
                PdbPolicy::Override,
                &never,
                SystemTime::now(),
            )
            .await;
            let want = if pdb {
                EvictionResult::PdbOverridden
            } else {
                EvictionResult::Evicted
            };
            assert_eq!(attempt.result, want, "{:?}", attempt.detail);
            let pod = format!("/api/v1/namespaces/shop/pods/{HOSTILE_POD_IN_PATH}");
            let mut expected = vec![("POST".to_string(), format!("{pod}/eviction"))];
            if pdb {
                expected.push(("DELETE".into(), pod.clone()));
                expected.push(("PATCH".into(), format!("{pod}/status")));
            }
            assert_eq!(fake.calls(), expected, "no query smuggled in (pdb {pdb})");
            assert!(
                fake.rejected().is_empty(),
                "the server reads the name back: {:?}",
                fake.rejected()
            );
        }

        // An event in a namespace that is not one.
        let fake = Fake::start(answers(false)).await;
        let ctx = fake.context("api server", 1, "worker-1");
        let mut decision = hostile_eviction(false);
        decision.namespace = "shop/../kube-system?x".into();
        events::post(
            &ctx,
            &events::build_pod_evicted(&decision, "worker-1", SystemTime::now()),
        )
        .await
        .unwrap();
        assert_eq!(
            fake.calls(),
            [(
                "POST".to_string(),
                "/apis/events.k8s.io/v1/namespaces/shop%2F..%2Fkube-system%3Fx/events".to_string()
            )]
        );
        assert!(fake.rejected().is_empty(), "{:?}", fake.rejected());

        // Every path that names the node: its allocatable memory, its taint, its condition,
        // and the API server pod source's field selector and watch.
        let fake = Fake::start(answers(false)).await;
        let ctx = fake.context("api server", 1, HOSTILE_NODE);
        allocatable::read(&ctx).await.unwrap();
        let want = taint::wanted(&[NodeCondition::MemoryPressure]);
        taint::apply(&ctx, want.as_ref(), &never).await.unwrap();
        NodeConditionReporter::new()
            .report(
                &ctx,
                ConditionStatus::True,
                "MemoryPressure",
                "m",
                SystemTime::now(),
                false,
            )
            .await
            .unwrap();
        ApiServerPodSource::new(ctx.clone()).relist().await.unwrap();
        let node = format!("/api/v1/nodes/{HOSTILE_NODE_IN_PATH}");
        let list = format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{HOSTILE_NODE_IN_PATH}");
        let paths: Vec<String> = fake
            .calls()
            .into_iter()
            .map(|(m, p)| format!("{m} {p}"))
            .collect();
        assert_eq!(
            paths,
            [
                format!("GET {node}"),
                format!("GET {node}"),
                format!("PATCH {node}"),
                format!("GET {node}"),
                format!("PATCH {node}/status"),
                format!("GET {list}"),
            ]
        );
        assert!(fake.rejected().is_empty(), "{:?}", fake.rejected());
    })
    .await;
}

fn kubelet_with(fake: &Fake, timeout: Duration) -> KubeletClient {
    let mut endpoint = fake.endpoint("kubelet");
    endpoint.timeout = timeout;
    KubeletClient::new(Context {
        transport: Transport::new(endpoint).unwrap(),
        ..fake.context("kubelet", 3, "worker-1")
    })
}

fn too_large(e: &ApiError) -> Option<(usize, Option<u64>)> {
    match e {
        ApiError::Transport(TransportError::TooLarge { cap, declared, .. }) => {
            Some((*cap, *declared))
        }
        _ => None,
    }
}

#[tokio::test]
async fn an_answer_past_its_cap_is_refused_without_reading_it_all_nor_trying_again() {
    bounded(async {
        // 40 MiB of a valid pod list, declared in Content-Length: refused before its body.
        let item = json!({"metadata": {"namespace": "shop", "name": "p", "uid": "u"}, "spec": {"containers": []}}).to_string();
        let mut big = String::from("{\"kind\": \"PodList\", \"apiVersion\": \"v1\", \"metadata\": {}, \"items\": [");
        while big.len() < 40 << 20 {
            big.push_str(&item);
            big.push(',');
        }
        big.push_str(&item);
        big.push_str("]}");
        let declared = big.len() as u64;
        let fake = Fake::start(move |_, _| Reply::json(200, big.clone())).await;
        let err = kubelet_with(&fake, Duration::from_secs(5)).pods().await.unwrap_err();
        assert_eq!(too_large(&err), Some((POD_LIST_CAP, Some(declared))), "{err}");
        assert_eq!(fake.calls().len(), 1, "a refused size is not tried again");

        // An endless summary, chunked (no length declared): refused at its cap.
        let fake = Fake::start(|_, _| Reply::endless("[".repeat(256 << 10), Duration::ZERO)).await;
        let err = kubelet_with(&fake, Duration::from_secs(10)).summary().await.unwrap_err();
        assert_eq!(too_large(&err), Some((SUMMARY_CAP, None)), "{err}");
        assert!(err.to_string().contains(&format!("larger than its {SUMMARY_CAP}-byte cap")), "{err}");
    })
    .await;
}

#[tokio::test]
async fn an_answer_that_trickles_is_cut_at_the_request_timeout() {
    bounded(async {
        let fake = Fake::start(|_, _| Reply::endless("{".into(), Duration::from_millis(50))).await;
        let started = std::time::Instant::now();
        let err = kubelet_with(&fake, Duration::from_millis(400))
            .pods()
            .await
            .unwrap_err();
        assert!(
            matches!(err, ApiError::Transport(TransportError::Timeout { .. })),
            "{err}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "three tries of 400 ms and their pauses"
        );
    })
    .await;
}

/// An eviction the API server accepted (201) with an answer past the 4 MiB cap, declared or
/// chunked: the status decides, so the pod is reported evicted; the body past the cap is not
/// read. The Status message of a refusal is cut for the log line it ends up in.
#[tokio::test]
async fn an_eviction_answer_past_its_cap_is_decided_by_its_status() {
    bounded(async {
        let never = || false;
        let decision = Eviction {
            name: "web".into(),
            ..hostile_eviction(true)
        };
        let padding = " ".repeat(5 << 20);
        let rows: Vec<(&str, Reply, EvictionResult)> = vec![
            (
                "201, 5 MiB declared",
                Reply::json(201, format!("{{\"kind\": \"Status\"{padding}}}")),
                EvictionResult::Evicted,
            ),
            (
                "201, endless and chunked",
                Reply {
                    status: 201,
                    ..Reply::endless(" ".repeat(256 << 10), Duration::ZERO)
                },
                EvictionResult::Evicted,
            ),
            (
                "403 with a 5 MiB message",
                Reply::status(403, "Forbidden", &"no ".repeat((5 << 20) / 3)),
                EvictionResult::Refused,
            ),
        ];
        for (what, reply, want) in rows {
            let fake = Fake::start(move |_, _| reply.clone()).await;
            let ctx = fake.context("api server", 1, "worker-1");
            let attempt = evict::evict(
                &ctx,
                &decision,
                PdbPolicy::Respect,
                &never,
                SystemTime::now(),
            )
            .await;
            assert_eq!(
                attempt.result,
                want,
                "{what}: {:?}",
                attempt.detail.as_deref().map(|d| &d[..d.len().min(300)])
            );
            let detail = attempt.detail.unwrap_or_default();
            assert!(
                detail.len() <= 1024,
                "{what}: a detail of {} bytes",
                detail.len()
            );
            assert_eq!(fake.calls().len(), 1, "{what}: asked once");
        }
    })
    .await;
}
