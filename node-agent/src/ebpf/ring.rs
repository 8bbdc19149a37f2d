//! Draining the ring buffer asynchronously: the kernel wakes the epoll on the map's fd, tokio's
//! `AsyncFd` wakes us, and every record is decoded before we wait again.

use aya::maps::{MapData, RingBuf};
use tokio::io::unix::AsyncFd;

use super::{KernelPrograms, LoadError};
use crate::probes::{decode, DecodeError, KernelEvent};

/// The agent's single consumer of the `EVENTS` ring buffer.
pub struct EventStream {
    ring: AsyncFd<RingBuf<MapData>>,
}

impl KernelPrograms {
    /// Takes the ring buffer out of the object; call once (needs a tokio runtime).
    pub fn events(&mut self) -> Result<EventStream, LoadError> {
        let map = self
            .ebpf
            .take_map("EVENTS")
            .ok_or(LoadError::MissingMap("EVENTS"))?;
        let ring = RingBuf::try_from(map).map_err(|source| LoadError::Map {
            name: "EVENTS",
            source,
        })?;
        // SAFETY: the fd belongs to `ring`, which the AsyncFd owns; it stays open until the
        // AsyncFd is dropped, and AsyncFd deregisters it before dropping `ring`.
        let ring = unsafe { AsyncFd::register(ring) }.map_err(|e| LoadError::Map {
            name: "EVENTS",
            source: aya::maps::MapError::SyscallError(aya::sys::SyscallError {
                call: "epoll_ctl",
                io_error: e.into_parts().1,
            }),
        })?;
        Ok(EventStream { ring })
    }
}

impl EventStream {
    /// Waits for records and returns every one available, decoded. A record that does not
    /// decode is returned as an error in its place, so it is reported, not lost.
    pub async fn next_batch(&mut self) -> std::io::Result<Vec<Result<KernelEvent, DecodeError>>> {
        loop {
            let mut guard = self.ring.readable_mut().await?;
            let ring = guard.get_inner_mut();
            let mut batch = Vec::new();
            while let Some(record) = ring.next() {
                batch.push(decode(&record));
            }
            guard.clear_ready();
            if !batch.is_empty() {
                return Ok(batch);
            }
        }
    }
}
