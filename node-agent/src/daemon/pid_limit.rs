//! What `pid.available` is measured against. The kubelet reads min(`pid_max`, `threads-max`)
//! in the host's PID namespace. Since Linux 6.14 `pid_max` belongs to each PID namespace: a
//! pod's own reads its own (4194304 on 6.18, where the host's may be 32768), while a fork in
//! the pod still takes a PID in every namespace above it, so the host's figure is the one that
//! runs out. The agent's pod has no `hostPID`, so it takes the kubelet's figure from its
//! summary (`node.rlimit.maxpid`) as soon as a summary gives one, and uses the smaller of that
//! and its own. Until then, or with no kubelet summary at all (`podSource: apiserver`,
//! standalone), it uses its own, and says at start when that may not be the host's.

/// The kubelet's task limit, as its summaries last gave it.
#[derive(Debug, Default)]
pub struct PidLimit {
    kubelet: Option<i64>,
    /// The bad figure last named in the log, so it is named once, not at every summary.
    said_bad: Option<String>,
}

impl PidLimit {
    /// The limit `pid.available` is measured against, given this namespace's own figure.
    pub fn limit(&self, own: i64) -> i64 {
        self.kubelet.map_or(own, |kubelet| kubelet.min(own))
    }

    /// Takes the latest summary's figure (`None`: the summary said nothing, and the last figure
    /// stands). Returns whether the kubelet's figure changed: the kernel's line is then set
    /// again. A bad figure is named once and leaves the last good one in place. `own` (this
    /// namespace's figure, for the log) is read only when the figure changed.
    pub fn take(
        &mut self,
        figure: Option<&Result<i64, String>>,
        own: impl FnOnce() -> Option<i64>,
    ) -> bool {
        match figure {
            None => false,
            Some(Err(why)) => {
                if self.said_bad.as_deref() != Some(why.as_str()) {
                    tracing::warn!(
                        "the kubelet's summary gives no usable task limit ({why}): pid.available \
                         is measured against {}",
                        self.kubelet.map_or_else(
                            || "this PID namespace's own min(pid_max, threads-max)".to_string(),
                            |k| format!("the kubelet's last figure, {k}")
                        )
                    );
                    self.said_bad = Some(why.clone());
                }
                false
            }
            Some(Ok(figure)) => {
                self.said_bad = None;
                if self.kubelet == Some(*figure) {
                    return false;
                }
                let was = self.kubelet.replace(*figure);
                let own = own();
                match own {
                    Some(own) if own > *figure => tracing::info!(
                        kubelet = figure,
                        own,
                        was,
                        "pid.available is measured against the kubelet's task limit \
                         (node.rlimit.maxpid, read in the host's PID namespace), below this \
                         PID namespace's own"
                    ),
                    _ => tracing::info!(
                        kubelet = figure,
                        own,
                        was,
                        "the kubelet's task limit (node.rlimit.maxpid) read: pid.available is \
                         measured against the smaller of it and this namespace's own"
                    ),
                }
                true
            }
        }
    }
}

/// At start: whether the agent runs in a PID namespace of its own, where `pid_max` need not be
/// the host's, and what it will measure `pid.available` against there.
pub fn say_namespace(kubelet_summary: bool) {
    if in_initial_pid_namespace() != Some(false) {
        return;
    }
    if kubelet_summary {
        tracing::info!(
            "this agent runs in a PID namespace of its own, whose pid_max need not be the host's: \
             pid.available is measured against the kubelet's node.rlimit.maxpid once its \
             summary gives it, and this namespace's own figure until then"
        );
    } else {
        tracing::warn!(
            "this agent runs in a PID namespace of its own and reads no kubelet summary \
             (podSource apiserver, or no cluster): pid.available is measured against this \
             namespace's pid_max, which on Linux 6.14 and later is not the host's. Run it with \
             hostPID, or with podSource kubelet or nodeProxy, where pid.available matters"
        );
    }
}

/// `Some(true)` in the initial PID namespace (its `/proc/self/ns/pid` inode is the kernel's
/// fixed `PROC_PID_INIT_INO`), `None` when that cannot be told.
fn in_initial_pid_namespace() -> Option<bool> {
    use std::os::unix::fs::MetadataExt as _;
    const PROC_PID_INIT_INO: u64 = 0xEFFF_FFFC;
    let ns = std::fs::metadata("/proc/self/ns/pid").ok()?;
    Some(ns.ino() == PROC_PID_INIT_INO)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubelets_figure_caps_the_namespaces_own_and_a_bad_one_changes_nothing() {
        let own = 4_194_304;
        let mut limit = PidLimit::default();
        assert_eq!(limit.limit(own), own, "no summary yet: the namespace's own");
        /// (behaviour, the summary's figure, changed?, the limit then)
        type Row = (&'static str, Option<Result<i64, String>>, bool, i64);
        let rows: [Row; 6] = [
            (
                "the host's, below the pod's",
                Some(Ok(32_768)),
                true,
                32_768,
            ),
            ("the same again", Some(Ok(32_768)), false, 32_768),
            ("a summary without it", None, false, 32_768),
            (
                "a bad figure",
                Some(Err("maxpid is -1".into())),
                false,
                32_768,
            ),
            ("raised on the host", Some(Ok(65_536)), true, 65_536),
            ("above the namespace's own", Some(Ok(8_000_000)), true, own),
        ];
        for (behaviour, figure, changed, then) in rows {
            assert_eq!(
                limit.take(figure.as_ref(), || Some(own)),
                changed,
                "{behaviour}"
            );
            assert_eq!(limit.limit(own), then, "{behaviour}");
        }
    }
}
