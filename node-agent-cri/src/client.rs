//! The CRI client: gRPC over the runtime's unix socket. Reads, plus the two calls node-level
//! reclaim makes (`RemoveContainer`, `RemoveImage`). Every call is bounded by the configured
//! timeout and every error names the call and the endpoint.

use std::{future::Future, time::Duration};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Uri};

use crate::{
    config::{CriSettings, Endpoint},
    convert::{self, Problem},
    error::CriError,
    model::{
        Container, ContainerState, ContainerStats, Image, ImageFsInfo, PodSandbox, RuntimeVersion,
    },
    proto::{
        self, image_service_client::ImageServiceClient,
        runtime_service_client::RuntimeServiceClient,
    },
    reclaim::Listing,
};

/// The most one CRI answer may weigh: the kubelet's own limit (`maxMsgSize`), since a node's
/// container list can exceed gRPC's 4 MiB default (250 pods with their dead containers kept
/// for GC, 1–2 KiB of labels and annotations each, is 1–2 MiB; images with all their tags and
/// digests less). tonic refuses a larger message before decoding it, as `OutOfRange`.
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// A connection to one runtime endpoint. Cheap to clone; calls may run concurrently.
#[derive(Debug, Clone)]
pub struct CriClient {
    endpoint: Endpoint,
    timeout: Duration,
    channel: Channel,
}

impl CriClient {
    /// Connects and asks `Version`, so a wrong endpoint or a runtime that does not speak CRI v1
    /// is found at start. The connection is re-established by itself if the runtime restarts.
    pub async fn connect(settings: &CriSettings) -> Result<Self, CriError> {
        let client = Self::lazy(settings);
        let version = client.version().await?;
        if version.runtime_api_version != "v1" {
            return Err(CriError::UnsupportedApi {
                endpoint: client.endpoint.clone(),
                api: version.runtime_api_version,
                runtime: format!("{} {}", version.runtime_name, version.runtime_version),
            });
        }
        Ok(client)
    }

    /// A client that connects at its first call.
    pub fn lazy(settings: &CriSettings) -> Self {
        let path = settings.endpoint.path().to_path_buf();
        // The URI only satisfies the HTTP/2 layer; the connector below ignores it.
        let channel = tonic::transport::Endpoint::from_static("http://cri.invalid")
            .connect_timeout(settings.timeout)
            .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(TokioIo::new(stream))
                }
            }));
        Self {
            endpoint: settings.endpoint.clone(),
            timeout: settings.timeout,
            channel,
        }
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    pub(crate) fn runtime(&self) -> RuntimeServiceClient<Channel> {
        RuntimeServiceClient::new(self.channel.clone()).max_decoding_message_size(MAX_MESSAGE_BYTES)
    }

    pub(crate) fn images(&self) -> ImageServiceClient<Channel> {
        ImageServiceClient::new(self.channel.clone()).max_decoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// Awaits one call within the timeout; maps its failure to a [`CriError`] naming it.
    pub(crate) async fn call<T>(
        &self,
        call: &'static str,
        request: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, CriError> {
        match tokio::time::timeout(self.timeout, request).await {
            Err(_) => Err(CriError::Timeout {
                call,
                endpoint: self.endpoint.clone(),
                timeout: self.timeout,
            }),
            Ok(Err(status)) => Err(CriError::status(call, &self.endpoint, status)),
            Ok(Ok(response)) => Ok(response.into_inner()),
        }
    }

    fn bad(&self, call: &'static str, problem: Problem) -> CriError {
        CriError::BadResponse {
            call,
            endpoint: self.endpoint.clone(),
            problem: problem.0,
        }
    }

    pub async fn version(&self) -> Result<RuntimeVersion, CriError> {
        let request = proto::VersionRequest {
            version: "v1".into(),
        };
        let mut client = self.runtime();
        let answer = self.call("Version", client.version(request)).await?;
        Ok(convert::version(answer))
    }

    pub async fn list_pod_sandboxes(&self) -> Result<Vec<PodSandbox>, CriError> {
        let mut client = self.runtime();
        let answer = self
            .call(
                "ListPodSandbox",
                client.list_pod_sandbox(proto::ListPodSandboxRequest::default()),
            )
            .await?;
        answer
            .items
            .into_iter()
            .map(convert::sandbox)
            .collect::<Result<_, _>>()
            .map_err(|p| self.bad("ListPodSandbox", p))
    }

    /// Every container (`None`) or those in one state.
    pub async fn list_containers(
        &self,
        state: Option<ContainerState>,
    ) -> Result<Vec<Container>, CriError> {
        let request = proto::ListContainersRequest {
            filter: state.map(|s| proto::ContainerFilter {
                state: Some(convert::state_value(s)),
                ..Default::default()
            }),
        };
        let mut client = self.runtime();
        let answer = self
            .call("ListContainers", client.list_containers(request))
            .await?;
        answer
            .containers
            .into_iter()
            .map(convert::container)
            .collect::<Result<_, _>>()
            .map_err(|p| self.bad("ListContainers", p))
    }

    pub async fn container_stats(&self, id: &str) -> Result<ContainerStats, CriError> {
        let request = proto::ContainerStatsRequest {
            container_id: id.into(),
        };
        let mut client = self.runtime();
        let answer = self
            .call("ContainerStats", client.container_stats(request))
            .await?;
        let stats = answer
            .stats
            .ok_or_else(|| self.bad("ContainerStats", Problem(format!("no stats for {id}"))))?;
        convert::container_stats(stats).map_err(|p| self.bad("ContainerStats", p))
    }

    pub async fn list_container_stats(&self) -> Result<Vec<ContainerStats>, CriError> {
        let mut client = self.runtime();
        let answer = self
            .call(
                "ListContainerStats",
                client.list_container_stats(proto::ListContainerStatsRequest::default()),
            )
            .await?;
        answer
            .stats
            .into_iter()
            .map(convert::container_stats)
            .collect::<Result<_, _>>()
            .map_err(|p| self.bad("ListContainerStats", p))
    }

    pub async fn image_fs_info(&self) -> Result<ImageFsInfo, CriError> {
        let mut client = self.images();
        let answer = self
            .call(
                "ImageFsInfo",
                client.image_fs_info(proto::ImageFsInfoRequest::default()),
            )
            .await?;
        convert::image_fs_info(answer).map_err(|p| self.bad("ImageFsInfo", p))
    }

    pub async fn list_images(&self) -> Result<Vec<Image>, CriError> {
        let mut client = self.images();
        let answer = self
            .call(
                "ListImages",
                client.list_images(proto::ListImagesRequest::default()),
            )
            .await?;
        answer
            .images
            .into_iter()
            .map(convert::image)
            .collect::<Result<_, _>>()
            .map_err(|p| self.bad("ListImages", p))
    }

    /// The image a reference (ID, tag or digest) names; `None` when the runtime has none.
    pub async fn image_status(&self, reference: &str) -> Result<Option<Image>, CriError> {
        let request = proto::ImageStatusRequest {
            image: Some(image_spec(reference)),
            verbose: false,
        };
        let mut client = self.images();
        let answer = self
            .call("ImageStatus", client.image_status(request))
            .await?;
        answer
            .image
            .map(convert::image)
            .transpose()
            .map_err(|p| self.bad("ImageStatus", p))
    }

    /// Removes a container that is not running (the CRI has the runtime force it otherwise).
    /// Removing one already gone succeeds, as the CRI requires.
    pub async fn remove_container(&self, id: &str) -> Result<(), CriError> {
        let request = proto::RemoveContainerRequest {
            container_id: id.into(),
        };
        let mut client = self.runtime();
        self.call("RemoveContainer", client.remove_container(request))
            .await
            .map(drop)
    }

    /// Removes an image by ID (all its tags) or by reference.
    pub async fn remove_image(&self, reference: &str) -> Result<(), CriError> {
        let request = proto::RemoveImageRequest {
            image: Some(image_spec(reference)),
        };
        let mut client = self.images();
        self.call("RemoveImage", client.remove_image(request))
            .await
            .map(drop)
    }

    /// What node-level reclaim plans from: every container, every image and the container
    /// stats the runtime has.
    pub async fn listing(&self) -> Result<Listing, CriError> {
        let (containers, images, stats) = tokio::try_join!(
            self.list_containers(None),
            self.list_images(),
            self.list_container_stats()
        )?;
        Ok(Listing {
            containers,
            images,
            stats: stats.into_iter().map(|s| (s.id.clone(), s)).collect(),
        })
    }
}

fn image_spec(reference: &str) -> proto::ImageSpec {
    proto::ImageSpec {
        image: reference.into(),
        ..Default::default()
    }
}
