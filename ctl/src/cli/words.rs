//! Slurm's words for what the controller sends as types: node states and
//! job reasons. The only place they are written; nothing parses them back.

use corral_proto::msg::{JobReason, NodeState, NodeView};

/// The long state word (`scontrol show node`, lowercase): `idle`,
/// `mixed`, `allocated`, `draining`, `drained`, `down`.
pub fn node_state_long(s: NodeState) -> &'static str {
    match s {
        NodeState::Idle => "idle",
        NodeState::Mixed => "mixed",
        NodeState::Allocated => "allocated",
        NodeState::Draining => "draining",
        NodeState::Drained => "drained",
        NodeState::Down => "down",
    }
}

/// sinfo's short state word (`%t`): `idle`, `mix`, `alloc`, `drng`,
/// `drain`, `down`.
pub fn node_state_short(s: NodeState) -> &'static str {
    match s {
        NodeState::Idle => "idle",
        NodeState::Mixed => "mix",
        NodeState::Allocated => "alloc",
        NodeState::Draining => "drng",
        NodeState::Drained => "drain",
        NodeState::Down => "down",
    }
}

/// A node's short state with Slurm's `*` for a node not responding.
pub fn node_state(n: &NodeView) -> String {
    let star = if n.not_responding { "*" } else { "" };
    format!("{}{star}", node_state_short(n.state))
}

/// The reason word in squeue's `NODELIST(REASON)` and scontrol's `Reason=`.
pub fn job_reason(r: JobReason) -> &'static str {
    match r {
        JobReason::None => "None",
        JobReason::Priority => "Priority",
        JobReason::Resources => "Resources",
        JobReason::Dependency => "Dependency",
        JobReason::DependencyNeverSatisfied => "DependencyNeverSatisfied",
        JobReason::BeginTime => "BeginTime",
        JobReason::JobHeldUser => "JobHeldUser",
        JobReason::JobHeldAdmin => "JobHeldAdmin",
        JobReason::ReqNodeNotAvail => "ReqNodeNotAvail",
        JobReason::PartitionTimeLimit => "PartitionTimeLimit",
        JobReason::JobArrayTaskLimit => "JobArrayTaskLimit",
        JobReason::JobLaunchFailure => "JobLaunchFailure",
        JobReason::NonZeroExitCode => "NonZeroExitCode",
        JobReason::NodeDown => "NodeDown",
        JobReason::TimeLimit => "TimeLimit",
    }
}
