//! The local kubelet's read-only API: `GET /pods` (a `v1.PodList`) and `GET /stats/summary`.

use std::time::SystemTime;

use http::StatusCode;
use k8s_openapi::{api::core::v1::Pod, List};

use super::{stats::Summary, PodSnapshot};
use crate::{
    api::{call, decode, ApiError, Context},
    transport::ApiRequest,
};

/// The kubelet's API; `ctx.transport` reaches the kubelet.
#[derive(Debug, Clone)]
pub struct KubeletClient {
    ctx: Context,
}

impl KubeletClient {
    pub fn new(ctx: Context) -> Self {
        Self { ctx }
    }

    /// The pods the kubelet runs, retried with backoff.
    pub async fn pods(&self) -> Result<Vec<Pod>, ApiError> {
        let req = ApiRequest::get("/pods");
        let list: List<Pod> = self.get_json(&req, "v1.PodList").await?;
        Ok(list.items)
    }

    /// The kubelet's usage summary, retried with backoff.
    pub async fn summary(&self) -> Result<Summary, ApiError> {
        self.get_json(&ApiRequest::get("/stats/summary"), "stats/v1alpha1 Summary")
            .await
    }

    /// Pods and usage together; `observed_at` is when the earlier of the two answers arrived.
    pub async fn snapshot(&self) -> Result<PodSnapshot, ApiError> {
        let pods = self.pods().await?;
        let pods_at = SystemTime::now();
        let summary = self.summary().await?;
        Ok(PodSnapshot::build(
            &pods,
            Some(&summary),
            pods_at,
            &self.ctx.counters,
        ))
    }

    async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        req: &ApiRequest,
        expected: &'static str,
    ) -> Result<T, ApiError> {
        let what = format!("kubelet GET {}", req.path);
        let ctx = &self.ctx;
        ctx.backoff
            .run(&ctx.counters, &what, || async {
                let resp = call(&ctx.transport, req, &[StatusCode::OK]).await?;
                decode(ctx.transport.endpoint().name, req, &resp, expected)
            })
            .await
    }
}
