//! Test helper for memory tests. Waits for a line on stdin before each phase, so the test can
//! move it into a cgroup and pace it.
//!
//! - `mem-helper oom`: touches memory 1 MiB at a time until the kernel kills it (bounded at
//!   4 GiB, then exits 10 so a missing OOM kill fails the test instead of eating the machine).
//! - `mem-helper hold MIB`: touches MIB MiB, prints `held`, waits for a line, frees it, prints
//!   `freed`, waits for a line, exits.
//! - `mem-helper oscillate LOW_MIB HIGH_MIB TIMES [HOLD_US]`: moves between LOW and HIGH MiB
//!   TIMES times, staying HOLD_US microseconds (default 0) at each end.
//! - `mem-helper cross KIB`: touches KIB KiB page by page, prints `held NS` (CLOCK_MONOTONIC
//!   right after the last page was written, the clock of kernel event timestamps), then sleeps
//!   until a line arrives: no memory event of its own follows the last charge. Then frees it,
//!   prints `freed`, waits for a line and exits.
//! - `mem-helper ramp KIB BYTES_PER_S`: as `cross`, but never faster than BYTES_PER_S: before
//!   each 64 KiB it waits until the clock allows them, so over any interval it charges at most
//!   the rate times the interval plus 64 KiB (and the kernel's 256 KiB charge batch).
//! - `mem-helper burst`: as `cross` with one transparent huge page: 2 MiB aligned, advised
//!   `MADV_HUGEPAGE`, touched at its first byte (one fault that charges 2 MiB at once where
//!   the kernel gives a huge page), then at every other page (no-ops after a huge page; 511
//!   quick faults where none was given). Prints `held NS huge|small`.

use std::io::{BufRead as _, Write as _};

const MIB: usize = 1 << 20;

fn wait_line() {
    let mut line = String::new();
    if std::io::stdin().lock().read_line(&mut line).is_err() {
        std::process::exit(3);
    }
}

fn say(what: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{what}");
    let _ = out.flush();
}

/// One MiB mapped straight from the kernel with every page written, so it is charged to the
/// cgroup at once and returned at once on drop (no allocator caching in between).
struct Mib(*mut libc::c_void);

fn touched_mib() -> Mib {
    // SAFETY: anonymous private mapping; checked for failure before use.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            MIB,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        std::process::exit(4);
    }
    // SAFETY: the mapping is MIB bytes long and writable.
    unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0x5a, MIB) };
    Mib(p)
}

impl Drop for Mib {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in touched_mib.
        unsafe { libc::munmap(self.0, MIB) };
    }
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// `bytes` mapped and written page by page; unmapped on drop.
struct Touched(*mut libc::c_void, usize);

fn touched(bytes: usize) -> Touched {
    // SAFETY: anonymous private mapping; checked for failure before use.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        std::process::exit(4);
    }
    for offset in (0..bytes).step_by(4096) {
        // SAFETY: within the writable mapping.
        unsafe { p.cast::<u8>().add(offset).write_volatile(0x5a) };
    }
    Touched(p, bytes)
}

impl Drop for Touched {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in touched.
        unsafe { libc::munmap(self.0, self.1) };
    }
}

/// 2 MiB from a fresh mapping, aligned to 2 MiB, advised for a transparent huge page and
/// touched (a huge page faulted in whole where the kernel gives one). Returns the mapping (to
/// unmap) and whether the region is one huge page (`AnonHugePages` in `/proc/self/smaps`).
fn huge_page() -> (Touched, bool) {
    const HUGE: usize = 2 * MIB;
    // SAFETY: anonymous private mapping; checked for failure before use.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            2 * HUGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        std::process::exit(4);
    }
    let aligned = (p as usize).next_multiple_of(HUGE) as *mut u8;
    // SAFETY: `aligned .. aligned + HUGE` lies within the 4 MiB mapping; advice only.
    unsafe { libc::madvise(aligned.cast(), HUGE, libc::MADV_HUGEPAGE) };
    for offset in (0..HUGE).step_by(4096) {
        // SAFETY: within the writable mapping.
        unsafe { aligned.add(offset).write_volatile(0x5a) };
    }
    let huge = std::fs::read_to_string("/proc/self/smaps_rollup")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("AnonHugePages:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .is_some_and(|kib| kib >= 2048);
    (Touched(p, 2 * HUGE), huge)
}

/// KIB KiB written page by page, never more than `bytes_per_s` a second (checked every 64 KiB).
fn paced(kib: usize, bytes_per_s: u64) -> Touched {
    let bytes = kib * 1024;
    // SAFETY: anonymous private mapping; checked for failure before use.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        std::process::exit(4);
    }
    let start = monotonic_ns();
    for offset in (0..bytes).step_by(4096) {
        if offset % (64 * 1024) == 0 {
            // The bytes up to the end of this 64 KiB chunk may be charged from `due` on.
            let due = start
                + ((offset + 64 * 1024) as u128 * 1_000_000_000 / bytes_per_s.max(1) as u128)
                    as u64;
            while monotonic_ns() < due {
                std::hint::spin_loop();
            }
        }
        // SAFETY: within the writable mapping.
        unsafe { p.cast::<u8>().add(offset).write_volatile(0x5a) };
    }
    Touched(p, bytes)
}

fn arg(n: usize) -> usize {
    match std::env::args().nth(n).map(|a| a.parse()) {
        Some(Ok(v)) => v,
        _ => {
            eprintln!(
                "usage: mem-helper oom | hold MIB | oscillate LOW_MIB HIGH_MIB TIMES [HOLD_US] | cross KIB | ramp KIB BYTES_PER_S | burst"
            );
            std::process::exit(2);
        }
    }
}

/// Says `held NS [what]`, waits for a line, frees `held`, says `freed`, waits for a line.
fn hold_then_free(held: Touched, what: &str) {
    let done = monotonic_ns();
    say(&format!("held {done}{what}"));
    wait_line();
    drop(held);
    say("freed");
    wait_line();
}

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_default();
    wait_line();
    match mode.as_str() {
        "oom" => {
            let mut held = Vec::new();
            for _ in 0..4096 {
                held.push(touched_mib());
            }
            std::process::exit(10);
        }
        "hold" => {
            let mut held: Vec<Mib> = (0..arg(2)).map(|_| touched_mib()).collect();
            say("held");
            wait_line();
            held.clear();
            held.shrink_to_fit();
            say("freed");
            wait_line();
        }
        "cross" => hold_then_free(touched(arg(2) * 1024), ""),
        "ramp" => hold_then_free(paced(arg(2), arg(3) as u64), ""),
        "burst" => {
            let (held, huge) = huge_page();
            hold_then_free(held, if huge { " huge" } else { " small" });
        }
        "oscillate" => {
            let (low, high, times) = (arg(2), arg(3), arg(4));
            let hold = std::env::args()
                .nth(5)
                .map(|_| arg(5))
                .map(|us| std::time::Duration::from_micros(us as u64));
            let base: Vec<Mib> = (0..low).map(|_| touched_mib()).collect();
            for _ in 0..times {
                let extra: Vec<Mib> = (low..high).map(|_| touched_mib()).collect();
                if let Some(hold) = hold {
                    std::thread::sleep(hold);
                }
                drop(extra);
                if let Some(hold) = hold {
                    std::thread::sleep(hold);
                }
            }
            drop(base);
            say("done");
        }
        _ => {
            eprintln!(
                "usage: mem-helper oom | hold MIB | oscillate LOW_MIB HIGH_MIB TIMES [HOLD_US] | cross KIB | ramp KIB BYTES_PER_S | burst"
            );
            std::process::exit(2);
        }
    }
}
