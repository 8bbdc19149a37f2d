//! Least privilege, proven by the real API server (and the real kubelet's authorization):
//! every request the agent makes is allowed; every grant of its ClusterRole and every
//! validation of its admission policy is needed, for without each a named failure follows or
//! the agent's token could do what the validation forbids; and the policy, as the API server
//! evaluates it, keeps the agent's token to its own node where it can: everywhere but the
//! Eviction API, which the default way of a hard eviction (a kill on the node, recorded by a
//! pods/status patch) no longer uses.

use std::{collections::BTreeSet, time::Duration};

use anyhow::Context as _;
use http::Method;
use node_agent_tests::{
    agent_access::{agent_requests_since, eviction, policy_denial, AgentToken, Answer, Audited},
    real_cluster::{
        metric_value, wait_running, Patch, Qos, RealCluster, Variant, WorkloadPod, AGENT_NS,
    },
    real_node::{condition, grow_until_left, pressure_taint, wait_log, GhostNode},
};
use serde_json::{json, Value};

/// The shipped config with a transition period short enough that a test sees pressure end.
fn config() -> String {
    Variant::shipped_config_with(&[(
        "evictionPressureTransitionPeriod: \"5m\"",
        "evictionPressureTransitionPeriod: \"20s\"",
    )])
}

/// The enforcing install with the shipped config (short transition), and `patches`.
fn enforcing(patches: Vec<Patch>) -> Variant {
    Variant {
        config: Some(config()),
        patches,
        ..Variant::enforcing()
    }
}

/// [`enforcing`] with hard evictions asked through the API (`hardEviction: api`), where
/// pods/eviction is what the agent writes.
fn enforcing_through_the_api(patches: Vec<Patch>) -> Variant {
    Variant {
        config: Some(Variant::api_config_with(&[(
            "evictionPressureTransitionPeriod: \"5m\"",
            "evictionPressureTransitionPeriod: \"20s\"",
        )])),
        patches,
        ..Variant::enforcing()
    }
}

/// The documents of a file of deploy/.
fn deploy_documents(file: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(
        node_agent_tests::real_cluster::workspace()
            .join("deploy")
            .join(file),
    )
    .unwrap_or_else(|e| panic!("deploy/{file}: {e}"));
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| {
            let v: serde_yaml_ng::Value = serde::Deserialize::deserialize(d).expect("YAML");
            serde_json::to_value(v).expect("JSON")
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// deploy/rbac.yaml's ClusterRole's rules.
fn cluster_role_rules() -> Vec<Value> {
    deploy_documents("rbac.yaml")
        .into_iter()
        .find(|d| d["kind"] == "ClusterRole")
        .and_then(|r| r["rules"].as_array().cloned())
        .expect("deploy/rbac.yaml has a ClusterRole with rules")
}

/// Every (resource, verb) the ClusterRole grants.
fn grants() -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for rule in cluster_role_rules() {
        for r in rule["resources"].as_array().into_iter().flatten() {
            for v in rule["verbs"].as_array().into_iter().flatten() {
                out.insert((
                    r.as_str().unwrap_or("").to_string(),
                    v.as_str().unwrap_or("").to_string(),
                ));
            }
        }
    }
    out
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_string))
        .collect()
}

/// A patch of the ClusterRole that takes `verb` on `resource` away and leaves every other grant.
fn without_grant(resource: &str, verb: &str) -> Patch {
    let rules = cluster_role_rules();
    let (i, rule) = rules
        .iter()
        .enumerate()
        .find(|(_, r)| {
            strings(&r["resources"]).iter().any(|x| x == resource)
                && strings(&r["verbs"]).iter().any(|x| x == verb)
        })
        .unwrap_or_else(|| panic!("deploy/rbac.yaml grants no {verb} on {resource}"));
    let resources = strings(&rule["resources"]);
    let verbs = strings(&rule["verbs"]);
    let operations = match (resources.len(), verbs.len()) {
        (1, 1) => json!([{"op": "remove", "path": format!("/rules/{i}")}]),
        (1, _) => json!([{"op": "replace", "path": format!("/rules/{i}/verbs"),
            "value": verbs.iter().filter(|v| *v != verb).collect::<Vec<_>>()}]),
        (_, 1) => json!([{"op": "replace", "path": format!("/rules/{i}/resources"),
            "value": resources.iter().filter(|r| *r != resource).collect::<Vec<_>>()}]),
        _ => panic!("rule {i} grants several verbs on several resources: not one grant alone"),
    };
    Patch {
        kind: "ClusterRole".into(),
        name: "node-agent".into(),
        operations,
    }
}

/// A patch of the admission policy without the validation whose message contains `message`.
fn without_validation(message: &str) -> Patch {
    let vap = deploy_documents("admission-policy.yaml")
        .into_iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .expect("the admission policy");
    let i = vap["spec"]["validations"]
        .as_array()
        .into_iter()
        .flatten()
        .position(|v| v["message"].as_str().is_some_and(|m| m.contains(message)))
        .unwrap_or_else(|| panic!("no validation says {message:?}"));
    Patch {
        kind: "ValidatingAdmissionPolicy".into(),
        name: "node-agent-own-node".into(),
        operations: json!([{"op": "remove", "path": format!("/spec/validations/{i}")}]),
    }
}

/// Every validation's message, as the policy writes it (folded: one line).
fn validation_messages() -> Vec<String> {
    deploy_documents("admission-policy.yaml")
        .into_iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .and_then(|v| v["spec"]["validations"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .map(|v| v["message"].as_str().unwrap_or("").trim().to_string())
        .collect()
}

/// Waits for an audited request of the agent's matching `pick`.
fn wait_audited(
    rc: &RealCluster,
    since: jiff::Timestamp,
    what: &str,
    limit: Duration,
    pick: impl Fn(&Audited) -> bool,
) -> anyhow::Result<Audited> {
    rc.kubectl.wait_for(what, limit, |_| {
        Ok(agent_requests_since(rc, since)?
            .into_iter()
            .find(|a| pick(a)))
    })
}

/// The agent's metric `series`, 0 when absent.
fn counter(rc: &RealCluster, node: &str, series: &str) -> anyhow::Result<f64> {
    let pod = rc.agent_pod(node, "node-agent")?;
    Ok(metric_value(&rc.agent_metrics(&pod)?, series).unwrap_or(0.0))
}

/// Until the agent's condition says no pressure (its transition period over).
fn wait_no_pressure(rc: &RealCluster, node: &str) -> anyhow::Result<()> {
    rc.kubectl.wait_for(
        "NodeAgentPressure False and no pressure taint",
        Duration::from_secs(90),
        |_| {
            let c = condition(rc, node, "NodeAgentPressure")?;
            let clear = c.is_none_or(|c| c["status"] != "True");
            Ok((clear && pressure_taint(rc, node)?.is_none()).then_some(()))
        },
    )
}

/// A pod that is OOM-killed in its container again and again (it asks for 64 MiB under a
/// 32 MiB limit and is restarted each time): a storm in one container.
fn oom_looper(name: &str, node: &str) -> WorkloadPod {
    let mut p = WorkloadPod::new(name, Qos::Burstable, "16Mi", &["memory", "64", "0"]);
    p.memory_limit = Some("32Mi".into());
    p.node = Some(node.to_string());
    p
}

fn oom_looper_manifest(p: &WorkloadPod, namespace: &str) -> String {
    p.manifest(namespace)
        .replace("restartPolicy: Never", "restartPolicy: Always")
}

fn delete_pod(rc: &RealCluster, namespace: &str, pod: &str) -> anyhow::Result<()> {
    rc.kubectl.run(&[
        "-n",
        namespace,
        "delete",
        "pod",
        pod,
        "--ignore-not-found",
        "--wait=true",
        "--timeout=60s",
    ])?;
    Ok(())
}

// --- (a) Every request the agent makes is allowed -------------------------------------------

#[test]
fn every_request_the_agent_makes_enforcing_under_pressure_is_allowed() -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    let node = rc.node0().name;
    let since = jiff::Timestamp::now();
    rc.install("privilege-allowed", &enforcing(Vec::new()))?;
    let agent = rc.agent_pod(&node, "node-agent")?;
    let ns = rc.namespace("allowed");

    // OOM kills in one container, again and again: the pod's event, then its series.
    let looper = oom_looper("looper", &node);
    rc.kubectl.apply(&oom_looper_manifest(&looper, &ns.name))?;
    // Memory pressure past the agent's line: a kill on the node and its record, its events,
    // the condition and the taint; then the pressure ends, and the taint goes.
    let grower = grow_until_left(
        &rc,
        &ns.name,
        &agent,
        &node,
        WorkloadPod::new("grower", Qos::Burstable, "64Mi", &[]),
        150.0,
        400,
    )?;
    rc.wait_killed_by_agent(&ns.name, &grower.name, Duration::from_secs(120))?;
    wait_audited(
        &rc,
        since,
        "the taint written by the agent",
        Duration::from_secs(60),
        |a| a.verb == "patch" && a.resource == "nodes" && a.subresource.is_empty() && a.code == 200,
    )?;
    wait_no_pressure(&rc, &node)?;
    wait_audited(
        &rc,
        since,
        "an OOM kill's series written by the agent",
        Duration::from_secs(120),
        |a| a.verb == "patch" && a.resource == "events" && a.code == 200,
    )?;
    delete_pod(&rc, &ns.name, "looper")?;

    let requests = agent_requests_since(&rc, since)?;
    let refused: Vec<String> = requests
        .iter()
        .filter(|a| a.code == 401 || a.code == 403)
        .map(Audited::line)
        .collect();
    assert!(
        refused.is_empty(),
        "requests of the agent refused:\n{}",
        refused.join("\n")
    );
    // What the agent did, each answered as done: the grants of its ClusterRole at work.
    let used: BTreeSet<(String, String, u16)> = requests
        .iter()
        .map(|a| {
            let resource = if a.subresource.is_empty() {
                a.resource.clone()
            } else {
                format!("{}/{}", a.resource, a.subresource)
            };
            (resource, a.verb.clone(), a.code)
        })
        .collect();
    // (pods/eviction is the way of soft and disk thresholds, and of hard ones with
    // `hardEviction: api`: the write rows below take it away there.)
    for (resource, verb, code) in [
        ("pods/status", "patch", 200),
        ("nodes", "get", 200),
        ("nodes", "patch", 200),
        ("nodes/status", "patch", 200),
        ("events", "create", 201),
        ("events", "patch", 200),
    ] {
        assert!(
            used.contains(&(resource.to_string(), verb.to_string(), code)),
            "the agent's {verb} on {resource} answered {code}; it made: {used:?}"
        );
    }
    // The kubelet's API (nodes/pods, nodes/stats) is authorized by the kubelet, which asks
    // the API server: the pod source read it throughout.
    assert_eq!(
        rc.metric(
            &rc.agent_pod(&node, "node-agent")?,
            "node_agent_kube_source_ready{source=\"pods\"}"
        )?,
        Some(1.0)
    );
    let other: Vec<String> = requests
        .iter()
        .filter(|a| a.code >= 400)
        .map(Audited::line)
        .collect();
    eprintln!(
        "{} requests of the agent, none refused; other failures: {other:?}",
        requests.len()
    );
    Ok(())
}

// --- (b) Every grant of the ClusterRole is needed --------------------------------------------

/// Each grant of deploy/rbac.yaml, and the test below that takes it away and names what fails.
const GRANT_NEEDED_BY: &[(&str, &str, &str)] = &[
    (
        "pods",
        "list",
        "without_list_or_watch_on_pods_the_api_server_source_is_blind",
    ),
    (
        "pods",
        "watch",
        "without_list_or_watch_on_pods_the_api_server_source_is_blind",
    ),
    (
        "pods/eviction",
        "create",
        "without_each_write_grant_under_pressure_the_agent_names_the_refusal",
    ),
    (
        "pods/status",
        "patch",
        "without_each_write_grant_under_pressure_the_agent_names_the_refusal",
    ),
    (
        "nodes",
        "patch",
        "without_each_write_grant_under_pressure_the_agent_names_the_refusal",
    ),
    (
        "events",
        "create",
        "without_each_write_grant_under_pressure_the_agent_names_the_refusal",
    ),
    (
        "nodes/status",
        "patch",
        "without_patch_on_nodes_status_or_events_the_condition_or_the_series_is_refused",
    ),
    (
        "events",
        "patch",
        "without_patch_on_nodes_status_or_events_the_condition_or_the_series_is_refused",
    ),
    (
        "nodes",
        "get",
        "without_each_read_grant_the_pod_source_names_the_refusal",
    ),
    (
        "nodes/pods",
        "get",
        "without_each_read_grant_the_pod_source_names_the_refusal",
    ),
    (
        "nodes/stats",
        "get",
        "without_each_read_grant_the_pod_source_names_the_refusal",
    ),
    (
        "tokenreviews",
        "create",
        "without_create_on_the_reviews_no_caller_of_metrics_is_let_in_and_the_log_says_why",
    ),
    (
        "subjectaccessreviews",
        "create",
        "without_create_on_the_reviews_no_caller_of_metrics_is_let_in_and_the_log_says_why",
    ),
];

/// `metricsAccess: kubernetes` (the default) reviews each caller of `/metrics` through the API
/// server: a TokenReview of its token, then a SubjectAccessReview of `get /metrics`. Without
/// `create` on either, even a caller granted `get` is turned away, 503, and the agent's log
/// names the refusal.
#[test]
fn without_create_on_the_reviews_no_caller_of_metrics_is_let_in_and_the_log_says_why(
) -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    let node = rc.node0().name;
    let scraper = rc.metrics_token()?;
    for review in ["tokenreviews", "subjectaccessreviews"] {
        rc.install(
            &format!("without-{review}"),
            &Variant {
                patches: vec![without_grant(review, "create")],
                ..Variant::default()
            },
        )?;
        let agent = rc.agent_pod(&node, "node-agent")?;
        let (code, body) = rc.agent_get(&agent, "/metrics", Some(&scraper))?;
        eprintln!("without create on {review}: {code} {}", body.trim());
        assert_eq!(code, 503, "without create on {review}: {body}");
        let line = rc.kubectl.wait_for(
            &format!("the agent's log naming {review}"),
            Duration::from_secs(30),
            |_| {
                let logs = rc.agent_logs(&agent)?;
                Ok(logs
                    .lines()
                    .find(|l| l.contains("could not be reviewed") && l.contains(review))
                    .map(str::to_string))
            },
        )?;
        assert!(line.contains("403") || line.contains("forbidden"), "{line}");
    }
    // With both grants back, the same caller is let in.
    rc.restore_base()?;
    let agent = rc.agent_pod(&node, "node-agent")?;
    let (code, _) = rc.agent_get(&agent, "/metrics", Some(&scraper))?;
    assert_eq!(code, 200, "with the shipped grants");
    Ok(())
}

#[test]
fn every_grant_of_the_cluster_role_is_taken_away_by_a_test_here() {
    let granted = grants();
    let tested: BTreeSet<(String, String)> = GRANT_NEEDED_BY
        .iter()
        .map(|(r, v, _)| (r.to_string(), v.to_string()))
        .collect();
    let untested: Vec<_> = granted.difference(&tested).collect();
    assert!(
        untested.is_empty(),
        "deploy/rbac.yaml grants {untested:?}, which no test here shows to be needed: take it away, or prove it"
    );
    let gone: Vec<_> = tested.difference(&granted).collect();
    assert!(gone.is_empty(), "no longer granted: {gone:?}");
}

/// One write grant taken away, with pressure to make the agent use it.
struct WriteRow {
    resource: &'static str,
    verb: &'static str,
    /// The agent's log line says this (with `403`).
    log: &'static str,
    /// The agent's counter that rises.
    counter: &'static str,
    /// Hard evictions through the API (`hardEviction: api`) rather than on the node.
    through_the_api: bool,
}

impl WriteRow {
    fn variant(&self, patches: Vec<Patch>) -> Variant {
        if self.through_the_api {
            enforcing_through_the_api(patches)
        } else {
            enforcing(patches)
        }
    }
}

#[test]
fn without_each_write_grant_under_pressure_the_agent_names_the_refusal() -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    let node = rc.node0().name;
    rc.install("privilege-writes", &enforcing(Vec::new()))?;
    let ns = rc.namespace("writes");
    let rows = [
        WriteRow {
            resource: "pods/eviction",
            verb: "create",
            log: "result=\"refused\"",
            counter: "node_agent_evictions_total{eviction_signal=\"allocatableMemory.available\",result=\"refused\"}",
            through_the_api: true,
        },
        // The record of a kill on the node: the pod was killed, its record refused.
        WriteRow {
            resource: "pods/status",
            verb: "patch",
            log: "its record (Failed, Evicted) was not written",
            counter: "node_agent_eviction_records_total{result=\"lost\"}",
            through_the_api: false,
        },
        WriteRow {
            resource: "nodes",
            verb: "patch",
            log: "node taint not written",
            counter: "node_agent_kube_errors_total{operation=\"node taint\"}",
            through_the_api: false,
        },
        WriteRow {
            resource: "events",
            verb: "create",
            log: "event not recorded",
            counter: "node_agent_kube_errors_total{operation=\"EvictionThresholdMet\"}",
            through_the_api: false,
        },
    ];
    for (i, row) in rows.iter().enumerate() {
        let what = format!("without {} {}", row.verb, row.resource);
        let since = jiff::Timestamp::now();
        rc.apply_variant(
            "privilege-writes-without",
            &row.variant(vec![without_grant(row.resource, row.verb)]),
        )?;
        let agent = rc.agent_pod(&node, "node-agent")?;
        let before = counter(&rc, &node, row.counter)?;
        let grower = grow_until_left(
            &rc,
            &ns.name,
            &agent,
            &node,
            WorkloadPod::new(&format!("grower-{i}"), Qos::Burstable, "64Mi", &[]),
            150.0,
            400,
        )?;
        // The API server refused it, by RBAC, naming the grant.
        let refusal = wait_audited(&rc, since, &what, Duration::from_secs(90), |a| {
            let resource = if a.subresource.is_empty() {
                a.resource.clone()
            } else {
                format!("{}/{}", a.resource, a.subresource)
            };
            resource == row.resource && a.verb == row.verb && a.code == 403
        })?;
        assert!(
            refusal.message.contains(&format!(
                "cannot {} resource \"{}\"",
                row.verb, row.resource
            )),
            "{what}: RBAC's refusal: {}",
            refusal.line()
        );
        // The agent says so, and counts it.
        let line = wait_log(&rc, &node, &[row.log, "403"], Duration::from_secs(60))
            .with_context(|| what.clone())?;
        eprintln!("{what}: {line}");
        rc.kubectl.wait_for(
            &format!("{what}: {} rises", row.counter),
            Duration::from_secs(30),
            |_| Ok((counter(&rc, &node, row.counter)? > before).then_some(())),
        )?;
        if row.resource == "nodes" {
            assert!(
                pressure_taint(&rc, &node)?.is_none(),
                "{what}: no taint on the node"
            );
        }
        // The grant back, the pressure gone.
        rc.apply_variant("privilege-writes", &row.variant(Vec::new()))?;
        delete_pod(&rc, &ns.name, &grower.name)?;
        wait_no_pressure(&rc, &node)?;
    }
    Ok(())
}

#[test]
fn without_patch_on_nodes_status_or_events_the_condition_or_the_series_is_refused(
) -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    let node = rc.node0().name;
    rc.install("privilege-status", &enforcing(Vec::new()))?;

    // nodes/status: the condition, written at start (and every minute), is refused.
    let since = jiff::Timestamp::now();
    rc.apply_variant(
        "privilege-status-without",
        &enforcing(vec![without_grant("nodes/status", "patch")]),
    )?;
    let old = rc.agent_pod(&node, "node-agent")?;
    rc.kubectl
        .run(&["-n", AGENT_NS, "delete", "pod", &old, "--wait=true"])?;
    let refusal = wait_audited(
        &rc,
        since,
        "the condition refused",
        Duration::from_secs(120),
        |a| a.resource == "nodes" && a.subresource == "status" && a.code == 403,
    )?;
    assert!(
        refusal
            .message
            .contains("cannot patch resource \"nodes/status\""),
        "{}",
        refusal.line()
    );
    let line = wait_log(
        &rc,
        &node,
        &["node condition not written", "403"],
        Duration::from_secs(60),
    )?;
    eprintln!("without patch nodes/status: {line}");
    assert!(
        counter(
            &rc,
            &node,
            "node_agent_kube_errors_total{operation=\"node condition\"}"
        )? >= 1.0
    );
    rc.apply_variant("privilege-status", &enforcing(Vec::new()))?;

    // events patch: an OOM storm's first kill is an event, its series is refused.
    let ns = rc.namespace("series");
    let since = jiff::Timestamp::now();
    rc.apply_variant(
        "privilege-status-without",
        &enforcing(vec![without_grant("events", "patch")]),
    )?;
    let looper = oom_looper("looper", &node);
    rc.kubectl.apply(&oom_looper_manifest(&looper, &ns.name))?;
    wait_audited(
        &rc,
        since,
        "the storm's event created",
        Duration::from_secs(90),
        |a| a.resource == "events" && a.verb == "create" && a.code == 201,
    )?;
    let refusal = wait_audited(
        &rc,
        since,
        "the series refused",
        Duration::from_secs(120),
        |a| a.resource == "events" && a.verb == "patch" && a.code == 403,
    )?;
    assert!(
        refusal.message.contains("cannot patch resource \"events\""),
        "{}",
        refusal.line()
    );
    let line = wait_log(
        &rc,
        &node,
        &["event not recorded", "403"],
        Duration::from_secs(60),
    )?;
    eprintln!("without patch events: {line}");
    delete_pod(&rc, &ns.name, "looper")?;
    Ok(())
}

#[test]
fn without_each_read_grant_the_pod_source_names_the_refusal() -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    let spec = rc.node0();
    let node = spec.name.clone();
    // (grant taken away, what the agent's log then says, restart the kubelet: its
    // authorization cache would answer from before for minutes).
    let rows: [(&str, &str, &[&str], bool); 3] = [
        (
            "nodes",
            "get",
            &["source not ready", "403", "cannot get resource \"nodes\""],
            false,
        ),
        (
            "nodes/pods",
            "get",
            &["source not ready", "403", "subresource(s)=[pods proxy]"],
            true,
        ),
        (
            "nodes/stats",
            "get",
            &["source not ready", "403", "subresource(s)=[stats]"],
            true,
        ),
    ];
    for (resource, verb, log, kubelet) in rows {
        let what = format!("without {verb} {resource}");
        rc.apply_variant(
            "privilege-reads-without",
            &Variant {
                patches: vec![without_grant(resource, verb)],
                ..Variant::default()
            },
        )?;
        let _restore_kubelet = if kubelet {
            Some(node_agent_tests::real_node::restart_kubelet(
                &rc,
                &spec,
                &Default::default(),
            )?)
        } else {
            None
        };
        // A fresh agent: it works out the kubelet's address from its Node at start.
        let old = rc.agent_pod(&node, "node-agent")?;
        rc.kubectl
            .run(&["-n", AGENT_NS, "delete", "pod", &old, "--wait=true"])?;
        let line =
            wait_log(&rc, &node, log, Duration::from_secs(120)).with_context(|| what.clone())?;
        eprintln!("{what}: {line}");
        let agent = rc.agent_pod(&node, "node-agent")?;
        assert_eq!(
            rc.metric(&agent, "node_agent_kube_source_ready{source=\"pods\"}")?,
            Some(0.0),
            "{what}: the pod source is not ready"
        );
        let ready = rc.kubectl.call(
            &[
                "get",
                "--raw",
                &format!("/api/v1/namespaces/{AGENT_NS}/pods/{agent}:9464/proxy/readyz"),
            ],
            None,
            Duration::from_secs(20),
        )?;
        assert!(!ready.success, "{what}: /readyz fails: {}", ready.stdout);
        rc.install("base", &Variant::default())?;
    }
    Ok(())
}

#[test]
fn without_list_or_watch_on_pods_the_api_server_source_is_blind() -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    let node = rc.node0().name;
    let apiserver =
        Variant::shipped_config_with(&[("podSource: kubelet ", "podSource: apiserver")]);
    for verb in ["list", "watch"] {
        let what = format!("podSource: apiserver without {verb} pods");
        let since = jiff::Timestamp::now();
        rc.apply_variant(
            "privilege-pods-without",
            &Variant {
                config: Some(apiserver.clone()),
                patches: vec![without_grant("pods", verb)],
                ..Variant::default()
            },
        )?;
        let refusal = wait_audited(&rc, since, &what, Duration::from_secs(180), |a| {
            a.resource == "pods" && a.verb == verb && a.code == 403
        })?;
        assert!(
            refusal
                .message
                .contains(&format!("cannot {verb} resource \"pods\"")),
            "{what}: {}",
            refusal.line()
        );
        let line = wait_log(
            &rc,
            &node,
            &[
                "source not ready",
                "403",
                &format!("cannot {verb} resource \"pods\""),
            ],
            Duration::from_secs(120),
        )
        .with_context(|| what.clone())?;
        eprintln!("{what}: {line}");
        rc.install("base", &Variant::default())?;
    }
    Ok(())
}

// --- (b) Every validation of the admission policy is needed ----------------------------------

/// What the tests below ask with the agent's token, around a Node without a kubelet.
struct Scene<'a> {
    ghost: GhostNode<'a>,
    namespace: String,
    own_node: String,
    /// A pod on the agent's node, and one bound to the ghost Node; their UIDs.
    own_pod: (String, String),
    ghost_pod: (String, String),
    bound: AgentToken,
    unbound: AgentToken,
}

impl<'a> Scene<'a> {
    fn new(rc: &'a RealCluster, namespace: &str) -> anyhow::Result<Self> {
        let own_node = rc.node0().name;
        let ghost = GhostNode::register(rc, "node-agent-ghost")?;
        let mut own = WorkloadPod::new("own", Qos::BestEffort, "", &["sleep"]);
        own.node = Some(own_node.clone());
        let mut far = WorkloadPod::new("far", Qos::BestEffort, "", &["sleep"]);
        far.node = Some(ghost.name.clone());
        rc.kubectl.apply(&own.manifest(namespace))?;
        rc.kubectl.apply(&far.manifest(namespace))?;
        wait_running(&rc.kubectl, namespace, &["own"], Duration::from_secs(90))?;
        let uid = |pod: &str| node_agent_tests::real_node::pod_uid(rc, namespace, pod);
        let agent = rc.agent_pod(&own_node, "node-agent")?;
        let bound = AgentToken::bound_to(rc, &agent)?;
        assert_eq!(bound.node.as_deref(), Some(own_node.as_str()));
        Ok(Self {
            own_pod: ("own".into(), uid("own")?),
            ghost_pod: ("far".into(), uid("far")?),
            ghost,
            namespace: namespace.to_string(),
            own_node,
            bound,
            unbound: AgentToken::unbound(rc)?,
        })
    }

    fn evict(
        &self,
        token: &AgentToken,
        pod: &(String, String),
        with_uid: bool,
    ) -> anyhow::Result<Answer> {
        token.post(
            &format!(
                "/api/v1/namespaces/{}/pods/{}/eviction?dryRun=All",
                self.namespace, pod.0
            ),
            &eviction(&self.namespace, &pod.0, with_uid.then_some(pod.1.as_str())),
        )
    }

    /// An events.k8s.io/v1 event as the agent writes them, changed by `edit`.
    fn event(&self, edit: impl FnOnce(&mut Value)) -> Value {
        let mut e = json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": format!("probe.{}", jiff::Timestamp::now().as_nanosecond()), "namespace": self.namespace},
            "eventTime": jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
            "reportingController": "node-agent.io/node-agent",
            "reportingInstance": format!("node-agent-{}", self.own_node),
            "action": "Evicting", "reason": "Evicted", "type": "Warning", "note": "probe",
            "regarding": {"apiVersion": "v1", "kind": "Pod", "namespace": self.namespace,
                          "name": self.own_pod.0, "uid": self.own_pod.1},
            "related": {"apiVersion": "v1", "kind": "Node", "name": self.own_node},
        });
        edit(&mut e);
        e
    }

    fn post_event(&self, event: &Value) -> anyhow::Result<Answer> {
        self.bound.post(
            &format!(
                "/apis/events.k8s.io/v1/namespaces/{}/events?dryRun=All",
                self.namespace
            ),
            event,
        )
    }
}

/// One validation taken away: what the agent's token then does that the policy forbids.
struct PolicyRow {
    /// The validation, by its message.
    message: &'static str,
    probe: fn(&Scene) -> anyhow::Result<Answer>,
}

fn policy_rows() -> Vec<PolicyRow> {
    vec![
        PolicyRow {
            message: "must use the token of its own pod",
            // A token without the node claim evicts a pod (naming its UID).
            probe: |s| s.evict(&s.unbound, &s.own_pod, true),
        },
        PolicyRow {
            message: "may change, or reach the kubelet of, only its own node",
            // Another node's status.
            probe: |s| {
                s.bound.merge_patch(
                    &format!("/api/v1/nodes/{}/status?dryRun=All", s.ghost.name),
                    &json!({"status": {"conditions": [{"type": "NodeAgentPressure", "status": "True",
                        "reason": "PressureDetected", "message": "forged"}]}}),
                )
            },
        },
        PolicyRow {
            message: "may change only its own taint",
            // A label on its own node.
            probe: |s| {
                s.bound.merge_patch(
                    &format!("/api/v1/nodes/{}?dryRun=All", s.own_node),
                    &json!({"metadata": {"labels": {"forged": "yes"}}}),
                )
            },
        },
        PolicyRow {
            message: "may delete or update only pods on its own node",
            // With deploy/override's grants: delete a pod on another node.
            probe: |s| {
                s.bound.request(
                    Method::DELETE,
                    &format!(
                        "/api/v1/namespaces/{}/pods/{}?dryRun=All",
                        s.namespace, s.ghost_pod.0
                    ),
                    None,
                )
            },
        },
        PolicyRow {
            message: "must carry the pod's UID as a precondition",
            probe: |s| s.evict(&s.bound, &s.own_pod, false),
        },
        PolicyRow {
            message: "must come from its own node",
            // An event speaking for another node's agent, about that node.
            // (A node's events live in `default`, as the agent writes them.)
            probe: |s| {
                let event = s.event(|e| {
                    e["metadata"]["namespace"] = json!("default");
                    e["reportingInstance"] = json!(format!("node-agent-{}", s.ghost.name));
                    e["regarding"] =
                        json!({"apiVersion": "v1", "kind": "Node", "name": s.ghost.name});
                    e.as_object_mut().map(|o| o.remove("related"));
                });
                s.bound.post(
                    "/apis/events.k8s.io/v1/namespaces/default/events?dryRun=All",
                    &event,
                )
            },
        },
        PolicyRow {
            message: "about a pod must name its own node",
            // An event about a pod with no related node.
            probe: |s| {
                s.post_event(&s.event(|e| {
                    e.as_object_mut().map(|o| o.remove("related"));
                }))
            },
        },
        PolicyRow {
            message: "may update only the events it reported",
            // With a wider grant (core/v1 events, where reportingInstance may change): an
            // event someone else wrote, rewritten as the agent's.
            probe: |s| {
                s.bound.merge_patch(
                    &format!(
                        "/api/v1/namespaces/{}/events/written-by-someone-else?dryRun=All",
                        s.namespace
                    ),
                    &json!({"reportingInstance": format!("node-agent-{}", s.own_node)}),
                )
            },
        },
    ]
}

/// The grants two rows need beyond the ClusterRole: deploy/override's (pods delete), and a
/// wider one on core/v1 events; removed when dropped.
struct WiderGrants<'a>(&'a RealCluster);

impl WiderGrants<'_> {
    const CORE_EVENTS: &'static str = "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: node-agent-test-core-events}
rules:
  - {apiGroups: [\"\"], resources: [events], verbs: [patch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: node-agent-test-core-events}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: node-agent-test-core-events}
subjects: [{kind: ServiceAccount, name: node-agent, namespace: node-agent}]
";
}

impl Drop for WiderGrants<'_> {
    fn drop(&mut self) {
        let override_dir = node_agent_tests::real_cluster::workspace().join("deploy/override");
        let _ = self.0.kubectl.call(
            &[
                "delete",
                "-k",
                &override_dir.to_string_lossy(),
                "--ignore-not-found",
            ],
            None,
            Duration::from_secs(60),
        );
        let _ = self.0.kubectl.call(
            &["delete", "-f", "-", "--ignore-not-found"],
            Some(Self::CORE_EVENTS),
            Duration::from_secs(60),
        );
    }
}

fn is_denial_by(answer: &Answer, message: &str) -> bool {
    answer.status == 403
        && answer.body["reason"] == "Forbidden"
        && answer.message().contains(&policy_denial(""))
        && answer.message().contains(message)
}

#[test]
fn every_validation_of_the_admission_policy_is_needed() -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    rc.install("base", &Variant::default())?;
    let ns = rc.namespace("policy");
    let scene = Scene::new(&rc, &ns.name)?;
    let _grants = WiderGrants(&rc);
    let override_dir = node_agent_tests::real_cluster::workspace().join("deploy/override");
    rc.kubectl
        .run(&["apply", "-k", &override_dir.to_string_lossy()])?;
    rc.kubectl.apply(WiderGrants::CORE_EVENTS)?;
    rc.kubectl.apply(&format!(
        "apiVersion: v1\nkind: Event\nmetadata: {{name: written-by-someone-else, namespace: {ns}}}\ninvolvedObject: {{apiVersion: v1, kind: ConfigMap, name: kube-root-ca.crt, namespace: {ns}}}\nreason: Probe\nmessage: written by an admin\ntype: Normal\nreportingComponent: example.com/admin\nreportingInstance: admin-host\nsource: {{component: admin}}\n",
        ns = ns.name
    ))?;

    let rows = policy_rows();
    let messages = validation_messages();
    for m in &messages {
        assert!(
            rows.iter().any(|r| m.contains(r.message)),
            "validation {m:?} has no row here that takes it away"
        );
    }
    for row in &rows {
        let what = format!("the validation {:?}", row.message);
        // As shipped: refused by that validation, in the API server's words.
        let answer =
            rc.kubectl
                .wait_for(&format!("{what} in force"), Duration::from_secs(60), |_| {
                    let a = (row.probe)(&scene)?;
                    if is_denial_by(&a, row.message) {
                        Ok(Some(a))
                    } else {
                        anyhow::bail!("answered {} {}", a.status, a.text)
                    }
                })?;
        eprintln!("{what}, shipped: {} {}", answer.status, answer.message());
        // Without it: the token does what it forbids.
        rc.apply_variant(
            "policy-without",
            &Variant {
                patches: vec![without_validation(row.message)],
                ..Variant::default()
            },
        )?;
        let answer = rc.kubectl.wait_for(
            &format!("{what} taken away"),
            Duration::from_secs(60),
            |_| {
                let a = (row.probe)(&scene)?;
                if (200..300).contains(&a.status) {
                    Ok(Some(a))
                } else {
                    anyhow::bail!("answered {} {}", a.status, a.text)
                }
            },
        )?;
        eprintln!("{what}, taken away: {}", answer.status);
        rc.apply_variant("base", &Variant::default())?;
    }
    Ok(())
}

// --- (c) The policy as the API server evaluates it --------------------------------------------

#[test]
fn the_api_server_keeps_the_agents_token_to_its_own_node_except_for_evictions() -> anyhow::Result<()>
{
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    rc.install("base", &Variant::default())?;
    let ns = rc.namespace("own-node");
    let s = Scene::new(&rc, &ns.name)?;
    let taint = json!({"spec": {"taints": [{"key": "node-agent.io/pressure", "value": "MemoryPressure", "effect": "NoSchedule"}]}});

    // Its own node's taint: allowed; another node's: refused, in these words and this shape.
    let own = s
        .bound
        .merge_patch(&format!("/api/v1/nodes/{}?dryRun=All", s.own_node), &taint)?;
    assert_eq!(own.status, 200, "the agent's own taint: {}", own.text);
    let other = s
        .bound
        .merge_patch(&format!("/api/v1/nodes/{}", s.ghost.name), &taint)?;
    let denial =
        policy_denial("the node agent may change, or reach the kubelet of, only its own node");
    assert_eq!(other.status, 403, "another node's taint: {}", other.text);
    assert_eq!(
        other.body,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("nodes \"{}\" is forbidden: {denial}", s.ghost.name),
            "reason": "Forbidden",
            "details": {"name": s.ghost.name, "kind": "nodes", "causes": [{"message": denial}]},
            "code": 403}),
        "the API server's refusal"
    );
    assert!(
        pressure_taint(&rc, &s.ghost.name)?.is_none(),
        "the ghost Node carries no pressure taint"
    );

    // Events: its own, about a pod on its node, allowed; one about a pod elsewhere that names
    // another node, refused; an event it did not write, refused.
    let mine = s.post_event(&s.event(|_| {}))?;
    assert_eq!(mine.status, 201, "the agent's own event: {}", mine.text);
    let elsewhere = s.post_event(&s.event(|e| {
        e["regarding"]["name"] = json!(s.ghost_pod.0);
        e["regarding"]["uid"] = json!(s.ghost_pod.1);
        e["related"]["name"] = json!(s.ghost.name);
    }))?;
    assert!(
        is_denial_by(
            &elsewhere,
            "the node agent's events about a pod must name its own node"
        ),
        "an event about a pod on another node: {}",
        elsewhere.text
    );
    rc.kubectl.apply(&format!(
        "apiVersion: events.k8s.io/v1\nkind: Event\nmetadata: {{name: not-the-agents, namespace: {ns}}}\neventTime: \"{t}\"\nreportingController: example.com/other\nreportingInstance: other-host\naction: Probing\nreason: Probe\ntype: Normal\nnote: written by someone else\nregarding: {{apiVersion: v1, kind: Pod, namespace: {ns}, name: {pod}, uid: {uid}}}\n",
        ns = ns.name,
        t = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ"),
        pod = s.ghost_pod.0,
        uid = s.ghost_pod.1,
    ))?;
    let series = s.bound.merge_patch(
        &format!("/apis/events.k8s.io/v1/namespaces/{}/events/not-the-agents", ns.name),
        &json!({"series": {"count": 2, "lastObservedTime": jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()}}),
    )?;
    assert_eq!(
        series.status, 403,
        "an event the agent did not write: {}",
        series.text
    );
    assert!(
        series.message().contains(&policy_denial("")),
        "{}",
        series.text
    );
    eprintln!("patching an event it did not write: {}", series.message());

    // The record of a kill on the node (the default way of a hard eviction): a pods/status
    // patch, which the policy checks against the pod's node. A pod on its node: allowed; a
    // pod on another node: refused.
    let record = json!({"status": {"phase": "Failed", "reason": "Evicted",
        "message": "The node was low on resource: memory. "}});
    let near = s.bound.merge_patch(
        &format!(
            "/api/v1/namespaces/{}/pods/{}/status?dryRun=All",
            s.namespace, s.own_pod.0
        ),
        &record,
    )?;
    assert_eq!(
        near.status, 200,
        "recording a pod on its node: {}",
        near.text
    );
    let far = s.bound.merge_patch(
        &format!(
            "/api/v1/namespaces/{}/pods/{}/status?dryRun=All",
            s.namespace, s.ghost_pod.0
        ),
        &record,
    )?;
    assert!(
        is_denial_by(&far, "may delete or update only pods on its own node"),
        "recording a pod on another node: {}",
        far.text
    );

    // Evictions: the policy cannot see the evicted pod's node (the Eviction is all the
    // request carries), so a pod on another node can be evicted by UID, as
    // node-agent-kube/README.md says ("What the policy cannot bind"); without the UID, not.
    let far = s.evict(&s.bound, &s.ghost_pod, true)?;
    assert_eq!(
        far.status, 201,
        "evicting a pod on another node, by UID: {}",
        far.text
    );
    let far = s.evict(&s.bound, &s.ghost_pod, false)?;
    assert!(
        is_denial_by(&far, "must carry the pod's UID as a precondition"),
        "{}",
        far.text
    );
    let near = s.evict(&s.bound, &s.own_pod, true)?;
    assert_eq!(
        near.status, 201,
        "evicting a pod on its node: {}",
        near.text
    );
    drop(s);
    Ok(())
}
