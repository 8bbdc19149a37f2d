//! OOM kills, memory thresholds and ring-buffer losses on the real kernel.

use std::time::{Duration, Instant};

use node_agent::{
    ebpf::{KernelEvent, KernelPrograms, LoadOptions, MemoryChoice, MemoryMechanism, SamplerPace},
    probes::comm,
};
use node_agent_common::{DIRECTION_DOWN, DIRECTION_UP, OOM_CGROUP_LIMIT};
use node_agent_tests::{
    collect_events, fake_cluster::monotonic_ns, require_root, runtime, scaled, time_scale, Helper,
    TestCgroup,
};

const MEM_HELPER: &str = env!("CARGO_BIN_EXE_mem-helper");
const MIB: u64 = 1 << 20;

#[test]
fn an_oom_kill_in_a_small_cgroup_yields_one_event_naming_the_victim() -> anyhow::Result<()> {
    require_root();
    let cgroup = TestCgroup::new("oom")?;
    let id = cgroup.id();
    cgroup.set_memory_limit(32 * MIB)?;
    let rt = runtime();
    let mut programs = KernelPrograms::load()?;
    let mut events = rt.block_on(async { programs.events() })?;

    let mut helper = Helper::spawn(MEM_HELPER, &["oom".to_string()])?;
    let pid = helper.pid();
    cgroup.add(pid)?;
    helper.go()?;
    let signal = helper.wait_killed(Duration::from_secs(20))?;
    let killed_seen = Instant::now();
    assert_eq!(signal, libc::SIGKILL, "the OOM killer sends SIGKILL");

    let ooms = rt.block_on(collect_events(
        &mut events,
        Duration::from_secs(1),
        |e| matches!(e, KernelEvent::OomKill(o) if o.cgroup_id == id),
        |_| false,
    ))?;
    assert_eq!(ooms.len(), 1, "exactly one oom_kill event: {ooms:?}");
    let (KernelEvent::OomKill(oom), received) = ooms[0] else {
        unreachable!()
    };
    assert_eq!((oom.pid, oom.tgid), (pid, pid));
    assert_eq!(comm(&oom.comm), "mem-helper");
    assert_eq!(
        oom.constraint, OOM_CGROUP_LIMIT,
        "the cgroup's own limit was hit"
    );
    assert_eq!(oom.limit_cgroup_id, id);
    assert!(
        oom.anon_rss * 4096 > 16 * MIB,
        "victim's anon RSS is reported: {} pages",
        oom.anon_rss
    );
    assert!(
        received <= killed_seen + Duration::from_secs(1),
        "event arrived within 1 s of the kill"
    );
    Ok(())
}

/// The in-kernel memory mechanisms to prove on this kernel: the cheapest that attaches (what
/// the agent picks) and the sampler, which every supported kernel (6.1+) has. On a kernel where
/// fexit attaches both are tested; where it does not (this development host), the sampler is
/// the cheapest and is tested once.
fn mechanisms() -> anyhow::Result<Vec<MemoryChoice>> {
    let cheapest = KernelPrograms::load()?.memory_mechanism();
    Ok(match cheapest {
        MemoryMechanism::PageCounterFexit => {
            vec![MemoryChoice::PageCounterFexit, MemoryChoice::CounterSampler]
        }
        MemoryMechanism::CounterSampler => vec![MemoryChoice::CounterSampler],
        MemoryMechanism::Unavailable => {
            anyhow::bail!("no in-kernel memory mechanism attaches on this kernel")
        }
    })
}

fn load(memory: MemoryChoice) -> anyhow::Result<KernelPrograms> {
    Ok(KernelPrograms::load_with(&LoadOptions {
        memory,
        ..LoadOptions::default()
    })?)
}

#[test]
fn the_cheapest_memory_mechanism_that_attaches_is_chosen() -> anyhow::Result<()> {
    require_root();
    let chosen = KernelPrograms::load()?.memory_mechanism();
    match load(MemoryChoice::PageCounterFexit) {
        Ok(p) => {
            assert_eq!(p.memory_mechanism(), MemoryMechanism::PageCounterFexit);
            assert_eq!(
                chosen,
                MemoryMechanism::PageCounterFexit,
                "fexit attaches here"
            );
        }
        Err(refused) => {
            eprintln!("fexit refused on this kernel: {refused:#}");
            assert_eq!(
                chosen,
                MemoryMechanism::CounterSampler,
                "without fexit the sampler comes next"
            );
        }
    }
    let sampler = load(MemoryChoice::CounterSampler)?;
    assert_eq!(sampler.memory_mechanism(), MemoryMechanism::CounterSampler);
    Ok(())
}

#[test]
fn a_memory_threshold_reports_one_up_and_one_down_crossing() -> anyhow::Result<()> {
    require_root();
    for memory in mechanisms()? {
        up_and_down(memory).map_err(|e| e.context(format!("with {memory:?}")))?;
    }
    Ok(())
}

fn up_and_down(memory: MemoryChoice) -> anyhow::Result<()> {
    let cgroup = TestCgroup::new("threshold")?;
    let id = cgroup.id();
    let rt = runtime();
    let mut programs = load(memory)?;
    let (threshold, hysteresis) = (64 * MIB, 8 * MIB);
    programs.set_memory_threshold(id, threshold, hysteresis)?;
    let mut events = rt.block_on(async { programs.events() })?;
    let is_ours =
        move |e: &KernelEvent| matches!(e, KernelEvent::MemoryThreshold(m) if m.cgroup_id == id);
    let one = |v: &[KernelEvent]| !v.is_empty();

    let mut helper = Helper::spawn(MEM_HELPER, &["cross".to_string(), (128 * 1024).to_string()])?;
    cgroup.add(helper.pid())?;
    helper.go()?;
    assert!(helper.read_line()?.starts_with("held "));
    let held_usage = cgroup.memory_usage()?;
    let mut up = rt.block_on(collect_events(
        &mut events,
        scaled(Duration::from_secs(2)),
        is_ours,
        one,
    ))?;
    // Nothing more may come while the usage holds still.
    up.extend(rt.block_on(collect_events(
        &mut events,
        scaled(Duration::from_millis(100)),
        is_ours,
        |_| false,
    ))?);

    helper.go()?;
    assert_eq!(helper.read_line()?, "freed");
    let freed_usage = cgroup.memory_usage()?;
    let mut down = rt.block_on(collect_events(
        &mut events,
        scaled(Duration::from_secs(2)),
        is_ours,
        one,
    ))?;
    down.extend(rt.block_on(collect_events(
        &mut events,
        scaled(Duration::from_millis(100)),
        is_ours,
        |_| false,
    ))?);
    helper.go()?;
    helper.wait(scaled(Duration::from_secs(5)))?;

    assert_eq!(up.len(), 1, "one event for the up-crossing: {up:?}");
    let KernelEvent::MemoryThreshold(u) = up[0].0 else {
        unreachable!()
    };
    assert_eq!(u.direction, DIRECTION_UP);
    // The kernel reads the page counter memory.usage_in_bytes / memory.current report: at the
    // crossing it is at or above the line and at most what the helper went on to hold.
    assert!(
        u.usage_bytes >= threshold && u.usage_bytes <= held_usage,
        "usage at the up-crossing {} between the threshold {threshold} and the usage held {held_usage}",
        u.usage_bytes
    );
    assert!(
        held_usage >= 128 * MIB,
        "cgroupfs agrees the memory was charged: {held_usage}"
    );

    assert_eq!(down.len(), 1, "one event for the down-crossing: {down:?}");
    let KernelEvent::MemoryThreshold(d) = down[0].0 else {
        unreachable!()
    };
    assert_eq!(d.direction, DIRECTION_DOWN);
    assert!(
        d.usage_bytes < threshold - hysteresis,
        "down-crossing below threshold minus hysteresis"
    );
    assert!(
        freed_usage < threshold - hysteresis,
        "cgroupfs agrees: {freed_usage}"
    );
    Ok(())
}

/// The case a per-event trigger misses: a process charges just past the line and then sleeps,
/// so no further memory event follows the crossing. It must still be reported, within 10 ms of
/// the last charge by the kernel's own clock, with the figure cgroupfs shows. Here the helper
/// charges as fast as it can, far under the sampler's charge-rate bound.
#[test]
fn a_crossing_followed_by_silence_is_reported_within_10ms() -> anyhow::Result<()> {
    require_root();
    for memory in mechanisms()? {
        crossing_then_silence(load(memory)?, None, Charge::Fast)
            .map(drop)
            .map_err(|e| e.context(format!("with {memory:?}")))?;
    }
    Ok(())
}

/// The sampler's promise, by rate, at its slowest pace: it waits as long as the charge-rate
/// bound allows, so a line far away is read only every longest period; a charge at the bound
/// from there must still be reported within 10 ms of the crossing. The bound is lowered to one
/// the helper can be held under (256 MiB/s for the node), the helper charges at three quarters
/// of it, and the line starts far enough away that the first wait is the longest period (the
/// test checks the pace before the charge starts).
#[test]
fn a_crossing_at_the_charge_bound_from_the_slowest_pace_is_reported_within_10ms(
) -> anyhow::Result<()> {
    require_root();
    let defaults = LoadOptions::default();
    let bound = 256 * MIB / 1_000_000;
    let programs = KernelPrograms::load_with(&LoadOptions {
        memory: MemoryChoice::CounterSampler,
        sampler: SamplerPace {
            charge_bytes_per_us: Some(bound),
            ..defaults.sampler
        },
        ..defaults
    })?;
    // (96 MiB − one 2 MiB burst) at the bound is 367 ms: beyond the longest period.
    let charge = Charge::Paced {
        kib: 96 * 1024,
        bytes_per_s: bound * 1_000_000 * 3 / 4,
    };
    crossing_then_silence(programs, None, charge).map(drop)
}

/// The other half of the promise: a burst of the largest single charge (one 2 MiB transparent
/// huge page, charged whole when it is faulted in) that crosses a line is reported within
/// 10 ms, with the sampler at the agent's own pace and bound.
#[test]
fn a_crossing_by_one_huge_page_is_reported_within_10ms() -> anyhow::Result<()> {
    require_root();
    let programs = load(MemoryChoice::CounterSampler)?;
    crossing_then_silence(programs, None, Charge::Burst).map(drop)
}

/// The pace follows the distance to the line: a few ticks a second while every line is far
/// (an idle node is left asleep), every shortest period while one is near.
#[test]
fn the_sampler_ticks_rarely_while_every_line_is_far_and_often_near_one() -> anyhow::Result<()> {
    require_root();
    let mut programs = load(MemoryChoice::CounterSampler)?;
    let pace = programs
        .sampler_pace()
        .ok_or_else(|| anyhow::anyhow!("the sampler was asked for and is not loaded"))?;
    let far = TestCgroup::new("far")?;
    programs.set_memory_threshold(far.id(), far.memory_usage()? + (1 << 40), MIB)?;
    let rate = |programs: &mut KernelPrograms, over: Duration| -> anyhow::Result<f64> {
        // Past the ticks the line's setting starts with.
        std::thread::sleep(Duration::from_millis(50));
        let a = timers(programs)?.iter().map(|t| t.ticks).sum::<u64>();
        let started = Instant::now();
        std::thread::sleep(over);
        let b = timers(programs)?.iter().map(|t| t.ticks).sum::<u64>();
        Ok((b - a) as f64 / started.elapsed().as_secs_f64())
    };
    let far_rate = rate(&mut programs, Duration::from_secs(2))?;
    let slowest = 1.0 / pace.max_period.as_secs_f64();
    assert!(
        far_rate <= slowest + 1.0 && far_rate <= 10.0,
        "every line 1 TiB away: {far_rate:.1} ticks a second; expected at most one per longest \
         period ({:?}) and at most 10: an idle node is left asleep",
        pace.max_period
    );
    let near = TestCgroup::new("near")?;
    programs.set_memory_threshold(near.id(), near.memory_usage()? + MIB, 0)?;
    let near_rate = rate(&mut programs, Duration::from_millis(500))?;
    let fastest = 1.0 / pace.period.as_secs_f64();
    // Timers run late under emulation (the VM tests): a tenth of the pace is still far
    // above the far rate.
    assert!(
        near_rate >= fastest / 10.0 / f64::from(time_scale()).min(2.0) && near_rate > 20.0 * far_rate.max(1.0),
        "a line 1 MiB away: {near_rate:.0} ticks a second (shortest period {:?}); far: {far_rate:.1}",
        pace.period
    );
    Ok(())
}

/// A line set again closer than the usage (the daemon rewrites lines as the node's headroom
/// shrinks) is read at once, not after the longest period the far line before it allowed.
#[test]
fn a_line_moved_below_the_usage_is_reported_at_once() -> anyhow::Result<()> {
    require_root();
    let mut programs = load(MemoryChoice::CounterSampler)?;
    let cgroup = TestCgroup::new("moved")?;
    let id = cgroup.id();
    let rt = runtime();
    let mut helper = Helper::spawn(MEM_HELPER, &["hold".to_string(), "16".to_string()])?;
    cgroup.add(helper.pid())?;
    helper.go()?;
    assert_eq!(helper.read_line()?, "held");
    let usage = cgroup.memory_usage()?;
    programs.set_memory_threshold(id, usage + (1 << 40), MIB)?;
    let mut events = rt.block_on(async { programs.events() })?;
    // The far line's first ticks pass; from here the sampler waits its longest period.
    std::thread::sleep(Duration::from_millis(100));
    let before = monotonic_ns();
    programs.set_memory_threshold(id, usage - 8 * MIB, MIB)?;
    let up = rt.block_on(collect_events(
        &mut events,
        scaled(Duration::from_secs(2)),
        move |e| matches!(e, KernelEvent::MemoryThreshold(m) if m.cgroup_id == id),
        |v| !v.is_empty(),
    ))?;
    helper.go()?;
    assert_eq!(helper.read_line()?, "freed");
    helper.go()?;
    helper.wait(scaled(Duration::from_secs(5)))?;
    assert_eq!(up.len(), 1, "the moved line is reported crossed: {up:?}");
    let KernelEvent::MemoryThreshold(u) = up[0].0 else {
        unreachable!()
    };
    assert_eq!(u.direction, DIRECTION_UP);
    // What this proves is "at once, not after the far line's period": the far line had the
    // sampler waiting its longest period, 250 ms. How soon (the 10 ms promise) is a figure
    // of `cargo xtask bench`, not an assertion that a loaded machine can fail: here the
    // report must come well inside that period.
    let bound_ms = 100 * u64::from(time_scale());
    assert!(
        u.header.ktime_ns <= before + bound_ms * 1_000_000,
        "reported {:.2} ms after the line moved below the usage: not at once (within {bound_ms} ms, well inside the far line's 250 ms period)",
        u.header.ktime_ns.saturating_sub(before) as f64 / 1e6
    );
    Ok(())
}

/// The sampler's two timers run on two CPUs and take turns; when one stops ticking, as on a
/// vCPU the host deschedules, the other samples alone at the full pace and a crossing
/// followed by silence is still reported within 10 ms.
///
/// The sampler is loaded planning for no charge rate, so every tick waits the shortest
/// period: two timers that did not take turns would tick twice as often as one.
/// The DaemonSet grants the agent BPF and PERFMON alone. Without `CAP_DAC_READ_SEARCH` a
/// cgroup cannot be opened by its id (`open_by_handle_at`), which is how the sampler finds the
/// cgroup a line is on; on the real cluster its line on kubepods (allocatable memory) failed so,
/// and that signal was only read every resync. The line must be watched all the same.
#[test]
fn the_sampler_watches_a_line_without_cap_dac_read_search() -> anyhow::Result<()> {
    require_root();
    let mut programs = load(MemoryChoice::CounterSampler)?;
    let cgroup = TestCgroup::new("nodac")?;
    let id = cgroup.id();
    // This process only: nextest runs each test in one of its own.
    drop_capability(CAP_DAC_READ_SEARCH)?;
    let rt = runtime();
    let mut helper = Helper::spawn(MEM_HELPER, &["hold".to_string(), "16".to_string()])?;
    cgroup.add(helper.pid())?;
    helper.go()?;
    assert_eq!(helper.read_line()?, "held");
    let usage = cgroup.memory_usage()?;
    let mut events = rt.block_on(async { programs.events() })?;
    programs.set_memory_threshold(id, usage - 8 * MIB, MIB)?;
    let up = rt.block_on(collect_events(
        &mut events,
        scaled(Duration::from_secs(2)),
        move |e| matches!(e, KernelEvent::MemoryThreshold(m) if m.cgroup_id == id),
        |v| !v.is_empty(),
    ))?;
    helper.go()?;
    assert_eq!(helper.read_line()?, "freed");
    helper.go()?;
    helper.wait(scaled(Duration::from_secs(5)))?;
    assert_eq!(
        up.len(),
        1,
        "the line is watched and reported crossed: {up:?}"
    );
    Ok(())
}

/// `CAP_DAC_READ_SEARCH` (include/uapi/linux/capability.h).
const CAP_DAC_READ_SEARCH: u32 = 2;

/// Removes one capability from this process's effective, permitted and inheritable sets.
fn drop_capability(cap: u32) -> anyhow::Result<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: capget(2) with a v3 header and two data elements, as the ABI requires.
    if unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) } != 0 {
        anyhow::bail!("capget: {}", std::io::Error::last_os_error());
    }
    let (word, bit) = ((cap / 32) as usize, 1u32 << (cap % 32));
    data[word].effective &= !bit;
    data[word].permitted &= !bit;
    data[word].inheritable &= !bit;
    // SAFETY: as above.
    if unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) } != 0 {
        anyhow::bail!("capset: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

#[test]
fn a_stopped_sampler_timer_is_covered_by_the_other() -> anyhow::Result<()> {
    require_root();
    let defaults = LoadOptions::default();
    let period = defaults.sampler.period;
    let mut programs = KernelPrograms::load_with(&LoadOptions {
        memory: MemoryChoice::CounterSampler,
        sampler: SamplerPace {
            charge_bytes_per_us: Some(0),
            ..defaults.sampler
        },
        ..defaults
    })?;
    let cgroup = TestCgroup::new("turns")?;
    programs.set_memory_threshold(cgroup.id(), cgroup.memory_usage()? + 64 * MIB, MIB)?;

    let before = timers(&mut programs)?;
    let started = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    let after = timers(&mut programs)?;
    let elapsed = started.elapsed();
    let ticks: Vec<u64> = after
        .iter()
        .zip(&before)
        .map(|(a, b)| a.ticks - b.ticks)
        .collect();
    let total: u64 = ticks.iter().sum();
    let one_timer = elapsed.as_nanos() as f64 / period.as_nanos() as f64;
    assert!(
        total as f64 <= 1.5 * one_timer,
        "the timers take turns: {total} ticks in {elapsed:?} at one per {period:?}, {ticks:?} \
         per timer"
    );
    if agent_cpus() >= 2 {
        assert!(
            ticks.iter().all(|&t| t > 0) && after[0].cpu != after[1].cpu,
            "with two CPUs both timers tick, each on its own: {ticks:?} on CPUs {} and {}",
            after[0].cpu,
            after[1].cpu
        );
    } else {
        assert_eq!(
            ticks.iter().filter(|&&t| t > 0).count(),
            1,
            "one CPU, one timer: {ticks:?}"
        );
    }

    if agent_cpus() < 2 {
        // One timer and nothing to cover for it: the crossing is sampled by that one.
        return crossing_then_silence(programs, None, Charge::Fast).map(drop);
    }
    let running = ticks.iter().position(|&t| t > 0).unwrap_or(0) as u32;
    let other = running ^ 1;
    let alone_before = timers(&mut programs)?[other as usize].alone_ticks;
    let mut programs = crossing_then_silence(programs, Some(running), Charge::Fast)?;
    let now = timers(&mut programs)?;
    assert!(
        now[other as usize].alone_ticks > alone_before,
        "timer {other} samples alone once timer {running} stopped: {now:?}"
    );
    Ok(())
}

fn timers(programs: &mut KernelPrograms) -> anyhow::Result<Vec<node_agent_common::SamplerStats>> {
    programs
        .sampler_timer_stats()?
        .ok_or_else(|| anyhow::anyhow!("the sampler was asked for and is not loaded"))
}

/// CPUs this test (and so the programs it loads) may run on.
fn agent_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// How the helper charges up to the line.
#[derive(Debug, Clone, Copy)]
enum Charge {
    /// 48 MiB page by page, as fast as it can.
    Fast,
    /// `kib` page by page, never faster than `bytes_per_s`.
    Paced { kib: u64, bytes_per_s: u64 },
    /// One 2 MiB transparent huge page.
    Burst,
}

impl Charge {
    fn helper_args(self) -> Vec<String> {
        match self {
            Charge::Fast => vec!["cross".into(), (48 * 1024).to_string()],
            Charge::Paced { kib, bytes_per_s } => {
                vec!["ramp".into(), kib.to_string(), bytes_per_s.to_string()]
            }
            Charge::Burst => vec!["burst".into()],
        }
    }

    fn bytes(self) -> u64 {
        match self {
            Charge::Fast => 48 * MIB,
            Charge::Paced { kib, .. } => kib * 1024,
            Charge::Burst => 2 * MIB,
        }
    }
}

/// Runs the crossing and checks its report; `stop` names a sampler timer to stop once the
/// line is set (setting it starts both). With the sampler, a line that is more than the
/// longest period of charging away is first checked to be read at the slowest pace.
fn crossing_then_silence(
    mut programs: KernelPrograms,
    stop: Option<u32>,
    charge: Charge,
) -> anyhow::Result<KernelPrograms> {
    let cgroup = TestCgroup::new("silence")?;
    let id = cgroup.id();
    let rt = runtime();
    let mut helper = Helper::spawn(MEM_HELPER, &charge.helper_args())?;
    cgroup.add(helper.pid())?;
    // The line sits 128 KiB below where the helper ends: its last pages cross it.
    let line = cgroup.memory_usage()? + charge.bytes() - 128 * 1024;
    programs.set_memory_threshold(id, line, MIB)?;
    if let Some(timer) = stop {
        programs.stop_sampler_timer(timer)?;
    }
    if let (Charge::Paced { .. }, Some(pace)) = (charge, programs.sampler_pace()) {
        // The ticks the line's setting starts with pass, then the pace is the slowest.
        std::thread::sleep(Duration::from_millis(50));
        let a = timers(&mut programs)?.iter().map(|t| t.ticks).sum::<u64>();
        let quiet = pace.max_period * 3;
        std::thread::sleep(quiet);
        let b = timers(&mut programs)?.iter().map(|t| t.ticks).sum::<u64>();
        assert!(
            b - a <= 4,
            "before the charge the line is read at the slowest pace ({:?}): {} ticks in {quiet:?}",
            pace.max_period,
            b - a
        );
    }
    let mut events = rt.block_on(async { programs.events() })?;
    helper.go()?;
    let held = helper.read_line()?;
    let mut words = held.split_whitespace();
    let done_ns: u64 = match (words.next(), words.next().and_then(|n| n.parse().ok())) {
        (Some("held"), Some(ns)) => ns,
        _ => anyhow::bail!("mem-helper said {held:?}, expected `held NS`"),
    };
    let page = words
        .next()
        .map(|w| format!(" ({w} page)"))
        .unwrap_or_default();
    let resting = cgroup.memory_usage()?;
    let up = rt.block_on(collect_events(
        &mut events,
        scaled(Duration::from_secs(2)),
        move |e| matches!(e, KernelEvent::MemoryThreshold(m) if m.cgroup_id == id),
        |v| !v.is_empty(),
    ))?;
    helper.go()?;
    assert_eq!(helper.read_line()?, "freed");
    helper.go()?;
    helper.wait(scaled(Duration::from_secs(5)))?;

    assert_eq!(
        up.len(),
        1,
        "the crossing is reported while the helper sleeps: {up:?}"
    );
    let KernelEvent::MemoryThreshold(u) = up[0].0 else {
        unreachable!()
    };
    assert_eq!(u.direction, DIRECTION_UP);
    // 10 ms on hardware; under emulation (the VM tests) the guest's timers run late by the
    // emulator's factor, which the bound stretches by.
    let after_ms = u.header.ktime_ns.saturating_sub(done_ns) as f64 / 1e6;
    let bound_ms = 10 * u64::from(time_scale());
    // The sampler counts its ticks that ran over 5 ms late: the one way it can break the bound.
    let late = match programs.sampler_stats()? {
        Some(s) => {
            assert!(
                s.ticks > 0 && s.late_ticks <= s.ticks,
                "the sampler ticked and counted no more late ticks than ticks: {s:?}"
            );
            assert_eq!(
                s.late_ticks > 0,
                s.max_late_ns > node_agent_common::SAMPLER_LATE_NS,
                "a late tick is one over 5 ms late, and the worst is kept: {s:?}"
            );
            format!(
                "; sampler ticks over 5 ms late: {} (worst {:.1} ms)",
                s.late_ticks,
                s.max_late_ns as f64 / 1e6
            )
        }
        None => String::new(),
    };
    eprintln!("{charge:?}{page}: reported {after_ms:.2} ms after the last charge{late}");
    assert!(
        u.header.ktime_ns <= done_ns + bound_ms * 1_000_000,
        "{charge:?}{page}: reported {after_ms:.2} ms after the last charge (kernel clock), within \
         {bound_ms} ms{late}"
    );
    // A paced ramp is read while it still charges (the sampler keeps up with it): its usage at
    // the crossing lies between the line and where the ramp came to rest. The others are read
    // once their last pages are charged, give or take the kernel memory charged after them
    // (page tables, the pipe the helper answers on: seen up to 512 KiB, two charge batches).
    let below_rest = match charge {
        Charge::Paced { .. } => resting.saturating_sub(line),
        Charge::Fast | Charge::Burst => MIB,
    };
    assert!(
        u.usage_bytes >= line
            && u.usage_bytes <= resting + MIB
            && resting.saturating_sub(u.usage_bytes) <= below_rest,
        "usage at the crossing {} is the resting usage cgroupfs shows ({resting}) within {} KiB",
        u.usage_bytes,
        below_rest / 1024
    );
    Ok(programs)
}

#[test]
fn an_overflowed_ring_buffer_counts_its_losses() -> anyhow::Result<()> {
    require_root();
    let cgroup = TestCgroup::new("losses")?;
    let id = cgroup.id();
    let rt = runtime();
    // One page of ring buffer holds about 60 threshold events.
    let mut programs = KernelPrograms::load_with(&LoadOptions {
        ring_bytes: 4096,
        ..LoadOptions::default()
    })?;
    programs.set_memory_threshold(id, 16 * MIB, 0)?;
    let mut events = rt.block_on(async { programs.events() })?;

    // 300 round trips across the line, each an up- and a down-crossing, nothing drained.
    let mut helper = Helper::spawn(
        MEM_HELPER,
        &[
            "oscillate".to_string(),
            "8".to_string(),
            "24".to_string(),
            "300".to_string(),
        ],
    )?;
    cgroup.add(helper.pid())?;
    helper.go()?;
    assert_eq!(helper.read_line()?, "done");
    helper.wait(Duration::from_secs(30))?;

    // Stop the line so nothing more is sent, then drain what the ring kept.
    // Other tests' cgroups may add records meanwhile: drain until the books balance or a
    // bounded number of rounds passed.
    programs.clear_memory_threshold(id)?;
    let mut drained = Vec::new();
    let (mut lost, mut sent) = (0, 0);
    for _ in 0..10 {
        drained.extend(rt.block_on(collect_events(
            &mut events,
            Duration::from_millis(200),
            |_| true,
            |_| false,
        ))?);
        lost = programs.lost_events()?.iter().sum();
        sent = programs.sent_events()?.iter().sum();
        if drained.len() as u64 + lost == sent {
            break;
        }
    }
    assert!(
        lost > 0,
        "an overflow is counted, not hidden (drained {})",
        drained.len()
    );
    assert!(
        drained.len() <= 4096 / 48,
        "no more than the ring holds was delivered"
    );
    assert_eq!(
        drained.len() as u64 + lost,
        sent,
        "every record the kernel sent was delivered or counted lost"
    );
    Ok(())
}
