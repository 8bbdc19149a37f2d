//! The DaemonSet's pod template, translated into the CRI requests the kubelet would send, so a
//! test runs the agent exactly as `deploy/daemonset/daemonset.yaml` says: one place for the
//! security context and mounts, proven by the test that runs it.
//!
//! The translation follows the kubelet (`pkg/kubelet/kuberuntime`: `security_context.go`,
//! `kuberuntime_container_linux.go`, `kuberuntime_sandbox.go`): capabilities by name as
//! written, `allowPrivilegeEscalation: false` → `no_new_privs`, seccomp `RuntimeDefault`,
//! the kubelet's masked and read-only `/proc` paths for unprivileged containers, hostPath
//! volumes as bind mounts with their propagation, requests and limits as cgroup settings.
//! A field that matters for privileges and that this translation does not know fails the
//! test rather than being dropped: what runs here is what the manifest says.

use std::{collections::BTreeMap, path::PathBuf};

use anyhow::{bail, Context as _};
use node_agent_cri::proto;
use serde_json::Value;

/// The kubelet's default masked paths (`securitycontext.defaultMaskedPaths`).
const MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
/// The kubelet's default read-only paths (`securitycontext.defaultReadonlyPaths`).
const READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// Pod-template fields with no bearing on what the container may do on the node.
const POD_FIELDS_ELSEWHERE: &[&str] = &[
    "serviceAccountName",
    "priorityClassName",
    "tolerations",
    "nodeSelector",
    "affinity",
    "terminationGracePeriodSeconds",
    "dnsPolicy",
    "automountServiceAccountToken",
];
const CONTAINER_FIELDS_ELSEWHERE: &[&str] = &[
    "name",
    "image",
    "imagePullPolicy",
    "ports",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "terminationMessagePolicy",
];

/// A volume and where its content comes from on the test host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Volume {
    /// `kind` is the hostPath's `type` (`""` when unset).
    HostPath {
        path: String,
        kind: String,
    },
    ConfigMap {
        name: String,
    },
    EmptyDir,
}

/// The pod template of a DaemonSet manifest, parsed strictly.
#[derive(Debug, Clone)]
pub struct PodTemplate {
    pub spec: Value,
    pub container: Value,
    pub volumes: BTreeMap<String, Volume>,
}

impl PodTemplate {
    /// Reads the first container of the DaemonSet in `yaml`.
    pub fn from_daemonset(yaml: &str) -> anyhow::Result<Self> {
        let ds: Value = serde_yaml_ng::from_str(yaml).context("the DaemonSet is not YAML")?;
        if ds["kind"] != "DaemonSet" {
            bail!("expected a DaemonSet, got kind {}", ds["kind"]);
        }
        let spec = ds["spec"]["template"]["spec"].clone();
        let keys = object_keys(&spec, "spec.template.spec")?;
        for key in keys {
            let known = POD_FIELDS_ELSEWHERE.contains(&key.as_str())
                || [
                    "hostPID",
                    "hostNetwork",
                    "hostIPC",
                    "containers",
                    "volumes",
                    "securityContext",
                ]
                .contains(&key.as_str());
            if !known {
                bail!("spec.template.spec.{key}: the test does not know how the kubelet applies it; teach tests/src/podspec.rs");
            }
        }
        let containers = spec["containers"]
            .as_array()
            .context("spec.template.spec.containers")?;
        if containers.len() != 1 {
            bail!(
                "expected one container, the DaemonSet has {}",
                containers.len()
            );
        }
        let container = containers[0].clone();
        let mut volumes = BTreeMap::new();
        for v in spec["volumes"].as_array().cloned().unwrap_or_default() {
            let name = v["name"]
                .as_str()
                .context("a volume without name")?
                .to_string();
            let volume = if let Some(path) = v["hostPath"]["path"].as_str() {
                Volume::HostPath {
                    path: path.to_string(),
                    kind: v["hostPath"]["type"].as_str().unwrap_or("").to_string(),
                }
            } else if let Some(cm) = v["configMap"]["name"].as_str() {
                Volume::ConfigMap {
                    name: cm.to_string(),
                }
            } else if v.get("emptyDir").is_some() {
                Volume::EmptyDir
            } else {
                bail!("volume {name}: only hostPath, configMap and emptyDir are translated: {v}");
            };
            volumes.insert(name, volume);
        }
        Ok(Self {
            spec,
            container,
            volumes,
        })
    }

    pub fn host_pid(&self) -> bool {
        self.spec["hostPID"] == true
    }

    pub fn host_network(&self) -> bool {
        self.spec["hostNetwork"] == true
    }

    /// The kubelet's `namespacesForPod`.
    pub fn namespaces(&self) -> proto::NamespaceOption {
        let mode = |host: bool, otherwise: proto::NamespaceMode| {
            if host {
                proto::NamespaceMode::Node
            } else {
                otherwise
            }
            .into()
        };
        proto::NamespaceOption {
            network: mode(self.host_network(), proto::NamespaceMode::Pod),
            pid: mode(self.host_pid(), proto::NamespaceMode::Container),
            ipc: mode(self.spec["hostIPC"] == true, proto::NamespaceMode::Pod),
            ..Default::default()
        }
    }

    /// The container port named `name`.
    pub fn port(&self, name: &str) -> anyhow::Result<u16> {
        self.container["ports"]
            .as_array()
            .and_then(|ports| ports.iter().find(|p| p["name"] == name))
            .and_then(|p| p["containerPort"].as_u64())
            .and_then(|p| u16::try_from(p).ok())
            .with_context(|| format!("no container port named {name}"))
    }

    /// The container's security context as the CRI gets it.
    pub fn security_context(&self) -> anyhow::Result<proto::LinuxContainerSecurityContext> {
        let sc = &self.container["securityContext"];
        for key in object_keys(sc, "securityContext")? {
            let known = [
                "privileged",
                "allowPrivilegeEscalation",
                "readOnlyRootFilesystem",
                "runAsUser",
                "runAsGroup",
                "runAsNonRoot",
                "capabilities",
                "seccompProfile",
            ];
            if !known.contains(&key.as_str()) {
                bail!("securityContext.{key}: not translated; teach tests/src/podspec.rs");
            }
        }
        let names = |key: &str| -> Vec<String> {
            sc["capabilities"][key]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|c| c.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        let privileged = sc["privileged"] == true;
        let seccomp = match sc["seccompProfile"]["type"].as_str() {
            None => None,
            Some("RuntimeDefault") => Some(proto::SecurityProfile {
                profile_type: proto::security_profile::ProfileType::RuntimeDefault.into(),
                localhost_ref: String::new(),
            }),
            Some("Unconfined") => Some(proto::SecurityProfile {
                profile_type: proto::security_profile::ProfileType::Unconfined.into(),
                localhost_ref: String::new(),
            }),
            Some(other) => bail!("seccompProfile.type {other}: not translated"),
        };
        if sc["runAsNonRoot"] == true && sc["runAsUser"].as_i64().unwrap_or(0) == 0 {
            bail!("runAsNonRoot with uid 0: the kubelet would refuse to start the container");
        }
        Ok(proto::LinuxContainerSecurityContext {
            capabilities: Some(proto::Capability {
                add_capabilities: names("add"),
                drop_capabilities: names("drop"),
                add_ambient_capabilities: vec![],
            }),
            privileged,
            namespace_options: Some(self.namespaces()),
            run_as_user: sc["runAsUser"]
                .as_i64()
                .map(|value| proto::Int64Value { value }),
            run_as_group: sc["runAsGroup"]
                .as_i64()
                .map(|value| proto::Int64Value { value }),
            readonly_rootfs: sc["readOnlyRootFilesystem"] == true,
            no_new_privs: sc["allowPrivilegeEscalation"] == false,
            seccomp,
            masked_paths: if privileged {
                vec![]
            } else {
                MASKED_PATHS.iter().map(|s| s.to_string()).collect()
            },
            readonly_paths: if privileged {
                vec![]
            } else {
                READONLY_PATHS.iter().map(|s| s.to_string()).collect()
            },
            ..Default::default()
        })
    }

    /// Bind mounts for the container's volume mounts. `backing` gives the host directory of a
    /// configMap or emptyDir volume (the kubelet's own directories under its pods dir), and
    /// may stand in for a hostPath this machine lacks (it is not a node: no kubelet); other
    /// hostPaths are the host's own.
    pub fn mounts(
        &self,
        backing: impl Fn(&str, &Volume) -> anyhow::Result<Option<PathBuf>>,
    ) -> anyhow::Result<Vec<proto::Mount>> {
        let mut mounts = Vec::new();
        for m in self.container["volumeMounts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            for key in object_keys(&m, "volumeMounts[]")? {
                if !["name", "mountPath", "readOnly", "mountPropagation"].contains(&key.as_str()) {
                    bail!("volumeMounts[].{key}: not translated");
                }
            }
            let name = m["name"].as_str().context("volumeMount without name")?;
            let volume = self
                .volumes
                .get(name)
                .with_context(|| format!("volumeMount {name}: no such volume"))?;
            // A stand-in for a hostPath is checked as the kubelet checks the host's own path.
            let host_path = match (backing(name, volume)?, volume) {
                (Some(path), Volume::HostPath { kind, .. }) => {
                    host_path_as_kubelet(&path, kind, name)?
                }
                (Some(path), _) => path,
                (None, Volume::HostPath { path, kind }) => {
                    host_path_as_kubelet(std::path::Path::new(path), kind, name)?
                }
                (None, other) => bail!("volume {name} ({other:?}) needs a directory from the test"),
            };
            let propagation = match m["mountPropagation"].as_str() {
                None | Some("None") => proto::MountPropagation::PropagationPrivate,
                Some("HostToContainer") => proto::MountPropagation::PropagationHostToContainer,
                Some("Bidirectional") => proto::MountPropagation::PropagationBidirectional,
                Some(other) => bail!("mountPropagation {other}"),
            };
            mounts.push(proto::Mount {
                container_path: m["mountPath"].as_str().context("mountPath")?.to_string(),
                host_path: host_path.to_string_lossy().into_owned(),
                readonly: m["readOnly"] == true,
                propagation: propagation.into(),
                ..Default::default()
            });
        }
        Ok(mounts)
    }

    /// Environment, with downward-API `fieldRef`s resolved from `fields`.
    pub fn env(&self, fields: &BTreeMap<&str, &str>) -> anyhow::Result<Vec<proto::KeyValue>> {
        let mut env = Vec::new();
        for e in self.container["env"]
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            let key = e["name"].as_str().context("env without name")?.to_string();
            let value = if let Some(v) = e["value"].as_str() {
                v.to_string()
            } else if let Some(path) = e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                fields
                    .get(path)
                    .with_context(|| format!("env {key}: no value for fieldRef {path}"))?
                    .to_string()
            } else {
                bail!("env {key}: only value and fieldRef are translated");
            };
            env.push(proto::KeyValue {
                key,
                value: value.into(),
            });
        }
        Ok(env)
    }

    /// `command` and `args` as written.
    pub fn command(&self) -> (Vec<String>, Vec<String>) {
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        (
            strings(&self.container["command"]),
            strings(&self.container["args"]),
        )
    }

    /// Requests and limits as the kubelet sets the container's cgroup (cgroup v1 shares,
    /// CFS quota over a 100 ms period, memory limit), and the pod's QoS class.
    pub fn resources(&self) -> anyhow::Result<(proto::LinuxContainerResources, &'static str)> {
        let r = &self.container["resources"];
        let cpu = |v: &Value| v.as_str().map(millicores).transpose();
        let mem = |v: &Value| v.as_str().map(bytes).transpose();
        let (cpu_req, cpu_lim) = (cpu(&r["requests"]["cpu"])?, cpu(&r["limits"]["cpu"])?);
        let (mem_req, mem_lim) = (mem(&r["requests"]["memory"])?, mem(&r["limits"]["memory"])?);
        let qos = match (cpu_req, cpu_lim, mem_req, mem_lim) {
            (Some(a), Some(b), Some(c), Some(d)) if a == b && c == d => "guaranteed",
            (None, None, None, None) => "besteffort",
            _ => "burstable",
        };
        let resources = proto::LinuxContainerResources {
            cpu_period: if cpu_lim.is_some() { 100_000 } else { 0 },
            cpu_quota: cpu_lim.map_or(0, |m| m * 100_000 / 1000),
            cpu_shares: cpu_req.map_or(2, |m| (m * 1024 / 1000).max(2)),
            memory_limit_in_bytes: mem_lim.unwrap_or(0),
            ..Default::default()
        };
        Ok((resources, qos))
    }
}

/// A hostPath as the kubelet prepares it before the runtime mounts it (`pkg/volume/hostpath`):
/// `Directory` must be a directory, or the pod does not start; `DirectoryOrCreate` is made
/// (mode 0755) when missing; unset, nothing is checked, and containerd's CRI then makes a
/// missing path itself (its `WithMounts`), which the test refuses to do on the host: a
/// manifest that relies on it creates on nodes what the test would create here.
fn host_path_as_kubelet(
    path: &std::path::Path,
    kind: &str,
    volume: &str,
) -> anyhow::Result<PathBuf> {
    match kind {
        "Directory" if !path.is_dir() => bail!(
            "hostPath {} (volume {volume}, type Directory) is not a directory: the kubelet would not start the pod",
            path.display()
        ),
        "Directory" => {}
        "DirectoryOrCreate" if !path.exists() => {
            std::fs::create_dir_all(path)
                .with_context(|| format!("creating {} (DirectoryOrCreate)", path.display()))?;
        }
        "DirectoryOrCreate" if !path.is_dir() => bail!(
            "hostPath {} (volume {volume}, DirectoryOrCreate) is not a directory",
            path.display()
        ),
        "DirectoryOrCreate" => {}
        other => bail!("hostPath {} (volume {volume}): type {other:?} is not translated; give it a type", path.display()),
    }
    Ok(path.to_path_buf())
}

/// deploy/ rendered as an operator renders it (`kubectl kustomize`, KUBECTL) with `components`
/// enabled by one line each in a copy of its kustomization.yaml: the DaemonSet named `name`.
pub fn render_daemonset(components: &[&str], name: &str) -> anyhow::Result<PodTemplate> {
    let deploy = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let copy = std::env::temp_dir().join(format!(
        "node-agent-podspec-{}-{}",
        std::process::id(),
        components.join("+").replace('/', "_")
    ));
    let _ = std::fs::remove_dir_all(&copy);
    copy_dir(&deploy, &copy)?;
    let rendered = (|| {
        let kustomization = copy.join("kustomization.yaml");
        let mut text = std::fs::read_to_string(&kustomization)?;
        if !components.is_empty() {
            text.push_str("components:\n");
            for c in components {
                text.push_str(&format!("  - components/{c}\n"));
            }
        }
        std::fs::write(&kustomization, text)?;
        let kubectl = std::env::var("KUBECTL").context(
            "KUBECTL names kubectl (set by `cargo xtask test`; `cargo xtask setup` installs it)",
        )?;
        let out = std::process::Command::new(&kubectl)
            .arg("kustomize")
            .arg(&copy)
            .output()
            .with_context(|| format!("running {kubectl}"))?;
        if !out.status.success() {
            bail!(
                "kubectl kustomize: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        anyhow::Ok(String::from_utf8(out.stdout)?)
    })();
    let _ = std::fs::remove_dir_all(&copy);
    let rendered = rendered?;
    for doc in serde_yaml_ng::Deserializer::from_str(&rendered) {
        let v = <Value as serde::Deserialize>::deserialize(doc)?;
        if v["kind"] == "DaemonSet" && v["metadata"]["name"] == name {
            return PodTemplate::from_daemonset(&serde_json::to_string(&v)?);
        }
    }
    bail!("no DaemonSet {name} in deploy/ rendered with {components:?}")
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

fn object_keys(v: &Value, what: &str) -> anyhow::Result<Vec<String>> {
    match v {
        Value::Null => Ok(vec![]),
        Value::Object(map) => Ok(map.keys().cloned().collect()),
        other => bail!("{what}: expected a mapping, got {other}"),
    }
}

/// `200m` or `1` CPUs in millicores.
fn millicores(s: &str) -> anyhow::Result<i64> {
    match s.strip_suffix('m') {
        Some(m) => Ok(m.parse()?),
        None => Ok((s.parse::<f64>()? * 1000.0) as i64),
    }
}

/// A memory quantity (binary suffixes, as the manifests use) in bytes.
fn bytes(s: &str) -> anyhow::Result<i64> {
    let q: node_agent_policy::Quantity = s.parse().with_context(|| format!("quantity {s:?}"))?;
    Ok(q.value())
}

/// Checks the fields other sections of the translation ignore really are the harmless ones.
pub fn check_container_fields(template: &PodTemplate) -> anyhow::Result<()> {
    for key in object_keys(&template.container, "containers[0]")? {
        let translated = [
            "command",
            "args",
            "env",
            "securityContext",
            "resources",
            "volumeMounts",
        ];
        if !translated.contains(&key.as_str())
            && !CONTAINER_FIELDS_ELSEWHERE.contains(&key.as_str())
        {
            bail!("containers[0].{key}: the test does not know how the kubelet applies it; teach tests/src/podspec.rs");
        }
    }
    Ok(())
}
