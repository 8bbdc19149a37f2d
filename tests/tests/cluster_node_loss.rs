//! A node lost beside the agent, on the real cluster: the kubelet of the second node killed
//! (its pods and its agent keep running) until the node lifecycle controller marks the Node
//! NotReady and taints it `node.kubernetes.io/unreachable` (NoSchedule and NoExecute); a pod
//! that tolerates that for 5 s is evicted by the controller; the `out-of-service` taint (the
//! non-graceful shutdown's) has it forced off; then the node comes back.
//!
//! The agent under pressure all the while (a pod it may not evict holds memory past its
//! line) has its own taint on the node beside the controller's: when the pressure ends with
//! the node still lost, it removes its taint and leaves the controller's; its pod tolerates
//! every taint (the DaemonSet's `operator: Exists`), so neither the controller nor the
//! out-of-service taint evicts it; and once the node is back nothing of the agent's stays:
//! no taint, its condition False.

use std::time::Duration;

use node_agent_cluster::faults::Component;
use node_agent_tests::real_cluster::{
    wait_running, Qos, RealCluster, Variant, WorkloadPod, AGENT_NS,
};
use node_agent_tests::real_node::{
    condition, hold_pressure, kill9, pod_uid, pressure_taint, taints, workload_pid,
};
use serde_json::Value;

const OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";
const UNREACHABLE: &str = "node.kubernetes.io/unreachable";

/// Starts the node's kubelet again, and removes the out-of-service taint, when dropped (also
/// when the test fails half-way).
struct NodeBack<'a> {
    rc: &'a RealCluster,
    node: node_agent_cluster::NodeSpec,
    kubelet_down: bool,
}

impl NodeBack<'_> {
    fn bring_back(&mut self) -> anyhow::Result<()> {
        if std::mem::replace(&mut self.kubelet_down, false) {
            self.rc
                .cluster
                .start_component(&Component::Kubelet(self.node.clone()))?;
        }
        let _ = self.rc.kubectl.call(
            &[
                "taint",
                "node",
                &self.node.name,
                &format!("{OUT_OF_SERVICE}-"),
            ],
            None,
            Duration::from_secs(10),
        );
        Ok(())
    }
}

impl Drop for NodeBack<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.bring_back() {
            eprintln!("bringing {} back: {e:#}", self.node.name);
        }
    }
}

fn has_taint(taints: &[Value], key: &str, effect: &str) -> bool {
    taints
        .iter()
        .any(|t| t["key"] == key && t["effect"] == effect)
}

fn deleting(rc: &RealCluster, ns: &str, pod: &str) -> anyhow::Result<Option<bool>> {
    let out = rc.kubectl.call(
        &["-n", ns, "get", "pod", pod, "-o", "json"],
        None,
        Duration::from_secs(10),
    )?;
    if !out.success {
        if out.stderr.contains("NotFound") {
            return Ok(None);
        }
        anyhow::bail!("kubectl get pod {pod}: {}", out.stderr);
    }
    let p: Value = serde_json::from_str(&out.stdout)?;
    Ok(Some(p["metadata"]["deletionTimestamp"].is_string()))
}

#[test]
fn a_lost_node_is_the_controllers_to_taint_and_empty_and_comes_back_with_nothing_of_the_agents(
) -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    let node = rc.cluster.layout.node(1);
    // Enforcing, pods labelled hold excluded, and a transition period short enough to see the
    // agent's taint go within the test.
    let config = Variant::shipped_config_with(&[
        ("matchLabels: {}", "matchLabels: {hold: \"yes\"}"),
        (
            "evictionPressureTransitionPeriod: \"5m\"",
            "evictionPressureTransitionPeriod: \"20s\"",
        ),
    ]);
    rc.install(
        "node-loss",
        &Variant {
            config: Some(config),
            ..Variant::enforcing()
        },
    )?;
    let agent = rc.agent_pod(&node.name, "node-agent")?;
    let ns = rc.namespace("node-loss");

    // A pod that tolerates the node's loss for 5 s, and pressure the agent reports and may
    // not relieve.
    let mut short = WorkloadPod::new("short", Qos::BestEffort, "", &["sleep"]);
    short.node = Some(node.name.clone());
    short.extra_spec.push(format!(
        "  tolerations: [{{key: {UNREACHABLE}, operator: Exists, effect: NoExecute, tolerationSeconds: 5}}, {{key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: 5}}]"
    ));
    rc.kubectl.apply(&short.manifest(&ns.name))?;
    wait_running(&rc.kubectl, &ns.name, &["short"], Duration::from_secs(90))?;
    hold_pressure(&rc, &ns.name, &node.name)?;
    let holder = workload_pid(&pod_uid(&rc, &ns.name, "holder")?)?;

    // The node lost: its kubelet killed. The controller marks it NotReady and taints it, its
    // taints beside the agent's.
    let mut back = NodeBack {
        rc: &rc,
        node: node.clone(),
        kubelet_down: false,
    };
    rc.cluster
        .kill_component(&Component::Kubelet(node.clone()))?;
    back.kubelet_down = true;
    rc.kubectl.wait_for(
        "the Node NotReady and tainted unreachable by the controller",
        Duration::from_secs(150),
        |_| {
            let t = taints(&rc, &node.name)?;
            let ready = condition(&rc, &node.name, "Ready")?;
            Ok((ready.is_some_and(|c| c["status"] != "True")
                && has_taint(&t, UNREACHABLE, "NoExecute")
                && has_taint(&t, UNREACHABLE, "NoSchedule"))
            .then_some(()))
        },
    )?;
    assert!(
        pressure_taint(&rc, &node.name)?.is_some(),
        "the agent's taint beside the controller's: {:?}",
        taints(&rc, &node.name)?
    );

    // The controller evicts the pod that tolerates 5 s (no kubelet ends it: it stays
    // Terminating), never the agent's.
    rc.kubectl.wait_for(
        "the 5 s pod marked for deletion by the controller",
        Duration::from_secs(60),
        |_| {
            Ok(deleting(&rc, &ns.name, "short")?
                .unwrap_or(true)
                .then_some(()))
        },
    )?;

    // The pressure ends while the node is lost (the holder killed from the host): the agent
    // removes its own taint after the transition period and leaves the controller's.
    kill9(holder)?;
    rc.kubectl
        .wait_for("the agent's taint removed", Duration::from_secs(90), |_| {
            Ok(pressure_taint(&rc, &node.name)?.is_none().then_some(()))
        })?;
    let t = taints(&rc, &node.name)?;
    assert!(
        has_taint(&t, UNREACHABLE, "NoExecute") && has_taint(&t, UNREACHABLE, "NoSchedule"),
        "the controller's taints stay when the agent removes its own: {t:?}"
    );
    let c = condition(&rc, &node.name, "NodeAgentPressure")?.expect("the agent's condition");
    assert_eq!(c["status"], "False", "{c}");

    // The non-graceful shutdown's taint: the terminating pod is forced off; the agent's pod
    // tolerates it and stays.
    rc.kubectl.run(&[
        "taint",
        "node",
        &node.name,
        &format!("{OUT_OF_SERVICE}=nodeshutdown:NoExecute"),
    ])?;
    rc.kubectl.wait_for(
        "the terminating pod forced off by the out-of-service taint",
        Duration::from_secs(90),
        |_| Ok(deleting(&rc, &ns.name, "short")?.is_none().then_some(())),
    )?;
    assert_eq!(
        deleting(&rc, AGENT_NS, &agent)?,
        Some(false),
        "the agent's pod is neither evicted nor forced off"
    );

    // The node back: Ready, the controller's taints gone, the agent's pod the same one and
    // Ready, and nothing of the agent's left on the Node.
    back.bring_back()?;
    rc.kubectl.wait_for(
        "the node Ready with no taint left",
        Duration::from_secs(120),
        |_| {
            let t = taints(&rc, &node.name)?;
            let ready = condition(&rc, &node.name, "Ready")?;
            Ok((ready.is_some_and(|c| c["status"] == "True") && t.is_empty()).then_some(()))
        },
    )?;
    rc.kubectl.wait_for(
        "the agent's pod Ready again",
        Duration::from_secs(90),
        |k| {
            let p = k.get_json(&["-n", AGENT_NS, "pod", &agent])?;
            Ok(p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
                .then_some(()))
        },
    )?;
    let c = condition(&rc, &node.name, "NodeAgentPressure")?.expect("the agent's condition");
    assert_eq!(
        c["status"], "False",
        "nothing of the agent's pressure stays: {c}"
    );
    Ok(())
}
