//! Fork/exit counting and fork storms on the real kernel: trigger in a fresh cgroup, expect
//! exact figures.

use std::time::Duration;

use node_agent::ebpf::{KernelEvent, KernelPrograms};
use node_agent_tests::{collect_events, require_root, runtime, Helper, TestCgroup};

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
