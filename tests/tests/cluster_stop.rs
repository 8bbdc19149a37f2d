//! How the agent ends, and what it leaves on its node, on the real cluster: README's table
//! "What the agent leaves on its node", row by row. Pressure is held throughout by a pod the
//! config excludes (the agent reports pressure, taints the node and may evict nothing), so
//! there is a taint to leave or remove.
//!
//! - SIGTERM in a rollout (`kubectl rollout restart`): the new agent is Ready beside the old
//!   one (maxSurge 1), so the old one leaves the condition and the taint to it, unchanged.
//! - SIGTERM otherwise (a deleted pod): the taint removed and the condition `Unknown`, reason
//!   `AgentStopped`, by the stopping agent; the next one taints again.
//! - `kubectl delete -k` alone: the service account and RBAC go before the pods, so the
//!   stopping agent's writes are refused (403 or 401): taint and condition stay. The
//!   DaemonSets deleted first (README's uninstall): nothing of the agent's stays.
//! - SIGKILL: nothing written; the taint stays until the next start's first evaluation, which
//!   removes it when the node no longer needs it and keeps it, without a gap, when it does.

use std::time::Duration;

use node_agent_tests::{
    agent_access::{agent_requests_since, audited_since, Audited},
    real_cluster::{RealCluster, AGENT_NS},
    real_node::{
        agent_pid, condition, hold_pressure, holding, kill9, pressure_taint, wait_pressure_reported,
    },
};
use serde_json::Value;

const TAINT: &str = "node-agent.io/pressure";

/// Whether an audited PATCH of the node's status sets the agent's condition to `status` (and
/// `reason`, if given).
fn writes_condition(a: &Audited, status: &str, reason: Option<&str>) -> bool {
    a.verb == "patch"
        && a.resource == "nodes"
        && a.subresource == "status"
        && a.body["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| {
                c["type"] == "NodeAgentPressure"
                    && c["status"] == status
                    && reason.is_none_or(|r| c["reason"] == r)
            })
}

/// Whether an audited PATCH of the node leaves it without the agent's taint (or with it).
fn writes_taint(a: &Audited, present: bool) -> bool {
    a.verb == "patch"
        && a.resource == "nodes"
        && a.subresource.is_empty()
        && a.body["spec"]["taints"].is_array()
        && a.body["spec"]["taints"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|t| t["key"] == TAINT)
            == present
}

/// Removes the agent's taint when dropped, as README says to by hand, should a test leave one.
struct TaintCleanup<'a>(&'a RealCluster, String);

impl Drop for TaintCleanup<'_> {
    fn drop(&mut self) {
        let _ = self.0.kubectl.call(
            &["taint", "nodes", &self.1, &format!("{TAINT}:NoSchedule-")],
            None,
            Duration::from_secs(30),
        );
    }
}

/// What the agent pod `pod` asked since `since`, answered.
fn by_pod(rc: &RealCluster, since: jiff::Timestamp, pod: &str) -> anyhow::Result<Vec<Audited>> {
    Ok(agent_requests_since(rc, since)?
        .into_iter()
        .filter(|a| a.pod == pod)
        .collect())
}

/// Asserts that the agent pod `pod`, stopping, removed its taint and set its condition
/// Unknown/AgentStopped, each answered 200, and wrote nothing after.
fn assert_stopped_cleanly(
    rc: &RealCluster,
    since: jiff::Timestamp,
    pod: &str,
    how: &str,
) -> anyhow::Result<()> {
    let asked = by_pod(rc, since, pod)?;
    let writes: Vec<&Audited> = asked.iter().filter(|a| a.verb == "patch").collect();
    let unknown = writes
        .iter()
        .position(|a| writes_condition(a, "Unknown", Some("AgentStopped")))
        .unwrap_or_else(|| {
            panic!(
                "{how}: the stopping agent set its condition Unknown: {:?}",
                writes.iter().map(|a| a.line()).collect::<Vec<_>>()
            )
        });
    let untaint = writes
        .iter()
        .position(|a| writes_taint(a, false))
        .unwrap_or_else(|| {
            panic!(
                "{how}: the stopping agent removed its taint: {:?}",
                writes.iter().map(|a| a.line()).collect::<Vec<_>>()
            )
        });
    assert_eq!(
        writes[unknown].code,
        200,
        "{how}: {}",
        writes[unknown].line()
    );
    assert_eq!(
        writes[untaint].code,
        200,
        "{how}: {}",
        writes[untaint].line()
    );
    assert_eq!(
        unknown.max(untaint),
        writes.len() - 1,
        "{how}: they are its last writes: {:?}",
        writes.iter().map(|a| a.line()).collect::<Vec<_>>()
    );
    Ok(())
}

#[test]
fn sigterm_in_a_rollout_hands_over_and_from_a_deleted_pod_removes_the_taint() -> anyhow::Result<()>
{
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    let node = rc.node0().name;
    let _taint = TaintCleanup(&rc, node.clone());
    rc.install("stop-sigterm", &holding())?;
    let ns = rc.namespace("sigterm");
    hold_pressure(&rc, &ns.name, &node)?;
    let taint = pressure_taint(&rc, &node)?.expect("tainted");
    let before = condition(&rc, &node, "NodeAgentPressure")?.expect("the condition");

    // kubectl rollout restart: maxSurge 1, so the new pod is Ready on the node before the old
    // one gets SIGTERM; the old one leaves the condition and the taint to it.
    let old = rc.agent_pod(&node, "node-agent")?;
    let since = jiff::Timestamp::now();
    rc.kubectl
        .run(&["-n", AGENT_NS, "rollout", "restart", "daemonset/node-agent"])?;
    rc.kubectl.run(&[
        "-n",
        AGENT_NS,
        "rollout",
        "status",
        "daemonset/node-agent",
        "--timeout=240s",
    ])?;
    rc.kubectl
        .wait_for("the old agent pod gone", Duration::from_secs(120), |k| {
            let out = k.call(
                &["-n", AGENT_NS, "get", "pod", &old],
                None,
                Duration::from_secs(10),
            )?;
            Ok((!out.success && out.stderr.contains("NotFound")).then_some(()))
        })?;
    let written = by_pod(&rc, since, &old)?;
    assert!(
        !written
            .iter()
            .any(|a| writes_taint(a, false) || writes_condition(a, "Unknown", None)),
        "the old agent handed over, giving up nothing: {:?}",
        written.iter().map(Audited::line).collect::<Vec<_>>()
    );
    let still = pressure_taint(&rc, &node)?.expect("the taint stayed");
    assert_eq!(
        still["timeAdded"], taint["timeAdded"],
        "the same taint, never removed: {still}"
    );
    let after = condition(&rc, &node, "NodeAgentPressure")?.expect("the condition");
    assert_eq!(after["status"], "True", "{after}");
    // The new agent writes the condition from its own first evaluation, with its own
    // transition time (as a restarted kubelet does with MemoryPressure); the status stays.
    eprintln!(
        "the condition's transition time across the rollout: {} -> {}",
        before["lastTransitionTime"], after["lastTransitionTime"]
    );
    let new = rc.agent_pod(&node, "node-agent")?;
    assert_ne!(new, old);
    let logs = rc.agent_logs(&new)?;
    assert!(
        logs.contains("pressure changed"),
        "the new agent evaluates the held pressure: {logs}"
    );

    // kubectl delete pod: SIGTERM with no new agent Ready beside it, so the agent gives up
    // what it wrote; the next one taints again.
    let since = jiff::Timestamp::now();
    rc.kubectl
        .run(&["-n", AGENT_NS, "delete", "pod", &new, "--wait=true"])?;
    assert_stopped_cleanly(&rc, since, &new, "kubectl delete pod")?;
    rc.cluster
        .wait_agent_ready("node-agent", Duration::from_secs(240))?;
    wait_pressure_reported(&rc, &node)?;
    let next = rc.agent_pod(&node, "node-agent")?;
    let retainted = by_pod(&rc, since, &next)?;
    assert!(
        retainted
            .iter()
            .any(|a| writes_taint(a, true) && a.code == 200),
        "the next agent tainted the node again: {:?}",
        retainted.iter().map(Audited::line).collect::<Vec<_>>()
    );
    Ok(())
}

/// kubectl, deleting what `kubectl apply -k` made: `cluster/overlay` (deploy/'s base).
fn delete_k(rc: &RealCluster) -> anyhow::Result<()> {
    // The kustomization that was applied (cluster/overlay with this test's config), as a user
    // deletes what they applied; what is gone already (the DaemonSets, in README's order) is
    // passed over.
    let applied = rc.cluster.layout.dir.join("variants/stop-uninstall");
    let out = rc.kubectl.call(
        &[
            "delete",
            "-k",
            &applied.to_string_lossy(),
            "--ignore-not-found",
            "--wait=true",
            "--timeout=180s",
        ],
        None,
        Duration::from_secs(200),
    )?;
    anyhow::ensure!(out.success, "kubectl delete -k: {}", out.stderr);
    rc.kubectl.wait_for(
        "the node-agent namespace gone",
        Duration::from_secs(180),
        |k| {
            let out = k.call(
                &["get", "namespace", AGENT_NS],
                None,
                Duration::from_secs(10),
            )?;
            Ok((!out.success && out.stderr.contains("NotFound")).then_some(()))
        },
    )
}

#[test]
fn delete_k_alone_leaves_taint_and_condition_and_the_readmes_uninstall_leaves_nothing(
) -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    let node = rc.node0().name;
    let _taint = TaintCleanup(&rc, node.clone());
    let ns = rc.namespace("uninstall");

    // `kubectl delete -k` alone, under pressure.
    rc.install("stop-uninstall", &holding())?;
    hold_pressure(&rc, &ns.name, &node)?;
    let agent = rc.agent_pod(&node, "node-agent")?;
    let ip = rc.kubectl.run(&[
        "-n",
        AGENT_NS,
        "get",
        "pod",
        &agent,
        "-o",
        "jsonpath={.status.podIP}",
    ])?;
    let before = condition(&rc, &node, "NodeAgentPressure")?.expect("the agent's condition");
    let since = jiff::Timestamp::now();
    delete_k(&rc)?;
    // Its service account and RBAC were deleted before its DaemonSet (kustomize's order, which
    // `delete -k` follows): what it wrote while stopping was refused, 403 once its
    // ClusterRoleBinding was gone, 401 once its service account was too (the API server
    // accepts a token it verified in the last 10 s without looking again, so which comes
    // depends on the agent's last request before), and nothing of its own was removed.
    let writes: Vec<Audited> = audited_since(&rc, since)?
        .into_iter()
        .filter(|a| {
            a.source_ips.iter().any(|s| s == ip.trim())
                && a.verb == "patch"
                && a.resource == "nodes"
        })
        .collect();
    let lines: Vec<String> = writes.iter().map(Audited::line).collect();
    eprintln!("the stopping agent's writes to its node: {lines:?}");
    assert!(
        !writes.is_empty() && writes.iter().all(|a| a.code == 401 || a.code == 403),
        "the stopping agent's writes to its node were all refused (401 or 403): {lines:?}"
    );
    assert!(pressure_taint(&rc, &node)?.is_some(), "the taint stays");
    let after = condition(&rc, &node, "NodeAgentPressure")?.expect("the agent's condition");
    assert_eq!(
        after["status"], "True",
        "the condition stays as last written: {after}"
    );
    assert_eq!(after["reason"], before["reason"], "{after}");
    eprintln!("kubectl delete -k alone left: taint, condition {after}");
    rc.kubectl
        .run(&["taint", "nodes", &node, &format!("{TAINT}:NoSchedule-")])?;

    // README's uninstall: the DaemonSets first (their pods gone, each agent stopped with its
    // credentials still valid), then the rest.
    rc.install("stop-uninstall", &holding())?;
    wait_pressure_reported(&rc, &node)?;
    let agent = rc.agent_pod(&node, "node-agent")?;
    let since = jiff::Timestamp::now();
    rc.delete_agent_daemonsets()?;
    delete_k(&rc)?;
    assert_stopped_cleanly(&rc, since, &agent, "README's uninstall")?;
    assert!(pressure_taint(&rc, &node)?.is_none(), "no taint left");
    let after = condition(&rc, &node, "NodeAgentPressure")?.expect("the agent's condition");
    assert_eq!(
        (&after["status"], &after["reason"]),
        (&Value::from("Unknown"), &Value::from("AgentStopped")),
        "{after}"
    );
    Ok(())
}

/// The agent container's restart count.
fn restarts(rc: &RealCluster, pod: &str) -> anyhow::Result<u64> {
    let p = rc.kubectl.get_json(&["-n", AGENT_NS, "pod", pod])?;
    Ok(p["status"]["containerStatuses"][0]["restartCount"]
        .as_u64()
        .unwrap_or(0))
}

/// SIGKILLs the agent's process from the host and waits until the kubelet has restarted its
/// container and the new process runs.
fn kill_and_wait_restart(rc: &RealCluster, pod: &str) -> anyhow::Result<()> {
    let before = restarts(rc, pod)?;
    let pid = agent_pid(rc, pod)?;
    kill9(pid)?;
    rc.kubectl.wait_for(
        "the kubelet restarting the agent",
        Duration::from_secs(120),
        |_| {
            let restarted = restarts(rc, pod)? > before;
            Ok((restarted && agent_pid(rc, pod).is_ok_and(|p| p != pid)).then_some(()))
        },
    )?;
    let p = rc.kubectl.get_json(&["-n", AGENT_NS, "pod", pod])?;
    let last = &p["status"]["containerStatuses"][0]["lastState"]["terminated"];
    assert_eq!(last["exitCode"], 137, "killed by SIGKILL: {last}");
    Ok(())
}

#[test]
fn sigkill_leaves_the_taint_until_the_next_start_removes_what_the_node_no_longer_needs(
) -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    let node = rc.node0().name;
    let _taint = TaintCleanup(&rc, node.clone());
    // The shipped transition period (5m): after the pressure ends, a running agent keeps its
    // condition and taint that long.
    rc.install("stop-sigkill", &holding())?;
    let ns = rc.namespace("sigkill");
    hold_pressure(&rc, &ns.name, &node)?;
    let agent = rc.agent_pod(&node, "node-agent")?;
    assert!(pressure_taint(&rc, &node)?.is_some(), "tainted");
    let before = condition(&rc, &node, "NodeAgentPressure")?.expect("the condition");

    // SIGKILL under pressure: nothing written on the way out; the next start finds the
    // pressure from its first evaluation (allocatable memory measured against the pods
    // cgroup's own limit, before the Node answers) and keeps the taint and the condition: it
    // never lifts either, not even for a moment.
    let since = jiff::Timestamp::now();
    kill_and_wait_restart(&rc, &agent)?;
    wait_pressure_reported(&rc, &node)?;
    std::thread::sleep(Duration::from_secs(5));
    let written = by_pod(&rc, since, &agent)?;
    let lines = || written.iter().map(Audited::line).collect::<Vec<_>>();
    assert!(
        !written.iter().any(|a| writes_condition(a, "Unknown", None)),
        "the condition is never given up: {:?}",
        lines()
    );
    assert!(
        !written.iter().any(|a| writes_taint(a, false)),
        "the taint is never lifted: {:?}",
        lines()
    );
    assert!(pressure_taint(&rc, &node)?.is_some(), "tainted at the end");
    let after = condition(&rc, &node, "NodeAgentPressure")?.expect("the condition");
    assert_eq!(after["status"], "True", "{after}; before: {before}");

    // The pressure ends; the transition period holds the condition and the taint...
    rc.kubectl
        .run(&["-n", &ns.name, "delete", "pod", "holder", "--wait=true"])?;
    rc.kubectl.wait_for(
        "the agent seeing the pressure end",
        Duration::from_secs(60),
        |_| {
            let logs = rc.agent_logs(&agent)?;
            Ok(logs
                .lines()
                .rev()
                .find(|l| l.contains("pressure changed"))
                .is_some_and(|l| l.contains("thresholds_met={}"))
                .then_some(()))
        },
    )?;
    std::thread::sleep(Duration::from_secs(10));
    assert!(
        pressure_taint(&rc, &node)?.is_some(),
        "held by the transition period"
    );
    // ...until a SIGKILL: the next start's first evaluation finds no pressure and removes the
    // taint the node no longer needs.
    let since = jiff::Timestamp::now();
    kill_and_wait_restart(&rc, &agent)?;
    rc.kubectl.wait_for(
        "the taint removed by the next start",
        Duration::from_secs(90),
        |_| Ok(pressure_taint(&rc, &node)?.is_none().then_some(())),
    )?;
    let written = by_pod(&rc, since, &agent)?;
    assert!(
        written
            .iter()
            .any(|a| writes_taint(a, false) && a.code == 200),
        "the restarted agent removed it: {:?}",
        written.iter().map(Audited::line).collect::<Vec<_>>()
    );
    let after = condition(&rc, &node, "NodeAgentPressure")?.expect("the condition");
    assert_eq!(after["status"], "False", "{after}");
    Ok(())
}
