//! Disk on a real node: an emptyDir over its `sizeLimit`, measured by the real kubelet's
//! `/stats/summary`, is evicted with the kubelet's message; pods over their limits never hold
//! up a memory eviction; and under disk pressure node-level reclaim removes the kubelet's own
//! containerd's dead containers and unused images before anything is evicted.

use std::{process::Command, time::Duration};

use node_agent_cluster::images::Archive;
use node_agent_tests::real_cluster::{
    evicted_by_kubelet, wait_running, Namespace, Qos, RealCluster, Variant, WorkloadPod, AGENT_SA,
};
use node_agent_tests::real_node::nodefs_statfs;
use serde_json::Value;

/// A pod writing `mib` MiB (fallocate) into an emptyDir limited to `limit`.
fn over_its_limit(name: &str, node: &str, mib: u64, limit: &str) -> WorkloadPod {
    let mut p = WorkloadPod::new(
        name,
        Qos::BestEffort,
        "",
        &["allocate", "/scratch/data", &mib.to_string()],
    );
    p.node = Some(node.to_string());
    p.extra_spec.push(format!(
        "  volumes: [{{name: scratch, emptyDir: {{sizeLimit: {limit}}}}}]"
    ));
    p.extra_container
        .push("      volumeMounts: [{name: scratch, mountPath: /scratch}]".into());
    p
}

/// Who removed `pod`: the agent (an Eviction by its service account in the audit log) or the
/// kubelet (the pod left Failed with reason Evicted).
fn who_evicted(rc: &RealCluster, ns: &str, pod: &str) -> anyhow::Result<&'static str> {
    let by_agent = rc
        .eviction_requests(ns)?
        .iter()
        .any(|(p, code, user)| p == pod && *code == 201 && user == AGENT_SA);
    let p = rc.kubectl.call(
        &["-n", ns, "get", "pod", pod, "-o", "json"],
        None,
        Duration::from_secs(10),
    )?;
    let by_kubelet =
        p.success && serde_json::from_str::<Value>(&p.stdout).is_ok_and(|v| evicted_by_kubelet(&v));
    Ok(match (by_agent, by_kubelet) {
        (true, false) => "agent",
        (false, true) => "kubelet",
        (true, true) => "both",
        (false, false) => "nobody",
    })
}

fn evicted_message(rc: &RealCluster, ns: &Namespace, pod: &str) -> anyhow::Result<String> {
    let events = rc.kubectl.get_json(&[
        "-n",
        &ns.name,
        "events",
        "--field-selector",
        &format!("involvedObject.name={pod}"),
    ])?;
    Ok(events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["reason"] == "Evicted")
        .filter_map(|e| e["message"].as_str())
        .collect::<Vec<_>>()
        .join(" | "))
}

#[test]
fn an_emptydir_over_its_size_limit_is_evicted_with_the_kubelets_message() -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    rc.install("emptydir", &Variant::enforcing())?;
    let node = rc.node0().name;
    let ns = rc.namespace("emptydir");
    rc.kubectl
        .apply(&over_its_limit("filler", &node, 200, "100Mi").manifest(&ns.name))?;
    // The kubelet measures volumes every volumeStatsAggPeriod (1 min): within two of them.
    rc.wait_gone_or_failed(&ns.name, "filler", Duration::from_secs(180))?;
    let who = who_evicted(&rc, &ns.name, "filler")?;
    let message = evicted_message(&rc, &ns, "filler")?;
    eprintln!("the emptyDir over its limit was evicted by: {who}; message: {message}");
    assert!(
        who == "agent" || who == "kubelet",
        "one of them evicted it: {who}"
    );
    assert!(
        message.contains("Usage of EmptyDir volume \"scratch\" exceeds the limit \"100Mi\""),
        "the kubelet's message: {message}"
    );
    Ok(())
}

#[test]
fn pods_over_their_limits_never_hold_up_a_memory_eviction() -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    rc.install("storage-and-memory", &Variant::enforcing())?;
    let node = rc.node0().name;
    let agent = rc.agent_pod(&node, "node-agent")?;
    let ns = rc.namespace("storagemem");
    // Memory held just above the agent's line's reach: 260 MiB of headroom left.
    let mut hog = WorkloadPod::new("hog", Qos::BestEffort, "", &["memory", "800", "400"]);
    hog.node = Some(node.clone());
    rc.kubectl.apply(&hog.manifest(&ns.name))?;
    wait_running(&rc.kubectl, &ns.name, &["hog"], Duration::from_secs(60))?;
    rc.wait_held(&ns.name, &["hog"], Duration::from_secs(60))?;
    rc.grow_to_headroom(&ns.name, &node, &agent, "base", 260.0, 400)?;
    rc.wait_held(&ns.name, &["base"], Duration::from_secs(120))?;
    // Three pods over their emptyDir limits. Both the agent and the kubelet learn of them from
    // the kubelet's volume statistics, and the agent asks their evictions the moment it reads
    // them, so a pod may be gone before this test sees it there: each counts once it is seen
    // over its limit or its eviction was asked.
    for i in 0..3 {
        rc.kubectl
            .apply(&over_its_limit(&format!("over-{i}"), &node, 150, "50Mi").manifest(&ns.name))?;
    }
    let over: Vec<String> = (0..3).map(|i| format!("over-{i}")).collect();
    rc.kubectl.wait_for(
        "the three over their limits in the kubelet's stats, or their evictions asked",
        Duration::from_secs(150),
        |k| {
            let summary: Value = serde_json::from_str(&k.run(&[
                "get",
                "--raw",
                &format!("/api/v1/nodes/{node}/proxy/stats/summary"),
            ])?)?;
            let in_stats = |pod: &str| {
                summary["pods"].as_array().into_iter().flatten().any(|p| {
                    p["podRef"]["namespace"] == ns.name.as_str()
                        && p["podRef"]["name"] == pod
                        && p["volume"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|v| v["usedBytes"].as_u64().unwrap_or(0) > 50 << 20)
                })
            };
            let asked = rc.eviction_requests(&ns.name)?;
            let seen = over
                .iter()
                .filter(|pod| in_stats(pod) || asked.iter().any(|(p, _, _)| p == *pod))
                .count();
            Ok((seen == 3).then_some(()))
        },
    )?;
    // The memory crossing, at once: 120 MiB more.
    let mut push = WorkloadPod::new("push", Qos::BestEffort, "", &["memory", "120", "0"]);
    push.node = Some(node.clone());
    rc.kubectl.apply(&push.manifest(&ns.name))?;
    // The hog (800 MiB over its request of 0) goes for memory; the three for their limits.
    rc.wait_gone_or_failed(&ns.name, "hog", Duration::from_secs(60))?;
    // The hog's kill on the node is recorded by its status patch, the limit evictions are
    // asked through the API: both are the agent's ends of pods.
    let ends = rc.agent_pod_ends(&ns.name)?;
    // The hog's record, taken (200): not merely asked.
    let hog_recorded = ends
        .iter()
        .find(|e| e.pod == "hog" && e.kind == "status" && e.code == 200)
        .and_then(|e| e.at.parse::<jiff::Timestamp>().ok());
    let times: Vec<(String, String)> = ends.into_iter().map(|e| (e.pod, e.at)).collect();
    let at = |pod: &str| -> Option<jiff::Timestamp> {
        times
            .iter()
            .find(|(p, _)| p == pod)
            .and_then(|(_, t)| t.parse().ok())
    };
    let memory = anyhow::Context::context(
        hog_recorded,
        "the hog's kill recorded by the agent, answered 200",
    )?;
    // The crossing is the push's start (it touches its 120 MiB at once): from there the
    // memory eviction waits behind none of the limit evictions, asked just before it or in
    // flight beside it. One lane would hold it for as long as they take.
    let started: jiff::Timestamp = rc
        .kubectl
        .run(&[
            "-n",
            &ns.name,
            "get",
            "pod",
            "push",
            "-o",
            "jsonpath={.status.containerStatuses[0].state.running.startedAt}",
        ])?
        .trim()
        .parse()
        .map_err(|e| anyhow::anyhow!("the push's start time: {e}"))?;
    let storage: Vec<String> = over
        .iter()
        .filter_map(|p| at(p).map(|t| format!("{p} {t}")))
        .collect();
    eprintln!("push started {started}; memory kill recorded {memory}; limit evictions asked by the agent: {storage:?}; all: {times:?}");
    let waited = memory.as_millisecond() - started.as_millisecond();
    // Bounded from below too: the crossing is the push's, so its record cannot come before the
    // push started (whole seconds: up to 1 s earlier than the true start).
    assert!(
        waited > -1000,
        "the memory kill recorded {waited} ms before the push started: not the push's crossing: {times:?}"
    );
    assert!(
        waited < 5000,
        "the memory kill recorded {waited} ms after the push started (its start is in whole seconds): {times:?}"
    );
    Ok(())
}

/// Builds an image of 300 MiB of zeros (small as an archive, 300 MiB unpacked) that no pod
/// uses, and imports it into the node's containerd.
fn unused_image(rc: &RealCluster) -> anyhow::Result<String> {
    let dir = rc.cluster.layout.dir.join("images/unused");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("ctx"))?;
    let reference = "localhost/node-agent-cluster/unused:1";
    std::fs::write(
        dir.join("ctx/Containerfile"),
        "FROM scratch\nCOPY big /big\n",
    )?;
    let status = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M", "count=300", "status=none"])
        .arg(format!("of={}", dir.join("ctx/big").display()))
        .status()?;
    anyhow::ensure!(status.success(), "dd failed");
    let buildah = |args: &[&str]| {
        let mut c = Command::new("buildah");
        c.arg("--root")
            .arg(dir.join("storage/root"))
            .arg("--runroot")
            .arg(dir.join("storage/run"));
        c.args(["--storage-driver", "vfs"]).args(args);
        c
    };
    let out = buildah(&[
        "bud",
        "--isolation",
        "chroot",
        "--pull-never",
        "-t",
        reference,
    ])
    .arg(dir.join("ctx"))
    .output()?;
    anyhow::ensure!(
        out.status.success(),
        "buildah bud: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let archive = dir.join("unused.oci.tar");
    let out = buildah(&[
        "push",
        reference,
        &format!("oci-archive:{}:{reference}", archive.display()),
    ])
    .output()?;
    anyhow::ensure!(
        out.status.success(),
        "buildah push: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(dir.join("storage"));
    let _ = std::fs::remove_file(dir.join("ctx/big"));
    let ns = rc.cluster.node_ns(&rc.node0())?;
    node_agent_cluster::images::import(
        ns,
        &[Archive {
            reference: reference.into(),
            path: archive,
        }],
    )?;
    Ok(reference.to_string())
}

/// The node's containerd's images (`ctr -n k8s.io images ls -q`).
fn node_images(rc: &RealCluster) -> anyhow::Result<String> {
    let ns = rc.cluster.node_ns(&rc.node0())?;
    node_agent_cluster::node::in_ns(
        ns,
        "ctr",
        &[
            "--address",
            "/run/containerd/containerd.sock",
            "-n",
            "k8s.io",
            "images",
            "ls",
            "-q",
        ],
    )
}

/// Imports the sandbox image into the first node again when dropped. The reclaim removes it
/// as the kubelet's image GC would: containerd 1.6 does not pin its sandbox image, so it is an
/// unused image like any other. A real node pulls it again for its next pod; this cluster has
/// no registry, and without it no pod would start on the node after this test.
struct SandboxImageBack<'a>(&'a RealCluster);

impl Drop for SandboxImageBack<'_> {
    fn drop(&mut self) {
        let rc = self.0;
        let archive = Archive {
            reference: node_agent_cluster::node_components::PAUSE_IMAGE.into(),
            path: rc.cluster.layout.images().join("pause.oci.tar"),
        };
        let back = rc
            .cluster
            .node_ns(&rc.node0())
            .and_then(|ns| node_agent_cluster::images::import(ns, &[archive]));
        if let Err(e) = back {
            eprintln!("importing the sandbox image again: {e:#}");
        }
    }
}

/// `err` with the agent's log behind it: what it saw and decided is the first thing to read
/// when the node did not do what the test expected.
fn with_agent_log(rc: &RealCluster, agent: &str, err: anyhow::Error) -> anyhow::Error {
    match rc.agent_logs(agent) {
        Ok(log) => {
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(150)..];
            err.context(format!(
                "the agent's log ({agent}), its last lines:\n{}",
                tail.join("\n")
            ))
        }
        Err(e) => err.context(format!("the agent's log ({agent}) could not be read: {e}")),
    }
}

#[test]
fn disk_pressure_reclaims_dead_containers_and_unused_images_before_evicting() -> anyhow::Result<()>
{
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    // Dropped before the base is restored: the base's new agent pod needs a sandbox.
    let _sandbox = SandboxImageBack(&rc);
    // Images may go as soon as they are seen unused (the shipped 2m would keep the test's).
    let config =
        Variant::shipped_config_with(&[("imageMinimumGCAge: 2m", "imageMinimumGCAge: 0s")]);
    rc.install(
        "reclaim",
        &Variant {
            config: Some(config),
            ..Variant::enforcing()
        },
    )?;
    let node = rc.node0().name;
    let agent = rc.agent_pod(&node, "node-agent")?;
    let ns = rc.namespace("reclaim");
    let image = unused_image(&rc)?;
    assert!(node_images(&rc)?.contains(&image), "imported");
    // A dead container: a pod that ran and ended.
    let mut done = WorkloadPod::new("done", Qos::BestEffort, "", &[]);
    done.node = Some(node.clone());
    done.extra_container
        .push("      command: [\"/bin/true\"]".into());
    rc.kubectl.apply(&done.manifest(&ns.name))?;
    rc.kubectl
        .wait_for("the pod ran to its end", Duration::from_secs(60), |k| {
            Ok((k
                .run(&[
                    "-n",
                    &ns.name,
                    "get",
                    "pod",
                    "done",
                    "-o",
                    "jsonpath={.status.phase}",
                ])?
                .trim()
                == "Succeeded")
                .then_some(()))
        })?;
    // Fill the node's disk to just under the agent's imagefs line (20 % free: the shared disk
    // is nodefs and imagefs at once), above the kubelet's (15 %): 18 % free. Sized from the
    // disk read now: the agent's figure can be a sampling period old, from before the unused
    // image was imported, and would overshoot past the kubelet's line by the image's size.
    let (available, capacity) = nodefs_statfs(&rc, &rc.node0())?;
    let fill_mib = ((available - 0.18 * capacity) / 1048576.0).floor() as u64;
    let mut filler = WorkloadPod::new(
        "filler",
        Qos::BestEffort,
        "",
        &["allocate", "/scratch/data", &fill_mib.to_string()],
    );
    filler.node = Some(node.clone());
    filler
        .extra_spec
        .push("  volumes: [{name: scratch, emptyDir: {}}]".into());
    filler
        .extra_container
        .push("      volumeMounts: [{name: scratch, mountPath: /scratch}]".into());
    rc.kubectl.apply(&filler.manifest(&ns.name))?;
    wait_running(&rc.kubectl, &ns.name, &["filler"], Duration::from_secs(60))?;

    // Reclaim first: the unused image and the dead container go, the node's event says so.
    rc.kubectl
        .wait_for("the unused image removed", Duration::from_secs(120), |_| {
            Ok((!node_images(&rc)?.contains(&image)).then_some(()))
        })
        .map_err(|e| with_agent_log(&rc, &agent, e))?;
    let ns_node = rc.cluster.node_ns(&rc.node0())?;
    let dead = node_agent_cluster::node::in_ns(
        ns_node,
        "ctr",
        &[
            "--address",
            "/run/containerd/containerd.sock",
            "-n",
            "k8s.io",
            "containers",
            "ls",
            "-q",
        ],
    )?;
    let done_uid = rc.kubectl.run(&[
        "-n",
        &ns.name,
        "get",
        "pod",
        "done",
        "-o",
        "jsonpath={.status.containerStatuses[0].containerID}",
    ])?;
    let done_id = done_uid.trim().trim_start_matches("containerd://");
    assert!(
        !done_id.is_empty() && !dead.contains(done_id),
        "the dead container removed"
    );
    let events = rc.kubectl.get_json(&[
        "-n",
        "default",
        "events",
        "--field-selector",
        &format!("involvedObject.name={node}"),
    ])?;
    assert!(
        events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["reason"] == "FreedDiskSpace"),
        "FreedDiskSpace on the node: {events}"
    );
    // ...and that was enough: nothing evicted.
    std::thread::sleep(Duration::from_secs(5));
    let evicted = rc.eviction_requests(&ns.name)?;
    if !evicted.is_empty() {
        return Err(with_agent_log(
            &rc,
            &agent,
            anyhow::anyhow!("no eviction after the reclaim freed enough, yet: {evicted:?}"),
        ));
    }
    let phase = rc.kubectl.run(&[
        "-n",
        &ns.name,
        "get",
        "pod",
        "filler",
        "-o",
        "jsonpath={.status.phase}",
    ])?;
    assert_eq!(phase.trim(), "Running");
    Ok(())
}
