//! The inspection endpoint that `kubectl node-agent` reads: the agent's status, its live
//! stream and what it lately decided about one pod, served read-only over HTTP/1.1 on a
//! loopback address of the agent's own pod (`inspectListen`, `127.0.0.1:9465` in deploy/).
//!
//! Loopback in the pod's own network namespace is no network endpoint: nothing off the pod
//! reaches it. The plugin comes in through the API server's `pods/portforward`, which the
//! kubelet and the container runtime carry into the pod, so who may read it is decided by
//! Kubernetes RBAC (`create` on `pods/portforward` in the agent's namespace,
//! deploy/operator-rbac.yaml); exec, which would hand out a shell in a container holding
//! `CAP_BPF`, is never needed.
//!
//! The loop writes what it decides into [`Inspect`] (a lock held only to copy plain data in
//! or out, never across I/O); the listener ([`crate::serve::inspect`]) reads it. Nothing on the decision path waits for
//! a client: the live stream reaches the endpoint through the same broadcast as the trace
//! socket, and what the clients may hold is bounded in [`crate::serve::inspect`].

mod history;
mod query;
pub mod wire;

use std::{
    sync::{Arc, Mutex},
    time::SystemTime,
};

use node_agent_policy::{Decision, EvictionConfig, Observations};

use self::history::{History, PodId, Seen};
pub use self::{
    history::WINDOW,
    query::{ExplainQuery, QueryError, Request},
    wire::{Entry, Explanation, Fact, MetThreshold, Mode, StatusReply},
};
use crate::{telemetry::Health, trace::Record};

/// Other pods' evictions shown beside an explanation.
const OTHERS_CHOSEN: usize = 3;

/// What the endpoint shows, shared between the loop (writing) and the server (reading).
#[derive(Clone)]
pub struct Inspect {
    state: Arc<Mutex<State>>,
    health: Arc<Health>,
}

/// Who the agent is: fixed at start.
#[derive(Debug, Clone, Default)]
pub struct Identity {
    pub node: Option<String>,
    /// `namespace/name`.
    pub pod: Option<String>,
}

#[derive(Debug)]
struct State {
    identity: Identity,
    started: i128,
    mode: Mode,
    memory_mechanism: &'static str,
    thresholds_met: Vec<MetThreshold>,
    last_eviction: Option<Record>,
    last_oom_kill: Option<Record>,
    history: History,
}

/// Wall-clock nanoseconds since the epoch.
fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

impl Inspect {
    pub fn new(identity: Identity, mode: Mode, health: Arc<Health>) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                identity,
                started: now_ns(),
                mode,
                memory_mechanism: "unknown",
                thresholds_met: Vec::new(),
                last_eviction: None,
                last_oom_kill: None,
                history: History::default(),
            })),
            health,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        // A panic elsewhere while holding it leaves plain data: keep serving it.
        f(&mut self.state.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// At start and after every reload: dry run or enforcing.
    pub fn set_mode(&self, mode: Mode) {
        self.with(|s| s.mode = mode);
    }

    /// `fexit`, `sampler` or `polling` (at start).
    pub fn set_memory_mechanism(&self, name: &'static str) {
        self.with(|s| s.memory_mechanism = name);
    }

    /// A record of the live stream: the last eviction and OOM kill, and the pod's history.
    pub fn record(&self, record: &Record) {
        let now = now_ns();
        let pod = pod_of(record);
        self.with(|s| {
            match record {
                Record::Eviction { .. } => s.last_eviction = Some(record.clone()),
                Record::OomKill { .. } => s.last_oom_kill = Some(record.clone()),
                _ => {}
            }
            if let Some(pod) = pod {
                s.history
                    .note(pod, Seen::Record(Box::new(record.clone())), now);
            }
        });
    }

    /// One evaluation: the thresholds met, the pod chosen, those passed over and those kept
    /// over a local storage limit.
    pub fn decision(
        &self,
        eviction: &EvictionConfig,
        observations: &Observations,
        decision: &Decision,
    ) {
        let now = now_ns();
        let thresholds = eviction.thresholds();
        let met: Vec<MetThreshold> = decision
            .thresholds_met
            .iter()
            .map(|t| {
                let observed = observations.get(&t.signal);
                MetThreshold {
                    signal: t.signal.as_str().to_string(),
                    hard: t.hard,
                    grace_period_passed: t.grace_period_passed,
                    observed: observed.map(|o| o.available),
                    threshold: thresholds
                        .get(t.index)
                        .zip(observed)
                        .map(|(th, o)| th.value.resolve(o.capacity).value()),
                }
            })
            .collect();
        self.with(|s| {
            s.thresholds_met = met;
            for e in &decision.evictions {
                let seen = Seen::Chosen {
                    signal: e.signal,
                    hard: e.hard,
                    observed: e.available.value(),
                    threshold: e.threshold_quantity.value(),
                };
                s.history.note(named(&e.namespace, &e.name), seen, now);
            }
            if let Some(signal) = decision.reclaim {
                for p in &decision.passed_over {
                    let seen = Seen::PassedOver {
                        signal,
                        reason: p.reason,
                    };
                    s.history.note(named(&p.namespace, &p.name), seen, now);
                }
            }
            for (p, limit) in &decision.over_limit_passed_over {
                let seen = Seen::OverLimitKept {
                    limit: *limit,
                    reason: p.reason,
                };
                s.history.note(named(&p.namespace, &p.name), seen, now);
            }
        });
    }

    /// `GET /v1/status`.
    pub fn status(&self) -> StatusReply {
        let (ready, readiness) = match self.health.readiness() {
            Ok(()) => (true, "ready".to_string()),
            Err(why) => (false, why.trim_end().to_string()),
        };
        let now = now_ns();
        self.with(|s| StatusReply {
            version: env!("CARGO_PKG_VERSION").to_string(),
            commit: env!("NODE_AGENT_COMMIT").to_string(),
            node: s.identity.node.clone(),
            pod: s.identity.pod.clone(),
            mode: s.mode,
            ready,
            readiness,
            memory_mechanism: s.memory_mechanism.to_string(),
            thresholds_met: s.thresholds_met.clone(),
            last_eviction: s.last_eviction.clone(),
            last_oom_kill: s.last_oom_kill.clone(),
            started: crate::sys::format_rfc3339(s.started),
            now: crate::sys::format_rfc3339(now),
        })
    }

    /// `GET /v1/explain`.
    pub fn explain(&self, q: &ExplainQuery) -> Explanation {
        let now = now_ns();
        let (stored, others, met, mode, node) = self.with(|s| {
            (
                s.history.of(&q.namespace, &q.pod, q.uid.as_deref(), now),
                s.history
                    .chosen_others(&q.namespace, &q.pod, now, OTHERS_CHOSEN),
                s.thresholds_met.clone(),
                s.mode,
                s.identity.node.clone(),
            )
        });
        // Built outside the lock: the loop never waits on an explanation being written.
        let entries = stored
            .into_iter()
            .map(|e| entry(&q.namespace, &q.pod, e))
            .collect();
        let others_chosen = others
            .into_iter()
            .map(|(id, e)| match id {
                PodId::Named { namespace, name } => entry(&namespace, &name, e),
                PodId::Uid(uid) => entry("", &uid, e),
            })
            .collect();
        Explanation {
            namespace: q.namespace.clone(),
            pod: q.pod.clone(),
            node,
            mode,
            window_seconds: WINDOW.as_secs(),
            entries,
            thresholds_met: met,
            others_chosen,
            now: crate::sys::format_rfc3339(now),
        }
    }
}

fn named(namespace: &str, name: &str) -> PodId {
    PodId::Named {
        namespace: namespace.to_string(),
        name: name.to_string(),
    }
}

/// The pod a record names: by name when the pod source named it, else by UID.
fn pod_of(record: &Record) -> Option<PodId> {
    if let Record::Eviction {
        namespace, name, ..
    } = record
    {
        return Some(named(namespace, name));
    }
    let pod = record.cgroup()?.pod.as_ref()?;
    match (&pod.namespace, &pod.name) {
        (Some(ns), Some(name)) => Some(named(ns, name)),
        _ => Some(PodId::Uid(pod.uid.clone())),
    }
}

/// The wire form of a stored entry.
fn entry(namespace: &str, pod: &str, stored: history::Stored) -> Entry {
    let fact = match stored.seen {
        Seen::Chosen {
            signal,
            hard,
            observed,
            threshold,
        } => Fact::Chosen {
            signal: signal.as_str().to_string(),
            hard,
            observed,
            threshold,
        },
        Seen::PassedOver { signal, reason } => Fact::PassedOver {
            signal: signal.as_str().to_string(),
            reason: reason.as_str().to_string(),
            why: reason.to_string(),
        },
        Seen::OverLimitKept { limit, reason } => Fact::OverLimitKept {
            limit: limit.as_str().to_string(),
            reason: reason.as_str().to_string(),
            why: reason.to_string(),
        },
        Seen::Record(record) => Fact::Record { record },
    };
    Entry {
        first: crate::sys::format_rfc3339(stored.first),
        last: crate::sys::format_rfc3339(stored.last),
        count: stored.count,
        namespace: namespace.to_string(),
        pod: pod.to_string(),
        fact,
    }
}
