//! The kernel feed: the loaded programs, the cgroups they track and their ring buffer, turned
//! into attributed events and loss counts. One feed serves the daemon and `trace` alike.
//!
//! - [`tracker`]: which cgroups the programs count and watch, rescanned as cgroups come and go.
//! - [`KernelFeed::attribute`]: a kernel event attributed to its cgroup, pod and container
//!   (each probe's own part of that is in [`crate::probes`]).
//!
//! Reading is split in two so a caller can attribute with names it may not hold across an
//! await: [`KernelFeed::recv`] waits for the next batch of records, [`KernelFeed::attribute`]
//! turns it into events (rescanning first when an event names a cgroup that came after the
//! last rescan). [`KernelFeed::housekeeping`] counts ring-buffer losses and rescans when due.

pub mod tracker;

use std::path::Path;

pub use crate::probes::{attribute, Attributed, NoNames, PodNames};
pub use tracker::{CgroupControl, CgroupTracker, ForkLimit, TrackError, Tracked};

use crate::{
    cgroup::CgroupIndex,
    ebpf::{DecodeError, EventStream, KernelEvent, KernelPrograms, LoadError, LoadOptions},
};

#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Track(#[from] TrackError),
    #[error("reading the kernel programs' ring buffer")]
    Ring(#[source] std::io::Error),
    #[error(transparent)]
    Control(#[from] crate::ebpf::ControlError),
}

/// Records read from the ring, not yet attributed.
pub struct Records(Vec<Result<KernelEvent, DecodeError>>);

/// A batch of records, attributed.
#[derive(Debug, Default)]
pub struct Batch {
    pub events: Vec<Attributed>,
    /// Records that did not decode (counted and logged by the caller).
    pub undecodable: Vec<DecodeError>,
    /// The cgroups were rescanned for this batch (an event named a new one).
    pub rescanned: Option<Tracked>,
}

/// Ring-buffer records lost since the previous housekeeping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost {
    pub lost: u64,
    /// The kernel's running totals, per CPU.
    pub total_per_cpu: Vec<u64>,
}

/// What one housekeeping pass found.
#[derive(Debug, Default)]
pub struct Housekeeping {
    pub lost: Option<Lost>,
    /// The cgroups were rescanned (a change was reported or the safety interval passed).
    pub rescanned: Option<Tracked>,
    /// Why the losses or the rescan could not be read; the feed goes on.
    pub errors: Vec<FeedError>,
}

pub struct KernelFeed {
    programs: KernelPrograms,
    tracker: CgroupTracker,
    ring: EventStream,
    lost_before: u64,
    page_size: u64,
}

impl KernelFeed {
    /// Loads the programs, tracks every cgroup below `root` (the memory hierarchy's mount) and
    /// opens the ring buffer.
    pub fn start(
        options: &LoadOptions,
        root: &Path,
        fork_limit: Option<ForkLimit>,
    ) -> Result<(Self, Tracked), FeedError> {
        let mut programs = KernelPrograms::load_with(options)?;
        let mut tracker = CgroupTracker::new(root, fork_limit)?;
        let tracked = tracker.refresh(&mut programs)?;
        let ring = programs.events()?;
        let lost_before = programs.lost_events()?.iter().sum();
        let feed = Self {
            programs,
            tracker,
            ring,
            lost_before,
            page_size: crate::sys::page_size(),
        };
        Ok((feed, tracked))
    }

    /// The next records; waits until there are some.
    pub async fn recv(&mut self) -> Result<Records, FeedError> {
        self.ring
            .next_batch()
            .await
            .map(Records)
            .map_err(FeedError::Ring)
    }

    /// Attributes `records` with the pod names known now.
    pub fn attribute(&mut self, records: Records, names: &dyn PodNames) -> Batch {
        let mut batch = Batch::default();
        let mut decoded = Vec::new();
        for record in records.0 {
            match record {
                Ok(KernelEvent::CgroupChange(_)) => self.tracker.mark_changed(),
                Ok(event) => decoded.push(event),
                Err(e) => batch.undecodable.push(e),
            }
        }
        // A cgroup newer than the last rescan (a pod that just started): rescan before
        // attributing, so the event names its pod.
        let unknown = decoded.iter().any(|e| {
            e.new_cgroup()
                .is_some_and(|id| self.tracker.index().lookup(id).is_none())
        });
        if unknown {
            self.tracker.mark_changed();
            match self.tracker.refresh_if_due(&mut self.programs) {
                Ok(t) => batch.rescanned = t,
                Err(e) => tracing::warn!(error = %crate::error_chain(&e), "rescanning cgroups"),
            }
        }
        let index = self.tracker.index();
        batch.events = decoded
            .iter()
            .filter_map(|e| attribute(e, index, names, self.page_size))
            .collect();
        batch
    }

    /// Counts ring-buffer losses since the last call, and rescans the cgroups when due.
    pub fn housekeeping(&mut self) -> Housekeeping {
        let mut done = Housekeeping::default();
        match self.programs.lost_events() {
            Ok(per_cpu) => {
                let total: u64 = per_cpu.iter().sum();
                if total > self.lost_before {
                    done.lost = Some(Lost {
                        lost: total - self.lost_before,
                        total_per_cpu: per_cpu,
                    });
                    self.lost_before = total;
                }
            }
            Err(e) => done.errors.push(e.into()),
        }
        match self.tracker.refresh_if_due(&mut self.programs) {
            Ok(t) => done.rescanned = t,
            Err(e) => done.errors.push(e.into()),
        }
        done
    }

    /// Rescans the cgroups now if a change was reported (or the safety interval passed).
    pub fn rescan_if_changed(&mut self) -> Result<Option<Tracked>, TrackError> {
        self.tracker.refresh_if_due(&mut self.programs)
    }

    /// Rescans the cgroups at the next housekeeping (or the next event naming a new one).
    pub fn mark_changed(&mut self) {
        self.tracker.mark_changed();
    }

    pub fn index(&self) -> &CgroupIndex {
        self.tracker.index()
    }

    /// The programs, for their control maps (lines, limits) and counters.
    pub fn programs(&mut self) -> &mut KernelPrograms {
        &mut self.programs
    }

    pub fn memory_mechanism(&self) -> crate::ebpf::MemoryMechanism {
        self.programs.memory_mechanism()
    }

    /// A new fork limit on every tracked cgroup.
    pub fn set_fork_limit(&mut self, limit: Option<ForkLimit>) -> Result<(), TrackError> {
        self.tracker.set_fork_limit(&mut self.programs, limit)
    }
}
