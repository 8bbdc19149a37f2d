//! One evaluation: read the node (each source apart) and the pods, decide among the pods the
//! agent may act on, report, re-arm the kernel's lines, and hand the planned actions to the
//! executor.

use std::{
    collections::{BTreeMap, HashSet},
    path::PathBuf,
    time::SystemTime,
};

use node_agent_policy::{evaluate_among, Decision, NodeCondition, PodInfo, Signal};

use super::{
    acting::Note,
    observe::{read_node, NodeReading, Source},
    pods, triggers, Daemon, Trigger,
};

/// The pods to rank, whether they may be acted on, and the ids the pod source lists.
struct Pods {
    pods: Vec<PodInfo>,
    fresh: bool,
    listed: Option<HashSet<String>>,
}

impl Daemon {
    /// Reads the node, runs the policy, reports, and hands what it plans to the executor.
    pub(super) async fn evaluate(&mut self, trigger: Trigger) {
        self.telemetry.metrics.evaluation(trigger.name);
        let now = self.now();
        if let Some((done, gone)) = self.acts.state.settle(now, &|p| p.exists()) {
            tracing::debug!(pod = %done.pod_id, cgroup_gone = gone, "eviction settled");
        }
        let reading = read_node(&self.node);
        self.note_sources(&reading.failed);
        let Pods {
            pods,
            fresh,
            listed,
        } = self.pods();
        if let Some(listed) = &listed {
            self.acts.state.forget_absent(listed);
        }
        let eligibility = self.acts.state.eligibility(&self.base_eligibility(), now);
        let decide = |pods: &[PodInfo]| {
            evaluate_among(
                &self.config.eviction,
                &reading.capacity,
                &reading.observations,
                pods,
                &eligibility,
                now,
                &self.policy,
            )
        };
        let (mut decision, mut state) = decide(&pods);
        // Ranking and the event need current usage: when a pod is to go, read every pod's
        // cgroup now and decide again from the same starting state.
        let mut ranked = pods;
        if decision.evict.is_some() {
            ranked = self.with_fresh_memory(&ranked);
            (decision, state) = decide(&ranked);
        }
        self.policy = state;
        if let Some(k) = trigger.ktime_ns {
            let latency = crate::sys::monotonic_ns().saturating_sub(k) as f64 / 1e9;
            self.telemetry
                .metrics
                .decision_latency(trigger.name, latency);
        }
        // The evicted pod's cgroup, to see it go: its pod cgroup, or for a standalone workload
        // the cgroup it is named after. Looked up only when an eviction is handed over.
        let (index, node_cgroup) = (
            self.kernel.tracker.index(),
            &self.config.settings.node_cgroup,
        );
        let cgroup_of = |pod: &PodInfo| -> Option<PathBuf> {
            match &pod.uid {
                Some(uid) => pods::pod_cgroup(index, node_cgroup, uid),
                None => Some(index.root().join(pod.name.trim_start_matches('/'))),
            }
        };
        let plan =
            self.acts
                .state
                .plan(&decision, &ranked, fresh, trigger.ktime_ns, &cgroup_of, now);
        // The executor gets its work first; reporting and re-arming follow, off its path.
        self.act(plan.actions).await;
        self.notes(plan.notes, fresh);
        self.report(&reading, &decision);
        self.rearm_memory_trigger(&reading);
        // Without the memcg tracepoints the kernel cannot report memory growth: the node is
        // then re-read every pressure_poll_interval all the time (cheap: a few cgroupfs reads).
        self.pressure = !decision.thresholds_met.is_empty()
            || self.kernel.triggers.memory_fired()
            || self.kernel.programs.memory_mechanism() == crate::ebpf::MemoryMechanism::Unavailable;
    }

    /// Whether the latest pod snapshot has a pod over a local storage limit that the agent may
    /// evict now, or the pods over one that it may not evict changed: checked every
    /// housekeeping tick, so such a pod goes (or is said to stay) within about a second of the
    /// stats showing it (the kubelet: at its next synchronize), not at the next resync.
    pub(super) fn local_storage_due(&self) -> bool {
        let Some(cluster) = &self.cluster else {
            return false;
        };
        let now = self.now();
        if self.acts.state.in_flight().is_some() || self.acts.state.paced_until(now).is_some() {
            return false;
        }
        let snapshot = cluster.snapshots.borrow();
        let Some(snapshot) = snapshot.as_ref() else {
            return false;
        };
        let eligibility = self.acts.state.eligibility(&self.base_eligibility(), now);
        let over = node_agent_policy::over_local_storage_limits(
            &snapshot.pods,
            self.node.has_imagefs(),
            &eligibility,
        );
        over.evict.is_some() || over.kept != self.acts.state.over_limit_kept()
    }

    /// The pods to rank: the pod source's (fresh enough to act on or not), or in standalone
    /// mode the workload cgroups.
    fn pods(&self) -> Pods {
        match (&self.cluster, &self.config.kubernetes) {
            (Some(cluster), Some(kube)) => {
                let snapshot = cluster.snapshots.borrow();
                let Some(snapshot) = snapshot.as_ref() else {
                    return Pods {
                        pods: Vec::new(),
                        fresh: false,
                        listed: None,
                    };
                };
                let fresh = match snapshot.check_fresh(SystemTime::now(), kube.staleness_bound()) {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::debug!(error = %e, "pod data");
                        false
                    }
                };
                Pods {
                    listed: Some(snapshot.pods.iter().map(PodInfo::id).collect()),
                    pods: snapshot.pods.clone(),
                    fresh,
                }
            }
            _ => Pods {
                pods: pods::standalone_workloads(
                    self.kernel.tracker.index(),
                    &self.config.settings.node_cgroup,
                )
                .into_iter()
                .map(|(name, _)| pods::standalone_pod(&name, None))
                .collect(),
                fresh: true,
                listed: None,
            },
        }
    }

    /// The same pods with memory read now from their cgroups.
    fn with_fresh_memory(&self, ranked: &[PodInfo]) -> Vec<PodInfo> {
        let version = self.layout.memory.version();
        let index = self.kernel.tracker.index();
        let node_cgroup = &self.config.settings.node_cgroup;
        match &self.cluster {
            Some(cluster) => {
                let snapshot = cluster.snapshots.borrow();
                let containers = snapshot.as_ref().map(|s| &s.containers);
                let empty = Default::default();
                pods::with_fresh_memory(
                    ranked,
                    index,
                    node_cgroup,
                    version,
                    containers.unwrap_or(&empty),
                )
            }
            None => pods::standalone_workloads(index, node_cgroup)
                .into_iter()
                .map(|(name, dir)| pods::standalone_pod(&name, pods::working_set(&dir, version)))
                .collect(),
        }
    }

    /// Logs and counts what the plan says, each transition once.
    fn notes(&mut self, notes: Vec<Note>, fresh: bool) {
        let metrics = &self.telemetry.metrics;
        let mut stale = false;
        for note in notes {
            match note {
                Note::Pressure { met, conditions } => {
                    tracing::info!(thresholds_met = ?met, conditions = ?conditions, "pressure changed");
                }
                Note::NoEvictablePod {
                    signal,
                    passed_over,
                } => {
                    metrics.set_no_evictable_pod(Some(signal));
                    let passed: Vec<String> = passed_over
                        .iter()
                        .map(|p| format!("{}/{} ({})", p.namespace, p.name, p.reason.as_str()))
                        .collect();
                    tracing::warn!(signal = %signal, passed_over = ?passed,
                        "threshold met but no pod may be evicted: every candidate is critical, excluded or not evictable now");
                }
                Note::EvictablePodAgain => {
                    metrics.set_no_evictable_pod(None);
                    tracing::info!("a pod may be evicted again, or none needs to be");
                }
                Note::Stale => stale = true,
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
            if !self.stale {
                tracing::warn!("a threshold is met but the pod data is stale or missing: not evicting until it is fresh");
            }
            self.stale = true;
        } else if fresh && self.stale {
            tracing::info!("pod data is fresh again");
            self.stale = false;
        }
    }

    /// Signal values, thresholds met and conditions on /metrics.
    fn report(&self, reading: &NodeReading, decision: &Decision) {
        let metrics = &self.telemetry.metrics;
        for (signal, obs) in &reading.observations {
            metrics.set_signal_available(*signal, obs.available);
        }
        for t in self.config.eviction.thresholds() {
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

    /// Signal sources that could not be read: each one marked unknown (metric, `/readyz`),
    /// logged when it fails and when it is back.
    fn note_sources(&mut self, failed: &BTreeMap<Source, String>) {
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
                self.telemetry
                    .metrics
                    .set_signal_unknown(*signal, is.is_some());
            }
        }
        self.telemetry.health.set_degraded(
            failed
                .iter()
                .map(|(s, e)| (s.as_str().to_string(), e.clone()))
                .collect(),
        );
        self.degraded = failed.clone();
    }

    /// The in-kernel `pid.available` check, at the most lenient configured threshold.
    pub(super) fn set_pid_trigger(&mut self) {
        let reading = read_node(&self.node);
        let Some(limit) = reading.capacity.pids else {
            tracing::warn!("pid.available could not be read: no kernel PID trigger");
            return;
        };
        let threshold = triggers::most_lenient(&self.config.eviction, Signal::PidAvailable, limit);
        let threshold = threshold.map_or(0, |t| t.max(1) as u64);
        if let Err(e) = self.kernel.programs.set_pid_threshold(
            limit as u64,
            threshold,
            (threshold / 20).max(10),
        ) {
            tracing::warn!(error = %e, "setting the kernel PID trigger");
        }
    }

    fn rearm_memory_trigger(&mut self, reading: &NodeReading) {
        let version = self.layout.memory.version();
        let kernel = &mut self.kernel;
        if let Err(e) = kernel.triggers.rearm(
            &mut kernel.programs,
            &self.config.eviction,
            reading,
            version,
        ) {
            tracing::warn!(error = %e, "setting the kernel memory trigger");
        }
    }
}
