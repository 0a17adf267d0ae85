//! corral: the CLI (srun, sbatch, squeue, sinfo, scancel, scontrol by
//! argv[0] or as `corral CMD`; plus `corral up`, `corral sim`, `corral certs`).

fn main() {
    let code = corral_ctl::cli::main(std::env::args_os().collect());
    std::process::exit(code);
}
