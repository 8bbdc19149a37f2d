//! The trace socket over real Unix sockets in a temporary directory.

use std::{
    os::unix::fs::{FileTypeExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use tokio::{io::AsyncReadExt as _, net::UnixStream, time::timeout};

use super::{Backoff, Live, LiveError, MAX_CLIENTS};
use crate::trace::Record;

/// Every wait of a test ends within this or the test fails.
const STEP: Duration = Duration::from_secs(5);

fn socket_in(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("trace.sock")
}

fn record(lost: u64) -> Record {
    Record::EventsLost {
        time: String::new(),
        lost,
        total_per_cpu: Vec::new(),
    }
}

/// Sockets in this network namespace named `path`: the listener, plus one per connection the
/// server side still holds (accepted or waiting to be), whether or not its client is gone.
fn server_side_sockets(path: &Path) -> usize {
    let table = std::fs::read_to_string("/proc/net/unix").expect("/proc/net/unix");
    let name = path.to_str().expect("UTF-8 temp path");
    table
        .lines()
        .filter(|line| line.split_whitespace().nth(7) == Some(name))
        .count()
}

/// Polls `check` every 10 ms until it holds; false if it still does not after [`STEP`].
async fn eventually(mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + STEP;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    check()
}

/// Whether the server closed `stream` within `wait` (an open idle client reads nothing).
async fn closed_by_server(stream: &mut UnixStream, wait: Duration) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        timeout(wait, stream.read(&mut byte)).await,
        Ok(Ok(0) | Err(_))
    )
}

async fn read_line(stream: &mut UnixStream) -> String {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.last() != Some(&b'\n') {
        let n = timeout(STEP, stream.read(&mut byte))
            .await
            .expect("a line within the step bound")
            .expect("read");
        assert_eq!(n, 1, "stream ended mid-line: {line:?}");
        line.push(byte[0]);
    }
    String::from_utf8(line).expect("UTF-8")
}

#[tokio::test]
async fn the_socket_is_mode_0600_whatever_the_umask() {
    // The umask is the process's: this is the only test that changes it, and it restores it.
    // Other tests creating files meanwhile only get other modes, which none of them checks.
    for umask in [0o000, 0o022, 0o277] {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = socket_in(&dir);
        // SAFETY: umask only swaps the process's file mode mask.
        let previous = unsafe { libc::umask(umask) };
        let bound = Live::bind(&path).await;
        // SAFETY: as above.
        unsafe { libc::umask(previous) };
        let (_live, _task) = bound.expect("bind");
        let meta = std::fs::symlink_metadata(&path).expect("socket exists");
        assert!(meta.file_type().is_socket());
        assert_eq!(
            meta.permissions().mode() & 0o7777,
            0o600,
            "umask {umask:03o}: only the agent's user may connect"
        );
    }
}

#[tokio::test]
async fn what_is_not_a_stale_socket_is_never_replaced() {
    let dir = tempfile::tempdir().expect("tempdir");
    let target = dir.path().join("precious.txt");
    std::fs::write(&target, "keep me").expect("write");

    let file = dir.path().join("file");
    std::fs::write(&file, "keep me too").expect("write");
    let directory = dir.path().join("directory");
    std::fs::create_dir(&directory).expect("mkdir");
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    let fifo = dir.path().join("fifo");
    let status = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(status.success(), "mkfifo");

    for (path, kind) in [
        (&file, "a regular file"),
        (&directory, "a directory"),
        (&link, "a symbolic link"),
        (&fifo, "a FIFO"),
    ] {
        let before = std::fs::symlink_metadata(path).expect("exists").file_type();
        match Live::bind(path).await {
            Err(error @ LiveError::NotASocket { .. }) => {
                let text = error.to_string();
                assert!(
                    text.contains(&path.display().to_string()) && text.contains(kind),
                    "{text}"
                );
            }
            Err(other) => panic!("{}: expected NotASocket, got {other}", path.display()),
            Ok(_) => panic!("{} was replaced by a socket", path.display()),
        }
        let after = std::fs::symlink_metadata(path)
            .expect("still there")
            .file_type();
        assert_eq!(before, after, "{} untouched", path.display());
    }
    assert_eq!(std::fs::read_to_string(&file).expect("read"), "keep me too");
    assert_eq!(std::fs::read_to_string(&target).expect("read"), "keep me");
}

#[tokio::test]
async fn paths_that_are_empty_relative_or_too_long_are_refused() {
    let long = PathBuf::from(format!("/tmp/{}.sock", "x".repeat(120)));
    for (path, expected) in [
        (PathBuf::new(), "empty"),
        (PathBuf::from("trace.sock"), "must be absolute"),
        (long, "at most 107 bytes"),
    ] {
        match Live::bind(&path).await {
            Err(error) => assert!(error.to_string().contains(expected), "{path:?}: {error}"),
            Ok(_) => panic!("{path:?} was accepted"),
        }
    }
    assert!(
        !Path::new("trace.sock").exists(),
        "nothing created in the working directory"
    );
}

#[tokio::test]
async fn a_stale_socket_is_replaced_and_a_live_one_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = socket_in(&dir);
    // A crashed agent leaves its socket file behind: nobody listens on it any more.
    drop(std::os::unix::net::UnixListener::bind(&path).expect("stale socket"));
    assert!(path.exists());

    let (live, _task) = Live::bind(&path)
        .await
        .expect("the stale socket is replaced");
    let mut client = UnixStream::connect(&path).await.expect("connect");
    assert!(
        eventually(|| live.tx.receiver_count() == 1).await,
        "accepted"
    );
    live.publish(&record(7));
    assert!(read_line(&mut client).await.contains("\"lost\":7"));

    match Live::bind(&path).await {
        Err(LiveError::InUse { path: shown }) => assert_eq!(shown, path.display().to_string()),
        Err(other) => panic!("expected InUse, got {other}"),
        Ok(_) => panic!("a second agent took over a live socket"),
    }
}

#[tokio::test]
async fn clients_that_leave_are_let_go_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = socket_in(&dir);
    let (_live, _task) = Live::bind(&path).await.expect("bind");

    let mut clients = Vec::new();
    for _ in 0..10 {
        clients.push(UnixStream::connect(&path).await.expect("connect"));
    }
    assert!(
        eventually(|| server_side_sockets(&path) == 11).await,
        "10 clients held"
    );
    // No record is published: only noticing the hang-up itself frees the descriptors.
    drop(clients);
    assert!(
        eventually(|| server_side_sockets(&path) == 1).await,
        "descriptors of departed clients still held: {} sockets",
        server_side_sockets(&path)
    );
}

#[tokio::test]
async fn at_most_max_clients_are_served_and_a_freed_slot_is_reused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = socket_in(&dir);
    let (live, _task) = Live::bind(&path).await.expect("bind");

    let mut served = Vec::new();
    for _ in 0..MAX_CLIENTS {
        served.push(UnixStream::connect(&path).await.expect("connect"));
    }
    assert!(eventually(|| live.tx.receiver_count() == MAX_CLIENTS).await);
    for n in 0..4 {
        let mut extra = UnixStream::connect(&path).await.expect("connect");
        assert!(
            closed_by_server(&mut extra, STEP).await,
            "client {} over the limit is closed",
            MAX_CLIENTS + n + 1
        );
    }
    live.publish(&record(1));
    for client in &mut served {
        assert!(read_line(client).await.contains("\"lost\":1"));
    }

    drop(served.pop());
    assert!(eventually(|| live.tx.receiver_count() == MAX_CLIENTS - 1).await);
    let mut newcomer = UnixStream::connect(&path).await.expect("connect");
    assert!(
        eventually(|| live.tx.receiver_count() == MAX_CLIENTS).await,
        "the freed slot takes a new client"
    );
    live.publish(&record(2));
    assert!(read_line(&mut newcomer).await.contains("\"lost\":2"));
}

#[test]
fn accept_failures_back_off_exponentially_to_a_second() {
    let mut backoff = Backoff::default();
    let waits: Vec<u128> = (0..10).map(|_| backoff.failed().as_millis()).collect();
    assert_eq!(waits, [10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000]);
    for _ in 0..100 {
        assert_eq!(backoff.failed(), Duration::from_secs(1), "never past 1 s");
    }
}
