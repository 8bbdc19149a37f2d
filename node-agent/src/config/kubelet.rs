//! Beside the kubelet, at the edge: reads the kubelet's own config file and says, at start and
//! on every reload, which of its eviction thresholds would be acted on before the agent's (the
//! comparison is the policy's pure `beside::kubelet_acts_first`; `node-agent check-config`
//! prints the same findings through [`read`]). Nothing here stops the agent: a missing file is
//! one info line, an unparsable one a warning naming the file and the error.
//! The file is read off the loop ([`check_off_loop`]): it lives on the kubelet's filesystem,
//! which may hang.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, Ordering},
};

use node_agent_policy::{beside::kubelet_acts_first, EvictionConfig, Signal};

/// A check reading the kubelet's file is under way (one at a time: a hung filesystem ties up
/// one thread, not one per reload).
static CHECKING: AtomicBool = AtomicBool::new(false);

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
/// agent's own is: a regular file, at most [`MAX_CONFIG_BYTES`](crate::fs_helper::read::MAX_CONFIG_BYTES).
pub fn read(path: Option<&Path>) -> KubeletConfig {
    let Some(path) = path else {
        return KubeletConfig::NotSet;
    };
    // On the kubelet's filesystem, which may hang: read by a helper process.
    use crate::fs_helper::{ask, Answer, Request};
    let text = match ask(&Request::Read(path.to_path_buf())) {
        Err(e) => return KubeletConfig::Unreadable(crate::error_chain(&e)),
        Ok(Answer::Read(Ok(None))) => return KubeletConfig::Missing,
        Ok(Answer::Read(Err(e))) => return KubeletConfig::Unreadable(e),
        Ok(Answer::Read(Ok(Some(text)))) => text,
        Ok(other) => {
            return KubeletConfig::Unreadable(format!("the filesystem helper answered {other:?}"))
        }
    };
    if let Err(e) = crate::yaml::check_nesting(&text) {
        return KubeletConfig::Unreadable(format!("not read: {e}"));
    }
    match EvictionConfig::from_kubelet_yaml(&text) {
        Ok(c) => KubeletConfig::Read(Box::new(c)),
        Err(e) => KubeletConfig::Unreadable(crate::error_chain(&e)),
    }
}

/// The kubelet's `cgroupRoot` from its config file, read once at start (where the kubelet puts
/// its pods cgroup: `/` for kubeadm, `/kubelet` for kind); `None` when the file is not
/// configured, missing, unreadable or sets none (the kubelet's default, `/`). Read by the
/// filesystem helper: the file may be on a hung filesystem.
pub fn cgroup_root(path: Option<&Path>) -> Option<String> {
    use crate::fs_helper::{ask, Answer, Request};
    let text = match ask(&Request::Read(path?.to_path_buf())) {
        Ok(Answer::Read(Ok(Some(text)))) => text,
        _ => return None,
    };
    crate::yaml::check_nesting(&text).ok()?;
    let value: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).ok()?;
    value
        .get("cgroupRoot")
        .and_then(|v| v.as_str())
        .filter(|r| r.starts_with('/'))
        .map(str::to_string)
}

/// [`warn_if_kubelet_acts_first`] on a thread of its own, unless one is still running.
pub fn check_off_loop(
    eviction: EvictionConfig,
    path: Option<PathBuf>,
    capacities: BTreeMap<Signal, i64>,
) {
    if path.is_none() || CHECKING.swap(true, Ordering::AcqRel) {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("kubelet-check".into())
        .spawn(move || {
            warn_if_kubelet_acts_first(&eviction, path.as_deref(), &|s| {
                capacities.get(&s).copied()
            });
            CHECKING.store(false, Ordering::Release);
        });
    if let Err(e) = spawned {
        CHECKING.store(false, Ordering::Release);
        tracing::warn!(error = %e, "the kubelet's thresholds are not compared: no thread");
    }
}

/// Logs, for the agent's thresholds, each kubelet threshold the agent would not act before
/// (one warning each). `capacity` resolves percentages: the node's capacity per signal.
pub fn warn_if_kubelet_acts_first(
    eviction: &EvictionConfig,
    path: Option<&Path>,
    capacity: &dyn Fn(Signal) -> Option<i64>,
) {
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
    let findings = kubelet_acts_first(&kubelet, eviction, capacity);
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
        assert!(why.contains("not a regular file (a directory)"), "{why}");
        let KubeletConfig::Read(c) = read(Some(&good)) else {
            panic!("good not read")
        };
        // Its memory threshold (and the allocatable one the kubelet derives from it); the
        // other kubelet fields are ignored, the kubelet's defaults not added.
        let signals: Vec<&str> = c.thresholds().iter().map(|t| t.signal.as_str()).collect();
        assert_eq!(signals, ["memory.available", "allocatableMemory.available"]);
    }
}
