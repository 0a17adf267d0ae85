//! `corral.toml`: the controller's configuration.
//!
//! ```toml
//! cluster = "corral"
//! listen = "0.0.0.0:6817"
//! certs = "/etc/corral/certs"      # ca.pem, corral-ctld.pem, corral-ctld.key
//! heartbeat_timeout = 30           # seconds of agent silence before DOWN
//! kill_wait = 30                   # seconds between SIGTERM and SIGKILL
//! allocation_timeout = 60          # seconds a salloc may go silent before its allocation ends
//! requeue_delay = 121              # seconds a requeued job waits before it may start again
//! leave_grace = 300                # seconds a deleted node's jobs get to finish
//! operators = [1000]               # uids that may act on any job and node
//! state_dir = "/var/spool/corral/ctld"   # durable state (none: in memory only)
//! policy = "conservative"          # or "easy", "fcfs"
//! array_reservations = 20          # an array's waiting tasks planned each pass (Slurm's bf_max_job_array_resv)
//!
//! [priority]                       # multifactor weights (Slurm's PriorityWeight*)
//! age = 1000                       # reached at max_age
//! max_age = 604800                 # seconds (7 days)
//! size = 0                         # the job's share of the cluster's CPUs or GPUs (1000: large first)
//! partition = 1000                 # the partition's tier
//! qos = 1000
//! fairshare = 10000
//!
//! [limits]                         # what may be queued (the defaults)
//! max_job_count = 1000000          # unfinished jobs in the whole cluster (an array's tasks each count)
//! max_jobs_per_user = 10000        # unfinished jobs of one user, tasks counted (operators: no limit)
//! max_script_size = 4194304        # bytes of one batch script (Slurm's default)
//! max_bytes_per_user = 268435456   # script and environment bytes of one user's unfinished jobs
//! max_array_size = 1001            # an array's indices are below this (Slurm's MaxArraySize)
//! max_job_id = 67043328            # ids wrap to 1 past this, skipping those in use (Slurm's MaxJobId)
//! max_text_len = 1024              # bytes of a job's name, comment, account, mail address
//! max_path_len = 4096              # bytes of a job's directories and file names
//! max_step_count = 40000           # steps one job may start (Slurm's MaxStepCount)
//! state_reserve = 1073741824       # free bytes kept on state_dir's disk: below, no new jobs
//!                                  # (default: the smaller of 1 GiB and 5% of that disk)
//! default_mem_per_cpu = 4000       # MB a CPU of a job without --mem holds (0: none;
//!                                  # default: its CPUs' share of the node's memory)
//!
//! [health]                        # checks that drain sick nodes
//! interval = 30                    # seconds between every node's GPU checks
//! max_temperature_c = 90
//! drain_xids = [48, 63, 64, 74, 79, 94, 95]
//!
//! [[health.command]]               # run by every agent, as root
//! name = "scratch"
//! command = "/usr/local/sbin/check-scratch"   # exit 0: healthy; stdout: the detail
//! interval = 60                    # default: health.interval
//! timeout = 10
//!
//! [[health.active]]                # a job ctld runs on idle nodes
//! name = "burn"
//! script = "#!/bin/sh\n/opt/gpu-burn 60\n"
//! nodes = 1                        # nodes per run (2: a communication test)
//! interval = 3600                  # seconds between runs on a node
//! time_limit = "10:00"
//!
//! [accounts]                     # Slurm's associations, read-only (sacctmgr show, sshare)
//! default = "default"              # the account of a job that names none, for users not listed
//!                                  # ("": none, as a Slurm without accounting shows (null))
//! [accounts.users]                 # each user's accounts, the first their default
//! alice = ["ml", "vision"]
//! bob = "ml"
//!
//! [accounting]                    # finished jobs, for sacct (default: SQLite in state_dir)
//! url = "postgres://corral@db/corral"   # or mysql://…, sqlite:///path
//! private = true                   # users see only their own jobs (operators: all)
//! enabled = true
//!
//! [[partition]]
//! name = "gpu"
//! nodes = "worker-[0-7]"           # hostlist, or "ALL"
//! default = true
//! default_time = "1:00:00"
//! max_time = "UNLIMITED"
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use corral_proto::msg::{CommandCheck, HealthConfig, Ident};
use scheduler_core::{BackfillPolicy, PartitionSpec, PriorityWeights};
use serde::Deserialize;

use crate::timefmt::parse_limit;

/// Why the configuration is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}")]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("{path}: partition {partition}: {message}")]
    Partition {
        path: PathBuf,
        partition: String,
        message: String,
    },
    #[error("{path}: policy must be conservative, easy or fcfs, not {policy}")]
    Policy { path: PathBuf, policy: String },
    #[error("{path}: no partitions")]
    NoPartitions { path: PathBuf },
    #[error(transparent)]
    Jail(Box<shared_root::config::ConfigError>),
    #[error("{path}: accounting: {message}")]
    Accounting { path: PathBuf, message: String },
    #[error("{path}: accounts: {message}")]
    Accounts { path: PathBuf, message: String },
    #[error("{path}: health check {check:?}: {message}")]
    Health {
        path: PathBuf,
        check: String,
        message: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default = "default_cluster")]
    cluster: String,
    #[serde(default = "default_listen")]
    listen: SocketAddr,
    #[serde(default = "default_certs")]
    certs: PathBuf,
    #[serde(default = "default_heartbeat")]
    heartbeat_timeout: u64,
    #[serde(default = "default_kill_wait")]
    kill_wait: u64,
    #[serde(default = "default_allocation_timeout")]
    allocation_timeout: u64,
    #[serde(default = "default_requeue_delay")]
    requeue_delay: u64,
    #[serde(default = "default_leave_grace")]
    leave_grace: u64,
    #[serde(default)]
    operators: Vec<u32>,
    state_dir: Option<PathBuf>,
    #[serde(default = "default_policy")]
    policy: String,
    #[serde(default = "default_array_reservations")]
    array_reservations: u32,
    #[serde(default = "default_min_job_age")]
    min_job_age: u64,
    #[serde(default)]
    priority: RawPriority,
    #[serde(default)]
    limits: Limits,
    #[serde(default)]
    partition: Vec<RawPartition>,
    #[serde(default)]
    health: RawHealth,
    /// Read by agents and `corral jail shell`; checked here.
    jail: Option<toml::Table>,
    #[serde(default)]
    accounting: RawAccounting,
    #[serde(default)]
    accounts: RawAccounts,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawAccounts {
    default: String,
    users: std::collections::BTreeMap<String, OneOrMany>,
}

impl Default for RawAccounts {
    fn default() -> Self {
        RawAccounts {
            default: "default".into(),
            users: Default::default(),
        }
    }
}

/// `bob = "ml"` or `alice = ["ml", "vision"]`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawAccounting {
    enabled: bool,
    url: Option<String>,
    private: bool,
}

impl Default for RawAccounting {
    fn default() -> Self {
        RawAccounting {
            enabled: true,
            url: None,
            private: true,
        }
    }
}

/// The multifactor priority's weights; every factor is in [0, 1], so a
/// weight is the most that factor adds. The scheduler core's defaults.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawPriority {
    age: u32,
    max_age: u64,
    size: u32,
    partition: u32,
    qos: u32,
    fairshare: u32,
}

impl Default for RawPriority {
    fn default() -> Self {
        let w = PriorityWeights::default();
        RawPriority {
            age: w.age,
            max_age: w.max_age,
            size: w.size,
            partition: w.partition,
            qos: w.qos,
            fairshare: w.fairshare,
        }
    }
}

/// Where finished jobs are recorded, and who may read them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcctConfig {
    /// `sqlite://…`, `postgres://…` or `mysql://…`.
    pub url: String,
    /// Users see only their own jobs (root and operators see all).
    pub private: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawHealth {
    interval: u64,
    max_temperature_c: u32,
    drain_xids: Vec<u32>,
    command: Vec<RawCommand>,
    active: Vec<RawActive>,
}

impl Default for RawHealth {
    fn default() -> Self {
        let d = HealthConfig::default();
        RawHealth {
            interval: d.interval_ms / 1000,
            max_temperature_c: d.max_temperature_c,
            drain_xids: d.drain_xids,
            command: Vec::new(),
            active: Vec::new(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCommand {
    name: String,
    command: String,
    interval: Option<u64>,
    #[serde(default = "default_check_timeout")]
    timeout: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawActive {
    name: String,
    script: String,
    #[serde(default = "default_active_nodes")]
    nodes: u32,
    #[serde(default = "default_active_interval")]
    interval: u64,
    #[serde(default = "default_active_limit")]
    time_limit: String,
}

fn default_check_timeout() -> u64 {
    10
}
fn default_active_nodes() -> u32 {
    1
}
fn default_active_interval() -> u64 {
    3600
}
fn default_active_limit() -> String {
    "10:00".into()
}

/// A check the controller runs as a job on idle nodes; its failure drains
/// the nodes it ran on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActiveCheck {
    pub name: String,
    pub script: String,
    /// Nodes per run.
    pub nodes: u32,
    /// Seconds between runs on a node.
    pub interval: u64,
    /// Seconds the run may take.
    pub time_limit: u64,
}

/// What one user, and the cluster as a whole, may queue. Operators are
/// held only to the cluster-wide count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Unfinished (pending, running, completing) jobs in the cluster.
    pub max_job_count: u64,
    /// Unfinished jobs of one user.
    pub max_jobs_per_user: u64,
    /// Bytes of one batch script.
    pub max_script_size: u64,
    /// Script, argument and environment bytes of one user's unfinished
    /// jobs, which the controller keeps in memory.
    pub max_bytes_per_user: u64,
    /// An array's task indices are below this (Slurm's `MaxArraySize`,
    /// 1001; an array costs one record until its tasks start, but each of
    /// its tasks counts against the job limits).
    pub max_array_size: u32,
    /// Job ids wrap back to 1 past this, skipping those still in use
    /// (Slurm's `MaxJobId`, 67,043,328): an array takes one id a task.
    pub max_job_id: u64,
    /// Bytes of a name, comment, account, partition, QOS, mail address
    /// or host name (Slurm's 1024).
    pub max_text_len: usize,
    /// Bytes of a path: the working and submit directories, the script's
    /// path, output and input files (Slurm's `PATH_MAX`, 4096).
    pub max_path_len: usize,
    /// Steps one job may start, srun's first among them (Slurm's
    /// `MaxStepCount`); how many run at once is each node's task budget.
    pub max_step_count: u32,
    /// Free bytes the state directory's filesystem keeps: below them no
    /// new job is taken, while completions, node traffic and accounting
    /// go on in what is left. None: the smaller of 1 GiB and a twentieth
    /// of the filesystem.
    pub state_reserve: Option<u64>,
    /// MB each CPU of a job that asks for no memory holds (Slurm's
    /// `DefMemPerCPU`); 0: none (no memory limit, placed as if it needed
    /// none). Unset: its CPUs' share of the node's memory.
    pub default_mem_per_cpu: Option<u64>,
}

impl Limits {
    /// What the scheduler gives a job that asks for no memory.
    pub fn default_memory(&self) -> scheduler_core::DefaultMemory {
        match self.default_mem_per_cpu {
            None => scheduler_core::DefaultMemory::ShareOfNode,
            Some(0) => scheduler_core::DefaultMemory::Nothing,
            Some(mb) => scheduler_core::DefaultMemory::PerCpu(mb),
        }
    }

    /// The free bytes kept on a filesystem of `size` bytes.
    pub fn reserve_on(&self, size: u64) -> u64 {
        self.state_reserve.unwrap_or((size / 20).min(1 << 30))
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_job_count: 1_000_000,
            max_jobs_per_user: 10_000,
            max_script_size: 4 << 20,
            max_bytes_per_user: 256 << 20,
            max_array_size: 1001,
            max_job_id: 67_043_328,
            max_text_len: 1024,
            max_path_len: 4096,
            max_step_count: 40_000,
            state_reserve: None,
            default_mem_per_cpu: None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPartition {
    name: String,
    nodes: String,
    #[serde(default)]
    default: bool,
    default_time: Option<String>,
    max_time: Option<String>,
    #[serde(default = "default_tier")]
    priority_tier: u32,
}

fn default_cluster() -> String {
    "corral".into()
}
fn default_listen() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 6817))
}
fn default_certs() -> PathBuf {
    "/etc/corral/certs".into()
}
fn default_heartbeat() -> u64 {
    30
}
fn default_kill_wait() -> u64 {
    30
}
/// Slurm's: a requeued job's begin time is `cred_expire` (120 s) and one
/// more second after the requeue (measured on Slurm 22.05).
fn default_requeue_delay() -> u64 {
    121
}

fn default_allocation_timeout() -> u64 {
    60
}
fn default_leave_grace() -> u64 {
    300
}
fn default_array_reservations() -> u32 {
    20
}

fn default_policy() -> String {
    "conservative".into()
}
fn default_min_job_age() -> u64 {
    300
}
fn default_tier() -> u32 {
    1
}

/// The controller's configuration, checked.
#[derive(Clone, Debug)]
pub struct Config {
    pub cluster: String,
    pub listen: SocketAddr,
    pub certs: PathBuf,
    /// Seconds of silence after which an agent's node is DOWN.
    pub heartbeat_timeout: u64,
    /// Seconds between SIGTERM and SIGKILL when a job is ended.
    pub kill_wait: u64,
    /// Seconds a running `salloc` allocation may go without its salloc
    /// saying it is alive (every 5 s) before it is ended.
    pub allocation_timeout: u64,
    /// Seconds a requeued job waits before it may start again (121 by
    /// default, as Slurm's).
    pub requeue_delay: u64,
    /// Seconds a deleted node's running jobs get to finish.
    pub leave_grace: u64,
    pub operators: Vec<u32>,
    /// Where the controller keeps its durable state (`None`: in memory
    /// only, lost on restart).
    pub state_dir: Option<PathBuf>,
    pub policy: BackfillPolicy,
    /// How many of an array's waiting tasks each pass plans under
    /// conservative backfill (Slurm's `bf_max_job_array_resv`, 20).
    pub array_reservations: u32,
    /// The multifactor priority's weights (`[priority]`).
    pub weights: PriorityWeights,
    /// Seconds a finished job stays visible to squeue and scontrol.
    pub min_job_age: u64,
    pub limits: Limits,
    pub partitions: Vec<PartitionSpec>,
    /// What every agent checks on its node.
    pub health: HealthConfig,
    /// Checks run as jobs on idle nodes.
    pub active_checks: Vec<ActiveCheck>,
    /// The shared root jobs run in (agents read it from this file).
    pub jail: Option<shared_root::config::JailSection>,
    /// Who active checks run as: the controller's own user (root in a
    /// real cluster; the person running `corral up` otherwise). Set by
    /// corral-ctld at start; root until then.
    pub check_user: Ident,
    /// Finished jobs are recorded here (`None`: no accounting).
    pub accounting: Option<AcctConfig>,
    /// Who may charge which account (`[accounts]`).
    pub accounts: super::accounts::Accounts,
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut config = Config::parse(path, &text)?;
        config.accounts.resolve(|name| {
            nix::unistd::User::from_name(name)
                .ok()
                .flatten()
                .map(|u| u.uid.as_raw())
        });
        Ok(config)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
        let policy = match raw.policy.as_str() {
            "conservative" => BackfillPolicy::Conservative,
            "easy" => BackfillPolicy::Easy,
            "fcfs" => BackfillPolicy::Fcfs,
            other => {
                return Err(ConfigError::Policy {
                    path: path.to_path_buf(),
                    policy: other.to_string(),
                })
            }
        };
        if raw.partition.is_empty() {
            return Err(ConfigError::NoPartitions {
                path: path.to_path_buf(),
            });
        }
        let mut partitions = Vec::new();
        for p in raw.partition {
            let err = |message: String| ConfigError::Partition {
                path: path.to_path_buf(),
                partition: p.name.clone(),
                message,
            };
            if p.nodes != "ALL" {
                scheduler_core::hostlist::expand(&p.nodes).map_err(|e| err(e.to_string()))?;
            }
            let mut spec = PartitionSpec::new(p.name.clone(), p.nodes.clone());
            spec.is_default = p.default;
            spec.priority_tier = p.priority_tier;
            spec.default_time = match &p.default_time {
                Some(t) => parse_limit(t).map_err(err)?,
                None => None,
            };
            spec.max_time = match &p.max_time {
                Some(t) => parse_limit(t).map_err(err)?,
                None => None,
            };
            partitions.push(spec);
        }
        let (health, active_checks) = health(path, raw.health)?;
        let jail = match raw.jail {
            Some(_) => shared_root::config::JailSection::parse(path, text)
                .map_err(|e| ConfigError::Jail(Box::new(e)))?,
            None => None,
        };
        let accounting = accounting(path, raw.accounting, raw.state_dir.as_deref())?;
        let accounts = accounts(path, raw.accounts, raw.limits.max_text_len)?;
        Ok(Config {
            accounts,
            accounting,
            jail,
            health,
            active_checks,
            check_user: Ident { uid: 0, gid: 0 },
            cluster: raw.cluster,
            listen: raw.listen,
            certs: raw.certs,
            heartbeat_timeout: raw.heartbeat_timeout.max(1),
            kill_wait: raw.kill_wait,
            allocation_timeout: raw.allocation_timeout.max(15),
            requeue_delay: raw.requeue_delay,
            leave_grace: raw.leave_grace,
            operators: raw.operators,
            state_dir: raw.state_dir,
            policy,
            array_reservations: raw.array_reservations,
            weights: PriorityWeights {
                age: raw.priority.age,
                max_age: raw.priority.max_age,
                size: raw.priority.size,
                partition: raw.priority.partition,
                qos: raw.priority.qos,
                fairshare: raw.priority.fairshare,
            },
            min_job_age: raw.min_job_age,
            limits: raw.limits,
            partitions,
        })
    }
}

/// `[accounts]`, checked: names printable and short, no user without an
/// account.
fn accounts(
    path: &Path,
    raw: RawAccounts,
    max_text: usize,
) -> Result<super::accounts::Accounts, ConfigError> {
    let err = |message: String| ConfigError::Accounts {
        path: path.to_path_buf(),
        message,
    };
    let name_ok = |what: &str, name: &str| -> Result<(), ConfigError> {
        let bad = name.is_empty()
            || name.len() > max_text
            || name
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || matches!(c, ',' | '|' | '='));
        if bad {
            return Err(err(format!(
                "{what} {name:?} must be 1 to {max_text} bytes without spaces, commas, '|' or '='"
            )));
        }
        Ok(())
    };
    if !raw.default.is_empty() {
        name_ok("account", &raw.default)?;
    }
    let mut users = Vec::new();
    for (user, list) in raw.users {
        name_ok("user", &user)?;
        let list = match list {
            OneOrMany::One(a) => vec![a],
            OneOrMany::Many(v) => v,
        };
        if list.is_empty() {
            return Err(err(format!("user {user} has no account")));
        }
        for a in &list {
            name_ok("account", a)?;
        }
        let mut seen = std::collections::HashSet::new();
        let list: Vec<String> = list
            .into_iter()
            .filter(|a| seen.insert(a.clone()))
            .collect();
        users.push((user, list));
    }
    Ok(super::accounts::Accounts::new(
        (!raw.default.is_empty()).then_some(raw.default),
        users,
    ))
}

/// The accounting database: the configured URL, else SQLite beside the
/// state; none without either.
fn accounting(
    path: &Path,
    raw: RawAccounting,
    state_dir: Option<&Path>,
) -> Result<Option<AcctConfig>, ConfigError> {
    if !raw.enabled {
        return Ok(None);
    }
    let url = match (raw.url, state_dir) {
        (Some(u), _) => u,
        (None, Some(dir)) => format!("sqlite://{}", dir.join("accounting.sqlite").display()),
        (None, None) => return Ok(None),
    };
    let known = ["sqlite:", "postgres:", "postgresql:", "mysql:", "mariadb:"];
    if !known.iter().any(|k| url.starts_with(k)) {
        return Err(ConfigError::Accounting {
            path: path.to_path_buf(),
            message: "url must start with sqlite:, postgres: or mysql:".into(),
        });
    }
    Ok(Some(AcctConfig {
        url,
        private: raw.private,
    }))
}

/// A check's name becomes part of a drain reason: short, printable, one
/// word.
fn check_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

fn health(path: &Path, raw: RawHealth) -> Result<(HealthConfig, Vec<ActiveCheck>), ConfigError> {
    let err = |check: &str, message: &str| ConfigError::Health {
        path: path.to_path_buf(),
        check: check.to_string(),
        message: message.to_string(),
    };
    if raw.interval == 0 {
        return Err(err("interval", "must be at least 1 second"));
    }
    let mut names = std::collections::HashSet::new();
    let names_ok = |name: &str, names: &mut std::collections::HashSet<String>| {
        if !check_name_ok(name) {
            return Err(err(name, "a name is letters, digits, '-', '_' or '.'"));
        }
        if name == "gpu" || name == "agent" || !names.insert(name.to_string()) {
            return Err(err(name, "this name is taken"));
        }
        Ok(())
    };
    let mut commands = Vec::new();
    for c in raw.command {
        names_ok(&c.name, &mut names)?;
        if c.command.trim().is_empty() {
            return Err(err(&c.name, "empty command"));
        }
        let interval = c.interval.unwrap_or(raw.interval);
        if interval == 0 || c.timeout == 0 {
            return Err(err(
                &c.name,
                "interval and timeout must be at least 1 second",
            ));
        }
        commands.push(CommandCheck {
            name: c.name,
            command: c.command,
            interval_ms: interval.saturating_mul(1000),
            timeout_ms: c.timeout.saturating_mul(1000),
        });
    }
    let mut active = Vec::new();
    for a in raw.active {
        names_ok(&a.name, &mut names)?;
        if a.nodes == 0 || a.interval == 0 {
            return Err(err(&a.name, "nodes and interval must be at least 1"));
        }
        let time_limit = parse_limit(&a.time_limit)
            .map_err(|m| err(&a.name, &m))?
            .ok_or_else(|| err(&a.name, "an active check needs a time limit"))?;
        active.push(ActiveCheck {
            name: a.name,
            script: a.script,
            nodes: a.nodes,
            interval: a.interval,
            time_limit,
        });
    }
    let cfg = HealthConfig {
        interval_ms: raw.interval.saturating_mul(1000),
        max_temperature_c: raw.max_temperature_c,
        drain_xids: raw.drain_xids,
        commands,
    };
    Ok((cfg, active))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `[accounts]`: a user's first account is their default; an empty
    /// list, a name with a space, a comma, a '|' or a control character,
    /// or one over the text limit is refused with the section named.
    #[test]
    fn accounts_are_checked() {
        let parse = |accounts: &str| {
            Config::parse(
                Path::new("c.toml"),
                &format!("{accounts}\n[[partition]]\nname = \"p\"\nnodes = \"ALL\"\n"),
            )
        };
        let c = parse("[accounts]\ndefault = \"general\"\n[accounts.users]\n\"1000\" = [\"ml\", \"vision\", \"ml\"]\n\"1001\" = \"physics\"\n").unwrap();
        assert_eq!(c.accounts.default_for(1000), Some("ml"));
        assert_eq!(c.accounts.default_for(1001), Some("physics"));
        assert_eq!(c.accounts.default_for(7), Some("general"));
        let long = "a".repeat(2000);
        for bad in [
            "[accounts.users]\nalice = []\n".to_string(),
            "[accounts.users]\nalice = \"m l\"\n".into(),
            "[accounts.users]\nalice = \"a,b\"\n".into(),
            "[accounts.users]\nalice = \"a|b\"\n".into(),
            "[accounts.users]\nalice = \"a\\u001bb\"\n".into(),
            format!("[accounts]\ndefault = \"{long}\"\n"),
            "[accounts]\nfrobs = 1\n".into(),
        ] {
            let e = parse(&bad).unwrap_err().to_string();
            assert!(e.starts_with("c.toml"), "{bad}: {e}");
        }
        let e = parse("[accounts.users]\nalice = []\n")
            .unwrap_err()
            .to_string();
        assert_eq!(e, "c.toml: accounts: user alice has no account");
    }

    #[test]
    fn parses_a_cluster() {
        let c = Config::parse(
            Path::new("c.toml"),
            "cluster = \"x\"\nlisten = \"127.0.0.1:7000\"\nheartbeat_timeout = 5\n\
             [[partition]]\nname = \"gpu\"\nnodes = \"worker-[0-7]\"\ndefault = true\nmax_time = \"1-00:00:00\"\n",
        )
        .unwrap();
        assert_eq!(c.cluster, "x");
        assert_eq!(c.heartbeat_timeout, 5);
        assert_eq!(c.partitions[0].max_time, Some(86400));
        assert!(c.partitions[0].is_default);
        assert_eq!(c.health, HealthConfig::default());
    }

    #[test]
    fn priority_weights_default_to_the_scheduler_core_and_may_be_set() {
        let base = "[[partition]]\nname = \"p\"\nnodes = \"ALL\"\n";
        let c = Config::parse(Path::new("c.toml"), base).unwrap();
        assert_eq!(c.weights, PriorityWeights::default());
        let c = Config::parse(
            Path::new("c.toml"),
            &format!("[priority]\nsize = 500\nfairshare = 0\nmax_age = 3600\n{base}"),
        )
        .unwrap();
        assert_eq!(
            c.weights,
            PriorityWeights {
                size: 500,
                fairshare: 0,
                max_age: 3600,
                ..PriorityWeights::default()
            }
        );
    }

    #[test]
    fn parses_health_checks() {
        let c = Config::parse(
            Path::new("c.toml"),
            "[health]\ninterval = 5\nmax_temperature_c = 80\n\
             [[health.command]]\nname = \"scratch\"\ncommand = \"df /scratch\"\ntimeout = 3\n\
             [[health.active]]\nname = \"nccl\"\nscript = \"#!/bin/sh\\ntrue\\n\"\nnodes = 2\n\
             [[partition]]\nname = \"p\"\nnodes = \"ALL\"\n",
        )
        .unwrap();
        assert_eq!(c.health.interval_ms, 5000);
        assert_eq!(c.health.max_temperature_c, 80);
        assert_eq!(
            c.health.commands,
            [CommandCheck {
                name: "scratch".into(),
                command: "df /scratch".into(),
                interval_ms: 5000,
                timeout_ms: 3000,
            }]
        );
        assert_eq!(c.active_checks[0].nodes, 2);
        assert_eq!(c.active_checks[0].time_limit, 600);
        assert_eq!(c.active_checks[0].script, "#!/bin/sh\ntrue\n");
    }

    #[test]
    fn broken_configs_say_where() {
        for (text, want) in [
            (
                "[[partition]]\nname = \"p\"\nnodes = \"w-[3-1]\"\n",
                "partition p",
            ),
            ("listen = 5\n", "c.toml"),
            (
                "policy = \"random\"\n[[partition]]\nname=\"p\"\nnodes=\"ALL\"\n",
                "policy",
            ),
            ("cluster = \"x\"\n", "no partitions"),
            ("bogus = 1\n", "c.toml"),
            (
                "[priority]\njobsize = 1\n[[partition]]\nname=\"p\"\nnodes=\"ALL\"\n",
                "jobsize",
            ),
            (
                "[[partition]]\nname = \"p\"\nnodes = \"ALL\"\nmax_time = \"soon\"\n",
                "time limit",
            ),
            (
                "[jail]\nroot = \"srv\"\n[[partition]]\nname=\"p\"\nnodes=\"ALL\"\n",
                "c.toml: [jail]: root must be an absolute path",
            ),
            (
                "[[health.command]]\nname = \"gpu\"\ncommand = \"true\"\n[[partition]]\nname=\"p\"\nnodes=\"ALL\"\n",
                "health check \"gpu\": this name is taken",
            ),
            (
                "[[health.command]]\nname = \"a b\"\ncommand = \"true\"\n[[partition]]\nname=\"p\"\nnodes=\"ALL\"\n",
                "health check \"a b\"",
            ),
            (
                "[[health.active]]\nname = \"x\"\nscript = \"s\"\ntime_limit = \"UNLIMITED\"\n[[partition]]\nname=\"p\"\nnodes=\"ALL\"\n",
                "needs a time limit",
            ),
        ] {
            let e = Config::parse(Path::new("c.toml"), text).unwrap_err();
            let msg = format!(
                "{e}: {}",
                e.source().map(|s| s.to_string()).unwrap_or_default()
            );
            assert!(msg.contains(want), "{msg}");
        }
    }

    use std::error::Error;
}
