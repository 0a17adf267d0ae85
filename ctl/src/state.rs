//! The controller's state and every change to it.
//!
//! [`Controller`] owns the scheduler, the job table and the node registry.
//! Each input (a request, an agent's message, a clock tick) is one method
//! call that changes state and queues the messages agents must receive in
//! an outbox the caller drains. Nothing here does I/O or reads a clock:
//! `now` comes in, so every path is testable without a network, and making
//! state durable (a later issue) means journaling these calls, here only.

use std::collections::{BTreeMap, HashMap, HashSet};

use corral_proto::cred::{CredError, Token, Verifier};
use corral_proto::msg::{
    AgentMsg, CtldMsg, Dep, ExitStatus, GpuAsk, Ident, JobFilter, JobKind, JobRun, JobSpec,
    JobState, JobView, Launch, LaunchKind, NodeUpdate, NodeView, PartitionView, Registration,
    Stats, StepSpec, JOBS_PER_PAGE,
};
use scheduler_core::{
    hostlist, Dependency, GpuRequest, GpuSpec, HoldKind, JobId, JobOutcome, JobRequest, JobStatus,
    LostJob, NodeAdmin, NodeAllocation, NodeSpec, Scheduler, SchedulerConfig, StartDecision,
    UserId,
};

use crate::config::Config;

mod select;
pub use select::{Selector, MAX_FILTER_ENTRIES};

/// The most GPUs one request may name (per node, per task or in all).
pub const MAX_GPUS: u32 = 1 << 16;

/// The widest `--nice` (Slurm's range).
pub const MAX_NICE: u32 = 2_147_483_645;

/// Step id of a batch script (Slurm prints it as `batch`).
pub const BATCH_STEP: u32 = u32::MAX - 1;

/// Why a job is being ended before its own exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kill {
    Cancelled,
    Timeout,
}

#[derive(Debug)]
struct JobRecord {
    id: u64,
    user: Ident,
    spec: JobSpec,
    partition: String,
    submit: u64,
    state: JobState,
    start: Option<u64>,
    end: Option<u64>,
    end_by: Option<u64>,
    alloc: Vec<(String, NodeAllocation)>,
    exit: ExitStatus,
    kill: Option<Kill>,
    /// Nodes still running the job's first step (batch or srun's).
    primary_left: HashSet<String>,
    /// Nodes that have not yet confirmed the job's processes are gone.
    cleaning: HashSet<String>,
    next_step: u32,
    /// Times the job was requeued: the number of its current run.
    restarts: u32,
    failure: Option<String>,
    /// Bytes of script, arguments and environment held for it (counted
    /// against its user until it is final).
    bytes: u64,
}

impl JobRecord {
    /// A finished job keeps what squeue and scontrol show, not its script
    /// and environment (kilobytes each, and finished jobs linger for
    /// `min_job_age`); what it held no longer counts against its user.
    fn shed(&mut self, usage: &mut HashMap<u32, Usage>, unfinished: &mut u64) {
        if self.bytes != u64::MAX {
            if let Some(u) = usage.get_mut(&self.user.uid) {
                u.jobs = u.jobs.saturating_sub(1);
                u.bytes = u.bytes.saturating_sub(self.bytes);
                if u.jobs == 0 {
                    usage.remove(&self.user.uid);
                }
            }
            *unfinished = unfinished.saturating_sub(1);
            self.bytes = u64::MAX;
        }
        self.spec.env = Vec::new();
        if let JobKind::Batch { script, .. } = &mut self.spec.kind {
            *script = String::new();
        }
    }

    fn run(&self) -> JobRun {
        JobRun {
            job: self.id,
            run: self.restarts,
        }
    }

    fn primary_step(&self) -> u32 {
        match self.spec.kind {
            JobKind::Batch { .. } => BATCH_STEP,
            JobKind::Interactive { .. } => 0,
        }
    }
}

#[derive(Debug)]
struct NodeRecord {
    id: scheduler_core::NodeId,
    reg: Registration,
    boot: u64,
    last_seen: u64,
    connected: bool,
    not_responding: bool,
    /// An operator's drain or down: (state, reason, by, at).
    admin: Option<(NodeUpdate, String, u32, u64)>,
    /// The agent's own word that it cannot take work: (why, since). The
    /// node drains for it and comes back when the agent says it is well.
    problem: Option<(String, u64)>,
}

/// A refusal to show the user.
pub type Refusal = String;

/// The controller's state.
#[derive(Debug)]
pub struct Controller {
    cfg: Config,
    sched: Scheduler,
    jobs: BTreeMap<u64, JobRecord>,
    next_job: u64,
    nodes: BTreeMap<String, NodeRecord>,
    verifier: Verifier,
    outbox: Vec<(String, CtldMsg)>,
    /// Set by any change a pass might act on.
    dirty: bool,
    /// When the scheduler next wants a pass without any event.
    wake_at: Option<u64>,
    stats: Stats,
    /// Unfinished jobs and their bytes, per user and in all.
    usage: HashMap<u32, Usage>,
    unfinished: u64,
}

/// What one user has queued.
#[derive(Clone, Copy, Debug, Default)]
struct Usage {
    jobs: u64,
    bytes: u64,
}

fn spec_bytes(spec: &JobSpec) -> u64 {
    let env: usize = spec.env.iter().map(|(k, v)| k.len() + v.len() + 16).sum();
    let kind = match &spec.kind {
        JobKind::Batch { script, args, .. } => {
            script.len() + args.iter().map(|a| a.len() + 8).sum::<usize>()
        }
        JobKind::Interactive { argv, .. } => argv.iter().map(|a| a.len() + 8).sum(),
    };
    (env + kind + spec.work_dir.len() + spec.name.len()) as u64
}

/// Refuses text with control characters: a job's name and paths reach
/// other users' terminals through squeue and scontrol.
fn printable(what: &str, s: &str) -> Result<(), Refusal> {
    if s.chars().any(char::is_control) {
        return Err(format!(
            "Invalid {what}: control characters are not allowed"
        ));
    }
    Ok(())
}

fn gpu_request(g: GpuAsk) -> GpuRequest {
    match g {
        GpuAsk::None => GpuRequest::None,
        GpuAsk::PerNode(n) => GpuRequest::PerNode(n),
        GpuAsk::PerTask(n) => GpuRequest::PerTask(n),
        GpuAsk::Total(n) => GpuRequest::Total(n),
    }
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

impl Controller {
    pub fn new(cfg: Config) -> Result<Controller, Refusal> {
        let mut sched = Scheduler::new(SchedulerConfig {
            policy: cfg.policy,
            ..SchedulerConfig::default()
        });
        for p in &cfg.partitions {
            sched.add_partition(p.clone()).map_err(|e| e.to_string())?;
        }
        Ok(Controller {
            cfg,
            sched,
            jobs: BTreeMap::new(),
            next_job: 1,
            nodes: BTreeMap::new(),
            verifier: Verifier::default(),
            outbox: Vec::new(),
            dirty: false,
            wake_at: None,
            stats: Stats::default(),
            usage: HashMap::new(),
            unfinished: 0,
        })
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Messages for agents queued by the calls so far.
    pub fn take_outbox(&mut self) -> Vec<(String, CtldMsg)> {
        std::mem::take(&mut self.outbox)
    }

    /// Whether a pass may start something.
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// Whether a pass may start something (and clears the flag).
    pub fn take_dirty(&mut self) -> bool {
        std::mem::replace(&mut self.dirty, false)
    }

    /// Root and the configured operators.
    pub fn privileged(&self, who: Ident) -> bool {
        who.uid == 0 || self.cfg.operators.contains(&who.uid)
    }

    /// Checks a credential: who the request is for.
    pub fn authenticate(&mut self, token: &Token, now_ms: u64) -> Result<Ident, CredError> {
        self.verifier.verify(token, now_ms)
    }

    // ---- nodes -------------------------------------------------------

    /// An agent registers (its certificate already checked for the name).
    pub fn register(&mut self, reg: Registration, now: u64) -> Result<(), Refusal> {
        if reg.name.is_empty() || reg.name.len() > 256 {
            return Err("invalid node name".into());
        }
        self.verifier.register(&reg.name, &reg.credential_key);
        self.dirty = true;
        if let Some(n) = self.nodes.get_mut(&reg.name) {
            let id = n.id;
            let running: HashSet<JobRun> = reg.running.iter().copied().collect();
            n.reg = reg;
            n.last_seen = now;
            n.connected = true;
            n.problem = None;
            let was_down = std::mem::replace(&mut n.not_responding, false);
            let name = n.reg.name.clone();
            // Runs we think are here that the agent no longer has: the
            // agent restarted and its tasks died with it.
            let lost_runs = self.jobs.values().any(|j| {
                j.state == JobState::Running
                    && j.alloc.iter().any(|(n, _)| *n == name)
                    && !running.contains(&j.run())
            });
            if !was_down && lost_runs {
                self.node_lost(now, &name, "Agent restarted");
                if let Some(n) = self.nodes.get_mut(&name) {
                    n.not_responding = false;
                }
            }
            self.end_strays(now, &name, &running);
            let admin = self.admin_state(&name);
            self.sched
                .handle_node_admin(now, id, admin)
                .map_err(|e| e.to_string())?;
            return Ok(());
        }
        let spec = NodeSpec {
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
                })
                .collect(),
            features: reg.features.clone(),
        };
        let id = self
            .sched
            .handle_node_added(spec)
            .map_err(|e| e.to_string())?;
        let running = reg.running.clone();
        let name = reg.name.clone();
        self.nodes.insert(
            name.clone(),
            NodeRecord {
                id,
                reg,
                boot: now,
                last_seen: now,
                connected: true,
                not_responding: false,
                admin: None,
                problem: None,
            },
        );
        for job in running {
            self.outbox
                .push((name.clone(), CtldMsg::Terminate { job, grace_ms: 0 }));
        }
        Ok(())
    }

    /// Ends on `name` the runs its agent has that are not placed there
    /// (jobs that failed or were requeued while it was silent), and
    /// completes the clean-ups that waited on runs it no longer has.
    fn end_strays(&mut self, now: u64, name: &str, running: &HashSet<JobRun>) {
        for r in running {
            let placed = self.jobs.get(&r.job).is_some_and(|j| {
                !j.state.is_final() && j.run() == *r && j.alloc.iter().any(|(n, _)| n == name)
            });
            if !placed {
                self.outbox.push((
                    name.to_string(),
                    CtldMsg::Terminate {
                        job: *r,
                        grace_ms: 0,
                    },
                ));
            }
        }
        let done: Vec<JobRun> = self
            .jobs
            .values()
            .filter(|j| j.cleaning.contains(name) && !running.contains(&j.run()))
            .map(JobRecord::run)
            .collect();
        for r in done {
            self.cleaned(now, name, r);
        }
    }

    /// Something arrived from the agent at `at` (no heartbeat list).
    pub fn heard(&mut self, name: &str, at: u64) {
        if let Some(n) = self.nodes.get_mut(name) {
            n.last_seen = n.last_seen.max(at);
        }
    }

    /// An agent's heartbeat, passed on by the server without holding up
    /// the agent's stream: `at` is when it arrived, `running` the runs it
    /// listed. A node that was marked not responding while its agent
    /// stayed connected is back: its stale runs are ended there.
    pub fn heartbeat(&mut self, name: &str, at: u64, running: &[JobRun]) {
        let Some(n) = self.nodes.get_mut(name) else {
            return;
        };
        n.last_seen = n.last_seen.max(at);
        if !(n.not_responding && n.connected) {
            return;
        }
        n.not_responding = false;
        let id = n.id;
        tracing::info!(node = %name, "node responding again");
        let running: HashSet<JobRun> = running.iter().copied().collect();
        self.end_strays(at, name, &running);
        let admin = self.admin_state(name);
        let _ = self.sched.handle_node_admin(at, id, admin);
        self.dirty = true;
    }

    fn admin_state(&self, name: &str) -> NodeAdmin {
        let Some(n) = self.nodes.get(name) else {
            return NodeAdmin::Down {
                reason: "Unknown".into(),
            };
        };
        if n.not_responding {
            return NodeAdmin::Down {
                reason: "Not responding".into(),
            };
        }
        match &n.admin {
            Some((NodeUpdate::Drain, reason, _, _)) => NodeAdmin::Drain {
                reason: reason.clone(),
            },
            Some((NodeUpdate::Down, reason, _, _)) => NodeAdmin::Down {
                reason: reason.clone(),
            },
            _ => match &n.problem {
                Some((why, _)) => NodeAdmin::Drain {
                    reason: format!("Agent unhealthy: {why}"),
                },
                None => NodeAdmin::Up,
            },
        }
    }

    /// The agent's connection ended (it may come back).
    pub fn disconnected(&mut self, name: &str) {
        if let Some(n) = self.nodes.get_mut(name) {
            n.connected = false;
        }
    }

    /// A message from an agent on its control stream.
    pub fn agent_message(&mut self, node: &str, msg: AgentMsg, now: u64) {
        if let Some(n) = self.nodes.get_mut(node) {
            n.last_seen = now;
        }
        match msg {
            AgentMsg::Heartbeat { running } => self.heartbeat(node, now, &running),
            AgentMsg::StepExited { job, step, exit } => {
                self.step_exited(now, node, job, step, exit, None)
            }
            AgentMsg::LaunchFailed { job, step, message } => {
                let exit = ExitStatus {
                    code: 1,
                    signal: None,
                };
                self.step_exited(now, node, job, step, exit, Some(message));
            }
            AgentMsg::JobCleaned { job } => self.cleaned(now, node, job),
            AgentMsg::Health { problem } => self.health(node, problem, now),
        }
    }

    /// The agent says whether it can take work.
    fn health(&mut self, node: &str, problem: Option<String>, now: u64) {
        let Some(n) = self.nodes.get_mut(node) else {
            return;
        };
        if n.problem.as_ref().map(|(p, _)| p) == problem.as_ref() {
            return;
        }
        match &problem {
            Some(p) => tracing::warn!(%node, problem = %p, "node unhealthy; draining it"),
            None => tracing::info!(%node, "node healthy again"),
        }
        n.problem = problem.map(|p| (p, now));
        let id = n.id;
        let admin = self.admin_state(node);
        let _ = self.sched.handle_node_admin(now, id, admin);
        self.dirty = true;
    }

    fn step_exited(
        &mut self,
        now: u64,
        node: &str,
        run: JobRun,
        step: u32,
        exit: ExitStatus,
        failure: Option<String>,
    ) {
        let job = run.job;
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        // News of an older run (requeued since) is not this run's.
        if j.run() != run || j.state != JobState::Running || step != j.primary_step() {
            return;
        }
        if !j.primary_left.remove(node) {
            return;
        }
        if exit.code > j.exit.code || (j.exit.signal.is_none() && exit.signal.is_some()) {
            j.exit = exit;
        }
        if let (Some(message), None) = (failure, &j.failure) {
            let what = if step == BATCH_STEP {
                "batch step".to_string()
            } else {
                format!("step {step}")
            };
            j.failure = Some(format!("{what} on {node}: {message}"));
        }
        if j.primary_left.is_empty() {
            self.complete(now, job, 0);
        }
    }

    /// The job's work is over (or it is being ended): COMPLETING until
    /// every node confirms its processes are gone.
    fn complete(&mut self, now: u64, job: u64, grace_ms: u64) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        j.state = JobState::Completing;
        j.end = Some(now);
        j.cleaning = j.alloc.iter().map(|(n, _)| n.clone()).collect();
        let run = j.run();
        for (n, _) in &j.alloc {
            self.outbox
                .push((n.clone(), CtldMsg::Terminate { job: run, grace_ms }));
        }
        // Nodes that cannot answer count as clean.
        let gone: Vec<String> = j
            .cleaning
            .iter()
            .filter(|n| self.nodes.get(*n).is_none_or(|r| r.not_responding))
            .cloned()
            .collect();
        for n in gone {
            self.cleaned(now, &n, run);
        }
    }

    fn cleaned(&mut self, now: u64, node: &str, run: JobRun) {
        let job = run.job;
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        if j.run() != run
            || j.state != JobState::Completing
            || !j.cleaning.remove(node)
            || !j.cleaning.is_empty()
        {
            return;
        }
        let (state, outcome) = match j.kill {
            Some(Kill::Cancelled) => (JobState::Cancelled, JobOutcome::Cancelled),
            Some(Kill::Timeout) => (JobState::Timeout, JobOutcome::Timeout),
            None if j.exit.success() && j.failure.is_none() => {
                (JobState::Completed, JobOutcome::Completed)
            }
            None => (
                JobState::Failed,
                JobOutcome::Failed {
                    exit_code: j.exit.code.max(1),
                },
            ),
        };
        j.state = state;
        j.shed(&mut self.usage, &mut self.unfinished);
        let _ = self.sched.handle_job_finished(now, JobId(job), outcome);
        self.stats.finished += 1;
        self.dirty = true;
    }

    /// A clock tick: silent agents go DOWN, jobs past their limit time out,
    /// old finished jobs are forgotten.
    pub fn tick(&mut self, now: u64) {
        let timeout = self.cfg.heartbeat_timeout;
        let silent: Vec<String> = self
            .nodes
            .values()
            .filter(|n| !n.not_responding && now.saturating_sub(n.last_seen) > timeout)
            .map(|n| n.reg.name.clone())
            .collect();
        for name in silent {
            tracing::warn!(node = %name, "node not responding; marking it DOWN");
            self.node_lost(now, &name, "Not responding");
        }
        let overdue: Vec<u64> = self
            .jobs
            .values()
            .filter(|j| j.state == JobState::Running && j.end_by.is_some_and(|e| e <= now))
            .map(|j| j.id)
            .collect();
        for job in overdue {
            if let Some(j) = self.jobs.get_mut(&job) {
                j.kill = Some(Kill::Timeout);
            }
            let grace = self.cfg.kill_wait * 1000;
            self.complete(now, job, grace);
        }
        let age = self.cfg.min_job_age;
        self.jobs.retain(|_, j| {
            !(j.state.is_final() && j.end.is_some_and(|e| now.saturating_sub(e) > age))
        });
        // A begin time or a reservation's end came: a pass may start jobs.
        if self.wake_at.is_some_and(|w| w <= now) {
            self.dirty = true;
        }
        self.wake_at = self.sched.next_wakeup(now);
    }

    fn node_lost(&mut self, now: u64, name: &str, reason: &str) {
        let Some(n) = self.nodes.get_mut(name) else {
            return;
        };
        n.not_responding = true;
        let id = n.id;
        let lost = self
            .sched
            .handle_node_admin(
                now,
                id,
                NodeAdmin::Down {
                    reason: reason.into(),
                },
            )
            .unwrap_or_default();
        for l in lost {
            let (job, requeued) = match l {
                LostJob::Failed(j) => (j.0, false),
                LostJob::Requeued(j) => (j.0, true),
            };
            let Some(j) = self.jobs.get_mut(&job) else {
                continue;
            };
            // The job's other nodes end their part.
            let run = j.run();
            for (n, _) in &j.alloc {
                if n != name {
                    self.outbox.push((
                        n.clone(),
                        CtldMsg::Terminate {
                            job: run,
                            grace_ms: 0,
                        },
                    ));
                }
            }
            j.alloc.clear();
            j.primary_left.clear();
            j.cleaning.clear();
            if requeued {
                j.state = JobState::Pending;
                j.start = None;
                j.end_by = None;
                j.exit = ExitStatus::default();
                j.restarts += 1;
            } else {
                j.state = JobState::NodeFail;
                j.end = Some(now);
                j.shed(&mut self.usage, &mut self.unfinished);
                self.stats.finished += 1;
            }
        }
        // Completions that waited on the lost node.
        let waiting: Vec<JobRun> = self
            .jobs
            .values()
            .filter(|j| j.cleaning.contains(name))
            .map(JobRecord::run)
            .collect();
        for run in waiting {
            self.cleaned(now, name, run);
        }
        self.dirty = true;
    }

    // ---- requests ----------------------------------------------------

    /// Checks what a submission may ask for and what its user may still
    /// queue, before the scheduler sees it.
    fn admit(&self, who: Ident, spec: &JobSpec) -> Result<u64, Refusal> {
        let privileged = self.privileged(who);
        printable("job name", &spec.name)?;
        printable("working directory", &spec.work_dir)?;
        for p in [&spec.partition, &spec.qos].into_iter().flatten() {
            printable("partition or QOS name", p)?;
        }
        if let JobKind::Batch {
            script,
            stdout,
            stderr,
            ..
        } = &spec.kind
        {
            for p in [stdout, stderr].into_iter().flatten() {
                printable("output file name", p)?;
            }
            let max = self.cfg.limits.max_script_size;
            if script.len() as u64 > max {
                return Err(format!(
                    "Batch script is too large: {} bytes, the limit is {max}",
                    script.len()
                ));
            }
        }
        if let GpuAsk::PerNode(g) | GpuAsk::PerTask(g) | GpuAsk::Total(g) = spec.gpus {
            if g > MAX_GPUS {
                return Err(format!(
                    "Invalid generic resource (gres) specification: {g} GPUs, the most is {MAX_GPUS}"
                ));
            }
        }
        if spec.nice < 0 && !privileged {
            return Err(
                "Access/permission denied: only operators may set a negative nice value".into(),
            );
        }
        if spec.nice.unsigned_abs() > MAX_NICE {
            return Err(format!(
                "Invalid nice value: it must be between -{MAX_NICE} and {MAX_NICE}"
            ));
        }
        let limits = &self.cfg.limits;
        if self.unfinished >= limits.max_job_count {
            return Err(format!(
                "Resource temporarily unavailable: the cluster holds its limit of {} jobs",
                limits.max_job_count
            ));
        }
        let bytes = spec_bytes(spec);
        let used = self.usage.get(&who.uid).copied().unwrap_or_default();
        if !privileged && used.jobs >= limits.max_jobs_per_user {
            return Err(format!(
                "Job violates accounting/QOS policy (job submit limit, user's size and/or time limits): \
                 {} unfinished jobs, the limit per user is {}",
                used.jobs, limits.max_jobs_per_user
            ));
        }
        if !privileged && used.bytes.saturating_add(bytes) > limits.max_bytes_per_user {
            return Err(format!(
                "Job violates accounting/QOS policy (job submit limit, user's size and/or time limits): \
                 unfinished jobs would hold {} bytes of scripts and environment, the limit per user is {}",
                used.bytes.saturating_add(bytes),
                limits.max_bytes_per_user
            ));
        }
        Ok(bytes)
    }

    pub fn submit(&mut self, who: Ident, spec: JobSpec, now: u64) -> Result<u64, Refusal> {
        let bytes = self.admit(who, &spec)?;
        let mut req = JobRequest::new(UserId(who.uid));
        req.name = spec.name.clone();
        req.partition = spec.partition.clone();
        req.nodes = spec.nodes;
        req.ntasks = spec.ntasks;
        req.ntasks_per_node = spec.ntasks_per_node;
        req.cpus_per_task = spec.cpus_per_task.unwrap_or(1).max(1);
        req.memory_per_node_mb = spec.mem_mb;
        req.gpus = gpu_request(spec.gpus);
        req.exclusive = spec.exclusive;
        req.time_limit = spec.time_limit;
        req.nodelist = spec.nodelist.clone();
        req.exclude = spec.exclude.clone();
        req.hold = spec.hold;
        req.requeue = spec.requeue;
        req.qos = spec.qos.clone();
        req.nice = spec.nice;
        req.begin_time = spec.begin;
        req.dependencies = spec
            .dependencies
            .iter()
            .map(|d| match *d {
                Dep::After(j) => Dependency::After(JobId(j)),
                Dep::AfterOk(j) => Dependency::AfterOk(JobId(j)),
                Dep::AfterNotOk(j) => Dependency::AfterNotOk(JobId(j)),
                Dep::AfterAny(j) => Dependency::AfterAny(JobId(j)),
                Dep::Singleton => Dependency::Singleton,
            })
            .collect();
        let id = self.next_job;
        let held = req.hold;
        self.sched
            .submit(now, JobId(id), req)
            .map_err(|e| capitalise(&e.to_string()))?;
        self.next_job += 1;
        self.stats.submitted += 1;
        let partition = spec
            .partition
            .clone()
            .or_else(|| {
                self.cfg
                    .partitions
                    .iter()
                    .find(|p| p.is_default)
                    .map(|p| p.name.clone())
            })
            .unwrap_or_default();
        self.jobs.insert(
            id,
            JobRecord {
                id,
                user: who,
                spec,
                partition,
                submit: now,
                state: JobState::Pending,
                start: None,
                end: None,
                end_by: None,
                alloc: Vec::new(),
                exit: ExitStatus::default(),
                kill: None,
                primary_left: HashSet::new(),
                cleaning: HashSet::new(),
                next_step: 0,
                restarts: 0,
                failure: None,
                bytes,
            },
        );
        let u = self.usage.entry(who.uid).or_default();
        u.jobs += 1;
        u.bytes += bytes;
        self.unfinished += 1;
        // A held job cannot start: no pass needed for it.
        self.dirty |= !held;
        Ok(id)
    }

    /// Counts for `sdiag`-style monitoring.
    pub fn stats(&self) -> Stats {
        let mut s = self.stats;
        s.pending = 0;
        s.running = 0;
        s.completing = 0;
        for j in self.jobs.values() {
            match j.state {
                JobState::Pending => s.pending += 1,
                JobState::Running => s.running += 1,
                JobState::Completing => s.completing += 1,
                _ => {}
            }
        }
        s
    }

    /// Records how long the last pass took (measured by the driver).
    pub fn record_pass(&mut self, micros: u64) {
        self.stats.passes += 1;
        self.stats.last_pass_us = micros;
    }

    /// Runs a scheduling pass and queues the launches it decides.
    pub fn schedule(&mut self, now: u64) -> usize {
        let starts = self.sched.schedule(now);
        let n = starts.len();
        for d in starts {
            self.start(now, d);
        }
        n
    }

    fn node_name(&self, id: scheduler_core::NodeId) -> String {
        self.sched.node_info(id).map(|i| i.name).unwrap_or_default()
    }

    fn start(&mut self, now: u64, d: StartDecision) {
        let mut alloc: Vec<(String, NodeAllocation)> = d
            .nodes
            .into_iter()
            .map(|a| (self.node_name(a.node), a))
            .collect();
        // Slurm orders a job's nodes by name: task 0 and the batch script
        // go to the first.
        alloc.sort_by(|a, b| natural(&a.0, &b.0));
        let Some(j) = self.jobs.get_mut(&d.job.0) else {
            return;
        };
        j.state = JobState::Running;
        j.start = Some(now);
        j.end_by = (d.end_by < scheduler_core::INFINITE).then_some(d.end_by);
        j.alloc = alloc;
        j.exit = ExitStatus::default();
        j.kill = None;
        j.failure = None;
        let job_nodes: Vec<String> = j.alloc.iter().map(|(n, _)| n.clone()).collect();
        let ntasks: u32 = j.alloc.iter().map(|(_, a)| a.tasks).sum();
        let gpus_per_task = match j.spec.gpus {
            GpuAsk::PerTask(g) => Some(g),
            _ => None,
        };
        let time_limit = j.end_by.map(|e| e.saturating_sub(now));
        let base = |a: &NodeAllocation, node_index: u32, first_task: u32, tasks_here: u32| Launch {
            job: j.id,
            run: j.restarts,
            step: 0,
            name: j.spec.name.clone(),
            user: j.user,
            partition: j.partition.clone(),
            work_dir: j.spec.work_dir.clone(),
            env: j.spec.env.clone(),
            job_nodes: job_nodes.clone(),
            node_index,
            step_nodes: job_nodes.len() as u32,
            ntasks,
            first_task,
            tasks_here,
            cpus_per_task: j.spec.cpus_per_task.unwrap_or(1).max(1),
            cpus: a.cpus.clone(),
            gpus: a.gpus.clone(),
            gpus_per_task,
            memory_mb: a.memory_mb,
            time_limit,
            what: LaunchKind::Batch {
                script: String::new(),
                args: Vec::new(),
                stdout: String::new(),
                stderr: None,
            },
        };
        match &j.spec.kind {
            JobKind::Batch {
                script,
                args,
                stdout,
                stderr,
            } => {
                let (node, a) = &j.alloc[0];
                let mut l = base(a, 0, 0, 1);
                l.step = BATCH_STEP;
                l.what = LaunchKind::Batch {
                    script: script.clone(),
                    args: args.clone(),
                    stdout: stdout.clone().unwrap_or_else(|| "slurm-%j.out".into()),
                    stderr: stderr.clone(),
                };
                j.primary_left = [node.clone()].into();
                self.outbox.push((node.clone(), CtldMsg::Launch(l)));
            }
            JobKind::Interactive { argv, io } => {
                let mut first = 0;
                for (i, (node, a)) in j.alloc.iter().enumerate() {
                    let mut l = base(a, i as u32, first, a.tasks);
                    first += a.tasks;
                    l.what = LaunchKind::Step {
                        argv: argv.clone(),
                        io: *io,
                    };
                    self.outbox.push((node.clone(), CtldMsg::Launch(l)));
                }
                j.primary_left = job_nodes.iter().cloned().collect();
                j.next_step = 1;
            }
        }
    }

    /// `srun` inside an allocation: a new step on the job's nodes.
    pub fn submit_step(&mut self, who: Ident, s: StepSpec) -> Result<(u64, u32), Refusal> {
        let privileged = self.privileged(who);
        let j = self
            .jobs
            .get_mut(&s.job)
            .ok_or_else(|| format!("Invalid job id specified: {}", s.job))?;
        if j.user.uid != who.uid && !privileged {
            return Err("Access/permission denied".into());
        }
        if j.state != JobState::Running {
            return Err(format!("Job {} is not running", s.job));
        }
        let all = j.alloc.len() as u32;
        let nodes = s.nodes.unwrap_or(all);
        if nodes == 0 || nodes > all {
            return Err(format!(
                "Requested node configuration is not available: the allocation has {all} nodes"
            ));
        }
        let job_tasks: u32 = j.alloc.iter().map(|(_, a)| a.tasks).sum();
        let ntasks = s.ntasks.unwrap_or(if s.nodes.is_some() {
            nodes
        } else {
            job_tasks.max(nodes)
        });
        if ntasks == 0 {
            return Err("Invalid number of tasks".into());
        }
        let nodes = nodes.min(ntasks);
        let step = j.next_step;
        j.next_step += 1;
        let job_nodes: Vec<String> = j.alloc.iter().map(|(n, _)| n.clone()).collect();
        let gpus_per_task = match j.spec.gpus {
            GpuAsk::PerTask(g) => Some(g),
            _ => None,
        };
        let (base, extra) = (ntasks / nodes, ntasks % nodes);
        let mut first = 0;
        let mut env = j.spec.env.clone();
        // The step's own environment wins over the job's.
        for (k, v) in s.env {
            env.retain(|(key, _)| *key != k);
            env.push((k, v));
        }
        for (i, (node, a)) in j.alloc.iter().take(nodes as usize).enumerate() {
            let here = base + u32::from((i as u32) < extra);
            let l = Launch {
                job: j.id,
                run: j.restarts,
                step,
                name: j.spec.name.clone(),
                user: j.user,
                partition: j.partition.clone(),
                work_dir: s.work_dir.clone(),
                env: env.clone(),
                job_nodes: job_nodes.clone(),
                node_index: i as u32,
                step_nodes: nodes,
                ntasks,
                first_task: first,
                tasks_here: here,
                cpus_per_task: j.spec.cpus_per_task.unwrap_or(1).max(1),
                cpus: a.cpus.clone(),
                gpus: a.gpus.clone(),
                gpus_per_task,
                memory_mb: a.memory_mb,
                time_limit: j.end_by.zip(j.start).map(|(e, st)| e.saturating_sub(st)),
                what: LaunchKind::Step {
                    argv: s.argv.clone(),
                    io: s.io,
                },
            };
            first += here;
            self.outbox.push((node.clone(), CtldMsg::Launch(l)));
        }
        Ok((s.job, step))
    }

    /// Cancels (or signals) jobs. Jobs named by id that do not exist or
    /// belong to someone else are refused before anything is done; jobs of
    /// others that a filter selects are refused one by one, after the
    /// caller's own are cancelled, as Slurm's scancel reports them.
    pub fn cancel(
        &mut self,
        who: Ident,
        f: &JobFilter,
        signal: Option<i32>,
        now: u64,
    ) -> Result<Vec<u64>, Refusal> {
        let sel = Selector::new(f.clone())?;
        let privileged = self.privileged(who);
        for id in &f.ids {
            let j = self.jobs.get(id).ok_or_else(|| {
                format!("Kill job error on job id {id}: Invalid job id specified")
            })?;
            if j.user.uid != who.uid && !privileged {
                return Err(format!(
                    "Kill job error on job id {id}: Access/permission denied"
                ));
            }
            if j.state.is_final() {
                return Err(format!(
                    "Kill job error on job id {id}: Job/step already completing or completed"
                ));
            }
        }
        let selected: Vec<u64> = self
            .jobs
            .values()
            .filter(|j| {
                !j.state.is_final()
                    && sel.matches(j.id, j.user.uid, j.state, &j.partition, &j.spec.name)
            })
            .map(|j| j.id)
            .collect();
        let mut done = Vec::new();
        let mut denied = Vec::new();
        for id in selected {
            let Some(j) = self.jobs.get(&id) else {
                continue;
            };
            if j.user.uid != who.uid && !privileged {
                denied.push(id);
                continue;
            }
            if let Some(sig) = signal {
                if j.state == JobState::Running {
                    let run = j.run();
                    for (n, _) in &j.alloc {
                        self.outbox.push((
                            n.clone(),
                            CtldMsg::Signal {
                                job: run,
                                step: None,
                                signal: sig,
                            },
                        ));
                    }
                    done.push(id);
                }
                continue;
            }
            match j.state {
                JobState::Pending => {
                    let _ = self.sched.cancel(JobId(id));
                    if let Some(j) = self.jobs.get_mut(&id) {
                        j.state = JobState::Cancelled;
                        j.end = Some(now);
                        j.shed(&mut self.usage, &mut self.unfinished);
                    }
                    self.stats.finished += 1;
                    self.dirty = true;
                }
                JobState::Running => {
                    if let Some(j) = self.jobs.get_mut(&id) {
                        j.kill = Some(Kill::Cancelled);
                    }
                    let grace = self.cfg.kill_wait * 1000;
                    self.complete(now, id, grace);
                }
                _ => continue,
            }
            done.push(id);
        }
        if !denied.is_empty() {
            const SHOWN: usize = 20;
            let mut lines: Vec<String> = denied
                .iter()
                .take(SHOWN)
                .map(|id| format!("Kill job error on job id {id}: Access/permission denied"))
                .collect();
            if denied.len() > SHOWN {
                lines.push(format!(
                    "Access/permission denied for {} more jobs",
                    denied.len() - SHOWN
                ));
            }
            return Err(lines.join("\n"));
        }
        Ok(done)
    }

    /// Holds (`release == false`) or releases jobs.
    pub fn hold(&mut self, who: Ident, ids: &[u64], release: bool) -> Result<Vec<u64>, Refusal> {
        let privileged = self.privileged(who);
        let kind = if privileged {
            HoldKind::Admin
        } else {
            HoldKind::User
        };
        for id in ids {
            let j = self
                .jobs
                .get(id)
                .ok_or_else(|| format!("Invalid job id specified: {id}"))?;
            if j.user.uid != who.uid && !privileged {
                return Err(format!("Access/permission denied for job {id}"));
            }
        }
        for id in ids {
            let r = if release {
                self.sched.release(JobId(*id), kind)
            } else {
                self.sched.hold(JobId(*id), kind)
            };
            r.map_err(|e| capitalise(&e.to_string()))?;
        }
        self.dirty = true;
        Ok(ids.to_vec())
    }

    /// `scontrol update NodeName=… State=…`.
    pub fn update_node(
        &mut self,
        who: Ident,
        names: &str,
        state: NodeUpdate,
        reason: Option<String>,
        now: u64,
    ) -> Result<(), Refusal> {
        if !self.privileged(who) {
            return Err("Access/permission denied".into());
        }
        let list =
            hostlist::expand(names).map_err(|e| format!("Invalid node name specified: {e}"))?;
        if let Some(bad) = list.iter().find(|n| !self.nodes.contains_key(*n)) {
            return Err(format!("Invalid node name specified: {bad}"));
        }
        if state != NodeUpdate::Resume && reason.as_deref().is_none_or(str::is_empty) {
            return Err("You must specify a reason when DRAINING or DOWNING a node".into());
        }
        if let Some(r) = &reason {
            printable("reason", r)?;
        }
        // RESUME cannot bring back a node whose agent is gone: say so
        // rather than report a change that did not happen.
        if state == NodeUpdate::Resume {
            if let Some(n) = list
                .iter()
                .filter_map(|n| self.nodes.get(n))
                .find(|n| !n.connected)
            {
                return Err(format!(
                    "Invalid node state transition requested: {} is not responding; it returns when its agent connects again",
                    n.reg.name
                ));
            }
        }
        for name in list {
            let Some(n) = self.nodes.get_mut(&name) else {
                continue;
            };
            n.admin = match state {
                NodeUpdate::Resume => None,
                s => Some((s, reason.clone().unwrap_or_default(), who.uid, now)),
            };
            if state == NodeUpdate::Resume {
                // Connected (checked above): it answers.
                n.not_responding = false;
            }
            let id = n.id;
            if state == NodeUpdate::Down {
                self.node_lost(now, &name, reason.as_deref().unwrap_or("down"));
                if let Some(n) = self.nodes.get_mut(&name) {
                    // Still connected: it answers, it is only out of service.
                    n.not_responding = !n.connected;
                }
            }
            let admin = self.admin_state(&name);
            self.sched
                .handle_node_admin(now, id, admin)
                .map_err(|e| e.to_string())?;
        }
        self.dirty = true;
        Ok(())
    }

    // ---- views -------------------------------------------------------

    /// Jobs the filter selects, one page (ids above `f.after`, at most
    /// [`JOBS_PER_PAGE`]) in id order.
    pub fn job_views(&self, f: &JobFilter, now: u64) -> Vec<JobView> {
        let Ok(mut sel) = Selector::new(f.clone()) else {
            return Vec::new();
        };
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
        now: u64,
    ) -> (Vec<JobView>, Option<u64>) {
        let from = sel.after.saturating_add(1);
        let candidates: Box<dyn Iterator<Item = &JobRecord>> = match &sel.ids {
            Some(ids) => Box::new(ids.range(from..).filter_map(|id| self.jobs.get(id))),
            None => Box::new(self.jobs.range(from..).map(|(_, j)| j)),
        };
        let mut views = Vec::new();
        for (scanned, j) in candidates.enumerate() {
            if views.len() >= max_views || scanned >= max_scan {
                return (views, Some(j.id - 1));
            }
            if sel.matches(j.id, j.user.uid, j.state, &j.partition, &j.spec.name) {
                views.push(self.view(j, now));
            }
        }
        (views, None)
    }

    fn view(&self, j: &JobRecord, _now: u64) -> JobView {
        // Only a pending job has anything to ask the scheduler (a running
        // one's status would clone its allocation for nothing).
        let status = (j.state == JobState::Pending)
            .then(|| self.sched.job_status(JobId(j.id)))
            .flatten();
        let (reason, priority, expected) = match status {
            Some(JobStatus::Pending {
                reason,
                expected_start,
                priority,
            }) => (reason.as_str().to_string(), priority, expected_start),
            _ => ("None".to_string(), 0, None),
        };
        let reason = match (j.state, &j.failure) {
            (JobState::Pending, _) => reason,
            (JobState::Failed, Some(_)) => "JobLaunchFailure".into(),
            (JobState::Failed, None) => "NonZeroExitCode".into(),
            (JobState::NodeFail, _) => "NodeDown".into(),
            (JobState::Timeout, _) => "TimeLimit".into(),
            _ => "None".into(),
        };
        let running = !j.alloc.is_empty();
        let num_tasks = if running {
            j.alloc.iter().map(|(_, a)| a.tasks).sum()
        } else {
            j.spec.ntasks.unwrap_or(j.spec.nodes.unwrap_or(1))
        };
        let num_cpus = if running {
            j.alloc.iter().map(|(_, a)| a.cpus.len() as u32).sum()
        } else {
            num_tasks * j.spec.cpus_per_task.unwrap_or(1).max(1)
        };
        let gpus = if running {
            j.alloc.iter().map(|(_, a)| a.gpus.len() as u32).sum()
        } else {
            match j.spec.gpus {
                GpuAsk::None => 0,
                GpuAsk::PerNode(g) => g * j.spec.nodes.unwrap_or(1),
                GpuAsk::PerTask(g) => g * num_tasks,
                GpuAsk::Total(g) => g,
            }
        };
        let (stdout, stderr, command, batch) = match &j.spec.kind {
            JobKind::Batch { stdout, stderr, .. } => (
                Some(stdout.clone().unwrap_or_else(|| "slurm-%j.out".into())),
                stderr.clone(),
                j.spec.name.clone(),
                true,
            ),
            JobKind::Interactive { argv, .. } => (None, None, argv.join(" "), false),
        };
        JobView {
            id: j.id,
            name: j.spec.name.clone(),
            user: j.user,
            partition: j.partition.clone(),
            state: j.state,
            reason,
            priority,
            submit_time: j.submit,
            start_time: j.start,
            end_time: j.end.or(j.end_by),
            expected_start: expected,
            time_limit: j
                .spec
                .time_limit
                .or_else(|| j.end_by.zip(j.start).map(|(e, s)| e.saturating_sub(s))),
            nodes: j.alloc.iter().map(|(n, _)| n.clone()).collect(),
            num_nodes: if running {
                j.alloc.len() as u32
            } else {
                j.spec.nodes.unwrap_or(1)
            },
            num_tasks,
            cpus_per_task: j.spec.cpus_per_task.unwrap_or(1).max(1),
            num_cpus,
            gpus,
            mem_mb: j.spec.mem_mb.unwrap_or(0),
            exit: j.exit,
            work_dir: j.spec.work_dir.clone(),
            stdout,
            stderr,
            command,
            batch,
            requeue: j.spec.requeue,
            restarts: j.restarts,
            failure: j.failure.clone(),
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
                let mut state = info.state.as_str().to_string();
                if n.not_responding {
                    state.push('*');
                }
                let partitions = member_of.remove(&n.id).unwrap_or_default();
                let (reason, reason_user, reason_time) = match (&n.admin, n.not_responding) {
                    (Some((_, r, by, at)), _) => (Some(r.clone()), Some(*by), Some(*at)),
                    (None, true) => (
                        Some("Not responding".to_string()),
                        Some(0),
                        Some(n.last_seen),
                    ),
                    (None, false) => match &n.problem {
                        Some((why, since)) => (
                            Some(format!("Agent unhealthy: {why}")),
                            Some(0),
                            Some(*since),
                        ),
                        None => (None, None, None),
                    },
                };
                Some(NodeView {
                    name: n.reg.name.clone(),
                    state,
                    cpus: info.cpus,
                    alloc_cpus: info.alloc_cpus,
                    memory_mb: info.memory_mb,
                    alloc_memory_mb: info.alloc_memory_mb,
                    gpus: info.gpus,
                    alloc_gpus: info.alloc_gpus,
                    features: info.features,
                    partitions,
                    reason,
                    reason_user,
                    reason_time,
                    boot_time: n.boot,
                    last_seen: n.last_seen,
                    jobs: info.jobs.iter().map(|j| j.0).collect(),
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
pub fn natural(a: &str, b: &str) -> std::cmp::Ordering {
    let split = |s: &str| {
        let t = s.trim_end_matches(|c: char| c.is_ascii_digit());
        (t.len(), s[t.len()..].parse::<u64>().ok())
    };
    let ((la, na), (lb, nb)) = (split(a), split(b));
    a[..la].cmp(&b[..lb]).then(na.cmp(&nb)).then(a.cmp(b))
}

#[cfg(test)]
mod tests;
