//! Ranking the pods that exist, not only those the last snapshot listed: a pod admitted since
//! the last refresh has a cgroup (the runtime makes it before the pod's containers start) but
//! is no candidate until the pod source lists it. An unlisted pod cgroup is named at once
//! (`Cluster::name_pods_now`: one `GET /pods`, tens of milliseconds), found at every
//! housekeeping and before every threshold's eviction; and while one holds more than
//! [`NAME_FLOOR`] (its sandbox and a starting process hold less), the eviction waits for its
//! name, at most [`NAME_WAIT`]. Its size says nothing of its rank: a pod over its request
//! ranks before a bigger one within it, and its request and priority are known only once it
//! is named (measured on the real cluster: a ramp started 0.3 s before the crossing was
//! passed over for a 2.5 GiB ballast of higher priority). Pure: the loop reads the cgroups
//! and the clock.

use std::time::Duration;

/// The longest a threshold's eviction waits for the pod source to name an unlisted pod.
pub const NAME_WAIT: Duration = Duration::from_millis(250);
/// An unlisted pod cgroup holding less than this (its sandbox, a process starting) is not
/// waited for.
pub const NAME_FLOOR: u64 = 16 << 20;

/// What the eviction does about the unlisted pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing unlisted holds more than [`NAME_FLOOR`]: the pod chosen goes.
    Act,
    /// `uid` (unlisted) holds more: wait for its name, until `until`.
    Wait { uid: String, until: Duration },
    /// Waited [`NAME_WAIT`] and it is still unlisted: the pod chosen goes.
    GaveUp { uid: String },
}

/// Since when an eviction has waited for names, and which unlisted pods were asked about.
#[derive(Debug, Default)]
pub struct Naming {
    since: Option<Duration>,
    asked: std::collections::BTreeSet<String>,
}

impl Naming {
    /// Whether `unlisted` holds a pod not asked about yet (each is asked about once, so a
    /// cgroup the pod source never lists, a pod of another kubelet, costs one request).
    pub fn any_new(&mut self, unlisted: std::collections::BTreeSet<String>) -> bool {
        let new = unlisted.iter().any(|u| !self.asked.contains(u));
        self.asked = unlisted;
        new
    }

    /// `unlisted`: each unlisted pod cgroup's pod UID and working set.
    pub fn check(&mut self, now: Duration, unlisted: &[(String, u64)]) -> Verdict {
        let waited_for = unlisted
            .iter()
            .filter(|(_, ws)| *ws > NAME_FLOOR)
            .max_by_key(|(_, ws)| *ws);
        let Some((uid, _)) = waited_for else {
            self.since = None;
            return Verdict::Act;
        };
        let since = *self.since.get_or_insert(now);
        let until = since + NAME_WAIT;
        if now < until {
            return Verdict::Wait {
                uid: uid.clone(),
                until,
            };
        }
        self.since = None;
        Verdict::GaveUp { uid: uid.clone() }
    }

    /// Whether an eviction is waiting for names now.
    pub fn waiting(&self) -> bool {
        self.since.is_some()
    }

    /// No eviction is due: nothing waits.
    pub fn clear(&mut self) {
        self.since = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn an_eviction_waits_a_little_for_an_unlisted_pod_to_be_named() {
        let mut n = Naming::default();
        let mib = 1u64 << 20;
        let grown = vec![("new".to_string(), 40 * mib)];
        let starting = vec![("new".to_string(), 2 * mib)];
        // (behaviour, at ms, unlisted, verdict)
        let rows = [
            ("nothing unlisted: act", 0, vec![], Verdict::Act),
            (
                "one just starting (its sandbox): act",
                10,
                starting.clone(),
                Verdict::Act,
            ),
            (
                "one that holds memory, whatever its size against the pod chosen: wait",
                20,
                grown.clone(),
                Verdict::Wait {
                    uid: "new".into(),
                    until: ms(270),
                },
            ),
            (
                "still unlisted: wait on, the same deadline",
                200,
                grown.clone(),
                Verdict::Wait {
                    uid: "new".into(),
                    until: ms(270),
                },
            ),
            (
                "past the wait: the chosen pod goes",
                270,
                grown.clone(),
                Verdict::GaveUp { uid: "new".into() },
            ),
            (
                "a new wait starts afresh",
                300,
                grown,
                Verdict::Wait {
                    uid: "new".into(),
                    until: ms(550),
                },
            ),
            ("named meanwhile: act", 310, vec![], Verdict::Act),
        ];
        for (what, at, unlisted, want) in rows {
            assert_eq!(n.check(ms(at), &unlisted), want, "{what}");
        }
        assert!(!n.waiting());
    }

    #[test]
    fn each_unlisted_pod_is_asked_about_once() {
        let mut n = Naming::default();
        let set = |uids: &[&str]| uids.iter().map(|u| u.to_string()).collect();
        assert!(n.any_new(set(&["a"])));
        assert!(!n.any_new(set(&["a"])), "asked already");
        assert!(n.any_new(set(&["a", "b"])), "b is new");
        assert!(!n.any_new(set(&[])));
        assert!(n.any_new(set(&["a"])), "a came again after it was named");
    }
}
