//! The kubelet's read-only API: `GET /pods` (a `v1.PodList`) and `GET /stats/summary`, each
//! capped in size and read record by record, from the kubelet itself or through the API
//! server's node proxy (`/api/v1/nodes/<node>/proxy/...`, the same answers). Where the kubelet
//! is, and how it is trusted: `crate::kubelet`.

use std::time::SystemTime;

use http::StatusCode;

use super::{
    records::{self, DecodeError, PodList, Summary},
    PodSnapshot,
};
use crate::{
    api::{call, node_path, ApiError, Context},
    transport::{ApiRequest, HttpResponse, POD_LIST_CAP, SUMMARY_CAP},
};

/// The kubelet's API; `ctx.transport` reaches the kubelet, or the API server whose node proxy
/// reaches it.
#[derive(Debug, Clone)]
pub struct KubeletClient {
    ctx: Context,
    /// Before each path: empty for the kubelet itself, the node proxy's path through the API
    /// server.
    prefix: String,
}

impl KubeletClient {
    pub fn new(ctx: Context) -> Self {
        Self {
            ctx,
            prefix: String::new(),
        }
    }

    /// The same reads through the API server's node proxy for `ctx.node` (RBAC: `nodes/proxy`
    /// `get`); `ctx.transport` reaches the API server.
    pub fn through_node_proxy(ctx: Context) -> Self {
        Self {
            prefix: Self::node_proxy_prefix(&ctx.node),
            ctx,
        }
    }

    /// `/api/v1/nodes/<node>/proxy`, the name encoded.
    pub fn node_proxy_prefix(node: &str) -> String {
        format!("{}/proxy", node_path(node))
    }

    /// The pods the kubelet runs, each read into the model, retried with backoff.
    pub async fn pods(&self) -> Result<PodList, ApiError> {
        let req = ApiRequest::get(format!("{}/pods", self.prefix)).capped(POD_LIST_CAP);
        self.get(&req, "v1.PodList", records::decode_pod_list).await
    }

    /// The kubelet's usage summary, retried with backoff: the entries that could be read, the
    /// ones that could not, and the node's task limit. A summary of another node than the
    /// agent's is refused: the address dialled belongs to another node's kubelet.
    pub async fn summary(&self) -> Result<Summary, ApiError> {
        let req = ApiRequest::get(format!("{}/stats/summary", self.prefix)).capped(SUMMARY_CAP);
        let summary = self
            .get(&req, "stats/v1alpha1 Summary", records::decode_summary)
            .await?;
        let node = &summary.node;
        if node.as_deref() != Some(self.ctx.node.as_str()) {
            return Err(ApiError::Unusable {
                endpoint: self.ctx.transport.endpoint().name,
                method: req.method,
                path: req.path,
                why: format!(
                    "it is the summary of node {}, not of {}: this kubelet is another node's",
                    node.as_deref()
                        .map_or("(none named)".to_string(), |n| format!("{n:?}")),
                    self.ctx.node
                ),
            });
        }
        Ok(summary)
    }

    /// Pods and usage together; `observed_at` is when the earlier of the two answers arrived.
    pub async fn snapshot(&self) -> Result<PodSnapshot, ApiError> {
        let PodList {
            items,
            mut problems,
            ..
        } = self.pods().await?;
        let pods_at = SystemTime::now();
        let Summary {
            max_pids,
            stats,
            problems: stats_problems,
            ..
        } = self.summary().await?;
        problems.extend(stats_problems);
        let mut snapshot = PodSnapshot::build(items, Some(&stats), pods_at, problems);
        snapshot.kubelet_max_pids = max_pids;
        Ok(snapshot)
    }

    /// The pods alone, at once (no summary: a pod the kubelet just admitted is named within
    /// one request), with the usage `last` had for the pods it knew. Ranking reads every
    /// pod's memory from its cgroup before an eviction anyway.
    pub async fn pods_now(&self, last: &PodSnapshot) -> Result<PodSnapshot, ApiError> {
        let PodList {
            items, problems, ..
        } = self.pods().await?;
        Ok(PodSnapshot::build(items, None, SystemTime::now(), problems).with_usage_of(last))
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
