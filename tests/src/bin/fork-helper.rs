//! Test helper: waits for a line on stdin, then forks exactly N children and reaps them all.
//! Usage: `fork-helper N` (children exit at once) or `fork-helper N hold` (children stay
//! alive; the helper prints `forked`, waits for another line, then kills and reaps them).
//! Single-threaded, no other forks, so the only tasks it creates are the N children.

use std::io::{BufRead as _, Write as _};

fn wait_line() {
    let mut line = String::new();
    if std::io::stdin().lock().read_line(&mut line).is_err() {
        std::process::exit(3);
    }
}

fn main() {
    let n: usize = match std::env::args().nth(1).map(|a| a.parse()) {
        Some(Ok(n)) if n <= 10_000 => n,
        _ => {
            eprintln!("usage: fork-helper N [hold] (N <= 10000)");
            std::process::exit(2);
        }
    };
    let hold = std::env::args().nth(2).as_deref() == Some("hold");
    wait_line();
    let mut children = Vec::with_capacity(n);
    for _ in 0..n {
        // SAFETY: single-threaded process; the child only calls pause/_exit.
        match unsafe { libc::fork() } {
            0 => unsafe {
                if hold {
                    libc::pause();
                }
                libc::_exit(0)
            },
            pid if pid < 0 => std::process::exit(4),
            pid => children.push(pid),
        }
    }
    if hold {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "forked");
        let _ = out.flush();
        wait_line();
        for &pid in &children {
            // SAFETY: signals our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
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
