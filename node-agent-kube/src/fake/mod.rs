//! An in-process fake of the kubelet and the API server for tests (feature `fake`): real HTTPS
//! (a CA made for each test with rcgen), HTTP/1.1, and answers scripted per test. Every request
//! is recorded so tests assert exactly what was sent. Used by this crate's tests and by the
//! end-to-end tests of the daemon.

use std::{
    convert::Infallible,
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::{
    api::{Backoff, Counters},
    transport::{Endpoint, Transport},
};
use http_body_util::{BodyExt as _, Full};
use hyper::{body::Bytes, service::service_fn, Request, Response};
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// One request as the fake saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub method: String,
    /// Path with query, as sent.
    pub path: String,
    pub authorization: Option<String>,
    pub content_type: Option<String>,
    /// The body parsed as JSON (Null when empty).
    pub body: serde_json::Value,
}

/// What the fake answers.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: String,
    pub delay: Duration,
}

impl Reply {
    pub fn json(status: u16, body: impl Into<String>) -> Self {
        Self {
            status,
            body: body.into(),
            delay: Duration::ZERO,
        }
    }

    pub fn status(status: u16, reason: &str, message: &str) -> Self {
        Self::json(
            status,
            serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": message, "reason": reason, "code": status})
            .to_string(),
        )
    }

    pub fn slow(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

type Responder = Arc<dyn Fn(&Seen, usize) -> Reply + Send + Sync>;

/// A CA and what it signed, written to files.
pub struct Pki {
    pub dir: tempfile::TempDir,
    pub ca_file: PathBuf,
    server_cert: Vec<u8>,
    server_key: Vec<u8>,
}

impl Pki {
    pub fn new() -> Self {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "fake-cluster-ca");
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().unwrap();
        let params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        let cert = params.signed_by(&key, &issuer).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.crt");
        std::fs::write(&ca_file, ca_cert.pem()).unwrap();
        Self {
            dir,
            ca_file,
            server_cert: cert.der().to_vec(),
            server_key: key.serialize_der(),
        }
    }
}

impl Default for Pki {
    fn default() -> Self {
        Self::new()
    }
}

pub struct Fake {
    pub addr: SocketAddr,
    pub pki: Pki,
    pub token_file: PathBuf,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Fake {
    /// Starts a server answering with `respond(request, index of the request)`.
    pub async fn start(respond: impl Fn(&Seen, usize) -> Reply + Send + Sync + 'static) -> Self {
        let pki = Pki::new();
        let token_file = pki.dir.path().join("token");
        std::fs::write(&token_file, "token-one\n").unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![pki.server_cert.clone().into()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pki.server_key.clone())),
            )
            .unwrap();
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(tls));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let respond: Responder = Arc::new(respond);
        let task = tokio::spawn({
            let seen = seen.clone();
            async move {
                loop {
                    let Ok((tcp, _)) = listener.accept().await else {
                        return;
                    };
                    let (acceptor, seen, respond) =
                        (acceptor.clone(), seen.clone(), respond.clone());
                    tokio::spawn(async move {
                        // A client that rejects our certificate ends here; that is the test.
                        let Ok(stream) = acceptor.accept(tcp).await else {
                            return;
                        };
                        let service =
                            service_fn(move |req| handle(req, seen.clone(), respond.clone()));
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            }
        });
        Self {
            addr,
            pki,
            token_file,
            seen,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.addr.port())
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// (method, path) of every request, in order.
    pub fn calls(&self) -> Vec<(String, String)> {
        self.seen()
            .into_iter()
            .map(|s| (s.method, s.path))
            .collect()
    }

    pub fn endpoint(&self, name: &'static str) -> Endpoint {
        Endpoint {
            name,
            url: self.url(),
            ca_file: Some(self.pki.ca_file.clone()),
            insecure_skip_tls_verify: false,
            token_path: Some(self.token_file.clone()),
            timeout: Duration::from_secs(2),
        }
    }

    pub fn transport(&self, name: &'static str) -> Transport {
        Transport::new(self.endpoint(name)).unwrap()
    }
}

async fn handle(
    req: Request<hyper::body::Incoming>,
    seen: Arc<Mutex<Vec<Seen>>>,
    respond: Responder,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let (authorization, content_type) = (header("authorization"), header("content-type"));
    let method = req.method().to_string();
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.to_string())
        .unwrap_or_default();
    let bytes = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body = if bytes.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&bytes).into()))
    };
    let request = Seen {
        method,
        path,
        authorization,
        content_type,
        body,
    };
    let index = {
        let mut seen = seen.lock().unwrap();
        seen.push(request.clone());
        seen.len() - 1
    };
    let reply = respond(&request, index);
    tokio::time::sleep(reply.delay).await;
    Ok(Response::builder()
        .status(reply.status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(reply.body)))
        .unwrap())
}

/// Retries quick enough for tests.
pub fn fast_backoff(attempts: u32) -> Backoff {
    Backoff {
        attempts,
        initial: Duration::from_millis(10),
        max: Duration::from_millis(40),
    }
}

pub fn counters() -> Arc<Counters> {
    Arc::new(Counters::default())
}

pub fn fixture(name: &str) -> String {
    std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name),
    )
    .unwrap()
}

/// Every test runs under this bound.
pub const TEST_BOUND: Duration = Duration::from_secs(20);
