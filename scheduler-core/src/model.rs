//! The scheduler's vocabulary: identifiers, what nodes and partitions are,
//! what a job asks for, and what the scheduler answers. Plain data; no
//! behaviour beyond builders and formatting.

use std::fmt;

/// Seconds on the driver's clock. The scheduler never reads a clock; every
/// call that depends on time carries `now` in these units.
pub type Secs = u64;

/// A time limit or an instant that never comes ("UNLIMITED").
pub const INFINITE: Secs = u64::MAX / 4;

macro_rules! id {
    ($(#[$m:meta])* $name:ident($t:ty)) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub $t);
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

id!(
    /// A job, numbered by the driver (the controller, a simulator).
    JobId(u64)
);
id!(
    /// A node slot, handed out by [`crate::Scheduler::handle_node_added`].
    NodeId(u32)
);
id!(
    /// A partition, handed out by [`crate::Scheduler::add_partition`].
    PartitionId(u32)
);
id!(
    /// A user (the driver maps names to numbers; a uid does nicely).
    UserId(u32)
);
id!(
    /// An account that fair-share charges usage to.
    AccountId(u32)
);

/// The largest number of GPUs one node may have (one bit each in a mask).
pub const MAX_GPUS_PER_NODE: usize = 64;

/// One GPU of a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuSpec {
    /// Index on the node (`/dev/nvidiaN`, `CUDA_VISIBLE_DEVICES`).
    pub index: u32,
    /// Stable identifier reported by the driver.
    pub uuid: String,
    /// Topology group: GPUs in one group (an NVLink domain, a NUMA node)
    /// talk fast to each other; jobs that fit in one group get one group.
    pub group: u32,
    /// Its model as jobs name it (`--gres=gpu:h200:1`); empty: untyped.
    pub model: String,
}

/// What a node offers, as its agent reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSpec {
    pub name: String,
    pub cpus: u32,
    pub memory_mb: u64,
    pub gpus: Vec<GpuSpec>,
    pub features: Vec<String>,
}

impl NodeSpec {
    /// A node without GPUs.
    pub fn new(name: impl Into<String>, cpus: u32, memory_mb: u64) -> Self {
        NodeSpec {
            name: name.into(),
            cpus,
            memory_mb,
            gpus: Vec::new(),
            features: Vec::new(),
        }
    }

    /// Adds `count` GPUs split into topology groups of `per_group`
    /// (`per_group == 0` puts them all in one group). UUIDs are derived from
    /// the node name so they are stable.
    pub fn with_gpus(mut self, count: u32, per_group: u32) -> Self {
        self.gpus = (0..count)
            .map(|i| GpuSpec {
                index: i,
                uuid: format!("GPU-{}-{i}", self.name),
                group: i.checked_div(per_group).unwrap_or(0),
                model: String::new(),
            })
            .collect();
        self
    }

    pub fn with_features<S: Into<String>>(mut self, features: impl IntoIterator<Item = S>) -> Self {
        self.features = features.into_iter().map(Into::into).collect();
        self
    }
}

/// A node's state as `sinfo` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NodeState {
    Idle,
    Mixed,
    Allocated,
    /// Drain set, jobs still running.
    Draining,
    /// Drain set, nothing running.
    Drained,
    Down,
}

impl NodeState {
    /// Slurm's word for the state.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Idle => "idle",
            NodeState::Mixed => "mixed",
            NodeState::Allocated => "allocated",
            NodeState::Draining => "draining",
            NodeState::Drained => "drained",
            NodeState::Down => "down",
        }
    }
}

/// What an operator or a health check says about a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeAdmin {
    /// In service.
    Up,
    /// Running jobs continue; nothing new starts.
    Drain { reason: String },
    /// Gone: its running jobs are lost.
    Down { reason: String },
}

/// A partition: which nodes, which limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionSpec {
    pub name: String,
    /// A hostlist expression (`worker-[0-7]`), or `ALL`. Nodes that register
    /// later join every partition whose expression names them.
    pub nodes: String,
    /// Time limit for jobs that give none; `None` means the maximum.
    pub default_time: Option<Secs>,
    /// Longest time limit a job may ask for; `None` means unlimited.
    pub max_time: Option<Secs>,
    /// Jobs in higher tiers come first (Slurm's PriorityTier).
    pub priority_tier: u32,
    /// Jobs that name no partition go here.
    pub is_default: bool,
}

impl PartitionSpec {
    pub fn new(name: impl Into<String>, nodes: impl Into<String>) -> Self {
        PartitionSpec {
            name: name.into(),
            nodes: nodes.into(),
            default_time: None,
            max_time: None,
            priority_tier: 1,
            is_default: false,
        }
    }
}

/// How a job asks for GPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GpuRequest {
    #[default]
    None,
    /// `--gres=gpu:N`, `--gpus-per-node=N`.
    PerNode(u32),
    /// `--gpus-per-task=N`: each task gets N GPUs of its own.
    PerTask(u32),
    /// `--gpus=N`: spread over the job's nodes, evenly.
    Total(u32),
}

/// A job dependency (`--dependency`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dependency {
    /// Once the job has started.
    After(JobId),
    /// Once the job has completed with exit code 0.
    AfterOk(JobId),
    /// Once the job has ended in any other way.
    AfterNotOk(JobId),
    /// Once the job has ended.
    AfterAny(JobId),
    /// Once no earlier job of the same name and user is pending or running.
    Singleton,
}

/// What a job asks for: the fields of `sbatch`'s command line that matter
/// to scheduling. Built with [`JobRequest::new`] and its setters; the
/// scheduler checks it at submit and turns it into a valid job or a
/// [`crate::SubmitError`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobRequest {
    pub name: String,
    pub user: UserId,
    pub account: AccountId,
    pub partition: Option<String>,
    /// `-N`: exactly this many nodes.
    pub nodes: Option<u32>,
    /// `-n`.
    pub ntasks: Option<u32>,
    /// `--ntasks-per-node`.
    pub ntasks_per_node: Option<u32>,
    /// `-c`.
    pub cpus_per_task: u32,
    /// `--mem`, per node.
    pub memory_per_node_mb: Option<u64>,
    /// `--mem-per-cpu`: per CPU of each task, on the task's node.
    pub memory_per_cpu_mb: Option<u64>,
    /// `--mem-per-gpu`: per GPU the job holds on a node.
    pub memory_per_gpu_mb: Option<u64>,
    /// `--mem=0`: all of each node's memory.
    pub memory_whole_node: bool,
    pub gpus: GpuRequest,
    /// `--gres=gpu:TYPE:N`: only nodes whose GPUs are all of this model.
    pub gpu_type: Option<String>,
    pub exclusive: bool,
    /// `-t`; `None` takes the partition's default.
    pub time_limit: Option<Secs>,
    /// `-w`: these nodes must be part of the allocation.
    pub nodelist: Vec<String>,
    /// `-x`.
    pub exclude: Vec<String>,
    /// `-C`: every node must have all of these features (`a&b`), or with
    /// `features_any`, at least one of them (`a|b`).
    pub features: Vec<String>,
    pub features_any: bool,
    pub qos: Option<String>,
    pub nice: i32,
    /// `-H`: submitted held.
    pub hold: bool,
    /// `--begin`.
    pub begin_time: Option<Secs>,
    pub dependencies: Vec<Dependency>,
    /// `-d` joined by `?`: any one of the dependencies suffices (joined
    /// by `,`, the default, all must hold).
    pub dependencies_any: bool,
    /// `--requeue`: back to pending when its node fails.
    pub requeue: bool,
    /// `--array`: this entry stands for many identical tasks.
    pub array: Option<ArrayRequest>,
    /// This job is one task of that array, split off it when it started
    /// (what a driver says when it hands back a task it restored).
    pub array_of: Option<JobId>,
}

/// A job array (`--array`): `tasks` identical tasks, held as one entry
/// until each starts. The task at position `p` (0-based, in the order
/// the driver numbers its indices) runs as job `id + 1 + p`, where `id` is
/// the array's: a driver submitting an array of `n` tasks as `id` keeps
/// the `n` ids after it for them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArrayRequest {
    pub tasks: u32,
    /// At most this many tasks run at once (`%N`); 0 for no limit.
    pub throttle: u32,
    /// Positions not yet started, as ascending half-open ranges; `None`
    /// for all of them. (A driver restoring an array says what is left.)
    pub waiting: Option<Vec<(u32, u32)>>,
    /// Tasks that already ended before a restore, and whether one of them
    /// did not succeed.
    pub ended: u32,
    pub failed: bool,
}

impl ArrayRequest {
    /// An array of `tasks` tasks, none started.
    pub fn new(tasks: u32, throttle: u32) -> Self {
        ArrayRequest {
            tasks,
            throttle,
            waiting: None,
            ended: 0,
            failed: false,
        }
    }
}

impl JobRequest {
    /// One task, one CPU, no GPUs, the default partition.
    pub fn new(user: UserId) -> Self {
        JobRequest {
            name: String::new(),
            user,
            account: AccountId(user.0),
            partition: None,
            nodes: None,
            ntasks: None,
            ntasks_per_node: None,
            cpus_per_task: 1,
            memory_per_node_mb: None,
            memory_per_cpu_mb: None,
            memory_per_gpu_mb: None,
            memory_whole_node: false,
            gpus: GpuRequest::None,
            gpu_type: None,
            exclusive: false,
            time_limit: None,
            nodelist: Vec::new(),
            exclude: Vec::new(),
            features: Vec::new(),
            features_any: false,
            qos: None,
            nice: 0,
            hold: false,
            begin_time: None,
            dependencies: Vec::new(),
            dependencies_any: false,
            requeue: false,
            array: None,
            array_of: None,
        }
    }
}

/// How a job ended, as the driver reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JobOutcome {
    Completed,
    Failed { exit_code: i32 },
    Cancelled,
    Timeout,
    NodeFail,
}

impl JobOutcome {
    /// Whether `afterok` dependants may run.
    pub fn succeeded(self) -> bool {
        matches!(self, JobOutcome::Completed)
    }
}

/// Why a pending job is not running, in Slurm's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PendingReason {
    /// Not yet looked at by a scheduling pass.
    None,
    /// Higher-priority jobs hold the resources it needs.
    Priority,
    /// The first job in line waiting for resources to free up.
    Resources,
    Dependency,
    DependencyNeverSatisfied,
    BeginTime,
    JobHeldUser,
    JobHeldAdmin,
    /// Nodes it needs are drained, down or gone.
    ReqNodeNotAvail,
    /// Its time limit is over its partition's (lowered after submit).
    PartitionTimeLimit,
    /// As many of its array's tasks run as its `%N` allows.
    JobArrayTaskLimit,
}

impl PendingReason {
    /// The word `squeue` prints in its `NODELIST(REASON)` column.
    pub fn as_str(self) -> &'static str {
        match self {
            PendingReason::None => "None",
            PendingReason::Priority => "Priority",
            PendingReason::Resources => "Resources",
            PendingReason::Dependency => "Dependency",
            PendingReason::DependencyNeverSatisfied => "DependencyNeverSatisfied",
            PendingReason::BeginTime => "BeginTime",
            PendingReason::JobHeldUser => "JobHeldUser",
            PendingReason::JobHeldAdmin => "JobHeldAdmin",
            PendingReason::ReqNodeNotAvail => "ReqNodeNotAvail",
            PendingReason::PartitionTimeLimit => "PartitionTimeLimit",
            PendingReason::JobArrayTaskLimit => "JobArrayTaskLimit",
        }
    }
}

impl fmt::Display for PendingReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who put a hold on a job (only they, or an admin, release it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HoldKind {
    User,
    Admin,
}

/// A job's share of one node: exact CPU and GPU indices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeAllocation {
    pub node: NodeId,
    /// Tasks placed on this node.
    pub tasks: u32,
    /// CPU indices, ascending.
    pub cpus: Vec<u32>,
    /// GPU indices; with `--gpus-per-task=g`, task `i` of this node owns
    /// `gpus[i*g..(i+1)*g]`.
    pub gpus: Vec<u32>,
    pub memory_mb: u64,
}

/// A job's share of one node in a reservation: counts and the exact GPUs
/// it will get (CPU indices are chosen only when it starts).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedNode {
    pub node: NodeId,
    pub tasks: u32,
    pub cpus: u32,
    pub gpus: Vec<u32>,
    pub memory_mb: u64,
}

/// Where and when a pending job is planned to start, as of the last pass
/// (Slurm's `StartTime` and `SchedNodeList`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub start: Secs,
    pub end: Secs,
    pub nodes: Vec<PlannedNode>,
}

/// A decision of a scheduling pass: start this job now, here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartDecision {
    pub job: JobId,
    /// The array `job` is a task of, when it was split off one now (its
    /// position there is `job - array - 1`).
    pub array: Option<JobId>,
    /// The time the job must end by (start plus its time limit).
    pub end_by: Secs,
    /// One entry per node, all starting together.
    pub nodes: Vec<NodeAllocation>,
}

/// What became of a running job when its node was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LostJob {
    /// Ended in NODE_FAIL.
    Failed(JobId),
    /// Submitted with `--requeue`: pending again.
    Requeued(JobId),
}

/// A job as the scheduler sees it now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobStatus {
    Pending {
        reason: PendingReason,
        /// The start its reservation promises, when it holds one.
        expected_start: Option<Secs>,
        priority: i64,
    },
    Running {
        start: Secs,
        end_by: Secs,
        nodes: Vec<NodeAllocation>,
    },
    Finished(JobOutcome),
}

/// A node as `sinfo` and `scontrol show node` need it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    pub id: NodeId,
    pub name: String,
    pub state: NodeState,
    /// The drain or down reason, if any.
    pub reason: Option<String>,
    pub cpus: u32,
    pub alloc_cpus: u32,
    pub memory_mb: u64,
    pub alloc_memory_mb: u64,
    pub gpus: u32,
    pub alloc_gpus: u32,
    pub features: Vec<String>,
    pub jobs: Vec<JobId>,
}

/// A node's GPU model for typed requests: the one model all its GPUs
/// share (compared without case); `None` when untyped or mixed (a typed
/// request never goes there).
pub fn node_gpu_model(gpus: &[GpuSpec]) -> Option<String> {
    let first = gpus.first()?.model.to_ascii_lowercase();
    let same = gpus.iter().all(|g| g.model.eq_ignore_ascii_case(&first));
    (same && !first.is_empty()).then_some(first)
}

/// Whether a node with `has` meets a job's `-C`: all of `want`, or with
/// `any`, one of them; nothing asked is met by every node.
pub fn features_met(has: &[String], want: &[String], any: bool) -> bool {
    if any && !want.is_empty() {
        want.iter().any(|f| has.contains(f))
    } else {
        want.iter().all(|f| has.contains(f))
    }
}
