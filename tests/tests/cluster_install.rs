//! Installing and rolling out as the README says, on the real cluster: the base observes (its
//! decisions in trace and metrics, and nothing but reads in the API server's audit log), a
//! node label hands the node to the enforcing DaemonSet through the real DaemonSet controller,
//! a config change rolls out as a new pod template, and a config the agent refuses stops the
//! rollout while the node keeps its agent.

use std::time::{Duration, Instant};

use node_agent_tests::real_cluster::{RealCluster, Variant, AGENT_NS, AGENT_SA};
use serde_json::Value;

/// The agent pods on `node`, with their DaemonSet, args and readiness.
fn agents_on(rc: &RealCluster, node: &str) -> anyhow::Result<Vec<(String, String, bool, bool)>> {
    let pods = rc.kubectl.get_json(&[
        "-n",
        AGENT_NS,
        "pods",
        "--field-selector",
        &format!("spec.nodeName={node}"),
    ])?;
    Ok(pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| {
            let owner = p["metadata"]["ownerReferences"][0]["name"]
                .as_str()
                .unwrap_or("")
                .to_string();
            let dry = p["spec"]["containers"][0]["args"]
                .as_array()
                .is_some_and(|a| a.iter().any(|x| x == "--dry-run"));
            let ready = p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            (
                p["metadata"]["name"].as_str().unwrap_or("").to_string(),
                owner,
                dry,
                ready,
            )
        })
        .collect())
}

#[test]
fn the_base_install_decides_in_dry_run_and_only_reads() -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    rc.restore_base()?;
    let node = rc.node0().name;
    let agent = rc.agent_pod(&node, "node-agent")?;
    let since = jiff::Timestamp::now();
    let ns = rc.namespace("dryrun");
    let mut hog = node_agent_tests::real_cluster::WorkloadPod::new(
        "hog",
        node_agent_tests::real_cluster::Qos::BestEffort,
        "",
        &["memory", "500", "500"],
    );
    hog.node = Some(node.clone());
    rc.kubectl.apply(&hog.manifest(&ns.name))?;
    rc.wait_held(&ns.name, &["hog"], Duration::from_secs(90))?;
    // Its decisions, as an operator watches them: the live stream (attached before the
    // pressure comes) and the counter.
    let watcher = {
        let kubectl = rc.kubectl.clone();
        let agent = agent.clone();
        std::thread::spawn(move || {
            kubectl.call(
                &[
                    "-n",
                    AGENT_NS,
                    "exec",
                    &agent,
                    "--",
                    "node-agent",
                    "trace",
                    "--kind",
                    "eviction",
                    "--output",
                    "json",
                    "--duration",
                    "60s",
                ],
                None,
                Duration::from_secs(120),
            )
        })
    };
    std::thread::sleep(Duration::from_secs(2));
    rc.grow_to_headroom(&ns.name, &node, &agent, "grower", 150.0, 400)?;
    rc.wait_held(&ns.name, &["grower"], Duration::from_secs(120))?;
    let trace = watcher.join().expect("the trace's thread")?;
    let records: Vec<Value> = trace
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(
        records
            .iter()
            .any(|r| r["result"] == "dry_run" && r["name"] == "hog"),
        "a dry-run decision naming the hog in the live stream: {}\n{}",
        trace.stdout,
        trace.stderr
    );
    let dry = rc.metric(
        &agent,
        "node_agent_evictions_total{eviction_signal=\"allocatableMemory.available\",result=\"dry_run\"}",
    )?;
    assert!(dry >= Some(1.0), "counted as dry_run: {dry:?}");
    // Nothing evicted, and nothing killed on the node: a kill would show as a restart.
    let hog_now = rc.kubectl.get_json(&["-n", &ns.name, "pod", "hog"])?;
    assert_eq!(hog_now["status"]["phase"], "Running", "nothing evicted");
    assert_eq!(
        hog_now["status"]["containerStatuses"][0]["restartCount"], 0,
        "nothing killed on the node"
    );

    // Only reads from its service account: no eviction, event, condition, taint. The reviews
    // of /metrics' callers (TokenReview, SubjectAccessReview) are creates that change nothing.
    let audit = rc.audit_events()?;
    let writes: Vec<String> = audit
        .iter()
        .filter(|e| e["user"]["username"] == AGENT_SA && e["stage"] == "ResponseComplete")
        .filter(|e| {
            e["requestReceivedTimestamp"]
                .as_str()
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                .is_some_and(|t| t >= since)
        })
        .filter(|e| !matches!(e["verb"].as_str(), Some("get" | "list" | "watch")))
        .filter(|e| {
            !matches!(
                e["objectRef"]["resource"].as_str(),
                Some("tokenreviews" | "subjectaccessreviews")
            )
        })
        .map(|e| {
            format!(
                "{} {} {}",
                e["verb"], e["objectRef"]["resource"], e["requestURI"]
            )
        })
        .collect();
    assert!(
        writes.is_empty(),
        "writes by the agent in dry run: {writes:?}"
    );
    Ok(())
}

#[test]
fn labelling_a_node_hands_it_to_the_enforcing_daemonset_and_back() -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    let node = rc.node0().name;
    struct Unlabel<'a>(&'a RealCluster, String);
    impl Drop for Unlabel<'_> {
        fn drop(&mut self) {
            let _ = self
                .0
                .kubectl
                .run(&["label", "node", &self.1, "node-agent.io/enforce-"]);
        }
    }
    let _unlabel = Unlabel(&rc, node.clone());
    rc.install(
        "by-label",
        &Variant {
            components: vec!["enforce-by-node-label".into()],
            ..Variant::default()
        },
    )?;
    let now = agents_on(&rc, &node)?;
    assert!(
        matches!(now.as_slice(), [(_, owner, true, true)] if owner == "node-agent"),
        "unlabelled: the observing DaemonSet's pod: {now:?}"
    );
    rc.kubectl
        .run(&["label", "node", &node, "node-agent.io/enforce=true"])?;
    rc.kubectl.wait_for("the enforcing DaemonSet's pod alone on the node", Duration::from_secs(120), |_| {
        let now = agents_on(&rc, &node)?;
        Ok(matches!(now.as_slice(), [(_, owner, false, true)] if owner == "node-agent-enforce").then_some(()))
    })?;
    rc.kubectl
        .run(&["label", "node", &node, "node-agent.io/enforce-"])?;
    rc.kubectl.wait_for(
        "back to the observing DaemonSet's pod",
        Duration::from_secs(120),
        |_| {
            let now = agents_on(&rc, &node)?;
            Ok(
                matches!(now.as_slice(), [(_, owner, true, true)] if owner == "node-agent")
                    .then_some(()),
            )
        },
    )?;
    Ok(())
}

#[test]
fn a_config_change_rolls_out_as_a_new_pod_template() -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    rc.restore_base()?;
    let node = rc.node0().name;
    let config_of = |rc: &RealCluster| -> anyhow::Result<String> {
        let ds = rc
            .kubectl
            .get_json(&["-n", AGENT_NS, "daemonset", "node-agent"])?;
        Ok(ds["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v["name"] == "config")
            .and_then(|v| v["configMap"]["name"].as_str())
            .unwrap_or("")
            .to_string())
    };
    // Every agent freshly ready, as right after a rollout, a restart or a node's joining: with
    // `minReadySeconds: 30` the DaemonSet controller then dropped the timer that ends the
    // surge, and the change below stalled with two agents per node (Kubernetes 1.37).
    rc.kubectl
        .run(&["-n", AGENT_NS, "rollout", "restart", "daemonset/node-agent"])?;
    rc.wait_rolled_out()?;
    let before = config_of(&rc)?;
    let old_pod = rc.agent_pod(&node, "node-agent")?;
    let config = Variant::shipped_config_with(&[("logLevel: info", "logLevel: debug")]);
    let applied = Instant::now();
    rc.install(
        "debug-logs",
        &Variant {
            config: Some(config),
            shipped_rollout: true,
            ..Variant::default()
        },
    )?;
    eprintln!(
        "the change rolled out over {} nodes in {:.0?}",
        rc.cluster.nodes().len(),
        applied.elapsed()
    );
    let after = config_of(&rc)?;
    assert!(
        before.starts_with("node-agent-config-")
            && after.starts_with("node-agent-config-")
            && before != after,
        "a new ConfigMap, named by its content's hash: {before} -> {after}"
    );
    let new_pod = rc.agent_pod(&node, "node-agent")?;
    assert_ne!(
        old_pod, new_pod,
        "the changed template rolled out as a new pod"
    );
    let logs = rc.agent_logs(&new_pod)?;
    assert!(
        logs.contains("DEBUG"),
        "the new pod runs the new config (debug lines)"
    );
    // The rollout's pace: each new agent counted as ready no sooner than 30 s after its start.
    let pod = rc.kubectl.get_json(&["-n", AGENT_NS, "pod", &new_pod])?;
    let started =
        timestamp(&pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"])?;
    let ready = pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .map(|c| timestamp(&c["lastTransitionTime"]))
        .transpose()?
        .ok_or_else(|| anyhow::anyhow!("{new_pod} has no Ready condition"))?;
    let waited = ready.duration_since(started);
    eprintln!("{new_pod}: Ready {waited:#} after its start");
    assert!(
        waited.as_secs() >= 30,
        "Ready only 30 s after the start: {waited:#}"
    );
    Ok(())
}

/// An RFC 3339 time of the API.
fn timestamp(v: &Value) -> anyhow::Result<jiff::Timestamp> {
    v.as_str()
        .ok_or_else(|| anyhow::anyhow!("no time: {v}"))?
        .parse()
        .map_err(|e| anyhow::anyhow!("time {v}: {e}"))
}

/// Samples the nodes' agents each second for `window`: the seconds in which some node had no
/// Ready agent, and whether the pods first seen Ready stayed throughout.
fn watch_nodes(rc: &RealCluster, window: Duration) -> anyhow::Result<(u32, bool)> {
    let nodes: Vec<String> = rc.cluster.nodes().iter().map(|n| n.name.clone()).collect();
    let mut first = Vec::new();
    for node in &nodes {
        first.extend(
            agents_on(rc, node)?
                .into_iter()
                .filter(|a| a.3)
                .map(|a| a.0),
        );
    }
    let start = Instant::now();
    let (mut without, mut kept) = (0u32, true);
    while start.elapsed() < window {
        let mut ready_pods = Vec::new();
        let mut all_covered = true;
        for node in &nodes {
            let now = agents_on(rc, node)?;
            all_covered &= now.iter().any(|a| a.3);
            ready_pods.extend(now.into_iter().filter(|a| a.3).map(|a| a.0));
        }
        if !all_covered {
            without += 1;
        }
        if !first.iter().all(|p| ready_pods.contains(p)) {
            kept = false;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    Ok((without, kept))
}

#[test]
fn a_refused_config_stops_the_rollout_and_the_node_keeps_its_agent() -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    // A config the agent refuses at start: a duration without its unit.
    let refused =
        Variant::shipped_config_with(&[("podRefreshInterval: 2s", "podRefreshInterval: 2")]);
    let window = Duration::from_secs(45);

    // The strategy deploy/ shipped before: one node at a time, the old pod removed first.
    let old_strategy = Some(
        "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: node-agent, namespace: node-agent}\nspec:\n  updateStrategy:\n    rollingUpdate: {maxUnavailable: 1, maxSurge: 0}\n".to_string(),
    );
    let shipped = || Variant {
        shipped_rollout: true,
        ..Variant::default()
    };
    rc.install(
        "old-strategy",
        &Variant {
            daemonset_patch: old_strategy.clone(),
            ..shipped()
        },
    )?;
    rc.apply_variant(
        "old-strategy-refused",
        &Variant {
            config: Some(refused.clone()),
            daemonset_patch: old_strategy,
            ..shipped()
        },
    )?;
    let (without_old, _) = watch_nodes(&rc, window)?;
    eprintln!(
        "maxUnavailable 1: the node had no Ready agent for {without_old} of {} s",
        window.as_secs()
    );
    assert!(
        without_old > window.as_secs() as u32 / 2,
        "the old strategy left the node without an agent: {without_old} s"
    );

    // deploy/'s strategy: the new pod first (maxSurge), the old one kept until it is ready.
    rc.install("shipped", &shipped())?;
    rc.apply_variant(
        "refused",
        &Variant {
            config: Some(refused),
            ..shipped()
        },
    )?;
    let (without, kept) = watch_nodes(&rc, window)?;
    eprintln!(
        "maxSurge 1: the node had no Ready agent for {without} of {} s; the old pod kept: {kept}",
        window.as_secs()
    );
    assert_eq!(without, 0, "every node always had its agent");
    assert!(kept, "the old pods kept running beside the refused ones");
    let status = rc.kubectl.call(
        &[
            "-n",
            AGENT_NS,
            "rollout",
            "status",
            "daemonset/node-agent",
            "--timeout=5s",
        ],
        None,
        Duration::from_secs(30),
    )?;
    assert!(!status.success, "the rollout stopped: {}", status.stdout);
    // The rollout goes one node at a time, in the controller's order: the refused agent is
    // on one of the nodes, beside that node's old one.
    let mut surge = Vec::new();
    for n in rc.cluster.nodes() {
        surge.extend(agents_on(&rc, &n.name)?);
    }
    assert!(
        surge.iter().any(|a| !a.3),
        "the refused agent is there, not ready: {surge:?}"
    );
    let logs = rc.kubectl.call(
        &[
            "-n",
            AGENT_NS,
            "logs",
            &surge.iter().find(|a| !a.3).expect("the refused pod").0,
            "--previous",
        ],
        None,
        Duration::from_secs(20),
    )?;
    assert!(
        logs.stdout.contains("podRefreshInterval") || logs.stderr.contains("podRefreshInterval"),
        "its log names the refused field: {}{}",
        logs.stdout,
        logs.stderr
    );
    Ok(())
}
