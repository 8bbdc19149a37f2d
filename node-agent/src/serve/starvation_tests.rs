//! The listener under a connection-holding attack: clients that connect and never send a
//! request must not keep `/healthz` from the kubelet (issue 12, item 2).
//!
//! Clients come from distinct loopback addresses (all of 127.0.0.0/8 reaches this host), so
//! "one client" and "many clients" are what the server sees.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpSocket, TcpStream},
    sync::oneshot,
    task::JoinHandle,
    time::timeout,
};

use super::bind;
use crate::telemetry::{Health, Metrics};

/// The kubelet's default probe timeout (`timeoutSeconds: 1`).
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Every other network step of a test finishes within this or the test fails.
const STEP: Duration = Duration::from_secs(5);

struct Running {
    addr: SocketAddr,
    metrics: std::sync::Arc<Metrics>,
    _stop: oneshot::Sender<()>,
    serving: JoinHandle<()>,
}

async fn start() -> Running {
    let health = Health::new(Duration::from_secs(60));
    health.beat();
    let metrics = Metrics::new();
    let server = bind(
        "127.0.0.1:0".parse().expect("address"),
        std::sync::Arc::clone(&metrics),
        health,
    )
    .await
    .expect("bind on an ephemeral port");
    let addr = server.local_addr();
    let (stop, stopped) = oneshot::channel();
    let serving = tokio::spawn(server.serve(async {
        let _ = stopped.await;
    }));
    Running {
        addr,
        metrics,
        _stop: stop,
        serving,
    }
}

fn loopback(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

async fn connect_from(from: IpAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    socket.connect(to).await
}

/// One kubelet-style probe: a fresh connection, `GET /healthz`, the status within
/// [`PROBE_TIMEOUT`]; any failure (refused, closed, timed out, not 200) is an `Err`.
async fn probe(from: IpAddr, to: SocketAddr) -> Result<(), String> {
    let attempt = async {
        let mut stream = connect_from(from, to)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut raw = Vec::new();
        stream
            .read_to_end(&mut raw)
            .await
            .map_err(|e| format!("read: {e}"))?;
        if raw.starts_with(b"HTTP/1.1 200 ") {
            Ok(())
        } else {
            Err(format!("reply {:?}", String::from_utf8_lossy(&raw)))
        }
    };
    timeout(PROBE_TIMEOUT, attempt)
        .await
        .unwrap_or_else(|_| Err(format!("no reply within {PROBE_TIMEOUT:?}")))
}

/// Whether the server has closed `stream` (EOF or reset) by now: an open idle connection
/// yields nothing within `wait`.
async fn closed_by_server(stream: &mut TcpStream, wait: Duration) -> bool {
    let mut byte = [0u8; 1];
    match timeout(wait, stream.read(&mut byte)).await {
        Err(_) => false,
        Ok(Ok(0) | Err(_)) => true,
        Ok(Ok(_)) => panic!("the server sent data on a connection that sent no request"),
    }
}

#[tokio::test]
async fn healthz_answers_while_many_clients_hold_idle_connections() {
    let server = start().await;
    // The attack as probed: connections that never send a byte, from 100 addresses, more
    // than the listener's whole capacity at once, then about 7 more per second throughout.
    let addr = server.addr;
    let attack = tokio::spawn(async move {
        let mut held = Vec::new();
        for n in 0u16..100 {
            let from = loopback(2 + u8::try_from(n % 100).expect("< 100"));
            if let Ok(stream) = connect_from(from, addr).await {
                held.push(stream);
            }
        }
        let mut n = 0u16;
        loop {
            tokio::time::sleep(Duration::from_millis(150)).await;
            let from = loopback(2 + u8::try_from(n % 100).expect("< 100"));
            if let Ok(stream) = connect_from(from, addr).await {
                held.push(stream);
            }
            n = n.wrapping_add(1);
        }
    });
    // Let the burst land before the first probe.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut failures = Vec::new();
    for n in 0..60 {
        if let Err(why) = probe(loopback(1), server.addr).await {
            failures.push(format!("probe {n}: {why}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    attack.abort();

    assert!(
        failures.is_empty(),
        "{} of 60 /healthz probes failed under the attack: {failures:#?}",
        failures.len()
    );
    assert!(!server.serving.is_finished(), "the server still runs");
}

#[tokio::test]
async fn one_client_holds_at_most_its_share_of_connections() {
    let server = start().await;
    // Another client's keep-alive connection, opened first: one client's flood must not
    // push it out.
    let mut scraper = connect_from(loopback(3), server.addr)
        .await
        .expect("connect");
    scraper
        .write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut first = [0u8; 512];
    let n = timeout(STEP, scraper.read(&mut first))
        .await
        .expect("reply in time")
        .expect("read");
    assert!(
        first[..n].starts_with(b"HTTP/1.1 503 "),
        "{:?}",
        &first[..n]
    );

    let mut flood = Vec::new();
    for _ in 0..40 {
        flood.push(
            timeout(STEP, connect_from(loopback(2), server.addr))
                .await
                .expect("connect in time")
                .expect("connect"),
        );
    }
    let mut open = Vec::new();
    for (n, stream) in flood.iter_mut().enumerate() {
        if !closed_by_server(stream, Duration::from_millis(100)).await {
            open.push(n);
        }
    }
    assert_eq!(
        open,
        (32..40).collect::<Vec<_>>(),
        "one client keeps only its 8 newest connections"
    );

    scraper
        .write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("the other client's connection is still open");
    let mut rest = Vec::new();
    timeout(STEP, scraper.read_to_end(&mut rest))
        .await
        .expect("reply in time")
        .expect("read");
    assert!(rest.starts_with(b"HTTP/1.1 503 "), "{rest:?}");

    let exported = server.metrics.encode();
    assert!(
        exported.lines().any(|line| line
            == r#"node_agent_telemetry_connections_closed_total{reason="client_limit"} 32"#),
        "every closure is counted: {exported}"
    );
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed_within_seconds() {
    let server = start().await;
    let mut silent = connect_from(loopback(4), server.addr)
        .await
        .expect("connect");
    let bound = Duration::from_secs(4);
    assert!(
        closed_by_server(&mut silent, bound).await,
        "a connection without a request is still open after {bound:?}"
    );
}
