//! The Helm chart (deploy/chart) on the real cluster, with the real Helm (built from its Go
//! module, HELM): installed, upgraded with a new config (rolled node by node), upgraded with a
//! config the agent refuses (the rollout stops, every node keeps its agent), rolled back, and
//! uninstalled as the README says, leaving the node's condition and taint as its table does.
//! Each test takes the kustomize install off first (the chart's objects have the same names)
//! and puts it back when it ends, failed or not.

use std::{
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use node_agent_tests::{
    real_cluster::{workspace, RealCluster, Variant, AGENT_NS},
    real_node::{condition, pressure_taint},
};
use serde_json::Value;

/// The kinds the agent's install is made of (every object carries
/// `app.kubernetes.io/name: node-agent`).
const NAMESPACED: &str = "daemonsets,configmaps,serviceaccounts,services,networkpolicies";
const CLUSTER_SCOPED: &str = "clusterroles,clusterrolebindings,validatingadmissionpolicies,validatingadmissionpolicybindings";

/// The chart installed in place of the kustomize install for one test; uninstalled, and the
/// kustomize install put back, when dropped.
struct Release<'a> {
    rc: &'a RealCluster,
}

impl<'a> Release<'a> {
    /// Takes the kustomize install off (its namespace stays, labelled as the agent needs).
    fn take_over(rc: &'a RealCluster) -> anyhow::Result<Self> {
        let release = Self { rc };
        release.remove_every_object()?;
        Ok(release)
    }

    fn remove_every_object(&self) -> anyhow::Result<()> {
        self.rc.delete_agent_daemonsets()?;
        self.rc.kubectl.run(&[
            "-n",
            AGENT_NS,
            "delete",
            NAMESPACED,
            "-l",
            "app.kubernetes.io/name=node-agent",
            "--wait=true",
            "--timeout=120s",
        ])?;
        self.rc.kubectl.run(&[
            "delete",
            CLUSTER_SCOPED,
            "-l",
            "app.kubernetes.io/name=node-agent",
            "--wait=true",
            "--timeout=120s",
        ])?;
        Ok(())
    }

    /// `helm ARGS --kubeconfig <the cluster's admin>`: stdout, or an error with both streams.
    fn helm(&self, args: &[&str], bound: Duration) -> anyhow::Result<String> {
        let helm =
            std::env::var("HELM").expect("HELM names Helm (set by `cargo xtask cluster test`)");
        let kubeconfig = self.rc.cluster.layout.admin_kubeconfig();
        let mut cmd = Command::new(helm);
        cmd.args(args)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let shown = format!("helm {}", args.join(" "));
        let child = cmd.spawn()?;
        let out = node_agent_tests::output_within(child, bound, &shown)?;
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        if out.status.success() {
            Ok(stdout)
        } else {
            anyhow::bail!("{shown}: {}\n{stdout}{stderr}", out.status)
        }
    }

    /// `helm install|upgrade node-agent deploy/chart` with the cluster's agent image and
    /// `values`, waiting at most `wait` for the rollout (`--wait`).
    fn deploy(&self, verb: &str, values: &[&str], wait: Duration) -> anyhow::Result<String> {
        let chart = chart();
        let (repository, tag) = image();
        let image = format!("image.repository={repository},image.tag={tag}");
        let timeout = format!("{}s", wait.as_secs());
        let mut args = vec![
            verb,
            "node-agent",
            chart.to_str().expect("UTF-8 path"),
            "--namespace",
            AGENT_NS,
            "--set",
            &image,
            "--wait",
            "--timeout",
            &timeout,
        ];
        args.extend_from_slice(values);
        self.helm(&args, wait + Duration::from_secs(60))
    }

    /// `helm uninstall`, waiting for what it deletes to go.
    fn uninstall(&self) -> anyhow::Result<String> {
        self.helm(
            &[
                "uninstall",
                "node-agent",
                "--namespace",
                AGENT_NS,
                "--wait",
                "--timeout",
                "180s",
            ],
            Duration::from_secs(240),
        )
    }

    /// `helm status`'s JSON.
    fn status(&self) -> anyhow::Result<Value> {
        let text = self.helm(
            &[
                "status",
                "node-agent",
                "--namespace",
                AGENT_NS,
                "-o",
                "json",
            ],
            Duration::from_secs(60),
        )?;
        Ok(serde_json::from_str(&text)?)
    }
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        let _ = self.uninstall();
        if let Err(e) = self.remove_every_object() {
            eprintln!("removing what the chart left: {e:#}");
        }
        if let Err(e) = self.rc.restore_base() {
            eprintln!("restoring the kustomize install: {e:#}");
        }
    }
}

fn chart() -> PathBuf {
    workspace().join("deploy/chart")
}

/// The agent's image on the cluster's nodes (NODE_AGENT_IMAGE), as repository and tag.
fn image() -> (String, String) {
    let reference = std::env::var("NODE_AGENT_IMAGE")
        .expect("NODE_AGENT_IMAGE names the agent's image (set by `cargo xtask cluster test`)");
    let (repository, tag) = reference
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("NODE_AGENT_IMAGE {reference:?} has no tag"));
    (repository.to_string(), tag.to_string())
}

/// An agent pod not being deleted.
#[derive(Debug)]
struct Agent {
    name: String,
    node: String,
    ready: bool,
    dry_run: bool,
    /// The config's hash its pod template carries.
    config: String,
}

/// The agent pods not being deleted.
fn agents(rc: &RealCluster) -> anyhow::Result<Vec<Agent>> {
    let pods = rc.kubectl.get_json(&[
        "-n",
        AGENT_NS,
        "pods",
        "-l",
        "app.kubernetes.io/name=node-agent",
    ])?;
    Ok(pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| {
            let ready = p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            let dry = p["spec"]["containers"][0]["args"]
                .as_array()
                .is_some_and(|a| a.iter().any(|x| x == "--dry-run"));
            Agent {
                name: p["metadata"]["name"].as_str().unwrap_or("").to_string(),
                node: p["spec"]["nodeName"].as_str().unwrap_or("").to_string(),
                ready,
                dry_run: dry,
                config: p["metadata"]["annotations"]["node-agent.io/config-sha256"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
            }
        })
        .collect())
}

/// Fails unless every node has exactly one agent pod, Ready, with these traits.
fn assert_one_ready_agent_per_node(rc: &RealCluster, dry_run: bool) -> anyhow::Result<String> {
    let pods = agents(rc)?;
    for node in rc.cluster.nodes() {
        let on: Vec<_> = pods.iter().filter(|p| p.node == node.name).collect();
        assert!(
            on.len() == 1 && on[0].ready && on[0].dry_run == dry_run,
            "{}: one Ready agent (dry run {dry_run}): {on:?}",
            node.name
        );
    }
    Ok(pods[0].config.clone())
}

/// A config of deploy/config.yaml's with `replace` applied, written under the cluster's
/// directory (removed with the cluster) where Helm reads it: `--set-file`'s argument.
fn config_file(rc: &RealCluster, name: &str, replace: &[(&str, &str)]) -> anyhow::Result<String> {
    let dir = rc.cluster.layout.dir.join("helm-configs");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, Variant::shipped_config_with(replace))?;
    Ok(format!("config={}", path.display()))
}

#[test]
fn helm_install_brings_a_ready_observing_agent_to_every_node() -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let release = Release::take_over(&rc)?;
    let conditions_before = rc
        .cluster
        .nodes()
        .iter()
        .map(|n| condition(&rc, &n.name, "NodeAgentPressure"))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let started = Instant::now();
    let out = release.deploy("install", &[], Duration::from_secs(300))?;
    eprintln!(
        "helm install (ready on {} nodes in {:.0?}):\n{out}",
        rc.cluster.nodes().len(),
        started.elapsed()
    );
    assert!(out.contains("STATUS: deployed"), "{out}");
    assert!(
        out.contains("OBSERVES ONLY"),
        "the notes say it observes: {out}"
    );
    assert_one_ready_agent_per_node(&rc, true)?;
    let status = release.status()?;
    assert_eq!(status["info"]["status"], "deployed", "{status}");
    eprintln!(
        "{}",
        rc.kubectl
            .run(&["-n", AGENT_NS, "get", "daemonsets,pods", "-o", "wide"])?
    );
    // What the release installed is the chart's: managed by Helm.
    let ds = rc
        .kubectl
        .get_json(&["-n", AGENT_NS, "daemonset", "node-agent"])?;
    assert_eq!(
        ds["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "Helm"
    );
    assert_eq!(
        ds["metadata"]["annotations"]["meta.helm.sh/release-name"],
        "node-agent"
    );
    // A dry-run agent writes neither condition nor taint (a condition an earlier agent left
    // stays as it was).
    for (node, before) in rc.cluster.nodes().iter().zip(conditions_before) {
        assert!(pressure_taint(&rc, &node.name)?.is_none());
        assert_eq!(
            condition(&rc, &node.name, "NodeAgentPressure")?,
            before,
            "{}: no condition written in dry run",
            node.name
        );
    }
    Ok(())
}

#[test]
fn helm_upgrade_rolls_a_new_config_out_node_by_node() -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let release = Release::take_over(&rc)?;
    release.deploy("install", &[], Duration::from_secs(300))?;
    let before = assert_one_ready_agent_per_node(&rc, true)?;
    let old: Vec<String> = agents(&rc)?.into_iter().map(|p| p.name).collect();
    let debug = config_file(&rc, "debug", &[("logLevel: info", "logLevel: debug")])?;
    let started = Instant::now();
    release.deploy("upgrade", &["--set-file", &debug], Duration::from_secs(300))?;
    eprintln!("the new config rolled out in {:.0?}", started.elapsed());
    let after = assert_one_ready_agent_per_node(&rc, true)?;
    assert_ne!(before, after, "the pods carry the new config's hash");
    let now = agents(&rc)?;
    assert!(
        now.iter().all(|p| !old.contains(&p.name)),
        "every pod is new: {old:?} -> {now:?}"
    );
    assert!(
        rc.agent_logs(&now[0].name)?.contains("DEBUG"),
        "the new pods run the new config"
    );
    assert_eq!(release.status()?["version"], 2);
    Ok(())
}

#[test]
fn a_refused_config_stops_the_helm_rollout_and_helm_rollback_takes_it_back() -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let release = Release::take_over(&rc)?;
    release.deploy("install", &[], Duration::from_secs(300))?;
    let good = assert_one_ready_agent_per_node(&rc, true)?;
    // A config the agent refuses at start: a duration without its unit.
    let refused = config_file(
        &rc,
        "refused",
        &[("podRefreshInterval: 2s", "podRefreshInterval: 2")],
    )?;
    let failed = release
        .deploy(
            "upgrade",
            &["--set-file", &refused],
            Duration::from_secs(75),
        )
        .expect_err("an upgrade whose agents never become ready fails");
    eprintln!("helm upgrade with the refused config: {failed:#}");
    assert_eq!(release.status()?["info"]["status"], "failed");
    // The rollout stopped on its first node; every node still has its old agent, Ready.
    let pods = agents(&rc)?;
    for node in rc.cluster.nodes() {
        assert!(
            pods.iter()
                .any(|p| p.node == node.name && p.ready && p.config == good),
            "{}: its old agent still runs, Ready: {pods:?}",
            node.name
        );
    }
    assert!(
        pods.iter().any(|p| !p.ready && p.config != good),
        "the refused agent is there, not ready: {pods:?}"
    );

    let out = release.helm(
        &[
            "rollback",
            "node-agent",
            "1",
            "--namespace",
            AGENT_NS,
            "--wait",
            "--timeout",
            "300s",
        ],
        Duration::from_secs(360),
    )?;
    eprintln!("helm rollback: {out}");
    let back = assert_one_ready_agent_per_node(&rc, true)?;
    assert_eq!(back, good, "the first revision's config again");
    let status = release.status()?;
    assert_eq!(
        (&status["info"]["status"], &status["version"]),
        (&Value::from("deployed"), &Value::from(3)),
        "{status}"
    );
    Ok(())
}

#[test]
fn helm_uninstall_after_the_daemonset_leaves_the_node_as_the_readme_says() -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let release = Release::take_over(&rc)?;
    release.deploy(
        "install",
        &["--set", "enforce=true"],
        Duration::from_secs(300),
    )?;
    assert_one_ready_agent_per_node(&rc, false)?;
    // An acting agent writes its condition (False: no pressure) on its first evaluation; a
    // condition an earlier agent left may say anything, so each node's is awaited as False.
    for node in rc.cluster.nodes() {
        rc.kubectl.wait_for(
            "the acting agent's condition, False",
            Duration::from_secs(60),
            |_| {
                Ok(condition(&rc, &node.name, "NodeAgentPressure")?
                    .filter(|c| c["status"] == "False")
                    .map(|_| ()))
            },
        )?;
    }
    // README's uninstall: the DaemonSet first (each agent stops with its credentials still
    // valid), then the release.
    rc.delete_agent_daemonsets()?;
    let out = release.uninstall()?;
    eprintln!("helm uninstall: {out}");
    for node in rc.cluster.nodes() {
        assert!(pressure_taint(&rc, &node.name)?.is_none(), "no taint left");
        let c = condition(&rc, &node.name, "NodeAgentPressure")?
            .unwrap_or_else(|| panic!("{}: the agent's condition", node.name));
        assert_eq!(
            (&c["status"], &c["reason"]),
            (&Value::from("Unknown"), &Value::from("AgentStopped")),
            "{}: {c}",
            node.name
        );
    }
    // Nothing of the release is left.
    let left = rc.kubectl.run(&[
        "get",
        &format!("{CLUSTER_SCOPED},{NAMESPACED}"),
        "-A",
        "-l",
        "app.kubernetes.io/name=node-agent",
        "-o",
        "name",
    ])?;
    assert!(left.trim().is_empty(), "left behind: {left}");
    let listed = release.helm(
        &["list", "--namespace", AGENT_NS, "-q"],
        Duration::from_secs(60),
    )?;
    assert!(listed.trim().is_empty(), "no release: {listed}");
    Ok(())
}
