//! `kubectl node-agent` on the real cluster of two nodes (`cargo xtask cluster test`): run by
//! the cluster's own kubectl, which finds it on PATH, with the shipped agent (deploy/, dry
//! run) on node-agent-0 and node-agent-1, each in namespaces of its own.
//!
//! - `status`: one row per node, read from each agent through pods/portforward; exit 1 for an
//!   agent that cannot be read; `-l` picks nodes.
//! - `trace`: both nodes' streams merged, across a real OOM kill (a pod over its memory limit
//!   on node-agent-0) and a real eviction decision on node-agent-1 (dry run: decided,
//!   published, not sent), with a pod passed over; an agent pod deleted mid-stream is said to
//!   leave and its replacement to join, and the trace goes on. `explain` then says what was
//!   decided about each of those pods, and why the one passed over was.
//! - RBAC: without get and create on pods/portforward a user is refused naming them; with
//!   exactly deploy/operator-rbac.yaml's roles the same user reads every agent.

use std::{
    collections::BTreeSet,
    sync::mpsc::Receiver,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context as _};
use node_agent_tests::{
    kubectl_plugin::{AgentConfig, Applied, Plugin},
    real_cluster::{wait_running, Qos, RealCluster, WorkloadPod, AGENT_NS},
};
use serde_json::Value;

const NODES: [&str; 2] = ["node-agent-0", "node-agent-1"];
const CALL: Duration = Duration::from_secs(60);

/// The agent pods' names, by node, once both are Running.
fn agent_pods(rc: &RealCluster) -> anyhow::Result<Vec<(String, String)>> {
    NODES
        .iter()
        .map(|n| Ok((n.to_string(), rc.agent_pod(n, "node-agent")?)))
        .collect()
}

fn status_json(plugin: &Plugin, args: &[&str]) -> anyhow::Result<(bool, Vec<Value>)> {
    let mut all = vec!["status", "-o", "json"];
    all.extend_from_slice(args);
    let ran = plugin.run(&all, CALL)?;
    let rows: Vec<Value> = serde_json::from_str(&ran.stdout)
        .with_context(|| format!("status -o json printed {:?} ({})", ran.stdout, ran.stderr))?;
    Ok((ran.success, rows))
}

#[test]
fn status_has_a_row_per_node_and_fails_for_an_agent_it_cannot_read() -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let plugin = Plugin::new(&rc);
    let agents = agent_pods(&rc)?;
    // Every agent Ready: both rows read from the agents themselves.
    let rows = rc.kubectl.wait_for(
        "both agents ready in status",
        Duration::from_secs(120),
        |_| {
            let (ok, rows) = status_json(&plugin, &[])?;
            Ok((ok && rows.len() == 2).then_some(rows))
        },
    )?;
    for ((node, pod), row) in agents.iter().zip(&rows) {
        assert_eq!(row["node"], node.as_str(), "{row}");
        assert_eq!(row["pod"], pod.as_str(), "{row}");
        assert_eq!(row["daemonset"], "node-agent", "{row}");
        let status = &row["status"];
        assert_eq!(
            status["node"],
            node.as_str(),
            "the agent says which node it is: {row}"
        );
        assert_eq!(
            status["mode"], "dry-run",
            "the base install observes: {row}"
        );
        assert_eq!(
            (status["ready"].as_bool(), status["readiness"].as_str()),
            (Some(true), Some("ready"))
        );
        assert!(
            ["fexit", "sampler", "polling"]
                .contains(&status["memory_mechanism"].as_str().unwrap_or("")),
            "{row}"
        );
        assert_eq!(status["version"], env!("CARGO_PKG_VERSION"));
        assert!(
            status["commit"].as_str().is_some_and(|c| c.len() == 40),
            "{row}"
        );
    }
    // The table: a header and one row per node, in node order.
    let table = plugin.run(&["status"], CALL)?;
    ensure!(table.success, "status: {}", table.stderr);
    let lines: Vec<&str> = table.stdout.lines().collect();
    ensure!(
        lines.len() == 3 && lines[0].starts_with("NODE "),
        "{}",
        table.stdout
    );
    for (line, (node, pod)) in lines[1..].iter().zip(&agents) {
        ensure!(
            line.starts_with(node.as_str()) && line.contains(pod.as_str()),
            "{line}"
        );
        ensure!(line.contains("dry-run") && line.contains(" yes "), "{line}");
    }
    // -l: the nodes a label selector picks.
    let (_, one) = status_json(&plugin, &["-l", "kubernetes.io/hostname=node-agent-1"])?;
    ensure!(
        one.len() == 1 && one[0]["node"] == "node-agent-1",
        "{one:?}"
    );

    // An agent pod that serves nothing (a stand-in with the agents' label in their
    // namespace, no DaemonSet's): its row says it cannot be read, and status exits 1.
    let mut stand_in = WorkloadPod::new("node-agent-stand-in", Qos::BestEffort, "16Mi", &["sleep"]);
    stand_in.node = Some("node-agent-1".into());
    stand_in.labels = vec![("app.kubernetes.io/name".into(), "node-agent".into())];
    let _stand_in = Applied::new(&rc.kubectl, &stand_in.manifest(AGENT_NS))?;
    wait_running(
        &rc.kubectl,
        AGENT_NS,
        &["node-agent-stand-in"],
        Duration::from_secs(90),
    )?;
    let (ok, rows) = status_json(&plugin, &[])?;
    ensure!(!ok, "status exits 1 when an agent cannot be read");
    let row = rows
        .iter()
        .find(|r| r["pod"] == "node-agent-stand-in")
        .context("the stand-in's row")?;
    let error = row["error"].as_str().unwrap_or("");
    ensure!(error.contains("nothing listens on 127.0.0.1:9465"), "{row}");
    let table = plugin.run(&["status"], CALL)?;
    ensure!(!table.success, "the table too exits 1");
    ensure!(
        table
            .stdout
            .contains("node-agent-1: the agent could not be read: nothing listens"),
        "{}",
        table.stdout
    );
    Ok(())
}

/// The merged stream of a running trace, line by line, as JSON.
struct Stream {
    lines: Receiver<String>,
    seen: Vec<Value>,
}

impl Stream {
    /// Reads until a line satisfies `want` (bounded); returns it.
    fn until(
        &mut self,
        what: &str,
        limit: Duration,
        want: impl Fn(&Value) -> bool,
    ) -> anyhow::Result<Value> {
        if let Some(v) = self.seen.iter().find(|v| want(v)) {
            return Ok(v.clone());
        }
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match self.lines.recv_timeout(left) {
                Ok(line) => line,
                Err(_) => bail!(
                    "{what}: not in the trace within {limit:?}; it printed:\n{}",
                    self.seen
                        .iter()
                        .map(Value::to_string)
                        .collect::<Vec<_>>()
                        .join("\n")
                ),
            };
            let value: Value =
                serde_json::from_str(&line).with_context(|| format!("not JSON: {line}"))?;
            self.seen.push(value.clone());
            if want(&value) {
                return Ok(value);
            }
        }
    }
}

fn kind(v: &Value) -> &str {
    v["kind"].as_str().unwrap_or("")
}

#[test]
fn trace_merges_both_nodes_across_a_real_oom_kill_and_eviction_and_explain_says_why(
) -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let plugin = Plugin::new(&rc);
    let ns = rc.namespace("plugin");
    let agents = agent_pods(&rc)?;

    let (trace, lines) = plugin.start(&["trace", "-o", "json", "--timeout", "480s"])?;
    let mut stream = Stream {
        lines,
        seen: Vec::new(),
    };
    for (node, pod) in &agents {
        stream.until(&format!("{pod} joined"), Duration::from_secs(60), |v| {
            kind(v) == "agent_joined" && v["node"] == node.as_str() && v["pod"] == pod.as_str()
        })?;
    }

    // A real OOM kill on node-agent-0: 200 MiB into a 64 MiB limit, 10 MiB/s (the kill comes
    // after the agent's pod source has listed the pod; a kill before that is told by UID).
    let mut oom = WorkloadPod::new("oom", Qos::Burstable, "32Mi", &["memory", "200", "10"]);
    oom.node = Some("node-agent-0".into());
    oom.memory_limit = Some("64Mi".into());
    rc.kubectl.apply(&oom.manifest(&ns.name))?;
    let uid = rc
        .kubectl
        .wait_for("the oom pod's UID", Duration::from_secs(30), |k| {
            let pod = k.get_json(&["-n", &ns.name, "pod", "oom"])?;
            Ok(pod["metadata"]["uid"].as_str().map(String::from))
        })?;
    let kill = stream.until(
        "the OOM kill on node-agent-0",
        Duration::from_secs(120),
        |v| {
            kind(v) == "oom_kill"
                && v["node"] == "node-agent-0"
                && v["cgroup"]["pod"]["uid"] == uid.as_str()
        },
    )?;
    assert_eq!(kill["constraint"], "cgroup_limit", "{kill}");

    // A real eviction decision on node-agent-1. Two pods there: `kept` uses more memory above
    // its request, so it ranks first, but the config excludes it by label; `chosen` is next.
    // The threshold (memory.available below 99% of the node's memory) is met as soon as the
    // agents reload the edited config; the base install is dry run, so the eviction is decided
    // and published but not sent.
    let mut kept = WorkloadPod::new("kept", Qos::BestEffort, "0", &["memory", "160"]);
    kept.node = Some("node-agent-1".into());
    kept.labels = vec![("node-agent.io/test-keep".into(), "true".into())];
    let mut chosen = WorkloadPod::new("chosen", Qos::Burstable, "16Mi", &["memory", "80"]);
    chosen.node = Some("node-agent-1".into());
    rc.kubectl.apply(&kept.manifest(&ns.name))?;
    rc.kubectl.apply(&chosen.manifest(&ns.name))?;
    wait_running(
        &rc.kubectl,
        &ns.name,
        &["kept", "chosen"],
        Duration::from_secs(120),
    )?;
    // Their memory held before the threshold is met, so the ranking sees it.
    std::thread::sleep(Duration::from_secs(8));
    let _config = AgentConfig::edit(&rc, |text| {
        let text = text.replacen(
            "memory.available: \"200Mi\"",
            "memory.available: \"99%\"",
            1,
        );
        text.replacen(
            "    labelSelector:\n      matchLabels: {}",
            "    labelSelector:\n      matchLabels: {node-agent.io/test-keep: \"true\"}",
            1,
        )
    })?;
    let decided = stream.until(
        "the dry-run eviction of `chosen` on node-agent-1",
        Duration::from_secs(300),
        |v| {
            kind(v) == "eviction"
                && v["node"] == "node-agent-1"
                && v["name"] == "chosen"
                && v["namespace"] == ns.name.as_str()
        },
    )?;
    assert_eq!(
        (decided["result"].as_str(), decided["signal"].as_str()),
        (Some("dry_run"), Some("memory.available")),
        "{decided}"
    );

    // The status says so too: the threshold met and the last eviction, on node-agent-1.
    let (_, rows) = status_json(&plugin, &["--node", "node-agent-1"])?;
    let status = &rows[0]["status"];
    ensure!(
        status["thresholds_met"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|t| t["signal"] == "memory.available"),
        "{status}"
    );
    ensure!(status["last_eviction"]["kind"] == "eviction", "{status}");

    // An agent that leaves mid-stream is said to, and its replacement joins; the trace goes on.
    let (_, old) = agents[1].clone();
    rc.kubectl
        .run(&["-n", AGENT_NS, "delete", "pod", &old, "--wait=false"])?;
    stream.until(&format!("{old} left"), Duration::from_secs(90), |v| {
        kind(v) == "agent_left" && v["pod"] == old.as_str() && v["node"] == "node-agent-1"
    })?;
    let joined = stream.until(
        "a new agent on node-agent-1 joined",
        Duration::from_secs(180),
        |v| kind(v) == "agent_joined" && v["node"] == "node-agent-1" && v["pod"] != old.as_str(),
    )?;

    // One stream for both nodes, each line naming its node, the records in time order.
    let nodes: BTreeSet<&str> = stream
        .seen
        .iter()
        .filter_map(|v| v["node"].as_str())
        .collect();
    assert_eq!(
        nodes,
        NODES.into_iter().collect(),
        "both nodes in one stream"
    );
    let times: Vec<jiff::Timestamp> = stream
        .seen
        .iter()
        .filter(|v| !kind(v).starts_with("agent_"))
        .map(|v| v["time"].as_str().unwrap_or("").parse())
        .collect::<Result<_, _>>()?;
    let unordered = times.windows(2).filter(|w| w[0] > w[1]).count();
    assert_eq!(unordered, 0, "records out of time order: {times:?}");
    drop(trace);

    // explain: the pod chosen, the pod passed over and why, the pod OOM-killed.
    let explain = |pod: &str| -> anyhow::Result<String> {
        let ran = plugin.run(&["explain", pod, "-n", &ns.name], CALL)?;
        ensure!(ran.success, "explain {pod}: {}", ran.stderr);
        Ok(ran.stdout)
    };
    let text = explain("chosen")?;
    ensure!(
        text.starts_with(&format!("Pod {}/chosen on node node-agent-1", ns.name)),
        "{text}"
    );
    ensure!(
        text.contains("chosen for eviction: memory.available hard threshold met"),
        "{text}"
    );
    ensure!(
        text.contains(&format!(
            "eviction {}/chosen: dry_run: memory.available",
            ns.name
        )),
        "{text}"
    );
    let text = explain("kept")?;
    ensure!(
        text.contains(
            "passed over for memory.available: it matches kubernetes.exclusions.labelSelector"
        ),
        "{text}"
    );
    ensure!(
        text.contains("The agent chose other pods instead"),
        "{text}"
    );
    ensure!(text.contains(&format!("{}/chosen: ", ns.name)), "{text}");
    // The kill was seen by node-agent-0's agent (the new node-agent-1 agent knows nothing of
    // it, and explain asks the agent of the pod's own node).
    let text = explain("oom")?;
    ensure!(text.contains("on node node-agent-0"), "{text}");
    ensure!(
        text.contains(&format!("oom_kill {}/oom", ns.name)) && text.contains("cgroup limit"),
        "{text}"
    );
    let missing = plugin.run(&["explain", "nope", "-n", &ns.name], CALL)?;
    ensure!(
        !missing.success
            && missing
                .stderr
                .contains(&format!("pod {}/nope not found", ns.name)),
        "{}",
        missing.stderr
    );
    ensure!(
        joined["detail"]
            .as_str()
            .is_some_and(|d| d.contains("node-agent")),
        "{joined}"
    );
    Ok(())
}

/// A kubeconfig for the service account `sa` of `namespace`, with a token from the API.
fn service_account_kubeconfig(
    rc: &RealCluster,
    namespace: &str,
    sa: &str,
    dir: &std::path::Path,
) -> anyhow::Result<std::path::PathBuf> {
    rc.kubectl
        .run(&["-n", namespace, "create", "serviceaccount", sa])?;
    let token = rc
        .kubectl
        .run(&["-n", namespace, "create", "token", sa, "--duration=1h"])?
        .trim()
        .to_string();
    let admin = rc.kubectl.run(&["config", "view", "--raw", "-o", "json"])?;
    let admin: Value = serde_json::from_str(&admin)?;
    let cluster = &admin["clusters"][0]["cluster"];
    let server = cluster["server"]
        .as_str()
        .context("the admin kubeconfig's server")?;
    let ca = cluster["certificate-authority-data"]
        .as_str()
        .context("the admin kubeconfig's CA")?;
    let path = dir.join(format!("{sa}.kubeconfig"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: {server}, certificate-authority-data: {ca}}}}}]\nusers: [{{name: {sa}, user: {{token: {token}}}}}]\ncontexts: [{{name: {sa}, context: {{cluster: c, user: {sa}}}}}]\ncurrent-context: {sa}\n"
        ),
    )?;
    Ok(path)
}

fn role_binding(name: &str, role_kind: &str, role: &str, namespace: &str, sa: &str) -> String {
    format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: {name}, namespace: {AGENT_NS}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: {role_kind}, name: {role}}}\nsubjects: [{{kind: ServiceAccount, name: {sa}, namespace: {namespace}}}]\n"
    )
}

#[test]
fn a_user_without_portforward_is_refused_naming_it_and_the_shipped_roles_suffice(
) -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let ns = rc.namespace("plugin-rbac");
    let dir = std::env::temp_dir().join(&ns.name);
    std::fs::create_dir_all(&dir)?;
    let kubeconfig = service_account_kubeconfig(&rc, &ns.name, "viewer", &dir)?;
    let plugin = Plugin::new(&rc).as_user(&kubeconfig);
    let expect_refusal = |args: &[&str], words: &str| -> anyhow::Result<()> {
        let ran = plugin.run(args, CALL)?;
        ensure!(!ran.success, "{args:?} is refused: {}", ran.stdout);
        ensure!(ran.stderr.contains(words), "{args:?}: {}", ran.stderr);
        Ok(())
    };

    // Nothing granted: listing the agents is refused, naming it.
    expect_refusal(&["status"], "error: forbidden: you need list on pods in namespace node-agent (deploy/operator-rbac.yaml)")?;

    // Pods readable in the agent's namespace, but no pods/portforward.
    let reader = format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: {0}-reader, namespace: {AGENT_NS}}}\nrules: [{{apiGroups: [\"\"], resources: [pods], verbs: [get, list, watch]}}]\n---\n{1}",
        ns.name,
        role_binding(&format!("{}-reader", ns.name), "Role", &format!("{}-reader", ns.name), &ns.name, "viewer"),
    );
    let reader = Applied::new(&rc.kubectl, &reader)?;
    let refused = "error: forbidden: you need get and create on pods/portforward in namespace node-agent (deploy/operator-rbac.yaml)";
    expect_refusal(&["status"], refused)?;
    expect_refusal(&["trace", "--timeout", "30s"], refused)?;
    drop(reader);

    // Exactly deploy/operator-rbac.yaml's roles, bound to this user: status reads every agent,
    // and -l needs the nodes role, refused naming it until that is bound too.
    let shipped = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/operator-rbac.yaml"
    ))?;
    let _roles = Applied::new(&rc.kubectl, &shipped)?;
    let _operator = Applied::new(
        &rc.kubectl,
        &role_binding(
            &format!("{}-operator", ns.name),
            "ClusterRole",
            "node-agent-operator",
            &ns.name,
            "viewer",
        ),
    )?;
    let granted = rc.kubectl.wait_for(
        "the operator role in force",
        Duration::from_secs(30),
        |_| {
            let ran = plugin.run(&["status"], CALL)?;
            Ok(ran.success.then_some(ran))
        },
    )?;
    ensure!(granted.stdout.lines().count() == 3, "{}", granted.stdout);
    expect_refusal(
        &["status", "-l", "kubernetes.io/os=linux"],
        "error: forbidden: you need list on nodes (cluster-wide) (deploy/operator-rbac.yaml)",
    )?;
    let _nodes = Applied::new(
        &rc.kubectl,
        &format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{name: {0}-nodes}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: node-agent-operator-nodes}}\nsubjects: [{{kind: ServiceAccount, name: viewer, namespace: {0}}}]\n",
            ns.name
        ),
    )?;
    rc.kubectl
        .wait_for("-l with the nodes role", Duration::from_secs(30), |_| {
            let ran = plugin.run(&["status", "-l", "kubernetes.io/os=linux"], CALL)?;
            Ok(ran.success.then_some(()))
        })?;
    // The refusals and grants the plugin met are the API server's own: its audit log has the
    // forward refused for this user, and then allowed.
    let user = format!("system:serviceaccount:{}:viewer", ns.name);
    let forwards: Vec<i64> = rc
        .audit_events()?
        .iter()
        .filter(|e| {
            e["user"]["username"] == user.as_str()
                && e["objectRef"]["subresource"] == "portforward"
                && e["stage"] == "ResponseComplete"
        })
        .filter_map(|e| e["responseStatus"]["code"].as_i64())
        .collect();
    ensure!(
        forwards.contains(&403) && forwards.contains(&101),
        "{forwards:?}"
    );
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}
