//! A filesystem whose `statfs` never answers, as a hung NFS server or a stuck FUSE daemon would
//! leave one: a FUSE server of the test's own, speaking the kernel's FUSE protocol on
//! `/dev/fuse` (no libfuse), mounted by root. The root directory answers `stat` (so a path on it
//! looks fine to a config check); every `statfs` is read and never answered. Mounted with
//! [`HungFs::mount_hung_stat`], `stat` is never answered either: every call hangs.
//!
//! Dropping it stops the server: closing `/dev/fuse` aborts the connection, which fails every
//! request still waiting (the hung `statfs` returns an error to whoever made it), then the
//! mount is lazily detached and its directory removed.

use std::{
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    thread::JoinHandle,
};

use anyhow::Context as _;

const FUSE_LOOKUP: u32 = 1;
const FUSE_FORGET: u32 = 2;
const FUSE_GETATTR: u32 = 3;
const FUSE_STATFS: u32 = 17;
const FUSE_INIT: u32 = 26;
const FUSE_INTERRUPT: u32 = 36;
const FUSE_DESTROY: u32 = 38;
const FUSE_BATCH_FORGET: u32 = 42;
const IN_HEADER: usize = 40;

pub struct HungFs {
    dir: PathBuf,
    stop: Arc<AtomicBool>,
    statfs_seen: Arc<AtomicUsize>,
    getattr_seen: Arc<AtomicUsize>,
    server: Option<JoinHandle<()>>,
}

impl HungFs {
    /// Mounts it on a new directory `dir`.
    pub fn mount(dir: &Path) -> anyhow::Result<Self> {
        Self::mount_with(dir, false)
    }

    /// Mounts it on a new directory `dir`, `stat` of it hanging too (never call it from the
    /// test: it waits until the filesystem is dropped).
    pub fn mount_hung_stat(dir: &Path) -> anyhow::Result<Self> {
        Self::mount_with(dir, true)
    }

    fn mount_with(dir: &Path, stat_hangs: bool) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let path = c"/dev/fuse";
        // SAFETY: a valid NUL-terminated path; the descriptor is owned below.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        anyhow::ensure!(
            fd >= 0,
            "open /dev/fuse: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: `fd` was just opened and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let target = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())?;
        let options = std::ffi::CString::new(format!(
            "fd={},rootmode=40000,user_id=0,group_id=0",
            fd.as_raw_fd()
        ))?;
        // SAFETY: valid NUL-terminated strings; mount(2) reads them only.
        let rc = unsafe {
            libc::mount(
                c"node-agent-hung".as_ptr(),
                target.as_ptr(),
                c"fuse".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                options.as_ptr().cast(),
            )
        };
        anyhow::ensure!(
            rc == 0,
            "mount a FUSE filesystem on {}: {}",
            dir.display(),
            std::io::Error::last_os_error()
        );
        let stop = Arc::new(AtomicBool::new(false));
        let statfs_seen = Arc::new(AtomicUsize::new(0));
        let getattr_seen = Arc::new(AtomicUsize::new(0));
        let server = std::thread::Builder::new()
            .name("hung-fs".into())
            .spawn({
                let (stop, seen) = (stop.clone(), statfs_seen.clone());
                let getattr = stat_hangs.then(|| getattr_seen.clone());
                move || serve(fd, &stop, &seen, getattr.as_deref())
            })
            .context("starting the FUSE server")?;
        Ok(Self {
            dir: dir.to_path_buf(),
            stop,
            statfs_seen,
            getattr_seen,
            server: Some(server),
        })
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// How many `statfs` calls are waiting for an answer that never comes.
    pub fn statfs_waiting(&self) -> usize {
        self.statfs_seen.load(Ordering::SeqCst)
    }

    /// How many `stat` calls are waiting (mounted with [`HungFs::mount_hung_stat`]).
    pub fn stat_waiting(&self) -> usize {
        self.getattr_seen.load(Ordering::SeqCst)
    }
}

impl Drop for HungFs {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(server) = self.server.take() {
            let _ = server.join();
        }
        if let Ok(target) = std::ffi::CString::new(self.dir.as_os_str().as_encoded_bytes()) {
            // SAFETY: a valid NUL-terminated path.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn reply(fd: &OwnedFd, unique: u64, error: i32, body: &[u8]) {
    let mut out = Vec::with_capacity(16 + body.len());
    out.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
    out.extend_from_slice(&error.to_ne_bytes());
    out.extend_from_slice(&unique.to_ne_bytes());
    out.extend_from_slice(body);
    // SAFETY: writes `out` to the device; a failure (the connection aborted) is ignored.
    unsafe { libc::write(fd.as_raw_fd(), out.as_ptr().cast(), out.len()) };
}

fn init_out(major: u32, minor: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(64);
    b.extend_from_slice(&major.to_ne_bytes());
    b.extend_from_slice(&minor.min(31).to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes()); // max_readahead
    b.extend_from_slice(&0u32.to_ne_bytes()); // flags
    b.extend_from_slice(&16u16.to_ne_bytes()); // max_background
    b.extend_from_slice(&16u16.to_ne_bytes()); // congestion_threshold
    b.extend_from_slice(&4096u32.to_ne_bytes()); // max_write
    b.extend_from_slice(&1u32.to_ne_bytes()); // time_gran
    b.resize(64, 0);
    b
}

/// `fuse_attr_out` for the root directory, valid for an hour.
fn root_attr() -> Vec<u8> {
    let mut b = Vec::with_capacity(104);
    b.extend_from_slice(&3600u64.to_ne_bytes()); // attr_valid
    b.extend_from_slice(&0u32.to_ne_bytes()); // attr_valid_nsec
    b.extend_from_slice(&0u32.to_ne_bytes()); // dummy
    b.extend_from_slice(&1u64.to_ne_bytes()); // ino
    b.extend_from_slice(&[0u8; 5 * 8]); // size, blocks, atime, mtime, ctime
    b.extend_from_slice(&[0u8; 3 * 4]); // atimensec, mtimensec, ctimensec
    b.extend_from_slice(&(libc::S_IFDIR | 0o755).to_ne_bytes()); // mode
    b.extend_from_slice(&2u32.to_ne_bytes()); // nlink
    b.extend_from_slice(&[0u8; 4 * 4]); // uid, gid, rdev, blksize
    b.extend_from_slice(&0u32.to_ne_bytes()); // flags
    b
}

/// `getattr_hangs`: `stat` is read, counted there, and never answered.
fn serve(
    fd: OwnedFd,
    stop: &AtomicBool,
    statfs_seen: &AtomicUsize,
    getattr_hangs: Option<&AtomicUsize>,
) {
    let mut buf = vec![0u8; 1 << 17];
    while !stop.load(Ordering::SeqCst) {
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, 100) } <= 0 {
            continue;
        }
        // SAFETY: reads at most `buf.len()` bytes into `buf`.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < IN_HEADER as isize {
            if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENODEV) {
                return;
            }
            continue;
        }
        let req = &buf[..n as usize];
        let (opcode, unique) = (u32_at(req, 4), u64_at(req, 8));
        match opcode {
            FUSE_INIT => reply(
                &fd,
                unique,
                0,
                &init_out(u32_at(req, IN_HEADER), u32_at(req, IN_HEADER + 4)),
            ),
            FUSE_GETATTR => match getattr_hangs {
                Some(seen) => {
                    seen.fetch_add(1, Ordering::SeqCst);
                }
                None => reply(&fd, unique, 0, &root_attr()),
            },
            FUSE_LOOKUP => reply(&fd, unique, -libc::ENOENT, &[]),
            // Read, never answered: the caller waits until the connection is aborted.
            FUSE_STATFS => {
                statfs_seen.fetch_add(1, Ordering::SeqCst);
            }
            FUSE_FORGET | FUSE_BATCH_FORGET | FUSE_INTERRUPT => {}
            FUSE_DESTROY => {
                reply(&fd, unique, 0, &[]);
                return;
            }
            _ => reply(&fd, unique, -libc::ENOSYS, &[]),
        }
    }
    // Dropping `fd` closes the device: the kernel aborts the connection.
}
