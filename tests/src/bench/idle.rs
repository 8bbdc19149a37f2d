//! What an idle daemon costs the whole node, lines far: `node-agent run` (standalone, the
//! kubelet's default memory threshold only, see [`super::kube::standalone_config_text`]; on
//! this node every line is gigabytes away) against no daemon, in alternated
//! windows (with/without, then without/with), each pair's difference a sample:
//!
//! - timer wake-ups per second: local timer interrupts plus `TIMER` and `HRTIMER` softirqs,
//!   summed over CPUs ([`super::meter::Wakeups`]). An idle CPU sleeps between them; each one is
//!   a CPU woken (or a busy one interrupted).
//! - busy + steal: `/proc/stat` user, nice, system, irq, softirq and steal, in percent of one
//!   core. Steal is time a woken vCPU waited for the host; counting it with busy time makes
//!   the row see what the sampler's ticks cost on a shared host as well as on bare metal.
//! - the daemon's own CPU.
//!
//! The meter is checked the same way with a known load: a thread of the bench that sleeps
//! 10 ms at a time, 100 wake-ups per second, against none.

use std::{
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use super::{
    meter::{process_cpu_ns, NodeJiffies, Wakeups},
    report::Row,
    stats::{mean_ci, Interval},
    stress::Daemon,
};

const SECTION: &str = "footprint";
/// The known load the meter is checked with: wake-ups per second.
pub const INJECTED_HZ: u64 = 100;
/// After a daemon starts or stops, or the load starts, this long passes before a window.
const SETTLE: Duration = Duration::from_secs(2);

pub struct Options {
    pub pairs: usize,
    pub window: Duration,
}

/// One window's readings.
#[derive(Debug, Clone, Copy, Default)]
struct Window {
    /// Wake-ups per second: (interrupts, timer softirqs, hrtimer softirqs).
    wakeups: (f64, f64, f64),
    busy: f64,
    steal: f64,
}

impl Window {
    fn wakeups(&self) -> f64 {
        self.wakeups.0 + self.wakeups.1 + self.wakeups.2
    }
}

fn window(length: Duration) -> anyhow::Result<Window> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (w0, j0, t0) = (Wakeups::read()?, NodeJiffies::read()?, Instant::now());
    std::thread::sleep(length);
    let (w1, j1, secs) = (
        Wakeups::read()?,
        NodeJiffies::read()?,
        t0.elapsed().as_secs_f64(),
    );
    let rate = |a: u64, b: u64| b.saturating_sub(a) as f64 / secs;
    let (busy, steal) = j0.shares_since(&j1, cpus);
    Ok(Window {
        wakeups: (
            rate(w0.local_timer, w1.local_timer),
            rate(w0.timer_softirq, w1.timer_softirq),
            rate(w0.hrtimer_softirq, w1.hrtimer_softirq),
        ),
        busy,
        steal,
    })
}

/// Alternated pairs of windows without and with `on` running (`on` starts it and returns a
/// guard that stops it when dropped, and is asked for its side readings while it runs).
fn pairs<G>(
    opts: &Options,
    mut on: impl FnMut() -> anyhow::Result<G>,
    mut during: impl FnMut(&mut G, Duration) -> anyhow::Result<Window>,
) -> anyhow::Result<Vec<(Window, Window)>> {
    let mut out = Vec::new();
    for pair in 0..opts.pairs {
        let mut got = [Window::default(); 2];
        let order = if pair % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for with in order {
            if with {
                let mut guard = on()?;
                std::thread::sleep(SETTLE);
                got[1] = during(&mut guard, opts.window)?;
                drop(guard);
            } else {
                std::thread::sleep(SETTLE);
                got[0] = window(opts.window)?;
            }
        }
        out.push((got[0], got[1]));
    }
    Ok(out)
}

fn diffs(pairs: &[(Window, Window)], f: impl Fn(&Window) -> f64) -> Vec<f64> {
    pairs.iter().map(|(off, on)| f(on) - f(off)).collect()
}

fn mean(pairs: &[(Window, Window)], f: impl Fn(&(Window, Window)) -> f64) -> f64 {
    pairs.iter().map(f).sum::<f64>() / pairs.len().max(1) as f64
}

/// `node_agent_memory_sampler_ticks_total` from the daemon's `/metrics` (0 when the sampler is
/// not its memory mechanism).
fn sampler_ticks(port: u16) -> anyhow::Result<f64> {
    let text = crate::fake_cluster::http_get(port, "/metrics")?;
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix("node_agent_memory_sampler_ticks_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0))
}

/// The daemon's rows.
pub fn daemon(
    rows: &mut Vec<Row>,
    agent: &Path,
    work_dir: &Path,
    opts: &Options,
) -> anyhow::Result<()> {
    // Per "with" window: the daemon's own CPU (% of a core) and its sampler's ticks per second.
    let mut own: Vec<f64> = Vec::new();
    let mut ticks: Vec<f64> = Vec::new();
    let measured = pairs(
        opts,
        || Daemon::start(agent, work_dir),
        |d, length| {
            let (c0, k0, t0) = (
                process_cpu_ns(d.pid())?,
                sampler_ticks(d.port())?,
                Instant::now(),
            );
            let w = window(length)?;
            let secs = t0.elapsed().as_secs_f64();
            let (c1, k1) = (process_cpu_ns(d.pid())?, sampler_ticks(d.port())?);
            own.push((c1 - c0) as f64 / (secs * 1e9) * 100.0);
            ticks.push((k1 - k0) / secs);
            Ok(w)
        },
    )?;
    let n = measured.len();
    let setup = format!(
        "{n} alternated pairs of {:.0} s windows without and with `node-agent run` \
         (standalone, `memory.available<100Mi` only: every line gigabytes away), 2 s after each \
         start or stop",
        opts.window.as_secs_f64()
    );
    let ticks_mean = ticks.iter().sum::<f64>() / ticks.len().max(1) as f64;
    if let Some(ci) = mean_ci(&diffs(&measured, Window::wakeups)) {
        let part = |f: fn(&Window) -> f64| mean(&measured, |(off, on)| f(on) - f(off));
        rows.push(
            Row::info(
                SECTION,
                "daemon idle, lines far: timer wake-ups per second, with − without",
                format!("{} /s", ci.show(1, true)),
            )
            .estimate(ci, "wake-ups/s")
            .at_most("≤ +20 /s (upper end)", 20.0)
            .note(format!(
                "{}; local timer interrupts + TIMER + HRTIMER softirqs over all CPUs \
                 (/proc/interrupts, /proc/softirqs); {setup}; by kind (means of the \
                 differences): interrupts {:+.1}, TIMER {:+.1}, HRTIMER {:+.1}; {:.1} /s \
                 without (mean); the daemon's sampler ticked {ticks_mean:.1} times a second \
                 (its /metrics)",
                ci.describe("mean of the pairs' differences"),
                part(|w| w.wakeups.0),
                part(|w| w.wakeups.1),
                part(|w| w.wakeups.2),
                mean(&measured, |(off, _)| off.wakeups()),
            )),
        );
    }
    if let Some(ci) = mean_ci(&diffs(&measured, |w| w.busy + w.steal)) {
        rows.push(
            Row::info(
                SECTION,
                "daemon idle, lines far: busy + steal, with − without",
                format!("{} % of one core", ci.show(3, true)),
            )
            .estimate(ci, "% of a core")
            .below("< 0.5 % (upper end)", 0.5)
            .note(format!(
                "{}; /proc/stat user + nice + system + irq + softirq + steal, all CPUs; \
                 {setup}; busy {:+.3}, steal {:+.3} (means of the differences); {:.3} % \
                 busy + steal without (mean). Steal is time a runnable vCPU waited for the \
                 host: a woken idle vCPU pays it on a shared host, 0 on bare metal",
                ci.describe("mean of the pairs' differences"),
                mean(&measured, |(off, on)| on.busy - off.busy),
                mean(&measured, |(off, on)| on.steal - off.steal),
                mean(&measured, |(off, _)| off.busy + off.steal),
            )),
        );
    }
    if let Some(ci) = mean_ci(&own) {
        rows.push(
            Row::info(
                SECTION,
                "daemon idle CPU (its own threads), standalone",
                format!("{} % of one core", ci.show(3, false)),
            )
            .estimate(ci, "% of a core")
            .below("< 0.5 % (upper end)", 0.5)
            .note(format!(
                "{}; the daemon's threads (schedstat) in the \"with\" windows above",
                ci.describe("mean of the windows")
            )),
        );
    }
    Ok(())
}

/// A thread sleeping `1 / hz` at a time until dropped: a known periodic load.
struct Sleeper {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<u64>>,
}

impl Sleeper {
    fn start(hz: u64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let handle = std::thread::spawn(move || {
            let period = Duration::from_nanos(1_000_000_000 / hz);
            let mut next = Instant::now() + period;
            let mut wakes = 0;
            while !stopping.load(Ordering::Relaxed) {
                if let Some(left) = next.checked_duration_since(Instant::now()) {
                    std::thread::sleep(left);
                }
                wakes += 1;
                next += period;
            }
            wakes
        });
        Self {
            stop,
            handle: Some(handle),
        }
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// The meter, checked: the increase it measures with a thread waking [`INJECTED_HZ`] times a
/// second must lie, interval and all, within 0.8 to 1.5 wake-ups per injected one.
pub fn meter(rows: &mut Vec<Row>, opts: &Options) -> anyhow::Result<()> {
    let measured = pairs(opts, || Ok(Sleeper::start(INJECTED_HZ)), |_, l| window(l))?;
    let Some(ci) = mean_ci(&diffs(&measured, Window::wakeups)) else {
        return Ok(());
    };
    let injected = INJECTED_HZ as f64;
    let per: Interval = ci.scaled(1.0 / injected);
    let met = per.lo >= 0.8 && per.hi <= 1.5;
    let part = |f: fn(&Window) -> f64| mean(&measured, |(off, on)| f(on) - f(off));
    rows.push(
        Row::info(
            SECTION,
            format!(
                "wake-up meter check: a thread waking {INJECTED_HZ} times a second, with − without"
            ),
            format!("{} /s", ci.show(1, true)),
        )
        .estimate(ci, "wake-ups/s")
        .target("0.8 … 1.5 per injected wake-up, whole interval", met)
        .note(format!(
            "{}; {:.2} … {:.2} per injected wake-up; the same meter and windows as the daemon's \
             row ({} pairs of {:.0} s); by kind (means of the differences): interrupts {:+.1}, \
             TIMER {:+.1}, HRTIMER {:+.1}",
            ci.describe("mean of the pairs' differences"),
            per.lo,
            per.hi,
            measured.len(),
            opts.window.as_secs_f64(),
            part(|w| w.wakeups.0),
            part(|w| w.wakeups.1),
            part(|w| w.wakeups.2),
        )),
    );
    Ok(())
}
