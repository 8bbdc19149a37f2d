//! Which dead containers go: the kubelet's `evictContainers` as `DeleteAllUnusedContainers`
//! runs it (`evictNonDeletedPods = true`).
//!
//! 1. Containers not running and created at least `min_age` ago are candidates, grouped by
//!    (pod UID, container name) — an "evict unit".
//! 2. Once the pod sources are ready, every candidate of a pod that is terminated or gone goes.
//! 3. Of the rest, each unit keeps its newest `max_per_pod_container` (by attempt, then
//!    creation time); older ones go.
//! 4. If more than `max_containers` candidates remain node-wide, each unit is cut to
//!    `max(max_containers / units, 1)`, then the oldest go until the limit holds.
//!
//! The kubelet walks its units in map order; here each stage removes oldest first (then by ID),
//! so the plan is the same on every run.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use jiff::Timestamp;
use serde::Serialize;

use super::{age, PodPhase, PodStates};
use crate::model::{Container, ContainerState, ContainerStats, PodRef};

/// The kubelet's container GC settings (`--minimum-container-ttl-duration`,
/// `--maximum-dead-containers-per-container`, `--maximum-dead-containers`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContainerGcPolicy {
    /// Dead containers younger than this stay. Default 0.
    pub min_age: Duration,
    /// Dead containers kept per (pod, container name); negative: no limit. Default 1.
    pub max_per_pod_container: i32,
    /// Dead containers kept on the node; negative: no limit. Default -1.
    pub max_containers: i32,
}

impl Default for ContainerGcPolicy {
    fn default() -> Self {
        Self {
            min_age: Duration::ZERO,
            max_per_pod_container: 1,
            max_containers: -1,
        }
    }
}

/// Why a dead container is removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "reason")]
pub enum ContainerReason {
    /// Its pod succeeded, failed or was evicted.
    PodTerminated,
    /// Its pod no longer exists (or it was never a kubelet pod's).
    PodGone,
    /// Older than the newest `keep` dead containers of the same pod and name.
    OverPerContainerLimit { keep: u32 },
    /// The node holds more than `max` dead containers.
    OverNodeLimit { max: u32 },
}

/// A dead container the plan removes (`RemoveContainer`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContainerRemoval {
    pub id: String,
    pub pod: PodRef,
    pub name: String,
    pub attempt: u32,
    pub state: ContainerState,
    pub created_at: Timestamp,
    pub image_id: String,
    #[serde(flatten)]
    pub reason: ContainerReason,
    /// Its writable layer's size, when the runtime has stats for it.
    pub expected_bytes: Option<u64>,
}

/// Why a dead container stays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "reason")]
pub enum KeptContainerReason {
    /// Younger than `min_age`.
    TooNew,
    /// Among the newest of its pod and name that the limits keep (logs, restart history).
    Newest,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeptContainer {
    pub id: String,
    pub pod: PodRef,
    pub name: String,
    pub attempt: u32,
    #[serde(flatten)]
    pub reason: KeptContainerReason,
}

/// (pod UID, container name)
type Unit = (String, String);

pub(super) fn plan(
    containers: &[Container],
    stats: &BTreeMap<String, ContainerStats>,
    pods: &PodStates,
    policy: &ContainerGcPolicy,
    now: Timestamp,
) -> (Vec<ContainerRemoval>, Vec<KeptContainer>) {
    let mut kept = Vec::new();
    let mut units: BTreeMap<Unit, Vec<&Container>> = BTreeMap::new();
    for c in containers
        .iter()
        .filter(|c| c.state != ContainerState::Running)
    {
        if age(now, c.created_at) < policy.min_age {
            kept.push(keep(c, KeptContainerReason::TooNew));
            continue;
        }
        units
            .entry((c.pod.uid.clone(), c.name.clone()))
            .or_default()
            .push(c);
    }
    for unit in units.values_mut() {
        unit.sort_by(|a, b| newest_first(a, b));
    }

    let mut removals: Vec<(&Container, ContainerReason)> = Vec::new();
    if pods.sources_ready {
        let finished: Vec<Unit> = units
            .keys()
            .filter(|(uid, _)| pods.pods.get(uid) != Some(&PodPhase::Active))
            .cloned()
            .collect();
        let mut stage = Vec::new();
        for key in finished {
            let reason = match pods.pods.get(&key.0) {
                Some(PodPhase::Terminated) => ContainerReason::PodTerminated,
                _ => ContainerReason::PodGone,
            };
            for c in units.remove(&key).unwrap_or_default() {
                stage.push((c, reason));
            }
        }
        push_oldest_first(&mut removals, stage);
    }

    if let Ok(keep) = u32::try_from(policy.max_per_pod_container) {
        let reason = ContainerReason::OverPerContainerLimit { keep };
        push_oldest_first(&mut removals, cut_units(&mut units, keep as usize, reason));
    }

    if let Ok(max) = u32::try_from(policy.max_containers) {
        let total: usize = units.values().map(Vec::len).sum();
        if total > max as usize {
            let reason = ContainerReason::OverNodeLimit { max };
            let per_unit = (max as usize / units.len().max(1)).max(1);
            push_oldest_first(&mut removals, cut_units(&mut units, per_unit, reason));
            let mut rest: Vec<&Container> = units.values().flatten().copied().collect();
            rest.sort_by(|a, b| newest_first(a, b));
            let excess = rest.len().saturating_sub(max as usize);
            let cut: Vec<_> = rest.split_off(rest.len() - excess);
            let cut_ids: BTreeSet<&str> = cut.iter().map(|c| c.id.as_str()).collect();
            for unit in units.values_mut() {
                unit.retain(|c| !cut_ids.contains(c.id.as_str()));
            }
            push_oldest_first(
                &mut removals,
                cut.into_iter().map(|c| (c, reason)).collect(),
            );
        }
    }

    for c in units.values().flatten() {
        kept.push(keep(c, KeptContainerReason::Newest));
    }
    let removals = removals
        .into_iter()
        .map(|(c, reason)| ContainerRemoval {
            id: c.id.clone(),
            pod: c.pod.clone(),
            name: c.name.clone(),
            attempt: c.attempt,
            state: c.state,
            created_at: c.created_at,
            image_id: c.image_id.clone(),
            reason,
            expected_bytes: stats
                .get(&c.id)
                .and_then(|s| s.writable_layer.as_ref())
                .and_then(|w| w.used_bytes),
        })
        .collect();
    (removals, kept)
}

/// The kubelet's `byAttempt`: higher attempt first, then later creation; ID breaks ties.
fn newest_first(a: &Container, b: &Container) -> std::cmp::Ordering {
    b.attempt
        .cmp(&a.attempt)
        .then(b.created_at.cmp(&a.created_at))
        .then(a.id.cmp(&b.id))
}

/// Cuts every unit to its newest `keep`; returns what was cut.
fn cut_units<'c>(
    units: &mut BTreeMap<Unit, Vec<&'c Container>>,
    keep: usize,
    reason: ContainerReason,
) -> Vec<(&'c Container, ContainerReason)> {
    let mut cut = Vec::new();
    for unit in units.values_mut() {
        if unit.len() > keep {
            cut.extend(unit.split_off(keep).into_iter().map(|c| (c, reason)));
        }
    }
    cut
}

/// Appends one stage's removals, oldest first (the kubelet removes from the end of its
/// newest-first list).
fn push_oldest_first<'c>(
    removals: &mut Vec<(&'c Container, ContainerReason)>,
    mut stage: Vec<(&'c Container, ContainerReason)>,
) {
    stage.sort_by(|(a, _), (b, _)| newest_first(b, a));
    removals.extend(stage);
}

fn keep(c: &Container, reason: KeptContainerReason) -> KeptContainer {
    KeptContainer {
        id: c.id.clone(),
        pod: c.pod.clone(),
        name: c.name.clone(),
        attempt: c.attempt,
        reason,
    }
}
