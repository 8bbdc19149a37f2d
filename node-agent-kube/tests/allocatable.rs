//! The node's allocatable memory read from its Node object, against the strict fake holding a
//! real Node: exactly one `GET /api/v1/nodes/<name>` per read, the figure in bytes, a change
//! seen at the next read, and a missing field or a refused read each named for what it is.

use node_agent_kube::{
    allocatable::{self, AllocatableError},
    fake::{Fake, NodeStore, Reply, Seen, TEST_BOUND},
};
use serde_json::json;

const NODE: &str = "worker-1";

async fn bounded<T>(fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(TEST_BOUND, fut)
        .await
        .expect("test ran past its time bound")
}

fn chain(e: &dyn std::error::Error) -> String {
    std::iter::successors(Some(e), |e| e.source())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}

async fn serving(store: &NodeStore) -> Fake {
    let store = store.clone();
    Fake::start(move |s: &Seen, _| {
        store
            .answer(s)
            .unwrap_or_else(|| Reply::status(404, "NotFound", "not found"))
    })
    .await
}

#[tokio::test]
async fn the_nodes_allocatable_memory_is_read_with_one_get_and_follows_its_changes() {
    let store = NodeStore::new(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE},
        "status": {"capacity": {"memory": "4030388Ki"},
                   "allocatable": {"cpu": "2", "memory": "3825588Ki", "pods": "110"},
                   "conditions": []}
    }));
    let fake = serving(&store).await;
    let ctx = fake.context("api server", 1, NODE);
    assert_eq!(
        bounded(allocatable::read(&ctx)).await.unwrap(),
        3825588 * 1024
    );
    store.change(|n| n["status"]["allocatable"]["memory"] = json!("2Gi"));
    assert_eq!(bounded(allocatable::read(&ctx)).await.unwrap(), 2 << 30);
    assert_eq!(
        fake.calls(),
        vec![
            ("GET".to_string(), format!("/api/v1/nodes/{NODE}")),
            ("GET".to_string(), format!("/api/v1/nodes/{NODE}"))
        ],
        "one plain GET per read, nothing else"
    );
    assert!(fake.rejected().is_empty(), "{:?}", fake.rejected());

    store.change(|n| {
        n["status"]["allocatable"]
            .as_object_mut()
            .unwrap()
            .remove("memory");
    });
    let absent = bounded(allocatable::read(&ctx)).await.unwrap_err();
    assert!(!absent.is_unreachable(), "the Node answered");
    assert!(
        chain(&absent).contains("node worker-1: status.allocatable.memory is absent"),
        "{absent}"
    );
}

#[tokio::test]
async fn a_refused_read_is_an_api_error_naming_the_field_not_a_figure() {
    let fake = Fake::start(|_: &Seen, _| {
        Reply::status(
            403,
            "Forbidden",
            "nodes \"worker-1\" is forbidden: User \"system:serviceaccount:node-agent:node-agent\" cannot get resource \"nodes\"",
        )
    })
    .await;
    let ctx = fake.context("api server", 1, NODE);
    let err = bounded(allocatable::read(&ctx)).await.unwrap_err();
    assert!(matches!(err, AllocatableError::Api { .. }), "{err:?}");
    assert!(err.is_unreachable());
    let text = chain(&err);
    assert!(
        text.contains("reading node worker-1's status.allocatable.memory")
            && text.contains("403 Forbidden (RBAC does not grant this)"),
        "{text}"
    );
}
