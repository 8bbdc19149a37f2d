//! What the agent saw and did in the moments before an OOM kill: memory lines crossed, memory
//! thresholds met, and what followed (the eviction chosen and its outcome, no pod left to
//! evict, a grace period still running). Kept for [`WINDOW`], at most [`CAP`] entries of each
//! kind, so an OOM storm cannot grow it. Times are the kernel's `CLOCK_MONOTONIC`, as the
//! kernel programs stamp their events.
//!
//! An SRE tuning thresholds reads it as "pressure seen 1.8 s before, eviction of shop/cart
//! blocked by its PodDisruptionBudget": it goes into the pod's event and the trace.

use std::{collections::VecDeque, time::Duration};

use node_agent_kube::evict::EvictionResult;
use node_agent_policy::Signal;

use crate::saw_before::{Pressure, SawBefore};

/// How far back an OOM kill looks.
pub const WINDOW: Duration = Duration::from_secs(60);
/// The most entries of each kind kept.
pub const CAP: usize = 256;
/// The most pods passed over named in one sentence.
const NAMED: usize = 3;

/// Pressure the agent saw.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    /// A kernel memory line on this cgroup (path below the hierarchy's root) was crossed.
    Line { path: String },
    /// A memory threshold of the policy was found met.
    Threshold { signal: Signal },
}

/// What the agent did about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acted {
    /// An eviction was handed over (namespace/name).
    Evicting { pod: String, signal: String },
    /// How an eviction ended.
    Outcome { pod: String, result: EvictionResult },
    /// A threshold past its grace period with no pod that may be evicted, and the pods
    /// passed over, each as "namespace/name (why)".
    NothingEvictable {
        signal: Signal,
        passed_over: Vec<String>,
    },
    /// A threshold met, its grace period still running.
    InGrace { signal: Signal },
}

#[derive(Debug, Default)]
pub struct Recent {
    seen: VecDeque<(u64, Seen)>,
    acted: VecDeque<(u64, Acted)>,
}

fn push<T>(q: &mut VecDeque<(u64, T)>, at: u64, item: T) {
    if q.len() == CAP {
        q.pop_front();
    }
    q.push_back((at, item));
}

impl Recent {
    /// A memory line crossed upwards on the cgroup at `path`.
    pub fn line_crossed(&mut self, at: u64, path: String) {
        push(&mut self.seen, at, Seen::Line { path });
    }

    /// A memory threshold newly met.
    pub fn threshold_met(&mut self, at: u64, signal: Signal) {
        push(&mut self.seen, at, Seen::Threshold { signal });
    }

    pub fn acted(&mut self, at: u64, acted: Acted) {
        if self.acted.back().is_some_and(|(_, last)| *last == acted) {
            return;
        }
        push(&mut self.acted, at, acted);
    }

    /// What came before a kill at `at` of a process in the cgroup at `victim` (a path below
    /// the hierarchy's root): lines on that cgroup or one above it, memory thresholds, and the
    /// last memory decision, within [`WINDOW`].
    pub fn before(&self, at: u64, victim: Option<&str>, in_flight: Vec<String>) -> SawBefore {
        let since = at.saturating_sub(WINDOW.as_nanos() as u64);
        let within = |t: u64| t >= since && t <= at;
        let is_ancestor = |path: &str| {
            let path = path.trim_end_matches('/');
            victim.is_some_and(|v| {
                path.is_empty()
                    || v == path
                    || v.strip_prefix(path)
                        .is_some_and(|rest| rest.starts_with('/'))
            })
        };
        let pressure = self
            .seen
            .iter()
            .filter(|(t, _)| within(*t))
            .find_map(|(t, seen)| {
                let what = match seen {
                    Seen::Line { path } if is_ancestor(path) => format!("memory line on {path}"),
                    Seen::Line { .. } => return None,
                    Seen::Threshold { signal } => format!("{signal} threshold met"),
                };
                Some(Pressure {
                    what,
                    before_ms: (at - t) / 1_000_000,
                })
            });
        let decision = self
            .acted
            .iter()
            .rev()
            .find(|(t, _)| within(*t))
            .map(|(_, acted)| match acted {
                Acted::Evicting { pod, signal } => {
                    format!("eviction of {pod} for {signal} under way")
                }
                Acted::Outcome { pod, result } => match result {
                    EvictionResult::Evicted | EvictionResult::PdbOverridden => {
                        format!("{pod} evicted")
                    }
                    EvictionResult::DryRun => format!("would have evicted {pod} (dry run)"),
                    EvictionResult::BlockedByPdb => {
                        format!("eviction of {pod} blocked by its PodDisruptionBudget")
                    }
                    other => format!("eviction of {pod}: {}", other.as_str()),
                },
                Acted::NothingEvictable {
                    signal,
                    passed_over,
                } => {
                    let mut said =
                        format!("{signal} past its grace period, but no pod may be evicted");
                    if !passed_over.is_empty() {
                        said.push_str(": ");
                        said.push_str(&passed_over[..passed_over.len().min(NAMED)].join(", "));
                        if passed_over.len() > NAMED {
                            said.push_str(&format!(" and {} more", passed_over.len() - NAMED));
                        }
                    }
                    said
                }
                Acted::InGrace { signal } => format!("{signal} met, grace period still running"),
            });
        SawBefore {
            pressure,
            decision,
            in_flight,
        }
    }

    /// Drops what is older than the window before `now`.
    pub fn expire(&mut self, now: u64) {
        let since = now.saturating_sub(WINDOW.as_nanos() as u64);
        self.seen.retain(|(t, _)| *t >= since);
        self.acted.retain(|(t, _)| *t >= since);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_kill_is_told_what_came_before_it_within_the_window() {
        let victim = Some("/kubepods/burstable/podabc/ctr");
        type Fill = Box<dyn Fn(&mut Recent)>;
        let rows: Vec<(&str, Fill, &str)> = vec![
            (
                "nothing seen",
                Box::new(|_| {}),
                "node-agent saw no memory pressure in the minute before",
            ),
            (
                "a line on kubepods, an ancestor",
                Box::new(|r| r.line_crossed(100 * S, "/kubepods".into())),
                "node-agent saw memory pressure (memory line on /kubepods) 1.8s before",
            ),
            (
                "a line on another pod is not this kill's",
                Box::new(|r| r.line_crossed(100 * S, "/kubepods/burstable/podxyz".into())),
                "node-agent saw no memory pressure in the minute before",
            ),
            (
                "a line on a sibling whose name starts alike is not an ancestor",
                Box::new(|r| r.line_crossed(100 * S, "/kubepods/burstable/poda".into())),
                "node-agent saw no memory pressure in the minute before",
            ),
            (
                "a threshold, then a blocked eviction",
                Box::new(|r| {
                    r.threshold_met(99 * S, Signal::MemoryAvailable);
                    r.acted(100 * S, Acted::Evicting { pod: "shop/cart".into(), signal: "memory.available".into() });
                    r.acted(101 * S, Acted::Outcome { pod: "shop/cart".into(), result: EvictionResult::BlockedByPdb });
                }),
                "node-agent saw memory pressure (memory.available threshold met) 2.8s before; eviction of shop/cart blocked by its PodDisruptionBudget",
            ),
            (
                "older than the window: forgotten",
                Box::new(|r| {
                    r.threshold_met(30 * S, Signal::MemoryAvailable);
                    r.acted(30 * S, Acted::NothingEvictable { signal: Signal::MemoryAvailable, passed_over: vec![] });
                }),
                "node-agent saw no memory pressure in the minute before",
            ),
            (
                "nothing evictable: the pods passed over, the first few named",
                Box::new(|r| {
                    r.threshold_met(100 * S, Signal::MemoryAvailable);
                    let passed = (1..=5).map(|i| format!("shop/p{i} (blocked_by_pdb)")).collect();
                    r.acted(100 * S, Acted::NothingEvictable { signal: Signal::MemoryAvailable, passed_over: passed });
                }),
                "node-agent saw memory pressure (memory.available threshold met) 1.8s before; memory.available past its grace period, but no pod may be evicted: shop/p1 (blocked_by_pdb), shop/p2 (blocked_by_pdb), shop/p3 (blocked_by_pdb) and 2 more",
            ),
            (
                "still in grace",
                Box::new(|r| {
                    r.threshold_met(95 * S, Signal::MemoryAvailable);
                    r.acted(95 * S, Acted::InGrace { signal: Signal::MemoryAvailable });
                }),
                "node-agent saw memory pressure (memory.available threshold met) 6.8s before; memory.available met, grace period still running",
            ),
        ];
        let kill = 101 * S + 800_000_000;
        for (what, fill, want) in rows {
            let mut r = Recent::default();
            fill(&mut r);
            assert_eq!(r.before(kill, victim, vec![]).to_string(), want, "{what}");
        }
        let r = Recent::default();
        assert!(r
            .before(kill, victim, vec!["shop/web".into()])
            .to_string()
            .ends_with("; eviction in flight: shop/web"));
    }

    #[test]
    fn an_oom_storm_never_grows_it_past_its_cap() {
        let mut r = Recent::default();
        for i in 0..10 * CAP as u64 {
            r.line_crossed(i, format!("/cg{i}"));
            r.acted(
                i,
                Acted::InGrace {
                    signal: Signal::MemoryAvailable,
                },
            );
            r.acted(
                i,
                Acted::NothingEvictable {
                    signal: Signal::MemoryAvailable,
                    passed_over: vec![],
                },
            );
        }
        assert_eq!((r.seen.len(), r.acted.len()), (CAP, CAP));
        r.expire(10 * CAP as u64 + WINDOW.as_nanos() as u64);
        assert_eq!((r.seen.len(), r.acted.len()), (0, 0));
    }
}
