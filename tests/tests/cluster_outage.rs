//! Each component of the cluster stopped, killed or hung while memory pressure builds on a
//! node, the agent enforcing: the API server stopped (SIGSTOP) for 30 s and killed, etcd
//! killed, the kubelet killed, containerd killed, and the agent itself SIGKILLed just after its
//! kill on the node, with the API server stopped so that its record cannot have been taken. In each, a filler brings the node 350 MiB short of the pods cgroup's
//! limit, then a pod armed beforehand (it waits for SIGUSR1, sent from the host, so the ramp
//! starts while the component is away) grows past the agent's line and would pass the limit
//! within two seconds without relief; a BestEffort pod holds what must be given back. The test measures, from the host, when the pods cgroup crossed the agent's line
//! and when the victim's process was gone (relief), and checks: no OOM kill on this machine
//! (`/proc/vmstat`'s `oom_kill`), the grower untouched, the victim ended once and recorded by
//! the agent once the API server is back, and the taint and condition gone after.
//!
//! The delay to relief is printed per outage (`relief …`) for the closing notes.

use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context as _};
use node_agent_cluster::faults::Component;
use node_agent_tests::real_cluster::{
    wait_running, Qos, RealCluster, Variant, WorkloadPod, AGENT_NS,
};
use node_agent_tests::real_node::{
    agent_pid, condition, kill9, pod_uid, pods_cgroup_available, pressure_taint, workload_pid,
};

const MIB: f64 = 1048576.0;
/// The agent's hard line on `allocatableMemory.available` (deploy/config.yaml).
const LINE_MIB: f64 = 200.0;
/// How fast the grower grows: the 200 MiB between the line and the limit last one second.
const RATE_MIB_S: u64 = 200;
/// What the victim holds.
const VICTIM_MIB: u64 = 600;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Outage {
    /// The baseline: the same ramp with every component up.
    Nothing,
    ApiServerStopped,
    ApiServerKilled,
    EtcdKilled,
    KubeletKilled,
    ContainerdKilled,
    /// The API server stopped, then the agent SIGKILLed just after its kill on the node,
    /// before its record can be taken; the kubelet restarts it in place.
    AgentKilledBeforeItsRecord,
}

/// Puts the component back when dropped, also when the test fails half-way.
struct Restore<'a> {
    rc: &'a RealCluster,
    outage: Outage,
    node: node_agent_cluster::NodeSpec,
    done: bool,
}

impl Restore<'_> {
    fn component(&self) -> Option<Component> {
        match self.outage {
            Outage::ApiServerStopped
            | Outage::ApiServerKilled
            | Outage::AgentKilledBeforeItsRecord => Some(Component::ApiServer),
            Outage::EtcdKilled => Some(Component::Etcd),
            Outage::KubeletKilled => Some(Component::Kubelet(self.node.clone())),
            Outage::ContainerdKilled => Some(Component::Containerd(self.node.clone())),
            Outage::Nothing => None,
        }
    }

    fn start(&self) -> anyhow::Result<()> {
        let Some(c) = self.component() else {
            return Ok(());
        };
        match self.outage {
            Outage::ApiServerStopped | Outage::AgentKilledBeforeItsRecord => {
                self.rc.cluster.signal_component(&c, libc::SIGSTOP)
            }
            _ => self.rc.cluster.kill_component(&c),
        }
    }

    fn end(&mut self) -> anyhow::Result<()> {
        self.done = true;
        let Some(c) = self.component() else {
            return Ok(());
        };
        match self.outage {
            Outage::ApiServerStopped | Outage::AgentKilledBeforeItsRecord => {
                self.rc.cluster.signal_component(&c, libc::SIGCONT)?
            }
            _ => self.rc.cluster.start_component(&c)?,
        }
        // The controller manager and the scheduler exit when they cannot renew their leases;
        // kubeadm's kubelet would restart their static pods.
        let restarted = self.rc.cluster.restart_exited_controllers()?;
        if !restarted.is_empty() {
            eprintln!(
                "{:?}: restarted as the kubelet would: {restarted:?}",
                self.outage
            );
        }
        Ok(())
    }
}

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        if !self.done {
            if let Err(e) = self.end() {
                eprintln!("putting back {:?}: {e:#}", self.outage);
            }
        }
    }
}

/// The machine's OOM kills so far (`/proc/vmstat`), any cgroup's.
fn oom_kills() -> anyhow::Result<u64> {
    let text = std::fs::read_to_string("/proc/vmstat")?;
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .context("/proc/vmstat has no oom_kill")?
        .trim()
        .parse()
        .context("/proc/vmstat's oom_kill")
}

/// What the host saw while the grower grew.
struct Watched {
    /// Arming → the pods cgroup below the agent's line.
    crossed: Option<Duration>,
    /// Arming → the victim's process gone.
    gone: Option<Duration>,
    /// The least headroom seen, MiB.
    least_mib: f64,
}

/// Polls the pods cgroup and the victim's process every 2 ms from `armed` until the victim is
/// gone or `limit` passes.
fn watch(
    node: &node_agent_cluster::NodeSpec,
    victim: u32,
    armed: Instant,
    limit: Duration,
) -> Watched {
    let mut w = Watched {
        crossed: None,
        gone: None,
        least_mib: f64::MAX,
    };
    while armed.elapsed() < limit {
        if let Ok(available) = pods_cgroup_available(node) {
            let mib = available / MIB;
            w.least_mib = w.least_mib.min(mib);
            if mib < LINE_MIB && w.crossed.is_none() {
                w.crossed = Some(armed.elapsed());
            }
        }
        if !node_agent_cluster::process::alive(victim) {
            w.gone = Some(armed.elapsed());
            return w;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    w
}

fn agent_log_since(rc: &RealCluster, pod: &str, since: &str, previous: bool) -> String {
    let mut args = vec!["-n", AGENT_NS, "logs", pod, "--since-time", since];
    if previous {
        args.push("--previous");
    }
    rc.kubectl.run(&args).unwrap_or_default()
}

fn rfc3339_now() -> String {
    jiff::Timestamp::try_from(SystemTime::now())
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn under(outage: Outage, hold: Duration) -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    // Enforcing, with a transition period short enough to see the taint go within the test.
    let config = Variant::shipped_config_with(&[(
        "evictionPressureTransitionPeriod: \"5m\"",
        "evictionPressureTransitionPeriod: \"20s\"",
    )]);
    rc.install(
        "outage",
        &Variant {
            config: Some(config),
            ..Variant::enforcing()
        },
    )?;
    let node = rc.node0();
    let agent = rc.agent_pod(&node.name, "node-agent")?;
    let ns = rc.namespace("outage");

    // The victim, BestEffort and first in the kubelet's ranking (600 MiB over its request);
    // a filler, Guaranteed (never ranked first), that leaves 350 MiB; and the grower, armed,
    // Burstable and at most 386 MiB over its request, which grows 450 MiB once armed: past the
    // agent's line after 150 MiB, past the pods cgroup's limit after 350 unless something
    // gives memory back.
    let mut victim = WorkloadPod::new(
        "victim",
        Qos::BestEffort,
        "",
        &["memory", &VICTIM_MIB.to_string(), "0"],
    );
    victim.node = Some(node.name.clone());
    rc.kubectl.apply(&victim.manifest(&ns.name))?;
    wait_running(&rc.kubectl, &ns.name, &["victim"], Duration::from_secs(90))?;
    rc.wait_held(&ns.name, &["victim"], Duration::from_secs(60))?;
    std::thread::sleep(Duration::from_secs(3));
    rc.grow_to_headroom(&ns.name, &node.name, &agent, "filler", 350.0, 0)?;
    rc.wait_held(&ns.name, &["filler"], Duration::from_secs(60))?;
    let mut grower = WorkloadPod::new(
        "grower",
        Qos::Burstable,
        "64Mi",
        &["armed", "memory", "450", &RATE_MIB_S.to_string()],
    );
    grower.node = Some(node.name.clone());
    rc.kubectl.apply(&grower.manifest(&ns.name))?;
    wait_running(&rc.kubectl, &ns.name, &["grower"], Duration::from_secs(90))?;
    rc.kubectl
        .wait_for("the grower is armed", Duration::from_secs(30), |k| {
            Ok(k.run(&["-n", &ns.name, "logs", "grower"])?
                .contains("phase=armed")
                .then_some(()))
        })?;
    for pod in ["victim", "filler", "grower"] {
        eprintln!("{outage:?}: {pod} is pod {}", pod_uid(&rc, &ns.name, pod)?);
    }
    let victim_pid = workload_pid(&pod_uid(&rc, &ns.name, "victim")?)?;
    let grower_pid = workload_pid(&pod_uid(&rc, &ns.name, "grower")?)?;
    let agent_host_pid = agent_pid(&rc, &agent)?;
    let since = rfc3339_now();
    let kills_before = oom_kills()?;

    // The outage, then the ramp.
    let mut restore = Restore {
        rc: &rc,
        outage,
        node: node.clone(),
        done: false,
    };
    let started = Instant::now();
    restore.start()?;
    std::thread::sleep(Duration::from_secs(2));
    let armed = Instant::now();
    // SAFETY: kill(2) of the grower's process, found by its pod's cgroup just before.
    if unsafe { libc::kill(grower_pid as i32, libc::SIGUSR1) } != 0 {
        bail!("SIGUSR1 to the grower: {}", std::io::Error::last_os_error());
    }
    let seen = watch(&node, victim_pid, armed, Duration::from_secs(20));
    if outage == Outage::AgentKilledBeforeItsRecord {
        kill9(agent_host_pid)?;
    }
    let (Some(crossed), Some(gone)) = (seen.crossed, seen.gone) else {
        bail!(
            "{outage:?}: no relief within 20 s of the ramp (crossed the line after {:?}, least headroom {:.0} MiB)",
            seen.crossed,
            seen.least_mib
        );
    };
    let relief = gone.saturating_sub(crossed);
    eprintln!(
        "relief {outage:?}: line crossed {:.0} ms after the ramp began, victim gone {:.0} ms after the crossing; least headroom {:.0} MiB",
        crossed.as_secs_f64() * 1e3,
        relief.as_secs_f64() * 1e3,
        seen.least_mib
    );
    if let Some(rest) = hold.checked_sub(started.elapsed()) {
        std::thread::sleep(rest);
    }
    restore.end()?;

    // After: the agent's record of its kill once the API server is back, nothing killed twice,
    // the grower untouched, no OOM kill, the taint and condition gone.
    if let Err(e) = rc.wait_killed_by_agent(&ns.name, "victim", Duration::from_secs(90)) {
        let log = agent_log_since(&rc, &agent, &since, false);
        return Err(e.context(format!(
            "{outage:?}: no record; the agent's log since the outage:\n{log}"
        )));
    }
    for pod in ["filler", "grower"] {
        let p = rc.kubectl.get_json(&["-n", &ns.name, "pod", pod])?;
        assert_eq!(
            p["status"]["phase"], "Running",
            "{outage:?}: {pod} stays: {}",
            p["status"]
        );
        assert_eq!(
            p["status"]["containerStatuses"][0]["restartCount"].as_i64(),
            Some(0),
            "{outage:?}: {pod} was never killed"
        );
    }
    let kills = oom_kills()? - kills_before;
    assert_eq!(
        kills, 0,
        "{outage:?}: the kernel's OOM killer acted {kills} times"
    );
    let ends = rc.agent_pod_ends(&ns.name)?;
    // Only the victim ended, by records of the kill (a stopped API server may still carry out
    // the patch a killed agent had sent, beside the restarted agent's: the same record).
    assert!(
        ends.iter().any(|e| e.code == 200)
            && ends.iter().all(|e| e.pod == "victim" && e.kind == "status"),
        "{outage:?}: records of the victim alone: {ends:?}"
    );
    rc.kubectl.wait_for(
        "the taint removed and the condition False",
        Duration::from_secs(90),
        |_| {
            let taint = pressure_taint(&rc, &node.name)?;
            let c = condition(&rc, &node.name, "NodeAgentPressure")?;
            Ok((taint.is_none() && c.is_some_and(|c| c["status"] == "False")).then_some(()))
        },
    )?;

    // What the agent said.
    let now_agent = rc.agent_pod(&node.name, "node-agent")?;
    let log = match outage {
        Outage::AgentKilledBeforeItsRecord => {
            agent_log_since(&rc, &agent, &since, true)
                + &agent_log_since(&rc, &now_agent, &since, false)
        }
        _ => agent_log_since(&rc, &agent, &since, false),
    };
    eprintln!("{outage:?}: the agent's log since the outage:\n{log}");
    // Every line of `all`, and one of `any` (what was missing: which request found no answer
    // first is a race, and so is whether the connection's source flips before the record's
    // retries get through).
    let (all, any): (&[&str], &[&str]) = match outage {
        Outage::ApiServerStopped | Outage::ApiServerKilled | Outage::EtcdKilled => (
            &["eviction recorded"],
            &[
                "source not ready",
                "its record waits for the API server",
                "no complete answer",
                "connection refused",
            ],
        ),
        Outage::KubeletKilled => (&["source not ready", "source ready"], &[]),
        Outage::Nothing => (&["eviction recorded"], &[]),
        Outage::AgentKilledBeforeItsRecord => (
            &[
                "a kill's record a previous run left unwritten: writing it",
                "eviction recorded",
            ],
            &[],
        ),
        Outage::ContainerdKilled => (&[], &[]),
    };
    for line in all {
        assert!(
            log.contains(line),
            "{outage:?}: the agent's log says {line:?}"
        );
    }
    assert!(
        any.is_empty() || any.iter().any(|l| log.contains(l)),
        "{outage:?}: the agent's log says what was missing, one of {any:?}"
    );
    Ok(())
}

#[test]
fn nothing_away_the_baseline() -> anyhow::Result<()> {
    under(Outage::Nothing, Duration::from_secs(0))
}

#[test]
fn the_api_server_stopped_for_30_s() -> anyhow::Result<()> {
    under(Outage::ApiServerStopped, Duration::from_secs(30))
}

#[test]
fn the_api_server_killed_and_restarted() -> anyhow::Result<()> {
    under(Outage::ApiServerKilled, Duration::from_secs(15))
}

#[test]
fn etcd_killed_and_restarted() -> anyhow::Result<()> {
    under(Outage::EtcdKilled, Duration::from_secs(15))
}

#[test]
fn the_kubelet_killed_and_restarted() -> anyhow::Result<()> {
    under(Outage::KubeletKilled, Duration::from_secs(15))
}

#[test]
fn containerd_killed_and_restarted() -> anyhow::Result<()> {
    under(Outage::ContainerdKilled, Duration::from_secs(15))
}

#[test]
fn the_agent_sigkilled_after_its_kill_before_its_record() -> anyhow::Result<()> {
    under(Outage::AgentKilledBeforeItsRecord, Duration::from_secs(20))
}
