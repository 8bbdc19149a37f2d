//! Whether the sources the agent decides on deliver, on `/metrics`, kept apart from the other
//! families. Families (prefix `node_agent_`):
//! - `kube_source_ready{source}`: 1 while the source delivers what the agent decides on, 0
//!   while `/readyz` names it (`source="pods"`: the pod source, kubelet or API server;
//!   `source="cluster"`: the API server connection); the family appears in Kubernetes mode;
//! - `kube_kubelet_tls_verified`: 0 while the agent reads a kubelet whose serving certificate
//!   it does not check (`kubelet.insecureSkipTLSVerify: true`), else 1 (a checked kubelet, or
//!   none read directly: the API server's watch or node proxy);
//! - `telemetry_accept_errors_total`: connections this listener could not accept (out of file
//!   descriptors, say), each counted; the log says when it starts and stops failing.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    source: &'static str,
}

#[derive(Debug, Default)]
pub struct SourceMetrics {
    ready: Family<SourceLabels, Gauge>,
    kubelet_tls_verified: Gauge,
    accept_errors: Counter,
}

impl SourceMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        // Until a pod source says otherwise (standalone, nothing is read unchecked).
        self.kubelet_tls_verified.set(1);
        r.register(
            "kube_source_ready",
            "Whether the source delivers what the agent decides on (1) or /readyz names it (0): pods (kubelet or API server) and cluster (the API server connection)",
            self.ready.clone(),
        );
        r.register(
            "kube_kubelet_tls_verified",
            "0 while the agent reads a kubelet whose serving certificate it does not check (kubelet.insecureSkipTLSVerify), else 1",
            self.kubelet_tls_verified.clone(),
        );
        r.register(
            "telemetry_accept_errors",
            "Connections to this listener that could not be accepted (for example out of file descriptors)",
            self.accept_errors.clone(),
        );
    }

    /// `node_agent_kube_source_ready{source}`.
    pub fn set_ready(&self, source: &'static str, ready: bool) {
        self.ready
            .get_or_create(&SourceLabels { source })
            .set(i64::from(ready));
    }

    /// `node_agent_kube_kubelet_tls_verified`.
    pub fn set_kubelet_tls_verified(&self, verified: bool) {
        self.kubelet_tls_verified.set(i64::from(verified));
    }

    /// `node_agent_telemetry_accept_errors_total`.
    pub fn accept_error(&self) {
        self.accept_errors.inc();
    }
}
