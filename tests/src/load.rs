//! The agent's load on the control plane, measured on the real cluster (issue 44, part 1):
//! what one agent asks of the API server, beside what the kubelet of the same node asks, in
//! the states a node goes through. `cargo xtask cluster load` runs it.
//!
//! Method (fixed before any figure was looked at):
//! - The real cluster of `cargo xtask cluster` (one node, Kubernetes v1.37.2), the agent
//!   installed from deploy/ and made to act (`Variant::enforcing`, the shipped config with the
//!   pods of the pressure phase excluded, so pressure is reported and held, not relieved).
//! - The source is the API server's audit log (every request, `Metadata` level; the agent's at
//!   `Request` level), read from a mark taken at the start of each phase to its end, through
//!   rotations ([`AuditMark`]). A request is counted once, at its `ResponseComplete` stage (a
//!   watch also at `ResponseStarted`, counted as a watch opened); by the user that made it: the
//!   agent (`system:serviceaccount:node-agent:node-agent`) and the node's kubelet
//!   (`system:node:<node>`), the kubelet being the yardstick a DaemonSet is judged by.
//! - Phases, one after the other, each `minutes` long unless its own work takes longer:
//!   `idle` (nothing happens), `churn` (100 pods created on the node, Running, then deleted),
//!   `api-restart` (the API server killed and started again 10 s later, counted to the end of
//!   the window: what every agent does when it comes back), `rollout` (`kubectl rollout
//!   restart` of the agent's DaemonSet, until the new agent is Ready), and last `pressure` (a
//!   pod the agent may not evict holds memory past its line: condition True, taint on,
//!   heartbeats and events; last because the condition stays True for the pressure transition
//!   period after it ends, 5 min, which would fall into a later phase).
//! - Reported per phase: requests per minute by verb and resource (subresource after a `/`),
//!   for the agent and the kubelet, the watches each opened, and the agent's share of the two.
//!   Bytes are not in the audit log (no response sizes at these levels) and are not reported.
//! - Printed as a table and written to target/bench/load-<commit>.json; one run (n = 1 per
//!   phase): the figures are counts over a window, not latencies, and say so.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use serde::Serialize;
use serde_json::Value;

use crate::{
    real_cluster::{AuditMark, Qos, RealCluster, WorkloadPod, AGENT_NS},
    real_node::{hold_pressure, holding},
};

/// The agent's user in the audit log.
pub const AGENT_USER: &str = "system:serviceaccount:node-agent:node-agent";

/// Requests of one user in one phase, by `verb resource[/subresource]`.
#[derive(Debug, Default, Clone, Serialize, PartialEq)]
pub struct Tally {
    pub requests: BTreeMap<String, u64>,
    pub watches_opened: u64,
}

impl Tally {
    pub fn total(&self) -> u64 {
        self.requests.values().sum()
    }
}

/// What one phase measured.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    pub name: String,
    pub minutes: f64,
    pub agent: Tally,
    pub kubelet: Tally,
}

/// Counts `events` (audit events) of the agent and of `kubelet_user`: each request once, at
/// `ResponseComplete`; a watch also at `ResponseStarted`, as opened.
pub fn tally(events: &[Value], kubelet_user: &str) -> (Tally, Tally) {
    let (mut agent, mut kubelet) = (Tally::default(), Tally::default());
    for e in events {
        let who = match e["user"]["username"].as_str() {
            Some(AGENT_USER) => &mut agent,
            Some(u) if u == kubelet_user => &mut kubelet,
            _ => continue,
        };
        let verb = e["verb"].as_str().unwrap_or("?");
        match e["stage"].as_str() {
            Some("ResponseStarted") if verb == "watch" => who.watches_opened += 1,
            Some("ResponseComplete") => {
                let r = &e["objectRef"];
                let resource = match (r["resource"].as_str(), r["subresource"].as_str()) {
                    (Some(res), Some(sub)) => format!("{res}/{sub}"),
                    (Some(res), None) => res.to_string(),
                    // Non-resource URLs (/healthz, /version, /api).
                    _ => e["requestURI"]
                        .as_str()
                        .unwrap_or("?")
                        .split('?')
                        .next()
                        .unwrap_or("?")
                        .to_string(),
                };
                *who.requests
                    .entry(format!("{verb} {resource}"))
                    .or_default() += 1;
            }
            _ => {}
        }
    }
    (agent, kubelet)
}

/// The table of all phases: requests per minute, the agent's beside the kubelet's.
pub fn table(phases: &[Phase]) -> String {
    let mut out = String::from(
        "| phase | minutes | agent req/min | kubelet req/min | agent's share | agent watches opened | kubelet watches opened | the agent's requests (count) |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for p in phases {
        let (a, k) = (p.agent.total() as f64, p.kubelet.total() as f64);
        let share = if a + k > 0.0 {
            a / (a + k) * 100.0
        } else {
            0.0
        };
        let detail: Vec<String> = p
            .agent
            .requests
            .iter()
            .map(|(what, n)| format!("{what} {n}"))
            .collect();
        out.push_str(&format!(
            "| {} | {:.1} | {:.1} | {:.1} | {share:.0} % | {} | {} | {} |\n",
            p.name,
            p.minutes,
            a / p.minutes,
            k / p.minutes,
            p.agent.watches_opened,
            p.kubelet.watches_opened,
            detail.join(", ")
        ));
    }
    out
}

/// Runs every phase on the cluster `rc`, each at least `minutes` long.
pub fn run(rc: &RealCluster, minutes: f64) -> anyhow::Result<Vec<Phase>> {
    let window = Duration::from_secs_f64(minutes * 60.0);
    let node = rc.node0().name;
    let kubelet_user = format!("system:node:{node}");
    let log = rc.cluster.layout.audit_log();
    let measure = |name: &str, work: &dyn Fn() -> anyhow::Result<()>| -> anyhow::Result<Phase> {
        let mark = AuditMark::now(&log)?;
        let started = Instant::now();
        eprintln!("load: {name} ({minutes} min or as long as its work takes)");
        work()?;
        if let Some(rest) = window.checked_sub(started.elapsed()) {
            std::thread::sleep(rest);
        }
        let took = started.elapsed();
        let events = mark.events_since(&log)?;
        let (agent, kubelet) = tally(&events, &kubelet_user);
        Ok(Phase {
            name: name.to_string(),
            minutes: took.as_secs_f64() / 60.0,
            agent,
            kubelet,
        })
    };
    rc.install("load", &holding())?;
    let mut phases = Vec::new();
    phases.push(measure("idle", &|| Ok(()))?);

    let ns = rc.namespace("load");
    phases.push(measure("churn", &|| {
        let manifests: Vec<String> = (0..100)
            .map(|i| {
                let mut pod =
                    WorkloadPod::new(&format!("churn-{i}"), Qos::BestEffort, "", &["pause"]);
                pod.node = Some(node.clone());
                pod.manifest(&ns.name)
            })
            .collect();
        rc.kubectl.apply(&manifests.join("---\n"))?;
        let names: Vec<String> = (0..100).map(|i| format!("churn-{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        crate::real_cluster::wait_running(&rc.kubectl, &ns.name, &names, Duration::from_secs(300))?;
        rc.kubectl.run(&[
            "-n",
            &ns.name,
            "delete",
            "pods",
            "--all",
            "--wait=true",
            "--timeout=300s",
        ])?;
        Ok(())
    })?);

    phases.push(measure("api-restart", &|| {
        use node_agent_cluster::faults::Component;
        rc.cluster.kill_component(&Component::ApiServer)?;
        std::thread::sleep(Duration::from_secs(10));
        rc.cluster.start_component(&Component::ApiServer)?;
        rc.cluster.restart_exited_controllers()?;
        Ok(())
    })?);

    phases.push(measure("rollout", &|| {
        rc.kubectl
            .run(&["-n", AGENT_NS, "rollout", "restart", "daemonset/node-agent"])?;
        rc.wait_rolled_out()
    })?);
    // Last: the agent keeps its condition True for the pressure transition period after the
    // pressure ends (the kubelet's semantics, 5 min), which would fall into a later phase.
    phases.push(measure("pressure", &|| hold_pressure(rc, &ns.name, &node))?);
    drop(ns);
    rc.restore_base().context("the base install back")?;
    Ok(phases)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn each_request_is_counted_once_by_user_verb_and_resource() {
        let ev = |user: &str, verb: &str, stage: &str, res: Value| json!({"user": {"username": user}, "verb": verb, "stage": stage, "objectRef": res, "requestURI": "/x?y"});
        let pods = json!({"resource": "pods"});
        let status = json!({"resource": "nodes", "subresource": "status"});
        let events = [
            ev(AGENT_USER, "patch", "ResponseComplete", status.clone()),
            ev(AGENT_USER, "patch", "RequestReceived", status.clone()),
            ev(AGENT_USER, "watch", "ResponseStarted", pods.clone()),
            ev(AGENT_USER, "watch", "ResponseComplete", pods.clone()),
            ev("system:node:n0", "get", "ResponseComplete", json!({})),
            ev("system:node:n1", "get", "ResponseComplete", pods.clone()),
            ev("someone", "list", "ResponseComplete", pods),
        ];
        let (agent, kubelet) = tally(&events, "system:node:n0");
        assert_eq!(
            agent.requests,
            BTreeMap::from([("patch nodes/status".into(), 1), ("watch pods".into(), 1)])
        );
        assert_eq!(agent.watches_opened, 1);
        assert_eq!(kubelet.requests, BTreeMap::from([("get /x".into(), 1)]));
        assert_eq!(kubelet.total(), 1);
    }
}
