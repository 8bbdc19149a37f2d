//! The pods bound to this node and their usage, with the time they were observed.
//!
//! Two sources: the local kubelet (`kubelet`) and a list+watch of the API server (`apiserver`).
//! Both hand out a [`PodSnapshot`]; the daemon checks [`PodSnapshot::check_fresh`] before acting.

pub mod apiserver;
pub mod kubelet;
pub mod model;
pub mod stats;

use std::{
    collections::HashMap,
    sync::atomic::Ordering,
    time::{Duration, SystemTime},
};

use k8s_openapi::api::core::v1::Pod;
use node_agent_policy::PodInfo;

use crate::api::Counters;
use model::{ContainerRef, PodError, Read};
use stats::Summary;

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
    /// Pods left out because their object was unreadable (each one logged and counted).
    pub skipped: Vec<PodError>,
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
    /// Builds the view from raw pods and, when there is one, the kubelet's summary (matched by
    /// UID). Unreadable pods are logged, counted and listed in `skipped`.
    pub fn build(
        raw: &[Pod],
        summary: Option<&Summary>,
        observed_at: SystemTime,
        counters: &Counters,
    ) -> Self {
        let stats: HashMap<&str, &stats::PodStats> = summary
            .map(|s| s.pods.iter().map(|p| (p.pod_ref.uid.as_str(), p)).collect())
            .unwrap_or_default();
        let mut pods = Vec::with_capacity(raw.len());
        let mut containers = HashMap::new();
        let mut skipped = Vec::new();
        for pod in raw {
            match model::read(pod) {
                Ok(Read::Active {
                    mut pod,
                    containers: running,
                }) => {
                    if let Some(s) = pod.uid.as_deref().and_then(|uid| stats.get(uid)) {
                        model::apply_stats(&mut pod, s);
                    }
                    containers.extend(running);
                    pods.push(*pod);
                }
                Ok(Read::Terminal) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "pod left out of the snapshot");
                    counters.pods_skipped.fetch_add(1, Ordering::Relaxed);
                    skipped.push(e);
                }
            }
        }
        Self {
            pods,
            containers,
            observed_at,
            skipped,
        }
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
