//! Test machinery shared by the property tests, the fuzz target and the
//! scenario harness (behind the `testing` feature): one operation
//! vocabulary, one driver that plays the part of a cluster (jobs run for a
//! set time, then the driver reports them finished), and the invariant
//! checks every caller wants after every step.
//!
//! The driver owns no policy: it only calls the public API in the order the
//! crate doc gives, so what it checks holds for any real driver too.

use std::collections::BTreeMap;

use crate::{
    BackfillPolicy, Cancelled, Dependency, GpuRequest, HoldKind, JobId, JobOutcome, JobRequest,
    JobStatus, LostJob, NodeAdmin, NodeAllocation, NodeId, NodeSpec, PartitionSpec, Scheduler,
    SchedulerConfig, Secs, StartDecision, SubmitError,
};

/// A node to add: its name is chosen by the driver (`n<i>`).
#[derive(Clone, Debug)]
pub struct NodeShape {
    pub cpus: u32,
    pub memory_mb: u64,
    pub gpus: u32,
    pub per_group: u32,
    /// Carries the feature `fast`.
    pub fast: bool,
}

impl NodeShape {
    fn spec(&self, name: String) -> NodeSpec {
        let mut spec =
            NodeSpec::new(name, self.cpus, self.memory_mb).with_gpus(self.gpus, self.per_group);
        if self.fast {
            spec.features.push("fast".into());
        }
        spec
    }
}

/// How long a started job runs before the driver reports it finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runtime {
    /// Its whole time limit.
    Limit,
    /// This long, or its limit if shorter.
    Secs(Secs),
    /// This share of its limit, in percent (at least one second).
    PercentOfLimit(u64),
}

/// A job the driver submits: what it asks for and how it will end.
#[derive(Clone, Debug)]
pub struct JobPlan {
    pub req: JobRequest,
    pub runtime: Runtime,
    pub outcome: JobOutcome,
}

impl JobPlan {
    /// Runs its whole limit and completes.
    pub fn new(req: JobRequest) -> Self {
        JobPlan {
            req,
            runtime: Runtime::Limit,
            outcome: JobOutcome::Completed,
        }
    }
}

/// Where and when a job ran.
#[derive(Clone, Debug)]
pub struct Run {
    pub start: Secs,
    pub end: Secs,
    pub nodes: Vec<NodeAllocation>,
}

/// One thing that can happen to a scheduler. Job and node operands are
/// picks (`k % active jobs`, `k % nodes`), so any value is meaningful.
#[derive(Clone, Debug)]
pub enum Op {
    /// Submits a job; `dep` = (kind, pick) makes it depend on an active
    /// job: kind % 5 is after, afterok, afternotok, afterany, singleton.
    Submit {
        job: Box<JobPlan>,
        dep: Option<(u8, u8)>,
    },
    Cancel(u8),
    Hold(u8),
    Release(u8),
    /// A running job goes back to the queue (`scontrol requeue`).
    Requeue(u8),
    /// A pending job's request changes (`scontrol update`): its nice and
    /// its time limit (at least a second).
    Update {
        job: u8,
        nice: i16,
        limit: u16,
    },
    /// A running job's time limit changes; a run longer than the new limit
    /// ends at it, as the controller would time it out.
    Limit {
        job: u8,
        limit: u16,
    },
    /// A running job is suspended (`scontrol suspend`): its run stops
    /// until it is continued, and its limit with it.
    Suspend(u8),
    /// A suspended job runs again (`scontrol resume`).
    Continue(u8),
    Drain(u8),
    Resume(u8),
    Down(u8),
    Remove(u8),
    AddNode(NodeShape),
    /// Moves the clock; jobs whose run is over by then finish.
    Advance(u16),
    /// One scheduling pass.
    Pass,
}

/// A scheduler with a clock and a cluster that runs what it starts.
#[derive(Debug)]
pub struct Driver {
    pub s: Scheduler,
    pub now: Secs,
    next_job: u64,
    next_node: usize,
    /// Every accepted job's plan.
    pub jobs: BTreeMap<JobId, JobPlan>,
    /// Running jobs and when their run is over.
    pub ends: BTreeMap<JobId, Secs>,
    /// Suspended jobs: since when, and how much of their run is left.
    pub suspended: BTreeMap<JobId, (Secs, Secs)>,
    /// Where and when each job last started, and when that run ends.
    pub runs: BTreeMap<JobId, Run>,
    /// Every decision and status, for determinism checks (when `logging`).
    pub log: Vec<String>,
    pub logging: bool,
}

impl Driver {
    /// A driver over `cfg` (with every search cross-checked against a full
    /// scan) and one default partition `partition` over all nodes.
    pub fn new(cfg: SchedulerConfig, partition: PartitionSpec) -> Self {
        let mut s = Scheduler::new(SchedulerConfig {
            verify_search: true,
            ..cfg
        });
        s.add_partition(PartitionSpec {
            is_default: true,
            ..partition
        })
        .expect("the first partition is accepted");
        Driver {
            s,
            now: 0,
            next_job: 1,
            next_node: 0,
            jobs: BTreeMap::new(),
            ends: BTreeMap::new(),
            suspended: BTreeMap::new(),
            runs: BTreeMap::new(),
            log: Vec::new(),
            logging: false,
        }
    }

    /// A driver with one partition `all` over every node and these nodes.
    pub fn with_nodes(cfg: SchedulerConfig, nodes: &[NodeShape]) -> Self {
        let mut d = Driver::new(cfg, PartitionSpec::new("all", "ALL"));
        for n in nodes {
            d.add_node(n);
        }
        d
    }

    /// Adds a node named `n<i>`.
    pub fn add_node(&mut self, n: &NodeShape) -> NodeId {
        self.add_named(n.spec(format!("n{}", self.next_node)))
    }

    /// Adds a node with its own name.
    pub fn add_named(&mut self, spec: NodeSpec) -> NodeId {
        self.next_node += 1;
        self.s
            .handle_node_added(spec)
            .expect("the driver's node names are fresh")
    }

    pub fn submit(&mut self, job: JobPlan) -> Result<JobId, SubmitError> {
        let id = JobId(self.next_job);
        // An array's tasks take the ids after its own.
        let tasks = job.req.array.as_ref().map_or(0, |a| u64::from(a.tasks));
        self.next_job += 1 + tasks;
        let res = self.s.submit(self.now, id, job.req.clone());
        if self.logging {
            let said = res.as_ref().map_err(ToString::to_string);
            self.log.push(format!("submit {id} {said:?}"));
        }
        res?;
        self.jobs.insert(id, job);
        Ok(id)
    }

    pub fn pick_job(&self, k: u8) -> Option<JobId> {
        let ids: Vec<JobId> = self.s.active_jobs().collect();
        (!ids.is_empty()).then(|| ids[k as usize % ids.len()])
    }

    pub fn pick_node(&self, k: u8) -> Option<NodeId> {
        let ids: Vec<NodeId> = self.s.node_ids().collect();
        (!ids.is_empty()).then(|| ids[k as usize % ids.len()])
    }

    /// Carries out one operation, then audits the bookkeeping.
    pub fn apply(&mut self, op: &Op) -> Result<(), String> {
        match op {
            Op::Submit { job, dep } => {
                let mut job = JobPlan::clone(job);
                if let Some((kind, k)) = *dep {
                    if let Some(t) = self.pick_job(k) {
                        job.req.dependencies.push(match kind % 5 {
                            0 => Dependency::After(t),
                            1 => Dependency::AfterOk(t),
                            2 => Dependency::AfterNotOk(t),
                            3 => Dependency::AfterAny(t),
                            _ => Dependency::Singleton,
                        });
                    }
                }
                let _ = self.submit(job);
            }
            Op::Cancel(k) => {
                if let Some(j) = self.pick_job(*k) {
                    if let Ok(Cancelled::Running(_)) = self.s.cancel(j) {
                        self.ends.remove(&j);
                        self.suspended.remove(&j);
                        self.s
                            .handle_job_finished(self.now, j, JobOutcome::Cancelled)
                            .map_err(|e| e.to_string())?;
                    }
                }
            }
            Op::Hold(k) => {
                if let Some(j) = self.pick_job(*k) {
                    let _ = self.s.hold(j, HoldKind::User);
                }
            }
            Op::Release(k) => {
                if let Some(j) = self.pick_job(*k) {
                    let _ = self.s.release(j, HoldKind::User);
                }
            }
            Op::Requeue(k) => {
                if let Some(j) = self.pick_job(*k) {
                    if self.s.requeue(self.now, j, None).is_ok() {
                        self.ends.remove(&j);
                        self.suspended.remove(&j);
                    }
                }
            }
            Op::Update { job, nice, limit } => {
                if let Some(j) = self.pick_job(*job) {
                    if let Some(plan) = self.jobs.get(&j) {
                        let mut req = plan.req.clone();
                        req.nice = i32::from(*nice);
                        req.time_limit = Some(Secs::from((*limit).max(1)));
                        if self.s.update(j, req.clone()).is_ok() {
                            if let Some(p) = self.jobs.get_mut(&j) {
                                p.req = req;
                            }
                        }
                    }
                }
            }
            Op::Limit { job, limit } => {
                if let Some(j) = self.pick_job(*job) {
                    let limit = Secs::from((*limit).max(1));
                    if let Ok(end) = self.s.set_running_limit(j, Some(limit)) {
                        if let Some((since, left)) = self.suspended.get_mut(&j) {
                            // Its end once resumed, less the suspension now.
                            *left = (*left).min(end.saturating_sub(*since));
                        }
                        if let Some(e) = self.ends.get_mut(&j) {
                            *e = (*e).min(end.max(self.now));
                        }
                        if let Some(r) = self.runs.get_mut(&j) {
                            r.end = r.end.min(end.max(self.now));
                        }
                        if let Some(p) = self.jobs.get_mut(&j) {
                            p.req.time_limit = Some(limit);
                        }
                    }
                }
            }
            Op::Suspend(k) => {
                if let Some(j) = self.pick_job(*k) {
                    if self.s.suspend(self.now, j).is_ok() {
                        if let Some(end) = self.ends.remove(&j) {
                            self.suspended
                                .insert(j, (self.now, end.saturating_sub(self.now)));
                        }
                    }
                }
            }
            Op::Continue(k) => {
                if let Some(j) = self.pick_job(*k) {
                    if let Ok(end_by) = self.s.resume(self.now, j) {
                        let (_, left) = self
                            .suspended
                            .remove(&j)
                            .ok_or_else(|| format!("job {j} resumed but was never suspended"))?;
                        let end = self.now + left;
                        // A job overdue when it was suspended (its limit
                        // cut below its run time) is overdue at once
                        // when resumed: it ends now, past its `end_by`.
                        if end > end_by.max(self.now) {
                            return Err(format!(
                                "job {j} resumed to end by {end_by}, runs to {end}"
                            ));
                        }
                        self.ends.insert(j, end);
                        if let Some(r) = self.runs.get_mut(&j) {
                            r.end = end;
                        }
                    }
                }
            }
            Op::Drain(k) | Op::Resume(k) | Op::Down(k) | Op::Remove(k) => {
                if let Some(n) = self.pick_node(*k) {
                    let now = self.now;
                    let lost = match op {
                        Op::Drain(_) => {
                            let reason = "test".into();
                            self.s
                                .handle_node_admin(now, n, NodeAdmin::Drain { reason })
                        }
                        Op::Resume(_) => self.s.handle_node_admin(now, n, NodeAdmin::Up),
                        Op::Down(_) => {
                            let reason = "test".into();
                            self.s.handle_node_admin(now, n, NodeAdmin::Down { reason })
                        }
                        _ => self.s.handle_node_removed(now, n),
                    }
                    .map_err(|e| e.to_string())?;
                    for l in lost {
                        let (LostJob::Failed(j) | LostJob::Requeued(j)) = l;
                        self.ends.remove(&j);
                        self.suspended.remove(&j);
                    }
                }
            }
            Op::AddNode(n) => {
                self.add_node(n);
            }
            Op::Advance(d) => {
                self.now += Secs::from(*d);
                self.finish_due()?;
            }
            Op::Pass => {
                self.pass()?;
            }
        }
        self.s.audit()
    }

    /// Reports every job whose run is over by now as finished.
    pub fn finish_due(&mut self) -> Result<(), String> {
        let now = self.now;
        let due: Vec<JobId> = self
            .ends
            .iter()
            .filter(|(_, &end)| end <= now)
            .map(|(&j, _)| j)
            .collect();
        for j in due {
            self.ends.remove(&j);
            let outcome = self
                .jobs
                .get(&j)
                .map_or(JobOutcome::Completed, |p| p.outcome);
            self.s
                .handle_job_finished(now, j, outcome)
                .map_err(|e| format!("finishing job {j}: {e}"))?;
        }
        Ok(())
    }

    /// One pass at the current time. Every start is checked against what
    /// the job asked for, and the whole plan for consistency.
    pub fn pass(&mut self) -> Result<Vec<StartDecision>, String> {
        let starts = self.s.schedule(self.now);
        self.s.audit()?;
        for d in &starts {
            // A task split off an array runs the array's plan.
            if let (Some(a), false) = (d.array, self.jobs.contains_key(&d.job)) {
                let mut plan = self
                    .jobs
                    .get(&a)
                    .ok_or_else(|| format!("task {} of an unknown array {a}", d.job))?
                    .clone();
                plan.req.array = None;
                plan.req.array_of = Some(a);
                self.jobs.insert(d.job, plan);
            }
            let plan = self
                .jobs
                .get(&d.job)
                .ok_or_else(|| format!("job {} started but was never submitted", d.job))?;
            check_start(&self.s, &plan.req, d)?;
            let limit = d.end_by - self.now;
            let runtime = match plan.runtime {
                Runtime::Limit => limit,
                Runtime::Secs(t) => t.min(limit),
                Runtime::PercentOfLimit(p) => (limit.saturating_mul(p) / 100).max(1),
            };
            self.ends.insert(d.job, self.now + runtime);
            self.runs.insert(
                d.job,
                Run {
                    start: self.now,
                    end: self.now + runtime,
                    nodes: d.nodes.clone(),
                },
            );
            if self.logging {
                self.log.push(format!("{} start {d:?}", self.now));
            }
        }
        if self.logging {
            for j in self.s.active_jobs().collect::<Vec<_>>() {
                self.log.push(format!("{j} {:?}", self.s.job_status(j)));
            }
        }
        check_plan(&self.s, self.now)?;
        Ok(starts)
    }

    /// The end of the next run to finish.
    pub fn next_end(&self) -> Option<Secs> {
        self.ends.values().copied().min()
    }

    /// Moves the clock to `t`, ending runs and passing at each end on the
    /// way; returns every start decision made.
    pub fn advance_to(&mut self, t: Secs) -> Result<Vec<(Secs, StartDecision)>, String> {
        let mut started = Vec::new();
        while let Some(end) = self.next_end().filter(|&e| e <= t) {
            self.now = end;
            self.finish_due()?;
            started.extend(self.pass()?.into_iter().map(|d| (end, d)));
        }
        self.now = self.now.max(t);
        Ok(started)
    }

    /// Passes and run ends until nothing more can happen.
    pub fn run_until_idle(&mut self) -> Result<Vec<(Secs, StartDecision)>, String> {
        let mut started: Vec<(Secs, StartDecision)> =
            self.pass()?.into_iter().map(|d| (self.now, d)).collect();
        let mut steps = 0u32;
        while let Some(end) = self.next_end() {
            self.now = end;
            self.finish_due()?;
            started.extend(self.pass()?.into_iter().map(|d| (end, d)));
            steps += 1;
            if steps >= 100_000 {
                return Err("the simulation does not settle".into());
            }
        }
        Ok(started)
    }
}

/// A policy from a small number, for generated inputs.
pub fn policy(k: u8) -> BackfillPolicy {
    match k % 3 {
        0 => BackfillPolicy::Conservative,
        1 => BackfillPolicy::Easy,
        _ => BackfillPolicy::Fcfs,
    }
}

/// A start decision gives the job exactly what it asked for.
pub fn check_start(s: &Scheduler, req: &JobRequest, d: &StartDecision) -> Result<(), String> {
    let fail = |what: String| Err(format!("job {}: {what}", d.job));
    let tasks: u32 = d.nodes.iter().map(|a| a.tasks).sum();
    let want_tasks = match (req.nodes, req.ntasks, req.ntasks_per_node) {
        (_, _, Some(_)) => tasks, // rounded up to whole nodes
        (_, Some(t), None) => t,
        (Some(n), None, None) => n,
        // --gpus=T alone: one task on each node the GPUs are spread over.
        (None, None, None) if matches!(req.gpus, GpuRequest::Total(_)) => d.nodes.len() as u32,
        (None, None, None) => 1,
    };
    if tasks != want_tasks.max(1) {
        return fail(format!("{tasks} tasks, asked for {want_tasks}"));
    }
    if let Some(n) = req.nodes {
        if d.nodes.len() as u32 != n {
            return fail(format!("{} nodes, asked for {n}", d.nodes.len()));
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for a in &d.nodes {
        if !seen.insert(a.node) {
            return fail(format!("node {} twice", a.node));
        }
        let info = s
            .node_info(a.node)
            .ok_or_else(|| format!("job {} on unknown node {}", d.job, a.node))?;
        if a.tasks == 0 {
            return fail(format!("no task on {}", info.name));
        }
        if req.ntasks_per_node.is_some_and(|tpn| a.tasks != tpn) {
            return fail(format!("{} tasks on {}", a.tasks, info.name));
        }
        if !crate::model::features_met(&info.features, &req.features, req.features_any) {
            return fail(format!("{} lacks a required feature", info.name));
        }
        let (cpus, gpus) = if req.exclusive {
            (info.cpus, info.gpus)
        } else {
            let gpus = match req.gpus {
                GpuRequest::None => 0,
                GpuRequest::PerNode(n) => n,
                GpuRequest::PerTask(n) => n * a.tasks,
                GpuRequest::Total(_) => a.gpus.len() as u32,
            };
            (a.tasks * req.cpus_per_task, gpus)
        };
        if a.cpus.len() as u32 != cpus || a.gpus.len() as u32 != gpus {
            return fail(format!(
                "{} CPUs and {} GPUs on {}, owed {cpus} and {gpus}",
                a.cpus.len(),
                a.gpus.len(),
                info.name
            ));
        }
    }
    if let (GpuRequest::Total(n), false) = (req.gpus, req.exclusive) {
        let got: u32 = d.nodes.iter().map(|a| a.gpus.len() as u32).sum();
        if got != n {
            return fail(format!("{got} GPUs in all, asked for {n}"));
        }
    }
    Ok(())
}

/// The pass's plan is a schedule that can be kept: running jobs and every
/// reservation together never put a node over its CPUs or memory or give a
/// GPU to two jobs at once. So no job started by backfill takes anything a
/// reservation was promised.
pub fn check_plan(s: &Scheduler, now: Secs) -> Result<(), String> {
    struct Use {
        start: Secs,
        end: Secs,
        cpus: u32,
        mem: u64,
        gpus: Vec<u32>,
    }
    let mut uses: BTreeMap<NodeId, Vec<Use>> = BTreeMap::new();
    for j in s.active_jobs() {
        match s.job_status(j) {
            Some(JobStatus::Running { end_by, nodes, .. }) => {
                for a in nodes {
                    uses.entry(a.node).or_default().push(Use {
                        start: now,
                        end: end_by.max(now + 1),
                        cpus: a.cpus.len() as u32,
                        mem: a.memory_mb,
                        gpus: a.gpus,
                    });
                }
            }
            Some(JobStatus::Pending {
                expected_start: Some(t),
                ..
            }) => {
                let r = s
                    .reservation(j)
                    .ok_or_else(|| format!("job {j} has an expected start but no reservation"))?;
                if r.start != t || r.start <= now {
                    return Err(format!("job {j} reserved at {} (now {now})", r.start));
                }
                for a in &r.nodes {
                    uses.entry(a.node).or_default().push(Use {
                        start: r.start,
                        end: r.end,
                        cpus: a.cpus,
                        mem: a.memory_mb,
                        gpus: a.gpus.clone(),
                    });
                }
            }
            _ => {}
        }
    }
    for (node, list) in uses {
        let info = s
            .node_info(node)
            .ok_or_else(|| format!("planned node {node} is unknown"))?;
        let mut times: Vec<Secs> = list.iter().map(|u| u.start).collect();
        times.sort_unstable();
        times.dedup();
        for t in times {
            let live: Vec<&Use> = list.iter().filter(|u| u.start <= t && t < u.end).collect();
            let cpus: u32 = live.iter().map(|u| u.cpus).sum();
            let mem: u64 = live.iter().map(|u| u.mem).sum();
            if cpus > info.cpus || mem > info.memory_mb {
                return Err(format!(
                    "node {} has {cpus} CPUs and {mem} MB planned at {t}",
                    info.name
                ));
            }
            let mut gpus: Vec<u32> = live.iter().flat_map(|u| u.gpus.iter().copied()).collect();
            let n = gpus.len();
            gpus.sort_unstable();
            gpus.dedup();
            if gpus.len() != n || gpus.iter().any(|&g| g >= info.gpus) {
                return Err(format!("a GPU of {} planned twice at {t}", info.name));
            }
        }
    }
    Ok(())
}
