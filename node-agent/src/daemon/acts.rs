//! The daemon's acting part: the pure plan (`node_agent_executor::plan`), the executor it
//! hands actions to, the executor's settings, and when the runtime's images were last asked
//! about. Handing over never waits (see `node_agent_executor`).

use std::{
    collections::BTreeMap,
    time::{Duration, SystemTime},
};

use node_agent_executor::{
    plan::{oom_kill_actions, Acting, NodeReclaim, Plan, Rates, Timing},
    Action, Executor, OomTold, Outcome, Settings, Unnamed,
};
use node_agent_kube::config::{KubeConfig, PdbPolicy};
use node_agent_policy::Eligibility;
use tokio::sync::{mpsc, watch};

use super::{
    config::{AgentConfig, Overrides},
    feed::Cluster,
};
use node_agent_cri::reclaim::FsLayout;

/// How often the runtime's images (and where it keeps them) are asked about: the kubelet's
/// image GC period, when it runs `detectImages`.
pub const IMAGE_DETECT_PERIOD: Duration = Duration::from_secs(300);

pub struct Acts {
    executor: Executor,
    pub outcomes: mpsc::UnboundedReceiver<Outcome>,
    settings: watch::Sender<Settings>,
    pub plan: Acting,
    pub timing: Timing,
    /// When the runtime was last asked (the kubelet's `detectImages`); `None`: ask now.
    images_asked_at: Option<Duration>,
    /// OOM kills waiting for the runtime to name their container, by container id.
    identifying: BTreeMap<String, Vec<Unnamed>>,
}

/// Containers being named by the runtime at once, and kills held for each.
const MAX_IDENTIFYING: usize = 64;

impl Acts {
    pub fn start(
        config: &AgentConfig,
        cluster: Option<&Cluster>,
        overrides: &Overrides,
        now: Duration,
    ) -> Self {
        let (settings, settings_rx) =
            watch::channel(executor_settings(config, cluster, overrides, 0));
        let (executor, outcomes) = Executor::spawn(settings_rx);
        let mut plan = Acting::default();
        plan.set_pacing(Some(rates(config)), now);
        Self {
            executor,
            outcomes,
            settings,
            plan,
            timing: timing(config),
            images_asked_at: None,
            identifying: BTreeMap::new(),
        }
    }

    /// An OOM kill in a container the pod source has not named: the runtime is asked once per
    /// container; kills meanwhile wait for its answer (a bounded few; beyond, they are dropped
    /// and said so, the series still counts the ones kept).
    pub fn identify(&mut self, kill: Unnamed) {
        let id = kill.container_id.clone();
        if let Some(waiting) = self.identifying.get_mut(&id) {
            if waiting.len() < MAX_IDENTIFYING {
                waiting.push(kill);
            } else {
                tracing::warn!(container = %id, "OOM kills waiting for the runtime to name their container: one dropped");
            }
            return;
        }
        if self.identifying.len() >= MAX_IDENTIFYING {
            tracing::warn!(container = %id, "too many containers waiting to be named by the runtime: an OOM kill dropped");
            return;
        }
        self.identifying.insert(id, Vec::new());
        self.executor.submit(Action::Identify(Box::new(kill)));
    }

    /// An OOM kill, its victim named as far as it can be: its pod's event (or nothing while it
    /// joins a series), or the node's.
    pub fn oom_kill(&mut self, told: OomTold, kube: Option<&KubeConfig>, now: Duration) {
        let actions = match told {
            OomTold::Pod(kill) => self
                .plan
                .pod_oom_kill(kill, now, SystemTime::now())
                .into_iter()
                .collect(),
            OomTold::Node(kill) => oom_kill_actions(kube, kill),
        };
        self.submit(actions);
    }

    /// The pods whose eviction is in flight, `namespace/name`.
    pub fn in_flight_pods(&self) -> Vec<String> {
        self.plan.in_flight().map(|f| f.pod.clone()).collect()
    }

    /// The runtime answered for this container: the kills that waited for it.
    pub fn identified(&mut self, container_id: &str) -> Vec<Unnamed> {
        self.identifying.remove(container_id).unwrap_or_default()
    }

    /// Hands the plan's actions over (in order; never waits).
    pub fn submit(&self, actions: Vec<Action>) {
        for action in actions {
            self.executor.submit(action);
        }
    }

    /// The generation of the executor's cluster connection.
    pub fn generation(&self) -> u64 {
        self.settings.borrow().generation
    }

    /// A reload: the executor's settings first (dry run and exclusions hold from this moment),
    /// then the plan's pacing and timing; what was reported is reported anew.
    pub fn reconfigure(
        &mut self,
        config: &AgentConfig,
        cluster: Option<&Cluster>,
        overrides: &Overrides,
        reconnected: bool,
        now: Duration,
    ) {
        let generation = self.generation() + u64::from(reconnected);
        self.settings
            .send_replace(executor_settings(config, cluster, overrides, generation));
        self.plan.set_pacing(Some(rates(config)), now);
        self.timing = timing(config);
        self.plan.reset_reported();
    }

    /// The node-level reclaim the config and this filesystem layout call for.
    pub fn set_node_reclaim(&mut self, config: &AgentConfig, layout: FsLayout) {
        let reclaim = config.runtime.as_ref().map(|_| NodeReclaim {
            layout,
            interval: config.settings.resync_interval,
        });
        self.plan.set_node_reclaim(reclaim);
    }

    /// Asks the runtime about its images and filesystems when the period has passed (or it has
    /// never been asked, or `now_please` says it restarted).
    pub fn detect_images_if_due(&mut self, config: &AgentConfig, now: Duration, now_please: bool) {
        if config.runtime.is_none() {
            return;
        }
        let due = now_please
            || self
                .images_asked_at
                .is_none_or(|t| now >= t + IMAGE_DETECT_PERIOD);
        if due {
            self.images_asked_at = Some(now);
            self.executor.submit(Action::DetectImages);
        }
    }

    /// The agent stops: its condition `Unknown` and its taint removed, waited for at most
    /// `deadline` (see [`Executor::stop`]).
    pub async fn stop(&mut self, deadline: Duration) -> Option<node_agent_executor::StatusReport> {
        self.executor.stop(&mut self.outcomes, deadline).await
    }

    /// What the plan holds for the loop: its actions handed over, its notes returned.
    pub fn carry_out(&self, plan: Plan) -> Vec<node_agent_executor::plan::Note> {
        self.submit(plan.actions);
        plan.notes
    }
}

/// The agent's own pod and the exclusions: who must never be evicted, whatever happens.
pub fn base_eligibility(config: &AgentConfig, overrides: &Overrides) -> Eligibility {
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
    }
}
