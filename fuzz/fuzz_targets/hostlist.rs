//! Hostlist expressions from anywhere: expansion never panics and never
//! runs away; what expands compresses back to the same names, in order
//! (and sorted, to the same names in some order).
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
    assert_eq!(again, names);
    let sorted = hostlist::expand(&hostlist::compress_sorted(&names)).expect("sorted lists expand");
    let (mut a, mut b) = (names.clone(), sorted);
    a.sort();
    b.sort();
    assert_eq!(a, b);
});
