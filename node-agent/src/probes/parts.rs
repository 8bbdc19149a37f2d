//! The parts every probe's trace record is built from: the cgroup and pod it concerns, the
//! way a line was crossed, and how the table prints bytes and crossings. Here, below both the
//! probes and `trace`, so that each probe's module builds its own record and `trace` only
//! gathers them.

use serde::{Deserialize, Serialize};

use super::{Direction, Subject};
use crate::cgroup::QosClass;

/// The cgroup an event concerns.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CgroupRef {
    pub id: u64,
    /// Path below the memory hierarchy's root; `None` if the cgroup is already gone.
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PodRef {
    pub uid: String,
    pub qos: Qos,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
}

/// The pod's QoS class, as the kubelet names it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Crossing {
    Up,
    Down,
}

impl From<&Subject> for CgroupRef {
    fn from(s: &Subject) -> Self {
        CgroupRef {
            id: s.cgroup_id,
            path: s.path.clone(),
            pod: s.pod.as_ref().map(|p| PodRef {
                uid: p.uid.clone(),
                qos: match p.qos {
                    QosClass::Guaranteed => Qos::Guaranteed,
                    QosClass::Burstable => Qos::Burstable,
                    QosClass::BestEffort => Qos::BestEffort,
                },
                container_id: p.container_id.clone(),
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                container: p.container.clone(),
            }),
        }
    }
}

impl CgroupRef {
    /// `namespace/name/container`, `pod UID`, the path, or the id: the most a reader can be told.
    pub fn label(&self) -> String {
        match (&self.pod, &self.path) {
            (
                Some(PodRef {
                    namespace: Some(ns),
                    name: Some(name),
                    container,
                    ..
                }),
                _,
            ) => match container {
                Some(c) => format!("{ns}/{name}/{c}"),
                None => format!("{ns}/{name}"),
            },
            (Some(pod), _) => format!("pod {}", pod.uid),
            (None, Some(path)) => path.clone(),
            (None, None) => format!("cgroup #{}", self.id),
        }
    }
}

impl From<Direction> for Crossing {
    fn from(d: Direction) -> Self {
        match d {
            Direction::Up => Crossing::Up,
            Direction::Down => Crossing::Down,
        }
    }
}

pub(crate) fn crossing(d: Crossing) -> &'static str {
    match d {
        Crossing::Up => "up",
        Crossing::Down => "down",
    }
}

/// Binary units, as `kubectl` shows quantities: `812.4Mi`, `1.5Gi`, `512Ki`, `100B`.
pub(crate) fn bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["Ki", "Mi", "Gi", "Ti", "Pi"];
    if b < 1024 {
        return format!("{b}B");
    }
    let mut v = b as f64 / 1024.0;
    let mut unit = UNITS[0];
    for u in &UNITS[1..] {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    format!("{v:.1}{unit}")
}
