//! The daemon's logs as a log pipeline reads them: with `logFormat: json` in its config file,
//! every line it writes on stderr during an end-to-end run (real kernel, real memory pressure,
//! the strict fake cluster) is one JSON object with a timestamp, level, target and message,
//! and the eviction's line carries the fields the text line has (`pod`, `signal`, `result`).
//! A reload to `logFormat: text` switches the lines that follow, the first saying so.

use node_agent_tests::{
    fake_cluster::{wait_until, PodSpec},
    require_root,
    world::{wait, World},
};
use serde_json::Value;

const MEM_HELPER: &str = env!("CARGO_BIN_EXE_mem-helper");

#[test]
fn every_line_of_an_eviction_run_is_json_with_the_text_lines_fields() -> anyhow::Result<()> {
    require_root();
    let hog = PodSpec::new(
        "shop",
        "hog",
        "1b4e28ba-2fa1-11d2-883f-0016d3cca427",
        "16Mi",
        'a',
    );
    let calm = PodSpec::new(
        "shop",
        "calm",
        "6ba7b810-9dad-11d1-80b4-00c04fd430c8",
        "512Mi",
        'b',
    );
    let w = World::new("e2e-json-logs", &[hog, calm], MEM_HELPER)?;
    let mut daemon = w.start("", "logFormat: json\n")?;
    let _calm = w.load("calm", 120)?;
    let _hog = w.load("hog", 100)?;
    wait_until(wait(), "the eviction request", || !w.evictions().is_empty())?;
    daemon.wait_log("eviction outcome", wait())?;

    let lines = daemon.lines();
    assert!(lines.len() >= 3, "{lines:#?}");
    let mut eviction = None;
    for line in &lines {
        let v: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        let object = v
            .as_object()
            .unwrap_or_else(|| panic!("not an object: {line}"));
        for key in ["timestamp", "level", "target", "message"] {
            assert!(object[key].is_string(), "{key} in {line}");
        }
        assert!(
            ["ERROR", "WARN", "INFO"].contains(&object["level"].as_str().unwrap()),
            "RUST_LOG=info: {line}"
        );
        if v["message"] == "eviction outcome" {
            eviction = Some(v);
        }
    }
    let eviction = eviction.expect("the eviction's line");
    assert_eq!(eviction["pod"], "shop/hog", "{eviction}");
    assert_eq!(eviction["signal"], "memory.available", "{eviction}");
    assert_eq!(eviction["result"], "evicted", "{eviction}");
    assert_eq!(eviction["target"], "node_agent::run::report", "{eviction}");
    let running = lines
        .iter()
        .find(|l| l.contains("node-agent running"))
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .unwrap();
    assert_eq!(running["mode"], "kubernetes", "{running}");

    // A reload to text: the lines that follow are text, the first of them saying why.
    let before = daemon.lines().len();
    w.reload(&mut daemon, "", "logFormat: text\n")?;
    let lines = daemon.lines();
    let switch = lines
        .iter()
        .position(|l| l.contains("log format changed"))
        .expect("the switch is logged");
    assert!(switch >= before, "{lines:#?}");
    for line in &lines[..switch] {
        assert!(
            serde_json::from_str::<Value>(line).is_ok(),
            "JSON before the switch: {line}"
        );
    }
    assert!(
        lines[switch].contains(" INFO ") && lines[switch].contains("log_format=text was=json"),
        "{}",
        lines[switch]
    );
    let after = &lines[switch..];
    for line in after {
        assert!(
            serde_json::from_str::<Value>(line).is_err(),
            "text after the switch: {line}"
        );
    }
    assert!(
        after
            .iter()
            .any(|l| l.contains(" INFO ") && l.contains("config reloaded")),
        "{after:#?}"
    );
    w.assert_nothing_refused();
    daemon.stop()
}
