//! The in-kernel memory sampler's shared types and its one pacing rule (`node-agent-ebpf/src/
//! sampler.rs` ticks by it; `node-agent/src/ebpf/sampler/` configures it).
//!
//! **The promise, by rate.** Memory is charged to a cgroup no faster than a bound: each CPU
//! at most [`MAX_CHARGE_BYTES_PER_US_PER_CPU`] (the kernel zeroes every page it charges, and
//! zeroing runs at about memory bandwidth), plus at most one charge of
//! [`LARGEST_SINGLE_CHARGE_BYTES`] at once (a transparent huge page is charged whole when it
//! is faulted in). Against that bound the sampler promises: a crossing by any charge up to the
//! bound, a burst of the largest single charge included, is reported within 10 ms. It reads a
//! line, and waits no longer than the bound needs to close the line's headroom beyond one
//! burst, plus its shortest period ([`SamplerControl::wait_ns`]); so a crossing within the
//! bound is read at most one shortest period (1 ms) after it happens, and the rest of the
//! 10 ms is for a timer that fires late. A line whose headroom is seconds of charging at the
//! bound is read every [`DEFAULT_SAMPLER_MAX_PERIOD_NS`] at most, so an idle node with every
//! line far is woken a few times a second, not a thousand. A charge beyond the bound (none that
//! the kernel can do by faulting pages in; a cgroup v1 task move with `move_charge_at_immigrate`
//! is one) is still reported within the longest period.

/// Most memory lines the in-kernel sampler watches at once.
pub const MAX_MEMORY_LINES: u32 = 256;

/// The sampler's shortest period, its pace near a line: a crossing by a charge within the
/// bound is read at most this long after it happens.
pub const DEFAULT_SAMPLER_PERIOD_NS: u64 = 1_000_000;

/// The sampler's longest period: the pace while every line is at least this long of charging
/// at the bound away (then the node is woken 4 times a second for the sampler), and the bound
/// on how late a charge faster than the bound is seen.
pub const DEFAULT_SAMPLER_MAX_PERIOD_NS: u64 = 250_000_000;

/// The charge-rate bound per CPU, bytes per microsecond: 16 GiB/s. Every page charged is
/// zeroed (or filled) first, and one CPU zeroes at about its memory bandwidth (a transparent
/// huge page: 2 MiB in about 100 µs on current servers); 4 KiB faults are several times
/// slower. The sampler assumes every online CPU charges the same line at this rate.
pub const MAX_CHARGE_BYTES_PER_US_PER_CPU: u64 = (16 << 30) / 1_000_000;

/// The largest single charge: a transparent huge page, 2 MiB with 4 KiB base pages (x86-64,
/// arm64), which the page counter takes whole when the page is faulted in.
pub const LARGEST_SINGLE_CHARGE_BYTES: u64 = 2 << 20;

/// One line the in-kernel sampler watches. User space writes `cgroup_id` with `counter` 0; the
/// kernel's cgroup iterator fills `counter` with the address of that memcg's `memory` page
/// counter, which the sampler reads every period. The threshold itself is the cgroup's
/// [`crate::MemoryThreshold`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryLine {
    pub cgroup_id: u64,
    /// Kernel-owned: a kernel address, never dereferenced by user space; 0 until resolved.
    pub counter: u64,
}

const _: () = assert!(core::mem::size_of::<MemoryLine>() == 16);

/// What user space tells the sampler: its periods, the charge bound it plans for and how many
/// line slots are in use. After each tick the timer waits the shortest [`Self::wait_ns`] over
/// the lines below their threshold; a line at or above its threshold (waiting for the
/// down-crossing: memory can be freed at once) waits `period_ns`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SamplerControl {
    /// The shortest wait between ticks.
    pub period_ns: u64,
    /// The longest wait between ticks.
    pub max_period_ns: u64,
    /// The charge-rate bound of the whole node (all CPUs), bytes per µs; 0: no bound, every
    /// wait is `period_ns`.
    pub charge_bytes_per_us: u64,
    /// The largest single charge, bytes: headroom a charge can close at once.
    pub burst_bytes: u64,
    /// Slots `0..lines` of the line array are checked; 0 stops the timers at their next tick.
    pub lines: u32,
    /// Which of the [`SAMPLER_TIMERS`] the next run of the attach iterator (re)starts, on the
    /// CPU it runs on.
    pub timer: u32,
}

const _: () = assert!(core::mem::size_of::<SamplerControl>() == 40);

impl SamplerControl {
    /// How long a line with `headroom` bytes below its threshold may wait for its next read:
    /// the time the charge bound needs to cover the headroom beyond one largest single charge,
    /// plus the shortest period, at most the longest period. Read at that moment, a crossing
    /// by a charge within the bound (no faster than `charge_bytes_per_us`, plus one burst of
    /// `burst_bytes`) is at most `period_ns` old; meanwhile the line cannot have been crossed.
    #[inline(always)]
    pub fn wait_ns(&self, headroom: u64) -> u64 {
        let period = self.period_ns;
        let longest = if self.max_period_ns > period {
            self.max_period_ns
        } else {
            period
        };
        if self.charge_bytes_per_us == 0 {
            return period;
        }
        let reach = headroom.saturating_sub(self.burst_bytes);
        let most_us = (longest - period) / 1000;
        let us = reach / self.charge_bytes_per_us;
        period + if us < most_us { us } else { most_us } * 1000
    }
}

/// What the sampler did: ticks so far and the time spent in them (kernel-measured), and the
/// ticks that came more than [`SAMPLER_LATE_NS`] after they were due with no tick of the other
/// timer in between, with the worst delay. Such a late tick is where the 10 ms promise can
/// break: a crossing is read one shortest period after it at the latest when timers are on
/// time, so a tick that much late leaves it seen after more than half the 10 ms. Timers run
/// late when softirqs are deferred or the host deschedules the vCPU they are on; a late timer
/// whose partner ticked meanwhile left no gap and is not counted. One value per timer in the
/// kernel map; user space adds them up (`+`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SamplerStats {
    pub ticks: u64,
    pub busy_ns: u64,
    pub late_ticks: u64,
    pub max_late_ns: u64,
    /// Ticks taken alone at the full pace because the partner timer was overdue by a whole
    /// pace: the gaps a descheduled vCPU would have left, covered.
    pub alone_ticks: u64,
    /// The CPU this timer's last tick ran on (per timer; a sum keeps the first timer's).
    pub cpu: u32,
    pub _pad: u32,
}

const _: () = assert!(core::mem::size_of::<SamplerStats>() == 48);

/// The figures of two timers together: counts add up, the worst delay is the larger.
impl core::ops::Add for SamplerStats {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self {
            ticks: self.ticks.saturating_add(other.ticks),
            busy_ns: self.busy_ns.saturating_add(other.busy_ns),
            late_ticks: self.late_ticks.saturating_add(other.late_ticks),
            max_late_ns: self.max_late_ns.max(other.max_late_ns),
            alone_ticks: self.alone_ticks.saturating_add(other.alone_ticks),
            cpu: self.cpu,
            _pad: 0,
        }
    }
}

/// The sampler's timers. Each is pinned to its own CPU, so a vCPU the host deschedules (steal)
/// stops only one of them: the other notices the first is overdue and samples alone at the
/// full pace. While both run they take turns, so together they tick as often as one would.
pub const SAMPLER_TIMERS: u32 = 2;

/// How late a sampler tick may start before it counts in `SamplerStats::late_ticks`: half the
/// 10 ms promise.
pub const SAMPLER_LATE_NS: u64 = 5_000_000;

crate::user_pod!(MemoryLine, SamplerControl, SamplerStats);

#[cfg(test)]
mod tests {
    extern crate std;

    use std::{boxed::Box, vec::Vec};

    use super::*;

    const MS: u64 = 1_000_000;
    const MIB: u64 = 1 << 20;

    fn control(bytes_per_us: u64) -> SamplerControl {
        SamplerControl {
            period_ns: MS,
            max_period_ns: 250 * MS,
            charge_bytes_per_us: bytes_per_us,
            burst_bytes: 2 * MIB,
            lines: 1,
            timer: 0,
        }
    }

    #[test]
    fn the_wait_is_the_time_the_bound_needs_beyond_one_burst_plus_the_shortest_period() {
        // 1000 bytes per µs (1 GB/s): every million bytes beyond the burst is 1 ms more.
        let c = control(1000);
        let cases = [
            ("no headroom: the shortest period", 0, MS),
            ("within one burst: the shortest period", 2 * MIB, MS),
            (
                "10 MB beyond the burst: 10 ms more",
                2 * MIB + 10_000_000,
                11 * MS,
            ),
            (
                "a part of a µs of charging rounds down",
                2 * MIB + 10_000_999,
                11 * MS,
            ),
            ("far: the longest period", 10_000 * MIB, 250 * MS),
            ("u64::MAX headroom does not overflow", u64::MAX, 250 * MS),
        ];
        for (why, headroom, want) in cases {
            assert_eq!(c.wait_ns(headroom), want, "{why}");
        }
        assert_eq!(
            control(0).wait_ns(u64::MAX),
            MS,
            "no bound: every wait is the shortest"
        );
        let inverted = SamplerControl {
            max_period_ns: 0,
            ..control(1)
        };
        assert_eq!(
            inverted.wait_ns(u64::MAX),
            MS,
            "a longest below the shortest is the shortest"
        );
    }

    /// Ticks by `wait_ns` against a usage that grows as `usage(t_ns)`; returns how long after
    /// the crossing of `line` a tick first read usage at or above it, or `None` if no
    /// crossing happened within `horizon_ns`.
    fn detection_delay(
        c: &SamplerControl,
        line: u64,
        usage: impl Fn(u64) -> u64,
        horizon_ns: u64,
    ) -> Option<u64> {
        // The crossing: the first microsecond at which usage reaches the line.
        let crossing = (0..=horizon_ns / 1000)
            .map(|us| us * 1000)
            .find(|&t| usage(t) >= line)?;
        let mut t = 0;
        loop {
            let u = usage(t);
            if u >= line {
                return Some(t - crossing);
            }
            t += c.wait_ns(line - u);
        }
    }

    #[test]
    fn every_crossing_within_the_bound_is_read_within_one_shortest_period() {
        let gib_s = (1u64 << 30) / 1_000_000; // bytes per µs
        let c = control(16 * gib_s);
        let rate = c.charge_bytes_per_us;
        let burst = c.burst_bytes;
        let base = 512 * MIB;
        let us = |t: u64| t / 1000;
        // (what, line above the base, usage at time t) — every usage grows at most `rate` per
        // µs plus one `burst` at once.
        type Usage = Box<dyn Fn(u64) -> u64>;
        let cases: Vec<(&str, u64, Usage)> = std::vec![
            (
                "at the bound from t = 0",
                4096 * MIB,
                Box::new(move |t| base + rate * us(t))
            ),
            (
                "idle 3 s, then at the bound",
                4096 * MIB,
                Box::new(move |t| base + rate * us(t).saturating_sub(3_000_000)),
            ),
            (
                "idle, then one burst and the bound",
                300 * MIB,
                Box::new(move |t| {
                    let s = us(t).saturating_sub(777_777);
                    base + if s > 0 { burst + rate * s } else { 0 }
                }),
            ),
            (
                "at the bound, then one burst at the end",
                1024 * MIB - 8192,
                Box::new(move |t| {
                    let grown = (rate * us(t)).min(1024 * MIB - burst - 4096);
                    base + grown + if us(t) >= 70_000 { burst } else { 0 }
                }),
            ),
            (
                "a burst alone, the line within it",
                burst - 4096,
                Box::new(move |t| base + if us(t) >= 500_123 { burst } else { 0 }),
            ),
            (
                "a tenth of the bound",
                2048 * MIB,
                Box::new(move |t| base + rate / 10 * us(t))
            ),
        ];
        for (what, above, usage) in cases {
            let delay = detection_delay(&c, base + above, usage, 20_000 * MS)
                .unwrap_or_else(|| panic!("{what}: the line was never crossed"));
            assert!(
                delay <= c.period_ns,
                "{what}: read {delay} ns after the crossing, more than one shortest period"
            );
        }
    }

    #[test]
    fn a_far_line_is_read_at_the_longest_period_and_a_faster_charge_within_it() {
        let c = control(MIB / 1000);
        let base = 0;
        // Nothing charged: four reads a second.
        let mut t = 0;
        let mut reads = 0;
        while t < 1_000 * MS {
            t += c.wait_ns(100_000 * MIB);
            reads += 1;
        }
        assert_eq!(reads, 4, "a far line is read at the longest period");
        // A charge a thousand times the bound still crosses within the longest period.
        let fast = |t: u64| base + 1000 * MIB * (t / MS);
        let delay = detection_delay(&c, 600 * MIB, fast, 10_000 * MS).unwrap();
        assert!(delay <= c.max_period_ns, "{delay}");
    }
}
