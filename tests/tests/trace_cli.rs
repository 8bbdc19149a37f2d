//! `node-agent trace` as an operator runs it: a subprocess whose JSON Lines output is read.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use node_agent_tests::{agent_bin, require_root, scaled, AgentProcess, Helper, TestCgroup};

const MEM_HELPER: &str = env!("CARGO_BIN_EXE_mem-helper");

#[test]
fn trace_json_shows_an_oom_kill_and_exits_cleanly_on_sigterm() -> anyhow::Result<()> {
    require_root();
    let cgroup = TestCgroup::new("trace-oom")?;
    cgroup.set_memory_limit(32 << 20)?;
    let id = cgroup.id();

    // --no-attach: a daemon running on this machine must not stand in for the programs.
    let trace = AgentProcess::spawn(
        &[
            "trace",
            "--no-attach",
            "--output",
            "json",
            "--duration",
            "30s",
            "--kind",
            "oom_kill",
        ]
        .map(std::ffi::OsStr::new),
    )?;
    // Ready once it logs that it is tracing.
    let deadline = Instant::now() + scaled(Duration::from_secs(20));
    loop {
        let left = deadline
            .checked_duration_since(Instant::now())
            .expect("trace started within 20 s");
        if trace
            .log
            .recv_timeout(left)
            .is_ok_and(|l| l.contains("tracing"))
        {
            break;
        }
    }

    let mut helper = Helper::spawn(MEM_HELPER, &["oom".to_string()])?;
    let pid = helper.pid();
    cgroup.add(pid)?;
    helper.go()?;
    helper.wait_killed(Duration::from_secs(20))?;

    let deadline = Instant::now() + scaled(Duration::from_secs(2));
    let mut seen = None;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let Ok(v) = trace.json.recv_timeout(left) else {
            break;
        };
        assert_eq!(
            v["kind"], "oom_kill",
            "--kind oom_kill lets nothing else through: {v}"
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

    trace.signal(libc::SIGTERM);
    let mut trace = trace;
    let started = Instant::now();
    let status = loop {
        if let Some(status) = trace.child.try_wait()? {
            break status;
        }
        assert!(
            started.elapsed() < scaled(Duration::from_secs(2)),
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
