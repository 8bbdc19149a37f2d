//! Node-level reclaim end to end (root): a real containerd on a small tmpfs that is also the
//! agent's `nodefs`, the daemon in Kubernetes mode against the fake cluster with one evictable
//! pod, and an unused image imported until `nodefs.available` is below its threshold. The
//! agent must delete the image through the CRI, observe the filesystem again and evict
//! nothing — as the kubelet's `reclaimNodeLevelResources` does — and say so in the trace, in a
//! node event and on `/metrics`. In dry run it must delete nothing and evict (in dry run).
//! The filesystem layout comes from the runtime's `ImageFsInfo` compared by device: a
//! configured `imagefsPath` on the same filesystem (an override such as
//! `imagefsPath: /var/lib/containerd` on a one-disk node) still reclaims first.

use std::{path::PathBuf, time::Duration};

use node_agent_kube::fake::Fake;
use node_agent_tests::{
    containerd::{Containerd, Options, PAUSE_IMAGE},
    fake_cluster::{
        attach_trace, free_port, next_record, responder, wait_until, ClusterState, Daemon, PodSpec,
        SharedCluster, NODE,
    },
    oci::ImageSpec,
    scaled, TestCgroup,
};

const MIB: u64 = 1 << 20;
const UID: &str = "3f2504e0-4f89-11d3-9a0c-0305e82c3301";
const UNUSED: &str = "localhost/node-agent-test/unused:1";

fn wait() -> Duration {
    scaled(Duration::from_secs(20))
}

/// containerd on its small filesystem, the fake cluster with one pod, and the config.
struct World {
    ctrd: Containerd,
    state: SharedCluster,
    fake: Fake,
    node: TestCgroup,
    dir: PathBuf,
    port: u16,
    /// More top-level lines (the agent's own settings), not indented.
    agent: String,
    rt: tokio::runtime::Runtime,
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl World {
    fn new(label: &str) -> anyhow::Result<World> {
        let rt = tokio::runtime::Runtime::new()?;
        let ctrd = rt.block_on(Containerd::start(Options {
            small_fs_bytes: Some(128 * MIB),
        }))?;
        let state = SharedCluster::default();
        state.lock().unwrap().pods = vec![PodSpec::new("shop", "web", UID, "16Mi", 'c').json()];
        let fake = rt.block_on(Fake::start(responder(state.clone())));
        let dir =
            std::env::temp_dir().join(format!("node-agent-reclaim-{label}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(World {
            node: TestCgroup::new(label)?,
            port: free_port()?,
            ctrd,
            state,
            fake,
            dir,
            agent: String::new(),
            rt,
        })
    }

    /// `nodefs.available<threshold` on containerd's filesystem; reclaim through its socket.
    fn start(&self, threshold: u64, dry_run: bool) -> anyhow::Result<Daemon> {
        let path = self.write_config(threshold, dry_run)?;
        let daemon = Daemon::start(&path, self.port)?;
        let lists = self.cluster().pod_lists;
        wait_until(wait(), "two pod list fetches", || {
            self.cluster().pod_lists >= lists + 2
        })?;
        Ok(daemon)
    }

    /// A new threshold, taken by a reload.
    fn reload(&self, daemon: &mut Daemon, threshold: u64, dry_run: bool) -> anyhow::Result<()> {
        let before = daemon.log_count("config reloaded");
        self.write_config(threshold, dry_run)?;
        daemon.process.signal(libc::SIGHUP);
        daemon.wait_logs("config reloaded", before + 1, wait())?;
        Ok(())
    }

    fn write_config(&self, threshold: u64, dry_run: bool) -> anyhow::Result<PathBuf> {
        let fs = self
            .ctrd
            .small_fs()
            .expect("the fixture has its small filesystem");
        let config = format!(
            "apiVersion: node-agent.io/v1alpha1\nkind: NodeAgentConfiguration\n\
             eviction:\n  evictionHard: {{nodefs.available: '{threshold}'}}\n\
             kubernetes:\n  podSource: kubelet\n  nodeName: {NODE}\n  podRefreshInterval: 200ms\n  \
             kubelet: {{url: '{url}', caFile: '{ca}'}}\n  \
             apiServer: {{url: '{url}', caFile: '{ca}'}}\n  tokenPath: '{token}'\n  evictionsPerMinute: 60\n\
             cri:\n  endpoint: 'unix://{sock}'\n  imageMinimumGCAge: 0s\n  keepImages: ['{PAUSE_IMAGE}']\n\
             dryRun: {dry_run}\nlisten: '127.0.0.1:{port}'\nmetricsAccess: loopback\ntraceSocket: '{trace}'\nnodeCgroup: '{cg}'\n\
             memoryCapacity: 1Gi\nnodefsPath: '{fs}'\nresyncInterval: 1s\nforkLimit: 0\n{agent}",
            url = self.fake.url(),
            ca = self.fake.pki.ca_file.display(),
            token = self.fake.token_file.display(),
            sock = self.ctrd.socket().display(),
            port = self.port,
            trace = self.dir.join("trace.sock").display(),
            cg = self.node.cgroup_path(),
            fs = fs.display(),
            agent = self.agent,
        );
        let path = self.dir.join("config.yaml");
        std::fs::write(&path, config)?;
        Ok(path)
    }

    fn cluster(&self) -> std::sync::MutexGuard<'_, ClusterState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Imports a 16 MiB image no container uses; returns its ID.
    fn import_unused(&self) -> anyhow::Result<String> {
        let spec = ImageSpec::busybox(UNUSED)?.with_filler("blob", 16 * MIB as usize, 1);
        Ok(self
            .rt
            .block_on(self.ctrd.build_and_import(&spec, "unused"))?
            .id)
    }

    fn image_present(&self, id: &str) -> anyhow::Result<bool> {
        Ok(self
            .rt
            .block_on(self.ctrd.client().image_status(id))?
            .is_some())
    }

    fn node_events(&self, reason: &str) -> usize {
        self.cluster()
            .answered
            .iter()
            .filter(|a| a.path.ends_with("/events") && a.body["reason"] == reason)
            .count()
    }
}

#[test]
fn an_unused_image_is_deleted_and_no_pod_is_evicted_when_that_frees_enough() -> anyhow::Result<()> {
    reclaims_instead_of_evicting(World::new("reclaim")?)
}

/// An `imagefsPath: /var/lib/containerd` override on a one-disk node (the shipped config had
/// it before the layout came from the runtime): the path
/// is on the nodefs filesystem, so images are reclaimed for `nodefs.available` as the kubelet
/// does (the layout was once decided from the setting alone, and evicted at once).
#[test]
fn an_imagefs_path_on_the_nodefs_filesystem_still_reclaims_first() -> anyhow::Result<()> {
    let mut world = World::new("reclaim-one-disk")?;
    world.agent = format!("imagefsPath: '{}'\n", world.ctrd.root().display());
    reclaims_instead_of_evicting(world)
}

fn reclaims_instead_of_evicting(world: World) -> anyhow::Result<()> {
    // First a threshold the import cannot meet: an image is never reclaimed while it is being
    // imported (the test's image has no minimum GC age), only once it is whole.
    let mut daemon = world.start(MIB, false)?;
    let trace = attach_trace(&world.dir.join("trace.sock"), &[])?;
    assert_eq!(
        daemon.metric(
            "node_agent_threshold_met{eviction_signal=\"nodefs.available\",kind=\"hard\"}"
        )?,
        Some(0.0)
    );

    let id = world.import_unused()?;
    let (_, loaded) = world.ctrd.small_fs_usage()?;
    // The import took 32 MiB (content and snapshot); its removal gives them back, so a
    // threshold 12 MiB above what is left now is met, and cured by the removal alone.
    let threshold = loaded + 12 * MIB;
    world.reload(&mut daemon, threshold, false)?;

    let record = next_record(&trace, "reclaim", wait())?;
    assert_eq!(record["signal"], "nodefs.available", "{record}");
    assert_eq!(record["result"], "reclaimed", "{record}");
    assert_eq!(record["images_removed"], 1, "{record}");
    assert_eq!(record["containers_removed"], 0, "{record}");
    assert!(
        record["expected_bytes"].as_u64().unwrap() >= 16 * MIB,
        "{record}"
    );
    let after = record["available_after"].as_i64().unwrap() as u64;
    assert!(
        after >= threshold,
        "observed again after the reclaim, above the threshold: {record}"
    );
    assert!(
        !world.image_present(&id)?,
        "the unused image is gone from containerd"
    );
    assert!(
        world.image_present(PAUSE_IMAGE)?,
        "the kept sandbox image stays"
    );

    // Evaluations go on (resync every second): none evicts, the threshold is no longer met.
    daemon.wait_evaluations(3.0, wait())?;
    assert!(
        world.cluster().evictions().is_empty(),
        "no eviction after a sufficient reclaim"
    );
    assert_eq!(
        daemon.metric(
            "node_agent_threshold_met{eviction_signal=\"nodefs.available\",kind=\"hard\"}"
        )?,
        Some(0.0)
    );
    assert_eq!(
        world.node_events("FreedDiskSpace"),
        1,
        "one node event says what was freed"
    );
    let events = world.cluster().answered.clone();
    let note = events
        .iter()
        .find(|a| a.body["reason"] == "FreedDiskSpace")
        .map(|a| a.body["note"].to_string())
        .unwrap_or_default();
    assert!(
        note.contains("removed 0 dead container(s) and 1 unused image(s)"),
        "{note}"
    );
    assert_eq!(
        daemon.metric("node_agent_node_reclaim_objects_total{eviction_signal=\"nodefs.available\",object=\"image\",result=\"removed\"}")?,
        Some(1.0)
    );
    assert!(daemon.metric("node_agent_node_reclaim_bytes_total{eviction_signal=\"nodefs.available\",result=\"removed\"}")?.unwrap_or(0.0) >= (16 * MIB) as f64);
    assert_eq!(
        daemon.metric("node_agent_node_reclaim_runtime_unavailable")?,
        Some(0.0)
    );
    daemon.stop()
}

#[test]
fn in_dry_run_the_plan_is_reported_nothing_is_deleted_and_the_eviction_is_decided(
) -> anyhow::Result<()> {
    let world = World::new("reclaim-dry")?;
    // As above: the threshold is met only once the image is whole, never while the import is
    // under way (a reclaim then finds no unused image and reports nothing_to_reclaim).
    let mut daemon = world.start(MIB, true)?;
    let trace = attach_trace(&world.dir.join("trace.sock"), &[])?;
    let id = world.import_unused()?;
    let (_, loaded) = world.ctrd.small_fs_usage()?;
    world.reload(&mut daemon, loaded + 12 * MIB, true)?;

    let record = next_record(&trace, "reclaim", wait())?;
    assert_eq!(record["result"], "dry_run", "{record}");
    assert_eq!(record["images_removed"], 0, "{record}");
    assert!(
        record["expected_bytes"].as_u64().unwrap() >= 16 * MIB,
        "what it would free: {record}"
    );
    let steps = record["steps"].as_array().unwrap();
    assert!(
        steps.iter().any(|s| s["id"] == id.as_str()),
        "the image it would remove: {record}"
    );
    // Still met after the (reported) reclaim: the pod is chosen, in dry run.
    let eviction = next_record(&trace, "eviction", wait())?;
    assert_eq!(eviction["name"], "web", "{eviction}");
    assert_eq!(eviction["result"], "dry_run", "{eviction}");
    assert!(world.image_present(&id)?, "dry run deletes nothing");
    assert!(
        world.cluster().evictions().is_empty(),
        "dry run sends nothing"
    );
    assert_eq!(
        world.node_events("FreedDiskSpace") + world.node_events("FreeDiskSpaceFailed"),
        0
    );
    assert_eq!(
        daemon.metric("node_agent_node_reclaim_objects_total{eviction_signal=\"nodefs.available\",object=\"image\",result=\"would_remove\"}")?,
        Some(1.0)
    );
    daemon.stop()
}
