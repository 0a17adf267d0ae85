#![no_main]
libfuzzer_sys::fuzz_target!(|d: &[u8]| {
    let _ = d;
});
