//! The local kubelet's read-only API: `GET /pods` (a `v1.PodList`) and `GET /stats/summary`,
//! each capped in size and read record by record.

use std::time::SystemTime;

use http::StatusCode;

use super::{
    records::{self, DecodeError, PodList, Problem},
    stats::PodStats,
    PodSnapshot,
};
use crate::{
    api::{call, ApiError, Context},
    transport::{ApiRequest, HttpResponse, POD_LIST_CAP, SUMMARY_CAP},
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

    /// The pods the kubelet runs, each read into the model, retried with backoff.
    pub async fn pods(&self) -> Result<PodList, ApiError> {
        let req = ApiRequest::get("/pods").capped(POD_LIST_CAP);
        self.get(&req, "v1.PodList", records::decode_pod_list).await
    }

    /// The kubelet's usage summary, retried with backoff: the entries that could be read, and
    /// the ones that could not.
    pub async fn summary(&self) -> Result<(Vec<PodStats>, Vec<Problem>), ApiError> {
        let req = ApiRequest::get("/stats/summary").capped(SUMMARY_CAP);
        self.get(&req, "stats/v1alpha1 Summary", records::decode_summary)
            .await
    }

    /// Pods and usage together; `observed_at` is when the earlier of the two answers arrived.
    pub async fn snapshot(&self) -> Result<PodSnapshot, ApiError> {
        let PodList {
            items,
            mut problems,
            ..
        } = self.pods().await?;
        let pods_at = SystemTime::now();
        let (stats, stats_problems) = self.summary().await?;
        problems.extend(stats_problems);
        Ok(PodSnapshot::build(items, Some(&stats), pods_at, problems))
    }

    /// GETs and decodes, retried with backoff. The decoding (up to the cap's megabytes of
    /// JSON) runs on a blocking thread, never on the runtime's workers.
    async fn get<T: Send + 'static>(
        &self,
        req: &ApiRequest,
        expected: &'static str,
        decode: fn(&[u8]) -> Result<T, DecodeError>,
    ) -> Result<T, ApiError> {
        let what = format!("kubelet GET {}", req.path);
        let ctx = &self.ctx;
        let name = ctx.transport.endpoint().name;
        ctx.backoff
            .run(&ctx.counters, &what, || async {
                let resp: HttpResponse = call(&ctx.transport, req, &[StatusCode::OK]).await?;
                let decoded = tokio::task::spawn_blocking(move || decode(&resp.body)).await;
                ApiError::decoded(name, req, expected, decoded)
            })
            .await
    }
}
