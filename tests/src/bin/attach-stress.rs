//! Attaches and detaches the agent's kernel programs over and over while other processes start
//! and fault pages in a memory cgroup: the loop `cargo xtask vm-stress` runs inside a VM to find
//! out whether that can crash the kernel (a 6.18 guest once oopsed with `int3` at the memcg
//! tracepoint's patch site in `count_memcg_events` while programs were attached or detached).
//!
//! - `attach-stress toggle OBJECT ROUNDS [PROGRAM,...]`: loads the eBPF object once, loads
//!   every BTF tracepoint, fentry and fexit program that this kernel accepts (or those named),
//!   then per round attaches them all, waits 0-3 ms, and detaches them all.
//! - `attach-stress reload ROUNDS`: per round loads and attaches the agent's programs with
//!   `KernelPrograms::load()`, as `node-agent trace` does, waits 0-3 ms, and drops them.
//!
//! It refuses to run unless the kernel command line has `node_agent_vmtest` (xtask's VMs):
//! crashing the kernel is what it looks for, so never on a development host.

use std::{
    process::ExitCode,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use aya::programs::{BtfTracePoint, FEntry, FExit, Program};

const CGROUP: &str = "/sys/fs/cgroup/attach-stress";
const FAULT_MIB: usize = 4;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = match args.as_slice() {
        ["toggle", object, rounds] => guarded(|| toggle(object, rounds, None)),
        ["toggle", object, rounds, names] => guarded(|| toggle(object, rounds, Some(names))),
        ["reload", rounds] => guarded(|| reload(rounds)),
        ["load"] => load(),
        _ => Err(anyhow::anyhow!(
            "usage: attach-stress toggle OBJECT ROUNDS [PROGRAM,...] | reload ROUNDS"
        )),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("attach-stress: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn guarded(body: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<()> {
    let cmdline = std::fs::read_to_string("/proc/cmdline").context("reading /proc/cmdline")?;
    if !cmdline.split_whitespace().any(|w| w == "node_agent_vmtest") {
        bail!(
            "refusing to run: this stresses kernel code patching and may crash the kernel; it \
             runs only in the VMs of `cargo xtask vm-stress` (kernel command line \
             `node_agent_vmtest`)"
        );
    }
    // The load runs in a process of its own, started before any program is loaded: children
    // forked from this one would hold copies of the link descriptors, so a detach would not
    // take effect until they exit and the next attach would find the program still attached.
    std::fs::create_dir_all(CGROUP).context("creating the stress cgroup")?;
    std::fs::write(format!("{CGROUP}/memory.max"), (512u64 << 20).to_string())
        .context("limiting the stress cgroup (is the memory controller enabled?)")?;
    std::fs::write(
        format!("{CGROUP}/cgroup.procs"),
        std::process::id().to_string(),
    )
    .context("moving into the stress cgroup")?;
    let mut load = std::process::Command::new("/proc/self/exe")
        .arg("load")
        .stdin(std::process::Stdio::piped())
        .spawn()
        .context("starting the load process")?;
    let result = body();
    drop(load.stdin.take()); // EOF: the load process stops, reports and exits.
    load.wait().context("waiting for the load process")?;
    result
}

/// The load process: one thread per CPU forking children that fault pages, until stdin closes.
fn load() -> anyhow::Result<()> {
    let load = Load::start();
    let mut line = String::new();
    while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {
        line.clear();
    }
    let (children, secs) = load.stop();
    println!("attach-stress: load: {children} processes started and faulted {FAULT_MIB} MiB each in {secs:.0} s");
    Ok(())
}

fn rounds(text: &str) -> anyhow::Result<u32> {
    text.parse()
        .with_context(|| format!("ROUNDS {text:?} is not a count"))
}

/// Loads every program this kernel accepts once, then attaches and detaches them per round.
fn toggle(object: &str, rounds_text: &str, names: Option<&str>) -> anyhow::Result<()> {
    let rounds = rounds(rounds_text)?;
    let bytes = std::fs::read(object).with_context(|| format!("reading {object}"))?;
    let btf = aya::Btf::from_sys_fs().context("reading the kernel's BTF")?;
    let mut ebpf = aya::EbpfLoader::new()
        .btf(Some(&btf))
        .load(&bytes)
        .context("loading the eBPF object")?;
    let wanted: Option<Vec<&str>> = names.map(|n| n.split(',').collect());
    let mut loaded = Vec::new();
    let names: Vec<String> = ebpf.programs().map(|(n, _)| n.to_string()).collect();
    for name in names {
        if wanted.as_ref().is_some_and(|w| !w.contains(&name.as_str())) {
            continue;
        }
        let program = ebpf.program_mut(&name).expect("listed just now");
        // Each program is named after the function or tracepoint it attaches to.
        let result = match program {
            Program::BtfTracePoint(p) => p.load(&name, &btf),
            Program::FEntry(p) => p.load(&name, &btf),
            Program::FExit(p) => p.load(&name, &btf),
            _ => continue,
        };
        match result {
            Ok(()) => loaded.push(name),
            Err(e) => println!("attach-stress: {name} does not load here: {e}"),
        }
    }
    if loaded.is_empty() {
        bail!("no program of the object loads on this kernel");
    }
    println!("attach-stress: toggling {}", loaded.join(" "));
    let started = Instant::now();
    let mut rng = Rng::seeded();
    for round in 1..=rounds {
        let mut links = Vec::new();
        for name in &loaded {
            links.push(attach(ebpf.program_mut(name).expect("loaded"))?);
        }
        std::thread::sleep(Duration::from_micros(rng.below(3000)));
        for (name, link) in loaded.iter().zip(links) {
            detach(ebpf.program_mut(name).expect("loaded"), link)?;
        }
        progress("toggle", round, rounds, started);
    }
    Ok(())
}

/// A link to detach: aya's link ids are per program type.
enum Link {
    Tp(aya::programs::tp_btf::BtfTracePointLinkId),
    Entry(aya::programs::fentry::FEntryLinkId),
    Exit(aya::programs::fexit::FExitLinkId),
}

fn attach(program: &mut Program) -> anyhow::Result<Link> {
    Ok(match program {
        Program::BtfTracePoint(p) => Link::Tp(BtfTracePoint::attach(p)?),
        Program::FEntry(p) => Link::Entry(FEntry::attach(p)?),
        Program::FExit(p) => Link::Exit(FExit::attach(p)?),
        _ => bail!("not a tracing program"),
    })
}

fn detach(program: &mut Program, link: Link) -> anyhow::Result<()> {
    match (program, link) {
        (Program::BtfTracePoint(p), Link::Tp(l)) => p.detach(l)?,
        (Program::FEntry(p), Link::Entry(l)) => p.detach(l)?,
        (Program::FExit(p), Link::Exit(l)) => p.detach(l)?,
        _ => bail!("link of another program type"),
    }
    Ok(())
}

/// The agent's own load path, start to finish, per round.
fn reload(rounds_text: &str) -> anyhow::Result<()> {
    let rounds = rounds(rounds_text)?;
    let started = Instant::now();
    let mut rng = Rng::seeded();
    for round in 1..=rounds {
        let programs = node_agent::ebpf::KernelPrograms::load()?;
        if round == 1 {
            println!(
                "attach-stress: memory mechanism: {}",
                programs.memory_mechanism()
            );
        }
        std::thread::sleep(Duration::from_micros(rng.below(3000)));
        drop(programs);
        progress("reload", round, rounds, started);
    }
    Ok(())
}

fn progress(what: &str, round: u32, rounds: u32, started: Instant) {
    if round == rounds || round.is_multiple_of((rounds / 10).max(1)) {
        println!(
            "attach-stress: {what} round {round}/{rounds} after {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
}

/// One thread per CPU, each forking a child over and over that maps [`FAULT_MIB`] MiB, writes
/// every page and exits: fresh processes faulting pages, in the stress's memory cgroup (so
/// every page is charged to a memcg).
struct Load {
    stop: Arc<AtomicBool>,
    started: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
    since: Instant,
}

impl Load {
    fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let started = Arc::new(AtomicU64::new(0));
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = (0..workers)
            .map(|_| {
                let (stop, started) = (stop.clone(), started.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        if let Err(e) = fork_and_fault() {
                            eprintln!("attach-stress: a fault process failed: {e}");
                            std::thread::sleep(Duration::from_millis(100));
                        }
                        started.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        Self {
            stop,
            started,
            threads,
            since: Instant::now(),
        }
    }

    fn stop(self) -> (u64, f64) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
        (
            self.started.load(Ordering::Relaxed),
            self.since.elapsed().as_secs_f64(),
        )
    }
}

/// Forks a child that faults [`FAULT_MIB`] MiB of fresh anonymous memory and exits, and waits
/// for it. The child makes only async-signal-safe calls (mmap, stores, _exit), as a child of
/// a multi-threaded process must.
fn fork_and_fault() -> std::io::Result<()> {
    let bytes = FAULT_MIB << 20;
    // SAFETY: fork has no memory-safety preconditions; the child below calls only
    // async-signal-safe functions before _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: a private anonymous mapping, checked before use, written within its length.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if p == libc::MAP_FAILED {
                libc::_exit(1);
            }
            for offset in (0..bytes).step_by(4096) {
                p.cast::<u8>().add(offset).write_volatile(1);
            }
            libc::_exit(0);
        }
    }
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    if unsafe { libc::waitpid(pid, &mut status, 0) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        return Err(std::io::Error::other(format!("child status {status:#x}")));
    }
    Ok(())
}

/// xorshift64: the waits only need to vary.
struct Rng(u64);

impl Rng {
    fn seeded() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.subsec_nanos());
        Self(u64::from(nanos) | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}
