//! Handing a decided eviction to the executor.

use std::time::{Duration, Instant, SystemTime};

use node_agent_kube::evict::EvictionOutcome;
use node_agent_policy::PodInfo;

use super::{kube, pods, Daemon, Finished, Trigger};
use crate::trace::Record;

impl Daemon {
    /// Hands one eviction to the executor, or reports it in dry-run/standalone mode.
    pub(super) fn execute(
        &mut self,
        e: node_agent_policy::Eviction,
        pods: &[PodInfo],
        trigger: Trigger,
    ) {
        let key = e
            .uid
            .clone()
            .unwrap_or_else(|| format!("{}/{}", e.namespace, e.name));
        if self.in_flight.is_some() {
            return;
        }
        let wait = self
            .config
            .kubernetes
            .as_ref()
            .map_or(Duration::from_secs(30), |k| k.eviction_wait_timeout());
        if self
            .recently_decided
            .get(&key)
            .is_some_and(|at| at.elapsed() < wait)
        {
            return;
        }
        if let Err(wait) = self.bucket.try_take(Instant::now()) {
            self.metrics.eviction(e.signal.as_str(), "rate_limited");
            tracing::info!(pod = %key, ?wait, "eviction rate limit reached; waiting");
            return;
        }
        self.recently_decided.retain(|_, at| at.elapsed() < wait);
        self.recently_decided.insert(key.clone(), Instant::now());
        let observed = self.state_observed(&e);
        let base = Record::Eviction {
            time: crate::sys::now_rfc3339(),
            trigger_ktime_ns: trigger.ktime_ns,
            namespace: e.namespace.clone(),
            name: e.name.clone(),
            uid: e.uid.clone(),
            signal: e.signal.as_str().to_string(),
            hard: e.hard,
            observed,
            threshold: e.threshold_quantity.value(),
            grace_period_seconds: e.grace_period_seconds,
            result: String::new(),
            message: e.message.clone(),
        };
        let Some(kube) = &self.kube else {
            self.publish_eviction(base, "dry_run");
            return;
        };
        let Some(pod) = self
            .snapshot()
            .and_then(|s| s.pods.into_iter().find(|p| Some(&p.uid) == e.uid.as_ref()))
        else {
            self.publish_eviction(base, "failed");
            return;
        };
        let Some(info) = pods.iter().find(|p| p.uid == e.uid) else {
            return;
        };
        let request = kube::eviction_request(&e, &pod, info);
        let executor = kube.executor.clone();
        let metrics = self.metrics.clone();
        let live = self.live.clone();
        let finished = self.finished_tx.clone();
        let cgroup_dir = pods::pod_cgroups(&self.index, &self.config.settings.node_cgroup)
            .get(&pod.uid)
            .cloned();
        let uid = pod.uid.clone();
        self.in_flight = Some(uid.clone());
        tokio::spawn(async move {
            let (result, gone_wait) = match executor.evict(&pod, &request, SystemTime::now()).await
            {
                Ok(EvictionOutcome::Evicted) => ("evicted", true),
                Ok(EvictionOutcome::PdbOverridden { .. }) => ("pdb_overridden", true),
                Ok(EvictionOutcome::AlreadyGone) => ("already_gone", false),
                Ok(EvictionOutcome::BlockedByPdb { message }) => {
                    tracing::info!(pod = %uid, %message, "eviction blocked by a PodDisruptionBudget");
                    ("blocked_by_pdb", false)
                }
                Ok(EvictionOutcome::DryRun) => ("dry_run", false),
                Err(node_agent_kube::evict::EvictError::Protected { reason, .. }) => {
                    tracing::warn!(pod = %uid, %reason, "eviction refused: protected pod");
                    ("refused", false)
                }
                Err(err) => {
                    tracing::warn!(pod = %uid, error = %err, "eviction failed");
                    ("failed", false)
                }
            };
            metrics.eviction(request.signal.as_str(), result);
            let mut record = base;
            if let Record::Eviction {
                result: r, time, ..
            } = &mut record
            {
                *r = result.to_string();
                *time = crate::sys::now_rfc3339();
            }
            live.publish(&record);
            // As the kubelet does: wait for the pod's cgroup to go before the next eviction.
            if gone_wait {
                if let Some(dir) = cgroup_dir {
                    let _ = node_agent_kube::pacing::wait_until_gone(
                        || {
                            let dir = dir.clone();
                            async move { !dir.exists() }
                        },
                        wait,
                        Duration::from_millis(100),
                    )
                    .await;
                }
            }
            let _ = finished.send(Finished { uid }).await;
        });
    }

    pub(super) fn publish_eviction(&self, mut record: Record, result: &str) {
        if let Record::Eviction {
            result: r,
            signal,
            namespace,
            name,
            ..
        } = &mut record
        {
            *r = result.to_string();
            self.metrics.eviction(signal, result);
            tracing::info!(pod = %format!("{namespace}/{name}"), signal = %signal, result, "eviction decision");
        }
        self.live.publish(&record);
    }

    /// The observed value of the eviction's signal at the last reading.
    pub(super) fn state_observed(&self, e: &node_agent_policy::Eviction) -> i64 {
        e.available.value()
    }
}
