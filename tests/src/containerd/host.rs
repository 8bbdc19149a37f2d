//! What the fixture does to the host and undoes: the lock that keeps fixtures one at a
//! time, mounts, the pods' bridge, leftover shims, cgroups.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};

pub(super) const CAP_SYS_RESOURCE: u32 = 24;

/// Whether this process's bounding set holds a capability. Some sandboxes (CI runners, this
/// project's build machines) drop CAP_SYS_RESOURCE, without which no process may lower an OOM
/// score: runc then fails the sandbox's `oom_score_adj = -998`. containerd's
/// `restrict_oom_score_adj` keeps scores at or above its own there, as it does when rootless.
pub fn has_capability(cap: u32) -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << cap) != 0)
}

/// One fixture at a time on the machine, across threads, test binaries and worktrees: they
/// share the pods' subnet, and the machine is small.
pub(super) struct FixtureLock(
    #[expect(dead_code, reason = "held open: the lock lives as long as the file")] std::fs::File,
);

impl FixtureLock {
    const PATH: &'static str = "/run/lock/node-agent-containerd-fixture.lock";
    const WAIT: Duration = Duration::from_secs(600);

    pub(super) fn acquire() -> anyhow::Result<Self> {
        use std::os::fd::AsRawFd as _;
        std::fs::create_dir_all("/run/lock")?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(Self::PATH)
            .with_context(|| format!("opening {}", Self::PATH))?;
        let deadline = Instant::now() + Self::WAIT;
        // SAFETY: flock on a descriptor we own.
        while unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            if Instant::now() > deadline {
                bail!(
                    "another containerd fixture held {} for {:?}",
                    Self::PATH,
                    Self::WAIT
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(Self(file))
    }
}

pub(super) fn which(tool: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// Removes a network link if it exists (the pods' bridge).
pub(super) fn delete_link(name: &str) {
    if Path::new("/sys/class/net").join(name).exists() {
        let status = Command::new("ip").args(["link", "delete", name]).status();
        if !matches!(status, Ok(s) if s.success()) {
            eprintln!("containerd fixture: could not delete link {name}: {status:?}");
        }
    }
}

pub(super) fn make_shared_mount(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    // SAFETY: mount(2) reads the NUL-terminated paths only; the other arguments are constants.
    let bind = unsafe {
        libc::mount(
            c.as_ptr(),
            c.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if bind != 0 {
        bail!(
            "bind-mounting {} onto itself: {}",
            dir.display(),
            std::io::Error::last_os_error()
        );
    }
    // SAFETY: as above.
    let shared = unsafe {
        libc::mount(
            std::ptr::null(),
            c.as_ptr(),
            std::ptr::null(),
            libc::MS_SHARED | libc::MS_REC,
            std::ptr::null(),
        )
    };
    if shared != 0 {
        bail!(
            "making {} a shared mount: {}",
            dir.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

pub(super) fn mount_tmpfs(at: &Path, bytes: u64) -> anyhow::Result<()> {
    let status = Command::new("mount")
        .args(["-t", "tmpfs", "-o"])
        .arg(format!("size={bytes},mode=0755"))
        .arg("node-agent-test")
        .arg(at)
        .status()
        .context("running mount")?;
    if !status.success() {
        bail!(
            "mounting a tmpfs of {bytes} bytes at {} failed ({status})",
            at.display()
        );
    }
    Ok(())
}

pub fn statvfs(path: &Path) -> anyhow::Result<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: statvfs writes into the zeroed struct we pass; the path is NUL-terminated.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        bail!(
            "statvfs {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
    }
    let frsize = s.f_frsize as u64;
    Ok((s.f_blocks as u64 * frsize, s.f_bavail as u64 * frsize))
}

/// containerd's shims outlive it by design; kill those started for this socket.
pub(super) fn kill_shims(socket: &Path) {
    let needle = socket.to_string_lossy().into_owned();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let args: Vec<String> = String::from_utf8_lossy(&cmdline)
            .split('\0')
            .map(str::to_string)
            .collect();
        let is_ours =
            args.first().is_some_and(|a| a.contains("containerd-shim")) && args.contains(&needle);
        if !is_ours {
            continue;
        }
        // SAFETY: sending a signal has no memory-safety preconditions.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        // A killed shim leaves its socket where containerd 1.6 always puts them:
        // /run/containerd/s/<sha256 of address/namespace/id> (runtime/v2/shim/util.go).
        let flag = |name: &str| {
            args.iter()
                .position(|a| a == name)
                .and_then(|i| args.get(i + 1))
                .cloned()
        };
        if let (Some(namespace), Some(id)) = (flag("-namespace"), flag("-id")) {
            use sha2::Digest as _;
            let key = Path::new(&needle).join(namespace).join(id);
            let digest = sha2::Sha256::digest(key.to_string_lossy().as_bytes());
            let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
            let _ = std::fs::remove_file(Path::new("/run/containerd/s").join(hex));
        }
    }
}

/// Every cgroup hierarchy's mount point (v1 controllers and v2).
pub(super) fn cgroup_mounts() -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fstype = right.split_whitespace().next()?;
            if fstype != "cgroup" && fstype != "cgroup2" {
                return None;
            }
            Some(PathBuf::from(left.split_whitespace().nth(4)?))
        })
        .collect()
}

/// Kills what is left in the test's cgroups and removes them in every hierarchy.
pub(super) fn remove_cgroups(name: &str) {
    for mount in cgroup_mounts() {
        let dir = mount.join(name);
        if dir.exists() {
            crate::remove_tree(&dir);
        }
    }
}

/// Lazily unmounts every mount at or below `dir`, deepest first (rootfs overlays, shm, the
/// small filesystem).
pub(super) fn unmount_below(dir: &Path) {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4).map(PathBuf::from))
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    for point in points {
        use std::os::unix::ffi::OsStrExt as _;
        let Ok(c) = std::ffi::CString::new(point.as_os_str().as_bytes()) else {
            continue;
        };
        // SAFETY: umount2 reads the NUL-terminated path only.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
            eprintln!(
                "containerd fixture: umount {}: {}",
                point.display(),
                std::io::Error::last_os_error()
            );
        }
    }
}
