//! A PSI memory trigger on a ramp pushed into reclaim.
//!
//! PSI measures stall — time tasks wait for memory (reclaim, refaults) — not usage, so a ramp
//! that stays under its limit never fires it. This ramp reads a file through the page cache in
//! a memory cgroup limited to 16 MiB: once usage reaches the limit every new page needs reclaim,
//! and that reclaim is stall. "Detection" here is the time from the moment usage reached the
//! limit (within one 256 KiB charge batch; the allocator reads its usage after every page) to
//! the trigger's `POLLPRI`. The trigger is on the `memory.pressure` of a cgroup v2 group holding
//! only the helper when the v2 hierarchy is mounted, else the whole node's
//! `/proc/pressure/memory`, with the smallest window this host accepts.

use std::{
    io::Write as _,
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Context as _;

use super::{
    cgroups::{roots, BenchCgroup},
    child::make_ramp_file,
    median, mono_ns, quantile,
    ramp::Ramp,
    report::{ms, Row},
    Rng,
};

const MIB: u64 = 1 << 20;
const SECTION: &str = "latency";
/// Windows tried, smallest first (µs). Below 2 s the kernel wants CAP_SYS_RESOURCE.
const WINDOWS_US: [u64; 3] = [500_000, 1_000_000, 2_000_000];

/// An open PSI trigger.
struct Trigger {
    file: std::fs::File,
    window_us: u64,
    threshold_us: u64,
}

impl Trigger {
    /// The first window the kernel accepts, with a threshold of 1 % of it.
    fn open(pressure: &Path) -> anyhow::Result<(Self, Vec<String>)> {
        let mut refused = Vec::new();
        for window_us in WINDOWS_US {
            let threshold_us = window_us / 100;
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(pressure)
                .with_context(|| format!("opening {}", pressure.display()))?;
            let spec = format!("some {threshold_us} {window_us}\0");
            match file.write_all(spec.as_bytes()) {
                Ok(()) => {
                    return Ok((
                        Self {
                            file,
                            window_us,
                            threshold_us,
                        },
                        refused,
                    ))
                }
                Err(e) => refused.push(format!("{} ms ({e})", window_us / 1000)),
            }
        }
        anyhow::bail!(
            "{} accepts no PSI trigger; refused windows: {}",
            pressure.display(),
            refused.join(", ")
        )
    }

    /// Waits for the trigger; returns the CLOCK_MONOTONIC time it fired.
    fn wait(&self, timeout: Duration) -> Option<u64> {
        let mut pfd = libc::pollfd {
            fd: self.file.as_raw_fd(),
            events: libc::POLLPRI,
            revents: 0,
        };
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: polls one pollfd we own.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        let t = mono_ns();
        (n > 0 && pfd.revents & libc::POLLPRI != 0).then_some(t)
    }
}

pub fn run(
    rows: &mut Vec<Row>,
    crossings: usize,
    work_dir: &Path,
    rng: &mut Rng,
) -> anyhow::Result<()> {
    let (_, v2_root) = roots()?;
    let memcg = BenchCgroup::memory("psi")?;
    let v2 = match &v2_root {
        Some(root) => Some(BenchCgroup::under(root, "psi")?),
        None => None,
    };
    let pressure: PathBuf = match &v2 {
        Some(cg) if cg.path().join("memory.pressure").exists() => cg.path().join("memory.pressure"),
        _ => PathBuf::from("/proc/pressure/memory"),
    };
    let limit = 16 * MIB;
    memcg.set_memory_limit(limit)?;
    let file = work_dir.join("psi-ramp.bin");
    make_ramp_file(&file, 64 << 20)?;
    let extra: Vec<&BenchCgroup> = v2.iter().collect();
    let mut ramp = Ramp::file(&memcg, &extra, &file, limit - 256 * 1024)?;
    let (trigger, refused) = Trigger::open(&pressure)?;
    let window = Duration::from_micros(trigger.window_us);

    let mut latencies = Vec::new();
    let (mut missed, mut early) = (0, 0);
    for _ in 0..crossings {
        let _ = trigger.wait(Duration::ZERO);
        ramp.start_up()?;
        let fired = trigger.wait(3 * window + Duration::from_secs(1));
        let crossing = ramp.stop()?;
        ramp.down()?;
        match (crossing, fired) {
            (Some(c), Some(t)) if t >= c.t_ns => latencies.push((t - c.t_ns) as f64),
            (Some(_), Some(_)) => early += 1,
            _ => missed += 1,
        }
        // The trigger fires at most once per window: start the next ramp in a fresh one.
        std::thread::sleep(window + rng.duration(window));
    }
    drop(ramp);
    let _ = std::fs::remove_file(&file);

    let (p50, p99) = (
        median(&latencies).unwrap_or(f64::NAN),
        quantile(&latencies, 0.99).unwrap_or(f64::NAN),
    );
    let scope = if pressure.starts_with("/proc") {
        "/proc/pressure/memory (node-wide: no cgroup v2 hierarchy)".to_string()
    } else {
        "memory.pressure of the helper's own cgroup v2 group".to_string()
    };
    let mut note = format!(
        "n = {}; {scope}; trigger `some {} ms per {} ms`; detection = usage reaching the \
         16 MiB limit of a page-cache ramp (reclaim, i.e. stall, begins) → POLLPRI",
        latencies.len(),
        trigger.threshold_us / 1000,
        trigger.window_us / 1000,
    );
    if !refused.is_empty() {
        note.push_str(&format!(
            "; smaller windows refused: {}",
            refused.join(", ")
        ));
    }
    if missed > 0 {
        note.push_str(&format!(
            "; {missed} ramps without a trigger within 3 windows"
        ));
    }
    if early > 0 {
        note.push_str(&format!(
            "; {early} triggers before usage reached the limit"
        ));
    }
    rows.push(
        Row::info(
            SECTION,
            "PSI trigger, smallest window: limit reached → POLLPRI (p50 / p99)",
            format!("{} / {} ms", ms(p50), ms(p99)),
        )
        .value(p50 / 1e6, "ms")
        .note(note),
    );
    Ok(())
}
