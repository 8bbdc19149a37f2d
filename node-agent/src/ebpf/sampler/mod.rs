//! The in-kernel memory sampler's user side: line slots, its pace (the charge-rate bound it
//! plans for: `node_agent_common::sampler`), and the cgroup iterator that tells the kernel where
//! a newly watched cgroup's page counter lives (see `node-agent-ebpf/src/sampler.rs`; the
//! iterator itself is in `iterator.rs`).
//!
//! The program starts a timer on the CPU it runs on, so each new line's iterator runs once
//! per timer, each time on a thread pinned to another of the agent's CPUs: two vCPUs rarely
//! lose the host at the same moment. A line set again much lower than before runs the
//! iterator again, which restarts the timers at the shortest period: a timer waiting up to the
//! longest period for a far line must not keep waiting once the line has moved near, or below
//! the usage.

use std::{
    collections::HashMap,
    fs::File,
    os::fd::{AsFd as _, AsRawFd as _},
    path::Path,
    time::Duration,
};

use aya::{
    maps::{Array, MapData},
    programs::Iter,
    Ebpf,
};
use node_agent_common::{
    MemoryLine, SamplerControl, SamplerStats, LARGEST_SINGLE_CHARGE_BYTES,
    MAX_CHARGE_BYTES_PER_US_PER_CPU, MAX_MEMORY_LINES, SAMPLER_TIMERS,
};

use self::iterator::{open_cgroup, run_cgroup_iterator, run_on, timer_cpus};
use super::error::{classify_program_error, map_err, ControlError, LoadError, SamplerError};

mod iterator;

pub(crate) const ATTACH_PROGRAM: &str = "memory_sampler_attach";

/// How often the sampler ticks (see `SamplerControl::wait_ns`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SamplerPace {
    /// The shortest wait between ticks: a crossing by a charge within the bound is read at
    /// most this long after it happens.
    pub period: Duration,
    /// The longest wait between ticks, while every line is far: a charge faster than the
    /// bound is seen this soon.
    pub max_period: Duration,
    /// The charge-rate bound (bytes per µs, whole node) lines are assumed to approach at, on
    /// top of one largest single charge ([`LARGEST_SINGLE_CHARGE_BYTES`]); `None`:
    /// [`MAX_CHARGE_BYTES_PER_US_PER_CPU`] times the CPUs online; `Some(0)`: no bound, every
    /// wait is the shortest.
    pub charge_bytes_per_us: Option<u64>,
}

/// Line slots in use, and the memory hierarchy's root to open cgroups by id.
pub(crate) struct Sampler {
    mount: File,
    mount_path: String,
    period_ns: u64,
    max_period_ns: u64,
    charge_bytes_per_us: u64,
    slots: Vec<Option<u64>>,
    by_cgroup: HashMap<u64, u32>,
    /// The CPU each timer starts on, in timer order: distinct CPUs the agent may run on. Fewer
    /// than [`SAMPLER_TIMERS`] where the agent has fewer CPUs; empty if its affinity cannot be
    /// read, and then timer 0 starts wherever the iterator runs.
    cpus: Vec<usize>,
}

impl Sampler {
    /// Checks that the attach program loads (the verifier accepts `bpf_timer` and the cgroup
    /// iterator on this kernel) and opens the memory hierarchy.
    pub(crate) fn load(
        ebpf: &mut Ebpf,
        btf: &aya::Btf,
        memory_mount: &Path,
        pace: SamplerPace,
    ) -> Result<Self, LoadError> {
        let name = ATTACH_PROGRAM;
        let program: &mut Iter = ebpf
            .program_mut(name)
            .ok_or(LoadError::MissingProgram(name))?
            .try_into()
            .map_err(|source| LoadError::Program { name, source })?;
        program
            .load("cgroup", btf)
            .map_err(|source| classify_program_error(name, source))?;
        let mount = File::open(memory_mount).map_err(|source| LoadError::MemoryHierarchy {
            path: memory_mount.display().to_string(),
            source,
        })?;
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1);
        let period_ns = ns(pace.period);
        let charge_bytes_per_us = match pace.charge_bytes_per_us {
            Some(rate) => rate,
            None => {
                // The node's CPUs, not the agent's share of them: any of them may charge.
                let cpus = aya::util::online_cpus().map_or(1, |c| c.len().max(1));
                MAX_CHARGE_BYTES_PER_US_PER_CPU.saturating_mul(cpus as u64)
            }
        };
        let sampler = Self {
            mount,
            mount_path: memory_mount.display().to_string(),
            period_ns,
            max_period_ns: ns(pace.max_period).max(period_ns),
            charge_bytes_per_us,
            slots: Vec::new(),
            by_cgroup: HashMap::new(),
            cpus: timer_cpus(),
        };
        sampler
            .write_control(ebpf, 0)
            .map_err(|e| LoadError::Sampler(Box::new(e)))?;
        Ok(sampler)
    }

    pub(crate) fn pace(&self) -> SamplerPace {
        SamplerPace {
            period: Duration::from_nanos(self.period_ns),
            max_period: Duration::from_nanos(self.max_period_ns),
            charge_bytes_per_us: Some(self.charge_bytes_per_us),
        }
    }

    /// Starts sampling `cgroup`'s page counter (its threshold is in `MEMORY_THRESHOLDS`). For a
    /// cgroup already watched whose line was just set `moved_down` bytes lower than before,
    /// restarts the timers at the shortest period when the wait planned for the old line could
    /// now make a crossing late ([`Self::needs_restart`]).
    pub(crate) fn watch(
        &mut self,
        ebpf: &mut Ebpf,
        cgroup: u64,
        moved_down: u64,
    ) -> Result<(), ControlError> {
        if let Some(&index) = self.by_cgroup.get(&cgroup) {
            if self.needs_restart(moved_down) {
                return self.resolve(ebpf, index, cgroup);
            }
            return Ok(());
        }
        let slot = match self.slots.iter().position(Option::is_none) {
            Some(free) => free,
            None if self.slots.len() < MAX_MEMORY_LINES as usize => {
                self.slots.push(None);
                self.slots.len() - 1
            }
            None => return Err(SamplerError::Full.into()),
        };
        let index = u32::try_from(slot).map_err(|_| SamplerError::Full)?;
        self.slots[slot] = Some(cgroup);
        self.by_cgroup.insert(cgroup, index);
        let result = self
            .write_line(ebpf, index, cgroup)
            .and_then(|()| self.write_control(ebpf, 0))
            .and_then(|()| self.resolve(ebpf, index, cgroup));
        if result.is_err() {
            let _ = self.unwatch(ebpf, cgroup);
        }
        result
    }

    /// Whether a line moved down by `moved_down` bytes needs the timers restarted. A wait
    /// planned for the old line lets the new one be crossed at most `moved_down / rate` sooner
    /// than planned: within the shortest period that only doubles the (1 ms) delay of the
    /// promise, and the daemon, which lowers lines a little at nearly every reading, restarts
    /// nothing. A line moved further (below the usage, or much nearer) is read at once. With
    /// no charge bound every wait is the shortest already.
    fn needs_restart(&self, moved_down: u64) -> bool {
        let slack = self
            .charge_bytes_per_us
            .saturating_mul(self.period_ns / 1000);
        self.charge_bytes_per_us > 0 && moved_down > slack
    }

    /// Stops sampling `cgroup`; a cgroup not watched is not an error.
    pub(crate) fn unwatch(&mut self, ebpf: &mut Ebpf, cgroup: u64) -> Result<(), ControlError> {
        let Some(index) = self.by_cgroup.remove(&cgroup) else {
            return Ok(());
        };
        self.slots[index as usize] = None;
        self.write_line(ebpf, index, 0)?;
        while self.slots.last().is_some_and(Option::is_none) {
            self.slots.pop();
        }
        self.write_control(ebpf, 0)
    }

    /// Each timer's figures, in timer order.
    pub(crate) fn timer_stats(ebpf: &mut Ebpf) -> Result<Vec<SamplerStats>, ControlError> {
        let map = lines_map::<SamplerStats>(ebpf, "SAMPLER_STATS")?;
        (0..SAMPLER_TIMERS)
            .map(|timer| {
                map.get(&timer, 0)
                    .map_err(map_err("SAMPLER_STATS", u64::from(timer)))
            })
            .collect()
    }

    /// Cancels one timer and marks it long overdue, as a vCPU the host never gives back would
    /// leave it; the next new line starts it again.
    pub(crate) fn stop_timer(ebpf: &mut Ebpf, timer: u32) -> Result<(), ControlError> {
        /// The kernel's `SamplerTimer` (node-agent-ebpf/src/sampler.rs). Writing an element
        /// cancels and frees the `bpf_timer` in it (`bpf_obj_free_fields()`).
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct TimerSlot {
            timer: [u64; 2],
            due_ns: u64,
            last_ns: u64,
            flags: u64,
        }
        // SAFETY: plain integers, no padding.
        unsafe impl aya::Pod for TimerSlot {}
        let slot = TimerSlot {
            timer: [0; 2],
            due_ns: 1,
            last_ns: 0,
            flags: 0,
        };
        lines_map::<TimerSlot>(ebpf, "SAMPLER_TIMER")?
            .set(timer, slot, 0)
            .map_err(map_err("SAMPLER_TIMER", u64::from(timer)))
    }

    fn write_line(&self, ebpf: &mut Ebpf, index: u32, cgroup: u64) -> Result<(), ControlError> {
        let mut map = lines_map::<MemoryLine>(ebpf, "MEMORY_LINES")?;
        let line = MemoryLine {
            cgroup_id: cgroup,
            counter: 0,
        };
        map.set(index, line, 0)
            .map_err(map_err("MEMORY_LINES", u64::from(index)))
    }

    /// Writes the periods and slots in use, and which timer the attach program starts next.
    fn write_control(&self, ebpf: &mut Ebpf, timer: u32) -> Result<(), ControlError> {
        let mut map = lines_map::<SamplerControl>(ebpf, "SAMPLER_CONTROL")?;
        let control = SamplerControl {
            period_ns: self.period_ns,
            max_period_ns: self.max_period_ns,
            charge_bytes_per_us: self.charge_bytes_per_us,
            burst_bytes: LARGEST_SINGLE_CHARGE_BYTES,
            lines: u32::try_from(self.slots.len()).unwrap_or(MAX_MEMORY_LINES),
            timer,
        };
        map.set(0, control, 0)
            .map_err(map_err("SAMPLER_CONTROL", 0))
    }

    /// Runs the attach program on the cgroup's directory, once per timer on that timer's CPU,
    /// and checks that it found the counter.
    fn resolve(&self, ebpf: &mut Ebpf, index: u32, cgroup: u64) -> Result<(), ControlError> {
        let dir =
            open_cgroup(&self.mount, Path::new(&self.mount_path), cgroup).map_err(|source| {
                SamplerError::Open {
                    cgroup,
                    mount: self.mount_path.clone(),
                    source,
                }
            })?;
        let program: &mut Iter = ebpf
            .program_mut(ATTACH_PROGRAM)
            .ok_or(LoadError::MissingProgram(ATTACH_PROGRAM))?
            .try_into()
            .map_err(|source| LoadError::Program {
                name: ATTACH_PROGRAM,
                source,
            })?;
        let prog_fd = program
            .fd()
            .map_err(|source| LoadError::Program {
                name: ATTACH_PROGRAM,
                source,
            })?
            .as_fd()
            .as_raw_fd();
        let placements: Vec<(u32, Option<usize>)> = if self.cpus.is_empty() {
            vec![(0, None)]
        } else {
            (0..SAMPLER_TIMERS)
                .zip(self.cpus.iter().map(|&c| Some(c)))
                .collect()
        };
        for (timer, cpu) in placements {
            self.write_control(ebpf, timer)?;
            run_on(cpu, || run_cgroup_iterator(prog_fd, &dir)).map_err(|(step, source)| {
                SamplerError::Iterator {
                    cgroup,
                    step,
                    source,
                }
            })?;
        }
        let map = lines_map::<MemoryLine>(ebpf, "MEMORY_LINES")?;
        let line = map
            .get(&index, 0)
            .map_err(map_err("MEMORY_LINES", u64::from(index)))?;
        if line.cgroup_id != cgroup || line.counter == 0 {
            return Err(SamplerError::Unresolved { cgroup }.into());
        }
        Ok(())
    }
}

fn lines_map<'a, T: aya::Pod>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<Array<&'a mut MapData, T>, ControlError> {
    let map = ebpf.map_mut(name).ok_or(LoadError::MissingMap(name))?;
    Array::try_from(map).map_err(|source| LoadError::Map { name, source }.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(charge_bytes_per_us: u64) -> Sampler {
        Sampler {
            mount: File::open("/").expect("/ opens"),
            mount_path: "/".into(),
            period_ns: 1_000_000,
            max_period_ns: 250_000_000,
            charge_bytes_per_us,
            slots: Vec::new(),
            by_cgroup: HashMap::new(),
            cpus: Vec::new(),
        }
    }

    #[test]
    fn only_a_line_moved_down_beyond_one_shortest_period_of_charging_restarts_the_timers() {
        // 32 GiB/s (2 CPUs at the bound): 1 ms of charging is 34_359_000 bytes.
        let s = sampler(34_359);
        let cases = [
            ("moved up or not at all", 0, false),
            (
                "moved down a little (the daemon's readings)",
                4 << 20,
                false,
            ),
            (
                "moved down by exactly one period of charging",
                34_359_000,
                false,
            ),
            ("moved down by more", 34_359_001, true),
            ("from far to below the usage", 1 << 40, true),
        ];
        for (why, moved_down, want) in cases {
            assert_eq!(s.needs_restart(moved_down), want, "{why}");
        }
        assert!(
            !sampler(0).needs_restart(1 << 40),
            "no bound: every wait is already the shortest"
        );
    }
}
