//! Racing the real kubelet on the real cluster (`cargo xtask cluster bench`; the method is in
//! docs/benchmarks.md, *Racing the kubelet on a real node*): scenarios of memory, PID and disk
//! pressure made by pods, in three configurations interleaved run by run, each run measured
//! from the node's own files (the kubepods cgroup's headroom and each pod's usage, every
//! millisecond), the kernel's log (OOM kills), the kubelet's log and the agent's (decisions),
//! and a watch of the run's pods (their API records).

pub mod observe;
pub mod report;
pub mod run;

use serde::{Deserialize, Serialize};

/// Who may act on the node in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Config {
    /// The kubelet alone, with kubeadm's configuration (the kubelet's default thresholds).
    KubeletKubeadm,
    /// The kubelet alone, with the agent's shipped thresholds.
    KubeletAgentThresholds,
    /// The kubelet with kubeadm's configuration and the agent as shipped, enforcing.
    KubeletAndAgent,
}

impl Config {
    pub const ALL: [Config; 3] = [
        Config::KubeletKubeadm,
        Config::KubeletAgentThresholds,
        Config::KubeletAndAgent,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Config::KubeletKubeadm => "kubelet (kubeadm)",
            Config::KubeletAgentThresholds => "kubelet (agent's thresholds)",
            Config::KubeletAndAgent => "kubelet + agent",
        }
    }

    /// The name `--config` takes.
    pub fn name(self) -> &'static str {
        match self {
            Config::KubeletKubeadm => "kubelet-kubeadm",
            Config::KubeletAgentThresholds => "kubelet-agent-thresholds",
            Config::KubeletAndAgent => "kubelet-and-agent",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }

    /// The kubelet runs with the agent's thresholds (else kubeadm's, its defaults).
    pub fn kubelet_has_agents_thresholds(self) -> bool {
        self == Config::KubeletAgentThresholds
    }

    /// The agent runs beside the kubelet, enforcing.
    pub fn has_agent(self) -> bool {
        self == Config::KubeletAndAgent
    }
}

/// What a run's pods do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Scenario {
    SlowRamp,
    FastRamp,
    FastestRamp,
    Burst,
    ManySmallPods,
    /// A ramp in a pod whose PID 1 is a shell: it ignores SIGTERM.
    IgnoresSigterm,
    ForkStorm,
    DiskFill,
    EmptyDirOverLimit,
}

/// The signal a scenario presses on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Pressed {
    /// The kubepods cgroup's headroom (its limit less its working set), MiB: what both sides
    /// measure `allocatableMemory.available` as.
    Memory,
    /// `pid.available`, PIDs.
    Pids,
    /// `nodefs.available` (the shared disk), MiB.
    Disk,
    /// An emptyDir's usage against its limit (no node signal).
    LocalStorage,
}

impl Scenario {
    pub const ALL: [Scenario; 9] = [
        Scenario::SlowRamp,
        Scenario::FastRamp,
        Scenario::FastestRamp,
        Scenario::Burst,
        Scenario::ManySmallPods,
        Scenario::IgnoresSigterm,
        Scenario::ForkStorm,
        Scenario::DiskFill,
        Scenario::EmptyDirOverLimit,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::SlowRamp => "slow-ramp",
            Scenario::FastRamp => "fast-ramp",
            Scenario::FastestRamp => "fastest-ramp",
            Scenario::Burst => "burst",
            Scenario::ManySmallPods => "many-small-pods",
            Scenario::IgnoresSigterm => "ignores-sigterm",
            Scenario::ForkStorm => "fork-storm",
            Scenario::DiskFill => "disk-fill",
            Scenario::EmptyDirOverLimit => "emptydir-over-limit",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Scenario::SlowRamp => "slow ramp (5 MiB/s)",
            Scenario::FastRamp => "fast ramp (300 MiB/s)",
            Scenario::FastestRamp => "fastest ramp (as fast as pages are touched)",
            Scenario::Burst => "burst (1000 MiB at once)",
            Scenario::ManySmallPods => "many small pods (8 × 20 MiB/s)",
            Scenario::IgnoresSigterm => "ignores SIGTERM (shell as PID 1, 300 MiB/s)",
            Scenario::ForkStorm => "fork storm (3000 forks)",
            Scenario::DiskFill => "disk fill (200 MiB/s)",
            Scenario::EmptyDirOverLimit => "emptyDir over its limit (200 MiB in 100 MiB)",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    pub fn pressed(self) -> Pressed {
        match self {
            Scenario::ForkStorm => Pressed::Pids,
            Scenario::DiskFill => Pressed::Disk,
            Scenario::EmptyDirOverLimit => Pressed::LocalStorage,
            _ => Pressed::Memory,
        }
    }

    /// Where a memory scenario starts: the kubepods cgroup's headroom (MiB) when its pods are
    /// created, the same in every configuration.
    pub fn start_headroom_mib(self) -> Option<f64> {
        match self {
            Scenario::SlowRamp => Some(START_HEADROOM_SLOW_MIB),
            s if s.pressed() == Pressed::Memory => Some(START_HEADROOM_MIB),
            _ => None,
        }
    }

    /// How long a run may last before it is ended (the pods still running are counted as
    /// such).
    pub fn limit(self) -> std::time::Duration {
        std::time::Duration::from_secs(match self {
            Scenario::SlowRamp => 120,
            Scenario::EmptyDirOverLimit => 180,
            Scenario::DiskFill => 120,
            _ => 60,
        })
    }
}

/// The kubepods cgroup's headroom when a memory scenario's pods are created: 700 MiB above
/// the agent's line (200), 800 above the kubelet's (kubeadm: 100), 900 above the OOM killer.
pub const START_HEADROOM_MIB: f64 = 900.0;
/// The slow ramp starts nearer, to keep its runs short: 100 MiB above the agent's line.
pub const START_HEADROOM_SLOW_MIB: f64 = 300.0;
