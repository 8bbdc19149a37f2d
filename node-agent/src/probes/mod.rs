//! The kernel probes' user-space side, one module per probe: its ring-buffer record decoded,
//! attributed to what it concerns, and turned into its line of the live stream.
//!
//! - [`oom_kill`]: the OOM killer chose a victim (kernel side: `node-agent-ebpf/src/oom.rs`).
//! - [`memory_threshold`]: a watched cgroup's memory usage crossed its line (`memcg.rs`).
//! - [`pid_threshold`]: the node's `pid.available` crossed its line (`tasks.rs`).
//! - [`fork_storm`]: a cgroup forked more than its limit within a window (`tasks.rs`).
//!
//! A cgroup created or removed (`cgroups.rs`) is decoded here too; it concerns nobody and only
//! tells the feed that its cgroup index is out of date, so it has no module of its own.
//!
//! Here is the plumbing they share: the header read and the dispatch on its kind ([`decode`]),
//! the typed events ([`KernelEvent`], [`Happened`]) and the dispatch from one to the next. A new
//! probe is its kernel program, its record type in `node-agent-common`, a module here that
//! implements [`Probe`], its line in each list of this file ([`NAMES`], the two enums and their
//! matches) and its variant of `trace::Record`; then the daemon's answer to it, a policy choice
//! (`run::core`).

pub mod fork_storm;
pub mod memory_threshold;
pub mod oom_kill;
pub mod parts;
pub mod pid_threshold;
mod subject;

use node_agent_common::{
    CgroupChangeEvent, EventHeader, ForkStormEvent, MemoryThresholdEvent, OomKillEvent,
    PidThresholdEvent, DIRECTION_UP, KIND_CGROUP_CHANGE,
};

pub use fork_storm::ForkStorm;
pub use memory_threshold::MemoryThreshold;
pub use oom_kill::OomKill;
pub use pid_threshold::PidThreshold;
pub use subject::{attribute, Attributed, Context, NoNames, PodNames, PodSubject, Subject};

/// One probe's user-space side. `Self` is its event attributed: what the daemon decides on.
pub trait Probe: Sized {
    /// The `kind` in its records' header (`node_agent_common::KIND_*`).
    const KIND: u32;
    /// Its trace records' `kind`, the word `--kind` takes, and its `kind` label on
    /// `node_agent_kernel_events_total`.
    const NAME: &'static str;
    /// The record as the kernel program writes it (`node-agent-common`).
    type Raw: Copy;
    /// Its line of the live stream, a variant of `trace::Record`.
    type Record;

    /// The cgroup the record names when it may be one created since the last rescan (a pod
    /// that just started): the cgroups are rescanned first, so that the event names its pod.
    fn new_cgroup(raw: &Self::Raw) -> Option<u64>;
    /// The record attributed to its cgroup and pod.
    fn attribute(raw: &Self::Raw, context: &Context<'_>) -> Self;
    /// Its trace record; `time` renders `ktime_ns`.
    fn record(&self, time: String, ktime_ns: u64) -> Self::Record;
}

/// Every probe's [`Probe::NAME`], in the order `trace --kind` lists them.
pub const NAMES: [&str; 4] = [
    OomKill::NAME,
    MemoryThreshold::NAME,
    PidThreshold::NAME,
    ForkStorm::NAME,
];

/// One record from the kernel programs, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelEvent {
    OomKill(OomKillEvent),
    MemoryThreshold(MemoryThresholdEvent),
    PidThreshold(PidThresholdEvent),
    ForkStorm(ForkStormEvent),
    /// A cgroup was created or removed somewhere: the cgroup index is out of date.
    CgroupChange(CgroupChangeEvent),
}

/// What happened, attributed: one probe's event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Happened {
    OomKill(OomKill),
    MemoryThreshold(MemoryThreshold),
    PidThreshold(PidThreshold),
    ForkStorm(ForkStorm),
}

impl KernelEvent {
    pub fn header(&self) -> &EventHeader {
        match self {
            Self::OomKill(e) => &e.header,
            Self::MemoryThreshold(e) => &e.header,
            Self::PidThreshold(e) => &e.header,
            Self::ForkStorm(e) => &e.header,
            Self::CgroupChange(e) => &e.header,
        }
    }

    /// See [`Probe::new_cgroup`].
    pub fn new_cgroup(&self) -> Option<u64> {
        match self {
            Self::OomKill(e) => OomKill::new_cgroup(e),
            Self::MemoryThreshold(e) => MemoryThreshold::new_cgroup(e),
            Self::PidThreshold(e) => PidThreshold::new_cgroup(e),
            Self::ForkStorm(e) => ForkStorm::new_cgroup(e),
            Self::CgroupChange(_) => None,
        }
    }

    /// The event attributed; `None` for the cgroup index's own bookkeeping (a cgroup came or
    /// went), which concerns nobody.
    pub fn attribute(&self, context: &Context<'_>) -> Option<Happened> {
        Some(match self {
            Self::OomKill(e) => Happened::OomKill(OomKill::attribute(e, context)),
            Self::MemoryThreshold(e) => {
                Happened::MemoryThreshold(MemoryThreshold::attribute(e, context))
            }
            Self::PidThreshold(e) => Happened::PidThreshold(PidThreshold::attribute(e, context)),
            Self::ForkStorm(e) => Happened::ForkStorm(ForkStorm::attribute(e, context)),
            Self::CgroupChange(_) => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("ring-buffer record of {len} bytes is shorter than an event header")]
    NoHeader { len: usize },
    #[error("ring-buffer record of kind {kind} has {len} bytes, expected {expected}")]
    Short {
        kind: u32,
        len: usize,
        expected: usize,
    },
    #[error("ring-buffer record of unknown kind {kind}")]
    UnknownKind { kind: u32 },
}

/// Decodes one record. A record that is too short or of an unknown kind is an error naming
/// what was wrong, never a panic or a silent skip.
pub fn decode(record: &[u8]) -> Result<KernelEvent, DecodeError> {
    let header: EventHeader = read(record).ok_or(DecodeError::NoHeader { len: record.len() })?;
    let kind = header.kind;
    fn body<T: Copy>(record: &[u8], kind: u32) -> Result<T, DecodeError> {
        read(record).ok_or(DecodeError::Short {
            kind,
            len: record.len(),
            expected: std::mem::size_of::<T>(),
        })
    }
    Ok(match kind {
        OomKill::KIND => KernelEvent::OomKill(body(record, kind)?),
        MemoryThreshold::KIND => KernelEvent::MemoryThreshold(body(record, kind)?),
        PidThreshold::KIND => KernelEvent::PidThreshold(body(record, kind)?),
        ForkStorm::KIND => KernelEvent::ForkStorm(body(record, kind)?),
        KIND_CGROUP_CHANGE => KernelEvent::CgroupChange(body(record, kind)?),
        kind => return Err(DecodeError::UnknownKind { kind }),
    })
}

/// Copies a `T` out of the start of `bytes` if it is long enough. `T` is one of the
/// `#[repr(C)]` integer-only types of node-agent-common, valid for any bit pattern.
fn read<T: Copy>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: length checked above; read_unaligned copes with any alignment; the types read
    // here are plain integers and arrays, so every bit pattern is a valid value.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// A kernel `comm` as text: up to the first NUL, lossy UTF-8.
pub fn comm(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// Which way a line was crossed (the threshold probes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    Up,
    Down,
}

impl Direction {
    fn of(d: u32) -> Self {
        if d == DIRECTION_UP {
            Direction::Up
        } else {
            Direction::Down
        }
    }
}

#[cfg(test)]
mod tests {
    use node_agent_common::{KIND_MEMORY_THRESHOLD, KIND_OOM_KILL};

    use super::*;

    fn bytes_of<T>(v: &T) -> Vec<u8> {
        // SAFETY: reading the bytes of a plain-data value.
        unsafe {
            std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>())
        }
        .to_vec()
    }

    #[test]
    fn decodes_each_kind_and_refuses_bad_records() {
        let mut oom = OomKillEvent::default();
        oom.header.kind = KIND_OOM_KILL;
        oom.pid = 42;
        oom.comm[..4].copy_from_slice(b"hog\0");
        let mut mem = MemoryThresholdEvent::default();
        mem.header.kind = KIND_MEMORY_THRESHOLD;
        mem.usage_bytes = 1 << 20;
        let unknown = EventHeader {
            kind: 99,
            ..EventHeader::default()
        };

        assert_eq!(decode(&bytes_of(&oom)), Ok(KernelEvent::OomKill(oom)));
        assert_eq!(
            decode(&bytes_of(&mem)),
            Ok(KernelEvent::MemoryThreshold(mem))
        );
        let cases: Vec<(&str, Vec<u8>, DecodeError)> = vec![
            ("empty record", vec![], DecodeError::NoHeader { len: 0 }),
            (
                "header cut short",
                bytes_of(&oom)[..8].to_vec(),
                DecodeError::NoHeader { len: 8 },
            ),
            (
                "body cut short",
                bytes_of(&oom)[..40].to_vec(),
                DecodeError::Short {
                    kind: KIND_OOM_KILL,
                    len: 40,
                    expected: 104,
                },
            ),
            (
                "unknown kind",
                bytes_of(&unknown),
                DecodeError::UnknownKind { kind: 99 },
            ),
        ];
        for (name, record, want) in cases {
            assert_eq!(decode(&record), Err(want), "{name}");
        }
        assert_eq!(comm(&oom.comm), "hog");
        assert_eq!(comm(b"full-length-comm"), "full-length-comm");
    }
}
