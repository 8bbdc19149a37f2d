//! The in-kernel memory sampler's user side: line slots, and the cgroup iterator that tells the
//! kernel where a newly watched cgroup's page counter lives (see `node-agent-ebpf/src/sampler.rs`;
//! the iterator itself is in `iterator.rs`).
//!
//! The program starts a timer on the CPU it runs on, so each new line's iterator runs once
//! per timer, each time on a thread pinned to another of the agent's CPUs: two vCPUs rarely
//! lose the host at the same moment.

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
    MemoryLine, SamplerControl, SamplerStats, MAX_MEMORY_LINES,
    PLAUSIBLE_CHARGE_BYTES_PER_US_PER_CPU, SAMPLER_TIMERS,
};

use self::iterator::{open_cgroup, run_cgroup_iterator, run_on, timer_cpus};
use super::{control::ControlError, LoadError};

mod iterator;

pub(crate) const ATTACH_PROGRAM: &str = "memory_sampler_attach";

#[derive(Debug, thiserror::Error)]
pub enum SamplerError {
    #[error("the sampler watches at most {MAX_MEMORY_LINES} memory lines")]
    Full,
    #[error("opening cgroup {cgroup} in the memory hierarchy at {mount} by its id")]
    Open {
        cgroup: u64,
        mount: String,
        #[source]
        source: std::io::Error,
    },
    #[error("running the cgroup iterator on cgroup {cgroup} ({step})")]
    Iterator {
        cgroup: u64,
        step: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the kernel found no memory page counter for cgroup {cgroup} (on cgroup v2, is the \
         memory controller enabled in its parent's cgroup.subtree_control?)"
    )]
    Unresolved { cgroup: u64 },
}

/// How often the sampler ticks (see `SamplerControl`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SamplerPace {
    /// The shortest wait between ticks: while a line is near, a crossing is seen this soon.
    pub period: Duration,
    /// The longest wait between ticks: any crossing is seen this soon.
    pub max_period: Duration,
    /// The charge rate (bytes per µs, whole node) lines are assumed to approach at; `None`:
    /// [`PLAUSIBLE_CHARGE_BYTES_PER_US_PER_CPU`] times the CPUs online.
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
            .map_err(|source| super::object::classify_program_error(name, source))?;
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
                PLAUSIBLE_CHARGE_BYTES_PER_US_PER_CPU.saturating_mul(cpus as u64)
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

    /// Starts sampling `cgroup`'s page counter (its threshold is in `MEMORY_THRESHOLDS`).
    pub(crate) fn watch(&mut self, ebpf: &mut Ebpf, cgroup: u64) -> Result<(), ControlError> {
        if self.by_cgroup.contains_key(&cgroup) {
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
                    .map_err(super::control::map_err("SAMPLER_STATS", u64::from(timer)))
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
            .map_err(super::control::map_err("SAMPLER_TIMER", u64::from(timer)))
    }

    fn write_line(&self, ebpf: &mut Ebpf, index: u32, cgroup: u64) -> Result<(), ControlError> {
        let mut map = lines_map::<MemoryLine>(ebpf, "MEMORY_LINES")?;
        let line = MemoryLine {
            cgroup_id: cgroup,
            counter: 0,
        };
        map.set(index, line, 0)
            .map_err(super::control::map_err("MEMORY_LINES", u64::from(index)))
    }

    /// Writes the periods and slots in use, and which timer the attach program starts next.
    fn write_control(&self, ebpf: &mut Ebpf, timer: u32) -> Result<(), ControlError> {
        let mut map = lines_map::<SamplerControl>(ebpf, "SAMPLER_CONTROL")?;
        let control = SamplerControl {
            period_ns: self.period_ns,
            max_period_ns: self.max_period_ns,
            charge_bytes_per_us: self.charge_bytes_per_us,
            lines: u32::try_from(self.slots.len()).unwrap_or(MAX_MEMORY_LINES),
            timer,
        };
        map.set(0, control, 0)
            .map_err(super::control::map_err("SAMPLER_CONTROL", 0))
    }

    /// Runs the attach program on the cgroup's directory, once per timer on that timer's CPU,
    /// and checks that it found the counter.
    fn resolve(&self, ebpf: &mut Ebpf, index: u32, cgroup: u64) -> Result<(), ControlError> {
        let dir = open_cgroup(&self.mount, cgroup).map_err(|source| SamplerError::Open {
            cgroup,
            mount: self.mount_path.clone(),
            source,
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
            .map_err(super::control::map_err("MEMORY_LINES", u64::from(index)))?;
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
