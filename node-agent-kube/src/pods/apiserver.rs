//! The API server as pod source: list, then watch, the pods with
//! `fieldSelector=spec.nodeName=<node>`, kept in a store the daemon reads snapshots from.
//!
//! While a watch stream is open the store is current, so a snapshot taken then is observed
//! "now"; once the stream breaks, snapshots keep the time of the last sign of life and go stale.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::SystemTime,
};

use http::StatusCode;
use http_body_util::BodyExt as _;
use k8s_openapi::{api::core::v1::Pod, List};
use serde::Deserialize;

use super::PodSnapshot;
use crate::{
    api::{call, decode, ApiError, Context, Counters},
    transport::{ApiRequest, TransportError},
};

#[derive(Debug, Default)]
struct State {
    pods: BTreeMap<String, Pod>,
    resource_version: Option<String>,
    /// A watch stream is open and healthy.
    live: bool,
    /// Last list, event or bookmark.
    last_seen: Option<SystemTime>,
}

/// Shared view of the watched pods.
#[derive(Debug, Clone, Default)]
pub struct PodStore {
    state: Arc<Mutex<State>>,
}

impl PodStore {
    /// The pods as of now, or None before the first list succeeded.
    pub fn snapshot(&self, now: SystemTime, counters: &Counters) -> Option<PodSnapshot> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let observed_at = if state.live { now } else { state.last_seen? };
        let pods: Vec<Pod> = state.pods.values().cloned().collect();
        Some(PodSnapshot::build(&pods, None, observed_at, counters))
    }

    fn update(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.state.lock().unwrap_or_else(|p| p.into_inner()));
    }
}

/// How one watch stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchEnd {
    /// The server closed it (its timeoutSeconds ran out): watch again from the same version.
    Closed,
    /// The version is too old (410 Gone) or an event was unreadable: list again.
    Relist,
}

#[derive(Debug, Deserialize)]
struct WatchLine {
    #[serde(rename = "type")]
    kind: String,
    object: serde_json::Value,
}

/// The pods of `ctx.node`, listed and watched on the API server (`ctx.transport`).
#[derive(Debug, Clone)]
pub struct ApiServerPodSource {
    ctx: Context,
    store: PodStore,
}

impl ApiServerPodSource {
    pub fn new(ctx: Context) -> Self {
        Self {
            ctx,
            store: PodStore::default(),
        }
    }

    pub fn store(&self) -> PodStore {
        self.store.clone()
    }

    fn list_path(&self) -> String {
        format!(
            "/api/v1/pods?fieldSelector=spec.nodeName%3D{}",
            self.ctx.node
        )
    }

    /// Replaces the store with a fresh list, retried with backoff.
    pub async fn relist(&self) -> Result<(), ApiError> {
        let req = ApiRequest::get(self.list_path());
        let list: List<Pod> = self
            .ctx
            .backoff
            .run(&self.ctx.counters, "api server list pods", || async {
                let resp = call(&self.ctx.transport, &req, &[StatusCode::OK]).await?;
                decode(
                    self.ctx.transport.endpoint().name,
                    &req,
                    &resp,
                    "v1.PodList",
                )
            })
            .await?;
        let now = SystemTime::now();
        self.store.update(|s| {
            s.pods = list
                .items
                .into_iter()
                .filter_map(|p| Some((p.metadata.uid.clone()?, p)))
                .collect();
            s.resource_version = list.metadata.resource_version;
            s.last_seen = Some(now);
        });
        Ok(())
    }

    /// Opens one watch from the stored version and applies its events until it ends.
    pub async fn watch_once(&self, timeout_seconds: u32) -> Result<WatchEnd, ApiError> {
        let rv = self
            .store
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .resource_version
            .clone();
        let Some(rv) = rv else {
            return Ok(WatchEnd::Relist);
        };
        let req = ApiRequest::get(format!(
            "{}&watch=true&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds={timeout_seconds}",
            self.list_path()
        ));
        let name = self.ctx.transport.endpoint().name;
        let response = self.ctx.transport.open(&req).await?;
        if response.status() == StatusCode::GONE {
            return Ok(WatchEnd::Relist);
        }
        if response.status() != StatusCode::OK {
            let status = response.status();
            let headers = response.headers().clone();
            let body = response
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes().to_vec())
                .unwrap_or_default();
            return Err(ApiError::from_response(
                name,
                &req,
                &crate::transport::HttpResponse {
                    status,
                    headers,
                    body,
                },
            ));
        }
        self.store.update(|s| s.live = true);
        let end = self.apply_stream(&req, response.into_body()).await;
        self.store.update(|s| {
            s.live = false;
            s.last_seen = Some(SystemTime::now());
        });
        end
    }

    async fn apply_stream(
        &self,
        req: &ApiRequest,
        mut body: kube::client::Body,
    ) -> Result<WatchEnd, ApiError> {
        let mut buf = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|source| TransportError::ReadBody {
                endpoint: self.ctx.transport.endpoint().name,
                method: req.method.clone(),
                path: req.path.clone(),
                source: Box::new(source),
            })?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            buf.extend_from_slice(&data);
            while let Some(pos) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=pos).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                if self.apply_line(&line) == Some(WatchEnd::Relist) {
                    return Ok(WatchEnd::Relist);
                }
            }
        }
        Ok(WatchEnd::Closed)
    }

    /// Applies one event; Some(Relist) when the store can no longer be trusted.
    fn apply_line(&self, line: &[u8]) -> Option<WatchEnd> {
        let event: WatchLine = match serde_json::from_slice(line) {
            Ok(e) => e,
            Err(e) => {
                Counters::bump(&self.ctx.counters.watch_events_dropped);
                tracing::warn!(error = %e, "unreadable pod watch event; listing again");
                return Some(WatchEnd::Relist);
            }
        };
        if event.kind == "ERROR" {
            let code = event.object.get("code").and_then(|c| c.as_u64());
            tracing::info!(?code, "pod watch ended with an error event; listing again");
            return Some(WatchEnd::Relist);
        }
        let pod: Pod = match serde_json::from_value(event.object) {
            Ok(p) => p,
            Err(e) => {
                Counters::bump(&self.ctx.counters.watch_events_dropped);
                tracing::warn!(error = %e, kind = %event.kind, "unreadable pod in a watch event; listing again");
                return Some(WatchEnd::Relist);
            }
        };
        let now = SystemTime::now();
        self.store.update(|s| {
            s.last_seen = Some(now);
            s.resource_version = pod
                .metadata
                .resource_version
                .clone()
                .or(s.resource_version.take());
            let Some(uid) = pod.metadata.uid.clone() else {
                return;
            };
            match event.kind.as_str() {
                "ADDED" | "MODIFIED" => {
                    s.pods.insert(uid, pod);
                }
                "DELETED" => {
                    s.pods.remove(&uid);
                }
                _ => {} // BOOKMARK: only the version moves
            }
        });
        None
    }

    /// Lists, then watches, forever; every failure is logged, counted and retried with backoff.
    pub async fn run(self, watch_timeout_seconds: u32) {
        let mut need_list = true;
        let mut failures = 0u32;
        loop {
            let step = if need_list {
                self.relist().await.map(|()| WatchEnd::Closed)
            } else {
                self.watch_once(watch_timeout_seconds).await
            };
            match step {
                Ok(end) => {
                    failures = 0;
                    need_list = end == WatchEnd::Relist;
                }
                Err(e) => {
                    failures += 1;
                    Counters::bump(&self.ctx.counters.request_failures);
                    tracing::error!(error = %e, "pod watch failed; listing again after a pause");
                    need_list = true;
                    tokio::time::sleep(self.ctx.backoff.delay(failures)).await;
                }
            }
        }
    }
}
