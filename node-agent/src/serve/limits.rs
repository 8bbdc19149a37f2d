//! What every listener of the agent bounds the same way: the size of a request's head, the
//! pause after a failed accept (out of descriptors) so an accept loop never spins, and how often
//! a listener may log about the clients it closed or refused ([`Throttle`]), so a flood of
//! clients is never a flood of log lines. What each listener holds per client (connections,
//! streams, their timeouts) is its own: [`super::connections`] for the metrics listener,
//! [`super::inspect::Limits`], [`super::live::MAX_CLIENTS`].

use std::time::{Duration, Instant};

/// A request's line and headers: probes, scrapers and `kubectl node-agent` send a few hundred
/// bytes.
pub const MAX_HEADER_BYTES: usize = 8 * 1024;
/// Pause after a failed accept (out of descriptors) before the next.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Closed or refused clients and failing accepts are logged at most this often (each
/// episode's first at once).
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// Counts occurrences and says when to log them: the first at once, then at most every
/// [`LOG_EVERY`], with how many happened since the last line.
#[derive(Debug, Default)]
pub struct Throttle {
    since: u64,
    last: Option<Instant>,
}

impl Throttle {
    /// One more occurrence at `now`: how many to log now, if a line is due.
    pub fn due(&mut self, now: Instant) -> Option<u64> {
        self.since += 1;
        if self
            .last
            .is_some_and(|last| now.saturating_duration_since(last) < LOG_EVERY)
        {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.since))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_is_logged_at_once_then_one_line_per_window_with_the_count() {
        let mut t = Throttle::default();
        let start = Instant::now();
        assert_eq!(t.due(start), Some(1));
        assert_eq!(t.due(start + Duration::from_secs(1)), None);
        assert_eq!(t.due(start + Duration::from_secs(9)), None);
        assert_eq!(
            t.due(start + LOG_EVERY),
            Some(3),
            "the two held back and this one"
        );
        assert_eq!(t.due(start + LOG_EVERY + Duration::from_secs(1)), None);
    }
}
