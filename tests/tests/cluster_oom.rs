//! OOM kills where users look, on the real kubelet: the kernel kills a container over its
//! limit, the kubelet reports `OOMKilled`, and the agent's `NodeAgentOOMKill` event is on the
//! pod (`kubectl describe pod`); a storm of kills in one container is one event with a series,
//! and each kill is counted on /metrics.

use std::time::Duration;

use node_agent_tests::real_cluster::{
    metric_value, wait_running, Qos, RealCluster, Variant, WorkloadPod,
};
use serde_json::Value;

fn oom_events(rc: &RealCluster, ns: &str, pod: &str) -> anyhow::Result<Vec<Value>> {
    // events.k8s.io/v1, as the agent writes them (series and note are fields of that API).
    let list = rc
        .kubectl
        .get_json(&["-n", ns, "events.v1.events.k8s.io"])?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["reason"] == "NodeAgentOOMKill" && e["regarding"]["name"] == pod)
        .cloned()
        .collect())
}

#[test]
fn a_container_over_its_limit_is_oomkilled_and_the_agents_event_is_on_the_pod() -> anyhow::Result<()>
{
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    // The base install is a dry run, which writes no event: enforcing.
    rc.install("oom", &Variant::enforcing())?;
    let node = rc.node0().name;
    let ns = rc.namespace("oom");
    let mut pod = WorkloadPod::new("hog", Qos::Burstable, "32Mi", &["memory", "200", "50"]);
    pod.memory_limit = Some("64Mi".into());
    pod.node = Some(node.clone());
    rc.kubectl.apply(&pod.manifest(&ns.name))?;

    // The kubelet's word: OOMKilled.
    let terminated =
        rc.kubectl
            .wait_for("the container terminated", Duration::from_secs(120), |k| {
                let p = k.get_json(&["-n", &ns.name, "pod", "hog"])?;
                Ok(p["status"]["containerStatuses"][0]["state"]["terminated"]
                    .as_object()
                    .cloned())
            })?;
    assert_eq!(
        terminated["reason"], "OOMKilled",
        "the kubelet's reason: {terminated:?}"
    );

    // The agent's event, on the pod, related to the node, naming the container and the limit.
    let events = rc.kubectl.wait_for(
        "the agent's OOM event on the pod",
        Duration::from_secs(60),
        |_| {
            let e = oom_events(&rc, &ns.name, "hog")?;
            Ok((!e.is_empty()).then_some(e))
        },
    )?;
    assert_eq!(events.len(), 1, "one event: {events:?}");
    let e = &events[0];
    assert_eq!(e["action"], "OOMKilling");
    assert_eq!(e["related"]["kind"], "Node");
    assert_eq!(e["related"]["name"], node.as_str());
    let note = e["note"].as_str().unwrap_or("");
    assert!(
        note.contains("main"),
        "the note names the container: {note}"
    );
    assert!(
        note.contains("pod-workload"),
        "the note names the process: {note}"
    );
    let described = rc
        .kubectl
        .run(&["-n", &ns.name, "describe", "pod", "hog"])?;
    assert!(
        described.contains("NodeAgentOOMKill") && described.contains("OOMKilled"),
        "kubectl describe pod shows the kubelet's reason and the agent's event:\n{described}"
    );
    Ok(())
}

#[test]
fn a_storm_of_kills_in_one_container_is_one_event_with_a_series_and_every_kill_is_counted(
) -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    rc.install("oom-storm", &Variant::enforcing())?;
    let node = rc.node0().name;
    let agent = rc.agent_pod(&node, "node-agent")?;
    let ns = rc.namespace("oomstorm");
    // A shell that starts a 200 MiB hog again and again under a 64 MiB limit: the kernel kills
    // each hog (the largest process), never the shell. Eight kills, then the shell sleeps.
    let mut pod = WorkloadPod::new("storm", Qos::Burstable, "32Mi", &[]);
    pod.memory_limit = Some("64Mi".into());
    pod.node = Some(node.clone());
    pod.extra_container.push(
        "      command: [\"/bin/sh\", \"-c\", \"i=0; while [ $i -lt 8 ]; do /bin/pod-workload memory 200; i=$((i+1)); done; echo storm-done; exec /bin/pod-workload sleep\"]".into(),
    );
    rc.kubectl.apply(&pod.manifest(&ns.name))?;
    wait_running(&rc.kubectl, &ns.name, &["storm"], Duration::from_secs(90))?;
    rc.kubectl
        .wait_for("eight kills", Duration::from_secs(120), |k| {
            Ok(k.run(&["-n", &ns.name, "logs", "storm"])?
                .contains("storm-done")
                .then_some(()))
        })?;
    let series = format!(
        "node_agent_oom_kills_total{{namespace=\"{}\",container=\"main\",reason=\"cgroup_limit\"}}",
        ns.name
    );
    rc.kubectl
        .wait_for("eight kills counted", Duration::from_secs(60), |_| {
            let text = rc.agent_metrics(&agent)?;
            Ok((metric_value(&text, &series) == Some(8.0)).then_some(()))
        })?;
    // One event, its series counting every kill (merged at most every 2 s: wait for the last).
    let event = rc.kubectl.wait_for(
        "one event whose series counts 8",
        Duration::from_secs(60),
        |_| {
            let e = oom_events(&rc, &ns.name, "storm")?;
            Ok((e.len() == 1 && e[0]["series"]["count"] == 8).then(|| e[0].clone()))
        },
    );
    let event = match event {
        Ok(e) => e,
        Err(err) => panic!("{err:#}; events: {:?}", oom_events(&rc, &ns.name, "storm")),
    };
    assert!(event["series"]["lastObservedTime"].is_string(), "{event}");
    Ok(())
}
