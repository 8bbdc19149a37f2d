//! Reading a scenario: every field checked, each refusal naming the field, before any step runs.

use std::time::Duration;

use serde_yaml_ng::Value;

use super::{apply_usage, field_error, Scenario, ScenarioError, Step, UsageUpdate};
use crate::config::EvictionConfig;
use crate::duration::parse_go_duration;
use crate::local_storage::EmptyDirInfo;
use crate::node_reclaim::Freed;
use crate::observe::{ContainerInfo, NodeCapacity, PodInfo, Resources};
use crate::quantity::Quantity;
use crate::signal::Signal;
use crate::yaml;

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
