//! What user space tells the kernel programs (cgroups to count, thresholds) and what it reads
//! back (counts, losses).

use aya::maps::{Array, HashMap, MapData, PerCpuArray, PerCpuHashMap, PerCpuValues};
use node_agent_common::{ForkRateLimit, MemoryThreshold, PidLimits, SamplerStats, TaskCounts};

use super::{
    error::{map_err, ControlError, LoadError},
    sampler::Sampler,
    KernelPrograms,
};

macro_rules! typed_map {
    ($self:ident, $name:literal, $ty:ty) => {{
        let map = $self
            .ebpf
            .map_mut($name)
            .ok_or(LoadError::MissingMap($name))?;
        <$ty>::try_from(map).map_err(|source| LoadError::Map {
            name: $name,
            source,
        })?
    }};
}

impl KernelPrograms {
    /// Starts counting forks and exits of tasks in the memory cgroup with this id, from zero.
    pub fn track_cgroup(&mut self, cgroup: u64) -> Result<(), ControlError> {
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| ControlError::Cpus(e))?;
        let zeros = PerCpuValues::try_from(vec![TaskCounts::default(); cpus])
            .map_err(ControlError::Cpus)?;
        let mut map = typed_map!(
            self,
            "TASK_COUNTS",
            PerCpuHashMap::<&mut MapData, u64, TaskCounts>
        );
        map.insert(cgroup, zeros, 0)
            .map_err(map_err("TASK_COUNTS", cgroup))
    }

    /// Stops counting a cgroup and drops its thresholds.
    pub fn untrack_cgroup(&mut self, cgroup: u64) -> Result<(), ControlError> {
        // A key that is not there is already untracked (deletion reports ENOENT).
        fn gone(r: Result<(), aya::maps::MapError>) -> Result<(), aya::maps::MapError> {
            match r {
                Err(aya::maps::MapError::KeyNotFound) => Ok(()),
                Err(aya::maps::MapError::SyscallError(e))
                    if e.io_error.raw_os_error() == Some(libc::ENOENT) =>
                {
                    Ok(())
                }
                other => other,
            }
        }
        let mut tasks = typed_map!(
            self,
            "TASK_COUNTS",
            PerCpuHashMap::<&mut MapData, u64, TaskCounts>
        );
        gone(tasks.remove(&cgroup)).map_err(map_err("TASK_COUNTS", cgroup))?;
        let mut forks = typed_map!(
            self,
            "FORK_LIMITS",
            HashMap::<&mut MapData, u64, ForkRateLimit>
        );
        gone(forks.remove(&cgroup)).map_err(map_err("FORK_LIMITS", cgroup))?;
        self.clear_memory_threshold(cgroup)
    }

    /// Drops a cgroup's memory threshold (and its sampler line); absent is not an error.
    pub fn clear_memory_threshold(&mut self, cgroup: u64) -> Result<(), ControlError> {
        if let Some(sampler) = self.sampler.as_mut() {
            sampler.unwatch(&mut self.ebpf, cgroup)?;
        }
        let mut mem = typed_map!(
            self,
            "MEMORY_THRESHOLDS",
            HashMap::<&mut MapData, u64, MemoryThreshold>
        );
        match mem.remove(&cgroup) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(aya::maps::MapError::SyscallError(e))
                if e.io_error.raw_os_error() == Some(libc::ENOENT) =>
            {
                Ok(())
            }
            Err(source) => Err(ControlError::Map {
                map: "MEMORY_THRESHOLDS",
                key: cgroup,
                source,
            }),
        }
    }

    /// Forks and exits counted for a tracked cgroup, summed over CPUs; `None` if not tracked.
    pub fn task_counts(&mut self, cgroup: u64) -> Result<Option<TaskCounts>, ControlError> {
        let map = typed_map!(
            self,
            "TASK_COUNTS",
            PerCpuHashMap::<&mut MapData, u64, TaskCounts>
        );
        match map.get(&cgroup, 0) {
            Ok(values) => Ok(Some(TaskCounts::sum(values.iter()))),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(source) => Err(ControlError::Map {
                map: "TASK_COUNTS",
                key: cgroup,
                source,
            }),
        }
    }

    /// Sets (or replaces, re-arming it) the memory threshold of a cgroup.
    pub fn set_memory_threshold(
        &mut self,
        cgroup: u64,
        bytes: u64,
        hysteresis: u64,
    ) -> Result<(), ControlError> {
        let value = MemoryThreshold {
            bytes,
            hysteresis,
            above: 0,
        };
        let mut map = typed_map!(
            self,
            "MEMORY_THRESHOLDS",
            HashMap::<&mut MapData, u64, MemoryThreshold>
        );
        // How far the line moved down: the sampler may have planned its wait for the old one.
        let moved_down = map
            .get(&cgroup, 0)
            .map_or(0, |old| old.bytes.saturating_sub(bytes));
        map.insert(cgroup, value, 0)
            .map_err(map_err("MEMORY_THRESHOLDS", cgroup))?;
        // The sampler reads the counter of each line's cgroup; fexit finds it on the way.
        if let Some(sampler) = self.sampler.as_mut() {
            if let Err(e) = sampler.watch(&mut self.ebpf, cgroup, moved_down) {
                let _ = self.clear_memory_threshold(cgroup);
                return Err(e);
            }
        }
        Ok(())
    }

    /// The sampler's ticks and the kernel time spent in them, its timers added up; `None`
    /// without the sampler.
    pub fn sampler_stats(&mut self) -> Result<Option<SamplerStats>, ControlError> {
        Ok(self.sampler_timer_stats()?.map(|timers| {
            timers
                .into_iter()
                .fold(SamplerStats::default(), |a, b| a + b)
        }))
    }

    /// Each sampler timer's figures, in timer order; `None` without the sampler.
    pub fn sampler_timer_stats(&mut self) -> Result<Option<Vec<SamplerStats>>, ControlError> {
        if self.sampler.is_none() {
            return Ok(None);
        }
        Sampler::timer_stats(&mut self.ebpf).map(Some)
    }

    /// Stops sampler timer `timer` as a vCPU the host never gives back would: for tests that
    /// the other timer covers for it. Setting a threshold on a new cgroup starts it again.
    #[doc(hidden)]
    pub fn stop_sampler_timer(&mut self, timer: u32) -> Result<(), ControlError> {
        if self.sampler.is_none() {
            return Ok(());
        }
        Sampler::stop_timer(&mut self.ebpf, timer)
    }

    /// Sets the fork-rate limit of a cgroup: more than `max_forks` per `window`.
    pub fn set_fork_limit(
        &mut self,
        cgroup: u64,
        max_forks: u64,
        window: std::time::Duration,
    ) -> Result<(), ControlError> {
        let value = ForkRateLimit {
            max_forks,
            window_ns: u64::try_from(window.as_nanos()).unwrap_or(u64::MAX),
            ..ForkRateLimit::default()
        };
        let mut map = typed_map!(
            self,
            "FORK_LIMITS",
            HashMap::<&mut MapData, u64, ForkRateLimit>
        );
        map.insert(cgroup, value, 0)
            .map_err(map_err("FORK_LIMITS", cgroup))
    }

    /// Sets the node's PID limit and the `pid.available` threshold (0 disables it).
    pub fn set_pid_threshold(
        &mut self,
        limit: u64,
        threshold: u64,
        hysteresis: u64,
    ) -> Result<(), ControlError> {
        let value = PidLimits {
            limit,
            threshold,
            hysteresis,
            below: 0,
            _pad: 0,
        };
        let mut map = typed_map!(self, "PID_LIMITS", Array::<&mut MapData, PidLimits>);
        map.set(0, value, 0).map_err(map_err("PID_LIMITS", 0))
    }

    /// The initial PID namespace's `pid_max` as the kernel programs last saw it: `None` on
    /// kernels where `pid_max` is one global figure (before 6.14), and before the first fork
    /// or exit since load.
    pub fn host_pid_max(&mut self) -> Result<Option<u32>, ControlError> {
        let map = typed_map!(self, "HOST_PID_MAX", Array::<&mut MapData, u32>);
        let pid_max = map.get(&0, 0).map_err(map_err("HOST_PID_MAX", 0))?;
        Ok((pid_max != 0).then_some(pid_max))
    }

    /// Records the kernel programs tried to write, per CPU, since load (delivered + lost).
    pub fn sent_events(&mut self) -> Result<Vec<u64>, ControlError> {
        let map = typed_map!(self, "SENT", PerCpuArray::<&mut MapData, u64>);
        Ok(map
            .get(&0, 0)
            .map_err(map_err("SENT", 0))?
            .iter()
            .copied()
            .collect())
    }

    /// Ring-buffer records the kernel could not write, per CPU, since load.
    pub fn lost_events(&mut self) -> Result<Vec<u64>, ControlError> {
        let map = typed_map!(self, "LOST", PerCpuArray::<&mut MapData, u64>);
        Ok(map
            .get(&0, 0)
            .map_err(map_err("LOST", 0))?
            .iter()
            .copied()
            .collect())
    }
}
