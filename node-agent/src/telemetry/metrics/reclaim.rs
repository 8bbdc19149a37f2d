//! Node-level reclaim on `/metrics`: kept apart from the other families so that it can move as
//! one piece. Families (prefix `node_agent_`):
//! - `node_reclaims_total{eviction_signal,result}`: reclaims by the disk signal that asked for them and
//!   how they went (`reclaimed`, `partial`, `nothing_to_reclaim`, `dry_run`,
//!   `runtime_unavailable`);
//! - `node_reclaim_objects_total{eviction_signal,object,result}`: dead containers and unused images
//!   (`object="container"|"image"`) by step result (`removed`, `failed`, `skipped`,
//!   `would_remove` in dry run);
//! - `node_reclaim_bytes_total{eviction_signal,result}`: bytes the removed objects were expected to free
//!   (the runtime's sizes; `result="removed"`), or a dry run's plan would free
//!   (`result="would_remove"`);
//! - `node_reclaim_runtime_unavailable`: 1 while the container runtime could not be reached
//!   the last time it was asked (disk pressure then evicts pods directly).

use node_agent_executor::reclaim::{ReclaimOutcome, ReclaimResult, Tally};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunLabels {
    eviction_signal: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ObjectLabels {
    eviction_signal: String,
    object: &'static str,
    result: &'static str,
}

#[derive(Debug, Default)]
pub struct ReclaimMetrics {
    runs: Family<RunLabels, Counter>,
    objects: Family<ObjectLabels, Counter>,
    bytes: Family<RunLabels, Counter>,
    runtime_unavailable: Gauge,
}

impl ReclaimMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "node_reclaims",
            "Node-level reclaims (dead containers, unused images) before evicting for a disk signal, by result",
            self.runs.clone(),
        );
        r.register(
            "node_reclaim_objects",
            "Dead containers and unused images node-level reclaim removed, failed to remove, skipped or (dry run) would remove",
            self.objects.clone(),
        );
        r.register(
            "node_reclaim_bytes",
            "Bytes node-level reclaim's removed objects were expected to free (the runtime's sizes), or a dry run's plan would free",
            self.bytes.clone(),
        );
        r.register(
            "node_reclaim_runtime_unavailable",
            "Whether the container runtime could not be reached the last time node-level reclaim asked it (1) or could (0)",
            self.runtime_unavailable.clone(),
        );
    }

    /// Each disk signal's reclaims at 0 from the start, so `increase()` and dashboards see 0
    /// rather than nothing on a node that never reclaimed.
    pub(super) fn precreate<'a>(&self, signals: impl Iterator<Item = &'a str>) {
        for eviction_signal in signals {
            for result in ReclaimResult::ALL {
                self.runs.get_or_create_owned(&RunLabels {
                    eviction_signal: eviction_signal.to_string(),
                    result: result.as_str(),
                });
            }
        }
    }

    pub fn set_runtime_unavailable(&self, unavailable: bool) {
        self.runtime_unavailable.set(i64::from(unavailable));
    }

    /// Counts one reclaim outcome.
    pub fn record(&self, outcome: &ReclaimOutcome) {
        let signal = outcome.signal.as_str().to_string();
        self.runs
            .get_or_create(&RunLabels {
                eviction_signal: signal.clone(),
                result: outcome.result.as_str(),
            })
            .inc();
        let (containers, images) = outcome.tallies();
        for (object, t) in [("container", containers), ("image", images)] {
            let Tally {
                removed,
                failed,
                skipped,
                would_remove,
            } = t;
            for (result, n) in [
                ("removed", removed),
                ("failed", failed),
                ("skipped", skipped),
                ("would_remove", would_remove),
            ] {
                if n > 0 {
                    self.objects
                        .get_or_create(&ObjectLabels {
                            eviction_signal: signal.clone(),
                            object,
                            result,
                        })
                        .inc_by(n);
                }
            }
        }
        let bytes = outcome.expected_bytes();
        if bytes > 0 {
            let result = if outcome.result == ReclaimResult::DryRun {
                "would_remove"
            } else {
                "removed"
            };
            self.bytes
                .get_or_create(&RunLabels {
                    eviction_signal: signal,
                    result,
                })
                .inc_by(bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use node_agent_cri::{
        model::PodRef,
        reclaim::{Outcome, ReclaimReport, StepResult, Target},
    };
    use node_agent_policy::Signal;

    use super::*;

    fn encode(m: &ReclaimMetrics) -> String {
        let mut r = Registry::with_prefix("node_agent");
        m.register(&mut r);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
        out
    }

    #[test]
    fn an_outcome_counts_the_run_its_objects_by_result_and_the_bytes() {
        let m = ReclaimMetrics::default();
        let step = |container: bool, result: StepResult, bytes| Outcome {
            target: if container {
                Target::Container {
                    id: "c".into(),
                    pod: PodRef::default(),
                    name: "n".into(),
                }
            } else {
                Target::Image {
                    id: "i".into(),
                    repo_tags: vec![],
                }
            },
            result,
            expected_bytes: Some(bytes),
        };
        m.record(&ReclaimOutcome {
            signal: Signal::ImageFsAvailable,
            result: ReclaimResult::Partial,
            plan: None,
            report: ReclaimReport {
                outcomes: vec![
                    step(true, StepResult::Removed, 100),
                    step(false, StepResult::Removed, 900),
                    step(false, StepResult::Failed { error: "x".into() }, 5000),
                ],
            },
            error: None,
            event_error: None,
            at: SystemTime::UNIX_EPOCH,
        });
        m.set_runtime_unavailable(true);
        let text = encode(&m);
        for line in [
            "node_agent_node_reclaims_total{eviction_signal=\"imagefs.available\",result=\"partial\"} 1",
            "node_agent_node_reclaim_objects_total{eviction_signal=\"imagefs.available\",object=\"container\",result=\"removed\"} 1",
            "node_agent_node_reclaim_objects_total{eviction_signal=\"imagefs.available\",object=\"image\",result=\"removed\"} 1",
            "node_agent_node_reclaim_objects_total{eviction_signal=\"imagefs.available\",object=\"image\",result=\"failed\"} 1",
            "node_agent_node_reclaim_bytes_total{eviction_signal=\"imagefs.available\",result=\"removed\"} 1000",
            "node_agent_node_reclaim_runtime_unavailable 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
    }
}
