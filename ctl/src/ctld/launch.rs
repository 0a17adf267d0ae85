//! The `Launch` messages that start a batch job, an srun job's first
//! step, or a later step inside an allocation.

use super::wire::wire_id;
use super::{natural, Controller, CtldError, JobRecord, Refusal, StoredAlloc};

use corral_proto::msg::{
    CtldMsg, ExitStatus, GpuAsk, Ident, JobId, JobKind, JobState, Launch, LaunchKind, StepId,
    StepSpec,
};
use scheduler_core::StartDecision;

/// One step's launches, one per node that runs a part of it. The batch
/// script, an srun job's first step and a later step inside an allocation
/// all build their `Launch` messages here.
struct StepPlan<'a> {
    job: &'a JobRecord,
    step: StepId,
    work_dir: &'a str,
    env: &'a [(String, String)],
    /// `SLURM_NTASKS` and `SLURM_NNODES` as the step's tasks see them.
    ntasks: u32,
    step_nodes: u32,
    /// Tasks on each of the job's first nodes that run a part.
    tasks: Vec<u32>,
    what: LaunchKind,
}

impl StepPlan<'_> {
    fn launches(self) -> Vec<(String, Launch)> {
        let j = self.job;
        let job_nodes: Vec<String> = j.alloc.iter().map(|(n, _)| n.clone()).collect();
        let gpus_per_task = match j.spec.gpus {
            GpuAsk::PerTask(g) => Some(g),
            _ => None,
        };
        let time_limit = j.end_by.zip(j.start).map(|(e, s)| e.saturating_sub(s));
        let mut first_task = 0;
        let mut out = Vec::with_capacity(self.tasks.len());
        for (i, ((node, a), &here)) in j.alloc.iter().zip(&self.tasks).enumerate() {
            let launch = Launch {
                job: j.id,
                run: j.restarts,
                step: self.step,
                name: j.spec.name.clone(),
                user: j.user,
                partition: j.partition.clone(),
                work_dir: self.work_dir.to_string(),
                env: self.env.to_vec(),
                job_nodes: job_nodes.clone(),
                node_index: i as u32,
                step_nodes: self.step_nodes,
                ntasks: self.ntasks,
                first_task,
                tasks_here: here,
                cpus_per_task: j.cpus_per_task(),
                cpus: a.cpus.clone(),
                gpus: a.gpus.clone(),
                gpus_per_task,
                memory_mb: a.memory_mb,
                time_limit,
                exclusive: j.spec.exclusive,
                what: self.what.clone(),
            };
            first_task += here;
            out.push((node.clone(), launch));
        }
        out
    }
}

impl Controller {
    pub(super) fn start(&mut self, now: u64, d: StartDecision) {
        let mut alloc: Vec<(String, StoredAlloc)> = d
            .nodes
            .into_iter()
            .map(|a| (self.node_name(a.node), StoredAlloc::of(a)))
            .collect();
        // Slurm orders a job's nodes by name: task 0 and the batch script
        // go to the first.
        alloc.sort_by(|a, b| natural(&a.0, &b.0));
        let Some(j) = self.jobs.get_mut(&wire_id(d.job)) else {
            return;
        };
        j.state = JobState::Running;
        j.start = Some(now);
        j.end_by = (d.end_by < scheduler_core::INFINITE).then_some(d.end_by);
        j.alloc = alloc;
        j.exit = ExitStatus::default();
        j.kill = None;
        j.failure = None;
        j.steps.clear();
        match &j.spec.kind {
            JobKind::Batch { .. } => j.step_started(StepId::BATCH, "batch".into(), 1, 1, now),
            JobKind::Interactive { argv, .. } => {
                let (name, nodes) = (super::acct::step_name(argv), j.alloc.len());
                let tasks = j.alloc.iter().map(|(_, a)| a.tasks).sum();
                j.step_started(StepId(0), name, nodes, tasks, now);
            }
        }
        let ntasks: u32 = j.alloc.iter().map(|(_, a)| a.tasks).sum();
        let step_nodes = j.alloc.len() as u32;
        let plan = match &j.spec.kind {
            JobKind::Batch {
                script,
                args,
                stdout,
                stderr,
            } => {
                j.primary_left = j.alloc.iter().take(1).map(|(n, _)| n.clone()).collect();
                StepPlan {
                    job: j,
                    step: StepId::BATCH,
                    work_dir: &j.spec.work_dir,
                    env: &j.spec.env,
                    ntasks,
                    step_nodes,
                    tasks: vec![1],
                    what: LaunchKind::Batch {
                        script: script.clone(),
                        args: args.clone(),
                        stdout: stdout.clone().unwrap_or_else(|| "slurm-%j.out".into()),
                        stderr: stderr.clone(),
                    },
                }
            }
            JobKind::Interactive { argv, io } => {
                j.primary_left = j.alloc.iter().map(|(n, _)| n.clone()).collect();
                j.next_step = 1;
                StepPlan {
                    job: j,
                    step: StepId(0),
                    work_dir: &j.spec.work_dir,
                    env: &j.spec.env,
                    ntasks,
                    step_nodes,
                    tasks: j.alloc.iter().map(|(_, a)| a.tasks).collect(),
                    what: LaunchKind::Step {
                        argv: argv.clone(),
                        io: *io,
                    },
                }
            }
        };
        for (node, l) in plan.launches() {
            self.outbox.push((node, CtldMsg::Launch(l)));
        }
    }

    /// `srun` inside an allocation: a new step on the job's nodes.
    pub fn submit_step(
        &mut self,
        who: Ident,
        s: StepSpec,
        now: u64,
    ) -> Result<(JobId, StepId), Refusal> {
        let privileged = self.privileged(who);
        let j = self
            .jobs
            .get_mut(&s.job)
            .ok_or(CtldError::UnknownJob(s.job))?;
        if j.user.uid != who.uid && !privileged {
            return Err(CtldError::AccessDenied);
        }
        if j.state != JobState::Running {
            return Err(CtldError::NotRunning(s.job));
        }
        let all = j.alloc.len() as u32;
        let nodes = s.nodes.unwrap_or(all);
        if nodes == 0 || nodes > all {
            return Err(CtldError::StepNodes(all));
        }
        let job_tasks: u32 = j.alloc.iter().map(|(_, a)| a.tasks).sum();
        let ntasks = s.ntasks.unwrap_or(if s.nodes.is_some() {
            nodes
        } else {
            job_tasks.max(nodes)
        });
        if ntasks == 0 {
            return Err(CtldError::StepTasks);
        }
        let nodes = nodes.min(ntasks);
        let step = StepId(j.next_step);
        j.next_step += 1;
        j.step_started(
            step,
            super::acct::step_name(&s.argv),
            nodes as usize,
            ntasks,
            now,
        );
        let mut env = j.spec.env.clone();
        // The step's own environment wins over the job's.
        for (k, v) in s.env {
            env.retain(|(key, _)| *key != k);
            env.push((k, v));
        }
        // Tasks spread evenly, the first nodes taking one more.
        let (base, extra) = (ntasks / nodes, ntasks % nodes);
        let plan = StepPlan {
            job: j,
            step,
            work_dir: &s.work_dir,
            env: &env,
            ntasks,
            step_nodes: nodes,
            tasks: (0..nodes).map(|i| base + u32::from(i < extra)).collect(),
            what: LaunchKind::Step {
                argv: s.argv.clone(),
                io: s.io,
            },
        };
        for (node, l) in plan.launches() {
            self.outbox.push((node, CtldMsg::Launch(l)));
        }
        Ok((s.job, step))
    }
}
