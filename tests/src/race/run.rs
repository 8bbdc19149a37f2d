//! One run: a configuration in force, a namespace with the ballast and the scenario's pods,
//! everything observed until the pods have ended or the run's limit, then the namespace
//! deleted and its cgroups waited for.
//!
//! Configurations change between runs (the bench interleaves them run by run): the kubelet is
//! restarted only when its thresholds change, and the agent's DaemonSet, installed once,
//! enforcing, is put on or taken off the node by a label its `nodeSelector` asks for.

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use node_agent_cluster::node_components::KubeletOptions;
use serde::{Deserialize, Serialize};

use super::{
    observe::{self, Conditions, Decision, RecordWatch, Sampled, Sampler, Sources},
    Config, Pressed, Scenario,
};
use crate::real_cluster::{Patch, Qos, RealCluster, Variant, WorkloadPod, AGENT_NS};

/// Each side's line on the memory axis (the kubepods cgroup's headroom, MiB): the hard
/// `memory.available` threshold, which both sides apply to that headroom as
/// `allocatableMemory.available` (the kubelet's `addAllocatableThresholds`; the agent's the
/// same).
pub const AGENT_LINE_MIB: f64 = 200.0;
pub const KUBELET_LINE_KUBEADM_MIB: f64 = 100.0;
pub const KUBELET_LINE_AGENTS_MIB: f64 = 200.0;
/// The fork storm's thresholds: this many PIDs below pid.available at the run's start.
const PID_MARGIN: f64 = 1500.0;
/// The label the race's agent DaemonSet asks of a node: the agent is on the node while it is
/// there.
const AGENT_LABEL: &str = "node-agent.io/race";
/// What the ballast's pod holds besides the memory it is asked to (its sandbox, its
/// process), MiB: the headroom at the start is measured when the scenario's pods are created,
/// before they hold anything.
const BALLAST_OVERHEAD_MIB: f64 = 4.0;
/// The ballast's priority class, made by the bench: above the scenario pods (0).
pub const BALLAST_PRIORITY_CLASS: &str = "race-ballast";
/// What the run watches after its pods ended: a kubelet period and a bit, for late
/// evictions (over-evictions) and conditions.
const TAIL: Duration = Duration::from_secs(11);

/// What a run saw.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRecord {
    pub scenario: Scenario,
    pub config: Config,
    /// Which round of the bench (each round runs every scenario in every configuration).
    pub round: usize,
    /// When the scenario's pods were created.
    pub started_ns: i64,
    /// Each side's line on the pressed signal (headroom MiB, or PIDs, or free MiB), as set in
    /// this run.
    pub agent_line: Option<f64>,
    pub kubelet_line: Option<f64>,
    /// The pressed signal when the scenario's pods were created.
    pub start_available: Option<f64>,
    pub sampled: Sampled,
    /// Each side's decisions to evict pods of the run, in time order.
    pub decisions: Vec<Decision>,
    /// Each pod's first API record of its end (`Failed`/`Evicted`, or marked deleted), by name.
    pub records: std::collections::BTreeMap<String, i64>,
    pub conditions: Conditions,
    /// The scenario pods' names and UIDs.
    pub pods: Vec<(String, String)>,
    /// The ballast pod's name and UID (memory scenarios): never the victim to choose.
    pub ballast: Option<(String, String)>,
    /// Restarts in place of the scenario pods' containers (0 where nothing restarted them).
    pub restarts: u64,
    /// Local storage: when the pod's write was done (its `phase=held`), the clock both sides
    /// start from.
    pub written_ns: Option<i64>,
}

/// The kubelet's eviction settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KubeletMode {
    /// kubeadm's: the kubelet's defaults, no PID threshold.
    Kubeadm,
    /// The agent's shipped thresholds (with this PID line, for the fork storm).
    AgentThresholds(Option<i64>),
}

/// What is in force on the node now (`None`: not known yet, set at the first run).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct InForce {
    kubelet: Option<KubeletMode>,
    /// The agent's DaemonSet installed with this PID line, and whether it is on the node.
    agent: Option<(Option<i64>, bool)>,
}

/// The configuration in force, changed only as far as a run needs.
pub struct Bench<'a> {
    pub rc: &'a RealCluster,
    now: InForce,
}

/// The kubelet's eviction settings equal to the agent's shipped ones (deploy/config.yaml's
/// `eviction:` section, as KubeletConfiguration lines).
fn agents_thresholds_for_the_kubelet(pid_threshold: Option<i64>) -> anyhow::Result<Vec<String>> {
    let text =
        std::fs::read_to_string(crate::real_cluster::workspace().join("deploy/config.yaml"))?;
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text)?;
    let mut eviction = doc
        .get("eviction")
        .cloned()
        .context("deploy/config.yaml has no eviction section")?;
    if let (Some(pids), Some(hard)) = (pid_threshold, eviction.get_mut("evictionHard")) {
        hard["pid.available"] = serde_yaml_ng::Value::String(format!("{pids}"));
    }
    Ok(serde_yaml_ng::to_string(&eviction)?
        .lines()
        .map(str::to_string)
        .collect())
}

impl<'a> Bench<'a> {
    pub fn new(rc: &'a RealCluster) -> Self {
        Self {
            rc,
            now: InForce::default(),
        }
    }

    /// The ballast's priority class (1000000: above the scenario pods, below anything
    /// critical).
    pub fn prepare(&self) -> anyhow::Result<()> {
        self.rc.kubectl.apply(&format!(
            "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata:\n  name: {BALLAST_PRIORITY_CLASS}\nvalue: 1000000\npreemptionPolicy: Never\ndescription: the race's ballast, never the victim to choose\n"
        ))?;
        Ok(())
    }

    /// Puts `config` in force: the kubelet restarted with its settings if they change; the
    /// agent installed enforcing (once per PID line) and on the node, or taken off it.
    /// `pid_threshold`: the fork storm's absolute line.
    fn ensure(&mut self, config: Config, pid_threshold: Option<i64>) -> anyhow::Result<()> {
        let node = self.rc.node0();
        let kubelet = if config.kubelet_has_agents_thresholds() {
            KubeletMode::AgentThresholds(pid_threshold)
        } else {
            KubeletMode::Kubeadm
        };
        if self.now.kubelet != Some(kubelet) {
            let options = match kubelet {
                KubeletMode::AgentThresholds(pids) => KubeletOptions {
                    extra: agents_thresholds_for_the_kubelet(pids)?,
                },
                KubeletMode::Kubeadm => KubeletOptions::default(),
            };
            self.rc.cluster.restart_kubelet(&node, &options)?;
            self.now.kubelet = Some(kubelet);
        }
        let wanted_agent = config.has_agent();
        // The agent's DaemonSet: installed once (and again for a new PID line), enforcing.
        let installed_for = self.now.agent.map(|(p, _)| p);
        if installed_for != Some(pid_threshold) {
            self.label_node(wanted_agent)?;
            let config_yaml = match pid_threshold {
                Some(p) => Variant::shipped_config_with(&[(
                    "pid.available: \"10%\"",
                    &format!("pid.available: \"{p}\""),
                )]),
                None => Variant::shipped_config_with(&[]),
            };
            self.rc.apply_variant(
                "race-agent",
                &Variant {
                    config: Some(config_yaml),
                    patches: vec![Patch {
                        kind: "DaemonSet".into(),
                        name: "node-agent".into(),
                        operations: serde_json::json!([{
                            "op": "add",
                            "path": format!("/spec/template/spec/nodeSelector/{}", AGENT_LABEL.replace('/', "~1")),
                            "value": "on",
                        }]),
                    }],
                    ..Variant::enforcing()
                },
            )?;
            self.now.agent = Some((pid_threshold, wanted_agent));
            self.wait_agent(wanted_agent)?;
        } else if self.now.agent.map(|(_, on)| on) != Some(wanted_agent) {
            self.label_node(wanted_agent)?;
            self.now.agent = Some((pid_threshold, wanted_agent));
            self.wait_agent(wanted_agent)?;
        }
        Ok(())
    }

    fn label_node(&self, on: bool) -> anyhow::Result<()> {
        let node = self.rc.node0();
        let label = if on {
            format!("{AGENT_LABEL}=on")
        } else {
            format!("{AGENT_LABEL}-")
        };
        self.rc
            .kubectl
            .run(&["label", "node", &node.name, &label, "--overwrite"])?;
        Ok(())
    }

    /// Waits until the agent is Ready on the node (`on`), or no agent pod is left.
    fn wait_agent(&self, on: bool) -> anyhow::Result<()> {
        self.rc.kubectl.wait_for(
            "the agent on or off the node",
            Duration::from_secs(180),
            |k| {
                let pods = k.get_json(&["-n", AGENT_NS, "pods"])?;
                let items: Vec<&serde_json::Value> =
                    pods["items"].as_array().into_iter().flatten().collect();
                let ready = items.iter().any(|p| {
                    p["metadata"]["deletionTimestamp"].is_null()
                        && p["status"]["conditions"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                });
                let done = if on {
                    ready && items.len() == 1
                } else {
                    items.is_empty()
                };
                Ok(done.then_some(()))
            },
        )
    }

    /// The agent's pod on the node, when it is there.
    fn agent_pod(&self) -> Option<String> {
        let pods = self.rc.kubectl.get_json(&["-n", AGENT_NS, "pods"]).ok()?;
        pods["items"].as_array()?.iter().find_map(|p| {
            p["metadata"]["deletionTimestamp"]
                .is_null()
                .then(|| p["metadata"]["name"].as_str().map(str::to_string))
                .flatten()
        })
    }

    /// One run of `scenario` under `config`.
    pub fn run(
        &mut self,
        scenario: Scenario,
        config: Config,
        round: usize,
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
            (max - f64::from(info.procs) - PID_MARGIN) as i64
        });
        self.ensure(config, pid_threshold)?;
        let ns = rc.namespace(&format!("race-{}", scenario.name()));
        let (agent_line, kubelet_line) = match (pressed, config) {
            (Pressed::Memory, Config::KubeletKubeadm) => (None, Some(KUBELET_LINE_KUBEADM_MIB)),
            (Pressed::Memory, Config::KubeletAgentThresholds) => {
                (None, Some(KUBELET_LINE_AGENTS_MIB))
            }
            (Pressed::Memory, Config::KubeletAndAgent) => {
                (Some(AGENT_LINE_MIB), Some(KUBELET_LINE_KUBEADM_MIB))
            }
            (Pressed::Pids, Config::KubeletKubeadm) => (None, None),
            (Pressed::Pids, Config::KubeletAgentThresholds) => {
                (None, pid_threshold.map(|p| p as f64))
            }
            (Pressed::Pids, Config::KubeletAndAgent) => (pid_threshold.map(|p| p as f64), None),
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

        // The ballast: memory scenarios start at the same headroom in every configuration.
        let mut ballast = None;
        if let Some(start) = scenario.start_headroom_mib() {
            let headroom = settled_headroom(&kubepods)?;
            let size = (headroom - start - BALLAST_OVERHEAD_MIB).floor();
            anyhow::ensure!(
                size > 64.0,
                "the node's pods already hold too much: headroom {headroom:.0} MiB, {start:.0} wanted at the start"
            );
            // Never the victim to choose: above every scenario pod in priority, which both
            // sides rank by right after "exceeds its request" (which every pod here does).
            // Within its request it would ask for more than the node's allocatable leaves.
            let mut b = WorkloadPod::new(
                "ballast",
                Qos::Burstable,
                "64Mi",
                &["memory", &(size as u64).to_string(), "0", "64"],
            );
            b.priority_class = Some(BALLAST_PRIORITY_CLASS.into());
            b.node = Some(node.name.clone());
            b.extra_spec
                .push("  tolerations: [{operator: Exists}]".into());
            rc.kubectl.apply(&b.manifest(&ns.name))?;
            rc.wait_held(&ns.name, &["ballast"], Duration::from_secs(120))?;
            std::thread::sleep(Duration::from_secs(1));
            ballast = Some(("ballast".to_string(), pod_uid(rc, &ns.name, "ballast")?));
        }

        let uids = Arc::new(Mutex::new(BTreeSet::new()));
        if let (Some((_, uid)), Ok(mut set)) = (&ballast, uids.lock()) {
            set.insert(uid.clone());
        }
        let sampler = Sampler::start(Sources {
            pressed,
            kubepods: kubepods.clone(),
            nodefs: rc.cluster.node_path(&node, "/var/lib/kubelet")?,
            pods: uids.clone(),
        });
        let watch = RecordWatch::start(&rc.kubectl, &ns.name)?;
        let start_available = match pressed {
            Pressed::Memory => observe::kubepods_headroom_mib(&kubepods),
            _ => None,
        };
        let started_ns = observe::wall_ns();
        let pods = scenario_pods(scenario, &node.name);
        for p in &pods {
            rc.kubectl.apply(&p.manifest(&ns.name))?;
        }
        let names: Vec<String> = pods.iter().map(|p| p.name.clone()).collect();
        // The pods' UIDs, for their cgroups.
        let mut pod_uids = Vec::new();
        for name in &names {
            let uid = pod_uid(rc, &ns.name, name)?;
            if let Ok(mut set) = uids.lock() {
                set.insert(uid.clone());
            }
            pod_uids.push((name.clone(), uid));
        }
        // Until every scenario pod is gone or ended, or the limit.
        let limit = scenario.limit();
        let start = Instant::now();
        let mut conditions = Conditions::default();
        let mut written_ns = None;
        let mut restarts = 0;
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
            let mut active = 0;
            for p in list["items"].as_array().into_iter().flatten() {
                if !names.iter().any(|n| p["metadata"]["name"] == n.as_str()) {
                    continue;
                }
                restarts = restarts.max(
                    p["status"]["containerStatuses"][0]["restartCount"]
                        .as_u64()
                        .unwrap_or(0),
                );
                if p["metadata"]["deletionTimestamp"].is_null()
                    && matches!(p["status"]["phase"].as_str(), Some("Pending" | "Running"))
                    && !p["status"]["containerStatuses"][0]["state"]["terminated"].is_object()
                {
                    active += 1;
                }
            }
            if active == 0 || start.elapsed() > limit {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        // What the sides still do once the pressure is gone (over-evictions, conditions).
        let tail = Instant::now();
        while tail.elapsed() < TAIL {
            poll_conditions(&mut conditions);
            std::thread::sleep(Duration::from_millis(500));
        }
        let sampled = sampler.stop();
        let records = watch.stop();
        let mut decisions = Vec::new();
        if config.has_agent() {
            let pod = self.agent_pod().context("the agent's pod on the node")?;
            let since = jiff::Timestamp::from_nanosecond(i128::from(started_ns) - 60_000_000_000)
                .map(|t| t.to_string())
                .unwrap_or_default();
            let log = rc.kubectl.run(&[
                "-n",
                AGENT_NS,
                "logs",
                &pod,
                &format!("--since-time={since}"),
            ])?;
            decisions.extend(observe::agent_decisions(&log, &ns.name, started_ns));
        }
        let kubelet_log = crate::real_cluster::read_tail(
            &rc.cluster.layout.log(&format!("kubelet-{}", node.name)),
            16 << 20,
        )?;
        decisions.extend(observe::kubelet_decisions(
            &kubelet_log,
            &ns.name,
            started_ns,
        ));
        decisions.sort_by_key(|d| d.wall_ns);
        let name = ns.name.clone();
        drop(ns);
        // The namespace's pods' cgroups gone before the next run.
        let all: Vec<String> = pod_uids
            .iter()
            .map(|(_, u)| u.clone())
            .chain(ballast.iter().map(|(_, u)| u.clone()))
            .collect();
        let _ = rc
            .kubectl
            .wait_for("the run's cgroups gone", Duration::from_secs(120), |_| {
                Ok(all
                    .iter()
                    .all(|u| {
                        !observe::pod_cgroups(&kubepods, u)
                            .iter()
                            .any(|d| d.exists())
                    })
                    .then_some(()))
            });
        eprintln!(
            "race: {} / {} round {round}: {} decisions ({} by the agent), {} OOM kills, lowest {:.0}, started at {} (namespace {name})",
            scenario.name(),
            config.label(),
            decisions.len(),
            decisions
                .iter()
                .filter(|d| d.by == observe::By::Agent)
                .count(),
            sampled.oom_kills.len(),
            sampled
                .samples
                .iter()
                .map(|s| s.available)
                .fold(f64::INFINITY, f64::min),
            start_available.map_or("-".into(), |s| format!("{s:.0}")),
        );
        Ok(RunRecord {
            scenario,
            config,
            round,
            started_ns,
            agent_line,
            kubelet_line,
            start_available,
            sampled,
            decisions,
            records,
            conditions,
            pods: pod_uids,
            ballast,
            restarts,
            written_ns,
        })
    }
}

fn pod_uid(rc: &RealCluster, namespace: &str, name: &str) -> anyhow::Result<String> {
    Ok(rc
        .kubectl
        .run(&[
            "-n",
            namespace,
            "get",
            "pod",
            name,
            "-o",
            "jsonpath={.metadata.uid}",
        ])?
        .trim()
        .to_string())
}

/// The kubepods headroom once the previous run's memory is back: two readings 1 s apart
/// within 8 MiB of each other (bounded).
fn settled_headroom(kubepods: &std::path::Path) -> anyhow::Result<f64> {
    let read = || observe::kubepods_headroom_mib(kubepods).context("reading kubepods' memory");
    let mut last = read()?;
    for _ in 0..30 {
        std::thread::sleep(Duration::from_secs(1));
        let now = read()?;
        if (now - last).abs() < 8.0 {
            return Ok(now);
        }
        last = now;
    }
    Ok(last)
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

/// The scenario's pods, on `node`, tolerating every taint (both sides' pressure taints stay
/// for minutes after a run).
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
        p.extra_spec
            .push("  tolerations: [{operator: Exists}]".into());
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
        Scenario::IgnoresSigterm => {
            // The shell is PID 1 and has no handler: SIGTERM does nothing (a PID namespace's
            // first process gets no default action); its child never hears of it.
            let mut p = ramp("shell", "64Mi", 3000, 300, 1);
            p.command = Some(vec![
                "/bin/sh".into(),
                "-c".into(),
                "/bin/pod-workload memory 3000 300 1; sleep 100000".into(),
            ]);
            p.args.clear();
            vec![p]
        }
        Scenario::ForkStorm => {
            let mut p = WorkloadPod::new("storm", Qos::Burstable, "64Mi", &["forks", "3000"]);
            p.node = Some(node.to_string());
            p.extra_spec
                .push("  tolerations: [{operator: Exists}]".into());
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
            p.extra_spec.push(
                "  tolerations: [{operator: Exists}]\n  volumes: [{name: scratch, emptyDir: {}}]"
                    .into(),
            );
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
            p.extra_spec.push(
                "  tolerations: [{operator: Exists}]\n  volumes: [{name: scratch, emptyDir: {sizeLimit: 100Mi}}]"
                    .into(),
            );
            p.extra_container
                .push("      volumeMounts: [{name: scratch, mountPath: /scratch}]".into());
            vec![p]
        }
    }
}
