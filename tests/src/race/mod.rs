//! Racing the real kubelet on the real cluster (`cargo xtask cluster bench`; the method is in
//! docs/benchmarks.md, *Racing the kubelet on a real node*): scenarios of memory, PID and disk
//! pressure made by pods, in three configurations, each run measured from the node's own
//! files, the kernel's log, the API server's audit log and the kubelet's log.

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
}

/// What a run's pods do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Scenario {
    SlowRamp,
    FastRamp,
    FastestRamp,
    Burst,
    ManySmallPods,
    ForkStorm,
    DiskFill,
    EmptyDirOverLimit,
}

/// The signal a scenario presses on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Pressed {
    /// `allocatableMemory.available`, MiB.
    Memory,
    /// `pid.available`, PIDs.
    Pids,
    /// `nodefs.available` (the shared disk), MiB.
    Disk,
    /// An emptyDir's usage against its limit (no node signal).
    LocalStorage,
}

impl Scenario {
    pub const ALL: [Scenario; 8] = [
        Scenario::SlowRamp,
        Scenario::FastRamp,
        Scenario::FastestRamp,
        Scenario::Burst,
        Scenario::ManySmallPods,
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

    /// How long a run may last before it is ended (the pods still running are counted as
    /// such).
    pub fn limit(self) -> std::time::Duration {
        std::time::Duration::from_secs(match self {
            Scenario::SlowRamp => 240,
            Scenario::EmptyDirOverLimit => 180,
            Scenario::DiskFill => 120,
            _ => 60,
        })
    }
}
