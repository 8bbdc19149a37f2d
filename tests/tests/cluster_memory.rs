//! Memory pressure on a real node, with the real kubelet, API server and scheduler: the agent
//! kills the pod the kubelet's ranking names on the node, as the kubelet does for a hard
//! threshold, and records it `Failed`/`Evicted` through the API; the kubelet ends what is left
//! of it and never restarts it in place, its controller replaces it, what the agent wrote is
//! where users look, and the taint keeps the scheduler away while the pressure lasts.

use std::time::{Duration, Instant};

use node_agent_tests::real_cluster::{
    disruption_target, evicted_by_kubelet, wait_running, Qos, RealCluster, Variant, WorkloadPod,
};
use node_agent_tests::real_node::condition;
use serde_json::Value;

const MIB: f64 = 1048576.0;

/// The agent's headroom on `allocatableMemory.available` (bytes), from its /metrics.
fn allocatable_headroom(rc: &RealCluster, agent: &str) -> anyhow::Result<f64> {
    rc.metric(
        agent,
        "node_agent_signal_available_bytes{eviction_signal=\"allocatableMemory.available\"}",
    )?
    .ok_or_else(|| anyhow::anyhow!("the agent exports no allocatableMemory.available"))
}

/// The agent's own `EvictionThresholdMet` events on `node`, as (name, resourceVersion): a new
/// one, or one updated (a series counted on), shows a new pair.
fn agent_threshold_events(
    rc: &RealCluster,
    node: &str,
) -> anyhow::Result<std::collections::BTreeSet<(String, String)>> {
    let events = rc.kubectl.get_json(&[
        "events",
        "-n",
        "default",
        "--field-selector",
        &format!("involvedObject.name={node}"),
    ])?;
    Ok(events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| {
            e["reason"] == "EvictionThresholdMet"
                && e["reportingComponent"] == node_agent_kube::events::REPORTING_CONTROLLER
        })
        .map(|e| {
            (
                e["metadata"]["name"].as_str().unwrap_or("").to_string(),
                e["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
            )
        })
        .collect())
}

fn node_taints(rc: &RealCluster, node: &str) -> anyhow::Result<Vec<String>> {
    let n = rc.kubectl.get_json(&["node", node])?;
    Ok(n["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["key"].as_str().map(str::to_string))
        .collect())
}

#[test]
fn the_agent_evicts_the_pod_the_kubelets_ranking_names_and_the_taint_keeps_new_pods_away(
) -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    let node = rc.node0().name;
    // Enforcing, with the shipped config but a short transition period, so that the taint's
    // leaving is seen within the test (the shipped 5m would hold it five minutes).
    let config = Variant::shipped_config_with(&[(
        "evictionPressureTransitionPeriod: \"5m\"",
        "evictionPressureTransitionPeriod: \"20s\"",
    )]);
    rc.install(
        "memory",
        &Variant {
            config: Some(config),
            ..Variant::enforcing()
        },
    )?;
    let agent = rc.agent_pod(&node, "node-agent")?;
    let ns = rc.namespace("memory");
    let started = Instant::now();
    let spec = rc.node0();
    let kubelet_mark = node_agent_tests::real_node::kubelet_log_mark(&rc, &spec)?;
    let threshold_events_before = agent_threshold_events(&rc, &node)?;

    // Three QoS classes, four pods, each of the rankings a shortcut would make naming another:
    // BestEffort holds 600 MiB over its request of 0; a Burstable pod ("overcommitted") holds
    // 800 MiB on a request of 64Mi (736 MiB over); the grower, Burstable too, grows to just
    // past the agent's line (allocatableMemory.available < 200Mi, copied from
    // memory.available as the kubelet copies it) and stays above the kubelet's (100Mi), so
    // only the agent acts, 400 MiB over its request whatever the node's size. All three
    // exceed their requests; the kubelet's ranking takes the one exceeding by more:
    // "overcommitted", not BestEffort (a BestEffort-first shortcut), nor the grower (the
    // largest, and the one that grew).
    let mut g = WorkloadPod::new("guaranteed", Qos::Guaranteed, "256Mi", &["memory", "128"]);
    let mut be = WorkloadPod::new("besteffort", Qos::BestEffort, "", &["memory", "600", "500"]);
    let mut over = WorkloadPod::new(
        "overcommitted",
        Qos::Burstable,
        "64Mi",
        &["memory", "800", "500"],
    );
    for p in [&mut g, &mut be, &mut over] {
        p.node = Some(node.clone());
        rc.kubectl.apply(&p.manifest(&ns.name))?;
    }
    wait_running(
        &rc.kubectl,
        &ns.name,
        &["guaranteed", "besteffort", "overcommitted"],
        Duration::from_secs(90),
    )?;
    // Wait for both to hold their memory, then size the grower from the agent's own figure.
    rc.wait_held(
        &ns.name,
        &["guaranteed", "besteffort", "overcommitted"],
        Duration::from_secs(60),
    )?;
    // The agent's exported figure is as old as its last evaluation (up to a resyncInterval):
    // read the same quantity fresh from the pods cgroup too, and take the smaller, or the
    // grower overshoots by what the other pods charged since.
    let fresh = node_agent_tests::real_node::pods_cgroup_available(&spec)?;
    let headroom = fresh.min(allocatable_headroom(&rc, &agent)?);
    let target_mib = ((headroom / MIB) - 150.0).floor() as u64;
    assert!(
        target_mib > 1024 + 400,
        "the node has room for the test's grower: headroom {:.0} MiB",
        headroom / MIB
    );
    let mut grower = WorkloadPod::new(
        "grower",
        Qos::Burstable,
        &format!("{}Mi", target_mib - 400),
        &["memory", &target_mib.to_string(), "100"],
    );
    grower.node = Some(node.clone());
    rc.kubectl.apply(&grower.manifest(&ns.name))?;
    wait_running(&rc.kubectl, &ns.name, &["grower"], Duration::from_secs(90))?;
    let victim_uid = rc.kubectl.run(&[
        "-n",
        &ns.name,
        "get",
        "pod",
        "overcommitted",
        "-o",
        "jsonpath={.metadata.uid}",
    ])?;

    // The agent kills "overcommitted" on the node and records it as the kubelet's eviction leaves a
    // pod: Failed, the kubelet's condition with its message; the kubelet removes its cgroup.
    let killed = rc.wait_killed_by_agent(&ns.name, "overcommitted", Duration::from_secs(120))?;
    let evicted_after = started.elapsed();
    let disruption = disruption_target(&killed);
    assert_eq!(disruption["reason"], "TerminationByKubelet", "{killed}");
    assert!(
        disruption["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("The node was low on resource: memory")),
        "the kubelet's message: {killed}"
    );
    let cgroup = format!(
        "/sys/fs/cgroup/memory/kubepods/burstable/pod{}",
        victim_uid.trim()
    );
    rc.kubectl.wait_for(
        "the evicted pod's cgroup removed by the kubelet",
        Duration::from_secs(60),
        |_| Ok((!std::path::Path::new(&cgroup).exists()).then_some(())),
    )?;
    // Once the kubelet has ended it, the record stands: Failed, the condition; the kubelet
    // neither restarted it in place nor put a phase of its own back.
    let ended = rc
        .kubectl
        .get_json(&["-n", &ns.name, "pod", "overcommitted"])?;
    assert_eq!(ended["status"]["phase"], "Failed", "{ended}");
    assert_eq!(
        disruption_target(&ended)["reason"],
        "TerminationByKubelet",
        "{ended}"
    );
    eprintln!(
        "the killed pod once the kubelet ended it: reason {} (the agent wrote Evicted), restarts {}",
        ended["status"]["reason"], ended["status"]["containerStatuses"][0]["restartCount"]
    );
    for survivor in ["guaranteed", "besteffort", "grower"] {
        let phase = rc.kubectl.run(&[
            "-n",
            &ns.name,
            "get",
            "pod",
            survivor,
            "-o",
            "jsonpath={.status.phase}",
        ])?;
        assert_eq!(phase.trim(), "Running", "{survivor} was not evicted");
    }

    // The taint keeps a new pod off the node while the condition is True.
    // The agent's taint, and no other: the kubelet saw no pressure of its own (it would add
    // node.kubernetes.io/memory-pressure).
    assert_eq!(
        node_taints(&rc, &node)?,
        vec!["node-agent.io/pressure".to_string()],
        "the pressure taint alone is on the node after the eviction"
    );
    let c = condition(&rc, &node, "NodeAgentPressure")?.expect("the agent's condition");
    assert_eq!(c["status"], "True", "NodeAgentPressure: {c}");
    let mut late = WorkloadPod::new("late", Qos::BestEffort, "", &["sleep"]);
    late.labels.push(("wants".into(), node.clone()));
    late.extra_spec.push(format!(
        "  nodeSelector: {{kubernetes.io/hostname: {node}}}"
    ));
    rc.kubectl.apply(&late.manifest(&ns.name))?;
    rc.kubectl.wait_for(
        "the scheduler refusing the new pod for the taint",
        Duration::from_secs(30),
        |k| {
            let events = k.get_json(&[
                "-n",
                &ns.name,
                "events",
                "--field-selector",
                "involvedObject.name=late",
            ])?;
            Ok(events["items"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|e| {
                    // The 1.37 scheduler names no taint key ("1 node(s) had untolerated taint(s)"):
                    // the agent's is the node's only one (above).
                    e["reason"] == "FailedScheduling"
                        && e["message"]
                            .as_str()
                            .is_some_and(|m| m.contains("untolerated taint"))
                })
                .then_some(()))
        },
    )?;
    let phase = rc.kubectl.run(&[
        "-n",
        &ns.name,
        "get",
        "pod",
        "late",
        "-o",
        "jsonpath={.status.phase}",
    ])?;
    assert_eq!(phase.trim(), "Pending", "the tainted node took no new pod");

    // The pressure is gone: after the transition period the condition clears, the taint
    // leaves, and the scheduler places the pod.
    wait_running(&rc.kubectl, &ns.name, &["late"], Duration::from_secs(120))?;
    assert!(
        !node_taints(&rc, &node)?
            .iter()
            .any(|t| t == "node-agent.io/pressure"),
        "the taint left"
    );
    let c = condition(&rc, &node, "NodeAgentPressure")?.expect("the agent's condition");
    assert_eq!(c["status"], "False", "NodeAgentPressure: {c}");

    // Where users look: the Evicted event on the pod (it outlives the pod), with the kubelet's
    // sentence and the agent's figures, and the node's EvictionThresholdMet.
    let events = rc.kubectl.get_json(&["-n", &ns.name, "events"])?;
    let evicted: Vec<&Value> = events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["reason"] == "Evicted" && e["involvedObject"]["name"] == "overcommitted")
        .collect();
    assert_eq!(evicted.len(), 1, "one Evicted event on the pod: {events}");
    let message = evicted[0]["message"].as_str().unwrap_or("");
    assert!(
        message.contains("The node was low on resource: memory"),
        "the kubelet's sentence: {message}"
    );
    // The agent's own, written in this test: not the kubelet's, nor one from before.
    let threshold_events = agent_threshold_events(&rc, &node)?;
    assert!(
        threshold_events
            .difference(&threshold_events_before)
            .next()
            .is_some(),
        "the agent's EvictionThresholdMet on the node, new or counted on in this test: {threshold_events:?}"
    );
    let described = rc.kubectl.run(&["describe", "node", &node])?;
    assert!(
        described.contains("NodeAgentPressure"),
        "kubectl describe node shows the condition"
    );

    // Killed on the node and recorded by the agent's service account (its pods/status
    // patch, answered 200): no Eviction through the API at all.
    let ends = rc.agent_pod_ends(&ns.name)?;
    let records: Vec<_> = ends.iter().filter(|e| e.kind == "status").collect();
    assert!(
        !records.is_empty()
            && records
                .iter()
                .all(|e| e.pod == "overcommitted" && e.code == 200),
        "the agent's records: {ends:?}"
    );
    assert!(
        ends.iter().all(|e| e.kind != "eviction"),
        "no Eviction asked: {ends:?}"
    );

    // The kubelet evicted nothing of its own: no eviction in its log since the test began, and
    // no pod but the one the agent recorded left ended by an eviction (Failed with reason
    // Evicted, or ended with the kubelet's DisruptionTarget condition).
    // Read whole from the mark (an error if the log no longer covers the window): its ranking
    // line (it kills right after) or its eviction line for any of the test's pods.
    let kubelet_log = node_agent_tests::real_node::kubelet_log_since(&rc, &spec, kubelet_mark)?;
    let kubelet_acted: Vec<&str> = kubelet_log
        .lines()
        .filter(|l| {
            (l.contains("pod is evicted successfully") || l.contains("pods ranked for eviction"))
                && l.contains(&format!("{}/", ns.name))
        })
        .collect();
    assert!(
        kubelet_acted.is_empty(),
        "no kubelet eviction in its log: {kubelet_acted:?}"
    );
    let pods = rc.kubectl.get_json(&["-n", &ns.name, "pods"])?;
    let evicted: Vec<&str> = pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| evicted_by_kubelet(p))
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    assert_eq!(evicted, ["overcommitted"], "only the agent's: {pods}");
    let metric = rc.metric(
        &agent,
        "node_agent_evictions_total{eviction_signal=\"allocatableMemory.available\",result=\"killed\"}",
    )?;
    assert_eq!(metric, Some(1.0), "the agent counted its kill");
    eprintln!(
        "evicted {evicted_after:?} after the pods were created; agent {agent}; namespace {}",
        ns.name
    );
    Ok(())
}

/// The Evicted event of a pod whose containers make its note long (ten containers with
/// 63-character names: 1486 bytes before it is cut) is one the real API server takes.
#[test]
fn a_long_evicted_note_is_cut_to_what_the_api_server_takes() -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    rc.install("long-note", &Variant::enforcing())?;
    let node = rc.node0().name;
    let agent = rc.agent_pod(&node, "node-agent")?;
    let ns = rc.namespace("longnote");
    let mut wide = WorkloadPod::new("wide", Qos::BestEffort, "", &["memory", "60", "60"]);
    wide.node = Some(node.clone());
    // Nine more containers, each named with 63 characters (the longest a name may be).
    for i in 1..10 {
        let name = format!("c{i}-{}", "x".repeat(60));
        wide.extra_spec.push(String::new());
        wide.extra_container.push(format!(
            "    - name: {name}\n      image: {}\n      imagePullPolicy: Never\n      args: [\"memory\", \"60\", \"60\"]",
            node_agent_cluster::images::WORKLOAD_IMAGE
        ));
    }
    wide.extra_spec.retain(|l| !l.is_empty());
    rc.kubectl.apply(&wide.manifest(&ns.name))?;
    wait_running(&rc.kubectl, &ns.name, &["wide"], Duration::from_secs(120))?;
    rc.kubectl.wait_for(
        "every container holds its memory",
        Duration::from_secs(90),
        |k| {
            let p = k.get_json(&["-n", &ns.name, "pod", "wide"])?;
            let names: Vec<String> = p["spec"]["containers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["name"].as_str().map(str::to_string))
                .collect();
            for c in &names {
                if !k
                    .run(&["-n", &ns.name, "logs", "wide", "-c", c])?
                    .contains("phase=held")
                {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        },
    )?;
    rc.grow_to_headroom(&ns.name, &node, &agent, "grower", 150.0, 300)?;
    rc.wait_killed_by_agent(&ns.name, "wide", Duration::from_secs(120))?;
    let events = rc
        .kubectl
        .get_json(&["-n", &ns.name, "events.v1.events.k8s.io"])?;
    let evicted: Vec<&Value> = events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["reason"] == "Evicted" && e["regarding"]["name"] == "wide")
        .collect();
    assert_eq!(evicted.len(), 1, "the Evicted event was taken: {events}");
    let note = evicted[0]["note"].as_str().unwrap_or("");
    assert!(note.len() <= 1024, "cut to 1024 bytes: {}", note.len());
    assert!(note.contains("c1-"), "it names the containers: {note}");
    let refused = rc.metric(
        &agent,
        "node_agent_kube_errors_total{operation=\"pod event\"}",
    )?;
    assert_eq!(refused, Some(0.0), "no event refused");
    Ok(())
}
