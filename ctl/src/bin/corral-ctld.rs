//! corral-ctld: reads corral.toml and serves the cluster.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use corral_ctl::ctld::config::Config;
use corral_ctl::ctld::server::Server;

/// Corral's controller.
#[derive(Debug, Parser)]
#[command(name = "corral-ctld", version)]
struct Args {
    /// The configuration file.
    #[arg(long, short = 'f', default_value = "/etc/corral/corral.toml")]
    config: PathBuf,
    /// Listen here instead of the configured address (port 0: any).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Write the bound address to this file once listening.
    #[arg(long)]
    addr_file: Option<PathBuf>,
}

async fn run(args: Args) -> anyhow::Result<()> {
    let mut cfg = Config::load(&args.config)?;
    cfg.check_user = corral_proto::msg::Ident {
        uid: nix::unistd::getuid().as_raw(),
        gid: nix::unistd::getgid().as_raw(),
    };
    let listen = args.listen.unwrap_or(cfg.listen);
    let server = Server::new(cfg)?;
    server.set_config_path(args.config.clone());
    server.run(listen, args.addr_file).await?;
    Ok(())
}

/// One malloc arena for the whole controller. glibc gives threads that
/// allocate at once arenas of their own (up to eight per core), and
/// submissions arrive on whichever tokio worker reads them, so a queue's
/// records were spread over several arenas, each with its own slack. One
/// arena: 826-829 rather than 904-906 bytes resident per pending job
/// (10,000 held jobs on `corral up`, 8 clients, 2 runs each). Its lock
/// costs little: ctld's work on jobs runs under the controller's one lock
/// anyway.
fn one_malloc_arena() {
    #[cfg(target_env = "gnu")]
    #[allow(unsafe_code)]
    // SAFETY: mallopt only sets a parameter of glibc's malloc; it runs
    // first in main, before any other thread exists.
    unsafe {
        nix::libc::mallopt(nix::libc::M_ARENA_MAX, 1);
    }
}

fn main() {
    one_malloc_arena();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CORRAL_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        // A log on a full disk loses lines, never the daemon: reporting
        // the failed write on stderr panics the thread that logged.
        .log_internal_errors(false)
        .init();
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => match e.kind() {
            clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                e.exit()
            }
            _ => {
                let text = e.to_string();
                let line = text.lines().next().unwrap_or("invalid arguments");
                eprintln!("corral-ctld: error: {}", line.trim_start_matches("error: "));
                std::process::exit(2);
            }
        },
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("corral-ctld: error: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = rt.block_on(run(args)) {
        eprintln!("corral-ctld: error: {e:#}");
        std::process::exit(1);
    }
}
