//! What is sent ([`ApiRequest`]) and what comes back ([`HttpResponse`]), with the cap on what
//! an answer may weigh.
//!
//! ## What an answer may weigh
//!
//! A body is read frame by frame into one buffer and refused as soon as it passes its cap
//! (or declares a `Content-Length` above it), so a hostile or broken endpoint costs at most the
//! cap, never the whole answer; the DaemonSet's 256 MiB limit holds the agent, its kernel maps
//! and one capped answer with its decoded objects. The caps come from what real nodes hold:
//!
//! - A pod list ([`POD_LIST_CAP`], 32 MiB): the kubelet's default `maxPods` is 110 and managed
//!   clusters allow up to 250 (AKS 250, GKE 256 with a /23, EKS with prefix delegation). A pod
//!   object as the kubelet and the API server return it (managedFields, a
//!   `last-applied-configuration` annotation, a few containers with env) weighs 8–30 KiB; a
//!   large one 60 KiB. 250 pods × 64 KiB = 16 MiB; the cap doubles that.
//! - The kubelet's `/stats/summary` ([`SUMMARY_CAP`], 16 MiB): 2–6 KiB per pod (containers,
//!   volumes, network interfaces); 250 pods × 16 KiB = 4 MiB, four times headroom.
//! - Any other answer ([`OBJECT_CAP`], 4 MiB): one object (a Node with its 50 image entries is
//!   20–80 KiB; etcd refuses objects above 1.5 MiB) or a `metav1.Status`.
//! - One watch event ([`WATCH_LINE_CAP`], 4 MiB): one Pod (at most etcd's 1.5 MiB) in its
//!   envelope; see `pods::apiserver` for the watch's deadlines.

use http::{Method, StatusCode};

/// The most a pod list (`GET /pods`, or a list of the API server) may weigh: see the module.
pub const POD_LIST_CAP: usize = 32 << 20;
/// The most the kubelet's `/stats/summary` may weigh.
pub const SUMMARY_CAP: usize = 16 << 20;
/// The most any other answer (one object, a Status) may weigh.
pub const OBJECT_CAP: usize = 4 << 20;
/// The most one line (one event) of a watch may weigh.
pub const WATCH_LINE_CAP: usize = 4 << 20;

/// A complete HTTP answer.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: StatusCode,
    pub headers: http::HeaderMap,
    pub body: Vec<u8>,
}

/// How much of an answer a message quotes, in bytes.
pub const EXCERPT: usize = 512;

impl HttpResponse {
    /// The body for error messages: UTF-8, cut to [`EXCERPT`] bytes.
    pub fn excerpt(&self) -> String {
        let text = String::from_utf8_lossy(&self.body);
        let mut end = text.len().min(EXCERPT);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text[..end].to_string()
    }
}

/// What an answer past its cap becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PastCap {
    /// Refused ([`TransportError::TooLarge`]): the caller needs the whole body.
    #[default]
    Refused,
    /// Cut at the cap, the rest never read: the status decides (an eviction the server
    /// accepted is accepted, whatever it wrote after).
    Cut,
}

/// A request to send: method, path with query, optional body with its content type, and the
/// most its answer may weigh.
#[derive(Debug, Clone)]
pub struct ApiRequest {
    pub method: Method,
    pub path: String,
    pub body: Option<(&'static str, Vec<u8>)>,
    /// The answer's cap in bytes ([`OBJECT_CAP`] unless the request says otherwise).
    pub max_body: usize,
    /// What an answer past `max_body` becomes.
    pub past_cap: PastCap,
}

impl ApiRequest {
    pub fn get(path: impl Into<String>) -> Self {
        Self {
            method: Method::GET,
            path: path.into(),
            body: None,
            max_body: OBJECT_CAP,
            past_cap: PastCap::Refused,
        }
    }

    /// The same request with another cap on its answer.
    pub fn capped(mut self, max_body: usize) -> Self {
        self.max_body = max_body;
        self
    }

    /// The same request, its answer cut at the cap rather than refused: for a write whose
    /// status says what happened.
    pub fn status_decides(mut self) -> Self {
        self.past_cap = PastCap::Cut;
        self
    }

    pub fn with_json(
        method: Method,
        path: impl Into<String>,
        content_type: &'static str,
        body: &serde_json::Value,
    ) -> Self {
        Self {
            method,
            path: path.into(),
            body: Some((content_type, body.to_string().into_bytes())),
            max_body: OBJECT_CAP,
            past_cap: PastCap::Refused,
        }
    }
}
