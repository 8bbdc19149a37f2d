//! The embedded eBPF object and its life cycle: find offsets, load, attach, detach on drop.

use aya::{
    programs::{BtfTracePoint, FExit},
    Ebpf, EbpfLoader,
};
use std::time::Duration;

use node_agent_common::{
    DEFAULT_RING_BYTES, DEFAULT_SAMPLER_MAX_PERIOD_NS, DEFAULT_SAMPLER_PERIOD_NS,
};

use super::{
    error::{classify_load_error, classify_program_error, LoadError},
    sampler::{Sampler, SamplerPace},
};
use crate::btf::Btf;

/// The object `cargo xtask build` compiled; empty when built with plain `cargo build`.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/node-agent-ebpf.o"));

/// How memory thresholds are watched on this kernel, cheapest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryMechanism {
    /// fexit on the page-counter charge and uncharge functions: evaluated in the kernel once
    /// per charge batch (64 pages), right after the counter moved. Needs BPF trampolines.
    PageCounterFexit,
    /// An in-kernel timer reads each watched line's page counter every period: nothing runs on
    /// the fault path, a crossing is seen within one period. Needs `bpf_timer` and the cgroup
    /// iterator (6.1+); used where fexit cannot attach.
    CounterSampler,
    /// Neither: memory thresholds are not evaluated by the kernel programs; the daemon
    /// re-reads cgroupfs every `pressurePollInterval` instead.
    Unavailable,
}

impl std::fmt::Display for MemoryMechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::PageCounterFexit => {
                "fexit on page_counter charge/uncharge (in-kernel thresholds)"
            }
            Self::CounterSampler => "in-kernel page-counter sampler (bpf_timer)",
            Self::Unavailable => "cgroupfs polling (no in-kernel memory mechanism attaches here)",
        })
    }
}

impl MemoryMechanism {
    /// `fexit`, `sampler` or `polling`: the metric's label and what `kubectl node-agent
    /// status` shows.
    pub fn short_name(self) -> &'static str {
        match self {
            Self::PageCounterFexit => "fexit",
            Self::CounterSampler => "sampler",
            Self::Unavailable => "polling",
        }
    }
}

/// Which memory mechanism to use: the cheapest that attaches, or one named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MemoryChoice {
    /// fexit where it attaches, else the sampler, else polling; says why at each step.
    #[default]
    Auto,
    PageCounterFexit,
    CounterSampler,
    /// No in-kernel memory thresholds at all.
    Polling,
}

/// Load-time choices.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Ring buffer size in bytes: a power of two, at least one page.
    pub ring_bytes: u32,
    pub memory: MemoryChoice,
    /// How often the sampler ticks: every `period` while a line is near, up to every
    /// `max_period` while all are far (by the charge-rate bound: `SamplerPace`).
    pub sampler: SamplerPace,
    /// Attach the fork/exit programs (fork counts, fork storms, `pid.available`). Only the
    /// benchmark turns them off, to measure what the memory mechanism costs on its own.
    pub task_accounting: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            ring_bytes: DEFAULT_RING_BYTES,
            memory: MemoryChoice::Auto,
            sampler: SamplerPace {
                period: Duration::from_nanos(DEFAULT_SAMPLER_PERIOD_NS),
                max_period: Duration::from_nanos(DEFAULT_SAMPLER_MAX_PERIOD_NS),
                charge_bytes_per_us: None,
            },
            task_accounting: true,
        }
    }
}

/// Programs always attached: (program name in the object, BTF tracepoint).
const ALWAYS: &[&str] = &["mark_victim", "cgroup_mkdir", "cgroup_rmdir"];
/// The fork/exit accounting's BTF tracepoints (`LoadOptions::task_accounting`).
const TASKS: &[&str] = &["sched_process_fork", "sched_process_exit"];
/// fexit programs on the page-counter functions, named after them.
const PAGE_COUNTER: &[&str] = &[
    "page_counter_try_charge",
    "page_counter_charge",
    "page_counter_uncharge",
];

/// The loaded and attached kernel programs. Dropping it detaches every program and frees the
/// maps (which cancels the sampler's timer).
pub struct KernelPrograms {
    pub(crate) ebpf: Ebpf,
    memory: MemoryMechanism,
    pub(crate) sampler: Option<Sampler>,
}

impl KernelPrograms {
    /// Loads the embedded object with default options and attaches every program.
    pub fn load() -> Result<Self, LoadError> {
        Self::load_with(&LoadOptions::default())
    }

    pub fn load_with(options: &LoadOptions) -> Result<Self, LoadError> {
        if OBJECT.is_empty() {
            return Err(LoadError::NotEmbedded);
        }
        if !options.ring_bytes.is_power_of_two() || options.ring_bytes < 4096 {
            return Err(LoadError::RingSize(options.ring_bytes));
        }
        if !std::path::Path::new(crate::btf::VMLINUX).exists() {
            return Err(LoadError::NoBtf);
        }
        let btf = Btf::from_kernel().map_err(LoadError::Btf)?;
        let offsets = super::offsets::from_btf(&btf).map_err(LoadError::Btf)?;
        let aya_btf = aya::Btf::from_sys_fs().map_err(|e| LoadError::Object(e.into()))?;

        raise_memlock_limit();
        let mut ebpf = EbpfLoader::new()
            .btf(Some(&aya_btf))
            .override_global("OFFSETS", &offsets, true)
            .map_max_entries("EVENTS", options.ring_bytes)
            .load(OBJECT)
            .map_err(classify_load_error)?;
        let tasks = if options.task_accounting { TASKS } else { &[] };
        for &name in ALWAYS.iter().chain(tasks) {
            let program: &mut BtfTracePoint = ebpf
                .program_mut(name)
                .ok_or(LoadError::MissingProgram(name))?
                .try_into()
                .map_err(|source| LoadError::Program { name, source })?;
            program
                .load(name, &aya_btf)
                .map_err(|source| classify_program_error(name, source))?;
            program
                .attach()
                .map_err(|source| classify_program_error(name, source))?;
        }
        let (memory, sampler) = choose_memory(&mut ebpf, &aya_btf, options)?;
        tracing::info!(memory = %memory, "kernel programs attached");
        Ok(Self {
            ebpf,
            memory,
            sampler,
        })
    }

    /// How memory thresholds are watched on this kernel.
    pub fn memory_mechanism(&self) -> MemoryMechanism {
        self.memory
    }

    /// The sampler's shortest period (a crossing by a plausible charge is seen this soon),
    /// when the sampler is the mechanism.
    pub fn sampler_period(&self) -> Option<Duration> {
        self.sampler.as_ref().map(|s| s.pace().period)
    }

    /// How the sampler ticks, when it is the mechanism.
    pub fn sampler_pace(&self) -> Option<SamplerPace> {
        self.sampler.as_ref().map(Sampler::pace)
    }
}

/// The cheapest memory mechanism that attaches (or the one asked for); each refusal is logged
/// with the kernel's reason.
fn choose_memory(
    ebpf: &mut Ebpf,
    btf: &aya::Btf,
    options: &LoadOptions,
) -> Result<(MemoryMechanism, Option<Sampler>), LoadError> {
    let try_fexit = matches!(
        options.memory,
        MemoryChoice::Auto | MemoryChoice::PageCounterFexit
    );
    if try_fexit {
        match attach_fexit(ebpf, btf) {
            Ok(()) => return Ok((MemoryMechanism::PageCounterFexit, None)),
            Err(e) if options.memory == MemoryChoice::PageCounterFexit => return Err(e),
            Err(e) => tracing::info!(
                reason = %crate::error_chain(&e),
                "fexit on the page counter does not attach here; trying the in-kernel sampler"
            ),
        }
    }
    if matches!(
        options.memory,
        MemoryChoice::Auto | MemoryChoice::CounterSampler
    ) {
        let sampler = crate::cgroup::detect()
            .map_err(|e| LoadError::MemoryHierarchy {
                path: "/proc/self/mountinfo".into(),
                source: std::io::Error::other(e.to_string()),
            })
            .and_then(|layout| Sampler::load(ebpf, btf, layout.memory.mount(), options.sampler));
        match sampler {
            Ok(s) => return Ok((MemoryMechanism::CounterSampler, Some(s))),
            Err(e) if options.memory == MemoryChoice::CounterSampler => return Err(e),
            Err(e) => tracing::warn!(
                reason = %crate::error_chain(&e),
                "the in-kernel memory sampler does not load here; memory is polled from cgroupfs"
            ),
        }
    }
    Ok((MemoryMechanism::Unavailable, None))
}

/// Attaches the page-counter fexit programs, all or none.
fn attach_fexit(ebpf: &mut Ebpf, btf: &aya::Btf) -> Result<(), LoadError> {
    let mut attached: Vec<&'static str> = Vec::new();
    let result = (|| {
        for &name in PAGE_COUNTER {
            let program: &mut FExit = ebpf
                .program_mut(name)
                .ok_or(LoadError::MissingProgram(name))?
                .try_into()
                .map_err(|source| LoadError::Program { name, source })?;
            // Not `classify_program_error`: a refusal here is about this kernel (no
            // trampolines, a lockdown), not about privileges, and the loader goes on.
            program
                .load(name, btf)
                .map_err(|source| LoadError::Program { name, source })?;
            attached.push(name);
            program
                .attach()
                .map_err(|source| LoadError::Program { name, source })?;
        }
        Ok(())
    })();
    if result.is_err() {
        for name in attached {
            if let Some(p) = ebpf.program_mut(name) {
                let _ = TryInto::<&mut FExit>::try_into(p).map(|p| p.unload());
            }
        }
    }
    result
}

/// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; later ones to the memcg, where this
/// is harmless. Failure is not fatal: the load error that follows says more.
fn raise_memlock_limit() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads the struct we pass and nothing else.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "could not raise RLIMIT_MEMLOCK");
    }
}

/// What the kernel counted for one attached program while BPF statistics were enabled
/// (`kernel.bpf_stats_enabled`, or an `aya::sys::enable_stats` guard).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramStats {
    pub name: String,
    pub run_count: u64,
    pub run_time: Duration,
}

impl KernelPrograms {
    /// Run counts and run time of every loaded program, by name.
    pub fn program_stats(&self) -> Vec<ProgramStats> {
        self.ebpf
            .programs()
            .filter_map(|(name, program)| {
                let info = program.info().ok()?;
                Some(ProgramStats {
                    name: name.to_string(),
                    run_count: info.run_count(),
                    run_time: info.run_time(),
                })
            })
            .collect()
    }
}

/// Turns the kernel's BPF run-time statistics on until the returned descriptor is closed (what
/// `kernel.bpf_stats_enabled` does, scoped to this process). They cost two clock reads per
/// program run, so overhead is measured without them.
pub fn enable_run_time_stats() -> std::io::Result<std::os::fd::OwnedFd> {
    aya::sys::enable_stats(aya::sys::Stats::RunTime).map_err(|e| e.io_error)
}
