//! The one cgroup tracker of the daemon and of `trace`: keeps the cgroup index current, has the
//! kernel programs count forks and exits of every cgroup (up to the kernel maps' size) and
//! watch each workload cgroup's fork rate.
//!
//! The kernel maps hold [`MAX_TRACKED_CGROUPS`] cgroups. Cgroups beyond that are left out,
//! counted and logged once when the cap is reached; as soon as room frees, a full pass over the
//! index tracks them (not only the cgroups that are new since the last rescan).

use std::{collections::HashSet, path::PathBuf, time::Duration};

use node_agent_common::MAX_TRACKED_CGROUPS;

use crate::cgroup::{CgroupIndex, IndexError, RescanSchedule};
use crate::ebpf::{ControlError, KernelPrograms};

/// What the tracker asks of the kernel programs ([`KernelPrograms`] in the agent; a recorder
/// in tests).
pub trait CgroupControl {
    fn track_cgroup(&mut self, cgroup: u64) -> Result<(), ControlError>;
    fn untrack_cgroup(&mut self, cgroup: u64) -> Result<(), ControlError>;
    fn set_fork_limit(
        &mut self,
        cgroup: u64,
        max_forks: u64,
        window: Duration,
    ) -> Result<(), ControlError>;
}

impl CgroupControl for KernelPrograms {
    fn track_cgroup(&mut self, cgroup: u64) -> Result<(), ControlError> {
        KernelPrograms::track_cgroup(self, cgroup)
    }
    fn untrack_cgroup(&mut self, cgroup: u64) -> Result<(), ControlError> {
        KernelPrograms::untrack_cgroup(self, cgroup)
    }
    fn set_fork_limit(
        &mut self,
        cgroup: u64,
        max_forks: u64,
        window: Duration,
    ) -> Result<(), ControlError> {
        KernelPrograms::set_fork_limit(self, cgroup, max_forks, window)
    }
}

/// A full walk of cgroupfs when no cgroup change was reported for this long.
pub const SAFETY_RESCAN: Duration = Duration::from_secs(60);

/// A fork storm: more than `max_forks` forks within `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForkLimit {
    pub max_forks: u64,
    pub window: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum TrackError {
    #[error("rescanning the cgroup hierarchy")]
    Index(#[from] IndexError),
    #[error("telling the kernel programs which cgroups to watch")]
    Control(#[from] ControlError),
}

/// What a refresh found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tracked {
    /// Cgroups tracked now.
    pub tracked: usize,
    /// Cgroups in the index left untracked because the kernel maps are full.
    pub untracked: usize,
    /// The cap was reached by this refresh (it was not at the previous one).
    pub cap_reached: bool,
}

pub struct CgroupTracker {
    index: CgroupIndex,
    tracked: HashSet<u64>,
    cap: usize,
    untracked: usize,
    fork_limit: Option<ForkLimit>,
    rescan: RescanSchedule,
}

impl CgroupTracker {
    /// Scans the hierarchy at `root`; nothing is tracked until [`Self::refresh`].
    pub fn new(
        root: impl Into<PathBuf>,
        fork_limit: Option<ForkLimit>,
    ) -> Result<Self, TrackError> {
        Self::with_cap(root, fork_limit, MAX_TRACKED_CGROUPS as usize)
    }

    pub fn with_cap(
        root: impl Into<PathBuf>,
        fork_limit: Option<ForkLimit>,
        cap: usize,
    ) -> Result<Self, TrackError> {
        Ok(Self {
            index: CgroupIndex::scan(root)?,
            tracked: HashSet::new(),
            cap,
            untracked: 0,
            fork_limit,
            rescan: RescanSchedule::new(SAFETY_RESCAN, std::time::Instant::now()),
        })
    }

    pub fn index(&self) -> &CgroupIndex {
        &self.index
    }

    /// The kernel reported a cgroup created or removed: rescan at the next [`Self::refresh_if_due`].
    pub fn mark_changed(&mut self) {
        self.rescan.mark();
    }

    /// Rescans when a change was reported or the safety interval passed.
    pub fn refresh_if_due(
        &mut self,
        programs: &mut impl CgroupControl,
    ) -> Result<Option<Tracked>, TrackError> {
        if self.rescan.due(std::time::Instant::now()) {
            return self.refresh(programs).map(Some);
        }
        Ok(None)
    }

    /// Rescans now: forgets cgroups that went, tracks those that came, and when cgroups were
    /// left out for lack of room, tries every one of them again.
    pub fn refresh(&mut self, programs: &mut impl CgroupControl) -> Result<Tracked, TrackError> {
        let changes = self.index.refresh()?;
        for id in &changes.removed {
            if self.tracked.remove(id) {
                programs.untrack_cgroup(*id)?;
            }
        }
        let candidates: Vec<u64> = if self.untracked > 0 || self.tracked.is_empty() {
            self.index.entries().map(|(id, _)| id).collect()
        } else {
            changes.added
        };
        self.track(programs, candidates)
    }

    fn track(
        &mut self,
        programs: &mut impl CgroupControl,
        candidates: Vec<u64>,
    ) -> Result<Tracked, TrackError> {
        let was_full = self.untracked > 0;
        for id in candidates {
            if self.tracked.contains(&id) || self.tracked.len() >= self.cap {
                continue;
            }
            let Some(entry) = self.index.lookup(id) else {
                continue;
            };
            programs.track_cgroup(id)?;
            // The root's fork rate is the whole node's; storms are about one workload.
            if let Some(limit) = self
                .fork_limit
                .filter(|_| !entry.path.as_os_str().is_empty())
            {
                programs.set_fork_limit(id, limit.max_forks, limit.window)?;
            }
            self.tracked.insert(id);
        }
        self.untracked = self.index.len().saturating_sub(self.tracked.len());
        let report = Tracked {
            tracked: self.tracked.len(),
            untracked: self.untracked,
            cap_reached: self.untracked > 0 && !was_full,
        };
        if report.cap_reached {
            tracing::warn!(
                cap = self.cap,
                untracked = self.untracked,
                "tracking cap reached: the kernel maps are full; the cgroups beyond it are tracked as soon as room frees"
            );
        } else if was_full && self.untracked == 0 {
            tracing::info!(
                tracked = self.tracked.len(),
                "every cgroup is tracked again"
            );
        }
        Ok(report)
    }

    /// A new fork limit (or none) for every tracked workload cgroup, at once. Removing limits
    /// untracks and tracks each cgroup again, which also drops its memory threshold: the
    /// caller re-arms those.
    pub fn set_fork_limit(
        &mut self,
        programs: &mut impl CgroupControl,
        limit: Option<ForkLimit>,
    ) -> Result<(), TrackError> {
        if limit == self.fork_limit {
            return Ok(());
        }
        self.fork_limit = limit;
        for &id in &self.tracked {
            let is_root = self
                .index
                .lookup(id)
                .is_none_or(|e| e.path.as_os_str().is_empty());
            match limit {
                Some(l) if !is_root => programs.set_fork_limit(id, l.max_forks, l.window)?,
                Some(_) => {}
                // No limit: the programs have no "remove the limit" call, and untracking drops
                // the cgroup's limit with its counts; tracking it again starts its counts anew.
                None => {
                    programs.untrack_cgroup(id)?;
                    programs.track_cgroup(id)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// What the tracker told the "kernel": tracked ids and their fork limits.
    #[derive(Default)]
    struct Recorder {
        tracked: BTreeMap<u64, Option<u64>>,
    }

    impl CgroupControl for Recorder {
        fn track_cgroup(&mut self, cgroup: u64) -> Result<(), ControlError> {
            self.tracked.insert(cgroup, None);
            Ok(())
        }
        fn untrack_cgroup(&mut self, cgroup: u64) -> Result<(), ControlError> {
            self.tracked.remove(&cgroup);
            Ok(())
        }
        fn set_fork_limit(
            &mut self,
            cgroup: u64,
            max_forks: u64,
            _: Duration,
        ) -> Result<(), ControlError> {
            self.tracked.insert(cgroup, Some(max_forks));
            Ok(())
        }
    }

    fn id(p: &std::path::Path) -> u64 {
        crate::cgroup::cgroup_id(p).unwrap()
    }

    #[test]
    fn cgroups_beyond_the_cap_are_tracked_once_room_frees() {
        let tmp = tempfile::tempdir().unwrap();
        let dirs: Vec<_> = (0..4).map(|i| tmp.path().join(format!("w{i}"))).collect();
        for d in &dirs {
            std::fs::create_dir(d).unwrap();
        }
        let limit = ForkLimit {
            max_forks: 50,
            window: Duration::from_secs(1),
        };
        // The root and four workloads; room for three.
        let mut tracker = CgroupTracker::with_cap(tmp.path(), Some(limit), 3).unwrap();
        let mut kernel = Recorder::default();
        let first = tracker.refresh(&mut kernel).unwrap();
        assert_eq!(
            first,
            Tracked {
                tracked: 3,
                untracked: 2,
                cap_reached: true
            }
        );
        let again = tracker.refresh(&mut kernel).unwrap();
        assert!(
            !again.cap_reached,
            "the cap is reported when reached, not on every rescan"
        );
        assert_eq!(again.untracked, 2);

        let left_out: Vec<u64> = dirs
            .iter()
            .map(|d| id(d))
            .filter(|i| !kernel.tracked.contains_key(i))
            .collect();
        let gone: Vec<&std::path::PathBuf> = dirs
            .iter()
            .filter(|d| kernel.tracked.contains_key(&id(d)))
            .take(2)
            .collect();
        for d in &gone {
            std::fs::remove_dir(d).unwrap();
        }
        let after = tracker.refresh(&mut kernel).unwrap();
        assert_eq!(
            (after.tracked, after.untracked),
            (3, 0),
            "room freed: a full pass tracks the rest"
        );
        for i in left_out {
            assert!(
                kernel.tracked.contains_key(&i),
                "{i} tracked once room freed"
            );
        }
        assert!(
            kernel
                .tracked
                .iter()
                .all(|(i, l)| (*i == id(tmp.path())) == l.is_none()),
            "limits on workloads, never on the root: {:?}",
            kernel.tracked
        );
    }

    #[test]
    fn a_new_fork_limit_reaches_every_tracked_cgroup() {
        let tmp = tempfile::tempdir().unwrap();
        for i in 0..3 {
            std::fs::create_dir(tmp.path().join(format!("w{i}"))).unwrap();
        }
        let mut tracker = CgroupTracker::new(tmp.path(), None).unwrap();
        let mut kernel = Recorder::default();
        tracker.refresh(&mut kernel).unwrap();
        assert!(kernel.tracked.values().all(Option::is_none));
        let limit = ForkLimit {
            max_forks: 7,
            window: Duration::from_secs(1),
        };
        tracker.set_fork_limit(&mut kernel, Some(limit)).unwrap();
        let limited = kernel.tracked.values().filter(|l| **l == Some(7)).count();
        assert_eq!(
            (kernel.tracked.len(), limited),
            (4, 3),
            "every workload, not the root"
        );
        tracker.set_fork_limit(&mut kernel, None).unwrap();
        assert!(
            kernel.tracked.values().all(Option::is_none),
            "removed again, still tracked"
        );
        assert_eq!(kernel.tracked.len(), 4);
    }
}
