//! The statistics every judged row uses (docs/benchmarks.md, *Method*): an estimate with a
//! 95 % interval, and a target checked against the interval's unfavourable end, never against
//! the estimate alone.
//!
//! - [`quantile_ci`]: a quantile (the median, a p99) with its distribution-free interval
//!   from order statistics (the ranks the binomial distribution gives), for figures whose
//!   spread is skewed or heavy-tailed (paired ratios of loop times, latencies).
//! - [`mean_ci`]: a mean with a percentile-bootstrap interval, for counts and CPU shares that
//!   add up (wake-ups per second, busy time), where the mean is the figure that matters.
//! - [`bootstrap`]: the same resampling for any statistic of one or two samples (a ratio of
//!   two p99s).
//!
//! Resampling is seeded with a constant, so one set of figures always gives one interval.

/// Two-sided confidence of every interval.
pub const CONFIDENCE: f64 = 0.95;
/// Bootstrap resamples per interval.
const RESAMPLES: usize = 4000;
const SEED: u64 = 0x9e37_79b9_7f4a_7c15;

/// An estimate with its interval. `coverage` is the interval's actual confidence: for order
/// statistics it is at least [`CONFIDENCE`] when the sample is large enough, less when it is
/// not (then the interval is the sample's range and says so).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interval {
    pub estimate: f64,
    pub lo: f64,
    pub hi: f64,
    pub coverage: f64,
    pub n: usize,
}

impl Interval {
    /// `estimate [lo … hi]` with `digits` decimals and a sign when `signed`.
    pub fn show(&self, digits: usize, signed: bool) -> String {
        let f = |v: f64| {
            if signed {
                format!("{v:+.digits$}")
            } else {
                format!("{v:.digits$}")
            }
        };
        format!("{} [{} … {}]", f(self.estimate), f(self.lo), f(self.hi))
    }

    /// How the interval was made, for a row's note.
    pub fn describe(&self, statistic: &str) -> String {
        if self.coverage + 1e-9 >= CONFIDENCE {
            format!("{statistic}, 95 % interval in brackets, n = {}", self.n)
        } else if self.coverage == 0.0 {
            format!(
                "{statistic}, interval in brackets unreliable (n = {} is too few to resample)",
                self.n
            )
        } else {
            format!(
                "{statistic}, interval in brackets only {:.0} % (n = {} is too few for 95 %)",
                self.coverage * 100.0,
                self.n
            )
        }
    }

    pub fn scaled(self, by: f64) -> Self {
        let (a, b) = (self.lo * by, self.hi * by);
        Self {
            estimate: self.estimate * by,
            lo: a.min(b),
            hi: a.max(b),
            ..self
        }
    }

    /// `k ÷ self` (for positive values): the interval's ends swap.
    pub fn divide_into(self, k: f64) -> Self {
        Self {
            estimate: k / self.estimate,
            lo: k / self.hi,
            hi: k / self.lo,
            ..self
        }
    }

    pub fn shifted(self, by: f64) -> Self {
        Self {
            estimate: self.estimate + by,
            lo: self.lo + by,
            hi: self.hi + by,
            ..self
        }
    }
}

/// ln C(n, k) + k ln p + (n − k) ln(1 − p): the binomial probability mass, in logs.
fn ln_binomial_pmf(n: usize, k: usize, p: f64) -> f64 {
    let ln_fact = |m: usize| (1..=m).map(|i| (i as f64).ln()).sum::<f64>();
    ln_fact(n) - ln_fact(k) - ln_fact(n - k) + k as f64 * p.ln() + (n - k) as f64 * (1.0 - p).ln()
}

/// P(B = k) for k in 0..=n, B ~ Binomial(n, p), 0 < p < 1.
fn binomial_pmf(n: usize, p: f64) -> Vec<f64> {
    // One pass of the recurrence from the mode would be faster; n stays in the thousands.
    let mode = ((n as f64 + 1.0) * p).floor().min(n as f64) as usize;
    let at_mode = ln_binomial_pmf(n, mode, p);
    let mut pmf = vec![0.0; n + 1];
    pmf[mode] = 1.0;
    for k in (0..mode).rev() {
        // P(k) = P(k + 1) · (k + 1)(1 − p) / ((n − k) p)
        pmf[k] = pmf[k + 1] * (k as f64 + 1.0) * (1.0 - p) / ((n - k) as f64 * p);
    }
    for k in mode + 1..=n {
        pmf[k] = pmf[k - 1] * (n - k + 1) as f64 * p / (k as f64 * (1.0 - p));
    }
    let scale = at_mode.exp();
    pmf.iter().map(|v| v * scale).collect()
}

/// The `q` quantile of `values` (nearest rank, as [`super::quantile`]) with its distribution-free
/// interval: the order statistics `x(l)` and `x(u)` such that the true quantile lies between
/// them with probability at least 95 % whatever the distribution (the number of values below
/// it is Binomial(n, q)). `None` when empty.
pub fn quantile_ci(values: &[f64], q: f64) -> Option<Interval> {
    let n = values.len();
    if n == 0 {
        return None;
    }
    let mut x = values.to_vec();
    x.sort_by(f64::total_cmp);
    let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
    let estimate = x[rank - 1];
    let q = q.clamp(1e-9, 1.0 - 1e-9);
    let pmf = binomial_pmf(n, q);
    let tail = (1.0 - CONFIDENCE) / 2.0;
    // l: the largest rank with P(B < l) ≤ tail (B = values below the true quantile), at least 1.
    let mut below = 0.0;
    let mut l = 1;
    for (k, p) in pmf.iter().enumerate() {
        // Here `below` = P(B < k).
        if k >= 1 && below <= tail && k <= rank {
            l = k;
        }
        below += p;
    }
    // u: the smallest rank with P(B ≥ u) ≤ tail, at most n.
    let mut above = 0.0;
    let mut u = n;
    for k in (1..=n).rev() {
        above += pmf[k];
        // Here `above` = P(B ≥ k).
        if above <= tail && k >= rank {
            u = k;
        }
    }
    let coverage: f64 = pmf[l..u].iter().sum();
    Some(Interval {
        estimate,
        lo: x[l - 1],
        hi: x[u - 1],
        coverage,
        n,
    })
}

/// The median with its distribution-free interval.
pub fn median_ci(values: &[f64]) -> Option<Interval> {
    quantile_ci(values, 0.5)
}

/// The mean with its percentile-bootstrap interval. `None` when empty.
pub fn mean_ci(values: &[f64]) -> Option<Interval> {
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    bootstrap(values, &[], |a, _| mean(a))
}

/// `stat` of the samples `a` and `b` (either may be empty) with a percentile-bootstrap
/// interval: each resample draws `a` and `b` anew, with replacement, at their own sizes.
pub fn bootstrap(a: &[f64], b: &[f64], stat: impl Fn(&[f64], &[f64]) -> f64) -> Option<Interval> {
    if a.is_empty() {
        return None;
    }
    let estimate = stat(a, b);
    let mut rng = super::Rng::seeded(SEED);
    let mut draw = |from: &[f64], into: &mut Vec<f64>| {
        into.clear();
        for _ in 0..from.len() {
            into.push(from[(rng.next_u64() % from.len() as u64) as usize]);
        }
    };
    let (mut ra, mut rb) = (Vec::with_capacity(a.len()), Vec::with_capacity(b.len()));
    let mut stats: Vec<f64> = Vec::with_capacity(RESAMPLES);
    for _ in 0..RESAMPLES {
        draw(a, &mut ra);
        draw(b, &mut rb);
        stats.push(stat(&ra, &rb));
    }
    stats.retain(|s| s.is_finite());
    stats.sort_by(f64::total_cmp);
    let tail = (1.0 - CONFIDENCE) / 2.0;
    let at = |p: f64| {
        let i = ((p * stats.len() as f64) as usize).min(stats.len().saturating_sub(1));
        stats.get(i).copied().unwrap_or(estimate)
    };
    Some(Interval {
        estimate,
        lo: at(tail),
        hi: at(1.0 - tail),
        // Fewer than five values resample into a handful of distinct means: no interval.
        coverage: if a.len() >= 5 { CONFIDENCE } else { 0.0 },
        n: a.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_binomial_masses_add_up_to_one() {
        for (n, p) in [(1, 0.5), (16, 0.5), (1000, 0.99), (37, 0.1)] {
            let total: f64 = binomial_pmf(n, p).iter().sum();
            assert!((total - 1.0).abs() < 1e-9, "n = {n}, p = {p}: {total}");
        }
    }

    #[test]
    fn median_intervals_use_the_textbook_ranks() {
        // n → (lower rank, upper rank) of the 95 % distribution-free interval of the median.
        let cases = [(16, 4, 13), (24, 7, 18), (100, 40, 61), (6, 1, 6)];
        for (n, l, u) in cases {
            let v: Vec<f64> = (1..=n).map(|i| i as f64).collect();
            let ci = median_ci(&v).unwrap();
            assert_eq!((ci.lo, ci.hi), (l as f64, u as f64), "n = {n}");
            assert_eq!(ci.estimate, (n as f64 / 2.0).ceil(), "n = {n}");
            if n >= 16 {
                assert!(ci.coverage >= CONFIDENCE, "n = {n}: {}", ci.coverage);
            }
        }
        let tiny = median_ci(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((tiny.lo, tiny.hi), (1.0, 3.0), "too few: the range");
        assert!(
            tiny.coverage < CONFIDENCE,
            "and it says so: {}",
            tiny.coverage
        );
        assert!(median_ci(&[]).is_none());
    }

    #[test]
    fn a_p99_interval_of_a_thousand_lies_around_the_990th_value() {
        let v: Vec<f64> = (1..=1000).map(f64::from).collect();
        let ci = quantile_ci(&v, 0.99).unwrap();
        assert_eq!(ci.estimate, 990.0);
        assert!(
            (982.0..990.0).contains(&ci.lo) && (990.0..=998.0).contains(&ci.hi),
            "{ci:?}"
        );
        assert!(ci.coverage >= CONFIDENCE);
    }

    #[test]
    fn bootstrap_intervals_of_the_mean_cover_it_and_shrink_with_n() {
        let mut rng = super::super::Rng::seeded(7);
        let sample = |n: usize, rng: &mut super::super::Rng| -> Vec<f64> {
            (0..n).map(|_| 10.0 + 4.0 * (rng.unit() - 0.5)).collect()
        };
        let small = mean_ci(&sample(10, &mut rng)).unwrap();
        let large = mean_ci(&sample(1000, &mut rng)).unwrap();
        for ci in [small, large] {
            assert!(ci.lo <= ci.estimate && ci.estimate <= ci.hi, "{ci:?}");
            assert!(ci.lo < 10.0 + 1.0 && ci.hi > 10.0 - 1.0, "{ci:?}");
        }
        assert!(
            large.hi - large.lo < small.hi - small.lo,
            "{small:?} {large:?}"
        );
        // Same data, same interval: the resampling is seeded.
        let v = sample(20, &mut rng);
        assert_eq!(mean_ci(&v), mean_ci(&v));
        assert_eq!(mean_ci(&[5.0]).map(|c| (c.lo, c.hi)), Some((5.0, 5.0)));
    }

    #[test]
    fn a_ratio_of_two_samples_gets_an_interval_around_it() {
        let a: Vec<f64> = (1..=200).map(f64::from).collect();
        let b: Vec<f64> = (1..=200).map(|i| 2.0 * f64::from(i)).collect();
        let max = |v: &[f64]| v.iter().copied().fold(f64::MIN, f64::max);
        let ci = bootstrap(&a, &b, |a, b| max(a) / max(b)).unwrap();
        assert_eq!(ci.estimate, 0.5);
        assert!(ci.lo <= 0.5 && ci.hi >= 0.5 && ci.hi < 0.6, "{ci:?}");
    }
}
