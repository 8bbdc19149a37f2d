//! `node-agent simulate` scenarios (YAML or JSON): refused naming the field, or replayed
//! through the policy to its JSON lines, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if let Ok(steps) = node_agent_policy::scenario::run(text) {
        for step in &steps {
            let _ = step.to_json_line();
        }
    }
});
