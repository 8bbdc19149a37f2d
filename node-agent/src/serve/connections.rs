//! Who may hold a connection to the telemetry listener, so `/healthz` cannot be starved.
//!
//! A client that connects and sends nothing must not keep the kubelet's probe out. Three
//! rules, applied on every accept and by a periodic sweep:
//! - **per-client share**: one client (an IPv4 address, or an IPv6 /64) holds at most
//!   [`Limits::per_client`] connections; its next one replaces its least recently active one;
//! - **capacity is preemptible**: when [`Limits::max_connections`] are open, a new connection
//!   replaces the least recently active one of all, so a fresh probe always gets in (an
//!   attacker would have to open the whole capacity again within the probe's round trip);
//! - **idle connections close**: no byte read or written for [`Limits::idle_timeout`] closes a
//!   connection (hyper's header timeout also bounds a request that trickles in).
//!
//! "Activity" is read or write progress on the socket, recorded by [`Tracked`], so a client
//! stalling the response it asked for counts as idle too.

use std::{
    collections::HashMap,
    io,
    net::{IpAddr, Ipv6Addr},
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bounds on the connections of one listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Limits {
    /// Open connections in all; the least recently active one makes room for a new one.
    pub max_connections: usize,
    /// Open connections of one client; its least recently active one makes room.
    pub per_client: usize,
    /// A request's headers must arrive within this (hyper closes the connection otherwise).
    pub header_timeout: Duration,
    /// No read or write progress for this long closes a connection.
    pub idle_timeout: Duration,
}

impl Limits {
    /// The endpoints serve one scraper and the kubelet's probes (a fresh connection each,
    /// request sent at once, 1 s default timeout): a handful of connections is the normal load.
    pub const DEFAULT: Limits = Limits {
        max_connections: 64,
        per_client: 8,
        header_timeout: Duration::from_secs(2),
        idle_timeout: Duration::from_secs(5),
    };
}

/// The party a connection counts against: an IPv4 address (IPv4-mapped IPv6 included), or
/// the /64 prefix of an IPv6 address, since one host commonly holds a whole /64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Client(IpAddr);

impl Client {
    pub fn of(ip: IpAddr) -> Client {
        match ip.to_canonical() {
            IpAddr::V4(v4) => Client(IpAddr::V4(v4)),
            IpAddr::V6(v6) => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                Client(IpAddr::V6(Ipv6Addr::from(prefix)))
            }
        }
    }
}

impl std::fmt::Display for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            IpAddr::V4(v4) => write!(f, "{v4}"),
            IpAddr::V6(v6) => write!(f, "{v6}/64"),
        }
    }
}

/// Monotonic nanoseconds since the listener started; the unit of [`Activity`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Clock {
    origin: Instant,
}

impl Clock {
    pub fn new() -> Clock {
        Clock {
            origin: Instant::now(),
        }
    }

    pub fn at(&self, now: Instant) -> u64 {
        // u64 nanoseconds last 584 years; saturate rather than wrap past that.
        u64::try_from(now.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX)
    }

    pub fn now(&self) -> u64 {
        self.at(Instant::now())
    }
}

/// The last read or write progress on one connection ([`Clock`] nanoseconds).
#[derive(Debug)]
pub(super) struct Activity(AtomicU64);

impl Activity {
    pub fn new(at: u64) -> Arc<Activity> {
        Arc::new(Activity(AtomicU64::new(at)))
    }

    fn touch(&self, at: u64) {
        self.0.fetch_max(at, Ordering::Relaxed);
    }

    fn last(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Why a connection was closed by the listener rather than by its client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Closed {
    /// Its client opened more than its share.
    ClientLimit,
    /// The listener was full and it was the least recently active.
    Capacity,
    /// No progress for the idle timeout.
    Idle,
}

impl Closed {
    pub fn as_str(self) -> &'static str {
        match self {
            Closed::ClientLimit => "client_limit",
            Closed::Capacity => "capacity",
            Closed::Idle => "idle",
        }
    }
}

struct Entry<H> {
    client: Client,
    activity: Arc<Activity>,
    handle: H,
}

/// The open connections by sequence number (accept order), each with its client, activity
/// and a handle that closes it (`H`: the task's abort handle).
pub(super) struct Table<H> {
    limits: Limits,
    entries: HashMap<u64, Entry<H>>,
}

impl<H> Table<H> {
    pub fn new(limits: Limits) -> Table<H> {
        Table {
            limits,
            entries: HashMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The connection to close so that one more from `client` fits, and why; `None` when
    /// there is room. The least recently active goes first; among equals, the oldest.
    pub fn make_room(&self, client: Client) -> Option<(u64, Closed)> {
        let least_active = |same_client: bool| {
            self.entries
                .iter()
                .filter(|(_, entry)| !same_client || entry.client == client)
                .min_by_key(|(&seq, entry)| (entry.activity.last(), seq))
                .map(|(&seq, _)| seq)
        };
        let of_client = self
            .entries
            .values()
            .filter(|entry| entry.client == client)
            .count();
        if of_client >= self.limits.per_client.max(1) {
            return least_active(true).map(|seq| (seq, Closed::ClientLimit));
        }
        if self.entries.len() >= self.limits.max_connections.max(1) {
            return least_active(false).map(|seq| (seq, Closed::Capacity));
        }
        None
    }

    pub fn insert(&mut self, seq: u64, client: Client, activity: Arc<Activity>, handle: H) {
        self.entries.insert(
            seq,
            Entry {
                client,
                activity,
                handle,
            },
        );
    }

    /// Forgets a connection; its handle, to close it, when it was still listed.
    pub fn remove(&mut self, seq: u64) -> Option<H> {
        self.entries.remove(&seq).map(|entry| entry.handle)
    }

    /// The connections without progress for the idle timeout at `now`.
    pub fn idle(&self, now: u64) -> Vec<u64> {
        let timeout = u64::try_from(self.limits.idle_timeout.as_nanos()).unwrap_or(u64::MAX);
        let mut idle: Vec<u64> = self
            .entries
            .iter()
            .filter(|(_, entry)| now.saturating_sub(entry.activity.last()) > timeout)
            .map(|(&seq, _)| seq)
            .collect();
        idle.sort_unstable();
        idle
    }
}

/// A connection's socket that records read and write progress in its [`Activity`].
pub(super) struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
    clock: Clock,
}

impl<S> Tracked<S> {
    pub fn new(inner: S, activity: Arc<Activity>, clock: Clock) -> Tracked<S> {
        Tracked {
            inner,
            activity,
            clock,
        }
    }

    fn progressed(&self) {
        self.activity.touch(self.clock.now());
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.progressed();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.progressed();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.progressed();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(ip: &str) -> Client {
        Client::of(ip.parse().expect("ip"))
    }

    #[test]
    fn clients_are_ipv4_addresses_or_ipv6_prefixes() {
        #[rustfmt::skip]
        let rows = [
            ("10.0.0.1", "10.0.0.1", true),
            ("10.0.0.1", "10.0.0.2", false),
            ("::ffff:10.0.0.1", "10.0.0.1", true),
            ("2001:db8::1", "2001:db8::ffff:1", true),
            ("2001:db8:0:0:1::1", "2001:db8:0:0:2::9", true),
            ("2001:db8:0:1::1", "2001:db8:0:2::1", false),
        ];
        for (a, b, same) in rows {
            assert_eq!(client(a) == client(b), same, "{a} vs {b}");
        }
        assert_eq!(client("2001:db8::7").to_string(), "2001:db8::/64");
    }

    type Entries = &'static [(u64, &'static str, u64)];
    type Expected = Option<(u64, Closed)>;

    /// A table of `(seq, client, last activity)` and the limits 3 in all, 2 per client.
    fn table(rows: &[(u64, &str, u64)]) -> Table<()> {
        let mut table = Table::new(Limits {
            max_connections: 3,
            per_client: 2,
            header_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_nanos(100),
        });
        for &(seq, ip, at) in rows {
            table.insert(seq, client(ip), Activity::new(at), ());
        }
        table
    }

    #[test]
    fn make_room_closes_the_least_recently_active_of_the_client_then_of_all() {
        #[rustfmt::skip]
        let rows: [(&str, Entries, &str, Expected); 7] = [
            ("empty: room", &[], "10.0.0.1", None),
            ("under both limits: room", &[(1, "10.0.0.1", 5), (2, "10.0.0.2", 5)], "10.0.0.1", None),
            ("client at its share: its least active goes",
             &[(1, "10.0.0.1", 9), (2, "10.0.0.1", 3), (3, "10.0.0.2", 1)], "10.0.0.1", Some((2, Closed::ClientLimit))),
            ("full: the least active of all goes",
             &[(1, "10.0.0.1", 9), (2, "10.0.0.2", 3), (3, "10.0.0.3", 4)], "10.0.0.4", Some((2, Closed::Capacity))),
            ("full and at its share: the client's own goes first",
             &[(1, "10.0.0.1", 9), (2, "10.0.0.1", 8), (3, "10.0.0.3", 1)], "10.0.0.1", Some((2, Closed::ClientLimit))),
            ("equal activity: the oldest goes",
             &[(7, "10.0.0.1", 5), (4, "10.0.0.2", 5), (9, "10.0.0.3", 5)], "10.0.0.4", Some((4, Closed::Capacity))),
            ("an IPv6 /64 is one client",
             &[(1, "2001:db8::1", 5), (2, "2001:db8::2", 6)], "2001:db8::3", Some((1, Closed::ClientLimit))),
        ];
        for (name, entries, newcomer, expected) in rows {
            assert_eq!(
                table(entries).make_room(client(newcomer)),
                expected,
                "{name}"
            );
        }
    }

    #[test]
    fn idle_lists_connections_without_progress_past_the_timeout() {
        let mut table = table(&[
            (1, "10.0.0.1", 0),
            (2, "10.0.0.2", 50),
            (3, "10.0.0.3", 100),
        ]);
        assert_eq!(
            table.idle(100),
            Vec::<u64>::new(),
            "nothing past 100 ns yet"
        );
        assert_eq!(table.idle(101), vec![1], "exactly at the bound stays");
        assert_eq!(table.idle(1000), vec![1, 2, 3]);
        assert_eq!(table.remove(1), Some(()));
        assert_eq!(table.remove(1), None, "removed once");
        assert_eq!(table.idle(1000), vec![2, 3]);
        assert_eq!(table.len(), 2);
    }

    #[tokio::test]
    async fn tracked_records_read_and_write_progress() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let clock = Clock::new();
        let activity = Activity::new(0);
        let (near, mut far) = tokio::io::duplex(64);
        let mut tracked = Tracked::new(near, Arc::clone(&activity), clock);

        tokio::time::sleep(Duration::from_millis(2)).await;
        tracked.write_all(b"ping").await.expect("write");
        let after_write = activity.last();
        assert!(after_write > 0, "a write is progress");

        far.write_all(b"pong").await.expect("write");
        let mut got = [0u8; 4];
        tokio::time::sleep(Duration::from_millis(2)).await;
        tracked.read_exact(&mut got).await.expect("read");
        assert!(activity.last() > after_write, "a read is progress");
    }
}
