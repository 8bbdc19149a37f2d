//! Components stopped, killed and started again while the cluster runs: what the outage tests
//! (`tests/tests/cluster_outage.rs`) do to the control plane or to a node. A component is
//! found by the name `up` recorded it under (and its start time: a reused PID is never
//! signalled), started again with the command `up` used, its log appended to, and waited for
//! as `up` waits for it.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};

use crate::{
    control_plane,
    layout::NodeSpec,
    node_components,
    process::{alive, output_of, spawn_daemon},
    state::State,
    up::{kubelet_name, Cluster},
};

/// How long a component may take to come back.
const BACK_LIMIT: Duration = Duration::from_secs(120);

/// A component of the running cluster.
#[derive(Debug, Clone)]
pub enum Component {
    Etcd,
    ApiServer,
    ControllerManager,
    Scheduler,
    Kubelet(NodeSpec),
    Containerd(NodeSpec),
}

impl Component {
    /// The name `up` recorded it under (and its log's name).
    pub fn name(&self) -> String {
        match self {
            Self::Etcd => "etcd".into(),
            Self::ApiServer => "kube-apiserver".into(),
            Self::ControllerManager => "kube-controller-manager".into(),
            Self::Scheduler => "kube-scheduler".into(),
            Self::Kubelet(node) => kubelet_name(node),
            Self::Containerd(node) => format!("containerd-{}", node.name),
        }
    }
}

impl Cluster {
    /// Starts again the controller manager and the scheduler where they exited, as the kubelet
    /// restarts kubeadm's static pods: each exits when it cannot renew its leader lease (the
    /// API server or etcd away for longer than its renew deadline, 10 s).
    pub fn restart_exited_controllers(&self) -> anyhow::Result<Vec<String>> {
        let mut started = Vec::new();
        for c in [Component::ControllerManager, Component::Scheduler] {
            if self.component_pid(&c).is_err() {
                self.forget(&c.name())?;
                self.start_component(&c)?;
                started.push(c.name());
            }
        }
        Ok(started)
    }

    /// The host PID of `component`, as recorded and still running.
    pub fn component_pid(&self, component: &Component) -> anyhow::Result<u32> {
        let name = component.name();
        let state = State::load(&self.layout.state())?.context("no cluster is up")?;
        state
            .processes
            .iter()
            .find(|p| p.name == name && p.is_running())
            .map(|p| p.pid)
            .with_context(|| format!("{name} is not running"))
    }

    /// Sends `signal` (e.g. SIGSTOP, SIGCONT) to `component`.
    pub fn signal_component(&self, component: &Component, signal: i32) -> anyhow::Result<()> {
        let pid = self.component_pid(component)?;
        // SAFETY: kill(2) of a process recorded by PID and start time, checked just before.
        if unsafe { libc::kill(pid as i32, signal) } != 0 {
            bail!(
                "signal {signal} to {} ({pid}): {}",
                component.name(),
                std::io::Error::last_os_error()
            );
        }
        Ok(())
    }

    /// SIGKILLs `component` and waits until it is gone (its record removed).
    pub fn kill_component(&self, component: &Component) -> anyhow::Result<()> {
        let pid = self.component_pid(component)?;
        self.signal_component(component, libc::SIGKILL)?;
        let start = Instant::now();
        while alive(pid) {
            if start.elapsed() > Duration::from_secs(10) {
                bail!("{} ({pid}) outlived SIGKILL by 10 s", component.name());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.forget(&component.name())
    }

    /// Removes the processes recorded under `name` from the state file (they are gone).
    pub(crate) fn forget(&self, name: &str) -> anyhow::Result<()> {
        let mut state = State::load(&self.layout.state())?.context("no cluster is up")?;
        state.processes.retain(|p| p.name != name);
        state.save(&self.layout.state())
    }

    /// Starts `component` again with the command `up` used, and waits until it serves as `up`
    /// waits for it (etcd serves clients, the API server's /readyz, containerd's socket, the
    /// kubelet's heartbeat).
    pub fn start_component(&self, component: &Component) -> anyhow::Result<()> {
        let layout = &self.layout;
        let name = component.name();
        let node0 = layout.node(0);
        let (mut cmd, node) = match component {
            Component::Etcd => (control_plane::etcd(layout, &node0), node0.clone()),
            Component::ApiServer => (control_plane::apiserver(layout, &node0)?, node0.clone()),
            Component::ControllerManager => {
                (control_plane::controller_manager(layout), node0.clone())
            }
            Component::Scheduler => (control_plane::scheduler(layout), node0.clone()),
            Component::Kubelet(node) => (node_components::kubelet(layout, node), node.clone()),
            Component::Containerd(node) => (
                node_components::containerd(&node_components::containerd_config(layout, node)?),
                node.clone(),
            ),
        };
        let ns = self.node_ns(&node)?;
        let log = layout.log(&name);
        let log_start = std::fs::metadata(&log).map_or(0, |m| m.len());
        let daemon = spawn_daemon(&name, &mut cmd, Some(ns), &log)?;
        let mut state = State::load(&layout.state())?.context("no cluster is up")?;
        self.record(&mut state, &daemon)?;
        let kubectl = self.kubectl();
        let since_start = || {
            std::fs::read(&log)
                .map(|b| {
                    String::from_utf8_lossy(&b[(log_start as usize).min(b.len())..]).into_owned()
                })
                .unwrap_or_default()
        };
        match component {
            Component::Etcd => daemon.wait_until("it serves clients", BACK_LIMIT, || {
                let text = since_start();
                text.contains("serving client traffic securely")
                    || text.contains("ready to serve client requests")
            }),
            Component::ApiServer => daemon.wait_until("/readyz answers ok", BACK_LIMIT, || {
                kubectl
                    .call(&["get", "--raw", "/readyz"], None, Duration::from_secs(5))
                    .is_ok_and(|o| o.success && o.stdout.trim() == "ok")
            }),
            Component::ControllerManager | Component::Scheduler => {
                let since = crate::up::now_secs();
                daemon.wait_until("it renews its leader lease", BACK_LIMIT, || {
                    kubectl
                        .get_json(&["-n", "kube-system", "lease", &name])
                        .ok()
                        .and_then(|l| l["spec"]["renewTime"].as_str().map(crate::up::rfc3339_secs))
                        .is_some_and(|renewed| renewed >= since)
                })
            }
            Component::Containerd(_) => daemon.wait_until("its socket answers", BACK_LIMIT, || {
                let mut cmd = Command::new("ctr");
                cmd.args(["--address", "/run/containerd/containerd.sock", "version"]);
                ns.enter(&mut cmd)
                    .is_ok_and(|_entered| output_of(&mut cmd).is_ok())
            }),
            Component::Kubelet(node) => {
                let since = crate::up::now_secs();
                daemon.wait_until("its Node reports Ready again", BACK_LIMIT, || {
                    crate::up::ready_since(&kubectl, &node.name, since)
                })
            }
        }
    }
}
