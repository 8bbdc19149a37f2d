//! The Kubernetes clients' failure counts on `/metrics`.

use std::sync::{atomic::Ordering, Arc, OnceLock};

use node_agent_kube::api::Counters;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
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
        let rows: [(&str, &str, u64); 7] = [
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
                "Pods left out of the snapshots (object unreadable, or a UID two pods share), counted when each first appears",
                read(|c| &c.pods_skipped),
            ),
            (
                "kube_stats_skipped",
                "Stats entries refused (unreadable, or a UID two entries share): their pods rank as pods without stats; counted when each first appears",
                read(|c| &c.stats_skipped),
            ),
            (
                "kube_fields_invalid",
                "Pod quantities that are not quantities, read as a zero request or no limit; counted when each first appears",
                read(|c| &c.fields_invalid),
            ),
            (
                "kube_watch_events_dropped",
                "Pod watch lines not applied (unreadable, too large, too slow, or a silent watch given up)",
                read(|c| &c.watch_events_dropped),
            ),
            (
                "kube_pod_relists",
                "Lists of the node's pods by the API server pod source (the first one and every relist)",
                read(|c| &c.pod_relists),
            ),
        ];
        for (name, help, value) in rows {
            let counter = ConstCounter::new(value);
            let metric = encoder.encode_descriptor(name, help, None, counter.metric_type())?;
            counter.encode(metric)?;
        }
        // The pause before the pod source's next list or watch while it backs off.
        let backoff = ConstGauge::new(read(|c| &c.pod_watch_backoff_millis) as f64 / 1000.0);
        let metric = encoder.encode_descriptor(
            "kube_pod_watch_backoff",
            "The pause before the API server pod source's next list or watch while it backs off (0 while its watch is healthy)",
            Some(&prometheus_client::registry::Unit::Seconds),
            backoff.metric_type(),
        )?;
        backoff.encode(metric)?;
        Ok(())
    }
}
