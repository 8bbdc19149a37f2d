//! What operators see of the loop's work: metrics, `/readyz`, log lines (one per transition,
//! not per evaluation) and the live stream. Everything here is presentation, built from typed
//! decisions, readings and outcomes; nothing here decides.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use node_agent_executor::{
    node::{RecordReport, RecordResult},
    plan::Note,
    reclaim::{ReclaimOutcome, ReclaimResult},
    Outcome, Refused, Report, StatusReport,
};
use node_agent_kube::api::ApiError;
use node_agent_policy::{Decision, EvictionConfig, NodeCondition, Signal};

use crate::{
    config::AgentConfig,
    observe::node::{NodeReading, Source},
    run::recent::{Acted, Recent},
    serve::live::Live,
};
use crate::{
    error_chain,
    inspect::{Inspect, Mode},
    kernel::Attributed,
    saw_before::SawBefore,
    telemetry::{Health, KubeOperation, Metrics},
    trace::Record,
};

/// The telemetry, and what was last said, so each change is said once.
pub struct Reporter {
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    pub live: Live,
    /// Sources that could not be read at the last evaluation.
    degraded: BTreeMap<Source, String>,
    /// The last decision to evict was refused for stale pod data.
    stale: bool,
    /// Why the container runtime could not be reached the last time it was asked.
    runtime_error: Option<String>,
    /// A lane of the executor refused actions (said once per episode).
    refusing: bool,
    /// Kinds of event the API server last refused or failed to take (each said once per
    /// episode, every failure counted).
    events_failing: BTreeSet<KubeOperation>,
    /// What was seen and done lately, for what an OOM kill is told came before it.
    pub recent: Recent,
    /// What `kubectl node-agent` reads: status, and what was decided about each pod.
    pub inspect: Inspect,
    /// Pods killed on the node whose record waits for the API server.
    records_waiting: BTreeSet<String>,
}

impl Reporter {
    pub fn new(metrics: Arc<Metrics>, health: Arc<Health>, live: Live, inspect: Inspect) -> Self {
        Self {
            metrics,
            health,
            live,
            degraded: BTreeMap::new(),
            stale: false,
            runtime_error: None,
            refusing: false,
            events_failing: BTreeSet::new(),
            recent: Recent::default(),
            inspect,
            records_waiting: BTreeSet::new(),
        }
    }

    /// A kernel event: counted and published; an OOM kill with what the agent saw before it.
    pub fn kernel_event(&self, event: &Attributed, saw_before: Option<SawBefore>) {
        let mut record = Record::event(event, crate::sys::ktime_rfc3339(event.ktime_ns));
        if let Some(saw) = saw_before {
            record = record.with_saw_before(saw);
        }
        self.metrics.kernel_event(record.kind());
        self.inspect.record(&record);
        self.live.publish(&record);
    }

    /// Signal sources that could not be read: each one marked unknown (metric, `/readyz`),
    /// logged when it fails and when it is back.
    pub fn sources(&mut self, failed: &BTreeMap<Source, String>) {
        if *failed == self.degraded {
            return;
        }
        for source in Source::ALL {
            let (was, is) = (self.degraded.get(&source), failed.get(&source));
            match (was, is) {
                (None, Some(error)) => tracing::warn!(source = source.as_str(), %error,
                    "signal source unreadable: its signals are unknown; the others are decided on"),
                (Some(_), None) => {
                    tracing::info!(source = source.as_str(), "signal source readable again")
                }
                _ => {}
            }
            for signal in source.signals() {
                self.metrics.set_signal_unknown(*signal, is.is_some());
            }
        }
        self.health.set_degraded(
            failed
                .iter()
                .map(|(s, e)| (s.as_str().to_string(), e.clone()))
                .collect(),
        );
        self.degraded = failed.clone();
    }

    /// Signal values, thresholds met and conditions on /metrics.
    pub fn decision(&self, eviction: &EvictionConfig, reading: &NodeReading, decision: &Decision) {
        self.inspect
            .decision(eviction, &reading.observations, decision);
        let metrics = &self.metrics;
        for (signal, obs) in &reading.observations {
            metrics.set_signal_available(*signal, obs.available);
        }
        for t in eviction.thresholds() {
            let is_met = decision
                .thresholds_met
                .iter()
                .any(|m| m.signal == t.signal && m.hard == t.is_hard());
            metrics.set_threshold_met(t.signal, t.is_hard(), is_met);
        }
        for c in [
            NodeCondition::MemoryPressure,
            NodeCondition::DiskPressure,
            NodeCondition::PidPressure,
        ] {
            metrics.set_condition(c.as_str(), decision.conditions.contains(&c));
        }
    }

    /// Logs and counts what the plan says, each transition once.
    pub fn notes(&mut self, notes: Vec<Note>, fresh: bool) {
        let metrics = &self.metrics;
        let mut stale = false;
        let now = crate::sys::monotonic_ns();
        for note in notes {
            match note {
                Note::Pressure { met, conditions } => {
                    for signal in met.iter().filter(|s| s.is_memory()) {
                        self.recent.threshold_met(now, *signal);
                    }
                    tracing::info!(thresholds_met = ?met, conditions = ?conditions, "pressure changed");
                }
                Note::NoEvictablePod {
                    signal,
                    passed_over,
                } => {
                    let passed: Vec<String> = passed_over
                        .iter()
                        .map(|p| format!("{}/{} ({})", p.namespace, p.name, p.reason.as_str()))
                        .collect();
                    if signal.is_memory() {
                        self.recent.acted(
                            now,
                            Acted::NothingEvictable {
                                signal,
                                passed_over: passed.clone(),
                            },
                        );
                    }
                    metrics.set_no_evictable_pod(Some(signal));
                    tracing::warn!(signal = %signal, passed_over = ?passed,
                        "threshold met but no pod may be evicted: every candidate is critical, excluded or not evictable now");
                }
                Note::EvictablePodAgain => {
                    metrics.set_no_evictable_pod(None);
                    tracing::info!("a pod may be evicted again, or none needs to be");
                }
                Note::Stale => stale = true,
                Note::Paced { signal, until } => {
                    metrics.eviction(signal, node_agent_kube::evict::EvictionResult::RateLimited);
                    tracing::debug!(signal = %signal, ?until, "eviction held by the pacing");
                }
                Note::OverLimitKept(kept) if kept.is_empty() => {
                    tracing::info!("no pod over a local storage limit is kept any more");
                }
                Note::OverLimitKept(kept) => {
                    let kept: Vec<String> = kept
                        .iter()
                        .map(|(p, limit)| {
                            format!(
                                "{}/{} ({limit}; {})",
                                p.namespace,
                                p.name,
                                p.reason.as_str()
                            )
                        })
                        .collect();
                    tracing::warn!(pods = ?kept,
                        "pods over a local storage limit are not evicted: critical, excluded or not evictable now");
                }
            }
        }
        if stale {
            metrics.stale_data("pods");
            // Blind: nothing is known of the pods, so "no pod may be evicted" is not either.
            metrics.set_no_evictable_pod(None);
            if !self.stale {
                tracing::warn!("a threshold is met but the pod data is stale or missing (the pod source is not ready: /readyz names it): not evicting until it is fresh");
            }
            self.stale = true;
        } else if fresh && self.stale {
            tracing::info!("pod data is fresh again");
            self.stale = false;
        }
    }

    /// An eviction's outcome: counted, logged and published.
    pub fn eviction(&mut self, report: &Report) {
        let result = report.attempt.result;
        let e = &report.eviction;
        self.recent.acted(
            crate::sys::monotonic_ns(),
            Acted::Outcome {
                pod: format!("{}/{}", e.namespace, e.name),
                result,
            },
        );
        self.metrics.eviction(report.eviction.signal, result);
        self.event_written(KubeOperation::PodEvent, report.event_error.as_ref());
        tracing::info!(
            pod = %format!("{}/{}", report.eviction.namespace, report.eviction.name),
            signal = %report.eviction.signal, result = result.as_str(), early = report.eviction.early,
            reason = report.attempt.detail.as_deref().unwrap_or(""),
            retry_after = ?report.attempt.retry_after, "eviction outcome"
        );
        let record = Record::eviction(report, crate::sys::now_rfc3339());
        self.inspect.record(&record);
        self.live.publish(&record);
    }

    /// What became of the record of an eviction carried out on the node: counted, logged.
    pub fn recorded(&mut self, record: &RecordReport) {
        let e = &record.eviction;
        let pod = format!("{}/{}", e.namespace, e.name);
        let after = record.after_kill;
        let label = match &record.result {
            RecordResult::Written => {
                self.records_waiting.remove(&pod);
                self.event_written(KubeOperation::PodEvent, record.event_error.as_ref());
                tracing::info!(%pod, ?after, "eviction recorded: the pod is Failed, Evicted");
                "written"
            }
            RecordResult::Gone => {
                self.records_waiting.remove(&pod);
                tracing::info!(%pod, ?after, "eviction not recorded: the pod went first");
                "gone"
            }
            RecordResult::DryRun => {
                self.records_waiting.remove(&pod);
                "dry_run"
            }
            RecordResult::Waiting(error) => {
                self.records_waiting.insert(pod.clone());
                tracing::warn!(%pod, error = %error_chain(error),
                    "the pod was killed on the node; its record waits for the API server (tried again until it is taken)");
                "waiting"
            }
            RecordResult::Lost(why) => {
                self.records_waiting.remove(&pod);
                tracing::error!(%pod, reason = %why,
                    "the pod was killed on the node but its record (Failed, Evicted) was not written: the kubelet may start it again in place");
                "lost"
            }
            RecordResult::Reasserted(killed) => {
                tracing::warn!(%pod, processes = killed.signalled, ?after,
                    "the kubelet had started a killed pod again in place: killed again, its record written again");
                "reasserted"
            }
        };
        self.metrics
            .eviction_record(label, self.records_waiting.len() as i64);
    }

    /// An event written, or not: every failure counted, said once until one of its kind is
    /// written again (an OOM storm against an API server refusing events is one line).
    fn event_written(&mut self, op: KubeOperation, error: Option<&ApiError>) {
        match error {
            Some(error) => {
                self.metrics.kube_error(op);
                if self.events_failing.insert(op) {
                    tracing::warn!(event = op.as_str(), error = %error_chain(error),
                        "event not recorded (further failures of this kind are counted in node_agent_kube_errors_total, not logged, until one is recorded)");
                }
            }
            None => {
                if self.events_failing.remove(&op) {
                    tracing::info!(event = op.as_str(), "events recorded again");
                }
            }
        }
    }

    /// The outcomes that only need saying: node events, status writes, lanes refusing.
    pub fn side_effect(&mut self, outcome: &Outcome) {
        match outcome {
            Outcome::NodeEvent { reason, result } => {
                let op = if *reason == node_agent_kube::events::OOM_KILL_REASON {
                    KubeOperation::OomKillEvent
                } else {
                    KubeOperation::ThresholdMetEvent
                };
                self.event_written(op, result.as_ref().err());
            }
            Outcome::PodOomEvent { result, .. } => {
                self.event_written(KubeOperation::PodOomEvent, result.as_ref().err());
            }
            Outcome::Status(report) => self.status(report),
            Outcome::Refused(refused) => self.refused(refused),
            _ => {}
        }
    }

    fn status(&self, report: &StatusReport) {
        if let Err(error) = &report.condition {
            self.metrics.kube_error(KubeOperation::NodeCondition);
            tracing::warn!(pressure = report.pressure, error = %error_chain(error), "node condition not written");
        }
        if let Err(error) = &report.taint {
            self.metrics.kube_error(KubeOperation::NodeTaint);
            tracing::warn!(wanted = report.pressure, error = %error_chain(error), "node taint not written");
        }
    }

    fn refused(&mut self, refused: &Refused) {
        self.metrics.executor_refused(refused.lane);
        if !self.refusing {
            tracing::warn!(lane = refused.lane, action = refused.action, "{refused}: shed while the lane catches up (counted in node_agent_executor_refused_total)");
            self.refusing = true;
        }
    }

    /// The executor took an action again after refusing some.
    pub fn lanes_clear(&mut self) {
        if self.refusing {
            tracing::info!("the executor's lanes take actions again");
            self.refusing = false;
        }
    }

    /// A node-level reclaim: counted, logged, published with the signal observed after it.
    pub fn reclaim(&mut self, outcome: &ReclaimOutcome, after: Option<i64>) {
        let metrics = &self.metrics;
        metrics.reclaim().record(outcome);
        if let Some(error) = &outcome.event_error {
            metrics.kube_error(KubeOperation::ReclaimEvent);
            tracing::warn!(error = %error_chain(error), "the node's reclaim event was not recorded");
        }
        match outcome.result {
            ReclaimResult::RuntimeUnavailable => {
                let why = outcome
                    .error
                    .as_ref()
                    .map_or_else(String::new, |e| error_chain(e));
                self.runtime(Some(why));
            }
            ReclaimResult::Partial => {
                self.runtime(None);
                tracing::warn!(signal = %outcome.signal, "{}", outcome.summary());
            }
            ReclaimResult::NothingToReclaim => {
                // Under lasting pressure this comes every resync: not worth a line each time.
                self.runtime(None);
                tracing::debug!(signal = %outcome.signal, "{}", outcome.summary());
            }
            ReclaimResult::Reclaimed | ReclaimResult::DryRun => {
                self.runtime(None);
                tracing::info!(signal = %outcome.signal, "{}", outcome.summary());
            }
        }
        self.live
            .publish(&Record::reclaim(outcome, after, crate::sys::now_rfc3339()));
    }

    /// Logs when the container runtime becomes unreachable and when it is back; the gauge
    /// follows. Returns whether it came back just now.
    pub fn runtime(&mut self, error: Option<String>) -> bool {
        self.metrics
            .reclaim()
            .set_runtime_unavailable(error.is_some());
        let back = self.runtime_error.is_some() && error.is_none();
        match (&self.runtime_error, &error) {
            (None, Some(error)) => tracing::warn!(%error,
                "container runtime unavailable: node-level reclaim is skipped and disk pressure evicts pods directly"),
            (Some(_), None) => {
                tracing::info!("container runtime reachable again: node-level reclaim resumes")
            }
            _ => {}
        }
        self.runtime_error = error;
        back
    }

    /// The signal a reclaim was for, read again after it: for the trace.
    pub fn reading_after(reading: &NodeReading, signal: Signal) -> Option<i64> {
        reading.observations.get(&signal).map(|o| o.available)
    }
}

/// What `kubectl node-agent status` says the agent may do (at start and after each reload).
pub fn inspect_mode(config: &AgentConfig) -> Mode {
    match (&config.kubernetes, config.dry_run()) {
        (None, _) => Mode::Standalone,
        (Some(_), true) => Mode::DryRun,
        (Some(_), false) => Mode::Enforcing,
    }
}
