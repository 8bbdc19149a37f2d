//! The kernel programs' own counters on `/metrics`: records sent to the ring buffer, and the
//! memory sampler's ticks, time and late ticks. The daemon copies them out of the kernel maps at
//! each housekeeping tick; a scrape reads the last copy.

use std::sync::{
    atomic::{AtomicBool, AtomicU64, Ordering},
    Arc,
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::counter::ConstCounter,
};

#[derive(Debug, Default)]
pub(super) struct KernelStats {
    pub(super) sent: AtomicU64,
    /// Whether the sampler is the memory mechanism (its counters are left out otherwise).
    pub(super) sampler: AtomicBool,
    pub(super) sampler_ticks: AtomicU64,
    pub(super) sampler_busy_ns: AtomicU64,
    pub(super) sampler_late_ticks: AtomicU64,
    pub(super) sampler_alone_ticks: AtomicU64,
}

#[derive(Debug, Default)]
pub(super) struct KernelCounters(pub(super) Arc<KernelStats>);

impl Collector for KernelCounters {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = &self.0;
        let sent = ConstCounter::new(s.sent.load(Ordering::Relaxed));
        sent.encode(encoder.encode_descriptor(
            "ringbuf_sent_events",
            "Records the kernel programs tried to write to the ring buffer: delivered plus lost",
            None,
            sent.metric_type(),
        )?)?;
        if s.sampler.load(Ordering::Relaxed) {
            let ticks = ConstCounter::new(s.sampler_ticks.load(Ordering::Relaxed));
            ticks.encode(encoder.encode_descriptor(
                "memory_sampler_ticks",
                "Periods the in-kernel memory sampler ran (one read of every watched page counter each)",
                None,
                ticks.metric_type(),
            )?)?;
            let busy = ConstCounter::new(s.sampler_busy_ns.load(Ordering::Relaxed) as f64 / 1e9);
            busy.encode(encoder.encode_descriptor(
                "memory_sampler_busy_seconds",
                "Time the in-kernel memory sampler spent in its ticks",
                None,
                busy.metric_type(),
            )?)?;
            let late = ConstCounter::new(s.sampler_late_ticks.load(Ordering::Relaxed));
            late.encode(encoder.encode_descriptor(
                "memory_sampler_late_ticks",
                "Sampler ticks that started over 5 ms after they were due while its other timer did \
                 not tick either (softirqs deferred, or the host descheduled both vCPUs): a crossing \
                 then may be reported after more than 10 ms",
                None,
                late.metric_type(),
            )?)?;
            let alone = ConstCounter::new(s.sampler_alone_ticks.load(Ordering::Relaxed));
            alone.encode(encoder.encode_descriptor(
                "memory_sampler_alone_ticks",
                "Sampler ticks one timer took alone at the full pace because the other, on another \
                 CPU, was overdue (its vCPU descheduled by the host): gaps covered",
                None,
                alone.metric_type(),
            )?)?;
        }
        Ok(())
    }
}
