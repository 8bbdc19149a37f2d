//! The API server as pod source: list, then watch, the pods with
//! `fieldSelector=spec.nodeName=<node>`, kept in a store the daemon reads snapshots from.
//!
//! A snapshot is as old as the last time the API server spoke for the store: a list, an
//! event, a bookmark, or a watch it opened from the store's version. An open watch vouches
//! for nothing by itself, so a watch that stays open and silent never makes old data look
//! fresh. To keep a quiet node's data within the staleness bound, each watch asks the server
//! to end it well within the bound ([`WatchTiming::for_bound`]); the server sends a bookmark
//! just before, and the next watch opens at once.
//!
//! Everything read is bounded: a list by `POD_LIST_CAP`, each watch line by `WATCH_LINE_CAP`
//! and by the request timeout from its first byte to its newline, and a watch silent past its
//! deadline is given up and the pods listed again. A list or watch that brings nothing (an
//! error, a 410 at once, a watch closed at once) makes the next one wait, exponentially with
//! jitter up to a cap, with one log line when the source starts backing off and one when it
//! is healthy again, and the pause on `/metrics`.

use std::{
    collections::BTreeMap,
    sync::{atomic::Ordering, Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use http::StatusCode;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::{
    records::{self, Item, PodList, Problem, POD_MODEL_BUDGET},
    PodSnapshot,
};
use crate::{
    api::{call, jitter, ApiError, Context, Counters},
    transport::{encode, ApiRequest, TransportError, POD_LIST_CAP, WATCH_LINE_CAP},
};

/// The first pause after a list or watch that brought nothing; it doubles from there.
const FIRST_PAUSE: Duration = Duration::from_millis(250);
/// The longest pause between lists, whatever the bound.
const MAX_PAUSE: Duration = Duration::from_secs(30);

#[derive(Debug, Default)]
struct State {
    /// By `namespace/name` (unique in the API server; two pods sharing a UID both stay, for
    /// the snapshot to refuse), each already in the model.
    pods: BTreeMap<String, Item>,
    /// What `pods` holds, approximately, in bytes: never above `POD_MODEL_BUDGET`.
    bytes: usize,
    /// Pods whose object cannot be read, by the name they give.
    unreadable: BTreeMap<String, Problem>,
    resource_version: Option<String>,
    /// The last time the API server spoke for the store: list, event, bookmark, watch opened.
    last_seen: Option<SystemTime>,
    /// Why the last list or watch failed, until one succeeds.
    last_error: Option<String>,
    /// Whether the first list has succeeded.
    listed: bool,
}

/// Shared view of the watched pods.
#[derive(Debug, Clone, Default)]
pub struct PodStore {
    state: Arc<Mutex<State>>,
}

impl PodStore {
    /// The pods as of the last time the API server spoke, or None before the first list.
    pub fn snapshot(&self) -> Option<PodSnapshot> {
        let (pods, problems, observed_at) = {
            let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if !state.listed {
                return None;
            }
            let pods: Vec<Item> = state.pods.values().cloned().collect();
            let problems: Vec<Problem> = state.unreadable.values().cloned().collect();
            (pods, problems, state.last_seen?)
        };
        Some(PodSnapshot::build(pods, None, observed_at, problems))
    }

    /// Why the last list or watch failed, while none has succeeded since.
    pub fn last_error(&self) -> Option<String> {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last_error
            .clone()
    }

    fn update<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// How long a watch runs and how long it may stay silent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchTiming {
    /// `timeoutSeconds` of each watch: the server ends it then (with a bookmark 2 s before).
    pub timeout_seconds: u32,
    /// No line for this long: the watch is given up and the pods listed again.
    pub silence: Duration,
    /// The longest pause between lists while backing off.
    pub max_pause: Duration,
}

impl WatchTiming {
    /// Watches that end (and are opened again) within two thirds of the staleness `bound`, at
    /// least every 5 s and at most every 60 s, so a quiet node's pods never look older than
    /// the bound while the API server answers, whatever its bookmark schedule (the API server
    /// bookmarks about every minute since 1.27, and 2 s before a watch's deadline since 1.16).
    /// Silent for the timeout and 10 s more, a watch is given up. Backing off pauses at most
    /// half the bound (and 30 s), so even a failing watch has the pods listed within the
    /// bound.
    pub fn for_bound(bound: Duration) -> Self {
        let timeout = (bound.as_secs() * 2 / 3).clamp(5, 60) as u32;
        Self {
            timeout_seconds: timeout,
            silence: Duration::from_secs(u64::from(timeout) + 10),
            max_pause: (bound / 2).clamp(FIRST_PAUSE, MAX_PAUSE),
        }
    }
}

/// Why the store must be listed again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelistReason {
    /// No version to watch from (before the first list).
    NoVersion,
    /// The version is too old: a 410 answer, or an ERROR event.
    Expired,
    /// A line that is not a watch event.
    Unreadable,
    /// A line longer than `WATCH_LINE_CAP`.
    LineTooLarge,
    /// A line that did not end within the request timeout of its first byte.
    LineTooSlow,
    /// The events would make the pods take more than their budget.
    OverBudget,
    /// No line within the watch's silence deadline.
    Silent,
}

impl RelistReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoVersion => "no version to watch from",
            Self::Expired => "the version expired (410)",
            Self::Unreadable => "a watch line is not an event",
            Self::LineTooLarge => "a watch line passed its size cap",
            Self::LineTooSlow => "a watch line did not end in time",
            Self::OverBudget => "the watched pods passed their memory budget",
            Self::Silent => "the watch stayed silent past its deadline",
        }
    }
}

/// How one watch stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchEnd {
    /// The server closed it (its timeoutSeconds ran out): watch again from the same version.
    Closed { lines: usize },
    /// The store can no longer be followed from its version: list again.
    Relist { reason: RelistReason, lines: usize },
}

impl WatchEnd {
    /// Events and bookmarks the watch delivered.
    pub fn lines(self) -> usize {
        match self {
            Self::Closed { lines } | Self::Relist { lines, .. } => lines,
        }
    }
}

#[derive(Debug, Deserialize)]
struct WatchLine<'a> {
    #[serde(rename = "type")]
    kind: String,
    #[serde(borrow)]
    object: &'a RawValue,
}

/// The version and code an event's object gives, read leniently (a pod that cannot be read
/// still moves the version).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ObjectHead {
    #[serde(default)]
    metadata: Option<HeadMeta>,
    code: Option<u16>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct HeadMeta {
    resource_version: Option<String>,
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
            "/api/v1/pods?fieldSelector={}",
            encode(&format!("spec.nodeName={}", self.ctx.node))
        )
    }

    /// Replaces the store with a fresh list, retried with backoff. Pods that cannot be read
    /// are kept aside, named; they never fail the list.
    pub async fn relist(&self) -> Result<(), ApiError> {
        Counters::bump(&self.ctx.counters.pod_relists);
        let req = ApiRequest::get(self.list_path()).capped(POD_LIST_CAP);
        let name = self.ctx.transport.endpoint().name;
        let result = self
            .ctx
            .backoff
            .run(&self.ctx.counters, "api server list pods", || async {
                let resp = call(&self.ctx.transport, &req, &[StatusCode::OK]).await?;
                // Up to the cap's megabytes of JSON: decoded on a blocking thread.
                let decoded =
                    tokio::task::spawn_blocking(move || records::decode_pod_list(&resp.body)).await;
                ApiError::decoded(name, &req, "v1.PodList", decoded)
            })
            .await;
        let PodList {
            items,
            resource_version,
            problems,
        } = match result {
            Ok(list) => list,
            Err(e) => {
                self.store.update(|s| s.last_error = Some(e.to_string()));
                return Err(e);
            }
        };
        let now = SystemTime::now();
        self.store.update(|s| {
            s.bytes = items.iter().map(|i| i.bytes).sum();
            s.pods = items.into_iter().map(|i| (i.name.clone(), i)).collect();
            s.unreadable = problems.into_iter().map(|p| (p.pod.clone(), p)).collect();
            s.resource_version = resource_version;
            s.last_seen = Some(now);
            s.last_error = None;
            s.listed = true;
        });
        Ok(())
    }

    /// Opens one watch from the stored version and applies its events until it ends.
    pub async fn watch_once(&self, timing: &WatchTiming) -> Result<WatchEnd, ApiError> {
        let rv = self.store.update(|s| s.resource_version.clone());
        let Some(rv) = rv else {
            return Ok(WatchEnd::Relist {
                reason: RelistReason::NoVersion,
                lines: 0,
            });
        };
        let req = ApiRequest::get(format!(
            "{}&watch=true&resourceVersion={}&allowWatchBookmarks=true&timeoutSeconds={}",
            self.list_path(),
            encode(&rv),
            timing.timeout_seconds
        ));
        let transport = &self.ctx.transport;
        let response = match transport.open(&req).await {
            Ok(r) => r,
            Err(e) => {
                self.store.update(|s| s.last_error = Some(e.to_string()));
                return Err(e.into());
            }
        };
        if response.status() == StatusCode::GONE {
            return Ok(WatchEnd::Relist {
                reason: RelistReason::Expired,
                lines: 0,
            });
        }
        if response.status() != StatusCode::OK {
            let (parts, body) = response.into_parts();
            let body = transport
                .read_capped(&req, &parts.headers, body)
                .await
                .unwrap_or_default();
            let err = ApiError::from_response(
                transport.endpoint().name,
                &req,
                &crate::transport::HttpResponse {
                    status: parts.status,
                    headers: parts.headers,
                    body,
                },
            );
            self.store.update(|s| s.last_error = Some(err.to_string()));
            return Err(err);
        }
        // The server opened a watch from the store's version: the store is current now.
        let now = SystemTime::now();
        self.store.update(|s| {
            s.last_seen = Some(now);
            s.last_error = None;
        });
        let result = self.apply_stream(&req, response.into_body(), timing).await;
        if let Err(e) = &result {
            self.store.update(|s| s.last_error = Some(e.to_string()));
        }
        result
    }

    /// Reads the stream line by line, each line capped in size and due within the request
    /// timeout of its first byte, the stream given up when silent past `timing.silence`.
    async fn apply_stream(
        &self,
        req: &ApiRequest,
        mut body: kube::client::Body,
        timing: &WatchTiming,
    ) -> Result<WatchEnd, ApiError> {
        use http_body_util::BodyExt as _;
        let line_deadline = self.ctx.transport.endpoint().timeout;
        let mut buf: Vec<u8> = Vec::new();
        let mut line_started: Option<Instant> = None;
        let mut last_line = Instant::now();
        let mut lines = 0;
        let relist = |reason: RelistReason, lines| {
            tracing::debug!(reason = reason.as_str(), "pod watch ended; listing again");
            Ok(WatchEnd::Relist { reason, lines })
        };
        loop {
            let silent_at = last_line + timing.silence;
            let deadline = line_started.map_or(silent_at, |t| (t + line_deadline).min(silent_at));
            let frame = match tokio::time::timeout_at(deadline.into(), body.frame()).await {
                Err(_) => {
                    let slow = line_started.is_some_and(|t| t + line_deadline <= silent_at);
                    let reason = if slow {
                        RelistReason::LineTooSlow
                    } else {
                        RelistReason::Silent
                    };
                    Counters::bump(&self.ctx.counters.watch_events_dropped);
                    return relist(reason, lines);
                }
                Ok(None) => return Ok(WatchEnd::Closed { lines }),
                Ok(Some(Err(source))) => {
                    return Err(TransportError::ReadBody {
                        endpoint: self.ctx.transport.endpoint().name,
                        method: req.method.clone(),
                        path: req.path.clone(),
                        source: Box::new(source),
                    }
                    .into())
                }
                Ok(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            // Only the new bytes are searched: a line arriving in many frames costs its
            // length once, not once per frame.
            let mut rest: &[u8] = &data;
            while let Some(pos) = rest.iter().position(|&b| b == b'\n') {
                let (head, tail) = (&rest[..pos], &rest[pos + 1..]);
                rest = tail;
                if buf.len() + head.len() > WATCH_LINE_CAP {
                    Counters::bump(&self.ctx.counters.watch_events_dropped);
                    return relist(RelistReason::LineTooLarge, lines);
                }
                let outcome = if buf.is_empty() {
                    self.apply_line(head)
                } else {
                    buf.extend_from_slice(head);
                    let outcome = self.apply_line(&buf);
                    buf.clear();
                    outcome
                };
                line_started = None;
                match outcome {
                    Applied::Nothing => continue,
                    Applied::Line => {
                        lines += 1;
                        last_line = Instant::now();
                    }
                    Applied::Relist(reason) => return relist(reason, lines),
                }
            }
            if !rest.is_empty() {
                if buf.len() + rest.len() > WATCH_LINE_CAP {
                    Counters::bump(&self.ctx.counters.watch_events_dropped);
                    return relist(RelistReason::LineTooLarge, lines);
                }
                line_started.get_or_insert_with(Instant::now);
                buf.extend_from_slice(rest);
            }
        }
    }

    /// Applies one event: a pod added, changed or gone, a bookmark, or the end of the watch.
    fn apply_line(&self, line: &[u8]) -> Applied {
        if line.iter().all(u8::is_ascii_whitespace) {
            return Applied::Nothing;
        }
        let event: WatchLine = match serde_json::from_slice(line) {
            Ok(e) => e,
            Err(e) => {
                Counters::bump(&self.ctx.counters.watch_events_dropped);
                tracing::debug!(error = %e, "unreadable pod watch line");
                return Applied::Relist(RelistReason::Unreadable);
            }
        };
        let head: ObjectHead = serde_json::from_str(event.object.get()).unwrap_or_default();
        if event.kind == "ERROR" {
            tracing::debug!(code = ?head.code, "pod watch ended with an error event");
            return Applied::Relist(RelistReason::Expired);
        }
        let version = head.metadata.and_then(|m| m.resource_version);
        let pod = match event.kind.as_str() {
            "ADDED" | "MODIFIED" | "DELETED" => Some(records::decode_item(event.object, 0)),
            // BOOKMARK: only the version moves.
            _ => None,
        };
        let now = SystemTime::now();
        self.store.update(|s| {
            s.last_seen = Some(now);
            if version.is_some() {
                s.resource_version = version;
            }
            let name = match &pod {
                Some(Ok(item)) => item.name.clone(),
                Some(Err(problem)) => problem.pod.clone(),
                None => return Applied::Line,
            };
            s.unreadable.remove(&name);
            if let Some(gone) = s.pods.remove(&name) {
                s.bytes -= gone.bytes;
            }
            match (event.kind.as_str(), pod) {
                ("DELETED", _) | (_, None) => {}
                (_, Some(Ok(item))) => {
                    if s.bytes + item.bytes > POD_MODEL_BUDGET {
                        return Applied::Relist(RelistReason::OverBudget);
                    }
                    s.bytes += item.bytes;
                    s.pods.insert(name, item);
                }
                (_, Some(Err(problem))) => {
                    // Named and left aside, as in a list; the watch goes on.
                    Counters::bump(&self.ctx.counters.watch_events_dropped);
                    s.unreadable.insert(name, problem);
                }
            }
            Applied::Line
        })
    }

    /// Lists, then watches, forever. A round that brings nothing (a failed list or watch, a
    /// watch that ends at once without a line) makes the next wait, exponentially with jitter
    /// up to `timing.max_pause`; one line says when the source starts backing off, one when
    /// it is healthy again.
    pub async fn run(self, timing: WatchTiming) {
        let counters = self.ctx.counters.clone();
        let mut need_list = true;
        let mut fruitless = 0u32;
        loop {
            let started = Instant::now();
            let outcome: Result<Option<WatchEnd>, ApiError> = if need_list {
                self.relist().await.map(|()| None)
            } else {
                self.watch_once(&timing).await.map(Some)
            };
            let fruitful = match &outcome {
                // A list alone proves nothing: a 410 storm lists fine every time.
                Ok(None) => {
                    need_list = false;
                    continue;
                }
                Ok(Some(end)) => {
                    need_list = matches!(end, WatchEnd::Relist { .. });
                    end.lines() > 0
                        || started.elapsed()
                            >= Duration::from_secs(u64::from(timing.timeout_seconds)) / 2
                }
                Err(_) => {
                    need_list = true;
                    false
                }
            };
            if fruitful {
                if fruitless > 0 {
                    tracing::info!(
                        rounds = fruitless,
                        "pod watch healthy again: no longer backing off"
                    );
                    counters
                        .pod_watch_backoff_millis
                        .store(0, Ordering::Relaxed);
                }
                fruitless = 0;
                continue;
            }
            fruitless += 1;
            let base = FIRST_PAUSE
                .saturating_mul(1u32.checked_shl(fruitless - 1).unwrap_or(u32::MAX))
                .min(timing.max_pause);
            let pause = jitter(base).min(timing.max_pause);
            counters
                .pod_watch_backoff_millis
                .store(pause.as_millis() as u64, Ordering::Relaxed);
            let why = match &outcome {
                Err(e) => e.to_string(),
                Ok(Some(WatchEnd::Relist { reason, .. })) => reason.as_str().to_string(),
                Ok(_) => "the watch ended at once without an event".to_string(),
            };
            if fruitless == 1 {
                tracing::warn!(why = %why, ?pause,
                    "pod list and watch bring nothing: backing off (exponentially, up to {:?}) until a watch delivers again",
                    timing.max_pause);
            } else {
                tracing::debug!(why = %why, ?pause, rounds = fruitless, "pod watch still backing off");
            }
            tokio::time::sleep(pause).await;
        }
    }
}

/// What one line did.
enum Applied {
    /// A blank line.
    Nothing,
    /// An event or bookmark, applied.
    Line,
    /// The store must be listed again.
    Relist(RelistReason),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watches_end_within_the_staleness_bound() {
        let s = Duration::from_secs;
        // (bound, timeoutSeconds, silence, longest pause)
        let rows = [
            (s(30), 20, s(30), s(15)),
            (s(5), 5, s(15), Duration::from_millis(2500)),
            (s(1), 5, s(15), Duration::from_millis(500)),
            (s(90), 60, s(70), s(30)),
            (s(3600), 60, s(70), s(30)),
        ];
        for (bound, timeout, silence, pause) in rows {
            let t = WatchTiming::for_bound(bound);
            assert_eq!(
                (t.timeout_seconds, t.silence, t.max_pause),
                (timeout, silence, pause),
                "{bound:?}"
            );
        }
    }
}
