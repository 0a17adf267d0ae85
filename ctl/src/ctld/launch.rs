//! The `Launch` messages that start a batch job, an srun job's first
//! step, or a later step inside an allocation, and the same launches
//! again for a node that registers without having received them (lost
//! with a connection, or in a controller's send buffers when it died).

use super::wire::wire_id;
use super::{natural, Controller, CtldError, JobRecord, Refusal, StoredAlloc};

use corral_proto::msg::{
    CtldMsg, ExitStatus, GpuAsk, Ident, JobId, JobKind, JobState, Launch, LaunchKind, LaunchShape,
    Launched, StepId, StepIo, StepSpec,
};
use scheduler_core::StartDecision;

/// One step's launches, one per node that runs a part of it. The batch
/// script, an srun job's first step and a later step inside an allocation
/// all build their `Launch` messages here.
struct StepPlan<'a> {
    job: &'a JobRecord,
    step: StepId,
    work_dir: std::borrow::Cow<'a, str>,
    env: std::borrow::Cow<'a, [(String, String)]>,
    /// `SLURM_NTASKS` and `SLURM_NNODES` as the step's tasks see them.
    ntasks: u32,
    step_nodes: u32,
    /// The job's nodes (indices into its allocation, ascending) that run
    /// a part, and the tasks on each.
    on: Vec<usize>,
    tasks: Vec<u32>,
    what: LaunchKind,
    /// The step's own GPUs per node, when it asked for some.
    gpus: &'a [(String, Vec<u32>)],
}

impl StepPlan<'_> {
    /// The launches for the step's nodes (`only`: for that one alone).
    fn launches(self, only: Option<&str>) -> Vec<(String, Launch)> {
        let j = self.job;
        let spec = j.spec();
        let array = j.array_env();
        let cpus_per_task = j.cpus_per_task();
        let job_nodes: Vec<String> = j.alloc.iter().map(|(n, _)| n.clone()).collect();
        let gpus_per_task = match spec.gpus {
            GpuAsk::PerTask(g) => Some(g),
            _ => None,
        };
        let time_limit = j
            .end_by
            .get()
            .zip(j.start.get())
            .map(|(e, s)| e.saturating_sub(s));
        let mut first_task = 0;
        let mut out = Vec::with_capacity(self.tasks.len());
        // Named in the launch only when they are not the job's first.
        let prefix = self.on.iter().enumerate().all(|(i, &k)| i == k);
        let step_nodes: Vec<String> = match prefix {
            true => Vec::new(),
            false => self.on.iter().map(|&k| j.alloc[k].0.clone()).collect(),
        };
        let parts = self.on.iter().filter_map(|&k| j.alloc.get(k));
        for (i, ((node, a), &here)) in parts.zip(&self.tasks).enumerate() {
            if only.is_some_and(|o| o != node) {
                first_task += here;
                continue;
            }
            let launch = Launch {
                array,
                job: j.id,
                run: j.restarts,
                step: self.step,
                name: spec.name.clone(),
                user: j.user,
                partition: j.partition.to_string(),
                work_dir: self.work_dir.to_string(),
                env: self.env.to_vec(),
                job_nodes: job_nodes.clone(),
                node_index: i as u32,
                step_nodes: self.step_nodes,
                ntasks: self.ntasks,
                first_task,
                tasks_here: here,
                cpus_per_task,
                cpus: a.cpus.clone(),
                gpus: a.gpus.clone(),
                gpus_per_task,
                memory_mb: a.memory_mb,
                time_limit,
                exclusive: spec.exclusive,
                what: self.what.clone(),
                step_gpus: self
                    .gpus
                    .iter()
                    .find(|(n, _)| n == node)
                    .map(|(_, g)| g.clone()),
                shape: LaunchShape {
                    job_tasks: j.alloc.iter().map(|(_, a)| a.tasks).collect(),
                    job_cpus: j.alloc.iter().map(|(_, a)| a.cpus.len() as u32).collect(),
                    step_tasks: self.tasks.clone(),
                    ntasks_per_node: spec.ntasks_per_node,
                    cpus_per_task_given: spec.cpus_per_task.is_some(),
                    submit_dir: spec.submit_dir.clone(),
                    submit_host: spec.submit_host.clone(),
                    qos: spec.qos.clone(),
                    account: spec.account.clone(),
                    step_nodes: step_nodes.clone(),
                },
            };
            first_task += here;
            out.push((node.clone(), launch));
        }
        out
    }
}

/// `ntasks` over nodes holding `caps` tasks each, as Slurm's block
/// distribution places them (see [`JobRecord::step_layout`]); one entry
/// a node, each at least one when there are as many tasks as nodes.
fn block_layout(ntasks: u32, caps: &[u32]) -> Vec<u32> {
    let mut tasks = vec![0u32; caps.len()];
    if caps.is_empty() {
        return tasks;
    }
    let mut left = ntasks;
    for t in tasks.iter_mut() {
        if left == 0 {
            break;
        }
        *t = 1;
        left -= 1;
    }
    for (t, &cap) in tasks.iter_mut().zip(caps) {
        let more = cap.saturating_sub(*t).min(left);
        *t += more;
        left -= more;
    }
    let n = caps.len() as u32;
    let (base, extra) = (left / n, left % n);
    for (i, t) in tasks.iter_mut().enumerate() {
        *t += base + u32::from((i as u32) < extra);
    }
    tasks
}

/// A later step (srun inside an allocation) of the current run that
/// has not ended on all its nodes: what builds its launches again.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct OpenStep {
    pub step: StepId,
    /// Nodes whose part has not ended.
    pub left: Vec<String>,
    nodes: u32,
    ntasks: u32,
    work_dir: String,
    /// The step's own environment (the job's is under it).
    env: Vec<(String, String)>,
    argv: Vec<String>,
    io: StepIo,
    /// The step's own GPUs on each node, when it asked for some (held
    /// from other steps until its part there ends, unless it overlaps).
    gpus: Vec<(String, Vec<u32>)>,
    /// The job's nodes that run it (indices into the allocation).
    on: Vec<usize>,
    /// `--overlap`: its CPUs and GPUs are not held from other steps.
    overlap: bool,
    /// The CPUs it holds on each of its nodes (a count: tasks are held to
    /// the job's CPUs by its cgroup, not bound one by one).
    cpus: Vec<(String, u32)>,
    /// `-o/-e/-i`.
    files: corral_proto::msg::TaskFiles,
}

/// The most open steps a run keeps for sending again, and the most bytes
/// of their environments, commands and directories together (a step's
/// spec comes from its user, up to a frame's size, and the job's record
/// is stored again on each change). A step beyond either still runs,
/// without that cover.
const MAX_OPEN_STEPS: usize = 1024;
const MAX_OPEN_STEP_BYTES: usize = 1 << 20;

impl OpenStep {
    /// The bytes of its user's text it keeps.
    fn bytes(&self) -> usize {
        let env: usize = self.env.iter().map(|(k, v)| k.len() + v.len()).sum();
        let argv: usize = self.argv.iter().map(String::len).sum();
        env + argv + self.work_dir.len() + self.files.len()
    }
}

impl JobRecord {
    /// The job's first step: its batch script, or srun's command (an
    /// allocation has none).
    fn primary_plan(&self) -> Option<StepPlan<'_>> {
        let ntasks: u32 = self.alloc.iter().map(|(_, a)| a.tasks).sum();
        let step_nodes = self.alloc.len() as u32;
        let spec = self.spec();
        let (step, tasks, what) = match &spec.kind {
            JobKind::Batch {
                script,
                args,
                stdout,
                stderr,
            } => (
                StepId::BATCH,
                vec![1],
                LaunchKind::Batch {
                    script: script.clone(),
                    args: args.clone(),
                    stdout: stdout
                        .clone()
                        .unwrap_or_else(|| JobRecord::default_output(spec.array.is_some()).into()),
                    stderr: stderr.clone(),
                    append: spec.open_append,
                },
            ),
            JobKind::Interactive { argv, io, files } => (
                StepId(0),
                self.alloc.iter().map(|(_, a)| a.tasks).collect(),
                LaunchKind::Step {
                    argv: argv.clone(),
                    io: *io,
                    files: files.clone(),
                },
            ),
            JobKind::Allocation => return None,
        };
        Some(StepPlan {
            job: self,
            step,
            work_dir: std::borrow::Cow::Owned(spec.work_dir),
            env: std::borrow::Cow::Owned(spec.env),
            ntasks,
            step_nodes,
            on: (0..tasks.len()).collect(),
            tasks,
            what,
            gpus: &[],
        })
    }

    /// The CPUs a new step holds on each of its nodes (`on`, tasks spread
    /// as [`JobRecord::step_plan`] spreads them), as Slurm's steps do: all
    /// of the job's CPUs there, or with `--exact` its tasks' own; none
    /// with `--overlap`. What other steps hold is not free (an
    /// interactive job's first step holds all it runs on; a batch script
    /// holds nothing); too few free is `StepCpus`, which srun waits out.
    fn step_cpus(
        &self,
        s: &StepSpec,
        on: &[usize],
        nodes: u32,
        ntasks: u32,
    ) -> Result<Vec<(String, u32)>, CtldError> {
        if s.overlap {
            return Ok(Vec::new());
        }
        // A step's own `-c`, else one: Slurm 22.05's srun no longer takes
        // the job's `SLURM_CPUS_PER_TASK`.
        let per_task = s.cpus_per_task.unwrap_or(1).max(1);
        let layout = self.step_layout(on, ntasks);
        debug_assert_eq!(layout.len(), nodes as usize);
        let first_holds_all = self.spec.kind() == super::packed::Kind::Interactive;
        let mut out = Vec::with_capacity(on.len());
        for (&k, &tasks) in on.iter().zip(&layout) {
            let (node, a) = &self.alloc[k];
            let here = a.cpus.len() as u32;
            let want = if s.exact {
                tasks.saturating_mul(per_task)
            } else {
                here
            };
            if want > here {
                return Err(CtldError::StepCpusOverJob {
                    node: node.clone(),
                    want,
                    job: here,
                });
            }
            let held: u32 = if first_holds_all && self.primary_left.contains(node) {
                here
            } else {
                self.open_steps
                    .iter()
                    .filter(|o| !o.overlap && o.left.iter().any(|n| n == node))
                    .flat_map(|o| o.cpus.iter().filter(|(n, _)| n == node))
                    .map(|(_, c)| *c)
                    .sum()
            };
            let free = here.saturating_sub(held);
            if want > free {
                return Err(CtldError::StepCpus {
                    node: node.clone(),
                    want,
                    free,
                    job: here,
                });
            }
            out.push((node.clone(), want));
        }
        Ok(out)
    }

    /// How many of a step's `ntasks` each of its nodes (`on`) runs, by
    /// Slurm's block distribution over the job's own layout: one task on
    /// each node, then each node in turn filled up to the tasks the job
    /// has there, then (a step asking more tasks than the job has) one
    /// more on each node in turn. So a step of the whole job runs as the
    /// job's tasks lie (3 + 1 stays 3 + 1), and one of fewer tasks packs
    /// the first nodes (checked on Slurm 22.05: 3 tasks over a 4 + 2 job
    /// run 2 + 1, 5 over a 2 + 2 job 3 + 2).
    fn step_layout(&self, on: &[usize], ntasks: u32) -> Vec<u32> {
        let caps: Vec<u32> = on
            .iter()
            .map(|&k| self.alloc.get(k).map_or(1, |(_, a)| a.tasks.max(1)))
            .collect();
        block_layout(ntasks, &caps)
    }

    /// A later step's launches.
    fn step_plan<'a>(&'a self, s: &'a OpenStep) -> StepPlan<'a> {
        let mut env = self.spec().env;
        // The step's own environment wins over the job's.
        for (k, v) in &s.env {
            env.retain(|(key, _)| key != k);
            env.push((k.clone(), v.clone()));
        }
        StepPlan {
            job: self,
            step: s.step,
            work_dir: std::borrow::Cow::Borrowed(&s.work_dir),
            env: std::borrow::Cow::Owned(env),
            ntasks: s.ntasks,
            step_nodes: s.nodes,
            on: s.on.clone(),
            tasks: self.step_layout(&s.on, s.ntasks),
            what: LaunchKind::Step {
                argv: s.argv.clone(),
                io: s.io,
                files: s.files.clone(),
            },
            gpus: &s.gpus,
        }
    }

    /// `node`'s part of a later step ended: once all have, it is no longer
    /// open.
    pub(super) fn open_step_ended(&mut self, step: StepId, node: &str) {
        if let Some(i) = self.open_steps.iter().position(|s| s.step == step) {
            let s = &mut self.open_steps[i];
            s.left.retain(|n| n != node);
            if s.left.is_empty() {
                self.open_steps.swap_remove(i);
            }
        }
    }

    /// The launches `node` should have had and, by its word, did not:
    /// only for a running job, and only from the agent the run started
    /// on (another one restarted, and the run died with it).
    fn launches_missed(&self, node: &str, instance: u64, sent: Option<&Launched>) -> Vec<Launch> {
        if self.state != JobState::Running
            || !self
                .alloc
                .iter()
                .any(|(n, a)| n == node && a.agent == instance)
        {
            return Vec::new();
        }
        let has = |step| sent.is_some_and(|l| l.run == self.run() && l.has(step));
        let mut out = Vec::new();
        if self.primary_left.contains(node) && !has(self.primary_step()) {
            if let Some(plan) = self.primary_plan() {
                out.extend(plan.launches(Some(node)));
            }
        }
        for s in &self.open_steps {
            if s.left.iter().any(|n| n == node) && !has(s.step) {
                out.extend(self.step_plan(s).launches(Some(node)));
            }
        }
        out.into_iter().map(|(_, l)| l).collect()
    }
}

impl Controller {
    pub(super) fn start(&mut self, now: u64, d: StartDecision) {
        let mut alloc: Vec<(String, StoredAlloc)> = d
            .nodes
            .into_iter()
            .map(|a| {
                let name = self.node_name(a.node);
                let agent = self.nodes.get(&name).map_or(0, |n| n.reg.instance);
                (name, StoredAlloc::of(a, agent))
            })
            .collect();
        // Slurm orders a job's nodes by name: task 0 and the batch script
        // go to the first.
        alloc.sort_by(|a, b| natural(&a.0, &b.0));
        let id = wire_id(d.job);
        if let Some(a) = d.array {
            self.split_task(wire_id(a), id);
        }
        self.jobs
            .mark_started(id, alloc.iter().map(|(n, _)| n.as_str()));
        let Some(j) = self.jobs.get_mut(&id) else {
            return;
        };
        j.state = JobState::Running;
        j.start = super::Stamp::at(now);
        j.end_by = (d.end_by < scheduler_core::INFINITE)
            .then_some(d.end_by)
            .into();
        j.alloc = alloc;
        j.exit = ExitStatus::default();
        j.kill = None;
        j.failure = None;
        j.steps.clear();
        j.open_steps.clear();
        match j.spec().kind {
            JobKind::Batch { .. } => {
                j.step_started(StepId::BATCH, "batch".into(), 1, 1, now);
                j.primary_left = j.alloc.iter().take(1).map(|(n, _)| n.clone()).collect();
            }
            JobKind::Interactive { argv, .. } => {
                let (name, nodes) = (super::acct::step_name(&argv), j.alloc.len());
                let tasks = j.alloc.iter().map(|(_, a)| a.tasks).sum();
                j.step_started(StepId(0), name, nodes, tasks, now);
                j.primary_left = j.alloc.iter().map(|(n, _)| n.clone()).collect();
                j.next_step = 1;
            }
            // salloc's: steps come from srun inside it, numbered from 0.
            JobKind::Allocation => j.next_step = 0,
        }
        if let Some(plan) = j.primary_plan() {
            for (node, l) in plan.launches(None) {
                self.outbox.push((node, CtldMsg::Launch(l)));
            }
        }
    }

    /// A node registered saying which launches it was sent: the ones of
    /// running jobs it should have had and did not are sent again.
    pub(super) fn send_missed_launches(&mut self, node: &str, instance: u64, sent: &[Launched]) {
        let sent: std::collections::HashMap<JobId, &Launched> =
            sent.iter().map(|l| (l.run.job, l)).collect();
        for id in self.jobs.live_on_in(node, JobState::Running) {
            let Some(j) = self.jobs.get(&id) else {
                continue;
            };
            for l in j.launches_missed(node, instance, sent.get(&j.id).copied()) {
                tracing::info!(job = %j.id, step = %l.step, node, "launch sent again");
                self.outbox.push((node.to_string(), CtldMsg::Launch(l)));
            }
            // A suspend or resume lost with the connection: where it
            // stands now (either is harmless twice).
            if j.suspension.is_some() && j.alloc.iter().any(|(n, _)| n == node) {
                let stop = j.suspended();
                let job = j.run();
                self.outbox
                    .push((node.to_string(), CtldMsg::Suspend { job, stop }));
            }
        }
    }

    /// `srun` inside an allocation: a new step on the job's nodes.
    pub fn submit_step(
        &mut self,
        who: Ident,
        s: StepSpec,
        now: u64,
    ) -> Result<(JobId, StepId), Refusal> {
        super::admission::task_files(&s.files, self.cfg.limits.max_path_len)?;
        if let Some(name) = &s.name {
            super::admission::text("step name", name, self.cfg.limits.max_text_len)?;
        }
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
        if j.suspended() {
            return Err(CtldError::StepWhileSuspended(s.job));
        }
        // The same srun asking again (its answer was lost with a
        // controller that died after storing the step): the same step.
        // Each srun draws its own secret.
        if let Some(o) = j.open_steps.iter().find(|o| o.io.secret == s.io.secret) {
            return Ok((s.job, o.step));
        }
        let most = self.cfg.limits.max_step_count;
        if j.next_step >= most {
            return Err(CtldError::StepLimit(most));
        }
        // The job's nodes the step may use: those it names (`-w`) first,
        // then others in order, none it excludes (`-x`).
        let index = |n: &String| j.alloc.iter().position(|(name, _)| name == n);
        let mut named = Vec::new();
        for n in &s.nodelist {
            let k = index(n).ok_or_else(|| CtldError::StepNodeNotInJob(n.clone()))?;
            if !named.contains(&k) {
                named.push(k);
            }
        }
        let excluded: Vec<usize> = s.exclude.iter().filter_map(index).collect();
        if named.iter().any(|k| excluded.contains(k)) {
            return Err(CtldError::StepNodes(j.alloc.len() as u32));
        }
        let usable = (0..j.alloc.len()).filter(|k| !excluded.contains(k) && !named.contains(k));
        let candidates: Vec<usize> = named.iter().copied().chain(usable).collect();
        let all = candidates.len() as u32;
        let nodes = s.nodes.unwrap_or(if named.is_empty() {
            all
        } else {
            named.len() as u32
        });
        if nodes == 0 || nodes > all || (nodes as usize) < named.len() {
            return Err(CtldError::StepNodes(all));
        }
        let job_tasks: u32 = candidates.iter().map(|&k| j.alloc[k].1.tasks).sum();
        let ntasks = s.ntasks.unwrap_or(if s.nodes.is_some() {
            nodes
        } else {
            job_tasks.max(nodes)
        });
        if ntasks == 0 {
            return Err(CtldError::StepTasks);
        }
        let nodes = nodes.min(ntasks).max(named.len() as u32);
        let mut on: Vec<usize> = candidates[..nodes as usize].to_vec();
        on.sort_unstable();
        let cpus = j.step_cpus(&s, &on, nodes, ntasks)?;
        // A step's own GPUs: on each of its nodes, ones of the job's that
        // no open step holds there (an overlapping step takes any, free
        // ones first, and holds them from none).
        let mut gpus = Vec::new();
        if let Some(want) = s.gpus_per_node.filter(|&g| g > 0) {
            for (node, a) in on.iter().map(|&k| &j.alloc[k]) {
                let busy: Vec<u32> = j
                    .open_steps
                    .iter()
                    .filter(|o| !o.overlap && o.left.iter().any(|n| n == node))
                    .flat_map(|o| o.gpus.iter().filter(|(n, _)| n == node))
                    .flat_map(|(_, g)| g.iter().copied())
                    .collect();
                let mut free: Vec<u32> = a
                    .gpus
                    .iter()
                    .copied()
                    .filter(|g| !busy.contains(g))
                    .collect();
                if s.overlap {
                    free.extend(a.gpus.iter().filter(|g| busy.contains(g)));
                }
                if (free.len() as u32) < want {
                    return Err(CtldError::StepGpus {
                        node: node.clone(),
                        want,
                        free: free.len() as u32,
                        job: a.gpus.len() as u32,
                    });
                }
                gpus.push((node.clone(), free[..want as usize].to_vec()));
            }
        }
        let step = StepId(j.next_step);
        j.next_step += 1;
        j.step_started(
            step,
            s.name
                .clone()
                .unwrap_or_else(|| super::acct::step_name(&s.argv)),
            nodes as usize,
            ntasks,
            now,
        );
        let open = OpenStep {
            step,
            left: on.iter().map(|&k| j.alloc[k].0.clone()).collect(),
            nodes,
            ntasks,
            work_dir: s.work_dir,
            env: s.env,
            argv: s.argv,
            io: s.io,
            gpus,
            on,
            overlap: s.overlap,
            cpus,
            files: s.files,
        };
        let launches = j.step_plan(&open).launches(None);
        let kept: usize = j.open_steps.iter().map(OpenStep::bytes).sum();
        if j.open_steps.len() < MAX_OPEN_STEPS && kept + open.bytes() <= MAX_OPEN_STEP_BYTES {
            j.open_steps.push(open);
        }
        for (node, l) in launches {
            self.outbox.push((node, CtldMsg::Launch(l)));
        }
        Ok((s.job, step))
    }
}

#[cfg(test)]
mod tests {
    use super::block_layout;

    #[test]
    fn steps_lie_as_slurms_block_distribution() {
        // The layouts a Slurm 22.05 gave steps (4-CPU nodes): a step of
        // the whole job follows the job's tasks, fewer tasks pack the
        // first nodes, more go round once each node is full.
        assert_eq!(block_layout(4, &[3, 1]), [3, 1]);
        assert_eq!(block_layout(5, &[4, 1]), [4, 1]);
        assert_eq!(block_layout(6, &[4, 2]), [4, 2]);
        assert_eq!(block_layout(3, &[4, 2]), [2, 1]);
        assert_eq!(block_layout(4, &[2, 2]), [2, 2]);
        assert_eq!(block_layout(5, &[2, 2]), [3, 2]);
        assert_eq!(block_layout(1, &[2, 2]), [1, 0]);
        assert_eq!(block_layout(9, &[1, 1, 1]), [3, 3, 3]);
        assert!(block_layout(3, &[]).is_empty());
    }
}
