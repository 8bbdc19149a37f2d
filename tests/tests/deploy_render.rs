//! deploy/ as an operator renders it: `kubectl kustomize` (Debian's kubectl, or whichever is
//! on PATH), then PyPI's `kubernetes-validate --strict` against the OpenAPI schemas of the
//! oldest supported Kubernetes (1.30, the first with ValidatingAdmissionPolicy v1 and
//! node-bound service account tokens) and of 1.33 — the base and every component, each enabled
//! as the operator would (one line in a copy of deploy/kustomization.yaml). The generated
//! ConfigMap is checked with the agent's own `node-agent check-config`. The monitoring
//! component's alert rules go through Prometheus' `promtool check rules` and `promtool test
//! rules`. `cargo xtask test` installs the tools and names them in KUBECTL,
//! KUBERNETES_VALIDATE, PROMTOOL and NODE_AGENT_BIN.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::Duration,
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
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{shown}: {e}"));
    node_agent_tests::output_within(child, BOUND, &shown).unwrap_or_else(|e| panic!("{e}"))
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

    // The DaemonSet: Linux nodes only, the image kustomize's `images:` sets, observing only.
    let ds = docs
        .iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("daemonset");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["nodeSelector"]["kubernetes.io/os"], "linux");
    assert_eq!(pod["containers"][0]["image"], "localhost/node-agent:0.1.0");
    assert_eq!(
        pod["containers"][0]["args"],
        serde_json::json!(["--dry-run"])
    );

    // The ConfigMap: generated from config.yaml under a name hashed from it, which the
    // DaemonSet mounts; the agent itself takes what it holds.
    let cm = config_map(&docs);
    let name = cm["metadata"]["name"].as_str().unwrap();
    assert!(
        name.starts_with("node-agent-config-") && name.len() > "node-agent-config-".len(),
        "{name}"
    );
    assert_eq!(cm["metadata"]["namespace"], "node-agent");
    assert_eq!(mounted_config(ds), name);
    let config = cm["data"]["config.yaml"]
        .as_str()
        .expect("data.config.yaml");
    assert_eq!(
        config,
        std::fs::read_to_string(deploy_dir().join("config.yaml")).expect("config.yaml")
    );
    let report = check_config(config);
    assert!(report.contains("is valid."), "{report}");

    // No pods delete by default (pdbPolicy: override's, in deploy/override/); pods/status
    // patch, the record of a kill on the node, bound to the node by the admission policy.
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
        assert!(
            !deletes_pods,
            "the default role grants {verbs:?} on {resources:?}"
        );
    }
    let patches_status = role["rules"].as_array().unwrap().iter().any(|r| {
        r["resources"] == serde_json::json!(["pods/status"])
            && r["verbs"] == serde_json::json!(["patch"])
    });
    assert!(
        patches_status,
        "the record of a kill on the node: pods/status patch"
    );
}

fn config_map(docs: &[Value]) -> &Value {
    let maps: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "ConfigMap").collect();
    assert_eq!(maps.len(), 1, "one ConfigMap");
    maps[0]
}

/// The name of the ConfigMap a DaemonSet mounts at /etc/node-agent.
fn mounted_config(ds: &Value) -> &str {
    ds["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find_map(|v| v["configMap"]["name"].as_str())
        .expect("a configMap volume")
}

/// `node-agent check-config` on a config's text (NODE_AGENT_BIN): its report; panics unless
/// it takes the file.
fn check_config(text: &str) -> String {
    let dir = tempfile_dir("check-config");
    let file = dir.0.join("config.yaml");
    std::fs::write(&file, text).expect("config file");
    let agent = std::env::var("NODE_AGENT_BIN")
        .expect("NODE_AGENT_BIN names the agent binary (set by `cargo xtask test`)");
    let out = run_bounded(Command::new(agent).arg("check-config").arg(&file));
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "check-config refused the shipped config: {report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    report
}

/// A directory of this test's, removed when dropped.
fn tempfile_dir(name: &str) -> RemoveOnDrop {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "{name}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    RemoveOnDrop(dir)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("copy dir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy file");
        }
    }
}

/// deploy/ copied, with `components` enabled in its kustomization.yaml as the operator enables
/// them (the commented `components:` list made real) and `config.yaml` replaced by `config` if
/// given; rendered and validated. The copy goes when the guard is dropped.
fn render_install(
    name: &str,
    components: &[&str],
    config: Option<&str>,
) -> (RemoveOnDrop, Vec<Value>) {
    render_with(name, &[], components, config)
}

/// [`render_install`] with `resources` (paths in deploy/, as its comments name them) added to
/// the kustomization's resources, as the operator uncomments one.
fn render_with(
    name: &str,
    resources: &[&str],
    components: &[&str],
    config: Option<&str>,
) -> (RemoveOnDrop, Vec<Value>) {
    let dir = tempfile_dir(name);
    let root = dir.0.join("deploy");
    copy_dir(&deploy_dir(), &root);
    if !resources.is_empty() {
        let k = std::fs::read_to_string(root.join("kustomization.yaml")).expect("kustomization");
        let listed: String = resources.iter().map(|r| format!("  - {r}\n")).collect();
        assert!(
            k.contains("resources:\n"),
            "deploy/kustomization.yaml lists resources"
        );
        std::fs::write(
            root.join("kustomization.yaml"),
            k.replacen("resources:\n", &format!("resources:\n{listed}"), 1),
        )
        .expect("kustomization");
    }
    if !components.is_empty() {
        let mut k =
            std::fs::read_to_string(root.join("kustomization.yaml")).expect("kustomization");
        k.push_str("components:\n");
        for c in components {
            k.push_str(&format!("  - components/{c}\n"));
        }
        std::fs::write(root.join("kustomization.yaml"), k).expect("kustomization");
    }
    if let Some(config) = config {
        std::fs::write(root.join("config.yaml"), config).expect("config.yaml");
    }
    let (text, docs) = render(&root);
    // The Operator's kinds are not in the schemas.
    let builtin: String = docs
        .iter()
        .filter(|d| d["apiVersion"] != "monitoring.coreos.com/v1")
        .map(|d| format!("---\n{}", serde_yaml_ng::to_string(d).expect("YAML")))
        .collect();
    validate(
        name,
        if builtin.len() < text.len() {
            &builtin
        } else {
            &text
        },
    );
    (dir, docs)
}

fn daemon_sets(docs: &[Value]) -> Vec<&Value> {
    docs.iter().filter(|d| d["kind"] == "DaemonSet").collect()
}

/// The node affinity term of a DaemonSet's pods, as (key, operator, values).
fn affinity(ds: &Value) -> Option<(String, String, Value)> {
    let term = &ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
        ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
        ["matchExpressions"][0];
    Some((
        term["key"].as_str()?.to_string(),
        term["operator"].as_str()?.to_string(),
        term["values"].clone(),
    ))
}

#[test]
fn a_config_change_is_a_new_configmap_that_rolls_the_daemonset() {
    let (_a, before) = render_install("config-before", &[], None);
    let changed = std::fs::read_to_string(deploy_dir().join("config.yaml"))
        .expect("config.yaml")
        .replace(
            "    memory.available: \"200Mi\"",
            "    memory.available: \"300Mi\"",
        );
    let (_b, after) = render_install("config-after", &[], Some(&changed));
    let (old, new) = (config_map(&before), config_map(&after));
    assert_ne!(
        old["metadata"]["name"], new["metadata"]["name"],
        "the name follows the content"
    );
    let (ds_old, ds_new) = (daemon_sets(&before)[0], daemon_sets(&after)[0]);
    assert_eq!(
        mounted_config(ds_new),
        new["metadata"]["name"].as_str().unwrap()
    );
    // The pod template changes by that name alone: the DaemonSet's rolling update (one node
    // at a time, each new agent ready 30 s after its start) carries the new config, and `rollout undo` takes it back.
    let mut template = ds_new["spec"]["template"].clone();
    let volume = template["spec"]["volumes"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|v| v.get("configMap").is_some())
        .unwrap();
    volume["configMap"]["name"] = old["metadata"]["name"].clone();
    assert_eq!(template, ds_old["spec"]["template"]);
    assert_eq!(
        ds_new["spec"]["updateStrategy"]["rollingUpdate"],
        serde_json::json!({"maxSurge": 1, "maxUnavailable": 0}),
        "the new pod first, the old one kept until it is ready"
    );
    assert_rollout_pace(ds_new);
}

/// Each new agent counts as ready 30 s after its start, by its readiness probe: not by
/// `minReadySeconds`, whose timer the DaemonSet controller can drop, stalling a surge with two
/// agents on a node (deploy/daemonset/daemonset.yaml says how).
fn assert_rollout_pace(ds: &Value) {
    let name = &ds["metadata"]["name"];
    assert!(
        ds["spec"]["minReadySeconds"].as_u64().unwrap_or(0) == 0,
        "{name}: no minReadySeconds"
    );
    let probe = &ds["spec"]["template"]["spec"]["containers"][0]["readinessProbe"];
    assert_eq!(probe["initialDelaySeconds"], 30, "{name}: {probe}");
    assert_eq!(probe["httpGet"]["path"], "/readyz", "{name}: {probe}");
}

#[test]
fn the_enforce_component_drops_dry_run_on_every_node() {
    let (_dir, docs) = render_install("enforce", &["enforce"], None);
    let sets = daemon_sets(&docs);
    assert_eq!(sets.len(), 1);
    let container = &sets[0]["spec"]["template"]["spec"]["containers"][0];
    assert!(container.get("args").is_none(), "{container}");
    assert_eq!(
        container["command"],
        serde_json::json!([
            "/usr/local/bin/node-agent",
            "run",
            "--config",
            "/etc/node-agent/config.yaml"
        ])
    );
}

#[test]
fn enforcing_by_node_label_splits_the_nodes_between_two_daemonsets() {
    let (_dir, docs) = render_install(
        "enforce-by-label",
        &["enforce-by-node-label", "privileged"],
        None,
    );
    let sets = daemon_sets(&docs);
    let names: Vec<&str> = sets
        .iter()
        .map(|d| d["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["node-agent", "node-agent-enforce"]);
    let (observe, enforce) = (sets[0], sets[1]);
    let label = serde_json::json!(["true"]);
    assert_eq!(
        affinity(observe),
        Some((
            "node-agent.io/enforce".into(),
            "NotIn".into(),
            label.clone()
        ))
    );
    assert_eq!(
        affinity(enforce),
        Some(("node-agent.io/enforce".into(), "In".into(), label))
    );
    let container = |d: &Value| d["spec"]["template"]["spec"]["containers"][0].clone();
    assert_eq!(container(observe)["args"], serde_json::json!(["--dry-run"]));
    assert!(container(enforce).get("args").is_none());
    // Apart from that, the same agent: image, privileges (the privileged component applies to
    // both when listed after), mounts, the one ConfigMap.
    for key in [
        "image",
        "securityContext",
        "volumeMounts",
        "resources",
        "command",
    ] {
        assert_eq!(container(observe)[key], container(enforce)[key], "{key}");
    }
    assert_eq!(container(enforce)["securityContext"]["privileged"], true);
    assert_eq!(container(enforce)["image"], "localhost/node-agent:0.1.0");
    assert_eq!(mounted_config(observe), mounted_config(enforce));
    assert_eq!(
        mounted_config(observe),
        config_map(&docs)["metadata"]["name"].as_str().unwrap()
    );
    // Selectors that never take each other's pods; both still the agent's for the Service and
    // `kubectl logs -l app.kubernetes.io/name=node-agent`.
    let selector = |d: &Value| d["spec"]["selector"]["matchLabels"].clone();
    assert_ne!(selector(observe), selector(enforce));
    for d in [observe, enforce] {
        let labels = &d["spec"]["template"]["metadata"]["labels"];
        assert_eq!(labels["app.kubernetes.io/name"], "node-agent");
        for (k, v) in selector(d).as_object().unwrap() {
            assert_eq!(&labels[k], v, "{k}");
        }
    }
    assert_rollout_pace(enforce);
}

#[test]
fn the_privileged_component_renders_and_validates() {
    let (_dir, docs) = render_install("privileged", &["privileged"], None);
    let sets = daemon_sets(&docs);
    assert_eq!(
        sets[0]["spec"]["template"]["spec"]["containers"][0]["securityContext"],
        serde_json::json!({"privileged": true, "readOnlyRootFilesystem": true})
    );
}

/// The runtime-specific part of a rendered DaemonSet: CONTAINER_RUNTIME_ENDPOINT, and the
/// runtime root's volume (path, type) and mount (path).
fn runtime_of(ds: &Value) -> (String, (String, String), String) {
    let pod = &ds["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let endpoint = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "CONTAINER_RUNTIME_ENDPOINT")
        .map(|e| e["value"].as_str().unwrap().to_string())
        .collect::<Vec<_>>();
    assert_eq!(
        endpoint.len(),
        1,
        "one CONTAINER_RUNTIME_ENDPOINT: {endpoint:?}"
    );
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "runtime-root")
        .expect("the runtime-root volume");
    let mounts: Vec<&Value> = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["name"] == "runtime-root")
        .collect();
    assert_eq!(
        mounts.len(),
        1,
        "one mount of the runtime's root: {mounts:?}"
    );
    assert_eq!(mounts[0]["readOnly"], true);
    assert_eq!(mounts[0]["mountPropagation"], "HostToContainer");
    (
        endpoint[0].clone(),
        (
            volume["hostPath"]["path"].as_str().unwrap().to_string(),
            volume["hostPath"]["type"].as_str().unwrap().to_string(),
        ),
        mounts[0]["mountPath"].as_str().unwrap().to_string(),
    )
}

#[test]
fn each_runtime_component_names_its_socket_and_mounts_its_root_where_it_is() {
    let (_base, docs) = render_install("runtime-containerd", &[], None);
    let sets = daemon_sets(&docs);
    let base = runtime_of(sets[0]);
    let base_mounts = sets[0]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
        .as_array()
        .map(Vec::len);
    assert_eq!(
        base,
        (
            "unix:///host/run/containerd/containerd.sock".to_string(),
            (
                "/var/lib/containerd".to_string(),
                "DirectoryOrCreate".to_string()
            ),
            "/var/lib/containerd".to_string()
        )
    );
    for (component, socket, root) in [
        (
            "runtime-k3s",
            "/run/k3s/containerd/containerd.sock",
            "/var/lib/rancher/k3s/agent/containerd",
        ),
        (
            "runtime-rke2",
            "/run/k3s/containerd/containerd.sock",
            "/var/lib/rancher/rke2/agent/containerd",
        ),
        (
            "runtime-crio",
            "/run/crio/crio.sock",
            "/var/lib/containers/storage",
        ),
    ] {
        // Listed after enforce-by-node-label, as kustomization.yaml says: both DaemonSets.
        let (_dir, docs) = render_install(component, &["enforce-by-node-label", component], None);
        let sets = daemon_sets(&docs);
        assert_eq!(sets.len(), 2, "{component}");
        for ds in sets {
            let (endpoint, (host, kind), mount) = runtime_of(ds);
            // The socket as the host has it, inside the DaemonSet's mount of the host's /run.
            assert_eq!(endpoint, format!("unix:///host{socket}"), "{component}");
            // The root at its own path: the runtime's ImageFsInfo names host paths below it.
            assert_eq!(
                (host.as_str(), kind.as_str()),
                (root, "DirectoryOrCreate"),
                "{component}"
            );
            assert_eq!(mount, root, "{component}");
            // Everything else is the base's.
            let pod = &ds["spec"]["template"]["spec"];
            let run = pod["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"] == "host-run")
                .unwrap();
            assert_eq!(
                run["hostPath"],
                serde_json::json!({"path": "/run", "type": "Directory"})
            );
            assert_eq!(
                pod["containers"][0]["volumeMounts"]
                    .as_array()
                    .map(Vec::len),
                base_mounts,
                "{component}: the same mounts, one of them moved"
            );
        }
    }
}

#[test]
fn the_override_add_on_renders_and_validates_with_its_grant() {
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
    assert_eq!(grants, [("pods".to_string(), "delete".to_string())]);
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
      - series: 'node_agent_config_reloads_total{job="node-agent",instance="a:9464",node="n1",result="ok"}'
        values: '0 1 1 2 2 2'
      - series: 'node_agent_config_reloads_total{job="node-agent",instance="a:9464",node="n1",result="invalid"}'
        values: '0 0 0 1 1 1'
      - series: 'node_agent_config_reloads_total{job="node-agent",instance="a:9464",node="n1",result="refused"}'
        values: '0x5'
      - series: 'node_agent_config_reloads_total{job="node-agent",instance="b:9464",node="n2",result="retrying"}'
        values: '0 1 2 2 2 2'
      - series: 'node_agent_config_reloads_total{job="node-agent",instance="b:9464",node="n2",result="ok"}'
        values: '0 1 2 3 4 5'
      - series: 'node_agent_no_evictable_pod{job="node-agent",instance="a:9464",node="n1",eviction_signal="memory.available"}'
        values: '0 1x10'
      - series: 'node_agent_no_evictable_pod{job="node-agent",instance="b:9464",node="n2",eviction_signal="memory.available"}'
        values: '0 1 0 1 0 1 0'
      - series: 'node_agent_kube_source_ready{job="node-agent",instance="a:9464",node="n1",source="pods"}'
        values: '1 0x10'
      - series: 'node_agent_kube_source_ready{job="node-agent",instance="a:9464",node="n1",source="cluster"}'
        values: '1x10'
      - series: 'node_agent_oom_kills_foreseen_total{job="node-agent",instance="a:9464",node="n1",reason="node"}'
        values: '0 0 3 3 3 3'
      - series: 'node_agent_oom_kills_foreseen_total{job="node-agent",instance="a:9464",node="n1",reason="cgroup_limit"}'
        values: '0x5'
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
              description: 6 kernel events were dropped in 10 minutes because the ring buffer was full (ringBufferSize).
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
        alertname: NodeAgentNoEvictablePod
        exp_alerts: []
      - eval_time: 4m
        alertname: NodeAgentNoEvictablePod
        exp_alerts:
          - exp_labels: {severity: warning, job: node-agent, instance: "a:9464", node: n1, eviction_signal: memory.available}
            exp_annotations:
              summary: node-agent on n1 has no pod it may evict for memory.available
              description: "memory.available has been past its threshold for 2 minutes with no pod the agent may evict (critical, excluded, terminating or held by a PodDisruptionBudget); the agent's log names the pods it passed over."
      - eval_time: 2m
        alertname: NodeAgentConfigReloadRefused
        exp_alerts: []
      - eval_time: 5m
        alertname: NodeAgentConfigReloadRefused
        exp_alerts:
          - exp_labels: {severity: warning, job: node-agent, instance: "a:9464", node: n1, result: invalid}
            exp_annotations:
              summary: node-agent on n1 refused a new config (invalid)
              description: "The agent keeps running on its previous config: a reload ended invalid in the last 15 minutes. Check the file with node-agent check-config and see the agent's log for the field named."
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
      - eval_time: 1m
        alertname: NodeAgentForeseenOOMKills
        exp_alerts: []
      - eval_time: 5m
        alertname: NodeAgentForeseenOOMKills
        exp_alerts:
          - exp_labels: {severity: warning, job: node-agent, instance: "a:9464", node: n1, reason: node}
            exp_annotations:
              summary: node-agent on n1 saw OOM kills coming (node)
              description: '3 OOM kills (node) in 15 minutes came after the agent had seen memory pressure. The NodeAgentOOMKill events on the pods say what it saw and did before each: lower the memory thresholds (evict earlier) or clear what blocked the evictions (PodDisruptionBudgets, pods that may not be evicted).'
"#;

#[test]
fn the_monitoring_component_renders_and_its_alerts_check_and_fire() {
    let (guard, docs) = render_install("monitoring", &["monitoring"], None);
    let dir = guard.0.clone();
    let kinds = kinds(&docs);
    for expected in [
        "DaemonSet/node-agent",
        "Service/node-agent",
        "ServiceMonitor/node-agent",
        "PrometheusRule/node-agent",
        "ConfigMap/node-agent-dashboard",
    ] {
        assert!(
            kinds.iter().any(|k| k == expected),
            "{expected} in {kinds:?}"
        );
    }
    // The dashboard, as Grafana's sidecar finds it: by its label, one JSON file.
    let dashboard = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "node-agent-dashboard")
        .unwrap();
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let json: Value = serde_json::from_str(
        dashboard["data"]["node-agent.json"]
            .as_str()
            .expect("data.node-agent.json"),
    )
    .expect("the dashboard is JSON");
    assert_eq!(json["uid"], "node-agent");
    assert_eq!(
        json["panels"].as_array().map(Vec::len),
        serde_json::from_str::<Value>(
            &std::fs::read_to_string(deploy_dir().join("components/monitoring/dashboard.json"))
                .unwrap()
        )
        .unwrap()["panels"]
            .as_array()
            .map(Vec::len)
    );
    // The Service reaches the DaemonSet's pods (by the label every agent DaemonSet's pods
    // carry) on the port the ServiceMonitor scrapes.
    let find = |kind: &str| docs.iter().find(|d| d["kind"] == kind).expect(kind);
    let (daemonset, service, monitor) =
        (find("DaemonSet"), find("Service"), find("ServiceMonitor"));
    let labels = &daemonset["spec"]["template"]["metadata"]["labels"];
    let selector = service["spec"]["selector"].as_object().expect("selector");
    assert_eq!(
        selector.keys().collect::<Vec<_>>(),
        ["app.kubernetes.io/name"]
    );
    for (k, v) in selector {
        assert_eq!(&labels[k], v, "{k}");
    }
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
    // metricsAccess: kubernetes: Prometheus sends its token, and a role may grant it /metrics.
    assert_eq!(
        monitor["spec"]["endpoints"][0]["bearerTokenFile"],
        "/var/run/secrets/kubernetes.io/serviceaccount/token"
    );
    let reader = docs
        .iter()
        .find(|d| {
            d["kind"] == "ClusterRole" && d["metadata"]["name"] == "node-agent-metrics-reader"
        })
        .expect("the metrics reader role");
    assert_eq!(
        reader["rules"],
        serde_json::json!([{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}])
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
    assert!(said.contains("SUCCESS: 9 rules found"), "{said}");
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

/// The NetworkPolicy component: only Prometheus (kube-prometheus's namespace and labels) may
/// reach the agents' port, the policy selects the pods of every agent DaemonSet, and leaves
/// their own calls out.
#[test]
fn the_networkpolicy_component_lets_only_prometheus_reach_the_port() {
    let (_guard, docs) = render_install(
        "networkpolicy",
        &["enforce-by-node-label", "networkpolicy"],
        None,
    );
    let policy = docs
        .iter()
        .find(|d| d["kind"] == "NetworkPolicy")
        .expect("a NetworkPolicy");
    assert_eq!(policy["metadata"]["namespace"], "node-agent");
    assert_eq!(
        policy["spec"]["policyTypes"],
        serde_json::json!(["Ingress"])
    );
    let selector = &policy["spec"]["podSelector"]["matchLabels"];
    let agents = daemon_sets(&docs);
    assert_eq!(agents.len(), 2);
    for ds in agents {
        let labels = &ds["spec"]["template"]["metadata"]["labels"];
        for (k, v) in selector.as_object().expect("matchLabels") {
            assert_eq!(
                &labels[k], v,
                "{k}: the policy selects {}",
                ds["metadata"]["name"]
            );
        }
        let port = &ds["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"];
        assert_eq!(&policy["spec"]["ingress"][0]["ports"][0]["port"], port);
    }
    let from = &policy["spec"]["ingress"][0]["from"][0];
    assert_eq!(
        from["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "monitoring"
    );
    assert_eq!(
        from["podSelector"]["matchLabels"]["app.kubernetes.io/name"],
        "prometheus"
    );
    assert_eq!(policy["spec"]["ingress"].as_array().map(Vec::len), Some(1));
}

/// `kubectl node-agent`'s grants (deploy/operator-rbac.yaml, applied on its own): valid, read
/// only, pods/portforward only in the agent's namespace, and nothing that reaches a shell.
#[test]
fn the_plugin_users_roles_validate_read_only_and_forward_only_to_the_agents() {
    let text = std::fs::read_to_string(deploy_dir().join("operator-rbac.yaml"))
        .expect("operator-rbac.yaml");
    validate("operator-rbac", &text);
    let docs: Vec<Value> = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).expect("YAML"))
        .filter(|v| !v.is_null())
        .collect();
    let mut granted = std::collections::BTreeSet::new();
    for role in docs.iter().filter(|d| d["kind"] == "ClusterRole") {
        for rule in role["rules"].as_array().expect("rules") {
            for resource in rule["resources"].as_array().expect("resources") {
                for verb in rule["verbs"].as_array().expect("verbs") {
                    granted.insert(format!(
                        "{} {} {}",
                        role["metadata"]["name"].as_str().unwrap(),
                        resource.as_str().unwrap(),
                        verb.as_str().unwrap()
                    ));
                }
            }
        }
    }
    let expected: std::collections::BTreeSet<String> = [
        "node-agent-operator pods get",
        "node-agent-operator pods list",
        "node-agent-operator pods watch",
        "node-agent-operator pods/portforward get",
        "node-agent-operator pods/portforward create",
        "node-agent-operator-nodes nodes list",
        "node-agent-operator-nodes nodes watch",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(granted, expected, "exactly what the plugin uses");
    // The role with pods/portforward is bound only in the agent's namespace.
    let bindings: Vec<(String, String, Option<String>)> = docs
        .iter()
        .filter(|d| d["kind"].as_str().is_some_and(|k| k.ends_with("Binding")))
        .map(|d| {
            (
                d["kind"].as_str().unwrap().to_string(),
                d["roleRef"]["name"].as_str().unwrap().to_string(),
                d["metadata"]["namespace"].as_str().map(String::from),
            )
        })
        .collect();
    assert_eq!(
        bindings,
        [
            (
                "RoleBinding".into(),
                "node-agent-operator".into(),
                Some("node-agent".into())
            ),
            (
                "ClusterRoleBinding".into(),
                "node-agent-operator-nodes".into(),
                None
            ),
        ]
    );
    // Not part of the base install: operators apply it themselves.
    let (_, base) = render(&deploy_dir());
    assert!(!kinds(&base)
        .iter()
        .any(|k| k.contains("node-agent-operator")));
}

// ---- The Helm chart (deploy/chart) against the kustomize install ----

fn chart_dir() -> PathBuf {
    deploy_dir().join("chart")
}

/// `helm` with `args` (HELM, built from its Go module by `cargo xtask test`): its output, or
/// its error text when it fails.
fn helm(args: &[&str]) -> Result<String, String> {
    let out = run_bounded(Command::new(tool("HELM")).args(args));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!("{stdout}{stderr}"))
    }
}

/// `helm template node-agent deploy/chart --namespace node-agent` with `values` (each
/// `--set`, `--set-file`, ... and its argument), as the text and its documents.
fn helm_template(values: &[&str]) -> (String, Vec<Value>) {
    let chart = chart_dir();
    let mut args = vec![
        "template",
        "node-agent",
        chart.to_str().expect("UTF-8 path"),
        "--namespace",
        "node-agent",
    ];
    args.extend_from_slice(values);
    let text = helm(&args).unwrap_or_else(|e| panic!("helm {args:?}: {e}"));
    let docs = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).expect("rendered YAML"))
        .filter(|v| !v.is_null())
        .collect();
    (text, docs)
}

/// The objects as the comparison sees them, by kind and name, with each difference between the
/// two installs that is meant taken out (and only those):
/// - the Namespace: kustomize's base creates it; the chart installs into the release's, made
///   and labelled beforehand (`helm install` stores the release there first);
/// - the ConfigMap's name: kustomize's carries a hash of its content, the chart's is fixed and
///   its content's hash is a pod template annotation (`node-agent.io/config-sha256`): either
///   way a changed config is a changed pod template;
/// - Helm's own labels (`app.kubernetes.io/managed-by`, `helm.sh/chart`);
/// - the order of env, volume mounts and volumes, which kustomize's patches change and the API
///   server does not read (no `$(VAR)` refers to another variable).
fn comparable(docs: &[Value]) -> std::collections::BTreeMap<String, Value> {
    let mut out = std::collections::BTreeMap::new();
    for doc in docs {
        if doc["kind"] == "Namespace" {
            continue;
        }
        let mut doc = doc.clone();
        if let Some(labels) = doc
            .pointer_mut("/metadata/labels")
            .and_then(Value::as_object_mut)
        {
            labels.remove("app.kubernetes.io/managed-by");
            labels.remove("helm.sh/chart");
        }
        let is_config = |name: &str| name.starts_with("node-agent-config");
        if doc["kind"] == "ConfigMap" && doc["metadata"]["name"].as_str().is_some_and(is_config) {
            doc["metadata"]["name"] = "node-agent-config".into();
        }
        if doc["kind"] == "DaemonSet" {
            let template = &mut doc["spec"]["template"];
            if let Some(annotations) = template
                .pointer_mut("/metadata/annotations")
                .and_then(Value::as_object_mut)
            {
                annotations.remove("node-agent.io/config-sha256");
                if annotations.is_empty() {
                    template["metadata"]
                        .as_object_mut()
                        .expect("metadata")
                        .remove("annotations");
                }
            }
            let spec = &mut template["spec"];
            for v in spec["volumes"].as_array_mut().into_iter().flatten() {
                if v["configMap"]["name"].as_str().is_some_and(is_config) {
                    v["configMap"]["name"] = "node-agent-config".into();
                }
            }
            let by = |list: &mut Value, key: &str| {
                if let Some(items) = list.as_array_mut() {
                    items.sort_by_key(|i| i[key].as_str().unwrap_or("").to_string());
                }
            };
            by(&mut spec["volumes"], "name");
            for c in spec["containers"].as_array_mut().into_iter().flatten() {
                by(&mut c["env"], "name");
                by(&mut c["volumeMounts"], "mountPath");
            }
        }
        let key = format!(
            "{}/{}",
            doc["kind"].as_str().unwrap_or("?"),
            doc["metadata"]["name"].as_str().unwrap_or("?")
        );
        assert!(out.insert(key.clone(), doc).is_none(), "{key} twice");
    }
    out
}

/// Fails naming each object that one install has and the other has not, or that differs
/// beyond what [`comparable`] takes out.
fn assert_same_objects(what: &str, kustomize: &[Value], chart: &[Value]) {
    let (k, c) = (comparable(kustomize), comparable(chart));
    let only = |a: &std::collections::BTreeMap<String, Value>,
                b: &std::collections::BTreeMap<String, Value>| {
        a.keys()
            .filter(|n| !b.contains_key(*n))
            .cloned()
            .collect::<Vec<_>>()
    };
    assert!(
        only(&k, &c).is_empty() && only(&c, &k).is_empty(),
        "{what}: only kustomize installs {:?}; only the chart installs {:?}",
        only(&k, &c),
        only(&c, &k)
    );
    for (name, object) in &k {
        let mut found = Vec::new();
        differences("", object, &c[name], &mut found);
        assert!(
            found.is_empty(),
            "{what}: {name} differs (kustomize | the chart):\n{}",
            found.join("\n")
        );
    }
}

/// Each place where `a` and `b` differ, as a JSON pointer with both values.
fn differences(at: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for key in x.keys().chain(y.keys().filter(|k| !x.contains_key(*k))) {
                let (l, r) = (
                    x.get(key).unwrap_or(&Value::Null),
                    y.get(key).unwrap_or(&Value::Null),
                );
                differences(&format!("{at}/{key}"), l, r, out);
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (l, r)) in x.iter().zip(y).enumerate() {
                differences(&format!("{at}/{i}"), l, r, out);
            }
        }
        _ if a != b => out.push(format!("  {at}: {a} | {b}")),
        _ => {}
    }
}

#[test]
fn the_chart_lints_and_with_its_defaults_installs_what_kustomize_installs() {
    let chart = chart_dir();
    let chart = chart.to_str().expect("UTF-8 path");
    let lint = helm(&["lint", "--strict", chart]).unwrap_or_else(|e| panic!("helm lint: {e}"));
    assert!(lint.contains("0 chart(s) failed"), "{lint}");

    let (text, chart_docs) = helm_template(&[]);
    validate("chart", &text);
    let (kustomize_text, kustomize_docs) = render(&deploy_dir());
    assert!(
        kustomize_text.contains("kind: Namespace"),
        "the base creates the namespace"
    );
    assert_same_objects("the defaults", &kustomize_docs, &chart_docs);
    // The agent takes the chart's config as it takes deploy/config.yaml.
    let shipped = std::fs::read_to_string(deploy_dir().join("config.yaml")).expect("config");
    assert_eq!(
        config_map(&chart_docs)["data"]["config.yaml"],
        shipped.as_str()
    );
    check_config(&shipped);
}

#[test]
fn each_chart_value_installs_what_its_kustomize_component_does() {
    // (the chart's values, the kustomize resources and components an operator enables)
    let cases: &[(&[&str], &[&str], &[&str])] = &[
        (&["--set", "enforce=true"], &[], &["enforce"]),
        (
            &["--set", "enforceByNodeLabel=true"],
            &[],
            &["enforce-by-node-label"],
        ),
        (&["--set", "runtime=k3s"], &[], &["runtime-k3s"]),
        (&["--set", "runtime=rke2"], &[], &["runtime-rke2"]),
        (&["--set", "runtime=crio"], &[], &["runtime-crio"]),
        (&["--set", "privileged=true"], &[], &["privileged"]),
        (
            &[
                "--set",
                "serviceMonitor.enabled=true,prometheusRule.enabled=true,grafanaDashboard.enabled=true",
            ],
            &[],
            &["monitoring"],
        ),
        (&["--set", "networkPolicy.enabled=true"], &[], &["networkpolicy"]),
        (
            &["--set", "rbac.kubeletProxy=true"],
            &["rbac-kubelet-proxy.yaml"],
            &[],
        ),
        (
            &["--set", "rbac.pdbOverride=true"],
            &["override/rbac-override.yaml"],
            &[],
        ),
        // Components together, in the order the kustomization asks for.
        (
            &[
                "--set",
                "enforceByNodeLabel=true,runtime=crio,privileged=true,networkPolicy.enabled=true",
            ],
            &[],
            &[
                "enforce-by-node-label",
                "runtime-crio",
                "privileged",
                "networkpolicy",
            ],
        ),
    ];
    for (i, (values, resources, components)) in cases.iter().enumerate() {
        let (_dir, kustomize) = render_with(&format!("chart-{i}"), resources, components, None);
        let (text, chart) = helm_template(values);
        let builtin: String = chart
            .iter()
            .filter(|d| d["apiVersion"] != "monitoring.coreos.com/v1")
            .map(|d| format!("---\n{}", serde_yaml_ng::to_string(d).expect("YAML")))
            .collect();
        validate(
            &format!("chart-{i}"),
            if builtin.is_empty() { &text } else { &builtin },
        );
        assert_same_objects(&format!("{values:?}"), &kustomize, &chart);
    }
}

#[test]
fn the_chart_refuses_a_wrong_value_naming_it() {
    for (set, needle) in [
        ("runtime=docker", "runtime"),
        ("enforce=yes", "enforce"),
        ("image.digest=sha256:abc", "digest"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("image.repository=", "repository"),
        ("extraEnv[0].name=NODE_NAME", "extraEnv"),
        (
            "podLabels.app\\.kubernetes\\.io/name=x",
            "app.kubernetes.io/name",
        ),
        ("resources.limits.memory=lots", "memory"),
        ("serviceAccount.name=Not_A_Name", "name"),
        ("updateStrategy.type=Recreate", "type"),
        ("replicas=3", "replicas"),
    ] {
        let chart = chart_dir();
        let refused = helm(&[
            "template",
            "node-agent",
            chart.to_str().expect("UTF-8 path"),
            "--set",
            set,
        ])
        .expect_err(set);
        assert!(
            refused.contains("values don't meet the specifications of the schema")
                && refused.contains(needle),
            "--set {set}: {refused}"
        );
    }
}

#[test]
fn the_config_value_is_the_agents_config_and_a_change_rolls_the_pods() {
    let shipped = std::fs::read_to_string(deploy_dir().join("config.yaml")).expect("config");
    let changed = shipped.replace("logLevel: info", "logLevel: debug");
    assert_ne!(changed, shipped, "deploy/config.yaml sets logLevel: info");
    let dir = tempfile_dir("chart-config");
    let file = dir.0.join("config.yaml");
    std::fs::write(&file, &changed).expect("config file");
    let hash = |docs: &[Value]| -> String {
        let ds = docs
            .iter()
            .find(|d| d["kind"] == "DaemonSet")
            .expect("DaemonSet");
        ds["spec"]["template"]["metadata"]["annotations"]["node-agent.io/config-sha256"]
            .as_str()
            .expect("the config's hash on the pod template")
            .to_string()
    };
    let (_, before) = helm_template(&[]);
    let (_, after) = helm_template(&["--set-file", &format!("config={}", file.display())]);
    let taken = config_map(&after)["data"]["config.yaml"]
        .as_str()
        .expect("config.yaml");
    assert_eq!(taken, changed, "the ConfigMap holds the file as given");
    check_config(taken);
    assert_ne!(
        hash(&before),
        hash(&after),
        "a new config, a new pod template"
    );
    // The same config again: the same template, nothing rolls.
    let (_, again) = helm_template(&["--set-file", &format!("config={}", file.display())]);
    assert_eq!(hash(&after), hash(&again));
}

/// README.md's table of the chart's values, between its two markers, is the one the schema
/// makes: every value with its type, default and description.
#[test]
fn the_readmes_values_table_is_the_schemas() {
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(chart_dir().join("values.schema.json")).expect("schema"),
    )
    .expect("schema JSON");
    let defaults: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(chart_dir().join("values.yaml")).expect("values.yaml"),
    )
    .expect("values.yaml");
    let mut rows = vec![
        "| value | type | default | what it does |".to_string(),
        "| --- | --- | --- | --- |".to_string(),
    ];
    fn walk(prefix: &str, schema: &Value, defaults: &Value, rows: &mut Vec<String>) {
        for (key, s) in schema["properties"].as_object().expect("properties") {
            let name = format!("{prefix}{key}");
            let default = &defaults[key];
            // An object whose every part says what it is gets a row per part; one whose parts
            // are Kubernetes' own (updateStrategy, resources) is one row.
            let parts = s["properties"].as_object().filter(|p| !p.is_empty());
            if parts.is_some_and(|p| p.values().all(|v| v["description"].is_string())) {
                walk(&format!("{name}."), s, default, rows);
                continue;
            }
            let kind = match (&s["type"], &s["enum"]) {
                (Value::String(t), _) => t.clone(),
                (Value::Array(ts), _) => ts
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(" or "),
                (_, Value::Array(e)) => e
                    .iter()
                    .map(|v| match v.as_str() {
                        Some("") | None => format!("`{v}`"),
                        Some(word) => format!("`{word}`"),
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
                _ => "any".into(),
            };
            let shown = match default {
                Value::Null => "".to_string(),
                Value::String(s) if s.is_empty() => "`\"\"`".into(),
                other => format!("`{}`", serde_json::to_string(other).expect("JSON")),
            };
            rows.push(format!(
                "| `{name}` | {kind} | {shown} | {} |",
                s["description"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{name} has no description in the schema"))
            ));
        }
    }
    walk("", &schema, &defaults, &mut rows);
    let table = rows.join("\n");
    let readme = std::fs::read_to_string(deploy_dir().join("../README.md")).expect("README");
    let (begin, end) = (
        "<!-- chart values: generated from deploy/chart/values.schema.json -->\n",
        "\n<!-- end of chart values -->",
    );
    let written = readme
        .split_once(begin)
        .and_then(|(_, rest)| rest.split_once(end))
        .map(|(t, _)| t)
        .unwrap_or_else(|| {
            panic!("README.md has no chart values table between {begin:?} and {end:?}")
        });
    assert_eq!(
        written, table,
        "README.md's chart values table is not the schema's; the table it should hold:\n{table}"
    );
}

/// An OCI registry on loopback (the CNCF Distribution registry, REGISTRY, built from its Go
/// module by `cargo xtask test`), its storage in a directory of the test's; stopped when
/// dropped.
struct Registry {
    child: std::process::Child,
    address: String,
    _storage: RemoveOnDrop,
}

impl Registry {
    fn start() -> Self {
        let storage = tempfile_dir("registry");
        // A port the kernel gave and this process let go of just before the registry binds it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let address = format!("127.0.0.1:{port}");
        let config = storage.0.join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {address}\n",
                storage.0.join("data").display()
            ),
        )
        .expect("registry config");
        let child = Command::new(tool("REGISTRY"))
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting the registry");
        let registry = Self {
            child,
            address,
            _storage: storage,
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&registry.address).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "the registry listens on {} within 30 s",
                registry.address
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        registry
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What `cargo xtask chart --push` does (lint, package, push), into a real OCI registry: the
/// artifact Helm pulls back renders exactly what the chart in the tree renders.
#[test]
fn the_chart_pushed_as_an_oci_artifact_renders_what_the_tree_does() {
    let helm_bin = PathBuf::from(tool("HELM"));
    let out = tempfile_dir("chart-package");
    let package = node_agent_cluster::chart::package(&helm_bin, &chart_dir(), &out.0, "0.1.0")
        .expect("lint and package");
    let registry = Registry::start();
    let to = format!("oci://{}/charts", registry.address);
    let digest = node_agent_cluster::chart::push(&helm_bin, &package, &to, true)
        .expect("push to the registry");
    assert!(digest.starts_with("sha256:"), "{digest}");
    let pulled = helm(&[
        "template",
        "node-agent",
        &format!("{to}/node-agent"),
        "--version",
        "0.1.0",
        "--plain-http",
        "--namespace",
        "node-agent",
    ])
    .unwrap_or_else(|e| panic!("helm template from the registry: {e}"));
    let (local, _) = helm_template(&[]);
    assert_eq!(pulled, local, "the artifact is the chart");
    // A chart whose version is not the agent's is never packaged.
    let refused = node_agent_cluster::chart::package(&helm_bin, &chart_dir(), &out.0, "9.9.9")
        .expect_err("another agent version");
    assert!(refused.to_string().contains("9.9.9"), "{refused:#}");
}

/// The values users of node agents set, each where a pod spec has it, validated against the
/// Kubernetes schemas like every other render.
#[test]
fn each_pod_value_lands_where_the_pod_spec_has_it() {
    let digest = format!("sha256:{}", "ab".repeat(32));
    let set = format!(
        "image.repository=registry.example.com/node-agent,image.tag=9.9.9,image.digest={digest},\
         image.pullPolicy=Always,imagePullSecrets[0].name=pull,priorityClassName=agents,\
         nodeSelector.pool=infra,tolerations[0].key=dedicated,tolerations[0].operator=Exists,\
         podAnnotations.team=sre,podLabels.team=sre,extraEnv[0].name=RUST_BACKTRACE,\
         extraEnv[0].value=full,resources.limits.memory=512Mi,resources.requests.memory=512Mi,\
         serviceAccount.create=false,serviceAccount.name=prebuilt,\
         updateStrategy.rollingUpdate.maxSurge=0,updateStrategy.rollingUpdate.maxUnavailable=1,\
         affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=zone,\
         affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists,\
         enforceByNodeLabel=true"
    );
    let (text, docs) = helm_template(&["--set", &set]);
    validate("chart-values", &text);
    assert!(
        !docs.iter().any(|d| d["kind"] == "ServiceAccount"),
        "serviceAccount.create=false makes none"
    );
    for binding in docs.iter().filter(|d| d["kind"] == "ClusterRoleBinding") {
        assert_eq!(binding["subjects"][0]["name"], "prebuilt", "{binding}");
    }
    let policy = docs
        .iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .expect("the policy");
    assert!(
        policy["spec"]["matchConditions"][0]["expression"]
            .as_str()
            .is_some_and(|e| e.contains("'system:serviceaccount:node-agent:prebuilt'")),
        "the policy binds the agent's own account: {}",
        policy["spec"]["matchConditions"]
    );
    let sets = daemon_sets(&docs);
    assert_eq!(sets.len(), 2, "enforceByNodeLabel: two DaemonSets");
    for ds in sets {
        let name = ds["metadata"]["name"].as_str().unwrap_or("?");
        let pod = &ds["spec"]["template"];
        let spec = &pod["spec"];
        let c = &spec["containers"][0];
        assert_eq!(
            c["image"],
            format!("registry.example.com/node-agent@{digest}"),
            "{name}: the digest wins"
        );
        assert_eq!(c["imagePullPolicy"], "Always");
        assert_eq!(spec["imagePullSecrets"][0]["name"], "pull");
        assert_eq!(spec["priorityClassName"], "agents");
        assert_eq!(spec["serviceAccountName"], "prebuilt");
        // Helm merges a map given with --set into the default (Linux only stays), and
        // replaces a list.
        assert_eq!(
            spec["nodeSelector"],
            serde_json::json!({"kubernetes.io/os": "linux", "pool": "infra"})
        );
        assert_eq!(
            spec["tolerations"],
            serde_json::json!([{"key": "dedicated", "operator": "Exists"}])
        );
        assert_eq!(pod["metadata"]["annotations"]["team"], "sre");
        assert_eq!(pod["metadata"]["labels"]["team"], "sre");
        assert!(
            ds["spec"]["selector"]["matchLabels"].get("team").is_none(),
            "{name}: not in the selector"
        );
        let env = c["env"].as_array().expect("env");
        assert_eq!(
            env.last().expect("env")["name"],
            "RUST_BACKTRACE",
            "{name}: extraEnv after the chart's"
        );
        assert_eq!(c["resources"]["limits"]["memory"], "512Mi");
        assert_eq!(
            ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"],
            1
        );
        // The user's node affinity and the chart's enforce term, both required.
        let terms = &spec["affinity"]["nodeAffinity"]
            ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
        let keys: Vec<&str> = terms[0]["matchExpressions"]
            .as_array()
            .expect("matchExpressions")
            .iter()
            .filter_map(|e| e["key"].as_str())
            .collect();
        assert_eq!(keys, ["zone", "node-agent.io/enforce"], "{name}: {terms}");
    }
}
