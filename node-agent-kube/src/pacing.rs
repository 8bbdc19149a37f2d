//! Pacing evictions: a token bucket capping evictions per minute, and the wait after each
//! eviction until the pod's cgroup is gone (as the kubelet waits for pod cleanup).

use std::time::{Duration, Instant};

/// Capacity `burst`, refilled at `per_minute` tokens a minute. Pure: time comes in as `now`.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenBucket {
    burst: f64,
    per_second: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket at `now`.
    pub fn new(per_minute: u32, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            burst,
            per_second: f64::from(per_minute) / 60.0,
            tokens: burst,
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
        self.last = self.last.max(now);
    }

    /// Takes a token, or says how long until one is available.
    pub fn try_take(&mut self, now: Instant) -> Result<(), Duration> {
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitOutcome {
    /// The predicate said the pod's cgroup is gone, after this long.
    Gone(Duration),
    /// Still there when the timeout ran out.
    TimedOut(Duration),
}

/// Polls `is_gone` (e.g. "the pod's cgroup directory no longer exists") every `poll` until it
/// says yes or `timeout` passes.
pub async fn wait_until_gone<F, Fut>(
    mut is_gone: F,
    timeout: Duration,
    poll: Duration,
) -> WaitOutcome
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = tokio::time::Instant::now();
    loop {
        if is_gone().await {
            return WaitOutcome::Gone(start.elapsed());
        }
        let elapsed = start.elapsed();
        if elapsed >= timeout {
            return WaitOutcome::TimedOut(elapsed);
        }
        tokio::time::sleep(poll.min(timeout - elapsed)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_allows_burst_then_paces() {
        let t0 = Instant::now();
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
        let t0 = Instant::now() + Duration::from_secs(100);
        let mut b = TokenBucket::new(60, 1, t0);
        assert!(b.try_take(t0).is_ok());
        assert!(b.try_take(t0 - Duration::from_secs(50)).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn wait_returns_when_gone_or_at_timeout() {
        let mut polls = 0;
        let out = wait_until_gone(
            || {
                polls += 1;
                let gone = polls >= 3;
                async move { gone }
            },
            Duration::from_secs(30),
            Duration::from_secs(1),
        )
        .await;
        assert_eq!(out, WaitOutcome::Gone(Duration::from_secs(2)));
        let out = wait_until_gone(
            || async { false },
            Duration::from_secs(5),
            Duration::from_secs(2),
        )
        .await;
        assert_eq!(out, WaitOutcome::TimedOut(Duration::from_secs(5)));
    }
}
