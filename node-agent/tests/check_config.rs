//! End to end: the built `node-agent check-config` binary, its report and exit status, and the
//! same verdict as `node-agent run --config` on the same file.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

const HEADER: &str = "apiVersion: node-agent.io/v1alpha1\nkind: NodeAgentConfiguration\n";

fn agent(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_node-agent"))
        .args(args)
        .env("NODE_NAME", "worker-1")
        .env_remove("NODE_AGENT_CONFIG")
        .output()
        .expect("node-agent runs")
}

fn deploy(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(file)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The YAML of a report: every line that is not a comment.
fn yaml_of(report: &str) -> String {
    report
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn the_shipped_config_checks_and_acts_before_a_default_kubelet() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = dir.path().join("kubelet.yaml");
    // kubeadm's KubeletConfiguration sets no eviction fields: the kubelet's defaults apply.
    std::fs::write(&kubelet, "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: systemd\n").unwrap();
    let config = deploy("config.yaml");
    let out = agent(&[
        "check-config",
        config.to_str().unwrap(),
        "--kubelet-config",
        kubelet.to_str().unwrap(),
    ]);
    let report = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{report}{}", text(&out.stderr));
    for line in [
        format!("# node-agent check-config: {} is valid.", config.display()),
        "# Mode: enforcing (dryRun: false): evicts, taints and reports, unless the agent runs with --dry-run (the base DaemonSet's does).".to_string(),
        format!("# Beside the kubelet ({}): every kubelet eviction threshold is met after one of the agent's.", kubelet.display()),
        "#   memory.available<200Mi (hard)".into(),
        "#   memory.available<500Mi (soft, grace 1m30s)".into(),
        "#   nodefs.available<15% (hard)".into(),
        "#   allocatableMemory.available<200Mi (hard)".into(),
        "#   nodeCgroup /: a cgroup in the node's memory hierarchy".into(),
        "#   nodefsPath /var/lib/kubelet: an existing directory".into(),
        // Every default filled in, in the new spelling.
        "apiVersion: node-agent.io/v1alpha1".into(),
        "resyncInterval: 10s".into(),
        "ringBufferSize: 1Mi".into(),
        "  evictionPressureTransitionPeriod: 5m0s".into(),
        "  nodeOOMEvents: own".into(),
        "  imageMinimumGCAge: 2m0s".into(),
    ] {
        assert!(report.lines().any(|l| l == line), "{line:?} in:\n{report}");
    }
    assert!(!report.contains("WARNING"), "{report}");

    // The report's YAML is a config file that checks to the same effective configuration.
    let printed = dir.path().join("effective.yaml");
    std::fs::write(&printed, yaml_of(&report)).unwrap();
    let again = agent(&["check-config", printed.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(0), "{}", text(&again.stderr));
    assert_eq!(yaml_of(&text(&again.stdout)), yaml_of(&report));
}

#[test]
fn the_kubelet_acting_first_is_warned_as_the_agent_warns_and_an_unreadable_file_fails() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        format!("{HEADER}eviction: {{evictionHard: {{memory.available: 100Mi}}}}\n"),
    )
    .unwrap();
    let kubelet = dir.path().join("kubelet.yaml");
    std::fs::write(&kubelet, "kind: KubeletConfiguration\nevictionHard: {memory.available: 500Mi, nodefs.available: 10%}\n").unwrap();
    let out = agent(&[
        "check-config",
        config.to_str().unwrap(),
        "--kubelet-config",
        kubelet.to_str().unwrap(),
    ]);
    let report = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "warnings, as the agent's, refuse nothing: {report}"
    );
    assert!(report.contains("#   WARNING: the kubelet's hard memory.available<500Mi is met before the agent's hard memory.available<100Mi: the kubelet would evict first; set the agent's above it"), "{report}");
    assert!(report.contains("#   WARNING: the kubelet's hard nodefs.available<10% has no agent threshold on nodefs.available"), "{report}");
    assert!(report.contains("# Mode: standalone"), "{report}");

    std::fs::write(
        &kubelet,
        "kind: KubeletConfiguration\nevictionHard: {memory.available: lots}\n",
    )
    .unwrap();
    let out = agent(&[
        "check-config",
        config.to_str().unwrap(),
        "--kubelet-config",
        kubelet.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let said = text(&out.stderr);
    assert!(said.starts_with(&format!("node-agent: check-config: the kubelet's config file {}: evictionHard[memory.available]: \"lots\" is not a quantity", kubelet.display())), "{said}");
    let out = agent(&[
        "check-config",
        config.to_str().unwrap(),
        "--kubelet-config",
        "/nonexistent/kubelet.yaml",
    ]);
    assert_eq!(out.status.code(), Some(1));
}

/// `text` with every run of digits as `N`.
fn digits_as_n(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        match (c.is_ascii_digit(), out.ends_with('N')) {
            (true, true) => {}
            (true, false) => out.push('N'),
            (false, _) => out.push(c),
        }
    }
    out
}

/// The error `node-agent run --config FILE` stops with, and the one `check-config` gives.
fn verdicts(file: &Path, on_node: bool) -> (Output, Output) {
    let path = file.to_str().unwrap();
    let run = agent(&["run", "--config", path]);
    let mut check_args = vec!["check-config", path];
    if on_node {
        check_args.push("--on-node");
    }
    (run, agent(&check_args))
}

#[test]
fn check_config_and_the_agent_refuse_the_same_files_with_the_same_words() {
    let dir = tempfile::tempdir().unwrap();
    let mut files: Vec<(&str, PathBuf)> = Vec::new();
    let mut write = |name: &'static str, content: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        files.push((name, path));
    };
    write(
        "old-format.yaml",
        "agent: {dry_run: true}\nkubernetes: {request_timeout_seconds: 10}\n".into(),
    );
    write("misspelt.yaml", format!("{HEADER}resyncIntervall: 10s\n"));
    write(
        "bare-number.yaml",
        format!("{HEADER}kubernetes: {{passOver: 30}}\n"),
    );
    write("no-version.yaml", "dryRun: true\n".into());
    write(
        "bad-threshold.yaml",
        format!("{HEADER}eviction: {{evictionHard: {{memory.available: 500MB}}}}\n"),
    );
    write(
        "bad-kubernetes.yaml",
        format!("{HEADER}kubernetes: {{retry: {{initialBackoff: 10s, maxBackoff: 1s}}}}\n"),
    );
    write("empty.yaml", String::new());
    write(
        "too-large.yaml",
        format!("{HEADER}{}\n", "#".repeat(1 << 20)),
    );
    let fifo = dir.path().join("fifo.yaml");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    files.push(("fifo.yaml", fifo));

    for (name, path) in &files {
        for on_node in [false, true] {
            let (run, check) = verdicts(path, on_node);
            assert_eq!(
                run.status.code(),
                Some(1),
                "{name}: run: {}",
                text(&run.stderr)
            );
            assert_eq!(
                check.status.code(),
                Some(1),
                "{name}: check-config: {}",
                text(&check.stdout)
            );
            let run_said = text(&run.stderr);
            let check_said = text(&check.stderr);
            let refused = run_said
                .lines()
                .last()
                .and_then(|l| l.strip_prefix("node-agent: "))
                .unwrap_or_else(|| panic!("{name}: run said {run_said}"));
            assert_eq!(
                check_said.trim_end(),
                format!(
                    "node-agent: check-config: {}: refused: {refused}",
                    path.display()
                ),
                "{name}"
            );
        }
    }
}

#[test]
fn what_only_the_node_can_answer_is_checked_with_on_node_as_the_agent_checks_it() {
    let dir = tempfile::tempdir().unwrap();
    let rows = [
        (
            "nodeCgroup: /node-agent-no-such-cgroup\n",
            "config: nodeCgroup: no cgroup at",
            "#   nodeCgroup /node-agent-no-such-cgroup: a cgroup in the node's memory hierarchy",
        ),
        (
            "nodefsPath: /nonexistent/kubelet\n",
            "config: nodefsPath: /nonexistent/kubelet is not an existing directory on this node",
            "#   nodefsPath /nonexistent/kubelet: an existing directory",
        ),
        // Every machine that runs this test uses more than 64Mi.
        (
            "memoryCapacity: 64Mi\n",
            "config: memoryCapacity: 67108864 bytes is below the",
            "#   memoryCapacity 64Mi: not below the memory the node already uses",
        ),
    ];
    for (body, refusal, not_checked) in rows {
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, format!("{HEADER}{body}")).unwrap();
        // Anywhere else the file is valid, and the report says what was left to the node.
        let offline = agent(&["check-config", path.to_str().unwrap()]);
        assert_eq!(
            offline.status.code(),
            Some(0),
            "{body}: {}",
            text(&offline.stderr)
        );
        assert!(
            text(&offline.stdout).lines().any(|l| l == not_checked),
            "{body}: {}",
            text(&offline.stdout)
        );
        // On the node, the agent and check-config --on-node refuse it alike.
        let (run, check) = verdicts(&path, true);
        assert_eq!(run.status.code(), Some(1), "{body}");
        assert_eq!(check.status.code(), Some(1), "{body}");
        let run_said = text(&run.stderr);
        let refused = run_said
            .lines()
            .last()
            .unwrap()
            .strip_prefix("node-agent: ")
            .unwrap();
        assert!(refused.starts_with(refusal), "{body}: {run_said}");
        // The node's memory in use moves between the two runs; the words may not.
        assert_eq!(
            digits_as_n(text(&check.stderr).trim_end()),
            digits_as_n(&format!(
                "node-agent: check-config: {}: refused: {refused}",
                path.display()
            ))
        );
    }
    // And a file this node takes: check-config --on-node says so and compares with the
    // kubelet's file the config names (absent here, as the agent would say).
    let path = dir.path().join("config.yaml");
    std::fs::write(
        &path,
        format!("{HEADER}nodefsPath: /\nkubeletConfig: /nonexistent/kubelet/config.yaml\n"),
    )
    .unwrap();
    let out = agent(&["check-config", path.to_str().unwrap(), "--on-node"]);
    let report = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{report}{}", text(&out.stderr));
    assert!(report.contains("is valid on this node."), "{report}");
    assert!(report.contains("# Beside the kubelet: no kubelet config file at /nonexistent/kubelet/config.yaml: not compared"), "{report}");
    assert!(!report.contains("nodeCgroup /:"), "checked here: {report}");
}

/// A file nested 80 000 levels deep in 160 kB (issue 31's probe: 9.8 s of CPU at 50 000, and
/// a reload of this one 24.7 s): refused at once, naming where, and the kubelet's file as much.
#[test]
fn a_deeply_nested_file_is_refused_at_once_naming_where() {
    let dir = tempfile::tempdir().unwrap();
    let deep = dir.path().join("deep.yaml");
    let depth = 80_000;
    std::fs::write(
        &deep,
        format!(
            "{HEADER}eviction: {}{}\n",
            "[".repeat(depth),
            "]".repeat(depth)
        ),
    )
    .unwrap();
    let started = std::time::Instant::now();
    let out = agent(&["check-config", deep.to_str().unwrap()]);
    let took = started.elapsed();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("config is not read: nested more than 32 levels deep at line 3 column 42"),
        "{stderr}"
    );
    eprintln!("check-config of a file nested {depth} deep: {took:?}");
    assert!(took.as_secs_f64() < 5.0, "{took:?}");
    // The kubelet's file beside it: said unreadable, not parsed.
    let out = agent(&[
        "check-config",
        deploy("config.yaml").to_str().unwrap(),
        "--kubelet-config",
        deep.to_str().unwrap(),
    ]);
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(all.contains("nested more than 32 levels deep"), "{all}");
}
