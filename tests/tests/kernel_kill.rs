//! The executor's kill on the node against the real kernel (cgroup v1 here, v2 in the VM
//! tests): every process of a pod's cgroup tree is signalled, and nothing outside it; a cgroup
//! that is not the one verified is not touched.

use std::time::Duration;

use node_agent_executor::kill::{host::Host, kill_pod, release, KillError, KillTarget, Release};
use node_agent_tests::{move_into, require_root, Helper, TestCgroup};

const FORK_HELPER: &str = env!("CARGO_BIN_EXE_fork-helper");
const MEM_HELPER: &str = env!("CARGO_BIN_EXE_mem-helper");
const UID: &str = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";

fn target(dir: &std::path::Path) -> KillTarget {
    KillTarget {
        pod_uid: UID.into(),
        cgroup: dir.to_path_buf(),
        cgroup_id: node_agent::cgroup::cgroup_id(dir).expect("the pod's cgroup"),
    }
}

fn alive(pid: u32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

#[test]
fn every_process_of_the_pods_cgroup_tree_is_killed_and_nothing_outside_it() -> anyhow::Result<()> {
    require_root();
    let node = TestCgroup::new("kill")?;
    let pod = node.child(&format!("kubepods/burstable/pod{UID}"))?;
    let container = node.child(&format!("kubepods/burstable/pod{UID}/{}", "e".repeat(64)))?;
    let sandbox = node.child(&format!("kubepods/burstable/pod{UID}/{}", "f".repeat(64)))?;
    let outside = node.child("kubepods/burstable/podother/c")?;

    // The container: a helper with 200 children; its memory held by another helper.
    let mut forker = Helper::spawn(FORK_HELPER, &["200".into(), "hold".into()])?;
    move_into(&container, forker.pid())?;
    forker.go()?;
    anyhow::ensure!(
        forker.read_line()? == "forked",
        "the children did not start"
    );
    let mut holder = Helper::spawn(MEM_HELPER, &["hold".into(), "64".into()])?;
    move_into(&container, holder.pid())?;
    holder.go()?;
    anyhow::ensure!(holder.read_line()? == "held");
    let mut pause = Helper::spawn(MEM_HELPER, &["hold".into(), "1".into()])?;
    move_into(&sandbox, pause.pid())?;
    pause.go()?;
    anyhow::ensure!(pause.read_line()? == "held");
    let mut neighbour = Helper::spawn(MEM_HELPER, &["hold".into(), "1".into()])?;
    move_into(&outside, neighbour.pid())?;
    neighbour.go()?;
    anyhow::ensure!(neighbour.read_line()? == "held");

    let mut host = Host::new()?;
    let signalled = kill_pod(&mut host, &target(&pod), Duration::from_secs(1))?;
    let killed = signalled.killed.clone();
    assert!(killed.complete, "{killed:?}");
    assert_eq!(
        killed.signalled, 203,
        "the forker, its 200 children, the holder and the sandbox's process"
    );
    let released = release(&mut host, signalled);
    assert!(
        matches!(released, Release::Released { .. } | Release::Unavailable(_)),
        "{released:?}"
    );
    for helper in [&mut forker, &mut holder, &mut pause] {
        assert_eq!(helper.wait_killed(Duration::from_secs(10))?, libc::SIGKILL);
    }
    assert!(alive(neighbour.pid()), "the process outside the pod lives");
    // The tree is empty: nothing left to kill.
    let again = kill_pod(&mut host, &target(&pod), Duration::from_secs(1))?;
    assert_eq!(again.killed.signalled, 0);
    drop(node);
    Ok(())
}

#[test]
fn a_cgroup_made_anew_at_the_verified_path_is_not_touched() -> anyhow::Result<()> {
    require_root();
    let node = TestCgroup::new("kill-anew")?;
    let rel = format!("kubepods/burstable/pod{UID}");
    let pod = node.child(&rel)?;
    let verified = target(&pod);
    // The pod's cgroup goes and a new one is made at the same path (another pod's, a reused
    // UID): another id.
    std::fs::remove_dir(&pod)?;
    let pod = node.child(&rel)?;
    let mut inside = Helper::spawn(MEM_HELPER, &["hold".into(), "1".into()])?;
    move_into(&pod, inside.pid())?;
    inside.go()?;
    anyhow::ensure!(inside.read_line()? == "held");
    let mut host = Host::new()?;
    match kill_pod(&mut host, &verified, Duration::from_secs(1)) {
        Err(KillError::NotVerified { .. }) => {}
        other => anyhow::bail!("expected a refusal, got {other:?}"),
    }
    assert!(
        alive(inside.pid()),
        "nothing in the new cgroup is signalled"
    );
    drop(node);
    Ok(())
}
