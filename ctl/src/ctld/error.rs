//! Why the controller refuses a request. Each variant's text is what a
//! Slurm user reads (`sbatch: error: …`); the server turns it into the
//! wire's one-line answer at the one place it answers.

use corral_proto::msg::JobId;
use scheduler_core::{ControlError, SubmitError};

use super::{MAX_FEATURES, MAX_FEATURE_LEN, MAX_FILTER_ENTRIES, MAX_GPUS, MAX_NICE};

/// The most refused jobs a cancel names one by one.
const KILL_DENIED_SHOWN: usize = 20;

/// A refused request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CtldError {
    #[error("{}", capitalise(&.0.to_string()))]
    Submit(#[from] SubmitError),
    #[error("{}", capitalise(&.0.to_string()))]
    Control(#[from] ControlError),
    #[error("Invalid job id specified: {0}")]
    UnknownJob(JobId),
    #[error("Invalid job id specified: {0}_{1}")]
    UnknownTask(JobId, u32),
    #[error("Job would not start: {0}")]
    WouldNotStart(String),
    #[error("Invalid job array specification: {0}")]
    BadArray(String),
    #[error("Job dependency problem: job {0} has no array task {1}")]
    UnknownDependencyTask(JobId, u32),
    #[error("Access/permission denied")]
    AccessDenied,
    #[error("Access/permission denied for job {0}")]
    NotYourJob(JobId),
    /// `scontrol reconfigure` of a setting only a restart changes.
    #[error("Reconfiguration refused: {0} changes only with a restart of corral-ctld")]
    Reconfigure(&'static str),
    /// `scontrol update` of a job that no longer waits.
    #[error("Job is no longer pending execution for job {0}")]
    NoLongerPending(JobId),
    /// `scontrol update NumNodes=` above the most nodes the job asked for
    /// (its `-N`), as Slurm refuses it.
    #[error("Node count specification invalid for job {0}")]
    NodeCountInvalid(JobId),
    /// `scontrol update` that only an operator may make (a longer time
    /// limit, a negative nice).
    #[error("Access/permission denied for job {0}: {1}")]
    UpdateDenied(JobId, &'static str),
    #[error("{}", capitalise(&.0.to_string()))]
    Update(#[from] scheduler_core::UpdateError),
    #[error("Job {0} is not running")]
    NotRunning(JobId),
    #[error("Job {0} is not an allocation of salloc's")]
    NotAllocation(JobId),
    /// scancel naming a job it cannot end.
    #[error("Kill job error on job id {job}: {why}")]
    Kill { job: JobId, why: KillRefusal },
    /// `scontrol requeue` naming a job it cannot requeue.
    #[error("{why} for job {job}")]
    Requeue { job: JobId, why: RequeueRefusal },
    /// `scontrol suspend` or `resume` naming a job it cannot stop or
    /// continue.
    #[error("{why} for job {job}")]
    Suspend { job: JobId, why: SuspendRefusal },
    /// `srun` into a suspended job (srun waits, as Slurm's).
    #[error("Job {0} is suspended: its steps wait for scontrol resume")]
    StepWhileSuspended(JobId),
    /// scancel whose filter selected other users' jobs: one line per job.
    #[error("{}", kill_denied(.0))]
    KillDenied(Vec<JobId>),
    #[error("Too many {what} in one request: {count}, the most is {MAX_FILTER_ENTRIES}")]
    FilterTooLarge { what: &'static str, count: usize },
    #[error("Invalid {what}: control characters (and bidirectional overrides, line separators) are not allowed")]
    ControlCharacters { what: &'static str },
    #[error("Invalid {what}: longer than {max} bytes")]
    TooLong { what: &'static str, max: usize },
    #[error("Batch script is too large: {size} bytes, the limit is {max}")]
    ScriptTooLarge { size: u64, max: u64 },
    #[error("Invalid generic resource (gres) specification: {0} GPUs, the most is {MAX_GPUS}")]
    TooManyGpus(u32),
    #[error(
        "Invalid feature specification: {0} features, the most is {MAX_FEATURES}, each at most {MAX_FEATURE_LEN} bytes"
    )]
    TooManyFeatures(usize),
    #[error("Access/permission denied: only operators may set a negative nice value")]
    NegativeNice,
    #[error("Invalid nice value: it must be between -{MAX_NICE} and {MAX_NICE}")]
    NiceOutOfRange,
    /// The state's filesystem is below the reserve kept for what runs.
    #[error(
        "Resource temporarily unavailable: the controller's state disk has {free_mib} MiB free, \
         under the {reserve_mib} MiB it keeps for running jobs; no new jobs until space is freed"
    )]
    StateDiskLow { free_mib: u64, reserve_mib: u64 },
    #[error("Resource temporarily unavailable: the cluster holds its limit of {0} jobs")]
    ClusterFull(u64),
    #[error("Resource temporarily unavailable: no job id up to MaxJobId={0} is free")]
    NoJobIds(u64),
    #[error(
        "Job violates accounting/QOS policy (job submit limit, user's size and/or time limits): \
         {jobs} unfinished jobs and {adding} more (an array's tasks each count), the limit per user is {max}"
    )]
    UserJobLimit { jobs: u64, adding: u64, max: u64 },
    #[error(
        "Job violates accounting/QOS policy (job submit limit, user's size and/or time limits): \
         the user's jobs would hold {bytes} bytes (scripts and environments of unfinished jobs, \
         what finished jobs keep), the limit per user is {max}"
    )]
    UserByteLimit { bytes: u64, max: u64 },
    #[error("Requested node configuration is not available: the allocation has {0} nodes")]
    StepNodes(u32),
    #[error("Invalid number of tasks")]
    StepTasks,
    #[error("Step limit reached for this job: {0} steps (MaxStepCount)")]
    StepLimit(u32),
    #[error(
        "Requested GPUs are busy: the step asks {want} on {node}, where {free} of the job's {job} are free of other steps"
    )]
    StepGpus {
        node: String,
        want: u32,
        free: u32,
        job: u32,
    },
    #[error(
        "Requested nodes are busy: the step asks {want} CPUs on {node}, where {free} of the job's {job} are free of other steps"
    )]
    StepCpus {
        node: String,
        want: u32,
        free: u32,
        job: u32,
    },
    #[error("More processors requested than permitted: the step asks {want} CPUs on {node}, where the job has {job}")]
    StepCpusOverJob { node: String, want: u32, job: u32 },
    #[error("Invalid node name specified: {0}")]
    UnknownNode(String),
    #[error("Requested node configuration is not available: {0} is not one of the job's nodes")]
    StepNodeNotInJob(String),
    #[error("You must specify a reason when DRAINING or DOWNING a node")]
    ReasonRequired,
    #[error(
        "Invalid node state transition requested: {0} is not responding; it returns when its agent connects again"
    )]
    NodeNotResponding(String),
    /// A registration whose node name is empty or too long.
    #[error("invalid node name")]
    BadNodeName,
}

/// Why scancel cannot end a job it named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KillRefusal {
    #[error("Access/permission denied")]
    AccessDenied,
}

/// Why `scontrol requeue` cannot requeue a job (Slurm's words).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RequeueRefusal {
    #[error("Only batch jobs are accepted or processed")]
    NotBatch,
    #[error("Requested operation is presently disabled")]
    NotRequeueable,
    #[error("Job is pending execution")]
    Pending,
    #[error("Job can not be altered now, try again later")]
    Completing,
    /// A finished job's script is gone from the store (Slurm 22.05 would
    /// requeue it while it still knows the job).
    #[error("Job has finished and its script is no longer kept: submit it again")]
    Finished,
}

/// Why `scontrol suspend` or `resume` refused a job, in Slurm's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SuspendRefusal {
    #[error("Job is pending execution")]
    Pending,
    #[error("Job is not suspended")]
    NotSuspended,
    #[error("Job/step already completing or completed")]
    Finished,
}

fn kill_denied(jobs: &[JobId]) -> String {
    let mut lines: Vec<String> = jobs
        .iter()
        .take(KILL_DENIED_SHOWN)
        .map(|id| format!("Kill job error on job id {id}: Access/permission denied"))
        .collect();
    if jobs.len() > KILL_DENIED_SHOWN {
        lines.push(format!(
            "Access/permission denied for {} more jobs",
            jobs.len() - KILL_DENIED_SHOWN
        ));
    }
    lines.join("\n")
}

/// The core's messages are lowercase (library style); Slurm's start with
/// a capital.
pub(super) fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}
