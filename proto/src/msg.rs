//! The messages controller, agents, the CLI and srun exchange. Plain data:
//! what each side does with them lives in its own crate.
//!
//! Streams and who opens them:
//! - agent → ctld, one long-lived bidirectional stream per connection:
//!   [`Open::Control`] first, then [`AgentMsg`] up and [`CtldMsg`] down.
//! - anyone with a cluster certificate → ctld, one stream per request:
//!   [`Open::Request`] carrying a [`crate::cred::Token`], answered by one
//!   [`Response`].
//! - CLI → local agent over a Unix socket: [`LocalRequest`] frames, each
//!   answered by one [`Response`]; the agent relays them to ctld.
//! - agent → srun (dial back), one stream per node of a step:
//!   [`StepUp`] up, [`StepDown`] down.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::cred::Token;
pub use crate::ids::{Ident, JobId, JobRun, StepId};

/// Seconds since the Unix epoch.
pub type UnixSecs = u64;

/// The first frame of every stream opened to ctld.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[allow(clippy::large_enum_variant)]
pub enum Open {
    /// An agent registers its node; the stream stays open for its life.
    Control(Registration),
    /// One request on behalf of the user the token names.
    Request { token: Token, request: Request },
}

/// What a CLI asks its local agent.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[allow(clippy::large_enum_variant)]
pub enum LocalRequest {
    /// Forward this to ctld with a credential for the caller.
    Relay(Request),
    /// Mint a credential for the caller and return it
    /// ([`Response::Credential`]).
    Credential,
    /// The address the cluster reaches this node at
    /// ([`Response::Address`]).
    NodeAddress,
}

/// A node as its agent reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registration {
    pub name: String,
    pub cpus: u32,
    pub memory_mb: u64,
    pub gpus: Vec<GpuInfo>,
    pub features: Vec<String>,
    /// Key the agent signs credentials with (HMAC-SHA256), sent only over
    /// the mutually authenticated connection.
    pub credential_key: Vec<u8>,
    /// Jobs the agent still runs (after a reconnect), with their runs.
    pub running: Vec<JobRun>,
    /// The steps of those runs the agent was sent: a launch that did not
    /// arrive (lost with a connection or a controller) is sent again.
    pub launched: Vec<Launched>,
    /// Unix milliseconds up to which the agent forgot runs that ended
    /// here (it keeps them a while, sending their ends again): a run
    /// started later that it neither runs nor was launched never arrived;
    /// one started earlier may have ended unheard. 0: none forgotten.
    pub forgot_ended_before: u64,
    /// Drawn at random when the agent starts: a node that registers again
    /// with another one restarted, and its jobs' processes died with it.
    pub instance: u64,
    pub agent_version: String,
    /// The node's kernel as `uname` names it (system, release, version):
    /// `scontrol show node`'s `OS=`.
    pub os: String,
}

/// The steps of one run a node was sent. Launches reach a node in the
/// order ctld sent them, so a node that has step `n` has every step ctld
/// sent it before; it runs none twice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launched {
    pub run: JobRun,
    /// The batch script's step.
    pub batch: bool,
    /// One more than the highest numbered step (0 when none).
    pub next: u32,
}

impl Launched {
    /// Whether the node was sent `step` of this run.
    pub fn has(&self, step: StepId) -> bool {
        if step == StepId::BATCH {
            self.batch
        } else {
            step.0 < self.next
        }
    }
}

/// One GPU of a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    pub index: u32,
    pub uuid: String,
    pub memory_mb: u64,
    /// Topology group (NVLink domain, NUMA node).
    pub group: u32,
    /// The model jobs name it by (`--gres=gpu:h200:1`): NVML's name in
    /// Slurm's form, or the simulation's; empty when untyped.
    pub model: String,
}

/// Agent → ctld on the control stream.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum AgentMsg {
    Heartbeat {
        running: Vec<JobRun>,
    },
    /// All tasks of a step on this node have ended.
    StepExited {
        job: JobRun,
        step: StepId,
        exit: ExitStatus,
        /// The kernel killed a process of the job for exceeding its
        /// memory limit while the step ran.
        oom: bool,
    },
    /// A launch failed before any task ran.
    LaunchFailed {
        job: JobRun,
        step: StepId,
        message: String,
    },
    /// Every process of the job's run on this node is gone (after
    /// [`CtldMsg::Terminate`]).
    JobCleaned {
        job: JobRun,
        /// What the run used on this node (from its cgroup), where the
        /// node measures it.
        usage: Option<JobUsage>,
    },
    /// The agent's own health changed: `Some` says why it cannot run more
    /// work (ctld drains the node for it), `None` that it can again. Sent
    /// after each registration too.
    Health {
        problem: Option<String>,
    },
    /// The agent is stopping (SIGTERM): drain the node, let its jobs
    /// finish within `grace_ms`, then remove it ([`CtldMsg::Farewell`]).
    Leaving {
        grace_ms: u64,
    },
    /// The batch step of a job that runs on this node alone ended, and
    /// nothing of the run is left here: [`AgentMsg::StepExited`] and
    /// [`AgentMsg::JobCleaned`] at once, with no
    /// [`CtldMsg::Terminate`] between them.
    BatchDone {
        job: JobRun,
        exit: ExitStatus,
        oom: bool,
        usage: Option<JobUsage>,
    },
}

/// How a step ended on one node: the highest exit code of its tasks, and
/// the signal that ended one, if any.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    bincode::Encode,
    bincode::Decode,
)]
pub struct ExitStatus {
    pub code: i32,
    pub signal: Option<i32>,
}

/// What a job's run used on one node.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    bincode::Encode,
    bincode::Decode,
)]
pub struct JobUsage {
    /// CPU time of all its processes, user and system.
    pub cpu_ms: u64,
    /// Peak memory of its processes together.
    pub max_rss_kb: u64,
}

impl ExitStatus {
    pub fn success(&self) -> bool {
        self.code == 0 && self.signal.is_none()
    }
}

impl From<std::process::ExitStatus> for ExitStatus {
    /// A process's end as a shell reports it: its code, or 128 + the
    /// signal that ended it.
    fn from(st: std::process::ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        match (st.code(), st.signal()) {
            (Some(code), _) => ExitStatus { code, signal: None },
            (None, Some(sig)) => ExitStatus {
                code: 128 + sig,
                signal: Some(sig),
            },
            _ => ExitStatus {
                code: 1,
                signal: None,
            },
        }
    }
}

/// XIDs after which a GPU should get no more work until someone looks:
/// double-bit ECC (48), row remapping failures (63, 64), NVLink (74),
/// fallen off the bus (79), uncontained ECC (94, 95).
pub const DEFAULT_DRAIN_XIDS: [u32; 7] = [48, 63, 64, 74, 79, 94, 95];

/// The checks every agent runs on its node (`[health]` in ctld's
/// `corral.toml`): the built-in GPU checks and operators' commands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthConfig {
    /// How often the GPU checks run.
    pub interval_ms: u64,
    pub max_temperature_c: u32,
    /// XIDs that drain the node.
    pub drain_xids: Vec<u32>,
    pub commands: Vec<CommandCheck>,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            interval_ms: 30_000,
            max_temperature_c: 90,
            drain_xids: DEFAULT_DRAIN_XIDS.to_vec(),
            commands: Vec::new(),
        }
    }
}

/// An operator's check: a command every agent runs (as root, with
/// `/bin/sh -c`) every `interval_ms`. Exit 0 is healthy; otherwise the
/// first line of its standard output is the detail of the drain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandCheck {
    pub name: String,
    pub command: String,
    pub interval_ms: u64,
    pub timeout_ms: u64,
}

/// ctld → agent on the control stream.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[allow(clippy::large_enum_variant)]
pub enum CtldMsg {
    Welcome {
        heartbeat_ms: u64,
        /// The address ctld sees the agent at: where other nodes can reach
        /// this one (srun advertises it for dial-back).
        seen_as: std::net::IpAddr,
        /// The checks the agent runs on its node.
        health: HealthConfig,
    },
    Refused {
        reason: String,
    },
    Launch(Launch),
    /// Deliver a signal to the tasks of a job's run.
    Signal {
        job: JobRun,
        to: SignalTo,
        signal: i32,
    },
    /// Stop every process of the job's run on this node (`stop`), or let
    /// them go on: the job's cgroup frozen and thawed, or without one,
    /// SIGSTOP and SIGCONT to its tasks' groups.
    Suspend {
        job: JobRun,
        stop: bool,
    },
    /// End the job's run on this node: SIGTERM, then SIGKILL after the
    /// grace, then [`AgentMsg::JobCleaned`].
    Terminate {
        job: JobRun,
        grace_ms: u64,
    },
    /// The node has left the cluster: the agent may exit.
    Farewell,
}

/// One step of a job on one node.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Launch {
    pub job: JobId,
    /// Which run of the job this is (0 first, then one more per requeue).
    pub run: u32,
    pub step: StepId,
    pub name: String,
    pub user: Ident,
    pub partition: String,
    pub work_dir: String,
    /// The submitter's environment as `--export` chose it.
    pub env: Vec<(String, String)>,
    /// Every node of the job, in order; `SLURM_JOB_NODELIST` compresses it.
    pub job_nodes: Vec<String>,
    /// This node's index among the step's nodes (`SLURM_NODEID`).
    pub node_index: u32,
    /// Nodes of the step (`SLURM_NNODES` of a step).
    pub step_nodes: u32,
    /// Tasks of the step (`SLURM_NTASKS`).
    pub ntasks: u32,
    /// Global id of this node's first task (`SLURM_PROCID` base).
    pub first_task: u32,
    /// Tasks on this node.
    pub tasks_here: u32,
    pub cpus_per_task: u32,
    /// The job's CPUs on this node.
    pub cpus: Vec<u32>,
    /// The job's GPUs on this node; with `gpus_per_task`, task `i` here owns
    /// `gpus[i*g..(i+1)*g]`.
    pub gpus: Vec<u32>,
    pub gpus_per_task: Option<u32>,
    pub memory_mb: u64,
    /// The job's time limit in seconds (information for the task).
    pub time_limit: Option<u64>,
    /// The job holds its nodes alone (`--exclusive`): it may be given
    /// what escapes a job's limits, such as the node's Docker socket.
    pub exclusive: bool,
    pub what: LaunchKind,
    /// The step's own GPUs here, when it asked for fewer than the job's
    /// (what its tasks see; the job's cgroup still holds all of `gpus`).
    pub step_gpus: Option<Vec<u32>>,
    /// What the job's and the step's tasks see of the whole: the job's
    /// tasks and CPUs on each of its nodes, the step's tasks on each of
    /// its nodes (the job's first ones).
    pub shape: LaunchShape,
    /// The array this job is a task of.
    pub array: Option<ArrayEnv>,
}

/// What a task of an array sees of it (`SLURM_ARRAY_*`, `%A`, `%a`).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ArrayEnv {
    pub job: JobId,
    pub task: u32,
    pub count: u32,
    pub min: u32,
    pub max: u32,
    pub step: u32,
}

/// The job's and the step's layout over their nodes, for the variables
/// launchers compute ranks from (`SLURM_TASKS_PER_NODE`,
/// `SLURM_JOB_CPUS_PER_NODE`, `SLURM_STEP_NODELIST`, ...), and where the
/// job came from.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LaunchShape {
    pub job_tasks: Vec<u32>,
    pub job_cpus: Vec<u32>,
    pub step_tasks: Vec<u32>,
    pub ntasks_per_node: Option<u32>,
    /// `-c` was given (`SLURM_CPUS_PER_TASK` is set only then).
    pub cpus_per_task_given: bool,
    pub submit_dir: Option<String>,
    pub submit_host: Option<String>,
    pub qos: Option<String>,
    pub account: Option<String>,
    /// The step's nodes, when they are not the job's first ones
    /// (`srun -w`/`-x` inside a job; `SLURM_STEP_NODELIST`).
    pub step_nodes: Vec<String>,
}

impl Launch {
    /// The job and run this launch belongs to.
    pub fn job_run(&self) -> JobRun {
        JobRun {
            job: self.job,
            run: self.run,
        }
    }
}

/// What a step runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum LaunchKind {
    /// The batch script, on the job's first node, output to files.
    Batch {
        /// Any bytes (Slurm takes scripts that are not UTF-8).
        script: Vec<u8>,
        args: Vec<String>,
        stdout: String,
        stderr: Option<String>,
        /// `--open-mode=append`: output files are appended to, not
        /// truncated.
        append: bool,
    },
    /// `srun`'s command, with I/O streamed to srun (or, with `files`,
    /// to and from files on the nodes).
    Step {
        argv: Vec<String>,
        io: StepIo,
        files: TaskFiles,
    },
}

/// `srun -o/-e/-i`: each task's files, as patterns (`%t` task, `%n` node
/// of the step, `%N` node name, `%j` job, `%s` step, ...), opened by the
/// task on its node, relative to its working directory. `None`: streamed
/// to and from srun.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskFiles {
    pub stdout: Option<String>,
    pub stderr: Option<String>,
    pub stdin: Option<String>,
    /// `--pty`: task 0 runs on a terminal of its own, which srun's
    /// terminal drives (input, Ctrl-C, window size).
    pub pty: bool,
}

impl TaskFiles {
    /// The bytes of its user's text.
    pub fn len(&self) -> usize {
        [&self.stdout, &self.stderr, &self.stdin]
            .into_iter()
            .flatten()
            .map(String::len)
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.stdout.is_none() && self.stderr.is_none() && self.stdin.is_none() && !self.pty
    }
}

/// Where a step's I/O goes: srun's endpoint and how to trust it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepIo {
    pub addr: SocketAddr,
    /// SHA-256 of srun's self-signed certificate.
    pub cert_sha256: [u8; 32],
    /// Shown by the agent when it dials back, so srun knows it.
    pub secret: [u8; 32],
}

/// Agent → srun.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum StepUp {
    Hello {
        secret: [u8; 32],
        node: String,
        node_index: u32,
        step_nodes: u32,
        /// Tasks of the whole step.
        ntasks: u32,
        /// This node's tasks.
        tasks: Vec<u32>,
    },
    Output {
        task: u32,
        stderr: bool,
        data: Vec<u8>,
    },
    TaskExit {
        task: u32,
        exit: ExitStatus,
    },
    /// The launch failed on this node.
    Failed {
        message: String,
    },
}

/// srun → agent.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum StepDown {
    Stdin(Vec<u8>),
    StdinEof,
    Signal(i32),
    /// srun's terminal changed size (`--pty`).
    WindowSize {
        rows: u16,
        cols: u16,
    },
}

/// How a job asks for GPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum GpuAsk {
    #[default]
    None,
    PerNode(u32),
    PerTask(u32),
    Total(u32),
}

/// What `sbatch` and `srun` submit.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct JobSpec {
    pub name: String,
    pub partition: Option<String>,
    pub nodes: Option<u32>,
    pub ntasks: Option<u32>,
    pub ntasks_per_node: Option<u32>,
    pub cpus_per_task: Option<u32>,
    pub mem_mb: Option<u64>,
    /// `--mem=0`: each node's whole memory.
    pub mem_whole: bool,
    /// `--mem-per-cpu`, `--mem-per-gpu`.
    pub mem_per_cpu_mb: Option<u64>,
    pub mem_per_gpu_mb: Option<u64>,
    pub gpus: GpuAsk,
    /// `--gres=gpu:TYPE:N` and the like: GPUs of this model only.
    pub gpu_type: Option<String>,
    pub exclusive: bool,
    pub time_limit: Option<u64>,
    pub nodelist: Vec<String>,
    pub exclude: Vec<String>,
    pub requeue: bool,
    pub hold: bool,
    /// `--dependency`.
    pub dependencies: Vec<Dep>,
    /// The dependencies were joined by `?`: any one suffices.
    pub dependency_any: bool,
    /// `--kill-on-invalid-dep=yes`: a dependency that can never be met
    /// cancels the job rather than leaving it pending.
    pub kill_on_invalid_dep: bool,
    /// `--begin`, as a Unix time.
    pub begin: Option<UnixSecs>,
    pub qos: Option<String>,
    /// `-A` (none: the user's default, `[accounts]`): sacct's Account,
    /// `SLURM_JOB_ACCOUNT`, and what fair-share charges.
    pub account: Option<String>,
    pub nice: i32,
    pub work_dir: String,
    pub env: Vec<(String, String)>,
    pub kind: JobKind,
    /// `-C/--constraint`: node features, all of them (`a&b`) or with
    /// `constraint_any`, one of them (`a|b`).
    pub constraint: Vec<String>,
    pub constraint_any: bool,
    /// `--signal`.
    pub limit_signal: Option<LimitSignal>,
    /// Where and on which host the job was submitted
    /// (`SLURM_SUBMIT_DIR`, `SLURM_SUBMIT_HOST`); the work directory is
    /// another (`-D`).
    pub submit_dir: Option<String>,
    pub submit_host: Option<String>,
    /// `--open-mode=append` (Slurm's default truncates).
    pub open_append: bool,
    /// `--comment`.
    /// The batch script's absolute path as sbatch read it (scontrol's
    /// `Command`, with the script's arguments); `None` for `--wrap` and a
    /// script from standard input.
    pub script_path: Option<String>,
    pub comment: Option<String>,
    /// `--mail-type` (Slurm's names, comma-separated, checked by the CLI)
    /// and `--mail-user`: recorded with the job.
    pub mail_type: Option<String>,
    pub mail_user: Option<String>,
    /// `--array`.
    pub array: Option<ArraySpec>,
    /// `--wckey`: recorded (squeue `%w`, sacct WCKey); Corral keeps no
    /// accounting by it, as a Slurm without `TrackWCKey`.
    pub wckey: Option<String>,
}

/// `--array`: the task indices, ascending, as runs, and `%N`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArraySpec {
    pub runs: Vec<IndexRun>,
    /// At most this many tasks run at once; 0 for no limit.
    pub throttle: u32,
}

/// Indices `first, first + step, ...`, `count` of them.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, bincode::Encode, bincode::Decode,
)]
pub struct IndexRun {
    pub first: u32,
    pub count: u32,
    pub step: u32,
}

impl IndexRun {
    fn last(&self) -> u32 {
        self.first + (self.count - 1) * self.step
    }
}

impl ArraySpec {
    /// How many tasks.
    pub fn len(&self) -> u32 {
        self.runs.iter().map(|r| r.count).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The index of the task at `position` (0-based, ascending).
    pub fn index(&self, mut position: u32) -> Option<u32> {
        for r in &self.runs {
            if position < r.count {
                return Some(r.first + position * r.step);
            }
            position -= r.count;
        }
        None
    }

    /// The position of the task with index `index`.
    pub fn position(&self, index: u32) -> Option<u32> {
        let mut before = 0;
        for r in &self.runs {
            if index >= r.first && index <= r.last() && (index - r.first) % r.step == 0 {
                return Some(before + (index - r.first) / r.step);
            }
            before += r.count;
        }
        None
    }

    pub fn min(&self) -> u32 {
        self.runs.first().map_or(0, |r| r.first)
    }

    pub fn max(&self) -> u32 {
        self.runs.last().map_or(0, IndexRun::last)
    }

    /// Slurm's `SLURM_ARRAY_TASK_STEP`: the step of an array that is one
    /// stepped range, else 1.
    pub fn step(&self) -> u32 {
        match self.runs.as_slice() {
            [r] if r.count > 1 => r.step,
            _ => 1,
        }
    }

    /// The indices at positions `[from, to)`, as runs.
    pub fn slice(&self, from: u32, to: u32) -> Vec<IndexRun> {
        let mut out = Vec::new();
        let mut before = 0;
        for r in &self.runs {
            let (a, b) = (from.max(before), to.min(before + r.count));
            if a < b {
                out.push(IndexRun {
                    first: r.first + (a - before) * r.step,
                    count: b - a,
                    step: r.step,
                });
            }
            before += r.count;
        }
        out
    }
}

/// Indices as Slurm writes them: `1,3,5-7`, `0-15:4`, with `%N` after.
pub fn format_indices(runs: &[IndexRun], throttle: u32) -> String {
    let mut out = String::new();
    for r in runs {
        if !out.is_empty() {
            out.push(',');
        }
        match (r.count, r.step) {
            (1, _) => out.push_str(&r.first.to_string()),
            (2, s) if s > 1 => out.push_str(&format!("{},{}", r.first, r.last())),
            (_, 1) => out.push_str(&format!("{}-{}", r.first, r.last())),
            (_, s) => out.push_str(&format!("{}-{}:{s}", r.first, r.last())),
        }
    }
    if throttle > 0 {
        out.push_str(&format!("%{throttle}"));
    }
    out
}

/// One `--dependency` condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Dep {
    After(JobId),
    AfterOk(JobId),
    AfterNotOk(JobId),
    AfterAny(JobId),
    Singleton,
    /// A condition on one task of an array (`afterok:123_7`).
    Task {
        cond: DepCond,
        job: JobId,
        task: u32,
    },
}

impl std::fmt::Display for Dep {
    /// As `--dependency` takes it and squeue shows it: `afterok:12`,
    /// `afterany:12_7`, `singleton`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cond = |c: DepCond| match c {
            DepCond::After => "after",
            DepCond::AfterOk => "afterok",
            DepCond::AfterNotOk => "afternotok",
            DepCond::AfterAny => "afterany",
        };
        match *self {
            Dep::After(j) => write!(f, "after:{j}"),
            Dep::AfterOk(j) => write!(f, "afterok:{j}"),
            Dep::AfterNotOk(j) => write!(f, "afternotok:{j}"),
            Dep::AfterAny(j) => write!(f, "afterany:{j}"),
            Dep::Singleton => f.write_str("singleton"),
            Dep::Task { cond: c, job, task } => write!(f, "{}:{job}_{task}", cond(c)),
        }
    }
}

/// What a [`Dep::Task`] waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DepCond {
    After,
    AfterOk,
    AfterNotOk,
    AfterAny,
}

/// Which tasks of a job's run a signal is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SignalTo {
    /// Every step's tasks and the batch shell (`scancel --full`).
    All,
    /// One step's tasks; [`StepId::BATCH`] is the batch shell alone
    /// (`scancel --batch`, `--signal=B:`).
    Step(StepId),
    /// Every step's tasks, not the batch shell (`scancel -s`, `--signal`).
    Steps,
}

/// A signal for a job's tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendSignal {
    pub signal: i32,
    pub to: SignalTo,
}

/// `--signal=[B:]SIG[@TIME]`: `signal` goes to the job's tasks `before`
/// seconds before its time limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitSignal {
    pub signal: SendSignal,
    pub before: u32,
}

/// A batch script, or srun's command run in its own allocation.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum JobKind {
    Batch {
        /// Any bytes (Slurm takes scripts that are not UTF-8).
        script: Vec<u8>,
        /// Arguments after the script's name (`$1`, ...).
        args: Vec<String>,
        /// `-o`, with `%j`-style patterns still in it.
        stdout: Option<String>,
        stderr: Option<String>,
    },
    Interactive {
        argv: Vec<String>,
        io: StepIo,
        files: TaskFiles,
    },
    /// `salloc`: resources held for steps (`srun` inside it) until its
    /// command, run on the submitting host, ends; nothing is launched for
    /// it by itself.
    Allocation,
}

impl Default for JobKind {
    fn default() -> Self {
        JobKind::Batch {
            script: Vec::new(),
            args: Vec::new(),
            stdout: None,
            stderr: None,
        }
    }
}

/// srun inside an allocation: a new step of a running job.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct StepSpec {
    pub job: JobId,
    /// `srun -J`: the step's name (squeue `-s`, sacct JobName); none:
    /// the program's file name.
    pub name: Option<String>,
    pub nodes: Option<u32>,
    pub ntasks: Option<u32>,
    /// GPUs the step asks for on each of its nodes, from the job's
    /// (`srun --gres=gpu:N` inside a job); `None`: all of the job's.
    pub gpus_per_node: Option<u32>,
    /// `--overlap`: the step may use CPUs and GPUs other steps hold, and
    /// holds none from them.
    pub overlap: bool,
    /// `--exact` (or `--exclusive`): the step holds only the CPUs its
    /// tasks ask for on each node, not all of the job's there.
    pub exact: bool,
    /// `-c` of the step (else one: 22.05's srun does not take the job's).
    pub cpus_per_task: Option<u32>,
    /// `-w`: these of the job's nodes run the step; `-x`: these do not.
    pub nodelist: Vec<String>,
    pub exclude: Vec<String>,
    /// `-o/-e/-i`: its tasks' files.
    pub files: TaskFiles,
    pub argv: Vec<String>,
    pub work_dir: String,
    pub env: Vec<(String, String)>,
    pub io: StepIo,
}

/// Slurm's job states.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    bincode::Encode,
    bincode::Decode,
)]
pub enum JobState {
    Pending,
    Running,
    Completing,
    Completed,
    Failed,
    Cancelled,
    Timeout,
    NodeFail,
    /// A process of the job was killed for exceeding its memory limit.
    OutOfMemory,
    /// A run that ended and was queued again (only in accounting: the job
    /// itself is pending once more).
    Requeued,
    /// Running, but stopped by `scontrol suspend` (views only: the
    /// controller keeps it running, with a [`Suspension`]).
    Suspended,
}

impl JobState {
    pub const ALL: [JobState; 11] = [
        JobState::Pending,
        JobState::Running,
        JobState::Completing,
        JobState::Completed,
        JobState::Failed,
        JobState::Cancelled,
        JobState::Timeout,
        JobState::NodeFail,
        JobState::OutOfMemory,
        JobState::Requeued,
        JobState::Suspended,
    ];

    /// The long name (`scontrol`, `sacct`, `squeue -t`).
    pub fn name(self) -> &'static str {
        match self {
            JobState::Pending => "PENDING",
            JobState::Running => "RUNNING",
            JobState::Completing => "COMPLETING",
            JobState::Completed => "COMPLETED",
            JobState::Failed => "FAILED",
            JobState::Cancelled => "CANCELLED",
            JobState::Timeout => "TIMEOUT",
            JobState::NodeFail => "NODE_FAIL",
            JobState::OutOfMemory => "OUT_OF_MEMORY",
            JobState::Requeued => "REQUEUED",
            JobState::Suspended => "SUSPENDED",
        }
    }

    /// The compact code in `squeue`'s `ST` column.
    pub fn code(self) -> &'static str {
        match self {
            JobState::Pending => "PD",
            JobState::Running => "R",
            JobState::Completing => "CG",
            JobState::Completed => "CD",
            JobState::Failed => "F",
            JobState::Cancelled => "CA",
            JobState::Timeout => "TO",
            JobState::NodeFail => "NF",
            JobState::OutOfMemory => "OOM",
            JobState::Requeued => "RQ",
            JobState::Suspended => "S",
        }
    }

    /// Parses a long name or a code, in any case.
    pub fn parse(s: &str) -> Option<JobState> {
        let up = s.to_ascii_uppercase();
        JobState::ALL
            .into_iter()
            .find(|st| st.name() == up || st.code() == up)
    }

    pub fn is_final(self) -> bool {
        !matches!(
            self,
            JobState::Pending | JobState::Running | JobState::Completing | JobState::Suspended
        )
    }
}

/// A run's suspensions (`scontrol suspend` and `resume`), in seconds since
/// the epoch where they are times.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    bincode::Encode,
    bincode::Decode,
)]
pub struct Suspension {
    /// Suspended since then, if it is now.
    pub since: Option<u64>,
    /// Seconds of suspensions that ended (they do not count as run time,
    /// nor against the time limit).
    pub paused: u64,
    /// The last suspend or resume (scontrol's `SuspendTime`).
    pub changed: u64,
    /// Its run time when it was last suspended (`SecsPreSuspend`).
    pub pre_suspend: u64,
}

/// Which jobs a query or a cancel selects; empty fields select all.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct JobFilter {
    pub ids: Vec<JobId>,
    pub users: Vec<u32>,
    pub states: Vec<JobState>,
    pub partitions: Vec<String>,
    pub names: Vec<String>,
    /// Tasks of arrays (`123_7`): the array and the task's index.
    pub tasks: Vec<(JobId, u32)>,
    /// Paging for queries: only jobs with ids above this.
    pub after: JobId,
    /// Views with what each job asked for beyond its shape
    /// ([`JobView::ask`]) and its running steps; without it those are left
    /// out, and a plain `squeue` moves half the bytes.
    pub detail: bool,
    /// Views without the texts only some fields show: the working
    /// directory, the command, the output paths, the comment, the mail
    /// settings and a launch failure (empty or `None` instead). A layout
    /// that prints none of them asks for this, and ten thousand views
    /// carry four fewer texts each.
    pub brief: bool,
    /// Bare views: [`JobFilter::brief`], and of what a job asked only its
    /// name, partition and node count; the tasks, CPUs, GPUs, memory, time
    /// limit, batch and requeue flags read zero (a running job's limit is
    /// still its run's). What `squeue`'s default layout shows needs no
    /// more, and ctld then reads only the head of each job's spec. An
    /// array's views, and a query with [`JobFilter::detail`], are whole.
    pub bare: bool,
}

/// The most jobs ctld's in-process listing (`Controller::job_views`, for
/// tests and tools) returns at once. On the wire a listing comes whole,
/// in parts ([`Response::JobsPart`]).
pub const JOBS_PER_PAGE: usize = 5_000;

/// A request to ctld.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)]
pub enum Request {
    Submit(JobSpec),
    /// `--test-only`: when and where the job would start, were it
    /// submitted now; nothing is submitted.
    TestOnly(JobSpec),
    SubmitStep(StepSpec),
    /// Cancel (or signal, with `signal`) the selected jobs.
    Cancel {
        filter: JobFilter,
        signal: Option<SendSignal>,
    },
    Hold {
        ids: Vec<JobId>,
        /// `uhold`: a user hold even when an operator sets it.
        user: bool,
    },
    /// The job id of task `task` of array `array`, for `scontrol
    /// hold|release|update|requeue|top 123_7`: its record's, or, while it
    /// still waits in its array's record, a record of its own split off
    /// for it (as Slurm's). Answered with [`Response::Affected`].
    ArrayTask {
        array: JobId,
        task: u32,
    },
    /// `salloc`'s command ended: the allocation ends with its exit.
    /// `salloc` is alive (every 5 s while its allocation runs).
    AllocationAlive {
        job: JobId,
    },
    EndAllocation {
        job: JobId,
        exit: ExitStatus,
    },
    Release {
        ids: Vec<JobId>,
    },
    /// `scontrol requeue` (`requeuehold`: `hold`): running batch jobs are
    /// ended and wait again for a new run.
    Requeue {
        ids: Vec<JobId>,
        hold: bool,
    },
    /// `scontrol suspend` (or `resume`, with `resume`): running jobs'
    /// processes stop (or go on) on every node; operators only.
    Suspend {
        ids: Vec<JobId>,
        resume: bool,
    },
    Jobs(JobFilter),
    Nodes,
    Partitions,
    /// `scontrol delete NodeName=…`: the nodes leave the cluster (drained,
    /// their jobs given the grace, then removed; their agents exit).
    DeleteNodes {
        /// A hostlist expression.
        names: String,
    },
    UpdateNode {
        /// A hostlist expression.
        names: String,
        state: NodeUpdate,
        reason: Option<String>,
    },
    Ping,
    /// `scontrol reconfigure`: read `corral.toml` again.
    Reconfigure,
    /// `scontrol top`: these jobs first among their owner's.
    Top {
        ids: Vec<JobId>,
    },
    /// `scontrol update JobId=…`: a pending job's request changes.
    UpdateJob {
        id: JobId,
        changes: JobChanges,
    },
    /// Counts of jobs by state and the scheduler's recent work (`sdiag`).
    Stats,
    /// `scontrol show config`.
    Config,
    /// `sacct`: finished jobs from the accounting database, with the
    /// queue's own.
    Accounting(AcctQuery),
    /// `sacctmgr show` and `sshare`: the accounts and their users.
    Associations,
}

/// What `sacct` asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcctQuery {
    /// `-j` (empty: any job).
    pub ids: Vec<JobId>,
    /// `-u` (empty: the caller's own jobs, or everyone's for root and
    /// with `all_users`).
    pub users: Vec<u32>,
    pub all_users: bool,
    /// `-s` (empty: any state).
    pub states: Vec<JobState>,
    /// `-S`/`-E`: jobs that were in the system at some time in
    /// `[start, end]` (Unix seconds).
    pub start: Option<UnixSecs>,
    pub end: Option<UnixSecs>,
    /// `-D`: every run of a requeued job, not only its last.
    pub duplicates: bool,
    /// `-X`: no steps.
    pub allocations: bool,
    /// Paging: only jobs with ids above this.
    pub after: JobId,
}

/// The most jobs one [`Response::Accounting`] carries.
pub const ACCT_PER_PAGE: usize = 1_000;

/// One run of a job as accounting keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcctJob {
    pub id: JobId,
    /// Which run (0, or the number of requeues before it).
    pub run: u32,
    pub name: String,
    pub user: Ident,
    pub account: String,
    pub partition: String,
    /// The allocated nodes, as a hostlist (`None assigned` while pending).
    pub nodelist: String,
    pub alloc_nodes: u32,
    pub alloc_cpus: u32,
    pub alloc_mem_mb: u64,
    pub alloc_gpus: u32,
    pub req_nodes: u32,
    pub req_cpus: u32,
    pub req_mem_mb: u64,
    pub req_gpus: u32,
    pub submit: UnixSecs,
    /// When it could first start (its begin time, else its submission).
    pub eligible: UnixSecs,
    pub start: Option<UnixSecs>,
    pub end: Option<UnixSecs>,
    /// Seconds (`None`: unlimited).
    pub time_limit: Option<u64>,
    pub state: JobState,
    pub reason: JobReason,
    pub exit: ExitStatus,
    /// Who cancelled it.
    pub cancelled_by: Option<u32>,
    pub usage: Option<JobUsage>,
    pub work_dir: String,
    pub comment: String,
    /// `--wckey` (empty: none).
    pub wckey: String,
    pub steps: Vec<AcctStep>,
    /// A task of an array: the array's id and the task's index (sacct's
    /// `123_7`).
    pub array: Option<(JobId, u32)>,
}

/// One step of a job's run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcctStep {
    pub step: StepId,
    pub name: String,
    pub nodelist: String,
    pub nodes: u32,
    pub tasks: u32,
    pub cpus: u32,
    pub start: UnixSecs,
    pub end: Option<UnixSecs>,
    pub state: JobState,
    pub exit: ExitStatus,
}

/// The controller's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    pub pending: u64,
    pub running: u64,
    pub completing: u64,
    /// Jobs that reached a final state since ctld started.
    pub finished: u64,
    pub submitted: u64,
    pub passes: u64,
    pub last_pass_us: u64,
}

/// `scontrol update NodeName=… State=…`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeUpdate {
    Drain,
    Resume,
    Down,
    /// `State=FAIL`: expected to fail soon; out of use as a drain is,
    /// shown as `fail` (`failg` while jobs still run).
    Fail,
}

/// ctld's answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Response {
    Submitted {
        job: JobId,
    },
    StepCreated {
        job: JobId,
        step: StepId,
    },
    Done,
    /// The jobs a cancel or hold reached.
    Affected {
        jobs: Vec<JobId>,
    },
    Jobs(Vec<JobView>),
    Nodes(Vec<NodeView>),
    Partitions(Vec<PartitionView>),
    Credential(Token),
    Stats(Stats),
    /// `scontrol show config`: settings under Slurm's names.
    Config(Vec<(String, String)>),
    Address(std::net::IpAddr),
    /// `--test-only`'s answer: the id it would get, when it would start,
    /// on which nodes with how many CPUs, in which partition.
    WouldStart {
        job: JobId,
        start: UnixSecs,
        nodes: Vec<String>,
        cpus: u32,
        partition: String,
    },
    /// `sacct`'s answer: a page of jobs in id order, and where the next
    /// page starts (`None`: this was the last).
    Accounting {
        jobs: Vec<AcctJob>,
        next: Option<JobId>,
    },
    /// Refused, in words a Slurm user knows.
    Error(String),
    /// Not now: what it asks for is in use (a step's GPUs, held by other
    /// steps); asking again later may succeed.
    Busy(String),
    /// Some of a listing's jobs, in id order, with more frames to follow
    /// on the same stream: a listing is sent as it is made, so the reader
    /// decodes one part while ctld makes the next. The last frame is a
    /// [`Response::Jobs`] (or an [`Response::Error`], when the listing
    /// broke off). [`read_response`] puts them together.
    JobsPart(Vec<JobView>),
    /// A listing's part whose views may be compact ([`Listed`]): what ctld
    /// sends for a bare query ([`JobFilter::bare`]); more frames follow, up
    /// to a [`Response::CompactJobs`]. The readers ([`read_answer`] and the
    /// rest) hand its views on as [`JobView`]s.
    CompactJobsPart(Vec<Listed>),
    /// The last part of a listing begun with [`Response::CompactJobsPart`]
    /// (or all of a short one).
    CompactJobs(Vec<Listed>),
    /// `sacctmgr show` and `sshare`'s answer.
    Associations(Associations),
}

/// The cluster's accounts and who may charge them (`[accounts]` of
/// `corral.toml`), with their fair-share usage.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Associations {
    pub cluster: String,
    /// The account of a user not listed (`None`: no account).
    pub default: Option<String>,
    /// One a user and account, users in name order.
    pub list: Vec<Association>,
}

/// A user's right to charge an account, and what was charged.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Association {
    pub user: String,
    pub account: String,
    /// The user's default account.
    pub default: bool,
    /// Decayed usage (billing units × seconds) of the user, of the
    /// account, and of the whole cluster, as fair-share weighs it.
    pub user_usage: f64,
    pub account_usage: f64,
    pub total_usage: f64,
    /// The user's fair-share factor now, 0 to 1.
    pub fairshare: f64,
}

impl Response {
    /// Whether a whole encoded frame (as [`crate::read_raw_frame`] reads
    /// it) is a listing's part ([`Response::JobsPart`],
    /// [`Response::CompactJobsPart`]): a relay passing frames on undecoded
    /// reads on after one.
    pub fn frame_is_part(frame: &[u8]) -> bool {
        frame.len() > 6
            && (frame[6] == listing_tag(false, false) || frame[6] == listing_tag(false, true))
    }
}

/// The variant tag of a listing's frame ([`Response::JobsPart`], or,
/// `last`, [`Response::Jobs`]; their compact kin with `compact`), from the
/// enum itself: an empty listing's frame is length, version, the tag and
/// the empty list's length, one byte each while the enum has fewer than
/// 251 variants.
fn listing_tag(last: bool, compact: bool) -> u8 {
    static TAGS: std::sync::LazyLock<[u8; 4]> = std::sync::LazyLock::new(|| {
        [
            Response::JobsPart(Vec::new()),
            Response::Jobs(Vec::new()),
            Response::CompactJobsPart(Vec::new()),
            Response::CompactJobs(Vec::new()),
        ]
        .map(|r| {
            let f = crate::frame::encode(&r).expect("an empty listing encodes");
            assert_eq!(f.len(), 8, "a variant index past one byte");
            f[6]
        })
    });
    TAGS[usize::from(last) + 2 * usize::from(compact)]
}

/// An answer as it came off the stream: a listing's parts kept apart
/// (ten thousand views are not moved again into one list), or any other
/// answer.
#[derive(Debug)]
pub enum Answer {
    /// The views of a listing, part by part, in id order.
    Listing(Vec<Vec<JobView>>),
    Other(Response),
}

impl Answer {
    /// The answer as one [`Response`]: a listing's parts put together.
    pub fn into_response(self) -> Response {
        match self {
            Answer::Listing(mut parts) if parts.len() == 1 => {
                Response::Jobs(parts.pop().unwrap_or_default())
            }
            Answer::Listing(parts) => {
                let mut all = Vec::with_capacity(parts.iter().map(Vec::len).sum());
                parts.into_iter().for_each(|p| all.extend(p));
                Response::Jobs(all)
            }
            Answer::Other(r) => r,
        }
    }
}

/// Reads one answer: a listing's parts ([`Response::JobsPart`]) up to
/// the [`Response::Jobs`] that ends them, or any other answer; an error
/// that ends a listing is the answer. `Ok(None)`: the stream ended before
/// an answer began.
pub async fn read_answer<R>(r: &mut R) -> Result<Option<Answer>, crate::WireError>
where
    R: tokio::io::AsyncRead + Unpin,
{
    let mut parts: Vec<Vec<JobView>> = Vec::new();
    let answer = read_answer_each(r, |p| parts.push(std::mem::take(p))).await?;
    Ok(answer.map(|a| match a {
        Answer::Listing(_) => Answer::Listing(parts),
        other => other,
    }))
}

/// [`read_answer`], a listing's parts handed to `part` as each arrives
/// (the answer is then an empty [`Answer::Listing`]), so the reader
/// works on one while the next comes. A part's views are decoded one by
/// one from the frame into the same list each time, which `part` may
/// empty or take: ten thousand views in parts of fresh memory cost
/// squeue a page fault per four kilobytes, and moving each part's list
/// whole out of the decoder a copy of it.
pub async fn read_answer_each<R>(
    r: &mut R,
    mut part: impl FnMut(&mut Vec<JobView>),
) -> Result<Option<Answer>, crate::WireError>
where
    R: tokio::io::AsyncRead + Unpin,
{
    let mut views = Vec::new();
    read_listing(r, |compact, body| {
        views.clear();
        decode_views(compact, body, &mut views)?;
        part(&mut views);
        Ok(())
    })
    .await
}

/// [`read_answer_each`], each view of a listing handed to `view` as it
/// is decoded, its texts borrowed from the frame: no view is copied into
/// a list and no text into memory of its own (squeue renders ten
/// thousand of them as they come).
pub async fn read_answer_views<R>(
    r: &mut R,
    mut view: impl FnMut(&JobView<&str>),
) -> Result<Option<Answer>, crate::WireError>
where
    R: tokio::io::AsyncRead + Unpin,
{
    read_listing(r, |compact, body| {
        decode_views_each(compact, body, &mut view)
    })
    .await
}

/// The frames of one answer: each listing frame's body (after its tag)
/// handed to `body`, with whether its views are compact ([`Listed`]), up
/// to the last; any other answer returned whole.
async fn read_listing<R>(
    r: &mut R,
    mut body: impl FnMut(bool, &[u8]) -> Result<(), crate::WireError>,
) -> Result<Option<Answer>, crate::WireError>
where
    R: tokio::io::AsyncRead + Unpin,
{
    let mut any = false;
    let mut frame = Vec::new();
    loop {
        if !crate::frame::read_raw_frame_into(r, &mut frame).await? {
            return if any {
                Err(crate::WireError::Truncated)
            } else {
                Ok(None)
            };
        }
        // Length, version, then the variant's one byte.
        let tag = frame[6..].first().copied();
        let kind = [(false, false), (true, false), (false, true), (true, true)]
            .into_iter()
            .find(|&(last, compact)| tag == Some(listing_tag(last, compact)));
        let Some((last, compact)) = kind else {
            let answer = crate::frame::decode_body(&frame[4..])?;
            return Ok(Some(Answer::Other(answer)));
        };
        body(compact, &frame[7..])?;
        if last {
            return Ok(Some(Answer::Listing(Vec::new())));
        }
        any = true;
    }
}

/// [`decode_views`], each view borrowed from `body` and handed on.
fn decode_views_each<'a>(
    compact: bool,
    body: &'a [u8],
    view: &mut impl FnMut(&JobView<&'a str>),
) -> Result<(), crate::WireError> {
    each_view(body, |b| {
        let config = crate::frame::config();
        let (v, used) = match compact {
            true => bincode::borrow_decode_from_slice::<Listed<&str>, _>(b, config)
                .map(|(l, used)| (l.into_view(), used)),
            false => bincode::borrow_decode_from_slice::<JobView<&str>, _>(b, config),
        }
        .map_err(crate::WireError::Decode)?;
        view(&v);
        Ok(used)
    })
}

/// A listing frame's body after its tag: the count, then the views, and
/// nothing after them. Views are read with bincode's own derive, not
/// serde's (the bytes are the same, `views_encode_alike_both_ways`):
/// squeue decoded ten thousand in about half the time.
fn decode_views(
    compact: bool,
    body: &[u8],
    views: &mut Vec<JobView>,
) -> Result<(), crate::WireError> {
    each_view(body, |b| {
        let config = crate::frame::config();
        let (v, used) = match compact {
            true => bincode::decode_from_slice::<Listed, _>(b, config)
                .map(|(l, used)| (l.into_view(), used)),
            false => bincode::decode_from_slice::<JobView, _>(b, config),
        }
        .map_err(crate::WireError::Decode)?;
        views.push(v);
        Ok(used)
    })
}

/// Walks a listing's body: its count, then that many views, each read by
/// `one` from the bytes left (returning how many it used), and nothing
/// after them.
fn each_view<'a>(
    mut body: &'a [u8],
    mut one: impl FnMut(&'a [u8]) -> Result<usize, crate::WireError>,
) -> Result<(), crate::WireError> {
    let (count, used): (u64, usize) = bincode::decode_from_slice(body, crate::frame::config())
        .map_err(crate::WireError::Decode)?;
    body = &body[used..];
    for _ in 0..count {
        let used = one(body)?;
        body = &body[used..];
    }
    match body.len() {
        0 => Ok(()),
        left => Err(crate::WireError::Trailing(left)),
    }
}

/// [`read_answer`], a listing's parts put together into the one
/// [`Response::Jobs`].
pub async fn read_response<R>(r: &mut R) -> Result<Option<Response>, crate::WireError>
where
    R: tokio::io::AsyncRead + Unpin,
{
    Ok(read_answer(r).await?.map(Answer::into_response))
}

/// A job as `squeue` and `scontrol show job` show it. Its texts are
/// `String`s, or in ctld, which encodes views as it makes them, texts
/// borrowed from its own tables (`JobView<Cow<str>>`): bincode writes a
/// `str` and a `String` alike, so the bytes are the same
/// ([`JobView::into_owned`] makes the one from the other).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, bincode::Encode, bincode::Decode)]
pub struct JobView<S = String> {
    pub id: JobId,
    pub name: S,
    pub user: Ident,
    pub partition: S,
    pub state: JobState,
    /// Why it waits, or why it ended as it did.
    pub reason: JobReason,
    pub priority: i64,
    pub submit_time: UnixSecs,
    pub start_time: Option<UnixSecs>,
    pub end_time: Option<UnixSecs>,
    /// Expected start of a pending job with a reservation.
    pub expected_start: Option<UnixSecs>,
    pub time_limit: Option<u64>,
    pub nodes: Vec<S>,
    pub num_nodes: u32,
    pub num_tasks: u32,
    pub cpus_per_task: u32,
    pub num_cpus: u32,
    pub gpus: u32,
    pub mem_mb: u64,
    pub exit: ExitStatus,
    pub work_dir: S,
    pub stdout: Option<S>,
    pub stderr: Option<S>,
    pub command: S,
    pub batch: bool,
    pub requeue: bool,
    pub restarts: u32,
    /// Why the job failed to launch, naming the step and node.
    pub failure: Option<S>,
    /// What the job used, summed over its nodes (CPU) or the most on one
    /// node (memory), once its nodes have reported it.
    pub usage: Option<JobUsage>,
    pub comment: Option<S>,
    pub mail_type: Option<S>,
    pub mail_user: Option<S>,
    /// Of an array: the array's id, and this task's index or, for the
    /// tasks still waiting (one view for all), their indices.
    pub array: Option<ArrayView>,
    /// What was asked beyond the shape, as squeue and scontrol show it;
    /// only when the query asked for [`JobFilter::detail`] (read it with
    /// [`JobView::ask`]).
    pub ask: Option<Box<JobAsk>>,
    /// The steps running now (squeue `-s`, `scontrol show steps`); only
    /// with [`JobFilter::detail`].
    pub steps: Vec<StepView>,
    /// Its run's suspensions, if it was ever suspended.
    pub suspension: Option<Suspension>,
}

impl<S> JobView<S> {
    /// The same view with each text made anew by `f`.
    pub fn map_texts<T>(self, mut f: impl FnMut(S) -> T) -> JobView<T> {
        JobView {
            id: self.id,
            name: f(self.name),
            user: self.user,
            partition: f(self.partition),
            state: self.state,
            reason: self.reason,
            priority: self.priority,
            submit_time: self.submit_time,
            start_time: self.start_time,
            end_time: self.end_time,
            expected_start: self.expected_start,
            time_limit: self.time_limit,
            nodes: self.nodes.into_iter().map(&mut f).collect(),
            num_nodes: self.num_nodes,
            num_tasks: self.num_tasks,
            cpus_per_task: self.cpus_per_task,
            num_cpus: self.num_cpus,
            gpus: self.gpus,
            mem_mb: self.mem_mb,
            exit: self.exit,
            work_dir: f(self.work_dir),
            stdout: self.stdout.map(&mut f),
            stderr: self.stderr.map(&mut f),
            command: f(self.command),
            batch: self.batch,
            requeue: self.requeue,
            restarts: self.restarts,
            failure: self.failure.map(&mut f),
            usage: self.usage,
            comment: self.comment.map(&mut f),
            mail_type: self.mail_type.map(&mut f),
            mail_user: self.mail_user.map(&mut f),
            array: self.array,
            ask: self.ask,
            steps: self.steps,
            suspension: self.suspension,
        }
    }
}

impl<S: Into<String>> JobView<S> {
    /// The view with texts of its own.
    pub fn into_owned(self) -> JobView {
        self.map_texts(Into::into)
    }
}

impl<S: AsRef<str>> JobView<S> {
    /// Whether the view is all a [`BareView`] holds: every field that one
    /// leaves out reads zero, empty or `None`.
    pub fn is_bare(&self) -> bool {
        let v = self;
        v.num_tasks == 0
            && v.cpus_per_task == 0
            && v.num_cpus == 0
            && v.gpus == 0
            && v.mem_mb == 0
            && v.work_dir.as_ref().is_empty()
            && v.stdout.is_none()
            && v.stderr.is_none()
            && v.command.as_ref().is_empty()
            && !v.batch
            && !v.requeue
            && v.failure.is_none()
            && v.comment.is_none()
            && v.mail_type.is_none()
            && v.mail_user.is_none()
            && v.array.is_none()
            && v.ask.is_none()
            && v.steps.is_empty()
    }
}

/// A view in a compact listing: a bare query ([`JobFilter::bare`], what
/// squeue's default layout asks) leaves most of [`JobView`]'s fields
/// zero, and such a view travels as a [`BareView`], 17 bytes shorter (a
/// held job's: 34 bytes, not 51); any other (an array's entry) whole.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, bincode::Encode, bincode::Decode)]
// Only ever one at a time, on the stack of the reader turning it into a
// view: boxing the large one would cost an allocation per whole view.
#[allow(clippy::large_enum_variant)]
pub enum Listed<S = String> {
    Bare(BareView<S>),
    Whole(JobView<S>),
}

impl<S: Clone + AsRef<str>> Listed<S> {
    /// What [`encode_listed`] writes of a view, as a value (tests and
    /// tools; ctld writes it straight from the view).
    pub fn of(v: &JobView<S>) -> Listed<S> {
        match v.is_bare() {
            true => Listed::Bare(BareView {
                id: v.id,
                name: v.name.clone(),
                user: v.user,
                partition: v.partition.clone(),
                state: v.state,
                reason: v.reason,
                priority: v.priority,
                submit_time: v.submit_time,
                start_time: v.start_time,
                end_time: v.end_time,
                expected_start: v.expected_start,
                time_limit: v.time_limit,
                nodes: v.nodes.clone(),
                num_nodes: v.num_nodes,
                exit: v.exit,
                restarts: v.restarts,
                usage: v.usage,
                suspension: v.suspension,
            }),
            false => Listed::Whole(v.clone()),
        }
    }
}

impl<S: Default> Listed<S> {
    /// The view it stands for.
    pub fn into_view(self) -> JobView<S> {
        match self {
            Listed::Bare(b) => b.into_view(),
            Listed::Whole(v) => v,
        }
    }
}

/// The fields of a [`JobView`] a bare one ([`JobView::is_bare`]) may hold
/// other than zero, in the view's order; [`encode_listed`] writes them
/// straight from the view.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, bincode::Encode, bincode::Decode)]
pub struct BareView<S = String> {
    pub id: JobId,
    pub name: S,
    pub user: Ident,
    pub partition: S,
    pub state: JobState,
    pub reason: JobReason,
    pub priority: i64,
    pub submit_time: UnixSecs,
    pub start_time: Option<UnixSecs>,
    pub end_time: Option<UnixSecs>,
    pub expected_start: Option<UnixSecs>,
    pub time_limit: Option<u64>,
    pub nodes: Vec<S>,
    pub num_nodes: u32,
    pub exit: ExitStatus,
    pub restarts: u32,
    pub usage: Option<JobUsage>,
    pub suspension: Option<Suspension>,
}

impl<S: Default> BareView<S> {
    /// The whole view: what it leaves out reads zero, empty or `None`.
    pub fn into_view(self) -> JobView<S> {
        JobView {
            id: self.id,
            name: self.name,
            user: self.user,
            partition: self.partition,
            state: self.state,
            reason: self.reason,
            priority: self.priority,
            submit_time: self.submit_time,
            start_time: self.start_time,
            end_time: self.end_time,
            expected_start: self.expected_start,
            time_limit: self.time_limit,
            nodes: self.nodes,
            num_nodes: self.num_nodes,
            num_tasks: 0,
            cpus_per_task: 0,
            num_cpus: 0,
            gpus: 0,
            mem_mb: 0,
            exit: self.exit,
            work_dir: S::default(),
            stdout: None,
            stderr: None,
            command: S::default(),
            batch: false,
            requeue: false,
            restarts: self.restarts,
            failure: None,
            usage: self.usage,
            comment: None,
            mail_type: None,
            mail_user: None,
            array: None,
            ask: None,
            steps: Vec::new(),
            suspension: self.suspension,
        }
    }
}

/// A view written as [`BareView`]'s derive writes one, from the view's
/// own fields (none copied).
struct AsBare<'a, S>(&'a JobView<S>);

impl<S: bincode::Encode> bincode::Encode for AsBare<'_, S> {
    fn encode<E: bincode::enc::Encoder>(
        &self,
        e: &mut E,
    ) -> Result<(), bincode::error::EncodeError> {
        let v = self.0;
        v.id.encode(e)?;
        v.name.encode(e)?;
        v.user.encode(e)?;
        v.partition.encode(e)?;
        v.state.encode(e)?;
        v.reason.encode(e)?;
        v.priority.encode(e)?;
        v.submit_time.encode(e)?;
        v.start_time.encode(e)?;
        v.end_time.encode(e)?;
        v.expected_start.encode(e)?;
        v.time_limit.encode(e)?;
        v.nodes.encode(e)?;
        v.num_nodes.encode(e)?;
        v.exit.encode(e)?;
        v.restarts.encode(e)?;
        v.usage.encode(e)?;
        v.suspension.encode(e)
    }
}

/// Appends one view, encoded, to the views of a listing frame
/// ([`listing_frame`]).
pub fn encode_view<S: bincode::Encode>(
    v: &JobView<S>,
    out: &mut Vec<u8>,
) -> Result<(), crate::WireError> {
    bincode::encode_into_writer(v, ByteWriter(out), crate::frame::config())
        .map_err(crate::WireError::Encode)
}

/// Appends one view to the views of a compact listing frame
/// ([`listing_frame`] with `compact`): as a [`Listed::Bare`] where the
/// view is bare ([`JobView::is_bare`]), else whole. Byte for byte what
/// bincode's derive makes of the [`Listed`].
pub fn encode_listed<S: bincode::Encode + AsRef<str>>(
    v: &JobView<S>,
    out: &mut Vec<u8>,
) -> Result<(), crate::WireError> {
    let config = crate::frame::config();
    match v.is_bare() {
        // The variant's index, then its fields, as the derive writes them.
        true => bincode::encode_into_writer((0u32, AsBare(v)), ByteWriter(out), config),
        false => bincode::encode_into_writer((1u32, v), ByteWriter(out), config),
    }
    .map_err(crate::WireError::Encode)
}

/// Appends one view to a listing frame's views: [`encode_listed`] for a
/// compact listing, [`encode_view`] for a whole one.
pub fn encode_in_listing<S: bincode::Encode + AsRef<str>>(
    compact: bool,
    v: &JobView<S>,
    out: &mut Vec<u8>,
) -> Result<(), crate::WireError> {
    match compact {
        true => encode_listed(v, out),
        false => encode_view(v, out),
    }
}

/// Bincode's writer into a `Vec`, a byte at a time where it writes one:
/// most of a view's fields are one-byte varints, and a copy of unknown
/// length per field went through `memmove`.
struct ByteWriter<'a>(&'a mut Vec<u8>);

impl bincode::enc::write::Writer for ByteWriter<'_> {
    #[inline]
    fn write(&mut self, bytes: &[u8]) -> Result<(), bincode::error::EncodeError> {
        match bytes {
            [b] => self.0.push(*b),
            _ => self.0.extend_from_slice(bytes),
        }
        Ok(())
    }
}

/// A whole frame of a listing from `count` views encoded one by one with
/// [`encode_view`]: byte for byte what [`crate::frame::encode`] makes of a
/// [`Response::JobsPart`] of them, or, `last`, of a [`Response::Jobs`];
/// with `compact`, views encoded with [`encode_listed`] and the frame a
/// [`Response::CompactJobsPart`] or [`Response::CompactJobs`]. ctld
/// encodes each view as it makes it, its texts borrowed, so none is
/// copied on the way out.
pub fn listing_frame(
    last: bool,
    compact: bool,
    count: usize,
    views: &[u8],
) -> Result<Vec<u8>, crate::WireError> {
    let mut f = Vec::with_capacity(16 + views.len());
    f.extend_from_slice(&[0; 4]);
    f.extend_from_slice(&crate::PROTOCOL_VERSION.to_be_bytes());
    f.push(listing_tag(last, compact));
    bincode::serde::encode_into_std_write(count as u64, &mut f, crate::frame::config())
        .map_err(crate::WireError::Encode)?;
    f.extend_from_slice(views);
    let len = f.len() as u64 - 4;
    if len > u64::from(crate::MAX_FRAME) {
        return Err(crate::WireError::TooLarge {
            len: u32::try_from(len).unwrap_or(u32::MAX),
            max: crate::MAX_FRAME,
        });
    }
    f[..4].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(f)
}

/// What a view without detail asked for: nothing beyond its shape.
static NO_ASK: JobAsk = JobAsk {
    account: None,
    qos: None,
    nice: 0,
    dependency: None,
    req_nodes: Vec::new(),
    exc_nodes: Vec::new(),
    features: None,
    exclusive: false,
    mem_per_cpu_mb: None,
    gpu_type: None,
    gpus_per_node: None,
    gpus_per_task: None,
    gpus_total: None,
    begin: None,
    ntasks_per_node: None,
    nodes: None,
    submit_host: None,
    sched_nodes: Vec::new(),
    wckey: None,
    mem_per_gpu_mb: None,
};

impl<S> JobView<S> {
    /// What the job asked for beyond its shape (all defaults when the view
    /// was made without detail).
    pub fn ask(&self) -> &JobAsk {
        self.ask.as_deref().unwrap_or(&NO_ASK)
    }

    /// CPUs asked per node (squeue's MIN_CPUS): `-c` times
    /// `--ntasks-per-node`.
    pub fn min_cpus(&self) -> u32 {
        self.cpus_per_task * self.ask().ntasks_per_node.unwrap_or(1)
    }
}

/// What a job asked for beyond its shape: the fields squeue's format codes
/// and `scontrol show job` print.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, bincode::Encode, bincode::Decode,
)]
pub struct JobAsk {
    /// `-A`, `--qos`, `--nice`.
    pub account: Option<String>,
    pub qos: Option<String>,
    pub nice: i32,
    /// The dependency while it still holds the job, as Slurm shows it
    /// (`afterok:12(unfulfilled)`).
    pub dependency: Option<String>,
    /// `-w`, `-x`, `-C` (as written, `&` or `|` joined), `--exclusive`.
    pub req_nodes: Vec<String>,
    pub exc_nodes: Vec<String>,
    pub features: Option<String>,
    pub exclusive: bool,
    /// `--mem-per-cpu` (the job's `mem_mb` is then 0).
    pub mem_per_cpu_mb: Option<u64>,
    /// `--gres=gpu:TYPE:N`: the model asked for.
    pub gpu_type: Option<String>,
    /// GPUs asked per node (`--gres`, `--gpus-per-node`), per task
    /// (`--gpus-per-task`), or in all (`-G`), as Slurm's TRES fields show.
    pub gpus_per_node: Option<u32>,
    pub gpus_per_task: Option<u32>,
    pub gpus_total: Option<u32>,
    /// `--begin`.
    pub begin: Option<UnixSecs>,
    /// `--ntasks-per-node`.
    pub ntasks_per_node: Option<u32>,
    /// `-N` as given (`scontrol`'s `NumNodes=2-2` while pending).
    pub nodes: Option<u32>,
    /// Where it was submitted from (`scontrol`'s `AllocNode:Sid`).
    pub submit_host: Option<String>,
    /// Where a pending job's reservation would start it (squeue's
    /// SCHEDNODES, scontrol's `SchedNodeList`).
    pub sched_nodes: Vec<String>,
    /// `--wckey` (squeue's `%w`).
    pub wckey: Option<String>,
    /// `--mem-per-gpu` (scontrol's `MemPerTres=gres:gpu:N`; the job's
    /// `mem_mb` is then 0).
    pub mem_per_gpu_mb: Option<u64>,
}

/// What `scontrol update JobId=…` changes; `None` leaves a field as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobChanges {
    /// `TimeLimit=` (`Some(None)`: UNLIMITED).
    pub time_limit: Option<Option<u64>>,
    /// `TimeLimit=+N` or `-N`: the limit moved by so many seconds (an
    /// unlimited job stays so).
    pub time_limit_by: Option<i64>,
    pub nice: Option<i32>,
    pub name: Option<String>,
    pub comment: Option<String>,
    pub partition: Option<String>,
    /// `NumNodes=` (the fewest), and its most when it named one
    /// (`NumNodes=2-4`).
    pub nodes: Option<u32>,
    pub nodes_max: Option<u32>,
    /// `Dependency=` (empty: none), joined by `?` when the flag is set.
    pub dependency: Option<(Vec<Dep>, bool)>,
    /// `StartTime=` (`--begin`; `Some(None)`: now).
    pub begin: Option<Option<UnixSecs>>,
}

/// A running step as squeue `-s` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, bincode::Encode, bincode::Decode)]
pub struct StepView {
    pub id: StepId,
    pub name: String,
    pub nodes: Vec<String>,
    pub tasks: u32,
    pub cpus: u32,
    pub start: UnixSecs,
}

/// A job's place in an array, as squeue shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, bincode::Encode, bincode::Decode)]
pub struct ArrayView {
    pub job: JobId,
    pub task: Option<u32>,
    pub waiting: Vec<IndexRun>,
    pub throttle: u32,
}

/// Why a job waits, or why it ended as it did. The CLI writes Slurm's word
/// for it (`squeue`'s `NODELIST(REASON)`, `scontrol`'s `Reason=`).
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    bincode::Encode,
    bincode::Decode,
)]
pub enum JobReason {
    None,
    // Pending: what the scheduler says.
    Priority,
    Resources,
    Dependency,
    DependencyNeverSatisfied,
    BeginTime,
    JobHeldUser,
    JobHeldAdmin,
    ReqNodeNotAvail,
    PartitionTimeLimit,
    JobArrayTaskLimit,
    // Ended: what ended it.
    JobLaunchFailure,
    NonZeroExitCode,
    NodeDown,
    TimeLimit,
}

/// A node's scheduling state. The CLI writes Slurm's words for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NodeState {
    Idle,
    /// Some of it allocated.
    Mixed,
    /// All of it allocated.
    Allocated,
    /// Drain set, jobs still running.
    Draining,
    /// Drain set, nothing running.
    Drained,
    Down,
}

/// A node as `sinfo` and `scontrol show node` show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeView {
    pub name: String,
    pub state: NodeState,
    /// Its agent has gone silent (Slurm marks the state with `*`).
    pub not_responding: bool,
    /// An operator set `State=FAIL` (the state is a drain's).
    pub fail: bool,
    /// A job on it is still being ended here (Slurm's COMPLETING flag).
    pub completing: bool,
    pub cpus: u32,
    pub alloc_cpus: u32,
    pub memory_mb: u64,
    pub alloc_memory_mb: u64,
    pub gpus: u32,
    pub alloc_gpus: u32,
    /// The model all its GPUs share, as jobs name it.
    pub gpu_model: Option<String>,
    pub features: Vec<String>,
    pub partitions: Vec<String>,
    pub reason: Option<String>,
    pub reason_user: Option<u32>,
    pub reason_time: Option<UnixSecs>,
    pub boot_time: UnixSecs,
    pub last_seen: UnixSecs,
    pub jobs: Vec<JobId>,
    /// What its agent said of its kernel (empty: nothing).
    pub os: String,
}

/// A partition as `sinfo` and `scontrol show partition` show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionView {
    pub name: String,
    pub is_default: bool,
    pub nodes_expr: String,
    pub nodes: Vec<String>,
    pub max_time: Option<u64>,
    pub default_time: Option<u64>,
    pub priority_tier: u32,
    pub total_cpus: u32,
    pub total_gpus: u32,
}

#[cfg(test)]
mod listing_tests {
    use super::*;

    /// A view with every field set, no two alike.
    fn full(id: u64, state: JobState, reason: JobReason) -> JobView {
        JobView {
            id: JobId(id),
            name: format!("train-{id}"),
            user: Ident {
                uid: 1000,
                gid: 100,
            },
            partition: "gpu".into(),
            state,
            reason,
            priority: -7,
            submit_time: 1_700_000_000,
            start_time: Some(1_700_000_010),
            end_time: Some(1_700_000_900),
            expected_start: Some(1_700_000_005),
            time_limit: Some(3600),
            nodes: vec!["worker-0".into(), "worker-1".into()],
            num_nodes: 2,
            num_tasks: 8,
            cpus_per_task: 3,
            num_cpus: 24,
            gpus: 4,
            mem_mb: 1 << 40,
            exit: ExitStatus {
                code: -2,
                signal: Some(9),
            },
            work_dir: "/home/ada".into(),
            stdout: Some("out-%j".into()),
            stderr: Some("err-%j".into()),
            command: "/home/ada/run.sh".into(),
            batch: true,
            requeue: true,
            restarts: 3,
            failure: Some("node worker-1".into()),
            usage: Some(JobUsage {
                cpu_ms: 12_345,
                max_rss_kb: 678,
            }),
            comment: Some("note".into()),
            mail_type: Some("END".into()),
            mail_user: Some("ada".into()),
            array: Some(ArrayView {
                job: JobId(id - 1),
                task: Some(5),
                waiting: vec![IndexRun {
                    first: 6,
                    count: 4,
                    step: 2,
                }],
                throttle: 2,
            }),
            ask: Some(Box::new(JobAsk {
                account: Some("physics".into()),
                qos: Some("high".into()),
                nice: -5,
                dependency: Some("afterok:3".into()),
                req_nodes: vec!["worker-0".into()],
                exc_nodes: vec!["worker-3".into()],
                features: Some("a100".into()),
                exclusive: true,
                mem_per_cpu_mb: Some(512),
                gpu_type: Some("h100".into()),
                gpus_per_node: Some(2),
                gpus_per_task: Some(1),
                gpus_total: Some(4),
                begin: Some(1_700_000_001),
                ntasks_per_node: Some(4),
                nodes: Some(2),
                submit_host: Some("login".into()),
                sched_nodes: vec!["worker-2".into()],
                wckey: Some("submitit".into()),
                mem_per_gpu_mb: Some(2048),
            })),
            steps: vec![StepView {
                id: StepId(1),
                name: "step".into(),
                nodes: vec!["worker-0".into()],
                tasks: 2,
                cpus: 6,
                start: 1_700_000_020,
            }],
            suspension: Some(Suspension {
                since: Some(1_700_000_500),
                paused: 30,
                changed: 1_700_000_500,
                pre_suspend: 400,
            }),
        }
    }

    fn views() -> Vec<JobView> {
        let reasons = [
            JobReason::None,
            JobReason::Resources,
            JobReason::JobHeldAdmin,
            JobReason::TimeLimit,
        ];
        let mut out: Vec<JobView> = JobState::ALL
            .iter()
            .zip(reasons.iter().cycle())
            .enumerate()
            .map(|(i, (&s, &r))| full(10 + i as u64, s, r))
            .collect();
        // And one with every option empty.
        let mut bare = full(99, JobState::Pending, JobReason::Priority);
        (bare.start_time, bare.end_time, bare.expected_start) = (None, None, None);
        (bare.stdout, bare.stderr, bare.failure, bare.usage) = (None, None, None, None);
        (bare.array, bare.ask, bare.suspension) = (None, None, None);
        (bare.nodes, bare.steps) = (Vec::new(), Vec::new());
        out.push(bare);
        // And bare ones ([`JobView::is_bare`]), with and without what a
        // bare view still holds.
        for (id, state) in [(100, JobState::Running), (101, JobState::Pending)] {
            let mut v = full(id, state, JobReason::Priority);
            (v.num_tasks, v.cpus_per_task, v.num_cpus, v.gpus, v.mem_mb) = (0, 0, 0, 0, 0);
            (v.work_dir, v.command, v.batch, v.requeue) =
                (String::new(), String::new(), false, false);
            (v.stdout, v.stderr, v.failure, v.comment) = (None, None, None, None);
            (v.mail_type, v.mail_user, v.array, v.ask) = (None, None, None, None);
            v.steps = Vec::new();
            if state == JobState::Pending {
                (v.start_time, v.end_time, v.usage, v.suspension) = (None, None, None, None);
                (v.nodes, v.restarts) = (Vec::new(), 0);
            }
            assert!(v.is_bare());
            out.push(v);
        }
        out
    }

    /// A compact listing's view is written alike by [`encode_listed`],
    /// bincode's derive and serde, reads back as the view, and a bare one
    /// is 17 bytes shorter than whole (a held job's: 51 → 34); a view that holds
    /// anything a bare one leaves out goes whole.
    #[test]
    fn compact_views_are_the_views_they_stand_for() {
        let config = crate::frame::config();
        let all = views();
        assert!(all.iter().filter(|v| v.is_bare()).count() == 2);
        for v in &all {
            let l = Listed::of(v);
            let mut ours = Vec::new();
            encode_listed(v, &mut ours).unwrap();
            assert_eq!(
                ours,
                bincode::encode_to_vec(&l, config).unwrap(),
                "{}",
                v.id
            );
            assert_eq!(ours, bincode::serde::encode_to_vec(&l, config).unwrap());
            let (back, used): (Listed, usize) = bincode::decode_from_slice(&ours, config).unwrap();
            assert_eq!((back.into_view(), used), (v.clone(), ours.len()));
            let (back, _): (Listed<&str>, usize) =
                bincode::borrow_decode_from_slice(&ours, config).unwrap();
            assert_eq!(back.into_view().into_owned(), *v);
            let whole = bincode::encode_to_vec(v, config).unwrap();
            match v.is_bare() {
                // The 18 fields left out, a byte each, less the tag.
                true => assert_eq!(ours.len() + 17, whole.len()),
                false => assert_eq!(ours.len(), whole.len() + 1),
            }
        }
        // Each field a bare view leaves out, set alone, makes it whole.
        let base = all.iter().find(|v| v.is_bare()).unwrap().clone();
        let mut changed: Vec<JobView> = Vec::new();
        let mut one = |f: &dyn Fn(&mut JobView)| {
            let mut v = base.clone();
            f(&mut v);
            changed.push(v);
        };
        one(&|v| v.num_tasks = 1);
        one(&|v| v.cpus_per_task = 1);
        one(&|v| v.num_cpus = 1);
        one(&|v| v.gpus = 1);
        one(&|v| v.mem_mb = 1);
        one(&|v| v.work_dir = "/".into());
        one(&|v| v.stdout = Some(String::new()));
        one(&|v| v.stderr = Some(String::new()));
        one(&|v| v.command = "x".into());
        one(&|v| v.batch = true);
        one(&|v| v.requeue = true);
        one(&|v| v.failure = Some(String::new()));
        one(&|v| v.comment = Some(String::new()));
        one(&|v| v.mail_type = Some(String::new()));
        one(&|v| v.mail_user = Some(String::new()));
        one(&|v| v.array = full(1, JobState::Pending, JobReason::None).array);
        one(&|v| v.ask = Some(Box::default()));
        one(&|v| v.steps = full(1, JobState::Pending, JobReason::None).steps);
        assert_eq!(changed.len(), 18);
        for v in changed {
            assert!(!v.is_bare(), "{v:?}");
            let mut ours = Vec::new();
            encode_listed(&v, &mut ours).unwrap();
            let (back, _): (Listed, usize) = bincode::decode_from_slice(&ours, config).unwrap();
            assert_eq!(back.into_view(), v);
        }
    }

    /// bincode's derive and serde write a view byte for byte alike, and
    /// each reads what the other wrote: ctld and squeue use the derive,
    /// every other reader of a `Response` serde.
    #[test]
    fn views_encode_alike_both_ways() {
        let config = crate::frame::config();
        for v in views() {
            let by_serde = bincode::serde::encode_to_vec(&v, config).unwrap();
            let by_derive = bincode::encode_to_vec(&v, config).unwrap();
            assert_eq!(by_serde, by_derive, "view {}", v.id);
            let (back, used): (JobView, usize) =
                bincode::decode_from_slice(&by_serde, config).unwrap();
            assert_eq!((back, used), (v.clone(), by_serde.len()));
            let (back, _): (JobView, usize) =
                bincode::serde::decode_from_slice(&by_derive, config).unwrap();
            assert_eq!(back, v);
        }
    }

    /// Parts made view by view are the frames serde makes of the whole
    /// response, and the reader hands them back part by part, in order.
    #[tokio::test]
    async fn a_listing_comes_back_part_by_part() {
        for compact in [false, true] {
            a_listing_comes_back_part_by_part_as(compact).await;
        }
    }

    async fn a_listing_comes_back_part_by_part_as(compact: bool) {
        let all = views();
        let (first, rest) = all.split_at(5);
        let encode = |v: &JobView, body: &mut Vec<u8>| encode_in_listing(compact, v, body).unwrap();
        let frame = |last: bool, part: &[JobView]| {
            let mut body = Vec::new();
            for v in part {
                encode(v, &mut body);
            }
            let f = listing_frame(last, compact, part.len(), &body).unwrap();
            let listed = || part.iter().map(Listed::of).collect();
            let whole = match (compact, last) {
                (false, true) => Response::Jobs(part.to_vec()),
                (false, false) => Response::JobsPart(part.to_vec()),
                (true, true) => Response::CompactJobs(listed()),
                (true, false) => Response::CompactJobsPart(listed()),
            };
            assert_eq!(f, crate::frame::encode(&whole).unwrap());
            f
        };
        let mut stream = frame(false, first);
        stream.extend(frame(false, &[]));
        stream.extend(frame(true, rest));
        let mut parts = Vec::new();
        let answer = read_answer_each(&mut stream.as_slice(), |p| parts.push(p.clone()))
            .await
            .unwrap();
        assert!(matches!(answer, Some(Answer::Listing(_))));
        assert_eq!(parts, vec![first.to_vec(), Vec::new(), rest.to_vec()]);
        // Another answer comes whole; a listing cut short is an error.
        let other = crate::frame::encode(&Response::Error("no".into())).unwrap();
        let got = read_answer(&mut other.as_slice()).await.unwrap();
        assert!(matches!(got, Some(Answer::Other(Response::Error(e))) if e == "no"));
        let cut = frame(false, first);
        let got = read_answer(&mut cut.as_slice()).await;
        assert!(matches!(got, Err(crate::WireError::Truncated)), "{got:?}");
        // A count that promises fewer views than the frame holds.
        let mut body = Vec::new();
        for v in first {
            encode(v, &mut body);
        }
        let lying = listing_frame(true, compact, 2, &body).unwrap();
        let got = read_answer(&mut lying.as_slice()).await;
        assert!(matches!(got, Err(crate::WireError::Trailing(_))), "{got:?}");
        let lying = listing_frame(true, compact, 9, &body).unwrap();
        let got = read_answer(&mut lying.as_slice()).await;
        assert!(matches!(got, Err(crate::WireError::Decode(_))), "{got:?}");
    }

    /// Views read one by one, their texts borrowed from the frame, are
    /// the views that were sent, in order; the reader refuses what the
    /// owning reader refuses.
    #[tokio::test]
    async fn a_listing_comes_back_view_by_view_borrowed() {
        for compact in [false, true] {
            a_listing_comes_back_view_by_view_borrowed_as(compact).await;
        }
    }

    async fn a_listing_comes_back_view_by_view_borrowed_as(compact: bool) {
        let all = views();
        let frame = |last: bool, part: &[JobView], count: usize| {
            let mut body = Vec::new();
            for v in part {
                encode_in_listing(compact, v, &mut body).unwrap();
            }
            listing_frame(last, compact, count, &body).unwrap()
        };
        let (first, rest) = all.split_at(3);
        let mut stream = frame(false, first, first.len());
        stream.extend(frame(true, rest, rest.len()));
        let mut got = Vec::new();
        let answer =
            read_answer_views(&mut stream.as_slice(), |v| got.push(v.clone().into_owned()))
                .await
                .unwrap();
        assert!(matches!(answer, Some(Answer::Listing(_))));
        assert_eq!(got, all);
        let other = crate::frame::encode(&Response::Error("no".into())).unwrap();
        let answer = read_answer_views(&mut other.as_slice(), |_| panic!("no views"))
            .await
            .unwrap();
        assert!(matches!(answer, Some(Answer::Other(Response::Error(e))) if e == "no"));
        for (bad, count) in [(frame(false, first, 3), 3), (frame(true, first, 2), 2)] {
            let got = read_answer_views(&mut bad.as_slice(), |_| {}).await;
            assert!(got.is_err(), "count {count}: {got:?}");
        }
    }

    /// Reads a stream with both readers: the owned views, or the error.
    fn read_both(stream: &[u8]) -> (Result<Vec<JobView>, String>, Result<Vec<JobView>, String>) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let owned = match read_answer(&mut &stream[..]).await {
                Ok(Some(a @ Answer::Listing(_))) => match a.into_response() {
                    Response::Jobs(v) => Ok(v),
                    other => Err(format!("{other:?}")),
                },
                Ok(other) => Err(format!("{other:?}")),
                Err(e) => Err(e.to_string()),
            };
            let mut got = Vec::new();
            let borrowed =
                match read_answer_views(&mut &stream[..], |v| got.push(v.clone().into_owned()))
                    .await
                {
                    Ok(Some(Answer::Listing(_))) => Ok(got),
                    Ok(other) => Err(format!("{other:?}")),
                    Err(e) => Err(e.to_string()),
                };
            (owned, borrowed)
        })
    }

    proptest::proptest! {
        /// A listing's frame with bytes changed or cut short, whole or
        /// compact: neither reader panics, and the one that borrows the
        /// views' texts reads exactly what the one that copies them does
        /// (the same views, or a refusal from both).
        #[test]
        fn damaged_listings_read_alike_both_ways(
            compact in proptest::bool::ANY,
            count in 0usize..8,
            changes in proptest::collection::vec(
                (proptest::num::usize::ANY, proptest::num::u8::ANY), 0..6),
            cut in proptest::option::of(proptest::num::usize::ANY),
        ) {
            let all = views();
            let part = &all[..count.min(all.len())];
            let mut body = Vec::new();
            for v in part {
                encode_in_listing(compact, v, &mut body).unwrap();
            }
            let mut frame = listing_frame(true, compact, part.len(), &body).unwrap();
            // The header stays: what is damaged is what a listing carries.
            let head = 7;
            let len = frame.len() - head;
            if len > 0 {
                for (at, byte) in &changes {
                    frame[head + at % len] = *byte;
                }
            }
            if let Some(c) = cut {
                frame.truncate(head + c % (len + 1));
                let n = (frame.len() - 4) as u32;
                frame[..4].copy_from_slice(&n.to_be_bytes());
            }
            let (owned, borrowed) = read_both(&frame);
            match (&owned, &borrowed) {
                (Ok(a), Ok(b)) => proptest::prop_assert_eq!(a, b),
                (Err(_), Err(_)) => {}
                _ => proptest::prop_assert!(false, "{:?} against {:?}", owned, borrowed),
            }
            if changes.is_empty() && cut.is_none() {
                proptest::prop_assert_eq!(owned.unwrap(), part.to_vec());
            }
        }
    }
}
