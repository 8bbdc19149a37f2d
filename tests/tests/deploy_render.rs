//! deploy/ as an operator renders it: `kubectl kustomize` (Debian's kubectl, or whichever is
//! on PATH), then PyPI's `kubernetes-validate --strict` against the OpenAPI schemas of the
//! oldest supported Kubernetes (1.30, the first with ValidatingAdmissionPolicy v1 and
//! node-bound service account tokens) and of 1.33. The monitoring component's alert rules go
//! through Prometheus' `promtool check rules` and `promtool test rules`. `cargo xtask test`
//! installs the tools and names them in KUBECTL, KUBERNETES_VALIDATE and PROMTOOL.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use serde::Deserialize as _;
use serde_json::Value;

/// kubectl and the validator each get this long per run.
const BOUND: Duration = Duration::from_secs(120);

fn tool(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} names the tool this test runs (set by `cargo xtask test`; `cargo xtask setup` installs it)")
    })
}

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// Runs `cmd` to completion within [`BOUND`], killing it past that.
fn run_bounded(cmd: &mut Command) -> Output {
    let shown = format!("{cmd:?}");
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{shown}: {e}"));
    let deadline = Instant::now() + BOUND;
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{shown} still running after {BOUND:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

/// `kubectl kustomize <dir>` as JSON documents.
fn render(dir: &Path) -> (String, Vec<Value>) {
    let out = run_bounded(Command::new(tool("KUBECTL")).arg("kustomize").arg(dir));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let docs = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).expect("rendered YAML"))
        .filter(|v| !v.is_null())
        .collect();
    (text, docs)
}

fn validate(name: &str, rendered: &str) {
    let dir = std::env::temp_dir().join(format!("node-agent-render-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join(format!("{name}.yaml"));
    std::fs::write(&file, rendered).expect("write rendered");
    for version in ["1.30.0", "1.33.0"] {
        let out = run_bounded(
            Command::new(tool("KUBERNETES_VALIDATE"))
                .args(["--strict", "--quiet", "-k", version])
                .arg(&file),
        );
        assert!(
            out.status.success(),
            "{name} against Kubernetes {version}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn kinds(docs: &[Value]) -> Vec<String> {
    docs.iter()
        .map(|d| {
            format!(
                "{}/{}",
                d["kind"].as_str().unwrap_or("?"),
                d["metadata"]["name"].as_str().unwrap_or("?")
            )
        })
        .collect()
}

#[test]
fn the_default_install_renders_validates_and_carries_the_node_bound_policy() {
    let (text, docs) = render(&deploy_dir());
    validate("deploy", &text);
    let kinds = kinds(&docs);
    for expected in [
        "Namespace/node-agent",
        "ServiceAccount/node-agent",
        "ClusterRole/node-agent",
        "ClusterRoleBinding/node-agent",
        "ConfigMap/node-agent-config",
        "ValidatingAdmissionPolicy/node-agent-own-node",
        "ValidatingAdmissionPolicyBinding/node-agent-own-node",
        "DaemonSet/node-agent",
    ] {
        assert!(
            kinds.iter().any(|k| k == expected),
            "{expected} in {kinds:?}"
        );
    }

    // Rendering changes nothing in the policy: the expressions node-agent-kube's
    // admission_policy test evaluates are the ones installed, and no namespace was added.
    let source =
        std::fs::read_to_string(deploy_dir().join("admission-policy.yaml")).expect("source");
    let source: Vec<Value> = serde_yaml_ng::Deserializer::from_str(&source)
        .map(|doc| Value::deserialize(doc).expect("source YAML"))
        .collect();
    for kind in [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        let rendered = docs.iter().find(|d| d["kind"] == kind).expect("rendered");
        let original = source.iter().find(|d| d["kind"] == kind).expect("source");
        assert_eq!(rendered["spec"], original["spec"], "{kind} spec");
        assert!(
            rendered["metadata"].get("namespace").is_none(),
            "{kind} is cluster-scoped"
        );
    }

    // The DaemonSet: Linux nodes only, and the image kustomize's `images:` sets.
    let ds = docs
        .iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("daemonset");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["nodeSelector"]["kubernetes.io/os"], "linux");
    assert_eq!(pod["containers"][0]["image"], "localhost/node-agent:0.1.0");

    // No pods delete and no pods/status patch by default.
    let role = docs
        .iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "node-agent")
        .expect("role");
    for rule in role["rules"].as_array().expect("rules") {
        let resources: Vec<&str> = rule["resources"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let verbs: Vec<&str> = rule["verbs"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let deletes_pods = resources.contains(&"pods") && verbs.contains(&"delete");
        let patches_status = resources.contains(&"pods/status") && verbs.contains(&"patch");
        assert!(
            !deletes_pods && !patches_status,
            "the default role grants {verbs:?} on {resources:?}"
        );
    }
}

#[test]
fn the_override_add_on_renders_and_validates_with_its_two_grants() {
    let (text, docs) = render(&deploy_dir().join("override"));
    validate("override", &text);
    assert_eq!(
        kinds(&docs),
        [
            "ClusterRole/node-agent-override",
            "ClusterRoleBinding/node-agent-override"
        ]
    );
    let rules = docs[0]["rules"].as_array().expect("rules");
    let grants: Vec<(String, String)> = rules
        .iter()
        .flat_map(|r| {
            let verbs: Vec<String> = r["verbs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect();
            r["resources"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(move |res| {
                    verbs
                        .clone()
                        .into_iter()
                        .map(move |v| (res.as_str().unwrap().to_string(), v))
                })
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        grants,
        [
            ("pods".to_string(), "delete".to_string()),
            ("pods/status".to_string(), "patch".to_string())
        ]
    );
}

/// `to` as a path relative to `from` (kustomize refuses absolute paths).
fn relative(from: &Path, to: &Path) -> PathBuf {
    let from = from.canonicalize().expect("from");
    let to = to.canonicalize().expect("to");
    let common = from
        .components()
        .zip(to.components())
        .take_while(|(a, b)| a == b)
        .count();
    let mut path = PathBuf::new();
    for _ in from.components().skip(common) {
        path.push("..");
    }
    for part in to.components().skip(common) {
        path.push(part);
    }
    path
}

/// Runs promtool (PROMTOOL) with `args`; panics with what it said unless it succeeds.
fn promtool(args: &[&str], dir: &Path) -> String {
    let out = run_bounded(Command::new(tool("PROMTOOL")).args(args).current_dir(dir));
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}: {said}");
    said
}

/// Fires each alert from series named as the agent names them, and checks its labels and
/// annotations; an alert that should not fire yet (its `for:`) or for a healthy series is
/// checked too.
const ALERT_TESTS: &str = r#"
rule_files: [rules.yaml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'up{job="node-agent",instance="a:9464",node="n1"}'
        values: '1 0x10'
      - series: 'up{job="node-agent",instance="b:9464",node="n2"}'
        values: '1x10'
      - series: 'node_agent_ringbuf_lost_events_total{job="node-agent",instance="a:9464",node="n1"}'
        values: '0 0 6 6 6 6'
      - series: 'node_agent_evictions_total{job="node-agent",instance="a:9464",node="n1",eviction_signal="memory.available",result="failed"}'
        values: '0 0 1 1 1 1'
      - series: 'node_agent_evictions_total{job="node-agent",instance="a:9464",node="n1",eviction_signal="memory.available",result="evicted"}'
        values: '0 1 2 3 4 5'
      - series: 'node_agent_stale_data_total{job="node-agent",instance="a:9464",node="n1",source="pods"}'
        values: '0 0 2 2 2 2'
      - series: 'node_agent_signal_unknown{job="node-agent",instance="a:9464",node="n1",eviction_signal="nodefs.available"}'
        values: '0 1x10'
      - series: 'node_agent_signal_unknown{job="node-agent",instance="a:9464",node="n1",eviction_signal="pid.available"}'
        values: '0x10'
      - series: 'node_agent_kube_source_ready{job="node-agent",instance="a:9464",node="n1",source="pods"}'
        values: '1 0x10'
      - series: 'node_agent_kube_source_ready{job="node-agent",instance="a:9464",node="n1",source="cluster"}'
        values: '1x10'
    alert_rule_test:
      - eval_time: 4m
        alertname: NodeAgentDown
        exp_alerts: []
      - eval_time: 7m
        alertname: NodeAgentDown
        exp_alerts:
          - exp_labels: {severity: warning, job: node-agent, instance: "a:9464", node: n1}
            exp_annotations:
              summary: node-agent on n1 is not scraped
              description: Prometheus has not scraped node-agent at a:9464 for 5 minutes; that node has no fast pressure eviction.
      - eval_time: 5m
        alertname: NodeAgentRingBufferLosses
        exp_alerts:
          - exp_labels: {severity: warning, job: node-agent, instance: "a:9464", node: n1}
            exp_annotations:
              summary: node-agent on n1 lost kernel events
              description: 6 kernel events were dropped in 10 minutes because the ring buffer was full (agent.ring_bytes).
      - eval_time: 5m
        alertname: NodeAgentEvictionsFailing
        exp_alerts:
          - exp_labels: {severity: warning, job: node-agent, instance: "a:9464", node: n1, eviction_signal: memory.available, result: failed}
            exp_annotations:
              summary: node-agent on n1 cannot evict (failed)
              description: Evictions for memory.available ended failed in the last 15 minutes; see the agent's log and node_agent_kube_errors_total.
      - eval_time: 5m
        alertname: NodeAgentStalePodData
        exp_alerts:
          - exp_labels: {severity: warning, job: node-agent, instance: "a:9464", node: n1, source: pods}
            exp_annotations:
              summary: node-agent on n1 held evictions back on stale pods data
              description: A threshold was met but the pods data was stale, so no pod was evicted; see node_agent_kube_request_failures_total.
      - eval_time: 4m
        alertname: NodeAgentSignalUnknown
        exp_alerts: []
      - eval_time: 7m
        alertname: NodeAgentSignalUnknown
        exp_alerts:
          - exp_labels: {severity: warning, job: node-agent, instance: "a:9464", node: n1, eviction_signal: nodefs.available}
            exp_annotations:
              summary: node-agent on n1 cannot read nodefs.available
              description: The source of nodefs.available has been unreadable for 5 minutes; that signal triggers no eviction.
      - eval_time: 2m
        alertname: NodeAgentBlind
        exp_alerts: []
      - eval_time: 4m
        alertname: NodeAgentBlind
        exp_alerts:
          - exp_labels: {severity: critical, job: node-agent, instance: "a:9464", node: n1, source: pods}
            exp_annotations:
              summary: node-agent on n1 cannot read its pods source
              description: The pods source has not delivered for 2 minutes, so the agent cannot evict on that node; its /readyz and log say why (a kubelet certificate the agent cannot verify, RBAC, an unreachable API server).
"#;

#[test]
fn the_monitoring_component_renders_and_its_alerts_check_and_fire() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("monitoring-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let _cleanup = RemoveOnDrop(dir.clone());
    let deploy = relative(&dir, &deploy_dir());
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\ncomponents:\n  - {}\n",
            deploy.display(),
            deploy.join("components/monitoring").display()
        ),
    )
    .expect("kustomization");
    let (_, docs) = render(&dir);
    // The built-in kinds against the schemas (the Operator's kinds are not in them).
    let builtin: String = docs
        .iter()
        .filter(|d| d["apiVersion"] != "monitoring.coreos.com/v1")
        .map(|d| format!("---\n{}", serde_yaml_ng::to_string(d).expect("YAML")))
        .collect();
    validate("monitoring", &builtin);
    let kinds = kinds(&docs);
    for expected in [
        "DaemonSet/node-agent",
        "Service/node-agent",
        "ServiceMonitor/node-agent",
        "PrometheusRule/node-agent",
    ] {
        assert!(
            kinds.iter().any(|k| k == expected),
            "{expected} in {kinds:?}"
        );
    }
    // The Service reaches the DaemonSet's pods on the port the ServiceMonitor scrapes.
    let find = |kind: &str| docs.iter().find(|d| d["kind"] == kind).expect(kind);
    let (daemonset, service, monitor) =
        (find("DaemonSet"), find("Service"), find("ServiceMonitor"));
    assert_eq!(
        service["spec"]["selector"],
        daemonset["spec"]["template"]["metadata"]["labels"]
    );
    let container_port = &daemonset["spec"]["template"]["spec"]["containers"][0]["ports"][0];
    assert_eq!(
        service["spec"]["ports"][0]["targetPort"],
        container_port["name"]
    );
    assert_eq!(
        monitor["spec"]["endpoints"][0]["port"],
        service["spec"]["ports"][0]["name"]
    );
    assert_eq!(
        monitor["spec"]["selector"]["matchLabels"],
        service["metadata"]["labels"]
    );

    // The rules as Prometheus loads them: spec.groups in a rules file.
    let rule = find("PrometheusRule");
    let rules = serde_json::json!({ "groups": rule["spec"]["groups"] });
    std::fs::write(
        dir.join("rules.yaml"),
        serde_yaml_ng::to_string(&rules).expect("rules YAML"),
    )
    .expect("rules file");
    let said = promtool(&["check", "rules", "rules.yaml"], &dir);
    assert!(said.contains("SUCCESS: 6 rules found"), "{said}");
    std::fs::write(dir.join("tests.yaml"), ALERT_TESTS).expect("tests file");
    promtool(&["test", "rules", "tests.yaml"], &dir);
}

/// Removes its directory when dropped, so a failed assertion leaves nothing behind.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
