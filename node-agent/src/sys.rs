//! Small facts about the running system shared by `trace` and the daemon: clocks (kernel event
//! timestamps are CLOCK_MONOTONIC), the page size, and the kernel's PID limit; and the
//! scheduling request of the threads that wait for kernel events.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum SysError {
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: expected a number, found {found:?}")]
    NotANumber { path: PathBuf, found: String },
}

fn clock_ns(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only `ts`; both clocks always exist on Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
}

/// CLOCK_MONOTONIC now: the clock of `bpf_ktime_get_ns()`.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC) as u64
}

/// Wall-clock time of a kernel timestamp, as RFC 3339.
pub fn ktime_rfc3339(ktime_ns: u64) -> String {
    let offset = clock_ns(libc::CLOCK_REALTIME) - clock_ns(libc::CLOCK_MONOTONIC);
    format_rfc3339(i128::from(ktime_ns) + offset)
}

/// Now, as RFC 3339.
pub fn now_rfc3339() -> String {
    format_rfc3339(clock_ns(libc::CLOCK_REALTIME))
}

/// `2026-11-22T00:21:48.123456Z` from nanoseconds since the epoch (UTC, proleptic Gregorian).
pub fn format_rfc3339(ns: i128) -> String {
    let secs = ns.div_euclid(1_000_000_000) as i64;
    let micros = (ns.rem_euclid(1_000_000_000) / 1000) as i64;
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{micros:06}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

/// The page size in bytes (page counters and RSS figures count pages).
pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 {
        size as u64
    } else {
        4096
    }
}

/// min(pid_max, threads-max): the PID limit the kubelet's `pid.available` is measured against.
pub fn pid_limit() -> Result<i64, SysError> {
    pid_limit_with(&|p| std::fs::read_to_string(p))
}

/// [`pid_limit`], each file read through `read_file` (held open by the daemon: [`HeldFiles`]).
pub fn pid_limit_with(
    read_file: &dyn Fn(&std::path::Path) -> std::io::Result<String>,
) -> Result<i64, SysError> {
    let read = |path: &str| -> Result<i64, SysError> {
        let text = read_file(std::path::Path::new(path)).map_err(|source| SysError::Read {
            path: path.into(),
            source,
        })?;
        text.trim().parse().map_err(|_| SysError::NotANumber {
            path: path.into(),
            found: text.trim().to_string(),
        })
    };
    Ok(read("/proc/sys/kernel/pid_max")?.min(read("/proc/sys/kernel/threads-max")?))
}

/// Files the daemon reads again and again (`/proc/meminfo`, the node's and the pods cgroup's
/// memory files, the PID limits): each opened once and read from its start every time
/// (`pread`; procfs and cgroupfs files are generated anew at offset 0), so that a shortage of
/// descriptors (`EMFILE`) never blinds a signal that could be read before it. A descriptor that
/// stops answering (its cgroup removed and made again) is dropped and the file opened anew.
#[derive(Debug, Default)]
pub struct HeldFiles {
    files: std::cell::RefCell<std::collections::HashMap<PathBuf, std::fs::File>>,
}

impl HeldFiles {
    /// The most files held: the daemon reads a handful; a path past them is read as usual.
    const MAX: usize = 32;
    /// The most read of one file: these hold a few kilobytes.
    const MAX_BYTES: usize = 1 << 20;

    /// The whole file, through its held descriptor (opened, and held, the first time). The
    /// path is looked up each time (`stat`, which needs no descriptor): a file replaced, or a
    /// cgroup removed and made again, is opened anew.
    pub fn read(&self, path: &std::path::Path) -> std::io::Result<String> {
        use std::os::unix::fs::MetadataExt as _;
        let mut files = self.files.borrow_mut();
        let now = std::fs::metadata(path)?;
        if let Some(file) = files.get(path) {
            let same = file
                .metadata()
                .is_ok_and(|held| (held.dev(), held.ino()) == (now.dev(), now.ino()));
            match read_from_start(file) {
                Ok(text) if same => return Ok(text),
                _ => {
                    files.remove(path);
                }
            }
        }
        let file = std::fs::File::open(path)?;
        let text = read_from_start(&file)?;
        if files.len() < Self::MAX {
            files.insert(path.to_path_buf(), file);
        }
        Ok(text)
    }

    /// How many descriptors are held.
    pub fn held(&self) -> usize {
        self.files.borrow().len()
    }
}

fn read_from_start(file: &std::fs::File) -> std::io::Result<String> {
    use std::os::unix::fs::FileExt as _;
    let mut bytes = vec![0u8; 4096];
    let mut len = 0;
    loop {
        if len == bytes.len() {
            if len >= HeldFiles::MAX_BYTES {
                return Err(std::io::Error::other("larger than 1 MiB"));
            }
            bytes.resize(len * 2, 0);
        }
        match file.read_at(&mut bytes[len..], len as u64) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    bytes.truncate(len);
    String::from_utf8(bytes).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// The time slice the threads waiting for kernel events ask for: the shortest the kernel
/// grants a fair task (`sched_attr.sched_runtime` is clamped to 100 µs ..= 100 ms).
pub const EVENT_THREAD_SLICE_NS: u64 = 100_000;

/// `struct sched_attr` up to `sched_period` (SCHED_ATTR_SIZE_VER0, include/uapi/linux/sched/types.h).
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
}

/// The calling thread's scheduling attributes.
fn sched_getattr() -> std::io::Result<SchedAttr> {
    let mut attr = SchedAttr::default();
    // SAFETY: sched_getattr writes at most `size` bytes into `attr`, whose layout it expects.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            0,
            &mut attr as *mut SchedAttr,
            std::mem::size_of::<SchedAttr>() as u32,
            0,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(attr)
}

/// Asks the scheduler to give the calling thread a short slice ([`EVENT_THREAD_SLICE_NS`]),
/// keeping its policy and nice value. Since Linux 6.12 a fair task woken with a shorter slice
/// than the running one preempts it; without this, a thread woken by a kernel event on a CPU
/// busy with a memory-hungry task waits for that task's slice to run out, up to a whole tick
/// (4 ms at HZ=250). It runs no longer for it: a short slice only makes its turns come sooner
/// and end sooner. Older kernels ignore the request; a thread under a real-time or other
/// non-fair policy is left as it is.
pub fn ask_for_short_slice() -> std::io::Result<()> {
    let mut attr = sched_getattr()?;
    if attr.policy != libc::SCHED_OTHER as u32 && attr.policy != libc::SCHED_BATCH as u32 {
        return Ok(());
    }
    attr.size = std::mem::size_of::<SchedAttr>() as u32;
    attr.runtime = EVENT_THREAD_SLICE_NS;
    // SAFETY: sched_setattr reads `size` bytes of a fully initialised `attr`.
    let r = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The fields of /proc/meminfo the agent uses, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemInfo {
    pub total: u64,
    pub free: u64,
    pub inactive_file: u64,
}

/// The fields of /proc/meminfo's text, each "<n> kB", in bytes.
pub fn parse_meminfo(text: &str) -> Result<MemInfo, String> {
    let field = |name: &str| -> Result<u64, String> {
        let line = text
            .lines()
            .find(|l| l.split(':').next() == Some(name))
            .ok_or_else(|| format!("no {name} line"))?;
        let value = line.split(':').nth(1).unwrap_or("").trim();
        let kib = value
            .strip_suffix("kB")
            .map(str::trim)
            .ok_or_else(|| format!("{name}: expected \"<n> kB\", found {value:?}"))?;
        kib.parse::<u64>()
            .map(|k| k.saturating_mul(1024))
            .map_err(|_| format!("{name}: expected \"<n> kB\", found {value:?}"))
    };
    Ok(MemInfo {
        total: field("MemTotal")?,
        free: field("MemFree")?,
        inactive_file: field("Inactive(file)")?,
    })
}

#[cfg(test)]
mod tests {
    use super::{parse_meminfo, MemInfo};

    #[test]
    fn parses_meminfo_or_names_the_bad_field() {
        let good = "MemTotal:       24684084 kB\nMemFree:        1000 kB\nInactive(file):   4 kB\n";
        assert_eq!(
            parse_meminfo(good),
            Ok(MemInfo {
                total: 24684084 * 1024,
                free: 1000 * 1024,
                inactive_file: 4096
            })
        );
        for (text, needle) in [
            ("MemFree: 1 kB\nInactive(file): 1 kB\n", "no MemTotal"),
            (
                "MemTotal: lots\nMemFree: 1 kB\nInactive(file): 1 kB\n",
                "MemTotal: expected",
            ),
            (
                "MemTotal: 1 MB\nMemFree: 1 kB\nInactive(file): 1 kB\n",
                "MemTotal: expected",
            ),
        ] {
            assert!(parse_meminfo(text).unwrap_err().contains(needle), "{text}");
        }
    }

    /// Each reading is the file as it is now, through the one descriptor opened the first
    /// time; a file that goes is an error, and one made again is opened anew.
    #[test]
    fn held_files_read_the_file_as_it_is_now_through_one_descriptor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory.current");
        let held = super::HeldFiles::default();
        std::fs::write(&path, "1048576\n").unwrap();
        assert_eq!(held.read(&path).unwrap(), "1048576\n");
        std::fs::write(&path, "2\n").unwrap();
        assert_eq!(
            held.read(&path).unwrap(),
            "2\n",
            "shorter now: no stale tail"
        );
        assert_eq!(held.held(), 1);
        let meminfo = held.read(std::path::Path::new("/proc/meminfo")).unwrap();
        assert!(meminfo.starts_with("MemTotal:"), "{meminfo}");
        let again = held.read(std::path::Path::new("/proc/meminfo")).unwrap();
        assert!(again.starts_with("MemTotal:") && again.contains("Inactive(file)"));
        assert_eq!(held.held(), 2);
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, "3\n").unwrap();
        assert_eq!(held.read(&path).unwrap(), "3\n", "made again: read anew");
        assert!(held.read(&dir.path().join("absent")).is_err());
    }

    #[test]
    fn formats_timestamps_as_rfc3339_utc() {
        let cases = [
            (0i128, "1970-01-01T00:00:00.000000Z"),
            (1_795_307_308_123_456_789, "2026-11-22T00:28:28.123456Z"),
            (951_782_400_000_000_000, "2000-02-29T00:00:00.000000Z"),
        ];
        for (ns, want) in cases {
            assert_eq!(super::format_rfc3339(ns), want);
        }
    }

    #[test]
    fn reads_this_machines_limits() {
        assert!(super::pid_limit().unwrap() >= 1024);
        assert!(super::page_size().is_power_of_two());
    }

    /// The slice is granted (Linux 6.12+ reports it back; older kernels accept and ignore
    /// it), and the thread's policy and nice value stay as they were.
    #[test]
    fn a_short_slice_keeps_the_policy_and_nice_value() {
        std::thread::spawn(|| {
            // SAFETY: sets the nice value of the calling thread (who = 0) only.
            assert_eq!(unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 5) }, 0);
            let before = super::sched_getattr().unwrap();
            super::ask_for_short_slice().unwrap();
            let after = super::sched_getattr().unwrap();
            assert_eq!((after.policy, after.nice), (before.policy, 5));
            let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
            let mut version = release.split(|c: char| !c.is_ascii_digit());
            let major: u32 = version.next().unwrap().parse().unwrap();
            let minor: u32 = version.next().unwrap().parse().unwrap();
            let want = if (major, minor) >= (6, 12) {
                super::EVENT_THREAD_SLICE_NS
            } else {
                0
            };
            assert_eq!(after.runtime, want, "the slice reported on {release}");
        })
        .join()
        .unwrap();
    }
}
