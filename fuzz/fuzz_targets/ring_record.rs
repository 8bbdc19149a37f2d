//! Ring-buffer records as the kernel programs write them, and anything else: decoded or
//! refused with an error, and every decoded event turned into its trace record (JSON and
//! table row), never a panic.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use node_agent::{
    cgroup::CgroupIndex,
    probes::{attribute, decode, NoNames},
    trace::Record,
};

/// An index of an empty directory: every cgroup id is unknown, as for a cgroup gone by now.
fn index() -> &'static CgroupIndex {
    static INDEX: OnceLock<CgroupIndex> = OnceLock::new();
    INDEX.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("node-agent-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        CgroupIndex::scan(&dir).expect("index of an empty directory")
    })
}

fuzz_target!(|bytes: &[u8]| {
    let Ok(event) = decode(bytes) else {
        return;
    };
    if let Some(attributed) = attribute(&event, index(), &NoNames, 4096) {
        let record = Record::event(&attributed, String::new());
        let _ = record.json();
        let _ = record.table_row();
    }
});
