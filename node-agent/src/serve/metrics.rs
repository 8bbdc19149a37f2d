//! The HTTP/1.1 listener for `/metrics`, `/healthz` and `/readyz`. `/metrics`, and `/readyz`'s
//! whole reason, go only to callers its [`Gate`] lets in (`metricsAccess`); the kubelet's
//! probes need no credentials.

use std::{
    convert::Infallible,
    future::Future,
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use http_body_util::Full;
use hyper::{
    body::{Bytes, Incoming},
    header::{
        HeaderValue, ACCEPT, ALLOW, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER, VARY,
        WWW_AUTHENTICATE,
    },
    server::conn::http1,
    service::service_fn,
    Method, Request, Response, StatusCode,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    net::TcpListener,
    sync::watch,
    task::{AbortHandle, JoinSet},
};

use super::{
    access::{Gate, MetricsAccess, Refusal},
    connections::{Activity, Client, Clock, Closed, Limits, Table, Tracked},
    limits::{ACCEPT_BACKOFF, LOG_EVERY, MAX_HEADER_BYTES},
};
use crate::telemetry::{redact, Format, Health, Liveness, Metrics};

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("cannot listen for metrics and health on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the local address of the metrics listener bound to {addr}")]
    LocalAddr {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// After shutdown, in-flight responses get this long to finish before their tasks are aborted
/// (the daemon has 2 s to exit on SIGTERM).
const DRAIN_TIMEOUT: Duration = Duration::from_millis(500);
/// How often idle connections are looked for.
const SWEEP_EVERY: Duration = Duration::from_millis(500);

const TEXT: &str = "text/plain; charset=utf-8";

/// Binds now, so a bad or busy address is reported at start-up before anything is loaded;
/// [`Server::serve`] then answers requests.
pub async fn bind(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
) -> Result<Server, TelemetryError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| TelemetryError::Bind { addr, source })?;
    let local_addr = listener
        .local_addr()
        .map_err(|source| TelemetryError::LocalAddr { addr, source })?;
    let (_, none) = watch::channel(None);
    let gate = Gate::new(MetricsAccess::Open, none, metrics.clone());
    Ok(Server {
        listener,
        local_addr,
        metrics,
        health,
        gate,
    })
}

#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    local_addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    gate: Gate,
}

impl Server {
    /// The same listener, `/metrics` (and `/readyz`'s whole reason) behind `gate`; without it,
    /// open to anyone who reaches it.
    pub fn guarded_by(mut self, gate: Gate) -> Self {
        self.gate = gate;
        self
    }

    /// The bound address (the real port when bound to port 0).
    #[cfg(test)]
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves `GET` (and `HEAD`) on `/metrics`, `/healthz` and `/readyz` until `shutdown`
    /// resolves; then stops accepting, lets in-flight responses finish (idle keep-alive
    /// connections close at once), and returns within [`DRAIN_TIMEOUT`]. Connections are held
    /// to [`Limits::DEFAULT`] (see `telemetry::connections`), so clients that connect and
    /// stay silent cannot keep the kubelet's `/healthz` probe out.
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send + 'static) {
        let Server {
            listener,
            local_addr,
            metrics,
            health,
            gate,
        } = self;
        let limits = Limits::DEFAULT;
        let mut http = http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .max_header_size(MAX_HEADER_BYTES);
        let (stop_tx, stop_rx) = watch::channel(());
        let clock = Clock::new();
        let mut table: Table<AbortHandle> = Table::new(limits);
        let mut closed = ClosedLog::default();
        let mut refused = AcceptLog::default();
        let mut next_seq = 0u64;
        let mut connections = JoinSet::new();
        let mut sweep = tokio::time::interval(SWEEP_EVERY);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut shutdown = std::pin::pin!(shutdown);
        tracing::debug!(%local_addr, ?limits, "serving metrics and health");

        loop {
            tokio::select! {
                () = &mut shutdown => break,
                Some(joined) = connections.join_next(), if !connections.is_empty() => {
                    match joined {
                        Ok(seq) => {
                            table.remove(seq);
                        }
                        // Closed by the limits below: already out of the table.
                        Err(error) if error.is_cancelled() => {}
                        // Its entry goes with the next idle sweep.
                        Err(error) => tracing::error!(%error, "a telemetry connection task failed"),
                    }
                }
                _ = sweep.tick() => {
                    for seq in table.idle(clock.now()) {
                        if let Some(handle) = table.remove(seq) {
                            handle.abort();
                            closed.count(Closed::Idle, &metrics);
                        }
                    }
                    closed.report(local_addr, table.len());
                    refused.settle(local_addr, Instant::now());
                }
                accepted = listener.accept() => {
                    let (stream, peer) = match accepted {
                        Ok(accepted) => {
                            refused.accepted(Instant::now());
                            accepted
                        }
                        Err(error) => {
                            refused.failed(local_addr, &error, &metrics);
                            tokio::time::sleep(ACCEPT_BACKOFF).await;
                            continue;
                        }
                    };
                    let client = Client::of(peer.ip());
                    if let Some((victim, why)) = table.make_room(client) {
                        if let Some(handle) = table.remove(victim) {
                            handle.abort();
                            closed.count(why, &metrics);
                        }
                    }
                    let seq = next_seq;
                    next_seq += 1;
                    let activity = Activity::new(clock.now());
                    let stream = Tracked::new(stream, Arc::clone(&activity), clock);
                    let metrics = Arc::clone(&metrics);
                    let health = Arc::clone(&health);
                    let gate = gate.clone();
                    let service = service_fn(move |request: Request<Incoming>| {
                        let (metrics, health, gate) = (metrics.clone(), health.clone(), gate.clone());
                        async move {
                            let header = |name| {
                                request
                                    .headers()
                                    .get(name)
                                    .and_then(|v: &HeaderValue| v.to_str().ok())
                            };
                            let response = answer(
                                request.method(),
                                request.uri().path(),
                                header(ACCEPT),
                                header(AUTHORIZATION),
                                peer.ip(),
                                &metrics,
                                &health,
                                &gate,
                            )
                            .await;
                            Ok::<_, Infallible>(response)
                        }
                    });
                    let connection = http.serve_connection(TokioIo::new(stream), service);
                    let mut stop = stop_rx.clone();
                    let handle = connections.spawn(async move {
                        let mut connection = std::pin::pin!(connection);
                        let result = tokio::select! {
                            result = connection.as_mut() => result,
                            // Changed, or the sender is gone: either way the server is stopping.
                            _ = stop.changed() => {
                                connection.as_mut().graceful_shutdown();
                                connection.await
                            }
                        };
                        // Malformed requests, resets and timeouts end here; hyper has already
                        // answered what deserved an answer (400, 431).
                        if let Err(error) = result {
                            tracing::debug!(%peer, %error, "telemetry connection ended with an error");
                        }
                        seq
                    });
                    table.insert(seq, client, activity, handle);
                }
            }
        }

        drop(listener);
        drop(stop_tx);
        let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
            while connections.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                remaining = connections.len(),
                "telemetry connections still open after shutdown; aborting them"
            );
            connections.abort_all();
        }
        closed.report(local_addr, 0);
        tracing::debug!(%local_addr, "stopped serving metrics and health");
    }
}

/// Accept failures (out of file descriptors, say): each counted, one warning when they start
/// and one line once connections have been accepted again for [`SETTLED`] without a failure,
/// not one per 100 ms retry, nor one per connection a descriptor freed for a moment lets
/// through in the middle of the shortage.
#[derive(Debug, Default)]
struct AcceptLog {
    /// Failures since the shortage began.
    failing: u64,
    /// When a connection was last accepted during the shortage.
    accepted_at: Option<Instant>,
}

/// How long accepting must work again, with no failure, before the shortage is said to be
/// over (a failure is only seen when a client connects, so a quiet second proves little).
const SETTLED: Duration = Duration::from_secs(5);

impl AcceptLog {
    fn failed(&mut self, local_addr: SocketAddr, error: &std::io::Error, metrics: &Metrics) {
        metrics.sources().accept_error();
        if self.failing == 0 {
            tracing::warn!(%local_addr, %error,
                "accepting telemetry connections fails; retrying every {ACCEPT_BACKOFF:?}, each failure counted in node_agent_telemetry_accept_errors_total");
        }
        self.failing += 1;
        self.accepted_at = None;
    }

    fn accepted(&mut self, now: Instant) {
        if self.failing > 0 {
            self.accepted_at = Some(now);
        }
    }

    /// At each sweep: the shortage said over once accepting has worked for [`SETTLED`].
    fn settle(&mut self, local_addr: SocketAddr, now: Instant) {
        if self
            .accepted_at
            .is_some_and(|at| now.saturating_duration_since(at) >= SETTLED)
        {
            tracing::info!(%local_addr, failures = self.failing, "accepting telemetry connections again");
            *self = Self::default();
        }
    }
}

#[cfg(test)]
mod accept_log_tests {
    use super::*;

    #[test]
    fn a_shortage_is_said_once_each_way_however_often_a_connection_slips_through() {
        let metrics = Metrics::new();
        let addr: SocketAddr = "127.0.0.1:9464".parse().unwrap();
        let err = std::io::Error::from_raw_os_error(libc::EMFILE);
        let mut log = AcceptLog::default();
        let t0 = Instant::now();
        for i in 0..10u64 {
            log.failed(addr, &err, &metrics);
            // A descriptor freed for a moment: one connection through, then failing again.
            log.accepted(t0 + Duration::from_millis(100 * i));
            log.settle(addr, t0 + Duration::from_millis(100 * i + 50));
            assert_eq!(log.failing, i + 1, "still the same shortage");
        }
        log.accepted(t0 + Duration::from_secs(2));
        log.settle(addr, t0 + Duration::from_millis(6500));
        assert_eq!(log.failing, 10, "not settled before SETTLED");
        log.settle(addr, t0 + Duration::from_secs(7));
        assert_eq!(log.failing, 0, "over once accepting worked for SETTLED");
        assert_eq!(log.accepted_at, None);
    }
}

/// Connections closed by the limits since the last log line.
#[derive(Debug, Default)]
struct ClosedLog {
    client_limit: u64,
    capacity: u64,
    idle: u64,
    last_report: Option<Instant>,
}

impl ClosedLog {
    fn count(&mut self, why: Closed, metrics: &Metrics) {
        metrics.telemetry_connection_closed(why.as_str());
        match why {
            Closed::ClientLimit => self.client_limit += 1,
            Closed::Capacity => self.capacity += 1,
            Closed::Idle => self.idle += 1,
        }
    }

    /// One warning for the closures by the per-client and capacity limits (a sign of a
    /// misbehaving or hostile client), at most every [`LOG_EVERY`] (each one is counted in the metric); idle closures
    /// alone are normal keep-alive expiry and only logged at debug level.
    fn report(&mut self, local_addr: std::net::SocketAddr, open: usize) {
        let now = Instant::now();
        if self
            .last_report
            .is_some_and(|last| now.duration_since(last) < LOG_EVERY)
        {
            return;
        }
        let ClosedLog {
            client_limit,
            capacity,
            idle,
            ..
        } = *self;
        if client_limit + capacity > 0 {
            tracing::warn!(%local_addr, client_limit, capacity, idle, open,
                "closed telemetry connections to let others in (too many from one client, or the listener full)");
        } else if idle > 0 {
            tracing::debug!(%local_addr, idle, open, "closed idle telemetry connections");
        } else {
            return;
        }
        *self = ClosedLog {
            last_report: Some(now),
            ..ClosedLog::default()
        };
    }
}

/// The response to one request: the gate asked first where it stands.
#[expect(
    clippy::too_many_arguments,
    reason = "one request's parts and what answers it, as the service closure has them"
)]
async fn answer(
    method: &Method,
    path: &str,
    accept: Option<&str>,
    authorization: Option<&str>,
    peer: std::net::IpAddr,
    metrics: &Metrics,
    health: &Health,
    gate: &Gate,
) -> Response<Full<Bytes>> {
    let asks = method == Method::GET || method == Method::HEAD;
    if asks && path == "/metrics" {
        if let Err(refusal) = gate.check(authorization, peer, path).await {
            return refused(&refusal);
        }
    }
    let details = asks && path == "/readyz" && gate.sees_details(authorization, peer).await;
    respond(
        method,
        path,
        accept,
        metrics,
        health,
        Instant::now(),
        details,
    )
}

/// The answer to a caller the gate did not let in.
fn refused(refusal: &Refusal) -> Response<Full<Bytes>> {
    let (status, why) = match refusal {
        Refusal::Unauthenticated(why) => (StatusCode::UNAUTHORIZED, why.clone()),
        Refusal::Forbidden(why) => (StatusCode::FORBIDDEN, why.clone()),
        Refusal::Unavailable(why) => (StatusCode::SERVICE_UNAVAILABLE, why.clone()),
        Refusal::Busy => (
            StatusCode::TOO_MANY_REQUESTS,
            "too many callers being reviewed at once: try again".to_string(),
        ),
    };
    let mut response = response(status, TEXT, format!("{why}\n"));
    let headers = response.headers_mut();
    match refusal {
        Refusal::Unauthenticated(_) => {
            headers.insert(
                WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"node-agent\""),
            );
        }
        Refusal::Busy => {
            headers.insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        _ => {}
    }
    response
}

/// The response to one request; pure apart from reading the recorded values. `details`:
/// `/readyz` may give its whole reason (else URLs, addresses and paths are left out).
fn respond(
    method: &Method,
    path: &str,
    accept: Option<&str>,
    metrics: &Metrics,
    health: &Health,
    now: Instant,
    details: bool,
) -> Response<Full<Bytes>> {
    if !matches!(path, "/metrics" | "/healthz" | "/readyz") {
        return response(StatusCode::NOT_FOUND, TEXT, "not found\n".into());
    }
    if method != Method::GET && method != Method::HEAD {
        let mut response = response(
            StatusCode::METHOD_NOT_ALLOWED,
            TEXT,
            "method not allowed\n".into(),
        );
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    match path {
        "/metrics" => {
            let format = Format::negotiate(accept);
            let mut response = match metrics.encode_as(format) {
                Ok(body) => response(StatusCode::OK, format.content_type(), body),
                Err(error) => {
                    tracing::error!(%error, "converting the metrics to the text format failed");
                    response(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        TEXT,
                        format!("encoding the metrics failed: {error}\n"),
                    )
                }
            };
            response
                .headers_mut()
                .insert(VARY, HeaderValue::from_static("Accept"));
            response
        }
        "/healthz" => match health.liveness(now) {
            Liveness::Alive { since_beat } => response(
                StatusCode::OK,
                TEXT,
                format!("ok: main loop beat {since_beat:.1?} ago\n"),
            ),
            Liveness::Stalled { since_beat, limit } => response(
                StatusCode::SERVICE_UNAVAILABLE,
                TEXT,
                format!("stalled: main loop last beat {since_beat:.1?} ago (limit {limit:.1?})\n"),
            ),
        },
        _ => match health.readiness() {
            Ok(()) => response(StatusCode::OK, TEXT, "ready\n".into()),
            Err(why) if details => response(StatusCode::SERVICE_UNAVAILABLE, TEXT, why),
            Err(why) => response(StatusCode::SERVICE_UNAVAILABLE, TEXT, redact(&why)),
        },
    }
}

fn response(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
