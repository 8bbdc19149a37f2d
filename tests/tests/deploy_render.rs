//! deploy/ as an operator renders it: `kubectl kustomize` (Debian's kubectl, or whichever is
//! on PATH), then PyPI's `kubernetes-validate --strict` against the OpenAPI schemas of the
//! oldest supported Kubernetes (1.30, the first with ValidatingAdmissionPolicy v1 and
//! node-bound service account tokens) and of 1.33. `cargo xtask test` installs both tools and
//! names them in KUBECTL and KUBERNETES_VALIDATE.

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
