//! Hostlist expressions from anywhere: expansion never panics and never
//! runs away; what expands compresses back to the same set of names.
#![no_main]

use libfuzzer_sys::fuzz_target;
use scheduler_core::hostlist;

fuzz_target!(|data: &[u8]| {
    let Ok(expr) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(names) = hostlist::expand(expr) else {
        return;
    };
    assert!(names.len() <= hostlist::MAX_HOSTS);
    if names.iter().any(|n| n.contains(['[', ']', ','])) || names.len() > 10_000 {
        return;
    }
    let again = hostlist::expand(&hostlist::compress(&names)).expect("compressed lists expand");
    let (mut a, mut b) = (names.clone(), again);
    a.sort();
    a.dedup();
    b.sort();
    b.dedup();
    assert_eq!(a, b);
});
