//! The HTTP/1.1 listener for `/metrics`, `/healthz` and `/readyz`.

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
    header::{HeaderValue, ALLOW, CONTENT_TYPE},
    server::conn::http1,
    service::service_fn,
    Method, Request, Response, StatusCode,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{net::TcpListener, sync::watch, task::JoinSet};

use super::{
    health::{Health, Liveness},
    Metrics, TelemetryError, METRICS_CONTENT_TYPE,
};

/// A client gets this long to send a request's headers (slow or silent clients are closed).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Request line plus headers; a probe or scraper sends a few hundred bytes.
const MAX_HEADER_BYTES: usize = 8 * 1024;
/// Connections beyond this are closed on accept: the endpoints serve a scraper and probes.
const MAX_CONNECTIONS: usize = 64;
/// After shutdown, in-flight responses get this long to finish before their tasks are aborted
/// (the daemon has 2 s to exit on SIGTERM).
const DRAIN_TIMEOUT: Duration = Duration::from_millis(500);
/// Pause after a failed accept (e.g. out of file descriptors) so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

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
    Ok(Server {
        listener,
        local_addr,
        metrics,
        health,
    })
}

#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    local_addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

impl Server {
    /// The bound address (the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves `GET` (and `HEAD`) on `/metrics`, `/healthz` and `/readyz` until `shutdown`
    /// resolves; then stops accepting, lets in-flight responses finish (idle keep-alive
    /// connections close at once), and returns within [`DRAIN_TIMEOUT`].
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send + 'static) {
        let Server {
            listener,
            local_addr,
            metrics,
            health,
        } = self;
        let mut http = http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .max_header_size(MAX_HEADER_BYTES);
        let (stop_tx, stop_rx) = watch::channel(());
        let mut connections = JoinSet::new();
        let mut shutdown = std::pin::pin!(shutdown);
        tracing::debug!(%local_addr, "serving metrics and health");

        loop {
            tokio::select! {
                () = &mut shutdown => break,
                Some(joined) = connections.join_next(), if !connections.is_empty() => {
                    if let Err(error) = joined {
                        tracing::error!(%error, "a telemetry connection task failed");
                    }
                }
                accepted = listener.accept() => {
                    let (stream, peer) = match accepted {
                        Ok(accepted) => accepted,
                        Err(error) => {
                            tracing::warn!(%local_addr, %error, "accepting a telemetry connection failed");
                            tokio::time::sleep(ACCEPT_BACKOFF).await;
                            continue;
                        }
                    };
                    if connections.len() >= MAX_CONNECTIONS {
                        tracing::warn!(%peer, limit = MAX_CONNECTIONS, "closing a telemetry connection: too many open");
                        continue;
                    }
                    let metrics = Arc::clone(&metrics);
                    let health = Arc::clone(&health);
                    let service = service_fn(move |request: Request<Incoming>| {
                        let response = respond(
                            request.method(),
                            request.uri().path(),
                            &metrics,
                            &health,
                            Instant::now(),
                        );
                        std::future::ready(Ok::<_, Infallible>(response))
                    });
                    let connection = http.serve_connection(TokioIo::new(stream), service);
                    let mut stop = stop_rx.clone();
                    connections.spawn(async move {
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
                    });
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
        tracing::debug!(%local_addr, "stopped serving metrics and health");
    }
}

/// The response to one request; pure apart from reading the recorded values.
fn respond(
    method: &Method,
    path: &str,
    metrics: &Metrics,
    health: &Health,
    now: Instant,
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
        "/metrics" => response(StatusCode::OK, METRICS_CONTENT_TYPE, metrics.encode()),
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
            Err(why) => response(StatusCode::SERVICE_UNAVAILABLE, TEXT, why),
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
