//! Starting the sampler's timers: the cgroup iterator that runs the attach program on one
//! cgroup, on a thread pinned to the CPU a timer should live on.
//!
//! aya attaches iterators without link parameters, which a cgroup iterator refuses (it needs a
//! start cgroup and an order), so the link is created here with the two `bpf(2)` commands it
//! takes: `BPF_LINK_CREATE` with `bpf_iter_link_info.cgroup = { SELF_ONLY, dir fd }`, then
//! `BPF_ITER_CREATE`, whose `read()` runs the program once on that cgroup.

use std::{
    fs::File,
    io::Read as _,
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    },
    path::{Path, PathBuf},
};

use node_agent_common::SAMPLER_TIMERS;

/// `enum bpf_cmd` and `enum bpf_attach_type` values (include/uapi/linux/bpf.h).
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_ITER_CREATE: libc::c_long = 33;
const BPF_TRACE_ITER: u32 = 28;
const BPF_CGROUP_ITER_SELF_ONLY: u32 = 1;
/// `FILEID_KERNFS` (include/linux/exportfs.h): cgroupfs file handles are the kernfs node id,
/// which is the cgroup id.
const FILEID_KERNFS: libc::c_int = 0xfe;

/// Up to [`SAMPLER_TIMERS`] distinct CPUs this process may run on, lowest first.
pub(super) fn timer_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data that sched_getaffinity fills.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `cpu` is below CPU_SETSIZE.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .take(SAMPLER_TIMERS as usize)
        .collect()
}

/// Runs `f` on a thread pinned to `cpu` (on this thread if `None`), so that what `f` starts
/// in the kernel starts on that CPU; if pinning fails, unpinned.
pub(super) fn run_on<T: Send>(
    cpu: Option<usize>,
    f: impl FnOnce() -> Result<T, (&'static str, std::io::Error)> + Send,
) -> Result<T, (&'static str, std::io::Error)> {
    let Some(cpu) = cpu else {
        return f();
    };
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                // SAFETY: cpu_set_t is plain data; CPU_SET stays within it for cpu < CPU_SETSIZE.
                let pinned = unsafe {
                    let mut one: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(cpu, &mut one);
                    libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one)
                };
                if pinned != 0 {
                    // The CPU went offline or left the agent's cpuset since it was chosen: the
                    // timer then starts wherever this thread runs, which only weakens the
                    // spread, never the sampling.
                    tracing::debug!(
                        cpu,
                        error = %std::io::Error::last_os_error(),
                        "could not pin the thread starting a sampler timer"
                    );
                }
                f()
            })
            .join()
            .unwrap_or_else(|_| {
                Err((
                    "starting a sampler timer",
                    std::io::Error::other("the thread running the iterator panicked"),
                ))
            })
    })
}

/// Opens a cgroup directory from its id: a kernfs file handle on the hierarchy's mount, which
/// needs `CAP_DAC_READ_SEARCH`; without it (the DaemonSet grants only BPF and PERFMON), the
/// directory under the mount whose inode is the id (a cgroup's id is its directory's inode
/// number on 64-bit kernels, v1 and v2 alike), found by a bounded walk.
pub(super) fn open_cgroup(
    mount: &File,
    mount_path: &Path,
    cgroup: u64,
) -> std::io::Result<OwnedFd> {
    match open_by_handle(mount, cgroup) {
        Ok(fd) => Ok(fd),
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
            let dir = find_by_inode(mount_path, cgroup)?.ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!(
                        "no directory with inode {cgroup} under {} (opening it by handle needs CAP_DAC_READ_SEARCH: {e})",
                        mount_path.display()
                    ),
                )
            })?;
            let file = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
                .open(&dir)?;
            Ok(OwnedFd::from(file))
        }
        Err(e) => Err(e),
    }
}

/// How many directories the walk reads at most (a node's cgroup tree holds a few thousand).
const WALK_LIMIT: usize = 100_000;

/// The directory under `root` (itself included) whose inode is `inode`, breadth first.
fn find_by_inode(root: &Path, inode: u64) -> std::io::Result<Option<PathBuf>> {
    let mut queue = std::collections::VecDeque::from([root.to_path_buf()]);
    let mut seen = 0usize;
    while let Some(dir) = queue.pop_front() {
        seen += 1;
        if seen > WALK_LIMIT {
            return Ok(None);
        }
        let Ok(meta) = std::fs::metadata(&dir) else {
            continue;
        };
        if meta.ino() == inode {
            return Ok(Some(dir));
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                queue.push_back(entry.path());
            }
        }
    }
    Ok(None)
}

fn open_by_handle(mount: &File, cgroup: u64) -> std::io::Result<OwnedFd> {
    #[repr(C)]
    struct KernfsHandle {
        handle_bytes: u32,
        handle_type: libc::c_int,
        id: u64,
    }
    let mut handle = KernfsHandle {
        handle_bytes: 8,
        handle_type: FILEID_KERNFS,
        id: cgroup,
    };
    // SAFETY: `handle` has the layout of `struct file_handle` with an 8-byte payload; the kernel
    // reads `handle_bytes` bytes after the header and nothing else.
    let fd = unsafe {
        libc::open_by_handle_at(
            mount.as_raw_fd(),
            (&mut handle as *mut KernfsHandle).cast(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor the kernel just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Creates a cgroup iterator link on `dir` (that cgroup only) and runs it once.
pub(super) fn run_cgroup_iterator(
    prog_fd: libc::c_int,
    dir: &OwnedFd,
) -> Result<(), (&'static str, std::io::Error)> {
    /// `union bpf_iter_link_info`, its `cgroup` member.
    #[repr(C)]
    struct IterCgroup {
        order: u32,
        cgroup_fd: u32,
        cgroup_id: u64,
    }
    /// `union bpf_attr`, its `link_create` member with `iter_info`, zero-padded to the size
    /// of the kernel's union so that every field we do not set is 0.
    #[repr(C, align(8))]
    struct LinkCreate {
        prog_fd: u32,
        target_fd: u32,
        attach_type: u32,
        flags: u32,
        iter_info: u64,
        iter_info_len: u32,
        _rest: [u8; 100],
    }
    let info = IterCgroup {
        order: BPF_CGROUP_ITER_SELF_ONLY,
        cgroup_fd: dir.as_raw_fd() as u32,
        cgroup_id: 0,
    };
    let attr = LinkCreate {
        prog_fd: prog_fd as u32,
        target_fd: 0,
        attach_type: BPF_TRACE_ITER,
        flags: 0,
        iter_info: &info as *const IterCgroup as u64,
        iter_info_len: std::mem::size_of::<IterCgroup>() as u32,
        _rest: [0; 100],
    };
    let link = bpf(BPF_LINK_CREATE, &attr).map_err(|e| ("creating the link", e))?;
    #[repr(C, align(8))]
    struct IterCreate {
        link_fd: u32,
        flags: u32,
        _rest: [u8; 8],
    }
    let create = IterCreate {
        link_fd: link.as_raw_fd() as u32,
        flags: 0,
        _rest: [0; 8],
    };
    let iter = bpf(BPF_ITER_CREATE, &create).map_err(|e| ("creating the iterator", e))?;
    let mut file = File::from(iter);
    let mut out = Vec::new();
    file.read_to_end(&mut out)
        .map_err(|e| ("running the iterator", e))?;
    Ok(())
}

/// `bpf(2)` with an attribute struct; returns the new file descriptor.
fn bpf<T>(cmd: libc::c_long, attr: &T) -> std::io::Result<OwnedFd> {
    // SAFETY: `attr` is a fully initialised `union bpf_attr` prefix of `size_of::<T>()` bytes;
    // the kernel only reads it (and the memory its pointers name, which outlives the call).
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *const T,
            std::mem::size_of::<T>(),
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = libc::c_int::try_from(r)
        .map_err(|_| std::io::Error::other("bpf(2) returned an out-of-range descriptor"))?;
    // SAFETY: a new descriptor the kernel just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
