//! An in-process fake of the kubelet and the API server for tests (feature `fake`): real HTTPS
//! (a CA made for each test with rcgen), HTTP/1.1, and answers scripted per test. It is as
//! strict as the real API server about what it accepts ([`strict`]: bearer token, media
//! types, routes, methods, API versions, bodies), and can answer every error shape the agent
//! meets ([`Reply`]). Every request is recorded, with the reason if it was rejected, so tests
//! assert exactly what was sent. Used by this crate's tests and by the daemon's end-to-end
//! tests.

mod reply;
mod reviews;
mod strict;
mod taints;

use std::{
    convert::Infallible,
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::{
    api::{Backoff, Context, Counters},
    transport::{Endpoint, Tls, Transport},
};
use futures::StreamExt as _;
use http_body_util::{combinators::BoxBody, BodyExt as _, Full, StreamBody};
/// The shared body of [`Reply::shared`].
pub use hyper::body::Bytes;
use hyper::{body::Frame, service::service_fn, Request, Response};
use hyper_util::rt::TokioIo;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};
pub use reply::{Body, Reply};
pub use reviews::{Reviews, User};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
pub use strict::percent_decode;
pub use taints::NodeStore;
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
    pub accept: Option<String>,
    /// The body parsed as JSON (Null when empty).
    pub body: serde_json::Value,
    /// Why the fake refused it as the API server would (then the responder never saw it).
    pub rejected: Option<String>,
}

type Responder = Arc<dyn Fn(&Seen, usize) -> Reply + Send + Sync>;

/// A CA and the serving certificate the fake presents, the CA (what a client trusts) written
/// to a file.
pub struct Pki {
    pub dir: tempfile::TempDir,
    /// What a client trusts: the CA; for a kubelet's self-signed certificate, as the kubelet
    /// writes `kubelet.crt`: its certificate, then its CA.
    pub ca_file: PathBuf,
    /// What the server presents: its certificate, then the chain up to the CA.
    chain: Vec<Vec<u8>>,
    key: Vec<u8>,
    /// The CA, to sign further certificates with ([`Pki::signed_by`]).
    issuer: Issuer<'static, KeyPair>,
}

/// A CA named `common_name`: its certificate and what signs with it.
fn certificate_authority(common_name: &str) -> (rcgen::Certificate, Issuer<'static, KeyPair>) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    let cert = params.self_signed(&key).unwrap();
    (cert, Issuer::new(params, key))
}

/// A serving certificate for `names` (IP addresses become IP SANs, the others DNS SANs)
/// signed by `issuer`, and its key.
fn serving(
    common_name: &str,
    names: &[&str],
    issuer: &Issuer<'static, KeyPair>,
) -> (rcgen::Certificate, KeyPair) {
    let key = KeyPair::generate().unwrap();
    let mut params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert, key)
}

impl Pki {
    /// A cluster CA, and the serving certificate it signed for `localhost` and `127.0.0.1`
    /// (the API server's).
    pub fn new() -> Self {
        let (ca, issuer) = certificate_authority("fake-cluster-ca");
        let (cert, key) = serving("kube-apiserver", &["localhost", "127.0.0.1"], &issuer);
        Self::written(&ca.pem(), vec![cert.der().to_vec()], key, issuer)
    }

    /// A kubelet's serving certificate as the kubelet makes one itself (no
    /// `serverTLSBootstrap`, kubeadm's and kind's default): a CA of its own, `<host>-ca@<time>`,
    /// signs a certificate naming `hostname` alone, no IP address
    /// (`certutil.GenerateSelfSignedCertKey(hostname, nil, nil)`); the kubelet presents both,
    /// and its `kubelet.crt` (here `ca_file`) holds both.
    pub fn kubelet_self_signed(hostname: &str) -> Self {
        let at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let (ca, issuer) = certificate_authority(&format!("{hostname}-ca@{at}"));
        let (cert, key) = serving(&format!("{hostname}@{at}"), &[hostname], &issuer);
        let kubelet_crt = format!("{}{}", cert.pem(), ca.pem());
        Self::written(
            &kubelet_crt,
            vec![cert.der().to_vec(), ca.der().to_vec()],
            key,
            issuer,
        )
    }

    /// A kubelet's serving certificate signed by the cluster's CA, as `serverTLSBootstrap`
    /// gets one, for `names` (its addresses and hostname); `ca_file` is the cluster's CA.
    pub fn signed_by(cluster: &Pki, hostname: &str, names: &[&str]) -> Self {
        let (cert, key) = serving(&format!("system:node:{hostname}"), names, &cluster.issuer);
        let ca = std::fs::read_to_string(&cluster.ca_file).unwrap();
        // Its own issuer is never used: a kubelet signs nothing.
        let (_, issuer) = certificate_authority("unused");
        Self::written(&ca, vec![cert.der().to_vec()], key, issuer)
    }

    fn written(
        trusted: &str,
        chain: Vec<Vec<u8>>,
        key: KeyPair,
        issuer: Issuer<'static, KeyPair>,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.crt");
        std::fs::write(&ca_file, trusted).unwrap();
        Self {
            dir,
            ca_file,
            chain,
            key: key.serialize_der(),
            issuer,
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
    /// Bearer tokens the fake accepts (a rotated token is accepted with the old one).
    tokens: Arc<Mutex<Vec<String>>>,
    /// Resources RBAC does not grant the agent (`nodes/proxy`): answered 403 as the API server
    /// (or the kubelet) would. Everything else is granted.
    denied: Arc<Mutex<Vec<String>>>,
    /// The users TokenReview knows and what SubjectAccessReview grants them.
    reviews: Arc<Mutex<Reviews>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Fake {
    /// Starts a server answering with `respond(request, index of the request)`, presenting a
    /// certificate for `localhost` and `127.0.0.1` signed by a CA of its own.
    pub async fn start(respond: impl Fn(&Seen, usize) -> Reply + Send + Sync + 'static) -> Self {
        Self::start_with(Pki::new(), respond).await
    }

    /// The same, presenting `pki`'s certificate (a kubelet's self-signed one, say).
    pub async fn start_with(
        pki: Pki,
        respond: impl Fn(&Seen, usize) -> Reply + Send + Sync + 'static,
    ) -> Self {
        let token_file = pki.dir.path().join("token");
        std::fs::write(&token_file, "token-one\n").unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                pki.chain.iter().map(|der| der.clone().into()).collect(),
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pki.key.clone())),
            )
            .unwrap();
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(tls));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let tokens = Arc::new(Mutex::new(vec!["token-one".to_string()]));
        let denied = Arc::new(Mutex::new(Vec::new()));
        let reviews = Arc::new(Mutex::new(Reviews::default()));
        let respond: Responder = Arc::new(respond);
        let task = tokio::spawn({
            let (seen, tokens, denied, reviews) = (
                seen.clone(),
                tokens.clone(),
                denied.clone(),
                reviews.clone(),
            );
            async move {
                // The connections: dropped with this task, so a fake dropped (a kubelet gone)
                // answers nothing more, not even on a connection kept alive.
                let mut connections = tokio::task::JoinSet::new();
                loop {
                    let Ok((tcp, _)) = listener.accept().await else {
                        return;
                    };
                    while connections.try_join_next().is_some() {}
                    let (acceptor, seen, tokens, denied, reviews, respond) = (
                        acceptor.clone(),
                        seen.clone(),
                        tokens.clone(),
                        denied.clone(),
                        reviews.clone(),
                        respond.clone(),
                    );
                    connections.spawn(async move {
                        // A client that rejects our certificate ends here; that is the test.
                        let Ok(stream) = acceptor.accept(tcp).await else {
                            return;
                        };
                        let service = service_fn(move |req| {
                            let access = Access {
                                tokens: tokens.clone(),
                                denied: denied.clone(),
                                reviews: reviews.clone(),
                            };
                            handle(req, seen.clone(), access, respond.clone())
                        });
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
            tokens,
            denied,
            reviews,
            task,
        }
    }

    /// A user whose `token` TokenReview authenticates, in `groups`.
    pub fn add_user(&self, token: &str, name: &str, groups: &[&str]) {
        self.reviews.lock().unwrap().users.push(User {
            token: token.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        });
    }

    /// RBAC grants `subject` (a user or a group) `verb` on the non-resource URL `path`.
    pub fn grant_url(&self, subject: &str, verb: &str, path: &str) {
        self.reviews
            .lock()
            .unwrap()
            .grants
            .push((subject.into(), verb.into(), path.into()));
    }

    /// RBAC no longer grants the agent `resource` (`nodes/proxy`, say): its requests are
    /// answered 403 as the API server answers them.
    pub fn deny(&self, resource: &str) {
        self.denied.lock().unwrap().push(resource.to_string());
    }

    /// RBAC grants `resource` again.
    pub fn grant(&self, resource: &str) {
        self.denied.lock().unwrap().retain(|r| r != resource);
    }

    /// Rotates the service account token: writes the new one and accepts it (the old one
    /// stays valid, as a projected token does until it expires).
    pub fn rotate_token(&self, token: &str) {
        std::fs::write(&self.token_file, token).unwrap();
        self.tokens.lock().unwrap().push(token.to_string());
    }

    /// Requests the fake refused as the API server would, with why.
    pub fn rejected(&self) -> Vec<(String, String, String)> {
        self.seen()
            .into_iter()
            .filter_map(|s| s.rejected.map(|why| (s.method, s.path, why)))
            .collect()
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
            tls: Tls::ca(self.pki.ca_file.clone()),
            token_path: Some(self.token_file.clone()),
            timeout: Duration::from_secs(2),
        }
    }

    pub fn transport(&self, name: &'static str) -> Transport {
        Transport::new(self.endpoint(name)).unwrap()
    }

    /// A client context for node `node` with quick retries.
    pub fn context(&self, name: &'static str, attempts: u32, node: &str) -> Context {
        Context {
            transport: self.transport(name),
            backoff: fast_backoff(attempts),
            counters: counters(),
            node: node.to_string(),
        }
    }
}

type AnswerBody = BoxBody<Bytes, Infallible>;

/// Who may do what: the tokens accepted and the resources RBAC does not grant, and the users
/// and URL grants the reviews answer from.
struct Access {
    tokens: Arc<Mutex<Vec<String>>>,
    denied: Arc<Mutex<Vec<String>>>,
    reviews: Arc<Mutex<Reviews>>,
}

async fn handle(
    req: Request<hyper::body::Incoming>,
    seen: Arc<Mutex<Vec<Seen>>>,
    access: Access,
    respond: Responder,
) -> Result<Response<AnswerBody>, Infallible> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let (authorization, content_type, accept) = (
        header("authorization"),
        header("content-type"),
        header("accept"),
    );
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
    let mut request = Seen {
        method,
        path,
        authorization,
        content_type,
        accept,
        body,
        rejected: None,
    };
    let valid_tokens = access.tokens.lock().unwrap().clone();
    let denied = access.denied.lock().unwrap().clone();
    let checked = strict::check(&request, &bytes, &valid_tokens, &denied);
    if let Err(reply) = &checked {
        request.rejected = Some(match &reply.body {
            Body::Full(text) => format!("HTTP {}: {text}", reply.status),
            _ => format!("HTTP {}", reply.status),
        });
    }
    let index = {
        let mut seen = seen.lock().unwrap();
        seen.push(request.clone());
        seen.len() - 1
    };
    let reply = match checked {
        Ok(strict::Kind::TokenReview) => access.reviews.lock().unwrap().token_review(&request.body),
        Ok(strict::Kind::AccessReview) => {
            access.reviews.lock().unwrap().access_review(&request.body)
        }
        Ok(_) => respond(&request, index),
        Err(refusal) => refusal,
    };
    tokio::time::sleep(reply.delay).await;
    let body: AnswerBody = match reply.body {
        Body::Full(text) => Full::new(Bytes::from(text)).boxed(),
        Body::Stream { frames, keep_open } => {
            let frames = futures::stream::iter(frames).then(|(pause, chunk)| async move {
                tokio::time::sleep(pause).await;
                Ok::<_, Infallible>(Frame::data(Bytes::from(chunk)))
            });
            let open = if keep_open {
                futures::stream::pending().left_stream()
            } else {
                futures::stream::empty().right_stream()
            };
            http_body_util::BodyExt::boxed(StreamBody::new(frames.chain(open)))
        }
        Body::Shared {
            data,
            chunked: false,
        } => Full::new(data).boxed(),
        Body::Shared {
            data,
            chunked: true,
        } => {
            const FRAME: usize = 64 << 10;
            let frames = (0..data.len().div_ceil(FRAME)).map(move |i| {
                let end = ((i + 1) * FRAME).min(data.len());
                Ok::<_, Infallible>(Frame::data(data.slice(i * FRAME..end)))
            });
            http_body_util::BodyExt::boxed(StreamBody::new(futures::stream::iter(frames)))
        }
        Body::Endless { chunk, pause } => {
            let chunk = Bytes::from(chunk);
            let frames = futures::stream::repeat(()).then(move |()| {
                let chunk = chunk.clone();
                async move {
                    tokio::time::sleep(pause).await;
                    Ok::<_, Infallible>(Frame::data(chunk))
                }
            });
            http_body_util::BodyExt::boxed(StreamBody::new(frames))
        }
    };
    let mut response = Response::builder()
        .status(reply.status)
        .header("content-type", reply.content_type);
    for (name, value) in &reply.headers {
        response = response.header(*name, value);
    }
    Ok(response.body(body).unwrap())
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
