//! End to end through `node-agent run`: the release daemon in Kubernetes mode against the
//! in-process HTTPS fake kubelet/API server ([`node_agent_kube::fake`]), pods whose cgroups are
//! real (the kubelet's cgroupfs layout below a bench "node" cgroup), and a pod whose allocator
//! ramps the node across `memory.available`. Each round measures crossing → eviction request:
//!
//! - the allocator's crossing: the ramp helper reads `kubepods`' usage after every page and
//!   reports each change with the time just before the page that caused it; the crossing is
//!   the first reading at or above the line the kernel reported (the daemon sets the line);
//! - the kernel's crossing: `ktime_ns` of the `memory_threshold` up record on the daemon's
//!   trace socket (the same clock as `CLOCK_MONOTONIC`);
//! - the request: `CLOCK_MONOTONIC` when the fake had read the whole eviction POST.
//!
//! One daemon serves every round, as on a node: each round adds a fresh pod (new UID) to the
//! fake kubelet's list and to the cgroups, ramps it, and once its eviction request arrives
//! removes it as the kubelet would, so the daemon's wait for the pod's cgroup ends.

use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    sync::{mpsc, Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use node_agent_kube::fake::Fake;
use serde_json::Value;

use super::{
    cgroups::BenchCgroup,
    kube::{
        free_port, node_cgroup_name, responder, Cluster, Daemon, DaemonConfig, Pod, WorkDir,
        NAMESPACE,
    },
    mono_ns, quantile,
    report::{ms, Row},
    Rng,
};
use crate::{move_into, Helper};

const SECTION: &str = "latency";
const MIB: u64 = 1 << 20;
/// `memoryCapacity: 1Gi` and `memory.available<824Mi`: the threshold is met once the
/// node's working set passes 200 MiB.
const LINE_WORKING_SET: u64 = 200 * MIB;
/// The ramping pod holds this much before its ramp, and ramps this far past the line.
const HOG_LOW_MIB: u64 = 8;
const HOG_PAST_LINE_MIB: u64 = 16;
/// One round's eviction request must arrive within this.
const ROUND_LIMIT: Duration = Duration::from_secs(5);

/// A pod's memory as the kubelet ranks it.
#[derive(Debug, Clone, PartialEq)]
pub struct PodUse {
    pub name: String,
    pub request: u64,
    pub priority: i32,
    pub working_set: u64,
}

/// The pod the kubelet evicts first under memory pressure (`rankMemoryPressure`): pods whose
/// working set exceeds their memory request first, then lower priority, then the larger
/// working set above the request. Written out here, apart from the agent's policy crate, so
/// the bench checks the daemon's choice against the kubelet's rules rather than against itself.
pub fn kubelet_first(pods: &[PodUse]) -> Option<&str> {
    let exceeds = |p: &PodUse| p.working_set > p.request;
    let above = |p: &PodUse| i128::from(p.working_set) - i128::from(p.request);
    pods.iter()
        .min_by(|a, b| {
            exceeds(b)
                .cmp(&exceeds(a))
                .then(a.priority.cmp(&b.priority))
                .then(above(b).cmp(&above(a)))
        })
        .map(|p| p.name.as_str())
}

fn pod_usage(pod: &Pod) -> anyhow::Result<PodUse> {
    Ok(PodUse {
        name: pod.name.clone(),
        request: pod.request,
        priority: pod.priority,
        working_set: working_set(&pod.pod_dir)?,
    })
}

/// usage − inactive_file, as the kubelet (cAdvisor) computes a cgroup's working set.
fn working_set(dir: &Path) -> anyhow::Result<u64> {
    let read = |f: &str| std::fs::read_to_string(dir.join(f));
    let usage = read("memory.usage_in_bytes")
        .or_else(|_| read("memory.current"))
        .with_context(|| format!("no memory usage file in {}", dir.display()))?;
    let usage: u64 = usage
        .trim()
        .parse()
        .with_context(|| format!("{}: usage {usage:?} is not a number", dir.display()))?;
    let stat =
        read("memory.stat").with_context(|| format!("reading {}/memory.stat", dir.display()))?;
    // v1 names the hierarchical figure total_inactive_file; v2's inactive_file is hierarchical.
    let field = |key: &str| {
        stat.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let inactive = field("total_inactive_file ")
        .or_else(|| field("inactive_file "))
        .unwrap_or(0);
    Ok(usage.saturating_sub(inactive))
}

/// The daemon's trace socket, read directly: one JSON record a line.
fn attach(socket: &Path) -> anyhow::Result<mpsc::Receiver<Value>> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let stream = loop {
        match std::os::unix::net::UnixStream::connect(socket) {
            Ok(s) => break s,
            Err(e) if Instant::now() > deadline => {
                return Err(e).with_context(|| format!("connecting to {}", socket.display()))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                if tx.send(v).is_err() {
                    return;
                }
            }
        }
    });
    Ok(rx)
}

/// A helper process (the bench binary's `child ramp-trace`) running in `dir`; killed on drop.
fn spawn_ramp(
    dir: &Path,
    usage_file: &Path,
    low_mib: u64,
    high_mib: u64,
) -> anyhow::Result<Helper> {
    let exe = std::env::current_exe().context("finding the bench binary")?;
    let args = [
        "child".to_string(),
        "ramp-trace".to_string(),
        usage_file.to_string_lossy().into_owned(),
        low_mib.to_string(),
        high_mib.to_string(),
    ];
    let mut helper = Helper::spawn(&exe.to_string_lossy(), &args)?;
    move_into(dir, helper.pid())?;
    helper.go()?;
    let low = helper.read_line()?;
    anyhow::ensure!(
        low.starts_with("low "),
        "the ramp helper said {low:?}, expected `low USAGE`"
    );
    Ok(helper)
}

/// `trace T:U T:U ...` from the ramp helper.
fn parse_trace(line: &str) -> anyhow::Result<Vec<(u64, u64)>> {
    let mut words = line.split_whitespace();
    anyhow::ensure!(
        words.next() == Some("trace"),
        "the ramp helper said {line:.80?}, expected `trace T:U ...`"
    );
    words
        .map(|w| {
            let (t, u) = w.split_once(':').context("expected T:U")?;
            Ok((t.parse()?, u.parse()?))
        })
        .collect::<anyhow::Result<_>>()
        .with_context(|| format!("the ramp helper said {line:.80?}"))
}

/// One round's figures.
struct Sample {
    /// Allocator's crossing → request, ns; `None` if its readings never reached the line.
    from_allocator: Option<f64>,
    /// Kernel event → request, ns.
    from_kernel: f64,
    evicted: String,
    expected: Option<String>,
    decided_on: Trigger,
}

/// Which evaluation made a round's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    /// The one the first up-crossing of the round triggered.
    FirstCrossing,
    /// One a later up-crossing triggered: the first line lay below the threshold.
    LaterCrossing,
    /// Not a memory_threshold event (a pressure poll or re-sync); timed from the first crossing.
    Other,
}

/// Everything rounds share.
struct Bench<'a> {
    qos: PathBuf,
    node_dir: PathBuf,
    kubepods_usage: PathBuf,
    cluster: Arc<Mutex<Cluster>>,
    evictions: mpsc::Receiver<(String, u64)>,
    live: mpsc::Receiver<Value>,
    base: [&'a Pod; 2],
    daemon: &'a Daemon,
}

impl Bench<'_> {
    fn set_pods(&self, extra: Option<&Pod>) {
        let mut c = self.cluster.lock().unwrap_or_else(|e| e.into_inner());
        c.pods = self
            .base
            .iter()
            .copied()
            .chain(extra)
            .map(Pod::json)
            .collect();
    }

    fn pod_lists(&self) -> u64 {
        self.cluster
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pod_lists
    }

    fn round(&self, n: usize, rng: &mut Rng) -> anyhow::Result<Sample> {
        let created = Instant::now();
        let hog = Pod::create(&self.qos, &format!("hog-{n}"), 16, 0, rng)?;
        let need = LINE_WORKING_SET.saturating_sub(working_set(&self.node_dir)?);
        let high = need.div_ceil(MIB) + HOG_PAST_LINE_MIB;
        anyhow::ensure!(
            high > HOG_LOW_MIB + HOG_PAST_LINE_MIB,
            "the node's working set is already within {} MiB of the line before the ramp",
            HOG_LOW_MIB
        );
        let mut ramp = spawn_ramp(&hog.container_dir, &self.kubepods_usage, HOG_LOW_MIB, high)?;
        self.set_pods(Some(&hog));
        // The daemon has listed the new pod (two fetches after the change) and rescanned the
        // cgroups (it does so at the housekeeping tick, every second, after a cgroup came).
        let lists = self.pod_lists();
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.pod_lists() < lists + 2 || created.elapsed() < Duration::from_millis(1500) {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the daemon did not fetch the pod list within 5 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        while self.evictions.try_recv().is_ok() {}
        while self.live.try_recv().is_ok() {}

        let start = mono_ns();
        ramp.go()?;
        let (path, request_ns) = self.evictions.recv_timeout(ROUND_LIMIT).map_err(|_| {
            anyhow::anyhow!(
                "no eviction request within {ROUND_LIMIT:?} of the ramp's start; the daemon's last lines:\n{}",
                self.daemon.tail(5)
            )
        })?;
        // Usage only grows until the ramp ends, so this reading ranks as the decision's did.
        let uses = self
            .base
            .iter()
            .copied()
            .chain([&hog])
            .map(pod_usage)
            .collect::<anyhow::Result<Vec<_>>>()?;
        let expected = kubelet_first(&uses).map(str::to_string);
        let points = parse_trace(&ramp.read_line()?)?;

        // The up-crossings of `kubepods`' line (ktime_ns, line) and the decision's trigger.
        let mut ups: Vec<(u64, u64)> = Vec::new();
        let mut trigger = None;
        let deadline = Instant::now() + Duration::from_secs(2);
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            let Ok(v) = self.live.recv_timeout(left) else {
                break;
            };
            match v["kind"].as_str() {
                Some("memory_threshold") if v["direction"] == "up" => {
                    if let (Some(k), Some(line)) =
                        (v["ktime_ns"].as_u64(), v["threshold_bytes"].as_u64())
                    {
                        if k >= start {
                            ups.push((k, line));
                        }
                    }
                }
                Some("eviction") => {
                    trigger = v["trigger_ktime_ns"].as_u64();
                    break;
                }
                _ => {}
            }
        }
        anyhow::ensure!(
            !ups.is_empty(),
            "no memory_threshold up record on the trace socket"
        );
        // The crossing is the one whose kernel event triggered the deciding evaluation. A line
        // set from an older reading can sit below the threshold; its evaluation then finds the
        // threshold unmet and re-arms the line higher, and the next crossing decides.
        let (decided_on, (kernel_ns, line)) =
            match ups.iter().position(|(k, _)| Some(*k) == trigger) {
                Some(0) => (Trigger::FirstCrossing, ups[0]),
                Some(i) => (Trigger::LaterCrossing, ups[i]),
                None => (Trigger::Other, ups[0]),
            };
        let allocator_ns = points.iter().find(|(_, u)| *u >= line).map(|(t, _)| *t);
        let evicted = path
            .strip_prefix(&format!("/api/v1/namespaces/{NAMESPACE}/pods/"))
            .and_then(|p| p.strip_suffix("/eviction"))
            .unwrap_or(&path)
            .to_string();
        // The kubelet deletes the pod: out of the list, its processes and cgroups gone.
        self.set_pods(None);
        drop(ramp);
        drop(hog);
        Ok(Sample {
            from_allocator: allocator_ns.map(|t| request_ns.saturating_sub(t) as f64),
            from_kernel: request_ns.saturating_sub(kernel_ns) as f64,
            evicted,
            expected,
            decided_on,
        })
    }
}

pub fn run(
    rows: &mut Vec<Row>,
    agent: &Path,
    rounds: usize,
    work_dir: &Path,
    rng: &mut Rng,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        agent.is_file(),
        "no agent binary at {}: `cargo xtask bench` builds it and passes --agent",
        agent.display()
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting a tokio runtime for the fake cluster")?;
    let cluster = Arc::new(Mutex::new(Cluster {
        pods: Vec::new(),
        pod_lists: 0,
    }));
    let (tx, evictions) = mpsc::channel();
    let fake = runtime.block_on(Fake::start(responder(cluster.clone(), Mutex::new(tx))));

    let node = BenchCgroup::memory("e2e-node")?;
    let qos = node.path().join("kubepods/burstable");
    std::fs::create_dir_all(&qos).with_context(|| format!("creating {}", qos.display()))?;
    let kubepods = node.path().join("kubepods");
    let kubepods_usage = ["memory.usage_in_bytes", "memory.current"]
        .into_iter()
        .map(|f| kubepods.join(f))
        .find(|p| p.exists())
        .with_context(|| format!("no memory usage file in {}", kubepods.display()))?;
    let dir = WorkDir::create(work_dir.join(format!("e2e-{}", std::process::id())))?;
    let socket = dir.0.join("trace.sock");
    let config = dir.0.join("config.yaml");
    let text = DaemonConfig {
        fake: &fake,
        node_cgroup: node_cgroup_name(node.path()),
        socket: &socket,
        port: free_port()?,
        // `memoryCapacity: 1Gi` and `memory.available<824Mi`: the threshold is met once the
        // node's working set passes 200 MiB (LINE_WORKING_SET).
        memory_available: "824Mi",
        memory_capacity: Some("1Gi"),
        pod_refresh_interval: Some("500ms"),
        resync_interval: Some("60s"),
        fast_evictions: true,
    }
    .text();
    std::fs::write(&config, text).with_context(|| format!("writing {}", config.display()))?;

    // Two pods stay: one under its request, one over it by less than the ramping pod will be.
    let calm = Pod::create(&qos, "calm", 512, 0, rng)?;
    let steady = Pod::create(&qos, "steady", 32, 0, rng)?;
    let _calm_mem = spawn_ramp(&calm.container_dir, &kubepods_usage, 96, 97)?;
    let _steady_mem = spawn_ramp(&steady.container_dir, &kubepods_usage, 48, 49)?;

    let daemon = Daemon::start(agent, &config)?;
    let live = attach(&socket)?;
    let bench = Bench {
        qos,
        node_dir: node.path().to_path_buf(),
        kubepods_usage,
        cluster,
        evictions,
        live,
        base: [&calm, &steady],
        daemon: &daemon,
    };
    bench.set_pods(None);

    let started = Instant::now();
    let mut samples = Vec::new();
    let mut failed = Vec::new();
    for n in 0..rounds {
        match bench.round(n, rng) {
            Ok(s) => samples.push(s),
            Err(e) => {
                eprintln!("bench: e2e round {n}: {e:#}");
                failed.push(format!("{e:#}"));
                anyhow::ensure!(
                    failed.len() <= rounds / 4,
                    "{} of {} rounds failed; the last: {e:#}",
                    failed.len(),
                    n + 1
                );
            }
        }
    }
    let took = started.elapsed();
    drop(bench);
    drop(daemon);
    drop(fake);

    let kernel: Vec<f64> = samples.iter().map(|s| s.from_kernel).collect();
    let allocator: Vec<f64> = samples.iter().filter_map(|s| s.from_allocator).collect();
    let mismatched: Vec<String> = samples
        .iter()
        .filter(|s| s.expected.as_deref() != Some(s.evicted.as_str()))
        .map(|s| {
            format!(
                "{} instead of {}",
                s.evicted,
                s.expected.as_deref().unwrap_or("?")
            )
        })
        .collect();
    let count = |t: Trigger| samples.iter().filter(|s| s.decided_on == t).count();
    let mut triggers = format!(
        "decided on the first crossing's kernel event in {} rounds",
        count(Trigger::FirstCrossing)
    );
    if count(Trigger::LaterCrossing) > 0 {
        triggers.push_str(&format!(
            ", on a second crossing in {} (the first line, set from an older reading, lay below \
             the threshold; timed from the second)",
            count(Trigger::LaterCrossing)
        ));
    }
    if count(Trigger::Other) > 0 {
        triggers.push_str(&format!(
            ", on another trigger (pressure poll or re-sync) in {} (timed from the first crossing)",
            count(Trigger::Other)
        ));
    }
    let cell = |v: &[f64]| match (quantile(v, 0.5), quantile(v, 0.99)) {
        (Some(a), Some(b)) => format!("{} / {} ms", ms(a), ms(b)),
        _ => "—".to_string(),
    };
    let p99 = |v: &[f64]| quantile(v, 0.99).unwrap_or(f64::NAN) / 1e6;
    let mut health = format!("n = {}", samples.len());
    if !failed.is_empty() {
        health.push_str(&format!(", {} rounds without a measurement", failed.len()));
    }
    if allocator.len() < samples.len() {
        health.push_str(&format!(
            ", {} rounds whose allocator never read the kernel's line",
            samples.len() - allocator.len()
        ));
    }
    rows.push(
        Row::info(
            SECTION,
            "end to end through the `node-agent run` daemon: crossing → eviction request (p50 / p99)",
            cell(&allocator),
        )
        .value(p99(&allocator), "ms")
        .note(format!(
            "{health}; release daemon in Kubernetes mode, fake kubelet and API server over HTTPS in \
             the bench process; crossing = the allocator's CLOCK_MONOTONIC before the page that took \
             `kubepods` to the kernel's line, request = the fake's CLOCK_MONOTONIC once it had read \
             the POST; evicted pod = the kubelet's ranking in {} of {} rounds{}; {triggers}; \
             {} rounds in {:.0} s",
            samples.len() - mismatched.len(),
            samples.len(),
            if mismatched.is_empty() {
                String::new()
            } else {
                format!(" (mismatches: {})", mismatched.join(", "))
            },
            rounds,
            took.as_secs_f64(),
        )),
    );
    rows.push(
        Row::info(
            SECTION,
            "end-to-end leg: kernel event → eviction request",
            cell(&kernel),
        )
        .value(p99(&kernel), "ms")
        .note(
            "the `memory_threshold` record's ktime_ns, read from the daemon's trace socket, to the \
             request's arrival",
        ),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, request_mib: u64, priority: i32, ws_mib: u64) -> PodUse {
        PodUse {
            name: name.into(),
            request: request_mib * MIB,
            priority,
            working_set: ws_mib * MIB,
        }
    }

    #[test]
    fn the_kubelet_ranks_by_exceeding_requests_then_priority_then_usage_above_request() {
        let cases: [(&str, Vec<PodUse>, &str); 5] = [
            (
                "over its request beats under it, however large",
                vec![pod("big", 512, 0, 300), pod("small", 16, 0, 20)],
                "small",
            ),
            (
                "among those over, the larger excess",
                vec![pod("a", 32, 0, 48), pod("b", 16, 0, 60)],
                "b",
            ),
            (
                "among those over, lower priority before a larger excess",
                vec![pod("a", 32, -10, 40), pod("b", 16, 0, 60)],
                "a",
            ),
            (
                "all under: lower priority first",
                vec![pod("a", 512, 5, 100), pod("b", 512, 1, 10)],
                "b",
            ),
            (
                "exactly at the request does not exceed it",
                vec![pod("at", 64, 0, 64), pod("over", 16, 0, 17)],
                "over",
            ),
        ];
        for (why, pods, want) in cases {
            assert_eq!(kubelet_first(&pods), Some(want), "{why}");
        }
        assert_eq!(kubelet_first(&[]), None);
    }

    #[test]
    fn the_ramp_trace_parses_into_time_usage_pairs() {
        assert_eq!(
            parse_trace("trace 10:4096 12:8192").unwrap(),
            vec![(10, 4096), (12, 8192)]
        );
        assert_eq!(parse_trace("trace").unwrap(), vec![]);
        assert!(parse_trace("low 5").is_err());
        assert!(parse_trace("trace 10-4096").is_err());
    }
}
