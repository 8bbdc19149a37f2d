//! `node-agent simulate`: replays a timeline of observations through [`evaluate`] and reports
//! one JSON object per step. Parsing validates the whole scenario before any step runs, so an
//! invalid scenario produces an error and no output.

use std::time::Duration;

use serde::Serialize;
use serde_yaml_ng::Value;

use crate::config::{ConfigError, EvictionConfig};
use crate::duration::parse_go_duration;
use crate::evaluate::{evaluate, PolicyState};
use crate::local_storage::EmptyDirInfo;
use crate::node_reclaim::{observe_freed, reclaim_kinds, still_met_after_reclaim, Freed, FsLayout};
use crate::observe::{
    ContainerInfo, ContainerUsage, NodeCapacity, Observation, Observations, PodInfo, PodUsage,
    Resources,
};
use crate::quantity::Quantity;
use crate::signal::Signal;
use crate::yaml::{self, WrongType};

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

/// Parses and validates a scenario without running it.
pub fn parse(text: &str) -> Result<Scenario, ScenarioError> {
    let root: Value =
        serde_yaml_ng::from_str(text).map_err(|source| ScenarioError::Syntax { source })?;
    let mut node = None;
    let mut config = None;
    let mut pods = Vec::new();
    let mut steps = None;
    for (name, value) in yaml::entries(&root, "scenario")? {
        match name {
            "node" => node = Some(parse_node(value)?),
            "config" => config = Some(EvictionConfig::from_yaml_value(value, "config.")?),
            "pods" => pods = parse_pods(value)?,
            "steps" => steps = Some(value),
            other => {
                return Err(field_error(
                    other,
                    "only the fields node, config, pods and steps",
                ))
            }
        }
    }
    let node = node.ok_or_else(|| field_error("node", "a node with its capacity"))?;
    let steps = steps.ok_or_else(|| field_error("steps", "a list of steps"))?;
    let steps = parse_steps(steps, &node, &pods)?;
    Ok(Scenario {
        node,
        config: config.unwrap_or_default(),
        pods,
        steps,
    })
}

/// A non-negative whole amount written as a Kubernetes quantity or a plain number.
fn amount(value: &Value, field: &str) -> Result<u64, ScenarioError> {
    let q = whole(value, field)?;
    u64::try_from(q).map_err(|_| field_error(field, "a quantity that is not negative"))
}

/// A quantity as a whole number (rounded up), refused rather than saturated beyond `i64`.
fn whole(value: &Value, field: &str) -> Result<i64, ScenarioError> {
    quantity(value, field)?
        .checked_value()
        .map_err(|_| field_error(field, "a quantity within the int64 range"))
}

fn quantity(value: &Value, field: &str) -> Result<Quantity, ScenarioError> {
    let text = yaml::scalar_text(value, field)?;
    text.parse::<Quantity>().map_err(|e| {
        field_error(
            field,
            format!("a Kubernetes quantity such as 500Mi ({text:?}: {e})"),
        )
    })
}

fn parse_node(value: &Value) -> Result<NodeCapacity, ScenarioError> {
    let mut node = NodeCapacity::default();
    let mut capacity_seen = false;
    for (name, v) in yaml::entries(value, "node")? {
        match name {
            "capacity" => {
                capacity_seen = true;
                for (resource, q) in yaml::entries(v, "node.capacity")? {
                    let field = format!("node.capacity.{resource}");
                    let amount = i64::try_from(amount(q, &field)?)
                        .map_err(|_| field_error(&field, "a smaller quantity"))?;
                    match resource {
                        "memory" => node.memory_bytes = Some(amount),
                        "ephemeral-storage" => node.ephemeral_storage_bytes = Some(amount),
                        "inodes" => node.inodes = Some(amount),
                        "pids" => node.pids = Some(amount),
                        _ => {
                            return Err(field_error(
                                field,
                                "one of memory, ephemeral-storage, inodes, pids",
                            ))
                        }
                    }
                }
            }
            "hasImagefs" => node.has_imagefs = yaml::boolean(v, "node.hasImagefs")?,
            other => {
                return Err(field_error(
                    format!("node.{other}"),
                    "only the fields capacity and hasImagefs",
                ))
            }
        }
    }
    if !capacity_seen {
        return Err(field_error("node.capacity", "the node's capacity"));
    }
    Ok(node)
}

fn parse_resources(value: &Value, field: &str) -> Result<Resources, ScenarioError> {
    let mut resources = Resources::default();
    for (name, v) in yaml::entries(value, field)? {
        let entry_field = format!("{field}.{name}");
        let q = quantity(v, &entry_field)?;
        if q.is_negative() {
            return Err(field_error(entry_field, "a quantity that is not negative"));
        }
        match name {
            "memory" => resources.memory = Some(q),
            "ephemeral-storage" => resources.ephemeral_storage = Some(q),
            // Other resources (cpu, extended resources) play no part in eviction.
            _ => {}
        }
    }
    Ok(resources)
}

fn parse_pods(value: &Value) -> Result<Vec<PodInfo>, ScenarioError> {
    if value.is_null() {
        return Ok(Vec::new());
    }
    let mut pods: Vec<PodInfo> = Vec::new();
    for (i, pod_value) in yaml::sequence(value, "pods")?.iter().enumerate() {
        let at = format!("pods[{i}]");
        let mut pod = PodInfo {
            namespace: "default".to_string(),
            termination_grace_period_seconds: Some(30),
            ..PodInfo::default()
        };
        let mut name = None;
        let mut usage = None;
        for (key, v) in yaml::entries(pod_value, &at)? {
            let field = format!("{at}.{key}");
            match key {
                "name" => name = Some(yaml::string(v, &field)?),
                "namespace" => pod.namespace = yaml::string(v, &field)?,
                "uid" => pod.uid = Some(yaml::string(v, &field)?),
                "priority" => {
                    pod.priority = i32::try_from(yaml::integer(v, &field)?)
                        .map_err(|_| field_error(&field, "a 32-bit integer"))?
                }
                "static" => pod.is_static = yaml::boolean(v, &field)?,
                "mirror" => pod.is_mirror = yaml::boolean(v, &field)?,
                "terminationGracePeriodSeconds" => {
                    let seconds = yaml::integer(v, &field)?;
                    if seconds < 0 {
                        return Err(field_error(
                            field,
                            "a number of seconds that is not negative",
                        ));
                    }
                    pod.termination_grace_period_seconds = Some(seconds);
                }
                "containers" => {
                    for (j, c) in yaml::sequence(v, &field)?.iter().enumerate() {
                        pod.containers
                            .push(parse_container(c, &format!("{field}[{j}]"))?);
                    }
                }
                "volumes" => {
                    for (j, volume) in yaml::sequence(v, &field)?.iter().enumerate() {
                        pod.empty_dirs
                            .push(parse_volume(volume, &format!("{field}[{j}]"))?);
                    }
                }
                "usage" => usage = Some(parse_usage(v, &field)?),
                _ => {
                    return Err(field_error(
                        field,
                        "only the fields name, namespace, uid, priority, static, mirror, \
                         terminationGracePeriodSeconds, containers, volumes, usage",
                    ))
                }
            }
        }
        pod.name = name.ok_or_else(|| field_error(format!("{at}.name"), "the pod's name"))?;
        if pods.iter().any(|p| p.name == pod.name) {
            return Err(field_error(
                format!("{at}.name"),
                "a pod name not used by another pod",
            ));
        }
        let usage = usage.unwrap_or_default();
        check_volume_names(&pod, &usage, &format!("{at}.usage.volumes"))?;
        apply_usage(&mut pod, &usage);
        pods.push(pod);
    }
    Ok(pods)
}

fn parse_container(value: &Value, at: &str) -> Result<ContainerInfo, ScenarioError> {
    let mut container = ContainerInfo::default();
    let mut name = None;
    for (key, v) in yaml::entries(value, at)? {
        let field = format!("{at}.{key}");
        match key {
            "name" => name = Some(yaml::string(v, &field)?),
            "requests" => container.requests = parse_resources(v, &field)?,
            "limits" => container.limits = parse_resources(v, &field)?,
            _ => return Err(field_error(field, "only the fields name, requests, limits")),
        }
    }
    container.name =
        name.ok_or_else(|| field_error(format!("{at}.name"), "the container's name"))?;
    Ok(container)
}

/// A volume of a pod: an emptyDir, with or without a `sizeLimit` (the only kind local
/// storage eviction looks at).
fn parse_volume(value: &Value, at: &str) -> Result<EmptyDirInfo, ScenarioError> {
    let mut volume = EmptyDirInfo::default();
    let (mut name, mut empty_dir) = (None, false);
    for (key, v) in yaml::entries(value, at)? {
        let field = format!("{at}.{key}");
        match key {
            "name" => name = Some(yaml::string(v, &field)?),
            "emptyDir" => {
                empty_dir = true;
                if v.is_null() {
                    continue;
                }
                for (k, q) in yaml::entries(v, &field)? {
                    let limit_field = format!("{field}.{k}");
                    match k {
                        "sizeLimit" => {
                            let q = quantity(q, &limit_field)?;
                            if q.is_negative() {
                                return Err(field_error(
                                    limit_field,
                                    "a quantity that is not negative",
                                ));
                            }
                            volume.size_limit = Some(q);
                        }
                        "medium" => {}
                        _ => return Err(field_error(limit_field, "only sizeLimit, medium")),
                    }
                }
            }
            _ => return Err(field_error(field, "only the fields name, emptyDir")),
        }
    }
    volume.name = name.ok_or_else(|| field_error(format!("{at}.name"), "the volume's name"))?;
    if !empty_dir {
        return Err(field_error(
            format!("{at}.emptyDir"),
            "an emptyDir volume (the only kind a scenario models)",
        ));
    }
    Ok(volume)
}

/// `reclaimable: {bytes, inodes}`: what node-level reclaim would free.
fn parse_reclaimable(value: &Value, at: &str) -> Result<Freed, ScenarioError> {
    let mut freed = Freed::default();
    for (key, v) in yaml::entries(value, at)? {
        let field = format!("{at}.{key}");
        match key {
            "bytes" => freed.bytes = amount(v, &field)?,
            "inodes" => freed.inodes = amount(v, &field)?,
            _ => return Err(field_error(field, "only the fields bytes, inodes")),
        }
    }
    Ok(freed)
}

/// Usage may only name the pod's own volumes.
fn check_volume_names(pod: &PodInfo, usage: &UsageUpdate, at: &str) -> Result<(), ScenarioError> {
    match usage
        .volumes
        .iter()
        .find(|(name, _)| !pod.empty_dirs.iter().any(|v| &v.name == name))
    {
        Some((name, _)) => Err(field_error(
            format!("{at}.{name}"),
            format!("the name of a volume of pod {}", pod.name),
        )),
        None => Ok(()),
    }
}

fn parse_usage(value: &Value, at: &str) -> Result<UsageUpdate, ScenarioError> {
    let mut update = UsageUpdate::default();
    for (key, v) in yaml::entries(value, at)? {
        let field = format!("{at}.{key}");
        if key == "volumes" {
            for (name, q) in yaml::entries(v, &field)? {
                let bytes = amount(q, &format!("{field}.{name}"))?;
                update.volumes.push((name.to_string(), bytes));
            }
            continue;
        }
        let amount = Some(amount(v, &field)?);
        match key {
            "memory" => update.memory = amount,
            "pids" => update.pids = amount,
            "ephemeral-storage" => update.ephemeral_storage = amount,
            "inodes" => update.inodes = amount,
            _ => {
                return Err(field_error(
                    field,
                    "one of memory, pids, ephemeral-storage, inodes, volumes",
                ))
            }
        }
    }
    Ok(update)
}

fn parse_steps(
    value: &Value,
    node: &NodeCapacity,
    pods: &[PodInfo],
) -> Result<Vec<Step>, ScenarioError> {
    let mut steps: Vec<Step> = Vec::new();
    for (i, step_value) in yaml::sequence(value, "steps")?.iter().enumerate() {
        let at_field = format!("steps[{i}]");
        let mut step = Step {
            at_text: String::new(),
            at: Duration::ZERO,
            signals: Vec::new(),
            usage: Vec::new(),
            reclaimable: None,
        };
        let mut at_seen = false;
        for (key, v) in yaml::entries(step_value, &at_field)? {
            let field = format!("{at_field}.{key}");
            match key {
                "at" => {
                    at_seen = true;
                    step.at_text = yaml::scalar_text(v, &field)?;
                    let nanos = parse_go_duration(&step.at_text).map_err(|e| {
                        field_error(
                            &field,
                            format!("a Go duration such as 1m30s ({:?}: {e})", step.at_text),
                        )
                    })?;
                    let nanos = u64::try_from(nanos)
                        .map_err(|_| field_error(&field, "a duration that is not negative"))?;
                    step.at = Duration::from_nanos(nanos);
                }
                "signals" => {
                    for (name, q) in yaml::entries(v, &field)? {
                        let signal_field = format!("{field}[{name}]");
                        let signal: Signal =
                            name.parse().map_err(|e: crate::signal::UnknownSignal| {
                                field_error(&signal_field, e.to_string())
                            })?;
                        if node.capacity_for(signal).is_none() {
                            return Err(field_error(
                                signal_field,
                                format!(
                                    "node.capacity.{} to be set, to observe this signal",
                                    signal.resource()
                                ),
                            ));
                        }
                        step.signals.push((signal, whole(q, &signal_field)?));
                    }
                }
                "usage" => {
                    for (pod, u) in yaml::entries(v, &field)? {
                        let pod_field = format!("{field}.{pod}");
                        let Some(listed) = pods.iter().find(|p| p.name == pod) else {
                            return Err(field_error(pod_field, "the name of a pod listed in pods"));
                        };
                        let update = parse_usage(u, &pod_field)?;
                        check_volume_names(listed, &update, &format!("{pod_field}.volumes"))?;
                        step.usage.push((pod.to_string(), update));
                    }
                }
                "reclaimable" => step.reclaimable = Some(parse_reclaimable(v, &field)?),
                _ => {
                    return Err(field_error(
                        field,
                        "only the fields at, signals, usage, reclaimable",
                    ))
                }
            }
        }
        if !at_seen {
            return Err(field_error(
                format!("{at_field}.at"),
                "the step's time, e.g. 30s",
            ));
        }
        if let Some(previous) = steps.last() {
            if step.at < previous.at {
                return Err(field_error(
                    format!("{at_field}.at"),
                    format!(
                        "a time not before the previous step's {} (steps must not go backwards)",
                        previous.at_text
                    ),
                ));
            }
        }
        steps.push(step);
    }
    Ok(steps)
}
