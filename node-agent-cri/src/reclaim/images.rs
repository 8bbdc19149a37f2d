//! Which unused images go: the kubelet's image GC as `DeleteUnusedImages` runs it (free
//! without a byte limit).
//!
//! The kubelet remembers, per image ID, when it first saw the image and when it last saw a
//! container use it ([`ImageHistory`], its `imageRecords`, updated by `detectImages` every five
//! minutes and before each collection). An image is removed when no container (whatever its
//! state) uses it, the runtime has not pinned it, and it was first seen at least `min_age` ago;
//! least recently used first, ties broken by first seen.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use jiff::Timestamp;
use serde::Serialize;

use super::{age, ContainerRemoval, Listing};
use crate::model::{Container, Image};

/// The kubelet's image GC settings that apply to reclaim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ImageGcPolicy {
    /// `imageMinimumGCAge`: images first seen less than this ago stay (they may have just been
    /// pulled for a container about to start). Default 2 minutes.
    pub min_age: Duration,
    /// Images never removed, by ID, tag or digest: the sandbox (pause) image on runtimes that
    /// do not pin it (containerd before 1.7), whose removal would stop new pods from starting
    /// on a node without registry access.
    pub keep: Vec<String>,
}

impl Default for ImageGcPolicy {
    fn default() -> Self {
        Self {
            min_age: Duration::from_secs(120),
            keep: Vec::new(),
        }
    }
}

/// What the kubelet remembers about one image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ImageRecord {
    pub first_detected: Timestamp,
    /// `None`: never seen in use.
    pub last_used: Option<Timestamp>,
}

/// The kubelet's `imageRecords`: image use over time, by image ID. Kept by the caller between
/// observations; the agent's start is the kubelet's start (nothing known before it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ImageHistory {
    records: BTreeMap<String, ImageRecord>,
}

impl ImageHistory {
    /// The kubelet's `detectImages`: new images are first seen `now`; images some container
    /// uses were last used `now`; images gone are forgotten.
    pub fn detect(&mut self, images: &[Image], containers: &[Container], now: Timestamp) {
        let in_use: BTreeSet<&str> = containers.iter().map(|c| c.image_id.as_str()).collect();
        self.detect_with(images, &in_use, now);
    }

    fn detect_with(&mut self, images: &[Image], in_use: &BTreeSet<&str>, now: Timestamp) {
        let present: BTreeSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
        self.records.retain(|id, _| present.contains(id.as_str()));
        for image in images {
            let record = self.records.entry(image.id.clone()).or_insert(ImageRecord {
                first_detected: now,
                last_used: None,
            });
            if in_use.contains(image.id.as_str()) {
                record.last_used = Some(now);
            }
        }
    }

    pub fn get(&self, id: &str) -> Option<&ImageRecord> {
        self.records.get(id)
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

/// An unused image the plan removes (`RemoveImage` by ID).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ImageRemoval {
    pub id: String,
    pub repo_tags: Vec<String>,
    pub size_bytes: u64,
    pub first_detected: Timestamp,
    pub last_used: Option<Timestamp>,
    /// Containers of this plan that use the image: it is unused only once they are removed,
    /// so if one of them cannot be, the image stays.
    pub after_containers: Vec<String>,
}

/// Why an image stays.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "reason")]
pub enum KeptImageReason {
    /// A container that stays uses it (running or not).
    InUse { containers: Vec<String> },
    /// The runtime pinned it.
    Pinned,
    /// Named in the policy's `keep` list.
    Kept,
    /// First seen less than `min_age` ago.
    TooNew { age_seconds: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeptImage {
    pub id: String,
    pub repo_tags: Vec<String>,
    pub size_bytes: u64,
    #[serde(flatten)]
    pub reason: KeptImageReason,
}

pub(super) fn plan(
    listing: &Listing,
    removed_containers: &[ContainerRemoval],
    history: &ImageHistory,
    policy: &ImageGcPolicy,
    now: Timestamp,
) -> (Vec<ImageRemoval>, Vec<KeptImage>) {
    let removed: BTreeSet<&str> = removed_containers.iter().map(|c| c.id.as_str()).collect();
    let mut users: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for c in listing
        .containers
        .iter()
        .filter(|c| !removed.contains(c.id.as_str()))
    {
        users
            .entry(c.image_id.as_str())
            .or_default()
            .push(c.id.as_str());
    }
    // The kubelet detects images after its container pass, so what only removed containers
    // used is no longer in use; what staying containers use was last used now.
    let in_use: BTreeSet<&str> = users.keys().copied().collect();
    let mut seen = history.clone();
    seen.detect_with(&listing.images, &in_use, now);

    let mut kept = Vec::new();
    let mut candidates = Vec::new();
    for image in &listing.images {
        let reason = if let Some(containers) = users.get(image.id.as_str()) {
            Some(KeptImageReason::InUse {
                containers: containers.iter().map(|s| s.to_string()).collect(),
            })
        } else if image.pinned {
            Some(KeptImageReason::Pinned)
        } else if policy.keep.iter().any(|k| image.is_named(k)) {
            Some(KeptImageReason::Kept)
        } else {
            None
        };
        // detect_with recorded every listed image; the fallback is what it would record.
        let record = seen.get(&image.id).cloned().unwrap_or(ImageRecord {
            first_detected: now,
            last_used: None,
        });
        let reason = reason.or_else(|| {
            let age = age(now, record.first_detected);
            (age < policy.min_age).then_some(KeptImageReason::TooNew {
                age_seconds: age.as_secs(),
            })
        });
        match reason {
            Some(reason) => kept.push(KeptImage {
                id: image.id.clone(),
                repo_tags: image.repo_tags.clone(),
                size_bytes: image.size_bytes,
                reason,
            }),
            None => candidates.push((image, record)),
        }
    }
    // byLastUsedAndDetected: never used sorts first (Go's zero time), then first detected.
    candidates.sort_by(|(a, ra), (b, rb)| {
        ra.last_used
            .cmp(&rb.last_used)
            .then(ra.first_detected.cmp(&rb.first_detected))
            .then(a.id.cmp(&b.id))
    });
    let removals = candidates
        .into_iter()
        .map(|(image, record)| ImageRemoval {
            id: image.id.clone(),
            repo_tags: image.repo_tags.clone(),
            size_bytes: image.size_bytes,
            first_detected: record.first_detected,
            last_used: record.last_used,
            after_containers: removed_containers
                .iter()
                .filter(|c| c.image_id == image.id)
                .map(|c| c.id.clone())
                .collect(),
        })
        .collect();
    (removals, kept)
}
