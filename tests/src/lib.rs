//! The end-to-end harness: builds the real binaries, starts a cluster
//! (one corral-ctld, N corral-agents with simulated GPUs, on loopback)
//! in a temporary directory, and runs Slurm commands against it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use corral_ctl::cli::up::{Cluster, ClusterSpec};

pub mod db;

/// Builds corral, corral-ctld, corral-agent and corral-sim once per test binary (in
/// the profile the tests run in) and returns the directory holding them.
pub fn bin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("test binary path");
        // target/<profile>/deps/<test> → target/<profile>
        let dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("test binary lives in target/<profile>/deps")
            .to_path_buf();
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        // The variables cargo sets for this test would make build scripts
        // think their environment changed and rebuild.
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            if (k.starts_with("CARGO_") && k != "CARGO_HOME" && k != "CARGO_TARGET_DIR")
                || k.starts_with("RUST_")
                || k == "OUT_DIR"
            {
                cmd.env_remove(k.as_ref());
            }
        }
        cmd.current_dir(&root)
            .args(["build", "--bins", "-p", "corral-ctl", "-p", "corral-agent"])
            .args(["-p", "corral-replay"]);
        if dir.file_name().is_some_and(|p| p == "release") {
            cmd.arg("--release");
        }
        let st = cmd.status().expect("running cargo build");
        assert!(st.success(), "building the binaries failed");
        dir
    })
}

/// A cluster for one test, with its scratch directory.
#[derive(Debug)]
pub struct Env {
    pub cluster: Cluster,
    /// A directory every uid may write (job submit dir).
    pub work: PathBuf,
    /// Which node's agent the commands talk to.
    via: std::cell::Cell<u32>,
    _tmp: tempfile::TempDir,
}

/// Cluster options for a test.
#[derive(Clone, Debug)]
pub struct Opts {
    pub nodes: u32,
    pub gpus: u32,
    /// The simulated GPUs' model (none: untyped).
    pub gpu_model: Option<String>,
    pub heartbeat_timeout: u64,
    pub kill_wait: u64,
    /// Seconds a requeued job waits (2: Slurm's two minutes would only
    /// slow the tests).
    pub requeue_delay: u64,
    /// Agents do not run batch scripts (control-plane benches).
    pub no_exec: bool,
    /// The shared root jobs run in (needs root).
    pub jail: Option<PathBuf>,
    /// Its submounts, `SOURCE:TARGET[:ro]`.
    pub jail_submounts: Vec<String>,
    /// Where agents find device nodes for the jail.
    pub jail_dev: Option<PathBuf>,
    /// The Docker socket exclusive jobs get in the jail.
    pub jail_docker_socket: Option<PathBuf>,
    /// Whose exclusive jobs get it.
    pub jail_docker_group: Option<String>,
    /// Jobs in cgroups (as root).
    pub cgroups: bool,
    /// Driver files bound into GPU tasks' jails.
    pub jail_driver_files: Vec<PathBuf>,
    /// Seconds between the nodes' health checks.
    pub health_interval: u64,
    /// The controller's state on disk (else in memory only).
    pub durable: bool,
    /// Appended to the cluster's `corral.toml`.
    pub extra_config: String,
    /// More arguments for every agent.
    pub agent_args: Vec<String>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            nodes: 2,
            gpus: 4,
            gpu_model: None,
            heartbeat_timeout: 30,
            kill_wait: 1,
            requeue_delay: 2,
            no_exec: false,
            jail: None,
            jail_submounts: Vec::new(),
            jail_dev: None,
            jail_docker_socket: None,
            jail_docker_group: None,
            cgroups: true,
            jail_driver_files: Vec::new(),
            health_interval: 1,
            durable: true,
            extra_config: String::new(),
            agent_args: Vec::new(),
        }
    }
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

impl Env {
    pub fn start(o: Opts) -> Env {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::Builder::new()
            .prefix("corral-e2e-")
            .tempdir()
            .expect("temp dir");
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod temp dir");
        let work = tmp.path().join("work");
        std::fs::create_dir(&work).expect("work dir");
        std::fs::set_permissions(&work, std::fs::Permissions::from_mode(0o1777))
            .expect("chmod work dir");
        let spec = ClusterSpec {
            nodes: o.nodes,
            gpus_per_node: o.gpus,
            gpu_model: o.gpu_model.clone(),
            cpus_per_node: 8,
            mem_per_node: 16_000,
            heartbeat_timeout: o.heartbeat_timeout,
            kill_wait: o.kill_wait,
            requeue_delay: o.requeue_delay,
            no_exec: o.no_exec,
            agents: true,
            bin_dir: bin_dir().to_path_buf(),
            dir: tmp.path().join("cluster"),
            jail: o.jail.clone(),
            jail_submounts: o.jail_submounts.clone(),
            jail_dev: o.jail_dev.clone(),
            jail_docker_socket: o.jail_docker_socket.clone(),
            jail_docker_group: o.jail_docker_group.clone(),
            cgroups: o.cgroups,
            jail_driver_files: o.jail_driver_files.clone(),
            health_interval: o.health_interval,
            durable: o.durable,
            nvml: false,
            extra_config: o.extra_config.clone(),
            agent_args: o.agent_args.clone(),
        };
        let cluster = Cluster::start(spec).expect("starting the cluster");
        runtime()
            .block_on(cluster.wait_idle(o.nodes, Duration::from_secs(30)))
            .expect("nodes idle");
        Env {
            cluster,
            work,
            via: std::cell::Cell::new(0),
            _tmp: tmp,
        }
    }

    /// Sends later commands through node `i`'s agent (node 0's at first).
    pub fn use_node(&self, i: u32) {
        self.via.set(i);
    }

    /// The environment the cluster's commands run with (its agent's
    /// socket, its `PATH`).
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = self.cluster.env();
        let socket = self.cluster.socket(self.via.get());
        for (k, v) in &mut env {
            if k == "CORRAL_AGENT_SOCKET" {
                *v = socket.to_string_lossy().into_owned();
            }
        }
        env
    }

    /// A Slurm command, as the test's own user, in the work directory.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin_dir().join("corral"));
        c.args(args)
            .envs(self.env())
            .current_dir(&self.work)
            .stdin(Stdio::null());
        c
    }

    /// A Slurm command run as another uid (tests run as root). The binary
    /// is copied where that uid can reach it: a checkout under a private
    /// home directory would not be.
    pub fn cmd_as(&self, uid: u32, args: &[&str]) -> Command {
        use std::os::unix::process::CommandExt;
        let copy = self
            .work
            .parent()
            .unwrap_or(&self.work)
            .join("corral-for-users");
        if !copy.exists() {
            std::fs::copy(bin_dir().join("corral"), &copy).expect("copying corral");
        }
        let mut c = Command::new(copy);
        c.args(args)
            .envs(self.env())
            .current_dir(&self.work)
            .stdin(Stdio::null())
            .uid(uid)
            .gid(uid);
        c
    }

    /// Runs a command; returns (status code, stdout, stderr).
    pub fn run(&self, args: &[&str]) -> (i32, String, String) {
        out(self.cmd(args).output().expect("running corral"))
    }

    /// Runs a command that must succeed; returns its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let (code, o, e) = self.run(args);
        assert_eq!(code, 0, "corral {args:?} failed: {e}");
        o
    }

    /// Submits a batch script (text) and returns the job id.
    pub fn sbatch(&self, extra: &[&str], script: &str) -> u64 {
        let path = self.work.join(format!("job-{}.sh", corral_proto::now_ms()));
        std::fs::write(&path, script).expect("writing the script");
        let mut args = vec!["sbatch", "--parsable"];
        args.extend_from_slice(extra);
        let p = path.to_string_lossy().into_owned();
        args.push(&p);
        self.ok(&args).trim().parse().expect("job id")
    }

    /// A job's state name (`squeue -t all`), or "" once forgotten.
    pub fn state(&self, job: u64) -> String {
        let id = job.to_string();
        self.ok(&["squeue", "-h", "-t", "all", "-j", &id, "-o", "%T"])
            .trim()
            .to_string()
    }

    /// Waits until the job is in one of the states; panics after `secs`.
    pub fn wait_state(&self, job: u64, states: &[&str], secs: u64) -> String {
        let t0 = Instant::now();
        loop {
            let st = self.state(job);
            if states.contains(&st.as_str()) {
                return st;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(secs),
                "job {job} is {st}, not {states:?}, after {secs}s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits for a predicate over `sinfo -N -h` output.
    pub fn wait_sinfo(&self, what: &str, f: impl Fn(&str) -> bool, secs: u64) -> String {
        let t0 = Instant::now();
        loop {
            let s = self.ok(&["sinfo", "-N", "-h"]);
            if f(&s) {
                return s;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(secs),
                "{what} not seen in {secs}s:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until node `node`'s `sinfo -N -h` line contains `word` (or,
    /// with `present == false`, no longer does).
    pub fn wait_node(&self, node: &str, word: &str, present: bool, secs: u64) -> String {
        let what = format!("{node} {}{word}", if present { "" } else { "not " });
        self.wait_sinfo(
            &what,
            |s| {
                s.lines()
                    .any(|l| l.starts_with(node) && l.contains(word) == present)
            },
            secs,
        )
    }

    pub fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.work.join(name)).unwrap_or_default()
    }
}

pub fn out(o: Output) -> (i32, String, String) {
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// A one-line batch job (`true`) with its output thrown away: the unit of
/// the throughput benches.
pub fn tiny_job(work: &Path, hold: bool) -> corral_proto::msg::JobSpec {
    use corral_proto::msg::{JobKind, JobSpec};
    JobSpec {
        name: "tiny".into(),
        hold,
        work_dir: work.to_string_lossy().into_owned(),
        env: corral_ctl::cli::opts::exported_env(None).unwrap_or_default(),
        kind: JobKind::Batch {
            script: "#!/bin/sh\ntrue\n".into(),
            args: vec![],
            stdout: Some("/dev/null".into()),
            stderr: None,
        },
        ..JobSpec::default()
    }
}

/// Takes a mount away when dropped, however the test ends; lazily, as a
/// daemon may still hold files there.
#[derive(Debug)]
pub struct Unmount(pub PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Whether the tests run as root (needed to submit as other users).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}
