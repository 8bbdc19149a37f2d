//! One run: a configuration in force, a namespace with the ballast and the scenario's pods,
//! everything observed until the pressure is gone or the run's limit, then the namespace
//! deleted and its cgroups waited for.

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use node_agent_cluster::node_components::KubeletOptions;
use serde::{Deserialize, Serialize};

use super::{
    observe::{self, By, Conditions, Eviction, Sampled, Sampler, Sources},
    Config, Pressed, Scenario,
};
use crate::real_cluster::{Qos, RealCluster, Variant, WorkloadPod, AGENT_NS, AGENT_SA};

/// Where the scenario starts: the signal this far above the agent's line (MiB).
const START_ABOVE_AGENT_LINE_MIB: f64 = 700.0;
const SLOW_START_ABOVE_MIB: f64 = 200.0;
/// The agent's threshold on allocatableMemory.available (MiB), and the kubelet's (kubeadm), as
/// configured. The bench's axis is the Node's allocatable less the pods' working set; both
/// sides measure the pods cgroup's own headroom, which is the kubelet's hard threshold above
/// it: the report places the kubelet's line on the axis (`report::kubelet_line`), and a run
/// records the agent's where it falls (`AGENT_LINE_MIB` until 05d0d49, when the agent measured
/// against the Node's allocatable too; one hard threshold lower since).
pub const AGENT_LINE_MIB: f64 = 200.0;
pub const KUBELET_LINE_MIB: f64 = 100.0;
/// The fork storm's thresholds: this many PIDs below pid.available at the run's start.
const PID_MARGIN: f64 = 1500.0;

/// What a run saw.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRecord {
    pub scenario: Scenario,
    pub config: Config,
    pub index: usize,
    pub started_ns: i64,
    /// Each side's line on the pressed signal (available MiB, or PIDs), as set in this run.
    pub agent_line: Option<f64>,
    pub kubelet_line: Option<f64>,
    pub sampled: Sampled,
    pub evictions: Vec<Eviction>,
    pub conditions: Conditions,
    /// The scenario pods' UIDs by name.
    pub pods: Vec<(String, String)>,
    /// Local storage: when the pod's write was done (its `phase=held`), the clock both sides
    /// start from.
    pub written_ns: Option<i64>,
}

/// The configuration in force, switched only when it changes.
pub struct Bench<'a> {
    pub rc: &'a RealCluster,
    current: Option<(Config, bool)>,
}

/// The kubelet's eviction settings equal to the agent's shipped ones (deploy/config.yaml's
/// `eviction:` section, as KubeletConfiguration lines).
fn agents_thresholds_for_the_kubelet(pid_threshold: Option<f64>) -> anyhow::Result<Vec<String>> {
    let text =
        std::fs::read_to_string(crate::real_cluster::workspace().join("deploy/config.yaml"))?;
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text)?;
    let mut eviction = doc
        .get("eviction")
        .cloned()
        .context("deploy/config.yaml has no eviction section")?;
    if let (Some(pids), Some(hard)) = (pid_threshold, eviction.get_mut("evictionHard")) {
        hard["pid.available"] = serde_yaml_ng::Value::String(format!("{}", pids as i64));
    }
    Ok(serde_yaml_ng::to_string(&eviction)?
        .lines()
        .map(str::to_string)
        .collect())
}

impl<'a> Bench<'a> {
    pub fn new(rc: &'a RealCluster) -> Self {
        Self { rc, current: None }
    }

    /// Puts `config` in force (the kubelet restarted with its settings; the agent installed
    /// enforcing, or removed). `pid_threshold`: the fork storm's absolute line.
    fn ensure(&mut self, config: Config, pid_threshold: Option<f64>) -> anyhow::Result<()> {
        let fork = pid_threshold.is_some();
        if self.current == Some((config, fork)) && !fork {
            return Ok(());
        }
        let node = self.rc.node0();
        let kubelet = match config {
            Config::KubeletAgentThresholds => KubeletOptions {
                extra: agents_thresholds_for_the_kubelet(pid_threshold)?,
            },
            _ => KubeletOptions::default(),
        };
        self.rc.cluster.restart_kubelet(&node, &kubelet)?;
        match config {
            Config::KubeletAndAgent => {
                let config_yaml = match pid_threshold {
                    Some(p) => Variant::shipped_config_with(&[(
                        "pid.available: \"10%\"",
                        &format!("pid.available: \"{}\"", p as i64),
                    )]),
                    None => Variant::shipped_config_with(&[]),
                };
                self.rc.install(
                    if fork {
                        "race-agent-fork"
                    } else {
                        "race-agent"
                    },
                    &Variant {
                        config: Some(config_yaml),
                        ..Variant::enforcing()
                    },
                )?;
            }
            _ => {
                let _ = self.rc.kubectl.call(
                    &[
                        "-n",
                        AGENT_NS,
                        "delete",
                        "daemonsets",
                        "--all",
                        "--wait=true",
                    ],
                    None,
                    Duration::from_secs(120),
                );
                self.rc
                    .kubectl
                    .wait_for("no agent pod", Duration::from_secs(120), |k| {
                        let pods = k.get_json(&["-n", AGENT_NS, "pods"])?;
                        Ok(pods["items"]
                            .as_array()
                            .is_none_or(|a| a.is_empty())
                            .then_some(()))
                    })?;
            }
        }
        self.current = Some((config, fork));
        Ok(())
    }

    fn allocatable_mib(&self) -> anyhow::Result<f64> {
        let node = self.rc.kubectl.get_json(&["node", &self.rc.node0().name])?;
        let text = node["status"]["allocatable"]["memory"]
            .as_str()
            .context("the Node's allocatable memory")?;
        let q: node_agent_policy::Quantity = text.parse().context("allocatable memory")?;
        Ok(q.checked_value().map_err(|e| anyhow::anyhow!("{e:?}"))? as f64 / 1048576.0)
    }

    /// One run of `scenario` under `config`.
    pub fn run(
        &mut self,
        scenario: Scenario,
        config: Config,
        index: usize,
    ) -> anyhow::Result<RunRecord> {
        let rc = self.rc;
        let node = rc.node0();
        let kubepods = std::path::PathBuf::from("/sys/fs/cgroup/memory/kubepods");
        let pressed = scenario.pressed();
        let pid_threshold = (pressed == Pressed::Pids).then(|| {
            // Read before the kubelet and agent settle: the line is near the run's start.
            let max: f64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(32768.0);
            // SAFETY: sysinfo(2) into a zeroed struct.
            let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            unsafe { libc::sysinfo(&mut info) };
            max - f64::from(info.procs) - PID_MARGIN
        });
        self.ensure(config, pid_threshold)?;
        let allocatable = self.allocatable_mib()?;
        let ns = rc.namespace(&format!("race-{}", scenario.name()));
        let (agent_line, kubelet_line) = match (pressed, config) {
            (Pressed::Memory, Config::KubeletKubeadm) => (None, Some(KUBELET_LINE_MIB)),
            (Pressed::Memory, Config::KubeletAgentThresholds) => (None, Some(AGENT_LINE_MIB)),
            (Pressed::Memory, Config::KubeletAndAgent) => {
                let offset = crate::real_node::kubelet_allocatable_offset(rc, &node)? / 1048576.0;
                (Some(AGENT_LINE_MIB - offset), Some(KUBELET_LINE_MIB))
            }
            (Pressed::Pids, Config::KubeletKubeadm) => (None, None),
            (Pressed::Pids, Config::KubeletAgentThresholds) => (None, pid_threshold),
            (Pressed::Pids, Config::KubeletAndAgent) => (pid_threshold, None),
            (Pressed::Disk, c) => {
                let cap = disk_capacity_mib(rc)?;
                // One disk is nodefs and imagefs at once: the imagefs line is met first
                // (the kubelet's 15 %, the agent's 20 %).
                match c {
                    Config::KubeletKubeadm => (None, Some(0.15 * cap)),
                    Config::KubeletAgentThresholds => (None, Some(0.20 * cap)),
                    Config::KubeletAndAgent => (Some(0.20 * cap), Some(0.15 * cap)),
                }
            }
            (Pressed::LocalStorage, _) => (None, None),
        };

        // The ballast: memory scenarios start a fixed distance above the agent's line.
        if pressed == Pressed::Memory {
            std::thread::sleep(Duration::from_secs(2));
            let ws = observe_ws(&kubepods)?;
            let headroom = allocatable - ws;
            let above = if scenario == Scenario::SlowRamp {
                SLOW_START_ABOVE_MIB
            } else {
                START_ABOVE_AGENT_LINE_MIB
            };
            let ballast = (headroom - AGENT_LINE_MIB - above).floor();
            if ballast > 64.0 {
                let mut b = WorkloadPod::new(
                    "ballast",
                    Qos::Guaranteed,
                    &format!("{}Mi", ballast as u64 + 64),
                    &["memory", &(ballast as u64).to_string(), "0", "64"],
                );
                b.node = Some(node.name.clone());
                rc.kubectl.apply(&b.manifest(&ns.name))?;
                rc.wait_held(&ns.name, &["ballast"], Duration::from_secs(120))?;
                std::thread::sleep(Duration::from_secs(2));
            }
        }

        let uids = Arc::new(Mutex::new(BTreeSet::new()));
        let sampler = Sampler::start(Sources {
            pressed,
            kubepods: kubepods.clone(),
            allocatable_mib: allocatable,
            nodefs: rc.cluster.node_path(&node, "/var/lib/kubelet")?,
            pods: uids.clone(),
        });
        let started_ns = observe::wall_ns();
        let pods = scenario_pods(scenario, &node.name);
        for p in &pods {
            rc.kubectl.apply(&p.manifest(&ns.name))?;
        }
        let names: Vec<String> = pods.iter().map(|p| p.name.clone()).collect();
        // The pods' UIDs, for their cgroups.
        let mut pod_uids = Vec::new();
        for name in &names {
            let uid = rc.kubectl.run(&[
                "-n",
                &ns.name,
                "get",
                "pod",
                name,
                "-o",
                "jsonpath={.metadata.uid}",
            ])?;
            pod_uids.push((name.clone(), uid.trim().to_string()));
        }
        if let Ok(mut set) = uids.lock() {
            set.extend(pod_uids.iter().map(|(_, u)| u.clone()));
        }
        // Until every scenario pod is gone or ended, or the limit.
        let limit = scenario.limit();
        let start = Instant::now();
        let mut conditions = Conditions::default();
        let mut written_ns = None;
        // A condition counts when it turned True in this run: both sides hold one for
        // evictionPressureTransitionPeriod (5 min) after the pressure, so an earlier run's may
        // still be True (lastTransitionTime has whole seconds).
        let since_s = started_ns / 1_000_000_000;
        let poll_conditions = |conditions: &mut Conditions| {
            if let Ok(n) = rc.kubectl.get_json(&["node", &node.name]) {
                for c in n["status"]["conditions"].as_array().into_iter().flatten() {
                    let turned_s = c["lastTransitionTime"]
                        .as_str()
                        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                        .map_or(0, |t| t.as_second());
                    if c["status"] == "True" && turned_s >= since_s {
                        if let Some(t) = c["type"]
                            .as_str()
                            .filter(|t| observe::CONDITIONS.contains(t))
                        {
                            conditions.seen_true.insert(t.to_string());
                        }
                    }
                }
            }
        };
        loop {
            poll_conditions(&mut conditions);
            if written_ns.is_none()
                && pressed == Pressed::LocalStorage
                && rc
                    .kubectl
                    .run(&["-n", &ns.name, "logs", &names[0]])
                    .is_ok_and(|l| l.contains("phase=held"))
            {
                written_ns = Some(observe::wall_ns());
            }
            let list = rc.kubectl.get_json(&["-n", &ns.name, "pods"])?;
            let active = list["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| names.iter().any(|n| p["metadata"]["name"] == n.as_str()))
                .filter(|p| {
                    p["metadata"]["deletionTimestamp"].is_null()
                        && matches!(p["status"]["phase"].as_str(), Some("Pending" | "Running"))
                        && !p["status"]["containerStatuses"][0]["state"]["terminated"].is_object()
                })
                .count();
            if active == 0 || start.elapsed() > limit {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        // What the sides still do once the pressure is gone (over-evictions, conditions): 12 s,
        // more than a kubelet period.
        let tail = Instant::now();
        while tail.elapsed() < Duration::from_secs(12) {
            poll_conditions(&mut conditions);
            std::thread::sleep(Duration::from_millis(500));
        }
        let sampled = sampler.stop();
        let mut evictions =
            observe::agent_evictions(&rc.audit_events()?, &ns.name, AGENT_SA, started_ns);
        let kubelet_log = crate::real_cluster::read_tail(
            &rc.cluster.layout.log(&format!("kubelet-{}", node.name)),
            16 << 20,
        )?;
        evictions.extend(observe::kubelet_evictions(
            &kubelet_log,
            &ns.name,
            started_ns,
        ));
        evictions.sort_by_key(|e| e.wall_ns);
        let name = ns.name.clone();
        drop(ns);
        // The namespace's pods' cgroups gone before the next run.
        let _ = rc
            .kubectl
            .wait_for("the run's cgroups gone", Duration::from_secs(120), |_| {
                Ok(pod_uids
                    .iter()
                    .all(|(_, u)| {
                        !["", "burstable/", "besteffort/"]
                            .iter()
                            .any(|q| kubepods.join(format!("{q}pod{u}")).exists())
                    })
                    .then_some(()))
            });
        eprintln!(
            "race: {} / {} #{index}: {} evictions ({} by the agent), {} OOM kills, lowest {:.0} (namespace {name})",
            scenario.name(),
            config.label(),
            evictions.len(),
            evictions.iter().filter(|e| e.by == By::Agent).count(),
            sampled.oom_kills.len(),
            sampled.samples.iter().map(|s| s.available).fold(f64::INFINITY, f64::min),
        );
        Ok(RunRecord {
            scenario,
            config,
            index,
            started_ns,
            agent_line,
            kubelet_line,
            sampled,
            evictions,
            conditions,
            pods: pod_uids,
            written_ns,
        })
    }
}

fn observe_ws(kubepods: &std::path::Path) -> anyhow::Result<f64> {
    let usage: f64 = std::fs::read_to_string(kubepods.join("memory.usage_in_bytes"))?
        .trim()
        .parse()?;
    let stat = std::fs::read_to_string(kubepods.join("memory.stat"))?;
    let inactive: f64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("total_inactive_file "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    Ok((usage - inactive) / 1048576.0)
}

fn disk_capacity_mib(rc: &RealCluster) -> anyhow::Result<f64> {
    let path = rc.cluster.node_path(&rc.node0(), "/var/lib/kubelet")?;
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
    // SAFETY: statvfs(3) into a zeroed struct with a NUL-terminated path.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    anyhow::ensure!(
        unsafe { libc::statvfs(c.as_ptr(), &mut s) } == 0,
        "statvfs of the node's disk"
    );
    Ok(s.f_blocks as f64 * s.f_frsize as f64 / 1048576.0)
}

/// The scenario's pods, on `node`.
fn scenario_pods(scenario: Scenario, node: &str) -> Vec<WorkloadPod> {
    let ramp = |name: &str, request: &str, mib: u64, rate: u64, step: u64| {
        let mut p = WorkloadPod::new(
            name,
            Qos::Burstable,
            request,
            &[
                "memory",
                &mib.to_string(),
                &rate.to_string(),
                &step.to_string(),
            ],
        );
        p.node = Some(node.to_string());
        p
    };
    match scenario {
        Scenario::SlowRamp => vec![ramp("ramp", "64Mi", 3000, 5, 1)],
        Scenario::FastRamp => vec![ramp("ramp", "64Mi", 3000, 300, 1)],
        Scenario::FastestRamp => vec![ramp("ramp", "64Mi", 3000, 0, 1)],
        Scenario::Burst => vec![ramp("burst", "64Mi", 1000, 0, 1000)],
        Scenario::ManySmallPods => (0..8)
            .map(|i| ramp(&format!("small-{i}"), "32Mi", 400, 20, 1))
            .collect(),
        Scenario::ForkStorm => {
            let mut p = WorkloadPod::new("storm", Qos::Burstable, "64Mi", &["forks", "3000"]);
            p.node = Some(node.to_string());
            vec![p]
        }
        Scenario::DiskFill => {
            let mut p = WorkloadPod::new(
                "filler",
                Qos::BestEffort,
                "",
                &["fill", "/scratch/data", "8000", "200"],
            );
            p.node = Some(node.to_string());
            p.extra_spec
                .push("  volumes: [{name: scratch, emptyDir: {}}]".into());
            p.extra_container
                .push("      volumeMounts: [{name: scratch, mountPath: /scratch}]".into());
            vec![p]
        }
        Scenario::EmptyDirOverLimit => {
            let mut p = WorkloadPod::new(
                "over",
                Qos::BestEffort,
                "",
                &["allocate", "/scratch/data", "200"],
            );
            p.node = Some(node.to_string());
            p.extra_spec
                .push("  volumes: [{name: scratch, emptyDir: {sizeLimit: 100Mi}}]".into());
            p.extra_container
                .push("      volumeMounts: [{name: scratch, mountPath: /scratch}]".into());
            vec![p]
        }
    }
}
