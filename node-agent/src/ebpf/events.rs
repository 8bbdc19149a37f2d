//! Decoding ring-buffer records into typed events. A record that is too short or of an
//! unknown kind is an error naming what was wrong, never a panic or a silent skip.

use node_agent_common::{
    CgroupChangeEvent, EventHeader, ForkStormEvent, MemoryThresholdEvent, OomKillEvent,
    PidThresholdEvent, KIND_CGROUP_CHANGE, KIND_FORK_STORM, KIND_MEMORY_THRESHOLD, KIND_OOM_KILL,
    KIND_PID_THRESHOLD,
};

/// One event from the kernel programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelEvent {
    OomKill(OomKillEvent),
    MemoryThreshold(MemoryThresholdEvent),
    PidThreshold(PidThresholdEvent),
    ForkStorm(ForkStormEvent),
    /// A cgroup was created or removed somewhere: the cgroup index is out of date.
    CgroupChange(CgroupChangeEvent),
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

/// Decodes one record.
pub fn decode(record: &[u8]) -> Result<KernelEvent, DecodeError> {
    let header: EventHeader = read(record, 0).ok_or(DecodeError::NoHeader { len: record.len() })?;
    let kind = header.kind;
    fn body<T: Copy>(record: &[u8], kind: u32) -> Result<T, DecodeError> {
        read(record, kind).ok_or(DecodeError::Short {
            kind,
            len: record.len(),
            expected: std::mem::size_of::<T>(),
        })
    }
    Ok(match kind {
        KIND_OOM_KILL => KernelEvent::OomKill(body(record, kind)?),
        KIND_MEMORY_THRESHOLD => KernelEvent::MemoryThreshold(body(record, kind)?),
        KIND_PID_THRESHOLD => KernelEvent::PidThreshold(body(record, kind)?),
        KIND_FORK_STORM => KernelEvent::ForkStorm(body(record, kind)?),
        KIND_CGROUP_CHANGE => KernelEvent::CgroupChange(body(record, kind)?),
        kind => return Err(DecodeError::UnknownKind { kind }),
    })
}

/// Copies a `T` out of the start of `bytes` if it is long enough. `T` is one of the
/// `#[repr(C)]` integer-only types of node-agent-common, valid for any bit pattern.
fn read<T: Copy>(bytes: &[u8], _kind: u32) -> Option<T> {
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

#[cfg(test)]
mod tests {
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
