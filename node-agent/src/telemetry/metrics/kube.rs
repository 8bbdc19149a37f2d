//! The Kubernetes clients' failure counts on `/metrics`.

use std::sync::{atomic::Ordering, Arc, OnceLock};

use node_agent_kube::api::Counters;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::counter::ConstCounter,
};

/// The Kubernetes clients' failure counts (`node_agent_kube::api::Counters`), read at each
/// scrape: counted means exported.
#[derive(Debug, Default)]
pub(super) struct KubeCounters(pub(super) Arc<OnceLock<Arc<Counters>>>);

impl Collector for KubeCounters {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let c = self.0.get();
        let read = |f: fn(&Counters) -> &std::sync::atomic::AtomicU64| {
            c.map_or(0, |c| f(c).load(Ordering::Relaxed))
        };
        let rows: [(&str, &str, u64); 4] = [
            (
                "kube_request_failures",
                "Kubernetes API or kubelet requests that failed after their last try",
                read(|c| &c.request_failures),
            ),
            (
                "kube_retries",
                "Kubernetes API or kubelet requests tried again after a failure",
                read(|c| &c.retries),
            ),
            (
                "kube_pods_skipped",
                "Pods left out of a snapshot because their object could not be read",
                read(|c| &c.pods_skipped),
            ),
            (
                "kube_watch_events_dropped",
                "Pod watch events that could not be decoded (each makes the agent list again)",
                read(|c| &c.watch_events_dropped),
            ),
        ];
        for (name, help, value) in rows {
            let counter = ConstCounter::new(value);
            let metric = encoder.encode_descriptor(name, help, None, counter.metric_type())?;
            counter.encode(metric)?;
        }
        Ok(())
    }
}
