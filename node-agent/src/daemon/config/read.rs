//! Reading a config file from disk: a regular file, capped in size, read once.

use std::{
    io::Read,
    os::unix::fs::{FileTypeExt, OpenOptionsExt},
    path::Path,
};

/// The most a config file may hold. A ConfigMap holds at most 1 MiB of data (the API server's
/// limit on the object), so a mounted config is never larger, and the agent's whole config is
/// a few kilobytes: a file past this is the wrong file (a log, an image, `/dev/zero`), and
/// reading it whole would spend the agent's memory (its limit is 256Mi) before anything says
/// so. The kubelet's config file, read for the comparison of thresholds, has the same cap.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Why a config file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("not a regular file but {0}")]
    NotRegular(&'static str),
    #[error("larger than {limit} bytes, more than any config (a ConfigMap holds at most 1 MiB)")]
    TooLarge { limit: u64 },
    #[error("not UTF-8 text")]
    NotText,
}

impl ReadError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, ReadError::Io(e) if e.kind() == std::io::ErrorKind::NotFound)
    }
}

/// What a file that is not a regular one is.
fn kind(file_type: std::fs::FileType) -> Option<&'static str> {
    if file_type.is_file() {
        None
    } else if file_type.is_dir() {
        Some("a directory")
    } else if file_type.is_fifo() {
        Some("a FIFO (reading one would wait for a writer)")
    } else if file_type.is_socket() {
        Some("a socket")
    } else if file_type.is_char_device() || file_type.is_block_device() {
        Some("a device")
    } else {
        Some("neither a file nor a directory")
    }
}

/// The whole text of the regular file at `path` (symbolic links followed, as a ConfigMap's
/// mount needs), at most `limit` bytes. A FIFO, device, socket or directory is refused without
/// waiting on it: it is looked at before it is opened, and opened without blocking and looked
/// at again, in case it was swapped in between.
pub fn read_capped(path: &Path, limit: u64) -> Result<String, ReadError> {
    if let Some(kind) = kind(std::fs::metadata(path)?.file_type()) {
        return Err(ReadError::NotRegular(kind));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    if let Some(kind) = kind(file.metadata()?.file_type()) {
        return Err(ReadError::NotRegular(kind));
    }
    let mut bytes = Vec::new();
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(ReadError::TooLarge { limit });
    }
    String::from_utf8(bytes).map_err(|_| ReadError::NotText)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_regular_file_within_the_cap_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let at = |name: &str| dir.path().join(name);
        std::fs::write(at("ok.yaml"), "kind: x\n").unwrap();
        std::fs::write(at("big.yaml"), vec![b'#'; 1025]).unwrap();
        std::fs::write(at("edge.yaml"), vec![b'#'; 1024]).unwrap();
        std::fs::write(at("binary"), [0xff, 0xfe, 0x00]).unwrap();
        std::os::unix::fs::symlink(at("ok.yaml"), at("link.yaml")).unwrap();
        let fifo = std::ffi::CString::new(at("fifo").to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let socket = std::os::unix::net::UnixListener::bind(at("socket")).unwrap();

        let read = |name: &str| read_capped(&at(name), 1024).map_err(|e| e.to_string());
        assert_eq!(read("ok.yaml").as_deref(), Ok("kind: x\n"));
        assert_eq!(
            read("link.yaml").as_deref(),
            Ok("kind: x\n"),
            "a ConfigMap mount's symlink"
        );
        assert_eq!(read("edge.yaml").map(|t| t.len()), Ok(1024));
        #[rustfmt::skip]
        let refused: &[(&str, &str)] = &[
            ("big.yaml", "larger than 1024 bytes"),
            ("binary", "not UTF-8 text"),
            // Returns at once: nothing waits for a writer that never comes.
            ("fifo", "not a regular file but a FIFO"),
            ("socket", "not a regular file but a socket"),
            ("", "not a regular file but a directory"),
            ("absent.yaml", "No such file"),
        ];
        for (name, needle) in refused {
            let error = read(name).expect_err(name);
            assert!(error.contains(needle), "{name}: {error}");
        }
        assert!(read_capped(Path::new("/dev/zero"), 1024)
            .unwrap_err()
            .to_string()
            .contains("a device"));
        assert!(read_capped(&at("absent.yaml"), 1)
            .unwrap_err()
            .is_not_found());
        drop(socket);
    }
}
