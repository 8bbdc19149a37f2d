//! What `pid.available` is measured against. The kubelet reads min(`pid_max`, `threads-max`)
//! in the host's PID namespace. Since Linux 6.14 `pid_max` belongs to each PID namespace: a
//! pod's own reads its own (4194304 on 6.18, where the host's may be 32768), while a fork in
//! the pod still takes a PID in every namespace above it, so the host's figure is the one that
//! runs out. The agent's pod has no `hostPID`, so it takes the host's figure from its kernel
//! programs, which read the initial PID namespace's `pid_max` at every fork and exit, and the
//! kubelet's from its summary (`node.rlimit.maxpid`), and uses the smallest of those and its
//! own. Before the first of them (the first second after start), it uses its own.

/// The host's and the kubelet's task limits, as the kernel programs and the summaries last
/// gave them.
#[derive(Debug, Default)]
pub struct PidLimit {
    kubelet: Option<i64>,
    /// The initial PID namespace's `pid_max`, on kernels where it is not this namespace's.
    host: Option<i64>,
    /// The bad figure last named in the log, so it is named once, not at every summary.
    said_bad: Option<String>,
}

impl PidLimit {
    /// The limit `pid.available` is measured against, given this namespace's own figure.
    pub fn limit(&self, own: i64) -> i64 {
        [self.kubelet, self.host]
            .into_iter()
            .flatten()
            .fold(own, i64::min)
    }

    /// Takes the initial PID namespace's `pid_max` as the kernel programs last saw it (`None`:
    /// not known, and the last figure stands). Returns whether it changed: the kernel's line
    /// is then set again. `own` (this namespace's figure) is read only then, for the log, which
    /// says it where the host's is the lower (the agent in a PID namespace of its own).
    pub fn take_host(&mut self, pid_max: Option<u32>, own: impl FnOnce() -> Option<i64>) -> bool {
        let Some(pid_max) = pid_max.map(i64::from) else {
            return false;
        };
        if self.host == Some(pid_max) {
            return false;
        }
        let was = self.host.replace(pid_max);
        let own = own();
        if own.is_some_and(|own| pid_max < own) {
            tracing::info!(
                host_pid_max = pid_max,
                own,
                was,
                "the host's pid_max read by the kernel programs (the initial PID namespace's), \
                 below this namespace's own min(pid_max, threads-max): pid.available is measured \
                 against it, or the kubelet's node.rlimit.maxpid where that is lower"
            );
        } else {
            tracing::debug!(host_pid_max = pid_max, own, was, "the host's pid_max read");
        }
        true
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
pub fn say_namespace() {
    if in_initial_pid_namespace() != Some(false) {
        return;
    }
    tracing::info!(
        "this agent runs in a PID namespace of its own, whose pid_max need not be the host's \
         (Linux 6.14 and later): pid.available is measured against the host's, which the kernel \
         programs read, from the first fork or exit on the node"
    );
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

    #[test]
    fn the_hosts_pid_max_from_the_kernel_caps_the_namespaces_own_beside_the_kubelets() {
        let own = 4_194_304;
        let mut limit = PidLimit::default();
        /// (behaviour, the kernel's figure, the summary's, changed?, the limit then)
        type Row = (&'static str, Option<u32>, Option<i64>, bool, i64);
        let rows: [Row; 6] = [
            ("nothing from the kernel yet", None, None, false, own),
            (
                "the host's, below the pod's",
                Some(32_768),
                None,
                true,
                32_768,
            ),
            ("the same again", Some(32_768), None, false, 32_768),
            ("nothing new: the last stands", None, None, false, 32_768),
            (
                "the kubelet's, lower still",
                Some(32_768),
                Some(30_000),
                false,
                30_000,
            ),
            (
                "raised on the host, the kubelet's stands",
                Some(65_536),
                None,
                true,
                30_000,
            ),
        ];
        for (behaviour, kernel, kubelet, changed, then) in rows {
            assert_eq!(
                limit.take_host(kernel, || Some(own)),
                changed,
                "{behaviour}"
            );
            if let Some(k) = kubelet {
                limit.take(Some(&Ok(k)), || Some(own));
            }
            assert_eq!(limit.limit(own), then, "{behaviour}");
        }
    }
}
