//! Re-reading the config on SIGHUP or when the file changes.

use super::config::AgentConfig;
use super::Daemon;

impl Daemon {
    pub(super) fn config_changed(&mut self) -> bool {
        let Some(path) = &self.config_path else {
            return false;
        };
        let mtime = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        if mtime != self.config_mtime {
            self.config_mtime = mtime;
            return true;
        }
        false
    }

    /// Re-reads the config; an invalid one is refused whole and the old one stays.
    pub(super) fn reload(&mut self, why: &str) {
        let Some(path) = self.config_path.clone() else {
            tracing::info!(
                reason = why,
                "no config file to reload (standalone defaults)"
            );
            return;
        };
        // This reading covers the file as it is now: the change watcher need not read it again.
        self.config_mtime = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
        match AgentConfig::load(&path, &self.overrides) {
            Ok(new) => {
                let restart_needed = new.settings.listen != self.config.settings.listen
                    || new.settings.trace_socket != self.config.settings.trace_socket
                    || new.settings.ring_bytes != self.config.settings.ring_bytes
                    || new.settings.node_cgroup != self.config.settings.node_cgroup
                    || new.kubernetes.is_some() != self.config.kubernetes.is_some();
                if restart_needed {
                    tracing::warn!("config reloaded; listen, trace_socket, ring_bytes, node_cgroup and the kubernetes section take effect on restart");
                }
                let mut applied = new;
                applied.settings.listen = self.config.settings.listen;
                applied.settings.trace_socket = self.config.settings.trace_socket.clone();
                applied.settings.ring_bytes = self.config.settings.ring_bytes;
                applied.settings.node_cgroup = self.config.settings.node_cgroup.clone();
                if self.config.kubernetes.is_some() != applied.kubernetes.is_some() {
                    applied.kubernetes = self.config.kubernetes.clone();
                }
                self.sources.memory_capacity = applied.settings.memory_capacity;
                self.sources.nodefs = applied.settings.nodefs_path.clone();
                self.sources.imagefs = applied.settings.imagefs_path.clone();
                self.config = applied;
                self.triggers.forget();
                if let Err(e) = self.set_pid_trigger() {
                    tracing::warn!(error = %e, "re-arming the PID trigger");
                }
                self.metrics.config_reload(true);
                tracing::info!(reason = why, "config reloaded");
            }
            Err(e) => {
                self.metrics.config_reload(false);
                let chain =
                    std::iter::successors(Some(&e as &dyn std::error::Error), |e| e.source())
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(": ");
                tracing::error!(reason = why, error = %chain, "invalid config; keeping the previous one");
            }
        }
    }
}
