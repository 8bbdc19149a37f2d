//! The pods bound to this node and their usage, with the time they were observed.
//!
//! Two readers: the kubelet's API (`kubelet`: reached directly or through the API server's
//! node proxy, as `crate::kubelet` works out) and a list+watch of the API server
//! (`apiserver`). Both hand out a [`PodSnapshot`]; the daemon checks [`PodSnapshot::check_fresh`] before acting.
//! Lists and summaries are read record by record ([`records`]): one bad pod or stats entry is
//! named and left aside, never the whole answer.

pub mod apiserver;
pub mod kubelet;
pub mod model;
pub mod records;
pub mod stats;
pub mod status;

use std::{
    collections::{HashMap, HashSet},
    time::{Duration, SystemTime},
};

use node_agent_policy::PodInfo;

use model::{ContainerRef, Read};
use records::{Item, Problem, ProblemKind};
use stats::PodStats;

/// The pods on this node at one moment, as the policy sees them.
#[derive(Debug, Clone, PartialEq)]
pub struct PodSnapshot {
    /// Pods that are not terminal (Succeeded or Failed pods hold nothing any more; the kubelet
    /// leaves them out of its active pods too).
    pub pods: Vec<PodInfo>,
    /// Running containers by the id their runtime gave them (how their cgroups name them).
    pub containers: HashMap<String, ContainerRef>,
    /// When the oldest part of this snapshot was read (pods or usage).
    pub observed_at: SystemTime,
    /// The records not taken as they came, each naming its pod: pods left out (unreadable, or
    /// sharing a UID), stats entries refused, quantities read as zero or none.
    pub problems: Vec<Problem>,
    /// How many pods the source listed (terminal and left-out ones included).
    pub listed: usize,
    /// The UIDs of every pod listed, terminal ones included: a pod cgroup whose UID is not
    /// here is a pod the source has not listed yet.
    pub listed_uids: HashSet<String>,
    /// The node's task limit as the kubelet reads it, from its summary (`node.rlimit.maxpid`):
    /// `None` from the API server's pods, or a summary without it; `Err` naming a bad figure.
    /// The kubelet reads it in the host's PID namespace, which the agent's pod is not in.
    pub kubelet_max_pids: Option<Result<i64, String>>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StaleError {
    #[error("pod data is {age:?} old, above the {bound:?} bound: not acting on it")]
    TooOld { age: Duration, bound: Duration },
    #[error("pod data claims to be from {ahead:?} in the future: clock skew, not acting on it")]
    FromTheFuture { ahead: Duration },
}

/// Whether data observed at `observed_at` may still be acted on at `now`. Small clock steps
/// backwards (under a second) are tolerated; larger ones are refused.
pub fn check_fresh(
    observed_at: SystemTime,
    now: SystemTime,
    bound: Duration,
) -> Result<(), StaleError> {
    match now.duration_since(observed_at) {
        Ok(age) if age > bound => Err(StaleError::TooOld { age, bound }),
        Ok(_) => Ok(()),
        Err(e) if e.duration() <= Duration::from_secs(1) => Ok(()),
        Err(e) => Err(StaleError::FromTheFuture {
            ahead: e.duration(),
        }),
    }
}

impl PodSnapshot {
    /// Builds the view from the pods read (each already in the model) and, when there is one,
    /// the kubelet's stats entries (matched by UID). `problems` are the records decoding
    /// already left aside; pods sharing a UID (both) and bad quantities join them. Nothing is
    /// logged here: a [`records::ProblemLog`] says each problem once.
    pub fn build(
        items: Vec<Item>,
        stats: Option<&[PodStats]>,
        observed_at: SystemTime,
        mut problems: Vec<Problem>,
    ) -> Self {
        let stats: HashMap<&str, &PodStats> = stats
            .unwrap_or_default()
            .iter()
            .map(|p| (p.pod_ref.uid.as_str(), p))
            .collect();
        let listed = items.len()
            + problems
                .iter()
                .filter(|p| p.kind == ProblemKind::PodUnreadable)
                .count();
        let mut uids: HashMap<String, usize> = HashMap::new();
        for item in &items {
            *uids.entry(item.uid.clone()).or_default() += 1;
        }
        let listed_uids = uids.keys().cloned().collect();
        let mut pods = Vec::with_capacity(items.len());
        let mut containers = HashMap::new();
        for item in items {
            let shared = uids[&item.uid];
            if shared > 1 {
                problems.push(Problem {
                    detail: format!("{shared} pods carry UID {}", item.uid),
                    pod: item.name,
                    kind: ProblemKind::DuplicateUid,
                });
                continue;
            }
            let Read::Active {
                mut pod,
                containers: running,
                invalid,
            } = item.read
            else {
                continue;
            };
            if let Some(s) = stats.get(item.uid.as_str()) {
                model::apply_stats(&mut pod, s);
            }
            problems.extend(invalid.into_iter().map(|e| Problem {
                pod: item.name.clone(),
                kind: ProblemKind::FieldInvalid,
                detail: e.to_string(),
            }));
            containers.extend(running);
            pods.push(*pod);
        }
        Self {
            pods,
            containers,
            observed_at,
            problems,
            listed,
            listed_uids,
            kubelet_max_pids: None,
        }
    }

    /// This snapshot (pods read now, without usage) with the usage and the task limit `last`
    /// had: each pod's by its UID, none for a pod `last` did not know. Its age stays the
    /// pods' (usage is read from the cgroups before anything is decided on it).
    pub fn with_usage_of(mut self, last: &PodSnapshot) -> Self {
        for pod in &mut self.pods {
            let Some(uid) = &pod.uid else { continue };
            let Some(known) = last.by_uid(uid) else {
                continue;
            };
            pod.usage = known.usage.clone();
            for c in &mut pod.containers {
                if let Some(k) = known.containers.iter().find(|k| k.name == c.name) {
                    c.usage = k.usage;
                }
            }
        }
        self.kubelet_max_pids = last.kubelet_max_pids.clone();
        self
    }

    pub fn check_fresh(&self, now: SystemTime, bound: Duration) -> Result<(), StaleError> {
        check_fresh(self.observed_at, now, bound)
    }

    pub fn find(&self, namespace: &str, name: &str) -> Option<&PodInfo> {
        self.pods
            .iter()
            .find(|p| p.namespace == namespace && p.name == name)
    }

    /// The pod with this UID.
    pub fn by_uid(&self, uid: &str) -> Option<&PodInfo> {
        self.pods.iter().find(|p| p.uid.as_deref() == Some(uid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freshness_against_the_bound() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let bound = Duration::from_secs(30);
        let s = Duration::from_secs;
        let rows = [
            ("just read", t0, Ok(())),
            ("at the bound", t0 + s(30), Ok(())),
            (
                "past the bound",
                t0 + s(31),
                Err(StaleError::TooOld { age: s(31), bound }),
            ),
            (
                "clock jitter backwards",
                t0 - Duration::from_millis(500),
                Ok(()),
            ),
            (
                "clock far behind",
                t0 - s(10),
                Err(StaleError::FromTheFuture { ahead: s(10) }),
            ),
        ];
        for (what, now, want) in rows {
            assert_eq!(check_fresh(t0, now, bound), want, "{what}");
        }
    }
}
