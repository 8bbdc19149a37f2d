//! The real cluster's own life: `up` after a crash cleans up first, a component that cannot
//! start is named with its log, and `down` leaves the host as `up` found it. `cargo xtask
//! cluster test` runs this file last: it ends the cluster.

use std::time::Duration;

use node_agent_cluster::{
    down::HostSnapshot, images::Archive, node_components::KubeletOptions, state::State, UpOptions,
};
use node_agent_tests::real_cluster::RealCluster;

#[test]
fn after_a_crash_up_cleans_up_and_down_leaves_the_host_as_it_found_it() -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let layout = rc.cluster.layout.clone();
    let before: HostSnapshot = {
        let path = std::env::var("NODE_AGENT_HOST_BEFORE_UP")
            .expect("NODE_AGENT_HOST_BEFORE_UP: run with `cargo xtask cluster test`");
        serde_json::from_slice(&std::fs::read(&path)?)?
    };
    let agent_image = Archive {
        reference: std::env::var("NODE_AGENT_IMAGE")
            .expect("NODE_AGENT_IMAGE: run with `cargo xtask cluster test`"),
        path: std::env::var("NODE_AGENT_IMAGE_ARCHIVE")
            .expect("NODE_AGENT_IMAGE_ARCHIVE: run with `cargo xtask cluster test`")
            .into(),
    };

    // A crash: every process the cluster started, SIGKILLed at once. Containers, their shims
    // and the pods' cgroups stay, and so do the nodes' namespaces (the shims hold them).
    let state = State::load(&layout.state())?.expect("a running cluster has a state file");
    let killed: Vec<u32> = state
        .processes
        .iter()
        .filter(|p| p.is_running())
        .map(|p| p.pid)
        .collect();
    assert!(
        killed.len() >= 8,
        "the cluster's processes: {:?}",
        state.processes
    );
    for pid in &killed {
        // SAFETY: kill(2) of a process the cluster's state names, still the one it started.
        unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
    }
    std::thread::sleep(Duration::from_secs(1));
    let left = HostSnapshot::take(&layout)?;
    assert!(
        left.cgroups.iter().any(|c| c.ends_with("/kubepods")),
        "the crash left the pods' cgroups: {:?}",
        left.cgroups
    );

    // A component that cannot start is named, with the last lines of its log: here the API
    // server's forward to this host, its port taken by someone else.
    let squatter = std::net::TcpListener::bind(("127.0.0.1", layout.host_port()))?;
    let refused = rc
        .cluster
        .up(&UpOptions {
            extra_nodes: 0,
            kubelet: KubeletOptions::default(),
            agent_image: None,
        })
        .expect_err("up with the API server's port taken");
    let said = format!("{refused:#}");
    assert!(
        said.contains(&format!("127.0.0.1:{}", layout.host_port()))
            && said.contains("holder-node-agent-0"),
        "the error names the component and the port: {said}"
    );
    drop(squatter);

    // `up` cleans up what the crash and the failed up left, then comes up with the agent
    // Ready.
    rc.cluster.up(&UpOptions {
        extra_nodes: 0,
        kubelet: KubeletOptions::default(),
        agent_image: Some(agent_image),
    })?;
    let pods = rc
        .kubectl
        .run(&["-n", "node-agent", "get", "pods", "-o", "name"])?;
    assert_eq!(
        pods.lines().count(),
        1,
        "one agent pod after the new up: {pods}"
    );

    // `down` leaves nothing: processes, mounts, cgroups, loop devices, interfaces, firewall
    // rules, named namespaces, the node paths kubeadm uses on a host.
    rc.cluster.down()?;
    let after = HostSnapshot::take(&layout)?;
    let differences = before.differences(&after);
    assert!(
        differences.is_empty(),
        "the host differs from before the first up:\n{}",
        differences.join("\n")
    );
    assert!(!layout.state().exists(), "no state file after down");
    Ok(())
}
