//! Many nodes' live streams as one, in time order. Each agent's stream is in its own order,
//! but lines from different nodes cross the API server at different paces: a line is held
//! for [`HOLD`] after it arrives, and the held lines leave oldest first by their own time.
//! A line that arrives later than [`HOLD`] behind one already shown cannot be put before it
//! and leaves at once. Pure: the caller passes the clock.

use std::{cmp::Reverse, collections::BinaryHeap, time::Duration};

/// How long a line waits for an older one from another node.
pub const HOLD: Duration = Duration::from_millis(1000);

/// A line to show, from one node.
#[derive(Debug, Clone, PartialEq)]
pub struct Timed<T> {
    /// Its own time (ns since the epoch): the record's time, or when it arrived if it has
    /// none that reads.
    pub at: i128,
    pub node: String,
    pub line: T,
}

#[derive(Debug)]
struct Held<T> {
    at: i128,
    due: i128,
    seq: u64,
    node: String,
    line: T,
}

impl<T> PartialEq for Held<T> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl<T> Eq for Held<T> {}
impl<T> PartialOrd for Held<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Held<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

#[derive(Debug)]
pub struct Merger<T> {
    hold: i128,
    held: BinaryHeap<Reverse<Held<T>>>,
    seq: u64,
}

impl<T> Merger<T> {
    pub fn new(hold: Duration) -> Self {
        Merger {
            hold: hold.as_nanos() as i128,
            held: BinaryHeap::new(),
            seq: 0,
        }
    }

    /// A line from `node` with its own time `at`, arrived at `now`.
    pub fn push(&mut self, node: &str, at: i128, line: T, now: i128) {
        self.seq += 1;
        self.held.push(Reverse(Held {
            at,
            due: now + self.hold,
            seq: self.seq,
            node: node.to_string(),
            line,
        }));
    }

    /// The lines that may leave at `now`, oldest first: while the oldest held line has
    /// waited its hold. (A younger line whose hold is over waits for an older one still
    /// held, at most one more hold.)
    pub fn due(&mut self, now: i128) -> Vec<Timed<T>> {
        let mut out = Vec::new();
        while self.held.peek().is_some_and(|Reverse(h)| h.due <= now) {
            let Some(Reverse(h)) = self.held.pop() else {
                break;
            };
            out.push(Timed {
                at: h.at,
                node: h.node,
                line: h.line,
            });
        }
        out
    }

    /// Everything held, oldest first (at the end of the command).
    pub fn drain(&mut self) -> Vec<Timed<T>> {
        let mut out = Vec::with_capacity(self.held.len());
        while let Some(Reverse(h)) = self.held.pop() {
            out.push(Timed {
                at: h.at,
                node: h.node,
                line: h.line,
            });
        }
        out
    }

    /// When the next line may leave, if any is held.
    pub fn next_due(&self) -> Option<i128> {
        self.held.iter().map(|Reverse(h)| h.due).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i128 = 1_000_000;

    /// (node, own time ms, arrived ms) pushed in this order; then `due` at each of `polls`;
    /// the lines shown as "node@time".
    fn run(pushes: &[(&str, i128, i128)], polls: &[i128]) -> Vec<Vec<String>> {
        let mut m = Merger::new(Duration::from_millis(1000));
        let mut shown = Vec::new();
        let mut pushes = pushes.iter().peekable();
        for &poll in polls {
            while let Some(&&(node, at, arrived)) = pushes.peek() {
                if arrived > poll {
                    break;
                }
                m.push(node, at * MS, (), arrived * MS);
                pushes.next();
            }
            shown.push(
                m.due(poll * MS)
                    .into_iter()
                    .map(|t| format!("{}@{}", t.node, t.at / MS))
                    .collect(),
            );
        }
        shown
    }

    #[test]
    fn lines_of_many_nodes_leave_in_time_order() {
        type Pushes = Vec<(&'static str, i128, i128)>;
        type Shown = Vec<Vec<&'static str>>;
        let rows: Vec<(&str, Pushes, Vec<i128>, Shown)> = vec![
            (
                "one node: its own order, each line after its hold",
                vec![("a", 10, 10), ("a", 20, 20)],
                vec![500, 1010, 1020],
                vec![vec![], vec!["a@10"], vec!["a@20"]],
            ),
            (
                "a slower node's older line overtakes a faster node's newer one",
                vec![("a", 100, 110), ("b", 90, 600)],
                vec![1200, 1700],
                vec![vec![], vec!["b@90", "a@100"]],
            ),
            (
                "interleaved nodes come out sorted",
                vec![("a", 1, 5), ("b", 3, 6), ("a", 2, 7), ("b", 4, 8)],
                vec![2000],
                vec![vec!["a@1", "a@2", "b@3", "b@4"]],
            ),
            (
                "a line later than the hold behind one shown leaves at once, out of order",
                vec![("a", 100, 100), ("b", 50, 1500)],
                vec![1100, 2500],
                vec![vec!["a@100"], vec!["b@50"]],
            ),
            (
                "equal times keep their arrival order",
                vec![("b", 7, 1), ("a", 7, 2)],
                vec![1002],
                vec![vec!["b@7", "a@7"]],
            ),
        ];
        for (what, pushes, polls, want) in rows {
            let got = run(&pushes, &polls);
            let want: Vec<Vec<String>> = want
                .into_iter()
                .map(|v| v.into_iter().map(String::from).collect())
                .collect();
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn the_end_drains_what_is_held_in_order() {
        let mut m = Merger::new(HOLD);
        m.push("b", 2, "two", 0);
        m.push("a", 1, "one", 0);
        assert_eq!(m.next_due(), Some(HOLD.as_nanos() as i128));
        let lines: Vec<&str> = m.drain().into_iter().map(|t| t.line).collect();
        assert_eq!(lines, ["one", "two"]);
        assert!(m.drain().is_empty());
        assert_eq!(m.next_due(), None);
    }
}
