//! The scenario file: YAML or JSON, read with serde, every field checked and each refusal
//! naming its path, before any step runs. Pods are Kubernetes Pod manifests (what `kubectl get
//! pod -o yaml` prints) turned into the policy's pods by the daemon's own pod model
//! (`node_agent_kube::pods::model::read`), so a pod the daemon could not build is refused here
//! with the same message, and everything the daemon reads of a pod (init and sidecar
//! containers, overhead, pod-level resources, emptyDir size limits, priority, the static and
//! mirror annotations) counts here as it does on a node.
//!
//! ```yaml
//! node:
//!   capacity: {memory: 10Gi, ephemeral-storage: 100Gi, inodes: 1000000, pids: 32768}
//!   fsLayout: shared            # shared | separate_image_fs | split_image_fs
//! config: {evictionHard: {memory.available: 500Mi}}
//! pods:
//!   - pod: {metadata: {name: web, namespace: shop, uid: ...}, spec: {containers: [...]}}
//!     usage: {memory: 1536Mi, containers: {app: {memory: 1Gi, rootfs: 10Mi, logs: 1Mi}}}
//! steps:
//!   - at: 0s
//!     signals: {memory.available: 400Mi}
//!     usage: {web: {memory: 2Gi}}
//!     reclaimable: {bytes: 1Gi, inodes: 1000}
//! ```

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::api::core::v1::Pod;
use node_agent_kube::pods::model::{self, Read};
use node_agent_policy::{
    node_reclaim::{Freed, FsLayout},
    parse_go_duration,
    scenario::{apply_usage, Scenario, Step, UsageUpdate},
    ContainerUsage, EvictionConfig, NodeCapacity, PodInfo, Quantity, Signal,
};
use serde::Deserialize;

/// Why a scenario is refused: the field's path and what was expected there.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("{path}: {problem}")]
    Field { path: String, problem: String },
    #[error("config")]
    Config(#[source] node_agent_policy::ConfigError),
    #[error("pods[{index}].pod")]
    Pod {
        index: usize,
        #[source]
        source: Box<model::PodError>,
    },
}

/// A refusal at `path`, on one line (a parser's message may span several).
fn field(path: impl Into<String>, problem: impl Into<String>) -> FormatError {
    let problem: String = problem.into();
    FormatError::Field {
        path: path.into().replace(".?", ""),
        problem: problem.split_whitespace().collect::<Vec<_>>().join(" "),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    node: NodeSpec,
    #[serde(default)]
    config: Option<serde_yaml_ng::Value>,
    #[serde(default)]
    pods: Vec<PodEntry>,
    steps: Vec<StepSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct NodeSpec {
    capacity: Capacity,
    #[serde(default)]
    fs_layout: Option<LayoutName>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Capacity {
    memory: Option<Amount>,
    #[serde(rename = "ephemeral-storage")]
    ephemeral_storage: Option<Amount>,
    inodes: Option<Amount>,
    pids: Option<Amount>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum LayoutName {
    Shared,
    SeparateImageFs,
    SplitImageFs,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PodEntry {
    pod: serde_yaml_ng::Value,
    #[serde(default)]
    usage: UsageSpec,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct UsageSpec {
    memory: Option<Amount>,
    pids: Option<Amount>,
    #[serde(rename = "ephemeral-storage")]
    ephemeral_storage: Option<Amount>,
    inodes: Option<Amount>,
    #[serde(default)]
    volumes: BTreeMap<String, Amount>,
    #[serde(default)]
    containers: BTreeMap<String, ContainerSpec>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ContainerSpec {
    memory: Option<Amount>,
    /// Its writable layer.
    rootfs: Option<Amount>,
    logs: Option<Amount>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StepSpec {
    at: Scalar,
    #[serde(default)]
    signals: BTreeMap<String, Amount>,
    #[serde(default)]
    usage: BTreeMap<String, UsageSpec>,
    #[serde(default)]
    reclaimable: Option<Reclaimable>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Reclaimable {
    #[serde(default)]
    bytes: Option<Amount>,
    #[serde(default)]
    inodes: Option<Amount>,
}

/// A scalar written as text or as a number, kept as written.
#[derive(Debug, Clone)]
struct Scalar(String);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Int(i64),
            Float(f64),
        }
        Ok(Scalar(match Raw::deserialize(d)? {
            Raw::Text(t) => t,
            Raw::Int(i) => i.to_string(),
            Raw::Float(f) => f.to_string(),
        }))
    }
}

/// A Kubernetes quantity (`500Mi`) or a plain number, checked where it is used.
type Amount = Scalar;

/// The whole scenario, validated.
pub fn parse(text: &str) -> Result<Scenario, FormatError> {
    crate::yaml::check_nesting(text).map_err(|e| field("scenario", e.to_string()))?;
    let de = serde_yaml_ng::Deserializer::from_str(text);
    let file: File = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        // serde_yaml_ng puts the path (or its parent's) in front of some of its messages too.
        let message = e.into_inner().to_string();
        let message = match message.split_once(": ") {
            Some((head, rest)) if path.starts_with(head) => rest.to_string(),
            _ => message,
        };
        field(if path == "." { "scenario".into() } else { path }, message)
    })?;
    let fs_layout = match file.node.fs_layout.unwrap_or(LayoutName::Shared) {
        LayoutName::Shared => FsLayout::Shared,
        LayoutName::SeparateImageFs => FsLayout::SeparateImageFs,
        LayoutName::SplitImageFs => FsLayout::SplitImageFs,
    };
    let c = &file.node.capacity;
    let cap = |a: &Option<Amount>, name: &str| {
        a.as_ref()
            .map(|a| whole(a, &format!("node.capacity.{name}")))
            .transpose()
    };
    let node = NodeCapacity {
        memory_bytes: cap(&c.memory, "memory")?,
        ephemeral_storage_bytes: cap(&c.ephemeral_storage, "ephemeral-storage")?,
        inodes: cap(&c.inodes, "inodes")?,
        pids: cap(&c.pids, "pids")?,
        has_imagefs: fs_layout != FsLayout::Shared,
    };
    let config = match &file.config {
        Some(v) => EvictionConfig::from_yaml_value(v, "config.").map_err(FormatError::Config)?,
        None => EvictionConfig::default(),
    };
    let mut pods: Vec<PodInfo> = Vec::new();
    for (i, entry) in file.pods.iter().enumerate() {
        let at = format!("pods[{i}]");
        let mut pod = read_pod(i, &entry.pod)?;
        if pods
            .iter()
            .any(|p| (&p.namespace, &p.name) == (&pod.namespace, &pod.name))
        {
            return Err(field(
                format!("{at}.pod.metadata.name"),
                "a pod name not used by another pod of the namespace",
            ));
        }
        if pods.iter().any(|p| p.uid == pod.uid) {
            return Err(field(
                format!("{at}.pod.metadata.uid"),
                "a UID not used by another pod",
            ));
        }
        let update = usage(&entry.usage, &pod, &format!("{at}.usage"))?;
        apply_usage(&mut pod, &update);
        pods.push(pod);
    }
    let mut steps: Vec<Step> = Vec::new();
    for (i, s) in file.steps.iter().enumerate() {
        let at_field = format!("steps[{i}].at");
        let nanos = parse_go_duration(&s.at.0).map_err(|e| {
            field(
                &at_field,
                format!("a Go duration such as 1m30s ({:?}: {e})", s.at.0),
            )
        })?;
        let nanos = u64::try_from(nanos)
            .map_err(|_| field(&at_field, "a duration that is not negative"))?;
        let mut step = Step {
            at_text: s.at.0.clone(),
            at: Duration::from_nanos(nanos),
            signals: Vec::new(),
            usage: Vec::new(),
            reclaimable: None,
        };
        if let Some(previous) = steps.last() {
            if step.at < previous.at {
                return Err(field(
                    at_field,
                    format!(
                        "a time not before the previous step's {} (steps must not go backwards)",
                        previous.at_text
                    ),
                ));
            }
        }
        for (name, value) in &s.signals {
            let signal_field = format!("steps[{i}].signals[{name}]");
            let signal: Signal = name
                .parse()
                .map_err(|e: node_agent_policy::UnknownSignal| {
                    field(&signal_field, e.to_string())
                })?;
            if node.capacity_for(signal).is_none() {
                return Err(field(
                    signal_field,
                    format!(
                        "node.capacity.{} to be set, to observe this signal",
                        signal.resource()
                    ),
                ));
            }
            step.signals.push((signal, whole(value, &signal_field)?));
        }
        for (name, u) in &s.usage {
            let pod_field = format!("steps[{i}].usage.{name}");
            let Some(pod) = pods.iter().find(|p| &p.name == name) else {
                return Err(field(pod_field, "the name of a pod listed in pods"));
            };
            step.usage.push((name.clone(), usage(u, pod, &pod_field)?));
        }
        if let Some(r) = &s.reclaimable {
            let at = format!("steps[{i}].reclaimable");
            let amount = |a: &Option<Amount>, name: &str| {
                a.as_ref()
                    .map(|a| non_negative(a, &format!("{at}.{name}")))
                    .transpose()
                    .map(Option::unwrap_or_default)
            };
            step.reclaimable = Some(Freed {
                bytes: amount(&r.bytes, "bytes")?,
                inodes: amount(&r.inodes, "inodes")?,
            });
        }
        steps.push(step);
    }
    Ok(Scenario {
        node,
        fs_layout,
        config,
        pods,
        steps,
    })
}

/// A Pod manifest through the daemon's own pod model; fields the manifest may not have are
/// refused by path (the Kubernetes types would ignore them). What the API server fills in for
/// every pod it stores, a scenario may leave out: the namespace (`default`) and the UID
/// (derived from the namespace and name).
fn read_pod(index: usize, value: &serde_yaml_ng::Value) -> Result<PodInfo, FormatError> {
    let at = format!("pods[{index}].pod");
    let mut ignored = Vec::new();
    let mut pod: Pod = serde_ignored::deserialize(value.clone(), |path| {
        ignored.push(path.to_string());
    })
    .map_err(|e| field(&at, format!("a Kubernetes Pod ({e})")))?;
    if let Some(path) = ignored.first() {
        // serde_ignored writes `?` for a key its visitor could not name.
        let path = path.replace(".?", "");
        return Err(field(format!("{at}.{path}"), "not a field of a v1 Pod"));
    }
    let meta = &mut pod.metadata;
    let namespace = meta
        .namespace
        .get_or_insert_with(|| "default".into())
        .clone();
    if let Some(name) = &meta.name {
        meta.uid
            .get_or_insert_with(|| format!("{namespace}-{name}"));
    }
    match model::read(&pod).map_err(|source| FormatError::Pod {
        index,
        source: Box::new(source),
    })? {
        // The daemon keeps such a pod ranked (its bad request read as zero); a scenario is
        // written by hand, so it is refused, naming the field.
        Read::Active { invalid, .. } if !invalid.is_empty() => Err(FormatError::Pod {
            index,
            source: Box::new(invalid[0].clone()),
        }),
        Read::Active { pod, .. } => Ok(*pod),
        Read::Terminal => Err(field(
            format!("{at}.status.phase"),
            "a pod that has not ended (Succeeded and Failed pods are never evicted)",
        )),
    }
}

fn usage(spec: &UsageSpec, pod: &PodInfo, at: &str) -> Result<UsageUpdate, FormatError> {
    let amount = |a: &Option<Amount>, name: &str| {
        a.as_ref()
            .map(|a| non_negative(a, &format!("{at}.{name}")))
            .transpose()
    };
    let mut update = UsageUpdate {
        memory: amount(&spec.memory, "memory")?,
        pids: amount(&spec.pids, "pids")?,
        ephemeral_storage: amount(&spec.ephemeral_storage, "ephemeral-storage")?,
        inodes: amount(&spec.inodes, "inodes")?,
        ..UsageUpdate::default()
    };
    for (name, bytes) in &spec.volumes {
        let path = format!("{at}.volumes.{name}");
        if !pod.empty_dirs.iter().any(|v| &v.name == name) {
            return Err(field(
                path,
                format!("the name of an emptyDir volume of pod {}", pod.name),
            ));
        }
        update
            .volumes
            .push((name.clone(), non_negative(bytes, &path)?));
    }
    for (name, c) in &spec.containers {
        let path = format!("{at}.containers.{name}");
        if !pod.containers.iter().any(|k| &k.name == name) {
            return Err(field(
                path,
                format!("the name of a container of pod {}", pod.name),
            ));
        }
        let amount = |a: &Option<Amount>, what: &str| {
            a.as_ref()
                .map(|a| non_negative(a, &format!("{path}.{what}")))
                .transpose()
        };
        update.containers.push((
            name.clone(),
            ContainerUsage {
                memory_working_set_bytes: amount(&c.memory, "memory")?,
                rootfs_bytes: amount(&c.rootfs, "rootfs")?,
                logs_bytes: amount(&c.logs, "logs")?,
            },
        ));
    }
    Ok(update)
}

fn quantity(value: &Scalar, path: &str) -> Result<Quantity, FormatError> {
    value.0.parse::<Quantity>().map_err(|e| {
        field(
            path,
            format!("a Kubernetes quantity such as 500Mi ({:?}: {e})", value.0),
        )
    })
}

/// A whole number (rounded up), refused rather than saturated beyond `i64`.
fn whole(value: &Scalar, path: &str) -> Result<i64, FormatError> {
    quantity(value, path)?
        .checked_value()
        .map_err(|_| field(path, "a quantity within the int64 range"))
}

fn non_negative(value: &Scalar, path: &str) -> Result<u64, FormatError> {
    u64::try_from(whole(value, path)?).map_err(|_| field(path, "a quantity that is not negative"))
}
