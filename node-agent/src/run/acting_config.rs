//! What the acting half ([`node_agent_executor::Acts`]: the plan and the executor, owned
//! together) is started and reconfigured with, from the config: the executor's settings, the
//! plan's pacing and timing, node-level reclaim. Handing over never waits (see
//! `node_agent_executor`).

use std::time::Duration;

use node_agent_cri::reclaim::FsLayout;
use node_agent_executor::{
    kill::host::node_kill_available,
    plan::{NodeReclaim, Rates, Timing},
    Acts, Settings,
};
use node_agent_kube::config::{HardEviction, PdbPolicy};
use node_agent_policy::{error_chain, Eligibility};

use crate::{
    config::{AgentConfig, Overrides},
    observe::feed::Cluster,
};

/// The executor started with the config's settings, the plan with its pacing and the way
/// hard evictions go.
pub fn start(
    config: &AgentConfig,
    cluster: Option<&Cluster>,
    overrides: &Overrides,
    now: Duration,
) -> Acts {
    // Standalone never acts, so never kills: the question is asked only of an agent that may.
    let node_kill = match config.kubernetes {
        Some(_) => node_kill_available().map_err(|e| error_chain(&e)),
        None => Err("standalone: the agent never acts".into()),
    };
    let mut acts = Acts::start(
        executor_settings(config, cluster, overrides, 0),
        rates(config),
        timing(config),
        node_kill,
        now,
    );
    acts.set_hard_eviction(hard_eviction_on_node(config));
    acts
}

/// The config asks for hard memory and PID evictions on the node.
fn hard_eviction_on_node(config: &AgentConfig) -> bool {
    config
        .kubernetes
        .as_ref()
        .is_some_and(|k| k.hard_eviction == HardEviction::Node)
}

/// A reload: the executor's settings (a new generation when the cluster connection was made
/// anew), the plan's pacing and timing.
pub fn reconfigure(
    acts: &mut Acts,
    config: &AgentConfig,
    cluster: Option<&Cluster>,
    overrides: &Overrides,
    reconnected: bool,
    now: Duration,
) {
    let generation = acts.generation() + u64::from(reconnected);
    acts.reconfigure(
        executor_settings(config, cluster, overrides, generation),
        rates(config),
        timing(config),
        now,
    );
    acts.set_hard_eviction(hard_eviction_on_node(config));
}

/// The node-level reclaim the config and this filesystem layout call for.
pub fn node_reclaim(config: &AgentConfig, layout: FsLayout) -> Option<NodeReclaim> {
    config.runtime.as_ref().map(|_| NodeReclaim {
        layout,
        interval: config.settings.resync_interval,
    })
}

/// The agent's own pod and the exclusions: who must never be evicted, whatever happens.
fn base_eligibility(config: &AgentConfig, overrides: &Overrides) -> Eligibility {
    Eligibility {
        own_pod: overrides.own_pod.clone(),
        exclusions: config
            .kubernetes
            .as_ref()
            .map(|k| k.exclusions.clone())
            .unwrap_or_default(),
        ..Eligibility::default()
    }
}

fn rates(config: &AgentConfig) -> Rates {
    let (per_minute, burst) = config.pacing();
    Rates { per_minute, burst }
}

fn timing(config: &AgentConfig) -> Timing {
    let (per_minute, _) = config.pacing();
    let k = config.kubernetes.as_ref();
    Timing {
        pass_over: k.map_or(Duration::from_secs(30), |k| k.pass_over()),
        wait_timeout: k.map_or(Duration::from_secs(30), |k| k.eviction_wait_timeout()),
        failed: Duration::from_secs(60) / per_minute.max(1),
    }
}

/// What the executor works with, from the config (and the cluster connection).
fn executor_settings(
    config: &AgentConfig,
    cluster: Option<&Cluster>,
    overrides: &Overrides,
    generation: u64,
) -> Settings {
    Settings {
        cluster: cluster.map(|c| c.api.clone()),
        generation,
        dry_run: config.dry_run(),
        pdb_policy: config
            .kubernetes
            .as_ref()
            .map_or(PdbPolicy::Respect, |k| k.pdb_policy),
        eligibility: base_eligibility(config, overrides),
        taint: config.kubernetes.as_ref().is_some_and(|k| k.taint),
        runtime: config.runtime.clone(),
        heartbeat: node_agent_executor::CONDITION_HEARTBEAT,
        pending_records: config
            .kubernetes
            .as_ref()
            .map(|_| node_agent_executor::Journal::beside(&config.settings.trace_socket)),
    }
}
