//! Fork/exit counting on the real kernel: trigger in a fresh cgroup, then expect exact counts.

use std::time::Duration;

use node_agent::ebpf::KernelPrograms;
use node_agent_tests::{require_root, Helper, TestCgroup};

#[test]
fn counts_exactly_the_forks_and_exits_of_a_tracked_cgroup() -> anyhow::Result<()> {
    require_root();
    const N: u32 = 25;
    let cgroup = TestCgroup::new("forks")?;
    let mut programs = KernelPrograms::load()?;
    programs.track_cgroup(cgroup.id())?;

    let mut helper = Helper::spawn(env!("CARGO_BIN_EXE_fork-helper"), &[N.to_string()])?;
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
    // The N children and the helper itself exited inside the cgroup.
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

    let mut helper = Helper::spawn(env!("CARGO_BIN_EXE_fork-helper"), &["10".to_string()])?;
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
