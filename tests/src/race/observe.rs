//! What a run observes, each from its own source:
//! - the pressed signal, every millisecond, from the node's files: for memory the kubepods
//!   cgroup's headroom (its limit less its working set: the usage less the inactive file
//!   pages, as cAdvisor, the kubelet and the agent read it), for PIDs the node's tasks against
//!   `pid_max`, for disk `statvfs`;
//! - each of the run's pods' memory usage from its own cgroup (when its growth stopped) and
//!   when that cgroup went;
//! - the kernel's OOM kills from `/dev/kmsg`, with the task and the pod they took;
//! - each side's decisions: the kubelet's from its log (`pods ranked for eviction`, the kill
//!   right after), the agent's from its own (`eviction handed over`);
//! - the pods' API records, from a watch of the run's namespace (when each became `Failed`
//!   with reason `Evicted`, or was marked for deletion).
//!
//! Every time is `CLOCK_REALTIME` nanoseconds: the samples, the logs (klog and the agent's
//! RFC 3339 lines, both to the microsecond) and the watch's arrivals. (`/dev/kmsg` counts
//! CLOCK_MONOTONIC microseconds since boot: converted with the two clocks read together.)

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{BufRead as _, Read as _},
    os::{fd::AsRawFd as _, unix::fs::OpenOptionsExt as _},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use serde::{Deserialize, Serialize};

use super::Pressed;

pub fn wall_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

pub fn mono_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// How often the sampler reads.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(1);

/// One sample of the pressed signal: its available amount (MiB, or PIDs).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Sample {
    pub wall_ns: i64,
    pub available: f64,
}

/// A kernel OOM kill.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OomKill {
    pub wall_ns: i64,
    pub task: String,
    /// The pod UID its memory cgroup names, if a pod's.
    pub pod_uid: Option<String>,
    /// `CONSTRAINT_MEMCG` (a cgroup's limit) or `CONSTRAINT_NONE` (the machine).
    pub constraint: String,
}

/// One pod's memory usage (MiB) over the run: a point whenever it moved by 1 MiB or 100 ms
/// passed, and its peak exactly.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct PodSeries {
    pub points: Vec<(i64, f64)>,
    /// Its highest usage, and when it was first reached.
    pub peak: Option<(i64, f64)>,
    /// When its cgroup was first seen gone.
    pub gone_ns: Option<i64>,
}

/// What the sampler gathers while a run lasts.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Sampled {
    pub samples: Vec<Sample>,
    /// By pod UID.
    pub pods: BTreeMap<String, PodSeries>,
    pub oom_kills: Vec<OomKill>,
}

/// Where the sampler reads.
#[derive(Debug, Clone)]
pub struct Sources {
    pub pressed: Pressed,
    /// kubepods' memory cgroup directory (v1).
    pub kubepods: PathBuf,
    /// The node's disk, as seen from the host.
    pub nodefs: PathBuf,
    /// Pod UIDs whose cgroups to watch (added as the run creates them).
    pub pods: Arc<Mutex<BTreeSet<String>>>,
}

/// The sampler, on a thread of its own until stopped.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<Sampled>>,
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn stat_value(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
}

/// The kubepods cgroup's headroom: its limit less its working set, MiB.
pub fn kubepods_headroom_mib(kubepods: &Path) -> Option<f64> {
    let limit = read_u64(&kubepods.join("memory.limit_in_bytes"))?;
    let usage = read_u64(&kubepods.join("memory.usage_in_bytes"))?;
    let stat = std::fs::read_to_string(kubepods.join("memory.stat")).ok()?;
    let inactive = stat_value(&stat, "total_inactive_file").unwrap_or(0);
    let ws = usage.saturating_sub(inactive);
    Some((limit as f64 - ws as f64) / 1048576.0)
}

/// `pid.available` as the kubelet computes it: `pid_max` less the tasks the kernel counts.
fn pid_available() -> Option<f64> {
    let max = read_u64(Path::new("/proc/sys/kernel/pid_max"))? as f64;
    // SAFETY: sysinfo(2) into a zeroed struct.
    let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::sysinfo(&mut info) } != 0 {
        return None;
    }
    Some(max - f64::from(info.procs))
}

fn disk_available_mib(path: &Path) -> Option<f64> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statvfs(3) into a zeroed struct with a NUL-terminated path.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return None;
    }
    Some(s.f_bavail as f64 * s.f_frsize as f64 / 1048576.0)
}

/// The pod cgroup directories a UID may have under kubepods (by QoS).
pub fn pod_cgroups(kubepods: &Path, uid: &str) -> [PathBuf; 3] {
    [
        kubepods.join(format!("pod{uid}")),
        kubepods.join(format!("burstable/pod{uid}")),
        kubepods.join(format!("besteffort/pod{uid}")),
    ]
}

/// `/dev/kmsg` from its end: new records only.
fn open_kmsg() -> Option<std::fs::File> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")
        .ok()?;
    // SAFETY: lseek(2) on our descriptor; SEEK_END on /dev/kmsg skips to the newest record.
    unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_END) };
    Some(f)
}

/// An OOM kill from a `/dev/kmsg` record (`oom-kill:constraint=…,task_memcg=…,task=…,pid=…`).
fn oom_kill(record: &str, boot_wall_ns: i64) -> Option<OomKill> {
    let (header, message) = record.split_once(';')?;
    let body = message.strip_prefix("oom-kill:")?;
    let us: i64 = header.split(',').nth(2)?.parse().ok()?;
    let field = |k: &str| {
        body.split(',')
            .find_map(|kv| kv.strip_prefix(k).and_then(|v| v.strip_prefix('=')))
            .map(str::to_string)
    };
    let memcg = field("task_memcg").unwrap_or_default();
    let pod_uid = memcg
        .split('/')
        .find_map(|c| c.strip_prefix("pod"))
        .map(str::to_string);
    Some(OomKill {
        wall_ns: boot_wall_ns + us * 1000,
        task: field("task").unwrap_or_default(),
        pod_uid,
        constraint: field("constraint").unwrap_or_default(),
    })
}

/// Where each watched pod's cgroup is, once found.
#[derive(Default)]
struct Found {
    dirs: BTreeMap<String, PathBuf>,
}

impl Found {
    fn dir(&mut self, kubepods: &Path, uid: &str) -> Option<&PathBuf> {
        if !self.dirs.contains_key(uid) {
            let dir = pod_cgroups(kubepods, uid)
                .into_iter()
                .find(|d| d.exists())?;
            self.dirs.insert(uid.to_string(), dir);
        }
        self.dirs.get(uid)
    }
}

impl Sampler {
    pub fn start(sources: Sources) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut out = Sampled::default();
            let mut kmsg = open_kmsg();
            // CLOCK_MONOTONIC's zero in wall time (kmsg's timestamps are monotonic µs).
            let boot_wall_ns = wall_ns() - mono_ns();
            let mut found = Found::default();
            let mut tick = 0u64;
            while !flag.load(Ordering::Relaxed) {
                let now = wall_ns();
                let available = match sources.pressed {
                    Pressed::Memory | Pressed::LocalStorage => {
                        kubepods_headroom_mib(&sources.kubepods)
                    }
                    Pressed::Pids => pid_available(),
                    Pressed::Disk => disk_available_mib(&sources.nodefs),
                };
                if let Some(available) = available {
                    out.samples.push(Sample {
                        wall_ns: now,
                        available,
                    });
                }
                let uids: Vec<String> = sources
                    .pods
                    .lock()
                    .map(|p| p.iter().cloned().collect())
                    .unwrap_or_default();
                for uid in uids {
                    let series = out.pods.entry(uid.clone()).or_default();
                    if series.gone_ns.is_some() {
                        continue;
                    }
                    let Some(dir) = found.dir(&sources.kubepods, &uid) else {
                        continue;
                    };
                    match read_u64(&dir.join("memory.usage_in_bytes")) {
                        Some(bytes) => {
                            let mib = bytes as f64 / 1048576.0;
                            if series.peak.is_none_or(|(_, p)| mib > p + 0.5) {
                                series.peak = Some((now, mib));
                            }
                            let moved = series.points.last().is_none_or(|(t, v)| {
                                (mib - v).abs() >= 1.0 || now - t >= 100_000_000
                            });
                            if moved {
                                series.points.push((now, mib));
                            }
                        }
                        None if !dir.exists() => series.gone_ns = Some(now),
                        None => {}
                    }
                }
                tick += 1;
                if tick.is_multiple_of(20) {
                    if let Some(f) = kmsg.as_mut() {
                        let mut buf = vec![0u8; 8192];
                        while let Ok(n) = f.read(&mut buf) {
                            if n == 0 {
                                break;
                            }
                            if let Some(k) =
                                oom_kill(&String::from_utf8_lossy(&buf[..n]), boot_wall_ns)
                            {
                                out.oom_kills.push(k);
                            }
                        }
                    }
                }
                std::thread::sleep(SAMPLE_EVERY);
            }
            out
        });
        Self {
            stop,
            handle: Some(handle),
        }
    }

    pub fn stop(mut self) -> Sampled {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

/// Who decided an eviction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum By {
    Agent,
    Kubelet,
}

/// One side's decision to evict a pod, and how it was carried out.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Decision {
    pub wall_ns: i64,
    pub by: By,
    pub pod: String,
    /// The agent's: `node` (killed there) or `api` (an Eviction); the kubelet's: `kubelet`.
    pub way: String,
    /// The agent's: met ahead of its threshold (a fall faster than relief).
    #[serde(default)]
    pub early: bool,
}

/// The agent's decisions about pods of `namespace` since `since_ns`, from its log lines
/// `eviction handed over` (text format: `<RFC 3339> INFO target: eviction handed over pod=ns/name … way="node"`).
pub fn agent_decisions(log: &str, namespace: &str, since_ns: i64) -> Vec<Decision> {
    log.lines()
        .filter(|l| l.contains("eviction handed over"))
        .filter_map(|l| {
            let time: jiff::Timestamp = l.split_whitespace().next()?.parse().ok()?;
            let ns = time.as_nanosecond() as i64;
            let field = |k: &str| {
                l.split_whitespace()
                    .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
                    .map(|v| v.trim_matches('"').to_string())
            };
            let (pod_ns, name) = field("pod")?
                .split_once('/')
                .map(|(a, b)| (a.to_string(), b.to_string()))?;
            (ns >= since_ns && pod_ns == namespace).then(|| Decision {
                wall_ns: ns,
                by: By::Agent,
                pod: name,
                way: field("way").unwrap_or_default(),
                early: field("early").as_deref() == Some("true"),
            })
        })
        .collect()
}

/// The kubelet's evictions of pods of `namespace` since `since_ns`, from its log: each
/// `pods ranked for eviction` line (the decision, the kill right after) with the pod of the
/// `pod is evicted successfully` line that follows it. klog writes local time (UTC here) to
/// the microsecond, without the year: taken from `since_ns`.
pub fn kubelet_decisions(log: &str, namespace: &str, since_ns: i64) -> Vec<Decision> {
    let year = jiff::Timestamp::from_nanosecond(i128::from(since_ns))
        .map(|t| t.to_zoned(jiff::tz::TimeZone::UTC).year())
        .unwrap_or(2026);
    let time = |line: &str| -> Option<i64> {
        // I1128 10:56:25.121755   31752 file.go:1] ...
        let head = line.get(1..21)?;
        let (md, hms) = head.split_once(' ')?;
        let text = format!("{year}-{}-{}T{}Z", md.get(0..2)?, md.get(2..4)?, hms.trim());
        let t: jiff::Timestamp = text.parse().ok()?;
        Some(t.as_nanosecond() as i64)
    };
    let mut out = Vec::new();
    let mut ranked_at: Option<i64> = None;
    for line in log.lines() {
        if line.contains("Eviction manager: pods ranked for eviction") {
            ranked_at = time(line).filter(|t| *t >= since_ns);
        } else if line.contains("Eviction manager: pod is evicted successfully") {
            let pod = line
                .split("pod=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("");
            // Local-storage evictions (an emptyDir over its limit) rank nothing: the
            // eviction's own line is their time.
            let at = ranked_at.or_else(|| time(line).filter(|t| *t >= since_ns));
            if let (Some(at), Some((ns, name))) = (at, pod.split_once('/')) {
                if ns == namespace {
                    out.push(Decision {
                        wall_ns: at,
                        by: By::Kubelet,
                        pod: name.to_string(),
                        way: "kubelet".into(),
                        early: false,
                    });
                }
            }
        }
    }
    out
}

/// When each of a namespace's pods first showed its end in the API: `phase: Failed` with
/// reason `Evicted`, or a deletion timestamp. From a watch (`kubectl get --watch`), each line
/// timed as it arrives.
pub struct RecordWatch {
    child: std::process::Child,
    seen: Arc<Mutex<BTreeMap<String, i64>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl RecordWatch {
    pub fn start(kubectl: &node_agent_cluster::Kubectl, namespace: &str) -> anyhow::Result<Self> {
        let mut child = kubectl
            .command(&[
                "-n",
                namespace,
                "get",
                "pods",
                "--watch",
                "-o",
                // `|`-separated: kubectl pads tabs in its output.
                "jsonpath={.metadata.name}|{.status.phase}|{.status.reason}|{.metadata.deletionTimestamp}{\"\\n\"}",
            ])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        let stdout = child.stdout.take().expect("piped");
        let seen: Arc<Mutex<BTreeMap<String, i64>>> = Arc::default();
        let into = seen.clone();
        let reader = std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                let at = wall_ns();
                let f: Vec<&str> = line.trim().split('|').collect();
                let ended = (f.get(1) == Some(&"Failed") && f.get(2) == Some(&"Evicted"))
                    || f.get(3).is_some_and(|d| !d.is_empty());
                if ended {
                    if let (Some(name), Ok(mut seen)) = (f.first(), into.lock()) {
                        seen.entry(name.to_string()).or_insert(at);
                    }
                }
            }
        });
        Ok(Self {
            child,
            seen,
            reader: Some(reader),
        })
    }

    /// Each pod's first record of its end, by name.
    pub fn stop(mut self) -> BTreeMap<String, i64> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for RecordWatch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Node's conditions of interest that turned `True` during the run.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Conditions {
    pub seen_true: BTreeSet<String>,
}

pub const CONDITIONS: [&str; 4] = [
    "MemoryPressure",
    "DiskPressure",
    "PIDPressure",
    "NodeAgentPressure",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oom_kill_record_names_its_pod_and_time() {
        let record = "6,1234,5448801966,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=abc,mems_allowed=0,oom_memcg=/kubepods/burstable/pod5eb5,task_memcg=/kubepods/burstable/pod5eb57282-2de3/8e4b,task=pod-workload,pid=14602,uid=0\n";
        let k = oom_kill(record, 1_000_000_000).unwrap();
        assert_eq!(k.task, "pod-workload");
        assert_eq!(k.pod_uid.as_deref(), Some("5eb57282-2de3"));
        assert_eq!(k.constraint, "CONSTRAINT_MEMCG");
        assert_eq!(k.wall_ns, 1_000_000_000 + 5_448_801_966_000);
        assert!(oom_kill("6,1,2,-;Memory cgroup out of memory: Killed process 1", 0).is_none());
    }

    #[test]
    fn the_kubelets_decisions_are_read_from_its_log_with_their_time() {
        let since = "2026-11-28T10:00:00Z"
            .parse::<jiff::Timestamp>()
            .unwrap()
            .as_nanosecond() as i64;
        let log = "I1128 09:59:59.000000   1 eviction_manager.go:418] \"Eviction manager: pods ranked for eviction\" pods=[\"ns/old\"]\n\
                   I1128 09:59:59.100000   1 eviction_manager.go:658] \"Eviction manager: pod is evicted successfully\" pod=\"ns/old\"\n\
                   I1128 10:00:05.250000   1 eviction_manager.go:418] \"Eviction manager: pods ranked for eviction\" pods=[\"ns/hog\",\"ns/b\"]\n\
                   I1128 10:00:05.300000   1 eviction_manager.go:658] \"Eviction manager: pod is evicted successfully\" pod=\"ns/hog\"\n\
                   I1128 10:00:06.000000   1 eviction_manager.go:658] \"Eviction manager: pod is evicted successfully\" pod=\"other/x\"\n";
        let got = kubelet_decisions(log, "ns", since);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].pod, "hog");
        assert_eq!(got[0].wall_ns - since, 5_250_000_000);
        // An emptyDir over its limit: evicted with no ranking before it.
        let log = "I1128 10:00:07.500000   1 eviction_manager.go:658] \"Eviction manager: pod is evicted successfully\" pod=\"ns/filler\"\n";
        let got = kubelet_decisions(log, "ns", since);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].pod, "filler");
        assert_eq!(got[0].wall_ns - since, 7_500_000_000);
    }

    #[test]
    fn the_agents_decisions_are_read_from_its_log_with_their_way() {
        let since = "2026-12-07T06:00:00Z"
            .parse::<jiff::Timestamp>()
            .unwrap()
            .as_nanosecond() as i64;
        let log = "2026-12-07T05:59:59.000000Z  INFO node_agent::run::evaluate: eviction handed over pod=race/old signal=allocatableMemory.available hard=true early=false way=\"node\"\n\
                   2026-12-07T06:00:01.250000Z  INFO node_agent::run::evaluate: eviction handed over pod=race/ramp signal=allocatableMemory.available hard=true early=true way=\"node\"\n\
                   2026-12-07T06:00:01.300000Z  INFO node_agent::run::report: eviction outcome pod=race/ramp signal=allocatableMemory.available result=\"killed\"\n\
                   2026-12-07T06:00:02.000000Z  INFO node_agent::run::evaluate: eviction handed over pod=other/x signal=memory.available hard=false early=false way=\"api\"\n";
        let got = agent_decisions(log, "race", since);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(
            (got[0].pod.as_str(), got[0].way.as_str(), got[0].early),
            ("ramp", "node", true)
        );
        assert_eq!(got[0].wall_ns - since, 1_250_000_000);
    }
}
