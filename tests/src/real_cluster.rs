//! The real cluster the `cluster_*` tests run against (`cargo xtask cluster test` brings it up
//! and names it in `NODE_AGENT_CLUSTER_DIR`): kubectl as users run it, namespaces that are
//! deleted when a test ends (also when it fails), pods from the local workload image, the
//! agent's pods, metrics, trace and the API server's audit log.
//!
//! A test that finds no cluster fails, naming how to run it; it never skips.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use node_agent_cluster::{images::WORKLOAD_IMAGE, Cluster, Kubectl, NodeSpec};
use serde_json::Value;

/// The agent's namespace and DaemonSets (deploy/).
pub const AGENT_NS: &str = "node-agent";
pub const AGENT_SA: &str = "system:serviceaccount:node-agent:node-agent";

/// The tests' scraper: a service account allowed what deploy/components/monitoring allows
/// Prometheus.
const SCRAPER: &str = "apiVersion: v1
kind: Namespace
metadata: {name: node-agent-tests}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: scraper, namespace: node-agent-tests}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: node-agent-tests-scraper}
rules:
  - nonResourceURLs: [/metrics, /readyz]
    verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: node-agent-tests-scraper}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: node-agent-tests-scraper}
subjects: [{kind: ServiceAccount, name: scraper, namespace: node-agent-tests}]
";

/// The cluster of this test run.
#[derive(Clone)]
pub struct RealCluster {
    pub cluster: Cluster,
    pub kubectl: Kubectl,
    /// Where the audit log stood when the test began: [`RealCluster::audit_events`] reads
    /// from here, through the API server's rotations.
    pub audit_mark: AuditMark,
}

impl RealCluster {
    /// The cluster `cargo xtask cluster test` brought up. Panics (the test fails) when there
    /// is none.
    pub fn get() -> Self {
        let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("tests/ sits in the workspace")
            .to_path_buf();
        if std::env::var_os("NODE_AGENT_CLUSTER_DIR").is_none() {
            panic!("no real cluster: run the real-cluster tests with `cargo xtask cluster test` (it brings the cluster up and sets NODE_AGENT_CLUSTER_DIR)");
        }
        let cluster = Cluster::new(workspace);
        let kubectl = cluster.kubectl();
        let ready = kubectl
            .run(&[
                "get",
                "nodes",
                "-o",
                "jsonpath={.items[*].status.conditions[?(@.type==\"Ready\")].status}",
            ])
            .unwrap_or_else(|e| panic!("the real cluster does not answer: {e:#}"));
        assert!(
            ready.split_whitespace().all(|s| s == "True") && !ready.trim().is_empty(),
            "the real cluster's nodes are not Ready: {ready:?}"
        );
        let audit_mark = AuditMark::now(&cluster.layout.audit_log())
            .unwrap_or_else(|e| panic!("the API server's audit log: {e:#}"));
        Self {
            cluster,
            kubectl,
            audit_mark,
        }
    }

    pub fn node0(&self) -> NodeSpec {
        self.cluster.layout.node(0)
    }

    /// A namespace for one test, deleted when the guard drops.
    pub fn namespace(&self, prefix: &str) -> Namespace {
        let name = format!(
            "t-{prefix}-{:x}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos())
        );
        self.kubectl
            .run(&["create", "namespace", &name])
            .unwrap_or_else(|e| panic!("creating namespace {name}: {e:#}"));
        // The namespace's default service account must exist before pods can be created.
        self.kubectl
            .wait_for(
                "the namespace's default service account",
                Duration::from_secs(30),
                |k| {
                    Ok(k.call(
                        &["-n", &name, "get", "serviceaccount", "default"],
                        None,
                        Duration::from_secs(10),
                    )?
                    .success
                    .then_some(()))
                },
            )
            .unwrap_or_else(|e| panic!("{e:#}"));
        Namespace {
            name,
            kubectl: self.kubectl.clone(),
        }
    }

    /// The agent pod on `node` of DaemonSet instance `instance` (`node-agent`, or
    /// `node-agent-enforce`), running and not terminating; the newest, when a rollout's surge
    /// has put a new one beside the old (a new agent that never gets Ready stays beside it).
    pub fn agent_pod(&self, node: &str, instance: &str) -> anyhow::Result<String> {
        self.running_agent_pods(instance)?
            .iter()
            .filter(|p| p["spec"]["nodeName"] == node)
            // RFC 3339 in UTC at one-second precision: ordered as text.
            .max_by_key(|p| {
                p["metadata"]["creationTimestamp"]
                    .as_str()
                    .unwrap_or("")
                    .to_string()
            })
            .and_then(|p| p["metadata"]["name"].as_str().map(str::to_string))
            .with_context(|| format!("no running pod of {instance} on {node}"))
    }

    /// The pods of DaemonSet instance `instance` (`node-agent`, or `node-agent-enforce`) on
    /// every node that are running and not terminating, as the API server lists them.
    pub fn running_agent_pods(&self, instance: &str) -> anyhow::Result<Vec<serde_json::Value>> {
        let pods = self.kubectl.get_json(&[
            "-n",
            AGENT_NS,
            "pods",
            "-l",
            &format!("app.kubernetes.io/instance={instance}"),
            "--field-selector",
            "status.phase=Running",
        ])?;
        Ok(pods["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .cloned()
            .collect())
    }

    /// The agent's `/metrics`, scraped as Prometheus scrapes it: at the pod's address, with
    /// a service account token the API server vouches for (`metricsAccess: kubernetes`, the
    /// default): [`RealCluster::metrics_token`]. (The API server's pod proxy drops the
    /// caller's credentials, so the agent would refuse it.)
    pub fn agent_metrics(&self, pod: &str) -> anyhow::Result<String> {
        let (code, body) = self.agent_get(pod, "/metrics", Some(&self.metrics_token()?))?;
        if code != 200 {
            bail!("GET /metrics of {pod} answered {code}: {body}");
        }
        Ok(body)
    }

    /// A GET of the agent pod's port 9464 from inside its node.
    pub fn agent_get(
        &self,
        pod: &str,
        path: &str,
        bearer: Option<&str>,
    ) -> anyhow::Result<(u16, String)> {
        let p = self.kubectl.get_json(&["-n", AGENT_NS, "pod", pod])?;
        let ip = p["status"]["podIP"]
            .as_str()
            .context("the agent pod has no IP yet")?;
        let node = p["spec"]["nodeName"]
            .as_str()
            .context("the agent pod is not bound")?;
        let index: u8 = node
            .rsplit('-')
            .next()
            .and_then(|i| i.parse().ok())
            .with_context(|| format!("{node} is not a node of this cluster"))?;
        let ns = self.cluster.node_ns(&self.cluster.layout.node(index))?;
        node_agent_cluster::node::http_get(ns, format!("{ip}:9464").parse()?, path, bearer)
    }

    /// A token of the tests' scraper, `node-agent-tests/scraper`, granted `get` on the agent's
    /// `/metrics` and `/readyz` (as deploy/components/monitoring grants Prometheus); made once.
    pub fn metrics_token(&self) -> anyhow::Result<String> {
        static TOKEN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        if let Some(t) = TOKEN.get() {
            return Ok(t.clone());
        }
        self.kubectl.apply(SCRAPER)?;
        let token = self
            .kubectl
            .run(&[
                "-n",
                "node-agent-tests",
                "create",
                "token",
                "scraper",
                "--duration=2h",
            ])?
            .trim()
            .to_string();
        Ok(TOKEN.get_or_init(|| token).clone())
    }

    /// One sample of `/metrics`: the value of the series whose name and labels start with
    /// `series` (e.g. `node_agent_evictions_total{eviction_signal="memory.available",result="dry_run"}`).
    pub fn metric(&self, pod: &str, series: &str) -> anyhow::Result<Option<f64>> {
        let text = self.agent_metrics(pod)?;
        Ok(metric_value(&text, series))
    }

    /// Every audit event the API server wrote since the test began ([`RealCluster::get`]),
    /// through its rotations. An error, never a shorter list, when the log no longer covers
    /// the window (the marked file rotated away) or holds a line that is not an event.
    pub fn audit_events(&self) -> anyhow::Result<Vec<Value>> {
        self.audit_mark
            .events_since(&self.cluster.layout.audit_log())
    }
}

/// A place in the API server's audit log: the file (by inode: a rotation renames it to
/// `audit-<time>.log`, inode kept) and an offset in it.
#[derive(Debug, Clone, Copy)]
pub struct AuditMark {
    inode: u64,
    offset: u64,
}

impl AuditMark {
    /// The end of the log now.
    pub fn now(log: &std::path::Path) -> anyhow::Result<Self> {
        use std::os::unix::fs::MetadataExt as _;
        let meta = std::fs::metadata(log).with_context(|| format!("reading {}", log.display()))?;
        Ok(Self {
            inode: meta.ino(),
            offset: meta.len(),
        })
    }

    /// The events written since the mark, oldest first: the rest of the marked file, then every
    /// later file (backups in their names' order, which is their time's, the current one last).
    pub fn events_since(&self, log: &std::path::Path) -> anyhow::Result<Vec<Value>> {
        use std::io::{Read as _, Seek as _};
        use std::os::unix::fs::MetadataExt as _;
        let dir = log.parent().context("the audit log is in a directory")?;
        let stem = log
            .file_stem()
            .and_then(|s| s.to_str())
            .context("the audit log's name")?;
        let mut backups: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("listing {}", dir.display()))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{stem}-")) && n.ends_with(".log"))
            })
            .collect();
        backups.sort();
        backups.push(log.to_path_buf());
        let files: Vec<(std::path::PathBuf, u64)> = backups
            .into_iter()
            .filter_map(|p| std::fs::metadata(&p).ok().map(|m| (p, m.ino())))
            .collect();
        let first = files
            .iter()
            .position(|(_, ino)| *ino == self.inode)
            .with_context(|| {
                format!(
                    "the audit log no longer covers the test's window: the file it began in (inode {}) is gone from {}",
                    self.inode,
                    dir.display()
                )
            })?;
        let mut events = Vec::new();
        let last = files.len() - 1;
        for (i, (path, _)) in files.iter().enumerate().skip(first) {
            let mut f =
                std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
            if i == first {
                f.seek(std::io::SeekFrom::Start(self.offset))?;
            }
            let mut buf = Vec::new();
            f.read_to_end(&mut buf)
                .with_context(|| format!("reading {}", path.display()))?;
            let mut lines: Vec<&[u8]> = buf.split(|b| *b == b'\n').collect();
            // The piece after the last newline: empty, or (the current file only) an event
            // still being written, read next time.
            let tail = lines.pop().unwrap_or_default();
            if !tail.is_empty() && i != last {
                anyhow::bail!("{} ends in a cut line", path.display());
            }
            for (n, line) in lines.iter().enumerate() {
                let event: Value = serde_json::from_slice(line).with_context(|| {
                    format!(
                        "{} holds a line that is not an audit event (line {} after the mark)",
                        path.display(),
                        n + 1
                    )
                })?;
                events.push(event);
            }
        }
        Ok(events)
    }
}

/// The value of the first sample whose text starts with `series`.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, v)| v.trim().parse().ok())
}

/// The last `cap` bytes of a file, as text.
pub fn read_tail(path: &std::path::Path, cap: u64) -> anyhow::Result<String> {
    use std::io::{Read as _, Seek as _};
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = f.metadata()?.len();
    f.seek(std::io::SeekFrom::Start(len.saturating_sub(cap)))?;
    let mut buf = Vec::new();
    f.take(cap).read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// A test's namespace; deleted (and waited for, bounded) when dropped.
pub struct Namespace {
    pub name: String,
    kubectl: Kubectl,
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = self.kubectl.call(
            &[
                "delete",
                "namespace",
                &self.name,
                "--wait=true",
                "--timeout=120s",
            ],
            None,
            Duration::from_secs(150),
        );
    }
}

/// QoS classes as the kubelet derives them from requests and limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

/// A pod of the workload image.
#[derive(Debug, Clone)]
pub struct WorkloadPod {
    pub name: String,
    pub qos: Qos,
    /// Memory request (and limit, for Guaranteed), e.g. `256Mi`.
    pub memory: String,
    pub args: Vec<String>,
    pub node: Option<String>,
    pub labels: Vec<(String, String)>,
    pub priority_class: Option<String>,
    /// Extra YAML lines under `spec:` (volumes, tolerations), indented by two spaces.
    pub extra_spec: Vec<String>,
    /// Extra YAML lines under the container (volumeMounts), indented by six spaces.
    pub extra_container: Vec<String>,
    pub memory_limit: Option<String>,
    /// The container's command instead of the image's entrypoint (`pod-workload`), e.g. a
    /// shell as PID 1.
    pub command: Option<Vec<String>>,
}

impl WorkloadPod {
    pub fn new(name: &str, qos: Qos, memory: &str, args: &[&str]) -> Self {
        Self {
            name: name.to_string(),
            qos,
            memory: memory.to_string(),
            args: args.iter().map(|s| s.to_string()).collect(),
            node: None,
            labels: Vec::new(),
            priority_class: None,
            extra_spec: Vec::new(),
            extra_container: Vec::new(),
            memory_limit: None,
            command: None,
        }
    }

    pub fn manifest(&self, namespace: &str) -> String {
        let resources = match self.qos {
            // Half a CPU: a CFS quota of 10m would throttle a growing pod to a few MiB/s.
            Qos::Guaranteed => format!(
                "      resources:\n        requests: {{cpu: 500m, memory: {m}}}\n        limits: {{cpu: 500m, memory: {m}}}\n",
                m = self.memory
            ),
            Qos::Burstable => {
                let limit = self
                    .memory_limit
                    .as_ref()
                    .map(|l| format!("\n        limits: {{memory: {l}}}"))
                    .unwrap_or_default();
                format!(
                    "      resources:\n        requests: {{cpu: 10m, memory: {}}}{limit}\n",
                    self.memory
                )
            }
            Qos::BestEffort => String::new(),
        };
        let args = self
            .args
            .iter()
            .map(|a| format!("{a:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut labels = format!("    app: {}\n", self.name);
        for (k, v) in &self.labels {
            labels.push_str(&format!("    {k}: {v:?}\n"));
        }
        let mut spec = String::new();
        if let Some(node) = &self.node {
            spec.push_str(&format!("  nodeName: {node}\n"));
        }
        if let Some(pc) = &self.priority_class {
            spec.push_str(&format!("  priorityClassName: {pc}\n"));
        }
        for line in &self.extra_spec {
            spec.push_str(line);
            spec.push('\n');
        }
        let mut container_extra = String::new();
        if let Some(command) = &self.command {
            let quoted: Vec<String> = command.iter().map(|c| format!("{c:?}")).collect();
            container_extra.push_str(&format!("      command: [{}]\n", quoted.join(", ")));
        }
        for line in &self.extra_container {
            container_extra.push_str(line);
            container_extra.push('\n');
        }
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {namespace}\n  labels:\n{labels}spec:\n  terminationGracePeriodSeconds: 2\n  restartPolicy: Never\n{spec}  containers:\n    - name: main\n      image: {WORKLOAD_IMAGE}\n      imagePullPolicy: Never\n      args: [{args}]\n{resources}{container_extra}",
            name = self.name,
        )
    }
}

/// Waits until every pod named is Running (bounded).
pub fn wait_running(
    kubectl: &Kubectl,
    namespace: &str,
    pods: &[&str],
    limit: Duration,
) -> anyhow::Result<()> {
    let start = Instant::now();
    for pod in pods {
        let left = limit.saturating_sub(start.elapsed());
        kubectl.wait_for(&format!("pod {namespace}/{pod} Running"), left, |k| {
            let p = k.get_json(&["-n", namespace, "pod", pod])?;
            match p["status"]["phase"].as_str() {
                Some("Running") => Ok(Some(())),
                Some("Failed") | Some("Succeeded") => bail!("pod {pod} ended: {}", p["status"]),
                _ => Ok(None),
            }
        })?;
    }
    Ok(())
}

/// A variant of the install, as an operator makes one: a kustomization over `cluster/overlay`
/// (deploy/'s base with this box's differences) with deploy/'s components and, optionally, a
/// config.yaml of the test's own through `configMapGenerator` (so a changed config is a
/// changed pod template, as in deploy/).
#[derive(Debug, Clone, Default)]
pub struct Variant {
    /// Components of deploy/, by directory name (`enforce`, `enforce-by-node-label`).
    pub components: Vec<String>,
    /// The agent's config.yaml, whole; None keeps deploy/config.yaml.
    pub config: Option<String>,
    /// Extra resources (YAML documents), applied with it.
    pub resources: Vec<String>,
    /// JSON patches (RFC 6902) on objects of the install, as `patches:` of the kustomization:
    /// a rule of the ClusterRole or a validation of the admission policy taken away.
    pub patches: Vec<Patch>,
    /// A strategic-merge patch of the DaemonSet node-agent (YAML), as an operator's overlay
    /// would carry one.
    pub daemonset_patch: Option<String>,
    /// Keep deploy/'s rollout as shipped (an agent Ready no sooner than 30 s after its start:
    /// the readiness probe's `initialDelaySeconds`). Otherwise the variant's agents are Ready
    /// as soon as `/readyz` says so: the tests that are not about rollouts would each wait 30 s
    /// per change of install for nothing they check.
    pub shipped_rollout: bool,
}

/// One JSON patch of a [`Variant`] on the object of `kind` named `name`.
#[derive(Debug, Clone)]
pub struct Patch {
    pub kind: String,
    pub name: String,
    /// The operations, e.g. `[{"op": "remove", "path": "/rules/1"}]`.
    pub operations: serde_json::Value,
}

impl Variant {
    pub fn enforcing() -> Self {
        Self {
            components: vec!["enforce".into()],
            ..Self::default()
        }
    }

    /// deploy/config.yaml with `replace` applied (each `(from, to)` must occur).
    pub fn shipped_config_with(replace: &[(&str, &str)]) -> String {
        let mut text = std::fs::read_to_string(workspace().join("deploy/config.yaml"))
            .expect("deploy/config.yaml");
        for (from, to) in replace {
            assert!(text.contains(from), "deploy/config.yaml has no {from:?}");
            text = text.replace(from, to);
        }
        text
    }

    /// deploy/config.yaml with `replace` applied and hard evictions asked through the API
    /// (`kubernetes.hardEviction: api`) instead of carried out on the node: for the tests of
    /// what only the API path meets (budgets, the override's grants, 429s and their retries).
    pub fn api_config_with(replace: &[(&str, &str)]) -> String {
        let mut all = replace.to_vec();
        all.push(("\nkubernetes:\n", "\nkubernetes:\n  hardEviction: api\n"));
        Self::shipped_config_with(&all)
    }

    /// [`Variant::enforcing`] with [`Variant::api_config_with`]`(&[])`.
    pub fn enforcing_through_the_api() -> Self {
        Self {
            config: Some(Self::api_config_with(&[])),
            ..Self::enforcing()
        }
    }
}

/// The workspace root.
pub fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace")
        .to_path_buf()
}

impl RealCluster {
    /// Writes `variant`'s kustomization under the cluster directory and applies it
    /// (`kubectl apply -k`), pruning nothing; returns the rendered objects' kinds and names.
    pub fn apply_variant(&self, name: &str, variant: &Variant) -> anyhow::Result<String> {
        let dir = self.cluster.layout.dir.join("variants").join(name);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(&dir)?;
        // Relative paths from the variant's directory: kustomize loads bases and components
        // by directory.
        let root = workspace();
        let up = |target: &std::path::Path| -> String { relative(&dir, target) };
        let mut text = String::from(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n",
        );
        text.push_str(&format!("  - {}\n", up(&root.join("cluster/overlay"))));
        for (i, doc) in variant.resources.iter().enumerate() {
            let file = format!("extra-{i}.yaml");
            std::fs::write(dir.join(&file), doc)?;
            text.push_str(&format!("  - {file}\n"));
        }
        if !variant.components.is_empty() {
            // A user enables components in deploy/kustomization.yaml, whose `images:` then
            // reaches the DaemonSets they add; here they are added one level up, so that
            // level names the image as deploy/ does.
            text.push_str(&deploy_images_block(&root)?);
            text.push_str("components:\n");
            for c in &variant.components {
                text.push_str(&format!(
                    "  - {}\n",
                    up(&root.join("deploy/components").join(c))
                ));
            }
        }
        let mut patches = String::new();
        if let Some(patch) = &variant.daemonset_patch {
            std::fs::write(dir.join("daemonset-patch.yaml"), patch)?;
            patches.push_str(
                "  - path: daemonset-patch.yaml\n    target: {kind: DaemonSet, name: node-agent}\n",
            );
        }
        if !variant.shipped_rollout {
            patches.push_str("  - target: {kind: DaemonSet}\n    patch: |-\n      - op: replace\n        path: /spec/template/spec/containers/0/readinessProbe/initialDelaySeconds\n        value: 0\n");
        }
        for p in &variant.patches {
            // JSON is YAML: the operations as one double-quoted scalar.
            let ops = serde_json::to_string(&p.operations.to_string())?;
            patches.push_str(&format!(
                "  - target: {{kind: {}, name: {}}}\n    patch: {ops}\n",
                p.kind, p.name
            ));
        }
        if !patches.is_empty() {
            text.push_str("patches:\n");
            text.push_str(&patches);
        }
        if let Some(config) = &variant.config {
            std::fs::write(dir.join("config.yaml"), config)?;
            text.push_str("configMapGenerator:\n  - name: node-agent-config\n    namespace: node-agent\n    behavior: replace\n    files:\n      - config.yaml\n");
        }
        std::fs::write(dir.join("kustomization.yaml"), text)?;
        let out = self.kubectl.call(
            &["apply", "-k", &dir.to_string_lossy()],
            None,
            Duration::from_secs(120),
        )?;
        if !out.success {
            bail!("kubectl apply -k {}: {}", dir.display(), out.stderr.trim());
        }
        Ok(out.stdout)
    }

    /// Applies `variant` and waits until every DaemonSet of the agent has rolled out and its
    /// pods are Ready.
    pub fn install(&self, name: &str, variant: &Variant) -> anyhow::Result<()> {
        self.apply_variant(name, variant)?;
        self.wait_rolled_out()
    }

    /// Waits until every DaemonSet of the agent has rolled out: `kubectl rollout status`, then
    /// one Ready agent pod per node and none terminating.
    pub fn wait_rolled_out(&self) -> anyhow::Result<()> {
        for ds in self.agent_daemonsets()? {
            self.cluster
                .wait_agent_ready(&ds, Duration::from_secs(240))?;
            self.kubectl.run(&[
                "-n",
                AGENT_NS,
                "rollout",
                "status",
                &format!("daemonset/{ds}"),
                "--timeout=240s",
            ])?;
        }
        // A surge leaves the old pod beside the new one until the new one is available: the
        // rollout is over when every node has one agent pod, Ready, and none is terminating.
        self.kubectl.wait_for(
            "one Ready agent pod per node",
            Duration::from_secs(120),
            |k| {
                let pods = k.get_json(&["-n", AGENT_NS, "pods"])?;
                let mut per_node: std::collections::BTreeMap<String, (usize, bool)> =
                    Default::default();
                for p in pods["items"].as_array().into_iter().flatten() {
                    let node = p["spec"]["nodeName"].as_str().unwrap_or("").to_string();
                    let ready = p["metadata"]["deletionTimestamp"].is_null()
                        && p["status"]["conditions"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True");
                    let entry = per_node.entry(node).or_insert((0, true));
                    entry.0 += 1;
                    entry.1 &= ready;
                }
                Ok(
                    (!per_node.is_empty() && per_node.values().all(|(n, r)| *n == 1 && *r))
                        .then_some(()),
                )
            },
        )
    }

    /// The base install (deploy/ in dry run), as `cargo xtask cluster up` left it: the
    /// enforcing DaemonSet of enforce-by-node-label deleted if a test made it.
    pub fn restore_base(&self) -> anyhow::Result<()> {
        let _ = self.kubectl.call(
            &[
                "-n",
                AGENT_NS,
                "delete",
                "daemonset",
                "node-agent-enforce",
                "--ignore-not-found",
                "--wait=true",
            ],
            None,
            Duration::from_secs(120),
        );
        self.install("base", &Variant::default())
    }

    /// The agent's DaemonSets deleted and their pods gone (README's first step of an
    /// uninstall): no agent outlives its credentials.
    pub fn delete_agent_daemonsets(&self) -> anyhow::Result<()> {
        self.kubectl.run(&[
            "-n",
            AGENT_NS,
            "delete",
            "daemonsets",
            "-l",
            "app.kubernetes.io/name=node-agent",
            "--cascade=foreground",
            "--wait=true",
            "--timeout=180s",
        ])?;
        Ok(())
    }

    /// The agent's DaemonSets' names.
    pub fn agent_daemonsets(&self) -> anyhow::Result<Vec<String>> {
        let list = self.kubectl.get_json(&["-n", AGENT_NS, "daemonsets"])?;
        Ok(list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| d["metadata"]["name"].as_str().map(str::to_string))
            .collect())
    }

    /// The logs of an agent pod (its current container; capped by kubectl's --limit-bytes).
    pub fn agent_logs(&self, pod: &str) -> anyhow::Result<String> {
        self.kubectl
            .run(&["-n", AGENT_NS, "logs", pod, "--limit-bytes=8000000"])
    }

    /// Restores the base install when dropped (also when the test failed).
    pub fn base_on_drop(&self) -> RestoreBase<'_> {
        RestoreBase(self)
    }
}

/// See [`RealCluster::base_on_drop`].
pub struct RestoreBase<'a>(&'a RealCluster);

impl Drop for RestoreBase<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.0.restore_base() {
            eprintln!("restoring the base install: {e:#}");
        }
    }
}

/// `target` relative to `from` (both absolute).
fn relative(from: &std::path::Path, target: &std::path::Path) -> String {
    let from: Vec<_> = from.components().collect();
    let to: Vec<_> = target.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<String> =
        std::iter::repeat_n("..".to_string(), from.len() - common).collect();
    parts.extend(
        to[common..]
            .iter()
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    parts.join("/")
}

impl RealCluster {
    /// The agent's headroom on `allocatableMemory.available`, in MiB, from its /metrics.
    pub fn allocatable_headroom_mib(&self, agent: &str) -> anyhow::Result<f64> {
        let bytes = self
            .metric(
                agent,
                "node_agent_signal_available_bytes{eviction_signal=\"allocatableMemory.available\"}",
            )?
            .context("the agent exports no allocatableMemory.available")?;
        Ok(bytes / 1048576.0)
    }

    /// Waits until every named pod's workload printed `phase=held` (it holds its memory).
    pub fn wait_held(&self, namespace: &str, pods: &[&str], limit: Duration) -> anyhow::Result<()> {
        self.kubectl
            .wait_for("the pods hold their memory", limit, |k| {
                for pod in pods {
                    if !k
                        .run(&["-n", namespace, "logs", pod])?
                        .contains("phase=held")
                    {
                        return Ok(None);
                    }
                }
                Ok(Some(()))
            })
    }

    /// Starts `name`, a Guaranteed pod that grows (at `rate` MiB/s) until the node's
    /// allocatable headroom is `left_mib` (the agent's line is 200 MiB, the kubelet's 100),
    /// within its own request, so that it never ranks first; waits until it runs.
    pub fn grow_to_headroom(
        &self,
        namespace: &str,
        node: &str,
        agent: &str,
        name: &str,
        left_mib: f64,
        rate: u64,
    ) -> anyhow::Result<u64> {
        // The agent's exported figure is as old as its last evaluation (up to a resyncInterval
        // when nothing crosses): read the same quantity fresh, the pods cgroup's limit less its
        // working set (what the kubelet and the agent measure against), and take the smaller.
        let spec = self
            .cluster
            .nodes()
            .into_iter()
            .find(|n| n.name == node)
            .with_context(|| format!("no node {node}"))?;
        let fresh = crate::real_node::pods_cgroup_available(&spec)? / 1048576.0;
        let headroom = fresh.min(self.allocatable_headroom_mib(agent)?);
        let target = (headroom - left_mib).floor();
        if target < 64.0 {
            bail!("no room to grow: headroom {headroom:.0} MiB");
        }
        let target = target as u64;
        let mut grower = WorkloadPod::new(
            name,
            Qos::Guaranteed,
            &format!("{}Mi", target + 64),
            &["memory", &target.to_string(), &rate.to_string()],
        );
        grower.node = Some(node.to_string());
        self.kubectl.apply(&grower.manifest(namespace))?;
        wait_running(&self.kubectl, namespace, &[name], Duration::from_secs(90))?;
        Ok(target)
    }

    /// Waits until `pod` is gone from the API (deleted, as an eviction leaves it).
    pub fn wait_gone(&self, namespace: &str, pod: &str, limit: Duration) -> anyhow::Result<()> {
        self.kubectl
            .wait_for(&format!("pod {namespace}/{pod} gone"), limit, |k| {
                let out = k.call(
                    &["-n", namespace, "get", "pod", pod],
                    None,
                    Duration::from_secs(10),
                )?;
                Ok((!out.success && out.stderr.contains("NotFound")).then_some(()))
            })
    }

    /// The eviction requests the audit log holds for pods of `namespace`: (pod, answer code,
    /// user), in order.
    pub fn eviction_requests(&self, namespace: &str) -> anyhow::Result<Vec<(String, i64, String)>> {
        Ok(self
            .audit_events()?
            .iter()
            .filter(|e| {
                e["objectRef"]["subresource"] == "eviction"
                    && e["objectRef"]["namespace"] == namespace
                    && e["stage"] == "ResponseComplete"
            })
            .map(|e| {
                (
                    e["objectRef"]["name"].as_str().unwrap_or("").to_string(),
                    e["responseStatus"]["code"].as_i64().unwrap_or(0),
                    e["user"]["username"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect())
    }
}

/// One of the agent's writes that end a pod: an Eviction through the API, or the record of a
/// kill on the node (its status patched `Failed`, `Evicted`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentEnd {
    pub pod: String,
    /// `eviction` or `status`.
    pub kind: &'static str,
    pub code: i64,
    pub at: String,
}

impl RealCluster {
    /// The agent's writes that end pods of `namespace` (its Evictions and the records of its
    /// kills on the node), in the audit log's order.
    pub fn agent_pod_ends(&self, namespace: &str) -> anyhow::Result<Vec<AgentEnd>> {
        Ok(self
            .audit_events()?
            .iter()
            .filter(|e| {
                e["objectRef"]["namespace"] == namespace
                    && e["objectRef"]["resource"] == "pods"
                    && e["user"]["username"] == AGENT_SA
                    && e["stage"] == "ResponseComplete"
            })
            .filter_map(|e| {
                let kind = match (e["objectRef"]["subresource"].as_str(), e["verb"].as_str()) {
                    (Some("eviction"), Some("create")) => "eviction",
                    (Some("status"), Some("patch")) => "status",
                    _ => return None,
                };
                Some(AgentEnd {
                    pod: e["objectRef"]["name"].as_str().unwrap_or("").to_string(),
                    kind,
                    code: e["responseStatus"]["code"].as_i64().unwrap_or(0),
                    at: e["requestReceivedTimestamp"]
                        .as_str()
                        .unwrap_or("")
                        .to_string(),
                })
            })
            .collect())
    }

    /// Waits until `pod` was killed on the node by the agent and recorded: `Failed` with the
    /// kubelet's `DisruptionTarget` condition (reason `TerminationByKubelet`), its status
    /// written by the agent's account. Not `reason: Evicted`: the agent writes it, but the
    /// kubelet's status manager may drop it a moment later (its first terminal status of a pod
    /// whose terminal phase someone else set carries no reason; whether its final one takes the
    /// API's back is a race), as it drops it from its own evictions whose containers exit on
    /// SIGTERM. The condition is the record that stays.
    pub fn wait_killed_by_agent(
        &self,
        namespace: &str,
        pod: &str,
        limit: Duration,
    ) -> anyhow::Result<Value> {
        self.kubectl.wait_for(
            &format!("pod {namespace}/{pod} killed by the agent"),
            limit,
            |k| {
                let p = k.get_json(&["-n", namespace, "pod", pod])?;
                let status = &p["status"];
                let condition = disruption_target(&p);
                let recorded = status["phase"] == "Failed"
                    && condition["status"] == "True"
                    && condition["reason"] == "TerminationByKubelet";
                if !recorded {
                    return Ok(None);
                }
                let by_agent = self
                    .agent_pod_ends(namespace)?
                    .iter()
                    .any(|e| e.pod == pod && e.kind == "status" && e.code == 200);
                Ok(by_agent.then_some(p))
            },
        )
    }

    /// Waits until `pod` is gone (the agent's eviction deletes it) or Failed with reason
    /// Evicted (the kubelet's leaves it so).
    pub fn wait_gone_or_failed(
        &self,
        namespace: &str,
        pod: &str,
        limit: Duration,
    ) -> anyhow::Result<()> {
        self.kubectl
            .wait_for(&format!("pod {namespace}/{pod} evicted"), limit, |k| {
                let out = k.call(
                    &["-n", namespace, "get", "pod", pod, "-o", "json"],
                    None,
                    Duration::from_secs(10),
                )?;
                if !out.success {
                    return Ok(out.stderr.contains("NotFound").then_some(()));
                }
                let p: Value = serde_json::from_str(&out.stdout)?;
                Ok(evicted_by_kubelet(&p).then_some(()))
            })
    }
}

/// `pod`'s (its JSON) `DisruptionTarget` condition, or `Null` when it has none.
pub fn disruption_target(pod: &Value) -> Value {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "DisruptionTarget")
        .cloned()
        .unwrap_or_default()
}

/// Whether the kubelet ended `pod` (its JSON) by an eviction: `Failed` with reason `Evicted`,
/// or, as Kubernetes 1.37's kubelet leaves a pod whose containers exit 0 on SIGTERM (the
/// workload does), ended with the `DisruptionTarget` condition of reason
/// `TerminationByKubelet`.
pub fn evicted_by_kubelet(pod: &Value) -> bool {
    let status = &pod["status"];
    let failed_evicted = status["phase"] == "Failed" && status["reason"] == "Evicted";
    let ended = status["phase"] == "Failed" || status["phase"] == "Succeeded";
    let disrupted = disruption_target(pod)["reason"] == "TerminationByKubelet";
    failed_evicted || (ended && disrupted)
}

/// deploy/kustomization.yaml's `images:` block, as written there.
fn deploy_images_block(root: &std::path::Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(root.join("deploy/kustomization.yaml"))?;
    let mut block = String::new();
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with("images:") {
            inside = true;
        } else if inside && !(line.starts_with(' ') || line.starts_with('-')) {
            break;
        }
        if inside {
            block.push_str(line);
            block.push('\n');
        }
    }
    anyhow::ensure!(
        !block.is_empty(),
        "deploy/kustomization.yaml has no images: block"
    );
    Ok(block)
}
