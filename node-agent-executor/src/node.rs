//! The node lane: evictions carried out on the node ([`crate::kill`]) and the records they leave
//! through the API.
//!
//! Kills run in a thread of their own: cgroupfs and the kill's syscalls block, and a kill must
//! never wait behind anything else (the runtime's lane, the API server). Each kill's outcome
//! goes back to the loop the moment it is done. The record (the pod `Failed`, `Evicted`, with
//! the kubelet's message and condition, then its `Evicted` event) is written after, by a task
//! of its own per pod that keeps trying while the API server is away, for at most
//! [`RECORD_GIVE_UP`], [`MAX_RECORDS`] pods at once.
//!
//! The kubelet ends a pod whose phase the API says is terminal when it next syncs it (its
//! generateAPIPodStatus adopts the API's terminal phase, and a killed container is such a
//! sync). Had it restarted the killed pod in place before the record reached it, its status
//! manager may write its own phase back. So [`REASSERT_AFTER`] after the record is written the
//! lane looks again: a pod whose cgroup holds processes again is killed again and its record
//! written again, at most [`MAX_REASSERTS`] times, each said.

use std::{
    sync::{mpsc as std_mpsc, Arc},
    time::{Duration, Instant, SystemTime},
};

use node_agent_kube::{
    api::ApiError,
    events,
    evict::{self, Attempt, EvictionResult, Recorded},
};
use node_agent_policy::{error_chain, Eviction, PodInfo};
use tokio::sync::{mpsc, watch, Semaphore};

use crate::{
    action::{Evict, Kill, Outcome, Report},
    kill::{self, host::Host, KillError, Killed, Release},
    run::Settings,
};

/// How long one kill may go on signalling (a fork storm's rounds).
pub const KILL_DEADLINE: Duration = Duration::from_secs(1);
/// Records being written at once, at most; beyond, the record is given up at once and said
/// so (the pods were killed all the same).
pub const MAX_RECORDS: usize = 256;
/// How long a record is tried while the API server does not take it.
pub const RECORD_GIVE_UP: Duration = Duration::from_secs(3600);
/// The longest wait between two tries of a record.
const RECORD_MAX_WAIT: Duration = Duration::from_secs(10);
/// How long after its record is written a killed pod is looked at again: more than the
/// kubelet's PLEG relist period (1 s) and its pod worker's sync after it.
pub const REASSERT_AFTER: Duration = Duration::from_secs(3);
/// A killed pod started again in place is killed again at most this many times.
pub const MAX_REASSERTS: u32 = 3;

/// What became of a record, for the loop to say and count.
#[derive(Debug)]
pub enum RecordResult {
    /// Written (and the pod's `Evicted` event posted, or `event_error` says why not).
    Written,
    /// The pod went, or its name is another pod's: nothing to record.
    Gone,
    /// Dry run was set before it was written.
    DryRun,
    /// Not taken yet: the API server did not answer (or failed); tried again until
    /// [`RECORD_GIVE_UP`]. Said once per record.
    Waiting(ApiError),
    /// Refused, or given up after [`RECORD_GIVE_UP`] or for want of room: not tried again.
    Lost(String),
    /// The kubelet had started the killed pod again in place: killed again (this kill), its
    /// record written again.
    Reasserted(Killed),
}

/// A record's outcome.
#[derive(Debug)]
pub struct RecordReport {
    pub eviction: Eviction,
    pub result: RecordResult,
    pub event_error: Option<ApiError>,
    /// How long after the kill it came.
    pub after_kill: Duration,
}

/// A record to write, and the kill it records.
#[derive(Debug, Clone)]
struct RecordJob {
    kill: Kill,
    killed_at: Instant,
    reasserts: u32,
}

enum NodeJob {
    Kill(Box<Kill>),
    /// Look again at a pod killed and recorded.
    Reassert(Box<RecordJob>),
}

/// The lane's handle: kills go to its thread, which stops when this is dropped.
pub struct NodeLane {
    jobs: std_mpsc::Sender<NodeJob>,
}

impl NodeLane {
    pub fn spawn(
        settings: watch::Receiver<Settings>,
        outcomes: mpsc::UnboundedSender<Outcome>,
    ) -> Self {
        let (jobs, rx) = std_mpsc::channel();
        let (records, records_rx) = mpsc::unbounded_channel();
        let journal = settings.borrow().pending_records.clone();
        for pending in journal
            .map(|j| j.pending(SystemTime::now()))
            .unwrap_or_default()
        {
            let e = &pending.eviction;
            tracing::info!(pod = %format!("{}/{}", e.namespace, e.name), killed_ago = ?pending.killed_ago,
                "a kill's record a previous run left unwritten: writing it");
            let now = Instant::now();
            let _ = records.send(RecordJob {
                kill: Kill {
                    evict: Evict {
                        pod: PodInfo {
                            namespace: e.namespace.clone(),
                            name: e.name.clone(),
                            uid: e.uid.clone(),
                            ..PodInfo::default()
                        },
                        eviction: pending.eviction,
                        trigger_ktime_ns: None,
                    },
                    target: pending.target,
                },
                killed_at: now.checked_sub(pending.killed_ago).unwrap_or(now),
                // Not looked at again: the pod's labels and priority, which the last check
                // before a kill needs, are not kept.
                reasserts: MAX_REASSERTS,
            });
        }
        tokio::spawn(record_lane(
            settings.clone(),
            records_rx,
            outcomes.clone(),
            jobs.clone(),
        ));
        let spawned = std::thread::Builder::new()
            .name("node-kill".into())
            .spawn(move || node_thread(settings, rx, records, outcomes));
        if let Err(e) = spawned {
            // Without the thread every kill is reported failed by `submit`, never lost.
            tracing::error!(error = %e, "the node lane's thread could not be started");
        }
        Self { jobs }
    }

    /// Hands a kill to the lane; `Err` gives it back when the lane is gone.
    pub fn submit(&self, kill: Box<Kill>) -> Result<(), Box<Kill>> {
        self.jobs.send(NodeJob::Kill(kill)).map_err(|e| match e.0 {
            NodeJob::Kill(k) => k,
            NodeJob::Reassert(job) => Box::new(job.kill),
        })
    }
}

fn report(kill: &Kill, attempt: Attempt, killed: Option<Killed>) -> Report {
    Report {
        eviction: kill.evict.eviction.clone(),
        trigger_ktime_ns: kill.evict.trigger_ktime_ns,
        attempt,
        killed,
        event_error: None,
        at: SystemTime::now(),
    }
}

/// A kill reported failed before it was tried: the lane is gone.
pub fn lane_gone(kill: &Kill) -> Report {
    report(
        kill,
        Attempt::new(EvictionResult::Failed, "the node lane has stopped"),
        None,
    )
}

/// What the kill did, as the eviction's attempt.
fn attempt_of(result: &Result<Killed, KillError>) -> Attempt {
    match result {
        Ok(k) if k.signalled == 0 => Attempt::new(
            EvictionResult::AlreadyGone,
            "no process was left in the pod's cgroup",
        ),
        // Signalled, as far as it went when processes kept coming: the next decision may
        // choose it again.
        Ok(k) => Attempt::new(EvictionResult::Killed, describe(k)),
        Err(e @ KillError::Gone { .. }) => {
            Attempt::new(EvictionResult::AlreadyGone, error_chain(e))
        }
        Err(e @ (KillError::NotVerified { .. } | KillError::TooMany)) => {
            Attempt::new(EvictionResult::Refused, error_chain(e))
        }
        Err(e) => Attempt::new(EvictionResult::Failed, error_chain(e)),
    }
}

fn describe(k: &Killed) -> String {
    format!(
        "killed on the node: {} processes signalled in {:?} ({} rounds{})",
        k.signalled,
        k.signalled_in,
        k.rounds,
        if k.complete {
            ""
        } else {
            "; new ones still appeared, the storm goes on"
        }
    )
}

fn describe_release(release: &Release) -> String {
    match release {
        Release::Released {
            reaped,
            skipped,
            after,
        } => format!(
            "process_mrelease gave back the memory of {reaped}, {after:?} after the kill began ({skipped} were exiting on their own)"
        ),
        Release::Unavailable(errno) => format!(
            "process_mrelease refused ({}): the processes give their memory back as they exit",
            std::io::Error::from_raw_os_error(*errno)
        ),
        Release::Nothing => "nothing to give back".into(),
    }
}

/// The last check before anything is touched, with the settings of this moment: the pod may
/// go (own pod, exclusions) and the agent acts (not dry run, not standalone).
fn may_kill(settings: &Settings, kill: &Kill) -> Result<(), Attempt> {
    let pod = &kill.evict.pod;
    if let Some(reason) = settings.eligibility.check(pod) {
        tracing::error!(namespace = %pod.namespace, name = %pod.name, %reason,
            "kill refused by the executor's last check");
        return Err(Attempt::new(
            EvictionResult::Refused,
            format!("refused before anything was touched: {reason}"),
        ));
    }
    if settings.cluster.is_none() || settings.dry_run {
        let e = &kill.evict.eviction;
        tracing::info!(namespace = %e.namespace, name = %e.name, signal = %e.signal,
            cgroup = %kill.target.cgroup.display(), message = %e.message,
            "dry run: would kill the pod on the node");
        let why = if settings.cluster.is_some() {
            "dry run"
        } else {
            "standalone: no cluster"
        };
        return Err(Attempt::new(EvictionResult::DryRun, why));
    }
    Ok(())
}

/// Kills the pod, says so at once (its growth stopped: the loop waits for its memory), hands
/// its record over, then gives its memory back (`process_mrelease`) and says how that went.
fn kill_and_release(
    kill: &Kill,
    outcomes: &mpsc::UnboundedSender<Outcome>,
    record: impl FnOnce(),
) -> Result<Option<Killed>, ()> {
    let mut host = match Host::new() {
        Ok(h) => h,
        Err(e) => {
            let attempt = Attempt::new(EvictionResult::Failed, error_chain(&e));
            let sent = outcomes.send(Outcome::Eviction(Box::new(report(kill, attempt, None))));
            return sent.map(|()| None).map_err(drop);
        }
    };
    let (attempt, signalled) = match kill::kill_pod(&mut host, &kill.target, KILL_DEADLINE) {
        Ok(s) => (attempt_of(&Ok(s.killed.clone())), Some(s)),
        Err(e) => (attempt_of(&Err(e)), None),
    };
    let killed = signalled.as_ref().map(|s| s.killed.clone());
    let was_killed = attempt.result == EvictionResult::Killed;
    outcomes
        .send(Outcome::Eviction(Box::new(report(
            kill,
            attempt,
            killed.clone(),
        ))))
        .map_err(drop)?;
    if was_killed {
        record();
    }
    if let Some(signalled) = signalled {
        let released = kill::release(&mut host, signalled);
        let e = &kill.evict.eviction;
        tracing::debug!(pod = %format!("{}/{}", e.namespace, e.name), "{}", describe_release(&released));
    }
    Ok(killed.filter(|_| was_killed))
}

fn node_thread(
    settings: watch::Receiver<Settings>,
    jobs: std_mpsc::Receiver<NodeJob>,
    records: mpsc::UnboundedSender<RecordJob>,
    outcomes: mpsc::UnboundedSender<Outcome>,
) {
    while let Ok(job) = jobs.recv() {
        let current = settings.borrow().clone();
        match job {
            NodeJob::Kill(kill) => {
                if let Err(attempt) = may_kill(&current, &kill) {
                    let _ =
                        outcomes.send(Outcome::Eviction(Box::new(report(&kill, attempt, None))));
                    continue;
                }
                let killed_at = Instant::now();
                let record = || {
                    // Kept before it is tried, so an agent killed from here on finds it at
                    // its next start (a few microseconds on the emptyDir's tmpfs).
                    if let Some(journal) = &current.pending_records {
                        if let Err(e) =
                            journal.keep(&kill.evict.eviction, &kill.target, SystemTime::now())
                        {
                            tracing::warn!(dir = %journal.dir().display(), error = %e,
                                "the kill's record is not kept on the node: if the agent stops before the API server takes it, it is lost");
                        }
                    }
                    let _ = records.send(RecordJob {
                        kill: (*kill).clone(),
                        killed_at,
                        reasserts: 0,
                    });
                };
                if kill_and_release(&kill, &outcomes, record).is_err() {
                    return;
                }
            }
            NodeJob::Reassert(job) => {
                if may_kill(&current, &job.kill).is_err() {
                    continue;
                }
                // Only a pod whose cgroup holds processes again: the kubelet started it anew.
                if !kill::host::has_processes(&job.kill.target.cgroup) {
                    continue;
                }
                let mut host = match Host::new() {
                    Ok(h) => h,
                    Err(_) => continue,
                };
                match kill::kill_pod(&mut host, &job.kill.target, KILL_DEADLINE) {
                    Ok(signalled) if signalled.killed.signalled > 0 => {
                        let killed = signalled.killed.clone();
                        let _ = outcomes.send(Outcome::Recorded(Box::new(RecordReport {
                            eviction: job.kill.evict.eviction.clone(),
                            result: RecordResult::Reasserted(killed),
                            event_error: None,
                            after_kill: job.killed_at.elapsed(),
                        })));
                        let _ = records.send(RecordJob {
                            reasserts: job.reasserts + 1,
                            ..*job
                        });
                        kill::release(&mut host, signalled);
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(pod = %format!("{}/{}", job.kill.evict.eviction.namespace, job.kill.evict.eviction.name),
                        error = %error_chain(&e), "a killed pod started again in place could not be killed again")
                    }
                }
            }
        }
    }
}

/// Each record is a task of its own, at most [`MAX_RECORDS`] at once.
async fn record_lane(
    settings: watch::Receiver<Settings>,
    mut records: mpsc::UnboundedReceiver<RecordJob>,
    outcomes: mpsc::UnboundedSender<Outcome>,
    node: std_mpsc::Sender<NodeJob>,
) {
    let room = Arc::new(Semaphore::new(MAX_RECORDS));
    let mut running = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            next = records.recv() => {
                let Some(job) = next else { return };
                let Ok(slot) = room.clone().try_acquire_owned() else {
                    let _ = outcomes.send(record_outcome(&job, RecordResult::Lost(format!(
                        "{MAX_RECORDS} records are being written already"
                    )), None));
                    continue;
                };
                let (settings, outcomes, node) = (settings.clone(), outcomes.clone(), node.clone());
                running.spawn(async move {
                    write_record(&settings, job, &outcomes, &node).await;
                    drop(slot);
                });
            }
            Some(_) = running.join_next(), if !running.is_empty() => {}
        }
    }
}

fn record_outcome(job: &RecordJob, result: RecordResult, event_error: Option<ApiError>) -> Outcome {
    Outcome::Recorded(Box::new(RecordReport {
        eviction: job.kill.evict.eviction.clone(),
        result,
        event_error,
        after_kill: job.killed_at.elapsed(),
    }))
}

async fn write_record(
    settings_rx: &watch::Receiver<Settings>,
    job: RecordJob,
    outcomes: &mpsc::UnboundedSender<Outcome>,
    node: &std_mpsc::Sender<NodeJob>,
) {
    let dry_run = || settings_rx.borrow().dry_run;
    let e = &job.kill.evict.eviction;
    let mut wait = Duration::from_secs(1);
    let mut said_waiting = false;
    loop {
        let settings = settings_rx.borrow().clone();
        let Some(ctx) = settings.cluster.as_ref() else {
            let _ = outcomes.send(record_outcome(
                &job,
                RecordResult::Lost("no cluster".into()),
                None,
            ));
            return;
        };
        let result = match evict::record_evicted(ctx, e, &dry_run, SystemTime::now()).await {
            Recorded::Written => {
                forget(&settings, &job);
                let event = events::build_pod_evicted(e, &ctx.node, SystemTime::now());
                let event_error = if dry_run() {
                    None
                } else {
                    events::post(ctx, &event).await.err()
                };
                let _ = outcomes.send(record_outcome(&job, RecordResult::Written, event_error));
                if job.reasserts < MAX_REASSERTS {
                    tokio::time::sleep(REASSERT_AFTER).await;
                    let _ = node.send(NodeJob::Reassert(Box::new(job)));
                }
                return;
            }
            Recorded::Gone => RecordResult::Gone,
            Recorded::DryRun => RecordResult::DryRun,
            Recorded::Refused(err) => RecordResult::Lost(error_chain(&err)),
            Recorded::Failed(err) if job.killed_at.elapsed() < RECORD_GIVE_UP => {
                if !said_waiting {
                    said_waiting = true;
                    let _ = outcomes.send(record_outcome(&job, RecordResult::Waiting(err), None));
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(RECORD_MAX_WAIT);
                continue;
            }
            Recorded::Failed(err) => RecordResult::Lost(format!(
                "given up after {RECORD_GIVE_UP:?}: {}",
                error_chain(&err)
            )),
        };
        forget(&settings, &job);
        let _ = outcomes.send(record_outcome(&job, result, None));
        return;
    }
}

/// The record needs no keeping any more: written, or never to be.
fn forget(settings: &Settings, job: &RecordJob) {
    if let Some(journal) = &settings.pending_records {
        journal.remove(&job.kill.target.pod_uid);
    }
}
