//! One end-to-end test's world: the fake cluster (kubelet and API server), its pods' cgroups
//! below a test node cgroup, the config file and the daemon, shared by the daemon's end-to-end
//! test files. Everything goes on drop.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use node_agent_kube::fake::Fake;

use crate::{
    fake_cluster::{
        free_port, responder, wait_until, Answered, ClusterState, Config, Daemon, PodSpec,
        SharedCluster, NODE,
    },
    move_into, scaled, AgentProcess, Helper, TestCgroup,
};

/// How long a test waits for what the daemon does: 10 s, scaled under emulation (the VM tests).
pub fn wait() -> Duration {
    scaled(Duration::from_secs(10))
}

/// One test's world: the fake cluster, its pods' cgroups below a test node cgroup, the
/// config file and the daemon. Everything goes on drop.
pub struct World {
    pub state: SharedCluster,
    pub fake: Fake,
    pub node: TestCgroup,
    pub dir: PathBuf,
    pub config: PathBuf,
    pub socket: PathBuf,
    pub port: u16,
    pub pods: Vec<(PodSpec, PathBuf)>,
    /// The `mem-helper` binary (`env!("CARGO_BIN_EXE_mem-helper")` of the test).
    mem_helper: &'static str,
    _rt: tokio::runtime::Runtime,
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl World {
    pub fn new(label: &str, pods: &[PodSpec], mem_helper: &'static str) -> anyhow::Result<World> {
        let rt = tokio::runtime::Runtime::new()?;
        let state = SharedCluster::default();
        state.lock().unwrap().pods = pods.iter().map(PodSpec::json).collect();
        let fake = rt.block_on(Fake::start(responder(state.clone())));
        let node = TestCgroup::new(label)?;
        let pods = pods
            .iter()
            .map(|p| Ok((p.clone(), p.cgroup(&node)?)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let dir =
            std::env::temp_dir().join(format!("node-agent-e2e-{label}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(World {
            socket: dir.join("trace.sock"),
            config: dir.join("config.yaml"),
            port: free_port()?,
            state,
            fake,
            node,
            dir,
            pods,
            mem_helper,
            _rt: rt,
        })
    }

    /// The config with the test's `kubernetes:` and top-level lines; evictions paced at 60 a
    /// minute, and hard ones carried out through the API, unless the test says otherwise:
    /// these tests are about the eviction requests and the API server's answers; the kill on
    /// the node has its own (`kill_e2e.rs`).
    pub fn config(&self, kube: &str, agent: &str) -> String {
        self.config_with_threshold("824Mi", kube, agent)
    }

    pub fn config_with_threshold(&self, threshold: &str, kube: &str, agent: &str) -> String {
        let mut kube = kube.to_string();
        if !kube.contains("evictionsPerMinute") {
            kube = format!("  evictionsPerMinute: 60\n{kube}");
        }
        if !kube.contains("hardEviction") {
            kube = format!("  hardEviction: api\n{kube}");
        }
        Config {
            fake: &self.fake,
            node: &self.node,
            socket: &self.socket,
            port: self.port,
            threshold,
            kube: &kube,
            agent,
        }
        .text()
    }

    pub fn start(&self, kube: &str, agent: &str) -> anyhow::Result<Daemon> {
        self.start_text(&self.config(kube, agent))
    }

    /// Starts the daemon with this config text, once it has the pods.
    pub fn start_text(&self, text: &str) -> anyhow::Result<Daemon> {
        std::fs::write(&self.config, text)?;
        let daemon = Daemon::start(&self.config, self.port)?;
        self.pods_known(daemon)
    }

    /// [`Self::start_text`] for a config whose pod refresh is far off: the pods are known
    /// once the kubelet was asked once, at start.
    pub fn start_text_listed_once(&self, text: &str) -> anyhow::Result<Daemon> {
        std::fs::write(&self.config, text)?;
        let lists = self.cluster().pod_lists;
        let daemon = Daemon::start(&self.config, self.port)?;
        wait_until(wait(), "the pod list fetch at start", || {
            self.cluster().pod_lists > lists
        })?;
        Ok(daemon)
    }

    /// [`Self::start_text`], the agent PID 1 of a PID namespace of its own (a pod without
    /// `hostPID`).
    pub fn start_text_in_pid_namespace(&self, text: &str) -> anyhow::Result<Daemon> {
        std::fs::write(&self.config, text)?;
        let daemon = Daemon::start_in_pid_namespace(&self.config, self.port)?;
        self.pods_known(daemon)
    }

    fn pods_known(&self, daemon: Daemon) -> anyhow::Result<Daemon> {
        // The pods are known once the kubelet was asked twice since start.
        let lists = self.cluster().pod_lists;
        wait_until(wait(), "two pod list fetches", || {
            self.cluster().pod_lists >= lists + 2
        })?;
        Ok(daemon)
    }

    pub fn reload(&self, daemon: &mut Daemon, kube: &str, agent: &str) -> anyhow::Result<()> {
        let before = daemon.log_count("config reloaded");
        std::fs::write(&self.config, self.config(kube, agent))?;
        daemon.process.signal(libc::SIGHUP);
        daemon.wait_logs("config reloaded", before + 1, wait())?;
        Ok(())
    }

    pub fn cluster(&self) -> std::sync::MutexGuard<'_, ClusterState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn dir_of(&self, name: &str) -> &Path {
        &self
            .pods
            .iter()
            .find(|(p, _)| p.name == name)
            .expect("a pod of this world")
            .1
    }

    /// A helper holding `mib` MiB in the named pod's container cgroup.
    pub fn load(&self, name: &str, mib: u32) -> anyhow::Result<Helper> {
        let mut helper = Helper::spawn(self.mem_helper, &["hold".into(), mib.to_string()])?;
        move_into(self.dir_of(name), helper.pid())?;
        helper.go()?;
        anyhow::ensure!(
            helper.read_line()? == "held",
            "the helper in {name} did not hold its memory"
        );
        Ok(helper)
    }

    /// The paths of eviction requests so far.
    pub fn evictions(&self) -> Vec<(String, u16)> {
        self.cluster()
            .evictions()
            .iter()
            .map(|a| (a.path.clone(), a.status))
            .collect()
    }

    /// The first `Evicted` event posted, once there is one.
    pub fn evicted_event(&self) -> anyhow::Result<Answered> {
        let find = || {
            self.cluster()
                .answered
                .iter()
                .find(|a| a.body["reason"] == "Evicted")
                .cloned()
        };
        wait_until(wait(), "the Evicted event", || find().is_some())?;
        find().ok_or_else(|| anyhow::anyhow!("the Evicted event went away"))
    }

    /// How many times the Node was read.
    pub fn node_reads(&self) -> usize {
        let path = format!("/api/v1/nodes/{NODE}");
        self.fake
            .calls()
            .iter()
            .filter(|(m, p)| m == "GET" && *p == path)
            .count()
    }

    pub fn assert_nothing_refused(&self) {
        assert!(
            self.fake.rejected().is_empty(),
            "the API server would have refused: {:?}",
            self.fake.rejected()
        );
    }
}

/// Reads the trace until an eviction; whether a memory line on kubepods was crossed upwards
/// before it.
pub fn eviction_after_kubepods_crossing(
    trace: &AgentProcess,
) -> anyhow::Result<(serde_json::Value, bool)> {
    let mut crossed_on_kubepods = false;
    loop {
        let v = trace.json.recv_timeout(wait())?;
        match v["kind"].as_str() {
            Some("memory_threshold") if v["direction"] == "up" => {
                crossed_on_kubepods |= v["cgroup"]["path"]
                    .as_str()
                    .is_some_and(|p| p.ends_with("/kubepods"));
            }
            Some("eviction") => return Ok((v, crossed_on_kubepods)),
            _ => {}
        }
    }
}
