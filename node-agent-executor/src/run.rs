//! The one executor: everything that changes the cluster (evictions, events, the node
//! condition, the pressure taint) and the node's container runtime (node-level reclaim) leaves
//! from here, and every outcome goes back to the loop as data.
//!
//! Work runs in four lanes, each a task of its own, so that a slow sink holds up only its own
//! kind of work: evictions (with the pod's `Evicted` event), node events, the node's status
//! (condition, then taint; latest wins), and the runtime (reclaim, image detection). A runtime
//! that never answers, or an API server slow to take events during an OOM storm, never delays
//! an eviction. Within the eviction lane each eviction is a request of its own, up to
//! [`EVICTION_CAPACITY`] at once: a memory eviction never waits behind evictions for local
//! storage limits on a slow API server.
//!
//! [`Executor::submit`] never waits. The eviction and runtime lanes hold what the plan can have
//! in flight (an eviction past the lane's capacity is shed and reported as
//! [`Outcome::EvictionShed`], never as a failed eviction); the events lane holds
//! [`EVENT_BACKLOG`] and refuses more (a burst of node events), reported as
//! [`Outcome::Refused`]; the status lane keeps only the latest wish. Outcomes go on an unbounded
//! channel whose length is bounded by the actions the lanes accepted.
//!
//! Settings come through a `watch` channel and are read again before every request, so a
//! reload to dry run holds from that moment, between the retries of a request too.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use node_agent_kube::{
    api::{ApiError, Context},
    condition::{ConditionStatus, NodeConditionReporter},
    config::PdbPolicy,
    events,
    evict::{self, Attempt, EvictionResult},
    taint::{self, TaintChange, TaintError},
};
use node_agent_policy::{Eligibility, NodeCondition};
use tokio::{
    sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore},
    task::{JoinHandle, JoinSet},
};

use crate::{
    action::{Action, Evict, NodeEvent, Outcome, PodOomEvent, Report, StatusReport, Unnamed},
    journal::Journal,
    lanes::Refused,
    node::{self, NodeLane},
    reclaim::{self, NodeReclaimer, Reclaim, ReclaimOutcome, Runtime, RuntimeError},
};

/// Evictions the lane carries at once, each its own request: more than the plan hands over
/// at once (one for a threshold, and at most `plan::LOCAL_STORAGE_IN_FLIGHT` for local storage
/// limits), so an eviction is shed only if that rule is broken.
pub const EVICTION_CAPACITY: usize = 64;
/// Node events queued at most; a burst beyond (an OOM storm against a slow API server) is
/// refused and counted rather than held without bound.
pub const EVENT_BACKLOG: usize = 64;
/// Runtime jobs queued at most: the plan's one reclaim and one image detection.
const RUNTIME_BACKLOG: usize = 2;
/// The node condition is written again this often with the same status, so its
/// `lastHeartbeatTime` says the agent still watches (a heartbeat older than a few periods: the
/// agent is gone).
pub const CONDITION_HEARTBEAT: Duration = Duration::from_secs(60);
/// The reason and message of the condition an agent leaves when it stops.
pub const STOPPED_REASON: &str = "AgentStopped";
const STOPPED_MESSAGE: &str =
    "node-agent stopped: nobody watches this node for pressure on its behalf (its taint removed)";

/// What the status lane is asked to make true on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Wish {
    /// The condition (and the taint that follows it) for these conditions.
    Conditions(Vec<NodeCondition>),
    /// The agent stops: its condition `Unknown`, its taint removed.
    Stopped,
}

/// What the executor acts with; replaced whole by a reload.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `None`: standalone mode, no cluster: decisions are reported, never carried out.
    pub cluster: Option<Context>,
    /// Bumped whenever `cluster` is rebuilt, so the status lane reads the node again.
    pub generation: u64,
    pub dry_run: bool,
    pub pdb_policy: PdbPolicy,
    /// The agent's own pod and the exclusions: the last check before any request, for a
    /// reload that excluded a pod after the plan chose it.
    pub eligibility: Eligibility,
    /// Keep the agent's `NoSchedule` taint on the node while it reports pressure. Off: the
    /// taint is never added, and one left from before is removed.
    pub taint: bool,
    /// The container runtime node-level reclaim goes through; `None`: no reclaim.
    pub runtime: Option<Runtime>,
    /// How often the condition is written again unchanged ([`CONDITION_HEARTBEAT`]).
    pub heartbeat: Duration,
    /// Where the records of kills on the node wait until the API server takes them, so that
    /// a restarted agent writes them ([`crate::journal`]); `None`: not kept (standalone).
    pub pending_records: Option<Journal>,
}

/// What the events lane posts.
enum EventJob {
    Node(NodeEvent),
    PodOom(Box<PodOomEvent>),
}

enum RuntimeJob {
    Reclaim(Box<Reclaim>),
    DetectImages,
    Identify(Box<Unnamed>),
}

/// The handle the loop acts through; dropping it stops every lane.
pub struct Executor {
    /// Each eviction with the slot it holds in the lane until its outcome is out.
    evictions: mpsc::UnboundedSender<(Evict, OwnedSemaphorePermit)>,
    eviction_slots: Arc<Semaphore>,
    events: mpsc::Sender<EventJob>,
    status: watch::Sender<Option<Wish>>,
    runtime: mpsc::Sender<RuntimeJob>,
    /// Kills on the node and their records.
    node: NodeLane,
    /// For what `submit` itself reports (a full lane).
    outcomes: mpsc::UnboundedSender<Outcome>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Executor {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Executor {
    /// Starts the lanes; the receiver gives every outcome.
    pub fn spawn(settings: watch::Receiver<Settings>) -> (Self, mpsc::UnboundedReceiver<Outcome>) {
        let (outcomes, outcome_rx) = mpsc::unbounded_channel();
        let (evictions, eviction_rx) = mpsc::unbounded_channel();
        let eviction_slots = Arc::new(Semaphore::new(EVICTION_CAPACITY));
        let (events, event_rx) = mpsc::channel(EVENT_BACKLOG);
        let (status, status_rx) = watch::channel(None);
        let (runtime, runtime_rx) = mpsc::channel(RUNTIME_BACKLOG);
        let tasks = vec![
            tokio::spawn(eviction_lane(
                settings.clone(),
                eviction_rx,
                outcomes.clone(),
            )),
            tokio::spawn(event_lane(settings.clone(), event_rx, outcomes.clone())),
            tokio::spawn(status_lane(settings.clone(), status_rx, outcomes.clone())),
            tokio::spawn(runtime_lane(settings.clone(), runtime_rx, outcomes.clone())),
        ];
        let node = NodeLane::spawn(settings, outcomes.clone());
        let executor = Self {
            evictions,
            eviction_slots,
            events,
            status,
            runtime,
            node,
            outcomes,
            tasks,
        };
        (executor, outcome_rx)
    }

    /// Hands an action to its lane; never waits. What a full lane cannot take is reported as
    /// an outcome at once: an eviction as shed ([`Outcome::EvictionShed`]: not attempted, so the
    /// plan tries it again), a reclaim as one that did not happen, anything else as
    /// [`Outcome::Refused`].
    pub fn submit(&self, action: Action) {
        let refused = |lane, capacity, action| Refused {
            lane,
            capacity,
            action,
        };
        let outcome = match action {
            Action::Evict(evict) => match self.eviction_slots.clone().try_acquire_owned() {
                Ok(slot) => match self.evictions.send((*evict, slot)) {
                    Ok(()) => return,
                    // The lane is gone (the executor stopping): shed as if full.
                    Err(mpsc::error::SendError((evict, _))) => Outcome::EvictionShed {
                        evict: Box::new(evict),
                        refused: refused("eviction", EVICTION_CAPACITY, "eviction"),
                    },
                },
                Err(_) => Outcome::EvictionShed {
                    evict,
                    refused: refused("eviction", EVICTION_CAPACITY, "eviction"),
                },
            },
            Action::Kill(kill) => match self.node.submit(kill) {
                Ok(()) => return,
                Err(kill) => Outcome::Eviction(Box::new(node::lane_gone(&kill))),
            },
            Action::NodeEvent(event) => match self.events.try_send(EventJob::Node(event)) {
                Ok(()) => return,
                Err(e) => {
                    let action = match into_inner(e) {
                        EventJob::Node(event) => event.reason(),
                        EventJob::PodOom(_) => events::OOM_KILL_REASON,
                    };
                    Outcome::Refused(refused("event", EVENT_BACKLOG, action))
                }
            },
            Action::PodOomEvent(event) => match self.events.try_send(EventJob::PodOom(event)) {
                Ok(()) => return,
                Err(_) => Outcome::Refused(refused("event", EVENT_BACKLOG, "pod OOM event")),
            },
            Action::Status { conditions } => {
                self.status.send_replace(Some(Wish::Conditions(conditions)));
                return;
            }
            Action::Reclaim(job) => {
                let signal = job.signal;
                match self.runtime.try_send(RuntimeJob::Reclaim(job)) {
                    Ok(()) => return,
                    Err(_) => Outcome::Reclaim(Box::new(ReclaimOutcome::unavailable(
                        signal,
                        RuntimeError::Busy(refused("runtime", RUNTIME_BACKLOG, "reclaim")),
                    ))),
                }
            }
            Action::Identify(kill) => match self.runtime.try_send(RuntimeJob::Identify(kill)) {
                Ok(()) => return,
                Err(e) => match into_inner(e) {
                    RuntimeJob::Identify(kill) => Outcome::Identified {
                        kill,
                        who: Err(RuntimeError::Busy(refused(
                            "runtime",
                            RUNTIME_BACKLOG,
                            "container lookup",
                        ))),
                    },
                    RuntimeJob::Reclaim(_) | RuntimeJob::DetectImages => return,
                },
            },
            Action::DetectImages => match self.runtime.try_send(RuntimeJob::DetectImages) {
                Ok(()) => return,
                Err(_) => Outcome::ImagesDetected(Err(RuntimeError::Busy(refused(
                    "runtime",
                    RUNTIME_BACKLOG,
                    "image detection",
                )))),
            },
        };
        // The loop holds the receiver for as long as it holds this handle.
        let _ = self.outcomes.send(outcome);
    }
}

impl Executor {
    /// The agent stops: its condition set to `Unknown` and its taint removed (nothing in dry
    /// run or standalone), waited for at most `deadline`. Returns what the writes did, or
    /// `None` when the deadline passed first (the API server slow or gone); the outcomes that
    /// arrive meanwhile are dropped.
    pub async fn stop(
        &self,
        outcomes: &mut mpsc::UnboundedReceiver<Outcome>,
        deadline: Duration,
    ) -> Option<StatusReport> {
        self.status.send_replace(Some(Wish::Stopped));
        tokio::time::timeout(deadline, async {
            while let Some(outcome) = outcomes.recv().await {
                if let Outcome::Status(report) = outcome {
                    if report.stopped {
                        return Some(*report);
                    }
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
    }
}

fn into_inner<T>(e: mpsc::error::TrySendError<T>) -> T {
    match e {
        mpsc::error::TrySendError::Full(t) | mpsc::error::TrySendError::Closed(t) => t,
    }
}

fn report(evict: Evict, attempt: Attempt, event_error: Option<ApiError>) -> Report {
    Report {
        eviction: evict.eviction,
        trigger_ktime_ns: evict.trigger_ktime_ns,
        attempt,
        killed: None,
        event_error,
        at: SystemTime::now(),
    }
}

/// A lane ends when the executor's handle is dropped or the loop stops taking outcomes. Each
/// eviction runs as a task of its own (dropped with the lane), holding its slot until its
/// outcome is sent.
async fn eviction_lane(
    settings: watch::Receiver<Settings>,
    mut evictions: mpsc::UnboundedReceiver<(Evict, OwnedSemaphorePermit)>,
    outcomes: mpsc::UnboundedSender<Outcome>,
) {
    let mut running = JoinSet::new();
    loop {
        tokio::select! {
            next = evictions.recv() => {
                let Some((action, slot)) = next else { return };
                let settings = settings.clone();
                let outcomes = outcomes.clone();
                running.spawn(async move {
                    let report = evict_one(&settings, action).await;
                    let sent = outcomes.send(Outcome::Eviction(Box::new(report)));
                    drop(slot);
                    sent.is_ok()
                });
            }
            Some(done) = running.join_next(), if !running.is_empty() => {
                if matches!(done, Ok(false)) {
                    return;
                }
            }
        }
    }
}

async fn evict_one(settings_rx: &watch::Receiver<Settings>, action: Evict) -> Report {
    let settings = settings_rx.borrow().clone();
    let pod = &action.pod;
    // The same rule the policy applied, once more with the settings of this moment.
    if let Some(reason) = settings.eligibility.check(pod) {
        tracing::error!(namespace = %pod.namespace, name = %pod.name, %reason,
            "eviction refused by the executor's last check");
        let attempt = Attempt::new(
            EvictionResult::Refused,
            format!("refused before any request: {reason}"),
        );
        return report(action, attempt, None);
    }
    let eviction = &action.eviction;
    let Some(ctx) = settings.cluster.as_ref().filter(|_| !settings.dry_run) else {
        tracing::info!(namespace = %eviction.namespace, name = %eviction.name, signal = %eviction.signal,
            hard = eviction.hard, grace = eviction.grace_period_seconds, message = %eviction.message,
            "dry run: would evict");
        let why = if settings.cluster.is_some() {
            "dry run"
        } else {
            "standalone: no cluster"
        };
        return report(action, Attempt::new(EvictionResult::DryRun, why), None);
    };
    let dry_run = || settings_rx.borrow().dry_run;
    let attempt = evict::evict(
        ctx,
        eviction,
        settings.pdb_policy,
        &dry_run,
        SystemTime::now(),
    )
    .await;
    let mut event_error = None;
    if matches!(
        attempt.result,
        EvictionResult::Evicted | EvictionResult::PdbOverridden
    ) && !dry_run()
    {
        let event = events::build_pod_evicted(eviction, &ctx.node, SystemTime::now());
        event_error = events::post(ctx, &event).await.err();
    }
    report(action, attempt, event_error)
}

async fn event_lane(
    settings: watch::Receiver<Settings>,
    mut events: mpsc::Receiver<EventJob>,
    outcomes: mpsc::UnboundedSender<Outcome>,
) {
    while let Some(job) = events.recv().await {
        let current = settings.borrow().clone();
        let outcome = match job {
            EventJob::Node(event) => {
                let reason = event.reason();
                let result = node_event(&current, &event).await;
                Outcome::NodeEvent { reason, result }
            }
            EventJob::PodOom(event) => {
                let (namespace, name) = event.event();
                let result = pod_oom_event(&current, &event).await;
                Outcome::PodOomEvent {
                    namespace,
                    name,
                    result,
                }
            }
        };
        if outcomes.send(outcome).is_err() {
            return;
        }
    }
}

async fn pod_oom_event(settings: &Settings, event: &PodOomEvent) -> Result<(), ApiError> {
    let Some(ctx) = settings.cluster.as_ref() else {
        return Ok(());
    };
    match event {
        PodOomEvent::New { kill, at, repeats } => {
            let built = events::build_pod_oom_kill(&ctx.node, kill, *at, *repeats);
            if settings.dry_run {
                tracing::info!(pod = %format!("{}/{}", kill.namespace, kill.name), note = ?built.note,
                    "dry run: the pod's OOM event not posted");
                return Ok(());
            }
            events::post(ctx, &built).await
        }
        PodOomEvent::Series {
            namespace,
            name,
            count,
            last_observed,
        } => {
            if settings.dry_run {
                return Ok(());
            }
            events::patch_series(ctx, namespace, name, *count, *last_observed).await
        }
    }
}

async fn node_event(settings: &Settings, event: &NodeEvent) -> Result<(), ApiError> {
    let Some(ctx) = settings.cluster.as_ref() else {
        return Ok(());
    };
    let now = SystemTime::now();
    let built = match event {
        NodeEvent::ThresholdMet(resource) => {
            events::build_threshold_met(&ctx.node, resource.as_str(), now)
        }
        NodeEvent::OomKill(kill) => events::build_oom_kill(&ctx.node, kill, now),
    };
    if settings.dry_run {
        tracing::info!(reason = ?built.reason, note = ?built.note, "dry run: event not posted");
        return Ok(());
    }
    events::post(ctx, &built).await
}

/// Writes the latest wished-for status; a wish that arrives while one is being written is
/// written next, the ones in between never (nor the taint of the one being written, when a
/// newer wish came during its condition). The condition is written again every
/// `Settings::heartbeat` (not in dry run), so its heartbeat tells that the agent still
/// watches.
async fn status_lane(
    settings_rx: watch::Receiver<Settings>,
    mut wishes: watch::Receiver<Option<Wish>>,
    outcomes: mpsc::UnboundedSender<Outcome>,
) {
    let mut reporter = NodeConditionReporter::new();
    let mut generation = settings_rx.borrow().generation;
    let mut every = settings_rx.borrow().heartbeat;
    let mut heartbeat = tokio::time::interval(every);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    heartbeat.reset();
    let mut last: Option<Vec<NodeCondition>> = None;
    loop {
        let (wish, beat) = tokio::select! {
            changed = wishes.changed() => {
                if changed.is_err() {
                    return;
                }
                (wishes.borrow_and_update().clone(), false)
            }
            _ = heartbeat.tick() => (last.clone().map(Wish::Conditions), true),
        };
        let Some(wish) = wish else { continue };
        let settings = settings_rx.borrow().clone();
        if settings.heartbeat != every {
            every = settings.heartbeat;
            heartbeat = tokio::time::interval(every);
            heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            heartbeat.reset();
        }
        if beat && settings.dry_run {
            continue;
        }
        if settings.generation != generation {
            generation = settings.generation;
            reporter.reset();
        }
        let report = match &wish {
            Wish::Conditions(conditions) => {
                last = Some(conditions.clone());
                let condition = write_condition(&settings, &mut reporter, conditions).await;
                // A heartbeat rewrites the condition only; the taint follows changes. A wish
                // that came while the condition was being written (an API server away for
                // seconds) supersedes this one: its taint is left to it, written next, so a
                // taint that is no longer wanted is never added only to be removed.
                let superseded = wishes.has_changed().unwrap_or(false);
                let taint = if beat || superseded {
                    Ok(None)
                } else {
                    let want = taint::wanted(conditions).filter(|_| settings.taint);
                    write_taint(&settings_rx, &settings, want.as_ref()).await
                };
                StatusReport {
                    pressure: !conditions.is_empty(),
                    stopped: false,
                    condition,
                    taint,
                }
            }
            Wish::Stopped => {
                let condition = match settings.cluster.as_ref() {
                    Some(ctx) => reporter
                        .report(
                            ctx,
                            ConditionStatus::Unknown,
                            STOPPED_REASON,
                            STOPPED_MESSAGE,
                            SystemTime::now(),
                            settings.dry_run,
                        )
                        .await
                        .map(drop),
                    None => Ok(()),
                };
                let taint = write_taint(&settings_rx, &settings, None).await;
                StatusReport {
                    pressure: false,
                    stopped: true,
                    condition,
                    taint,
                }
            }
        };
        if outcomes.send(Outcome::Status(Box::new(report))).is_err() {
            return;
        }
    }
}

async fn write_condition(
    settings: &Settings,
    reporter: &mut NodeConditionReporter,
    conditions: &[NodeCondition],
) -> Result<(), ApiError> {
    let Some(ctx) = settings.cluster.as_ref() else {
        return Ok(());
    };
    let names: Vec<&str> = conditions.iter().map(|c| c.as_str()).collect();
    let (status, reason, message) = if conditions.is_empty() {
        (
            ConditionStatus::False,
            "NoPressure",
            "node-agent sees no pressure".to_string(),
        )
    } else {
        (
            ConditionStatus::True,
            "PressureDetected",
            format!("node-agent sees {}", names.join(", ")),
        )
    };
    reporter
        .report(
            ctx,
            status,
            reason,
            &message,
            SystemTime::now(),
            settings.dry_run,
        )
        .await
        .map(drop)
}

/// Writes the node's taint; in dry run (or standalone) only says what it would do.
async fn write_taint(
    settings_rx: &watch::Receiver<Settings>,
    settings: &Settings,
    want: Option<&k8s_openapi::api::core::v1::Taint>,
) -> Result<Option<TaintChange>, TaintError> {
    let Some(ctx) = settings.cluster.as_ref() else {
        return Ok(None);
    };
    let value = want.and_then(|t| t.value.as_deref()).unwrap_or("");
    if settings.dry_run {
        tracing::info!(
            key = taint::TAINT_KEY,
            effect = taint::TAINT_EFFECT,
            value,
            present = want.is_some(),
            "dry run: node taint not written"
        );
        return Ok(None);
    }
    let dry_run = || settings_rx.borrow().dry_run;
    let Some(change) = taint::apply(ctx, want, &dry_run).await? else {
        return Ok(None);
    };
    if change != TaintChange::Unchanged {
        tracing::info!(key = taint::TAINT_KEY, effect = taint::TAINT_EFFECT, value, ?change, node = %ctx.node,
            "node taint written");
    }
    Ok(Some(change))
}

async fn runtime_lane(
    settings_rx: watch::Receiver<Settings>,
    mut jobs: mpsc::Receiver<RuntimeJob>,
    outcomes: mpsc::UnboundedSender<Outcome>,
) {
    let mut reclaimer = NodeReclaimer::default();
    while let Some(job) = jobs.recv().await {
        let settings = settings_rx.borrow().clone();
        let outcome = match job {
            RuntimeJob::Reclaim(job) => Outcome::Reclaim(Box::new(
                reclaim_once(&settings_rx, &settings, &mut reclaimer, *job).await,
            )),
            RuntimeJob::DetectImages => Outcome::ImagesDetected(match &settings.runtime {
                Some(runtime) => reclaimer.detect(runtime).await,
                None => Err(RuntimeError::NotConfigured),
            }),
            RuntimeJob::Identify(kill) => {
                let who = match &settings.runtime {
                    Some(runtime) => reclaimer.identify(runtime, &kill.container_id).await,
                    None => Err(RuntimeError::NotConfigured),
                };
                Outcome::Identified { kill, who }
            }
        };
        if outcomes.send(outcome).is_err() {
            return;
        }
    }
}

/// Node-level reclaim: plan and carry out (or report, in dry run or standalone), then the
/// node event.
async fn reclaim_once(
    settings_rx: &watch::Receiver<Settings>,
    settings: &Settings,
    reclaimer: &mut NodeReclaimer,
    job: Reclaim,
) -> ReclaimOutcome {
    let Some(runtime) = &settings.runtime else {
        return ReclaimOutcome::unavailable(job.signal, RuntimeError::NotConfigured);
    };
    let standalone = settings.cluster.is_none();
    let dry_run = move || standalone || settings_rx.borrow().dry_run;
    let mut outcome = reclaimer.reclaim(runtime, job, &dry_run).await;
    // As every node event: not posted in dry run.
    if let Some(ctx) = settings.cluster.as_ref().filter(|_| !dry_run()) {
        if let Some(event) = reclaim::build_reclaim_event(&ctx.node, &outcome, SystemTime::now()) {
            outcome.event_error = events::post(ctx, &event).await.err();
        }
    }
    outcome
}
