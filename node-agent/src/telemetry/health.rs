//! Liveness (the main loop still beats) and readiness (programs attached, first evaluation
//! done, every signal source readable, and in Kubernetes mode the pod source and the cluster
//! connection delivering), kept in atomics (and small locks for the degraded sources) so the
//! loop and the Kubernetes feed record them without I/O.

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

#[derive(Debug)]
pub struct Health {
    /// Origin of `last_beat_nanos`; creation counts as the first beat, so start-up (loading
    /// programs, the first evaluation) has `stall_after` before `/healthz` fails.
    started: Instant,
    stall_after: Duration,
    last_beat_nanos: AtomicU64,
    ready: AtomicBool,
    /// Signal sources that could not be read, with why: `/readyz` names them.
    degraded: Mutex<Vec<(String, String)>>,
    /// Kubernetes sources (`pods`, `cluster`) that do not deliver now, with why.
    kube: Mutex<BTreeMap<&'static str, String>>,
}

/// What `/healthz` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Liveness {
    Alive {
        since_beat: Duration,
    },
    Stalled {
        since_beat: Duration,
        limit: Duration,
    },
}

impl Health {
    pub fn new(stall_after: Duration) -> Arc<Health> {
        Arc::new(Health {
            started: Instant::now(),
            stall_after,
            last_beat_nanos: AtomicU64::new(0),
            ready: AtomicBool::new(false),
            degraded: Mutex::new(Vec::new()),
            kube: Mutex::new(BTreeMap::new()),
        })
    }

    /// The main loop calls this every iteration or tick; `/healthz` fails (503) when it has
    /// not been called within `stall_after`.
    pub fn beat(&self) {
        self.beat_at(Instant::now());
    }

    /// `/readyz` is 503 until this is set: programs attached, first evaluation done.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    pub(crate) fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// The signal sources that cannot be read now, `(source, error)`; empty when all can.
    /// `/readyz` fails and names them while any is degraded.
    pub fn set_degraded(&self, sources: Vec<(String, String)>) {
        *self.degraded.lock().unwrap_or_else(|p| p.into_inner()) = sources;
    }

    /// A Kubernetes source (`pods`, `cluster`) delivers (`None`) or not, and why: `/readyz`
    /// names each one that does not.
    pub fn set_kube_source(&self, source: &'static str, not_ready: Option<String>) {
        let mut kube = self.kube.lock().unwrap_or_else(|p| p.into_inner());
        match not_ready {
            Some(why) => kube.insert(source, why),
            None => kube.remove(source),
        };
    }

    /// What `/readyz` says: ready, or why not (programs not attached, no evaluation yet, the
    /// pod source or the cluster connection not delivering, or signal sources degraded, each
    /// named).
    pub(crate) fn readiness(&self) -> Result<(), String> {
        if !self.is_ready() {
            return Err("not ready: programs not attached or no evaluation yet\n".into());
        }
        let kube = self.kube.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let degraded = self.degraded();
        if degraded.is_empty() && kube.is_empty() {
            return Ok(());
        }
        let mut text = String::new();
        if !kube.is_empty() {
            text += "not ready: the agent cannot decide on what it cannot read (no pod is evicted on data it could not verify):\n";
            for (source, why) in &kube {
                text += &format!("{source}: {why}\n");
            }
        }
        if !degraded.is_empty() {
            text += "not ready: signal sources degraded (their signals are unknown; the others are decided on):\n";
            for (source, error) in &degraded {
                text += &format!("{source}: {error}\n");
            }
        }
        Err(text)
    }

    pub(crate) fn degraded(&self) -> Vec<(String, String)> {
        self.degraded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn beat_at(&self, now: Instant) {
        // `fetch_max`: two threads beating at once never move the last beat backwards.
        self.last_beat_nanos
            .fetch_max(self.nanos_since_start(now), Ordering::Relaxed);
    }

    pub(crate) fn liveness(&self, now: Instant) -> Liveness {
        let last_beat = Duration::from_nanos(self.last_beat_nanos.load(Ordering::Relaxed));
        let since_beat =
            Duration::from_nanos(self.nanos_since_start(now)).saturating_sub(last_beat);
        if since_beat > self.stall_after {
            Liveness::Stalled {
                since_beat,
                limit: self.stall_after,
            }
        } else {
            Liveness::Alive { since_beat }
        }
    }

    fn nanos_since_start(&self, now: Instant) -> u64 {
        // u64 nanoseconds last 584 years; saturate rather than wrap past that.
        u64::try_from(now.saturating_duration_since(self.started).as_nanos()).unwrap_or(u64::MAX)
    }
}

/// `text` without what it would tell a caller about the node beyond what is wrong: every URL
/// (`scheme://…`), network address (an IP, with or without its port) and filesystem path of
/// more than one component (`/var/lib/kubelet/pki/kubelet.crt`; a request's `/pods` stays)
/// replaced by `<url>`, `<address>`, `<path>`. For `/readyz` to a caller the gate did not let in.
pub(crate) fn redact(text: &str) -> String {
    text.split('\n')
        .map(|line| {
            line.split(' ')
                .map(|word| {
                    // The word itself, without what punctuation wraps it in a sentence.
                    let start = word
                        .find(|c: char| !"\"'({<".contains(c))
                        .unwrap_or(word.len());
                    let end = word
                        .rfind(|c: char| !"\"')}>,;:.".contains(c))
                        .map_or(start, |i| i + 1)
                        .max(start);
                    let core = &word[start..end];
                    let replaced = if core.contains("://") {
                        "<url>"
                    } else if core.starts_with('/') && core[1..].contains('/') {
                        "<path>"
                    } else if is_address(core) {
                        "<address>"
                    } else {
                        return word.to_string();
                    };
                    format!("{}{replaced}{}", &word[..start], &word[end..])
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// An IP address, `ip:port` or `[ipv6]:port`.
fn is_address(word: &str) -> bool {
    use std::net::{IpAddr, SocketAddr};
    word.parse::<IpAddr>().is_ok() || word.parse::<SocketAddr>().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_leaves_what_is_wrong_and_takes_out_where() {
        let rows = [
            (
                "pods: cannot be read: kubelet: GET /pods: connect https://10.0.0.5:10250/pods: TLS handshake failed: UnknownIssuer (caFile /var/lib/kubelet/pki/kubelet.crt)",
                "pods: cannot be read: kubelet: GET /pods: connect <url>: TLS handshake failed: UnknownIssuer (caFile <path>)",
            ),
            (
                "nodefs: statfs /var/lib/kubelet has not answered for 2.1s (a hung filesystem?)",
                "nodefs: statfs <path> has not answered for 2.1s (a hung filesystem?)",
            ),
            ("cluster: connect to 10.96.0.1:443 refused", "cluster: connect to <address> refused"),
            ("cluster: GET /api/v1/nodes/n1: 403 Forbidden (RBAC does not grant the agent this; see deploy/rbac.yaml)",
             "cluster: GET <path>: 403 Forbidden (RBAC does not grant the agent this; see deploy/rbac.yaml)"),
            ("[fd00::1]:10250 and \"/etc/x/y\"", "<address> and \"<path>\""),
            ("not ready: programs not attached", "not ready: programs not attached"),
        ];
        for (text, want) in rows {
            assert_eq!(redact(text), want, "{text}");
        }
    }

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    #[test]
    fn liveness_follows_the_last_beat() {
        struct Row {
            name: &'static str,
            stall_after_ms: u64,
            beats_ms: &'static [u64],
            check_ms: u64,
            alive: bool,
            since_beat_ms: u64,
        }
        #[rustfmt::skip]
        let rows = [
            Row { name: "creation counts as a beat", stall_after_ms: 1000, beats_ms: &[], check_ms: 500, alive: true, since_beat_ms: 500 },
            Row { name: "no beat since creation past the bound", stall_after_ms: 1000, beats_ms: &[], check_ms: 1500, alive: false, since_beat_ms: 1500 },
            Row { name: "a recent beat keeps it alive", stall_after_ms: 1000, beats_ms: &[800], check_ms: 1500, alive: true, since_beat_ms: 700 },
            Row { name: "exactly at the bound is still alive", stall_after_ms: 1000, beats_ms: &[200], check_ms: 1200, alive: true, since_beat_ms: 1000 },
            Row { name: "just past the bound is stalled", stall_after_ms: 1000, beats_ms: &[200], check_ms: 1201, alive: false, since_beat_ms: 1001 },
            Row { name: "a late-arriving older beat does not move the last beat back", stall_after_ms: 1000, beats_ms: &[900, 100], check_ms: 1500, alive: true, since_beat_ms: 600 },
            Row { name: "a clock reading before the last beat counts as zero", stall_after_ms: 1000, beats_ms: &[900], check_ms: 800, alive: true, since_beat_ms: 0 },
        ];
        for row in rows {
            let health = Health::new(ms(row.stall_after_ms));
            for &beat in row.beats_ms {
                health.beat_at(health.started + ms(beat));
            }
            let since_beat = ms(row.since_beat_ms);
            let expected = if row.alive {
                Liveness::Alive { since_beat }
            } else {
                Liveness::Stalled {
                    since_beat,
                    limit: ms(row.stall_after_ms),
                }
            };
            assert_eq!(
                health.liveness(health.started + ms(row.check_ms)),
                expected,
                "{}",
                row.name
            );
        }
    }

    #[test]
    fn degraded_sources_are_kept_until_cleared() {
        let health = Health::new(ms(1000));
        assert!(health.degraded().is_empty());
        health.set_degraded(vec![(
            "imagefs".into(),
            "statvfs: no such directory".into(),
        )]);
        assert_eq!(
            health.degraded(),
            [(
                "imagefs".to_string(),
                "statvfs: no such directory".to_string()
            )]
        );
        health.set_ready(true);
        health.set_degraded(vec![(
            "imagefs".into(),
            "statvfs /images: no such directory".into(),
        )]);
        let why = health.readiness().unwrap_err();
        assert!(why.contains("imagefs: statvfs /images"), "{why}");
        health.set_degraded(Vec::new());
        assert!(health.degraded().is_empty());
        assert_eq!(health.readiness(), Ok(()));
    }

    #[test]
    fn kubernetes_sources_are_named_until_they_deliver() {
        let health = Health::new(ms(1000));
        health.set_ready(true);
        health.set_kube_source(
            "pods",
            Some("cannot be read: kubelet: TLS handshake failed".into()),
        );
        health.set_kube_source("cluster", Some("cannot be read: 403 Forbidden".into()));
        health.set_degraded(vec![("imagefs".into(), "statvfs: gone".into())]);
        let why = health.readiness().unwrap_err();
        for words in [
            "cluster: cannot be read: 403",
            "pods: cannot be read: kubelet: TLS",
            "imagefs: statvfs: gone",
        ] {
            assert!(why.contains(words), "{words}: {why}");
        }
        health.set_degraded(Vec::new());
        health.set_kube_source("cluster", None);
        let why = health.readiness().unwrap_err();
        assert!(!why.contains("cluster") && why.contains("pods:"), "{why}");
        health.set_kube_source("pods", None);
        assert_eq!(health.readiness(), Ok(()));
    }

    #[test]
    fn readiness_starts_false_and_follows_set_ready() {
        let health = Health::new(ms(1000));
        assert!(!health.is_ready(), "not ready before set_ready");
        health.set_ready(true);
        assert!(health.is_ready(), "ready after set_ready(true)");
        health.set_ready(false);
        assert!(!health.is_ready(), "not ready after set_ready(false)");
    }
}
