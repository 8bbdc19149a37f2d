//! The CRI client and node-level reclaim against a real containerd (root): pods and
//! containers created as the kubelet creates them, images imported from tars written here,
//! disk usage measured on a small filesystem of the test's own. A reclaim is carried out by
//! the executor's runtime lane, the one runner of a reclaim plan.

use std::time::{Duration, Instant};

use node_agent_cri::{
    model::{ContainerState, PodRef},
    reclaim::{FsLayout, GcPolicy, ImageGcPolicy, PodPhase, PodStates, StepResult},
    CriSettings,
};
use node_agent_executor::{
    reclaim::{Reclaim, ReclaimResult, Runtime},
    Action, Executor, Outcome, Settings,
};
use node_agent_kube::{
    config::PdbPolicy,
    fake::{Fake, Reply, Seen},
};
use node_agent_policy::{Eligibility, Signal};
use node_agent_tests::{
    containerd::{Containerd, Options, PAUSE_IMAGE},
    oci::ImageSpec,
    runtime,
};

const MIB: u64 = 1 << 20;
const RUNNING_UID: &str = "0b7a2e4c-1c4f-4d8e-9a55-2f1a6c7e9d01";
const GONE_UID: &str = "5d2c9e1a-7b3f-4c6d-8e9f-0a1b2c3d4e5f";

/// Polls `check` until it returns `Some`, at most `limit`.
async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await? {
            return Ok(v);
        }
        if Instant::now() > deadline {
            anyhow::bail!("{what}: not within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[test]
fn the_client_reads_sandboxes_containers_stats_and_images_as_created() {
    runtime()
        .block_on(async {
            let ctrd = Containerd::start(Options::default()).await?;
            let cri = ctrd.client();
            let version = cri.version().await?;
            assert_eq!(
                (
                    version.runtime_name.as_str(),
                    version.runtime_api_version.as_str()
                ),
                ("containerd", "v1")
            );

            let image = ctrd
                .build_and_import(
                    &ImageSpec::busybox("localhost/node-agent-test/app:1")?,
                    "app",
                )
                .await?;
            let pod = ctrd
                .run_pod(ctrd.pod_config("shop", "web", RUNNING_UID, "burstable"))
                .await?;
            let sleeper = ctrd
                .run_container(
                    &pod,
                    Containerd::container_config(
                        &pod,
                        "app",
                        0,
                        &image.name,
                        &["/bin/sleep", "600"],
                    ),
                    true,
                )
                .await?;
            let quitter = ctrd
                .run_container(
                    &pod,
                    Containerd::container_config(&pod, "init", 0, &image.name, &["/bin/true"]),
                    true,
                )
                .await?;
            ctrd.wait_state(&quitter, ContainerState::Exited, Duration::from_secs(20))
                .await?;

            let sandboxes = cri.list_pod_sandboxes().await?;
            assert_eq!(sandboxes.len(), 1, "{sandboxes:?}");
            assert_eq!(sandboxes[0].id, pod.sandbox_id);
            let web = PodRef {
                uid: RUNNING_UID.into(),
                namespace: "shop".into(),
                name: "web".into(),
            };
            assert_eq!(sandboxes[0].pod, web);

            let all = cri.list_containers(None).await?;
            let mut states: Vec<(&str, ContainerState)> =
                all.iter().map(|c| (c.name.as_str(), c.state)).collect();
            states.sort();
            assert_eq!(
                states,
                [
                    ("app", ContainerState::Running),
                    ("init", ContainerState::Exited)
                ]
            );
            for c in &all {
                assert_eq!(c.pod, web, "pod from the kubelet's labels");
                assert_eq!(c.image_id, image.id, "the image ID ListImages reports");
                assert_eq!(c.pod_sandbox_id, pod.sandbox_id);
            }
            let running = cri.list_containers(Some(ContainerState::Running)).await?;
            assert_eq!(
                running.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
                [sleeper.as_str()]
            );
            let exited = cri.list_containers(Some(ContainerState::Exited)).await?;
            assert_eq!(
                exited.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
                [quitter.as_str()]
            );

            // The container runs in the kubelet's cgroupfs layout below the test's cgroup.
            let layout = node_agent::cgroup::detect()?;
            let cgroup = layout
                .memory
                .mount()
                .join(ctrd.cgroup_root().trim_start_matches('/'))
                .join(format!("kubepods/burstable/pod{RUNNING_UID}"))
                .join(&sleeper);
            assert!(cgroup.is_dir(), "{} exists", cgroup.display());
            let procs = std::fs::read_to_string(cgroup.join("cgroup.procs"))?;
            assert_eq!(
                procs.lines().count(),
                1,
                "the sleeper runs there: {procs:?}"
            );

            let stats = cri.container_stats(&sleeper).await?;
            assert_eq!(stats.id, sleeper);
            assert!(
                stats.memory_working_set_bytes.is_some(),
                "a running container has memory stats: {stats:?}"
            );
            let listed = cri.list_container_stats().await?;
            assert!(listed.iter().any(|s| s.id == sleeper), "{listed:?}");

            let images = cri.list_images().await?;
            let app = images
                .iter()
                .find(|i| i.id == image.id)
                .expect("the app image is listed");
            assert_eq!(app.repo_tags, std::slice::from_ref(&image.name));
            assert_eq!(
                app.size_bytes, image.content_bytes,
                "containerd reports the content size"
            );
            assert!(images.iter().any(|i| i.is_named(PAUSE_IMAGE)));
            let status = cri
                .image_status(&image.name)
                .await?
                .expect("ImageStatus finds it by tag");
            assert_eq!(status.id, image.id);
            assert_eq!(
                cri.image_status("localhost/node-agent-test/absent:1")
                    .await?,
                None
            );

            // Errors name the call and the endpoint.
            let err = cri.container_stats("no-such-container").await.unwrap_err();
            assert!(
                err.to_string()
                    .starts_with(&format!("CRI ContainerStats at {} failed", ctrd.endpoint())),
                "{err}"
            );
            anyhow::Ok(())
        })
        .unwrap();
}

#[test]
fn image_fs_usage_follows_an_import_and_a_removal() {
    runtime().block_on(async {
        let ctrd = Containerd::start(Options {
            small_fs_bytes: Some(96 * MIB),
        })
        .await?;
        let cri = ctrd.client();
        let used = || async {
            let info = cri.image_fs_info().await?;
            anyhow::Ok(info.image_bytes_used().unwrap_or(0))
        };
        let info = cri.image_fs_info().await?;
        let mountpoint = &info.image_filesystems[0].mountpoint;
        assert!(
            std::path::Path::new(mountpoint).starts_with(ctrd.root()),
            "{mountpoint} is below containerd's root {}",
            ctrd.root().display()
        );
        let before = used().await?;
        let (_, available_before) = ctrd.small_fs_usage()?;

        let filler = ImageSpec::busybox("localhost/node-agent-test/filler:1")?.with_filler(
            "blob",
            16 * MIB as usize,
            1,
        );
        let image = ctrd.build_and_import(&filler, "filler").await?;
        let grown = eventually("image fs usage grows by the unpacked layer", Duration::from_secs(15), || async {
            let now = used().await?;
            Ok((now >= before + 16 * MIB).then_some(now))
        })
        .await?;
        let (_, available_loaded) = ctrd.small_fs_usage()?;
        assert!(
            available_before - available_loaded >= 32 * MIB,
            "content and snapshot both take the 16 MiB: {available_before} -> {available_loaded}"
        );

        cri.remove_image(&image.id).await?;
        assert_eq!(cri.image_status(&image.id).await?, None);
        eventually("image fs usage shrinks back", Duration::from_secs(15), || async {
            let now = used().await?;
            Ok((now + 16 * MIB <= grown).then_some(now))
        })
        .await?;
        let (_, available_after) = ctrd.small_fs_usage()?;
        assert!(
            available_after >= available_loaded + 32 * MIB,
            "RemoveImage freed the content and the snapshot: {available_loaded} -> {available_after}"
        );
        anyhow::Ok(())
    })
    .unwrap();
}

#[test]
fn a_reclaim_carried_out_by_the_executor_frees_real_bytes_and_spares_what_is_in_use() {
    runtime()
        .block_on(async {
            let ctrd = Containerd::start(Options {
                small_fs_bytes: Some(160 * MIB),
            })
            .await?;
            let cri = ctrd.client();
            let spec = |name: &str, seed| -> anyhow::Result<ImageSpec> {
                Ok(
                    ImageSpec::busybox(&format!("localhost/node-agent-test/{name}:1"))?
                        .with_filler("blob", 8 * MIB as usize, seed),
                )
            };
            let in_use = ctrd.build_and_import(&spec("in-use", 1)?, "in-use").await?;
            let dead_pods = ctrd
                .build_and_import(&spec("dead-pods", 2)?, "dead-pods")
                .await?;
            let unused = ctrd.build_and_import(&spec("unused", 3)?, "unused").await?;

            let web = ctrd
                .run_pod(ctrd.pod_config("shop", "web", RUNNING_UID, "burstable"))
                .await?;
            let running = ctrd
                .run_container(
                    &web,
                    Containerd::container_config(
                        &web,
                        "app",
                        0,
                        &in_use.name,
                        &["/bin/sleep", "600"],
                    ),
                    true,
                )
                .await?;
            let old = ctrd
                .run_pod(ctrd.pod_config("shop", "old", GONE_UID, "besteffort"))
                .await?;
            // A dead container that wrote 4 MiB into its writable layer.
            let dead = ctrd
                .run_container(
                    &old,
                    Containerd::container_config(
                        &old,
                        "job",
                        0,
                        &dead_pods.name,
                        &["/bin/dd", "if=/dev/zero", "of=/tmp/out", "bs=1M", "count=4"],
                    ),
                    true,
                )
                .await?;
            ctrd.wait_state(&dead, ContainerState::Exited, Duration::from_secs(20))
                .await?;

            // The executor's runtime lane, not in dry run: a cluster (the strict fake) takes the
            // node event the reclaim leaves.
            let api = Fake::start(|s: &Seen, _| match s.method.as_str() {
                "POST" if s.path.contains("/events") => Reply::json(201, s.body.to_string()),
                _ => Reply::status(404, "NotFound", "not found"),
            })
            .await;
            let runtime = Runtime {
                settings: CriSettings {
                    endpoint: ctrd.endpoint(),
                    timeout: Duration::from_secs(10),
                },
                gc: GcPolicy {
                    images: ImageGcPolicy {
                        min_age: Duration::ZERO,
                        keep: vec![PAUSE_IMAGE.into()],
                    },
                    ..Default::default()
                },
            };
            let (_settings, settings) = tokio::sync::watch::channel(Settings {
                cluster: Some(api.context("api server", 1, "worker-1")),
                generation: 0,
                dry_run: false,
                pdb_policy: PdbPolicy::Respect,
                eligibility: Eligibility::default(),
                taint: false,
                runtime: Some(runtime),
                heartbeat: node_agent_executor::CONDITION_HEARTBEAT,
                pending_records: None,
            });
            let (executor, mut outcomes) = Executor::spawn(settings);
            // The agent watched the node for a while: images first seen at an earlier
            // detection, which also notes the ones in use then.
            executor.submit(Action::DetectImages);
            let Some(Outcome::ImagesDetected(Ok(detected))) = outcomes.recv().await else {
                anyhow::bail!("image detection did not report a count");
            };
            assert_eq!(
                detected.images, 4,
                "the three test images and the pause image"
            );
            let image_fs = detected
                .image_fs
                .expect("containerd names its image filesystem");
            assert!(
                image_fs.starts_with(&ctrd.root().display().to_string()),
                "{image_fs} is below containerd's root {}",
                ctrd.root().display()
            );
            eventually(
                "the dead container's writable layer is measured",
                Duration::from_secs(15),
                || async {
                    let l = cri.listing().await?;
                    let measured = l
                        .stats
                        .get(&dead)
                        .and_then(|s| s.writable_layer.as_ref())
                        .and_then(|w| w.used_bytes)
                        .is_some_and(|b| b >= 4 * MIB);
                    Ok(measured.then_some(()))
                },
            )
            .await?;

            let (_, available_before) = ctrd.small_fs_usage()?;
            executor.submit(Action::Reclaim(Box::new(Reclaim {
                signal: Signal::NodeFsAvailable,
                layout: FsLayout::Shared,
                pods: PodStates {
                    sources_ready: true,
                    pods: [(RUNNING_UID.to_string(), PodPhase::Active)].into(),
                },
            })));
            let Some(Outcome::Reclaim(outcome)) = outcomes.recv().await else {
                anyhow::bail!("no reclaim outcome");
            };
            let plan = outcome.plan.as_ref().expect("the runtime was listed");
            eprintln!("{plan}");
            let removed_containers: Vec<&str> =
                plan.containers.iter().map(|c| c.id.as_str()).collect();
            assert_eq!(
                removed_containers,
                [dead.as_str()],
                "only the dead container of the gone pod"
            );
            let removed_images: Vec<&str> = plan.images.iter().map(|i| i.id.as_str()).collect();
            assert_eq!(
                removed_images,
                [unused.id.as_str(), dead_pods.id.as_str()],
                "never used first, then the one last used at the earlier detection"
            );
            assert_eq!(plan.images[1].after_containers, std::slice::from_ref(&dead));
            assert!(
                plan.expected_bytes() >= 2 * 8 * MIB + 4 * MIB,
                "{}",
                plan.expected_bytes()
            );
            assert_eq!(
                outcome.result,
                ReclaimResult::Reclaimed,
                "{}",
                outcome.summary()
            );
            assert!(
                outcome
                    .report
                    .outcomes
                    .iter()
                    .all(|o| o.result == StepResult::Removed),
                "{:#?}",
                outcome.report.outcomes
            );
            assert!(outcome.event_error.is_none(), "{:?}", outcome.event_error);
            let events: Vec<Seen> = api.seen();
            assert_eq!(events.len(), 1, "one node event: {:?}", api.calls());
            assert_eq!(events[0].body["reason"], "FreedDiskSpace");
            let (_, available_after) = ctrd.small_fs_usage()?;
            let freed = available_after.saturating_sub(available_before);
            // Each image's layer takes its 8 MiB twice (compressed content and unpacked snapshot);
            // the container's writable layer 4 MiB.
            assert!(freed >= 2 * 2 * 8 * MIB + 4 * MIB, "freed {freed} bytes");

            let images: Vec<String> = cri.list_images().await?.into_iter().map(|i| i.id).collect();
            assert!(
                images.contains(&in_use.id)
                    && !images.contains(&unused.id)
                    && !images.contains(&dead_pods.id)
            );
            let containers = cri.list_containers(None).await?;
            assert_eq!(
                containers
                    .iter()
                    .map(|c| (c.id.as_str(), c.state))
                    .collect::<Vec<_>>(),
                [(running.as_str(), ContainerState::Running)],
                "the running container and its image are untouched"
            );
            anyhow::Ok(())
        })
        .unwrap();
}
