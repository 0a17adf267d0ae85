//! Where the wire's types meet the scheduler core's: the one place a
//! submission or a registration becomes what the core takes.

use corral_proto::msg::{self as wire, Dep, GpuAsk, Ident, JobReason, JobSpec, Registration};

use scheduler_core::{
    Dependency, GpuRequest, GpuSpec, JobId, JobRequest, NodeSpec, NodeState, PendingReason, UserId,
};

/// The core's id for a job (the same number).
pub(super) fn core_id(id: wire::JobId) -> JobId {
    JobId(id.0)
}

/// The wire's id for a job the core names.
pub(super) fn wire_id(id: JobId) -> wire::JobId {
    wire::JobId(id.0)
}

pub(super) fn gpu_request(g: GpuAsk) -> GpuRequest {
    match g {
        GpuAsk::None => GpuRequest::None,
        GpuAsk::PerNode(n) => GpuRequest::PerNode(n),
        GpuAsk::PerTask(n) => GpuRequest::PerTask(n),
        GpuAsk::Total(n) => GpuRequest::Total(n),
    }
}

fn dependency(d: Dep) -> Dependency {
    match d {
        Dep::After(j) => Dependency::After(core_id(j)),
        Dep::AfterOk(j) => Dependency::AfterOk(core_id(j)),
        Dep::AfterNotOk(j) => Dependency::AfterNotOk(core_id(j)),
        Dep::AfterAny(j) => Dependency::AfterAny(core_id(j)),
        Dep::Singleton => Dependency::Singleton,
        // Resolved to the task's job id at submit; what is left stands
        // for its array.
        Dep::Task { cond, job, .. } => match cond {
            wire::DepCond::After => Dependency::After(core_id(job)),
            wire::DepCond::AfterOk => Dependency::AfterOk(core_id(job)),
            wire::DepCond::AfterNotOk => Dependency::AfterNotOk(core_id(job)),
            wire::DepCond::AfterAny => Dependency::AfterAny(core_id(job)),
        },
    }
}

/// What the scheduler is asked for a submission (already admitted, its
/// CPUs per task normalised).
pub(super) fn job_request(who: Ident, spec: &JobSpec) -> JobRequest {
    let mut req = JobRequest::new(UserId(who.uid));
    req.account = super::accounts::account_id(req.user, spec.account.as_deref());
    req.name = spec.name.clone();
    req.partition = spec.partition.clone();
    req.nodes = spec.nodes;
    req.ntasks = spec.ntasks;
    req.ntasks_per_node = spec.ntasks_per_node;
    req.cpus_per_task = spec.cpus_per_task.unwrap_or(1);
    req.memory_per_node_mb = spec.mem_mb;
    req.memory_per_cpu_mb = spec.mem_per_cpu_mb;
    req.memory_per_gpu_mb = spec.mem_per_gpu_mb;
    req.memory_whole_node = spec.mem_whole;
    req.gpus = gpu_request(spec.gpus);
    req.gpu_type = spec.gpu_type.clone();
    req.exclusive = spec.exclusive;
    req.time_limit = spec.time_limit;
    req.nodelist = spec.nodelist.clone();
    req.exclude = spec.exclude.clone();
    req.hold = spec.hold;
    req.requeue = spec.requeue;
    req.qos = spec.qos.clone();
    req.nice = spec.nice;
    req.begin_time = spec.begin;
    req.dependencies = spec.dependencies.iter().copied().map(dependency).collect();
    req.dependencies_any = spec.dependency_any;
    req.features = spec.constraint.clone();
    req.features_any = spec.constraint_any;
    req
}

/// The node a registration describes.
pub(super) fn node_spec(reg: &Registration) -> NodeSpec {
    NodeSpec {
        name: reg.name.clone(),
        cpus: reg.cpus,
        memory_mb: reg.memory_mb,
        gpus: reg
            .gpus
            .iter()
            .map(|g| GpuSpec {
                index: g.index,
                uuid: g.uuid.clone(),
                group: g.group,
                model: g.model.clone(),
            })
            .collect(),
        features: reg.features.clone(),
    }
}

/// The scheduler's pending reason, as the wire names it.
pub(super) fn job_reason(r: PendingReason) -> JobReason {
    match r {
        PendingReason::None => JobReason::None,
        PendingReason::Priority => JobReason::Priority,
        PendingReason::Resources => JobReason::Resources,
        PendingReason::Dependency => JobReason::Dependency,
        PendingReason::DependencyNeverSatisfied => JobReason::DependencyNeverSatisfied,
        PendingReason::BeginTime => JobReason::BeginTime,
        PendingReason::JobHeldUser => JobReason::JobHeldUser,
        PendingReason::JobHeldAdmin => JobReason::JobHeldAdmin,
        PendingReason::ReqNodeNotAvail => JobReason::ReqNodeNotAvail,
        PendingReason::PartitionTimeLimit => JobReason::PartitionTimeLimit,
        PendingReason::JobArrayTaskLimit => JobReason::JobArrayTaskLimit,
    }
}

/// The scheduler's node state, as the wire names it.
pub(super) fn node_state(s: NodeState) -> wire::NodeState {
    match s {
        NodeState::Idle => wire::NodeState::Idle,
        NodeState::Mixed => wire::NodeState::Mixed,
        NodeState::Allocated => wire::NodeState::Allocated,
        NodeState::Draining => wire::NodeState::Draining,
        NodeState::Drained => wire::NodeState::Drained,
        NodeState::Down => wire::NodeState::Down,
    }
}
