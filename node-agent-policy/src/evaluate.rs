//! The policy core: one evaluation of (config, node, observations, pods, now, previous state),
//! in the order of the kubelet's `synchronize`: thresholds met, minimum reclaim, grace
//! periods, node conditions, then the pods to evict: every pod over a local storage limit, and
//! for the threshold to reclaim at most one more. (The kubelet's periodic synchronize returns
//! after a local storage round, but its memory notifier synchronizes beside it: a memory
//! eviction never waits for the pods over their limits, and here it does not either.)

use std::collections::BTreeMap;
use std::time::Duration;

use crate::config::{EvictionConfig, Threshold};
use crate::eligible::{Eligibility, NotEvictableNow, PassReason};
use crate::local_storage::{limit_exceeded, StorageLimit};
use crate::message::{eviction_message, OffendingContainer};
use crate::observe::{NodeCapacity, Observations};
use crate::pod::PodInfo;
use crate::quantity::{Quantity, NANOS};
use crate::rank::rank;
use crate::signal::{EvictionSignal, NodeCondition, Resource, Signal};

/// The kubelet's `immediateEvictionGracePeriodSeconds`: the grace period for hard evictions.
pub const IMMEDIATE_EVICTION_GRACE_PERIOD_SECONDS: i64 = 1;

/// What the policy remembers between evaluations. Start with `PolicyState::default()`; keep
/// the returned state for the next call. Thresholds are identified by their index in
/// [`EvictionConfig::thresholds`], so start afresh when the configuration changes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PolicyState {
    /// Since when each threshold has been met without interruption.
    pub thresholds_first_observed_at: BTreeMap<usize, Duration>,
    /// When each node condition was last observed.
    pub conditions_last_observed_at: BTreeMap<NodeCondition, Duration>,
    /// Thresholds acted on (met past their grace period) at the last evaluation; minimum
    /// reclaim keeps these met until the signal recovers past threshold plus minimum reclaim.
    pub thresholds_acted_on: Vec<usize>,
}

/// A threshold met at this evaluation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetThreshold {
    /// Index into [`EvictionConfig::thresholds`].
    pub index: usize,
    pub signal: Signal,
    pub hard: bool,
    /// Met only because minimum reclaim holds it after it was acted on.
    pub held_by_min_reclaim: bool,
    /// Met for at least its grace period: it drives eviction.
    pub grace_period_passed: bool,
    /// Met only ahead of the threshold: the signal falls so fast that the headroom left would
    /// be gone before relief could arrive if asked for at the threshold ([`met_early`]).
    pub early: bool,
}

/// The pod chosen for eviction, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Eviction {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
    /// The signal whose threshold is being reclaimed, or the local storage limit the pod
    /// went over.
    pub signal: EvictionSignal,
    pub resource: Resource,
    /// Whether that threshold is hard (no grace period); a local storage limit is.
    pub hard: bool,
    /// The grace period to give the pod, seconds (at least 1).
    pub grace_period_seconds: i64,
    /// The kubelet's wording, for the pod's status and the event.
    pub message: String,
    /// The containers the message names, with the usage it gives (the event's annotations).
    pub offending_containers: Vec<OffendingContainer>,
    /// The threshold quantity at the observed capacity; for a local storage limit, the limit.
    pub threshold_quantity: Quantity,
    /// The observed available value; for a local storage limit, what was used.
    pub available: Quantity,
    /// Chosen for a hard threshold met early (`MetThreshold::early`): the signal falls faster
    /// than relief could follow from the threshold itself.
    pub early: bool,
}

impl Eviction {
    /// How the executor's reports name the pod (see [`PodInfo::id`]).
    pub fn pod_id(&self) -> String {
        self.uid
            .clone()
            .unwrap_or_else(|| format!("{}/{}", self.namespace, self.name))
    }
}

/// A pod ranked ahead of the evicted one (or of none) and passed over, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassedOver {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
    pub reason: PassReason,
}

/// The outcome of one evaluation, as data for the executor.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Decision {
    /// Thresholds met now, hard or soft, within or past their grace period, including those
    /// held by minimum reclaim.
    pub thresholds_met: Vec<MetThreshold>,
    /// Node conditions to report, sorted.
    pub conditions: Vec<NodeCondition>,
    /// The signal being reclaimed, when a threshold is past its grace period.
    pub reclaim: Option<Signal>,
    /// The pods to evict: every pod over a local storage limit that may be evicted (the
    /// kubelet's `localStorageEviction` evicts them all in one synchronize), then at most one
    /// for the threshold being reclaimed (never one of those).
    pub evictions: Vec<Eviction>,
    /// Pods ranked ahead of the evicted one (or of none) and passed over, in rank order.
    pub passed_over: Vec<PassedOver>,
    /// Pods over a local storage limit that may not be evicted (critical, excluded, not
    /// evictable now; those terminating or being evicted left out), with the limit, in pod order.
    pub over_limit_passed_over: Vec<(PassedOver, StorageLimit)>,
}

impl Decision {
    /// Each signal with a threshold met, once, sorted by name.
    pub fn signals_met(&self) -> Vec<Signal> {
        let mut signals: Vec<Signal> = self.thresholds_met.iter().map(|t| t.signal).collect();
        signals.sort_by_key(|s| s.as_str());
        signals.dedup();
        signals
    }

    /// A threshold is past its grace period and no pod may be evicted for it: the kubelet's
    /// "unable to evict any pods from the node".
    pub fn no_evictable_pod(&self) -> bool {
        self.reclaim.is_some() && self.threshold_eviction().is_none()
    }

    /// The eviction for the threshold being reclaimed, if a pod may go for it.
    pub fn threshold_eviction(&self) -> Option<&Eviction> {
        self.evictions
            .iter()
            .find(|e| e.signal.threshold().is_some())
    }
}

/// Whether `threshold` is met by the observation, optionally raised by its minimum reclaim
/// (the kubelet's `thresholdsMet`): met while available is strictly below the threshold.
pub(crate) fn is_met(
    threshold: &Threshold,
    observations: &Observations,
    enforce_min_reclaim: bool,
) -> bool {
    let Some(observed) = observations.get(&threshold.signal) else {
        return false;
    };
    let mut quantity = threshold.value.resolve(observed.capacity).nanos();
    if enforce_min_reclaim {
        if let Some(min_reclaim) = &threshold.min_reclaim {
            quantity = quantity.saturating_add(min_reclaim.resolve(observed.capacity).nanos());
        }
    }
    quantity > i128::from(observed.available) * NANOS
}

/// Whether a hard `threshold` is met only ahead of itself: its signal's lead (rate of fall ×
/// time to relief) is beyond the threshold and the headroom left, `available`, is within it.
/// Waiting for the threshold would leave relief arriving after the headroom is gone. A
/// departure from the kubelet, which waits for the threshold; the trace says so.
pub fn met_early(threshold: &Threshold, observations: &Observations) -> bool {
    let Some(observed) = observations.get(&threshold.signal) else {
        return false;
    };
    threshold.is_hard()
        && observed.lead > 0
        && observed.available <= observed.lead
        && !is_met(threshold, observations, false)
}

/// Evaluates the policy once with every pod a candidate unless the kubelet deems it critical
/// (`simulate`, benches). Pure: `now` is any monotonic time since a fixed epoch.
pub fn evaluate(
    config: &EvictionConfig,
    node: &NodeCapacity,
    observations: &Observations,
    pods: &[PodInfo],
    now: Duration,
    state: &PolicyState,
) -> (Decision, PolicyState) {
    evaluate_among(
        config,
        node,
        observations,
        pods,
        &Eligibility::default(),
        now,
        state,
    )
}

/// Evaluates the policy once, choosing among the pods `eligibility` allows: pods passed over
/// (critical, the agent's own, excluded, not evictable now) are skipped in rank order and the
/// next-ranked pod is chosen in the same evaluation, as the kubelet moves past critical pods.
pub fn evaluate_among(
    config: &EvictionConfig,
    node: &NodeCapacity,
    observations: &Observations,
    pods: &[PodInfo],
    eligibility: &Eligibility,
    now: Duration,
    state: &PolicyState,
) -> (Decision, PolicyState) {
    let thresholds = config.thresholds();

    // Thresholds met now, then those acted on before and not yet recovered past min reclaim.
    let mut met: Vec<(usize, bool)> = (0..thresholds.len())
        .filter(|&i| {
            is_met(&thresholds[i], observations, false) || met_early(&thresholds[i], observations)
        })
        .map(|i| (i, false))
        .collect();
    for &i in &state.thresholds_acted_on {
        let Some(threshold) = thresholds.get(i) else {
            continue;
        };
        if !met.iter().any(|(m, _)| *m == i) && is_met(threshold, observations, true) {
            met.push((i, true));
        }
    }

    let thresholds_first_observed_at: BTreeMap<usize, Duration> = met
        .iter()
        .map(|&(i, _)| {
            let since = state.thresholds_first_observed_at.get(&i).copied();
            (i, since.unwrap_or(now))
        })
        .collect();

    // Node conditions: observed now for every met threshold, held for the transition period.
    let mut conditions_last_observed_at = state.conditions_last_observed_at.clone();
    for &(i, _) in &met {
        conditions_last_observed_at.insert(thresholds[i].signal.node_condition(), now);
    }
    let conditions: Vec<NodeCondition> = conditions_last_observed_at
        .iter()
        .filter(|(_, &at)| now.saturating_sub(at) < config.pressure_transition_period())
        .map(|(&condition, _)| condition)
        .collect();

    let thresholds_met: Vec<MetThreshold> = met
        .iter()
        .map(|&(i, held)| {
            let threshold = &thresholds[i];
            let since = thresholds_first_observed_at[&i];
            MetThreshold {
                index: i,
                signal: threshold.signal,
                hard: threshold.is_hard(),
                held_by_min_reclaim: held,
                grace_period_passed: now.saturating_sub(since) >= threshold.grace_period,
                early: !held && met_early(threshold, observations),
            }
        })
        .collect();

    // Thresholds past their grace period, memory first (`byEvictionPriority`), then in signal
    // order, a hard threshold before a soft one on the same signal.
    let mut acted_on: Vec<usize> = thresholds_met
        .iter()
        .filter(|t| t.grace_period_passed)
        .map(|t| t.index)
        .collect();
    acted_on.sort_by_key(|&i| {
        let t = &thresholds[i];
        (!t.signal.is_memory(), t.signal, t.grace_period, i)
    });

    let next_state = PolicyState {
        thresholds_first_observed_at,
        conditions_last_observed_at,
        thresholds_acted_on: acted_on.clone(),
    };
    let mut decision = Decision {
        thresholds_met,
        conditions,
        ..Decision::default()
    };

    // Local storage limits, whatever the thresholds: every pod over one goes.
    let over = over_local_storage_limits(pods, node.has_imagefs, eligibility);
    decision.over_limit_passed_over = over.kept;
    decision.evictions = over.evict;
    // The threshold's pod is ranked among the rest: those going for their limit are passed
    // over as being evicted, so the threshold never waits for them nor picks one of them.
    let going: Vec<String> = decision.evictions.iter().map(Eviction::pod_id).collect();
    let eligibility = &if going.is_empty() {
        eligibility.clone()
    } else {
        let mut e = eligibility.clone();
        e.not_evictable_now
            .extend(going.into_iter().map(|id| (id, NotEvictableNow::Evicting)));
        e
    };

    let Some(&reclaim_index) = acted_on.first() else {
        return (decision, next_state);
    };
    let threshold = &thresholds[reclaim_index];
    // The kubelet's sync that evicts for local storage makes no threshold eviction: the pods
    // going for their limits are what relieves the disk, so a disk threshold waits for the
    // next evaluation. Memory and PIDs do not wait (a pod over its emptyDir limit frees no
    // memory, and the OOM killer would not wait either).
    if !decision.evictions.is_empty()
        && matches!(
            threshold.signal.resource(),
            Resource::EphemeralStorage | Resource::Inodes
        )
    {
        return (decision, next_state);
    }
    let early = decision
        .thresholds_met
        .iter()
        .any(|t| t.index == reclaim_index && t.early);
    decision.reclaim = Some(threshold.signal);
    let resource = threshold.signal.resource();
    let observed = observations[&threshold.signal];
    let threshold_quantity = threshold.value.resolve(observed.capacity);
    let available = Quantity::from_int(observed.available, threshold.signal.observation_format());

    for i in rank(pods, threshold.signal, node.has_imagefs) {
        let pod = &pods[i];
        if let Some(reason) = eligibility.check(pod) {
            decision.passed_over.push(PassedOver {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                uid: pod.uid.clone(),
                reason,
            });
            continue;
        }
        let (message, offending_containers) =
            eviction_message(resource, pod, Some((threshold_quantity, available)));
        decision.evictions.push(Eviction {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            signal: threshold.signal.into(),
            resource,
            hard: threshold.is_hard(),
            grace_period_seconds: grace_period_seconds(config, threshold, pod),
            message,
            offending_containers,
            threshold_quantity,
            available,
            early,
        });
        break;
    }
    (decision, next_state)
}

/// What the local storage limits ask for: every pod, in pod order, over a limit that may be
/// evicted, and every pod over a limit that may not (pods terminating or being evicted left
/// out).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OverLimits {
    pub evict: Vec<Eviction>,
    pub kept: Vec<(PassedOver, StorageLimit)>,
}

/// The kubelet's `localStorageEviction`, applied to `pods` under `eligibility`. The eviction gets
/// the immediate grace period and the kubelet's message, with no per-container annotations.
/// `evaluate_among` acts on it first; the daemon also calls it between evaluations to see when
/// the answer changed.
pub fn over_local_storage_limits(
    pods: &[PodInfo],
    has_imagefs: bool,
    eligibility: &Eligibility,
) -> OverLimits {
    let mut over = OverLimits::default();
    for pod in pods {
        let Some(exceeded) = limit_exceeded(pod, has_imagefs) else {
            continue;
        };
        match eligibility.check(pod) {
            // A pod on its way out (evicted, or its eviction on its way) is not kept: nothing to
            // say about it, nor to evict again.
            Some(PassReason::NotEvictableNow(
                NotEvictableNow::Terminating | NotEvictableNow::Evicting,
            )) => {}
            Some(reason) => over.kept.push((
                PassedOver {
                    namespace: pod.namespace.clone(),
                    name: pod.name.clone(),
                    uid: pod.uid.clone(),
                    reason,
                },
                exceeded.limit,
            )),
            None => {
                over.evict.push(Eviction {
                    namespace: pod.namespace.clone(),
                    name: pod.name.clone(),
                    uid: pod.uid.clone(),
                    signal: EvictionSignal::Limit(exceeded.limit),
                    resource: Resource::EphemeralStorage,
                    hard: true,
                    grace_period_seconds: IMMEDIATE_EVICTION_GRACE_PERIOD_SECONDS,
                    message: exceeded.message,
                    offending_containers: Vec::new(),
                    threshold_quantity: exceeded.limit_quantity,
                    available: exceeded.used,
                    early: false,
                });
            }
        }
    }
    over
}

/// The grace period the pod gets, as the kubelet ends up applying it: 1s for a hard
/// threshold; for a soft one `min(evictionMaxPodGracePeriod, terminationGracePeriodSeconds)`,
/// where a resulting 0 means "no override" (the pod's own period applies) and the kubelet's
/// pod workers never go below 1s.
pub fn grace_period_seconds(config: &EvictionConfig, threshold: &Threshold, pod: &PodInfo) -> i64 {
    if threshold.is_hard() {
        return IMMEDIATE_EVICTION_GRACE_PERIOD_SECONDS;
    }
    let max = config.max_pod_grace_period_seconds();
    let mut grace = match pod.termination_grace_period_seconds {
        Some(own) => max.min(own),
        None => max,
    };
    if grace == 0 {
        grace = pod.termination_grace_period_seconds.unwrap_or(0);
    }
    grace.max(1)
}
