//! corral-agent: parses flags and wires the agent together.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use corral_agent::cgroup::{Cgroups, Layout};
use corral_agent::gpu::{GpuBackend, SimGpus};
use corral_agent::launch::ProcessLauncher;
use corral_agent::{local, resources, Agent, AgentConfig};
use corral_proto::tls::CertFiles;

/// Corral's node agent: registers this node with corral-ctld and runs the
/// tasks it assigns.
#[derive(Debug, Parser)]
#[command(name = "corral-agent", version)]
struct Args {
    /// Node name (default: the host name).
    #[arg(long)]
    name: Option<String>,
    /// corral-ctld's address.
    #[arg(long, default_value = "127.0.0.1:6817")]
    ctld: SocketAddr,
    /// Directory with ca.pem and NAME.pem / NAME.key.
    #[arg(long, default_value = "/etc/corral/certs")]
    certs: PathBuf,
    /// Unix socket for local CLIs.
    #[arg(long, default_value = "/run/corral/agent.sock")]
    socket: PathBuf,
    /// Where batch scripts are kept while they run.
    #[arg(long, default_value = "/var/spool/corral")]
    spool: PathBuf,
    /// Cluster name (SLURM_CLUSTER_NAME).
    #[arg(long, default_value = "corral")]
    cluster: String,
    /// CPUs to offer (default: this machine's).
    #[arg(long)]
    cpus: Option<u32>,
    /// Memory to offer in MB (default: this machine's).
    #[arg(long)]
    mem: Option<u64>,
    /// Where GPUs come from: `auto` (NVML when the driver's library loads
    /// and sees a GPU, else the simulated ones below), `nvml` (fail
    /// without it) or `sim`.
    #[arg(long, value_enum, default_value_t = GpuSource::Auto)]
    gpus: GpuSource,
    /// Simulated GPUs: how many.
    #[arg(long, default_value_t = 0)]
    sim_gpus: u32,
    /// Simulated GPUs per topology group (0: one group).
    #[arg(long, default_value_t = 0)]
    sim_gpus_per_group: u32,
    /// Simulated GPU memory in MB.
    #[arg(long, default_value_t = 141 * 1024)]
    sim_gpu_memory: u64,
    /// Simulated GPUs from a TOML file of [[gpu]] tables (instead of the
    /// counts above).
    #[arg(long)]
    sim_gpu_file: Option<PathBuf>,
    /// Node features, comma separated.
    #[arg(long, value_delimiter = ',')]
    features: Vec<String>,
    /// Benchmarking only: report batch scripts as completed without
    /// running them.
    #[arg(long)]
    no_exec: bool,
    /// The cluster's corral.toml: its [jail] section says where tasks run
    /// (the flags below win over it).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Run every task inside this shared root (needs root).
    #[arg(long)]
    jail: Option<PathBuf>,
    /// With --jail: a directory with `corral` and its command links,
    /// shown in the jail at /run/corral/bin (default: this binary's).
    #[arg(long)]
    jail_bin: Option<PathBuf>,
    /// With --jail: SOURCE:TARGET[:ro], a host path at the same path on
    /// every node's jail (repeatable; TARGET must exist in the root).
    #[arg(long = "jail-submount", value_parser = shared_root::config::parse_submount)]
    jail_submounts: Vec<shared_root::Submount>,
    /// With --jail: where this node's device nodes are (tests point it at
    /// a directory of made-up `nvidiaN` nodes).
    #[arg(long, default_value = "/dev")]
    jail_dev: PathBuf,
    /// On SIGTERM, seconds the node's running jobs get to finish before
    /// they are ended (failed, or requeued if they asked); a second
    /// SIGTERM ends them at once.
    #[arg(long, default_value_t = 300)]
    leave_grace: u64,
    /// With --jail: the node's Docker socket, given to exclusive jobs of
    /// the members of `[jail] docker_group` only.
    #[arg(long)]
    jail_docker_socket: Option<PathBuf>,
    /// With --jail: a GPU driver file (library or tool) bound into every
    /// GPU task's jail (repeatable; default: NVIDIA's, found in the
    /// loader's cache).
    #[arg(long = "jail-driver-file")]
    jail_driver_files: Vec<PathBuf>,
    /// A cgroup per job (CPUs, memory, pids, GPU devices): `auto` when
    /// running as root and the node's cgroups are writable, `on` (fail
    /// if they are not), or `off`.
    #[arg(long, value_enum, default_value_t = CgroupMode::Auto)]
    cgroups: CgroupMode,
    /// The cgroup jobs go under (`PARENT/NODE/job_ID.RUN`).
    #[arg(long, default_value = "corral")]
    cgroup_parent: String,
    /// Most processes and threads one job may have on the node (0: no
    /// limit).
    #[arg(long, default_value_t = 32768)]
    cgroup_pids_max: u64,
    /// Processes and threads a job may have for each of its CPUs (at
    /// least 256, at most --cgroup-pids-max; 0: --cgroup-pids-max for
    /// every job), so one job's fork loop leaves others room.
    #[arg(long, default_value_t = 1024)]
    cgroup_pids_per_cpu: u64,
    /// Processes and threads all jobs of the node may have together
    /// (`auto`: the kernel's pid_max less a tenth, at least 1024, for
    /// the agent and the system; 0: no limit).
    #[arg(long, default_value = "auto")]
    cgroup_node_pids_max: String,
    /// Most live tasks (batch scripts and step tasks) one user may have
    /// on the node; a launch past it fails with that reason (default:
    /// eight a CPU, at least 256). `--overlap` steps hold no CPUs, so
    /// without it one user's steps could take the agent's descriptors.
    #[arg(long)]
    max_user_tasks: Option<u32>,
    /// With cgroups: turn on the cgroup2 root's `favordynmods`, which
    /// makes each task's move into its cgroup cost well under a
    /// millisecond instead of an RCU grace period (about 10 ms), at some
    /// cost to every fork and exit on the node; a machine-wide setting
    /// that Linux 6.18 keeps until reboot. `off` leaves the node as it is.
    #[arg(long, value_enum, default_value_t = Switch::On)]
    cgroup_favordynmods: Switch,
    /// Kill every job under --cgroup-parent (all nodes), remove it, and
    /// exit: what `corral up` does once its agents are gone.
    #[arg(long)]
    remove_cgroups: bool,
    /// Print the GPUs this node would report (backend, inventory, health
    /// readings) and exit.
    #[arg(long)]
    show_gpus: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum GpuSource {
    Auto,
    Nvml,
    Sim,
}

/// The node's GPU backend as `--gpus` and the simulation flags ask:
/// asking for simulated GPUs (a count or a file) means the simulation.
fn gpu_backend(args: &Args, name: &str) -> anyhow::Result<Arc<dyn GpuBackend>> {
    let simulated = args.sim_gpu_file.is_some() || args.sim_gpus > 0;
    let want_nvml = match args.gpus {
        GpuSource::Nvml => true,
        GpuSource::Auto => !simulated,
        GpuSource::Sim => false,
    };
    if want_nvml {
        match corral_agent::nvml::NvmlGpus::open() {
            Ok(g) => {
                tracing::info!(gpus = ?g, "GPUs from NVML");
                return Ok(Arc::new(g));
            }
            Err(e) if args.gpus == GpuSource::Nvml => {
                return Err(anyhow::Error::new(e).context("--gpus nvml"))
            }
            Err(e) => tracing::debug!(error = %e, "no NVML; simulated GPUs"),
        }
    }
    Ok(match &args.sim_gpu_file {
        Some(p) => Arc::new(SimGpus::from_file(name, p)?),
        None => Arc::new(SimGpus::uniform(
            name,
            args.sim_gpus,
            args.sim_gpus_per_group,
            args.sim_gpu_memory,
        )),
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Switch {
    On,
    Off,
}

/// Turns on `favordynmods` (see `cgroup::dynmods`); a failure is logged,
/// never fatal: jobs run the same, each start slower.
fn favor_dynmods() {
    use corral_agent::cgroup::dynmods::{favor, Outcome};
    match favor(
        &shared_root::Kernel,
        std::path::Path::new("/proc/self/mountinfo"),
    ) {
        Ok(Outcome::TurnedOn { mount }) => {
            tracing::info!(mount = %mount.display(), "cgroup2 favordynmods turned on: tasks join their cgroups without waiting for an RCU grace period")
        }
        Ok(Outcome::AlreadyOn) => tracing::debug!("cgroup2 favordynmods already on"),
        Ok(Outcome::NoCgroup2) => {
            tracing::info!("no cgroup2 mount: favordynmods left off; each task's start waits for an RCU grace period")
        }
        Ok(Outcome::Ignored { mount }) => {
            tracing::warn!(mount = %mount.display(), "favordynmods did not take (not the host's cgroup namespace?); each task's start waits for an RCU grace period")
        }
        Err(e) => {
            tracing::warn!(error = %corral_agent::agent::error_chain(&e), "favordynmods left off (Linux before 6.0?); each task's start waits for an RCU grace period")
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum CgroupMode {
    Auto,
    On,
    Off,
}

/// The node's job cgroups as `--cgroups` asks; stale ones of an agent
/// that died are killed and removed.
/// What `--cgroup-node-pids-max` names: `auto` leaves a tenth of the
/// kernel's PID space (at least 1,024) to what is not a job.
fn node_pids_max(arg: &str) -> anyhow::Result<Option<u64>> {
    if arg == "auto" {
        let max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(32768);
        return Ok(Some(max.saturating_sub((max / 10).max(1024)).max(1024)));
    }
    match arg.parse::<u64>() {
        Ok(0) => Ok(None),
        Ok(n) => Ok(Some(n)),
        Err(_) => anyhow::bail!("--cgroup-node-pids-max: {arg:?} is not a number or auto"),
    }
}

/// How many PIDs jobs get: each at most `job_max`, `per_cpu` for each
/// of its CPUs, all together `node_max`.
struct PidLimits {
    job_max: u64,
    per_cpu: u64,
    node_max: Option<u64>,
}

fn cgroups(
    mode: CgroupMode,
    parent: &str,
    pids: &PidLimits,
    memory_bytes: Option<u64>,
    node: &str,
) -> anyhow::Result<Option<Arc<Cgroups>>> {
    let root = nix::unistd::geteuid().is_root();
    if mode == CgroupMode::Off || (mode == CgroupMode::Auto && !root) {
        return Ok(None);
    }
    let job_max = (pids.job_max > 0).then_some(pids.job_max);
    let made = Layout::detect()
        .and_then(|l| Cgroups::new(l, parent, node, job_max))
        .and_then(|cg| cg.with_pids(pids.per_cpu, pids.node_max))
        .and_then(|cg| cg.with_memory(memory_bytes));
    match (made, mode) {
        (Ok(cg), _) => {
            cg.sweep();
            tracing::info!(layout = ?cg.layout(), "jobs run in cgroups");
            Ok(Some(Arc::new(cg)))
        }
        (Err(e), CgroupMode::On) => {
            Err(anyhow::Error::new(e).context("setting up the node's cgroups"))
        }
        (Err(e), _) => {
            tracing::warn!(error = %corral_agent::agent::error_chain(&e), "no cgroups: jobs run without limits");
            Ok(None)
        }
    }
}

/// Where tasks run: the flags, else corral.toml's [jail], else the host.
fn jail_config(args: &Args) -> anyhow::Result<Option<corral_agent::jail::JailConfig>> {
    let section = match &args.config {
        Some(path) => shared_root::config::JailSection::load(path)?,
        None => None,
    };
    let root = match (&args.jail, &section) {
        (Some(root), _) => root.clone(),
        (None, Some(s)) => s.root.clone(),
        (None, None) => return Ok(None),
    };
    let section = section.unwrap_or_default();
    let bin = match args.jail_bin.clone().or(section.bin) {
        Some(b) => b,
        None => std::env::current_exe()
            .context("finding this binary for the jail")?
            .parent()
            .map(PathBuf::from)
            .unwrap_or_default(),
    };
    let mut cfg = corral_agent::jail::JailConfig::new(root, bin);
    cfg.submounts = if args.jail_submounts.is_empty() {
        section.submounts
    } else {
        args.jail_submounts.clone()
    };
    cfg.host_files = section.host_files;
    cfg.host_dev = args.jail_dev.clone();
    cfg.docker_socket = args.jail_docker_socket.clone().or(section.docker_socket);
    cfg.docker_group = section.docker_group;
    if cfg.docker_socket.is_some() && cfg.docker_group.is_none() {
        tracing::warn!("the jail has a docker_socket but no docker_group: no job gets the socket");
    }
    cfg.driver_files = match (&args.jail_driver_files[..], section.driver_files) {
        ([], Some(files)) => files,
        ([], None) => corral_agent::jail::driver_files(),
        (files, _) => files.to_vec(),
    };
    Ok(Some(cfg))
}

/// Raises the soft limit on open descriptors to the hard one and returns
/// it: the agent holds a descriptor per local client and several per task.
fn raise_fd_limit() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => {
            if setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
                hard
            } else {
                soft
            }
        }
        Ok((soft, _)) => soft,
        Err(_) => 1024,
    }
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into())
}

async fn run(args: Args) -> anyhow::Result<()> {
    let parent = nix::unistd::getppid();
    if args.remove_cgroups {
        if nix::unistd::geteuid().is_root() {
            let layout = Layout::detect().context("finding the cgroups")?;
            Cgroups::new(layout, &args.cgroup_parent, "", None)
                .context("opening the cgroups")?
                .remove_cluster();
        }
        return Ok(());
    }
    let name = args.name.clone().unwrap_or_else(hostname);
    let gpus = gpu_backend(&args, &name)?;
    let inventory = gpus.gpus()?;
    if args.show_gpus {
        print!(
            "{}",
            corral_agent::gpu::describe(gpus.as_ref(), &inventory)?
        );
        return Ok(());
    }
    let checks = corral_agent::health::GpuChecks::new(inventory.len());
    let (cg_mode, cg_parent) = (args.cgroups, args.cgroup_parent.clone());
    let jail = jail_config(&args)?;
    let resources = resources::detect(args.cpus, args.mem);
    let max_user_tasks = args
        .max_user_tasks
        .unwrap_or_else(|| corral_agent::budget::Budget::default_user_tasks(resources.cpus));
    let cfg = AgentConfig {
        certs: CertFiles::in_dir(&args.certs, &name),
        name,
        cluster: args.cluster,
        ctld: args.ctld,
        socket: args.socket.clone(),
        spool: args.spool,
        resources,
        gpus: inventory.clone(),
        gpu_minors: inventory
            .iter()
            .map(|g| (g.index, gpus.minor(g.index)))
            .collect(),
        features: args.features,
        launcher: Arc::new(ProcessLauncher),
        no_exec: args.no_exec,
        gpu_health: Some((gpus, checks)),
        cgroups: None,
        jail,
        max_user_tasks,
    };
    let agent = Agent::new(cfg).context("starting agent")?;
    let pids = PidLimits {
        job_max: args.cgroup_pids_max,
        per_cpu: args.cgroup_pids_per_cpu,
        node_max: node_pids_max(&args.cgroup_node_pids_max)?,
    };
    // When memory runs short the kernel kills a job's process, never the
    // agent (its tasks set theirs back to 0 as they start).
    if nix::unistd::geteuid().is_root() {
        if let Err(e) = std::fs::write("/proc/self/oom_score_adj", "-1000") {
            tracing::warn!(error = %e, "the agent could not shield itself from the OOM killer");
        }
    }
    let memory = Some(resources.memory_mb.saturating_mul(1 << 20));
    if let Some(cg) = cgroups(cg_mode, &cg_parent, &pids, memory, agent.name())? {
        if args.cgroup_favordynmods == Switch::On {
            favor_dynmods();
        }
        agent.use_cgroups(cg);
    }
    let listener = local::bind(&args.socket)?;
    let limits = local::LocalLimits::for_fd_limit(raise_fd_limit());
    tokio::spawn(local::serve(agent.clone(), listener, limits));
    let control = {
        let agent = agent.clone();
        tokio::spawn(async move { agent.run_control().await })
    };
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("watching for SIGTERM")?;
    tokio::select! {
        r = control => {
            agent.kill_all();
            r.context("the control session")??
        }
        _ = term.recv() => {
            if nix::unistd::getppid() != parent {
                // Whoever started the agent (`corral up`) died: stop
                // now, jobs with it, rather than drain for minutes.
                tracing::info!("SIGTERM after the parent died: ending every job and stopping");
                agent.kill_all();
            } else {
                tracing::info!("SIGTERM: leaving the cluster");
                let grace = std::time::Duration::from_secs(args.leave_grace);
                tokio::select! {
                    () = agent.leave(grace) => {}
                    // A second SIGTERM (an impatient operator, or the
                    // kernel's when `corral up` dies while it stops the
                    // cluster, which leaves no ctld to confirm the leave)
                    // does not wait out the grace.
                    _ = term.recv() => {
                        tracing::info!("SIGTERM again: ending every job and stopping");
                        agent.kill_all();
                    }
                }
            }
        }
        _ = agent.removed() => {
            tracing::info!("removed from the cluster; stopping");
            agent.kill_all();
        }
    }
    Ok(())
}

fn main() {
    // A jailed job's PID namespace holder: nothing else of the agent.
    if std::env::args_os().nth(1).as_deref()
        == Some(std::ffi::OsStr::new(corral_agent::pidns::PID_INIT))
    {
        corral_agent::pidns::holder_main();
    }
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
                eprintln!(
                    "corral-agent: error: {}",
                    line.trim_start_matches("error: ")
                );
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
            eprintln!("corral-agent: error: {e}");
            std::process::exit(1);
        }
    };
    // Keeps a kernel static key on for this node's sruns (see there).
    let _offload = corral_agent::step::hold_udp_offload_key();
    if let Err(e) = rt.block_on(run(args)) {
        eprintln!("corral-agent: error: {e:#}");
        std::process::exit(1);
    }
}
