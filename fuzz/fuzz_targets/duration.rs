//! Go durations: any text parses or is refused without a panic or a wrapped value; what
//! parses, written back in nanoseconds, parses to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use node_agent_policy::parse_go_duration;

fuzz_target!(|text: &str| {
    let Ok(nanos) = parse_go_duration(text) else {
        return;
    };
    let written = format!("{nanos}ns");
    assert_eq!(
        parse_go_duration(&written),
        Ok(nanos),
        "{text:?} is {nanos} ns, but {written:?} is not"
    );
});
