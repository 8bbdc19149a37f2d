//! Every manifest in deploy/ parses into k8s-openapi types, and what matters is as intended:
//! privileges, host mounts, RBAC verbs, priority, resources, probes, the rollout, and a config
//! whose `kubernetes:` section this crate's loader accepts (the whole file: node-agent's
//! tests; the rendered install: tests/tests/deploy_render.rs).

use std::{collections::BTreeMap, path::PathBuf};

use k8s_openapi::api::{
    admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding},
    apps::v1::DaemonSet,
    core::v1::{ConfigMap, Namespace, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding},
};
use node_agent_kube::config::{KubeConfig, PodSourceKind};
use serde::Deserialize;

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// Every document of a multi-document YAML file, as JSON values.
fn documents(file: &str) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(deploy_dir().join(file)).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| serde_json::Value::deserialize(doc).unwrap_or_else(|e| panic!("{file}: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

fn typed<T: serde::de::DeserializeOwned>(file: &str, v: &serde_json::Value) -> T {
    serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{file}: {e}"))
}

#[derive(Default)]
struct Manifests {
    namespaces: Vec<Namespace>,
    service_accounts: Vec<ServiceAccount>,
    roles: Vec<ClusterRole>,
    bindings: Vec<ClusterRoleBinding>,
    config_maps: Vec<ConfigMap>,
    daemon_sets: Vec<DaemonSet>,
    policies: Vec<ValidatingAdmissionPolicy>,
    policy_bindings: Vec<ValidatingAdmissionPolicyBinding>,
}

fn load(files: &[&str]) -> Manifests {
    let mut m = Manifests::default();
    for file in files {
        for doc in documents(file) {
            match doc["kind"].as_str().unwrap_or_default() {
                "Namespace" => m.namespaces.push(typed(file, &doc)),
                "ServiceAccount" => m.service_accounts.push(typed(file, &doc)),
                "ClusterRole" => m.roles.push(typed(file, &doc)),
                "ClusterRoleBinding" => m.bindings.push(typed(file, &doc)),
                "ConfigMap" => m.config_maps.push(typed(file, &doc)),
                "DaemonSet" => m.daemon_sets.push(typed(file, &doc)),
                "ValidatingAdmissionPolicy" => m.policies.push(typed(file, &doc)),
                "ValidatingAdmissionPolicyBinding" => m.policy_bindings.push(typed(file, &doc)),
                other => panic!("{file}: unexpected kind {other:?}"),
            }
        }
    }
    m
}

fn kustomization_resources() -> Vec<String> {
    kustomization_resources_in("kustomization.yaml")
}

fn kustomization_resources_in(file: &str) -> Vec<String> {
    let k: serde_json::Value = documents(file).remove(0);
    k["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect()
}

/// The base's resources, a directory entry standing for its kustomization's own resources.
fn manifests() -> Manifests {
    let files: Vec<String> = kustomization_resources()
        .into_iter()
        .flat_map(|r| {
            if deploy_dir().join(&r).is_dir() {
                kustomization_resources_in(&format!("{r}/kustomization.yaml"))
                    .into_iter()
                    .map(|f| format!("{r}/{f}"))
                    .collect()
            } else {
                vec![r]
            }
        })
        .collect();
    load(&files.iter().map(String::as_str).collect::<Vec<_>>())
}

/// deploy/config.yaml, the agent's config the ConfigMap is generated from.
fn shipped_config() -> String {
    std::fs::read_to_string(deploy_dir().join("config.yaml")).unwrap()
}

/// (apiGroup, resource) → verbs, merged over rules.
fn grants(role: &ClusterRole) -> BTreeMap<(String, String), Vec<String>> {
    let mut out: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for rule in role.rules.as_deref().unwrap_or_default() {
        assert!(rule.resource_names.is_none() && rule.non_resource_urls.is_none());
        for group in rule.api_groups.as_deref().unwrap_or_default() {
            for resource in rule.resources.as_deref().unwrap_or_default() {
                let verbs = out.entry((group.clone(), resource.clone())).or_default();
                verbs.extend(rule.verbs.iter().cloned());
                verbs.sort();
            }
        }
    }
    out
}

#[test]
fn kustomization_lists_every_default_manifest() {
    let resources = kustomization_resources();
    let k: serde_json::Value = documents("kustomization.yaml").remove(0);
    assert_eq!(
        resources,
        [
            "namespace.yaml",
            "serviceaccount.yaml",
            "rbac.yaml",
            "admission-policy.yaml",
            "daemonset"
        ]
    );
    // The ConfigMap is generated from config.yaml, its name hashed by content.
    let generated = &k["configMapGenerator"][0];
    assert_eq!(generated["name"], "node-agent-config");
    assert_eq!(generated["namespace"], "node-agent");
    assert_eq!(generated["files"], serde_json::json!(["config.yaml"]));
    assert!(
        generated["options"].get("disableNameSuffixHash").is_none(),
        "the hash in its name is what rolls a config out"
    );
    // No namespace transformer: kustomize would put one on the cluster-scoped policy.
    assert!(k.get("namespace").is_none(), "{k}");
    let m = manifests();
    assert_eq!(m.namespaces[0].metadata.name.as_deref(), Some("node-agent"));
    // Every namespaced object names its namespace itself.
    assert!(m
        .service_accounts
        .iter()
        .map(|o| &o.metadata)
        .chain(m.daemon_sets.iter().map(|o| &o.metadata))
        .all(|meta| meta.namespace.as_deref() == Some("node-agent")));
    // The node-bound admission policy and its binding are part of the default install.
    assert_eq!(m.policies.len(), 1);
    assert_eq!(m.policy_bindings.len(), 1);
    assert!(m.policies[0].metadata.namespace.is_none(), "cluster-scoped");
    assert_eq!(
        m.service_accounts[0].metadata.name.as_deref(),
        Some("node-agent")
    );
}

#[test]
fn rbac_grants_exactly_the_intended_verbs() {
    let m = manifests();
    assert_eq!(m.roles.len(), 1);
    // No pods delete by default: that is pdbPolicy: override's, in deploy/override/. The
    // pods/status patch is the record of an eviction carried out on the node.
    let want: BTreeMap<(String, String), Vec<String>> = [
        ("", "pods", &["list", "watch"][..]),
        ("", "pods/eviction", &["create"]),
        ("", "pods/status", &["patch"]),
        ("", "nodes", &["get", "patch"]),
        ("", "nodes/status", &["patch"]),
        ("", "nodes/stats", &["get"]),
        ("", "nodes/pods", &["get"]),
        ("events.k8s.io", "events", &["create", "patch"]),
        // metricsAccess: kubernetes: who may read /metrics.
        ("authentication.k8s.io", "tokenreviews", &["create"]),
        ("authorization.k8s.io", "subjectaccessreviews", &["create"]),
    ]
    .into_iter()
    .map(|(g, r, v)| {
        (
            (g.to_string(), r.to_string()),
            v.iter().map(|s| s.to_string()).collect(),
        )
    })
    .collect();
    assert_eq!(grants(&m.roles[0]), want);
    // Exact equality above: no secrets, no nodes/proxy, no wildcard.

    let binding = &m.bindings[0];
    assert_eq!(binding.role_ref.name, "node-agent");
    let subject = &binding.subjects.as_ref().unwrap()[0];
    assert_eq!(
        (
            subject.kind.as_str(),
            subject.name.as_str(),
            subject.namespace.as_deref()
        ),
        ("ServiceAccount", "node-agent", Some("node-agent"))
    );

    // The override add-on grants exactly what pdbPolicy: override needs, to the same account.
    let override_files = kustomization_resources_in("override/kustomization.yaml");
    assert_eq!(override_files, ["rbac-override.yaml"]);
    let over = load(&["override/rbac-override.yaml"]);
    let want: BTreeMap<_, _> = [(("", "pods"), "delete")]
        .into_iter()
        .map(|((g, r), v)| ((g.to_string(), r.to_string()), vec![v.to_string()]))
        .collect();
    assert_eq!(grants(&over.roles[0]), want);
    let binding = &over.bindings[0];
    assert_eq!(
        binding.role_ref.name,
        over.roles[0].metadata.name.clone().unwrap()
    );
    assert_eq!(
        binding.subjects.as_ref().unwrap()[0].name.as_str(),
        "node-agent"
    );

    // The optional kubelet-proxy grant is exactly nodes/proxy get, and off by default.
    let proxy = load(&["rbac-kubelet-proxy.yaml"]);
    let want: BTreeMap<_, _> = [(
        ("".to_string(), "nodes/proxy".to_string()),
        vec!["get".to_string()],
    )]
    .into_iter()
    .collect();
    assert_eq!(grants(&proxy.roles[0]), want);
}

#[test]
fn daemonset_has_named_capabilities_host_access_probes_and_fixed_resources() {
    let m = manifests();
    let ds = &m.daemon_sets[0];
    let spec = ds.spec.as_ref().unwrap();
    let strategy = spec.update_strategy.as_ref().unwrap();
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    // A new image or config goes one node at a time, each new agent running a while before it
    // counts as ready, beside the old one: a node never goes without its agent, even when the
    // new one is refused (maxSurge 1, maxUnavailable 0). The while is the readiness probe's
    // delay, not minReadySeconds, whose timer the DaemonSet controller can drop and stall the
    // surge (daemonset.yaml).
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let rolling = strategy.rolling_update.as_ref().unwrap();
    assert_eq!(rolling.max_surge, Some(IntOrString::Int(1)));
    assert_eq!(rolling.max_unavailable, Some(IntOrString::Int(0)));
    assert_eq!(spec.min_ready_seconds.unwrap_or(0), 0);
    let ready_after = spec.template.spec.as_ref().unwrap().containers[0]
        .readiness_probe
        .as_ref()
        .and_then(|p| p.initial_delay_seconds);
    assert!(ready_after.unwrap_or(0) >= 30, "{ready_after:?}");
    // Its own instance label in the selector, so a second DaemonSet's pods
    // (components/enforce-by-node-label) are never its own.
    let selector = spec.selector.match_labels.as_ref().unwrap();
    assert_eq!(
        selector
            .get("app.kubernetes.io/instance")
            .map(String::as_str),
        Some("node-agent")
    );

    let pod = spec.template.spec.as_ref().unwrap();
    // The host's PID namespace, for hard evictions carried out on the node (the pods'
    // processes by their host IDs); never privileged: tests/tests/image_container.rs proves
    // the agent works so, and says what it cannot do without each.
    assert_eq!(pod.host_pid, Some(true));
    // Linux nodes only, and every one of them, tainted or not.
    assert_eq!(
        pod.node_selector,
        Some([("kubernetes.io/os".to_string(), "linux".to_string())].into())
    );
    let tolerations = pod.tolerations.as_deref().unwrap();
    assert!(tolerations
        .iter()
        .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none()));
    // The image is a name kustomize's `images:` rewrites (deploy_render checks the result).
    assert_eq!(
        pod.containers[0].image.as_deref(),
        Some("node-agent:latest")
    );
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    assert_eq!(pod.service_account_name.as_deref(), Some("node-agent"));
    let c = &pod.containers[0];
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.privileged, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    let caps = sc.capabilities.as_ref().unwrap();
    assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
    assert_eq!(
        caps.add.as_deref(),
        Some(&["BPF".to_string(), "PERFMON".to_string(), "KILL".to_string()][..])
    );
    assert_eq!(
        c.command.as_deref().unwrap(),
        [
            "/usr/local/bin/node-agent",
            "run",
            "--config",
            "/etc/node-agent/config.yaml"
        ]
    );
    // The base install observes: dry run whatever config.yaml says, until components/enforce
    // drops this (tests/tests/deploy_render.rs renders that).
    assert_eq!(c.args.as_deref(), Some(&["--dry-run".to_string()][..]));

    let res = c.resources.as_ref().unwrap();
    assert_eq!(res.requests, res.limits);
    let requests = res.requests.as_ref().unwrap();
    assert!(requests.contains_key("cpu") && requests.contains_key("memory"));

    let env: BTreeMap<_, _> = c
        .env
        .as_deref()
        .unwrap()
        .iter()
        .map(|e| {
            let value = match (&e.value, &e.value_from) {
                (Some(value), None) => value.as_str(),
                (None, Some(from)) => from.field_ref.as_ref().unwrap().field_path.as_str(),
                other => panic!("{}: {other:?}", e.name),
            };
            (e.name.as_str(), value)
        })
        .collect();
    assert_eq!(env["NODE_NAME"], "spec.nodeName");
    assert_eq!(env["POD_NAME"], "metadata.name");
    assert_eq!(env["POD_NAMESPACE"], "metadata.namespace");

    let port = &c.ports.as_deref().unwrap()[0];
    assert_eq!(
        (port.name.as_deref(), port.container_port),
        (Some("http"), 9464)
    );
    for (probe, path) in [
        (&c.liveness_probe, "/healthz"),
        (&c.readiness_probe, "/readyz"),
    ] {
        let get = probe.as_ref().unwrap().http_get.as_ref().unwrap();
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(
            get.port,
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("http".into())
        );
    }

    // Every host path the agent needs, mounted where it expects it.
    let host_paths: BTreeMap<&str, &str> = pod
        .volumes
        .as_deref()
        .unwrap()
        .iter()
        .filter_map(|v| Some((v.name.as_str(), v.host_path.as_ref()?.path.as_str())))
        .collect();
    let mounts: BTreeMap<&str, &str> = c
        .volume_mounts
        .as_deref()
        .unwrap()
        .iter()
        .map(|m| (m.name.as_str(), m.mount_path.as_str()))
        .collect();
    for (host, in_container) in [
        ("/sys/fs/cgroup", "/sys/fs/cgroup"),
        ("/var/lib/kubelet", "/var/lib/kubelet"),
        ("/var/lib/containerd", "/var/lib/containerd"),
        ("/run", "/host/run"),
    ] {
        let (volume, _) = host_paths
            .iter()
            .find(|(_, p)| **p == host)
            .unwrap_or_else(|| panic!("no hostPath {host}"));
        assert_eq!(mounts.get(volume), Some(&in_container), "{host}");
    }
    // Host mounts are read-only, and there are no others (no /proc, no bpffs, no tracefs).
    assert_eq!(host_paths.len(), 4, "{host_paths:?}");
    for m in c.volume_mounts.as_deref().unwrap() {
        if host_paths.contains_key(m.name.as_str()) {
            assert_eq!(m.read_only, Some(true), "{} read-only", m.name);
        }
    }
    // The config's paths are these mounts; the image filesystem is the runtime's word.
    let config: serde_json::Value = serde_yaml_ng::from_str(&shipped_config()).unwrap();
    let mounted = |p: &serde_json::Value| {
        let p = p.as_str().unwrap_or_else(|| panic!("{p} set"));
        mounts
            .values()
            .any(|m| std::path::Path::new(p).starts_with(m))
    };
    for field in ["nodefsPath", "kubeletConfig"] {
        assert!(mounted(&config[field]), "{field} is inside a mount");
    }
    assert!(
        config.get("imagefsPath").is_none(),
        "the runtime says where its images are"
    );
    // The runtime's socket, for node-level reclaim: named by CONTAINER_RUNTIME_ENDPOINT (the
    // config leaves it to the DaemonSet, whose runtime component sets it), inside the mount of
    // the host's /run (a mount of the socket file would go stale when the runtime restarts),
    // which exists on every node and follows the host's unmounts below it.
    assert!(config["cri"].get("endpoint").is_none(), "{}", config["cri"]);
    let endpoint = env["CONTAINER_RUNTIME_ENDPOINT"];
    let socket = serde_json::json!(endpoint
        .strip_prefix("unix://")
        .expect("a unix:// endpoint"));
    assert!(
        mounted(&socket),
        "CONTAINER_RUNTIME_ENDPOINT {endpoint} is inside a mount"
    );
    let volume = |name: &str| {
        pod.volumes
            .as_deref()
            .unwrap()
            .iter()
            .find(|v| v.name == name)
            .unwrap_or_else(|| panic!("volume {name}"))
            .host_path
            .clone()
            .unwrap()
    };
    let mount = |name: &str| {
        c.volume_mounts
            .as_deref()
            .unwrap()
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("mount {name}"))
            .clone()
    };
    // /run is never missing, so never created; the runtime's root may be, on a node of
    // another runtime, and is then created empty rather than keeping the pod from starting.
    let run = volume("host-run");
    assert_eq!(
        (run.path.as_str(), run.type_.as_deref()),
        ("/run", Some("Directory"))
    );
    let root = volume("runtime-root");
    assert_eq!(
        (root.path.as_str(), root.type_.as_deref()),
        ("/var/lib/containerd", Some("DirectoryOrCreate"))
    );
    for name in ["host-run", "runtime-root", "kubelet"] {
        assert_eq!(
            mount(name).mount_propagation.as_deref(),
            Some("HostToContainer"),
            "{name}"
        );
    }
    let config_volume = pod
        .volumes
        .as_deref()
        .unwrap()
        .iter()
        .find(|v| v.config_map.is_some())
        .unwrap();
    assert_eq!(
        config_volume.config_map.as_ref().unwrap().name,
        "node-agent-config"
    );
    assert_eq!(mounts[config_volume.name.as_str()], "/etc/node-agent");
}

#[test]
fn the_config_s_kubernetes_section_parses_with_this_crate_s_loader() {
    let whole: serde_json::Value = serde_yaml_ng::from_str(&shipped_config()).unwrap();
    assert_eq!(whole["apiVersion"], "node-agent.io/v1alpha1");
    assert_eq!(whole["kind"], "NodeAgentConfiguration");
    let section = serde_yaml_ng::to_string(&whole["kubernetes"]).unwrap();
    let config = KubeConfig::from_yaml(&section, Some("worker-1")).unwrap();
    assert_eq!(config.pod_source, PodSourceKind::Kubelet);
    assert_eq!(config.node_name, "worker-1");
    // The kubelet found from the Node, verified with kubeadm's and kind's kubelet.crt (below
    // the DaemonSet's /var/lib/kubelet mount) or the cluster CA; never unchecked.
    assert_eq!(
        config.kubelet,
        node_agent_kube::config::KubeletEndpoint::default()
    );
    assert!(config
        .kubelet
        .ca_file
        .as_deref()
        .is_some_and(|p| p.starts_with("/var/lib/kubelet/")));
    assert_eq!(
        config
            .exclusions
            .namespaces
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        ["kube-system", "node-agent"]
    );

    // The eviction section carries the kubelet's field names.
    let eviction = whole["eviction"].as_object().unwrap();
    for field in [
        "evictionHard",
        "evictionSoft",
        "evictionSoftGracePeriod",
        "evictionMaxPodGracePeriod",
        "evictionMinimumReclaim",
        "evictionPressureTransitionPeriod",
    ] {
        assert!(eviction.contains_key(field), "{field}");
    }
}

#[test]
fn containerfile_ships_the_prebuilt_static_agent_alone() {
    let text = std::fs::read_to_string(deploy_dir().join("Containerfile")).unwrap();
    for needle in [
        "FROM scratch",
        "COPY node-agent /usr/local/bin/node-agent",
        "ENTRYPOINT [\"/usr/local/bin/node-agent\"]",
    ] {
        assert!(text.contains(needle), "{needle}");
    }
}
