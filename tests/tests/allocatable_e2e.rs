//! `allocatableMemory.available` against the Node's own `status.allocatable.memory`, end to
//! end: `agent.allocatable_memory` is not set, the figure lives only on the fake API server's
//! Node object (strict wire format), the memory is real, in pod cgroups of the kubelet's layout,
//! and the kernel line on kubepods reports the crossing. An absent field makes the signal
//! unknown, naming it; a change of the Node's figure moves the kernel line at once.

use std::{path::PathBuf, time::Duration};

use node_agent_kube::fake::Fake;
use node_agent_tests::{
    cluster::{
        attach_trace, free_port, responder, wait_until, ClusterState, Config, Daemon, PodSpec,
        SharedCluster, NODE,
    },
    move_into, require_root, scaled, AgentProcess, Helper, TestCgroup,
};
use serde_json::{json, Value};

const MEM_HELPER: &str = env!("CARGO_BIN_EXE_mem-helper");
const AVAILABLE: &str =
    "node_agent_signal_available_bytes{eviction_signal=\"allocatableMemory.available\"}";
const UNKNOWN: &str = "node_agent_signal_unknown{eviction_signal=\"allocatableMemory.available\"}";

fn wait() -> Duration {
    scaled(Duration::from_secs(10))
}

/// hog: far over its 16Mi request (ranked first); calm: within its 512Mi request.
fn pods() -> [PodSpec; 2] {
    [
        PodSpec::new(
            "shop",
            "hog",
            "1b4e28ba-2fa1-11d2-883f-0016d3cca427",
            "16Mi",
            'a',
        ),
        PodSpec::new(
            "shop",
            "calm",
            "6ba7b810-9dad-11d1-80b4-00c04fd430c8",
            "512Mi",
            'b',
        ),
    ]
}

/// The fake cluster, the pods' cgroups below a test node cgroup, the config file. Everything
/// goes on drop.
struct World {
    state: SharedCluster,
    fake: Fake,
    node: TestCgroup,
    dir: PathBuf,
    config: PathBuf,
    port: u16,
    pods: Vec<(PodSpec, PathBuf)>,
    _rt: tokio::runtime::Runtime,
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl World {
    /// `allocatable`: the Node's `status.allocatable.memory`, absent when `None`.
    fn new(label: &str, allocatable: Option<&str>) -> anyhow::Result<World> {
        let rt = tokio::runtime::Runtime::new()?;
        let state = SharedCluster::default();
        {
            let mut s = state.lock().unwrap();
            s.pods = pods().iter().map(PodSpec::json).collect();
            set_allocatable(&s, allocatable);
        }
        let fake = rt.block_on(Fake::start(responder(state.clone())));
        let node = TestCgroup::new(label)?;
        let pods = pods()
            .iter()
            .map(|p| Ok((p.clone(), p.cgroup(&node)?)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let dir =
            std::env::temp_dir().join(format!("node-agent-e2e-{label}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(World {
            config: dir.join("config.yaml"),
            port: free_port()?,
            state,
            fake,
            node,
            dir,
            pods,
            _rt: rt,
        })
    }

    /// The agent on a 1Gi node whose own `memory.available<1Mi` is never met here; the kubelet
    /// copies that hard threshold onto `allocatableMemory.available`. No
    /// `agent.allocatable_memory`: the Node's figure is read every `resync`.
    fn start(&self, resync: &str) -> anyhow::Result<Daemon> {
        let text = Config {
            fake: &self.fake,
            node: &self.node,
            socket: &self.dir.join("trace.sock"),
            port: self.port,
            threshold: "1Mi",
            kube: "  evictions_per_minute: 60\n",
            agent: "",
        }
        .text()
        .replace(
            "resync_interval: 60s",
            &format!("resync_interval: {resync}"),
        );
        std::fs::write(&self.config, text)?;
        let mut daemon = Daemon::start(&self.config, self.port)?;
        let lists = self.cluster().pod_lists;
        wait_until(wait(), "two pod list fetches", || {
            self.cluster().pod_lists >= lists + 2
        })?;
        daemon.wait_log(
            "measured against the Node's status.allocatable.memory",
            wait(),
        )?;
        Ok(daemon)
    }

    fn cluster(&self) -> std::sync::MutexGuard<'_, ClusterState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A helper holding `mib` MiB in the named pod's container cgroup.
    fn load(&self, name: &str, mib: u32) -> anyhow::Result<Helper> {
        let dir = &self.pods.iter().find(|(p, _)| p.name == name).unwrap().1;
        let mut helper = Helper::spawn(MEM_HELPER, &["hold".into(), mib.to_string()])?;
        move_into(dir, helper.pid())?;
        helper.go()?;
        anyhow::ensure!(
            helper.read_line()? == "held",
            "{name} did not hold its memory"
        );
        Ok(helper)
    }

    fn evictions(&self) -> Vec<String> {
        self.cluster()
            .evictions()
            .iter()
            .map(|a| a.path.clone())
            .collect()
    }

    fn node_reads(&self) -> usize {
        let path = format!("/api/v1/nodes/{NODE}");
        self.fake
            .calls()
            .iter()
            .filter(|(m, p)| m == "GET" && *p == path)
            .count()
    }

    fn assert_nothing_refused(&self) {
        assert!(
            self.fake.rejected().is_empty(),
            "the API server would have refused: {:?}",
            self.fake.rejected()
        );
    }
}

/// Sets (or removes) the Node's `status.allocatable.memory` as the kubelet would.
fn set_allocatable(state: &ClusterState, memory: Option<&str>) {
    state.node.change(|n| {
        n["status"]["allocatable"] = match memory {
            Some(m) => json!({"cpu": "2", "memory": m, "pods": "110"}),
            None => json!({"cpu": "2", "pods": "110"}),
        };
    });
}

/// Reads the trace until an eviction; whether a memory line on kubepods was crossed upwards
/// before it.
fn eviction_after_kubepods_crossing(trace: &AgentProcess) -> anyhow::Result<(Value, bool)> {
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

fn assert_evicted_hog_for_allocatable(eviction: &Value) {
    assert_eq!(
        (
            eviction["name"].as_str(),
            eviction["signal"].as_str(),
            eviction["result"].as_str()
        ),
        (
            Some("hog"),
            Some("allocatableMemory.available"),
            Some("evicted")
        ),
        "{eviction}"
    );
    assert_eq!(eviction["threshold"], 1 << 20);
    assert!(
        eviction["observed"].as_i64().unwrap() < 1 << 20,
        "{eviction}"
    );
}

#[test]
fn pods_beyond_the_nodes_own_allocatable_memory_are_evicted_for_allocatable_memory_available(
) -> anyhow::Result<()> {
    require_root();
    let w = World::new("e2e-node-alloc", Some("200Mi"))?;
    let daemon = w.start("60s")?;
    // Met past 199Mi in kubepods: the figure comes from the Node alone.
    wait_until(wait(), "allocatableMemory.available observed", || {
        daemon.metric(AVAILABLE).ok().flatten().is_some()
    })?;
    assert!(w.node_reads() >= 1, "the Node was read");
    let trace = attach_trace(
        &w.dir.join("trace.sock"),
        &["--kind", "eviction,memory_threshold"],
    )?;

    let _calm = w.load("calm", 120)?;
    assert!(
        w.evictions().is_empty(),
        "120Mi of 200Mi allocatable: no eviction"
    );
    let _hog = w.load("hog", 100)?;
    wait_until(wait(), "the eviction request", || !w.evictions().is_empty())?;
    let (eviction, crossed_on_kubepods) = eviction_after_kubepods_crossing(&trace)?;
    assert!(crossed_on_kubepods, "the kernel line on kubepods fired");
    assert_evicted_hog_for_allocatable(&eviction);
    w.assert_nothing_refused();
    daemon.stop()
}

#[test]
fn an_absent_allocatable_is_unknown_and_a_change_of_the_nodes_figure_moves_the_kernel_line(
) -> anyhow::Result<()> {
    require_root();
    let w = World::new("e2e-node-alloc-change", None)?;
    let mut daemon = w.start("1s")?;
    // Absent: unknown, named, never 0.
    let said = daemon.wait_log("status.allocatable.memory is absent", wait())?;
    assert!(
        said.contains("signal source unreadable")
            && (said.contains("source=\"allocatable\"") || said.contains("source=allocatable")),
        "names the source and the field: {said}"
    );
    wait_until(wait(), "the signal marked unknown", || {
        daemon.metric(UNKNOWN).ok().flatten() == Some(1.0)
    })?;
    assert_eq!(daemon.metric(AVAILABLE)?, None, "no figure made up");
    let ready = daemon.get("/readyz")?;
    assert!(
        ready.starts_with("HTTP/1.1 503") && ready.contains("status.allocatable.memory"),
        "{ready}"
    );

    // The kubelet publishes it: known at the next read.
    set_allocatable(&w.cluster(), Some("600Mi"));
    daemon.wait_log("the Node's status.allocatable.memory read", wait())?;
    assert_eq!(daemon.metric(UNKNOWN)?, Some(0.0));
    let _calm = w.load("calm", 120)?;
    let _hog = w.load("hog", 100)?;
    wait_until(wait(), "the 220Mi in kubepods observed", || {
        daemon
            .metric(AVAILABLE)
            .ok()
            .flatten()
            .is_some_and(|a| a < (600 - 200) as f64 * 1048576.0)
    })?;
    assert!(
        w.evictions().is_empty(),
        "220Mi of 600Mi allocatable: no eviction"
    );

    // The kubelet restarts with more reserved: 300Mi. The line on kubepods moves down with it
    // at once; 100Mi more then crosses it, where the old figure's line was 300Mi further up.
    set_allocatable(&w.cluster(), Some("300Mi"));
    let changed = daemon.wait_log("the Node's status.allocatable.memory changed", wait())?;
    assert!(
        changed.contains(&format!("was={}", 600 << 20))
            && changed.contains(&format!("bytes={}", 300 << 20)),
        "{changed}"
    );
    assert!(
        w.evictions().is_empty(),
        "220Mi of 300Mi allocatable: no eviction"
    );
    let trace = attach_trace(
        &w.dir.join("trace.sock"),
        &["--kind", "eviction,memory_threshold"],
    )?;
    let _more = w.load("hog", 100)?;
    wait_until(wait(), "the eviction request", || !w.evictions().is_empty())?;
    let (eviction, crossed_on_kubepods) = eviction_after_kubepods_crossing(&trace)?;
    assert!(
        crossed_on_kubepods,
        "the moved kernel line on kubepods fired"
    );
    assert_evicted_hog_for_allocatable(&eviction);
    w.assert_nothing_refused();
    daemon.stop()
}
