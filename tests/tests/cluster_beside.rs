//! Beside the kubelet, on the real cluster: with the kubelet on kubeadm's defaults and the
//! agent on the shipped config, enforcing, pressure that would cross the kubelet's line is met
//! by the agent first, and the kubelet evicts nothing for it (its log, the pods' status, the
//! node's condition and taints say so); the same pressure with the agent only observing is
//! the kubelet's to evict, which shows what those assertions would see. And a kubelet whose
//! threshold is above the agent's is named by the agent's start-up warning.

use std::time::Duration;

use node_agent_cluster::{node_components::KubeletOptions, NodeSpec};
use node_agent_tests::{
    real_cluster::{
        disruption_target, wait_running, Qos, RealCluster, Variant, WorkloadPod, AGENT_NS,
    },
    real_node::{
        allocatable_headroom, condition, kubelet_allocatable_available, kubelet_allocatable_offset,
        kubelet_log_mark, kubelet_log_since, pods_cgroup_available, restart_kubelet, taints,
        wait_held,
    },
};
use serde_json::Value;

const MIB: f64 = 1048576.0;
/// What the kubelet's eviction manager logs when one of its thresholds is met.
const KUBELET_RECLAIMS: &str = "Eviction manager: attempting to reclaim";
const MEMORY_PRESSURE_TAINT: &str = "node.kubernetes.io/memory-pressure";

/// Pressure that crosses the agent's line (200Mi) slowly and, unless something evicts the
/// grower, the kubelet's too (100Mi), and stays there: a pod holding all but 550 MiB (as the
/// agent counts) of the pods' memory within its own request (above the agent's soft 500Mi, so that
/// only the grower is ever evicted), then a Burstable pod growing 20 MiB/s until the kubelet's
/// `allocatableMemory.available` is 50 MiB.
/// Returns the grower's name.
fn pressure(rc: &RealCluster, namespace: &str, spec: &NodeSpec) -> anyhow::Result<String> {
    let node = spec.name.as_str();
    // Sized by the figure the kubelet and the agent both measure (see
    // allocatable_available_is_the_kubelets_own), read from the pods cgroup as the kubelet
    // computes it.
    let headroom = pods_cgroup_available(spec)? / MIB;
    let filler_mib = (headroom - 550.0).floor() as u64;
    // Burstable within its request (a Guaranteed pod's CPU limit of 10m would take minutes to
    // touch that much memory): ranked after a pod over its request, by the kubelet and the agent.
    let mut filler = WorkloadPod::new(
        "filler",
        Qos::Burstable,
        &format!("{filler_mib}Mi"),
        &["memory", &(filler_mib - 32).to_string(), "0"],
    );
    filler.node = Some(node.to_string());
    rc.kubectl.apply(&filler.manifest(namespace))?;
    wait_running(&rc.kubectl, namespace, &["filler"], Duration::from_secs(90))?;
    wait_held(rc, namespace, "filler")?;
    let left = pods_cgroup_available(spec)? / MIB;
    let grow = (left - 50.0).floor() as u64;
    anyhow::ensure!(
        (400..=900).contains(&grow),
        "the filler left {left:.0} MiB: the grower would grow {grow} MiB"
    );
    let mut grower = WorkloadPod::new(
        "grower",
        Qos::Burstable,
        "16Mi",
        &["memory", &grow.to_string(), "20"],
    );
    grower.node = Some(node.to_string());
    rc.kubectl.apply(&grower.manifest(namespace))?;
    wait_running(&rc.kubectl, namespace, &["grower"], Duration::from_secs(90))?;
    Ok(grower.name)
}

/// What the kubelet did for memory pressure: the part of its log written since `from` bytes.
fn pods(rc: &RealCluster, namespace: &str) -> anyhow::Result<Vec<Value>> {
    Ok(rc.kubectl.get_json(&["-n", namespace, "pods"])?["items"]
        .as_array()
        .cloned()
        .unwrap_or_default())
}

fn has_memory_pressure_taint(rc: &RealCluster, node: &str) -> anyhow::Result<bool> {
    Ok(taints(rc, node)?
        .iter()
        .any(|t| t["key"] == MEMORY_PRESSURE_TAINT))
}

#[test]
fn enforcing_the_agent_acts_first_and_the_kubelet_evicts_nothing_for_the_same_pressure(
) -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    let spec = rc.node0();
    let node = spec.name.clone();
    // kubeadm's kubelet (no eviction settings of its own); restarted with them again at the
    // end, which also ends the pressure it may remember from the second half.
    let kubelet = restart_kubelet(&rc, &spec, &KubeletOptions::default())?;
    let memory_pressure_before =
        condition(&rc, &node, "MemoryPressure")?.expect("the kubelet's condition");
    assert_eq!(memory_pressure_before["status"], "False");

    // Enforcing, the shipped config.
    rc.install("beside-enforcing", &Variant::enforcing())?;
    let ns = rc.namespace("beside");
    let log_from = kubelet_log_mark(&rc, &spec)?;
    let grower = pressure(&rc, &ns.name, &spec)?;
    rc.wait_killed_by_agent(&ns.name, &grower, Duration::from_secs(120))?;
    // Two of the kubelet's 10 s housekeeping rounds, with the node as the agent left it.
    std::thread::sleep(Duration::from_secs(25));
    let kubelet_did = kubelet_log_since(&rc, &spec, log_from)?;
    assert!(
        !kubelet_did.contains(KUBELET_RECLAIMS),
        "the kubelet evicted too: {}",
        kubelet_did
            .lines()
            .filter(|l| l.contains("Eviction manager"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // The grower ended as the agent recorded it; every other pod runs, none ended by the
    // kubelet.
    let left = pods(&rc, &ns.name)?;
    assert!(
        left.iter().all(|p| p["metadata"]["name"] == grower.as_str()
            || (p["status"]["phase"] == "Running" && p["status"]["reason"].is_null())),
        "no other pod ended: {:?}",
        left.iter()
            .map(|p| (
                &p["metadata"]["name"],
                &p["status"]["phase"],
                &p["status"]["reason"]
            ))
            .collect::<Vec<_>>()
    );
    let agent = rc.agent_pod(&node, "node-agent")?;
    assert_eq!(
        rc.metric(&agent, "node_agent_evictions_total{eviction_signal=\"allocatableMemory.available\",result=\"killed\"}")?,
        Some(1.0),
        "the agent killed"
    );
    rc.kubectl.run(&[
        "-n",
        &ns.name,
        "delete",
        "pod",
        "filler",
        &grower,
        "--wait=true",
    ])?;

    // The same pressure with the agent only observing (the base install): the kubelet's to
    // act on, and what that looks like.
    rc.restore_base()?;
    let log_from = kubelet_log_mark(&rc, &spec)?;
    let grower = pressure(&rc, &ns.name, &spec)?;
    let evicted = rc.kubectl.wait_for(
        "the kubelet evicting the grower",
        Duration::from_secs(120),
        |k| {
            let p = k.get_json(&["-n", &ns.name, "pod", &grower])?;
            // Kubernetes 1.37's kubelet ends an evicted pod by its containers' exit: the
            // workload exits 0 on SIGTERM, so the phase is Succeeded, not Failed; the eviction
            // is the DisruptionTarget condition, reason TerminationByKubelet.
            let ended = p["status"]["phase"] == "Failed" || p["status"]["phase"] == "Succeeded";
            let by_kubelet = disruption_target(&p)["reason"] == "TerminationByKubelet";
            if ended && by_kubelet {
                return Ok(Some(p));
            }
            // Not yet: the pod's phase and conditions, and the kubelet's figure, for the timeout.
            anyhow::bail!(
                "phase {}, conditions {}; the kubelet's allocatableMemory.available {:.0} MiB",
                p["status"]["phase"],
                p["status"]["conditions"],
                kubelet_allocatable_available(&rc, &node).unwrap_or(f64::NAN) / MIB
            )
        },
    )?;
    eprintln!(
        "the kubelet's eviction as a user sees it: phase {}, reason {}, message {}",
        evicted["status"]["phase"], evicted["status"]["reason"], evicted["status"]["message"]
    );
    let disruption = disruption_target(&evicted);
    assert!(
        disruption["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("The node was low on resource: memory.")),
        "the kubelet's message: {disruption}"
    );
    assert!(kubelet_log_since(&rc, &spec, log_from)?.contains(KUBELET_RECLAIMS));
    // Its condition (at its next status update) and the taint that follows it.
    rc.kubectl.wait_for(
        "MemoryPressure True and its taint",
        Duration::from_secs(60),
        |_| {
            let c = condition(&rc, &node, "MemoryPressure")?;
            Ok(
                (c.is_some_and(|c| c["status"] == "True")
                    && has_memory_pressure_taint(&rc, &node)?)
                .then_some(()),
            )
        },
    )?;
    rc.kubectl
        .run(&["-n", &ns.name, "delete", "pod", "filler", "--wait=true"])?;
    drop(kubelet);
    // A restarted kubelet forgets the pressure it saw: the condition and taint go.
    rc.kubectl
        .wait_for("MemoryPressure gone", Duration::from_secs(120), |_| {
            let c = condition(&rc, &node, "MemoryPressure")?;
            Ok((c.is_some_and(|c| c["status"] == "False")
                && !has_memory_pressure_taint(&rc, &node)?)
            .then_some(()))
        })?;
    Ok(())
}

/// The agent's log from its start, after a restart (its pod deleted; a new one started).
fn restarted_agent_log(rc: &RealCluster, node: &str, wait_for: &str) -> anyhow::Result<String> {
    let old = rc.agent_pod(node, "node-agent")?;
    rc.kubectl
        .run(&["-n", AGENT_NS, "delete", "pod", &old, "--wait=true"])?;
    rc.kubectl.wait_for(
        &format!("the new agent logging {wait_for:?}"),
        Duration::from_secs(120),
        |_| {
            let Some(pod) = rc.agent_pod(node, "node-agent").ok().filter(|p| *p != old) else {
                return Ok(None);
            };
            let log = rc.agent_logs(&pod)?;
            Ok(log.contains(wait_for).then_some(log))
        },
    )
}

#[test]
fn a_kubelet_threshold_above_the_agents_is_named_at_the_agents_start() -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    let spec = rc.node0();
    let node = spec.name.clone();
    rc.install("base", &Variant::default())?;

    // kubeadm's kubelet: nothing to warn about.
    let log = restarted_agent_log(&rc, &node, "beside the kubelet")?;
    assert!(
        log.contains(
            "beside the kubelet: every kubelet eviction threshold is met after one of the agent's"
        ),
        "{log}"
    );
    assert!(!log.contains("beside the kubelet: the kubelet's"), "{log}");

    // A kubelet at memory.available<600Mi (its allocatable line copied from it, as the kubelet
    // does with enforceNodeAllocatable: [pods]): above every threshold of the agent's, soft
    // 500Mi and hard 200Mi. Then at 300Mi: between them, met before the agent's hard one,
    // after its soft one but sooner than that one's grace period.
    for (kubelet, says) in [
        (
            "600Mi",
            "beside the kubelet: the kubelet's hard memory.available<600Mi is met before the agent's",
        ),
        (
            "300Mi",
            "beside the kubelet: the agent's soft memory.available<500Mi (grace 90s) is met before the kubelet's hard memory.available<300Mi but waits longer: the kubelet may evict first",
        ),
    ] {
        let _kubelet = restart_kubelet(
            &rc,
            &spec,
            &KubeletOptions {
                extra: vec!["evictionHard:".into(), format!("  memory.available: {kubelet}")],
            },
        )?;
        let log = restarted_agent_log(&rc, &node, "beside the kubelet")?;
        let warnings: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("WARN") && l.contains("beside the kubelet"))
            .collect();
        eprintln!("kubelet at {kubelet}:\n{}", warnings.join("\n"));
        assert!(
            warnings.iter().any(|l| l.contains(says)),
            "kubelet at {kubelet}: a warning names both thresholds ({says}): {warnings:?}"
        );
    }
    Ok(())
}

#[test]
fn allocatable_available_is_the_kubelets_own() -> anyhow::Result<()> {
    // The kubelet measures its pods cgroup against the cgroup's own memory limit (capacity
    // less the reservations), and so does the agent; the Node's status.allocatable.memory is
    // that less the kubelet's hard memory.available threshold too (100Mi here), which the
    // agent measured against until the race found it.
    let rc = RealCluster::get();
    let node = rc.node0().name;
    rc.install("base", &Variant::default())?;
    let agent = rc.agent_pod(&node, "node-agent")?;
    let offset = kubelet_allocatable_offset(&rc, &rc.node0())? / MIB;
    assert_eq!(
        offset, 100.0,
        "the pods cgroup's limit less the Node's allocatable memory"
    );
    // The kubelet's figure is as old as its last housekeeping (10-15 s), the agent's as its
    // last evaluation: right after an install, pods the last test left may still be going.
    // Read both until the node is quiet, up to a minute.
    let mut readings = Vec::new();
    let difference = rc.kubectl.wait_for(
        "the two figures on a quiet node",
        Duration::from_secs(60),
        |_| {
            let (kubelet, ours) = (
                kubelet_allocatable_available(&rc, &node)?,
                allocatable_headroom(&rc, &agent)?,
            );
            let difference = (kubelet - ours) / MIB;
            readings.push(format!(
                "kubelet {:.0} MiB, agent {:.0} MiB",
                kubelet / MIB,
                ours / MIB
            ));
            std::thread::sleep(Duration::from_secs(2));
            Ok((-10.0..10.0).contains(&difference).then_some(difference))
        },
    );
    eprintln!("allocatableMemory.available readings: {readings:?}");
    let difference = difference?;
    eprintln!("the kubelet's figure and the agent's differ by {difference:.1} MiB");
    Ok(())
}
