//! corral.toml from an operator: parses or refuses with an error, never
//! panics.
#![no_main]

use corral_ctl::ctld::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(c) = Config::parse(std::path::Path::new("fuzz.toml"), text) {
        assert!(!c.partitions.is_empty());
        assert!(c.heartbeat_timeout >= 1);
    }
});
