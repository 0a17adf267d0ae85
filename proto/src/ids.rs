//! Who and what the messages name: users, jobs, runs and steps. A leaf:
//! every other module of the crate may use it, it uses none of them.

use serde::{Deserialize, Serialize};

/// Who a job runs as.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, bincode::Encode, bincode::Decode,
)]
pub struct Ident {
    pub uid: u32,
    pub gid: u32,
}

/// A job's id, as users see it (`SLURM_JOB_ID`).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    bincode::Encode,
    bincode::Decode,
)]
#[serde(transparent)]
pub struct JobId(pub u64);

impl std::fmt::Display for JobId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A step of a job: 0, 1, ... for srun's steps, [`StepId::BATCH`] for the
/// batch script (Slurm writes it `batch`).
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    bincode::Encode,
    bincode::Decode,
)]
#[serde(transparent)]
pub struct StepId(pub u32);

impl StepId {
    /// The batch script's step.
    pub const BATCH: StepId = StepId(u32::MAX - 1);
}

impl std::fmt::Display for StepId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            StepId::BATCH => f.write_str("batch"),
            StepId(n) => n.fmt(f),
        }
    }
}

/// One run of a job: a requeued job runs again with the next number
/// (`SLURM_RESTART_COUNT`), and every message about a job names its run so
/// that news of an older run is never credited to a newer one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct JobRun {
    pub job: JobId,
    pub run: u32,
}
