//! The job lifecycle: submission, the messages agents send about a job's
//! processes, completion and clean-up, time limits, cancel and hold.

use super::wire::{core_id, job_request, wire_id};
use super::{
    Controller, CtldError, JobRecord, Kill, KillRefusal, Refusal, RequeueRefusal, Selector,
    SuspendRefusal,
};

use corral_proto::msg::{
    AgentMsg, CtldMsg, ExitStatus, Ident, JobChanges, JobFilter, JobId, JobRun, JobSpec, JobState,
    JobUsage, SendSignal, StepId, Suspension,
};
use scheduler_core::{HoldKind, JobOutcome};

impl Controller {
    /// A message from an agent on its control stream.
    pub fn agent_message(&mut self, node: &str, msg: AgentMsg, now: u64) {
        self.clock = self.clock.max(now);
        if let Some(n) = self.nodes.get_mut(node) {
            n.last_seen = now;
        }
        match msg {
            AgentMsg::Heartbeat { running } => self.heartbeat(node, now, &running),
            AgentMsg::StepExited {
                job,
                step,
                exit,
                oom,
            } => {
                // Slurm records a step the OOM killer ended as 0:125
                // (checked on 22.05 with slurmdbd), whatever its shell
                // made of the kill.
                let exit = if oom {
                    self.record_oom(job);
                    super::acct::OOM_EXIT
                } else {
                    exit
                };
                self.step_exited(now, node, job, step, exit, None)
            }
            AgentMsg::LaunchFailed { job, step, message } => {
                let exit = ExitStatus {
                    code: 1,
                    signal: None,
                };
                self.step_exited(now, node, job, step, exit, Some(message));
            }
            AgentMsg::JobCleaned { job, usage } => {
                self.record_usage(node, job, usage);
                self.cleaned(now, node, job)
            }
            // `StepExited` of the batch step and `JobCleaned` in one: the
            // node has nothing of the run left, so the job's end sends it
            // no Terminate.
            AgentMsg::BatchDone {
                job,
                exit,
                oom,
                usage,
            } => {
                let queued = self.outbox.len();
                let step = StepId::BATCH;
                self.agent_message(
                    node,
                    AgentMsg::StepExited {
                        job,
                        step,
                        exit,
                        oom,
                    },
                    now,
                );
                self.withdraw_terminate(queued, node, job);
                self.agent_message(node, AgentMsg::JobCleaned { job, usage }, now);
            }
            AgentMsg::Health { problem } => self.health(node, problem, now),
            AgentMsg::Leaving { grace_ms } => self.leaving(node, grace_ms, now),
        }
    }

    /// Takes back the `Terminate` of `run` to `node` queued since the
    /// outbox held `queued` messages.
    fn withdraw_terminate(&mut self, queued: usize, node: &str, run: JobRun) {
        let mut at = queued;
        while at < self.outbox.len() {
            let (to, msg) = &self.outbox[at];
            if to == node && matches!(msg, CtldMsg::Terminate { job, .. } if *job == run) {
                self.outbox.remove(at);
            } else {
                at += 1;
            }
        }
    }

    /// A step of the run had a process killed for memory: the job ends
    /// OUT_OF_MEMORY (unless it is cancelled or times out first).
    fn record_oom(&mut self, run: JobRun) {
        if let Some(j) = self.jobs.get_mut_if(&run.job, |j| j.run() == run) {
            j.oom = true;
        }
    }

    /// A node's report of what the run used there, counted once per node.
    fn record_usage(&mut self, node: &str, run: JobRun, usage: Option<JobUsage>) {
        let Some(u) = usage else {
            return;
        };
        if let Some(j) = self
            .jobs
            .get_mut_if(&run.job, |j| j.run() == run && j.cleaning.contains(node))
        {
            let total = j.used.get_or_insert_with(JobUsage::default);
            total.cpu_ms = total.cpu_ms.saturating_add(u.cpu_ms);
            total.max_rss_kb = total.max_rss_kb.max(u.max_rss_kb);
        }
    }

    pub(super) fn step_exited(
        &mut self,
        now: u64,
        node: &str,
        run: JobRun,
        step: StepId,
        exit: ExitStatus,
        failure: Option<String>,
    ) {
        let job = run.job;
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        // News of an older run (requeued since) is not this run's.
        if j.run() != run {
            return;
        }
        j.step_part_exited(step, node, exit, now);
        j.open_step_ended(step, node);
        // A job ended by a cancel or its limit shows how its batch step
        // died (`scontrol show job`: ExitCode=0:15), as Slurm's.
        if j.state == JobState::Completing
            && step == j.primary_step()
            && exit.signal.is_some()
            && j.exit == ExitStatus::default()
        {
            j.exit = exit;
        }
        if j.state != JobState::Running || step != j.primary_step() {
            return;
        }
        if !j.primary_left.remove(node) {
            return;
        }
        if exit.code > j.exit.code || (j.exit.signal.is_none() && exit.signal.is_some()) {
            j.exit = exit;
        }
        if let (Some(message), None) = (failure, &j.failure) {
            let what = if step == StepId::BATCH {
                "batch step".to_string()
            } else {
                format!("step {step}")
            };
            j.failure = Some(format!("{what} on {node}: {message}").into());
        }
        if j.primary_left.is_empty() {
            self.complete(now, job, 0);
        }
    }

    /// The job's work is over (or it is being ended): COMPLETING until
    /// every node confirms its processes are gone.
    pub(super) fn complete(&mut self, now: u64, job: JobId, grace_ms: u64) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        j.state = JobState::Completing;
        j.end = super::Stamp::at(now);
        j.end_suspension(now);
        j.open_steps.clear();
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

    pub(super) fn cleaned(&mut self, now: u64, node: &str, run: JobRun) {
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
            Some(Kill::Requeue { hold, by_operator }) => {
                // `scontrol requeue`: nothing of the run is left; a new
                // one waits (held too, for `requeuehold`).
                let kind = hold.then_some(if by_operator {
                    HoldKind::Admin
                } else {
                    HoldKind::User
                });
                let _ = self.sched.requeue(now, core_id(job), kind);
                j.spec_mut().hold |= hold;
                let ended = j.reset_for_requeue(now, self.cfg.requeue_delay);
                self.account(ended);
                self.dirty = true;
                return;
            }
            Some(Kill::Cancelled) => (JobState::Cancelled, JobOutcome::Cancelled),
            Some(Kill::Timeout) => (JobState::Timeout, JobOutcome::Timeout),
            None if j.oom => (
                JobState::OutOfMemory,
                JobOutcome::Failed {
                    exit_code: j.exit.code.max(1),
                },
            ),
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
        let _ = self.sched.handle_job_finished(now, core_id(job), outcome);
        self.stats.finished += 1;
        self.dirty = true;
        self.active_check_done(job, now);
    }

    /// A clock tick: silent agents go DOWN, jobs past their limit time out,
    /// old finished jobs are forgotten.
    pub fn tick(&mut self, now: u64) {
        self.clock = self.clock.max(now);
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
        // The scheduler holds each running job's limit; a job already
        // completing is being ended and is not timed out again.
        let overdue: Vec<JobId> = self
            .sched
            .overdue_jobs(now)
            .into_iter()
            .map(wire_id)
            .filter(|id| {
                self.jobs
                    .get(id)
                    .is_some_and(|j| j.state == JobState::Running)
            })
            .collect();
        for job in overdue {
            if let Some(j) = self.jobs.get_mut(&job) {
                j.kill = Some(Kill::Timeout);
            }
            let grace = self.cfg.kill_wait * 1000;
            self.complete(now, job, grace);
        }
        self.limit_signals(now);
        self.silent_allocations(now);
        self.jobs
            .forget_ended(now, self.cfg.min_job_age, &mut self.usage);
        self.finish_leaving(now);
        self.end_recovery(now);
        self.active_checks(now);
        // A begin time or a reservation's end came: a pass may start jobs.
        if self.wake_at.is_some_and(|w| w <= now) {
            self.dirty = true;
        }
        self.wake_at = self.sched.next_wakeup(now);
    }

    /// `salloc`'s command ended with `exit`: a running allocation ends
    /// with it (COMPLETED, or FAILED with its code), one still pending
    /// is withdrawn as cancelled; one already over is left as it is.
    pub fn end_allocation(
        &mut self,
        who: Ident,
        job: JobId,
        exit: ExitStatus,
        now: u64,
    ) -> Result<(), Refusal> {
        let privileged = self.privileged(who);
        let j = self.jobs.get(&job).ok_or(CtldError::UnknownJob(job))?;
        if j.user.uid != who.uid && !privileged {
            return Err(CtldError::NotYourJob(job));
        }
        if j.spec.kind() != super::packed::Kind::Allocation {
            return Err(CtldError::NotAllocation(job));
        }
        match j.state {
            JobState::Pending => {
                let filter = JobFilter {
                    ids: vec![job],
                    ..JobFilter::default()
                };
                self.cancel(who, &filter, None, now)?;
            }
            JobState::Running => {
                if let Some(j) = self.jobs.get_mut(&job) {
                    j.exit = exit;
                }
                let grace = self.cfg.kill_wait * 1000;
                self.complete(now, job, grace);
            }
            _ => {}
        }
        Ok(())
    }

    /// salloc says its allocation is still wanted.
    pub fn allocation_alive(&mut self, who: Ident, job: JobId, now: u64) -> Result<(), Refusal> {
        let privileged = self.privileged(who);
        let j = self.jobs.get(&job).ok_or(CtldError::UnknownJob(job))?;
        if j.user.uid != who.uid && !privileged {
            return Err(CtldError::NotYourJob(job));
        }
        if j.spec.kind() != super::packed::Kind::Allocation {
            return Err(CtldError::NotAllocation(job));
        }
        self.allocation_seen.insert(job, now);
        Ok(())
    }

    /// Running allocations whose salloc went silent (killed, or its host
    /// gone) are ended as cancelled: their nodes are not held until a
    /// limit that may never come.
    fn silent_allocations(&mut self, now: u64) {
        let timeout = self.cfg.allocation_timeout;
        let mut silent = Vec::new();
        for id in self.jobs.running_ids() {
            let Some(j) = self.jobs.get(&id) else {
                continue;
            };
            if j.spec.kind() != super::packed::Kind::Allocation || j.state != JobState::Running {
                continue;
            }
            // Counted from its start, or from a restart.
            let seen = *self.allocation_seen.entry(id).or_insert(now);
            if now.saturating_sub(seen) > timeout {
                silent.push(id);
            }
        }
        self.allocation_seen.retain(|id, _| {
            self.jobs
                .get(id)
                .is_some_and(|j| j.state == JobState::Running)
        });
        for id in silent {
            tracing::warn!(job = %id, "salloc went silent; its allocation ends");
            if let Some(j) = self.jobs.get_mut(&id) {
                j.kill = Some(Kill::Cancelled);
                j.failure = Some(format!("salloc silent for over {timeout} s").into());
            }
            let grace = self.cfg.kill_wait * 1000;
            self.complete(now, id, grace);
            self.allocation_seen.remove(&id);
        }
    }

    /// `--signal`: running jobs within their signal's time of their limit
    /// are sent it, once per run.
    fn limit_signals(&mut self, now: u64) {
        for id in self.jobs.running_ids() {
            // The run's end by its limit, its own or its partition's.
            let due =
                self.jobs
                    .get(&id)
                    .is_some_and(|j| match (j.spec.limit_signal(), j.end_by.get()) {
                        // A suspended job's limit waits with it.
                        _ if j.suspended() => false,
                        (Some(ls), Some(end_by)) => {
                            !j.limit_signalled && now.saturating_add(u64::from(ls.before)) >= end_by
                        }
                        _ => false,
                    });
            if !due {
                continue;
            }
            if let Some(j) = self.jobs.get_mut(&id) {
                j.limit_signalled = true;
                if let Some(ls) = j.spec.limit_signal() {
                    j.send_signal(ls.signal, &mut self.outbox);
                }
            }
        }
    }

    /// With a store, a new job's script and environment go there (in the
    /// same transaction as its record) and leave memory: the server puts
    /// them back into its launches ([`crate::ctld::store::Payload`]).
    /// Taken from the spec before it is packed, so the packed spec never
    /// holds them.
    fn take_payload(&self, spec: &mut JobSpec) -> Option<crate::ctld::store::NewPayload> {
        self.cfg.state_dir.as_ref()?;
        let script = match &mut spec.kind {
            corral_proto::msg::JobKind::Batch { script, .. } => Some(std::mem::take(script)),
            corral_proto::msg::JobKind::Interactive { .. }
            | corral_proto::msg::JobKind::Allocation => None,
        };
        Some(crate::ctld::store::NewPayload::new(
            &std::mem::take(&mut spec.env),
            script,
        ))
    }

    /// Takes back a submission whose record could not be stored (its
    /// submitter was told so): it leaves the queue and the table, and
    /// the store deletes whatever of it a later commit wrote. Launches
    /// wait for the store, so none of it ran.
    pub fn withdraw(&mut self, id: JobId, now: u64) {
        let Some(j) = self.jobs.get(&id) else {
            return;
        };
        if j.state.is_final() {
            return;
        }
        let _ = self.sched.cancel(core_id(id));
        if let Some(j) = self.jobs.get_mut(&id) {
            // Whatever nodes it was given are told to let it go.
            j.release_nodes(None, &mut self.outbox);
            j.shed(&mut self.usage, &mut self.unfinished);
            j.accounted = true;
            j.end = super::Stamp::at(now);
        }
        self.jobs.remove(id, &mut self.usage);
        self.stats.submitted = self.stats.submitted.saturating_sub(1);
        self.dirty = true;
    }

    /// The first of `span` consecutive ids free for a new job (an array
    /// takes one for each of its tasks after its own): from the next id
    /// on, back to 1 once past `max_job_id` (Slurm's MaxJobId), skipping
    /// ids a job or an array's tasks still hold. How an id's old job ended
    /// is forgotten as it is given again.
    fn free_ids(&mut self, span: u64) -> Result<JobId, CtldError> {
        let max = self.cfg.limits.max_job_id.max(span);
        let first = self.next_job.max(1);
        let (mut start, mut wrapped) = (first, false);
        loop {
            if start + span - 1 > max {
                if wrapped {
                    return Err(CtldError::NoJobIds(max));
                }
                (start, wrapped) = (1, true);
                self.ids_wrapped = true;
            }
            if wrapped && start >= first {
                return Err(CtldError::NoJobIds(max));
            }
            if let Some(after) = self.ids_held(start, start + span) {
                start = after;
                continue;
            }
            // Once ids have wrapped, the core may still hold one (how an
            // old job ended, an array's book) though no record does; before,
            // every id from `next_job` on is new to it.
            if !self.ids_wrapped {
                return Ok(JobId(start));
            }
            let held = (start..start + span).rev().find(|&i| {
                let id = core_id(JobId(i));
                self.sched.forget_finished(id);
                self.sched.knows_job(id)
            });
            match held {
                Some(last) => start = last + 1,
                None => return Ok(JobId(start)),
            }
        }
    }

    /// Whether a record holds an id in `from..to` (an array's record holds
    /// its tasks' ids too); if so, the first id after what holds it.
    fn ids_held(&self, from: u64, to: u64) -> Option<u64> {
        for (id, r) in self.jobs.map.range(..JobId(to)).rev() {
            let end = id.0
                + 1
                + r.array.as_deref().map_or(0, |a| match a.task {
                    None => u64::from(a.tasks),
                    Some(_) => 0,
                });
            if id.0 >= from || end > from {
                return Some(end.max(id.0 + 1));
            }
            // A task's record: its array's, further down, may reach here.
            if r.array.as_deref().is_none_or(|a| a.task.is_none()) {
                return None;
            }
        }
        None
    }

    /// A job that names no account is its user's default's, as Slurm's
    /// default association makes it (`[accounts]`).
    fn default_account(&self, who: Ident, spec: &mut JobSpec) {
        if spec.account.as_deref().is_none_or(str::is_empty) {
            spec.account = self.cfg.accounts.default_for(who.uid).map(str::to_string);
        }
    }

    pub fn submit(&mut self, who: Ident, mut spec: JobSpec, now: u64) -> Result<JobId, Refusal> {
        self.clock = self.clock.max(now);
        let bytes = self.admit(who, &spec)?;
        self.admit_array(&mut spec)?;
        self.default_account(who, &mut spec);
        // Normalised once: everything after reads the value the job has.
        // (Left unset when not given: tasks see `SLURM_CPUS_PER_TASK`
        // only for `-c`, as Slurm's.)
        spec.cpus_per_task = spec.cpus_per_task.map(|c| c.max(1));
        let mut req = job_request(who, &spec);
        let tasks = spec.array.as_ref().map(|a| a.len());
        req.array = spec
            .array
            .as_ref()
            .map(|a| scheduler_core::ArrayRequest::new(a.len(), a.throttle));
        // An array's tasks take the ids after its own.
        let span = 1 + tasks.map_or(0, u64::from);
        let id = self.free_ids(span)?;
        let held = req.hold;
        self.sched
            .submit(now, core_id(id), req)
            .map_err(CtldError::Submit)?;
        let payload = self.take_payload(&mut spec);
        self.next_job = id.0 + span;
        self.stats.submitted += 1;
        // The core resolved the default partition; it says which.
        let partition = self
            .jobs
            .name(self.sched.job_partition(core_id(id)).unwrap_or_default());
        self.jobs.insert(
            id,
            JobRecord {
                id,
                user: who,
                spec: super::packed::PackedSpec::new(&spec),
                partition,
                submit: now,
                state: JobState::Pending,
                start: super::Stamp::NONE,
                end: super::Stamp::NONE,
                end_by: super::Stamp::NONE,
                exit: ExitStatus::default(),
                restarts: 0,
                failure: None,
                accounted: false,
                payload_stored: payload.is_some(),
                kept: false,
                bytes,
                run_part: None,
                array: tasks.map(|n| {
                    Box::new(super::ArrayPart {
                        job: id,
                        task: None,
                        waiting: vec![(0, n)],
                        ended: 0,
                        failed: false,
                        tasks: n,
                    })
                }),
            },
        );
        if let Some(p) = payload {
            self.payloads_out.push((id.0, Some(p)));
        }
        if spec.kill_on_invalid_dep {
            self.kill_on_invalid_dep.insert(id);
        }
        // Each of an array's tasks counts as a job.
        let weight = tasks.map_or(1, u64::from);
        let u = self.usage.entry(who.uid).or_default();
        u.jobs += weight;
        u.bytes += bytes;
        self.unfinished += weight;
        // A held job cannot start: no pass needed for it.
        self.dirty |= !held;
        Ok(id)
    }

    /// `--test-only`: admits the job as a submission would, then plans it
    /// on a copy of the scheduler; nothing changes. Says when and where
    /// it would start (its first task, for an array), or why it would not.
    pub fn test_only(
        &self,
        who: Ident,
        mut spec: JobSpec,
        now: u64,
    ) -> Result<corral_proto::msg::Response, Refusal> {
        use scheduler_core::JobStatus;
        self.admit(who, &spec)?;
        self.admit_array(&mut spec)?;
        self.default_account(who, &mut spec);
        spec.cpus_per_task = spec.cpus_per_task.map(|c| c.max(1));
        let mut req = job_request(who, &spec);
        req.array = spec
            .array
            .as_ref()
            .map(|a| scheduler_core::ArrayRequest::new(a.len(), a.throttle));
        let id = JobId(self.next_job);
        // A copy: its pass may start other jobs, which are not started.
        let mut sched = self.sched.clone();
        sched
            .submit(now, core_id(id), req)
            .map_err(CtldError::Submit)?;
        let partition = sched
            .job_partition(core_id(id))
            .unwrap_or_default()
            .to_string();
        let decisions = sched.schedule(now);
        let (start, nodes, cpus) = match decisions
            .iter()
            .find(|d| d.job == core_id(id) || d.array == Some(core_id(id)))
        {
            Some(d) => (
                now,
                d.nodes.iter().map(|a| a.node).collect::<Vec<_>>(),
                d.nodes.iter().map(|a| a.cpus.len() as u32).sum(),
            ),
            None => {
                let Some(plan) = sched.reservation(core_id(id)) else {
                    let why = match sched.job_status(core_id(id)) {
                        Some(JobStatus::Pending { reason, .. }) => reason.as_str(),
                        _ => "unknown",
                    };
                    return Err(CtldError::WouldNotStart(why.to_string()));
                };
                (
                    plan.start,
                    plan.nodes.iter().map(|n| n.node).collect(),
                    plan.nodes.iter().map(|n| n.cpus).sum(),
                )
            }
        };
        let mut names: Vec<String> = nodes.into_iter().map(|n| self.node_name(n)).collect();
        names.sort_by(|a, b| super::natural(a, b));
        Ok(corral_proto::msg::Response::WouldStart {
            job: id,
            start,
            nodes: names,
            cpus,
            partition,
        })
    }

    /// Cancels (or signals) jobs. Jobs named by id that do not exist or
    /// belong to someone else are refused before anything is done; jobs of
    /// others that a filter selects are refused one by one, after the
    /// caller's own are cancelled, as Slurm's scancel reports them.
    pub fn cancel(
        &mut self,
        who: Ident,
        f: &JobFilter,
        signal: Option<SendSignal>,
        now: u64,
    ) -> Result<Vec<JobId>, Refusal> {
        let mut sel = Selector::new(f.clone())?;
        let privileged = self.privileged(who);
        // A job that ended, or that the controller no longer knows, is
        // left alone without a word, as Slurm 22.05's scancel does (exit
        // 0: clean-up traps under `set -e` rely on it).
        for id in &f.ids {
            let Some(j) = self.jobs.get(id) else {
                continue;
            };
            if j.user.uid != who.uid && !privileged {
                return Err(CtldError::Kill {
                    job: *id,
                    why: KillRefusal::AccessDenied,
                });
            }
        }
        self.resolve_arrays(&mut sel)?;
        for (array, _) in &f.tasks {
            let j = self.jobs.get(array).ok_or(CtldError::UnknownJob(*array))?;
            if j.user.uid != who.uid && !privileged {
                return Err(CtldError::Kill {
                    job: *array,
                    why: KillRefusal::AccessDenied,
                });
            }
        }
        let selected: Vec<JobId> = self
            .jobs
            .values()
            .filter(|j| {
                !j.state.is_final()
                    && !j.spent_array()
                    && sel.matches(j.id, j.user.uid, j.shown_state(), &j.partition, || {
                        j.spec.read().name
                    })
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
            // An array's tasks still waiting: all of them, or those named.
            if let Some(a) = j.array.as_deref().filter(|a| a.task.is_none()) {
                if signal.is_some() {
                    continue;
                }
                // Each waiting task cancelled gets its accounting record,
                // as it would had it started.
                let waiting = a.waiting.iter().flat_map(|&(from, to)| from..to);
                let cancelled: Vec<u32> = match sel.only.get(&id) {
                    Some(named) => waiting.filter(|p| named.contains(p)).collect(),
                    None => waiting.collect(),
                };
                self.account_cancelled_tasks(id, &cancelled, who, now);
                match sel.only.get(&id) {
                    Some(positions) => {
                        for &p in positions {
                            let _ = self.sched.cancel_array_task(core_id(id), p);
                        }
                    }
                    None => {
                        let _ = self.sched.cancel(core_id(id));
                    }
                }
                self.sync_array(id);
                self.dirty = true;
                done.push(id);
                continue;
            }
            if let Some(sig) = signal {
                if j.state == JobState::Running {
                    j.send_signal(sig, &mut self.outbox);
                    done.push(id);
                }
                continue;
            }
            match j.state {
                JobState::Pending => {
                    let _ = self.sched.cancel(core_id(id));
                    if let Some(j) = self.jobs.get_mut(&id) {
                        j.state = JobState::Cancelled;
                        j.cancelled_by = Some(who.uid);
                        j.end = super::Stamp::at(now);
                        j.shed(&mut self.usage, &mut self.unfinished);
                    }
                    self.stats.finished += 1;
                    self.dirty = true;
                }
                JobState::Running => {
                    if let Some(j) = self.jobs.get_mut(&id) {
                        j.kill = Some(Kill::Cancelled);
                        j.cancelled_by = Some(who.uid);
                    }
                    let grace = self.cfg.kill_wait * 1000;
                    self.complete(now, id, grace);
                }
                _ => continue,
            }
            done.push(id);
        }
        if !denied.is_empty() {
            return Err(CtldError::KillDenied(denied));
        }
        Ok(done)
    }

    /// Accounting records for an array's tasks cancelled while they
    /// waited (`positions` in the array): never started, each is the
    /// array's record under the task's own id and index.
    fn account_cancelled_tasks(&mut self, array: JobId, positions: &[u32], who: Ident, now: u64) {
        if !self.accounting() || positions.is_empty() {
            return;
        }
        let Some(j) = self.jobs.get(&array) else {
            return;
        };
        let spec = j.spec().array;
        let mut base = j.acct(now);
        base.state = JobState::Cancelled;
        base.cancelled_by = Some(who.uid);
        base.end = Some(now);
        base.steps.clear();
        for &p in positions {
            let Some(index) = spec.as_ref().and_then(|s| s.index(p)) else {
                continue;
            };
            let mut r = base.clone();
            r.id = JobId(array.0 + 1 + u64::from(p));
            r.array = Some((array, index));
            self.account(r);
        }
    }

    /// Holds (`release == false`) or releases jobs.
    pub fn hold(
        &mut self,
        who: Ident,
        ids: &[JobId],
        release: bool,
    ) -> Result<Vec<JobId>, Refusal> {
        self.hold_as(who, ids, release, false)
    }

    /// `scontrol update JobId=…`: a pending job's request changes, checked
    /// as a submission is (the core checks the shape and the partition);
    /// it keeps its id, its age and its hold. Its owner may lower its time
    /// limit and raise its nice; an operator may do anything.
    pub fn update_job(&mut self, who: Ident, id: JobId, ch: &JobChanges) -> Result<(), Refusal> {
        let privileged = self.privileged(who);
        let j = self.jobs.get(&id).ok_or(CtldError::UnknownJob(id))?;
        if j.user.uid != who.uid && !privileged {
            return Err(CtldError::NotYourJob(id));
        }
        if let Some(by) = ch.time_limit_by {
            // Relative to the limit the job has now, as Slurm's.
            let limit = match j.spec().time_limit {
                None => None,
                Some(t) => {
                    let t = i64::try_from(t).unwrap_or(i64::MAX).saturating_add(by);
                    if t < 60 {
                        return Err(CtldError::UpdateDenied(
                            id,
                            "the time limit would fall below one minute",
                        ));
                    }
                    Some(t as u64)
                }
            };
            let ch = JobChanges {
                time_limit: Some(limit),
                time_limit_by: None,
                ..ch.clone()
            };
            return self.update_job(who, id, &ch);
        }
        let only_limit = ch.time_limit.is_some()
            && *ch
                == JobChanges {
                    time_limit: ch.time_limit,
                    ..JobChanges::default()
                };
        if j.state == JobState::Running && only_limit {
            return self.update_running_limit(who, id, ch.time_limit.flatten());
        }
        // An array's record of waiting tasks is not updated whole; a task
        // split off it is (`scontrol update JobId=12_3`).
        let task = j.array.as_deref().is_some_and(|a| a.task.is_some());
        if j.state != JobState::Pending || (j.array.is_some() && !task) {
            return Err(CtldError::NoLongerPending(id));
        }
        let mut spec = j.spec();
        if let Some(limit) = ch.time_limit {
            limit_change_allowed(id, spec.time_limit, limit, privileged)?;
            spec.time_limit = limit;
        }
        if let Some(nice) = ch.nice {
            if nice < 0 && !privileged {
                return Err(CtldError::UpdateDenied(
                    id,
                    "only an operator may set a negative nice",
                ));
            }
            if nice.unsigned_abs() > super::MAX_NICE {
                return Err(CtldError::NiceOutOfRange);
            }
            spec.nice = nice;
        }
        if let Some(n) = &ch.name {
            super::admission::text("job name", n, self.cfg.limits.max_text_len)?;
            spec.name = n.clone();
        }
        if let Some(c) = &ch.comment {
            super::admission::text("comment", c, self.cfg.limits.max_text_len)?;
            spec.comment = (!c.is_empty()).then(|| c.clone());
        }
        if let Some(p) = &ch.partition {
            super::admission::text(
                "partition, QOS or account name",
                p,
                self.cfg.limits.max_text_len,
            )?;
            spec.partition = Some(p.clone());
        }
        if let Some(n) = ch.nodes {
            // Slurm 22.05: a job given -N may not grow past it (its most
            // nodes) unless the update names a larger most; one given
            // none grows, its tasks with it.
            if ch.nodes_max.or(spec.nodes).is_some_and(|most| n > most) {
                return Err(CtldError::NodeCountInvalid(id));
            }
            if spec.nodes.is_none() && spec.ntasks_per_node.is_none() {
                spec.ntasks = spec.ntasks.map(|t| t.max(n));
            }
            spec.nodes = Some(n);
        }
        if let Some((deps, any)) = &ch.dependency {
            spec.dependencies = deps.clone();
            spec.dependency_any = *any;
        }
        if let Some(begin) = ch.begin {
            spec.begin = begin;
        }
        // A longer name or comment counts against its owner's bytes, as at
        // submit.
        let (old_bytes, new_bytes) = (j.bytes, super::admission::spec_bytes(&spec));
        let owner = j.user.uid;
        let used = self.usage.get(&owner).copied().unwrap_or_default();
        let max = self.cfg.limits.max_bytes_per_user;
        let total = used
            .bytes
            .saturating_add(used.kept)
            .saturating_sub(old_bytes)
            .saturating_add(new_bytes);
        if new_bytes > old_bytes && !privileged && total > max {
            return Err(CtldError::UserByteLimit { bytes: total, max });
        }
        self.admit_array(&mut spec)?;
        let mut req = super::wire::job_request(j.user, &spec);
        if task {
            req.array = None;
        }
        self.sched.update(core_id(id), req)?;
        let partition = self
            .jobs
            .name(self.sched.job_partition(core_id(id)).unwrap_or_default());
        if let Some(j) = self.jobs.get_mut(&id) {
            j.spec = super::packed::PackedSpec::new(&spec);
            j.partition = partition;
            j.bytes = new_bytes;
        }
        if let Some(u) = self.usage.get_mut(&owner) {
            u.bytes = u.bytes.saturating_sub(old_bytes).saturating_add(new_bytes);
        }
        self.dirty = true;
        Ok(())
    }

    /// A running job's time limit changes: its owner may shorten it, an
    /// operator also lengthen it; its end moves (a limit already passed
    /// ends it at the next tick, as TIMEOUT), and a `--signal` before the
    /// new end is sent again.
    fn update_running_limit(
        &mut self,
        who: Ident,
        id: JobId,
        limit: Option<u64>,
    ) -> Result<(), Refusal> {
        let privileged = self.privileged(who);
        let j = self.jobs.get(&id).ok_or(CtldError::UnknownJob(id))?;
        let longer = limit_change_allowed(id, j.spec().time_limit, limit, privileged)?;
        let end = self
            .sched
            .set_running_limit(core_id(id), limit)
            .map_err(CtldError::Control)?;
        if let Some(j) = self.jobs.get_mut(&id) {
            j.spec_mut().time_limit = limit;
            j.end_by = (end < scheduler_core::INFINITE).then_some(end).into();
            if longer {
                j.limit_signalled = false;
            }
        }
        self.dirty = true;
        Ok(())
    }

    /// `scontrol top`: the jobs named go first among their owner's waiting
    /// jobs of the same partition, account and QOS, in the order named, by
    /// nice values alone: each named job's nice drops until its priority
    /// (as the last pass ranked it) is above every such peer's and below
    /// the named job before it. The peers are left as they are. Operators
    /// only, as Slurm's default (`enable_user_top` unset).
    pub fn top(&mut self, who: Ident, ids: &[JobId]) -> Result<Vec<JobId>, Refusal> {
        if !self.privileged(who) {
            return Err(CtldError::AccessDenied);
        }
        if ids.len() > super::MAX_FILTER_ENTRIES {
            return Err(CtldError::FilterTooLarge {
                what: "job ids",
                count: ids.len(),
            });
        }
        let priority = |c: &Controller, id: JobId| match c.sched.job_status(core_id(id)) {
            Some(scheduler_core::JobStatus::Pending { priority, .. }) => Some(priority),
            _ => None,
        };
        for &id in ids {
            let j = self.jobs.get(&id).ok_or(CtldError::UnknownJob(id))?;
            if j.state != JobState::Pending || j.array.is_some() {
                return Err(CtldError::NoLongerPending(id));
            }
        }
        let Some(first) = ids.first().and_then(|id| self.jobs.get(id)) else {
            return Ok(Vec::new());
        };
        let first_spec = first.spec();
        let key = (first.user.uid, first.partition.clone());
        let ask = (first_spec.account, first_spec.qos);
        // The cheap fields first; a spec is decoded only for a job of the
        // same user and partition, and once.
        let same = |j: &JobRecord| {
            (j.user.uid, &j.partition) == (key.0, &key.1) && {
                let spec = j.spec();
                (spec.account, spec.qos) == ask
            }
        };
        let peers_max = self
            .jobs
            .values()
            .filter(|j| j.state == JobState::Pending && same(j) && !ids.contains(&j.id))
            .filter_map(|j| priority(self, j.id))
            .max()
            .unwrap_or(i64::MIN / 2);
        let mut moved = Vec::new();
        let n = ids.len() as i64;
        for (i, &id) in ids.iter().enumerate() {
            let Some(j) = self.jobs.get(&id) else {
                continue;
            };
            if !same(j) {
                continue;
            }
            let now_priority = priority(self, id).unwrap_or(0);
            let target = peers_max.saturating_add(n - i as i64);
            if now_priority >= target {
                continue;
            }
            let mut spec = j.spec();
            let lower = (target - now_priority).min(i64::from(i32::MAX));
            spec.nice = (i64::from(spec.nice) - lower).max(-i64::from(super::MAX_NICE)) as i32;
            let req = super::wire::job_request(j.user, &spec);
            self.sched.update(core_id(id), req)?;
            if let Some(j) = self.jobs.get_mut(&id) {
                j.spec = super::packed::PackedSpec::new(&spec);
            }
            moved.push(id);
        }
        self.dirty = true;
        Ok(moved)
    }

    /// `scontrol uhold`: a hold the job's owner may release, whoever sets
    /// it (`JobHeldUser`).
    pub fn user_hold(&mut self, who: Ident, ids: &[JobId]) -> Result<Vec<JobId>, Refusal> {
        self.hold_as(who, ids, false, true)
    }

    fn hold_as(
        &mut self,
        who: Ident,
        ids: &[JobId],
        release: bool,
        as_user: bool,
    ) -> Result<Vec<JobId>, Refusal> {
        let privileged = self.privileged(who);
        let kind = if privileged && !as_user {
            HoldKind::Admin
        } else {
            HoldKind::User
        };
        for id in ids {
            let j = self.jobs.get(id).ok_or(CtldError::UnknownJob(*id))?;
            if j.user.uid != who.uid && !privileged {
                return Err(CtldError::NotYourJob(*id));
            }
        }
        for id in ids {
            // A job a restarting controller has not queued again yet
            // takes the change when it is.
            let later = self.requeue_after_recovery.contains(id);
            let r = if later {
                Ok(())
            } else if release {
                self.sched.release(core_id(*id), kind)
            } else {
                self.sched.hold(core_id(*id), kind)
            };
            r.map_err(CtldError::Control)?;
            // Kept with the job, so a restarted controller holds it (or
            // not) as it was.
            if let Some(j) = self.jobs.get_mut(id) {
                j.spec_mut().hold = !release;
            }
        }
        self.dirty = true;
        Ok(ids.to_vec())
    }

    /// `scontrol requeue` (`requeuehold` with `hold`): each running batch
    /// job is ended as a cancel ends it (its steps signalled, then killed
    /// after `kill_wait`); once its nodes are clean it waits again, for a
    /// new run after `requeue_delay` ([`Kill::Requeue`]). Every job is
    /// checked before any is touched.
    pub fn requeue(
        &mut self,
        who: Ident,
        ids: &[JobId],
        hold: bool,
        now: u64,
    ) -> Result<Vec<JobId>, Refusal> {
        let ids = id_set(ids)?;
        let privileged = self.privileged(who);
        for id in &ids {
            let j = self.jobs.get(id).ok_or(CtldError::UnknownJob(*id))?;
            if j.user.uid != who.uid && !privileged {
                return Err(CtldError::NotYourJob(*id));
            }
            let why = match j.state {
                _ if j.spec.kind() != super::packed::Kind::Batch => Some(RequeueRefusal::NotBatch),
                _ if !j.spec().requeue => Some(RequeueRefusal::NotRequeueable),
                JobState::Pending => Some(RequeueRefusal::Pending),
                JobState::Running => None,
                JobState::Completing => Some(RequeueRefusal::Completing),
                _ => Some(RequeueRefusal::Finished),
            };
            if let Some(why) = why {
                return Err(CtldError::Requeue { job: *id, why });
            }
        }
        for &id in &ids {
            if let Some(j) = self.jobs.get_mut(&id) {
                // A suspended job requeued waits held, as Slurm's.
                j.kill = Some(Kill::Requeue {
                    hold: hold || j.suspended(),
                    by_operator: privileged,
                });
            }
            let grace = self.cfg.kill_wait * 1000;
            self.complete(now, id, grace);
        }
        Ok(ids)
    }
}

impl Controller {
    /// `scontrol suspend` (or `resume`): running jobs' processes stop on
    /// every node (or go on), and their time limits stop counting while
    /// they are stopped. They keep their CPUs, memory and GPUs (a stopped
    /// process still holds its GPU memory). Operators only, as Slurm's;
    /// every job is checked before any changes. Suspending a suspended
    /// job changes nothing, as Slurm's.
    pub fn suspend(
        &mut self,
        who: Ident,
        ids: &[JobId],
        resume: bool,
        now: u64,
    ) -> Result<Vec<JobId>, Refusal> {
        let ids = id_set(ids)?;
        let privileged = self.privileged(who);
        for id in &ids {
            let j = self.jobs.get(id).ok_or(CtldError::UnknownJob(*id))?;
            if !privileged {
                return Err(CtldError::NotYourJob(*id));
            }
            let why = match j.state {
                JobState::Pending => Some(SuspendRefusal::Pending),
                JobState::Running if resume && !j.suspended() => Some(SuspendRefusal::NotSuspended),
                JobState::Running => None,
                _ => Some(SuspendRefusal::Finished),
            };
            if let Some(why) = why {
                return Err(CtldError::Suspend { job: *id, why });
            }
        }
        for &id in &ids {
            let Some(j) = self.jobs.get(&id) else {
                continue;
            };
            if j.suspended() != resume {
                continue; // already as asked
            }
            let core = if resume {
                self.sched.resume(now, core_id(id)).map(Some)
            } else {
                self.sched.suspend(now, core_id(id)).map(|()| None)
            };
            let end = core.map_err(CtldError::Control)?;
            let Some(j) = self.jobs.get_mut(&id) else {
                continue;
            };
            let run_secs = now
                .saturating_sub(j.start.get().unwrap_or(now))
                .saturating_sub(j.suspension.map_or(0, |s| s.paused));
            let s = j.suspension.get_or_insert_with(Suspension::default);
            s.changed = now;
            if resume {
                let since = s.since.take().unwrap_or(now);
                s.paused = s.paused.saturating_add(now.saturating_sub(since));
            } else {
                s.since = Some(now);
                s.pre_suspend = run_secs;
            }
            if let Some(end) = end {
                j.end_by = (end < scheduler_core::INFINITE).then_some(end).into();
            }
            let run = j.run();
            for (n, _) in &j.alloc {
                self.outbox.push((
                    n.clone(),
                    CtldMsg::Suspend {
                        job: run,
                        stop: !resume,
                    },
                ));
            }
        }
        self.dirty = true;
        Ok(ids)
    }
}

/// A request's job ids, bounded (a hostile list is refused before any job
/// is looked at), in order, each once.
fn id_set(ids: &[JobId]) -> Result<Vec<JobId>, Refusal> {
    if ids.len() > super::MAX_FILTER_ENTRIES {
        return Err(CtldError::FilterTooLarge {
            what: "job ids",
            count: ids.len(),
        });
    }
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

/// Whether a new time limit lengthens the old (`None`: unlimited), and
/// whether who asks may: only an operator lengthens one.
fn limit_change_allowed(
    id: JobId,
    old: Option<u64>,
    new: Option<u64>,
    privileged: bool,
) -> Result<bool, Refusal> {
    let longer = match (new, old) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(new), Some(old)) => new > old,
    };
    if longer && !privileged {
        return Err(CtldError::UpdateDenied(
            id,
            "only an operator may lengthen a time limit",
        ));
    }
    Ok(longer)
}
