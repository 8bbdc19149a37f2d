//! Test helper: waits for a line on stdin, then forks exactly N children that exit at once,
//! reaps them all and exits. Usage: `fork-helper N`. Single-threaded, no other forks, so the
//! only tasks it creates are the N children.

use std::io::BufRead as _;

fn main() {
    let n: u32 = match std::env::args().nth(1).map(|a| a.parse()) {
        Some(Ok(n)) if n <= 10_000 => n,
        _ => {
            eprintln!("usage: fork-helper N (N <= 10000)");
            std::process::exit(2);
        }
    };
    let mut line = String::new();
    if std::io::stdin().lock().read_line(&mut line).is_err() {
        std::process::exit(3);
    }
    for _ in 0..n {
        // SAFETY: single-threaded process; the child only calls _exit.
        match unsafe { libc::fork() } {
            0 => unsafe { libc::_exit(0) },
            pid if pid < 0 => std::process::exit(4),
            _ => {}
        }
    }
    for _ in 0..n {
        let mut status = 0;
        // SAFETY: waits for any child, writing only to `status`.
        if unsafe { libc::wait(&mut status) } < 0 {
            std::process::exit(5);
        }
    }
}
