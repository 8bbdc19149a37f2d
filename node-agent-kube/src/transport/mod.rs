//! One HTTPS endpoint (the kubelet or the API server): TLS verified against CA files ([`Tls`]),
//! or explicitly not at all, a bearer token re-read from disk before every request, a timeout on
//! every request, a cap on every answer's size, and errors that say which endpoint failed and
//! how.
//!
//! kube's `Client` carries the bytes (hyper); the TLS connector is built here (rustls with
//! ring) because the kubelet's certificate may name the node rather than the address the agent
//! dials ([`Tls::Verify`]'s `also_named`), which kube's connector cannot check. Requests are
//! built here too, so that the token, the status handling and the exact wire format stay in
//! this crate's hands. Every name that goes into a path or a query goes through [`encode`].
//!
//! One job a file: `request` (what is sent, what comes back, and what an answer may weigh),
//! `tls` (the rustls setup from CA files) with `verify` (how the serving certificate is
//! judged, and the handshake's signatures checked once for either way), `token` (the bearer
//! token) and `error` (what went wrong, and telling a TLS failure from an outage). This file
//! holds the [`Transport`] that sends.

mod error;
mod request;
mod tls;
mod token;
mod verify;

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use http::{header, Request, StatusCode};
use http_body_util::BodyExt as _;
use hyper_util::client::legacy::connect::HttpConnector;
use kube::client::{Body, ConfigExt as _};

use self::{error::classify, tls::client_tls, token::read_token};
pub use self::{
    error::TransportError,
    request::{
        ApiRequest, HttpResponse, PastCap, EXCERPT, OBJECT_CAP, POD_LIST_CAP, SUMMARY_CAP,
        WATCH_LINE_CAP,
    },
    tls::Tls,
};

/// Percent-encodes one path segment or one query value: everything but RFC 3986's unreserved
/// characters (`A-Z a-z 0-9 - . _ ~`). The one encoder for every name the agent puts in a URL
/// (pods, namespaces, nodes, field selectors, resource versions), so that a name such as
/// `hog?dryRun=All&x=` from a lying kubelet stays a name and never becomes a query.
pub fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// How to reach one endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Shown in errors and logs: "kubelet" or "api server".
    pub name: &'static str,
    /// `https://host:port`.
    pub url: String,
    pub tls: Tls,
    /// None sends no Authorization header.
    pub token_path: Option<PathBuf>,
    pub timeout: Duration,
}

/// How the endpoint last answered, whatever asked: the time, and the status or why there was
/// none. Readiness reads it (`/readyz` names an endpoint that cannot be reached or refuses the
/// agent); every clone of one [`Transport`] shares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastAnswer {
    pub at: Instant,
    /// `METHOD path` of the request answered.
    pub request: String,
    /// The HTTP status, or the transport error in words.
    pub outcome: Result<StatusCode, String>,
}

#[derive(Debug, Default)]
struct Link {
    last: Mutex<Option<LastAnswer>>,
}

impl Link {
    fn record(&self, req: &ApiRequest, outcome: Result<StatusCode, String>) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(LastAnswer {
            at: Instant::now(),
            request: format!("{} {}", req.method, req.path),
            outcome,
        });
    }
}

#[derive(Clone)]
pub struct Transport {
    endpoint: Endpoint,
    client: kube::Client,
    link: Arc<Link>,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl Transport {
    /// Reads the CA files and builds the client. Must run inside a tokio runtime.
    pub fn new(endpoint: Endpoint) -> Result<Self, TransportError> {
        let name = endpoint.name;
        let uri: http::Uri = endpoint
            .url
            .parse()
            .map_err(|source| TransportError::BadUrl {
                endpoint: name,
                url: endpoint.url.clone(),
                source,
            })?;
        let tls = client_tls(name, &endpoint.tls)?;
        // The stack kube documents for a custom client (`Client::new`): a TLS connector and
        // the base URI, and nothing else. Not `Client::try_from`: its TraceLayer logs an ERROR
        // line for every failed request (a wrong CA: one per request, every refresh), and
        // its retries and timeouts are this crate's to choose. Every request is bounded by
        // `send`'s or `open`'s timeout; a watch by its own deadlines.
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(endpoint.timeout));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_only()
            .enable_http1()
            .wrap_connector(http);
        let config = kube::Config::new(uri);
        let service = tower::ServiceBuilder::new()
            .layer(config.base_uri_layer())
            .service(
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .build::<_, Body>(https),
            );
        let client = kube::Client::new(service, config.default_namespace);
        Ok(Self {
            endpoint,
            client,
            link: Arc::default(),
        })
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// How the endpoint last answered (any request through this transport or its clones).
    pub fn last_answer(&self) -> Option<LastAnswer> {
        self.link
            .last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Sends one request and reads the whole answer within the endpoint's timeout, at most
    /// `req.max_body` bytes of it. Any HTTP status is a successful transport; callers
    /// interpret it.
    pub async fn send(&self, req: &ApiRequest) -> Result<HttpResponse, TransportError> {
        let timeout = self.endpoint.timeout;
        let fut = async {
            let (parts, body) = self.open(req).await?.into_parts();
            let body = self.read_capped(req, &parts.headers, body).await?;
            Ok(HttpResponse {
                status: parts.status,
                headers: parts.headers,
                body,
            })
        };
        let result = tokio::time::timeout(timeout, fut)
            .await
            .unwrap_or_else(|_| Err(self.timeout_error(req)));
        match &result {
            // The endpoint answered (its status is recorded): what it said is the caller's.
            Err(TransportError::TooLarge { .. }) | Ok(_) => {}
            Err(e) => self.link.record(req, Err(e.to_string())),
        }
        result
    }

    /// The body, frame by frame into one buffer, refused as soon as it passes the cap: at most
    /// the cap is ever held, and no copy of it is made.
    pub(crate) async fn read_capped(
        &self,
        req: &ApiRequest,
        headers: &http::HeaderMap,
        mut body: Body,
    ) -> Result<Vec<u8>, TransportError> {
        let cap = req.max_body;
        let too_large = |declared| TransportError::TooLarge {
            endpoint: self.endpoint.name,
            method: req.method.clone(),
            path: req.path.clone(),
            cap,
            declared,
        };
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let cut = req.past_cap == PastCap::Cut;
        if declared.is_some_and(|n| n > cap as u64) && !cut {
            return Err(too_large(declared));
        }
        let mut buf = Vec::with_capacity(declared.map_or(0, |n| n as usize).min(cap));
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|source| TransportError::ReadBody {
                endpoint: self.endpoint.name,
                method: req.method.clone(),
                path: req.path.clone(),
                source: Box::new(source),
            })?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            if buf.len() + data.len() > cap {
                if cut {
                    // The rest is never read; the connection goes with the body.
                    buf.extend_from_slice(&data[..cap - buf.len()]);
                    return Ok(buf);
                }
                return Err(too_large(declared));
            }
            buf.extend_from_slice(&data);
        }
        Ok(buf)
    }

    /// Sends a request and returns the answer with its body still streaming (for watches).
    /// Only the headers are bounded by the timeout.
    pub async fn open(&self, req: &ApiRequest) -> Result<http::Response<Body>, TransportError> {
        let result = self.open_unrecorded(req).await;
        self.link.record(
            req,
            match &result {
                Ok(response) => Ok(response.status()),
                Err(e) => Err(e.to_string()),
            },
        );
        result
    }

    async fn open_unrecorded(
        &self,
        req: &ApiRequest,
    ) -> Result<http::Response<Body>, TransportError> {
        let name = self.endpoint.name;
        let mut builder = Request::builder()
            .method(req.method.clone())
            .uri(&req.path)
            .header(header::ACCEPT, "application/json");
        if let Some(path) = &self.endpoint.token_path {
            builder = builder.header(header::AUTHORIZATION, read_token(name, path).await?);
        }
        let body = match &req.body {
            Some((content_type, bytes)) => {
                builder = builder.header(header::CONTENT_TYPE, *content_type);
                Body::from(bytes.clone())
            }
            None => Body::empty(),
        };
        let request = builder
            .body(body)
            .map_err(|source| TransportError::BuildRequest {
                endpoint: name,
                path: req.path.clone(),
                source,
            })?;
        match tokio::time::timeout(self.endpoint.timeout, self.client.send(request)).await {
            Err(_) => Err(self.timeout_error(req)),
            Ok(Ok(response)) => Ok(response),
            Ok(Err(source)) => Err(classify(name, req, source)),
        }
    }

    fn timeout_error(&self, req: &ApiRequest) -> TransportError {
        TransportError::Timeout {
            endpoint: self.endpoint.name,
            method: req.method.clone(),
            path: req.path.clone(),
            after: self.endpoint.timeout,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_encoded_so_they_stay_one_segment_or_one_value() {
        let rows = [
            (
                "a plain pod name",
                "web-7c9f8d6b5-x2x9q",
                "web-7c9f8d6b5-x2x9q",
            ),
            (
                "a query smuggled in a name",
                "hog?dryRun=All&x=",
                "hog%3FdryRun%3DAll%26x%3D",
            ),
            (
                "a path smuggled in a name",
                "../../nodes/n1",
                "..%2F..%2Fnodes%2Fn1",
            ),
            ("a fragment and a space", "a#b c", "a%23b%20c"),
            ("a percent sign stays literal", "100%", "100%25"),
            (
                "a field selector value",
                "spec.nodeName=worker-1",
                "spec.nodeName%3Dworker-1",
            ),
            ("non-ASCII, byte by byte", "é", "%C3%A9"),
            ("unreserved marks", "a-b.c_d~e", "a-b.c_d~e"),
        ];
        for (what, name, want) in rows {
            assert_eq!(encode(name), want, "{what}");
        }
    }
}
