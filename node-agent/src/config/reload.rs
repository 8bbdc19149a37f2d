//! Where the config comes from, and a new one taken whole or refused whole.
//!
//! The file is watched off the loop, by a thread of its own ([`ConfigWatcher`]): it reads the
//! file (capped at [`crate::fs_helper::read::MAX_CONFIG_BYTES`], regular files only, so a FIFO or a device never blocks
//! it), and each content it takes is parsed and checked against the machine on a thread of its
//! own, which hands the loop a config ready to apply, or the error naming what is wrong. A
//! change is detected by content, not by mtime (a ConfigMap's symlink swap can keep the mtime),
//! and is taken only once two readings a poll apart agree, so a half-written file is never
//! applied. SIGHUP asks for a reading now; it is taken once two readings [`SETTLE`] apart agree.
//! A hung filesystem holds up the watcher's thread only: the loop never waits for it.
//!
//! A slow load never delays a later one: each file taken supersedes the ones before it, whose
//! verdicts are dropped when they come (at most [`MAX_LOADS`] load at once; the newest file
//! waits for a free one). The emergency `dryRun: true` is applied as soon as the file is
//! taken, before its checks ([`Change::DryRunFirst`]: the file's `dryRun` key, read without
//! touching any filesystem), so neither a file slow to check nor a hung filesystem behind a
//! check delays it; the rest of the file follows, whole or refused, and dry run stays either
//! way. The filesystem checks themselves wait at most the helper's deadline
//! ([`crate::fs_helper::ASK_DEADLINE`]).
//!
//! A new config takes effect whole and at once — the executor's mode, exclusions and pacing,
//! intervals, thresholds (kernel lines re-armed), fork limits on every tracked cgroup, signal
//! sources, the cluster connection — or it is refused whole: an invalid file, naming what is
//! wrong, or a change of a setting that cannot change while the agent runs, naming that
//! setting. Never a half-applied config.

use std::{
    path::{Path, PathBuf},
    sync::mpsc as std_mpsc,
    time::Duration,
};

use node_agent_policy::{EvictionConfig, PolicyState};
use tokio::sync::mpsc;

use super::{AgentConfig, ConfigError, Overrides};
use crate::cgroup::Hierarchy;

pub use crate::fs_helper::read::{read_capped, ReadError};

/// How often the watcher reads the file.
pub const POLL: Duration = Duration::from_secs(1);
/// Files parsed and checked at once, at most: a check stuck on a hung filesystem ties up one
/// thread, a few of them stop new ones until one ends.
pub const MAX_LOADS: usize = 4;

/// How a file's content becomes a config to apply: [`Checks::load`], or a test's own.
pub type Load = std::sync::Arc<dyn Fn(&[u8]) -> Result<Box<AgentConfig>, Refusal> + Send + Sync>;
/// After a SIGHUP, the second reading that must agree with the first.
pub const SETTLE: Duration = Duration::from_millis(100);

/// Why a new config was not taken.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Invalid(#[from] ConfigError),
}

/// What the watcher hands the loop.
#[derive(Debug)]
pub enum Change {
    /// A file taken asks for `dryRun: true`: dry run now, before the file is checked.
    DryRunFirst,
    /// A file's verdict: a config to apply whole, or why there is none.
    Whole(Candidate),
}

/// A config for the loop to apply, or why there is none.
#[derive(Debug)]
pub struct Candidate {
    pub why: &'static str,
    pub config: Result<Box<AgentConfig>, Refusal>,
}

/// What the watcher needs to parse and check a file as the agent did at start.
#[derive(Debug, Clone)]
pub struct Checks {
    pub overrides: Overrides,
    pub memory: Hierarchy,
    pub node_dir: PathBuf,
}

impl Checks {
    /// Parses and checks a file's content: the same verdict as at start.
    pub fn load(&self, bytes: &[u8]) -> Result<AgentConfig, ConfigError> {
        let config = AgentConfig::from_bytes(bytes, &self.overrides)?;
        super::plausible::check_on_machine(&config.settings, &self.memory, &self.node_dir)?;
        Ok(config)
    }
}

/// The thread that watches the config file; dropping it stops the thread at its next reading.
pub struct ConfigWatcher {
    asks: std_mpsc::Sender<()>,
    candidates: mpsc::Receiver<Candidate>,
    /// A file taken asked for dry run (one pending is enough).
    dry_run_first: mpsc::Receiver<()>,
}

impl ConfigWatcher {
    /// Watches `path`, whose content `applied` the running config was read from.
    pub fn start(path: PathBuf, applied: Vec<u8>, checks: Checks) -> std::io::Result<Self> {
        let load: Load = std::sync::Arc::new(move |bytes: &[u8]| load(&checks, bytes));
        Self::start_with(path, applied, load)
    }

    /// [`ConfigWatcher::start`], each file's content turned into a config by `load`.
    pub fn start_with(path: PathBuf, applied: Vec<u8>, load: Load) -> std::io::Result<Self> {
        let (asks, asked) = std_mpsc::channel();
        let (tx, candidates) = mpsc::channel(1);
        let (first, dry_run_first) = mpsc::channel(1);
        std::thread::Builder::new()
            .name("config-watch".into())
            .spawn(move || {
                let loads = Loads::new(load, tx.clone(), first);
                watch(&path, applied, &loads, &asked, &tx);
            })?;
        Ok(Self {
            asks,
            candidates,
            dry_run_first,
        })
    }

    /// SIGHUP: read the file now.
    pub fn ask(&self) {
        let _ = self.asks.send(());
    }

    /// The next change to apply (or refusal to report): dry run first, when a file asked.
    pub async fn next(&mut self) -> Option<Change> {
        tokio::select! {
            biased;
            Some(()) = self.dry_run_first.recv() => Some(Change::DryRunFirst),
            c = self.candidates.recv() => c.map(Change::Whole),
        }
    }
}

/// The loads under way: each file taken gets the next number, and a verdict is handed to the
/// loop only if no later file was taken meanwhile. A read error supersedes nothing: the file
/// read before it is still the last content taken, and its verdict still comes.
struct Loads {
    load: Load,
    tx: mpsc::Sender<Candidate>,
    /// Told of each file taken that asks for dry run, before it is loaded.
    first: mpsc::Sender<()>,
    /// The number of the latest file or error taken.
    latest: std::sync::Arc<std::sync::atomic::AtomicU64>,
    running: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// The newest file, while [`MAX_LOADS`] are under way.
    waiting: std::cell::RefCell<Option<(&'static str, Vec<u8>)>>,
}

impl Loads {
    fn new(load: Load, tx: mpsc::Sender<Candidate>, first: mpsc::Sender<()>) -> Self {
        Self {
            load,
            tx,
            first,
            latest: Default::default(),
            running: Default::default(),
            waiting: Default::default(),
        }
    }

    /// A read error to hand over.
    fn error(&self, candidate: Candidate) -> Result<(), ()> {
        self.tx.blocking_send(candidate).map_err(drop)
    }

    /// Parses and checks `bytes` on a thread of its own; it supersedes any load under way.
    fn take(&self, why: &'static str, bytes: Vec<u8>) {
        use std::sync::atomic::Ordering;
        let number = self.latest.fetch_add(1, Ordering::AcqRel) + 1;
        if asks_dry_run(&bytes) {
            // Full already: one dry run pending is as good as two.
            let _ = self.first.try_send(());
        }
        *self.waiting.borrow_mut() = None;
        if self.running.load(Ordering::Acquire) >= MAX_LOADS {
            tracing::warn!(
                loads = MAX_LOADS,
                "config files are still being checked: the newest waits for one of them to end"
            );
            *self.waiting.borrow_mut() = Some((why, bytes));
            return;
        }
        self.running.fetch_add(1, Ordering::AcqRel);
        let bytes = std::sync::Arc::new(bytes);
        let (load, tx, latest, running, kept) = (
            self.load.clone(),
            self.tx.clone(),
            self.latest.clone(),
            self.running.clone(),
            bytes.clone(),
        );
        let spawned = std::thread::Builder::new()
            .name("config-load".into())
            .spawn(move || {
                let config = load(&bytes);
                running.fetch_sub(1, Ordering::AcqRel);
                if latest.load(Ordering::Acquire) == number {
                    let _ = tx.blocking_send(Candidate { why, config });
                } else {
                    tracing::debug!(
                        reason = why,
                        "a config file's verdict dropped: a later file was taken meanwhile"
                    );
                }
            });
        if let Err(e) = spawned {
            self.running.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!(error = %e, "no thread to check the config file now: tried again at the next reading");
            *self.waiting.borrow_mut() = Some((why, kept.to_vec()));
        }
    }

    /// The newest file, if it waited for a free load and one is free now.
    fn retry_waiting(&self) {
        let waiting = self.waiting.borrow_mut().take();
        if let Some((why, bytes)) = waiting {
            self.take(why, bytes);
        }
    }
}

fn watch(
    path: &Path,
    mut applied: Vec<u8>,
    loads: &Loads,
    asked: &std_mpsc::Receiver<()>,
    tx: &mpsc::Sender<Candidate>,
) {
    // A change seen once: taken when the next reading agrees.
    let mut pending: Option<Vec<u8>> = None;
    // The last read error sent, so a lasting one is reported once.
    let mut failing: Option<ReadError> = None;
    // A SIGHUP whose reading failed for a shortage of the moment: owed, read again each poll.
    let mut owed = false;
    loop {
        let sighup = match asked.recv_timeout(POLL) {
            Ok(()) => {
                // A storm of SIGHUPs is one reading.
                while asked.try_recv().is_ok() {}
                true
            }
            Err(std_mpsc::RecvTimeoutError::Timeout) => owed,
            Err(std_mpsc::RecvTimeoutError::Disconnected) => return,
        };
        if tx.is_closed() {
            return;
        }
        loads.retry_waiting();
        let read = if sighup {
            read_settled(path)
        } else {
            read_capped(path)
        };
        owed = sighup && read.as_ref().is_err_and(ReadError::is_transient);
        let candidate = |why, config| Candidate { why, config };
        let send = match read {
            // A shortage of the moment (out of descriptors): said once while it lasts, never
            // a refusal of the file; the reading is tried again at the next poll.
            Err(e) if e.is_transient() => {
                let new = failing.as_ref() != Some(&e);
                failing = Some(e.clone());
                new.then(|| candidate("reading the config file", Err(e.into())))
            }
            Err(e) if sighup || failing.as_ref() != Some(&e) => {
                failing = Some(e.clone());
                pending = None;
                let why = if sighup {
                    "SIGHUP"
                } else {
                    "config file changed"
                };
                Some(candidate(why, Err(e.into())))
            }
            Err(_) => None,
            Ok(bytes) => {
                failing = None;
                if sighup {
                    pending = None;
                    applied.clone_from(&bytes);
                    loads.take("SIGHUP", bytes);
                    None
                } else if bytes == applied {
                    pending = None;
                    None
                } else if pending.as_ref() == Some(&bytes) {
                    pending = None;
                    applied.clone_from(&bytes);
                    loads.take("config file changed", bytes);
                    None
                } else {
                    pending = Some(bytes);
                    None
                }
            }
        };
        if let Some(c) = send {
            if loads.error(c).is_err() {
                return;
            }
        }
    }
}

/// Whether a file's content sets `dryRun: true` at its top level, read as YAML and nothing
/// else (no check, no filesystem): the emergency switch needs nothing more.
pub fn asks_dry_run(bytes: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return false;
    };
    if crate::yaml::check_nesting(text).is_err() {
        return false;
    }
    let Ok(serde_yaml_ng::Value::Mapping(map)) = serde_yaml_ng::from_str(text) else {
        return false;
    };
    map.get("dryRun") == Some(&serde_yaml_ng::Value::Bool(true))
}

fn load(checks: &Checks, bytes: &[u8]) -> Result<Box<AgentConfig>, Refusal> {
    checks.load(bytes).map(Box::new).map_err(Refusal::from)
}

/// Two readings [`SETTLE`] apart that agree (a few tries), else [`ReadError::Unsettled`].
fn read_settled(path: &Path) -> Result<Vec<u8>, ReadError> {
    let mut last = read_capped(path)?;
    for _ in 0..5 {
        std::thread::sleep(SETTLE);
        let next = read_capped(path)?;
        if next == last {
            return Ok(next);
        }
        last = next;
    }
    Err(ReadError::Unsettled {
        path: path.to_path_buf(),
        settle: SETTLE,
    })
}

/// The setting a reload may not change (the listener, the socket and the ring are bound or
/// sized at start; the node cgroup anchors every reading; a cluster cannot appear or vanish
/// under the loop), if the new config changes one.
pub fn unchangeable(old: &AgentConfig, new: &AgentConfig) -> Option<&'static str> {
    let (o, n) = (&old.settings, &new.settings);
    if o.listen != n.listen {
        Some("listen")
    } else if o.trace_socket != n.trace_socket {
        Some("traceSocket")
    } else if o.inspect_listen != n.inspect_listen {
        Some("inspectListen")
    } else if o.ring_bytes != n.ring_bytes {
        Some("ringBufferSize")
    } else if o.node_cgroup != n.node_cgroup {
        Some("nodeCgroup")
    } else if old.kubernetes.is_some() != new.kubernetes.is_some() {
        Some("kubernetes (the section added or removed)")
    } else if o.metrics_access != n.metrics_access {
        Some("metricsAccess")
    } else {
        None
    }
}

/// The policy's memory under new thresholds. Thresholds are known by index; one that stays
/// (same signal, hard or soft alike) keeps since when it was met and whether it was acted on,
/// so a reload neither restarts a grace period nor drops a minimum reclaim.
pub fn remap_state(old: &EvictionConfig, new: &EvictionConfig, state: &PolicyState) -> PolicyState {
    let find = |i: usize| {
        let t = &new.thresholds()[i];
        old.thresholds()
            .iter()
            .position(|o| o.signal == t.signal && o.is_hard() == t.is_hard())
    };
    let mut next = PolicyState {
        conditions_last_observed_at: state.conditions_last_observed_at.clone(),
        ..PolicyState::default()
    };
    for i in 0..new.thresholds().len() {
        let Some(j) = find(i) else { continue };
        if let Some(at) = state.thresholds_first_observed_at.get(&j) {
            next.thresholds_first_observed_at.insert(i, *at);
        }
        if state.thresholds_acted_on.contains(&j) {
            next.thresholds_acted_on.push(i);
        }
    }
    next
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::fs_helper::read::MAX_CONFIG_BYTES;

    fn config(text: &str) -> AgentConfig {
        let o = Overrides {
            node_name: Some("n1".into()),
            ..Overrides::default()
        };
        AgentConfig::parse(&format!("{H}{text}"), &o).unwrap()
    }

    /// The version header every config file starts with.
    const H: &str = "apiVersion: node-agent.io/v1alpha1\nkind: NodeAgentConfiguration\n";

    #[test]
    fn settings_bound_at_start_refuse_the_reload_by_name() {
        let base = "eviction: {evictionHard: {memory.available: 1Gi}}\nlisten: '127.0.0.1:1'\n";
        let rows = [
            ("listen: '127.0.0.1:2'", Some("listen")),
            ("listen: '127.0.0.1:1'\ntraceSocket: /tmp/other.sock", Some("traceSocket")),
            ("listen: '127.0.0.1:1'\nringBufferSize: 8Ki", Some("ringBufferSize")),
            ("listen: '127.0.0.1:1'\ninspectListen: 127.0.0.1:9465", Some("inspectListen")),
            ("listen: '127.0.0.1:1'\nnodeCgroup: /elsewhere", Some("nodeCgroup")),
            ("listen: '127.0.0.1:1'\nkubernetes: {}", Some("kubernetes (the section added or removed)")),
            ("listen: '127.0.0.1:1'\nmetricsAccess: open", Some("metricsAccess")),
            ("listen: '127.0.0.1:1'\ndryRun: true\nresyncInterval: 1s\nforkLimit: 5\neviction: {evictionHard: {memory.available: 2Gi}}", None),
        ];
        for (new, want) in rows {
            assert_eq!(unchangeable(&config(base), &config(new)), want, "{new}");
        }
    }

    #[test]
    fn thresholds_that_stay_keep_their_grace_period_and_reclaim() {
        let old = config("eviction: {evictionHard: {memory.available: 1Gi, pid.available: 100}, evictionSoft: {nodefs.available: 10%}, evictionSoftGracePeriod: {nodefs.available: 1m}}");
        let new = config("eviction: {evictionHard: {pid.available: 50}, evictionSoft: {nodefs.available: 20%}, evictionSoftGracePeriod: {nodefs.available: 2m}}");
        let index = |c: &AgentConfig, s: &str, hard: bool| {
            c.eviction
                .thresholds()
                .iter()
                .position(|t| t.signal.as_str() == s && t.is_hard() == hard)
                .unwrap()
        };
        let mut state = PolicyState::default();
        let t = Duration::from_secs(7);
        for (s, hard) in [
            ("memory.available", true),
            ("pid.available", true),
            ("nodefs.available", false),
        ] {
            state
                .thresholds_first_observed_at
                .insert(index(&old, s, hard), t);
        }
        state
            .thresholds_acted_on
            .push(index(&old, "pid.available", true));
        let next = remap_state(&old.eviction, &new.eviction, &state);
        let (pid, nodefs) = (
            index(&new, "pid.available", true),
            index(&new, "nodefs.available", false),
        );
        assert_eq!(next.thresholds_first_observed_at.get(&pid), Some(&t));
        assert_eq!(next.thresholds_first_observed_at.get(&nodefs), Some(&t));
        assert_eq!(next.thresholds_acted_on, vec![pid]);
        assert_eq!(
            next.thresholds_first_observed_at.len(),
            2,
            "the removed memory threshold is forgotten"
        );
    }

    #[test]
    fn only_a_regular_file_within_the_cap_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid path; mkfifo only creates the node.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let big = dir.path().join("big.yaml");
        std::fs::write(&big, vec![b'#'; MAX_CONFIG_BYTES as usize + 1]).unwrap();
        let ok = dir.path().join("ok.yaml");
        std::fs::write(&ok, H).unwrap();
        let rows: [(&str, &Path, &str); 4] = [
            (
                "a FIFO is refused without opening it (it would block)",
                &fifo,
                "a FIFO",
            ),
            ("a directory", dir.path(), "a directory"),
            ("too large", &big, "larger than 1048576 bytes"),
            (
                "missing",
                Path::new("/no/such/config.yaml"),
                "reading config file /no/such/config.yaml",
            ),
        ];
        for (what, path, needle) in rows {
            let err = read_capped(path).unwrap_err().to_string();
            assert!(err.contains(needle), "{what}: {err}");
        }
        assert_eq!(read_capped(&ok).unwrap(), H.as_bytes());
    }

    fn checks() -> Checks {
        let layout = crate::cgroup::detect().expect("cgroups");
        Checks {
            overrides: Overrides {
                node_name: Some("n1".into()),
                ..Overrides::default()
            },
            node_dir: layout.memory.mount().to_path_buf(),
            memory: layout.memory,
        }
    }

    /// The next candidate within `limit`, or `None`.
    fn next(w: &mut ConfigWatcher, limit: Duration) -> Option<Candidate> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(c) = w.candidates.try_recv() {
                return Some(c);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    fn dry_run(c: &Candidate) -> bool {
        c.config.as_ref().expect("a valid config").dry_run()
    }

    /// A file written in two steps is applied only once it stays whole for two readings; a
    /// symbolic link swapped to a file with the same mtime is seen by its content; a SIGHUP
    /// storm is one reading.
    #[test]
    fn the_watcher_takes_only_whole_files_by_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        let whole = format!("{H}dryRun: true\n");
        std::fs::write(&path, &whole).unwrap();
        let mut w =
            ConfigWatcher::start(path.clone(), whole.as_bytes().to_vec(), checks()).unwrap();
        assert!(next(&mut w, POLL * 2).is_none(), "nothing changed");

        // Half written: valid YAML that would turn dry run off, then completed at once.
        std::fs::write(&path, format!("{H}dryRun: false\n")).unwrap();
        std::thread::sleep(POLL / 2);
        std::fs::write(&path, format!("{H}dryRun: true\nforkLimit: 7\n")).unwrap();
        let c = next(&mut w, POLL * 4).expect("the whole file is taken");
        assert_eq!(c.why, "config file changed");
        assert!(dry_run(&c), "the half-written file was never applied");
        assert_eq!(c.config.as_ref().unwrap().settings.fork_limit, 7);

        // A ConfigMap update: a link swapped to another file of the same mtime.
        let (a, b) = (dir.path().join("a.yaml"), dir.path().join("b.yaml"));
        std::fs::write(&a, format!("{H}dryRun: true\nforkLimit: 8\n")).unwrap();
        std::fs::write(&b, format!("{H}dryRun: true\nforkLimit: 9\n")).unwrap();
        let mtime = std::fs::metadata(&a).unwrap().modified().unwrap();
        std::fs::File::options()
            .write(true)
            .open(&b)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        let link = dir.path().join("link.yaml");
        std::os::unix::fs::symlink(&a, &link).unwrap();
        let mut w =
            ConfigWatcher::start(link.clone(), std::fs::read(&a).unwrap(), checks()).unwrap();
        let tmp = dir.path().join("link.tmp");
        std::os::unix::fs::symlink(&b, &tmp).unwrap();
        std::fs::rename(&tmp, &link).unwrap();
        let c = next(&mut w, POLL * 4).expect("the swap is seen");
        assert_eq!(c.config.as_ref().unwrap().settings.fork_limit, 9);

        // A hundred SIGHUPs: one reading (or two), never a hundred.
        for _ in 0..100 {
            w.ask();
        }
        let mut seen = 0;
        while let Some(c) = next(&mut w, POLL * 2) {
            assert_eq!(c.why, "SIGHUP");
            seen += 1;
        }
        assert!((1..=2).contains(&seen), "{seen}");
    }

    /// A file whose parse and checks take long (a slow filesystem behind a check, a parser's
    /// worst case) never delays the next: a good file written after it is applied at once, and
    /// the slow one's verdict, superseded, is never delivered.
    #[test]
    fn a_slow_load_never_delays_a_later_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, H).unwrap();
        let checks = checks();
        let load: Load = std::sync::Arc::new(move |bytes: &[u8]| {
            if bytes.windows(4).any(|w| w == b"slow") {
                std::thread::sleep(Duration::from_secs(3));
            }
            checks.load(bytes).map(Box::new).map_err(Refusal::from)
        });
        let mut w = ConfigWatcher::start_with(path.clone(), H.as_bytes().to_vec(), load).unwrap();
        std::fs::write(&path, format!("{H}# slow\nforkLimit: 5\n")).unwrap();
        w.ask();
        std::thread::sleep(Duration::from_millis(400));
        std::fs::write(&path, format!("{H}dryRun: true\n")).unwrap();
        let asked = Instant::now();
        w.ask();
        let c = next(&mut w, Duration::from_secs(2)).expect("the good file, at once");
        assert!(dry_run(&c), "the later file: {c:?}");
        eprintln!(
            "the later file applied {:?} after its SIGHUP",
            asked.elapsed()
        );
        assert!(
            next(&mut w, Duration::from_secs(4)).is_none(),
            "the slow, superseded file is never delivered"
        );
    }

    /// A read error while a file is being checked supersedes nothing: the file taken before it
    /// is still the last content read, and its verdict still comes (else a file whose content
    /// comes back unchanged would never be applied).
    #[test]
    fn a_read_error_never_drops_the_verdict_of_the_file_read_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, H).unwrap();
        let checks = checks();
        let load: Load = std::sync::Arc::new(move |bytes: &[u8]| {
            std::thread::sleep(Duration::from_millis(1500));
            checks.load(bytes).map(Box::new).map_err(Refusal::from)
        });
        let mut w = ConfigWatcher::start_with(path.clone(), H.as_bytes().to_vec(), load).unwrap();
        std::fs::write(&path, format!("{H}dryRun: true\n")).unwrap();
        w.ask();
        std::thread::sleep(Duration::from_millis(600));
        std::fs::remove_file(&path).unwrap();
        w.ask();
        let first = next(&mut w, Duration::from_secs(3)).expect("the missing file, said");
        assert!(matches!(first.config, Err(Refusal::Read(_))), "{first:?}");
        let second = next(&mut w, Duration::from_secs(3)).expect("the file read before, applied");
        assert!(dry_run(&second), "{second:?}");
    }

    /// The emergency switch is read from the file's top level and nothing else.
    #[test]
    fn the_dry_run_key_is_read_alone() {
        let rows: [(&str, bool); 7] = [
            ("dryRun: true\n", true),
            ("apiVersion: x\ndryRun: true\nforkLimit: [nonsense\n", false),
            ("kind: NodeAgentConfig\ndryRun: true\nunknownKey: 1\n", true),
            ("dryRun: false\n", false),
            ("dryRun: 'true'\n", false),
            ("nested:\n  dryRun: true\n", false),
            ("- dryRun: true\n", false),
        ];
        for (text, want) in rows {
            assert_eq!(asks_dry_run(text.as_bytes()), want, "{text:?}");
        }
        assert!(!asks_dry_run(b"\xff\xfe"), "not text");
    }

    #[test]
    fn a_lasting_read_error_is_reported_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, H).unwrap();
        let mut w = ConfigWatcher::start(path.clone(), H.as_bytes().to_vec(), checks()).unwrap();
        std::fs::remove_file(&path).unwrap();
        let c = next(&mut w, POLL * 3).expect("the missing file is reported");
        assert!(
            matches!(c.config, Err(Refusal::Read(ReadError::Io { .. }))),
            "{c:?}"
        );
        assert!(next(&mut w, POLL * 3).is_none(), "once, not every poll");
    }
}
