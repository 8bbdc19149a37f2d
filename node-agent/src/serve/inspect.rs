//! The inspection endpoint's listener: HTTP/1.1 on a loopback address, one `GET` per
//! connection, read-only.
//!
//! What its clients may take is bounded ([`Limits`]):
//! - **how many**: [`Limits::max_connections`] connections at once, of which at most
//!   [`Limits::max_streams`] follow the live stream; one more is answered `503` at once and
//!   closed (a fixed answer written by a task of its own, bounded in time);
//! - **how long a request may take**: its headers within [`Limits::header_timeout`] (at most
//!   8 KiB of them), and a status or explanation answered and taken within
//!   [`Limits::request_deadline`], or the connection is closed;
//! - **memory per reader**: a trace reader's records wait in a queue of
//!   [`Limits::stream_queue`] lines; behind that, the daemon's one broadcast ring (shared by
//!   every reader, never grown for a slow one). A reader that falls behind the ring loses the
//!   oldest records and is told how many (`stream_lost`); one whose queue stays full for
//!   [`Limits::write_timeout`] is let go. The socket's send buffer is held at [`SEND_BUFFER`]
//!   (the kernel would grow it to megabytes), so a reader that takes nothing fills it within
//!   seconds and meets that rule, rather than holding a stream slot for minutes;
//! - **the decisions**: the loop publishes into the broadcast and writes [`crate::inspect::Inspect`]
//!   without waiting; nothing here is awaited by it.
//!
//! A quiet stream carries an empty line every [`Limits::keepalive`], so a reader that went
//! away is noticed and its slot freed even when no record comes.

use std::{
    convert::Infallible,
    future::Future,
    net::SocketAddr,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use hyper::{
    body::{Body, Bytes, Frame, Incoming},
    header::{HeaderValue, ALLOW, CONTENT_TYPE},
    server::conn::http1,
    service::service_fn,
    Method, Request as HttpRequest, Response, StatusCode,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::AsyncWriteExt as _,
    net::{TcpListener, TcpStream},
    sync::{broadcast, mpsc, Notify, OwnedSemaphorePermit, Semaphore},
    task::JoinSet,
};

use super::limits::{Throttle, ACCEPT_BACKOFF, MAX_HEADER_BYTES};
use crate::inspect::{Inspect, Request};
use crate::{telemetry::Metrics, trace::Record};

/// A new reader of the daemon's live stream (one JSON record per item).
pub type Subscribe = Arc<dyn Fn() -> broadcast::Receiver<Arc<str>> + Send + Sync>;

/// How long the fixed `503` to a client past the limits may take to write.
const REFUSE_TIMEOUT: Duration = Duration::from_secs(1);
/// A connection's send buffer: a few seconds of a busy stream, never megabytes.
pub const SEND_BUFFER: libc::c_int = 32 * 1024;

/// Holds the socket's send buffer at [`SEND_BUFFER`] (no autotuning); a failure leaves the
/// kernel's default and is not worth refusing the client for.
fn hold_send_buffer(stream: &TcpStream) {
    use std::os::fd::AsRawFd as _;
    let size = SEND_BUFFER;
    // SAFETY: a valid socket descriptor, and a c_int option value of its own size.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            std::ptr::addr_of!(size).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

const JSON: &str = "application/json";
const JSON_LINES: &str = "application/jsonl";
const TEXT: &str = "text/plain; charset=utf-8";

/// Bounds on the endpoint's clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_connections: usize,
    pub max_streams: usize,
    pub header_timeout: Duration,
    pub request_deadline: Duration,
    pub stream_queue: usize,
    pub write_timeout: Duration,
    pub keepalive: Duration,
}

impl Limits {
    /// An operator runs one `kubectl node-agent` at a time, a team a few: 16 connections,
    /// 8 of them trace streams. A request crosses the API server, the kubelet and the
    /// runtime's port forward, so headers get 5 s.
    pub const DEFAULT: Limits = Limits {
        max_connections: 16,
        max_streams: 8,
        header_timeout: Duration::from_secs(5),
        request_deadline: Duration::from_secs(30),
        stream_queue: 64,
        write_timeout: Duration::from_secs(10),
        keepalive: Duration::from_secs(15),
    };
}

#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("inspectListen: {addr} is not a loopback address; the endpoint has no authentication of its own and is reached through pods/portforward (127.0.0.1:9465)")]
    NotLoopback { addr: SocketAddr },
    #[error("cannot listen for kubectl node-agent on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Binds now, so a busy or refused address is said at start-up.
pub async fn bind(
    addr: SocketAddr,
    inspect: Inspect,
    subscribe: Subscribe,
    metrics: Arc<Metrics>,
) -> Result<Server, InspectError> {
    if !addr.ip().is_loopback() {
        return Err(InspectError::NotLoopback { addr });
    }
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| InspectError::Bind { addr, source })?;
    let local_addr = listener
        .local_addr()
        .map_err(|source| InspectError::Bind { addr, source })?;
    Ok(Server {
        listener,
        local_addr,
        ctx: Arc::new(Ctx {
            inspect,
            subscribe,
            metrics,
            limits: Limits::DEFAULT,
            streams: Arc::new(Semaphore::new(Limits::DEFAULT.max_streams)),
        }),
    })
}

pub struct Server {
    listener: TcpListener,
    local_addr: SocketAddr,
    ctx: Arc<Ctx>,
}

struct Ctx {
    inspect: Inspect,
    subscribe: Subscribe,
    metrics: Arc<Metrics>,
    limits: Limits,
    streams: Arc<Semaphore>,
}

/// One connection's state the service and the connection's task share.
#[derive(Default)]
struct Conn {
    /// It follows the live stream: no request deadline.
    streaming: AtomicBool,
    /// Its trace reader stopped taking records: close it now.
    kill: Notify,
}

impl Server {
    /// The bound address (the real port when bound to port 0).
    #[cfg(test)]
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Other bounds (tests make them small).
    #[cfg(test)]
    pub fn with_limits(mut self, limits: Limits) -> Self {
        let ctx = Arc::get_mut(&mut self.ctx).expect("not serving yet");
        ctx.limits = limits;
        ctx.streams = Arc::new(Semaphore::new(limits.max_streams));
        self
    }

    /// Serves until `shutdown` resolves, then closes every connection.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) {
        let Server {
            listener,
            local_addr,
            ctx,
        } = self;
        let slots = Arc::new(Semaphore::new(ctx.limits.max_connections));
        let mut connections = JoinSet::new();
        let mut busy = Throttle::default();
        let mut failing = Throttle::default();
        let mut shutdown = std::pin::pin!(shutdown);
        tracing::debug!(%local_addr, limits = ?ctx.limits, "serving kubectl node-agent");
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => match Arc::clone(&slots).try_acquire_owned() {
                        Ok(slot) => {
                            hold_send_buffer(&stream);
                            connections.spawn(connection(stream, slot, Arc::clone(&ctx)));
                        }
                        Err(_) => {
                            ctx.metrics.inspect().closed("busy");
                            if let Some(n) = busy.due(Instant::now()) {
                                tracing::warn!(refused = n, limit = ctx.limits.max_connections,
                                    "kubectl node-agent endpoint: every connection slot taken; refusing new clients (counted in node_agent_inspect_clients_closed_total)");
                            }
                            connections.spawn(refuse(stream, "busy: every connection slot of this agent's inspection endpoint is taken; try again shortly\n"));
                        }
                    },
                    Err(error) => {
                        if let Some(n) = failing.due(Instant::now()) {
                            tracing::warn!(%error, failed = n, "kubectl node-agent endpoint: accepting a client failed; backing off");
                        }
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                    }
                },
            }
        }
        connections.abort_all();
        tracing::debug!(%local_addr, "stopped serving kubectl node-agent");
    }
}

/// A client past the limits: a fixed `503`, written without reading its request, then closed.
async fn refuse(mut stream: TcpStream, why: &'static str) {
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: {TEXT}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{why}",
        why.len()
    );
    let _ = tokio::time::timeout(REFUSE_TIMEOUT, async {
        let _ = stream.write_all(answer.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

/// Serves one request on one connection, within the limits.
async fn connection(stream: TcpStream, _slot: OwnedSemaphorePermit, ctx: Arc<Ctx>) {
    let conn = Arc::new(Conn::default());
    let service = {
        let (ctx, conn) = (Arc::clone(&ctx), Arc::clone(&conn));
        service_fn(move |request: HttpRequest<Incoming>| {
            std::future::ready(Ok::<_, Infallible>(respond(&ctx, &conn, &request)))
        })
    };
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(ctx.limits.header_timeout)
        .max_header_size(MAX_HEADER_BYTES)
        .keep_alive(false);
    let serving = http.serve_connection(TokioIo::new(stream), service);
    let deadline = async {
        tokio::time::sleep(ctx.limits.request_deadline).await;
        if conn.streaming.load(Ordering::Relaxed) {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        result = serving => {
            if let Err(error) = result {
                tracing::debug!(%error, "kubectl node-agent connection ended with an error");
            }
        }
        () = conn.kill.notified() => {
            ctx.metrics.inspect().closed("slow_reader");
        }
        () = deadline => {
            ctx.metrics.inspect().closed("timeout");
            tracing::debug!(deadline = ?ctx.limits.request_deadline, "kubectl node-agent request not done in time: closed");
        }
    }
}

fn respond(ctx: &Ctx, conn: &Arc<Conn>, request: &HttpRequest<Incoming>) -> Response<Answer> {
    if request.method() != Method::GET {
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET is served\n".into(),
        );
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET"));
        return r;
    }
    let target = request.uri().path_and_query().map_or("/", |p| p.as_str());
    let parsed = match Request::parse(target) {
        Ok(parsed) => parsed,
        Err(error) => {
            let status = match error {
                crate::inspect::QueryError::NotFound(_) => StatusCode::NOT_FOUND,
                _ => StatusCode::BAD_REQUEST,
            };
            return text(status, format!("{error}\n"));
        }
    };
    match &parsed {
        Request::Status => json(&ctx.inspect.status()),
        Request::Explain(q) => json(&ctx.inspect.explain(q)),
        Request::Trace { .. } => {
            let Ok(permit) = Arc::clone(&ctx.streams).try_acquire_owned() else {
                ctx.metrics.inspect().closed("busy");
                return text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "busy: {} trace streams already follow this agent; try again when one ends\n",
                        ctx.limits.max_streams
                    ),
                );
            };
            let filter = parsed.trace_filter();
            conn.streaming.store(true, Ordering::Relaxed);
            let (tx, rx) = mpsc::channel(ctx.limits.stream_queue);
            tokio::spawn(forward(
                (ctx.subscribe)(),
                filter,
                tx,
                Arc::clone(conn),
                ctx.limits,
                Arc::clone(&ctx.metrics),
                permit,
            ));
            let mut r = Response::new(Answer::Stream(rx));
            r.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(JSON_LINES));
            r
        }
    }
}

/// Carries the live stream to one reader: filtered as `node-agent trace` filters, its gaps
/// told, the reader let go when it stops taking lines. Holds the stream slot until it ends.
async fn forward(
    mut rx: broadcast::Receiver<Arc<str>>,
    filter: Option<crate::trace::Filter>,
    tx: mpsc::Sender<Bytes>,
    conn: Arc<Conn>,
    limits: Limits,
    metrics: Arc<Metrics>,
    _slot: OwnedSemaphorePermit,
) {
    let mut keepalive = tokio::time::interval(limits.keepalive);
    keepalive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    keepalive.tick().await;
    loop {
        let line: Bytes = tokio::select! {
            received = rx.recv() => match received {
                Ok(line) => {
                    let keep = filter.as_ref().is_none_or(|f| {
                        serde_json::from_str::<Record>(&line).is_ok_and(|r| f.matches(&r))
                    });
                    if !keep {
                        continue;
                    }
                    Bytes::from(format!("{line}\n"))
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    metrics.inspect().skipped(n);
                    Bytes::from(format!("{}\n", Record::stream_lost(n).json()))
                }
                // The daemon is stopping.
                Err(broadcast::error::RecvError::Closed) => return,
            },
            _ = keepalive.tick() => Bytes::from_static(b"\n"),
            // The connection ended (the reader left): nothing more to carry.
            () = tx.closed() => return,
        };
        match tokio::time::timeout(limits.write_timeout, tx.send(line)).await {
            Ok(Ok(())) => keepalive.reset(),
            Ok(Err(_)) => return,
            Err(_) => {
                tracing::warn!(timeout = ?limits.write_timeout,
                    "kubectl node-agent endpoint: a trace reader took nothing for the write timeout; letting it go");
                conn.kill.notify_one();
                return;
            }
        }
    }
}

/// A response body: a whole answer, or the lines of a live stream as they come.
pub enum Answer {
    Full(Option<Bytes>),
    Stream(mpsc::Receiver<Bytes>),
}

impl Body for Answer {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Answer::Full(body) => Poll::Ready(body.take().map(|b| Ok(Frame::data(b)))),
            Answer::Stream(rx) => rx
                .poll_recv(cx)
                .map(|line| line.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Answer::Full(None))
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self {
            Answer::Full(Some(b)) => hyper::body::SizeHint::with_exact(b.len() as u64),
            Answer::Full(None) => hyper::body::SizeHint::with_exact(0),
            Answer::Stream(_) => hyper::body::SizeHint::default(),
        }
    }
}

fn text(status: StatusCode, body: String) -> Response<Answer> {
    let mut r = Response::new(Answer::Full(Some(Bytes::from(body))));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(TEXT));
    r
}

fn json<T: serde::Serialize>(value: &T) -> Response<Answer> {
    match serde_json::to_vec(value) {
        Ok(body) => {
            let mut r = Response::new(Answer::Full(Some(Bytes::from(body))));
            r.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(JSON));
            r
        }
        Err(error) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding the answer failed: {error}\n"),
        ),
    }
}

#[cfg(test)]
#[path = "inspect_tests.rs"]
mod tests;
