//! Beside the kubelet, at the edge: reads the kubelet's own config file and says, at start and
//! on every reload, which of its eviction thresholds would be acted on before the agent's (the
//! comparison is the policy's pure `beside::kubelet_acts_first`; `node-agent check-config`
//! prints the same findings). Nothing here stops the agent: a missing file is one info line,
//! an unparsable one a warning naming the file and the error.

use std::path::Path;

use node_agent_policy::{
    beside::{kubelet_acts_first, Finding},
    EvictionConfig, Signal,
};

use super::{
    config::{read, AgentConfig},
    observe::{read_node, NodeSources},
};

/// What became of the kubelet's config file.
#[derive(Debug)]
pub enum KubeletConfig {
    /// Not configured (`kubeletConfig: null`).
    NotSet,
    Missing,
    Unreadable(String),
    Read(Box<EvictionConfig>),
}

/// Reads and parses the kubelet's eviction settings (a KubeletConfiguration document; the
/// kubelet's defaults apply where it sets none, as in the kubelet). The file is read as the
/// agent's own is: a regular file, at most [`read::MAX_CONFIG_BYTES`].
pub fn read(path: Option<&Path>) -> KubeletConfig {
    let Some(path) = path else {
        return KubeletConfig::NotSet;
    };
    let chain = |e: &dyn std::error::Error| {
        std::iter::successors(Some(e), |e| e.source())
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(": ")
    };
    match read::read_capped(path, read::MAX_CONFIG_BYTES) {
        Err(e) if e.is_not_found() => KubeletConfig::Missing,
        Err(e) => KubeletConfig::Unreadable(chain(&e)),
        Ok(text) => match EvictionConfig::from_kubelet_yaml(&text) {
            Ok(c) => KubeletConfig::Read(Box::new(c)),
            Err(e) => KubeletConfig::Unreadable(chain(&e)),
        },
    }
}

/// The kubelet thresholds the agent's config would not act before; `capacity` gives a signal's
/// capacity, for a percentage against a quantity (`None`: not compared, said in the finding).
pub fn findings(
    config: &AgentConfig,
    kubelet: &EvictionConfig,
    capacity: &dyn Fn(Signal) -> Option<i64>,
) -> Vec<Finding> {
    kubelet_acts_first(kubelet, &config.eviction, capacity)
}

/// Logs, for the config in force, each kubelet threshold the agent would not act before (one
/// warning each).
pub fn warn_if_kubelet_acts_first(config: &AgentConfig, node: &NodeSources) {
    let path = config.settings.kubelet_config.as_deref();
    let file = path.map(|p| p.display().to_string()).unwrap_or_default();
    let kubelet = match read(path) {
        KubeletConfig::NotSet => return,
        KubeletConfig::Missing => {
            tracing::info!(file, "no kubelet config file: the kubelet's thresholds are not compared with the agent's");
            return;
        }
        KubeletConfig::Unreadable(error) => {
            tracing::warn!(file, %error, "the kubelet's config file cannot be read: its thresholds are not compared with the agent's");
            return;
        }
        KubeletConfig::Read(c) => c,
    };
    let reading = read_node(node);
    let capacity = |s| reading.observations.get(&s).map(|o| o.capacity);
    let findings = findings(config, &kubelet, &capacity);
    for f in &findings {
        tracing::warn!(file, signal = %f.kubelet.signal, "beside the kubelet: {f}");
    }
    if findings.is_empty() {
        tracing::info!(
            file,
            "beside the kubelet: every kubelet eviction threshold is met after one of the agent's"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_read_or_its_absence_and_errors_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("config.yaml");
        std::fs::write(&good, "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nevictionHard: {memory.available: 500Mi}\nimageGCHighThresholdPercent: 85\n").unwrap();
        let bad = dir.path().join("bad.yaml");
        std::fs::write(
            &bad,
            "kind: KubeletConfiguration\nevictionHard: {memory.available: lots}\n",
        )
        .unwrap();
        assert!(matches!(read(None), KubeletConfig::NotSet));
        assert!(matches!(
            read(Some(&dir.path().join("absent"))),
            KubeletConfig::Missing
        ));
        let KubeletConfig::Unreadable(why) = read(Some(&bad)) else {
            panic!("bad parsed")
        };
        assert!(why.contains("evictionHard"), "{why}");
        let KubeletConfig::Unreadable(why) = read(Some(dir.path())) else {
            panic!("a directory read")
        };
        assert!(why.contains("not a regular file but a directory"), "{why}");
        let KubeletConfig::Read(c) = read(Some(&good)) else {
            panic!("good not read")
        };
        // Its memory threshold (and the allocatable one the kubelet derives from it); the
        // other kubelet fields are ignored, the kubelet's defaults not added.
        let signals: Vec<&str> = c.thresholds().iter().map(|t| t.signal.as_str()).collect();
        assert_eq!(signals, ["memory.available", "allocatableMemory.available"]);
    }
}
