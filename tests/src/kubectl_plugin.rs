//! `kubectl node-agent` on the real cluster, run as users run it: the cluster's kubectl finds
//! the plugin on PATH (`cargo xtask cluster test` builds it and names it in
//! `NODE_AGENT_PLUGIN`), with a kubeconfig in `KUBECONFIG`. Objects a test adds outside its
//! own namespace (RBAC in the agent's namespace, an edited config) are put back when their
//! guard drops, also when the test fails.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::mpsc::Receiver,
    time::Duration,
};

use anyhow::Context as _;
use node_agent_cluster::Kubectl;

use crate::real_cluster::{RealCluster, AGENT_NS};

/// The plugin, run through kubectl by one user.
#[derive(Debug, Clone)]
pub struct Plugin {
    kubectl: PathBuf,
    /// The directory holding `kubectl-node_agent`, put first on PATH.
    dir: PathBuf,
    pub kubeconfig: PathBuf,
}

/// What a finished run printed.
#[derive(Debug)]
pub struct Ran {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Plugin {
    /// As the cluster's admin. Panics (the test fails) without `NODE_AGENT_PLUGIN`.
    pub fn new(rc: &RealCluster) -> Plugin {
        let binary = PathBuf::from(std::env::var_os("NODE_AGENT_PLUGIN").expect(
            "NODE_AGENT_PLUGIN: run the real-cluster tests with `cargo xtask cluster test`, which builds kubectl-node_agent",
        ));
        assert!(
            binary
                .file_name()
                .is_some_and(|n| n == "kubectl-node_agent")
                && binary.is_file(),
            "NODE_AGENT_PLUGIN={} is not a kubectl-node_agent binary",
            binary.display()
        );
        Plugin {
            kubectl: rc.kubectl.binary.clone(),
            dir: binary
                .parent()
                .expect("a file has a directory")
                .to_path_buf(),
            kubeconfig: rc.kubectl.kubeconfig.clone(),
        }
    }

    /// As the user of another kubeconfig.
    pub fn as_user(&self, kubeconfig: impl Into<PathBuf>) -> Plugin {
        Plugin {
            kubeconfig: kubeconfig.into(),
            ..self.clone()
        }
    }

    /// `kubectl node-agent ARGS`: flags before the plugin's name would stop kubectl finding
    /// it, so the kubeconfig goes in KUBECONFIG.
    pub fn command(&self, args: &[&str]) -> Command {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs = vec![self.dir.clone()];
        dirs.extend(std::env::split_paths(&path));
        let mut cmd = Command::new(&self.kubectl);
        cmd.arg("node-agent")
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("PATH", std::env::join_paths(dirs).expect("PATH entries"));
        cmd
    }

    /// Runs to its end within `limit`.
    pub fn run(&self, args: &[&str], limit: Duration) -> anyhow::Result<Ran> {
        let child = self
            .command(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting kubectl node-agent")?;
        let out = crate::output_within(
            child,
            limit,
            &format!("kubectl node-agent {}", args.join(" ")),
        )?;
        Ok(Ran {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    /// Starts a command that runs on (`trace`); its stdout lines arrive on the channel, its
    /// stderr is kept in the returned [`Running`].
    pub fn start(&self, args: &[&str]) -> anyhow::Result<(Running, Receiver<String>)> {
        let mut child = self
            .command(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting kubectl node-agent")?;
        let stdout = child.stdout.take().context("stdout")?;
        let stderr = child.stderr.take().context("stderr")?;
        let lines = crate::lines(stdout, Some);
        let errors = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut { stderr }, &mut text);
            text
        });
        Ok((
            Running {
                child,
                errors: Some(errors),
            },
            lines,
        ))
    }
}

/// A running plugin; killed when dropped.
pub struct Running {
    child: Child,
    errors: Option<std::thread::JoinHandle<String>>,
}

impl Running {
    /// Waits at most `limit` for it to end; its exit and stderr.
    pub fn finish(mut self, limit: Duration) -> anyhow::Result<(bool, String)> {
        let deadline = std::time::Instant::now() + limit;
        let status = loop {
            if let Some(status) = self.child.try_wait()? {
                break status;
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "kubectl node-agent still running after {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let errors = self
            .errors
            .take()
            .map(|t| t.join().unwrap_or_default())
            .unwrap_or_default();
        Ok((status.success(), errors))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Objects applied for a test; deleted when dropped.
pub struct Applied {
    manifest: String,
    kubectl: Kubectl,
}

impl Applied {
    pub fn new(kubectl: &Kubectl, manifest: &str) -> anyhow::Result<Applied> {
        // The guard first: a half-applied manifest is deleted too.
        let guard = Applied {
            manifest: manifest.to_string(),
            kubectl: kubectl.clone(),
        };
        kubectl.apply(manifest)?;
        Ok(guard)
    }
}

impl Drop for Applied {
    fn drop(&mut self) {
        let _ = self.kubectl.call(
            &["delete", "--ignore-not-found", "--wait=false", "-f", "-"],
            Some(&self.manifest),
            Duration::from_secs(60),
        );
    }
}

/// The agent's ConfigMap (mounted by every agent, which reloads a change in place), edited
/// for a test and put back as it was when dropped. Both wait (bounded) until every agent has
/// reloaded, so no agent runs on the edit after the guard is gone.
pub struct AgentConfig {
    name: String,
    original: String,
    rc: RealCluster,
}

/// How long the kubelet may take to update a ConfigMap volume, and the agent to reload.
const RELOAD_LIMIT: Duration = Duration::from_secs(180);
const RELOADS: &str = "node_agent_config_reloads_total{result=\"ok\"}";

impl AgentConfig {
    /// The DaemonSet's ConfigMap, its `config.yaml` changed by `edit`; returns once every
    /// agent has reloaded it.
    pub fn edit(rc: &RealCluster, edit: impl Fn(&str) -> String) -> anyhow::Result<AgentConfig> {
        let ds = rc
            .kubectl
            .get_json(&["-n", AGENT_NS, "daemonset", "node-agent"])?;
        let name = ds["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|v| v["configMap"]["name"].as_str())
            .context("the DaemonSet mounts no ConfigMap")?
            .to_string();
        let cm = rc.kubectl.get_json(&["-n", AGENT_NS, "configmap", &name])?;
        let original = cm["data"]["config.yaml"]
            .as_str()
            .context("the ConfigMap has no config.yaml")?
            .to_string();
        let guard = AgentConfig {
            name,
            original,
            rc: rc.clone(),
        };
        let edited = edit(&guard.original);
        anyhow::ensure!(edited != guard.original, "the edit changes nothing");
        guard.put_and_wait(&edited)?;
        Ok(guard)
    }

    /// Writes `text` and waits until every agent running now has reloaded once more.
    fn put_and_wait(&self, text: &str) -> anyhow::Result<()> {
        let pods = self.agents()?;
        let before: Vec<f64> = pods
            .iter()
            .map(|p| Ok(self.rc.metric(p, RELOADS)?.unwrap_or(0.0)))
            .collect::<anyhow::Result<_>>()?;
        let patch = serde_json::json!({"data": {"config.yaml": text}}).to_string();
        self.rc.kubectl.run(&[
            "-n",
            AGENT_NS,
            "patch",
            "configmap",
            &self.name,
            "--type=merge",
            "-p",
            &patch,
        ])?;
        for (pod, before) in pods.iter().zip(before) {
            self.rc
                .kubectl
                .wait_for(&format!("{pod} reloads its config"), RELOAD_LIMIT, |_| {
                    match self.rc.metric(pod, RELOADS) {
                        Ok(now) => Ok((now.unwrap_or(0.0) > before).then_some(())),
                        // Gone meanwhile: a new agent starts on the ConfigMap as it is.
                        Err(_) if !self.agents()?.contains(pod) => Ok(Some(())),
                        Err(e) => Err(e),
                    }
                })?;
        }
        Ok(())
    }

    fn agents(&self) -> anyhow::Result<Vec<String>> {
        Ok(self
            .rc
            .running_agent_pods("node-agent")?
            .iter()
            .filter_map(|p| p["metadata"]["name"].as_str().map(String::from))
            .collect())
    }
}

impl Drop for AgentConfig {
    fn drop(&mut self) {
        if let Err(e) = self.put_and_wait(&self.original.clone()) {
            eprintln!("putting the agent's config back: {e:#}");
        }
    }
}
