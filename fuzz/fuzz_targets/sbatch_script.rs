//! Batch scripts from users: `#SBATCH` directives parse or refuse, and
//! whatever they give parses as sbatch options or refuses, without panics.
#![no_main]

use corral_ctl::cli::sbatch::{directives, SbatchArgs};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(script) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(words) = directives(script) else {
        return;
    };
    let argv = std::iter::once("sbatch".to_string()).chain(words);
    if let Ok(args) = <SbatchArgs as clap::Parser>::try_parse_from(argv) {
        let _ = args.job.to_spec();
    }
});
