//! OOM kills, memory thresholds and ring-buffer losses on the real kernel.

use std::time::{Duration, Instant};

use node_agent::ebpf::{events::comm, KernelEvent, KernelPrograms, LoadOptions, MemoryMechanism};
use node_agent_common::{DIRECTION_DOWN, DIRECTION_UP, OOM_CGROUP_LIMIT};
use node_agent_tests::{collect_events, require_root, runtime, Helper, TestCgroup};

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

#[test]
fn a_memory_threshold_reports_one_up_and_one_down_crossing() -> anyhow::Result<()> {
    require_root();
    let cgroup = TestCgroup::new("threshold")?;
    let id = cgroup.id();
    let rt = runtime();
    let mut programs = KernelPrograms::load()?;
    // Every kernel this is tested on (this host, the VM tests' 6.1, 6.12 and 6.18) has an
    // in-kernel mechanism: fexit on the page counter or the memcg tracepoints, never polling.
    let mechanism = programs.memory_mechanism();
    eprintln!("memory mechanism: {mechanism}");
    assert_ne!(
        mechanism,
        MemoryMechanism::Unavailable,
        "neither fexit on the page counter nor the memcg tracepoints attached"
    );
    let (threshold, hysteresis) = (64 * MIB, 8 * MIB);
    programs.set_memory_threshold(id, threshold, hysteresis)?;
    let mut events = rt.block_on(async { programs.events() })?;
    let is_ours =
        move |e: &KernelEvent| matches!(e, KernelEvent::MemoryThreshold(m) if m.cgroup_id == id);

    let mut helper = Helper::spawn(MEM_HELPER, &["hold".to_string(), "128".to_string()])?;
    cgroup.add(helper.pid())?;
    helper.go()?;
    assert_eq!(helper.read_line()?, "held");
    let held_usage = cgroup.memory_usage()?;
    let up = rt.block_on(collect_events(
        &mut events,
        Duration::from_millis(500),
        is_ours,
        |_| false,
    ))?;

    helper.go()?;
    assert_eq!(helper.read_line()?, "freed");
    let freed_usage = cgroup.memory_usage()?;
    let down = rt.block_on(collect_events(
        &mut events,
        Duration::from_millis(500),
        is_ours,
        |_| false,
    ))?;
    helper.go()?;
    helper.wait(Duration::from_secs(5))?;

    assert_eq!(up.len(), 1, "one event for the up-crossing: {up:?}");
    let KernelEvent::MemoryThreshold(u) = up[0].0 else {
        unreachable!()
    };
    assert_eq!(u.direction, DIRECTION_UP);
    // The kernel reads the same page counter as memory.usage_in_bytes / memory.current, so
    // the figure at the crossing lies between the threshold and the threshold plus one
    // allocation step (1 MiB) and the per-CPU charge batch; 2 MiB covers both.
    assert!(
        (threshold..threshold + 2 * MIB).contains(&u.usage_bytes),
        "usage at the up-crossing {} within 2 MiB above the threshold (cgroupfs when held: {held_usage})",
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

#[test]
fn an_overflowed_ring_buffer_counts_its_losses() -> anyhow::Result<()> {
    require_root();
    let cgroup = TestCgroup::new("losses")?;
    let id = cgroup.id();
    let rt = runtime();
    // One page of ring buffer holds about 60 threshold events.
    let mut programs = KernelPrograms::load_with(&LoadOptions { ring_bytes: 4096 })?;
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

    let lost: u64 = programs.lost_events()?.iter().sum();
    let drained = rt.block_on(collect_events(
        &mut events,
        Duration::from_millis(300),
        |_| true,
        |_| false,
    ))?;
    assert!(
        lost > 0,
        "an overflow is counted, not hidden (drained {})",
        drained.len()
    );
    assert!(
        drained.len() <= 4096 / 48,
        "no more than the ring holds was delivered"
    );
    Ok(())
}
