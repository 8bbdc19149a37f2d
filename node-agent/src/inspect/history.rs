//! What the agent lately saw and decided about each pod, for `kubectl node-agent explain`:
//! chosen for eviction, passed over and why, kept over a local storage limit, and the trace
//! records that name the pod (eviction outcomes, OOM kills, memory lines, fork storms).
//!
//! Pure and bounded: times are wall-clock nanoseconds passed in; at most [`MAX_PODS`] pods
//! (the least recently touched goes first), [`MAX_ENTRIES`] entries each, nothing older than
//! [`WINDOW`] is shown. The same fact at consecutive evaluations (a pod passed over at every
//! 100 ms poll under pressure) is one entry with its first and last time and a count, so a
//! long episode neither floods the window nor pushes older facts out.

use std::{
    collections::{HashMap, VecDeque},
    time::Duration,
};

use node_agent_policy::{PassReason, Signal, StorageLimit};

use crate::trace::Record;

/// How far back an explanation reaches.
pub const WINDOW: Duration = Duration::from_secs(15 * 60);
/// Pods remembered (a node runs 110 by default).
pub const MAX_PODS: usize = 128;
/// Entries per pod.
pub const MAX_ENTRIES: usize = 16;
/// Longest reason kept from outside (the API server's words on an eviction).
const MAX_TEXT: usize = 512;

/// How a pod is known: by name, or (a cgroup the pod source has not named) by UID alone.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PodId {
    Named { namespace: String, name: String },
    Uid(String),
}

/// One fact about a pod, typed.
#[derive(Debug, Clone, PartialEq)]
pub enum Seen {
    Chosen {
        signal: node_agent_policy::EvictionSignal,
        hard: bool,
        observed: i64,
        threshold: i64,
    },
    PassedOver {
        signal: Signal,
        reason: PassReason,
    },
    OverLimitKept {
        limit: StorageLimit,
        reason: PassReason,
    },
    Record(Box<Record>),
}

impl Seen {
    /// Whether `other` is the same fact again (its figures may have moved): then it only
    /// extends this one's entry.
    fn same_as(&self, other: &Seen) -> bool {
        match (self, other) {
            (
                Seen::Chosen {
                    signal: a,
                    hard: ha,
                    ..
                },
                Seen::Chosen {
                    signal: b,
                    hard: hb,
                    ..
                },
            ) => a == b && ha == hb,
            (
                Seen::PassedOver {
                    signal: a,
                    reason: ra,
                },
                Seen::PassedOver {
                    signal: b,
                    reason: rb,
                },
            ) => a == b && ra == rb,
            (
                Seen::OverLimitKept {
                    limit: a,
                    reason: ra,
                },
                Seen::OverLimitKept {
                    limit: b,
                    reason: rb,
                },
            ) => a == b && ra == rb,
            (Seen::Record(a), Seen::Record(b)) => same_record(a, b),
            _ => false,
        }
    }
}

/// Records that repeat one fact: the same eviction result for the same signal, kills of the
/// same command in the same cgroup, crossings of the same line the same way.
fn same_record(a: &Record, b: &Record) -> bool {
    match (a, b) {
        (
            Record::Eviction {
                signal: sa,
                result: ra,
                ..
            },
            Record::Eviction {
                signal: sb,
                result: rb,
                ..
            },
        ) => sa == sb && ra == rb,
        (Record::OomKill(a), Record::OomKill(b)) => a.cgroup.id == b.cgroup.id && a.comm == b.comm,
        (Record::MemoryThreshold(a), Record::MemoryThreshold(b)) => {
            a.cgroup.id == b.cgroup.id && a.direction == b.direction
        }
        (Record::ForkStorm(a), Record::ForkStorm(b)) => a.cgroup.id == b.cgroup.id,
        _ => false,
    }
}

/// One entry: the fact as last seen, from `first` to `last` (wall-clock ns), `count` times.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    pub first: i128,
    pub last: i128,
    pub count: u32,
    pub seen: Seen,
}

#[derive(Debug, Default)]
struct PodHistory {
    /// Ordered by `last`.
    entries: VecDeque<Stored>,
    touched: i128,
}

#[derive(Debug, Default)]
pub struct History {
    pods: HashMap<PodId, PodHistory>,
}

impl History {
    /// Remembers `seen` about `pod` at `now`.
    pub fn note(&mut self, pod: PodId, seen: Seen, now: i128) {
        let seen = capped(seen);
        if !self.pods.contains_key(&pod) && self.pods.len() >= MAX_PODS {
            self.make_room(now);
        }
        let history = self.pods.entry(pod).or_default();
        history.touched = now;
        let since = now - window_ns();
        history.entries.retain(|e| e.last >= since);
        match history.entries.iter().position(|e| e.seen.same_as(&seen)) {
            Some(i) => {
                let mut entry = history.entries.remove(i).expect("position is in range");
                entry.last = now;
                entry.count = entry.count.saturating_add(1);
                entry.seen = seen;
                history.entries.push_back(entry);
            }
            None => {
                if history.entries.len() == MAX_ENTRIES {
                    history.entries.pop_front();
                }
                history.entries.push_back(Stored {
                    first: now,
                    last: now,
                    count: 1,
                    seen,
                });
            }
        }
    }

    /// Drops the pods with nothing left in the window, then, if still full, the least
    /// recently touched.
    fn make_room(&mut self, now: i128) {
        let since = now - window_ns();
        self.pods
            .retain(|_, h| h.entries.iter().any(|e| e.last >= since));
        if self.pods.len() >= MAX_PODS {
            if let Some(oldest) = self
                .pods
                .iter()
                .min_by_key(|(_, h)| h.touched)
                .map(|(id, _)| id.clone())
            {
                self.pods.remove(&oldest);
            }
        }
    }

    /// What is remembered about the pod (by name, and by UID when given), within the window
    /// before `now`, in order of first sight.
    pub fn of(&self, namespace: &str, name: &str, uid: Option<&str>, now: i128) -> Vec<Stored> {
        let named = PodId::Named {
            namespace: namespace.to_string(),
            name: name.to_string(),
        };
        let by_uid = uid.map(|u| PodId::Uid(u.to_string()));
        let since = now - window_ns();
        let mut all: Vec<Stored> = [Some(named), by_uid]
            .into_iter()
            .flatten()
            .filter_map(|id| self.pods.get(&id))
            .flat_map(|h| h.entries.iter())
            .filter(|e| e.last >= since)
            .cloned()
            .collect();
        all.sort_by_key(|e| (e.first, e.last));
        all
    }

    /// The latest `max` choices of other pods for eviction within the window, newest first.
    pub fn chosen_others(
        &self,
        namespace: &str,
        name: &str,
        now: i128,
        max: usize,
    ) -> Vec<(PodId, Stored)> {
        let since = now - window_ns();
        let mut chosen: Vec<(PodId, Stored)> = self
            .pods
            .iter()
            .filter(|(id, _)| {
                !matches!(id, PodId::Named { namespace: ns, name: n } if ns == namespace && n == name)
            })
            .flat_map(|(id, h)| {
                h.entries
                    .iter()
                    .filter(|e| e.last >= since && matches!(e.seen, Seen::Chosen { .. }))
                    .map(move |e| (id.clone(), e.clone()))
            })
            .collect();
        chosen.sort_by_key(|(_, e)| std::cmp::Reverse(e.last));
        chosen.truncate(max);
        chosen
    }

    #[cfg(test)]
    fn pods(&self) -> usize {
        self.pods.len()
    }
}

fn window_ns() -> i128 {
    WINDOW.as_nanos() as i128
}

/// Text from outside (the API server's reason for an eviction) cut to [`MAX_TEXT`] bytes.
fn capped(seen: Seen) -> Seen {
    match seen {
        Seen::Record(mut record) => {
            if let Record::Eviction {
                reason: Some(reason),
                message,
                ..
            } = record.as_mut()
            {
                cut(reason);
                cut(message);
            }
            Seen::Record(record)
        }
        other => other,
    }
}

fn cut(text: &mut String) {
    if text.len() > MAX_TEXT {
        let mut end = MAX_TEXT;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
}

#[cfg(test)]
#[path = "history_tests.rs"]
mod tests;
