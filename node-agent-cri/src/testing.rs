//! The CRI calls only tests make: they create what the kubelet would create (pod sandboxes,
//! containers) so the agent's reads and reclaim can be checked against a real runtime.
//! Requests are the protobuf messages themselves, so a test says exactly what the kubelet
//! would send.

use crate::{client::CriClient, error::CriError, proto};

impl CriClient {
    /// `RunPodSandbox`; returns the sandbox ID.
    pub async fn run_pod_sandbox(
        &self,
        config: proto::PodSandboxConfig,
    ) -> Result<String, CriError> {
        let request = proto::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: String::new(),
        };
        let mut client = self.runtime();
        let answer = self
            .call("RunPodSandbox", client.run_pod_sandbox(request))
            .await?;
        Ok(answer.pod_sandbox_id)
    }

    pub async fn stop_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let request = proto::StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        let mut client = self.runtime();
        self.call("StopPodSandbox", client.stop_pod_sandbox(request))
            .await
            .map(drop)
    }

    pub async fn remove_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let request = proto::RemovePodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        let mut client = self.runtime();
        self.call("RemovePodSandbox", client.remove_pod_sandbox(request))
            .await
            .map(drop)
    }

    /// `PodSandboxStatus` with `verbose`, whose `info` holds the runtime's details (containerd:
    /// the sandbox's pid and network namespace).
    pub async fn pod_sandbox_status(
        &self,
        id: &str,
    ) -> Result<proto::PodSandboxStatusResponse, CriError> {
        let request = proto::PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: true,
        };
        let mut client = self.runtime();
        self.call("PodSandboxStatus", client.pod_sandbox_status(request))
            .await
    }

    /// `CreateContainer` in a sandbox; returns the container ID.
    pub async fn create_container(
        &self,
        sandbox_id: &str,
        config: proto::ContainerConfig,
        sandbox_config: proto::PodSandboxConfig,
    ) -> Result<String, CriError> {
        let request = proto::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.into(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        let mut client = self.runtime();
        let answer = self
            .call("CreateContainer", client.create_container(request))
            .await?;
        Ok(answer.container_id)
    }

    pub async fn start_container(&self, id: &str) -> Result<(), CriError> {
        let request = proto::StartContainerRequest {
            container_id: id.into(),
        };
        let mut client = self.runtime();
        self.call("StartContainer", client.start_container(request))
            .await
            .map(drop)
    }

    /// `StopContainer`, giving the container `timeout_seconds` after SIGTERM.
    pub async fn stop_container(&self, id: &str, timeout_seconds: i64) -> Result<(), CriError> {
        let request = proto::StopContainerRequest {
            container_id: id.into(),
            timeout: timeout_seconds,
        };
        let mut client = self.runtime();
        self.call("StopContainer", client.stop_container(request))
            .await
            .map(drop)
    }

    pub async fn container_status(
        &self,
        id: &str,
    ) -> Result<proto::ContainerStatusResponse, CriError> {
        let request = proto::ContainerStatusRequest {
            container_id: id.into(),
            verbose: true,
        };
        let mut client = self.runtime();
        self.call("ContainerStatus", client.container_status(request))
            .await
    }
}
