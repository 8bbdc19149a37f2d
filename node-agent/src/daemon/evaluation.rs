//! One evaluation: read the node and the pods, run the policy, report.

use std::{collections::HashSet, time::SystemTime};

use node_agent_kube::{events as kube_events, pods::PodSnapshot};
use node_agent_policy::{evaluate, Decision, PodInfo};

use super::observe::{read_node, NodeReading};
use super::{pods, Daemon, Trigger};

impl Daemon {
    pub(super) fn snapshot(&self) -> Option<PodSnapshot> {
        self.kube
            .as_ref()
            .and_then(|k| k.snapshots.borrow().clone())
    }

    /// Reads the node, runs the policy, reports, and hands at most one eviction to the
    /// executor.
    pub(super) async fn evaluate(&mut self, trigger: Trigger) {
        self.metrics.evaluation(trigger.name);
        let reading = match read_node(&self.sources) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "reading the node; no decision this time");
                return;
            }
        };
        let (pods, usable) = self.pods();
        let now = self.now();
        let (mut decision, mut state) = evaluate(
            &self.config.eviction,
            &reading.capacity,
            &reading.observations,
            &pods,
            now,
            &self.state,
        );
        // Ranking needs current usage: when a pod is to go, re-read every pod's cgroup and
        // decide again from the same starting state.
        if decision.evict.is_some() {
            let fresh = self.pods_with_fresh_usage(&pods);
            (decision, state) = evaluate(
                &self.config.eviction,
                &reading.capacity,
                &reading.observations,
                &fresh,
                now,
                &self.state,
            );
        }
        self.state = state;
        if let Some(k) = trigger.ktime_ns {
            let latency = crate::sys::monotonic_ns().saturating_sub(k) as f64 / 1e9;
            self.metrics.decision_latency(trigger.name, latency);
        }
        self.report(&reading, &decision);
        self.rearm_memory_trigger(&reading);
        // Without the memcg tracepoints the kernel cannot report memory growth: the node is
        // then re-read every pressure_poll_interval all the time (cheap: a few cgroupfs reads).
        self.pressure = !decision.thresholds_met.is_empty()
            || self.triggers.memory_fired()
            || self.programs.memory_mechanism() == crate::ebpf::MemoryMechanism::Unavailable;
        if let Some(eviction) = decision.evict.clone() {
            if !usable {
                self.metrics.stale_data("pods");
                tracing::warn!(
                    "a threshold is met but the pod data is stale or missing: not evicting"
                );
            } else {
                self.execute(eviction, &pods, trigger);
            }
        }
    }

    /// The pods to rank, and whether they are fresh enough to act on.
    pub(super) fn pods(&self) -> (Vec<PodInfo>, bool) {
        match &self.kube {
            Some(kube) => {
                let Some(snapshot) = self.snapshot() else {
                    return (Vec::new(), false);
                };
                let fresh = snapshot
                    .check_fresh(SystemTime::now(), kube.config.staleness_bound())
                    .is_ok();
                let infos = snapshot
                    .pods
                    .iter()
                    .map(|p| pods::pod_info(p, None))
                    .collect();
                (infos, fresh)
            }
            None => {
                let infos =
                    pods::standalone_workloads(&self.index, &self.config.settings.node_cgroup)
                        .into_iter()
                        .map(|(name, _)| pods::standalone_pod(&name, None))
                        .collect();
                (infos, true)
            }
        }
    }

    /// The same pods with memory working sets read now from their cgroups.
    pub(super) fn pods_with_fresh_usage(&self, pods_in: &[PodInfo]) -> Vec<PodInfo> {
        let version = self.layout.memory.version();
        match &self.kube {
            Some(_) => {
                let cgroups = pods::pod_cgroups(&self.index, &self.config.settings.node_cgroup);
                let snapshot = self.snapshot();
                pods_in
                    .iter()
                    .map(|info| {
                        let fresh = info
                            .uid
                            .as_ref()
                            .and_then(|u| cgroups.get(u))
                            .and_then(|d| pods::working_set(d, version));
                        match (
                            snapshot.as_ref().and_then(|s| {
                                s.pods.iter().find(|p| Some(&p.uid) == info.uid.as_ref())
                            }),
                            fresh,
                        ) {
                            (Some(pod), Some(_)) => pods::pod_info(pod, fresh),
                            _ => info.clone(),
                        }
                    })
                    .collect()
            }
            None => pods::standalone_workloads(&self.index, &self.config.settings.node_cgroup)
                .into_iter()
                .map(|(name, dir)| pods::standalone_pod(&name, pods::working_set(&dir, version)))
                .collect(),
        }
    }

    /// Metrics, node condition and node events for this decision.
    pub(super) fn report(&mut self, reading: &NodeReading, decision: &Decision) {
        for (signal, obs) in &reading.observations {
            self.metrics
                .set_signal_available(signal.as_str(), obs.available);
        }
        let met: HashSet<_> = decision.thresholds_met.iter().map(|t| t.signal).collect();
        for t in self.config.eviction.thresholds() {
            let is_met = decision
                .thresholds_met
                .iter()
                .any(|m| m.signal == t.signal && m.hard == t.is_hard());
            self.metrics
                .set_threshold_met(t.signal.as_str(), t.is_hard(), is_met);
        }
        for c in [
            node_agent_policy::NodeCondition::MemoryPressure,
            node_agent_policy::NodeCondition::DiskPressure,
            node_agent_policy::NodeCondition::PidPressure,
        ] {
            self.metrics
                .set_condition(c.as_str(), decision.conditions.contains(&c));
        }
        if let Some(kube) = &self.kube {
            for signal in met.difference(&self.last_met) {
                let event = kube_events::build_threshold_met(
                    &kube.config.node_name,
                    signal.resource().as_str(),
                    SystemTime::now(),
                );
                let executor = kube.executor.clone();
                let metrics = self.metrics.clone();
                tokio::spawn(async move {
                    if executor.events().post(&event).await.is_err() {
                        metrics.kube_error("threshold event");
                    }
                });
            }
            if decision.conditions != self.last_conditions {
                let pressure = !decision.conditions.is_empty();
                let names: Vec<_> = decision.conditions.iter().map(|c| c.as_str()).collect();
                let message = if pressure {
                    format!("node-agent sees {}", names.join(", "))
                } else {
                    "node-agent sees no pressure".to_string()
                };
                let reason = if pressure {
                    "PressureDetected"
                } else {
                    "NoPressure"
                };
                let mut reporter = kube.conditions.clone();
                let metrics = self.metrics.clone();
                tokio::spawn(async move {
                    if reporter
                        .report(pressure, reason, &message, SystemTime::now())
                        .await
                        .is_err()
                    {
                        metrics.kube_error("node condition");
                    }
                });
            }
        }
        if met != self.last_met {
            tracing::info!(thresholds_met = ?met, conditions = ?decision.conditions, "pressure changed");
        }
        self.last_met = met;
        self.last_conditions = decision.conditions.clone();
    }
}
