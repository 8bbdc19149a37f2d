//! Kernel-side bookkeeping: tracked cgroups and the kernel triggers.

use super::observe::{read_node, NodeReading};
use super::{triggers, Daemon};

impl Daemon {
    /// Tracks cgroups that appeared (fork counts and fork-storm limits for workloads) and
    /// forgets those that went away.
    pub(super) fn track_new_cgroups(&mut self) -> anyhow::Result<()> {
        let changes = self.index.refresh()?;
        for id in &changes.removed {
            self.programs.untrack_cgroup(*id)?;
            self.tracked.remove(id);
        }
        let ids: Vec<u64> = if self.tracked.is_empty() {
            self.index.entries().map(|(id, _)| id).collect()
        } else {
            changes.added
        };
        for id in ids {
            if self.tracked.len() >= node_agent_common::MAX_TRACKED_CGROUPS as usize / 2 {
                break;
            }
            let Some(entry) = self.index.lookup(id) else {
                continue;
            };
            if entry.path.as_os_str().is_empty() {
                continue;
            }
            self.programs.track_cgroup(id)?;
            if self.config.settings.fork_limit > 0 {
                self.programs.set_fork_limit(
                    id,
                    self.config.settings.fork_limit,
                    self.config.settings.fork_window,
                )?;
            }
            self.tracked.insert(id);
        }
        self.metrics.set_tracked_cgroups(self.tracked.len() as i64);
        self.triggers.refresh_targets(&self.index);
        Ok(())
    }

    /// The in-kernel `pid.available` check, at the most lenient configured threshold.
    pub(super) fn set_pid_trigger(&mut self) -> anyhow::Result<()> {
        let reading = read_node(&self.sources)?;
        let Some(limit) = reading.capacity.pids else {
            return Ok(());
        };
        let threshold = triggers::most_lenient(
            &self.config.eviction,
            node_agent_policy::Signal::PidAvailable,
            limit,
        );
        let threshold = threshold.map_or(0, |t| t.max(1) as u64);
        self.programs
            .set_pid_threshold(limit as u64, threshold, (threshold / 20).max(10))?;
        Ok(())
    }

    pub(super) fn rearm_memory_trigger(&mut self, reading: &NodeReading) {
        let version = self.layout.memory.version();
        if let Err(e) =
            self.triggers
                .rearm(&mut self.programs, &self.config.eviction, reading, version)
        {
            tracing::warn!(error = %e, "setting the kernel memory trigger");
        }
    }
}
