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

use std::{
    error::Error as StdError,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use http::{header, Method, Request, StatusCode};
use http_body_util::BodyExt as _;
use hyper_util::client::legacy::connect::HttpConnector;
use kube::client::{Body, ConfigExt as _};
use rustls::{
    client::{
        danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
        WebPkiServerVerifier,
    },
    crypto::CryptoProvider,
    pki_types::{pem::PemObject as _, CertificateDer, ServerName, UnixTime},
    CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

/// The most a pod list (`GET /pods`, or a list of the API server) may weigh: see the module.
pub const POD_LIST_CAP: usize = 32 << 20;
/// The most the kubelet's `/stats/summary` may weigh.
pub const SUMMARY_CAP: usize = 16 << 20;
/// The most any other answer (one object, a Status) may weigh.
pub const OBJECT_CAP: usize = 4 << 20;
/// The most one line (one event) of a watch may weigh.
pub const WATCH_LINE_CAP: usize = 4 << 20;

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

/// How an endpoint's serving certificate is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tls {
    /// It must chain to a certificate of one of `ca_files` (PEM, each read when the transport
    /// is built; one that cannot be read, or holds no certificate, is an error) and name the
    /// host of the URL, or else one of `also_named` (DNS names or IP addresses): a kubelet's
    /// self-signed certificate names its hostname only, while the agent dials its address.
    Verify {
        ca_files: Vec<PathBuf>,
        also_named: Vec<String>,
    },
    /// Not checked at all. Only ever from a setting that says so explicitly.
    Insecure,
}

impl Tls {
    /// Verified against one CA file, for the URL's host only.
    pub fn ca(path: impl Into<PathBuf>) -> Self {
        Self::Verify {
            ca_files: vec![path.into()],
            also_named: Vec::new(),
        }
    }

    pub fn is_verified(&self) -> bool {
        matches!(self, Self::Verify { .. })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("{endpoint}: URL {url:?} is not valid")]
    BadUrl {
        endpoint: &'static str,
        url: String,
        #[source]
        source: http::uri::InvalidUri,
    },
    #[error("{endpoint}: cannot read CA file {}", path.display())]
    ReadCa {
        endpoint: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{endpoint}: CA file {} holds no usable PEM certificate{}", path.display(),
        detail.as_ref().map(|d| format!(" ({d})")).unwrap_or_default())]
    BadCa {
        endpoint: &'static str,
        path: PathBuf,
        /// What was wrong with it, when more than "no certificate".
        detail: Option<String>,
    },
    #[error("{endpoint}: {name:?} is neither a DNS name nor an IP address a certificate can name")]
    BadServerName {
        endpoint: &'static str,
        name: String,
    },
    #[error("{endpoint}: cannot set up TLS: {detail}")]
    TlsSetup {
        endpoint: &'static str,
        detail: String,
    },
    #[error("{endpoint}: cannot build a request for {path:?}")]
    BuildRequest {
        endpoint: &'static str,
        path: String,
        #[source]
        source: http::Error,
    },
    #[error("{endpoint}: cannot read the bearer token {}", path.display())]
    ReadToken {
        endpoint: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{endpoint}: bearer token file {} is empty or not a valid header value", path.display())]
    BadToken {
        endpoint: &'static str,
        path: PathBuf,
    },
    #[error("{endpoint}: {method} {path}: unreachable")]
    Unreachable {
        endpoint: &'static str,
        method: Method,
        path: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error(
        "{endpoint}: {method} {path}: TLS handshake failed (certificate not trusted?): {detail}"
    )]
    Tls {
        endpoint: &'static str,
        method: Method,
        path: String,
        detail: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("{endpoint}: {method} {path}: no complete answer within {after:?}")]
    Timeout {
        endpoint: &'static str,
        method: Method,
        path: String,
        after: Duration,
    },
    #[error("{endpoint}: {method} {path}: the answer is larger than its {cap}-byte cap{}",
        declared.map(|n| format!(" (it declares {n} bytes)")).unwrap_or_default())]
    TooLarge {
        endpoint: &'static str,
        method: Method,
        path: String,
        cap: usize,
        /// Its `Content-Length`, when it declared one.
        declared: Option<u64>,
    },
    #[error("{endpoint}: {method} {path}: reading the answer failed")]
    ReadBody {
        endpoint: &'static str,
        method: Method,
        path: String,
        #[source]
        source: Box<kube::Error>,
    },
}

impl TransportError {
    /// Whether trying again at once may succeed (outages, timeouts), as opposed to bad setup or
    /// an answer too large (the same answer again would be refused again; the next periodic
    /// read tries anew).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Unreachable { .. }
                | Self::Timeout { .. }
                | Self::ReadBody { .. }
                | Self::Tls { .. }
                // A token being rotated may be briefly absent.
                | Self::ReadToken { .. }
                | Self::BadToken { .. }
        )
    }
}

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

/// The rustls configuration for `tls`: the CA files read now, and a verifier that accepts a
/// certificate for the URL's host or one of the other names (or, explicitly, any certificate).
fn client_tls(endpoint: &'static str, tls: &Tls) -> Result<rustls::ClientConfig, TransportError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let setup = |detail: String| TransportError::TlsSetup { endpoint, detail };
    let verifier: Arc<dyn ServerCertVerifier> = match tls {
        Tls::Insecure => Arc::new(Unverified(provider.clone())),
        Tls::Verify {
            ca_files,
            also_named,
        } => {
            let mut roots = RootCertStore::empty();
            for path in ca_files {
                for der in read_ca(endpoint, path)? {
                    roots.add(der).map_err(|e| TransportError::BadCa {
                        endpoint,
                        path: path.clone(),
                        detail: Some(e.to_string()),
                    })?;
                }
            }
            let webpki =
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .map_err(|e| setup(e.to_string()))?;
            let also_named = also_named
                .iter()
                .map(|n| {
                    ServerName::try_from(n.clone()).map_err(|_| TransportError::BadServerName {
                        endpoint,
                        name: n.clone(),
                    })
                })
                .collect::<Result<_, _>>()?;
            Arc::new(NamedVerifier { webpki, also_named })
        }
    };
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| setup(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth())
}

/// The certificates of a PEM file (a CA bundle, or a kubelet's `kubelet.crt`: its certificate
/// followed by the CA that signed it).
fn read_ca(
    endpoint: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TransportError> {
    let pem = std::fs::read(path).map_err(|source| TransportError::ReadCa {
        endpoint,
        path: path.to_path_buf(),
        source,
    })?;
    let bad = |detail: Option<String>| TransportError::BadCa {
        endpoint,
        path: path.to_path_buf(),
        detail,
    };
    let ders = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(Some(e.to_string())))?;
    if ders.is_empty() {
        return Err(bad(None));
    }
    Ok(ders)
}

/// webpki's verification (chain, validity, usage), with the name checked against the URL's
/// host first, then each of `also_named`: the certificate must name one of them.
#[derive(Debug)]
struct NamedVerifier {
    webpki: Arc<WebPkiServerVerifier>,
    also_named: Vec<ServerName<'static>>,
}

/// A certificate that names none of the names the agent accepts for the endpoint.
#[derive(Debug)]
struct NameMismatch {
    tried: Vec<String>,
    presented: Option<Vec<String>>,
}

impl std::fmt::Display for NameMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the certificate is not valid for {}",
            self.tried.join(" nor ")
        )?;
        match &self.presented {
            Some(names) if names.is_empty() => f.write_str(" (it names nothing)"),
            Some(names) => write!(f, " (it names {})", names.join(", ")),
            None => Ok(()),
        }
    }
}

impl StdError for NameMismatch {}

/// A name as webpki presents it (`DnsName("worker-1")`), as a reader writes it (`worker-1`).
fn unquoted(presented: &str) -> String {
    match (presented.find('"'), presented.rfind('"')) {
        (Some(a), Some(b)) if b > a => presented[a + 1..b].to_string(),
        _ => presented.to_string(),
    }
}

fn is_name_mismatch(e: &rustls::Error) -> bool {
    matches!(
        e,
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. }
        )
    )
}

impl ServerCertVerifier for NamedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let first = self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        );
        let Err(e) = first else { return first };
        if !is_name_mismatch(&e) || self.also_named.is_empty() {
            return Err(e);
        }
        for name in &self.also_named {
            let next =
                self.webpki
                    .verify_server_cert(end_entity, intermediates, name, ocsp_response, now);
            match next {
                Err(e) if is_name_mismatch(&e) => continue,
                other => return other,
            }
        }
        let presented = match e {
            rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
                presented,
                ..
            }) => Some(presented.iter().map(|p| unquoted(p)).collect()),
            _ => None,
        };
        let tried = std::iter::once(server_name.to_str().into_owned())
            .chain(self.also_named.iter().map(|n| n.to_str().into_owned()))
            .collect();
        Err(rustls::Error::InvalidCertificate(CertificateError::Other(
            rustls::OtherError(Arc::new(NameMismatch { tried, presented })),
        )))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// Accepts any certificate (the handshake's signatures are still checked, so the session is
/// with whoever holds the key of the certificate shown): `insecureSkipTLSVerify`, explicit only.
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `Bearer <token>` from the file, read now so that a rotated token is picked up.
async fn read_token(
    endpoint: &'static str,
    path: &Path,
) -> Result<http::HeaderValue, TransportError> {
    let raw =
        tokio::fs::read_to_string(path)
            .await
            .map_err(|source| TransportError::ReadToken {
                endpoint,
                path: path.to_path_buf(),
                source,
            })?;
    let token = raw.trim();
    let bad = || TransportError::BadToken {
        endpoint,
        path: path.to_path_buf(),
    };
    if token.is_empty() {
        return Err(bad());
    }
    let mut value = http::HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| bad())?;
    value.set_sensitive(true);
    Ok(value)
}

/// The TLS error in `source`'s chain, if the failure was one: rustls' error travels inside
/// `io::Error`s (one in another, from tokio-rustls and hyper-rustls), whose `source` skips it.
fn tls_error(source: &kube::Error) -> Option<&rustls::Error> {
    let mut cur: Option<&(dyn StdError + 'static)> = Some(source);
    while let Some(e) = cur {
        let mut inner: Option<&(dyn StdError + 'static)> = Some(e);
        while let Some(i) = inner {
            if let Some(tls) = i.downcast_ref::<rustls::Error>() {
                return Some(tls);
            }
            inner = i
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .map(|r| r as &(dyn StdError + 'static));
        }
        cur = e.source();
    }
    None
}

/// A TLS error in words: rustls' own, or the names a certificate lacks ([`NameMismatch`]),
/// said without the debug notation rustls prints for them.
fn tls_words(e: &rustls::Error) -> String {
    match e {
        rustls::Error::InvalidCertificate(CertificateError::Other(other)) => {
            match other.0.downcast_ref::<NameMismatch>() {
                Some(mismatch) => format!("invalid peer certificate: {mismatch}"),
                None => e.to_string(),
            }
        }
        _ => e.to_string(),
    }
}

/// Tells a TLS failure from a plain outage by the error's source chain.
fn classify(endpoint: &'static str, req: &ApiRequest, source: kube::Error) -> TransportError {
    if let Some(detail) = tls_error(&source).map(tls_words) {
        return TransportError::Tls {
            endpoint,
            method: req.method.clone(),
            path: req.path.clone(),
            detail,
            source: Box::new(source),
        };
    }
    let detail = node_agent_policy::error_chain(&source);
    let lower = detail.to_ascii_lowercase();
    if lower.contains("certificate") || lower.contains("tls") || lower.contains("handshake") {
        TransportError::Tls {
            endpoint,
            method: req.method.clone(),
            path: req.path.clone(),
            detail,
            source: Box::new(source),
        }
    } else {
        TransportError::Unreachable {
            endpoint,
            method: req.method.clone(),
            path: req.path.clone(),
            source: Box::new(source),
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
