//! The in-kernel memory sampler's user side: line slots, and the cgroup iterator that tells the
//! kernel where a newly watched cgroup's page counter lives (see `node-agent-ebpf/src/memcg.rs`).
//!
//! aya attaches iterators without link parameters, which a cgroup iterator refuses (it needs a
//! start cgroup and an order), so the link is created here with the two `bpf(2)` commands it
//! takes: `BPF_LINK_CREATE` with `bpf_iter_link_info.cgroup = { SELF_ONLY, dir fd }`, then
//! `BPF_ITER_CREATE`, whose `read()` runs the program once on that cgroup.
//!
//! The program starts a timer on the CPU it runs on, so each new line's iterator runs once
//! per timer, each time on a thread pinned to another of the agent's CPUs: two vCPUs rarely
//! lose the host at the same moment.

use std::{
    collections::HashMap,
    fs::File,
    io::Read as _,
    os::fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd},
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

use super::{control::ControlError, LoadError};

pub(crate) const ATTACH_PROGRAM: &str = "memory_sampler_attach";

/// `enum bpf_cmd` and `enum bpf_attach_type` values (include/uapi/linux/bpf.h).
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_ITER_CREATE: libc::c_long = 33;
const BPF_TRACE_ITER: u32 = 28;
const BPF_CGROUP_ITER_SELF_ONLY: u32 = 1;
/// `FILEID_KERNFS` (include/linux/exportfs.h): cgroupfs file handles are the kernfs node id,
/// which is the cgroup id.
const FILEID_KERNFS: libc::c_int = 0xfe;

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
        /// The kernel's `SamplerTimer` (node-agent-ebpf/src/memcg.rs). Writing an element
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

/// Up to [`SAMPLER_TIMERS`] distinct CPUs this process may run on, lowest first.
fn timer_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data that sched_getaffinity fills.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `cpu` is below CPU_SETSIZE.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .take(SAMPLER_TIMERS as usize)
        .collect()
}

/// Runs `f` on a thread pinned to `cpu` (on this thread if `None`), so that what `f` starts
/// in the kernel starts on that CPU; if pinning fails, unpinned.
fn run_on<T: Send>(
    cpu: Option<usize>,
    f: impl FnOnce() -> Result<T, (&'static str, std::io::Error)> + Send,
) -> Result<T, (&'static str, std::io::Error)> {
    let Some(cpu) = cpu else {
        return f();
    };
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                // SAFETY: cpu_set_t is plain data; CPU_SET stays within it for cpu < CPU_SETSIZE.
                let pinned = unsafe {
                    let mut one: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(cpu, &mut one);
                    libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one)
                };
                if pinned != 0 {
                    // The CPU went offline or left the agent's cpuset since it was chosen: the
                    // timer then starts wherever this thread runs, which only weakens the
                    // spread, never the sampling.
                    tracing::debug!(
                        cpu,
                        error = %std::io::Error::last_os_error(),
                        "could not pin the thread starting a sampler timer"
                    );
                }
                f()
            })
            .join()
            .unwrap_or_else(|_| {
                Err((
                    "starting a sampler timer",
                    std::io::Error::other("the thread running the iterator panicked"),
                ))
            })
    })
}

fn lines_map<'a, T: aya::Pod>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<Array<&'a mut MapData, T>, ControlError> {
    let map = ebpf.map_mut(name).ok_or(LoadError::MissingMap(name))?;
    Array::try_from(map).map_err(|source| LoadError::Map { name, source }.into())
}

/// Opens a cgroup directory from its id (a kernfs file handle on the hierarchy's mount).
fn open_cgroup(mount: &File, cgroup: u64) -> std::io::Result<OwnedFd> {
    #[repr(C)]
    struct KernfsHandle {
        handle_bytes: u32,
        handle_type: libc::c_int,
        id: u64,
    }
    let mut handle = KernfsHandle {
        handle_bytes: 8,
        handle_type: FILEID_KERNFS,
        id: cgroup,
    };
    // SAFETY: `handle` has the layout of `struct file_handle` with an 8-byte payload; the kernel
    // reads `handle_bytes` bytes after the header and nothing else.
    let fd = unsafe {
        libc::open_by_handle_at(
            mount.as_raw_fd(),
            (&mut handle as *mut KernfsHandle).cast(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor the kernel just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Creates a cgroup iterator link on `dir` (that cgroup only) and runs it once.
fn run_cgroup_iterator(
    prog_fd: libc::c_int,
    dir: &OwnedFd,
) -> Result<(), (&'static str, std::io::Error)> {
    /// `union bpf_iter_link_info`, its `cgroup` member.
    #[repr(C)]
    struct IterCgroup {
        order: u32,
        cgroup_fd: u32,
        cgroup_id: u64,
    }
    /// `union bpf_attr`, its `link_create` member with `iter_info`, zero-padded to the size
    /// of the kernel's union so that every field we do not set is 0.
    #[repr(C, align(8))]
    struct LinkCreate {
        prog_fd: u32,
        target_fd: u32,
        attach_type: u32,
        flags: u32,
        iter_info: u64,
        iter_info_len: u32,
        _rest: [u8; 100],
    }
    let info = IterCgroup {
        order: BPF_CGROUP_ITER_SELF_ONLY,
        cgroup_fd: dir.as_raw_fd() as u32,
        cgroup_id: 0,
    };
    let attr = LinkCreate {
        prog_fd: prog_fd as u32,
        target_fd: 0,
        attach_type: BPF_TRACE_ITER,
        flags: 0,
        iter_info: &info as *const IterCgroup as u64,
        iter_info_len: std::mem::size_of::<IterCgroup>() as u32,
        _rest: [0; 100],
    };
    let link = bpf(BPF_LINK_CREATE, &attr).map_err(|e| ("creating the link", e))?;
    #[repr(C, align(8))]
    struct IterCreate {
        link_fd: u32,
        flags: u32,
        _rest: [u8; 8],
    }
    let create = IterCreate {
        link_fd: link.as_raw_fd() as u32,
        flags: 0,
        _rest: [0; 8],
    };
    let iter = bpf(BPF_ITER_CREATE, &create).map_err(|e| ("creating the iterator", e))?;
    let mut file = File::from(iter);
    let mut out = Vec::new();
    file.read_to_end(&mut out)
        .map_err(|e| ("running the iterator", e))?;
    Ok(())
}

/// `bpf(2)` with an attribute struct; returns the new file descriptor.
fn bpf<T>(cmd: libc::c_long, attr: &T) -> std::io::Result<OwnedFd> {
    // SAFETY: `attr` is a fully initialised `union bpf_attr` prefix of `size_of::<T>()` bytes;
    // the kernel only reads it (and the memory its pointers name, which outlives the call).
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *const T,
            std::mem::size_of::<T>(),
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = libc::c_int::try_from(r)
        .map_err(|_| std::io::Error::other("bpf(2) returned an out-of-range descriptor"))?;
    // SAFETY: a new descriptor the kernel just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
