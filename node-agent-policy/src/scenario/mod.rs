//! `node-agent simulate`'s replay: a timeline of observations through [`evaluate`], one output
//! per step. Pure: the scenario arrives parsed and validated (the file format, with pods in the
//! daemon's own pod model, is `node-agent`'s), so an invalid scenario never starts.

use std::time::Duration;

use serde::Serialize;

use crate::config::EvictionConfig;
use crate::evaluate::{evaluate, PolicyState};
use crate::node_reclaim::{observe_freed, reclaim_kinds, still_met_after_reclaim, Freed, FsLayout};
use crate::observe::{NodeCapacity, Observation, Observations};
use crate::pod::{ContainerUsage, PodInfo, PodUsage};
use crate::signal::Signal;

/// A parsed, validated scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The node's capacities; `has_imagefs` follows `fs_layout`.
    pub node: NodeCapacity,
    /// Where images and writable layers live: the one layout ranking and reclaim use.
    pub fs_layout: FsLayout,
    pub config: EvictionConfig,
    pub pods: Vec<PodInfo>,
    pub steps: Vec<Step>,
}

/// One step of the timeline.
#[derive(Debug, Clone)]
pub struct Step {
    /// The step's time as written, echoed in the output.
    pub at_text: String,
    /// Time since the start of the scenario.
    pub at: Duration,
    /// Signals observed at this step; others keep their last value.
    pub signals: Vec<(Signal, i64)>,
    /// Usage changes, by pod name, from this step on.
    pub usage: Vec<(String, UsageUpdate)>,
    /// What node-level reclaim (dead containers, unused images) would free from this step on,
    /// on the filesystem that holds images, until a reclaim frees it.
    pub reclaimable: Option<Freed>,
}

/// A change to a pod's usage; fields left `None` (volumes and containers not named) keep
/// their value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageUpdate {
    pub memory: Option<u64>,
    pub pids: Option<u64>,
    pub ephemeral_storage: Option<u64>,
    pub inodes: Option<u64>,
    /// Bytes used by volumes, by volume name.
    pub volumes: Vec<(String, u64)>,
    /// Each named container's own figures, as the kubelet's summary gives them.
    pub containers: Vec<(String, ContainerUsage)>,
}

/// One output line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StepOutput {
    pub at: String,
    pub thresholds_met: Vec<String>,
    pub conditions: Vec<String>,
    /// Node-level reclaim run at this step, when the scenario models it (a step gave
    /// `reclaimable`); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reclaimed: Option<ReclaimedOutput>,
    /// Every pod evicted at this step: one for a threshold, every pod over a local storage
    /// limit at once.
    pub evictions: Vec<EvictedOutput>,
}

/// A node-level reclaim at a step: what it freed and whether that was enough (no threshold
/// met with its minimum reclaim afterwards, so nothing is evicted).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReclaimedOutput {
    pub signal: String,
    pub bytes: u64,
    pub inodes: u64,
    pub enough: bool,
}

/// A pod evicted at a step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EvictedOutput {
    pub namespace: String,
    pub name: String,
    pub signal: String,
    pub grace_period_seconds: i64,
    pub message: String,
}

impl StepOutput {
    /// The step as one line of JSON (without the newline).
    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self).expect("a step output is always representable as JSON")
    }
}

/// Replays a parsed scenario. A pod evicted at one step is gone from later steps.
pub fn simulate(scenario: &Scenario) -> Vec<StepOutput> {
    let mut observations = Observations::new();
    let mut state = PolicyState::default();
    let mut pods = scenario.pods.clone();
    let mut reclaimable: Option<Freed> = None;
    let mut out = Vec::with_capacity(scenario.steps.len());
    for step in &scenario.steps {
        for &(signal, available) in &step.signals {
            let capacity = scenario.node.capacity_for(signal).unwrap_or(0);
            observations.insert(
                signal,
                Observation {
                    available,
                    capacity,
                    lead: 0,
                },
            );
        }
        for (name, update) in &step.usage {
            if let Some(pod) = pods.iter_mut().find(|p| &p.name == name) {
                apply_usage(pod, update);
            }
        }
        if let Some(freed) = step.reclaimable {
            reclaimable = Some(freed);
        }
        let (mut decision, next) = evaluate(
            &scenario.config,
            &scenario.node,
            &observations,
            &pods,
            step.at,
            &state,
        );
        state = next;
        // The kubelet reclaims node-level resources before evicting for a disk signal, and
        // evicts only if a threshold (with its minimum reclaim) is still met afterwards.
        let layout = scenario.fs_layout;
        let reclaimed = match (decision.reclaim, reclaimable.as_mut()) {
            (Some(signal), Some(left)) if !reclaim_kinds(signal, layout).is_empty() => {
                let freed = std::mem::take(left);
                observe_freed(&mut observations, layout, freed);
                let enough = !still_met_after_reclaim(&scenario.config, &observations);
                if enough {
                    decision.evictions.clear();
                }
                Some(ReclaimedOutput {
                    signal: signal.as_str().to_string(),
                    bytes: freed.bytes,
                    inodes: freed.inodes,
                    enough,
                })
            }
            _ => None,
        };
        let evictions: Vec<EvictedOutput> = decision
            .evictions
            .drain(..)
            .map(|e| {
                pods.retain(|p| !(p.namespace == e.namespace && p.name == e.name));
                EvictedOutput {
                    namespace: e.namespace,
                    name: e.name,
                    signal: e.signal.as_str().to_string(),
                    grace_period_seconds: e.grace_period_seconds,
                    message: e.message,
                }
            })
            .collect();
        let mut conditions: Vec<String> = decision
            .conditions
            .iter()
            .map(|c| c.as_str().to_string())
            .collect();
        conditions.sort();
        out.push(StepOutput {
            at: step.at_text.clone(),
            thresholds_met: decision
                .signals_met()
                .iter()
                .map(|s| s.as_str().to_string())
                .collect(),
            conditions,
            reclaimed,
            evictions,
        });
    }
    out
}

/// Sets what `update` names of the pod's usage.
pub fn apply_usage(pod: &mut PodInfo, update: &UsageUpdate) {
    let usage = pod.usage.get_or_insert_with(PodUsage::default);
    if let Some(v) = update.memory {
        usage.memory_working_set_bytes = v;
    }
    if let Some(v) = update.pids {
        usage.processes = v;
    }
    if let Some(v) = update.ephemeral_storage {
        usage.nodefs.bytes = v;
    }
    // The pod's ephemeral storage in all is its disk figure (volumes included), as the
    // kubelet's summary counts it.
    usage.ephemeral_storage_bytes = Some(usage.nodefs.bytes);
    for (name, bytes) in &update.volumes {
        usage.volumes.insert(name.clone(), *bytes);
    }
    if let Some(v) = update.inodes {
        usage.nodefs.inodes = v;
    }
    // The scenario has one disk figure per pod: it counts on whichever filesystem is short.
    usage.imagefs = usage.nodefs;
    let usage = usage.clone();
    for (name, figures) in &update.containers {
        if let Some(c) = pod.containers.iter_mut().find(|c| &c.name == name) {
            let current = c.usage.get_or_insert_with(ContainerUsage::default);
            current.memory_working_set_bytes = figures
                .memory_working_set_bytes
                .or(current.memory_working_set_bytes);
            current.rootfs_bytes = figures.rootfs_bytes.or(current.rootfs_bytes);
            current.logs_bytes = figures.logs_bytes.or(current.logs_bytes);
        }
    }
    // A single container without figures of its own is the whole pod: its writable layer is
    // the pod's disk figure less its volumes, and it writes no logs. With several, a
    // container's use is what the scenario gives for it.
    let named = |name: &str| update.containers.iter().any(|(n, _)| n == name);
    if let [container] = pod.containers.as_mut_slice() {
        if named(&container.name) {
            return;
        }
        let volumes = usage
            .volumes
            .values()
            .fold(0u64, |s, v| s.saturating_add(*v));
        container.usage = Some(ContainerUsage {
            memory_working_set_bytes: Some(usage.memory_working_set_bytes),
            rootfs_bytes: Some(usage.nodefs.bytes.saturating_sub(volumes)),
            logs_bytes: Some(0),
        });
    }
}
