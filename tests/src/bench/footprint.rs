//! Idle footprints, read from `/proc` while nothing happens:
//!
//! - `node-agent trace --output json` (the real binary: the kernel programs and a printer, no
//!   memory line) on a node with 100 and then 1000 pod cgroups in the kubelet's layout;
//! - `node-agent run` in Kubernetes mode, as deployed, against the strict fake kubelet and API
//!   server ([`super::kube`]), listing 110 and then 250 pods whose cgroups exist.
//!
//! CPU is each process's own (all threads' `schedstat`) per 1 s window, as a mean with its 95 %
//! interval; RSS is the largest `VmRSS` seen. The daemon's whole-node cost (wake-ups, busy and
//! steal time) is [`super::idle`]'s.

use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::{mpsc, Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use node_agent_kube::fake::Fake;

use super::{
    cgroups::{BenchCgroup, PodTree},
    kube::{free_port, node_cgroup_name, responder, Cluster, Daemon, DaemonConfig, Pod, WorkDir},
    meter::{process_cpu_ns, rss},
    report::Row,
    stats::mean_ci,
    Rng,
};

const SECTION: &str = "footprint";
const MIB: f64 = (1 << 20) as f64;

/// `node-agent trace`; killed on drop.
struct Trace(Child);

impl Trace {
    fn start(binary: &Path) -> anyhow::Result<Self> {
        let mut child = Command::new(binary)
            .args(["trace", "--output", "json"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let stderr = child.stderr.take().context("agent stderr")?;
        let agent = Self(child);
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("tracing") {
                    let _ = tx.send(());
                }
                if line.contains("WARN") || line.contains("ERROR") {
                    eprintln!("agent: {line}");
                }
            }
        });
        rx.recv_timeout(Duration::from_secs(30))
            .context("the agent did not log `tracing` within 30 s")?;
        Ok(agent)
    }

    fn stop(mut self) -> anyhow::Result<()> {
        // SAFETY: signals the agent we started.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(status) = self.0.try_wait()? {
                anyhow::ensure!(status.success(), "the agent exited with {status}");
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the agent did not exit within 5 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A process's CPU in percent of one core per 1 s window over `sample`, and its largest RSS
/// (bytes), read every 0.5 s.
fn watch(pid: u32, sample: Duration) -> anyhow::Result<(Vec<f64>, u64)> {
    let mut windows = Vec::new();
    let mut rss_max = rss(pid)?;
    let started = Instant::now();
    let (mut cpu0, mut t0) = (process_cpu_ns(pid)?, Instant::now());
    while started.elapsed() < sample {
        std::thread::sleep(Duration::from_millis(500));
        rss_max = rss_max.max(rss(pid)?);
        if t0.elapsed() >= Duration::from_secs(1) {
            let cpu = process_cpu_ns(pid)?;
            windows.push((cpu - cpu0) as f64 / t0.elapsed().as_nanos() as f64 * 100.0);
            (cpu0, t0) = (cpu, Instant::now());
        }
    }
    Ok((windows, rss_max))
}

fn cpu_row(measure: String, windows: &[f64], note: String) -> Option<Row> {
    let ci = mean_ci(windows)?;
    Some(
        Row::info(
            SECTION,
            measure,
            format!("{} % of one core", ci.show(3, false)),
        )
        .estimate(ci, "% of a core")
        .below("< 0.5 % (upper end)", 0.5)
        .note(format!("{}; {note}", ci.describe("mean of 1 s windows"))),
    )
}

fn rss_row(measure: String, bytes: u64) -> Row {
    let mib = bytes as f64 / MIB;
    Row::info(SECTION, measure, format!("{mib:.1} MiB"))
        .value(mib, "MiB")
        .below("< 50 MiB", 50.0)
        .note("largest VmRSS read every 0.5 s (a maximum: no interval)")
}

/// `node-agent trace` with 100 and 1000 pod cgroups.
pub fn trace(
    rows: &mut Vec<Row>,
    agent: &Path,
    sample: Duration,
    rng: &mut Rng,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        agent.is_file(),
        "no agent binary at {}: `cargo xtask bench` builds it and passes --agent",
        agent.display()
    );
    for pods in [100usize, 1000] {
        let tree = PodTree::create(pods, rng)?;
        let proc = Trace::start(agent)?;
        // Let the first scan, the tracking of every cgroup and the first housekeeping settle.
        std::thread::sleep(Duration::from_secs(2));
        let (windows, rss_max) = watch(proc.0.id(), sample)?;
        proc.stop()?;
        drop(tree);
        let cgroups = 2 * pods + 3;
        rows.extend(cpu_row(
            format!("`node-agent trace` idle CPU, {pods} pod cgroups"),
            &windows,
            format!(
                "`node-agent trace --output json` (kernel programs and a printer, no memory \
                 line): not the daemon; {cgroups} bench cgroups (pod + container each) in the \
                 memory hierarchy"
            ),
        ));
        rows.push(rss_row(
            format!("`node-agent trace` RSS, {pods} pod cgroups"),
            rss_max,
        ));
    }
    Ok(())
}

/// `node-agent run` in Kubernetes mode with 110 and 250 pods listed by the fake kubelet.
pub fn kube(
    rows: &mut Vec<Row>,
    agent: &Path,
    work_dir: &Path,
    sample: Duration,
    rng: &mut Rng,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting a tokio runtime for the fake cluster")?;
    for count in [110usize, 250] {
        let cluster = Arc::new(Mutex::new(Cluster {
            pods: Vec::new(),
            pod_lists: 0,
        }));
        let (tx, evictions) = mpsc::channel();
        let fake = runtime.block_on(Fake::start(responder(cluster.clone(), Mutex::new(tx))));
        let node = BenchCgroup::memory(&format!("kube{count}"))?;
        let qos = node.path().join("kubepods/burstable");
        std::fs::create_dir_all(&qos).with_context(|| format!("creating {}", qos.display()))?;
        let pods = (0..count)
            .map(|i| Pod::create(&qos, &format!("idle-{i}"), 64, 0, rng))
            .collect::<anyhow::Result<Vec<_>>>()?;
        cluster.lock().unwrap_or_else(|e| e.into_inner()).pods =
            pods.iter().map(Pod::json).collect();
        let dir = WorkDir::create(work_dir.join(format!("kube-{}-{count}", std::process::id())))?;
        let socket = dir.0.join("trace.sock");
        let config = dir.0.join("config.yaml");
        let text = DaemonConfig {
            fake: &fake,
            node_cgroup: node_cgroup_name(node.path()),
            socket: &socket,
            port: free_port()?,
            // The kubelet's default hard threshold on the node's real capacity: every line far.
            memory_available: "100Mi",
            memory_capacity: None,
            pod_refresh_interval: None,
            resync_interval: None,
            fast_evictions: false,
        }
        .text();
        std::fs::write(&config, text).with_context(|| format!("writing {}", config.display()))?;
        let daemon = Daemon::start(agent, &config)?;
        // Settled: the pods listed twice and the cgroups scanned.
        let deadline = Instant::now() + Duration::from_secs(20);
        let settled = Instant::now() + Duration::from_secs(3);
        while cluster.lock().unwrap_or_else(|e| e.into_inner()).pod_lists < 2
            || Instant::now() < settled
        {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the daemon did not list the pods twice within 20 s; its last lines:\n{}",
                daemon.tail(5)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let lists = cluster.lock().unwrap_or_else(|e| e.into_inner()).pod_lists;
        let (windows, rss_max) = watch(daemon.pid(), sample)?;
        let lists = cluster.lock().unwrap_or_else(|e| e.into_inner()).pod_lists - lists;
        anyhow::ensure!(
            evictions.try_recv().is_err(),
            "the idle daemon asked for an eviction"
        );
        drop(daemon);
        drop(fake);
        drop(pods);
        rows.extend(cpu_row(
            format!("daemon idle CPU, Kubernetes mode, {count} pods"),
            &windows,
            format!(
                "`node-agent run` as deployed (default intervals) against the strict fake \
                 kubelet and API server over HTTPS, {count} running pods listed (pod + \
                 container cgroups each), `memory.available<100Mi` on the node's capacity; \
                 the pod list was fetched {lists} times meanwhile"
            ),
        ));
        rows.push(rss_row(
            format!("daemon RSS, Kubernetes mode, {count} pods"),
            rss_max,
        ));
    }
    Ok(())
}
