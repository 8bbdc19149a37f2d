//! Errors of the CRI client: each names the call and the endpoint, and keeps its source.

use std::time::Duration;

use crate::config::Endpoint;

#[derive(Debug, thiserror::Error)]
pub enum CriError {
    /// The runtime answered the call with an error, or could not be reached for it.
    #[error("CRI {call} at {endpoint} failed ({code:?}): {message}")]
    Call {
        call: &'static str,
        endpoint: Endpoint,
        code: tonic::Code,
        message: String,
        #[source]
        source: tonic::Status,
    },
    /// No answer within the configured timeout.
    #[error("CRI {call} at {endpoint}: no answer within {timeout:?}")]
    Timeout {
        call: &'static str,
        endpoint: Endpoint,
        timeout: Duration,
    },
    /// The runtime answered, but not with what the CRI promises (a missing required field).
    #[error("CRI {call} at {endpoint}: unexpected answer: {problem}")]
    BadResponse {
        call: &'static str,
        endpoint: Endpoint,
        problem: String,
    },
    /// The endpoint answers `Version` with an API the agent does not speak.
    #[error("CRI endpoint {endpoint} speaks runtime API {api:?} ({runtime}); the agent needs v1")]
    UnsupportedApi {
        endpoint: Endpoint,
        api: String,
        runtime: String,
    },
}

impl CriError {
    pub fn call(&self) -> Option<&'static str> {
        match self {
            Self::Call { call, .. }
            | Self::Timeout { call, .. }
            | Self::BadResponse { call, .. } => Some(call),
            Self::UnsupportedApi { .. } => None,
        }
    }

    pub(crate) fn status(call: &'static str, endpoint: &Endpoint, status: tonic::Status) -> Self {
        // A refused or missing socket surfaces as `Unavailable` with the transport error inside;
        // flatten the chain so the message says why (e.g. "No such file or directory").
        let mut message = status.message().to_string();
        let mut source: Option<&dyn std::error::Error> = std::error::Error::source(&status);
        while let Some(e) = source {
            let text = e.to_string();
            if !message.contains(&text) {
                message = format!("{message}: {text}");
            }
            source = e.source();
        }
        Self::Call {
            call,
            endpoint: endpoint.clone(),
            code: status.code(),
            message,
            source: status,
        }
    }
}
