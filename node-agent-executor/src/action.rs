//! What the plan asks of the executor, and what the executor reports back: data, with the
//! errors kept typed so the loop can match on them, count them by kind and log their chain.

use std::time::SystemTime;

use node_agent_kube::{
    api::ApiError,
    events::{self, OomCause, OomKill, PodOomKill},
    evict::Attempt,
    taint::{TaintChange, TaintError},
};
use node_agent_policy::{Eviction, NodeCondition, PodInfo, Resource};

use crate::{
    kill::{KillTarget, Killed},
    lanes::Refused,
    node::RecordReport,
    reclaim::{Detected, Identity, Reclaim, ReclaimOutcome, RuntimeError},
};

/// One thing to do in the cluster or on the node's runtime.
#[derive(Debug, Clone)]
pub enum Action {
    Evict(Box<Evict>),
    /// A hard memory or PID threshold's eviction carried out on the node: the pod's processes
    /// killed and their memory given back at once, its record (`Failed`, `Evicted`) written
    /// through the API after.
    Kill(Box<Kill>),
    NodeEvent(NodeEvent),
    /// A kernel OOM kill in a pod, as an event on the pod (or one more in its series).
    PodOomEvent(Box<PodOomEvent>),
    /// The agent's node condition and the node's pressure taint for these conditions (none:
    /// no pressure). Only the latest status matters: one not yet written is replaced.
    Status {
        conditions: Vec<NodeCondition>,
    },
    /// Delete dead containers and unused images through the runtime, before any eviction for
    /// this disk signal.
    Reclaim(Box<Reclaim>),
    /// Note which images the runtime has and which are in use (the kubelet's periodic
    /// `detectImages`), so reclaim knows their age.
    DetectImages,
    /// Ask the runtime whose container this is (an OOM kill in a pod the pod source has not
    /// listed yet).
    Identify(Box<Unnamed>),
}

/// A kernel OOM kill whose victim is named as far as it can be, as it is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OomTold {
    /// In a pod the agent can name: an event on the pod (or one more in its series).
    Pod(PodOomKill),
    /// Anywhere else: an event on the node, unless `kubernetes.nodeOOMEvents: off`.
    Node(OomKill),
}

/// How an OOM kill is counted (`node_agent_oom_kills_total`): the pod's namespace and the
/// container where known (empty where not), the cause's label, and whether the agent saw
/// memory pressure in the minute before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomCounted {
    pub namespace: String,
    pub container: String,
    pub cause: &'static str,
    pub foreseen: bool,
}

/// An OOM kill in a container the agent cannot name yet: its cgroup gave the pod's UID and the
/// container's id, the runtime's labels give the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unnamed {
    pub container_id: String,
    pub pod_uid: String,
    /// The pod's namespace and name when the pod source has listed the pod but not yet this
    /// container of it (a container that has just started): its event stays on the pod
    /// even if the runtime cannot name the container.
    pub pod: Option<(String, String)>,
    pub pid: u32,
    pub comm: String,
    pub cause: OomCause,
    pub saw_before: String,
    /// The agent saw memory pressure in the minute before (`node_agent_oom_kills_foreseen_total`).
    pub foreseen: bool,
}

impl PodOomEvent {
    /// The event written: its namespace and name.
    pub fn event(&self) -> (String, String) {
        match self {
            Self::New { kill, at, .. } => (
                kill.namespace.clone(),
                node_agent_kube::events::event_name(&kill.name, *at),
            ),
            Self::Series {
                namespace, name, ..
            } => (namespace.clone(), name.clone()),
        }
    }
}

impl Unnamed {
    /// The kill, on its pod but with its container unnamed: the runtime could not name it.
    fn on_pod(self) -> Option<PodOomKill> {
        let (namespace, name) = self.pod?;
        Some(PodOomKill {
            namespace,
            name,
            uid: self.pod_uid,
            container: None,
            pid: self.pid,
            comm: self.comm,
            cause: self.cause,
            saw_before: self.saw_before,
            named_late: false,
        })
    }

    /// The kill as told once the runtime answered: on the pod `who` names; when nobody could
    /// name the container, on the pod when it is known, else on the node with the pod's UID.
    /// With how it is counted.
    pub fn told(self, who: Option<&Identity>) -> (OomTold, OomCounted) {
        let (cause, foreseen) = (self.cause.label(), self.foreseen);
        let Some(who) = who else {
            let counted = OomCounted {
                namespace: self
                    .pod
                    .as_ref()
                    .map(|(ns, _)| ns.clone())
                    .unwrap_or_default(),
                container: String::new(),
                cause,
                foreseen,
            };
            let pod_uid = self.pod_uid.clone();
            let (pid, comm) = (self.pid, self.comm.clone());
            let told = match self.on_pod() {
                Some(on_pod) => OomTold::Pod(on_pod),
                None => OomTold::Node(OomKill {
                    pid,
                    comm,
                    pod_uid: Some(pod_uid),
                }),
            };
            return (told, counted);
        };
        let counted = OomCounted {
            namespace: who.namespace.clone(),
            container: who.container.clone(),
            cause,
            foreseen,
        };
        (OomTold::Pod(self.named(who.clone())), counted)
    }

    /// The kill, named.
    fn named(self, who: Identity) -> PodOomKill {
        PodOomKill {
            namespace: who.namespace,
            name: who.name,
            uid: who.uid,
            container: Some(who.container),
            pid: self.pid,
            comm: self.comm,
            cause: self.cause,
            saw_before: self.saw_before,
            named_late: true,
        }
    }
}

/// The policy's decision, the pod it is about, and the kernel timestamp of what triggered it.
#[derive(Debug, Clone)]
pub struct Evict {
    pub eviction: Eviction,
    pub pod: PodInfo,
    pub trigger_ktime_ns: Option<u64>,
}

/// An eviction carried out on the node, and the pod's cgroup as the decision verified it.
#[derive(Debug, Clone)]
pub struct Kill {
    pub evict: Evict,
    pub target: KillTarget,
}

/// The pod's OOM event: posted for the first kill of a series, its count written after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodOomEvent {
    New {
        kill: PodOomKill,
        /// The first kill's time: the event's time and, with the pod's name, its name.
        at: SystemTime,
        /// Posted again after a failed write: the kills counted so far and the last one's
        /// time, written as the new event's `series`.
        repeats: Option<(u32, SystemTime)>,
    },
    Series {
        namespace: String,
        name: String,
        count: u32,
        last_observed: SystemTime,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeEvent {
    /// `EvictionThresholdMet`: a threshold on this resource is newly met.
    ThresholdMet(Resource),
    /// [`events::OOM_KILL_REASON`]: the kernel's OOM killer chose a process.
    OomKill(OomKill),
}

impl NodeEvent {
    pub fn reason(&self) -> &'static str {
        match self {
            Self::ThresholdMet(_) => "EvictionThresholdMet",
            Self::OomKill(_) => events::OOM_KILL_REASON,
        }
    }
}

/// What the executor reports back.
#[derive(Debug)]
pub enum Outcome {
    Eviction(Box<Report>),
    NodeEvent {
        reason: &'static str,
        result: Result<(), ApiError>,
    },
    /// A pod's OOM event posted, or its series written: which event (namespace, name), and
    /// how it went.
    PodOomEvent {
        namespace: String,
        name: String,
        result: Result<(), ApiError>,
    },
    Status(Box<StatusReport>),
    Reclaim(Box<ReclaimOutcome>),
    /// Images detected (how many, and where the runtime keeps them), or why the runtime could
    /// not be asked.
    ImagesDetected(Result<Detected, RuntimeError>),
    /// An action no lane took.
    Refused(Refused),
    /// An eviction the eviction lane could not take (full): never attempted, so nothing about
    /// the pod; the plan tries it again shortly.
    EvictionShed {
        evict: Box<Evict>,
        refused: Refused,
    },
    /// What became of the record of an eviction carried out on the node.
    Recorded(Box<RecordReport>),
    /// Whose container an OOM kill was in, or why the runtime could not say.
    Identified {
        kill: Box<Unnamed>,
        who: Result<Identity, RuntimeError>,
    },
}

/// The outcome of one eviction decision.
#[derive(Debug)]
pub struct Report {
    pub eviction: Eviction,
    pub trigger_ktime_ns: Option<u64>,
    pub attempt: Attempt,
    /// What the kill on the node did (an eviction carried out there).
    pub killed: Option<Killed>,
    /// The pod's `Evicted` event could not be posted (the eviction itself happened).
    pub event_error: Option<ApiError>,
    pub at: SystemTime,
}

/// What writing the node's status did: the condition, then the taint that follows it.
#[derive(Debug)]
pub struct StatusReport {
    pub pressure: bool,
    /// The writes of an agent that stops (condition `Unknown`, taint removed).
    pub stopped: bool,
    pub condition: Result<(), ApiError>,
    /// `Ok(None)`: nothing was sent (dry run, standalone, taints off and none to remove).
    pub taint: Result<Option<TaintChange>, TaintError>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unnamed(pod: Option<(&str, &str)>) -> Unnamed {
        Unnamed {
            container_id: "c0ffee".into(),
            pod_uid: "uid-cart".into(),
            pod: pod.map(|(ns, name)| (ns.into(), name.into())),
            pid: 7,
            comm: "java".into(),
            cause: OomCause::Node,
            saw_before: "pressure".into(),
            foreseen: true,
        }
    }

    fn on_pod(namespace: &str, container: Option<&str>, named_late: bool) -> OomTold {
        OomTold::Pod(PodOomKill {
            namespace: namespace.into(),
            name: "cart".into(),
            uid: "uid-cart".into(),
            container: container.map(Into::into),
            pid: 7,
            comm: "java".into(),
            cause: OomCause::Node,
            saw_before: "pressure".into(),
            named_late,
        })
    }

    fn counted(namespace: &str, container: &str) -> OomCounted {
        OomCounted {
            namespace: namespace.into(),
            container: container.into(),
            cause: OomCause::Node.label(),
            foreseen: true,
        }
    }

    #[test]
    fn a_kill_the_runtime_answered_for_is_told_where_it_is_known_best() {
        let who = Identity {
            namespace: "shop".into(),
            name: "cart".into(),
            uid: "uid-cart".into(),
            container: "app".into(),
        };
        let rows = [
            (
                "named by the runtime: on its pod, with its container",
                unnamed(None),
                Some(&who),
                on_pod("shop", Some("app"), true),
                counted("shop", "app"),
            ),
            (
                "not named, the pod listed: on the pod, no container",
                unnamed(Some(("shop", "cart"))),
                None,
                on_pod("shop", None, false),
                counted("shop", ""),
            ),
            (
                "not named, the pod not listed: on the node, with the pod's UID",
                unnamed(None),
                None,
                OomTold::Node(OomKill {
                    pid: 7,
                    comm: "java".into(),
                    pod_uid: Some("uid-cart".into()),
                }),
                counted("", ""),
            ),
        ];
        for (behaviour, kill, who, told, count) in rows {
            assert_eq!(kill.told(who), (told, count), "{behaviour}");
        }
    }
}
