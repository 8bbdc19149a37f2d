//! Fork/exit counting and fork storms on the real kernel: trigger in a fresh cgroup, expect
//! exact figures.

use std::time::Duration;

use node_agent::ebpf::{KernelEvent, KernelPrograms};
use node_agent_tests::{collect_events, require_root, runtime, scaled, Helper, TestCgroup};

const FORK_HELPER: &str = env!("CARGO_BIN_EXE_fork-helper");

#[test]
fn counts_exactly_the_forks_and_exits_of_a_tracked_cgroup() -> anyhow::Result<()> {
    require_root();
    const N: u32 = 25;
    let cgroup = TestCgroup::new("forks")?;
    let mut programs = KernelPrograms::load()?;
    programs.track_cgroup(cgroup.id())?;

    let mut helper = Helper::spawn(FORK_HELPER, &[N.to_string()])?;
    cgroup.add(helper.pid())?;
    helper.go()?;
    helper.wait(Duration::from_secs(10))?;

    let counts = programs
        .task_counts(cgroup.id())?
        .expect("cgroup is tracked");
    assert_eq!(
        counts.forks,
        u64::from(N),
        "forks counted in the test cgroup"
    );
    // The N children and the helper itself exited inside the cgroup: 0 live tasks remain.
    assert_eq!(
        counts.exits,
        u64::from(N) + 1,
        "exits counted in the test cgroup"
    );
    Ok(())
}

#[test]
fn does_not_count_untracked_cgroups() -> anyhow::Result<()> {
    require_root();
    let tracked = TestCgroup::new("tracked")?;
    let other = TestCgroup::new("untracked")?;
    let mut programs = KernelPrograms::load()?;
    programs.track_cgroup(tracked.id())?;

    let mut helper = Helper::spawn(FORK_HELPER, &["10".to_string()])?;
    other.add(helper.pid())?;
    helper.go()?;
    helper.wait(Duration::from_secs(10))?;

    let counts = programs
        .task_counts(tracked.id())?
        .expect("cgroup is tracked");
    assert_eq!(
        (counts.forks, counts.exits),
        (0, 0),
        "nothing ran in the tracked cgroup"
    );
    assert_eq!(
        programs.task_counts(other.id())?,
        None,
        "the other cgroup was never tracked"
    );
    Ok(())
}

#[test]
fn a_fork_burst_over_the_rate_yields_one_fork_storm_event() -> anyhow::Result<()> {
    require_root();
    let cgroup = TestCgroup::new("storm")?;
    let id = cgroup.id();
    let rt = runtime();
    let mut programs = KernelPrograms::load()?;
    programs.track_cgroup(id)?;
    // 200 forks in well under 10 s against a limit of 50 per 10 s: one storm, reported once.
    programs.set_fork_limit(id, 50, Duration::from_secs(10))?;
    let mut events = rt.block_on(async { programs.events() })?;

    let mut helper = Helper::spawn(FORK_HELPER, &["200".to_string()])?;
    cgroup.add(helper.pid())?;
    helper.go()?;
    helper.wait(Duration::from_secs(10))?;

    let storms = rt.block_on(collect_events(
        &mut events,
        Duration::from_millis(500),
        |e| matches!(e, KernelEvent::ForkStorm(s) if s.cgroup_id == id),
        |_| false,
    ))?;
    assert_eq!(
        storms.len(),
        1,
        "one fork_storm event per crossing: {storms:?}"
    );
    let KernelEvent::ForkStorm(storm) = storms[0].0 else {
        unreachable!()
    };
    assert_eq!(
        storm.forks_in_window, 51,
        "reported at the first fork over the limit"
    );
    assert_eq!(storm.pid, helper.pid(), "the forking parent is named");
    assert_eq!(programs.task_counts(id)?.expect("tracked").forks, 200);
    Ok(())
}

#[test]
fn each_fork_storm_after_a_quiet_window_is_reported_again() -> anyhow::Result<()> {
    require_root();
    let cgroup = TestCgroup::new("storms")?;
    let id = cgroup.id();
    let rt = runtime();
    let mut programs = KernelPrograms::load()?;
    programs.track_cgroup(id)?;
    // Three bursts of 120 forks against 50 per 200 ms, each after 600 ms of silence (three
    // windows without a fork): three storms, each reported once. Under emulation (the VM
    // tests) a fork takes milliseconds, so the window is scaled with the test's waits.
    let window = scaled(Duration::from_millis(200));
    programs.set_fork_limit(id, 50, window)?;
    let mut events = rt.block_on(async { programs.events() })?;
    for _ in 0..3 {
        std::thread::sleep(3 * window);
        let mut helper = Helper::spawn(FORK_HELPER, &["120".to_string()])?;
        cgroup.add(helper.pid())?;
        helper.go()?;
        helper.wait(Duration::from_secs(10))?;
    }
    let storms = rt.block_on(collect_events(
        &mut events,
        Duration::from_millis(500),
        |e| matches!(e, KernelEvent::ForkStorm(s) if s.cgroup_id == id),
        |_| false,
    ))?;
    assert_eq!(
        storms.len(),
        3,
        "one fork_storm event per storm: {storms:?}"
    );
    assert_eq!(programs.task_counts(id)?.expect("tracked").forks, 360);
    Ok(())
}

/// Live PIDs as the kernel counts them right now (the running/total field of /proc/loadavg
/// counts tasks, which is close to allocated PIDs; the test leaves a wide margin either way).
fn live_tasks() -> anyhow::Result<i64> {
    let text = std::fs::read_to_string("/proc/loadavg")?;
    let field = text
        .split_whitespace()
        .nth(3)
        .ok_or_else(|| anyhow::anyhow!("loadavg: {text}"))?;
    let total = field
        .split('/')
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("loadavg: {text}"))?;
    Ok(total.parse()?)
}

#[test]
fn pid_available_crossing_its_threshold_yields_one_event_each_way() -> anyhow::Result<()> {
    require_root();
    let cgroup = TestCgroup::new("pids")?;
    let rt = runtime();
    let mut programs = KernelPrograms::load()?;
    // pid.available starts about 600 above the threshold of 1000; holding 1200 more tasks
    // takes it about 600 below, and releasing them brings it back above threshold +
    // hysteresis. pid.available is node-wide, so nextest runs this test alone
    // (.config/nextest.toml): other tests' forks could cross the line back and forth.
    let (threshold, hysteresis) = (1000u64, 50u64);
    let limit = live_tasks()? as u64 + threshold + 600;
    programs.set_pid_threshold(limit, threshold, hysteresis)?;
    let mut events = rt.block_on(async { programs.events() })?;
    let is_pid = |e: &KernelEvent| matches!(e, KernelEvent::PidThreshold(_));

    let mut helper = Helper::spawn(FORK_HELPER, &["1200".to_string(), "hold".to_string()])?;
    cgroup.add(helper.pid())?;
    helper.go()?;
    assert_eq!(helper.read_line()?, "forked");
    let down = rt.block_on(collect_events(
        &mut events,
        Duration::from_millis(300),
        is_pid,
        |_| false,
    ))?;
    helper.go()?;
    helper.wait(Duration::from_secs(10))?;
    let up = rt.block_on(collect_events(
        &mut events,
        Duration::from_millis(300),
        is_pid,
        |_| false,
    ))?;

    assert_eq!(
        down.len(),
        1,
        "one event when pid.available fell below the threshold: {down:?}"
    );
    let KernelEvent::PidThreshold(d) = down[0].0 else {
        unreachable!()
    };
    assert_eq!(
        d.direction,
        node_agent_common::DIRECTION_UP,
        "threshold crossed (pressure up)"
    );
    assert!((d.limit as i64 - d.live) < threshold as i64);
    assert_eq!(up.len(), 1, "one event when it recovered: {up:?}");
    let KernelEvent::PidThreshold(u) = up[0].0 else {
        unreachable!()
    };
    assert_eq!(u.direction, node_agent_common::DIRECTION_DOWN);
    assert!((u.limit as i64 - u.live) > (threshold + hysteresis) as i64);
    Ok(())
}

#[test]
fn untracking_a_cgroup_without_limits_or_thresholds_is_not_an_error() -> anyhow::Result<()> {
    require_root();
    let cgroup = TestCgroup::new("untrack")?;
    let mut programs = KernelPrograms::load()?;
    programs.track_cgroup(cgroup.id())?;
    programs.untrack_cgroup(cgroup.id())?;
    programs.untrack_cgroup(cgroup.id())?;
    assert_eq!(programs.task_counts(cgroup.id())?, None);
    Ok(())
}
