//! One request to an agent's inspection endpoint: `pods/portforward` to port 9465 of its pod
//! (the API server checks the user's RBAC; the kubelet and the container runtime carry the
//! stream into the pod's network namespace, where the agent listens on loopback), then
//! HTTP/1.1 over that stream. Everything read is capped: a whole answer at [`MAX_ANSWER`],
//! a line of the live stream at [`MAX_LINE`].

use std::time::Duration;

use http_body_util::{BodyExt as _, Empty};
use hyper::{
    body::{Bytes, Incoming},
    header::HOST,
    Request, Response, StatusCode,
};
use hyper_util::rt::TokioIo;
use kube::api::Portforwarder;

use crate::{
    cluster::{Cluster, INSPECT_PORT},
    error::{chain, Call, PluginError},
};

/// The largest status or explanation taken.
pub const MAX_ANSWER: usize = 4 << 20;
/// The longest line of the live stream taken (a record is a few hundred bytes).
pub const MAX_LINE: usize = 1 << 20;
/// How long the runtime's word on a failed forward is waited for.
const ERROR_WAIT: Duration = Duration::from_secs(2);

/// Why a request to one agent failed.
#[derive(Debug)]
pub enum ForwardError {
    /// RBAC refused: the user must fix it; the whole command stops.
    Refused(PluginError),
    /// This agent could not be read (not listening, gone, an error answer): said, not fatal.
    Failed(String),
}

impl ForwardError {
    /// As a plugin error about the agent on `node`.
    pub fn about(self, node: &str, pod: &str) -> PluginError {
        match self {
            ForwardError::Refused(e) => e,
            ForwardError::Failed(problem) => PluginError::Agent {
                node: node.into(),
                pod: pod.into(),
                problem,
            },
        }
    }
}

/// An open answer: the response, and what keeps the forward alive while it is read.
pub struct Open {
    pub response: Response<Incoming>,
    forward: Portforwarder,
    driver: tokio::task::JoinHandle<()>,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.driver.abort();
        self.forward.abort();
    }
}

/// Sends `GET target` to the agent pod `pod` and waits for the answer's head, within
/// `--request-timeout`.
pub async fn open(cluster: &Cluster, pod: &str, target: &str) -> Result<Open, ForwardError> {
    match tokio::time::timeout(
        cluster.request_timeout,
        open_unbounded(cluster, pod, target),
    )
    .await
    {
        Ok(result) => result,
        Err(_) => Err(ForwardError::Failed(format!(
            "no answer within --request-timeout {:?}",
            cluster.request_timeout
        ))),
    }
}

async fn open_unbounded(cluster: &Cluster, pod: &str, target: &str) -> Result<Open, ForwardError> {
    // The forward is a WebSocket upgrade of a GET: authorized as get, and (Kubernetes 1.35+)
    // as create for the upgrade itself; a refusal of either is refused here as both.
    let call = Call::new(
        "get and create",
        "pods/portforward",
        Some(&cluster.agent_namespace),
        format!("forwarding to pod {pod}"),
    );
    let mut forward = cluster
        .agent_pods()
        .portforward(pod, &[INSPECT_PORT])
        .await
        .map_err(|e| match call.failed(e) {
            e if e.is_forbidden() => ForwardError::Refused(e),
            e => ForwardError::Failed(e.to_string()),
        })?;
    let stream = forward
        .take_stream(INSPECT_PORT)
        .ok_or_else(|| ForwardError::Failed("the port forward gave no stream".into()))?;
    let runtime_said = forward.take_error(INSPECT_PORT);
    let failed = |what: String| async move {
        // The kubelet or the runtime says why on the port's error channel (nothing listens
        // there, the pod's network namespace is gone): worth waiting a moment for.
        let said = match runtime_said {
            Some(said) => tokio::time::timeout(ERROR_WAIT, said).await.ok().flatten(),
            None => None,
        };
        ForwardError::Failed(match said {
            Some(said) if said.contains("connection refused") => format!(
                "nothing listens on 127.0.0.1:{INSPECT_PORT} in its pod (inspectListen is off, or the agent predates kubectl node-agent): {said}"
            ),
            Some(said) => format!("{what}: {said}"),
            None => what,
        })
    };
    let (mut sender, connection) =
        match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await {
            Ok(pair) => pair,
            Err(e) => return Err(failed(format!("starting HTTP: {}", chain(&e))).await),
        };
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    let request = Request::get(target)
        .header(HOST, "node-agent")
        .body(Empty::<Bytes>::new())
        .map_err(|e| ForwardError::Failed(format!("building the request {target}: {e}")))?;
    let response = match sender.send_request(request).await {
        Ok(response) => response,
        Err(e) => {
            driver.abort();
            return Err(failed(format!("no answer: {}", chain(&e))).await);
        }
    };
    let mut open = Open {
        response,
        forward,
        driver,
    };
    let status = open.response.status();
    if status != StatusCode::OK {
        let body = read_capped(&mut open, 64 << 10).await.unwrap_or_default();
        return Err(ForwardError::Failed(format!(
            "answered {status}: {}",
            String::from_utf8_lossy(&body).trim()
        )));
    }
    Ok(open)
}

/// `GET target`, the whole answer (at most [`MAX_ANSWER`]), as `T` from JSON.
pub async fn get_json<T: serde::de::DeserializeOwned>(
    cluster: &Cluster,
    pod: &str,
    target: &str,
) -> Result<T, ForwardError> {
    let read = async {
        let mut open = open(cluster, pod, target).await?;
        let body = read_capped(&mut open, MAX_ANSWER).await?;
        serde_json::from_slice(&body).map_err(|e| {
            ForwardError::Failed(format!(
                "its answer to {target} is not what this plugin reads (a different version?): {e}"
            ))
        })
    };
    // The head within the timeout, and the body too.
    match tokio::time::timeout(cluster.request_timeout * 2, read).await {
        Ok(result) => result,
        Err(_) => Err(ForwardError::Failed(format!(
            "its answer to {target} did not arrive within twice --request-timeout"
        ))),
    }
}

async fn read_capped(open: &mut Open, cap: usize) -> Result<Vec<u8>, ForwardError> {
    let mut body = Vec::new();
    while let Some(frame) = open.response.body_mut().frame().await {
        let frame = frame
            .map_err(|e| ForwardError::Failed(format!("reading its answer: {}", chain(&e))))?;
        if let Some(data) = frame.data_ref() {
            if body.len() + data.len() > cap {
                return Err(ForwardError::Failed(format!(
                    "its answer is larger than {cap} bytes"
                )));
            }
            body.extend_from_slice(data);
        }
    }
    Ok(body)
}

/// The lines of a streamed answer, each at most [`MAX_LINE`]. An empty line is the agent's
/// keepalive: it carries nothing but shows the stream is alive.
pub struct Lines {
    open: Open,
    buffer: Vec<u8>,
    done: bool,
}

impl Lines {
    pub fn new(open: Open) -> Lines {
        Lines {
            open,
            buffer: Vec::new(),
            done: false,
        }
    }

    /// The next line; `None` at the end of the stream; an error when a frame fails or a line
    /// outgrows [`MAX_LINE`].
    pub async fn next(&mut self) -> Result<Option<String>, String> {
        loop {
            if let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                let text = String::from_utf8_lossy(&line[..line.len() - 1])
                    .trim()
                    .to_string();
                return Ok(Some(text));
            }
            if self.buffer.len() > MAX_LINE {
                return Err(format!("a line longer than {MAX_LINE} bytes"));
            }
            if self.done {
                return Ok(None);
            }
            match self.open.response.body_mut().frame().await {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        self.buffer.extend_from_slice(data);
                    }
                }
                Some(Err(e)) => return Err(chain(&e)),
                None => self.done = true,
            }
        }
    }
}
