//! What the real-cluster tests do to a node beyond kubectl: its kubelet restarted with other
//! settings (and put back, also when the test fails), the agent's process found and killed
//! from the host, memory pressure sized from the agent's own figure, and Nodes registered
//! without a kubelet.

use std::time::Duration;

use anyhow::{bail, Context as _};
use node_agent_cluster::{node_components::KubeletOptions, NodeSpec};
use serde_json::Value;

use crate::real_cluster::{wait_running, Qos, RealCluster, Variant, WorkloadPod, AGENT_NS};

const MIB: f64 = 1048576.0;

/// Restarts the kubelet of `node` with `options`; the guard it returns restarts it with the
/// default options (kubeadm's) when dropped.
pub fn restart_kubelet<'a>(
    rc: &'a RealCluster,
    node: &NodeSpec,
    options: &KubeletOptions,
) -> anyhow::Result<KubeletRestore<'a>> {
    let guard = KubeletRestore {
        rc,
        node: node.clone(),
        before_restart: Vec::new(),
    };
    rc.cluster.restart_kubelet(node, options).with_context(|| {
        format!(
            "restarting {}'s kubelet with {:?}",
            node.name, options.extra
        )
    })?;
    Ok(guard)
}

/// See [`restart_kubelet`].
pub struct KubeletRestore<'a> {
    rc: &'a RealCluster,
    node: NodeSpec,
    /// Files inside the node removed before the kubelet restarts with its defaults (what the
    /// other settings made, e.g. a bootstrapped serving certificate); a name ending in `*`
    /// stands for every file of its directory that starts with the rest.
    pub before_restart: Vec<String>,
}

impl Drop for KubeletRestore<'_> {
    fn drop(&mut self) {
        for path in &self.before_restart {
            let Ok(host) = self.rc.cluster.node_path(&self.node, path) else {
                continue;
            };
            match path.strip_suffix('*') {
                None => {
                    let _ = std::fs::remove_file(host);
                }
                Some(_) => {
                    let prefix = host
                        .file_name()
                        .map(|n| n.to_string_lossy().trim_end_matches('*').to_string())
                        .unwrap_or_default();
                    let dir = host
                        .parent()
                        .map(std::path::Path::to_path_buf)
                        .unwrap_or_default();
                    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                        if entry.file_name().to_string_lossy().starts_with(&prefix) {
                            let _ = std::fs::remove_file(entry.path());
                        }
                    }
                }
            }
        }
        if let Err(e) = self
            .rc
            .cluster
            .restart_kubelet(&self.node, &KubeletOptions::default())
        {
            eprintln!(
                "restoring {}'s kubelet to its defaults: {e:#}",
                self.node.name
            );
        }
    }
}

/// The kubelet's log (the whole file: every start appends to it).
pub fn kubelet_log(rc: &RealCluster, node: &NodeSpec) -> anyhow::Result<String> {
    let path = rc.cluster.layout.log(&format!("kubelet-{}", node.name));
    crate::real_cluster::read_tail(&path, 64 << 20)
}

/// A place in the kubelet's log (its length now): what it writes from here on is read with
/// [`kubelet_log_since`].
pub fn kubelet_log_mark(rc: &RealCluster, node: &NodeSpec) -> anyhow::Result<u64> {
    let path = rc.cluster.layout.log(&format!("kubelet-{}", node.name));
    Ok(std::fs::metadata(&path)
        .with_context(|| format!("the kubelet's log {}", path.display()))?
        .len())
}

/// Everything the kubelet logged since `mark`, whole: an error, never an empty or partial
/// text, when the log no longer covers the window (cut or replaced since the mark) or holds
/// more than 512 MiB since it. A check that nothing happened reads all of it or fails.
pub fn kubelet_log_since(rc: &RealCluster, node: &NodeSpec, mark: u64) -> anyhow::Result<String> {
    use std::io::{Read as _, Seek as _};
    const MOST: u64 = 512 << 20;
    let path = rc.cluster.layout.log(&format!("kubelet-{}", node.name));
    let mut f = std::fs::File::open(&path)
        .with_context(|| format!("the kubelet's log {}", path.display()))?;
    let len = f.metadata()?.len();
    anyhow::ensure!(
        len >= mark,
        "the kubelet's log {} is {len} bytes, shorter than at the mark ({mark}): it was cut or replaced, so it does not cover the window",
        path.display()
    );
    anyhow::ensure!(
        len - mark <= MOST,
        "the kubelet logged {} bytes since the mark, more than the {MOST} read",
        len - mark
    );
    f.seek(std::io::SeekFrom::Start(mark))?;
    let mut buf = Vec::new();
    f.take(len - mark).read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// The host PID of the `node-agent run` process of the agent pod `pod` (its cgroup names the
/// pod's UID, so the agents of other clusters on this host are never taken for it).
pub fn agent_pid(rc: &RealCluster, pod: &str) -> anyhow::Result<u32> {
    let uid = pod_uid(rc, AGENT_NS, pod)?;
    match processes_in_pod(&uid, |args| {
        args.first().is_some_and(|a| a.ends_with(b"/node-agent"))
            && args.get(1).is_some_and(|a| *a == b"run")
    })?
    .as_slice()
    {
        [pid] => Ok(*pid),
        [] => bail!("no node-agent process in the cgroup of pod {pod} (pod{uid})"),
        more => bail!("several node-agent processes for pod {pod}: {more:?}"),
    }
}

/// The host PIDs of the processes in the cgroup of the pod with UID `uid` whose command line
/// (its arguments, split) `wanted` takes.
fn processes_in_pod(uid: &str, wanted: impl Fn(&[&[u8]]) -> bool) -> anyhow::Result<Vec<u32>> {
    let marker = format!("pod{uid}");
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        if !wanted(&args) {
            continue;
        }
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        if cgroup.contains(&marker) {
            found.push(pid);
        }
    }
    Ok(found)
}

/// The host PID of the workload process (`pod-workload memory` or `armed`, not the sandbox's
/// `pause`) of the pod with UID `uid`.
pub fn workload_pid(uid: &str) -> anyhow::Result<u32> {
    match processes_in_pod(uid, |args| {
        args.first().is_some_and(|a| a.ends_with(b"pod-workload"))
            && args
                .get(1)
                .is_some_and(|a| *a == b"memory" || *a == b"armed")
    })?
    .as_slice()
    {
        [pid] => Ok(*pid),
        other => bail!("expected one workload process in pod {uid}, found {other:?}"),
    }
}

/// The UID of pod `namespace/pod`.
pub fn pod_uid(rc: &RealCluster, ns: &str, pod: &str) -> anyhow::Result<String> {
    Ok(rc
        .kubectl
        .run(&[
            "-n",
            ns,
            "get",
            "pod",
            pod,
            "-o",
            "jsonpath={.metadata.uid}",
        ])?
        .trim()
        .to_string())
}

/// SIGKILL to `pid`.
pub fn kill9(pid: u32) -> anyhow::Result<()> {
    // SAFETY: kill(2) of a process found by its command line and cgroup just before.
    let rc = unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    if rc != 0 {
        bail!("kill -9 {pid}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// The agent's headroom on `allocatableMemory.available`, in bytes (its /metrics).
pub fn allocatable_headroom(rc: &RealCluster, agent: &str) -> anyhow::Result<f64> {
    rc.metric(
        agent,
        "node_agent_signal_available_bytes{eviction_signal=\"allocatableMemory.available\"}",
    )?
    .context("the agent exports no allocatableMemory.available")
}

/// A Burstable pod on `node` that grows until `allocatableMemory.available` is about
/// `leave_mib` MiB (measured by the agent `agent` just before), then holds it; Running when
/// this returns. `leave_mib` 150 is past the agent's shipped line (200Mi) and short of the
/// kubelet's (100Mi).
pub fn grow_until_left(
    rc: &RealCluster,
    namespace: &str,
    agent: &str,
    node: &str,
    mut pod: WorkloadPod,
    leave_mib: f64,
    rate_mib_s: u64,
) -> anyhow::Result<WorkloadPod> {
    let headroom = allocatable_headroom(rc, agent)? / MIB;
    let target = (headroom - leave_mib).floor();
    if target < 512.0 {
        bail!("the node has no room for the grower: {headroom:.0} MiB left for pods");
    }
    pod.args = vec!["memory".into(), format!("{target}"), rate_mib_s.to_string()];
    pod.node = Some(node.to_string());
    rc.kubectl.apply(&pod.manifest(namespace))?;
    wait_running(
        &rc.kubectl,
        namespace,
        &[&pod.name],
        Duration::from_secs(90),
    )?;
    Ok(pod)
}

/// Enforcing, the shipped config, pods labelled `hold: "yes"` excluded.
pub fn holding() -> Variant {
    Variant {
        config: Some(Variant::shipped_config_with(&[(
            "matchLabels: {}",
            "matchLabels: {hold: \"yes\"}",
        )])),
        ..Variant::enforcing()
    }
}

/// A pod the agent may not evict, holding memory past its line (and short of the kubelet's);
/// returns once the agent reports pressure and has tainted the node.
pub fn hold_pressure(rc: &RealCluster, namespace: &str, node: &str) -> anyhow::Result<()> {
    let agent = rc.agent_pod(node, "node-agent")?;
    let mut holder = WorkloadPod::new("holder", Qos::Burstable, "64Mi", &[]);
    holder.labels.push(("hold".into(), "yes".into()));
    grow_until_left(rc, namespace, &agent, node, holder, 150.0, 400)?;
    wait_pressure_reported(rc, node)
}

/// Waits until the agent reports pressure on `node`: its condition True and its taint on.
pub fn wait_pressure_reported(rc: &RealCluster, node: &str) -> anyhow::Result<()> {
    rc.kubectl.wait_for(
        "NodeAgentPressure True and the pressure taint",
        Duration::from_secs(90),
        |_| {
            let c = condition(rc, node, "NodeAgentPressure")?;
            Ok(
                (c.is_some_and(|c| c["status"] == "True") && pressure_taint(rc, node)?.is_some())
                    .then_some(()),
            )
        },
    )
}

/// Waits until the pod's log says it holds its memory.
pub fn wait_held(rc: &RealCluster, namespace: &str, pod: &str) -> anyhow::Result<()> {
    rc.kubectl.wait_for(
        &format!("{namespace}/{pod} holds its memory"),
        Duration::from_secs(90),
        |k| {
            Ok(k.run(&["-n", namespace, "logs", pod])?
                .contains("phase=held")
                .then_some(()))
        },
    )
}

/// A Node registered by hand, with no kubelet behind it; deleted (with the pods bound to it)
/// when dropped.
pub struct GhostNode<'a> {
    rc: &'a RealCluster,
    pub name: String,
}

impl<'a> GhostNode<'a> {
    pub fn register(rc: &'a RealCluster, name: &str) -> anyhow::Result<Self> {
        let guard = Self {
            rc,
            name: name.to_string(),
        };
        rc.kubectl.apply(&format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels: {{kubernetes.io/hostname: {name}}}\n"
        ))?;
        Ok(guard)
    }
}

impl Drop for GhostNode<'_> {
    fn drop(&mut self) {
        // Its pods never had a kubelet to confirm their end: forced.
        if let Ok(pods) = self.rc.kubectl.get_json(&[
            "pods",
            "-A",
            "--field-selector",
            &format!("spec.nodeName={}", self.name),
        ]) {
            for p in pods["items"].as_array().into_iter().flatten() {
                let (ns, name) = (
                    p["metadata"]["namespace"].as_str().unwrap_or(""),
                    p["metadata"]["name"].as_str().unwrap_or(""),
                );
                let _ = self.rc.kubectl.call(
                    &[
                        "-n",
                        ns,
                        "delete",
                        "pod",
                        name,
                        "--grace-period=0",
                        "--force",
                    ],
                    None,
                    Duration::from_secs(30),
                );
            }
        }
        let _ = self.rc.kubectl.call(
            &["delete", "node", &self.name, "--ignore-not-found"],
            None,
            Duration::from_secs(30),
        );
    }
}

/// The node's taints, each as JSON.
pub fn taints(rc: &RealCluster, node: &str) -> anyhow::Result<Vec<Value>> {
    let n = rc.kubectl.get_json(&["node", node])?;
    Ok(n["spec"]["taints"].as_array().cloned().unwrap_or_default())
}

/// The node's condition of type `kind`.
pub fn condition(rc: &RealCluster, node: &str, kind: &str) -> anyhow::Result<Option<Value>> {
    let n = rc.kubectl.get_json(&["node", node])?;
    Ok(n["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == kind)
        .cloned())
}

/// The agent's pressure taint on `node`, if present.
pub fn pressure_taint(rc: &RealCluster, node: &str) -> anyhow::Result<Option<Value>> {
    Ok(taints(rc, node)?
        .into_iter()
        .find(|t| t["key"] == "node-agent.io/pressure"))
}

/// The kubelet's own `allocatableMemory.available`, in bytes: its pods cgroup's available
/// memory in its `/stats/summary` (the cgroup's limit less its working set), read through the
/// API server's node proxy as an admin.
pub fn kubelet_allocatable_available(rc: &RealCluster, node: &str) -> anyhow::Result<f64> {
    let summary: Value = serde_json::from_str(&rc.kubectl.run(&[
        "get",
        "--raw",
        &format!("/api/v1/nodes/{node}/proxy/stats/summary"),
    ])?)?;
    summary["node"]["systemContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == "pods")
        .and_then(|c| c["memory"]["availableBytes"].as_f64())
        .context("the kubelet's summary has no pods container with availableBytes")
}

/// The kubelet's pods cgroup's memory limit (what the kubelet and the agent measure
/// `allocatableMemory.available` against) less the Node's `status.allocatable.memory` (which
/// also has the hard eviction threshold taken off), in bytes. Read from the cgroup and the Node
/// at once, where the kubelet's `/stats/summary` lags by its housekeeping.
pub fn kubelet_allocatable_offset(rc: &RealCluster, node: &NodeSpec) -> anyhow::Result<f64> {
    let limit_file = format!(
        "/sys/fs/cgroup/memory/{}/kubepods/memory.limit_in_bytes",
        node.cgroup_root.trim_matches('/')
    )
    .replace("memory//kubepods", "memory/kubepods");
    let limit: f64 = std::fs::read_to_string(&limit_file)
        .with_context(|| format!("reading {limit_file}"))?
        .trim()
        .parse()?;
    let allocatable = rc.kubectl.run(&[
        "get",
        "node",
        &node.name,
        "-o",
        "jsonpath={.status.allocatable.memory}",
    ])?;
    Ok(limit - quantity_bytes(allocatable.trim())?)
}

/// A memory quantity as the API server prints one (`3996Mi`, `4190109696`, `4092Ki`).
pub fn quantity_bytes(text: &str) -> anyhow::Result<f64> {
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit())
        .map_or((text, ""), |i| text.split_at(i));
    let scale = match unit {
        "" => 1.0,
        "Ki" => 1024.0,
        "Mi" => 1048576.0,
        "Gi" => 1073741824.0,
        other => bail!("quantity {text:?}: unit {other:?} not read here"),
    };
    Ok(number.parse::<f64>()? * scale)
}

/// The kubelet's `allocatableMemory.available` as it computes it (cAdvisor's figures for its
/// pods cgroup): the cgroup's memory limit less its working set (usage less inactive file
/// pages), read from the cgroup now, in bytes. The kubelet's `/stats/summary` says the same,
/// up to its housekeeping period late.
pub fn pods_cgroup_available(node: &NodeSpec) -> anyhow::Result<f64> {
    let dir = std::path::Path::new("/sys/fs/cgroup/memory")
        .join(node.cgroup_root.trim_start_matches('/'))
        .join("kubepods");
    let read = |file: &str| -> anyhow::Result<String> {
        std::fs::read_to_string(dir.join(file))
            .with_context(|| format!("reading {}/{file}", dir.display()))
    };
    let limit: f64 = read("memory.limit_in_bytes")?.trim().parse()?;
    let usage: f64 = read("memory.usage_in_bytes")?.trim().parse()?;
    let inactive_file: f64 = read("memory.stat")?
        .lines()
        .find_map(|l| l.strip_prefix("total_inactive_file "))
        .context("memory.stat has no total_inactive_file")?
        .trim()
        .parse()?;
    Ok(limit - (usage - inactive_file).max(0.0))
}

/// The node's disk as statfs(2) gives it now, inside the node's mount namespace: (available
/// bytes to an unprivileged writer, capacity bytes). Read fresh, unlike the agent's figure and
/// the kubelet's summary, which can be a sampling period old.
pub fn nodefs_statfs(rc: &RealCluster, node: &NodeSpec) -> anyhow::Result<(f64, f64)> {
    let ns = rc.cluster.node_ns(node)?;
    let out = node_agent_cluster::node::in_ns(
        ns,
        "stat",
        &["--file-system", "--format", "%a %b %S", "/var/lib/kubelet"],
    )?;
    let fields: Vec<f64> = out
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .with_context(|| format!("stat -f printed {out:?}"))?;
    match fields[..] {
        [avail, blocks, size] => Ok((avail * size, blocks * size)),
        _ => anyhow::bail!("stat -f printed {out:?}, not three numbers"),
    }
}

/// Waits for a line of the current agent pod's log containing every one of `needles`: the
/// newest on `node` first, then those on the other nodes, since a rollout surges one node at a
/// time in the controller's order and a new agent that never gets Ready holds it there.
pub fn wait_log(
    rc: &RealCluster,
    node: &str,
    needles: &[&str],
    limit: Duration,
) -> anyhow::Result<String> {
    rc.kubectl.wait_for(
        &format!("an agent log line with {needles:?}"),
        limit,
        |_| {
            let mut running: Vec<(bool, String, String)> = rc
                .running_agent_pods("node-agent")?
                .iter()
                .map(|p| {
                    (
                        p["spec"]["nodeName"] != node,
                        // RFC 3339 at one-second precision: ordered as text; newest first below.
                        p["metadata"]["creationTimestamp"]
                            .as_str()
                            .unwrap_or("")
                            .to_string(),
                        p["metadata"]["name"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect();
            running.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
            for (_, _, pod) in running {
                let logs = rc.agent_logs(&pod)?;
                if let Some(line) = logs.lines().find(|l| needles.iter().all(|n| l.contains(n))) {
                    return Ok(Some(line.to_string()));
                }
            }
            Ok(None)
        },
    )
}
