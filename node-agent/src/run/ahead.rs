//! Acting ahead of a fast fall: how fast each memory signal falls, and how long relief takes
//! once asked for, so that a hard threshold is met early where waiting for it would leave
//! relief arriving after the headroom is gone (`Observation::lead`, the policy's
//! `met_early`).
//!
//! The rate comes from the loop's own readings: each kernel line crossed (the lines approach
//! the next threshold in halving steps, see `triggers`) and each poll is a sample; the rate is
//! the fall over the last [`WINDOW`], once it has lasted [`MIN_SPAN`]. The time to relief is
//! measured on each urgent eviction:
//! from its decision to the victim's growth stopped (killed on the node) or its memory freed
//! (through the API), the largest of the last [`RELIEF_SAMPLES`], starting from a default per
//! way. The lead is `rate × time to relief × SAFETY`, at most [`LEAD_CAP`] times the fall seen.

use std::{
    collections::{BTreeMap, VecDeque},
    time::Duration,
};

use node_agent_policy::{Observations, Signal};

/// The readings a rate is taken over.
pub const WINDOW: Duration = Duration::from_millis(250);
/// A fall is a rate only once it has lasted this long: a process touching 100 MiB at once
/// falls at gigabytes a second for 50 ms and then stops, and extrapolated over a second of
/// relief it would evict for nothing (seen in the end-to-end tests).
const MIN_SPAN: Duration = Duration::from_millis(100);
/// The fall expected before relief is at most this many times the fall already seen in the
/// window: a lead rests on what was seen, not on a rate carried far beyond it.
pub const LEAD_CAP: f64 = 4.0;
/// Relief times remembered, per way.
pub const RELIEF_SAMPLES: usize = 8;
/// How much more than the measured time to relief is allowed for.
pub const SAFETY: f64 = 1.5;
/// Before any kill was measured: crossing to growth stopped on the node (measured on the real
/// cluster: the kill signalled 2–5 ms after the crossing).
pub const DEFAULT_NODE_RELIEF: Duration = Duration::from_millis(20);
/// Before any eviction through the API was measured: the victim's memory freed 60–150 ms after
/// the request with a pod that exits on SIGTERM, a second and more with one that does not.
pub const DEFAULT_API_RELIEF: Duration = Duration::from_millis(1500);

/// The memory signals' recent readings and the measured times to relief.
#[derive(Debug, Default)]
pub struct Ahead {
    readings: BTreeMap<Signal, VecDeque<(Duration, i64)>>,
    node_relief: VecDeque<Duration>,
    api_relief: VecDeque<Duration>,
}

impl Ahead {
    /// A reading at `now` (the loop's clock).
    pub fn observe(&mut self, now: Duration, observations: &Observations) {
        for (signal, obs) in observations.iter().filter(|(s, _)| s.is_memory()) {
            let q = self.readings.entry(*signal).or_default();
            q.push_back((now, obs.available));
            while q
                .front()
                .is_some_and(|(t, _)| now.saturating_sub(*t) > WINDOW)
            {
                q.pop_front();
            }
        }
    }

    /// How fast `signal` falls, bytes a second, and how far it fell over the readings that
    /// say so (0 when it does not, or not for long enough to say).
    fn fall(&self, signal: Signal) -> (f64, f64) {
        let Some(q) = self.readings.get(&signal) else {
            return (0.0, 0.0);
        };
        let (Some(&(t0, a0)), Some(&(t1, a1))) = (q.front(), q.back()) else {
            return (0.0, 0.0);
        };
        let span = t1.saturating_sub(t0);
        if span < MIN_SPAN || a1 >= a0 {
            return (0.0, 0.0);
        }
        let fell = (a0 - a1) as f64;
        (fell / span.as_secs_f64(), fell)
    }

    /// A measured time to relief: an eviction carried out on the node (`on_node`, to its growth
    /// stopped) or through the API (to its memory freed).
    pub fn relieved(&mut self, on_node: bool, after: Duration) {
        let q = if on_node {
            &mut self.node_relief
        } else {
            &mut self.api_relief
        };
        q.push_back(after);
        if q.len() > RELIEF_SAMPLES {
            q.pop_front();
        }
    }

    /// The time relief takes, the way hard evictions go now.
    pub fn relief(&self, on_node: bool) -> Duration {
        let (q, default) = if on_node {
            (&self.node_relief, DEFAULT_NODE_RELIEF)
        } else {
            (&self.api_relief, DEFAULT_API_RELIEF)
        };
        q.iter().copied().max().unwrap_or(default)
    }

    /// Sets each memory signal's lead in `observations`: how far it would fall before relief
    /// asked for now arrives.
    pub fn lead(&self, observations: &mut Observations, on_node: bool) {
        let relief = self.relief(on_node).as_secs_f64() * SAFETY;
        for (signal, obs) in observations.iter_mut().filter(|(s, _)| s.is_memory()) {
            let (rate, fell) = self.fall(*signal);
            obs.lead = (rate * relief).min(fell * LEAD_CAP) as i64;
        }
    }
}

#[cfg(test)]
mod tests {
    use node_agent_policy::Observation;

    use super::*;

    const MIB: i64 = 1 << 20;

    fn at(available_mib: i64) -> Observations {
        [(
            Signal::AllocatableMemoryAvailable,
            Observation::new(available_mib * MIB, 4096 * MIB),
        )]
        .into()
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_rate_is_the_fall_over_the_last_readings() {
        let mut a = Ahead::default();
        let rows: [(&str, u64, i64, f64); 7] = [
            ("one reading: no rate", 0, 1000, 0.0),
            ("a fall too short to say (a burst)", 50, 900, 0.0),
            ("falling 200 MiB in 150 ms", 150, 800, 1333.3),
            ("alone in the window after a pause: no rate", 500, 600, 0.0),
            ("not yet long enough", 550, 550, 0.0),
            (
                "the older ones out of the window, a fall of 100 ms",
                600,
                500,
                1000.0,
            ),
            ("rising: no fall", 700, 900, 0.0),
        ];
        for (what, t, available, mib_per_s) in rows {
            a.observe(ms(t), &at(available));
            let got = a.fall(Signal::AllocatableMemoryAvailable).0 / MIB as f64;
            assert!((got - mib_per_s).abs() < 1.0, "{what}: {got}");
        }
    }

    #[test]
    fn the_lead_is_rate_times_the_slowest_recent_relief_with_a_margin_and_a_cap() {
        let mut a = Ahead::default();
        a.observe(ms(0), &at(1000));
        a.observe(ms(100), &at(700));
        let lead = |a: &Ahead, on_node| {
            let mut obs = at(700);
            a.lead(&mut obs, on_node);
            obs[&Signal::AllocatableMemoryAvailable].lead / MIB
        };
        // 3 GiB/s: 20 ms on the node (before any measure) × 1.5 is 90 MiB; through the API,
        // 1.5 s × 1.5 would be 6750 MiB, but no more than 4 × the 300 MiB seen: 1200.
        assert_eq!(lead(&a, true), 90);
        assert_eq!(lead(&a, false), 1200);
        a.relieved(true, ms(4));
        a.relieved(true, ms(10));
        assert_eq!(lead(&a, true), 45, "the slowest of the measured");
        for _ in 0..RELIEF_SAMPLES {
            a.relieved(true, ms(2));
        }
        assert_eq!(lead(&a, true), 9, "the old ones forgotten");
    }
}
