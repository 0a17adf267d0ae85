//! `corral-sim`: replay a workload trace through Corral's scheduler in
//! virtual time and report waits, slowdown, utilisation and pass times.

use clap::Parser;
use corral_replay::cli::{run, Args};

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("{e:#}");
        std::process::exit(1);
    }
}
