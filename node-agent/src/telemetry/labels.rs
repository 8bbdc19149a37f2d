//! The fixed label values of the daemon's metrics, as enums: what triggered an evaluation, and
//! which Kubernetes operation failed. Each counter exists from the start for every value, and a
//! label is spelt only here.

/// What triggered an evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Trigger {
    Start,
    /// A kernel memory line was crossed.
    MemoryThreshold,
    /// The kernel's `pid.available` line was crossed.
    PidThreshold,
    /// The kernel's OOM killer chose a process.
    OomKill,
    /// The executor reported an eviction that changed nothing (the next pod may go now).
    EvictionOutcome,
    /// The executor reported a node-level reclaim (observe again before evicting).
    ReclaimOutcome,
    /// The pacing allows the next eviction.
    Pacing,
    /// A re-read while a threshold is met or a memory line is near.
    PressurePoll,
    /// The slow re-read that guards against drift and missed events.
    Resync,
    /// A new config was applied.
    Reload,
    /// The pod source shows a pod over a local storage limit, or the kept ones changed.
    LocalStorage,
    /// The Node's allocatable memory changed.
    Allocatable,
    /// The kubelet's task limit (`pid.available`'s capacity) changed.
    PidLimit,
}

impl Trigger {
    pub const ALL: [Trigger; 13] = [
        Trigger::Start,
        Trigger::MemoryThreshold,
        Trigger::PidThreshold,
        Trigger::OomKill,
        Trigger::EvictionOutcome,
        Trigger::ReclaimOutcome,
        Trigger::Pacing,
        Trigger::PressurePoll,
        Trigger::Resync,
        Trigger::Reload,
        Trigger::LocalStorage,
        Trigger::Allocatable,
        Trigger::PidLimit,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Start => "start",
            Trigger::MemoryThreshold => "memory_threshold",
            Trigger::PidThreshold => "pid_threshold",
            Trigger::OomKill => "oom_kill",
            Trigger::EvictionOutcome => "eviction_outcome",
            Trigger::ReclaimOutcome => "reclaim_outcome",
            Trigger::Pacing => "pacing",
            Trigger::PressurePoll => "pressure_poll",
            Trigger::Resync => "resync",
            Trigger::Reload => "reload",
            Trigger::LocalStorage => "local_storage",
            Trigger::Allocatable => "allocatable",
            Trigger::PidLimit => "pid_limit",
        }
    }
}

/// A Kubernetes read or write whose failures are counted (`node_agent_kube_errors_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KubeOperation {
    /// The kubelet's `/pods` and `/stats/summary`.
    KubeletPods,
    /// The Node's `status.allocatable.memory`.
    NodeAllocatable,
    /// A pod's `Evicted` event.
    PodEvent,
    /// The agent's node condition.
    NodeCondition,
    /// The agent's pressure taint.
    NodeTaint,
    /// The node event a node-level reclaim leaves.
    ReclaimEvent,
    /// The node event `EvictionThresholdMet`.
    ThresholdMetEvent,
    /// The node event for a kernel OOM kill outside pods.
    OomKillEvent,
    /// The pod event (or its series) for a kernel OOM kill in a pod.
    PodOomEvent,
}

impl KubeOperation {
    pub const ALL: [KubeOperation; 9] = [
        KubeOperation::KubeletPods,
        KubeOperation::NodeAllocatable,
        KubeOperation::PodEvent,
        KubeOperation::NodeCondition,
        KubeOperation::NodeTaint,
        KubeOperation::ReclaimEvent,
        KubeOperation::ThresholdMetEvent,
        KubeOperation::OomKillEvent,
        KubeOperation::PodOomEvent,
    ];

    /// The label value; node events keep their event reason as their name.
    pub fn as_str(self) -> &'static str {
        match self {
            KubeOperation::KubeletPods => "kubelet pods",
            KubeOperation::NodeAllocatable => "node allocatable",
            KubeOperation::PodEvent => "pod event",
            KubeOperation::NodeCondition => "node condition",
            KubeOperation::NodeTaint => "node taint",
            KubeOperation::ReclaimEvent => "reclaim event",
            KubeOperation::ThresholdMetEvent => "EvictionThresholdMet",
            KubeOperation::OomKillEvent => node_agent_kube::events::OOM_KILL_REASON,
            KubeOperation::PodOomEvent => "pod oom event",
        }
    }
}

/// The labels of `node_agent_telemetry_authorizations_total{result}`: what the listener's
/// gate (`crate::serve::access`) answered.
pub const AUTHORIZATION_RESULTS: [&str; 5] = [
    "allowed",
    "unauthenticated",
    "forbidden",
    "unavailable",
    "busy",
];
