//! Pacing evictions: a token bucket capping evictions per minute, part of the plan, so the plan
//! never hands over an eviction that the pacing would hold. (The wait after each eviction until
//! the pod's cgroup is gone, as the kubelet waits for pod cleanup, is the plan's in-flight
//! rule.) Time is the plan's `now`: a duration since a fixed start.

use std::time::Duration;

/// Capacity `burst`, refilled at `per_minute` tokens a minute. Pure: time comes in as `now`.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenBucket {
    burst: f64,
    per_second: f64,
    tokens: f64,
    last: Duration,
}

impl TokenBucket {
    /// A full bucket at `now`.
    pub fn new(per_minute: u32, burst: u32, now: Duration) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            burst,
            per_second: f64::from(per_minute) / 60.0,
            tokens: burst,
            last: now,
        }
    }

    fn refill(&mut self, now: Duration) {
        let elapsed = now.saturating_sub(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
        self.last = self.last.max(now);
    }

    /// New rates from a reload; the tokens held stay (up to the new burst), so a reload neither
    /// grants a fresh burst nor takes one away.
    pub fn reconfigure(&mut self, per_minute: u32, burst: u32, now: Duration) {
        self.refill(now);
        self.burst = f64::from(burst.max(1));
        self.per_second = f64::from(per_minute) / 60.0;
        self.tokens = self.tokens.min(self.burst);
    }

    /// Gives back a token taken for a request that changed nothing (the server refused it).
    pub fn refund(&mut self, now: Duration) {
        self.refill(now);
        self.tokens = (self.tokens + 1.0).min(self.burst);
    }

    /// Takes a token, or says how long until one is available.
    pub fn try_take(&mut self, now: Duration) -> Result<(), Duration> {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        if self.per_second <= 0.0 {
            return Err(Duration::MAX);
        }
        Err(Duration::from_secs_f64(
            (1.0 - self.tokens) / self.per_second,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_allows_burst_then_paces() {
        let t0 = Duration::from_secs(1000);
        let s = Duration::from_secs;
        let mut b = TokenBucket::new(6, 2, t0);
        // (time since t0, expected result)
        let rows = [
            (s(0), Ok(())),
            (s(0), Ok(())),
            (s(0), Err(s(10))),
            (s(5), Err(s(5))),
            (s(10), Ok(())),
            (s(10), Err(s(10))),
            (s(100), Ok(())),
            (s(100), Ok(())),
            (s(100), Err(s(10))),
        ];
        for (i, (at, want)) in rows.into_iter().enumerate() {
            // Whole milliseconds: the refill arithmetic is floating point.
            let got = b
                .try_take(t0 + at)
                .map_err(|d| Duration::from_millis((d.as_secs_f64() * 1000.0).round() as u64));
            assert_eq!(got, want, "row {i}");
        }
    }

    #[test]
    fn time_going_backwards_adds_no_tokens() {
        let t0 = Duration::from_secs(100);
        let mut b = TokenBucket::new(60, 1, t0);
        assert!(b.try_take(t0).is_ok());
        assert!(b.try_take(t0 - Duration::from_secs(50)).is_err());
    }

    #[test]
    fn refunds_and_new_rates_keep_what_is_held() {
        let t0 = Duration::from_secs(1000);
        let s = Duration::from_secs;
        let mut b = TokenBucket::new(6, 1, t0);
        assert!(b.try_take(t0).is_ok());
        b.refund(t0);
        assert!(
            b.try_take(t0).is_ok(),
            "a refunded token can be taken again"
        );
        assert!(b.try_take(t0).is_err());
        b.reconfigure(60, 3, t0);
        assert_eq!(
            b.try_take(t0).map_err(|d| d.as_millis()),
            Err(1000),
            "no fresh burst from a reload: the next token comes at the new rate"
        );
        assert!(b.try_take(t0 + s(3)).is_ok());
        assert!(b.try_take(t0 + s(3)).is_ok());
        assert!(b.try_take(t0 + s(3)).is_ok(), "up to the new burst");
        b.refund(t0 + s(3));
        b.refund(t0 + s(3));
        b.refund(t0 + s(3));
        b.refund(t0 + s(3));
        b.reconfigure(6, 1, t0 + s(3));
        assert!(b.try_take(t0 + s(3)).is_ok());
        assert!(
            b.try_take(t0 + s(3)).is_err(),
            "a smaller burst caps what is held"
        );
    }
}
