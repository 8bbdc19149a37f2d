//! One HTTPS endpoint (the kubelet or the API server): TLS from a CA file or an explicit
//! insecure flag, a bearer token re-read from disk before every request, a timeout on every
//! request, and errors that say which endpoint failed and how.
//!
//! kube's `Client` carries the bytes (rustls with ring, hyper); requests are built here so that
//! the token, the status handling and the exact wire format stay in this crate's hands.

use std::{
    error::Error as StdError,
    path::{Path, PathBuf},
    time::Duration,
};

use http::{header, Method, Request, StatusCode};
use http_body_util::BodyExt as _;
use kube::client::Body;

/// How to reach one endpoint.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// Shown in errors and logs: "kubelet" or "api server".
    pub name: &'static str,
    /// `https://host:port`.
    pub url: String,
    pub ca_file: Option<PathBuf>,
    pub insecure_skip_tls_verify: bool,
    /// None sends no Authorization header.
    pub token_path: Option<PathBuf>,
    pub timeout: Duration,
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
    #[error("{endpoint}: CA file {} holds no PEM certificate", path.display())]
    BadCa {
        endpoint: &'static str,
        path: PathBuf,
    },
    #[error("{endpoint}: cannot build a request for {path:?}")]
    BuildRequest {
        endpoint: &'static str,
        path: String,
        #[source]
        source: http::Error,
    },
    #[error("{endpoint}: cannot build the HTTPS client")]
    Client {
        endpoint: &'static str,
        #[source]
        source: Box<kube::Error>,
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
    /// Whether trying again later may succeed (outages, timeouts), as opposed to bad setup.
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

impl HttpResponse {
    /// The body for error messages: UTF-8, cut to 512 bytes.
    pub fn excerpt(&self) -> String {
        let text = String::from_utf8_lossy(&self.body);
        let mut end = text.len().min(512);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text[..end].to_string()
    }
}

/// A request to send: method, path with query, optional body with its content type.
#[derive(Debug, Clone)]
pub struct ApiRequest {
    pub method: Method,
    pub path: String,
    pub body: Option<(&'static str, Vec<u8>)>,
}

impl ApiRequest {
    pub fn get(path: impl Into<String>) -> Self {
        Self {
            method: Method::GET,
            path: path.into(),
            body: None,
        }
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
        }
    }
}

#[derive(Clone)]
pub struct Transport {
    endpoint: Endpoint,
    client: kube::Client,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl Transport {
    /// Reads the CA file and builds the client. Must run inside a tokio runtime.
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
        let mut config = kube::Config::new(uri);
        config.accept_invalid_certs = endpoint.insecure_skip_tls_verify;
        if let Some(path) = &endpoint.ca_file {
            config.root_cert = Some(read_ca(name, path)?);
        }
        config.connect_timeout = Some(endpoint.timeout);
        config.read_timeout = None; // a watch stays open; `send` bounds every plain request
        config.write_timeout = Some(endpoint.timeout);
        // Retries belong to this crate's policy, so that every request made is one we chose.
        config.default_retry = false;
        let client = kube::Client::try_from(config).map_err(|source| TransportError::Client {
            endpoint: name,
            source: Box::new(source),
        })?;
        Ok(Self { endpoint, client })
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Sends one request and reads the whole answer within the endpoint's timeout. Any HTTP
    /// status is a successful transport; callers interpret it.
    pub async fn send(&self, req: &ApiRequest) -> Result<HttpResponse, TransportError> {
        let timeout = self.endpoint.timeout;
        let fut = async {
            let response = self.open(req).await?;
            let status = response.status();
            let headers = response.headers().clone();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|source| TransportError::ReadBody {
                    endpoint: self.endpoint.name,
                    method: req.method.clone(),
                    path: req.path.clone(),
                    source: Box::new(source),
                })?
                .to_bytes()
                .to_vec();
            Ok(HttpResponse {
                status,
                headers,
                body,
            })
        };
        tokio::time::timeout(timeout, fut)
            .await
            .unwrap_or_else(|_| Err(self.timeout_error(req)))
    }

    /// Sends a request and returns the answer with its body still streaming (for watches).
    /// Only the headers are bounded by the timeout.
    pub async fn open(&self, req: &ApiRequest) -> Result<http::Response<Body>, TransportError> {
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

fn read_ca(endpoint: &'static str, path: &Path) -> Result<Vec<Vec<u8>>, TransportError> {
    let pem = std::fs::read_to_string(path).map_err(|source| TransportError::ReadCa {
        endpoint,
        path: path.to_path_buf(),
        source,
    })?;
    let ders = pem_certificates(&pem);
    if ders.is_empty() {
        return Err(TransportError::BadCa {
            endpoint,
            path: path.to_path_buf(),
        });
    }
    Ok(ders)
}

/// The DER bytes of each `CERTIFICATE` block in a PEM file.
fn pem_certificates(pem: &str) -> Vec<Vec<u8>> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut out = Vec::new();
    let mut rest = pem;
    while let Some(start) = rest.find(BEGIN) {
        let after = &rest[start + BEGIN.len()..];
        let Some(stop) = after.find(END) else { break };
        let b64: String = after[..stop]
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        if let Some(der) = base64_decode(&b64) {
            out.push(der);
        }
        rest = &after[stop + END.len()..];
    }
    out
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let bytes = s.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut acc = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            acc |= value(c)? << (18 - 6 * i);
        }
        let n = match chunk.len() {
            4 => 3,
            3 => 2,
            2 => 1,
            _ => return None,
        };
        out.extend_from_slice(&acc.to_be_bytes()[1..1 + n]);
    }
    Some(out)
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

/// Tells a TLS failure from a plain outage by the error's source chain.
fn classify(endpoint: &'static str, req: &ApiRequest, source: kube::Error) -> TransportError {
    let mut chain = Vec::new();
    let mut cur: Option<&(dyn StdError + 'static)> = Some(&source);
    while let Some(e) = cur {
        chain.push(e.to_string());
        cur = e.source();
    }
    let detail = chain.join(": ");
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
    fn base64_decodes_padded_and_unpadded() {
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("aGVsbG8").unwrap(), b"hello");
        assert_eq!(base64_decode("aGk=").unwrap(), b"hi");
        assert!(base64_decode("a$b=").is_none());
    }

    #[test]
    fn pem_without_certificates_yields_nothing() {
        assert!(
            pem_certificates("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----")
                .is_empty()
        );
        let one = "x\n-----BEGIN CERTIFICATE-----\naGVs\nbG8=\n-----END CERTIFICATE-----\n";
        assert_eq!(pem_certificates(one), vec![b"hello".to_vec()]);
    }
}
