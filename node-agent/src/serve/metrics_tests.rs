//! The endpoints over a real socket: raw HTTP/1.1 bytes in, status, headers and body out.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
    sync::oneshot,
    task::JoinHandle,
    time::timeout,
};

use node_agent_kube::evict::EvictionResult;
use node_agent_policy::Signal;

use super::{bind, Format, Health, Metrics, TelemetryError};

/// Every network step of a test finishes within this or the test fails.
const STEP: Duration = Duration::from_secs(5);

struct Running {
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    stop: oneshot::Sender<()>,
    serving: JoinHandle<()>,
}

async fn start(stall_after: Duration) -> Running {
    let metrics = Metrics::new();
    let health = Health::new(stall_after);
    let server = bind(
        "127.0.0.1:0".parse().expect("address"),
        Arc::clone(&metrics),
        Arc::clone(&health),
    )
    .await
    .expect("bind on an ephemeral port");
    let addr = server.local_addr();
    assert_ne!(addr.port(), 0, "local_addr reports the real port");
    let (stop, stopped) = oneshot::channel();
    let serving = tokio::spawn(server.serve(async {
        let _ = stopped.await;
    }));
    Running {
        addr,
        metrics,
        health,
        stop,
        serving,
    }
}

#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

fn parse_reply(raw: &[u8]) -> Option<Reply> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let mut head = head.split("\r\n");
    let status = head
        .next()?
        .strip_prefix("HTTP/1.1 ")?
        .get(..3)?
        .parse()
        .ok()?;
    let headers = head
        .filter_map(|line| line.split_once(": "))
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .collect();
    Some(Reply {
        status,
        headers,
        body: body.to_owned(),
    })
}

/// Sends `request` on a fresh connection and reads until the server closes it.
async fn exchange_raw(addr: SocketAddr, request: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.write_all(request).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    Ok(raw)
}

async fn request(addr: SocketAddr, method: &str, path: &str) -> Reply {
    request_with(addr, method, path, "").await
}

/// A request with extra header lines (each ending in CRLF).
async fn request_with(addr: SocketAddr, method: &str, path: &str, headers: &str) -> Reply {
    let request =
        format!("{method} {path} HTTP/1.1\r\nHost: x\r\n{headers}Connection: close\r\n\r\n");
    let raw = timeout(STEP, exchange_raw(addr, request.as_bytes()))
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: no reply within {STEP:?}"))
        .unwrap_or_else(|error| panic!("{method} {path}: {error}"));
    parse_reply(&raw).unwrap_or_else(|| {
        panic!(
            "{method} {path}: not an HTTP reply: {:?}",
            String::from_utf8_lossy(&raw)
        )
    })
}

/// Reads one response with a `Content-Length` body from a connection that stays open.
async fn read_one_reply(stream: &mut TcpStream) -> Reply {
    let mut raw = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(reply) = parse_reply(&raw) {
            let length: usize = reply
                .header("content-length")
                .and_then(|value| value.parse().ok())
                .expect("content-length");
            if reply.body.len() >= length {
                return reply;
            }
        }
        let n = timeout(STEP, stream.read(&mut chunk))
            .await
            .expect("reply within the step bound")
            .expect("read");
        assert_ne!(n, 0, "connection closed mid-reply: {raw:?}");
        raw.extend_from_slice(&chunk[..n]);
    }
}

#[tokio::test]
async fn metrics_are_served_in_the_format_the_scraper_accepts() {
    let server = start(Duration::from_secs(60)).await;
    server
        .metrics
        .eviction(Signal::MemoryAvailable.into(), EvictionResult::Evicted);
    let sample =
        r#"node_agent_evictions_total{eviction_signal="memory.available",result="evicted"} 1"#;
    #[rustfmt::skip]
    let rows: &[(&str, &str, Format)] = &[
        ("no Accept header", "", Format::Text),
        ("promtool and old Prometheus", "Accept: text/plain; version=0.0.4\r\n", Format::Text),
        ("anything", "Accept: */*\r\n", Format::Text),
        ("OpenMetrics", "Accept: application/openmetrics-text; version=1.0.0\r\n", Format::OpenMetrics),
        ("Prometheus 2.x",
         "Accept: application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2\r\n",
         Format::OpenMetrics),
    ];
    for (name, accept, format) in rows {
        let reply = request_with(server.addr, "GET", "/metrics", accept).await;
        assert_eq!(reply.status, 200, "{name}: {reply:?}");
        assert_eq!(
            reply.header("content-type"),
            Some(format.content_type()),
            "{name}"
        );
        assert_eq!(reply.header("vary"), Some("Accept"), "{name}");
        assert!(
            reply.body.lines().any(|line| line == sample),
            "{name}: {}",
            reply.body
        );
        let typed = match format {
            Format::OpenMetrics => "# TYPE node_agent_evictions counter",
            Format::Text => "# TYPE node_agent_evictions_total counter",
        };
        assert!(
            reply.body.lines().any(|line| line == typed),
            "{name}: {}",
            reply.body
        );
        assert_eq!(
            reply.body.ends_with("# EOF\n"),
            *format == Format::OpenMetrics,
            "{name}"
        );
    }
}

#[tokio::test]
async fn requests_are_routed_by_path_and_method() {
    let server = start(Duration::from_secs(60)).await;
    server.health.beat();
    server.health.set_ready(true);
    #[rustfmt::skip]
    let rows = [
        ("GET", "/metrics", 200),
        ("GET", "/metrics?name[]=x", 200),
        ("HEAD", "/metrics", 200),
        ("GET", "/healthz", 200),
        ("GET", "/readyz", 200),
        ("GET", "/nope", 404),
        ("GET", "/", 404),
        ("GET", "/metrics/", 404),
        ("POST", "/nope", 404),
        ("POST", "/metrics", 405),
        ("PUT", "/healthz", 405),
        ("DELETE", "/readyz", 405),
    ];
    for (method, path, status) in rows {
        let reply = request(server.addr, method, path).await;
        assert_eq!(reply.status, status, "{method} {path}: {reply:?}");
        if status == 405 {
            assert_eq!(reply.header("allow"), Some("GET, HEAD"), "{method} {path}");
        }
        if method == "HEAD" {
            assert!(reply.body.is_empty(), "HEAD has no body: {reply:?}");
        }
    }
}

#[tokio::test]
async fn readyz_follows_set_ready() {
    let server = start(Duration::from_secs(60)).await;
    let not_ready = request(server.addr, "GET", "/readyz").await;
    assert_eq!(not_ready.status, 503, "{not_ready:?}");
    assert!(not_ready.body.starts_with("not ready"), "{not_ready:?}");

    server.health.set_ready(true);
    assert_eq!(request(server.addr, "GET", "/readyz").await.status, 200);

    server.health.set_ready(false);
    assert_eq!(request(server.addr, "GET", "/readyz").await.status, 503);
}

#[tokio::test]
async fn healthz_fails_once_the_loop_stops_beating() {
    let stall_after = Duration::from_millis(200);
    let server = start(stall_after).await;
    server.health.beat();
    let alive = request(server.addr, "GET", "/healthz").await;
    assert_eq!(alive.status, 200, "{alive:?}");
    assert_eq!(
        alive.header("content-type"),
        Some("text/plain; charset=utf-8")
    );

    // Past the bound with a wide margin, so a slow machine cannot make this flaky.
    tokio::time::sleep(stall_after * 3).await;
    let stalled = request(server.addr, "GET", "/healthz").await;
    assert_eq!(stalled.status, 503, "{stalled:?}");
    assert!(
        stalled.body.starts_with("stalled: main loop last beat ")
            && stalled.body.contains(" ago (limit 200.0ms)"),
        "{stalled:?}"
    );

    server.health.beat();
    assert_eq!(request(server.addr, "GET", "/healthz").await.status, 200);
}

#[tokio::test]
async fn bad_requests_get_a_4xx_or_a_closed_connection_and_the_server_keeps_serving() {
    let server = start(Duration::from_secs(60)).await;
    server.health.beat();
    let huge_header = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(64 * 1024)
    );
    #[rustfmt::skip]
    let rows: [(&str, Vec<u8>); 7] = [
        ("binary garbage", vec![0x00, 0xff, 0x13, 0x37, b'\r', b'\n', b'\r', b'\n']),
        ("a request line without version", b"GET\r\n\r\n".to_vec()),
        ("an unsupported protocol version", b"GET /metrics HTTP/9.9\r\nHost: x\r\n\r\n".to_vec()),
        ("a header without colon", b"GET /metrics HTTP/1.1\r\nHost x\r\n\r\n".to_vec()),
        ("a non-UTF-8 path", b"GET /\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
        ("headers over the size bound", huge_header.into_bytes()),
        ("a TLS client hello", vec![0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03]),
    ];
    for (name, bytes) in rows {
        let outcome = timeout(STEP, exchange_raw(server.addr, &bytes))
            .await
            .unwrap_or_else(|_| panic!("{name}: connection neither answered nor closed"));
        match outcome {
            // Closed, or reset because the server closed with request bytes still unread.
            Ok(raw) if raw.is_empty() => {}
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => {}
            Ok(raw) => {
                let reply = parse_reply(&raw)
                    .unwrap_or_else(|| panic!("{name}: not an HTTP reply: {raw:?}"));
                assert!(
                    (400..500).contains(&reply.status),
                    "{name}: expected a 4xx, got {reply:?}"
                );
            }
            Err(error) => panic!("{name}: {error}"),
        }
    }
    assert_eq!(request(server.addr, "GET", "/healthz").await.status, 200);
    assert!(!server.serving.is_finished(), "the server still runs");
}

#[tokio::test]
async fn binding_an_address_in_use_names_it() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("local addr");

    let result = bind(addr, Metrics::new(), Health::new(Duration::from_secs(1))).await;

    match result {
        Err(error @ TelemetryError::Bind { addr: reported, .. }) => {
            assert_eq!(reported, addr);
            assert!(error.to_string().contains(&addr.to_string()), "{error}");
            let source = std::error::Error::source(&error).expect("the io error is kept");
            assert!(
                source.to_string().to_lowercase().contains("in use"),
                "{source}"
            );
        }
        other => panic!("expected TelemetryError::Bind, got {other:?}"),
    }
}

#[tokio::test]
async fn shutdown_stops_serving_and_closes_idle_keep_alive_connections() {
    let server = start(Duration::from_secs(60)).await;
    server.health.beat();

    // A keep-alive client (like a Prometheus scraper) that has had its answer and stays connected.
    let mut idle = TcpStream::connect(server.addr).await.expect("connect");
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    assert_eq!(read_one_reply(&mut idle).await.status, 200);
    // The connection is reused for a second request.
    idle.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    assert_eq!(read_one_reply(&mut idle).await.status, 503);

    server.stop.send(()).expect("server still running");
    timeout(STEP, server.serving)
        .await
        .expect("serve returns after shutdown")
        .expect("serve did not panic");

    let mut rest = Vec::new();
    let read = timeout(STEP, idle.read_to_end(&mut rest))
        .await
        .expect("the idle connection is closed");
    assert!(
        matches!(read, Ok(0)) || read.is_err(),
        "no more data on the idle connection: {rest:?}"
    );
    let refused = TcpStream::connect(server.addr).await;
    assert!(refused.is_err(), "nothing listens after shutdown");
}
