//! `pod-workload`: what the real-cluster tests and benchmarks run inside pods.
//!
//! ```text
//! pod-workload pause                                   the pod sandbox's process: waits for SIGTERM, reaps
//! pod-workload memory MIB [RATE_MIB_PER_S] [STEP_MIB]  touches MIB MiB (0 rate: at once), then holds it
//! pod-workload forks N                                  forks N children that wait, then holds them
//! pod-workload fill PATH MIB [RATE_MIB_PER_S]           writes MIB MiB to PATH (fsynced), then holds
//! pod-workload allocate PATH MIB                        allocates MIB MiB of disk to PATH at once (fallocate), then holds
//! pod-workload sleep                                    holds nothing, waits for SIGTERM
//! pod-workload armed COMMAND ...                        prints `phase=armed`, waits for SIGUSR1, then runs COMMAND
//! ```
//!
//! Every phase is printed on stdout (`kubectl logs`) as one line with the wall clock (UNIX
//! nanoseconds, the clock of the API server's and the kubelet's timestamps) and
//! CLOCK_MONOTONIC (the clock of kernel event timestamps): `phase=start`, `phase=progress
//! mib=…` every 64 MiB, `phase=held`. SIGTERM ends any of them at once with exit 0, as a
//! well-behaved pod does when evicted. Bad arguments exit 2 with the usage.

use std::io::Write as _;

const MIB: usize = 1 << 20;
const USAGE: &str = "usage: pod-workload [armed] pause | sleep | memory MIB [RATE_MIB_PER_S] [STEP_MIB] | forks N | fill PATH MIB [RATE_MIB_PER_S] | allocate PATH MIB";

fn clocks() -> (u128, u128) {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let mono = ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128;
    (wall, mono)
}

fn say(phase: &str, rest: &str) {
    let (wall, mono) = clocks();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "phase={phase} wall_ns={wall} mono_ns={mono} {rest}");
    let _ = out.flush();
}

extern "C" fn on_term(_: libc::c_int) {
    // SAFETY: _exit is async-signal-safe.
    unsafe { libc::_exit(0) };
}

fn exit_on_term() {
    // SAFETY: installing a handler that only calls _exit.
    unsafe {
        libc::signal(libc::SIGTERM, on_term as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_term as *const () as libc::sighandler_t);
    }
}

/// Waits for signals forever, reaping children (a sandbox's duty).
fn hold() -> ! {
    loop {
        // SAFETY: pause(2) and waitpid(2) with no outstanding borrows.
        unsafe {
            libc::pause();
            while libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) > 0 {}
        }
    }
}

fn number(arg: Option<&String>, what: &str) -> u64 {
    match arg.map(|a| a.parse::<u64>()) {
        Some(Ok(n)) => n,
        _ => {
            eprintln!("pod-workload: {what} must be a whole number\n{USAGE}");
            std::process::exit(2);
        }
    }
}

/// Sleeps until `done` MiB are due at `rate` MiB/s since `start` (0: never waits).
fn pace(start: std::time::Instant, done: u64, rate: u64) {
    if rate == 0 {
        return;
    }
    let due = std::time::Duration::from_secs_f64(done as f64 / rate as f64);
    if let Some(wait) = due.checked_sub(start.elapsed()) {
        std::thread::sleep(wait);
    }
}

fn memory(mib: u64, rate: u64, step: u64) -> ! {
    let step = step.max(1);
    say("start", &format!("mib={mib} rate_mib_s={rate}"));
    let start = std::time::Instant::now();
    let mut held: Vec<*mut u8> = Vec::new();
    let mut done = 0u64;
    while done < mib {
        let chunk = step.min(mib - done);
        let len = chunk as usize * MIB;
        // SAFETY: an anonymous private mapping; its pages are written below and never freed
        // (the process holds them until it ends).
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
            say("failed", &format!("mib={done} error=mmap"));
            std::process::exit(1);
        }
        let p = p.cast::<u8>();
        for page in (0..len).step_by(4096) {
            // SAFETY: within the mapping just made.
            unsafe { p.add(page).write_volatile(1) };
        }
        held.push(p);
        let before = done;
        done += chunk;
        if done / 64 != before / 64 {
            say("progress", &format!("mib={done}"));
        }
        pace(start, done, rate);
    }
    say("held", &format!("mib={done}"));
    hold()
}

fn forks(n: u64) -> ! {
    say("start", &format!("forks={n}"));
    for i in 0..n {
        // SAFETY: the child only waits for a signal and exits.
        match unsafe { libc::fork() } {
            0 => loop {
                // SAFETY: as above.
                unsafe { libc::pause() };
            },
            -1 => {
                say("failed", &format!("forks={i} error=fork"));
                hold()
            }
            _ => {}
        }
    }
    say("held", &format!("forks={n}"));
    hold()
}

fn fill(path: &str, mib: u64, rate: u64) -> ! {
    use std::io::Write as _;
    say("start", &format!("path={path} mib={mib} rate_mib_s={rate}"));
    let mut file = match std::fs::File::create(path) {
        Ok(f) => f,
        Err(e) => {
            say("failed", &format!("error={e}"));
            std::process::exit(1);
        }
    };
    let block = vec![0x5au8; MIB];
    let start = std::time::Instant::now();
    for done in 1..=mib {
        if let Err(e) = file.write_all(&block) {
            say("failed", &format!("mib={} error={e}", done - 1));
            hold()
        }
        if done % 64 == 0 {
            let _ = file.sync_data();
            say("progress", &format!("mib={done}"));
        }
        pace(start, done, rate);
    }
    let _ = file.sync_all();
    say("held", &format!("mib={mib}"));
    hold()
}

fn allocate(path: &str, mib: u64) -> ! {
    use std::os::fd::AsRawFd as _;
    say("start", &format!("path={path} mib={mib}"));
    let file = match std::fs::File::create(path) {
        Ok(f) => f,
        Err(e) => {
            say("failed", &format!("error={e}"));
            std::process::exit(1);
        }
    };
    let len = (mib * MIB as u64) as libc::off_t;
    // SAFETY: fallocate(2) on a descriptor we own.
    if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) } != 0 {
        say(
            "failed",
            &format!("error={}", std::io::Error::last_os_error()),
        );
        hold()
    }
    let _ = file.sync_all();
    say("held", &format!("mib={mib}"));
    hold()
}

/// Blocks until SIGUSR1 arrives (sent from the host, so a test starts the work at a moment of
/// its choosing, even while the API server is away). SIGTERM still ends the process.
fn wait_armed() {
    // SAFETY: a sigset built and used on this thread only; SIGUSR1 blocked so sigwait takes it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGUSR1);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        say("armed", "");
        let mut got: libc::c_int = 0;
        while libc::sigwait(&set, &mut got) != 0 {}
    }
}

fn main() {
    exit_on_term();
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("armed") {
        args.remove(0);
        wait_armed();
    }
    match args.first().map(String::as_str) {
        Some("pause") | Some("sleep") => hold(),
        Some("memory") => memory(
            number(args.get(1), "MIB"),
            args.get(2)
                .map_or(0, |_| number(args.get(2), "RATE_MIB_PER_S")),
            args.get(3).map_or(1, |_| number(args.get(3), "STEP_MIB")),
        ),
        Some("forks") => forks(number(args.get(1), "N")),
        Some("fill") => {
            let Some(path) = args.get(1) else {
                eprintln!("pod-workload: fill needs a PATH\n{USAGE}");
                std::process::exit(2);
            };
            fill(
                path,
                number(args.get(2), "MIB"),
                args.get(3)
                    .map_or(0, |_| number(args.get(3), "RATE_MIB_PER_S")),
            )
        }
        Some("allocate") => {
            let Some(path) = args.get(1) else {
                eprintln!("pod-workload: allocate needs a PATH\n{USAGE}");
                std::process::exit(2);
            };
            allocate(path, number(args.get(2), "MIB"))
        }
        _ => {
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    }
}
