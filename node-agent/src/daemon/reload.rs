//! Re-reading the config on SIGHUP or when the file changes. A new config takes effect whole
//! and at once — the executor's mode and pacing, exclusions, intervals, thresholds (kernel lines
//! re-armed), fork limits on every tracked cgroup, signal sources, the cluster connection — or
//! it is refused whole: an invalid file, naming what is wrong, or a change of a setting that
//! cannot change while the agent runs, naming that setting. Never a half-applied config.

use node_agent_policy::{EvictionConfig, PolicyState};

use super::{
    config::AgentConfig,
    feed::{same_connection, Cluster},
    wiring::{executor_settings, fork_limit},
    Daemon, Timers, Trigger,
};

/// The setting a reload may not change (the listener, the socket and the ring are bound or
/// sized at start; the node cgroup anchors every reading; a cluster cannot appear or vanish
/// under the loop), if the new config changes one.
pub fn unchangeable(old: &AgentConfig, new: &AgentConfig) -> Option<&'static str> {
    let (o, n) = (&old.settings, &new.settings);
    if o.listen != n.listen {
        Some("agent.listen")
    } else if o.trace_socket != n.trace_socket {
        Some("agent.trace_socket")
    } else if o.ring_bytes != n.ring_bytes {
        Some("agent.ring_bytes")
    } else if o.node_cgroup != n.node_cgroup {
        Some("agent.node_cgroup")
    } else if old.kubernetes.is_some() != new.kubernetes.is_some() {
        Some("kubernetes (the section added or removed)")
    } else {
        None
    }
}

/// The policy's memory under new thresholds. Thresholds are known by index; one that stays
/// (same signal, hard or soft alike) keeps since when it was met and whether it was acted on,
/// so a reload neither restarts a grace period nor drops a minimum reclaim.
pub fn remap_state(old: &EvictionConfig, new: &EvictionConfig, state: &PolicyState) -> PolicyState {
    let find = |i: usize| {
        let t = &new.thresholds()[i];
        old.thresholds()
            .iter()
            .position(|o| o.signal == t.signal && o.is_hard() == t.is_hard())
    };
    let mut next = PolicyState {
        conditions_last_observed_at: state.conditions_last_observed_at.clone(),
        ..PolicyState::default()
    };
    for i in 0..new.thresholds().len() {
        let Some(j) = find(i) else { continue };
        if let Some(at) = state.thresholds_first_observed_at.get(&j) {
            next.thresholds_first_observed_at.insert(i, *at);
        }
        if state.thresholds_acted_on.contains(&j) {
            next.thresholds_acted_on.push(i);
        }
    }
    next
}

impl Daemon {
    pub(super) fn config_changed(&mut self) -> bool {
        let Some(path) = &self.source.path else {
            return false;
        };
        let mtime = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        if mtime != self.source.mtime {
            self.source.mtime = mtime;
            return true;
        }
        false
    }

    /// Re-reads the config and applies all of it, or refuses it and keeps the running one.
    pub(super) async fn reload(&mut self, why: &str) {
        let Some(path) = self.source.path.clone() else {
            tracing::info!(
                reason = why,
                "no config file to reload (standalone defaults)"
            );
            return;
        };
        // This reading covers the file as it is now: the change watcher need not read it again.
        self.source.mtime = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
        let metrics = self.telemetry.metrics.clone();
        // The same machine checks as at start, against the node cgroup in use.
        let loaded = AgentConfig::load(&path, &self.source.overrides).and_then(|new| {
            super::config::checks::check_on_machine(
                &new.settings,
                &self.layout.memory,
                &self.node.node_dir,
            )?;
            Ok(new)
        });
        let new = match loaded {
            Ok(new) => new,
            Err(e) => {
                metrics.config_reload("invalid");
                let chain =
                    std::iter::successors(Some(&e as &dyn std::error::Error), |e| e.source())
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(": ");
                tracing::error!(reason = why, error = %chain, "invalid config; keeping the previous one");
                return;
            }
        };
        if let Some(field) = unchangeable(&self.config, &new) {
            metrics.config_reload("refused");
            tracing::error!(reason = why, field, "config reload refused: {field} cannot change while the agent runs (restart it to change this); keeping the previous config");
            return;
        }
        // A new way to reach the cluster (or a new pod refresh interval): connected before
        // anything changes, so a bad CA file refuses the reload instead of half-applying it.
        let reconnect = match (&self.config.kubernetes, &new.kubernetes) {
            (Some(old), Some(k))
                if !same_connection(old, k)
                    || self.config.settings.pod_refresh_interval
                        != new.settings.pod_refresh_interval =>
            {
                match Cluster::connect(
                    k,
                    new.settings.pod_refresh_interval,
                    self.kube_counters.clone(),
                    metrics.clone(),
                    self.telemetry.health.clone(),
                ) {
                    Ok(c) => Some(c),
                    Err(e) => {
                        metrics.config_reload("refused");
                        tracing::error!(reason = why, error = %e, "config reload refused: the new kubernetes connection cannot be made; keeping the previous config");
                        return;
                    }
                }
            }
            _ => None,
        };
        let mut generation = self.acts.settings.borrow().generation;
        if let Some(cluster) = reconnect {
            self.cluster = Some(cluster);
            generation += 1;
        }
        // The executor first: dry run and exclusions hold from this moment.
        let settings = executor_settings(
            &new,
            self.cluster.as_ref(),
            &self.source.overrides,
            generation,
        );
        self.acts.settings.send_replace(settings);

        self.policy = remap_state(&self.config.eviction, &new.eviction, &self.policy);
        let old = std::mem::replace(&mut self.config, new);
        let new = &self.config;
        self.node.memory_capacity = new.settings.memory_capacity;
        self.node.nodefs = new.settings.nodefs_path.clone();
        self.node.imagefs = new.settings.imagefs_path.clone();
        let (o, n) = (&old.settings, &new.settings);
        if (o.resync_interval, o.pressure_poll_interval)
            != (n.resync_interval, n.pressure_poll_interval)
        {
            self.timers = Timers::new(new);
        }
        let limit = fork_limit(new);
        if let Err(e) = self
            .kernel
            .tracker
            .set_fork_limit(&mut self.kernel.programs, limit)
        {
            tracing::error!(error = %e, "applying the new fork limit to the tracked cgroups");
        }
        // Thresholds at once: every kernel line is written anew at the next reading (now).
        self.kernel.triggers.forget();
        self.sync_allocatable();
        self.set_pid_trigger();
        self.acts.state.reset_reported();
        super::kubelet::warn_if_kubelet_acts_first(&self.config, &self.node);
        self.acts
            .state
            .set_node_reclaim(super::wiring::node_reclaim(&self.config));
        metrics.config_reload("ok");
        tracing::info!(
            reason = why,
            dry_run = self.config.dry_run(),
            "config reloaded; every setting applies now"
        );
        self.evaluate(Trigger::named("reload")).await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::daemon::config::Overrides;

    fn config(text: &str) -> AgentConfig {
        let o = Overrides {
            node_name: Some("n1".into()),
            ..Overrides::default()
        };
        AgentConfig::parse(text, &o).unwrap()
    }

    #[test]
    fn settings_bound_at_start_refuse_the_reload_by_name() {
        let base =
            "eviction: {evictionHard: {memory.available: 1Gi}}\nagent: {listen: '127.0.0.1:1'}\n";
        let rows = [
            ("agent: {listen: '127.0.0.1:2'}", Some("agent.listen")),
            ("agent: {listen: '127.0.0.1:1', trace_socket: /tmp/other.sock}", Some("agent.trace_socket")),
            ("agent: {listen: '127.0.0.1:1', ring_bytes: 8192}", Some("agent.ring_bytes")),
            ("agent: {listen: '127.0.0.1:1', node_cgroup: /elsewhere}", Some("agent.node_cgroup")),
            ("agent: {listen: '127.0.0.1:1'}\nkubernetes: {}", Some("kubernetes (the section added or removed)")),
            ("agent: {listen: '127.0.0.1:1', dry_run: true, resync_interval: 1s, fork_limit: 5}\neviction: {evictionHard: {memory.available: 2Gi}}", None),
        ];
        for (new, want) in rows {
            assert_eq!(unchangeable(&config(base), &config(new)), want, "{new}");
        }
    }

    #[test]
    fn thresholds_that_stay_keep_their_grace_period_and_reclaim() {
        let old = config("eviction: {evictionHard: {memory.available: 1Gi, pid.available: 100}, evictionSoft: {nodefs.available: 10%}, evictionSoftGracePeriod: {nodefs.available: 1m}}");
        let new = config("eviction: {evictionHard: {pid.available: 50}, evictionSoft: {nodefs.available: 20%}, evictionSoftGracePeriod: {nodefs.available: 2m}}");
        let index = |c: &AgentConfig, s: &str, hard: bool| {
            c.eviction
                .thresholds()
                .iter()
                .position(|t| t.signal.as_str() == s && t.is_hard() == hard)
                .unwrap()
        };
        let mut state = PolicyState::default();
        let t = Duration::from_secs(7);
        for (s, hard) in [
            ("memory.available", true),
            ("pid.available", true),
            ("nodefs.available", false),
        ] {
            state
                .thresholds_first_observed_at
                .insert(index(&old, s, hard), t);
        }
        state
            .thresholds_acted_on
            .push(index(&old, "pid.available", true));
        let next = remap_state(&old.eviction, &new.eviction, &state);
        let (pid, nodefs) = (
            index(&new, "pid.available", true),
            index(&new, "nodefs.available", false),
        );
        assert_eq!(next.thresholds_first_observed_at.get(&pid), Some(&t));
        assert_eq!(next.thresholds_first_observed_at.get(&nodefs), Some(&t));
        assert_eq!(next.thresholds_acted_on, vec![pid]);
        assert_eq!(
            next.thresholds_first_observed_at.len(),
            2,
            "the removed memory threshold is forgotten"
        );
    }
}
