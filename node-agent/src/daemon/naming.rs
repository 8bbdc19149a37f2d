//! Ranking the pods that exist, not only those the last snapshot listed: a pod admitted since
//! the last refresh has a cgroup (the runtime makes it before the pod's containers start) but
//! is no candidate until the pod source lists it. When a threshold's eviction is due and a pod
//! cgroup under the node's pods is not listed, the pod source is asked at once (`Cluster::
//! name_pods_now`: one `GET /pods`, tens of milliseconds); and while such an unlisted pod holds
//! more memory than the pod chosen, the eviction waits for its name, at most [`NAME_WAIT`]:
//! it is the likelier one to rank first, and killing the other would relieve nothing it
//! would not take back. Pure: the loop reads the cgroups and the clock.

use std::time::Duration;

/// The longest a threshold's eviction waits for the pod source to name a larger unlisted pod.
pub const NAME_WAIT: Duration = Duration::from_millis(250);

/// What the eviction does about the unlisted pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing unlisted holds more than the pod chosen: it goes.
    Act,
    /// `uid` (unlisted) holds more than the pod chosen: wait for its name, until `until`.
    Wait { uid: String, until: Duration },
    /// Waited [`NAME_WAIT`] and it is still unlisted: the pod chosen goes.
    GaveUp { uid: String },
}

/// Since when an eviction has waited for names.
#[derive(Debug, Default)]
pub struct Naming {
    since: Option<Duration>,
}

impl Naming {
    /// `unlisted`: each unlisted pod cgroup's pod UID and working set; `chosen`: the working set
    /// of the pod the policy chose.
    pub fn check(&mut self, now: Duration, unlisted: &[(String, u64)], chosen: u64) -> Verdict {
        let larger = unlisted
            .iter()
            .filter(|(_, ws)| *ws > chosen)
            .max_by_key(|(_, ws)| *ws);
        let Some((uid, _)) = larger else {
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
    fn an_eviction_waits_a_little_for_a_larger_unlisted_pod_to_be_named() {
        let mut n = Naming::default();
        let big = vec![("new".to_string(), 900u64)];
        let small = vec![("new".to_string(), 10u64)];
        // (behaviour, at ms, unlisted, chosen's working set, verdict)
        let rows = [
            ("nothing unlisted: act", 0, vec![], 500, Verdict::Act),
            (
                "a smaller unlisted pod: act",
                10,
                small.clone(),
                500,
                Verdict::Act,
            ),
            (
                "a larger one: wait for its name",
                20,
                big.clone(),
                500,
                Verdict::Wait {
                    uid: "new".into(),
                    until: ms(270),
                },
            ),
            (
                "still unlisted: wait on, the same deadline",
                200,
                big.clone(),
                500,
                Verdict::Wait {
                    uid: "new".into(),
                    until: ms(270),
                },
            ),
            (
                "past the wait: the chosen pod goes",
                270,
                big.clone(),
                500,
                Verdict::GaveUp { uid: "new".into() },
            ),
            (
                "a new wait starts afresh",
                300,
                big,
                500,
                Verdict::Wait {
                    uid: "new".into(),
                    until: ms(550),
                },
            ),
            ("named meanwhile: act", 310, vec![], 500, Verdict::Act),
        ];
        for (what, at, unlisted, chosen, want) in rows {
            assert_eq!(n.check(ms(at), &unlisted, chosen), want, "{what}");
        }
        assert!(!n.waiting());
    }
}
