//! End to end: the built `node-agent simulate` binary, its stdout and its exit codes.

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn simulate(scenario: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_node-agent"))
        .args(["simulate", "--scenario", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("node-agent starts");
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(scenario.as_bytes())
        .expect("scenario is written");
    child.wait_with_output().expect("node-agent finishes")
}

const SCENARIO: &str = "
node:
  capacity: {memory: 10Gi, ephemeral-storage: 100Gi, inodes: 1000000, pids: 32768}
config:
  evictionHard: {memory.available: 500Mi}
pods:
  - pod:
      metadata: {name: web}
      spec:
        containers:
          - name: app
            resources: {requests: {memory: 1Gi}}
    usage: {memory: 1536Mi}
steps:
  - at: 0s
    signals: {memory.available: 400Mi}
  - at: 10s
    signals: {memory.available: 2Gi}
";

#[test]
fn a_valid_scenario_prints_one_json_line_per_step() {
    let out = simulate(SCENARIO);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        concat!(
            r#"{"at":"0s","thresholdsMet":["memory.available"],"conditions":["MemoryPressure"],"evictions":[{"namespace":"default","name":"web","signal":"memory.available","gracePeriodSeconds":1,"message":"The node was low on resource: memory. Threshold quantity: 500Mi, available: 400Mi. Container app was using 1536Mi, request is 1Gi, has larger consumption of memory. "}]}"#,
            "\n",
            r#"{"at":"10s","thresholdsMet":[],"conditions":["MemoryPressure"],"evictions":[]}"#,
            "\n",
        )
    );
}

#[test]
fn an_invalid_scenario_exits_2_with_one_error_line_and_no_output() {
    let cases = [
        (
            "a step going backwards",
            SCENARIO.replace("at: 10s", "at: 5s\n  - at: 1s"),
            "steps[2].at",
        ),
        (
            "a negative step time",
            SCENARIO.replace("at: 10s", "at: -1s"),
            "steps[1].at",
        ),
        (
            "an operator inside a config value",
            SCENARIO.replace("500Mi}", "\"<500Mi\"}"),
            "config.evictionHard[memory.available]",
        ),
    ];
    for (behaviour, scenario, field) in cases {
        let out = simulate(&scenario);
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(2), "{behaviour}: {stderr}");
        assert!(out.stdout.is_empty(), "{behaviour}: nothing on stdout");
        assert_eq!(stderr.lines().count(), 1, "{behaviour}: one line: {stderr}");
        assert!(
            stderr.contains(field),
            "{behaviour}: names {field}: {stderr}"
        );
    }
}

#[test]
fn a_missing_scenario_file_exits_2() {
    let out = Command::new(env!("CARGO_BIN_EXE_node-agent"))
        .args(["simulate", "--scenario", "/nonexistent/scenario.yaml"])
        .output()
        .expect("node-agent runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/scenario.yaml"));
}
