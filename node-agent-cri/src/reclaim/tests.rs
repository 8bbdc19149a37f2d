//! Table tests: one row per behaviour of the kubelet's reclaim that the plan must reproduce.

use std::time::Duration;

use jiff::Timestamp;
use node_agent_policy::Signal;

use super::*;
use crate::model::{Container, ContainerState, ContainerStats, FilesystemUsage, Image, PodRef};

const T0: i64 = 1_700_000_000;

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(T0 + seconds).unwrap()
}

/// A container `id` of pod `uid`, named `name`, attempt, state, created at `t` seconds.
fn container(
    id: &str,
    uid: &str,
    name: &str,
    attempt: u32,
    state: ContainerState,
    t: i64,
    image: &str,
) -> Container {
    Container {
        id: id.into(),
        pod_sandbox_id: format!("sandbox-{uid}"),
        name: name.into(),
        attempt,
        pod: PodRef {
            uid: uid.into(),
            namespace: "shop".into(),
            name: format!("pod-{uid}"),
        },
        image: image.into(),
        image_id: image.into(),
        state,
        created_at: at(t),
    }
}

fn image(id: &str, size: u64) -> Image {
    Image {
        id: id.into(),
        repo_tags: vec![format!("registry.local/{id}:1")],
        repo_digests: vec![],
        size_bytes: size,
        pinned: false,
    }
}

use ContainerState::{Created, Exited, Running, Unknown};

fn pods(ready: bool, entries: &[(&str, PodPhase)]) -> PodStates {
    PodStates {
        sources_ready: ready,
        pods: entries.iter().map(|(u, p)| (u.to_string(), *p)).collect(),
    }
}

fn plan_containers(
    containers: Vec<Container>,
    pods: &PodStates,
    policy: ContainerGcPolicy,
    now: i64,
) -> ReclaimPlan {
    let listing = Listing {
        containers,
        ..Default::default()
    };
    ReclaimPlan::new(PlanInput {
        signal: Signal::NodeFsAvailable,
        layout: FsLayout::Shared,
        listing: &listing,
        pods,
        history: &ImageHistory::default(),
        policy: &GcPolicy {
            containers: policy,
            images: ImageGcPolicy::default(),
        },
        now: at(now),
    })
}

#[test]
fn reclaim_kinds_follow_the_kubelets_table() {
    use ReclaimKind::{DeadContainers as C, UnusedImages as I};
    let cases: &[(&str, Signal, FsLayout, &[ReclaimKind])] = &[
        (
            "shared fs: nodefs pressure deletes containers then images",
            Signal::NodeFsAvailable,
            FsLayout::Shared,
            &[C, I],
        ),
        (
            "shared fs: nodefs inodes too",
            Signal::NodeFsInodesFree,
            FsLayout::Shared,
            &[C, I],
        ),
        (
            "shared fs: imagefs signals share the same functions",
            Signal::ImageFsAvailable,
            FsLayout::Shared,
            &[C, I],
        ),
        (
            "imagefs: nodefs pressure reclaims nothing at node level",
            Signal::NodeFsAvailable,
            FsLayout::SeparateImageFs,
            &[],
        ),
        (
            "imagefs: imagefs pressure deletes containers then images",
            Signal::ImageFsAvailable,
            FsLayout::SeparateImageFs,
            &[C, I],
        ),
        (
            "imagefs: imagefs inodes too",
            Signal::ImageFsInodesFree,
            FsLayout::SeparateImageFs,
            &[C, I],
        ),
        (
            "split: imagefs pressure deletes images only",
            Signal::ImageFsAvailable,
            FsLayout::SplitImageFs,
            &[I],
        ),
        (
            "split: nodefs pressure deletes containers only",
            Signal::NodeFsInodesFree,
            FsLayout::SplitImageFs,
            &[C],
        ),
        (
            "memory is never reclaimed at node level",
            Signal::MemoryAvailable,
            FsLayout::Shared,
            &[],
        ),
        ("nor PIDs", Signal::PidAvailable, FsLayout::Shared, &[]),
        (
            "containerfs signals have no reclaim functions in the kubelet",
            Signal::ContainerFsAvailable,
            FsLayout::SplitImageFs,
            &[],
        ),
    ];
    for (behaviour, signal, layout, expected) in cases {
        assert_eq!(reclaim_kinds(*signal, *layout), *expected, "{behaviour}");
    }
}

#[test]
fn dead_containers_table() {
    let ready_active = pods(true, &[("a", PodPhase::Active), ("b", PodPhase::Active)]);
    let policy = ContainerGcPolicy::default();
    struct Row {
        behaviour: &'static str,
        containers: Vec<Container>,
        pods: PodStates,
        policy: ContainerGcPolicy,
        now: i64,
        removed: &'static [(&'static str, ContainerReason)],
    }
    use ContainerReason::*;
    let rows = vec![
        Row {
            behaviour: "running containers are never removed",
            containers: vec![container("r1", "gone", "app", 0, Running, 0, "i")],
            pods: pods(true, &[]),
            policy: policy.clone(),
            now: 100,
            removed: &[],
        },
        Row {
            behaviour:
                "an active pod keeps its newest dead container per name, older ones go oldest first",
            containers: vec![
                container("a0", "a", "app", 0, Exited, 0, "i"),
                container("a1", "a", "app", 1, Exited, 10, "i"),
                container("a2", "a", "app", 2, Exited, 20, "i"),
                container("a3", "a", "app", 3, Running, 30, "i"),
            ],
            pods: ready_active.clone(),
            policy: policy.clone(),
            now: 100,
            removed: &[
                ("a0", OverPerContainerLimit { keep: 1 }),
                ("a1", OverPerContainerLimit { keep: 1 }),
            ],
        },
        Row {
            behaviour: "the newest is chosen by attempt before creation time",
            containers: vec![
                container("late-but-older-attempt", "a", "app", 1, Exited, 50, "i"),
                container("early-but-newer-attempt", "a", "app", 2, Exited, 40, "i"),
            ],
            pods: ready_active.clone(),
            policy: policy.clone(),
            now: 100,
            removed: &[("late-but-older-attempt", OverPerContainerLimit { keep: 1 })],
        },
        Row {
            behaviour: "each container name of a pod is its own unit",
            containers: vec![
                container("app", "a", "app", 0, Exited, 0, "i"),
                container("sidecar", "a", "sidecar", 0, Exited, 0, "i"),
            ],
            pods: ready_active.clone(),
            policy: policy.clone(),
            now: 100,
            removed: &[],
        },
        Row {
            behaviour: "a terminated pod loses all its dead containers",
            containers: vec![
                container("t0", "t", "app", 0, Exited, 0, "i"),
                container("t1", "t", "app", 1, Exited, 10, "i"),
            ],
            pods: pods(true, &[("t", PodPhase::Terminated)]),
            policy: policy.clone(),
            now: 100,
            removed: &[("t0", PodTerminated), ("t1", PodTerminated)],
        },
        Row {
            behaviour:
                "a pod that no longer exists loses all its dead containers, created ones included",
            containers: vec![
                container("g0", "gone", "app", 0, Created, 5, "i"),
                container("g1", "gone", "app", 1, Unknown, 10, "i"),
            ],
            pods: pods(true, &[]),
            policy: policy.clone(),
            now: 100,
            removed: &[("g0", PodGone), ("g1", PodGone)],
        },
        Row {
            behaviour: "before the pod list is read, an unknown pod is treated as active",
            containers: vec![
                container("g0", "gone", "app", 0, Exited, 0, "i"),
                container("g1", "gone", "app", 1, Exited, 10, "i"),
            ],
            pods: pods(false, &[]),
            policy: policy.clone(),
            now: 100,
            removed: &[("g0", OverPerContainerLimit { keep: 1 })],
        },
        Row {
            behaviour: "containers younger than min_age stay, whatever their pod",
            containers: vec![
                container("old", "gone", "app", 0, Exited, 0, "i"),
                container("young", "gone", "app", 1, Exited, 90, "i"),
            ],
            pods: pods(true, &[]),
            policy: ContainerGcPolicy {
                min_age: Duration::from_secs(30),
                ..policy.clone()
            },
            now: 100,
            removed: &[("old", PodGone)],
        },
        Row {
            behaviour: "a negative per-container limit keeps every dead container of active pods",
            containers: vec![
                container("a0", "a", "app", 0, Exited, 0, "i"),
                container("a1", "a", "app", 1, Exited, 10, "i"),
            ],
            pods: ready_active.clone(),
            policy: ContainerGcPolicy {
                max_per_pod_container: -1,
                ..policy.clone()
            },
            now: 100,
            removed: &[],
        },
        Row {
            behaviour:
                "a node limit cuts every unit to an equal share, then the oldest across units",
            containers: vec![
                container("a0", "a", "app", 0, Exited, 0, "i"),
                container("a1", "a", "app", 1, Exited, 10, "i"),
                container("a2", "a", "app", 2, Exited, 20, "i"),
                container("b0", "b", "app", 0, Exited, 5, "i"),
                container("b1", "b", "web", 0, Exited, 15, "i"),
            ],
            pods: ready_active.clone(),
            // 3 units, max 2: share max(2/3, 1) = 1 per unit (a0, a1 go), then 3 > 2: the
            // oldest by attempt then creation (b0: attempt 0, created 5) goes.
            policy: ContainerGcPolicy {
                max_per_pod_container: -1,
                max_containers: 2,
                ..policy.clone()
            },
            now: 100,
            removed: &[
                ("a0", OverNodeLimit { max: 2 }),
                ("a1", OverNodeLimit { max: 2 }),
                ("b0", OverNodeLimit { max: 2 }),
            ],
        },
        Row {
            behaviour:
                "stages come in the kubelet's order: gone pods, then per-container, then node limit",
            containers: vec![
                container("a0", "a", "app", 0, Exited, 50, "i"),
                container("a1", "a", "app", 1, Exited, 60, "i"),
                container("g0", "gone", "app", 0, Exited, 70, "i"),
            ],
            pods: pods(true, &[("a", PodPhase::Active)]),
            policy: policy.clone(),
            now: 100,
            removed: &[("g0", PodGone), ("a0", OverPerContainerLimit { keep: 1 })],
        },
    ];
    for row in rows {
        let plan = plan_containers(row.containers, &row.pods, row.policy, row.now);
        let got: Vec<(&str, ContainerReason)> = plan
            .containers
            .iter()
            .map(|c| (c.id.as_str(), c.reason))
            .collect();
        assert_eq!(got, row.removed, "{}", row.behaviour);
        assert!(
            plan.images.is_empty(),
            "{}: no image in the listing",
            row.behaviour
        );
    }
}

#[test]
fn kept_containers_say_why() {
    let plan = plan_containers(
        vec![
            container("young", "a", "app", 1, Exited, 95, "i"),
            container("newest", "a", "web", 0, Exited, 0, "i"),
        ],
        &pods(true, &[("a", PodPhase::Active)]),
        ContainerGcPolicy {
            min_age: Duration::from_secs(10),
            ..Default::default()
        },
        100,
    );
    let kept: Vec<(&str, KeptContainerReason)> = plan
        .kept_containers
        .iter()
        .map(|k| (k.id.as_str(), k.reason))
        .collect();
    assert_eq!(
        kept,
        [
            ("young", KeptContainerReason::TooNew),
            ("newest", KeptContainerReason::Newest)
        ]
    );
}

#[test]
fn a_removed_container_expects_to_free_its_writable_layer() {
    let mut listing = Listing {
        containers: vec![container("g0", "gone", "app", 0, Exited, 0, "i")],
        ..Default::default()
    };
    listing.stats.insert(
        "g0".into(),
        ContainerStats {
            id: "g0".into(),
            writable_layer: Some(FilesystemUsage {
                mountpoint: "/var/lib/containerd".into(),
                used_bytes: Some(5 << 20),
                inodes_used: Some(3),
                timestamp: at(0),
            }),
            memory_working_set_bytes: None,
        },
    );
    let plan = ReclaimPlan::new(PlanInput {
        signal: Signal::NodeFsAvailable,
        layout: FsLayout::Shared,
        listing: &listing,
        pods: &pods(true, &[]),
        history: &ImageHistory::default(),
        policy: &GcPolicy::default(),
        now: at(100),
    });
    assert_eq!(plan.containers[0].expected_bytes, Some(5 << 20));
    assert_eq!(plan.expected_bytes(), 5 << 20);
}

/// Images: the history is detected at `detected` (seconds) with `history_containers`, then a
/// plan is made at `now` from `containers`.
struct ImageRow {
    behaviour: &'static str,
    images: Vec<Image>,
    history_containers: Vec<Container>,
    detected: &'static [i64],
    containers: Vec<Container>,
    pods: PodStates,
    policy: ImageGcPolicy,
    now: i64,
    removed: &'static [&'static str],
    kept: &'static [(&'static str, &'static str)],
}

fn run_image_row(row: ImageRow) {
    let mut history = ImageHistory::default();
    for t in row.detected {
        history.detect(&row.images, &row.history_containers, at(*t));
    }
    let listing = Listing {
        containers: row.containers,
        images: row.images,
        ..Default::default()
    };
    let plan = ReclaimPlan::new(PlanInput {
        signal: Signal::ImageFsAvailable,
        layout: FsLayout::SeparateImageFs,
        listing: &listing,
        pods: &row.pods,
        history: &history,
        policy: &GcPolicy {
            containers: ContainerGcPolicy::default(),
            images: row.policy,
        },
        now: at(row.now),
    });
    let removed: Vec<&str> = plan.images.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(removed, row.removed, "{}", row.behaviour);
    let kept: Vec<(&str, &str)> = plan
        .kept_images
        .iter()
        .map(|k| {
            let why = match k.reason {
                KeptImageReason::InUse { .. } => "in use",
                KeptImageReason::Pinned => "pinned",
                KeptImageReason::Kept => "kept",
                KeptImageReason::TooNew { .. } => "too new",
            };
            (k.id.as_str(), why)
        })
        .collect();
    assert_eq!(kept, row.kept, "{}", row.behaviour);
    let expected: u64 = plan.images.iter().map(|i| i.size_bytes).sum();
    assert_eq!(plan.expected_bytes(), expected, "{}", row.behaviour);
}

#[test]
fn unused_images_table() {
    let zero_age = ImageGcPolicy {
        min_age: Duration::ZERO,
        keep: vec![],
    };
    let active = pods(true, &[("a", PodPhase::Active)]);
    let rows = vec![
        ImageRow {
            behaviour: "images never used and first seen together go in ID order",
            images: vec![image("b", 10), image("a", 20), image("c", 30)],
            history_containers: vec![],
            detected: &[0],
            containers: vec![],
            pods: active.clone(),
            policy: zero_age.clone(),
            now: 500,
            removed: &["a", "b", "c"],
            kept: &[],
        },
        ImageRow {
            behaviour: "an image used by any container stays, whatever that container's state",
            images: vec![image("run", 1), image("dead", 2), image("free", 3)],
            history_containers: vec![],
            detected: &[0],
            containers: vec![
                container("c1", "a", "app", 0, Running, 0, "run"),
                container("c2", "a", "web", 0, Exited, 0, "dead"),
            ],
            pods: active.clone(),
            policy: zero_age.clone(),
            now: 500,
            removed: &["free"],
            kept: &[("run", "in use"), ("dead", "in use")],
        },
        ImageRow {
            behaviour: "pinned images stay",
            images: vec![Image { pinned: true, ..image("pause", 1) }, image("free", 3)],
            history_containers: vec![],
            detected: &[0],
            containers: vec![],
            pods: active.clone(),
            policy: zero_age.clone(),
            now: 500,
            removed: &["free"],
            kept: &[("pause", "pinned")],
        },
        ImageRow {
            behaviour: "images in the keep list stay, named by tag",
            images: vec![image("pause", 1), image("free", 3)],
            history_containers: vec![],
            detected: &[0],
            containers: vec![],
            pods: active.clone(),
            policy: ImageGcPolicy { min_age: Duration::ZERO, keep: vec!["registry.local/pause:1".into()] },
            now: 500,
            removed: &["free"],
            kept: &[("pause", "kept")],
        },
        ImageRow {
            behaviour: "an image the agent has never seen before the plan is too new under the default min_age",
            images: vec![image("fresh", 1)],
            history_containers: vec![],
            detected: &[],
            containers: vec![],
            pods: active.clone(),
            policy: ImageGcPolicy::default(),
            now: 200,
            removed: &[],
            kept: &[("fresh", "too new")],
        },
        ImageRow {
            behaviour: "an image used only by a dead container of a gone pod goes after that container",
            images: vec![image("old-app", 7)],
            history_containers: vec![container("g0", "gone", "app", 0, Running, 0, "old-app")],
            detected: &[0, 300],
            containers: vec![container("g0", "gone", "app", 0, Exited, 0, "old-app")],
            pods: pods(true, &[]),
            policy: zero_age.clone(),
            now: 300,
            removed: &["old-app"],
            kept: &[],
        },
        ImageRow {
            behaviour: "an image never seen in use goes before one that was (Go's zero time)",
            images: vec![image("used-at-100", 2), image("never-used", 1)],
            history_containers: vec![
                container("x", "gone", "x", 0, Exited, 0, "used-at-100"),
            ],
            detected: &[0, 100],
            containers: vec![],
            pods: active.clone(),
            policy: zero_age.clone(),
            now: 400,
            removed: &["never-used", "used-at-100"],
            kept: &[],
        },
    ];
    for row in rows {
        run_image_row(row);
    }
}

#[test]
fn an_image_first_seen_less_than_min_age_ago_stays() {
    let mut history = ImageHistory::default();
    history.detect(&[image("old", 1)], &[], at(0));
    let listing = Listing {
        images: vec![image("old", 1), image("new", 2)],
        ..Default::default()
    };
    let plan = ReclaimPlan::new(PlanInput {
        signal: Signal::NodeFsAvailable,
        layout: FsLayout::Shared,
        listing: &listing,
        pods: &pods(true, &[]),
        history: &history,
        policy: &GcPolicy::default(),
        now: at(200),
    });
    let removed: Vec<&str> = plan.images.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(
        removed,
        ["old"],
        "first seen 200 s ago, over the 2 min default"
    );
    assert_eq!(
        plan.kept_images[0].reason,
        KeptImageReason::TooNew { age_seconds: 0 }
    );
}

#[test]
fn last_use_orders_images_that_were_all_used() {
    let images = vec![image("b", 1), image("a", 1), image("c", 1)];
    let mut history = ImageHistory::default();
    history.detect(
        &images,
        &[container("1", "p", "x", 0, Running, 0, "a")],
        at(10),
    );
    history.detect(
        &images,
        &[container("2", "p", "x", 0, Running, 0, "b")],
        at(20),
    );
    history.detect(
        &images,
        &[container("3", "p", "x", 0, Running, 0, "c")],
        at(30),
    );
    let listing = Listing {
        images,
        ..Default::default()
    };
    let plan = ReclaimPlan::new(PlanInput {
        signal: Signal::NodeFsAvailable,
        layout: FsLayout::Shared,
        listing: &listing,
        pods: &pods(true, &[]),
        history: &history,
        policy: &GcPolicy {
            images: ImageGcPolicy {
                min_age: Duration::ZERO,
                keep: vec![],
            },
            ..Default::default()
        },
        now: at(40),
    });
    let order: Vec<&str> = plan.images.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(order, ["a", "b", "c"], "oldest last use first");
    assert_eq!(plan.images[0].last_used, Some(at(10)));
}

#[test]
fn history_forgets_images_that_are_gone_and_keeps_first_detection() {
    let mut history = ImageHistory::default();
    history.detect(&[image("a", 1), image("b", 1)], &[], at(0));
    history.detect(&[image("a", 1)], &[], at(50));
    assert_eq!(history.len(), 1);
    assert_eq!(history.get("a").map(|r| r.first_detected), Some(at(0)));
    assert!(history.get("b").is_none());
}

#[test]
fn no_images_are_planned_when_the_signal_reclaims_only_containers() {
    let listing = Listing {
        containers: vec![container("g0", "gone", "app", 0, Exited, 0, "img")],
        images: vec![image("img", 9)],
        ..Default::default()
    };
    let plan = ReclaimPlan::new(PlanInput {
        signal: Signal::NodeFsAvailable,
        layout: FsLayout::SplitImageFs,
        listing: &listing,
        pods: &pods(true, &[]),
        history: &ImageHistory::default(),
        policy: &GcPolicy::default(),
        now: at(1000),
    });
    assert_eq!(plan.kinds, [ReclaimKind::DeadContainers]);
    assert_eq!(plan.containers.len(), 1);
    assert!(plan.images.is_empty() && plan.kept_images.is_empty());
}

fn two_step_plan() -> ReclaimPlan {
    let mut history = ImageHistory::default();
    let images = vec![image("app", 100), image("other", 50)];
    history.detect(&images, &[], at(0));
    let listing = Listing {
        containers: vec![container("g0", "gone", "app", 0, Exited, 0, "app")],
        images,
        ..Default::default()
    };
    ReclaimPlan::new(PlanInput {
        signal: Signal::NodeFsAvailable,
        layout: FsLayout::Shared,
        listing: &listing,
        pods: &pods(true, &[]),
        history: &history,
        policy: &GcPolicy {
            images: ImageGcPolicy {
                min_age: Duration::ZERO,
                keep: vec![],
            },
            ..Default::default()
        },
        now: at(1000),
    })
}

#[test]
fn a_run_hands_out_containers_then_images_and_reports_each() {
    let plan = two_step_plan();
    assert_eq!(plan.images[0].after_containers, ["g0"]);
    let mut run = plan.run();
    let mut calls = Vec::new();
    while let Some(step) = run.next_step() {
        calls.push(match step {
            Step::RemoveContainer(c) => format!("RemoveContainer {}", c.id),
            Step::RemoveImage(i) => format!("RemoveImage {}", i.id),
        });
        run.record(Ok::<(), String>(()));
    }
    let report = run.finish();
    assert_eq!(
        calls,
        ["RemoveContainer g0", "RemoveImage app", "RemoveImage other"]
    );
    assert_eq!(report.removed().count(), 3);
    assert_eq!(report.expected_bytes_removed(), 150);
}

#[test]
fn an_image_whose_container_could_not_be_removed_is_skipped_not_tried() {
    let plan = two_step_plan();
    let mut run = plan.run();
    let mut tried = Vec::new();
    while let Some(step) = run.next_step() {
        let result = match step {
            Step::RemoveContainer(_) => Err("container is running"),
            Step::RemoveImage(i) => {
                tried.push(i.id.clone());
                Ok(())
            }
        };
        run.record(result);
    }
    let report = run.finish();
    assert_eq!(
        tried,
        ["other"],
        "the image of the failed container is not tried"
    );
    let results: Vec<&StepResult> = report.outcomes.iter().map(|o| &o.result).collect();
    assert_eq!(
        results,
        [
            &StepResult::Failed {
                error: "container is running".into()
            },
            &StepResult::Skipped {
                blocked_by: vec!["g0".into()]
            },
            &StepResult::Removed,
        ]
    );
    assert_eq!(report.failed().count(), 1);
    assert_eq!(report.expected_bytes_removed(), 50);
}

#[test]
fn a_step_left_unreported_counts_as_failed() {
    let plan = two_step_plan();
    let mut run = plan.run();
    assert!(run.next_step().is_some());
    let report = run.finish();
    assert_eq!(
        report.outcomes[0].result,
        StepResult::Failed {
            error: "the executor did not report this step".into()
        }
    );
}

#[test]
fn the_plan_prints_for_a_dry_run_and_serialises_for_the_trace() {
    let plan = two_step_plan();
    let text = plan.to_string();
    assert!(
        text.starts_with("node-level reclaim for nodefs.available (images share the node filesystem): remove 1 dead container(s) and 2 unused image(s), expected to free 150 B"),
        "{text}"
    );
    assert!(text.contains("remove container g0 shop/pod-gone app (attempt 0, exited): its pod no longer exists; size unknown"), "{text}");
    assert!(text.contains("remove image     app registry.local/app:1 (never seen in use, after its 1 container(s)); 100 B"), "{text}");
    let json = serde_json::to_value(&plan).unwrap();
    assert_eq!(json["signal"], "nodefs.available");
    assert_eq!(json["containers"][0]["reason"], "pod_gone");
    assert_eq!(json["images"][1]["id"], "other");

    let nothing = plan_containers(vec![], &pods(true, &[]), ContainerGcPolicy::default(), 0);
    assert!(nothing.is_empty());
    let memory = ReclaimPlan {
        kinds: vec![],
        signal: Signal::MemoryAvailable,
        ..nothing
    };
    assert_eq!(
        memory.to_string(),
        "node-level reclaim: nothing reclaims memory.available (images share the node filesystem); pods are evicted directly"
    );
}

#[test]
fn human_bytes_uses_binary_units() {
    let cases = [
        (0, "0 B"),
        (1023, "1023 B"),
        (1536, "1.5 KiB"),
        (300 << 20, "300.0 MiB"),
        (3 << 30, "3.0 GiB"),
    ];
    for (bytes, text) in cases {
        assert_eq!(human_bytes(bytes), text);
    }
}
