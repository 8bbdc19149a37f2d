//! The one executor: everything that changes the cluster — evictions, events, the node
//! condition, the node's pressure taint — and the node's container runtime (node-level
//! reclaim) leaves from this task, in the order the loop decided it, evictions paced by one
//! token bucket; every outcome goes back to the loop as data, so the next decision can use it.
//!
//! Its settings come through a `watch` channel and are read again before every request, so a
//! reload to dry run holds from that moment, between the retries of a request too.

use std::time::{Instant, SystemTime};

use node_agent_policy::{Eligibility, Eviction, NodeCondition, PodInfo, Resource};
use tokio::sync::{mpsc, watch};

use crate::{
    api::Context,
    condition::NodeConditionReporter,
    config::PdbPolicy,
    events::{self, OomKill},
    evict::{self, Attempt, EvictionResult},
    pacing::TokenBucket,
    reclaim::{self, NodeReclaimer, Reclaim, ReclaimOutcome},
    taint::{self, TaintChange},
};

/// What the executor acts on; replaced whole by a reload.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `None`: standalone mode, no cluster: decisions are reported, never carried out.
    pub cluster: Option<Context>,
    /// Bumped whenever `cluster` is rebuilt, so the condition reporter reads the node again.
    pub generation: u64,
    pub dry_run: bool,
    pub pdb_policy: PdbPolicy,
    pub evictions_per_minute: u32,
    pub eviction_burst: u32,
    /// The agent's own pod and the exclusions: the last check before any request.
    pub eligibility: Eligibility,
    /// Keep the agent's `NoSchedule` taint on the node while it reports pressure. Off: the
    /// taint is never added, and one left from before is removed.
    pub taint: bool,
    /// The container runtime node-level reclaim goes through; `None`: no reclaim.
    pub runtime: Option<reclaim::Runtime>,
}

/// One thing to do in the cluster.
#[derive(Debug, Clone)]
pub enum Action {
    Evict(Box<Evict>),
    NodeEvent(NodeEvent),
    /// The agent's node condition, with the conditions it stands for.
    Condition {
        pressure: bool,
        conditions: Vec<NodeCondition>,
    },
    /// The node's taint for these conditions (none while there are none), decided with the
    /// condition.
    Taint {
        conditions: Vec<NodeCondition>,
    },
    /// Delete dead containers and unused images through the runtime, before any eviction for
    /// this disk signal.
    Reclaim(Box<Reclaim>),
    /// Note which images the runtime has and which are in use (the kubelet's periodic
    /// `detectImages`), so reclaim knows their age.
    DetectImages,
}

/// The policy's decision, the pod it is about, and the kernel timestamp of what triggered it.
#[derive(Debug, Clone)]
pub struct Evict {
    pub eviction: Eviction,
    pub pod: PodInfo,
    pub trigger_ktime_ns: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeEvent {
    /// `EvictionThresholdMet`: a threshold on this resource is newly met.
    ThresholdMet(Resource),
    /// [`events::OOM_KILL_REASON`]: the kernel's OOM killer chose a process.
    OomKill(OomKill),
}

impl NodeEvent {
    pub fn reason(&self) -> &'static str {
        match self {
            Self::ThresholdMet(_) => "EvictionThresholdMet",
            Self::OomKill(_) => events::OOM_KILL_REASON,
        }
    }
}

/// What the executor reports back.
#[derive(Debug, Clone)]
pub enum Outcome {
    Eviction(Box<Report>),
    NodeEvent {
        reason: &'static str,
        error: Option<String>,
    },
    Condition {
        pressure: bool,
        error: Option<String>,
    },
    /// What the taint action did: `Ok(None)` when nothing was sent (dry run, no cluster).
    Taint {
        wanted: bool,
        result: Result<Option<TaintChange>, String>,
    },
    Reclaim(Box<ReclaimOutcome>),
    /// Images detected: how many the runtime has, or why it could not be listed.
    ImagesDetected(Result<usize, String>),
}

/// The outcome of one eviction decision.
#[derive(Debug, Clone)]
pub struct Report {
    pub eviction: Eviction,
    pub trigger_ktime_ns: Option<u64>,
    pub attempt: Attempt,
    /// The pod's `Evicted` event could not be posted (the eviction itself happened).
    pub event_error: Option<String>,
    pub at: SystemTime,
}

pub struct Executor {
    settings: watch::Receiver<Settings>,
    bucket: TokenBucket,
    rates: (u32, u32),
    reporter: NodeConditionReporter,
    generation: u64,
    reclaimer: NodeReclaimer,
}

impl Executor {
    pub fn new(settings: watch::Receiver<Settings>) -> Self {
        let (rates, generation) = {
            let s = settings.borrow();
            ((s.evictions_per_minute, s.eviction_burst), s.generation)
        };
        Self {
            bucket: TokenBucket::new(rates.0, rates.1, Instant::now()),
            rates,
            reporter: NodeConditionReporter::new(),
            generation,
            settings,
            reclaimer: NodeReclaimer::default(),
        }
    }

    /// Runs until the loop drops its sender, or stops listening for outcomes.
    pub async fn run(
        mut self,
        mut actions: mpsc::Receiver<Action>,
        outcomes: mpsc::Sender<Outcome>,
    ) {
        while let Some(action) = actions.recv().await {
            let outcome = self.act(action).await;
            if outcomes.send(outcome).await.is_err() {
                return;
            }
        }
    }

    async fn act(&mut self, action: Action) -> Outcome {
        let settings = self.settings.borrow().clone();
        if settings.generation != self.generation {
            self.generation = settings.generation;
            self.reporter.reset();
        }
        match action {
            Action::Evict(evict) => {
                Outcome::Eviction(Box::new(self.evict(&settings, *evict).await))
            }
            Action::NodeEvent(event) => {
                let reason = event.reason();
                let error = self.node_event(&settings, &event).await;
                Outcome::NodeEvent { reason, error }
            }
            Action::Condition {
                pressure,
                conditions,
            } => {
                let error = self.condition(&settings, pressure, &conditions).await;
                Outcome::Condition { pressure, error }
            }
            Action::Taint { conditions } => {
                let want = taint::wanted(&conditions).filter(|_| settings.taint);
                let result = self.taint(&settings, want.as_ref()).await;
                Outcome::Taint {
                    wanted: want.is_some(),
                    result,
                }
            }
            Action::Reclaim(action) => {
                Outcome::Reclaim(Box::new(self.reclaim(&settings, *action).await))
            }
            Action::DetectImages => Outcome::ImagesDetected(match &settings.runtime {
                Some(runtime) => self.reclaimer.detect(runtime).await,
                None => Err("no container runtime configured".into()),
            }),
        }
    }

    /// Node-level reclaim: plan and carry out (or report, in dry run or standalone), then the
    /// node event.
    async fn reclaim(&mut self, settings: &Settings, action: Reclaim) -> ReclaimOutcome {
        let Some(runtime) = &settings.runtime else {
            return ReclaimOutcome {
                signal: action.signal,
                result: reclaim::ReclaimResult::RuntimeUnavailable,
                plan: None,
                report: Default::default(),
                error: Some("no container runtime configured".into()),
                event_error: None,
                at: SystemTime::now(),
            };
        };
        let standalone = settings.cluster.is_none();
        let watch = self.settings.clone();
        let dry_run = move || standalone || watch.borrow().dry_run;
        let mut outcome = self.reclaimer.reclaim(runtime, action, &dry_run).await;
        // As every node event: not posted in dry run.
        if let Some(ctx) = settings.cluster.as_ref().filter(|_| !dry_run()) {
            if let Some(event) =
                reclaim::build_reclaim_event(&ctx.node, &outcome, SystemTime::now())
            {
                outcome.event_error = events::post(ctx, &event).await.err().map(|e| e.to_string());
            }
        }
        outcome
    }

    /// Writes the node's taint; in dry run (or standalone) only says what it would do.
    async fn taint(
        &mut self,
        settings: &Settings,
        want: Option<&k8s_openapi::api::core::v1::Taint>,
    ) -> Result<Option<TaintChange>, String> {
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
        let dry_run = || self.settings.borrow().dry_run;
        let Some(change) = taint::apply(ctx, want, &dry_run)
            .await
            .map_err(|e| e.to_string())?
        else {
            return Ok(None);
        };
        if change != TaintChange::Unchanged {
            tracing::info!(key = taint::TAINT_KEY, effect = taint::TAINT_EFFECT, value, ?change, node = %ctx.node,
                "node taint written");
        }
        Ok(Some(change))
    }

    async fn evict(&mut self, settings: &Settings, action: Evict) -> Report {
        let Evict {
            eviction,
            pod,
            trigger_ktime_ns,
        } = action;
        let report = |attempt, event_error| Report {
            eviction: eviction.clone(),
            trigger_ktime_ns,
            attempt,
            event_error,
            at: SystemTime::now(),
        };
        // The same rule the policy applied, once more before anything is sent.
        if let Some(reason) = settings.eligibility.check(&pod) {
            tracing::error!(namespace = %pod.namespace, name = %pod.name, %reason,
                "eviction refused by the executor's last check");
            return report(
                Attempt::new(
                    EvictionResult::Refused,
                    format!("refused before any request: {reason}"),
                ),
                None,
            );
        }
        let now = Instant::now();
        let rates = (settings.evictions_per_minute, settings.eviction_burst);
        if rates != self.rates {
            self.bucket.reconfigure(rates.0, rates.1, now);
            self.rates = rates;
        }
        if let Err(wait) = self.bucket.try_take(now) {
            return report(
                Attempt {
                    result: EvictionResult::RateLimited,
                    detail: Some(format!(
                        "evictions_per_minute {} reached; the next in {wait:.1?}",
                        rates.0
                    )),
                    retry_after: Some(wait),
                },
                None,
            );
        }
        let Some(ctx) = settings.cluster.as_ref().filter(|_| !settings.dry_run) else {
            tracing::info!(namespace = %eviction.namespace, name = %eviction.name, signal = %eviction.signal,
                hard = eviction.hard, grace = eviction.grace_period_seconds, message = %eviction.message,
                "dry run: would evict");
            let why = if settings.cluster.is_some() {
                "dry run"
            } else {
                "standalone: no cluster"
            };
            return report(Attempt::new(EvictionResult::DryRun, why), None);
        };
        let dry_run = || self.settings.borrow().dry_run;
        let attempt = evict::evict(
            ctx,
            &eviction,
            settings.pdb_policy,
            &dry_run,
            SystemTime::now(),
        )
        .await;
        if attempt.result.nothing_done() {
            self.bucket.refund(Instant::now());
        }
        let mut event_error = None;
        if matches!(
            attempt.result,
            EvictionResult::Evicted | EvictionResult::PdbOverridden
        ) && !dry_run()
        {
            let event = events::build_pod_evicted(&eviction, &ctx.node, SystemTime::now());
            event_error = events::post(ctx, &event).await.err().map(|e| e.to_string());
        }
        report(attempt, event_error)
    }

    async fn node_event(&mut self, settings: &Settings, event: &NodeEvent) -> Option<String> {
        let ctx = settings.cluster.as_ref()?;
        let now = SystemTime::now();
        let built = match event {
            NodeEvent::ThresholdMet(resource) => {
                events::build_threshold_met(&ctx.node, resource.as_str(), now)
            }
            NodeEvent::OomKill(kill) => events::build_oom_kill(&ctx.node, kill, now),
        };
        if settings.dry_run {
            tracing::info!(reason = ?built.reason, note = ?built.note, "dry run: event not posted");
            return None;
        }
        events::post(ctx, &built).await.err().map(|e| e.to_string())
    }

    async fn condition(
        &mut self,
        settings: &Settings,
        pressure: bool,
        conditions: &[NodeCondition],
    ) -> Option<String> {
        let ctx = settings.cluster.as_ref()?;
        let names: Vec<&str> = conditions.iter().map(|c| c.as_str()).collect();
        let (reason, message) = if pressure {
            (
                "PressureDetected",
                format!("node-agent sees {}", names.join(", ")),
            )
        } else {
            ("NoPressure", "node-agent sees no pressure".to_string())
        };
        self.reporter
            .report(
                ctx,
                pressure,
                reason,
                &message,
                SystemTime::now(),
                settings.dry_run,
            )
            .await
            .err()
            .map(|e| e.to_string())
    }
}

/// Starts the executor; the returned sender takes actions, the receiver gives outcomes.
pub fn spawn(
    settings: watch::Receiver<Settings>,
    backlog: usize,
) -> (
    mpsc::Sender<Action>,
    mpsc::Receiver<Outcome>,
    tokio::task::JoinHandle<()>,
) {
    let (action_tx, action_rx) = mpsc::channel(backlog);
    let (outcome_tx, outcome_rx) = mpsc::channel(backlog);
    let task = tokio::spawn(Executor::new(settings).run(action_rx, outcome_tx));
    (action_tx, outcome_rx, task)
}
