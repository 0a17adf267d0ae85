//! Errors the scheduler returns to its driver. Each says what was wrong in
//! words a Slurm user would recognise; none of them changes any state.

use crate::hostlist::HostlistError;
use crate::model::{JobId, NodeId, Secs};

/// Why a job request was refused at submit. A refused request never sits
/// in the queue.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("job id {0} is already in use")]
    DuplicateJob(JobId),
    #[error("invalid partition name specified: {0}")]
    UnknownPartition(String),
    #[error("no partition specified and no default partition configured")]
    NoDefaultPartition,
    #[error("invalid qos specification: {0}")]
    UnknownQos(String),
    #[error("invalid node name specified: {0}")]
    UnknownNode(String),
    #[error("requested time limit {limit}s exceeds partition {partition}'s limit of {max}s")]
    TimeLimit {
        partition: String,
        limit: Secs,
        max: Secs,
    },
    #[error("requested node configuration is not available: {0}")]
    NodeConfigUnavailable(String),
    #[error("invalid job request: {0}")]
    Invalid(String),
    #[error("job dependency problem: job {0} is unknown")]
    UnknownDependency(JobId),
}

/// Why a pending job's request could not be changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpdateError {
    #[error(transparent)]
    Control(#[from] ControlError),
    #[error(transparent)]
    Submit(#[from] SubmitError),
}

/// Why a control call (cancel, hold, node change, ...) was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    #[error("invalid job id specified: {0}")]
    UnknownJob(JobId),
    #[error("job {0} is not pending")]
    NotPending(JobId),
    #[error("job {0} is not running")]
    NotRunning(JobId),
    #[error("job {0} is not suspended")]
    NotSuspended(JobId),
    #[error("job {0} is held by an administrator")]
    AdminHold(JobId),
    #[error("invalid node id specified: {0}")]
    UnknownNode(NodeId),
    #[error("node {0} is already registered")]
    DuplicateNode(String),
    #[error("node {name} has {count} GPUs; at most {max} are supported", max = crate::model::MAX_GPUS_PER_NODE)]
    TooManyGpus { name: String, count: usize },
    #[error("node {name}: GPU index {index} is out of range or repeated")]
    BadGpuIndex { name: String, index: u32 },
    #[error("node {0} has no CPUs")]
    NoCpus(String),
    #[error("partition {0} already exists")]
    DuplicatePartition(String),
    #[error("invalid partition name specified: {0}")]
    UnknownPartition(String),
    #[error("partition {name}: bad node list")]
    PartitionNodes {
        name: String,
        #[source]
        source: HostlistError,
    },
}
