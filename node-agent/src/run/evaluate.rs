//! One evaluation: the node read, the pods decided among, the plan handed to the executor,
//! then reporting and the kernel's lines re-armed. Every branch of the loop in [`super::core`]
//! that asks for a decision ends here.

use node_agent_executor::Decided;
use node_agent_policy::{evaluate_among, PodInfo};

use crate::telemetry::Trigger;
use crate::{
    observe::naming::{Verdict, NAME_WAIT},
    observe::pods,
    run::acting_config,
    run::core::Daemon,
    run::recent::Acted,
};

impl Daemon {
    /// Reads the node, decides among the pods the agent may act on, hands what the plan says
    /// to the executor, reports, and re-arms the kernel's lines.
    pub(super) fn evaluate(&mut self, trigger: Trigger, ktime_ns: Option<u64>) {
        self.report.metrics.evaluation(trigger);
        let now = self.now();
        let cgroups = pods::NodeCgroups {
            version: self.node.layout.version(),
        };
        let ended = self.acts.settle(now, &cgroups);
        self.settled(&ended, now);
        // A cgroup made since the last scan (a pod just admitted, its memory growing) is in
        // the index before the pods are ranked: its usage is read from it, and it is named if
        // the pod source has not listed it. (Walked only when the kernel said a cgroup came
        // or went; else at housekeeping.) Measured on the real cluster: a ramp started 0.3 s
        // before the crossing, not yet in the index, ranked as using nothing.
        self.kernel.rescan_if_changed(&self.report);
        let mut reading = self.node.read();
        // How fast memory falls: a hard threshold is met early where relief asked for at it
        // would come after the headroom is gone.
        self.ahead.observe(now, &reading.observations);
        self.ahead
            .lead(&mut reading.observations, self.acts.kills_on_node());
        self.report.sources(&reading.failed);
        let config = &self.config.current;
        self.acts
            .set_node_reclaim(acting_config::node_reclaim(config, reading.fs_layout));
        let index = self.kernel.feed.index();
        let node_cgroup = &config.settings.node_cgroup;
        let cluster = self.kube.as_ref().map(|k| &k.cluster);
        let pods::Pods {
            pods,
            fresh,
            listed,
            listed_uids,
        } = pods::current(cluster.zip(config.kubernetes.as_ref()), index, node_cgroup);
        if let Some(listed) = &listed {
            self.acts.forget_absent(listed);
        }
        let eligibility = self.acts.eligibility(now, &cgroups);
        let decide = |pods: &[PodInfo]| {
            evaluate_among(
                &config.eviction,
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
        if !decision.evictions.is_empty() {
            let version = self.node.layout.version();
            ranked = pods::with_memory_now(cluster, &ranked, index, node_cgroup, version);
            (decision, state) = decide(&ranked);
        }
        self.policy = state;
        // A pod cgroup the pod source has not listed is named at once; the threshold's
        // eviction waits for its name while it holds memory (`naming`).
        let version = self.node.layout.version();
        let names_until = match (
            self.kube.as_mut(),
            &listed_uids,
            decision.threshold_eviction(),
        ) {
            (Some(kube), Some(listed_uids), Some(chosen)) => {
                let unlisted = pods::unlisted_pods(index, node_cgroup, listed_uids, version);
                if !unlisted.is_empty() {
                    kube.cluster.name_pods_now();
                }
                match kube.naming.check(now, &unlisted) {
                    Verdict::Act => None,
                    Verdict::Wait { uid, until } => {
                        tracing::debug!(pod_uid = %uid, chosen = %format!("{}/{}", chosen.namespace, chosen.name),
                            "a pod the pod source has not listed yet holds memory: waiting for its name before ranking");
                        Some(until)
                    }
                    Verdict::GaveUp { uid } => {
                        tracing::warn!(pod_uid = %uid, chosen = %format!("{}/{}", chosen.namespace, chosen.name), wait = ?NAME_WAIT,
                            "a pod cgroup holding memory is still not listed by the pod source: evicting the pod chosen among those it lists");
                        None
                    }
                }
            }
            (Some(kube), _, _) => {
                kube.naming.clear();
                None
            }
            _ => None,
        };
        self.acts.hold_for_names(names_until);
        if let Some(k) = ktime_ns {
            let latency = crate::sys::monotonic_ns().saturating_sub(k) as f64 / 1e9;
            self.report.metrics.decision_latency(trigger, latency);
        }
        // The evicted pod's cgroup, to see it go (and on the node, what a kill may touch): its
        // pod cgroup by its UID, or for a standalone workload the cgroup it is named after.
        // Looked up only when an eviction is handed over.
        let cgroup_of = |pod: &PodInfo| match &pod.uid {
            Some(uid) => pods::pod_cgroup(index, node_cgroup, uid),
            None => {
                let path = index.root().join(pod.name.trim_start_matches('/'));
                let id = crate::cgroup::cgroup_id(&path).ok()?;
                Some(node_agent_executor::plan::PodCgroup { path, id })
            }
        };
        // The executor gets its work first; reporting and re-arming follow, off its path.
        let handed_at = crate::sys::monotonic_ns();
        let decided = Decided {
            decision: &decision,
            pods: &ranked,
            fresh,
            trigger_ktime_ns: ktime_ns,
        };
        let handed = self.acts.act_on(decided, &cgroup_of, now);
        self.remember(handed_at, &decision, &handed.evictions);
        self.report.notes(handed.notes, fresh);
        let config = &self.config.current;
        self.report.decision(&config.eviction, &reading, &decision);
        self.kernel
            .rearm(&config.eviction, &reading, &self.node.layout);
        // Without an in-kernel memory mechanism the kernel cannot report memory growth: the
        // node is then re-read every pressure_poll_interval all the time.
        self.clock.polling = !decision.thresholds_met.is_empty()
            || self.kernel.triggers.memory_fired()
            || self.kernel.blind_to_memory();
    }

    /// What an OOM kill later is told came before it: the evictions handed over, a memory
    /// threshold met while its grace period runs.
    fn remember(
        &mut self,
        now: u64,
        decision: &node_agent_policy::Decision,
        evictions: &[(node_agent_policy::Eviction, bool)],
    ) {
        for (e, on_node) in evictions {
            tracing::info!(pod = %format!("{}/{}", e.namespace, e.name), signal = %e.signal,
                hard = e.hard, early = e.early, way = if *on_node { "node" } else { "api" },
                "eviction handed over");
            self.report.recent.acted(
                now,
                Acted::Evicting {
                    pod: format!("{}/{}", e.namespace, e.name),
                    signal: e.signal.as_str().to_string(),
                },
            );
        }
        let in_grace = decision
            .thresholds_met
            .iter()
            .find(|t| t.signal.is_memory() && !t.grace_period_passed);
        if let (Some(t), None) = (in_grace, decision.reclaim) {
            self.report
                .recent
                .acted(now, Acted::InGrace { signal: t.signal });
        }
    }
}
