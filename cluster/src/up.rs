//! `cargo xtask cluster up`: the cluster from nothing to the agent's DaemonSet pod Ready, each
//! step bounded in time, each failure naming the component with the last lines of its log.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};

use crate::{
    compile, control_plane, down,
    images::{self, Archive},
    kubectl::Kubectl,
    layout::{Layout, NodeSpec, APISERVER_PORT},
    node::{self, Lan},
    node_components::{self, KubeletOptions},
    process::{output_of, run, spawn_daemon, Daemon, Namespaces},
    state::{self, State},
};

/// How long each step may take before `up` gives up on it.
const START_LIMIT: Duration = Duration::from_secs(120);

/// Commands `up` needs on this host, with the package that has each.
const HOST_TOOLS: &[(&str, &str)] = &[
    ("/usr/bin/containerd", "containerd"),
    ("/usr/bin/ctr", "containerd"),
    ("/usr/sbin/runc", "runc"),
    ("/usr/lib/cni/bridge", "containernetworking-plugins"),
    ("/usr/bin/buildah", "buildah"),
    ("/usr/sbin/iptables-restore", "iptables"),
    ("/usr/sbin/ip", "iproute2"),
    ("/usr/sbin/mkfs.ext4", "e2fsprogs"),
    ("/usr/bin/file", "file"),
];

/// What `up` installs and how.
#[derive(Debug, Clone, Default)]
pub struct UpOptions {
    /// Nodes besides node 0.
    pub extra_nodes: u8,
    pub kubelet: KubeletOptions,
    /// The agent's image archive (`cargo xtask image`): imported into every node, and the
    /// agent installed through `cluster/overlay`. None: the cluster alone.
    pub agent_image: Option<Archive>,
}

/// One cluster: its directory, its nodes, and the checkout it belongs to.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub workspace: PathBuf,
    pub layout: Layout,
}

fn host_tools_missing() -> Vec<&'static str> {
    let mut missing: Vec<&str> = HOST_TOOLS
        .iter()
        .filter(|(path, _)| !Path::new(path).exists())
        .map(|(_, package)| *package)
        .collect();
    missing.dedup();
    missing
}

/// The Debian packages `up` needs that are missing.
pub fn missing_packages() -> Vec<&'static str> {
    host_tools_missing()
}

impl Cluster {
    pub fn new(workspace: impl Into<PathBuf>) -> Self {
        let workspace = workspace.into();
        Self {
            layout: Layout::default_for(&workspace),
            workspace,
        }
    }

    pub fn kubectl(&self) -> Kubectl {
        Kubectl::new(&self.layout)
    }

    /// The nodes a state file records, else node 0.
    pub fn nodes(&self) -> Vec<NodeSpec> {
        let count = State::load(&self.layout.state())
            .ok()
            .flatten()
            .map_or(1, |s| s.nodes.len().max(1));
        (0..count as u8).map(|i| self.layout.node(i)).collect()
    }

    /// The namespaces of a running node (its holder's).
    pub fn node_ns(&self, node: &NodeSpec) -> anyhow::Result<Namespaces> {
        let state = State::load(&self.layout.state())?
            .context("no cluster is up (no state file): run `cargo xtask cluster up`")?;
        let holder = state
            .processes
            .iter()
            .find(|p| p.name == holder_name(node) && p.is_running())
            .with_context(|| {
                format!(
                    "{}'s holder is not running: the cluster is down or broken",
                    node.name
                )
            })?;
        Ok(Namespaces { holder: holder.pid })
    }

    /// A path inside a running node's mount namespace, as seen from the host.
    pub fn node_path(&self, node: &NodeSpec, path: &str) -> anyhow::Result<PathBuf> {
        let ns = self.node_ns(node)?;
        Ok(PathBuf::from(format!("/proc/{}/root{path}", ns.holder)))
    }

    pub(crate) fn record(&self, state: &mut State, daemon: &Daemon) -> anyhow::Result<()> {
        state
            .processes
            .push(state::Process::of(&daemon.name, daemon.pid));
        state.save(&self.layout.state())
    }

    /// Brings the cluster up, after ending whatever the last run left.
    pub fn up(&self, options: &UpOptions) -> anyhow::Result<()> {
        let started = Instant::now();
        let mut step = Steps::new();
        if !is_root() {
            bail!("the cluster needs root (namespaces, mounts, cgroups, containerd)");
        }
        let missing = host_tools_missing();
        if !missing.is_empty() {
            bail!(
                "missing on this host: {} (`cargo xtask setup` installs them)",
                missing.join(" ")
            );
        }
        let layout = &self.layout;
        std::fs::create_dir_all(layout.logs())?;
        if layout.state().exists() || !leftover_processes(layout).is_empty() {
            eprintln!("xtask: cleaning up what the last cluster left");
        }
        down::down(layout).context("cleaning up what the last cluster left")?;
        if layout.instance == 0 {
            refuse_foreign_kubepods()?;
        }
        step.done("cleanup");

        let _components = compile::build(&self.workspace.join("cluster/go"), &layout.bin())?;
        step.done("components");
        let helper = self.helper()?;
        let mut archives = images::build(&self.workspace, layout)?;
        if let Some(agent) = &options.agent_image {
            archives.push(agent.clone());
        }
        step.done("images");

        let nodes: Vec<NodeSpec> = (0..=options.extra_nodes).map(|i| layout.node(i)).collect();
        control_plane::credentials(layout, &nodes)?;
        let mut state = State::default();
        state.save(&layout.state())?;

        // Namespaces and the lan.
        let lan_holder = node::holder(&helper, layout, "lan", None)?;
        self.record(&mut state, &lan_holder)?;
        let lan = Lan::create(&lan_holder)?;
        let mut node_ns = Vec::new();
        for spec in &nodes {
            let forward = (spec.index == 0).then(|| {
                format!(
                    "127.0.0.1:{}={}:{APISERVER_PORT}",
                    layout.host_port(),
                    spec.ip
                )
            });
            let holder = node::holder(&helper, layout, &holder_name(spec), forward)?;
            self.record(&mut state, &holder)?;
            let pid = holder.pid.to_string();
            state.nodes.push(state::Node {
                name: spec.name.clone(),
                net_ns: state::ns_inode(&pid, "net").context("the holder's network namespace")?,
                mnt_ns: state::ns_inode(&pid, "mnt").context("the holder's mount namespace")?,
                cgroup_root: spec.cgroup_root.clone(),
            });
            state.save(&layout.state())?;
            let ns = Namespaces { holder: holder.pid };
            lan.connect(spec, ns)?;
            node::network(spec, ns, &nodes)?;
            node::filesystems(layout, spec, ns)?;
            node_ns.push(ns);
        }
        step.done("namespaces");

        // The control plane, on node 0.
        let ns0 = node_ns[0];
        let node0 = &nodes[0];
        let etcd = spawn_daemon(
            "etcd",
            &mut control_plane::etcd(layout, node0),
            Some(ns0),
            &fresh_log(layout, "etcd"),
        )?;
        self.record(&mut state, &etcd)?;
        etcd.wait_until("it serves clients", START_LIMIT, || {
            log_has(&etcd.log, "serving client traffic securely")
                || log_has(&etcd.log, "ready to serve client requests")
        })?;
        let apiserver = spawn_daemon(
            "kube-apiserver",
            &mut control_plane::apiserver(layout, node0)?,
            Some(ns0),
            &fresh_log(layout, "kube-apiserver"),
        )?;
        self.record(&mut state, &apiserver)?;
        let kubectl = self.kubectl();
        apiserver.wait_until("/readyz answers ok", START_LIMIT, || {
            kubectl
                .call(&["get", "--raw", "/readyz"], None, Duration::from_secs(5))
                .is_ok_and(|o| o.success && o.stdout.trim() == "ok")
        })?;
        for (name, mut cmd) in [
            (
                "kube-controller-manager",
                control_plane::controller_manager(layout),
            ),
            ("kube-scheduler", control_plane::scheduler(layout)),
        ] {
            let d = spawn_daemon(name, &mut cmd, Some(ns0), &fresh_log(layout, name))?;
            self.record(&mut state, &d)?;
            d.wait_until("it holds its leader lease", START_LIMIT, || {
                kubectl
                    .call(
                        &[
                            "-n",
                            "kube-system",
                            "get",
                            "lease",
                            name,
                            "-o",
                            "jsonpath={.spec.holderIdentity}",
                        ],
                        None,
                        Duration::from_secs(5),
                    )
                    .is_ok_and(|o| o.success && !o.stdout.trim().is_empty())
            })?;
        }
        step.done("control plane");

        // Each node's runtime, kubelet and kube-proxy.
        for (spec, ns) in nodes.iter().zip(&node_ns) {
            let config = node_components::containerd_config(layout, spec)?;
            let containerd = spawn_daemon(
                &format!("containerd-{}", spec.name),
                &mut node_components::containerd(&config),
                Some(*ns),
                &fresh_log(layout, &format!("containerd-{}", spec.name)),
            )?;
            self.record(&mut state, &containerd)?;
            let socket = PathBuf::from(format!(
                "/proc/{}/root/run/containerd/containerd.sock",
                ns.holder
            ));
            containerd.wait_until("its socket answers", START_LIMIT, || {
                socket.exists() && {
                    let mut cmd = Command::new("ctr");
                    cmd.args(["--address", "/run/containerd/containerd.sock", "version"]);
                    ns.enter(&mut cmd)
                        .is_ok_and(|_entered| output_of(&mut cmd).is_ok())
                }
            })?;
            images::import(*ns, &archives)?;
            // A cgroup root other than / must exist in every hierarchy before the kubelet starts.
            if spec.cgroup_root != "/" {
                for hierarchy in down::hierarchies() {
                    let dir = hierarchy.join(spec.cgroup_root.trim_start_matches('/'));
                    std::fs::create_dir_all(&dir)
                        .with_context(|| format!("creating {}", dir.display()))?;
                }
            }
            let kubelet_yaml = node_components::kubelet_config(layout, spec, &options.kubelet)?;
            self.write_in_node(spec, "/var/lib/kubelet/config.yaml", &kubelet_yaml)?;
            let kubelet = spawn_daemon(
                &kubelet_name(spec),
                &mut node_components::kubelet(layout, spec),
                Some(*ns),
                &fresh_log(layout, &kubelet_name(spec)),
            )?;
            self.record(&mut state, &kubelet)?;
            let proxy = spawn_daemon(
                &format!("kube-proxy-{}", spec.name),
                &mut node_components::kube_proxy(layout, spec)?,
                Some(*ns),
                &fresh_log(layout, &format!("kube-proxy-{}", spec.name)),
            )?;
            self.record(&mut state, &proxy)?;
            kubelet.wait_until("its Node is Ready", START_LIMIT, || {
                kubectl
                    .call(
                        &[
                            "get",
                            "node",
                            &spec.name,
                            "-o",
                            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                        ],
                        None,
                        Duration::from_secs(5),
                    )
                    .is_ok_and(|o| o.success && o.stdout.trim() == "True")
            })?;
        }
        step.done("nodes Ready");

        if options.agent_image.is_some() {
            self.install_agent()?;
            step.done("agent Ready");
        }
        eprintln!(
            "xtask: cluster up in {:.0?} ({}); kubectl: {} --kubeconfig {}",
            started.elapsed(),
            step.summary(),
            layout.binary("kubectl").display(),
            layout.admin_kubeconfig().display()
        );
        Ok(())
    }

    /// `kubectl apply -k cluster/overlay` (deploy/'s base, with this box's differences), then
    /// waits for the DaemonSet's pods to be Ready on every node.
    pub fn install_agent(&self) -> anyhow::Result<()> {
        let kubectl = self.kubectl();
        let overlay = self.workspace.join("cluster/overlay");
        let out = kubectl.call(
            &["apply", "-k", &overlay.to_string_lossy()],
            None,
            Duration::from_secs(120),
        )?;
        if !out.success {
            bail!(
                "kubectl apply -k {} failed: {}",
                overlay.display(),
                out.stderr.trim()
            );
        }
        self.wait_agent_ready("node-agent", Duration::from_secs(240))
    }

    /// Waits until DaemonSet `name` (namespace node-agent) has a Ready pod on every node it
    /// schedules to; the error shows the pods and the agent's last log lines.
    pub fn wait_agent_ready(&self, name: &str, limit: Duration) -> anyhow::Result<()> {
        let kubectl = self.kubectl();
        let result = kubectl.wait_for(&format!("DaemonSet {name} ready"), limit, |k| {
            let ds = k.get_json(&["-n", "node-agent", "daemonset", name])?;
            let status = &ds["status"];
            // The controller has seen this generation (a DaemonSet no node matches, as the
            // enforcing one before any node is labelled, is ready with 0 of 0).
            let seen = status["observedGeneration"] == ds["metadata"]["generation"];
            let want = status["desiredNumberScheduled"].as_i64().unwrap_or(-1);
            let ready = status["numberReady"].as_i64().unwrap_or(0);
            let updated = status["updatedNumberScheduled"].as_i64().unwrap_or(0);
            Ok((seen && want >= 0 && ready == want && updated == want).then_some(()))
        });
        if let Err(e) = result {
            let pods = kubectl
                .run(&["-n", "node-agent", "get", "pods", "-o", "wide"])
                .unwrap_or_default();
            let logs = kubectl
                .call(
                    &[
                        "-n",
                        "node-agent",
                        "logs",
                        "-l",
                        "app.kubernetes.io/name=node-agent",
                        "--tail=20",
                        "--all-containers",
                    ],
                    None,
                    Duration::from_secs(20),
                )
                .map(|o| o.stdout + &o.stderr)
                .unwrap_or_default();
            let describe = kubectl
                .call(
                    &["-n", "node-agent", "describe", "pods"],
                    None,
                    Duration::from_secs(20),
                )
                .map(|o| {
                    let lines: Vec<String> = o.stdout.lines().map(str::to_string).collect();
                    lines[lines.len().saturating_sub(25)..].join("\n")
                })
                .unwrap_or_default();
            bail!("{e:#}\npods:\n{pods}\nagent logs:\n{logs}\nevents:\n{describe}");
        }
        Ok(())
    }

    /// Imports a newer build of the agent's image (same name and tag), and of the workload and
    /// sandbox images, into every node and restarts the agent's DaemonSets so their pods run
    /// it: for working against a cluster that stays up.
    pub fn refresh_agent_image(&self, archive: &Archive) -> anyhow::Result<()> {
        // The workload and sandbox images too: the tests may need what a newer pod-workload does.
        let mut archives = images::build(&self.workspace, &self.layout)?;
        archives.push(archive.clone());
        for node in self.nodes() {
            images::import(self.node_ns(&node)?, &archives)?;
        }
        let kubectl = self.kubectl();
        let list = kubectl.get_json(&["-n", "node-agent", "daemonsets"])?;
        for ds in list["items"].as_array().into_iter().flatten() {
            if let Some(name) = ds["metadata"]["name"].as_str() {
                kubectl.run(&[
                    "-n",
                    "node-agent",
                    "rollout",
                    "restart",
                    &format!("daemonset/{name}"),
                ])?;
                self.wait_agent_ready(name, Duration::from_secs(240))?;
            }
        }
        Ok(())
    }

    /// Writes a file inside a node's mount namespace.
    pub fn write_in_node(&self, node: &NodeSpec, path: &str, content: &str) -> anyhow::Result<()> {
        let host_path = self.node_path(node, path)?;
        std::fs::write(&host_path, content)
            .with_context(|| format!("writing {path} in {}", node.name))
    }

    /// Restarts a node's kubelet with other options (its config file rewritten), and waits for
    /// the Node to be Ready again.
    pub fn restart_kubelet(&self, node: &NodeSpec, options: &KubeletOptions) -> anyhow::Result<()> {
        let kubelet = crate::faults::Component::Kubelet(node.clone());
        if let Ok(pid) = self.component_pid(&kubelet) {
            crate::process::terminate(&[pid], Duration::from_secs(10));
        }
        self.forget(&kubelet.name())?;
        let yaml = node_components::kubelet_config(&self.layout, node, options)?;
        self.write_in_node(node, "/var/lib/kubelet/config.yaml", &yaml)?;
        // The Node stays Ready through a short restart: it waits for the new kubelet's
        // heartbeat.
        self.start_component(&kubelet)
    }

    /// Ends the cluster.
    pub fn down(&self) -> anyhow::Result<()> {
        down::down(&self.layout)
    }

    /// The helper binary (`node-agent-cluster`), built now.
    fn helper(&self) -> anyhow::Result<PathBuf> {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        run(Command::new(cargo).current_dir(&self.workspace).args([
            "build",
            "--locked",
            "--package",
            "node-agent-cluster",
            "--bin",
            "node-agent-cluster",
        ]))
        .context("building node-agent-cluster (the nodes' holder)")?;
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map_or_else(|| self.workspace.join("target"), PathBuf::from);
        Ok(target.join("debug/node-agent-cluster"))
    }
}

pub fn holder_name(node: &NodeSpec) -> String {
    format!("holder-{}", node.name)
}

pub fn kubelet_name(node: &NodeSpec) -> String {
    format!("kubelet-{}", node.name)
}

fn fresh_log(layout: &Layout, name: &str) -> PathBuf {
    let path = layout.log(name);
    let _ = std::fs::remove_file(&path);
    path
}

fn log_has(path: &Path, needle: &str) -> bool {
    std::fs::read_to_string(path).is_ok_and(|t| t.contains(needle))
}

fn is_root() -> bool {
    // SAFETY: geteuid(2) has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn leftover_processes(layout: &Layout) -> Vec<String> {
    down::HostSnapshot::take(layout)
        .map(|s| s.processes.into_iter().collect())
        .unwrap_or_default()
}

/// A `/kubepods` no cluster of ours made means a kubelet of the host's own: never touch it
/// while any process lives in it or a kubelet runs. Empty and with no kubelet left, it is
/// what a stopped kubelet (or a cluster of another directory) left behind: removed, and said.
fn refuse_foreign_kubepods() -> anyhow::Result<()> {
    let roots: Vec<PathBuf> = down::hierarchies()
        .into_iter()
        .map(|h| h.join("kubepods"))
        .filter(|p| p.is_dir())
        .collect();
    let Some(first) = roots.first() else {
        return Ok(());
    };
    let pids = down::pids_in_cgroups(&roots);
    let kubelets = down::kubelet_processes();
    if !pids.is_empty() || !kubelets.is_empty() {
        bail!(
            "{} exists and no cluster of this directory made it ({} processes in it, kubelet processes {:?}): is a kubelet running on this host? Stop it (or remove the cgroup) first",
            first.display(),
            pids.len(),
            kubelets
        );
    }
    let left = down::remove_cgroups(&roots);
    if !left.is_empty() {
        bail!(
            "{} exists, holds no process and no kubelet runs, but {} of its cgroups could not be removed (first: {})",
            first.display(),
            left.len(),
            left[0].display()
        );
    }
    eprintln!(
        "xtask: removed an empty {} that no running kubelet owns (left by one that stopped)",
        first.display()
    );
    Ok(())
}

/// Whether `node` is Ready with a heartbeat at or after `since` (seconds since the epoch): a
/// kubelet started since then reports.
pub(crate) fn ready_since(kubectl: &Kubectl, node: &str, since: i64) -> bool {
    kubectl
        .get_json(&["node", node])
        .ok()
        .and_then(|n| {
            n["status"]["conditions"].as_array().and_then(|cs| {
                cs.iter().find(|c| c["type"] == "Ready").map(|c| {
                    (
                        c["status"] == "True",
                        c["lastHeartbeatTime"].as_str().map(str::to_string),
                    )
                })
            })
        })
        .is_some_and(|(ready, beat)| ready && beat.is_some_and(|b| rfc3339_secs(&b) >= since))
}

pub(crate) fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Seconds since the epoch of an RFC 3339 time as the API server writes them
/// (`2026-11-28T08:00:00Z`); 0 when unreadable.
pub(crate) fn rfc3339_secs(text: &str) -> i64 {
    text.parse::<jiff::Timestamp>().map_or(0, |t| t.as_second())
}

/// Step timings for the summary line.
struct Steps {
    last: Instant,
    done: Vec<(String, Duration)>,
}

impl Steps {
    fn new() -> Self {
        Self {
            last: Instant::now(),
            done: Vec::new(),
        }
    }
    fn done(&mut self, what: &str) {
        let now = Instant::now();
        self.done.push((what.to_string(), now - self.last));
        eprintln!(
            "xtask: cluster: {what} ({:.1} s)",
            (now - self.last).as_secs_f64()
        );
        self.last = now;
    }
    fn summary(&self) -> String {
        self.done
            .iter()
            .map(|(w, d)| format!("{w} {:.0} s", d.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}
