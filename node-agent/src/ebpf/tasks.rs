//! Per-cgroup fork/exit counts kept by the `sched_process_fork`/`sched_process_exit` programs.

use aya::maps::{MapData, PerCpuHashMap, PerCpuValues};
use node_agent_common::TaskCounts;

use super::{KernelPrograms, LoadError};

const MAP: &str = "TASK_COUNTS";

#[derive(Debug, thiserror::Error)]
pub enum TaskCountsError {
    #[error("counting CPUs")]
    Cpus(#[source] std::io::Error),
    #[error("map {MAP} for cgroup id {cgroup}")]
    Map {
        cgroup: u64,
        #[source]
        source: aya::maps::MapError,
    },
    #[error(transparent)]
    Setup(#[from] LoadError),
}

impl KernelPrograms {
    fn task_map(&mut self) -> Result<PerCpuHashMap<&mut MapData, u64, TaskCounts>, LoadError> {
        let map = self.ebpf.map_mut(MAP).ok_or(LoadError::MissingMap(MAP))?;
        PerCpuHashMap::try_from(map).map_err(|source| LoadError::Map { name: MAP, source })
    }

    /// Starts counting forks and exits of tasks in the cgroup with this v2 id, from zero.
    pub fn track_cgroup(&mut self, cgroup: u64) -> Result<(), TaskCountsError> {
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| TaskCountsError::Cpus(e))?;
        let zeros = PerCpuValues::try_from(vec![TaskCounts::default(); cpus])
            .map_err(TaskCountsError::Cpus)?;
        self.task_map()?
            .insert(cgroup, zeros, 0)
            .map_err(|source| TaskCountsError::Map { cgroup, source })
    }

    /// Stops counting a cgroup.
    pub fn untrack_cgroup(&mut self, cgroup: u64) -> Result<(), TaskCountsError> {
        match self.task_map()?.remove(&cgroup) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(source) => Err(TaskCountsError::Map { cgroup, source }),
        }
    }

    /// Forks and exits counted for a tracked cgroup, summed over CPUs; `None` if not tracked.
    pub fn task_counts(&mut self, cgroup: u64) -> Result<Option<TaskCounts>, TaskCountsError> {
        match self.task_map()?.get(&cgroup, 0) {
            Ok(values) => Ok(Some(TaskCounts::sum(values.iter()))),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(source) => Err(TaskCountsError::Map { cgroup, source }),
        }
    }
}
