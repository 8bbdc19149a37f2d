//! The daemon's kernel part: the kernel feed (programs, tracked cgroups, ring buffer) and the
//! lines it arms in the kernel (memory headroom, `pid.available`), with the kernel's own
//! counters exported.

use node_agent_policy::{EvictionConfig, Signal};

use crate::{
    config::AgentConfig,
    observe::node::{NodeLayout, NodeReading},
    observe::triggers::{self, Triggers},
    run::report::Reporter,
};
use crate::{
    ebpf::MemoryMechanism,
    kernel::{ForkLimit, Housekeeping, KernelFeed, Tracked},
};

/// The fork limit the settings ask for (0: none).
pub fn fork_limit(config: &AgentConfig) -> Option<ForkLimit> {
    (config.settings.fork_limit > 0).then_some(ForkLimit {
        max_forks: config.settings.fork_limit,
        window: config.settings.fork_window,
    })
}

pub struct KernelSide {
    pub feed: KernelFeed,
    pub triggers: Triggers,
}

impl KernelSide {
    pub fn new(feed: KernelFeed, layout: &NodeLayout) -> Self {
        let mut side = Self {
            triggers: Triggers::new(layout),
            feed,
        };
        side.triggers.refresh_targets(side.feed.index());
        side
    }

    /// Without an in-kernel memory mechanism, memory growth is seen only by polling.
    pub fn blind_to_memory(&self) -> bool {
        self.feed.memory_mechanism() == MemoryMechanism::Unavailable
    }

    /// The cgroups were rescanned: counted, and the memory lines' targets picked again.
    pub fn rescanned(&mut self, tracked: Tracked, report: &Reporter) {
        report.metrics.set_tracked_cgroups(
            tracked.tracked as i64,
            tracked.untracked as i64,
            tracked.cap_reached,
        );
        self.triggers.refresh_targets(self.feed.index());
    }

    /// Losses and rescans, and the kernel's counters onto /metrics. A map that cannot be read
    /// leaves the last values: logged, never fatal to the loop.
    pub fn housekeeping(&mut self, report: &Reporter) {
        let Housekeeping {
            lost,
            rescanned,
            errors,
        } = self.feed.housekeeping();
        if let Some(lost) = lost {
            report.metrics.ring_lost(lost.lost);
            tracing::warn!(lost = lost.lost, "kernel events lost: ring buffer full");
            report.live.publish(&crate::trace::Record::EventsLost {
                time: crate::sys::now_rfc3339(),
                lost: lost.lost,
                total_per_cpu: lost.total_per_cpu,
            });
        }
        if let Some(t) = rescanned {
            self.rescanned(t, report);
        }
        for e in &errors {
            tracing::warn!(error = %crate::error_chain(e), "kernel feed housekeeping");
        }
        let programs = self.feed.programs();
        match (programs.sent_events(), programs.sampler_stats()) {
            (Ok(sent), Ok(sampler)) => report
                .metrics
                .set_kernel_counters(sent.iter().sum(), sampler),
            (Err(error), _) | (_, Err(error)) => {
                tracing::debug!(%error, "the kernel programs' counters could not be read");
            }
        }
    }

    /// The host's `pid_max` as the kernel programs last saw it, where it is not one global
    /// figure (Linux 6.14 and later); a map that cannot be read is logged and says nothing.
    pub fn host_pid_max(&mut self) -> Option<u32> {
        self.feed
            .programs()
            .host_pid_max()
            .inspect_err(
                |e| tracing::warn!(error = %e, "reading the host's pid_max from the kernel"),
            )
            .ok()
            .flatten()
    }

    /// Rescans the cgroups now if one was made or removed since the last scan.
    pub fn rescan_if_changed(&mut self, report: &Reporter) {
        match self.feed.rescan_if_changed() {
            Ok(Some(tracked)) => self.rescanned(tracked, report),
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %crate::error_chain(&e), "rescanning cgroups"),
        }
    }

    /// The in-kernel `pid.available` check, at the most lenient configured threshold.
    pub fn set_pid_trigger(&mut self, eviction: &EvictionConfig, reading: &NodeReading) {
        let Some(limit) = reading.capacity.pids else {
            tracing::warn!("pid.available could not be read: no kernel PID trigger");
            return;
        };
        let threshold = triggers::most_lenient(eviction, Signal::PidAvailable, limit);
        let threshold = threshold.map_or(0, |t| t.max(1) as u64);
        if let Err(e) = self.feed.programs().set_pid_threshold(
            limit as u64,
            threshold,
            (threshold / 20).max(10),
        ) {
            tracing::warn!(error = %e, "setting the kernel PID trigger");
        }
    }

    /// The memory lines from this reading.
    pub fn rearm(&mut self, eviction: &EvictionConfig, reading: &NodeReading, layout: &NodeLayout) {
        let Self { feed, triggers } = self;
        if let Err(e) = triggers.rearm(feed.programs(), eviction, reading, layout) {
            tracing::warn!(error = %e, "setting the kernel memory trigger");
        }
    }
}
