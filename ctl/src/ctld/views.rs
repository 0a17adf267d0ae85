//! What squeue, sinfo and scontrol show: views built from the job table,
//! the node registry and the scheduler's status.

use super::wire::{core_id, job_reason, node_state, wire_id};
use super::{Controller, JobRecord, Selector};
use corral_proto::msg::JobSpec;
use std::collections::HashMap;

use corral_proto::msg::{
    GpuAsk, JobAsk, JobFilter, JobId, JobKind, JobReason, JobState, JobView, NodeView,
    PartitionView, StepView, JOBS_PER_PAGE,
};
use scheduler_core::JobStatus;

impl Controller {
    // ---- views -------------------------------------------------------

    /// Jobs the filter selects, one page (ids above `f.after`, at most
    /// [`JOBS_PER_PAGE`]) in id order.
    pub fn job_views(&self, f: &JobFilter, now: u64) -> Vec<JobView> {
        let Ok(mut sel) = Selector::new(f.clone()) else {
            return Vec::new();
        };
        if self.resolve_arrays(&mut sel).is_err() {
            return Vec::new();
        }
        let mut out = Vec::new();
        loop {
            let (views, next) =
                self.job_views_chunk(&sel, JOBS_PER_PAGE - out.len(), usize::MAX, now);
            out.extend(views);
            match next {
                Some(after) if out.len() < JOBS_PER_PAGE => sel.after = after,
                _ => return out,
            }
        }
    }

    /// Part of a page: at most `max_views` views of jobs above `sel.after`,
    /// looking at no more than `max_scan` jobs. Returns the views and, when
    /// it stopped early, the id to go on after (the caller may release the
    /// controller between chunks, so a large view never holds it long).
    pub fn job_views_chunk(
        &self,
        sel: &Selector,
        max_views: usize,
        max_scan: usize,
        _now: u64,
    ) -> (Vec<JobView>, Option<JobId>) {
        let from = JobId(sel.after.0.saturating_add(1));
        let candidates: Box<dyn Iterator<Item = &JobRecord>> = match &sel.ids {
            Some(ids) => Box::new(ids.range(from..).filter_map(|id| self.jobs.get(id))),
            None => Box::new(self.jobs.range(from..).map(|(_, j)| j)),
        };
        let mut views = Vec::new();
        for (scanned, j) in candidates.enumerate() {
            if views.len() >= max_views || scanned >= max_scan {
                return (views, Some(JobId(j.id.0 - 1)));
            }
            // An array whose tasks all started is seen in its tasks.
            if j.spent_array() {
                continue;
            }
            if sel.matches(j.id, j.user.uid, j.shown_state(), &j.partition, || {
                j.spec().name
            }) {
                let spec = j.spec();
                let only = sel
                    .only
                    .get(&j.id)
                    .zip(spec.array.as_ref())
                    .map(|(only, a)| {
                        only.iter()
                            .flat_map(|&p| a.slice(p, p + 1))
                            .collect::<Vec<_>>()
                    });
                let mut v = self.view_of(j, spec, sel.detail);
                if let (Some(waiting), Some(a)) = (only, v.array.as_mut()) {
                    a.waiting = waiting;
                }
                views.push(v);
            }
        }
        (views, None)
    }

    pub(super) fn view(&self, j: &JobRecord, detail: bool, _now: u64) -> JobView {
        self.view_of(j, j.spec(), detail)
    }

    /// [`Controller::view`] with the job's spec decoded. The view takes
    /// the decoded spec's strings rather than copies of them: a listing
    /// of ten thousand jobs made and freed each one twice.
    fn view_of(&self, j: &JobRecord, mut spec: JobSpec, detail: bool) -> JobView {
        let cpus_per_task = spec.cpus_per_task.unwrap_or(1);
        // Only a pending job has anything to ask the scheduler (a running
        // one's status would clone its allocation for nothing).
        let status = (j.state == JobState::Pending)
            .then(|| self.sched.job_status(core_id(j.id)))
            .flatten();
        let (reason, priority, expected) = match status {
            Some(JobStatus::Pending {
                reason,
                expected_start,
                priority,
            }) => (job_reason(reason), priority, expected_start),
            _ => (JobReason::None, 0, None),
        };
        let reason = match (j.state, &j.failure) {
            (JobState::Pending, _) => reason,
            (JobState::Failed, Some(_)) => JobReason::JobLaunchFailure,
            (JobState::Failed, None) => JobReason::NonZeroExitCode,
            (JobState::NodeFail, _) => JobReason::NodeDown,
            (JobState::Timeout, _) => JobReason::TimeLimit,
            _ => JobReason::None,
        };
        let running = !j.alloc.is_empty();
        let num_tasks = if running {
            j.alloc.iter().map(|(_, a)| a.tasks).sum()
        } else {
            spec.ntasks.unwrap_or(spec.nodes.unwrap_or(1))
        };
        let num_cpus = if running {
            j.alloc.iter().map(|(_, a)| a.cpus.len() as u32).sum()
        } else {
            num_tasks * cpus_per_task
        };
        let gpus = if running {
            j.alloc.iter().map(|(_, a)| a.gpus.len() as u32).sum()
        } else {
            match spec.gpus {
                GpuAsk::None => 0,
                GpuAsk::PerNode(g) => g * spec.nodes.unwrap_or(1),
                GpuAsk::PerTask(g) => g * num_tasks,
                GpuAsk::Total(g) => g,
            }
        };
        // What needs the whole spec first; then its strings move.
        let array = j.array_view(&spec, self.sched.array_waiting(core_id(j.id)));
        let ask = detail.then(|| {
            let mut a = ask(j, &spec, reason);
            if j.state == JobState::Pending {
                if let Some(r) = self.sched.reservation(core_id(j.id)) {
                    a.sched_nodes = r.nodes.iter().map(|p| self.node_name(p.node)).collect();
                }
            }
            Box::new(a)
        });
        let default_output = match &spec.kind {
            JobKind::Batch { stdout: None, .. } => Some(JobRecord::default_output(&spec)),
            _ => None,
        };
        let (stdout, stderr, command, batch) = match &mut spec.kind {
            // Slurm's Command: the script's path and arguments, `(null)`
            // for --wrap and standard input.
            JobKind::Batch {
                stdout,
                stderr,
                args,
                ..
            } => (
                stdout.take().or_else(|| default_output.map(Into::into)),
                stderr.take(),
                match spec.script_path.take() {
                    Some(p) if args.is_empty() => p,
                    Some(p) => format!("{p} {}", args.join(" ")),
                    None => "(null)".into(),
                },
                true,
            ),
            JobKind::Interactive { argv, .. } => (None, None, argv.join(" "), false),
            JobKind::Allocation => (None, None, spec.name.clone(), false),
        };
        JobView {
            id: j.id,
            name: std::mem::take(&mut spec.name),
            user: j.user,
            partition: j.partition.clone(),
            state: j.shown_state(),
            reason,
            priority,
            submit_time: j.submit,
            start_time: j.start,
            end_time: j.end.or(j.end_by),
            expected_start: expected,
            time_limit: spec
                .time_limit
                .or_else(|| j.end_by.zip(j.start).map(|(e, s)| e.saturating_sub(s))),
            nodes: j.alloc.iter().map(|(n, _)| n.clone()).collect(),
            num_nodes: if running {
                j.alloc.len() as u32
            } else {
                spec.nodes.unwrap_or(1)
            },
            num_tasks,
            cpus_per_task,
            num_cpus,
            gpus,
            mem_mb: spec.mem_mb.unwrap_or(0),
            exit: j.exit,
            work_dir: std::mem::take(&mut spec.work_dir),
            stdout,
            stderr,
            command,
            batch,
            requeue: spec.requeue,
            restarts: j.restarts,
            failure: j.failure.clone(),
            usage: j.used,
            comment: spec.comment.take(),
            mail_type: spec.mail_type.take(),
            mail_user: spec.mail_user.take(),
            array,
            ask,
            steps: j
                .steps
                .iter()
                .filter(|s| detail && s.end.is_none())
                .map(|s| StepView {
                    id: s.id,
                    name: s.name.clone(),
                    nodes: s.nodes.clone(),
                    tasks: s.tasks,
                    cpus: s.cpus,
                    start: s.start,
                })
                .collect(),
            suspension: j.suspension,
        }
    }

    pub fn node_views(&self) -> Vec<NodeView> {
        // Each node's partitions, from one walk over the partitions.
        let mut member_of: HashMap<scheduler_core::NodeId, Vec<String>> = HashMap::new();
        for p in &self.cfg.partitions {
            if let Some(pid) = self.sched.partition_id(&p.name) {
                for &n in self.sched.partition_nodes(pid) {
                    member_of.entry(n).or_default().push(p.name.clone());
                }
            }
        }
        let mut out: Vec<NodeView> = self
            .nodes
            .values()
            .filter_map(|n| {
                let info = self.sched.node_info(n.id)?;
                let partitions = member_of.remove(&n.id).unwrap_or_default();
                let (reason, reason_user, reason_time) = match (&n.admin, n.not_responding) {
                    (Some((_, r, by, at)), _) => (Some(r.clone()), Some(*by), Some(*at)),
                    (None, true) => (
                        Some("Not responding".to_string()),
                        Some(0),
                        Some(n.last_seen),
                    ),
                    (None, false) => {
                        match (&n.leaving, n.problem.as_ref().or(n.check_failed.as_ref())) {
                            (Some((since, _)), _) => (
                                Some(super::nodes::LEAVING.to_string()),
                                Some(0),
                                Some(*since),
                            ),
                            (None, Some((why, since))) => {
                                (Some(format!("node_problem: {why}")), Some(0), Some(*since))
                            }
                            (None, None) => (None, None, None),
                        }
                    }
                };
                // A job ending whose clean-up here is not confirmed.
                let completing = info.jobs.iter().any(|&id| {
                    self.jobs.get(&wire_id(id)).is_some_and(|j| {
                        j.state == JobState::Completing && j.cleaning.contains(&n.reg.name)
                    })
                });
                Some(NodeView {
                    name: n.reg.name.clone(),
                    state: node_state(info.state),
                    not_responding: n.not_responding,
                    fail: matches!(n.admin, Some((corral_proto::msg::NodeUpdate::Fail, ..))),
                    completing,
                    cpus: info.cpus,
                    alloc_cpus: info.alloc_cpus,
                    memory_mb: info.memory_mb,
                    alloc_memory_mb: info.alloc_memory_mb,
                    gpus: info.gpus,
                    alloc_gpus: info.alloc_gpus,
                    gpu_model: scheduler_core::node_gpu_model(&super::wire::node_spec(&n.reg).gpus),
                    features: info.features,
                    partitions,
                    reason,
                    reason_user,
                    reason_time,
                    boot_time: n.boot,
                    last_seen: n.last_seen,
                    jobs: info.jobs.iter().copied().map(wire_id).collect(),
                })
            })
            .collect();
        out.sort_by(|a, b| natural(&a.name, &b.name));
        out
    }

    pub fn partition_views(&self) -> Vec<PartitionView> {
        self.cfg
            .partitions
            .iter()
            .map(|p| {
                let members: Vec<_> = self
                    .sched
                    .partition_id(&p.name)
                    .map(|id| self.sched.partition_nodes(id).to_vec())
                    .unwrap_or_default();
                let infos: Vec<_> = members
                    .iter()
                    .filter_map(|&id| self.sched.node_info(id))
                    .collect();
                let mut nodes: Vec<String> = infos.iter().map(|i| i.name.clone()).collect();
                nodes.sort_by(|a, b| natural(a, b));
                PartitionView {
                    name: p.name.clone(),
                    is_default: p.is_default,
                    nodes_expr: p.nodes.clone(),
                    nodes,
                    max_time: p.max_time,
                    default_time: p.default_time,
                    priority_tier: p.priority_tier,
                    total_cpus: infos.iter().map(|i| i.cpus).sum(),
                    total_gpus: infos.iter().map(|i| i.gpus).sum(),
                }
            })
            .collect()
    }
}

/// Orders names with numbers by value: worker-2 before worker-10.
/// What a job asked for beyond its shape, for squeue and scontrol.
fn ask(j: &JobRecord, spec: &JobSpec, reason: JobReason) -> JobAsk {
    // Slurm shows a dependency only while it still holds the job.
    let dependency = (j.state == JobState::Pending && !spec.dependencies.is_empty()).then(|| {
        let mark = if reason == JobReason::DependencyNeverSatisfied {
            "(failed)"
        } else {
            "(unfulfilled)"
        };
        let parts: Vec<String> = spec
            .dependencies
            .iter()
            .map(|d| format!("{d}{mark}"))
            .collect();
        parts.join(if spec.dependency_any { "?" } else { "," })
    });
    let (per_node, per_task, total) = match spec.gpus {
        GpuAsk::None => (None, None, None),
        GpuAsk::PerNode(g) => (Some(g), None, None),
        GpuAsk::PerTask(g) => (None, Some(g), None),
        GpuAsk::Total(g) => (None, None, Some(g)),
    };
    JobAsk {
        account: spec.account.clone(),
        qos: spec.qos.clone(),
        nice: spec.nice,
        dependency,
        req_nodes: spec.nodelist.clone(),
        exc_nodes: spec.exclude.clone(),
        features: (!spec.constraint.is_empty()).then(|| {
            spec.constraint
                .join(if spec.constraint_any { "|" } else { "&" })
        }),
        exclusive: spec.exclusive,
        mem_per_cpu_mb: spec.mem_per_cpu_mb,
        gpu_type: spec.gpu_type.clone(),
        gpus_per_node: per_node,
        gpus_per_task: per_task,
        gpus_total: total,
        begin: spec.begin,
        ntasks_per_node: spec.ntasks_per_node,
        nodes: spec.nodes,
        submit_host: spec.submit_host.clone(),
        sched_nodes: Vec::new(),
    }
}

pub fn natural(a: &str, b: &str) -> std::cmp::Ordering {
    let split = |s: &str| {
        let t = s.trim_end_matches(|c: char| c.is_ascii_digit());
        (t.len(), s[t.len()..].parse::<u64>().ok())
    };
    let ((la, na), (lb, nb)) = (split(a), split(b));
    a[..la].cmp(&b[..lb]).then(na.cmp(&nb)).then(a.cmp(b))
}
