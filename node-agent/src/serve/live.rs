//! The daemon's live view: every trace record, as a JSON line, to every client of a Unix
//! socket. `node-agent trace` attaches here instead of loading a second copy of the programs.
//!
//! The socket is the agent's, not the world's: it is created with mode 0600 whatever the
//! umask (the mode is set on the socket before it gets a name), an empty path (which Linux
//! would turn into an abstract socket any local user can reach) or a relative one is refused,
//! and whatever is not a stale socket at the path is left alone. At most [`MAX_CLIENTS`] are
//! served at once; a client that leaves is noticed at once, not at the next record; failing
//! accepts (out of file descriptors) back off instead of spinning.

use std::{
    io,
    os::unix::fs::{FileTypeExt as _, PermissionsExt as _},
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{UnixListener, UnixStream},
    sync::{broadcast, OwnedSemaphorePermit, Semaphore},
};

use super::limits::Throttle;
use crate::trace::Record;

/// Records queued per client before it counts as too slow (its losses are reported to it).
const CLIENT_BACKLOG: usize = 4096;
/// `trace` clients served at once; more are closed on accept (each holds a descriptor and a
/// task, and an operator needs a handful).
pub(crate) const MAX_CLIENTS: usize = 16;
/// The socket's mode: the agent's user (root) only.
const SOCKET_MODE: u32 = 0o600;
/// A client that takes a record for longer than this is dropped (it stopped reading).
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("another node-agent is already serving {path}")]
    InUse { path: String },
    #[error("the trace socket path is empty (an empty path would be an abstract socket any local user could reach)")]
    EmptyPath,
    #[error("the trace socket path {path:?} must be absolute, without NUL bytes, and at most {max} bytes long")]
    BadPath { path: String, max: usize },
    #[error("{path} exists and is not a socket ({kind}); refusing to replace it")]
    NotASocket { path: String, kind: &'static str },
    #[error("removing the stale trace socket {path}")]
    RemoveStale {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("creating the trace socket {path}")]
    Bind {
        path: String,
        #[source]
        source: io::Error,
    },
}

/// Publishes records to attached `trace` clients.
#[derive(Clone)]
pub struct Live {
    tx: broadcast::Sender<Arc<str>>,
}

impl Live {
    /// Binds the socket (replacing a stale socket left by a crashed agent, nothing else) and
    /// starts accepting.
    pub async fn bind(path: &Path) -> Result<(Live, tokio::task::JoinHandle<()>), LiveError> {
        let listener = listen(path).await?;
        let (tx, _) = broadcast::channel(CLIENT_BACKLOG);
        let live = Live { tx };
        let task = tokio::spawn(accept_loop(
            listener,
            live.clone(),
            Arc::new(Semaphore::new(MAX_CLIENTS)),
        ));
        Ok((live, task))
    }

    /// Prints every record on stdout as well (`node-agent run --trace`).
    pub fn print(&self, format: crate::trace::OutputFormat) {
        let mut rx = self.tx.subscribe();
        tokio::spawn(async move {
            use std::io::Write as _;
            if format == crate::trace::OutputFormat::Table {
                println!("{}", Record::TABLE_HEADER);
            }
            loop {
                let line = match rx.recv().await {
                    Ok(line) => line,
                    Err(broadcast::error::RecvError::Lagged(n)) => lost_line(n),
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                let text = match format {
                    crate::trace::OutputFormat::Json => line.to_string(),
                    crate::trace::OutputFormat::Table => {
                        match serde_json::from_str::<Record>(&line) {
                            Ok(rec) => rec.table_row(),
                            Err(_) => line.to_string(),
                        }
                    }
                };
                let mut out = std::io::stdout().lock();
                if writeln!(out, "{text}").and_then(|()| out.flush()).is_err() {
                    return;
                }
            }
        });
    }

    /// A new reader of the stream (the inspection endpoint's trace clients): records from
    /// now on, at most [`CLIENT_BACKLOG`] behind, after which it is told what it missed.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<str>> {
        self.tx.subscribe()
    }

    pub fn publish(&self, record: &Record) {
        // No receivers is fine: nobody is watching.
        let _ = self.tx.send(Arc::from(record.json()));
    }
}

/// Checks the path, clears a stale socket and binds a listener that is never reachable with
/// a wider mode than [`SOCKET_MODE`].
async fn listen(path: &Path) -> Result<UnixListener, LiveError> {
    use std::os::unix::ffi::OsStrExt as _;
    let shown = path.display().to_string();
    let bytes = path.as_os_str().as_bytes();
    if bytes.is_empty() {
        return Err(LiveError::EmptyPath);
    }
    // sun_path is 108 bytes on Linux, with room for the closing NUL.
    const MAX_PATH: usize = 107;
    if !path.is_absolute() || bytes.contains(&0) || bytes.len() > MAX_PATH {
        return Err(LiveError::BadPath {
            path: shown,
            max: MAX_PATH,
        });
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if UnixStream::connect(path).await.is_ok() {
                return Err(LiveError::InUse { path: shown });
            }
            std::fs::remove_file(path).map_err(|source| LiveError::RemoveStale {
                path: shown.clone(),
                source,
            })?;
        }
        Ok(meta) => {
            return Err(LiveError::NotASocket {
                path: shown,
                kind: file_kind(meta.file_type()),
            })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(LiveError::Bind {
                path: shown,
                source,
            })
        }
    }
    let bind_error = |source| LiveError::Bind {
        path: shown.clone(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(bind_error)?;
    }
    let socket = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)
        .map_err(bind_error)?;
    // The mode of the socket inode becomes the mode of the file `bind` creates (narrowed by
    // the umask), so the file is never reachable with more than 0600, not even for a moment.
    set_fd_mode(&socket, SOCKET_MODE).map_err(bind_error)?;
    socket
        .bind(&socket2::SockAddr::unix(path).map_err(bind_error)?)
        .map_err(bind_error)?;
    // A umask that took bits away (say 0277) is undone: exactly 0600.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))
        .map_err(bind_error)?;
    socket.listen(128).map_err(bind_error)?;
    socket.set_nonblocking(true).map_err(bind_error)?;
    let std_listener: std::os::unix::net::UnixListener = std::os::fd::OwnedFd::from(socket).into();
    UnixListener::from_std(std_listener).map_err(bind_error)
}

fn set_fd_mode(socket: &socket2::Socket, mode: u32) -> io::Result<()> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: fchmod on a descriptor we own; it reads no memory of ours.
    if unsafe { libc::fchmod(socket.as_raw_fd(), mode) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn file_kind(kind: std::fs::FileType) -> &'static str {
    if kind.is_symlink() {
        "a symbolic link"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_file() {
        "a regular file"
    } else if kind.is_fifo() {
        "a FIFO"
    } else {
        "a device"
    }
}

async fn accept_loop(listener: UnixListener, live: Live, slots: Arc<Semaphore>) {
    let mut backoff = Backoff::default();
    // Outside the backoff, which each success resets: alternating failures and successes
    // still log at most every LOG_EVERY.
    let mut failing = Throttle::default();
    let mut recovered = Throttle::default();
    let mut refused = Throttle::default();
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                if backoff.failures > 0 && recovered.due(Instant::now()).is_some() {
                    tracing::info!(
                        failures = backoff.failures,
                        "trace socket accepting clients again"
                    );
                }
                backoff = Backoff::default();
                match Arc::clone(&slots).try_acquire_owned() {
                    Ok(slot) => {
                        tokio::spawn(serve_client(stream, live.tx.subscribe(), slot));
                    }
                    Err(_) => {
                        // Dropping the stream closes it: the client sees the stream end.
                        if let Some(count) = refused.due(Instant::now()) {
                            tracing::warn!(
                                refused = count,
                                limit = MAX_CLIENTS,
                                "trace socket: too many clients; closing new ones"
                            );
                        }
                    }
                }
            }
            Err(error) => {
                // Out of descriptors (EMFILE/ENFILE) or memory: the condition lasts until
                // something is closed, so retrying at once would only spin.
                let wait = backoff.failed();
                if let Some(failed) = failing.due(Instant::now()) {
                    tracing::warn!(%error, failed, retry_in = ?wait,
                        "trace socket: accepting a client failed; backing off");
                }
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// Exponential pause after failed accepts: 10 ms doubling to 1 s, reset by a success.
#[derive(Debug, Default)]
struct Backoff {
    failures: u64,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(10);
    const MAX: Duration = Duration::from_secs(1);

    fn failed(&mut self) -> Duration {
        let doublings = u32::try_from(self.failures.min(16)).unwrap_or(16);
        self.failures += 1;
        Self::FIRST.saturating_mul(1 << doublings).min(Self::MAX)
    }
}

/// What a reader that fell behind by `lost` records is told.
fn lost_line(lost: u64) -> Arc<str> {
    Arc::from(Record::stream_lost(lost).json())
}

/// Streams records to one client until it leaves, stops reading or the daemon stops. The
/// client never sends anything, so a readable socket means it closed (or misbehaves): either
/// way it is let go at once, with its slot.
async fn serve_client(
    stream: UnixStream,
    mut rx: broadcast::Receiver<Arc<str>>,
    _slot: OwnedSemaphorePermit,
) {
    let (mut from_client, mut to_client) = stream.into_split();
    let mut scratch = [0u8; 64];
    let mut line = Vec::new();
    loop {
        let record = tokio::select! {
            received = rx.recv() => match received {
                Ok(record) => record,
                Err(broadcast::error::RecvError::Lagged(n)) => lost_line(n),
                Err(broadcast::error::RecvError::Closed) => return,
            },
            // EOF, an error, or bytes a trace client never sends.
            _ = from_client.read(&mut scratch) => return,
        };
        line.clear();
        line.extend_from_slice(record.as_bytes());
        line.push(b'\n');
        match tokio::time::timeout(WRITE_TIMEOUT, to_client.write_all(&line)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return,
            Err(_) => {
                tracing::warn!(timeout = ?WRITE_TIMEOUT, "trace socket: dropping a client that stopped reading");
                return;
            }
        }
    }
}

#[cfg(test)]
#[path = "live_tests.rs"]
mod tests;
