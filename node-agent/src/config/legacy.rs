//! Keys of the config format before `node-agent.io/v1alpha1` (snake_case, `*_seconds` and
//! `*_millis` integers, the `agent:` section, two `dry_run` flags), each with its new spelling,
//! so a file in the old format is refused naming what to write instead rather than with a
//! bare "unknown field". The old format is frozen: this table is all of it.

use serde_yaml_ng::Value;

/// One key of the old format found in a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OldKey {
    /// Where it is, as it was written (`kubernetes.request_timeout_seconds`).
    pub old: &'static str,
    /// What to write instead (`kubernetes.requestTimeout`), and how its value changes.
    pub new: &'static str,
}

impl std::fmt::Display for OldKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} is now {}", self.old, self.new)
    }
}

/// (old path, new spelling), in the order the old README listed them.
const RENAMED: &[(&str, &str)] = &[
    (
        "agent",
        "top-level fields (the agent's own settings have no section now)",
    ),
    (
        "agent.dry_run",
        "dryRun (top level, the one dry-run switch)",
    ),
    ("agent.listen", "listen (top level)"),
    ("agent.trace_socket", "traceSocket (top level)"),
    ("agent.node_cgroup", "nodeCgroup (top level)"),
    ("agent.memory_capacity", "memoryCapacity (top level)"),
    ("agent.allocatable_memory", "allocatableMemory (top level)"),
    ("agent.nodefs_path", "nodefsPath (top level)"),
    ("agent.imagefs_path", "imagefsPath (top level)"),
    ("agent.kubelet_config", "kubeletConfig (top level)"),
    ("agent.resync_interval", "resyncInterval (top level)"),
    (
        "agent.pressure_poll_interval",
        "pressurePollInterval (top level)",
    ),
    (
        "agent.pod_refresh_interval",
        "kubernetes.podRefreshInterval",
    ),
    ("agent.fork_limit", "forkLimit (top level)"),
    ("agent.fork_window", "forkWindow (top level)"),
    (
        "agent.ring_bytes",
        "ringBufferSize (top level, a quantity such as 1Mi)",
    ),
    (
        "kubernetes.dry_run",
        "dryRun (top level, the one dry-run switch)",
    ),
    ("kubernetes.pod_source", "kubernetes.podSource"),
    ("kubernetes.node_name", "kubernetes.nodeName"),
    ("kubernetes.kubelet.ca_file", "kubernetes.kubelet.caFile"),
    (
        "kubernetes.kubelet.insecure_skip_tls_verify",
        "kubernetes.kubelet.insecureSkipTLSVerify",
    ),
    ("kubernetes.api_server", "kubernetes.apiServer"),
    (
        "kubernetes.api_server.ca_file",
        "kubernetes.apiServer.caFile",
    ),
    ("kubernetes.token_path", "kubernetes.tokenPath"),
    (
        "kubernetes.request_timeout_seconds",
        "kubernetes.requestTimeout (a Go duration such as 10s)",
    ),
    (
        "kubernetes.retry.initial_backoff_millis",
        "kubernetes.retry.initialBackoff (a Go duration such as 200ms)",
    ),
    (
        "kubernetes.retry.max_backoff_millis",
        "kubernetes.retry.maxBackoff (a Go duration such as 5s)",
    ),
    ("kubernetes.pdb_policy", "kubernetes.pdbPolicy"),
    (
        "kubernetes.evictions_per_minute",
        "kubernetes.evictionsPerMinute",
    ),
    ("kubernetes.eviction_burst", "kubernetes.evictionBurst"),
    (
        "kubernetes.eviction_wait_timeout_seconds",
        "kubernetes.evictionWaitTimeout (a Go duration such as 30s)",
    ),
    (
        "kubernetes.pass_over_seconds",
        "kubernetes.passOver (a Go duration such as 30s)",
    ),
    (
        "kubernetes.staleness_bound_seconds",
        "kubernetes.stalenessBound (a Go duration such as 30s)",
    ),
    (
        "kubernetes.exclusions.label_selector",
        "kubernetes.exclusions.labelSelector",
    ),
    (
        "kubernetes.exclusions.label_selector.match_labels",
        "kubernetes.exclusions.labelSelector.matchLabels",
    ),
    (
        "kubernetes.exclusions.label_selector.match_expressions",
        "kubernetes.exclusions.labelSelector.matchExpressions",
    ),
    ("kubernetes.node_oom_events", "kubernetes.nodeOOMEvents"),
    ("cri.image_minimum_gc_age", "cri.imageMinimumGCAge"),
    ("cri.keep_images", "cri.keepImages"),
];

/// Every key of the old format in `document`, in the table's order.
pub fn old_keys(document: &Value) -> Vec<OldKey> {
    RENAMED
        .iter()
        .filter(|(old, _)| {
            old.split('.')
                .try_fold(document, |value, key| value.as_mapping()?.get(key))
                .is_some()
        })
        .map(|&(old, new)| OldKey { old, new })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_old_key_is_found_where_it_was_written() {
        let old = |yaml: &str| -> Vec<&str> {
            old_keys(&serde_yaml_ng::from_str(yaml).unwrap())
                .into_iter()
                .map(|k| k.old)
                .collect()
        };
        assert_eq!(
            old("agent: {dry_run: true}\nkubernetes: {dry_run: true, request_timeout_seconds: 10}"),
            [
                "agent",
                "agent.dry_run",
                "kubernetes.dry_run",
                "kubernetes.request_timeout_seconds"
            ]
        );
        assert_eq!(
            old("kubernetes: {api_server: {ca_file: /ca}, exclusions: {label_selector: {match_labels: {}}}}"),
            [
                "kubernetes.api_server",
                "kubernetes.api_server.ca_file",
                "kubernetes.exclusions.label_selector",
                "kubernetes.exclusions.label_selector.match_labels"
            ]
        );
        // The new spellings, and the old names where they are not keys, are not old keys.
        assert!(old("dryRun: true\nkubernetes: {podSource: kubelet, exclusions: {labelSelector: {matchLabels: {pod_source: x}}}}\ncri: {keepImages: []}").is_empty());
        assert!(old("kubernetes:\ncri: [keep_images]").is_empty());
    }

    #[test]
    fn every_row_names_a_new_spelling_in_camel_case() {
        for (old, new) in RENAMED {
            let spelling = new.split(' ').next().unwrap();
            assert!(!spelling.contains('_'), "{old} → {new}");
            assert_ne!(*old, spelling, "{old} is renamed");
        }
    }
}
