//! Kubernetes quantities: any text parses or is refused without a panic, and what parses
//! prints in a form that parses back to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use node_agent_policy::Quantity;

fuzz_target!(|text: &str| {
    let Ok(quantity) = text.parse::<Quantity>() else {
        return;
    };
    let _ = quantity.value();
    let _ = quantity.checked_value();
    let printed = quantity.to_string();
    let again: Quantity = printed
        .parse()
        .unwrap_or_else(|e| panic!("{text:?} prints as {printed:?}, which does not parse: {e}"));
    assert_eq!(
        again.nanos(),
        quantity.nanos(),
        "{text:?} prints as {printed:?}, a different value"
    );
});
