//! PodDisruptionBudgets on the real cluster, their status kept by the real disruption
//! controller: `respect` takes the API server's 429 (cause DisruptionBudget) and evicts the
//! next pod; `override` deletes the protected pod and marks it Evicted, as the kubelet does
//! under hard pressure, with the grants of deploy/override/ and not without them. Budgets
//! bind only evictions through the API (`kubernetes.hardEviction: api`): a kill on the node
//! passes them by, as the kubelet's own does.

use std::time::Duration;

use node_agent_tests::real_cluster::{
    wait_running, Namespace, Qos, RealCluster, Variant, WorkloadPod, AGENT_SA,
};

/// A protected pod (1000 MiB over its request, the ranking's first) with a budget that allows
/// no disruption, and an ordinary one (600 MiB over); waits until the disruption controller
/// says the budget allows none.
fn protected_and_next(rc: &RealCluster, ns: &Namespace, node: &str) -> anyhow::Result<()> {
    let mut protected =
        WorkloadPod::new("protected", Qos::BestEffort, "", &["memory", "1000", "500"]);
    protected.labels.push(("budget".into(), "all".into()));
    let mut next = WorkloadPod::new("next", Qos::BestEffort, "", &["memory", "600", "500"]);
    for p in [&mut protected, &mut next] {
        p.node = Some(node.to_string());
        rc.kubectl.apply(&p.manifest(&ns.name))?;
    }
    rc.kubectl.apply(&format!(
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {{name: all, namespace: {}}}\nspec:\n  minAvailable: 1\n  selector: {{matchLabels: {{budget: all}}}}\n",
        ns.name
    ))?;
    wait_running(
        &rc.kubectl,
        &ns.name,
        &["protected", "next"],
        Duration::from_secs(90),
    )?;
    rc.kubectl.wait_for(
        "the disruption controller's status",
        Duration::from_secs(60),
        |k| {
            let pdb = k.get_json(&["-n", &ns.name, "pdb", "all"])?;
            let s = &pdb["status"];
            Ok((s["observedGeneration"] == pdb["metadata"]["generation"]
                && s["currentHealthy"] == 1
                && s["disruptionsAllowed"] == 0)
                .then_some(()))
        },
    )?;
    rc.wait_held(&ns.name, &["protected", "next"], Duration::from_secs(60))
}

#[test]
fn respect_takes_the_budgets_429_and_evicts_the_next_pod() -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    rc.install("pdb-respect", &Variant::enforcing_through_the_api())?;
    let node = rc.node0().name;
    let agent = rc.agent_pod(&node, "node-agent")?;
    let ns = rc.namespace("pdbrespect");
    protected_and_next(&rc, &ns, &node)?;
    rc.grow_to_headroom(&ns.name, &node, &agent, "grower", 150.0, 200)?;
    rc.wait_gone(&ns.name, "next", Duration::from_secs(120))?;
    let phase = pod_phase(&rc, &ns.name, "protected")?;
    assert_eq!(phase.trim(), "Running", "the protected pod stays");
    let asked = rc.eviction_requests(&ns.name)?;
    assert!(
        asked.len() >= 2
            && asked[0] == ("protected".into(), 429, AGENT_SA.into())
            && asked.last() == Some(&("next".into(), 201, AGENT_SA.into())),
        "the budget's 429 for the protected pod, then the next pod evicted: {asked:?}"
    );
    // The 429's body names the DisruptionBudget cause (what `respect` keys on).
    let audit = rc.audit_events()?;
    let refused = audit
        .iter()
        .find(|e| {
            e["objectRef"]["subresource"] == "eviction"
                && e["objectRef"]["namespace"] == ns.name.as_str()
                && e["objectRef"]["name"] == "protected"
                && e["responseStatus"]["code"] == 429
        })
        .expect("the refused eviction in the audit log");
    let status = &refused["responseStatus"];
    assert!(
        status["details"]["causes"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["reason"] == "DisruptionBudget"),
        "the cause: {status}"
    );
    let blocked = rc.metric(
        &agent,
        "node_agent_evictions_total{eviction_signal=\"allocatableMemory.available\",result=\"blocked_by_pdb\"}",
    )?;
    assert!(
        blocked >= Some(1.0),
        "counted as blocked_by_pdb: {blocked:?}"
    );
    Ok(())
}

/// With hard evictions on the node (the shipped `kubernetes.hardEviction: node`), a budget binds
/// nothing, as it binds nothing of the kubelet's own hard evictions: the protected pod, the
/// ranking's first, is killed and recorded, the next one stays, and no Eviction is asked.
#[test]
fn on_the_node_a_budget_binds_nothing_as_for_the_kubelets_own() -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    rc.install("pdb-node", &Variant::enforcing())?;
    let node = rc.node0().name;
    let agent = rc.agent_pod(&node, "node-agent")?;
    let ns = rc.namespace("pdbnode");
    protected_and_next(&rc, &ns, &node)?;
    rc.grow_to_headroom(&ns.name, &node, &agent, "grower", 150.0, 200)?;
    rc.wait_killed_by_agent(&ns.name, "protected", Duration::from_secs(120))?;
    let phase = pod_phase(&rc, &ns.name, "next")?;
    assert_eq!(phase.trim(), "Running", "the next pod stays");
    let ends = rc.agent_pod_ends(&ns.name)?;
    assert!(
        ends.iter()
            .all(|e| e.kind == "status" && e.pod == "protected"),
        "only the protected pod's record, no Eviction asked: {ends:?}"
    );
    Ok(())
}

fn override_config() -> String {
    Variant::api_config_with(&[("pdbPolicy: respect ", "pdbPolicy: override")])
}

#[test]
fn override_without_its_grants_is_refused_and_the_protected_pod_stays() -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    rc.install(
        "pdb-override-bare",
        &Variant {
            config: Some(override_config()),
            ..Variant::enforcing()
        },
    )?;
    let node = rc.node0().name;
    let agent = rc.agent_pod(&node, "node-agent")?;
    let ns = rc.namespace("pdbbare");
    protected_and_next(&rc, &ns, &node)?;
    rc.grow_to_headroom(&ns.name, &node, &agent, "grower", 150.0, 200)?;
    rc.wait_gone(&ns.name, "next", Duration::from_secs(120))?;
    let phase = pod_phase(&rc, &ns.name, "protected")?;
    assert_eq!(
        phase.trim(),
        "Running",
        "without the grants the protected pod stays"
    );
    let audit = rc.audit_events()?;
    let deletes: Vec<i64> = audit
        .iter()
        .filter(|e| {
            e["verb"] == "delete"
                && e["objectRef"]["resource"] == "pods"
                && e["objectRef"]["namespace"] == ns.name.as_str()
                && e["objectRef"]["name"] == "protected"
                && e["user"]["username"] == AGENT_SA
                && e["stage"] == "ResponseComplete"
        })
        .filter_map(|e| e["responseStatus"]["code"].as_i64())
        .collect();
    assert!(
        !deletes.is_empty() && deletes.iter().all(|c| *c == 403),
        "the override's delete is refused by RBAC: {deletes:?}"
    );
    Ok(())
}

#[test]
fn override_with_its_grants_marks_the_protected_pod_evicted_and_deletes_it() -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    let grants = std::fs::read_to_string(
        node_agent_tests::real_cluster::workspace().join("deploy/override/rbac-override.yaml"),
    )?;
    // deploy/override/ as the README says to apply it, removed with the variant's namespace...
    rc.kubectl.apply(&grants)?;
    struct Revoke<'a>(&'a RealCluster);
    impl Drop for Revoke<'_> {
        fn drop(&mut self) {
            let _ = self.0.kubectl.run(&[
                "delete",
                "clusterrolebinding,clusterrole",
                "node-agent-override",
                "--ignore-not-found",
            ]);
        }
    }
    let _revoke = Revoke(&rc);
    rc.install(
        "pdb-override",
        &Variant {
            config: Some(override_config()),
            ..Variant::enforcing()
        },
    )?;
    let node = rc.node0().name;
    let agent = rc.agent_pod(&node, "node-agent")?;
    let ns = rc.namespace("pdboverride");
    protected_and_next(&rc, &ns, &node)?;
    rc.grow_to_headroom(&ns.name, &node, &agent, "grower", 150.0, 200)?;
    rc.wait_gone(&ns.name, "protected", Duration::from_secs(120))?;
    let phase = pod_phase(&rc, &ns.name, "next")?;
    assert_eq!(
        phase.trim(),
        "Running",
        "the next pod stays: the protected one went instead"
    );
    let audit = rc.audit_events()?;
    let by_agent = |verb: &str, sub: Option<&str>| -> Vec<i64> {
        audit
            .iter()
            .filter(|e| {
                e["verb"] == verb
                    && e["objectRef"]["namespace"] == ns.name.as_str()
                    && e["objectRef"]["name"] == "protected"
                    && e["objectRef"]["subresource"].as_str() == sub
                    && e["user"]["username"] == AGENT_SA
                    && e["stage"] == "ResponseComplete"
            })
            .filter_map(|e| e["responseStatus"]["code"].as_i64())
            .collect()
    };
    assert_eq!(
        by_agent("patch", Some("status")),
        vec![200],
        "marked Failed/Evicted"
    );
    assert_eq!(by_agent("delete", None), vec![200], "deleted");
    let overridden = rc.metric(
        &agent,
        "node_agent_evictions_total{eviction_signal=\"allocatableMemory.available\",result=\"pdb_overridden\"}",
    )?;
    assert_eq!(overridden, Some(1.0));
    Ok(())
}

/// The pod's phase, as the API server has it now.
fn pod_phase(rc: &RealCluster, namespace: &str, pod: &str) -> anyhow::Result<String> {
    rc.kubectl.run(&[
        "-n",
        namespace,
        "get",
        "pod",
        pod,
        "-o",
        "jsonpath={.status.phase}",
    ])
}
