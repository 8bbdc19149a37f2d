//! Node-level reclaim as the kubelet does it before evicting for disk pressure: delete dead
//! containers, then unused images, and evict only if the threshold is still met afterwards.
//!
//! Pure: the plan is a function of (signal, filesystem layout, runtime listing, pods, image
//! history, policy, now) and is returned as data. Nothing here talks to the runtime; an executor
//! carries the plan out step by step through a [`ReclaimRun`], which tells it which step comes
//! next and skips what an earlier failure made pointless, and collects the outcomes into a
//! [`ReclaimReport`].
//!
//! Kubelet sources followed (`pkg/kubelet`):
//! - `eviction/helpers.go` `buildSignalToNodeReclaimFuncs`: which signal reclaims what, by
//!   filesystem layout ([`reclaim_kinds`]);
//! - `eviction/eviction_manager.go` `reclaimNodeLevelResources`: run them in order, observe
//!   again, evict only if a threshold (with its minimum reclaim) is still met — the caller's part;
//! - `kuberuntime/kuberuntime_gc.go` `evictContainers` with `evictNonDeletedPods = true` (what
//!   `DeleteAllUnusedContainers` runs): [`containers`];
//! - `images/image_gc_manager.go` `detectImages`, `imagesInEvictionOrder`, `freeSpace` with
//!   unlimited bytes (what `DeleteUnusedImages` runs): [`images`].

mod containers;
mod display;
mod images;
mod run;
#[cfg(test)]
mod tests;

use std::{collections::BTreeMap, time::Duration};

use jiff::Timestamp;
pub use node_agent_policy::node_reclaim::{reclaim_kinds, FsLayout, ReclaimKind};
use node_agent_policy::Signal;
use serde::Serialize;

pub use containers::{
    ContainerGcPolicy, ContainerReason, ContainerRemoval, KeptContainer, KeptContainerReason,
};
pub use display::human_bytes;
pub use images::{
    ImageGcPolicy, ImageHistory, ImageRecord, ImageRemoval, KeptImage, KeptImageReason,
};
pub use run::{Outcome, ReclaimReport, ReclaimRun, Step, StepResult, Target};

use crate::model::{Container, ContainerStats, Image};

/// The runtime as listed at one moment: every container whatever its state, every image, and
/// the stats the runtime has for containers (for the bytes a removal is expected to free).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Listing {
    pub containers: Vec<Container>,
    pub images: Vec<Image>,
    /// By container ID; containers without stats are absent.
    pub stats: BTreeMap<String, ContainerStats>,
}

/// A pod as the kubelet's pod workers would see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PodPhase {
    /// Pending or running: its newest dead container per name is kept (logs, restarts).
    Active,
    /// Succeeded, failed or evicted, not yet deleted: all its dead containers may go.
    Terminated,
}

/// The pods the agent knows on this node, by UID. A UID absent from the map is a pod that no
/// longer exists; its dead containers may all go — but only once `sources_ready` (the kubelet's
/// `allSourcesReady`: the pod list has been read at least once), so a just-started agent never
/// mistakes a pod it has not heard of yet for a deleted one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PodStates {
    pub sources_ready: bool,
    pub pods: BTreeMap<String, PodPhase>,
}

/// The kubelet's garbage collection settings that shape node reclaim.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GcPolicy {
    pub containers: ContainerGcPolicy,
    pub images: ImageGcPolicy,
}

/// Everything one plan is made from.
#[derive(Debug, Clone, Copy)]
pub struct PlanInput<'a> {
    /// The threshold met that asks for reclaim.
    pub signal: Signal,
    pub layout: FsLayout,
    pub listing: &'a Listing,
    pub pods: &'a PodStates,
    /// Image use as observed before `now` ([`ImageHistory::detect`] at each observation).
    pub history: &'a ImageHistory,
    pub policy: &'a GcPolicy,
    pub now: Timestamp,
}

/// What node-level reclaim would delete, in the order it deletes it: dead containers first,
/// then unused images least recently used first. Also what it keeps and why, so a dry run can
/// say it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReclaimPlan {
    #[serde(serialize_with = "signal_name")]
    pub signal: Signal,
    pub layout: FsLayout,
    pub kinds: Vec<ReclaimKind>,
    pub planned_at: Timestamp,
    pub containers: Vec<ContainerRemoval>,
    pub images: Vec<ImageRemoval>,
    pub kept_containers: Vec<KeptContainer>,
    pub kept_images: Vec<KeptImage>,
}

impl ReclaimPlan {
    /// Builds the plan. Images used only by containers this plan removes count as unused, as
    /// they are when the kubelet looks at images after its container pass; each such image
    /// names those containers, so a failed container removal keeps its image.
    pub fn new(input: PlanInput<'_>) -> Self {
        let kinds = reclaim_kinds(input.signal, input.layout).to_vec();
        let mut plan = Self {
            signal: input.signal,
            layout: input.layout,
            kinds: kinds.clone(),
            planned_at: input.now,
            containers: Vec::new(),
            images: Vec::new(),
            kept_containers: Vec::new(),
            kept_images: Vec::new(),
        };
        if kinds.contains(&ReclaimKind::DeadContainers) {
            let (removals, kept) = containers::plan(
                &input.listing.containers,
                &input.listing.stats,
                input.pods,
                &input.policy.containers,
                input.now,
            );
            plan.containers = removals;
            plan.kept_containers = kept;
        }
        if kinds.contains(&ReclaimKind::UnusedImages) {
            let (removals, kept) = images::plan(
                input.listing,
                &plan.containers,
                input.history,
                &input.policy.images,
                input.now,
            );
            plan.images = removals;
            plan.kept_images = kept;
        }
        plan
    }

    pub fn is_empty(&self) -> bool {
        self.containers.is_empty() && self.images.is_empty()
    }

    /// Bytes the plan is expected to free if every step succeeds: the images' sizes as the
    /// runtime reports them plus the writable layers of the containers that have stats. The
    /// truth is what the next observation shows; this is what a dry run can promise.
    pub fn expected_bytes(&self) -> u64 {
        let containers: u64 = self
            .containers
            .iter()
            .filter_map(|c| c.expected_bytes)
            .sum();
        let images: u64 = self.images.iter().map(|i| i.size_bytes).sum();
        containers.saturating_add(images)
    }

    /// Starts carrying the plan out.
    pub fn run(&self) -> ReclaimRun<'_> {
        ReclaimRun::new(self)
    }
}

fn signal_name<S: serde::Serializer>(signal: &Signal, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(signal.as_str())
}

/// `now - since`, saturating at zero (clocks of the runtime and the agent may disagree).
fn age(now: Timestamp, since: Timestamp) -> Duration {
    let span = now.duration_since(since);
    Duration::try_from(span).unwrap_or(Duration::ZERO)
}
