//! Reading a config file from disk: a regular file, capped in size, read once. The agent's own
//! file (at start, by the reload watcher, by `check-config`) and the kubelet's are read here,
//! in the helper process ([`super::ask`]) where the file may hang.

use std::{
    io::Read as _,
    os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
    time::Duration,
};

/// The largest config file read. A ConfigMap holds at most 1 MiB of data (the API server's
/// limit on the object), so nothing larger can be a config the cluster delivered, and the
/// agent's whole config is a few kilobytes: a file past this is the wrong file (a log, an
/// image, `/dev/zero`), and reading it whole would spend the agent's memory (its limit is
/// 256Mi) before anything says so.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Why the file could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    #[error("reading config file {path}: {error}")]
    Io { path: PathBuf, error: String },
    /// A shortage of the moment in the agent or the kernel (out of descriptors or memory,
    /// interrupted), not a fault of the file: the same reading later may well succeed.
    #[error("reading config file {path}: {error} (a shortage of the moment, not the file's fault: read again shortly)")]
    Transient { path: PathBuf, error: String },
    #[error("config file {path} is not a regular file ({kind}): refusing to read it")]
    NotAFile { path: PathBuf, kind: &'static str },
    #[error("config file {path} is larger than {max} bytes")]
    TooLarge { path: PathBuf, max: u64 },
    #[error("config file {path} did not stay the same across readings {settle:?} apart: not applied while it is being written")]
    Unsettled { path: PathBuf, settle: Duration },
}

/// Whether an I/O error is a shortage of the moment rather than anything about the file: out
/// of descriptors (the process's or the system's), of kernel memory or buffers, or interrupted.
pub fn is_transient(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::ENOBUFS | libc::EAGAIN | libc::EINTR
        )
    )
}

impl ReadError {
    /// A shortage of the moment: not a refusal of the file, read again shortly.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Transient { .. })
    }
}

/// What a file that is not a regular one is.
fn kind(file_type: std::fs::FileType) -> Option<&'static str> {
    if file_type.is_file() {
        None
    } else if file_type.is_dir() {
        Some("a directory")
    } else if file_type.is_fifo() {
        Some("a FIFO")
    } else if file_type.is_socket() {
        Some("a socket")
    } else if file_type.is_char_device() || file_type.is_block_device() {
        Some("a device")
    } else {
        Some("not a file")
    }
}

/// Reads the whole file, at most [`MAX_CONFIG_BYTES`], refusing anything but a regular file
/// (symbolic links followed, as a ConfigMap's mount needs). A FIFO, device, socket or
/// directory is refused without waiting on it: its type is looked at before it is opened
/// (opening a FIFO would block until a writer comes), and it is opened without blocking and
/// looked at again, in case it was swapped in between.
pub fn read_capped(path: &Path) -> Result<Vec<u8>, ReadError> {
    let io = |e: std::io::Error| {
        let (path, error) = (path.to_path_buf(), e.to_string());
        if is_transient(&e) {
            ReadError::Transient { path, error }
        } else {
            ReadError::Io { path, error }
        }
    };
    let not_a_file = |kind| ReadError::NotAFile {
        path: path.to_path_buf(),
        kind,
    };
    if let Some(kind) = kind(std::fs::metadata(path).map_err(io)?.file_type()) {
        return Err(not_a_file(kind));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(io)?;
    if let Some(kind) = kind(file.metadata().map_err(io)?.file_type()) {
        return Err(not_a_file(kind));
    }
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(ReadError::TooLarge {
            path: path.to_path_buf(),
            max: MAX_CONFIG_BYTES,
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shortage_of_the_moment_is_told_apart_from_the_files_fault() {
        let rows = [
            (libc::EMFILE, true),
            (libc::ENFILE, true),
            (libc::ENOMEM, true),
            (libc::EINTR, true),
            (libc::ENOENT, false),
            (libc::EACCES, false),
            (libc::EISDIR, false),
        ];
        for (errno, transient) in rows {
            let e = std::io::Error::from_raw_os_error(errno);
            assert_eq!(is_transient(&e), transient, "{e}");
        }
    }

    #[test]
    fn only_a_regular_file_within_the_cap_is_read_and_nothing_waits() {
        let dir = tempfile::tempdir().unwrap();
        let at = |name: &str| dir.path().join(name);
        std::fs::write(at("ok.yaml"), "kind: x\n").unwrap();
        std::fs::write(at("big.yaml"), vec![b'#'; MAX_CONFIG_BYTES as usize + 1]).unwrap();
        std::fs::write(at("edge.yaml"), vec![b'#'; MAX_CONFIG_BYTES as usize]).unwrap();
        std::os::unix::fs::symlink(at("ok.yaml"), at("link.yaml")).unwrap();
        let fifo = std::ffi::CString::new(at("fifo").to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let socket = std::os::unix::net::UnixListener::bind(at("socket")).unwrap();

        let read = |path: &Path| read_capped(path).map_err(|e| e.to_string());
        assert_eq!(read(&at("ok.yaml")), Ok(b"kind: x\n".to_vec()));
        assert_eq!(
            read(&at("link.yaml")),
            Ok(b"kind: x\n".to_vec()),
            "a ConfigMap mount's symlink"
        );
        assert_eq!(
            read(&at("edge.yaml")).map(|t| t.len()),
            Ok(MAX_CONFIG_BYTES as usize)
        );
        #[rustfmt::skip]
        let refused: &[(PathBuf, &str)] = &[
            (at("big.yaml"), "is larger than 1048576 bytes"),
            // Returns at once: nothing waits for a writer that never comes.
            (at("fifo"), "is not a regular file (a FIFO)"),
            (at("socket"), "is not a regular file (a socket)"),
            (dir.path().to_path_buf(), "is not a regular file (a directory)"),
            (PathBuf::from("/dev/zero"), "is not a regular file (a device)"),
            (at("absent.yaml"), "No such file"),
        ];
        for (path, needle) in refused {
            let error = read(path).expect_err(&path.display().to_string());
            assert!(error.contains(needle), "{}: {error}", path.display());
        }
        drop(socket);
    }
}
