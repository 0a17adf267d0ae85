//! corral: the CLI (srun, sbatch, squeue, sinfo, scancel, scontrol by
//! argv[0] or as `corral CMD`; plus `corral up`, `corral sim`, `corral certs`).

fn main() {
    // A reader that stops early (`scontrol show hostnames | head -n 1`)
    // ends the command quietly, as it ends Slurm's: Rust ignores SIGPIPE
    // and would panic on the failed write instead.
    // SAFETY: restoring the default disposition installs no handler; it
    // runs first in main, before any other thread exists.
    #[allow(unsafe_code)]
    unsafe {
        let _ = nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigDfl,
        );
    }
    let code = corral_ctl::cli::main(std::env::args_os().collect());
    std::process::exit(code);
}
