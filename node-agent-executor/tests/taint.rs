//! The node's pressure taint through the one executor's status lane, against the strict fake
//! holding a real Node (`NodeStore`: resourceVersion, 409 on a stale one): it comes with
//! pressure, goes when the condition clears, leaves every other taint as it was, survives a
//! concurrent change, never appears in dry run, and is removed when the config turns it off.
//! (The lane writes the condition first; these tests look at the taint's requests, which go
//! to the Node itself rather than its `/status`.)

use std::sync::{Arc, Mutex};

use node_agent_executor::{Action, Executor, Outcome, Settings};
use node_agent_kube::{
    fake::{Fake, NodeStore, Reply, Seen, TEST_BOUND},
    taint::{TaintChange, TAINT_KEY},
    transport::ApiRequest,
};
use node_agent_policy::{Eligibility, NodeCondition};
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};

/// The taint's requests: reads and writes of the Node itself.
fn node_calls(calls: Vec<(String, String)>) -> Vec<(String, String)> {
    let path = format!("/api/v1/nodes/{NODE}");
    calls.into_iter().filter(|(_, p)| *p == path).collect()
}

const NODE: &str = "worker-1";

async fn bounded<T>(fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(TEST_BOUND, fut)
        .await
        .expect("test ran past its time bound")
}

/// Another controller's taints, one with `timeAdded` (NoExecute), which must come back as is.
fn others() -> Value {
    json!([
        {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": "2026-11-01T10:00:00Z"}
    ])
}

fn node(taints: Value) -> NodeStore {
    NodeStore::new(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE, "resourceVersion": "100", "labels": {"kubernetes.io/os": "linux"}},
        "spec": {"podCIDR": "10.0.1.0/24", "taints": taints},
        "status": {"conditions": []}
    }))
}

struct Running {
    fake: Fake,
    executor: Executor,
    outcomes: mpsc::UnboundedReceiver<Outcome>,
    settings: watch::Sender<Settings>,
}

async fn start(store: &NodeStore, taint: bool, dry_run: bool) -> Running {
    let fake = Fake::start({
        let store = store.clone();
        move |s: &Seen, _| {
            store.answer(s).unwrap_or_else(|| {
                // The condition's patch of the Node's status.
                if s.method == "PATCH" && s.path == format!("/api/v1/nodes/{NODE}/status") {
                    Reply::json(200, store.node().to_string())
                } else {
                    Reply::status(404, "NotFound", "not found")
                }
            })
        }
    })
    .await;
    let settings = Settings {
        cluster: Some(fake.context("api server", 2, NODE)),
        generation: 0,
        dry_run,
        pdb_policy: node_agent_kube::config::PdbPolicy::Respect,
        eligibility: Eligibility::default(),
        taint,
        runtime: None,
        heartbeat: node_agent_executor::CONDITION_HEARTBEAT,
        pending_records: None,
    };
    let (tx, rx) = watch::channel(settings);
    let (executor, outcomes) = Executor::spawn(rx);
    Running {
        fake,
        executor,
        outcomes,
        settings: tx,
    }
}

impl Running {
    async fn taint(
        &mut self,
        conditions: Vec<NodeCondition>,
    ) -> Result<Option<TaintChange>, String> {
        self.executor.submit(Action::Status { conditions });
        match self.outcomes.recv().await.unwrap() {
            Outcome::Status(report) => {
                assert!(report.condition.is_ok(), "{:?}", report.condition);
                report.taint.map_err(|e| e.to_string())
            }
            other => panic!("not a status outcome: {other:?}"),
        }
    }

    /// The taint's calls (the condition's go to the Node's `/status`, apart from its one read
    /// of the Node at the first report).
    fn calls(&self) -> Vec<(String, String)> {
        node_calls(self.fake.calls())
    }
}

fn ours(value: &str) -> Value {
    json!({"key": TAINT_KEY, "value": value, "effect": "NoSchedule"})
}

fn with(mut list: Value, extra: Value) -> Value {
    list.as_array_mut().unwrap().push(extra);
    list
}

#[tokio::test]
async fn the_taint_comes_with_pressure_and_goes_with_the_condition_others_untouched() {
    bounded(async {
        let store = node(others());
        let mut ex = start(&store, true, false).await;
        let before = store.node();
        let rows: Vec<(&str, Vec<NodeCondition>, TaintChange, Value)> = vec![
            (
                "pressure: added after the others",
                vec![NodeCondition::MemoryPressure],
                TaintChange::Added,
                with(others(), ours("MemoryPressure")),
            ),
            (
                "the same again: nothing sent",
                vec![NodeCondition::MemoryPressure],
                TaintChange::Unchanged,
                with(others(), ours("MemoryPressure")),
            ),
            (
                "another condition: the value follows",
                vec![NodeCondition::MemoryPressure, NodeCondition::DiskPressure],
                TaintChange::Updated,
                with(others(), ours("DiskPressure.MemoryPressure")),
            ),
            (
                "the condition cleared: removed",
                vec![],
                TaintChange::Removed,
                others(),
            ),
        ];
        for (what, conditions, change, taints) in rows {
            assert_eq!(ex.taint(conditions).await, Ok(Some(change)), "{what}");
            assert_eq!(store.node()["spec"]["taints"], taints, "{what}");
        }
        assert!(ex.fake.rejected().is_empty(), "{:?}", ex.fake.rejected());
        // Nothing but the taints changed.
        let mut after = store.node();
        after["spec"]["taints"] = before["spec"]["taints"].clone();
        after["metadata"]["resourceVersion"] = before["metadata"]["resourceVersion"].clone();
        assert_eq!(after, before);
        // Each change: a read, then a merge patch conditional on the version read.
        let path = format!("/api/v1/nodes/{NODE}");
        let patches: Vec<Seen> = ex
            .fake
            .seen()
            .into_iter()
            .filter(|s| s.method == "PATCH" && s.path == path)
            .collect();
        assert_eq!(patches.len(), 3);
        for p in &patches {
            assert_eq!(p.path, path);
            assert_eq!(
                p.content_type.as_deref(),
                Some("application/merge-patch+json")
            );
            assert_eq!(
                p.body.as_object().unwrap().len(),
                2,
                "metadata and spec only: {}",
                p.body
            );
            assert_eq!(
                p.body["spec"].as_object().unwrap().len(),
                1,
                "spec.taints only: {}",
                p.body
            );
        }
        assert_eq!(patches[0].body["metadata"]["resourceVersion"], "100");
        let gets = ex.calls().iter().filter(|(m, _)| m == "GET").count();
        assert_eq!(
            gets,
            1 + 4,
            "the condition's first read, then one per taint action: {:?}",
            ex.calls()
        );
    })
    .await;
}

#[tokio::test]
async fn a_concurrent_change_is_read_again_and_kept() {
    bounded(async {
        let store = node(others());
        // Between the agent's read and its patch, another controller adds a taint.
        let raced = Arc::new(Mutex::new(false));
        let fake = Fake::start({
            let (store, raced) = (store.clone(), raced.clone());
            move |s: &Seen, _| {
                if s.method == "PATCH" && !std::mem::replace(&mut *raced.lock().unwrap(), true) {
                    store.change(|n| {
                        n["spec"]["taints"]
                            .as_array_mut()
                            .unwrap()
                            .push(json!({"key": "maintenance", "effect": "NoSchedule"}));
                    });
                }
                store
                    .answer(s)
                    .unwrap_or_else(|| Reply::status(404, "NotFound", "not found"))
            }
        })
        .await;
        let ctx = fake.context("api server", 2, NODE);
        let want = node_agent_kube::taint::wanted(&[NodeCondition::PidPressure]);
        let change = node_agent_kube::taint::apply(&ctx, want.as_ref(), &|| false)
            .await
            .unwrap();
        assert_eq!(change, Some(TaintChange::Added));
        // Dry run set meanwhile: the node is read, nothing is written.
        let before = fake.calls().len();
        let none = node_agent_kube::taint::apply(&ctx, None, &|| true)
            .await
            .unwrap();
        assert_eq!(none, None);
        assert_eq!(
            fake.calls()[before..],
            [("GET".to_string(), format!("/api/v1/nodes/{NODE}"))]
        );
        let statuses: Vec<(String, String)> = fake.calls();
        assert_eq!(
            statuses.iter().filter(|(m, _)| m == "PATCH").count(),
            2,
            "the first patch met 409: {statuses:?}"
        );
        let taints = store.node()["spec"]["taints"].clone();
        let want = with(
            with(
                others(),
                json!({"key": "maintenance", "effect": "NoSchedule"}),
            ),
            ours("PIDPressure"),
        );
        assert_eq!(taints, want, "the other controller's taint survives");
    })
    .await;
}

#[tokio::test]
async fn dry_run_never_taints_and_sends_nothing() {
    bounded(async {
        let store = node(others());
        let mut ex = start(&store, true, true).await;
        assert_eq!(
            ex.taint(vec![NodeCondition::MemoryPressure]).await,
            Ok(None)
        );
        assert_eq!(
            ex.calls(),
            [("GET".to_string(), format!("/api/v1/nodes/{NODE}"))],
            "only the condition's first read of the node"
        );
        assert!(ex.fake.calls().iter().all(|(m, _)| m == "GET"));
        // Dry run set by a reload holds for the next action.
        ex.settings.send_modify(|s| s.dry_run = false);
        assert_eq!(
            ex.taint(vec![NodeCondition::MemoryPressure]).await,
            Ok(Some(TaintChange::Added))
        );
        ex.settings.send_modify(|s| s.dry_run = true);
        assert_eq!(ex.taint(vec![]).await, Ok(None));
        assert_eq!(
            store.node()["spec"]["taints"],
            with(others(), ours("MemoryPressure")),
            "dry run removes nothing either"
        );
    })
    .await;
}

#[tokio::test]
async fn turned_off_it_is_never_added_and_a_leftover_one_is_removed() {
    bounded(async {
        let store = node(others());
        let mut ex = start(&store, false, false).await;
        assert_eq!(
            ex.taint(vec![NodeCondition::MemoryPressure]).await,
            Ok(Some(TaintChange::Unchanged))
        );
        assert_eq!(store.node()["spec"]["taints"], others());
        assert!(
            ex.calls().iter().all(|(m, _)| m == "GET"),
            "{:?}",
            ex.calls()
        );
        // On by reload: added with the next report; off again: removed.
        ex.settings.send_modify(|s| s.taint = true);
        assert_eq!(
            ex.taint(vec![NodeCondition::MemoryPressure]).await,
            Ok(Some(TaintChange::Added))
        );
        ex.settings.send_modify(|s| s.taint = false);
        assert_eq!(
            ex.taint(vec![NodeCondition::MemoryPressure]).await,
            Ok(Some(TaintChange::Removed))
        );
        assert_eq!(store.node()["spec"]["taints"], others());
    })
    .await;
}

#[tokio::test]
async fn the_strict_fake_refuses_malformed_node_patches() {
    bounded(async {
        let fake = Fake::start(|_, _| Reply::json(200, "{}")).await;
        let transport = fake.transport("api server");
        let path = format!("/api/v1/nodes/{NODE}");
        let patch = |media: &'static str, body: Value| ApiRequest::with_json(http::Method::PATCH, path.clone(), media, &body);
        let merge = "application/merge-patch+json";
        let rows: Vec<(&str, ApiRequest, u16)> = vec![
            ("an unknown effect", patch(merge, json!({"spec": {"taints": [{"key": TAINT_KEY, "effect": "NoScheduling"}]}})), 422),
            ("a taint without a key", patch(merge, json!({"spec": {"taints": [{"effect": "NoSchedule"}]}})), 422),
            ("a value that is no label value", patch(merge, json!({"spec": {"taints": [{"key": TAINT_KEY, "effect": "NoSchedule", "value": "Memory Pressure"}]}})), 422),
            ("the same key and effect twice", patch(merge, json!({"spec": {"taints": [{"key": "a", "effect": "NoSchedule"}, {"key": "a", "effect": "NoSchedule"}]}})), 422),
            ("taints that are no list", patch(merge, json!({"spec": {"taints": {"key": "a"}}})), 422),
            ("a resourceVersion that is a number", patch(merge, json!({"metadata": {"resourceVersion": 100}})), 400),
            ("a merge patch that is a list", patch(merge, json!([])), 400),
            ("a JSON patch with an unknown op", patch("application/json-patch+json", json!([{"op": "set", "path": "/spec/taints", "value": []}])), 400),
            ("a JSON patch test without a value", patch("application/json-patch+json", json!([{"op": "test", "path": "/metadata/resourceVersion"}])), 400),
            ("a JSON patch adding a bad taint", patch("application/json-patch+json", json!([{"op": "add", "path": "/spec/taints", "value": [{"key": "a", "effect": "Never"}]}])), 422),
            ("a patch sent as plain JSON", patch("application/json", json!({"spec": {}})), 415),
        ];
        let count = rows.len();
        for (what, req, code) in rows {
            let resp = transport.send(&req).await.unwrap();
            assert_eq!(resp.status.as_u16(), code, "{what}: {}", resp.excerpt());
        }
        assert_eq!(fake.rejected().len(), count);
        // A well-formed taint patch goes through to the responder.
        let ok = patch(merge, json!({"metadata": {"resourceVersion": "7"}, "spec": {"taints": [{"key": TAINT_KEY, "effect": "NoSchedule", "value": "MemoryPressure"}]}}));
        assert_eq!(transport.send(&ok).await.unwrap().status.as_u16(), 200);
    })
    .await;
}

/// The condition's status in the last patch of the Node's status.
fn last_condition(fake: &Fake) -> Value {
    let status = format!("/api/v1/nodes/{NODE}/status");
    let seen = fake.seen();
    let patch = seen
        .iter()
        .rev()
        .find(|s| s.method == "PATCH" && s.path == status)
        .expect("a condition was written");
    patch.body["status"]["conditions"][0].clone()
}

/// An agent that stops leaves the node as it found it: its taint removed, its condition
/// `Unknown` saying it stopped (a pod scheduler and an operator both see nobody watches). In dry
/// run it writes nothing, as always.
#[tokio::test]
async fn a_stopping_agent_removes_its_taint_and_marks_its_condition_unknown() {
    bounded(async {
        let store = node(others());
        let mut ex = start(&store, true, false).await;
        ex.taint(vec![NodeCondition::MemoryPressure]).await.unwrap();
        assert_eq!(
            store.node()["spec"]["taints"],
            with(others(), ours("MemoryPressure"))
        );
        let report = ex
            .executor
            .stop(&mut ex.outcomes, std::time::Duration::from_secs(5))
            .await
            .expect("written within the deadline");
        assert!(report.stopped && report.condition.is_ok(), "{report:?}");
        assert!(
            matches!(report.taint, Ok(Some(TaintChange::Removed))),
            "{report:?}"
        );
        assert_eq!(
            store.node()["spec"]["taints"],
            others(),
            "the others' taints stay"
        );
        let condition = last_condition(&ex.fake);
        assert_eq!(
            (condition["status"].as_str(), condition["reason"].as_str()),
            (Some("Unknown"), Some(node_agent_executor::STOPPED_REASON))
        );

        // Dry run: nothing written on the way out either.
        let store = node(with(others(), ours("MemoryPressure")));
        let mut ex = start(&store, true, true).await;
        let report = ex
            .executor
            .stop(&mut ex.outcomes, std::time::Duration::from_secs(5))
            .await
            .expect("answered at once");
        assert!(matches!(report.taint, Ok(None)), "{report:?}");
        assert!(
            ex.fake.calls().iter().all(|(m, _)| m == "GET"),
            "{:?}",
            ex.fake.calls()
        );
    })
    .await;
}

/// The condition is written again, unchanged but for its heartbeat, every heartbeat period: a
/// heartbeat that stops moving means the agent is gone.
#[tokio::test]
async fn the_condition_heartbeat_moves_while_the_agent_runs() {
    bounded(async {
        let store = node(others());
        let mut ex = start(&store, true, false).await;
        ex.settings
            .send_modify(|s| s.heartbeat = std::time::Duration::from_millis(1100));
        ex.taint(vec![]).await.unwrap();
        let first = last_condition(&ex.fake);
        // The next outcome is the heartbeat's: the condition only.
        let Some(Outcome::Status(beat)) = ex.outcomes.recv().await else {
            panic!("a heartbeat")
        };
        assert!(
            beat.condition.is_ok() && matches!(beat.taint, Ok(None)),
            "{beat:?}"
        );
        let second = last_condition(&ex.fake);
        assert_eq!(first["status"], second["status"]);
        assert_eq!(first["lastTransitionTime"], second["lastTransitionTime"]);
        assert_ne!(
            first["lastHeartbeatTime"], second["lastHeartbeatTime"],
            "the heartbeat moved (RFC 3339 seconds: the period is over a second)"
        );
    })
    .await;
}

/// After an outage (the API server answering the condition's write seconds late), the pressure
/// that was being reported has ended: the taint it wanted is never added, only for the next
/// wish to remove it 90 ms later (seen on the real cluster after an API server outage).
#[tokio::test]
async fn a_wish_superseded_while_its_condition_is_written_never_adds_the_taint() {
    bounded(async {
        let store = node(others());
        let slow_first = Arc::new(Mutex::new(true));
        let fake = Fake::start({
            let store = store.clone();
            let slow_first = slow_first.clone();
            move |s: &Seen, _| {
                store.answer(s).unwrap_or_else(|| {
                    if s.method == "PATCH" && s.path == format!("/api/v1/nodes/{NODE}/status") {
                        let reply = Reply::json(200, store.node().to_string());
                        if std::mem::take(&mut *slow_first.lock().unwrap()) {
                            reply.slow(std::time::Duration::from_millis(800))
                        } else {
                            reply
                        }
                    } else {
                        Reply::status(404, "NotFound", "not found")
                    }
                })
            }
        })
        .await;
        let settings = Settings {
            cluster: Some(fake.context("api server", 2, NODE)),
            generation: 0,
            dry_run: false,
            pdb_policy: node_agent_kube::config::PdbPolicy::Respect,
            eligibility: Eligibility::default(),
            taint: true,
            runtime: None,
            heartbeat: node_agent_executor::CONDITION_HEARTBEAT,
            pending_records: None,
        };
        let (_settings, rx) = watch::channel(settings);
        let (executor, mut outcomes) = Executor::spawn(rx);
        executor.submit(Action::Status {
            conditions: vec![NodeCondition::MemoryPressure],
        });
        // The pressure's condition is on its way (slowly); the pressure ends meanwhile.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        executor.submit(Action::Status { conditions: vec![] });
        let mut reports = Vec::new();
        while reports.len() < 2 {
            match outcomes.recv().await.unwrap() {
                Outcome::Status(report) => reports.push(report),
                other => panic!("not a status outcome: {other:?}"),
            }
        }
        assert!(reports[0].pressure && reports[0].condition.is_ok());
        assert!(
            matches!(reports[0].taint, Ok(None)),
            "the superseded wish's taint is left to the next: {:?}",
            reports[0].taint
        );
        assert!(!reports[1].pressure);
        let writes: Vec<_> = node_calls(fake.calls())
            .into_iter()
            .filter(|(m, _)| m != "GET")
            .collect();
        assert!(writes.is_empty(), "the taint was never written: {writes:?}");
        assert_eq!(
            store.node()["spec"]["taints"],
            others(),
            "others untouched, ours never added"
        );
    })
    .await
}
