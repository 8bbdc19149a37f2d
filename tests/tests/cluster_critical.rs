//! Critical pods are never evicted, on the real kubelet: a static pod from the kubelet's
//! manifest directory (its mirror pod in the API) and a pod of priority class
//! `system-node-critical`, each the kubelet's ranking's first choice, are passed over, and
//! the next pod is killed on the node.

use std::time::Duration;

use node_agent_tests::real_cluster::{wait_running, Qos, RealCluster, Variant, WorkloadPod};

/// Removes the static pod's manifest (the kubelet then deletes the pod) when dropped.
struct StaticPod(std::path::PathBuf);

impl Drop for StaticPod {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn a_static_pod_and_a_system_node_critical_pod_are_passed_over_and_the_next_pod_goes(
) -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    rc.install("critical", &Variant::enforcing())?;
    let node = rc.node0().name;
    let agent = rc.agent_pod(&node, "node-agent")?;
    let ns = rc.namespace("critical");

    // A static pod: the kubelet reads it from its staticPodPath and creates its mirror pod.
    let manifests = rc.cluster.layout.node_dir(&rc.node0()).join("manifests");
    let mut static_pod = WorkloadPod::new(
        "static-hog",
        Qos::BestEffort,
        "",
        &["memory", "1200", "400"],
    );
    static_pod.name = "static-hog".into();
    let path = manifests.join("static-hog.yaml");
    std::fs::write(&path, static_pod.manifest(&ns.name))?;
    let _static = StaticPod(path);
    let mirror = format!("static-hog-{node}");
    // A system-node-critical pod, as big.
    let mut critical = WorkloadPod::new(
        "critical-hog",
        Qos::BestEffort,
        "",
        &["memory", "1200", "400"],
    );
    critical.priority_class = Some("system-node-critical".into());
    critical.node = Some(node.clone());
    // An ordinary pod, smaller: the one that may go.
    let mut ordinary = WorkloadPod::new("ordinary", Qos::BestEffort, "", &["memory", "300", "300"]);
    ordinary.node = Some(node.clone());
    rc.kubectl.apply(&critical.manifest(&ns.name))?;
    rc.kubectl.apply(&ordinary.manifest(&ns.name))?;
    wait_running(
        &rc.kubectl,
        &ns.name,
        &[&mirror, "critical-hog", "ordinary"],
        Duration::from_secs(120),
    )?;
    let mirror_pod = rc.kubectl.get_json(&["-n", &ns.name, "pod", &mirror])?;
    assert!(
        mirror_pod["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_string(),
        "the static pod's API object is a mirror pod"
    );
    rc.kubectl
        .wait_for("the pods hold their memory", Duration::from_secs(60), |k| {
            let all = [&mirror, "critical-hog", "ordinary"]
                .iter()
                .map(|p| k.run(&["-n", &ns.name, "logs", p]))
                .collect::<anyhow::Result<Vec<_>>>()?;
            Ok(all.iter().all(|l| l.contains("phase=held")).then_some(()))
        })?;
    std::thread::sleep(Duration::from_secs(3));

    // Pressure past the agent's line: a grower within its request, which never ranks first,
    // sized from the headroom read fresh as well as from the agent's figure (which can be a
    // resync old, from before the hogs held all they hold): sized from a stale figure alone it
    // overshot by more than the ordinary pod gives back, and the agent then rightly evicted
    // the grower too (CI, once).
    rc.grow_to_headroom(&ns.name, &node, &agent, "grower", 150.0, 200)?;

    // The ordinary pod is killed on the node and recorded; the critical ones stay, their
    // containers never restarted (a kill would show as a restart in place).
    rc.wait_killed_by_agent(&ns.name, "ordinary", Duration::from_secs(120))?;
    for pod in [mirror.as_str(), "critical-hog", "grower"] {
        let p = rc.kubectl.get_json(&["-n", &ns.name, "pod", pod])?;
        assert_eq!(
            p["status"]["phase"], "Running",
            "{pod} stays; its status: {}",
            p["status"]
        );
        let restarts = p["status"]["containerStatuses"][0]["restartCount"].as_i64();
        assert_eq!(restarts, Some(0), "{pod} was never killed");
    }
    let ends = rc.agent_pod_ends(&ns.name)?;
    let ended: Vec<&str> = ends.iter().map(|e| e.pod.as_str()).collect();
    assert!(
        !ended.is_empty() && ended.iter().all(|p| *p == "ordinary"),
        "the agent wrote the end of no critical pod: {ends:?}"
    );
    Ok(())
}
