//! The kernel side of `memory.available`: a usage line on the workload cgroups such that the
//! kernel reports, the moment it happens, any growth that would take the node across its
//! most lenient memory threshold.
//!
//! The node's working set is not a kernel counter, but growth is: with headroom
//! `H = available − threshold` at the last reading, the node crosses once its cgroups grow by
//! `H`. So each target cgroup gets the line `usage + H`. The threshold is the nearest one still
//! ahead (the largest below `available`), so a node past its soft threshold is watched in the
//! kernel for its hard one, not only re-read every `pressurePollInterval`: at the fastest
//! growth this machine makes (2–3 GiB/s) a poll 100 ms late is 250 MiB late. Targets: the kubepods cgroup below the
//! node cgroup when the kubelet layout is present; else the node cgroup itself when it is not
//! the hierarchy's root (the root's counter does not include tasks living in it); else each
//! top-level cgroup, which catches one workload running away (growth spread over several is
//! caught by the next poll or re-sync). While the headroom is gone the lines stay where they
//! are, and the daemon re-reads the node every `pressurePollInterval` instead.
//!
//! `allocatableMemory.available` (allocatable − the kubepods cgroup's working set) has the same
//! shape on the kubepods cgroup alone: its line there is set by the tighter headroom of the two.

use std::{collections::HashMap, path::PathBuf};

use node_agent_policy::{EvictionConfig, Signal};

use crate::observe::node::{NodeLayout, NodeReading};
use crate::{
    cgroup::{paths, CgroupIndex},
    ebpf::{ControlError, KernelPrograms},
};

/// A line moving up is rewritten only when it moves by more than this, to keep map writes rare;
/// a line moving down, or one the kernel reported crossed, is always rewritten.
const MOVE_AT_LEAST: u64 = 4 << 20;
/// With less headroom than this the daemon polls as well: the node is about to cross.
const NEAR: u64 = 2 * MOVE_AT_LEAST;
const MAX_HYSTERESIS: u64 = 16 << 20;
/// A line farther than this from the next threshold stops halfway ([`step`]).
pub const PROBE_ABOVE: u64 = 64 << 20;

/// The largest threshold quantity configured for `signal` (hard or soft), resolved against
/// `capacity`: the earliest point at which the policy may act.
pub fn most_lenient(config: &EvictionConfig, signal: Signal, capacity: i64) -> Option<i64> {
    config
        .thresholds()
        .iter()
        .filter(|t| t.signal == signal)
        .map(|t| t.value.resolve(capacity).value())
        .filter(|v| *v > 0)
        .max()
}

pub struct Triggers {
    layout: NodeLayout,
    targets: Vec<(u64, PathBuf)>,
    lines: HashMap<u64, u64>,
    fired: bool,
}

impl Triggers {
    pub fn new(layout: &NodeLayout) -> Self {
        Self {
            layout: layout.clone(),
            targets: Vec::new(),
            lines: HashMap::new(),
            fired: false,
        }
    }

    /// True while the memory headroom is gone (the daemon polls instead of waiting).
    pub fn memory_fired(&self) -> bool {
        self.fired
    }

    /// Lines are recomputed from scratch at the next reading (after a config change).
    pub fn forget(&mut self) {
        self.lines.clear();
    }

    /// The kernel reported this cgroup's line crossed: it stays silent until the line is
    /// written again, so the next reading re-arms it whatever it moved.
    pub fn crossed(&mut self, cgroup: u64) {
        self.lines.remove(&cgroup);
    }

    /// Picks the target cgroups again (pods and cgroups come and go).
    pub fn refresh_targets(&mut self, index: &CgroupIndex) {
        let layout = &self.layout;
        let dirs: Vec<PathBuf> = match layout.kubepods() {
            Some(k) => vec![k],
            None if !layout.is_root => vec![layout.node_dir.clone()],
            None => {
                let below = layout
                    .node_dir
                    .strip_prefix(index.root())
                    .unwrap_or(std::path::Path::new(""))
                    .to_path_buf();
                index
                    .entries()
                    .filter(|(_, e)| {
                        e.path.parent() == Some(below.as_path()) && !e.path.as_os_str().is_empty()
                    })
                    .map(|(_, e)| index.root().join(&e.path))
                    .collect()
            }
        };
        self.targets = dirs
            .into_iter()
            .filter_map(|d| crate::cgroup::cgroup_id(&d).ok().map(|id| (id, d)))
            .collect();
        self.lines
            .retain(|id, _| self.targets.iter().any(|(t, _)| t == id));
    }

    /// Sets each target's line from this reading.
    pub fn rearm(
        &mut self,
        programs: &mut KernelPrograms,
        config: &EvictionConfig,
        reading: &NodeReading,
        layout: &NodeLayout,
    ) -> Result<(), ControlError> {
        let version = layout.version();
        let node = headroom(config, reading, Signal::MemoryAvailable);
        // `allocatableMemory.available` falls as the kubepods cgroup grows: that cgroup's line
        // is set by the tighter of the two headrooms.
        let allocatable = headroom(config, reading, Signal::AllocatableMemoryAvailable);
        if node.is_none() && allocatable.is_none() {
            self.fired = false;
            return Ok(());
        }
        let kubepods = layout.kubepods();
        self.fired = false;
        for (id, dir) in &self.targets {
            let h = match (node, allocatable) {
                (Some(n), Some(a)) if kubepods.as_deref() == Some(dir.as_path()) => n.min(a),
                (Some(n), _) => n,
                (None, Some(a)) if kubepods.as_deref() == Some(dir.as_path()) => a,
                (None, _) => continue,
            };
            if h <= 0 {
                // The headroom is gone: lines stay where they are and the daemon polls.
                self.fired = true;
                continue;
            }
            let h = h as u64;
            self.fired |= h < NEAR;
            let Ok(reading) = paths::read_memory(dir, version) else {
                continue;
            };
            let line = reading.usage.saturating_add(step(h));
            // Down always (less headroom must never be noticed late); up only by a real step.
            let moved = self
                .lines
                .get(id)
                .is_none_or(|old| line < *old || line - old > MOVE_AT_LEAST);
            if moved {
                programs.set_memory_threshold(*id, line, (h / 2).min(MAX_HYSTERESIS))?;
                self.lines.insert(*id, line);
            }
        }
        Ok(())
    }
}

/// The nearest threshold of `signal` still ahead at `available` (the largest configured one
/// below it, hard or soft, resolved against `capacity`; a hard one no lower than `lead`, where
/// the policy meets it early): the next line growth would cross.
pub fn next_line(
    config: &EvictionConfig,
    signal: Signal,
    capacity: i64,
    available: i64,
    lead: i64,
) -> Option<i64> {
    config
        .thresholds()
        .iter()
        .filter(|t| t.signal == signal)
        .map(|t| {
            let v = t.value.resolve(capacity).value();
            if t.is_hard() {
                v.max(lead)
            } else {
                v
            }
        })
        .filter(|v| *v > 0 && *v < available)
        .max()
}

/// `available − the nearest threshold ahead` of a memory signal in this reading, `Some(0)`
/// when every threshold is met already, `None` when it was not read or has no threshold.
fn headroom(config: &EvictionConfig, reading: &NodeReading, signal: Signal) -> Option<i64> {
    let obs = reading.observations.get(&signal)?;
    most_lenient(config, signal, obs.capacity)?;
    Some(
        next_line(config, signal, obs.capacity, obs.available, obs.lead)
            .map_or(0, |line| obs.available - line),
    )
}

/// Where a target's line goes, `h` ahead of the next threshold: halfway there while it is far
/// (beyond [`PROBE_ABOVE`]), so that a ramp towards it is read on the way (each crossing is a
/// reading, and the readings give its rate: see `ahead`); at it once near.
pub fn step(h: u64) -> u64 {
    if h > PROBE_ABOVE {
        h / 2
    } else {
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_line_is_the_nearest_threshold_still_ahead() {
        let config = EvictionConfig::from_kubelet_yaml(
            "evictionHard: {memory.available: 200Mi}\nevictionSoft: {memory.available: 500Mi}\nevictionSoftGracePeriod: {memory.available: 1m}\n",
        )
        .unwrap();
        let mib = 1i64 << 20;
        let cap = 4096 * mib;
        let rows = [
            ("far from both: the soft one first", 2000, Some(500)),
            ("past the soft one: the hard one", 400, Some(200)),
            ("on the soft one: the hard one", 500, Some(200)),
            ("past both: none, the daemon polls", 150, None),
        ];
        for (what, available, want) in rows {
            assert_eq!(
                next_line(&config, Signal::MemoryAvailable, cap, available * mib, 0),
                want.map(|w| w * mib),
                "{what}"
            );
        }
        // A lead beyond the hard threshold (a fall faster than relief): the hard line where
        // the policy meets it early.
        assert_eq!(
            next_line(&config, Signal::MemoryAvailable, cap, 400 * mib, 300 * mib),
            Some(300 * mib)
        );
        assert_eq!(
            next_line(&config, Signal::MemoryAvailable, cap, 2000 * mib, 900 * mib),
            Some(900 * mib),
            "ahead of the soft one too"
        );
    }

    #[test]
    fn far_lines_stop_halfway_so_a_ramp_is_read_on_its_way() {
        let mib = 1u64 << 20;
        assert_eq!(step(1000 * mib), 500 * mib);
        assert_eq!(step(64 * mib), 64 * mib);
        assert_eq!(step(8 * mib), 8 * mib);
    }

    #[test]
    fn the_most_lenient_threshold_is_the_earliest_trigger() {
        let config = EvictionConfig::from_kubelet_yaml(
            "evictionHard: {memory.available: 100Mi, pid.available: 5%}\nevictionSoft: {memory.available: 10%}\nevictionSoftGracePeriod: {memory.available: 1m}\n",
        )
        .unwrap();
        let gib = 1i64 << 30;
        // 10% of 10Gi beats 100Mi (resolved with the kubelet's float32 arithmetic: not exact).
        let ten_percent = most_lenient(&config, Signal::MemoryAvailable, 10 * gib).unwrap();
        assert!(ten_percent.abs_diff(gib) < 1024, "{ten_percent}");
        assert_eq!(
            most_lenient(&config, Signal::MemoryAvailable, 512 << 20),
            Some(100 << 20),
            "100Mi beats 10% of 512Mi"
        );
        assert_eq!(
            most_lenient(&config, Signal::PidAvailable, 32768),
            Some(1638)
        );
        assert_eq!(
            most_lenient(&config, Signal::NodeFsAvailable, 1 << 40),
            None
        );
    }
}
