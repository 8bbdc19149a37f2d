//! What the client says when the runtime is not there or does not answer: the call, the
//! endpoint and why, within the configured timeout. No runtime needed (the real one is
//! exercised by `tests/tests/cri_containerd.rs`).

use std::time::{Duration, Instant};

use node_agent_cri::{CriClient, CriError, CriSettings, Endpoint};

fn settings(path: &std::path::Path, timeout: Duration) -> CriSettings {
    CriSettings {
        endpoint: Endpoint::from_path(path),
        timeout,
    }
}

#[tokio::test]
async fn a_missing_socket_is_an_error_naming_the_call_the_endpoint_and_the_cause() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("absent.sock");
    let err = CriClient::connect(&settings(&socket, Duration::from_secs(5)))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(
            err,
            CriError::Call {
                call: "Version",
                code: tonic::Code::Unavailable,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        text.starts_with(&format!(
            "CRI Version at unix://{} failed (Unavailable)",
            socket.display()
        )),
        "{text}"
    );
    assert!(
        text.contains("No such file or directory"),
        "the cause is named: {text}"
    );
}

#[tokio::test]
async fn a_runtime_that_never_answers_times_out_at_the_configured_limit() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("silent.sock");
    // Accepts connections and reads nothing: the HTTP/2 handshake never completes.
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let held = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    let client = CriClient::lazy(&settings(&socket, Duration::from_millis(300)));
    let started = Instant::now();
    let err = client.list_images().await.unwrap_err();
    let waited = started.elapsed();
    held.abort();
    let text = err.to_string();
    assert!(
        matches!(
            err,
            CriError::Timeout {
                call: "ListImages",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        text.contains(&format!("ListImages at unix://{}", socket.display())),
        "{text}"
    );
    assert!(
        waited < Duration::from_secs(5),
        "bounded by the timeout, took {waited:?}"
    );
}
