//! The agent's config file (a NodeAgentConfiguration): refused naming what is wrong, or
//! accepted, never a panic. An accepted file's effective configuration, printed as
//! `node-agent check-config` prints it, reads back as the same configuration, and is as valid.
#![no_main]

use libfuzzer_sys::fuzz_target;
use node_agent::config::{AgentConfig, NodeAgentConfiguration, Overrides};

fuzz_target!(|text: &str| {
    let overrides = Overrides {
        node_name: Some("worker-1".into()),
        ..Overrides::default()
    };
    let Ok(file) = NodeAgentConfiguration::parse(text) else {
        return;
    };
    let effective = file.effective();
    let printed = effective.to_yaml();
    let again = NodeAgentConfiguration::parse(&printed).unwrap_or_else(|e| {
        panic!("the effective configuration does not read back: {e}\n{printed}")
    });
    assert_eq!(again, effective, "{printed}");
    if let Ok(config) = AgentConfig::from_file(&file, &overrides) {
        let _ = config.dry_run();
        let reread = AgentConfig::from_file(&again, &overrides)
            .unwrap_or_else(|e| panic!("the effective configuration is refused: {e}\n{printed}"));
        assert_eq!(reread.eviction, config.eviction);
        assert_eq!(reread.settings, config.settings);
    }
});
