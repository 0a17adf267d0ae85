//! `corral up`: a whole cluster on this machine. Certificates and a config
//! in a fresh directory, one corral-ctld and N corral-agents with simulated
//! GPUs on loopback; then either a command runs against it (and its exit
//! code is ours) or it stays up until Ctrl-C.
//!
//! [`Cluster`] is also what the end-to-end tests start.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use corral_proto::error_chain as chain;
use corral_proto::msg::{NodeState, Request, Response};
use corral_proto::tls::{self, Role, CTLD_NAME};

use super::{fail, parse, COMMANDS};
use crate::client::Client;

const CMD: &str = "corral up";

/// Start a cluster with simulated GPU nodes on this machine.
#[derive(Debug, Parser)]
#[command(name = "corral up")]
pub struct UpArgs {
    /// Number of nodes (worker-0 … worker-N-1).
    #[arg(long, default_value_t = 2)]
    pub nodes: u32,
    /// Simulated GPUs per node.
    #[arg(long, default_value_t = 8)]
    pub gpus_per_node: u32,
    /// The simulated GPUs' model, as jobs name it (`--gres=gpu:h200:1`);
    /// none: untyped.
    #[arg(long)]
    pub gpu_model: Option<String>,
    /// CPUs per node (simulated: may exceed the machine's).
    #[arg(long, default_value_t = 16)]
    pub cpus_per_node: u32,
    /// Memory per node in MB (simulated).
    #[arg(long, default_value_t = 64_000)]
    pub mem_per_node: u64,
    /// Keep the cluster's files here (default: a fresh temporary directory,
    /// removed afterwards).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Seconds of agent silence before its node is DOWN.
    #[arg(long, default_value_t = 30)]
    pub heartbeat_timeout: u64,
    /// Seconds between SIGTERM and SIGKILL when a job is ended.
    #[arg(long, default_value_t = 5)]
    pub kill_wait: u64,
    /// Seconds a requeued job waits before it may run again (Slurm's 121
    /// by default).
    #[arg(long, default_value_t = 121)]
    pub requeue_delay: u64,
    /// Seconds between every node's health checks (a fault injected in
    /// DIR/gpus/worker-N.toml drains its node within this).
    #[arg(long, default_value_t = 5)]
    pub health_interval: u64,
    /// Run every job inside this shared root (needs root): see
    /// `shared_root::scaffold` for a tiny one.
    #[arg(long)]
    pub jail: Option<PathBuf>,
    /// With --jail: SOURCE:TARGET[:ro], a host path at the same path in
    /// every node's jail (repeatable).
    #[arg(long = "jail-submount")]
    pub jail_submounts: Vec<String>,
    /// With --jail: the Docker socket given to exclusive jobs only, of
    /// the members of --jail-docker-group (the socket is root on the node).
    #[arg(long)]
    pub jail_docker_socket: Option<PathBuf>,
    /// With --jail: the group (of the root's /etc/group) whose exclusive
    /// jobs get the Docker socket; without it no job does.
    #[arg(long)]
    pub jail_docker_group: Option<String>,
    /// Jobs run without cgroups (as root they get one each: CPUs, memory,
    /// pids and GPU devices limited).
    #[arg(long)]
    pub no_cgroups: bool,
    /// The first node reports this machine's real GPUs through NVML
    /// (fails without an NVIDIA driver); the others stay simulated.
    #[arg(long)]
    pub nvml: bool,
    /// Run this with the cluster's commands on PATH, then stop.
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// Why a cluster could not be brought up.
#[derive(Debug, thiserror::Error)]
pub enum UpError {
    #[error("{path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("certificates")]
    Tls(#[from] tls::TlsError),
    #[error("starting {program}")]
    Spawn {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Timeout(String),
}

/// What to start.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    pub nodes: u32,
    pub gpus_per_node: u32,
    /// The simulated GPUs' model (none: untyped).
    pub gpu_model: Option<String>,
    pub cpus_per_node: u32,
    pub mem_per_node: u64,
    pub heartbeat_timeout: u64,
    pub kill_wait: u64,
    pub requeue_delay: u64,
    /// Agents report batch scripts done without running them (benches of
    /// the control plane).
    pub no_exec: bool,
    /// Start an agent process per node (false: every node's certificate
    /// and the partition are made, but the nodes are simulated elsewhere,
    /// as by a fleet of `corral_agent::fleet`).
    pub agents: bool,
    /// Where corral, corral-ctld and corral-agent are.
    pub bin_dir: PathBuf,
    /// The cluster's directory (must be empty or absent).
    pub dir: PathBuf,
    /// The shared root every job runs in (`None`: the host's).
    pub jail: Option<PathBuf>,
    /// `SOURCE:TARGET[:ro]` submounts of the jail.
    pub jail_submounts: Vec<String>,
    /// Where the agents find device nodes for the jail (default `/dev`).
    pub jail_dev: Option<PathBuf>,
    /// The Docker socket exclusive jobs get in the jail.
    pub jail_docker_socket: Option<PathBuf>,
    /// Whose exclusive jobs get it (a group of the root's).
    pub jail_docker_group: Option<String>,
    /// Each job in its own cgroup (when the agents run as root).
    pub cgroups: bool,
    /// GPU driver files bound into GPU tasks' jails (default: the host's
    /// NVIDIA driver, if any).
    pub jail_driver_files: Vec<PathBuf>,
    /// Seconds between the nodes' health checks.
    pub health_interval: u64,
    /// The controller keeps its state in DIR/state (else in memory only).
    pub durable: bool,
    /// The first node's GPUs are the machine's own, through NVML.
    pub nvml: bool,
    /// More of `corral.toml`, appended as it is (tests: `[[health.command]]`,
    /// `[[health.active]]`).
    pub extra_config: String,
    /// More arguments for every agent (tests: small PID limits).
    pub agent_args: Vec<String>,
}

/// A running cluster; stopped when dropped.
#[derive(Debug)]
pub struct Cluster {
    pub spec: ClusterSpec,
    pub addr: SocketAddr,
    ctld: Option<Child>,
    agents: Vec<Option<Child>>,
}

/// The `[jail]` section of a cluster's corral.toml, if it has a jail.
fn jail_section(spec: &ClusterSpec, dir: &Path) -> String {
    let Some(root) = &spec.jail else {
        return String::new();
    };
    let quote = |p: &Path| toml::Value::String(p.to_string_lossy().into_owned()).to_string();
    let mut s = format!(
        "\n[jail]\nroot = {}\nbin = {}\nsubmounts = [{}]\n",
        quote(root),
        quote(&dir.join("jail-bin")),
        spec.jail_submounts
            .iter()
            .map(|m| toml::Value::String(m.clone()).to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    if let Some(d) = &spec.jail_docker_socket {
        s.push_str(&format!("docker_socket = {}\n", quote(d)));
    }
    if let Some(g) = &spec.jail_docker_group {
        s.push_str(&format!(
            "docker_group = {}\n",
            toml::Value::String(g.clone())
        ));
    }
    s
}

/// The cluster's commands as a jail sees them: `corral` itself (a hard
/// link, or a copy across filesystems) and relative links to it, which
/// resolve inside the jail too.
pub fn jail_bin(corral: &Path, dir: &Path) -> Result<(), UpError> {
    mkdir(dir)?;
    let inside = dir.join("corral");
    let _ = std::fs::remove_file(&inside);
    if std::fs::hard_link(corral, &inside).is_err() {
        std::fs::copy(corral, &inside).map_err(io(&inside))?;
    }
    for name in COMMANDS {
        let link = dir.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("corral", &link).map_err(io(&link))?;
    }
    Ok(())
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> UpError + '_ {
    move |source| UpError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A daemon's log: readable by the cluster's owner only (it names users,
/// jobs and paths), appended to across restarts, never through a link.
fn private_log(path: &Path) -> Result<std::fs::File, UpError> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
        .map_err(io(path))?;
    use std::os::unix::fs::PermissionsExt;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(io(path))?;
    Ok(f)
}

fn mkdir(path: &Path) -> Result<(), UpError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(path).map_err(io(path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).map_err(io(path))
}

impl Cluster {
    pub fn node_name(i: u32) -> String {
        format!("worker-{i}")
    }

    pub fn socket(&self, i: u32) -> PathBuf {
        self.spec
            .dir
            .join("run")
            .join(format!("{}.sock", Cluster::node_name(i)))
    }

    /// Node `i`'s simulated GPUs, re-read at every health check: edit it
    /// to inject a fault (`xid = 79`, `ecc_uncorrectable = 1`,
    /// `temperature_c = 95`, `lost = true` under a `[[gpu]]`).
    pub fn gpu_file(&self, i: u32) -> PathBuf {
        self.spec
            .dir
            .join("gpus")
            .join(format!("{}.toml", Cluster::node_name(i)))
    }

    pub fn path_dir(&self) -> PathBuf {
        self.spec.dir.join("bin")
    }

    /// The environment that points Slurm commands at this cluster.
    pub fn env(&self) -> Vec<(String, String)> {
        let path = std::env::var("PATH").unwrap_or_default();
        vec![
            (
                "PATH".into(),
                format!("{}:{path}", self.path_dir().display()),
            ),
            (
                "CORRAL_AGENT_SOCKET".into(),
                self.socket(0).to_string_lossy().into_owned(),
            ),
            (
                "CORRAL_CONF".into(),
                self.spec
                    .dir
                    .join("corral.toml")
                    .to_string_lossy()
                    .into_owned(),
            ),
        ]
    }

    /// Creates the directory, certificates and config; starts ctld and
    /// the agents. Does not wait for the nodes (see [`Cluster::wait_idle`]).
    pub fn start(mut spec: ClusterSpec) -> Result<Cluster, UpError> {
        spec.dir = std::path::absolute(&spec.dir).map_err(io(&spec.dir))?;
        let dir = &spec.dir;
        mkdir(dir)?;
        for sub in ["run", "log", "spool", "bin", "gpus"] {
            mkdir(&dir.join(sub))?;
        }
        let certs = dir.join("certs");
        tls::init_ca(&certs)?;
        tls::issue(&certs, CTLD_NAME, Role::Controller)?;
        for i in 0..spec.nodes {
            tls::issue(&certs, &Cluster::node_name(i), Role::Agent)?;
        }
        let me = nix::unistd::getuid().as_raw();
        let last = spec.nodes.saturating_sub(1);
        // The extra configuration's top-level keys (those before its first
        // table) belong before the tables written here.
        let extra = spec.extra_config.as_str();
        let split = extra
            .lines()
            .position(|l| l.trim_start().starts_with('['))
            .map_or(extra.len(), |i| {
                extra.lines().take(i).map(|l| l.len() + 1).sum::<usize>()
            })
            .min(extra.len());
        let (extra_keys, extra_tables) = extra.split_at(split);
        let config = format!(
            "cluster = \"corral-up\"\nlisten = \"127.0.0.1:0\"\ncerts = \"{}\"\nheartbeat_timeout = {}\n\
             kill_wait = {}\nrequeue_delay = {}\noperators = [{me}]\n{}{extra_keys}\n[[partition]]\nname = \"gpu\"\nnodes = \"worker-[0-{last}]\"\ndefault = true\n\n\
             [health]\ninterval = {}\n{}{}",
            certs.display(),
            spec.heartbeat_timeout,
            spec.kill_wait,
            spec.requeue_delay,
            if spec.durable {
                let state = dir.join("state").to_string_lossy().into_owned();
                format!("state_dir = {}\n", toml::Value::String(state))
            } else {
                String::new()
            },
            spec.health_interval.max(1),
            jail_section(&spec, dir),
            extra_tables,
        );
        let conf = dir.join("corral.toml");
        std::fs::write(&conf, config).map_err(io(&conf))?;
        let corral = spec.bin_dir.join("corral");
        for name in COMMANDS {
            let link = dir.join("bin").join(name);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&corral, &link).map_err(io(&link))?;
        }
        if spec.jail.is_some() {
            jail_bin(&corral, &dir.join("jail-bin"))?;
        }
        let mut cluster = Cluster {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            spec,
            ctld: None,
            agents: Vec::new(),
        };
        cluster.addr = cluster.start_ctld(None)?;
        let spawned = if cluster.spec.agents {
            cluster.spec.nodes
        } else {
            0
        };
        for i in 0..spawned {
            if cluster.real_gpus(i) {
                let child = cluster.spawn_agent(i)?;
                cluster.agents.push(Some(child));
                continue;
            }
            let file = cluster.gpu_file(i);
            let model = match &cluster.spec.gpu_model {
                Some(m) => format!("model = {m:?}\n"),
                None => String::new(),
            };
            let gpus: String = (0..cluster.spec.gpus_per_node)
                .map(|g| format!("[[gpu]]\nindex = {g}\n{model}"))
                .collect();
            std::fs::write(&file, gpus).map_err(io(&file))?;
            let child = cluster.spawn_agent(i)?;
            cluster.agents.push(Some(child));
        }
        Ok(cluster)
    }

    /// Starts corral-ctld (on `listen`, else a free port) and waits until
    /// it listens; returns where.
    fn start_ctld(&mut self, listen: Option<SocketAddr>) -> Result<SocketAddr, UpError> {
        let dir = &self.spec.dir;
        let addr_file = dir.join("ctld.addr");
        let _ = std::fs::remove_file(&addr_file);
        let ctld_bin = self.spec.bin_dir.join("corral-ctld");
        let log = dir.join("log").join("ctld.log");
        let logf = private_log(&log)?;
        // Daemons get process groups of their own: a Ctrl-C at the terminal
        // is for the command (srun forwards it), not for the cluster.
        let ctld = Command::new(&ctld_bin)
            .process_group(0)
            .die_with_parent()
            .arg("--config")
            .arg(dir.join("corral.toml"))
            .arg("--addr-file")
            .arg(&addr_file)
            .args(listen.map(|l| format!("--listen={l}")))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(logf)
            .spawn()
            .map_err(|source| UpError::Spawn {
                program: ctld_bin.clone(),
                source,
            })?;
        self.write_pid("ctld", ctld.id());
        self.ctld = Some(ctld);
        let t0 = Instant::now();
        loop {
            if let Some(a) = std::fs::read_to_string(&addr_file)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                return Ok(a);
            }
            if let Some(Ok(Some(st))) = self.ctld.as_mut().map(Child::try_wait) {
                return Err(UpError::Timeout(format!(
                    "corral-ctld exited ({st}); see {}",
                    log.display()
                )));
            }
            if t0.elapsed() > Duration::from_secs(20) {
                return Err(UpError::Timeout(
                    "corral-ctld did not start listening".into(),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends corral-ctld `sig` and waits for it to end.
    pub fn kill_ctld(&mut self, sig: nix::sys::signal::Signal) {
        if let Some(mut child) = self.ctld.take() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig);
            let _ = child.wait();
        }
    }

    /// Starts corral-ctld again on the address it had, with its state.
    pub fn restart_ctld(&mut self) -> Result<(), UpError> {
        let addr = self.addr;
        self.start_ctld(Some(addr)).map(|_| ())
    }

    /// `DIR/pids/NAME`: a daemon's process id, for people and tests.
    fn write_pid(&self, name: &str, pid: u32) {
        let dir = self.spec.dir.join("pids");
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::write(dir.join(name), format!("{pid}\n"));
    }

    /// Node `i` reports the machine's GPUs, not simulated ones.
    fn real_gpus(&self, i: u32) -> bool {
        self.spec.nvml && i == 0
    }

    fn spawn_agent(&self, i: u32) -> Result<Child, UpError> {
        let name = Cluster::node_name(i);
        let dir = &self.spec.dir;
        let bin = self.spec.bin_dir.join("corral-agent");
        let log = dir.join("log").join(format!("{name}.log"));
        let logf = private_log(&log)?;
        Command::new(&bin)
            .process_group(0)
            .die_with_parent()
            .args(["--name", &name, "--cluster", "corral-up"])
            .arg("--ctld")
            .arg(self.addr.to_string())
            .arg("--certs")
            .arg(dir.join("certs"))
            .arg("--socket")
            .arg(self.socket(i))
            .arg("--spool")
            .arg(dir.join("spool").join(&name))
            .arg("--cpus")
            .arg(self.spec.cpus_per_node.to_string())
            .arg("--mem")
            .arg(self.spec.mem_per_node.to_string())
            .args(if self.real_gpus(i) {
                ["--gpus".into(), "nvml".into()]
            } else {
                ["--sim-gpu-file".into(), self.gpu_file(i).into_os_string()]
            })
            .arg("--cgroup-parent")
            .arg(self.cgroup_parent())
            .args(
                (!self.spec.cgroups)
                    .then_some(["--cgroups", "off"])
                    .into_iter()
                    .flatten(),
            )
            .args(self.spec.no_exec.then_some("--no-exec"))
            .args(&self.spec.agent_args)
            .args(self.spec.jail.iter().flat_map(|_| {
                // The shared root is in the cluster's corral.toml.
                ["--config".into(), dir.join("corral.toml").into_os_string()]
            }))
            .args(
                self.spec
                    .jail_dev
                    .iter()
                    .flat_map(|d| ["--jail-dev".into(), d.clone().into_os_string()]),
            )
            .args(
                self.spec
                    .jail_driver_files
                    .iter()
                    .flat_map(|d| ["--jail-driver-file".into(), d.clone().into_os_string()]),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(logf)
            .spawn()
            .map_err(|source| UpError::Spawn {
                program: bin.clone(),
                source,
            })
            .inspect(|c| self.write_pid(&name, c.id()))
    }

    /// The cgroup this cluster's jobs go under (as root): one per cluster
    /// directory, so clusters on one machine (tests run several at once)
    /// never touch each other's jobs, and a restarted agent finds its own.
    pub fn cgroup_parent(&self) -> String {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.spec.dir.hash(&mut h);
        format!("corral/up-{:016x}", h.finish())
    }

    /// Node `i`'s agent's process id.
    pub fn agent_pid(&self, i: u32) -> Option<u32> {
        self.agents
            .get(i as usize)
            .and_then(Option::as_ref)
            .map(Child::id)
    }

    /// The controller's process id.
    pub fn ctld_pid(&self) -> Option<u32> {
        self.ctld.as_ref().map(Child::id)
    }

    /// Kills node `i`'s agent with a signal (SIGKILL to simulate a crash).
    pub fn kill_agent(&mut self, i: u32, sig: nix::sys::signal::Signal) {
        if let Some(Some(child)) = self.agents.get_mut(i as usize) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig);
            let _ = child.wait();
            self.agents[i as usize] = None;
        }
    }

    /// Starts node `i`'s agent again.
    pub fn restart_agent(&mut self, i: u32) -> Result<(), UpError> {
        let child = self.spawn_agent(i)?;
        if let Some(slot) = self.agents.get_mut(i as usize) {
            *slot = Some(child);
        }
        Ok(())
    }

    /// The first daemon that has exited, with the last line of its log.
    fn exited(&self) -> Option<String> {
        use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        let daemons =
            self.ctld
                .iter()
                .map(|c| (c.id(), "ctld".to_string()))
                .chain(self.agents.iter().enumerate().filter_map(|(i, a)| {
                    a.as_ref().map(|c| (c.id(), Cluster::node_name(i as u32)))
                }));
        for (pid, name) in daemons {
            let pid = nix::unistd::Pid::from_raw(pid as i32);
            match waitid(Id::Pid(pid), flags) {
                Ok(WaitStatus::StillAlive) | Err(_) => continue,
                Ok(_) => {
                    let log = self.spec.dir.join("log").join(format!("{name}.log"));
                    let text = std::fs::read_to_string(&log).unwrap_or_default();
                    let last = text.lines().last().unwrap_or("no output").to_string();
                    return Some(format!("{name} exited: {last}"));
                }
            }
        }
        None
    }

    /// Starts again every daemon that exited (the controller on its
    /// address, with its state; an agent as the same node) and says what
    /// it did, a line each. `corral up` calls it a few times a second.
    pub fn revive(&mut self) -> Vec<String> {
        let mut said = Vec::new();
        let gone = |c: &mut Option<Child>| match c.as_mut().map(Child::try_wait) {
            Some(Ok(Some(status))) => {
                c.take();
                Some(status)
            }
            _ => None,
        };
        if let Some(status) = gone(&mut self.ctld) {
            said.push(match self.restart_ctld() {
                Ok(()) => format!("corral-ctld {status}; started again on {}", self.addr),
                Err(e) => format!("corral-ctld {status}; could not start it again: {e}"),
            });
        }
        for i in 0..self.agents.len() {
            if let Some(status) = gone(&mut self.agents[i]) {
                let name = Cluster::node_name(i as u32);
                said.push(match self.spawn_agent(i as u32) {
                    Ok(child) => {
                        self.agents[i] = Some(child);
                        format!("{name}'s agent {status}; started again")
                    }
                    Err(e) => format!("{name}'s agent {status}; could not start it again: {e}"),
                });
            }
        }
        said
    }

    /// The daemons' process ids: the controller's, then each agent's.
    pub fn pids(&self) -> Vec<u32> {
        self.ctld
            .iter()
            .chain(self.agents.iter().flatten())
            .map(Child::id)
            .collect()
    }

    /// Waits until `count` nodes are idle, as seen through node 0's agent;
    /// fails at once when a daemon exits.
    pub async fn wait_idle(&self, count: u32, timeout: Duration) -> Result<(), UpError> {
        let t0 = Instant::now();
        let mut last = String::from("no answer");
        while t0.elapsed() < timeout {
            if let Some(why) = self.exited() {
                return Err(UpError::Timeout(why));
            }
            if let Ok(mut c) = Client::connect_to(&self.socket(0)).await {
                match c.call(Request::Nodes).await {
                    Ok(Response::Nodes(nodes)) => {
                        let idle = nodes
                            .iter()
                            .filter(|n| n.state == NodeState::Idle && !n.not_responding)
                            .count() as u32;
                        if idle >= count {
                            return Ok(());
                        }
                        last = format!("{idle} of {count} nodes idle");
                    }
                    Ok(other) => last = format!("{other:?}"),
                    Err(e) => last = e.to_string(),
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(UpError::Timeout(format!(
            "cluster not ready after {timeout:?}: {last}; logs in {}",
            self.spec.dir.join("log").display()
        )))
    }

    /// Stops every process (agents first).
    pub fn stop(&mut self) {
        let mut children: Vec<Child> = self.agents.iter_mut().filter_map(Option::take).collect();
        children.extend(self.ctld.take());
        for c in &children {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let t0 = Instant::now();
        for mut c in children {
            while t0.elapsed() < Duration::from_secs(3) {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        // What the agents' jobs left in their cgroups (a daemon that
        // outlived a killed agent) goes, and the cgroups with it.
        if nix::unistd::geteuid().is_root() {
            let _ = Command::new(self.spec.bin_dir.join("corral-agent"))
                .arg("--cgroup-parent")
                .arg(self.cgroup_parent())
                .arg("--remove-cgroups")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Daemons stop when whoever started them dies, even by SIGKILL: the
/// kernel sends them SIGTERM (an agent whose parent is gone ends its
/// jobs and exits at once).
trait DieWithParent {
    fn die_with_parent(&mut self) -> &mut Self;
}

impl DieWithParent for Command {
    #[allow(unsafe_code)]
    fn die_with_parent(&mut self) -> &mut Self {
        use std::os::unix::process::CommandExt;
        let parent = nix::unistd::getpid();
        // SAFETY: prctl and getppid are async-signal-safe; nothing here
        // allocates or takes a lock.
        unsafe {
            self.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)
                    .map_err(std::io::Error::from)?;
                // The parent may have died before the line above.
                if nix::unistd::getppid() != parent {
                    return Err(std::io::Error::other("parent gone"));
                }
                Ok(())
            })
        }
    }
}

fn fresh_dir() -> PathBuf {
    let base = std::env::temp_dir();
    let pid = std::process::id();
    let t = corral_proto::now_ms();
    base.join(format!("corral-up-{pid}-{t}"))
}

/// How often `corral up` looks for daemons that died.
const REVIVE_EVERY: Duration = Duration::from_millis(200);

fn revive(cluster: &mut Cluster) {
    for line in cluster.revive() {
        eprintln!("corral up: {line}");
    }
}

pub fn main(args: &[OsString]) -> i32 {
    let mut args = args.to_vec();
    args[0] = CMD.into();
    let a: UpArgs = match parse(CMD, &args) {
        Ok(a) => a,
        Err(code) => return code,
    };
    if a.nodes == 0 {
        return fail(CMD, "--nodes must be at least 1");
    }
    let bin_dir = match std::env::current_exe() {
        Ok(p) => p.parent().map(Path::to_path_buf).unwrap_or_default(),
        Err(e) => return fail(CMD, format!("cannot find my own binary: {e}")),
    };
    let temporary = a.dir.is_none();
    // Absolute: agents and jobs run in other directories than ours.
    let dir = match std::path::absolute(a.dir.clone().unwrap_or_else(fresh_dir)) {
        Ok(d) => d,
        Err(e) => return fail(CMD, format!("--dir: {e}")),
    };
    let spec = ClusterSpec {
        nodes: a.nodes,
        gpus_per_node: a.gpus_per_node,
        gpu_model: a.gpu_model.clone(),
        cpus_per_node: a.cpus_per_node,
        mem_per_node: a.mem_per_node,
        heartbeat_timeout: a.heartbeat_timeout,
        kill_wait: a.kill_wait,
        requeue_delay: a.requeue_delay,
        no_exec: false,
        agents: true,
        bin_dir,
        dir: dir.clone(),
        jail: a.jail.clone(),
        jail_submounts: a.jail_submounts.clone(),
        jail_dev: None,
        jail_docker_socket: a.jail_docker_socket.clone(),
        jail_docker_group: a.jail_docker_group.clone(),
        cgroups: !a.no_cgroups,
        health_interval: a.health_interval,
        durable: true,
        nvml: a.nvml,
        jail_driver_files: Vec::new(),
        extra_config: String::new(),
        agent_args: Vec::new(),
    };
    let code = super::block_on(CMD, async move {
        let cluster = match Cluster::start(spec) {
            Ok(c) => c,
            Err(e) => return fail(CMD, chain(&e)),
        };
        if let Err(e) = cluster.wait_idle(a.nodes, Duration::from_secs(60)).await {
            return fail(CMD, chain(&e));
        }
        let gpus = if a.nvml {
            format!("{} GPUs (worker-0: this machine's)", a.gpus_per_node)
        } else {
            format!("{} GPUs", a.gpus_per_node)
        };
        eprintln!(
            "corral up: {} nodes × {gpus} ready (controller {}, files in {})",
            a.nodes,
            cluster.addr,
            cluster.spec.dir.display()
        );
        if a.command.is_empty() {
            crate::say!("# In another shell:");
            for (k, v) in cluster.env() {
                crate::say!("export {k}={v}");
            }
            crate::say!("# Ctrl-C here stops the cluster.");
            let mut cluster = cluster;
            let stop = tokio::signal::ctrl_c();
            tokio::pin!(stop);
            loop {
                tokio::select! {
                    _ = &mut stop => return 0,
                    () = tokio::time::sleep(REVIVE_EVERY) => revive(&mut cluster),
                }
            }
        }
        // Ctrl-C belongs to the command; the cluster stops when it exits.
        // (Handling SIGINT here replaces its default action; the command
        // still gets the default, as handlers do not survive exec.)
        let _interrupts = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt());
        let mut cmd = tokio::process::Command::new(&a.command[0]);
        cmd.args(&a.command[1..]).envs(cluster.env());
        let mut cluster = cluster;
        let status = match cmd.spawn() {
            Ok(mut child) => loop {
                tokio::select! {
                    st = child.wait() => break st,
                    () = tokio::time::sleep(REVIVE_EVERY) => revive(&mut cluster),
                }
            },
            Err(e) => Err(e),
        };
        drop(cluster);
        match status {
            Ok(st) => st.code().unwrap_or(1),
            Err(e) => fail(CMD, format!("{}: {e}", a.command[0])),
        }
    });
    if temporary {
        let _ = std::fs::remove_dir_all(&dir);
    }
    code
}
