//! `node-agent trace` as an operator runs it: a subprocess whose JSON Lines output is read.

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use node_agent_tests::{require_root, Helper, TestCgroup};

const MEM_HELPER: &str = env!("CARGO_BIN_EXE_mem-helper");

fn agent_bin() -> String {
    std::env::var("NODE_AGENT_BIN")
        .expect("NODE_AGENT_BIN names the agent binary built with its kernel programs (set by `cargo xtask test`)")
}

/// Kills the trace process if the test fails half-way.
struct Reaper(std::process::Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn trace_json_shows_an_oom_kill_and_exits_cleanly_on_sigterm() -> anyhow::Result<()> {
    require_root();
    let cgroup = TestCgroup::new("trace-oom")?;
    cgroup.set_memory_limit(32 << 20)?;
    let id = cgroup.id();

    let mut trace = Reaper(
        Command::new(agent_bin())
            .args([
                "trace",
                "--output",
                "json",
                "--duration",
                "30s",
                "--kind",
                "oom_kill",
            ])
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?,
    );
    // Ready once it logs that it is tracing.
    let stderr = trace.0.stderr.take().expect("piped");
    let (ready_tx, ready_rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("trace: {line}");
            if line.contains("tracing") {
                let _ = ready_tx.send(());
            }
        }
    });
    ready_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("trace started within 20 s");

    let stdout = trace.0.stdout.take().expect("piped");
    let (line_tx, line_rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = line_tx.send(line);
        }
    });

    let mut helper = Helper::spawn(MEM_HELPER, &["oom".to_string()])?;
    let pid = helper.pid();
    cgroup.add(pid)?;
    helper.go()?;
    helper.wait_killed(Duration::from_secs(20))?;

    let deadline = Instant::now() + Duration::from_secs(2);
    let mut seen = None;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let Ok(line) = line_rx.recv_timeout(left) else {
            break;
        };
        let v: serde_json::Value = serde_json::from_str(&line)?;
        assert_eq!(
            v["kind"], "oom_kill",
            "--kind oom_kill lets nothing else through: {line}"
        );
        if v["pid"] == pid && v["cgroup"]["id"] == id {
            seen = Some(v);
            break;
        }
    }
    let v = seen.expect("trace printed the OOM kill of the helper");
    assert_eq!(v["comm"], "mem-helper");
    assert_eq!(v["constraint"], "cgroup_limit");
    assert!(v["cgroup"]["path"]
        .as_str()
        .is_some_and(|p| p.ends_with(&*cgroup.path().file_name().unwrap().to_string_lossy())));

    // SAFETY: signals the trace process we started.
    unsafe { libc::kill(trace.0.id() as i32, libc::SIGTERM) };
    let started = Instant::now();
    let status = loop {
        if let Some(status) = trace.0.try_wait()? {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "trace exits within 2 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "trace exits 0 on SIGTERM: {status}");
    Ok(())
}

#[test]
fn trace_refuses_bad_flags_with_one_clear_line() -> anyhow::Result<()> {
    let cases: &[(&[&str], &str)] = &[
        (
            &["trace", "--kind", "bogus"],
            "--kind \"bogus\" is not one of",
        ),
        (&["trace", "--memory-threshold", "/=lots"], "not a quantity"),
        (&["trace", "--duration", "soon"], "Go duration"),
    ];
    for (args, needle) in cases {
        let out = Command::new(agent_bin()).args(*args).output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} fails");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?} prints nothing on stdout");
    }
    Ok(())
}
