//! Pods and containers as the kubelet creates them through the CRI: its labels, cgroup
//! parents (cgroupfs driver), log paths; and what a test reads back about them.

use std::{
    collections::HashMap,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use node_agent_cri::proto;

use super::Containerd;

/// A pod sandbox created through the CRI, with the config it was created with (the CRI wants
/// it again for each container).
#[derive(Debug, Clone)]
pub struct Pod {
    pub sandbox_id: String,
    pub uid: String,
    pub config: proto::PodSandboxConfig,
}

impl Containerd {
    /// The pod's IP on the fixture's bridge.
    pub async fn pod_ip(&self, pod: &Pod) -> anyhow::Result<String> {
        let status = self.client.pod_sandbox_status(&pod.sandbox_id).await?;
        status
            .status
            .and_then(|s| s.network)
            .map(|n| n.ip)
            .filter(|ip| !ip.is_empty())
            .context("the sandbox has no IP")
    }

    /// The host PID of a running container's first process (containerd's verbose status).
    pub async fn container_pid(&self, id: &str) -> anyhow::Result<u32> {
        let status = self.client.container_status(id).await?;
        let info = status.info.get("info").context("no verbose info")?;
        let info: serde_json::Value = serde_json::from_str(info)?;
        info["pid"]
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
            .filter(|p| *p > 0)
            .with_context(|| format!("no pid in the container's info: {info}"))
    }

    /// What a container printed so far (the CRI log file, one `<time> <stream> <tag> <line>`
    /// per line; the lines themselves are returned).
    pub fn container_log(pod: &Pod, config: &proto::ContainerConfig) -> String {
        let path = Path::new(&pod.config.log_directory).join(&config.log_path);
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| l.splitn(4, ' ').nth(3).unwrap_or(l))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The cgroup parent the kubelet (cgroupfs driver) gives a pod of this QoS class.
    pub fn cgroup_parent(&self, qos: &str, uid: &str) -> String {
        match qos {
            "guaranteed" => format!("/{}/kubepods/pod{uid}", self.cgroup_root),
            _ => format!("/{}/kubepods/{qos}/pod{uid}", self.cgroup_root),
        }
    }

    /// A sandbox config as the kubelet writes it; callers adjust it before `run_pod`.
    pub fn pod_config(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        qos: &str,
    ) -> proto::PodSandboxConfig {
        let labels: HashMap<String, String> = [
            (node_agent_cri::model::POD_UID_LABEL, uid),
            (node_agent_cri::model::POD_NAME_LABEL, name),
            (node_agent_cri::model::POD_NAMESPACE_LABEL, namespace),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        proto::PodSandboxConfig {
            metadata: Some(proto::PodSandboxMetadata {
                name: name.into(),
                uid: uid.into(),
                namespace: namespace.into(),
                attempt: 0,
            }),
            hostname: name.into(),
            log_directory: self
                .dir
                .join("pods")
                .join(format!("{namespace}_{name}_{uid}"))
                .to_string_lossy()
                .into_owned(),
            labels,
            linux: Some(proto::LinuxPodSandboxConfig {
                cgroup_parent: self.cgroup_parent(qos, uid),
                security_context: Some(proto::LinuxSandboxSecurityContext {
                    namespace_options: Some(proto::NamespaceOption::default()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    pub async fn run_pod(&self, config: proto::PodSandboxConfig) -> anyhow::Result<Pod> {
        std::fs::create_dir_all(&config.log_directory)?;
        let uid = config
            .metadata
            .as_ref()
            .map(|m| m.uid.clone())
            .unwrap_or_default();
        let sandbox_id = self
            .client
            .run_pod_sandbox(config.clone())
            .await
            .with_context(|| format!("containerd's log:\n{}", self.log_tail()))?;
        Ok(Pod {
            sandbox_id,
            uid,
            config,
        })
    }

    /// A container config as the kubelet writes it: its labels, log path and image.
    pub fn container_config(
        pod: &Pod,
        name: &str,
        attempt: u32,
        image: &str,
        command: &[&str],
    ) -> proto::ContainerConfig {
        let mut labels = pod.config.labels.clone();
        labels.insert("io.kubernetes.container.name".into(), name.into());
        proto::ContainerConfig {
            metadata: Some(proto::ContainerMetadata {
                name: name.into(),
                attempt,
            }),
            image: Some(proto::ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            command: command.iter().map(|s| s.to_string()).collect(),
            log_path: format!("{name}/{attempt}.log"),
            labels,
            linux: Some(proto::LinuxContainerConfig::default()),
            ..Default::default()
        }
    }

    /// Creates (and with `start`, starts) a container in `pod`; returns its ID.
    pub async fn run_container(
        &self,
        pod: &Pod,
        config: proto::ContainerConfig,
        start: bool,
    ) -> anyhow::Result<String> {
        let name = config
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        std::fs::create_dir_all(Path::new(&pod.config.log_directory).join(&name))?;
        let log = || format!("containerd's log:\n{}", self.log_tail());
        let id = self
            .client
            .create_container(&pod.sandbox_id, config, pod.config.clone())
            .await
            .with_context(log)?;
        if start {
            self.client.start_container(&id).await.with_context(log)?;
        }
        Ok(id)
    }

    /// Waits until the container is in `state`, at most `limit`.
    pub async fn wait_state(
        &self,
        id: &str,
        state: node_agent_cri::model::ContainerState,
        limit: Duration,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            let containers = self.client.list_containers(None).await?;
            let now = containers.iter().find(|c| c.id == id).map(|c| c.state);
            if now == Some(state) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("container {id} is {now:?}, not {state:?}, after {limit:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
