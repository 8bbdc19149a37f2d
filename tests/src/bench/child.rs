//! The bench's helper processes: the bench binary re-executes itself with `child ...` so the
//! work runs in a cgroup of its own. Each waits for a line on stdin before each phase (the
//! tests' [`crate::Helper::go`]) and answers with one line on stdout.
//!
//! - `child ramp-anon USAGE_FILE LOW_MIB HIGH_MIB OFFSET`: touches LOW MiB and answers
//!   `low USAGE LINE` with LINE = USAGE + OFFSET bytes. Then, alternately: *up* touches pages one at
//!   a time up to HIGH MiB, reading USAGE_FILE after each, and answers `cross T USAGE` (T:
//!   CLOCK_MONOTONIC ns just before touching the page whose charge took usage to LINE or more)
//!   or `nocross USAGE`; *down* unmaps back to LOW and answers `low USAGE LINE`.
//! - `child ramp-trace USAGE_FILE LOW_MIB HIGH_MIB`: touches LOW MiB and answers `low USAGE`.
//!   Then, alternately: *up* touches pages one at a time up to HIGH MiB, reading USAGE_FILE
//!   after each, and answers `trace T:U T:U ...`, one pair each time the usage read changed
//!   (T: CLOCK_MONOTONIC ns just before touching the page after which U was read), so the
//!   bench can find when a line learnt only afterwards was crossed; *down* unmaps back to LOW
//!   and answers `low USAGE`.
//! - `child ramp-file USAGE_FILE FILE LINE`: answers `low USAGE LINE`; then *up* reads FILE 4 KiB
//!   at a time, round and round, until the next line arrives (at most 60 s), and answers as
//!   above; *down* drops the file's pages from the page cache.
//! - `child fork N`: forks and reaps N children one after the other; answers `ns ELAPSED`.
//! - `child fault MIB ROUNDS`: maps, touches and unmaps MIB MiB ROUNDS times; answers `ns ELAPSED`.
//! - `child spin MS`: busy for MS ms reading the clock; answers `spin ELAPSED LOST`, LOST being
//!   the time between reads that took over 1 µs (the CPU was taken away).
//! - `child oom`: touches memory until the OOM killer ends it (at most 1 GiB).
//! - `child charge MIB HUGE`: maps MIB MiB aligned to 2 MiB and, with HUGE = 1, advises
//!   transparent huge pages and touches one byte per 2 MiB (a fault that zeroes and charges a
//!   huge page), else refuses them and touches one byte per page; answers `charge ELAPSED
//!   HUGE_BYTES`, HUGE_BYTES being how much of it the kernel gave as huge pages.

use std::{
    io::{BufRead as _, Write as _},
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};

use super::mono_ns;

const PAGE: usize = 4096;
const MIB: usize = 1 << 20;

/// Runs the child mode named by `args` (after `child`).
pub fn run(args: &[String]) -> anyhow::Result<()> {
    let arg = |i: usize, what: &str| -> anyhow::Result<&str> {
        args.get(i)
            .map(String::as_str)
            .with_context(|| format!("child {}: missing {what}", args.join(" ")))
    };
    let num = |i: usize, what: &str| -> anyhow::Result<usize> {
        let text = arg(i, what)?;
        text.parse()
            .with_context(|| format!("child: {what} must be a number, found {text:?}"))
    };
    match arg(0, "mode")? {
        "ramp-anon" => ramp_anon(
            Path::new(arg(1, "USAGE_FILE")?),
            num(2, "LOW_MIB")?,
            num(3, "HIGH_MIB")?,
            num(4, "OFFSET")? as u64,
        ),
        "ramp-trace" => ramp_trace(
            Path::new(arg(1, "USAGE_FILE")?),
            num(2, "LOW_MIB")?,
            num(3, "HIGH_MIB")?,
        ),
        "ramp-file" => ramp_file(
            Path::new(arg(1, "USAGE_FILE")?),
            Path::new(arg(2, "FILE")?),
            num(3, "LINE")? as u64,
        ),
        "fork" => {
            let n = num(1, "N")?;
            wait_line()?;
            let (start, cpu) = (Instant::now(), cpu_ns());
            fork_loop(n)?;
            say(&format!(
                "ns {} {}",
                start.elapsed().as_nanos(),
                cpu_ns() - cpu
            ));
            Ok(())
        }
        "spin" => {
            let ms = num(1, "MS")? as u64;
            wait_line()?;
            let (elapsed, lost) = spin(Duration::from_millis(ms));
            say(&format!("spin {elapsed} {lost}"));
            Ok(())
        }
        "oom" => {
            // Touches memory until the OOM killer ends it; bounded so a missing kill cannot
            // eat the machine (the bench sets a small limit first).
            wait_line()?;
            let region = Region::map(1024 * MIB)?;
            region.touch(0, region.len);
            bail!("touched 1 GiB without being OOM-killed: is the cgroup's memory limit set?")
        }
        "fault" => {
            let (mib, rounds) = (num(1, "MIB")?, num(2, "ROUNDS")?);
            wait_line()?;
            let (start, cpu) = (Instant::now(), cpu_ns());
            for _ in 0..rounds {
                let region = Region::map(mib * MIB)?;
                region.touch(0, region.len);
            }
            say(&format!(
                "ns {} {}",
                start.elapsed().as_nanos(),
                cpu_ns() - cpu
            ));
            Ok(())
        }
        "charge" => {
            let (mib, huge) = (num(1, "MIB")?, num(2, "HUGE")? == 1);
            wait_line()?;
            let (elapsed, huge_bytes) = charge(mib * MIB, huge)?;
            say(&format!("charge {elapsed} {huge_bytes}"));
            Ok(())
        }
        other => {
            bail!("unknown child mode {other:?}: expected ramp-anon, ramp-trace, ramp-file, fork, fault, spin, oom or charge")
        }
    }
}

/// Charges `len` bytes of anonymous memory as fast as one CPU can: in 2 MiB huge pages if
/// `huge` (and the kernel gives them), else page by page. Returns (ns taken, bytes the kernel
/// gave as huge pages).
fn charge(len: usize, huge: bool) -> anyhow::Result<(u128, u64)> {
    const HUGE: usize = 2 * MIB;
    let region = Region::map(len + HUGE)?;
    let start = (region.ptr as usize).next_multiple_of(HUGE) - region.ptr as usize;
    let advice = if huge {
        libc::MADV_HUGEPAGE
    } else {
        libc::MADV_NOHUGEPAGE
    };
    // SAFETY: advice on a range inside our own mapping.
    unsafe { libc::madvise(region.ptr.add(start).cast(), len, advice) };
    let step = if huge { HUGE } else { PAGE };
    let t = Instant::now();
    for off in (start..start + len).step_by(step) {
        region.touch(off, off + 1);
    }
    let elapsed = t.elapsed().as_nanos();
    let huge_kib = std::fs::read_to_string("/proc/self/smaps_rollup")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("AnonHugePages:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .unwrap_or(0);
    Ok((elapsed, huge_kib * 1024))
}

fn wait_line() -> anyhow::Result<String> {
    let mut line = String::new();
    let n = std::io::stdin().lock().read_line(&mut line)?;
    anyhow::ensure!(n > 0, "stdin closed");
    Ok(line.trim().to_string())
}

fn say(what: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{what}");
    let _ = out.flush();
}

/// Reads a cgroup usage file with one `pread` per call (no allocation, no reopen).
struct Usage(std::fs::File);

impl Usage {
    fn open(path: &Path) -> anyhow::Result<Self> {
        Ok(Self(
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?,
        ))
    }

    fn read(&self) -> u64 {
        use std::os::unix::fs::FileExt as _;
        let mut buf = [0u8; 32];
        let n = self.0.read_at(&mut buf, 0).unwrap_or(0);
        std::str::from_utf8(&buf[..n])
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }
}

/// An anonymous private mapping, unmapped on drop.
struct Region {
    ptr: *mut u8,
    len: usize,
}

impl Region {
    fn map(len: usize) -> anyhow::Result<Self> {
        // SAFETY: anonymous private mapping; checked for failure before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            bail!("mmap of {len} bytes: {}", std::io::Error::last_os_error());
        }
        Ok(Self { ptr: p.cast(), len })
    }

    /// Writes one byte in each page of `[from, to)`: one page fault and charge per page.
    fn touch(&self, from: usize, to: usize) {
        for off in (from..to.min(self.len)).step_by(PAGE) {
            // SAFETY: `off` lies inside the writable mapping.
            unsafe { self.ptr.add(off).write_volatile(0x5a) };
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `map`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

fn ramp_anon(
    usage_file: &Path,
    low_mib: usize,
    high_mib: usize,
    offset: u64,
) -> anyhow::Result<()> {
    anyhow::ensure!(high_mib > low_mib, "HIGH_MIB must exceed LOW_MIB");
    let usage = Usage::open(usage_file)?;
    wait_line()?;
    let base = Region::map(low_mib * MIB)?;
    base.touch(0, base.len);
    let low = usage.read();
    let line = low + offset;
    say(&format!("low {low} {line}"));
    loop {
        if wait_line().is_err() {
            return Ok(());
        }
        let region = Region::map((high_mib - low_mib) * MIB)?;
        let mut crossed = None;
        for off in (0..region.len).step_by(PAGE) {
            let t = mono_ns();
            region.touch(off, off + 1);
            if crossed.is_none() {
                let u = usage.read();
                if u >= line {
                    crossed = Some((t, u));
                }
            }
        }
        match crossed {
            Some((t, u)) => say(&format!("cross {t} {u}")),
            None => say(&format!("nocross {}", usage.read())),
        }
        if wait_line().is_err() {
            return Ok(());
        }
        drop(region);
        say(&format!("low {} {line}", usage.read()));
    }
}

fn ramp_trace(usage_file: &Path, low_mib: usize, high_mib: usize) -> anyhow::Result<()> {
    anyhow::ensure!(high_mib > low_mib, "HIGH_MIB must exceed LOW_MIB");
    let usage = Usage::open(usage_file)?;
    wait_line()?;
    let base = Region::map(low_mib * MIB)?;
    base.touch(0, base.len);
    say(&format!("low {}", usage.read()));
    loop {
        if wait_line().is_err() {
            return Ok(());
        }
        let region = Region::map((high_mib - low_mib) * MIB)?;
        // Usage moves in charge batches (64 pages on most kernels): a few hundred changes.
        let mut points: Vec<(u64, u64)> = Vec::with_capacity(1024);
        let mut last = usage.read();
        for off in (0..region.len).step_by(PAGE) {
            let t = mono_ns();
            region.touch(off, off + 1);
            let u = usage.read();
            if u != last {
                points.push((t, u));
                last = u;
            }
        }
        let mut answer = String::from("trace");
        for (t, u) in points {
            answer.push_str(&format!(" {t}:{u}"));
        }
        say(&answer);
        if wait_line().is_err() {
            return Ok(());
        }
        drop(region);
        say(&format!("low {}", usage.read()));
    }
}

fn ramp_file(usage_file: &Path, file: &Path, line: u64) -> anyhow::Result<()> {
    use std::os::unix::io::AsRawFd as _;
    let usage = Usage::open(usage_file)?;
    let f = std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
    let len = f.metadata()?.len() as usize;
    anyhow::ensure!(len >= 16 * MIB, "{} is too small", file.display());
    let fd = f.as_raw_fd();
    // No read-ahead: one page charged per read, as in the anonymous ramp.
    // SAFETY: advisory call on our own fd.
    unsafe { libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_RANDOM) };
    wait_line()?;
    say(&format!("low {} {line}", usage.read()));
    let mut buf = vec![0u8; PAGE];
    loop {
        if wait_line().is_err() {
            return Ok(());
        }
        let mut crossed = None;
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut off = 0usize;
        let mut n = 0u64;
        loop {
            let t = mono_ns();
            // SAFETY: reads into our own buffer of PAGE bytes.
            let r = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), PAGE, off as libc::off_t) };
            if r < 0 {
                bail!(
                    "reading {}: {}",
                    file.display(),
                    std::io::Error::last_os_error()
                );
            }
            if crossed.is_none() {
                let u = usage.read();
                if u >= line {
                    crossed = Some((t, u));
                }
            }
            off = (off + PAGE) % len;
            n += 1;
            if n.is_multiple_of(64) && (stdin_ready() || Instant::now() > deadline) {
                break;
            }
        }
        let _ = wait_line();
        match crossed {
            Some((t, u)) => say(&format!("cross {t} {u}")),
            None => say(&format!("nocross {}", usage.read())),
        }
        if wait_line().is_err() {
            return Ok(());
        }
        // SAFETY: advisory call on our own fd.
        unsafe { libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED) };
        say(&format!("low {} {line}", usage.read()));
    }
}

fn stdin_ready() -> bool {
    let mut pfd = libc::pollfd {
        fd: 0,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: polls one pollfd we own, without waiting.
    unsafe { libc::poll(&mut pfd, 1, 0) > 0 }
}

/// CPU time (user + system) of this process and its reaped children, ns: what a loop costs
/// whatever else the machine runs meanwhile, BPF programs running in its context included.
fn cpu_ns() -> u64 {
    let of = |who| {
        // SAFETY: getrusage writes only the struct we pass.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(who, &mut u) };
        let tv = |t: libc::timeval| {
            u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000
                + u64::try_from(t.tv_usec).unwrap_or(0) * 1_000
        };
        tv(u.ru_utime) + tv(u.ru_stime)
    };
    of(libc::RUSAGE_SELF) + of(libc::RUSAGE_CHILDREN)
}

/// Busy for `length`, reading the clock in a tight loop; every gap between two reads longer
/// than [`SPIN_GAP_NS`] is time the CPU spent elsewhere (an interrupt, a softirq, a timer
/// callback, another task, the hypervisor). Returns (elapsed, sum of those gaps), ns.
fn spin(length: Duration) -> (u64, u64) {
    let start = mono_ns();
    let end = start + length.as_nanos() as u64;
    let (mut last, mut lost) = (start, 0);
    while last < end {
        let now = mono_ns();
        if now - last > SPIN_GAP_NS {
            lost += now - last;
        }
        last = now;
    }
    (last - start, lost)
}

/// A clock read takes well under 100 ns here; an interruption at least a few µs.
const SPIN_GAP_NS: u64 = 1_000;

fn fork_loop(n: usize) -> anyhow::Result<()> {
    for _ in 0..n {
        // SAFETY: the child only calls _exit.
        match unsafe { libc::fork() } {
            0 => unsafe { libc::_exit(0) },
            pid if pid < 0 => bail!("fork: {}", std::io::Error::last_os_error()),
            pid => {
                let mut status = 0;
                // SAFETY: waits for our own child, writing only `status`.
                if unsafe { libc::waitpid(pid, &mut status, 0) } < 0 {
                    bail!("waitpid: {}", std::io::Error::last_os_error());
                }
            }
        }
    }
    Ok(())
}

/// Creates `path` with `len` bytes written and flushed to disk, then drops it from the page
/// cache, so the file ramp charges every page it reads.
pub fn make_ramp_file(path: &Path, len: usize) -> anyhow::Result<()> {
    use std::os::unix::io::AsRawFd as _;
    let mut f =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let chunk = vec![0xa5u8; MIB];
    for _ in 0..len / MIB {
        f.write_all(&chunk)?;
    }
    f.sync_all()?;
    // SAFETY: advisory call on our own fd.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    Ok(())
}
