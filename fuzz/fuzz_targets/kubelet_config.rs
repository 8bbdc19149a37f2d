//! The kubelet's eviction config, as a KubeletConfiguration document and as the kubelet's
//! flags: refused with an error or accepted, never a panic; an accepted config is evaluated
//! against a node under pressure on every signal.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use node_agent_policy::{
    evaluate, EvictionConfig, EvictionFlags, NodeCapacity, Observation, Observations, PolicyState,
    Signal,
};

fn exercise(config: &EvictionConfig) {
    let node = NodeCapacity {
        memory_bytes: Some(8 << 30),
        ephemeral_storage_bytes: Some(100 << 30),
        inodes: Some(1 << 20),
        pids: Some(32768),
        has_imagefs: true,
        ..NodeCapacity::default()
    };
    let mut observations = Observations::new();
    for (signal, available, capacity) in [
        (Signal::MemoryAvailable, 1 << 20, 8 << 30),
        (Signal::AllocatableMemoryAvailable, 1 << 20, 8 << 30),
        (Signal::NodeFsAvailable, 1 << 20, 100 << 30),
        (Signal::NodeFsInodesFree, 10, 1 << 20),
        (Signal::ImageFsAvailable, 1 << 20, 100 << 30),
        (Signal::ImageFsInodesFree, 10, 1 << 20),
        (Signal::PidAvailable, 10, 32768),
    ] {
        observations.insert(
            signal,
            Observation {
                available,
                capacity,
                lead: 0,
            },
        );
    }
    let (_, state) = evaluate(
        config,
        &node,
        &observations,
        &[],
        Duration::ZERO,
        &PolicyState::default(),
    );
    let _ = evaluate(
        config,
        &node,
        &observations,
        &[],
        Duration::from_secs(3600),
        &state,
    );
}

fuzz_target!(|text: &str| {
    if let Ok(config) = EvictionConfig::from_kubelet_yaml(text) {
        exercise(&config);
    }
    // The same text as the kubelet's seven eviction flags, one per line.
    let mut lines = text.lines().map(Some).chain(std::iter::repeat(None));
    let mut next = || lines.next().flatten();
    let flags = EvictionFlags {
        eviction_hard: next(),
        eviction_soft: next(),
        eviction_soft_grace_period: next(),
        eviction_minimum_reclaim: next(),
        eviction_max_pod_grace_period: next(),
        eviction_pressure_transition_period: next(),
        enforce_node_allocatable: next(),
    };
    if let Ok(config) = EvictionConfig::from_flags(&flags) {
        exercise(&config);
    }
});
