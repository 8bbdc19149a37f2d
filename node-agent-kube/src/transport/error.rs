//! What went wrong reaching an endpoint ([`TransportError`]), each error naming the endpoint,
//! and [`classify`], which tells a TLS failure from a plain outage.

use std::{error::Error as StdError, path::PathBuf, time::Duration};

use http::Method;
use rustls::CertificateError;

use super::{request::ApiRequest, verify::NameMismatch};

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
pub(super) fn classify(
    endpoint: &'static str,
    req: &ApiRequest,
    source: kube::Error,
) -> TransportError {
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
