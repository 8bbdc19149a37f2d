//! OOM kills in pods, as events on the pod, counted the way the events API counts repeats:
//! the first kill of a container for a cause posts an event; the kills that follow within
//! [`SERIES_WINDOW`] are counted into that event's `series`, written at most every
//! [`FLUSH_EVERY`], so an OOM storm of any size is one event and a few updates, never one
//! request per kill. At most [`MAX_SERIES`] series are remembered (the oldest go first).
//!
//! A write that fails (the API server down, refusing, or the event gone) marks the series not
//! posted: when more kills come, the next flush posts the event again with its count so far in
//! `series` (as client-go creates an event whose series update found nothing), so retries go
//! at most every [`FLUSH_EVERY`] per series and only while kills keep coming.

use std::{collections::BTreeMap, time::Duration, time::SystemTime};

use node_agent_kube::events::{event_name, PodOomKill};

use crate::action::{Action, PodOomEvent};

/// Repeats within this long of the last one join its series (client-go's isomorphic window).
pub const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);
/// A series' count is written at most this often.
pub const FLUSH_EVERY: Duration = Duration::from_secs(2);
/// Series remembered at once.
pub const MAX_SERIES: usize = 256;

/// Kills of one container for one cause are one series.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    namespace: String,
    uid: String,
    container: Option<String>,
    cause: &'static str,
}

#[derive(Debug, Clone)]
struct Series {
    namespace: String,
    event_name: String,
    count: u32,
    /// The count last written (1: the event itself).
    written: u32,
    last: Duration,
    last_wall: SystemTime,
    flushed: Duration,
    /// The event exists as far as the agent knows (false after a failed write).
    posted: bool,
    /// The latest kill, for the event posted again.
    kill: PodOomKill,
}

#[derive(Debug, Default)]
pub struct OomSeries {
    series: BTreeMap<Key, Series>,
}

impl OomSeries {
    /// A kill: the new event to post, or nothing (counted into its series, written at the next
    /// [`Self::flush`]).
    pub fn kill(&mut self, kill: PodOomKill, now: Duration, wall: SystemTime) -> Option<Action> {
        let key = Key {
            namespace: kill.namespace.clone(),
            uid: kill.uid.clone(),
            container: kill.container.clone(),
            cause: kill.cause.label(),
        };
        if let Some(s) = self.series.get_mut(&key) {
            if now.saturating_sub(s.last) < SERIES_WINDOW {
                s.count = s.count.saturating_add(1);
                s.last = now;
                s.last_wall = wall;
                s.kill = kill;
                return None;
            }
        }
        if self.series.len() >= MAX_SERIES && !self.series.contains_key(&key) {
            if let Some(oldest) = self
                .series
                .iter()
                .min_by_key(|(_, s)| s.last)
                .map(|(k, _)| k.clone())
            {
                self.series.remove(&oldest);
            }
        }
        self.series.insert(
            key,
            Series {
                namespace: kill.namespace.clone(),
                event_name: event_name(&kill.name, wall),
                count: 1,
                written: 1,
                last: now,
                last_wall: wall,
                flushed: now,
                posted: true,
                kill: kill.clone(),
            },
        );
        Some(Action::PodOomEvent(Box::new(PodOomEvent::New {
            kill,
            at: wall,
            repeats: None,
        })))
    }

    /// A write of the event `name` in `namespace` failed: it is posted again when more kills
    /// come.
    pub fn failed(&mut self, namespace: &str, name: &str) {
        if let Some(s) = self
            .series
            .values_mut()
            .find(|s| s.namespace == namespace && s.event_name == name)
        {
            s.posted = false;
        }
    }

    /// The series whose count grew since it was last written, if that was [`FLUSH_EVERY`] ago;
    /// series past their window are forgotten.
    pub fn flush(&mut self, now: Duration) -> Vec<Action> {
        self.series
            .retain(|_, s| now.saturating_sub(s.last) < SERIES_WINDOW || s.count > s.written);
        let mut actions = Vec::new();
        for s in self.series.values_mut() {
            if s.count > s.written && now.saturating_sub(s.flushed) >= FLUSH_EVERY {
                s.written = s.count;
                s.flushed = now;
                let event = if s.posted {
                    PodOomEvent::Series {
                        namespace: s.namespace.clone(),
                        name: s.event_name.clone(),
                        count: s.count,
                        last_observed: s.last_wall,
                    }
                } else {
                    // A new event (a new name), its kills so far in its series.
                    s.posted = true;
                    s.event_name = event_name(&s.kill.name, s.last_wall);
                    PodOomEvent::New {
                        kill: s.kill.clone(),
                        at: s.last_wall,
                        repeats: Some((s.count, s.last_wall)),
                    }
                };
                actions.push(Action::PodOomEvent(Box::new(event)));
            }
        }
        actions
    }
}

#[cfg(test)]
mod tests {
    use node_agent_kube::events::OomCause;

    use super::*;

    fn kill(container: &str, cause: OomCause) -> PodOomKill {
        PodOomKill {
            namespace: "shop".into(),
            name: "cart".into(),
            uid: "uid-cart".into(),
            container: Some(container.into()),
            pid: 7,
            comm: "java".into(),
            cause,
            saw_before: String::new(),
            named_late: false,
        }
    }

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    fn series(actions: &[Action]) -> Vec<u32> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::PodOomEvent(e) => match &**e {
                    PodOomEvent::Series { count, .. } => Some(*count),
                    PodOomEvent::New { .. } => None,
                },
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_storm_is_one_event_and_its_series_written_at_most_every_flush() {
        let mut o = OomSeries::default();
        let wall = SystemTime::UNIX_EPOCH + s(1_800_000_000);
        let first = o.kill(kill("app", OomCause::Node), s(0), wall);
        assert!(
            matches!(&first, Some(Action::PodOomEvent(e)) if matches!(&**e, PodOomEvent::New { .. })),
            "{first:?}"
        );
        for i in 1..100 {
            assert!(o
                .kill(
                    kill("app", OomCause::Node),
                    s(0) + Duration::from_millis(i),
                    wall
                )
                .is_none());
        }
        assert_eq!(
            series(&o.flush(s(1))),
            Vec::<u32>::new(),
            "not before FLUSH_EVERY"
        );
        assert_eq!(series(&o.flush(s(2))), [100]);
        assert_eq!(series(&o.flush(s(10))), Vec::<u32>::new(), "nothing new");
        o.kill(kill("app", OomCause::Node), s(11), wall);
        assert_eq!(series(&o.flush(s(13))), [101]);
        // Another container, or another cause: another event.
        assert!(o
            .kill(kill("sidecar", OomCause::Node), s(14), wall)
            .is_some());
        assert!(o
            .kill(kill("app", OomCause::Unknown), s(14), wall)
            .is_some());
        // Past the window: a new event.
        assert!(o
            .kill(kill("app", OomCause::Node), s(11) + SERIES_WINDOW, wall)
            .is_some());
    }

    #[test]
    fn a_failed_write_posts_the_event_again_with_its_count_when_more_kills_come() {
        let mut o = OomSeries::default();
        let t0 = SystemTime::UNIX_EPOCH + s(1_800_000_000);
        let Some(Action::PodOomEvent(first)) = o.kill(kill("app", OomCause::Node), s(0), t0) else {
            panic!("a new event")
        };
        let (ns, name) = first.event();
        o.failed(&ns, &name);
        assert!(o.flush(s(5)).is_empty(), "no new kill: no retry");
        o.kill(kill("app", OomCause::Node), s(6), t0 + s(6));
        o.kill(kill("app", OomCause::Node), s(7), t0 + s(7));
        let again = o.flush(s(8));
        let [Action::PodOomEvent(e)] = &again[..] else {
            panic!("{again:?}")
        };
        let PodOomEvent::New { at, repeats, .. } = &**e else {
            panic!("{e:?}")
        };
        assert_eq!((*at, *repeats), (t0 + s(7), Some((3, t0 + s(7)))));
        let (_, renamed) = e.event();
        assert_ne!(
            renamed, name,
            "a new name: the failed one may exist after all"
        );
        // Written: the next kills go into the new event's series.
        o.kill(kill("app", OomCause::Node), s(9), t0 + s(9));
        let next = o.flush(s(10));
        assert!(
            matches!(&next[..], [Action::PodOomEvent(e)] if matches!(&**e, PodOomEvent::Series { count: 4, name, .. } if *name == renamed)),
            "{next:?}"
        );
        // A failed series update: the same.
        o.failed(&ns, &renamed);
        o.kill(kill("app", OomCause::Node), s(12), t0 + s(12));
        assert!(
            matches!(&o.flush(s(12))[..], [Action::PodOomEvent(e)] if matches!(&**e, PodOomEvent::New { repeats: Some((5, _)), .. }))
        );
        // Retries at most every FLUSH_EVERY, while kills keep coming.
        o.failed(&ns, &event_name("cart", t0 + s(12)));
        o.kill(kill("app", OomCause::Node), s(13), t0 + s(13));
        assert!(o.flush(s(13)).is_empty());
    }

    #[test]
    fn it_never_remembers_more_than_its_cap() {
        let mut o = OomSeries::default();
        let wall = SystemTime::UNIX_EPOCH;
        for i in 0..(MAX_SERIES as u64 * 3) {
            o.kill(kill(&format!("c{i}"), OomCause::Node), s(i), wall);
        }
        assert_eq!(o.series.len(), MAX_SERIES);
    }
}
