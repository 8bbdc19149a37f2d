//! Which signals the kubelet reclaims at node level before evicting, by filesystem layout
//! (`buildSignalToNodeReclaimFuncs` in `pkg/kubelet/eviction/helpers.go`). The reclaim itself
//! talks to the container runtime (`node-agent-cri`); this is the table both it and `simulate`
//! follow.

use std::fmt;

use serde::Serialize;

use crate::config::EvictionConfig;
use crate::evaluate::is_met;
use crate::observe::Observations;
use crate::signal::Signal;

/// Where the runtime keeps images and writable layers relative to the kubelet's root
/// (`nodefs`). The kubelet decides this from the runtime's `ImageFsInfo` and the devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FsLayout {
    /// Images, writable layers and the kubelet's root share one filesystem.
    Shared,
    /// Images and writable layers on a filesystem of their own (`imagefs`).
    SeparateImageFs,
    /// Images on `imagefs`, writable layers on `nodefs` (the kubelet's split image filesystem).
    SplitImageFs,
}

/// One of the kubelet's node reclaim functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReclaimKind {
    /// `containerGC.DeleteAllUnusedContainers`.
    DeadContainers,
    /// `imageGC.DeleteUnusedImages`.
    UnusedImages,
}

/// What the kubelet runs for a met threshold of `signal`, in order. Empty: nothing to reclaim
/// at node level (memory, PIDs; `nodefs` when images live elsewhere), the caller evicts at once.
pub fn reclaim_kinds(signal: Signal, layout: FsLayout) -> &'static [ReclaimKind] {
    use ReclaimKind::{DeadContainers, UnusedImages};
    use Signal::{ImageFsAvailable, ImageFsInodesFree, NodeFsAvailable, NodeFsInodesFree};
    match (layout, signal) {
        (
            FsLayout::Shared,
            NodeFsAvailable | NodeFsInodesFree | ImageFsAvailable | ImageFsInodesFree,
        )
        | (FsLayout::SeparateImageFs, ImageFsAvailable | ImageFsInodesFree) => {
            &[DeadContainers, UnusedImages]
        }
        (FsLayout::SplitImageFs, ImageFsAvailable | ImageFsInodesFree) => &[UnusedImages],
        (FsLayout::SplitImageFs, NodeFsAvailable | NodeFsInodesFree) => &[DeadContainers],
        _ => &[],
    }
}

impl fmt::Display for FsLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FsLayout::Shared => "images share the node filesystem",
            FsLayout::SeparateImageFs => "images and containers on imagefs",
            FsLayout::SplitImageFs => "images on imagefs, containers on nodefs",
        })
    }
}

impl FsLayout {
    /// The signals whose filesystem holds the images (and dead containers' layers), so what
    /// node-level reclaim frees shows in them.
    fn freed_on(self) -> &'static [Signal] {
        use Signal::{ImageFsAvailable, ImageFsInodesFree, NodeFsAvailable, NodeFsInodesFree};
        match self {
            FsLayout::Shared => &[
                NodeFsAvailable,
                NodeFsInodesFree,
                ImageFsAvailable,
                ImageFsInodesFree,
            ],
            FsLayout::SeparateImageFs | FsLayout::SplitImageFs => {
                &[ImageFsAvailable, ImageFsInodesFree]
            }
        }
    }
}

/// What a node-level reclaim freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Freed {
    pub bytes: u64,
    pub inodes: u64,
}

/// The observations after a reclaim freed `freed` on the filesystem that holds images.
pub fn observe_freed(observations: &mut Observations, layout: FsLayout, freed: Freed) {
    for &signal in layout.freed_on() {
        let Some(o) = observations.get_mut(&signal) else {
            continue;
        };
        let add = match signal {
            Signal::NodeFsInodesFree | Signal::ImageFsInodesFree => freed.inodes,
            _ => freed.bytes,
        };
        o.available = o
            .available
            .saturating_add(i64::try_from(add).unwrap_or(i64::MAX));
    }
}

/// The kubelet's test after a reclaim (`reclaimNodeLevelResources`): every threshold, its
/// minimum reclaim added, grace periods ignored; `true` while any is still met, and pods must
/// then be evicted.
pub fn still_met_after_reclaim(config: &EvictionConfig, observations: &Observations) -> bool {
    config
        .thresholds()
        .iter()
        .any(|t| is_met(t, observations, true))
}
