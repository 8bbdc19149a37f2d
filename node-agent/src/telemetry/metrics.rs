//! The `node_agent_*` metric families (and the standard `process_*` ones), the methods the
//! daemon records them through, and the two expositions `/metrics` writes.

mod inspect;
mod kernel;
mod kube;
mod process;
mod reclaim;
mod record;
mod sources;
#[cfg(test)]
mod tests;
mod text;

use std::sync::{Arc, OnceLock};

use kernel::{KernelCounters, KernelStats};
use kube::KubeCounters;
use node_agent_kube::{api::Counters, evict::EvictionResult};
use node_agent_policy::{Signal, StorageLimit};

use super::labels::{KubeOperation, Trigger};
use process::ProcessCollector;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::{Registry, Unit},
};
pub use text::{ConvertError, Format};

/// Upper bounds of the decision latency buckets, in seconds: 1-2-5 steps from 100 µs to 10 s
/// (×2.15 per step on average, so exponential in effect). The p99 target (2 ms) and the
/// kubelet's housekeeping interval (10 s) are bucket bounds themselves, so "share of decisions
/// within target" is one bucket divided by the count, without interpolation.
pub const DECISION_LATENCY_BUCKETS: [f64; 16] = [
    0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
    10.0,
];

/// The signals the agent observes (`observe::node::Source::signals`): their counters exist
/// from the start. A test holds the two lists together.
pub const OBSERVED_SIGNALS: [Signal; 7] = [
    Signal::MemoryAvailable,
    Signal::AllocatableMemoryAvailable,
    Signal::NodeFsAvailable,
    Signal::NodeFsInodesFree,
    Signal::ImageFsAvailable,
    Signal::ImageFsInodesFree,
    Signal::PidAvailable,
];

/// The kinds of kernel events counted in `node_agent_kernel_events_total`: one per probe.
pub const KERNEL_EVENT_KINDS: [&str; 4] = crate::probes::NAMES;

/// The results counted in `node_agent_eviction_records_total`.
pub const RECORD_RESULTS: [&str; 6] = [
    "written",
    "gone",
    "dry_run",
    "waiting",
    "lost",
    "reasserted",
];

/// What ran out at an OOM kill: a cgroup's limit, the whole node, or the kernel did not say.
pub const OOM_REASONS: [&str; 3] = ["cgroup_limit", "node", "unknown"];

/// `eviction_signal`: the kubelet's own label name for its signal names.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SignalLabels {
    eviction_signal: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ThresholdLabels {
    eviction_signal: &'static str,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    /// The commit built from (`node-agent --version` says the same).
    commit: &'static str,
    rustc: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MechanismLabels {
    mechanism: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConditionLabels {
    condition: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EvictionLabels {
    eviction_signal: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OomLabels {
    namespace: String,
    container: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OomReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TriggerLabels {
    trigger: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LaneLabels {
    lane: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation: &'static str,
}

type LatencyFamily = Family<TriggerLabels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new(DECISION_LATENCY_BUCKETS)
}

/// Every metric the daemon exports, registered once in one registry. Recording is a lock-free
/// atomic update once a label set exists (a read lock on the family to find it); label values
/// are escaped by the encoder, so any string is safe.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    signal_available_bytes: Family<SignalLabels, Gauge>,
    signal_available_inodes: Family<SignalLabels, Gauge>,
    signal_available_pids: Family<SignalLabels, Gauge>,
    build_info: Family<BuildLabels, Gauge>,
    memory_mechanism: Family<MechanismLabels, Gauge>,
    threshold_met: Family<ThresholdLabels, Gauge>,
    node_condition: Family<ConditionLabels, Gauge>,
    evictions: Family<EvictionLabels, Counter>,
    oom_kills: Family<OomLabels, Counter>,
    oom_kills_foreseen: Family<OomReasonLabels, Counter>,
    kernel_events: Family<KindLabels, Counter>,
    ringbuf_lost_events: Counter,
    ringbuf_decode_errors: Counter,
    decision_latency: LatencyFamily,
    decision_latency_invalid: Family<TriggerLabels, Counter>,
    evaluations: Family<TriggerLabels, Counter>,
    stale_data: Family<SourceLabels, Counter>,
    config_reloads: Family<ResultLabels, Counter>,
    eviction_records: Family<ResultLabels, Counter>,
    eviction_records_waiting: Gauge,
    hard_evictions_on_node: Gauge,
    tracked_cgroups: Gauge,
    untracked_cgroups: Gauge,
    tracking_cap_reached: Counter,
    kube_errors: Family<OperationLabels, Counter>,
    signal_unknown: Family<SignalLabels, Gauge>,
    no_evictable_pod: Family<SignalLabels, Gauge>,
    no_evictable_pod_events: Family<SignalLabels, Counter>,
    kube_counters: Arc<OnceLock<Arc<Counters>>>,
    kernel_stats: Arc<KernelStats>,
    telemetry_connections_closed: Family<ReasonLabels, Counter>,
    telemetry_authorizations: Family<ResultLabels, Counter>,
    executor_refused: Family<LaneLabels, Counter>,
    /// Node-level reclaim's families, in their own module.
    reclaim: reclaim::ReclaimMetrics,
    /// The sources' readiness and the listener's accept errors, in their own module.
    sources: sources::SourceMetrics,
    /// The inspection endpoint's clients, in their own module.
    inspect: inspect::InspectMetrics,
}

impl Metrics {
    pub fn new() -> Arc<Metrics> {
        let metrics = Metrics {
            registry: Registry::default(),
            signal_available_bytes: Family::default(),
            signal_available_inodes: Family::default(),
            signal_available_pids: Family::default(),
            build_info: Family::default(),
            memory_mechanism: Family::default(),
            threshold_met: Family::default(),
            node_condition: Family::default(),
            evictions: Family::default(),
            oom_kills: Family::default(),
            oom_kills_foreseen: Family::default(),
            kernel_events: Family::default(),
            ringbuf_lost_events: Counter::default(),
            ringbuf_decode_errors: Counter::default(),
            decision_latency: Family::new_with_constructor(latency_histogram),
            decision_latency_invalid: Family::default(),
            evaluations: Family::default(),
            stale_data: Family::default(),
            config_reloads: Family::default(),
            eviction_records: Family::default(),
            eviction_records_waiting: Gauge::default(),
            hard_evictions_on_node: Gauge::default(),
            tracked_cgroups: Gauge::default(),
            untracked_cgroups: Gauge::default(),
            tracking_cap_reached: Counter::default(),
            kube_errors: Family::default(),
            signal_unknown: Family::default(),
            no_evictable_pod: Family::default(),
            no_evictable_pod_events: Family::default(),
            kube_counters: Arc::default(),
            kernel_stats: Arc::default(),
            telemetry_connections_closed: Family::default(),
            telemetry_authorizations: Family::default(),
            executor_refused: Family::default(),
            reclaim: reclaim::ReclaimMetrics::default(),
            sources: sources::SourceMetrics::default(),
            inspect: inspect::InspectMetrics::default(),
        };
        metrics.precreate();
        Arc::new(metrics.registered())
    }

    /// Every counter whose label sets are known at start exists from the start, at 0, so
    /// `rate()`, `increase()` and alerts see a 0 rather than nothing.
    fn precreate(&self) {
        self.build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
                commit: env!("NODE_AGENT_COMMIT"),
                rustc: env!("NODE_AGENT_RUSTC"),
            })
            .set(1);
        for result in ["ok", "invalid", "refused", "retrying", "dry_run_first"] {
            self.config_reloads
                .get_or_create_owned(&ResultLabels { result });
        }
        for result in RECORD_RESULTS {
            self.eviction_records
                .get_or_create_owned(&ResultLabels { result });
        }
        let limits = StorageLimit::ALL.map(StorageLimit::as_str);
        for eviction_signal in OBSERVED_SIGNALS.iter().map(|s| s.as_str()).chain(limits) {
            for result in EvictionResult::ALL {
                self.evictions.get_or_create_owned(&EvictionLabels {
                    eviction_signal,
                    result: result.as_str(),
                });
            }
        }
        for signal in OBSERVED_SIGNALS {
            let eviction_signal = signal.as_str();
            self.no_evictable_pod_events
                .get_or_create_owned(&SignalLabels { eviction_signal });
            self.signal_unknown
                .get_or_create_owned(&SignalLabels { eviction_signal });
        }
        for trigger in Trigger::ALL {
            let labels = TriggerLabels {
                trigger: trigger.as_str(),
            };
            self.evaluations.get_or_create_owned(&labels);
            self.decision_latency_invalid.get_or_create_owned(&labels);
        }
        // The triggers with a kernel timestamp: their latency from 0, so that rate() and
        // histogram_quantile() see the first decision rather than a series born at 1.
        for trigger in [
            Trigger::MemoryThreshold,
            Trigger::PidThreshold,
            Trigger::OomKill,
        ] {
            self.decision_latency.get_or_create_owned(&TriggerLabels {
                trigger: trigger.as_str(),
            });
        }
        for kind in KERNEL_EVENT_KINDS {
            self.kernel_events.get_or_create_owned(&KindLabels {
                kind: kind.to_owned(),
            });
        }
        self.stale_data.get_or_create_owned(&SourceLabels {
            source: "pods".to_owned(),
        });
        for operation in KubeOperation::ALL {
            self.kube_errors.get_or_create_owned(&OperationLabels {
                operation: operation.as_str(),
            });
        }
        for reason in OOM_REASONS {
            self.oom_kills_foreseen
                .get_or_create_owned(&OomReasonLabels { reason });
        }
        for lane in node_agent_executor::LANES {
            self.executor_refused
                .get_or_create_owned(&LaneLabels { lane });
        }
        // Node-level reclaim answers the disk signals.
        self.reclaim.precreate(
            OBSERVED_SIGNALS
                .iter()
                .filter(|s| s.resource() != node_agent_policy::signal::Resource::Memory)
                .filter(|s| s.resource() != node_agent_policy::signal::Resource::Pids)
                .map(|s| s.as_str()),
        );
        for reason in ["client_limit", "capacity", "idle"] {
            self.telemetry_connections_closed
                .get_or_create_owned(&ReasonLabels { reason });
        }
        for result in super::labels::AUTHORIZATION_RESULTS {
            self.telemetry_authorizations
                .get_or_create_owned(&ResultLabels { result });
        }
    }

    /// The registry holds clones of the families (they share their storage), so recording
    /// through the fields shows up in [`Metrics::encode`].
    fn registered(mut self) -> Self {
        self.registry
            .register_collector(Box::new(ProcessCollector::default()));
        let r = self.registry.sub_registry_with_prefix("node_agent");
        self.reclaim.register(r);
        self.sources.register(r);
        self.inspect.register(r);
        // prometheus-client appends `_total` to counter names and the unit to the others', and
        // a full stop to each help text.
        r.register_with_unit(
            "signal_available",
            "Available bytes of each byte-valued eviction signal (memory.available, nodefs.available, imagefs.available)",
            Unit::Bytes,
            self.signal_available_bytes.clone(),
        );
        r.register_with_unit(
            "signal_available",
            "Free inodes of each inode-valued eviction signal (nodefs.inodesFree, imagefs.inodesFree)",
            Unit::Other("inodes".into()),
            self.signal_available_inodes.clone(),
        );
        r.register_with_unit(
            "signal_available",
            "Available process IDs (pid.available: min(pid_max, threads-max, the kubelet's rlimit.maxpid) minus live tasks)",
            Unit::Other("pids".into()),
            self.signal_available_pids.clone(),
        );
        r.register(
            "build_info",
            "The agent's build: always 1, with its version, the commit it was built from and the compiler's version in labels",
            self.build_info.clone(),
        );
        r.register(
            "memory_mechanism",
            "The in-kernel memory mechanism the kernel accepted (fexit, sampler, or polling when none): 1 for the one in use",
            self.memory_mechanism.clone(),
        );
        r.register(
            "threshold_met",
            "Whether the signal's eviction threshold of this kind (hard or soft) is met (1) or not (0)",
            self.threshold_met.clone(),
        );
        r.register(
            "node_condition",
            "Whether the node condition (MemoryPressure, DiskPressure, PIDPressure) is reported (1) or not (0)",
            self.node_condition.clone(),
        );
        r.register(
            "evictions",
            "Eviction decisions by the signal that drove them and their result",
            self.evictions.clone(),
        );
        r.register(
            "oom_kills",
            "Kernel OOM kills by pod namespace and container (none for cgroups outside pods) and whether a cgroup limit or the whole node ran out",
            self.oom_kills.clone(),
        );
        r.register(
            "oom_kills_foreseen",
            "Kernel OOM kills preceded within a minute by memory pressure the agent saw, by what ran out",
            self.oom_kills_foreseen.clone(),
        );
        r.register(
            "kernel_events",
            "Events read from the kernel programs' ring buffer, by kind",
            self.kernel_events.clone(),
        );
        r.register(
            "ringbuf_lost_events",
            "Events the kernel programs could not write because the ring buffer was full",
            self.ringbuf_lost_events.clone(),
        );
        r.register(
            "ringbuf_decode_errors",
            "Ring buffer records that could not be decoded",
            self.ringbuf_decode_errors.clone(),
        );
        r.register_with_unit(
            "decision_latency",
            "Time from the kernel timestamp of the triggering event to the decision, by trigger",
            Unit::Seconds,
            self.decision_latency.clone(),
        );
        r.register(
            "decision_latency_invalid",
            "Decision latencies not recorded because they were negative or not finite, by trigger",
            self.decision_latency_invalid.clone(),
        );
        r.register(
            "evaluations",
            "Evaluations of the eviction policy, by what triggered them",
            self.evaluations.clone(),
        );
        r.register(
            "stale_data",
            "Decisions refused because the data they needed was too old, by data source",
            self.stale_data.clone(),
        );
        r.register(
            "config_reloads",
            "Configuration reloads by result (ok; invalid, refused: the old configuration kept; retrying: read again; dry_run_first: a file asking for dry run, applied before its checks)",
            self.config_reloads.clone(),
        );
        r.register(
            "eviction_records",
            "Records of evictions carried out on the node (the pod Failed, Evicted, through the API), by result: written, gone (the pod went first), dry_run, waiting (the API server did not take it yet; tried again), lost (refused, or given up), reasserted (the kubelet had started the pod again in place: killed again, written again)",
            self.eviction_records.clone(),
        );
        r.register(
            "eviction_records_waiting",
            "Records of evictions carried out on the node that wait for the API server",
            self.eviction_records_waiting.clone(),
        );
        r.register(
            "hard_evictions_on_node",
            "1 while hard memory and PID evictions are carried out on the node (kubernetes.hardEviction: node, and the agent can), 0 while they go through the API",
            self.hard_evictions_on_node.clone(),
        );
        r.register(
            "tracked_cgroups",
            "Cgroups the agent currently tracks",
            self.tracked_cgroups.clone(),
        );
        r.register(
            "untracked_cgroups",
            "Cgroups left untracked because the kernel maps are full (tracked as soon as room frees)",
            self.untracked_cgroups.clone(),
        );
        r.register(
            "tracking_cap_reached",
            "Times the kernel maps' cgroup cap was reached",
            self.tracking_cap_reached.clone(),
        );
        r.register(
            "kube_errors",
            "Failed Kubernetes API or kubelet requests, by operation",
            self.kube_errors.clone(),
        );
        r.register(
            "signal_unknown",
            "Whether the signal could not be read at the last evaluation (1): its source is degraded and it meets no threshold",
            self.signal_unknown.clone(),
        );
        r.register(
            "no_evictable_pod",
            "Whether a threshold on this signal is past its grace period with no pod that may be evicted (1)",
            self.no_evictable_pod.clone(),
        );
        r.register(
            "no_evictable_pod_events",
            "Times a threshold on this signal was found past its grace period with no pod that may be evicted",
            self.no_evictable_pod_events.clone(),
        );
        r.register(
            "telemetry_connections_closed",
            "Connections to this listener closed by the agent, by reason (client_limit, capacity, idle)",
            self.telemetry_connections_closed.clone(),
        );
        r.register(
            "telemetry_authorizations",
            "Callers of /metrics (and of /readyz's details) let in or not under metricsAccess, by result (allowed, unauthenticated, forbidden, unavailable, busy)",
            self.telemetry_authorizations.clone(),
        );
        r.register(
            "executor_refused",
            "Actions the executor did not take because their lane was full (a burst of node events), by lane",
            self.executor_refused.clone(),
        );
        r.register_collector(Box::new(KubeCounters(self.kube_counters.clone())));
        r.register_collector(Box::new(KernelCounters(self.kernel_stats.clone())));
        self
    }

    /// Exports the Kubernetes clients' failure counts (set once, at start).
    /// Node-level reclaim's counters.
    pub fn reclaim(&self) -> &reclaim::ReclaimMetrics {
        &self.reclaim
    }

    /// Whether the sources deliver, and the listener's accept errors.
    pub fn sources(&self) -> &sources::SourceMetrics {
        &self.sources
    }

    /// The inspection endpoint's clients.
    pub fn inspect(&self) -> &inspect::InspectMetrics {
        &self.inspect
    }

    pub fn export_kube_counters(&self, counters: Arc<Counters>) {
        let _ = self.kube_counters.set(counters);
    }

    /// The whole exposition in OpenMetrics text, ending in `# EOF`.
    ///
    /// Encoding into a `String` cannot fail with these metric types; if it ever did, the error
    /// is logged and the text is returned without its `# EOF`, which scrapers reject as a
    /// failed scrape rather than reading a truncated exposition as complete.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        if let Err(error) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            tracing::error!(%error, "encoding the metrics failed; the exposition is incomplete");
        }
        text
    }

    /// The whole exposition in `format` (its content type: [`Format::content_type`]).
    pub fn encode_as(&self, format: Format) -> Result<String, ConvertError> {
        let openmetrics = self.encode();
        match format {
            Format::OpenMetrics => Ok(openmetrics),
            Format::Text => text::openmetrics_to_text(&openmetrics),
        }
    }
}
