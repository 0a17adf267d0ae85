//! corral: the CLI (srun, sbatch, squeue, sinfo, scancel, scontrol by
//! argv[0] or as `corral CMD`; plus `corral up`, `corral sim`, `corral certs`).

fn main() {
    // SIGPIPE stays ignored (Rust's default): the commands write their
    // output in one piece and take a closed pipe as a quiet end
    // (`corral_ctl::cli::emit`); srun lets it end the process, as Slurm's.
    let code = corral_ctl::cli::main(std::env::args_os().collect());
    std::process::exit(code);
}
