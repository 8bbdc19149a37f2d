//! `node-agent simulate`: replays a timeline of observations through [`evaluate`] and reports
//! one JSON object per step. Parsing validates the whole scenario before any step runs, so an
//! invalid scenario produces an error and no output.

use std::time::Duration;

use serde::Serialize;

use crate::config::{ConfigError, EvictionConfig};
use crate::evaluate::{evaluate, PolicyState};
use crate::node_reclaim::{observe_freed, reclaim_kinds, still_met_after_reclaim, Freed, FsLayout};
use crate::observe::{ContainerUsage, NodeCapacity, Observation, Observations, PodInfo, PodUsage};
use crate::signal::Signal;
use crate::yaml::WrongType;

mod parse;
pub use parse::parse;

/// Why a scenario is refused. Every variant names the field.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("scenario is not valid YAML or JSON: {source}")]
    Syntax {
        #[source]
        source: serde_yaml_ng::Error,
    },
    #[error("{field}: expected {expected}")]
    Field { field: String, expected: String },
    #[error(transparent)]
    Config(#[from] ConfigError),
}

impl From<WrongType> for ScenarioError {
    fn from(e: WrongType) -> Self {
        ScenarioError::Field {
            field: e.field,
            expected: e.expected.to_string(),
        }
    }
}

fn field_error(field: impl Into<String>, expected: impl Into<String>) -> ScenarioError {
    ScenarioError::Field {
        field: field.into(),
        expected: expected.into(),
    }
}

/// A parsed, validated scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub node: NodeCapacity,
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

/// A change to a pod's usage; fields left `None` (volumes not named) keep their value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageUpdate {
    pub memory: Option<u64>,
    pub pids: Option<u64>,
    pub ephemeral_storage: Option<u64>,
    pub inodes: Option<u64>,
    /// Bytes used by volumes, by volume name.
    pub volumes: Vec<(String, u64)>,
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
    pub evicted: Option<EvictedOutput>,
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

/// The pod evicted at a step.
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

/// Parses and replays a scenario (YAML or JSON).
pub fn run(text: &str) -> Result<Vec<StepOutput>, ScenarioError> {
    Ok(simulate(&parse(text)?))
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
        let layout = FsLayout::from_has_imagefs(scenario.node.has_imagefs);
        let reclaimed = match (decision.reclaim, reclaimable.as_mut()) {
            (Some(signal), Some(left)) if !reclaim_kinds(signal, layout).is_empty() => {
                let freed = std::mem::take(left);
                observe_freed(&mut observations, layout, freed);
                let enough = !still_met_after_reclaim(&scenario.config, &observations);
                if enough {
                    decision.evict = None;
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
        let evicted = decision.evict.take().map(|e| {
            pods.retain(|p| !(p.namespace == e.namespace && p.name == e.name));
            EvictedOutput {
                namespace: e.namespace,
                name: e.name,
                signal: e.signal.as_str().to_string(),
                grace_period_seconds: e.grace_period_seconds,
                message: e.message,
            }
        });
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
            evicted,
        });
    }
    out
}

fn apply_usage(pod: &mut PodInfo, update: &UsageUpdate) {
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
    // A single container is the whole pod: its writable layer is the pod's disk figure less
    // its volumes, and it writes no logs. With several, per-container use is unknown.
    if let [container] = pod.containers.as_mut_slice() {
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
