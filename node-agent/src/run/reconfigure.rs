//! Applying a reload: a new config taken whole, or refused whole with the running one kept
//! (see [`super::reload`] for where candidates come from). Everything that can fail (the new
//! cluster connection, the new filesystem probes) is made before anything changes; then the
//! executor first, the policy's state, logging, the node, timers, kernel lines and the
//! allocatable figure, and an evaluation at once.

use std::sync::Arc;

use crate::{
    config::reload::{remap_state, unchangeable, Candidate, Refusal},
    observe::feed::{same_connection, Cluster},
    observe::node::Filesystems,
    run::acting_config,
    run::core::Daemon,
    run::kernel_side::fork_limit,
    run::report::inspect_mode,
    run::wiring::check_kubelet,
};
use crate::{error_chain, telemetry::Trigger};

impl Daemon {
    /// A file taken asks for dry run: the executor holds from now, before the file is checked
    /// (its checks may wait on a hung filesystem). The running config is kept with dry run
    /// set; the file itself follows, applied whole or refused, and dry run stays either way.
    pub(super) fn dry_run_first(&mut self) {
        if self.config.current.dry_run() {
            return;
        }
        let mut config = self.config.current.clone();
        config.settings.dry_run = true;
        let now = self.now();
        acting_config::reconfigure(
            &mut self.acts,
            &config,
            self.kube.as_ref().map(|k| &k.cluster),
            &self.config.overrides,
            false,
            now,
        );
        self.config.current = config;
        self.report
            .inspect
            .set_mode(inspect_mode(&self.config.current));
        self.report.metrics.config_reload("dry_run_first");
        tracing::warn!("the config file asks for dry run: applied at once, before the file is checked; the rest of it follows (or is refused), and dry run stays");
    }

    /// Applies a new config whole, or refuses it whole and keeps the running one.
    pub(super) fn reload(&mut self, candidate: Candidate) {
        let why = candidate.why;
        let metrics = self.report.metrics.clone();
        let new = match candidate.config {
            Ok(new) => *new,
            Err(Refusal::Read(e)) if e.is_transient() => {
                metrics.config_reload("retrying");
                tracing::warn!(error = %error_chain(&e), "the config file could not be read for now (no fault of the file); keeping the running config and reading it again every second until it can be read");
                return;
            }
            Err(e) => {
                metrics.config_reload("invalid");
                tracing::error!(reason = why, error = %error_chain(&e), "invalid config; keeping the previous one");
                return;
            }
        };
        let old = &self.config.current;
        if let Some(field) = unchangeable(old, &new) {
            metrics.config_reload("refused");
            tracing::error!(reason = why, field, "config reload refused: {field} cannot change while the agent runs (restart it to change this); keeping the previous config");
            return;
        }
        // A new way to reach the cluster (or a new pod refresh interval): connected before
        // anything changes, so a bad CA file refuses the reload instead of half-applying it.
        let reconnect = match (&self.kube, &old.kubernetes, &new.kubernetes) {
            (Some(kube), Some(o), Some(k))
                if !same_connection(o, k)
                    || old.settings.pod_refresh_interval != new.settings.pod_refresh_interval =>
            {
                match Cluster::connect(
                    k,
                    new.settings.pod_refresh_interval,
                    kube.counters.clone(),
                    metrics.clone(),
                    self.report.health.clone(),
                ) {
                    Ok(c) => Some(c),
                    Err(e) => {
                        metrics.config_reload("refused");
                        tracing::error!(reason = why, error = %error_chain(&e), "config reload refused: the new kubernetes connection cannot be made; keeping the previous config");
                        return;
                    }
                }
            }
            _ => None,
        };
        // New filesystem probes before anything changes, for the same reason.
        let (o, n) = (&old.settings, &new.settings);
        let fs = if (&o.nodefs_path, &o.imagefs_path) != (&n.nodefs_path, &n.imagefs_path) {
            match Filesystems::new(&n.nodefs_path, n.imagefs_path.as_deref()) {
                Ok(fs) => Some(fs),
                Err(e) => {
                    metrics.config_reload("refused");
                    tracing::error!(reason = why, error = %e, "config reload refused: no thread for the new filesystem probes; keeping the previous config");
                    return;
                }
            }
        } else {
            None
        };
        let timers_change = (o.resync_interval, o.pressure_poll_interval)
            != (n.resync_interval, n.pressure_poll_interval);
        let reconnected = reconnect.is_some();
        if let (Some(kube), Some(cluster)) = (&mut self.kube, reconnect) {
            kube.reviewer
                .send_replace(Some(Arc::new(node_agent_kube::access::Reviewer::new(
                    cluster.api.clone(),
                ))));
            kube.cluster = cluster;
        }
        // The executor first: dry run and exclusions hold from this moment.
        let now = self.now();
        acting_config::reconfigure(
            &mut self.acts,
            &new,
            self.kube.as_ref().map(|k| &k.cluster),
            &self.config.overrides,
            reconnected,
            now,
        );
        metrics.set_hard_evictions_on_node(self.acts.kills_on_node());
        self.policy = remap_state(&old.eviction, &new.eviction, &self.policy);
        self.config.current = new;
        let config = &self.config.current;
        crate::logging::configure(config.settings.log_format, &config.settings.log_level);
        self.node.memory_capacity = config.settings.memory_capacity;
        if let Some(fs) = fs {
            self.node.fs = fs;
        }
        if timers_change {
            self.clock.set_intervals(config);
        }
        if let Err(e) = self.kernel.feed.set_fork_limit(fork_limit(config)) {
            tracing::error!(error = %error_chain(&e), "applying the new fork limit to the tracked cgroups");
        }
        // Thresholds at once: every kernel line is written anew at the next reading (now).
        self.kernel.triggers.forget();
        self.sync_allocatable();
        let reading = self.node.read();
        let config = &self.config.current;
        self.kernel.set_pid_trigger(&config.eviction, &reading);
        check_kubelet(config, &reading);
        metrics.config_reload("ok");
        self.report.inspect.set_mode(inspect_mode(config));
        tracing::info!(
            reason = why,
            dry_run = config.dry_run(),
            "config reloaded; every setting applies now"
        );
        self.evaluate(Trigger::Reload, None);
    }
}
