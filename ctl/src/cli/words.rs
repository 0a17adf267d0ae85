//! Slurm's words for what the controller sends as types: node states and
//! job reasons. The only place they are written; nothing parses them back.

use corral_proto::msg::{JobReason, NodeState, NodeView};

/// The long state word (sinfo's `%T`, lowercase): `idle`, `mixed`,
/// `allocated`, `completing`, `draining`, `drained`, `down`, `fail`,
/// `failing`. A drain or down outranks a FAIL, which outranks COMPLETING.
pub fn node_state_long(n: &NodeView) -> &'static str {
    match n.state {
        NodeState::Draining if n.fail => "failing",
        NodeState::Drained if n.fail => "fail",
        NodeState::Draining => "draining",
        NodeState::Drained => "drained",
        NodeState::Down => "down",
        _ if n.completing => "completing",
        NodeState::Idle => "idle",
        NodeState::Mixed => "mixed",
        NodeState::Allocated => "allocated",
    }
}

/// sinfo's short state word (`%t`): `idle`, `mix`, `alloc`, `comp`,
/// `drng`, `drain`, `down`, `fail`, `failg`.
pub fn node_state_short(n: &NodeView) -> &'static str {
    match n.state {
        NodeState::Draining if n.fail => "failg",
        NodeState::Drained if n.fail => "fail",
        NodeState::Draining => "drng",
        NodeState::Drained => "drain",
        NodeState::Down => "down",
        _ if n.completing => "comp",
        NodeState::Idle => "idle",
        NodeState::Mixed => "mix",
        NodeState::Allocated => "alloc",
    }
}

/// A node's short state with Slurm's `*` for a node not responding.
pub fn node_state(n: &NodeView) -> String {
    let star = if n.not_responding { "*" } else { "" };
    format!("{}{star}", node_state_short(n))
}

/// A node's state as `scontrol show node` writes it: the base state and
/// Slurm's flags in Slurm's order (`MIXED+COMPLETING`, `IDLE+DRAIN`,
/// `IDLE+FAIL`, `DOWN+NOT_RESPONDING`).
pub fn node_state_full(n: &NodeView) -> String {
    let by_use = || {
        if n.alloc_cpus == 0 {
            "IDLE"
        } else if n.alloc_cpus >= n.cpus {
            "ALLOCATED"
        } else {
            "MIXED"
        }
    };
    let (base, drain) = match n.state {
        NodeState::Idle => ("IDLE", false),
        NodeState::Mixed => ("MIXED", false),
        NodeState::Allocated => ("ALLOCATED", false),
        NodeState::Draining | NodeState::Drained => (by_use(), !n.fail),
        NodeState::Down => ("DOWN", false),
    };
    let mut s = base.to_string();
    for (on, flag) in [
        (n.completing, "+COMPLETING"),
        (drain, "+DRAIN"),
        (n.fail, "+FAIL"),
        // Slurm 22.05 (measured): `State=DOWN+NOT_RESPONDING` here,
        // `down*` in sinfo.
        (n.not_responding, "+NOT_RESPONDING"),
    ] {
        if on {
            s.push_str(flag);
        }
    }
    s
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
