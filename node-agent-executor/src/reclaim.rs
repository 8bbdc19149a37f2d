//! Node-level reclaim, the executor's runtime sink: the kubelet deletes dead containers and
//! unused images through the container runtime before it evicts for disk pressure
//! (`reclaimNodeLevelResources`); the plan decides when ([`Reclaim`] as an action), this
//! module lists the runtime, builds the pure [`ReclaimPlan`], carries it out step by step (or,
//! in dry run, only reports it) and returns a [`ReclaimOutcome`] for the loop, which observes
//! the filesystem again before anything is evicted for that signal. This is the one runner of
//! a reclaim plan.
//!
//! The runtime is reached only from the executor's runtime lane: a lazily connected CRI
//! client, kept until the `cri:` settings change, and the kubelet's image history
//! (`imageRecords`), updated by [`Action::DetectImages`](crate::Action::DetectImages) and at
//! each reclaim.

use std::time::SystemTime;

use k8s_openapi::api::events::v1::Event;
use node_agent_cri::{
    reclaim::{
        human_bytes, FsLayout, GcPolicy, ImageHistory, PlanInput, PodStates, ReclaimPlan,
        ReclaimReport, Step, StepResult, Target,
    },
    CriClient, CriError, CriSettings,
};
use node_agent_kube::{
    api::ApiError,
    events::{self, NodeReclaim},
};
use node_agent_policy::Signal;

use crate::lanes::Refused;

/// Why the runtime was not asked, or did not answer.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("no container runtime configured")]
    NotConfigured,
    #[error(transparent)]
    Cri(#[from] CriError),
    #[error(transparent)]
    Busy(Refused),
    #[error("the container runtime lists no container {0}")]
    NoSuchContainer(String),
}

/// The container runtime node-level reclaim goes through (`cri:`), and its GC settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runtime {
    pub settings: CriSettings,
    pub gc: GcPolicy,
}

/// What image detection found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detected {
    /// How many images the runtime has.
    pub images: usize,
    /// Where it keeps images (`ImageFsInfo`'s first image filesystem), if it says.
    pub image_fs: Option<String>,
    /// Where it keeps writable layers (its first container filesystem), if it says.
    pub container_fs: Option<String>,
}

/// Carry out node-level reclaim for a met threshold of `signal`.
#[derive(Debug, Clone, PartialEq)]
pub struct Reclaim {
    pub signal: Signal,
    pub layout: FsLayout,
    /// The pods the pod source lists, for the container GC's rules.
    pub pods: PodStates,
}

/// How a reclaim went, as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReclaimResult {
    /// Every step of a non-empty plan succeeded.
    Reclaimed,
    /// Some steps failed or were skipped; the others succeeded or not.
    Partial,
    /// The plan was empty: nothing dead, nothing unused (or all too new or kept).
    NothingToReclaim,
    /// Dry run: the plan was reported, nothing deleted.
    DryRun,
    /// The runtime could not be listed: nothing deleted.
    RuntimeUnavailable,
}

impl ReclaimResult {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reclaimed => "reclaimed",
            Self::Partial => "partial",
            Self::NothingToReclaim => "nothing_to_reclaim",
            Self::DryRun => "dry_run",
            Self::RuntimeUnavailable => "runtime_unavailable",
        }
    }

    pub const ALL: [ReclaimResult; 5] = [
        Self::Reclaimed,
        Self::Partial,
        Self::NothingToReclaim,
        Self::DryRun,
        Self::RuntimeUnavailable,
    ];
}

impl std::str::FromStr for ReclaimResult {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| format!("{s:?} is not a reclaim result"))
    }
}

/// What the executor reports about one reclaim.
#[derive(Debug)]
pub struct ReclaimOutcome {
    pub signal: Signal,
    pub result: ReclaimResult,
    /// `None` when the runtime could not be listed.
    pub plan: Option<ReclaimPlan>,
    /// The steps carried out (empty in dry run).
    pub report: ReclaimReport,
    /// Why the runtime could not be listed.
    pub error: Option<RuntimeError>,
    /// The node event could not be posted.
    pub event_error: Option<ApiError>,
    pub at: SystemTime,
}

/// Counts of one kind of object (containers or images) in an outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub removed: u64,
    pub failed: u64,
    pub skipped: u64,
    /// Dry run: what would have been removed.
    pub would_remove: u64,
}

impl ReclaimOutcome {
    /// Nothing was done: the runtime could not be asked.
    pub fn unavailable(signal: Signal, error: RuntimeError) -> Self {
        Self {
            signal,
            result: ReclaimResult::RuntimeUnavailable,
            plan: None,
            report: ReclaimReport::default(),
            error: Some(error),
            event_error: None,
            at: SystemTime::now(),
        }
    }

    /// Bytes the removed objects were expected to free (the runtime's sizes); in dry run, what
    /// the whole plan would free.
    pub fn expected_bytes(&self) -> u64 {
        match (self.result, &self.plan) {
            (ReclaimResult::DryRun, Some(plan)) => plan.expected_bytes(),
            _ => self.report.expected_bytes_removed(),
        }
    }

    /// `(containers, images)`.
    pub fn tallies(&self) -> (Tally, Tally) {
        let (mut containers, mut images) = (Tally::default(), Tally::default());
        if self.result == ReclaimResult::DryRun {
            if let Some(plan) = &self.plan {
                containers.would_remove = plan.containers.len() as u64;
                images.would_remove = plan.images.len() as u64;
            }
        }
        for o in &self.report.outcomes {
            let t = match o.target {
                Target::Container { .. } => &mut containers,
                Target::Image { .. } => &mut images,
            };
            match o.result {
                StepResult::Removed => t.removed += 1,
                StepResult::Failed { .. } => t.failed += 1,
                StepResult::Skipped { .. } => t.skipped += 1,
            }
        }
        (containers, images)
    }

    /// The first failure, for logs and the event.
    pub fn first_failure(&self) -> Option<String> {
        self.error.as_ref().map(ToString::to_string).or_else(|| {
            self.report.outcomes.iter().find_map(|o| match &o.result {
                StepResult::Failed { error } => Some(error.clone()),
                _ => None,
            })
        })
    }

    /// One line for logs, the trace and the node event.
    pub fn summary(&self) -> String {
        let (c, i) = self.tallies();
        let bytes = human_bytes(self.expected_bytes());
        let signal = self.signal;
        match self.result {
            ReclaimResult::RuntimeUnavailable => format!(
                "node-level reclaim for {signal} not done: the container runtime is unavailable ({})",
                self.error
                    .as_ref()
                    .map_or_else(|| "unknown error".to_string(), ToString::to_string)
            ),
            ReclaimResult::NothingToReclaim => {
                format!("node-level reclaim for {signal}: no dead container or unused image to remove")
            }
            ReclaimResult::DryRun => format!(
                "dry run: node-level reclaim for {signal} would remove {} dead container(s) and {} unused image(s), expected to free {bytes}",
                c.would_remove, i.would_remove
            ),
            ReclaimResult::Reclaimed | ReclaimResult::Partial => {
                let mut s = format!(
                    "node-level reclaim for {signal}: removed {} dead container(s) and {} unused image(s), expected to free {bytes}",
                    c.removed, i.removed
                );
                let (failed, skipped) = (c.failed + i.failed, c.skipped + i.skipped);
                if failed + skipped > 0 {
                    s.push_str(&format!("; {failed} removal(s) failed, {skipped} skipped"));
                    if let Some(e) = self.first_failure() {
                        s.push_str(&format!(" (first: {e})"));
                    }
                }
                s
            }
        }
    }
}

/// The executor's runtime handle and what it remembers about images.
#[derive(Default)]
pub(crate) struct NodeReclaimer {
    client: Option<(CriSettings, CriClient)>,
    history: ImageHistory,
}

impl NodeReclaimer {
    /// The client for `settings`; a new one (connecting lazily) when they changed.
    fn client(&mut self, settings: &CriSettings) -> CriClient {
        match &self.client {
            Some((s, c)) if s == settings => c.clone(),
            _ => {
                let c = CriClient::lazy(settings);
                self.client = Some((settings.clone(), c.clone()));
                // Another runtime: what was seen of the previous one's images no longer holds.
                self.history = ImageHistory::default();
                c
            }
        }
    }

    /// The kubelet's periodic `detectImages`: images first seen, images in use now; and where
    /// the runtime keeps images and writable layers (`ImageFsInfo`), from which the daemon
    /// decides the filesystem layout as the kubelet does.
    pub(crate) async fn detect(&mut self, runtime: &Runtime) -> Result<Detected, RuntimeError> {
        let client = self.client(&runtime.settings);
        let (images, containers, fs) = tokio::try_join!(
            client.list_images(),
            client.list_containers(None),
            client.image_fs_info()
        )?;
        self.history
            .detect(&images, &containers, jiff::Timestamp::now());
        let first = |list: &[node_agent_cri::model::FilesystemUsage]| {
            list.first().map(|f| f.mountpoint.clone())
        };
        Ok(Detected {
            images: images.len(),
            image_fs: first(&fs.image_filesystems),
            container_fs: first(&fs.container_filesystems),
        })
    }

    /// Whose container `id` is, from the labels the kubelet gave it.
    pub(crate) async fn identify(
        &mut self,
        runtime: &Runtime,
        id: &str,
    ) -> Result<Identity, RuntimeError> {
        let client = self.client(&runtime.settings);
        let containers = client.list_containers(None).await?;
        let c = containers
            .into_iter()
            .find(|c| c.id == id)
            .ok_or_else(|| RuntimeError::NoSuchContainer(id.to_string()))?;
        Ok(Identity {
            namespace: c.pod.namespace,
            name: c.pod.name,
            uid: c.pod.uid,
            container: c.name,
        })
    }

    /// Lists the runtime, plans, and carries the plan out unless `dry_run()` says otherwise
    /// (asked before every step: a reload to dry run holds from that moment).
    pub(crate) async fn reclaim(
        &mut self,
        runtime: &Runtime,
        action: Reclaim,
        dry_run: &(dyn Fn() -> bool + Sync),
    ) -> ReclaimOutcome {
        let client = self.client(&runtime.settings);
        let mut outcome = ReclaimOutcome {
            signal: action.signal,
            result: ReclaimResult::RuntimeUnavailable,
            plan: None,
            report: ReclaimReport::default(),
            error: None,
            event_error: None,
            at: SystemTime::now(),
        };
        let listing = match client.listing().await {
            Ok(l) => l,
            Err(e) => {
                outcome.error = Some(e.into());
                return outcome;
            }
        };
        let now = jiff::Timestamp::now();
        // New images are first seen now; use is judged by the plan itself, after its
        // container pass, as the kubelet's image GC runs after its container GC.
        self.history.detect(&listing.images, &[], now);
        let plan = ReclaimPlan::new(PlanInput {
            signal: action.signal,
            layout: action.layout,
            listing: &listing,
            pods: &action.pods,
            history: &self.history,
            policy: &runtime.gc,
            now,
        });
        if plan.is_empty() {
            tracing::debug!(plan = %plan, "node-level reclaim");
            outcome.result = ReclaimResult::NothingToReclaim;
        } else if dry_run() {
            // What a dry run shows: every object it would remove or keep, and why.
            tracing::info!(plan = %plan, "dry run: node-level reclaim not carried out");
            outcome.result = ReclaimResult::DryRun;
        } else {
            tracing::info!(plan = %plan, "node-level reclaim");
            let mut run = plan.run();
            let mut stopped = false;
            loop {
                if dry_run() {
                    stopped = true;
                    break;
                }
                let Some(step) = run.next_step() else { break };
                let result = match step {
                    Step::RemoveContainer(c) => client.remove_container(&c.id).await,
                    Step::RemoveImage(i) => client.remove_image(&i.id).await,
                };
                run.record(result);
            }
            outcome.report = run.finish();
            let all = outcome.report.outcomes.len() == plan.containers.len() + plan.images.len();
            let clean = outcome.report.removed().count() == outcome.report.outcomes.len();
            outcome.result = match (stopped, all && clean) {
                (true, _) if outcome.report.outcomes.is_empty() => ReclaimResult::DryRun,
                (false, true) => ReclaimResult::Reclaimed,
                _ => ReclaimResult::Partial,
            };
        }
        outcome.plan = Some(plan);
        outcome.at = SystemTime::now();
        outcome
    }
}

/// The node event a reclaim leaves ([`events::build_node_reclaim`]): freed when it removed
/// something and nothing failed, failed when a removal failed or the runtime could not be
/// reached; none when there was nothing to do or in dry run.
pub fn build_reclaim_event(node: &str, outcome: &ReclaimOutcome, now: SystemTime) -> Option<Event> {
    let ended = match outcome.result {
        ReclaimResult::Reclaimed => NodeReclaim::Freed,
        ReclaimResult::Partial | ReclaimResult::RuntimeUnavailable => NodeReclaim::Failed,
        ReclaimResult::NothingToReclaim | ReclaimResult::DryRun => return None,
    };
    Some(events::build_node_reclaim(
        node,
        ended,
        outcome.summary(),
        now,
    ))
}

/// Whose container it is, as the runtime's labels say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub container: String,
}

#[cfg(test)]
mod tests {
    use node_agent_cri::{
        model::{ContainerState, PodRef},
        reclaim::{ContainerReason, ContainerRemoval, ImageRemoval, Outcome, ReclaimKind},
    };

    use super::*;

    const MIB: u64 = 1 << 20;

    fn plan() -> ReclaimPlan {
        let at: jiff::Timestamp = "2026-11-22T21:00:00Z".parse().unwrap();
        ReclaimPlan {
            signal: Signal::NodeFsAvailable,
            layout: FsLayout::Shared,
            kinds: vec![ReclaimKind::DeadContainers, ReclaimKind::UnusedImages],
            planned_at: at,
            containers: vec![ContainerRemoval {
                id: "c1".into(),
                pod: PodRef::default(),
                name: "job".into(),
                attempt: 0,
                state: ContainerState::Exited,
                created_at: at,
                image_id: "i1".into(),
                reason: ContainerReason::PodGone,
                expected_bytes: Some(4 * MIB),
            }],
            images: vec![ImageRemoval {
                id: "i1".into(),
                repo_tags: vec!["localhost/x:1".into()],
                size_bytes: 9 * MIB,
                first_detected: at,
                last_used: None,
                after_containers: vec!["c1".into()],
            }],
            kept_containers: vec![],
            kept_images: vec![],
        }
    }

    fn step(id: &str, container: bool, result: StepResult, bytes: u64) -> Outcome {
        Outcome {
            target: if container {
                Target::Container {
                    id: id.into(),
                    pod: PodRef::default(),
                    name: "job".into(),
                }
            } else {
                Target::Image {
                    id: id.into(),
                    repo_tags: vec![],
                }
            },
            result,
            expected_bytes: Some(bytes),
        }
    }

    fn cri_error(call: &'static str, problem: &str) -> RuntimeError {
        RuntimeError::Cri(CriError::BadResponse {
            call,
            endpoint: node_agent_cri::config::Endpoint::parse("unix:///x").unwrap(),
            problem: problem.into(),
        })
    }

    fn outcome(result: ReclaimResult, steps: Vec<Outcome>) -> ReclaimOutcome {
        ReclaimOutcome {
            signal: Signal::NodeFsAvailable,
            result,
            plan: (result != ReclaimResult::RuntimeUnavailable).then(plan),
            report: ReclaimReport { outcomes: steps },
            error: (result == ReclaimResult::RuntimeUnavailable)
                .then(|| cri_error("ListContainers", "failed (Unavailable)")),
            event_error: None,
            at: SystemTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn each_result_says_what_it_did_in_the_summary_the_event_and_the_figures() {
        let removed = || {
            vec![
                step("c1", true, StepResult::Removed, 4 * MIB),
                step("i1", false, StepResult::Removed, 9 * MIB),
            ]
        };
        let failed = vec![
            step(
                "c1",
                true,
                StepResult::Failed {
                    error: "busy".into(),
                },
                4 * MIB,
            ),
            step(
                "i1",
                false,
                StepResult::Skipped {
                    blocked_by: vec!["c1".into()],
                },
                9 * MIB,
            ),
        ];
        // (behaviour, outcome, event (type, reason) or none, summary fragment, expected bytes)
        type Case = (
            &'static str,
            ReclaimOutcome,
            Option<(&'static str, &'static str)>,
            &'static str,
            u64,
        );
        let cases: Vec<Case> = vec![
            ("everything removed: a Normal event with the bytes",
             outcome(ReclaimResult::Reclaimed, removed()), Some(("Normal", "FreedDiskSpace")),
             "removed 1 dead container(s) and 1 unused image(s), expected to free 13.0 MiB", 13 * MIB),
            ("a failure: the kubelet's warning, naming the first error",
             outcome(ReclaimResult::Partial, failed), Some(("Warning", "FreeDiskSpaceFailed")),
             "1 removal(s) failed, 1 skipped (first: busy)", 0),
            ("dry run: what it would remove, no event",
             outcome(ReclaimResult::DryRun, vec![]), None,
             "dry run: node-level reclaim for nodefs.available would remove 1 dead container(s) and 1 unused image(s), expected to free 13.0 MiB", 13 * MIB),
            ("nothing to remove: no event",
             outcome(ReclaimResult::NothingToReclaim, vec![]), None, "no dead container or unused image", 0),
            ("runtime unavailable: a warning naming the runtime's error",
             outcome(ReclaimResult::RuntimeUnavailable, vec![]), Some(("Warning", "FreeDiskSpaceFailed")),
             "the container runtime is unavailable (CRI ListContainers at unix:///x: unexpected answer: failed (Unavailable)", 0),
        ];
        for (behaviour, o, event, summary, bytes) in cases {
            assert!(
                o.summary().contains(summary),
                "{behaviour}: {}",
                o.summary()
            );
            assert_eq!(o.expected_bytes(), bytes, "{behaviour}");
            let built = build_reclaim_event("node-1", &o, SystemTime::UNIX_EPOCH);
            let got = built
                .as_ref()
                .map(|e| (e.type_.as_deref().unwrap(), e.reason.as_deref().unwrap()));
            assert_eq!(got, event, "{behaviour}");
            if let Some(e) = built {
                assert_eq!(e.note.as_deref(), Some(o.summary().as_str()), "{behaviour}");
                assert_eq!(
                    e.regarding.unwrap().kind.as_deref(),
                    Some("Node"),
                    "{behaviour}"
                );
            }
        }
    }

    #[test]
    fn tallies_count_steps_by_object_and_a_dry_run_by_plan() {
        let o = outcome(
            ReclaimResult::Partial,
            vec![
                step("c1", true, StepResult::Removed, 4 * MIB),
                step(
                    "i1",
                    false,
                    StepResult::Failed { error: "x".into() },
                    9 * MIB,
                ),
            ],
        );
        let (c, i) = o.tallies();
        assert_eq!((c.removed, c.failed, i.removed, i.failed), (1, 0, 0, 1));
        let (c, i) = outcome(ReclaimResult::DryRun, vec![]).tallies();
        assert_eq!(
            (c.would_remove, i.would_remove, c.removed, i.removed),
            (1, 1, 0, 0)
        );
    }

    #[test]
    fn a_long_error_is_cut_to_the_events_note_limit() {
        let mut o = outcome(ReclaimResult::RuntimeUnavailable, vec![]);
        o.error = Some(cri_error("ListImages", &"é".repeat(2000)));
        let e = build_reclaim_event("n", &o, SystemTime::UNIX_EPOCH).unwrap();
        let note = e.note.unwrap();
        assert!(note.len() <= 1024 && note.ends_with('…'), "{}", note.len());
    }

    #[test]
    fn results_travel_by_name() {
        for r in ReclaimResult::ALL {
            assert_eq!(r.as_str().parse::<ReclaimResult>(), Ok(r));
        }
        assert!("done".parse::<ReclaimResult>().is_err());
    }
}
