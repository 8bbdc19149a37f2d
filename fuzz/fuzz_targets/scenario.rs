//! `node-agent simulate` scenarios (YAML or JSON): refused naming the field, or replayed
//! through the policy to its JSON lines, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let _ = node_agent::simulate::render(text);
});
