//! The agent's config file (`eviction:`, `kubernetes:`, `agent:`): refused naming what is
//! wrong, or accepted, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use node_agent::daemon::config::{AgentConfig, Overrides};

fuzz_target!(|text: &str| {
    let overrides = Overrides {
        node_name: Some("worker-1".into()),
        ..Overrides::default()
    };
    if let Ok(config) = AgentConfig::parse(text, &overrides) {
        let _ = config.dry_run();
    }
});
