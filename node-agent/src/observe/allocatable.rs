//! What `allocatableMemory.available` is measured against: `allocatableMemory` when it
//! is set (the config wins), else in Kubernetes mode what the kubelet measures against: its
//! pods cgroup's own memory limit (capacity less the reservations; the Node's
//! `status.allocatable.memory` is that less the hard eviction threshold too), with the Node's
//! figure standing in while that cgroup has no limit; else (standalone) nothing: the signal is
//! not observed.
//!
//! The Node is read by a task of its own every `resyncInterval` (a `GET` of the agent's Node;
//! the kubelet changes the figure only when it restarts with other reservations, so a watch of
//! every Node status update would wake the agent for nothing). Data flows one way: the task's
//! latest answer is an input of the loop, which takes a new figure at once — the kubepods kernel
//! line re-armed and the node decided again, as after a reload. An absent or unreadable field
//! makes the signal unknown, naming the field (never 0); an API that cannot be reached keeps
//! the last figure read.

use std::{sync::Arc, time::Duration};

use node_agent_kube::{
    allocatable::{self, FIELD},
    api::Context,
};
use tokio::{sync::watch, task::JoinHandle};

use crate::observe::feed::Cluster;
use crate::telemetry::{KubeOperation, Metrics};

/// Allocatable memory as a reading of the node takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allocatable {
    /// Not observed: standalone without `allocatableMemory`.
    NotObserved,
    /// The config's figure, in bytes: measured against as it is.
    Bytes(i64),
    /// The Node's `status.allocatable.memory`, in bytes. A reading measures against the pods
    /// cgroup's own limit, as the kubelet does, and against this only while it has none.
    Node(i64),
    /// The Node is to be read and has not answered yet (a start, a reconnect): a reading
    /// measures against the pods cgroup's own limit already, and observes nothing while that
    /// cgroup has none. A restarted agent so decides under the pressure it left, from its first
    /// evaluation.
    NodeNotRead,
    /// The Node cannot be read, or its figure is absent or malformed: why, naming the field. A
    /// reading measures against the pods cgroup's own limit still, as it needs nothing of the
    /// Node, and the signal is unknown where that cgroup has none.
    Unknown(String),
}

/// Where the figure comes from (said in the log once, and again when a reload changes it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    Config,
    Node,
}

/// The Node reads, while they run, and what the log last said.
#[derive(Default)]
pub struct AllocatableFeed {
    reader: Option<Reader>,
    said: Option<Origin>,
}

/// The task reading the Node, with the connection and interval it was started with.
struct Reader {
    updates: watch::Receiver<Allocatable>,
    every: Duration,
    /// The executor settings' generation: it changes when a reload reconnects to the cluster.
    generation: u64,
    task: JoinHandle<()>,
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Reader {
    /// Reads the Node now and then every `every`; the channel starts at `current`.
    fn spawn(
        api: Context,
        every: Duration,
        generation: u64,
        current: Allocatable,
        metrics: Arc<Metrics>,
    ) -> Self {
        let (tx, updates) = watch::channel(current);
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let next = match allocatable::read(&api).await {
                    Ok(bytes) => Allocatable::Node(bytes),
                    Err(e) => {
                        if e.is_unreachable() {
                            // Counted by the client's backoff; the cluster connection's state
                            // (`observe::feed`) logs the outage once and names it on /readyz.
                            metrics.kube_error(KubeOperation::NodeAllocatable);
                            if matches!(*tx.borrow(), Allocatable::Node(_)) {
                                continue;
                            }
                        }
                        Allocatable::Unknown(crate::error_chain(&e))
                    }
                };
                tx.send_if_modified(|current| {
                    let changed = *current != next;
                    *current = next;
                    changed
                });
                if tx.is_closed() {
                    return;
                }
            }
        });
        Self {
            updates,
            every,
            generation,
            task,
        }
    }
}

impl AllocatableFeed {
    /// At start and after each reload: the source the config asks for (`configured`, else the
    /// Node through `cluster`, read `every` so long), the Node reader started, restarted (a new
    /// connection or interval) or stopped; `figure`, the node's, set to what the next reading
    /// uses (a reader that is restarted keeps it until its first answer). Returns whether it
    /// changed: the kernel's lines are then written anew.
    pub(crate) fn sync(
        &mut self,
        configured: Option<i64>,
        cluster: Option<&Cluster>,
        every: Duration,
        generation: u64,
        figure: &mut Allocatable,
        metrics: &Arc<Metrics>,
    ) -> bool {
        let (from, next) = match (configured, cluster) {
            (Some(bytes), _) => {
                self.reader = None;
                (Some(Origin::Config), Allocatable::Bytes(bytes))
            }
            (None, Some(cluster)) => {
                let kept = self
                    .reader
                    .as_ref()
                    .is_some_and(|r| r.every == every && r.generation == generation);
                if !kept {
                    let current = match self.said {
                        Some(Origin::Node) => figure.clone(),
                        _ => Allocatable::NodeNotRead,
                    };
                    self.reader = Some(Reader::spawn(
                        cluster.api.clone(),
                        every,
                        generation,
                        current,
                        metrics.clone(),
                    ));
                }
                let reader = self.reader.as_mut().expect("started above");
                (
                    Some(Origin::Node),
                    reader.updates.borrow_and_update().clone(),
                )
            }
            (None, None) => {
                self.reader = None;
                (None, Allocatable::NotObserved)
            }
        };
        if from != self.said {
            say(from, configured, cluster.is_some(), every);
        }
        self.said = from;
        if next == *figure {
            return false;
        }
        *figure = next;
        true
    }

    /// Resolves when the Node reader has a new figure; never while there is no reader.
    pub(crate) async fn changed(&mut self) {
        let Some(reader) = self.reader.as_mut() else {
            return std::future::pending().await;
        };
        if reader.updates.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// The Node reader's newest figure, once [`Self::changed`] said there is one, taken into
    /// `figure` (the node's) when it differs: then the figure it replaced.
    pub(crate) fn take_change(&mut self, figure: &mut Allocatable) -> Option<Allocatable> {
        let next = self.reader.as_mut()?.updates.borrow_and_update().clone();
        if next == *figure {
            return None;
        }
        Some(std::mem::replace(figure, next))
    }
}

fn say(from: Option<Origin>, configured: Option<i64>, kubernetes: bool, every: Duration) {
    match (from, configured) {
        (Some(Origin::Config), Some(bytes)) if kubernetes => tracing::info!(bytes,
            "allocatableMemory.available is measured against the config's allocatableMemory: the config wins, the Node's {FIELD} is not read"),
        (Some(Origin::Config), Some(bytes)) => tracing::info!(bytes,
            "allocatableMemory.available is measured against the config's allocatableMemory"),
        (Some(Origin::Node), _) => tracing::info!(
            ?every,
            "allocatableMemory.available is measured against the pods cgroup's memory limit, as the kubelet measures it, and against the Node's {FIELD} while that cgroup has none (allocatableMemory is not set; the Node read every resyncInterval)"),
        _ => tracing::info!(
            "allocatableMemory.available is not observed: standalone without allocatableMemory"),
    }
}

/// Says how the Node's figure changed. An unknown one is said here, as the reading may not
/// need it; where it does (no limit on the pods cgroup), the evaluation says the signal's source
/// unreadable with the reason too.
pub(crate) fn say_changed(was: &Allocatable, next: &Allocatable) {
    match (was, next) {
        (_, Allocatable::Unknown(why)) => tracing::warn!(
            reason = why.as_str(),
            "the Node's {FIELD} is unknown: allocatableMemory.available is measured against the pods cgroup's memory limit, and is unknown where that cgroup has none"),
        (Allocatable::Node(was), Allocatable::Node(bytes)) => tracing::info!(was, bytes,
            "the Node's {FIELD} changed: where the pods cgroup has no memory limit, allocatableMemory.available is measured against it from now; the kernel line on kubepods re-armed"),
        (_, Allocatable::Node(bytes)) => tracing::info!(bytes,
            "the Node's {FIELD} read: allocatableMemory.available is measured against the pods cgroup's memory limit (as before the Node answered), or against this where that cgroup has none, with a kernel line on kubepods"),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    };

    use node_agent_kube::fake::{Fake, NodeStore, Reply, Seen, TEST_BOUND};
    use serde_json::json;

    use super::*;

    /// The reader's next figure, within the test's bound.
    async fn next(reader: &mut Reader) -> Allocatable {
        tokio::time::timeout(TEST_BOUND, reader.updates.changed())
            .await
            .expect("a new figure within the bound")
            .expect("the reader runs");
        reader.updates.borrow_and_update().clone()
    }

    #[tokio::test]
    async fn the_reader_follows_the_node_keeps_its_figure_through_an_outage_and_names_a_missing_field(
    ) {
        let store = NodeStore::new(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1"}, "status": {"allocatable": {"memory": "1Gi"}}}));
        let down = Arc::new(AtomicBool::new(false));
        let fake = Fake::start({
            let (store, down) = (store.clone(), down.clone());
            move |s: &Seen, _| {
                if down.load(Ordering::SeqCst) {
                    return Reply::status(503, "ServiceUnavailable", "etcd is down");
                }
                store
                    .answer(s)
                    .unwrap_or_else(|| Reply::status(404, "NotFound", "not found"))
            }
        })
        .await;
        let metrics = Metrics::new();
        let mut reader = Reader::spawn(
            fake.context("api server", 1, "n1"),
            Duration::from_millis(20),
            0,
            Allocatable::NodeNotRead,
            metrics.clone(),
        );
        assert_eq!(next(&mut reader).await, Allocatable::Node(1 << 30));

        // An outage: the figure read stays (the kubelet changes it only when it restarts), and
        // each failed read is counted.
        down.store(true, Ordering::SeqCst);
        let before = fake.calls().len();
        tokio::time::timeout(TEST_BOUND, async {
            while fake.calls().len() < before + 3 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("reads go on during the outage");
        assert_eq!(*reader.updates.borrow(), Allocatable::Node(1 << 30));
        assert!(
            metrics
                .encode()
                .contains("node_agent_kube_errors_total{operation=\"node allocatable\"}"),
            "counted"
        );

        down.store(false, Ordering::SeqCst);
        store.change(|n| n["status"]["allocatable"]["memory"] = json!("512Mi"));
        assert_eq!(next(&mut reader).await, Allocatable::Node(512 << 20));
        store.change(|n| n["status"] = json!({}));
        match next(&mut reader).await {
            Allocatable::Unknown(why) => assert!(
                why.contains("node n1: status.allocatable.memory is absent"),
                "{why}"
            ),
            other => panic!("unknown, naming the field: {other:?}"),
        }
        assert!(fake.rejected().is_empty(), "{:?}", fake.rejected());
    }

    #[tokio::test]
    async fn a_first_read_that_fails_leaves_the_figure_unknown_naming_why() {
        let fake = Fake::start(|_: &Seen, _| {
            Reply::status(403, "Forbidden", "cannot get resource \"nodes\"")
        })
        .await;
        let mut reader = Reader::spawn(
            fake.context("api server", 1, "n1"),
            Duration::from_millis(20),
            0,
            Allocatable::NodeNotRead,
            Metrics::new(),
        );
        match next(&mut reader).await {
            Allocatable::Unknown(why) => assert!(
                why.contains("status.allocatable.memory") && why.contains("403 Forbidden"),
                "{why}"
            ),
            other => panic!("unknown, not 0: {other:?}"),
        }
    }
}
