//! The policy side of the bench: a node of N pods to decide about, and how long `evaluate()`
//! takes for 110 pods (the kubelet's default `maxPods`) and for 1000.

use std::time::{Duration, Instant};

use node_agent_policy::{
    evaluate, ContainerInfo, ContainerUsage, EvictionConfig, EvictionFlags, NodeCapacity,
    Observation, Observations, PodInfo, PodUsage, PolicyState, Resources, Signal,
};

use anyhow::Context as _;

use super::{quantile, report::Row, stats::median_ci};

const MIB: i64 = 1 << 20;
/// The hard threshold the bench's node is configured with.
const HARD: &str = "memory.available<100Mi";
const HARD_BYTES: i64 = 100 * MIB;

/// `n` burstable pods, each one container with a memory request and usage, in a spread of
/// priorities, so ranking has real work to do.
pub fn pods(n: usize) -> Vec<PodInfo> {
    (0..n)
        .map(|i| {
            let request = node_agent_policy::Quantity::from_int(
                (64 + (i as i64 * 37) % 512) * MIB,
                node_agent_policy::Format::BinarySi,
            );
            let usage = (32 + (i as u64 * 53) % 768) << 20;
            PodInfo {
                namespace: format!("ns-{}", i % 20),
                name: format!("pod-{i}"),
                uid: Some(format!("00000000-0000-0000-0000-{i:012}")),
                priority: (i % 3) as i32 * 1000,
                termination_grace_period_seconds: Some(30),
                containers: vec![ContainerInfo {
                    name: "app".into(),
                    requests: Resources {
                        memory: Some(request),
                        ephemeral_storage: None,
                    },
                    limits: Resources::default(),
                    usage: Some(ContainerUsage {
                        memory_working_set_bytes: Some(usage),
                        rootfs_bytes: None,
                        logs_bytes: None,
                    }),
                }],
                usage: Some(PodUsage {
                    memory_working_set_bytes: usage,
                    processes: 3,
                    ..PodUsage::default()
                }),
                ..PodInfo::default()
            }
        })
        .collect()
}

/// Decides whether to evict when a cgroup's usage passes a line: the node's memory capacity is
/// set so that usage at or above the line leaves less than the hard threshold available.
#[derive(Clone)]
pub struct Decider {
    config: EvictionConfig,
    pods: Vec<PodInfo>,
}

impl Decider {
    pub fn new(n: usize) -> anyhow::Result<Self> {
        let config = EvictionConfig::from_flags(&EvictionFlags {
            eviction_hard: Some(HARD),
            ..EvictionFlags::default()
        })?;
        Ok(Self {
            config,
            pods: pods(n),
        })
    }

    /// One evaluation as the daemon would run it on a threshold event; true if a pod is chosen.
    pub fn decide(&self, usage: u64, line: u64) -> bool {
        let capacity = i64::try_from(line).unwrap_or(i64::MAX) + HARD_BYTES - 1;
        let available = capacity - i64::try_from(usage).unwrap_or(i64::MAX);
        let node = NodeCapacity {
            memory_bytes: Some(capacity),
            ..NodeCapacity::default()
        };
        let mut observations = Observations::new();
        observations.insert(
            Signal::MemoryAvailable,
            Observation {
                available,
                capacity,
                lead: 0,
            },
        );
        let (decision, _) = evaluate(
            &self.config,
            &node,
            &observations,
            &self.pods,
            Duration::from_secs(1),
            &PolicyState::default(),
        );
        !decision.evictions.is_empty()
    }
}

/// `evaluate()` with memory under pressure (so ranking and the eviction message run), for
/// 110 and 1000 pods: median and p99 of `runs` calls each.
pub fn run(rows: &mut Vec<Row>, runs: usize) -> anyhow::Result<()> {
    for n in [110usize, 1000] {
        let decider = Decider::new(n)?;
        let line = 8u64 << 30;
        anyhow::ensure!(
            decider.decide(line, line),
            "evaluate() chose no pod with memory.available under the hard threshold"
        );
        let mut samples = Vec::with_capacity(runs);
        for _ in 0..runs {
            let t = Instant::now();
            std::hint::black_box(decider.decide(std::hint::black_box(line), line));
            samples.push(t.elapsed().as_nanos() as f64);
        }
        let p50 = median_ci(&samples)
            .context("no evaluate() call was timed")?
            .scaled(1e-3);
        let p99 = quantile(&samples, 0.99).unwrap_or(f64::NAN);
        let mut row = Row::info(
            "policy",
            format!("evaluate(), {n} pods, memory threshold met (p50 / p99)"),
            format!("{:.1} / {:.1} µs", p50.estimate, p99 / 1e3),
        )
        .estimate(p50, "µs")
        .note(format!(
            "{runs} calls; ranking and the eviction message included; p50 {} µs ({})",
            p50.show(1, false),
            p50.describe("order statistics")
        ));
        if n == 1000 {
            row = row.below("p50 < 1 ms (upper end)", 1000.0);
        }
        rows.push(row);
    }
    Ok(())
}
