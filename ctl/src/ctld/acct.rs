//! Accounting: the record each run of a job leaves when it ends (its
//! steps with it), made here without I/O. The server writes them to the
//! store in the same transaction as the job's final state, then to the
//! accounting database ([`super::acctdb`]); `sacct` reads them back.

use std::collections::HashSet;

use corral_proto::msg::{
    AcctJob, AcctQuery, AcctStep, ExitStatus, GpuAsk, Ident, JobId, JobReason, JobState, StepId,
};

use super::{Controller, JobRecord};

/// One step of a job's current run, as accounting will record it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct StepTrack {
    pub id: StepId,
    pub name: String,
    pub nodes: Vec<String>,
    /// Nodes still running their part.
    pub left: Vec<String>,
    pub tasks: u32,
    pub cpus: u32,
    pub start: u64,
    pub end: Option<u64>,
    pub exit: ExitStatus,
}

/// Steps of one run accounted one by one; later ones are not (a loop of
/// a million `srun`s must not grow the job's record without bound).
pub const MAX_STEPS: usize = 1024;

/// The name sacct shows for a step: `batch`, or the program's file name.
pub(super) fn step_name(argv: &[String]) -> String {
    argv.first()
        .map(|a| a.rsplit('/').next().unwrap_or(a).to_string())
        .unwrap_or_default()
}

/// How Slurm's accounting records a step the OOM killer ended (`0:125`;
/// no real signal has that number).
pub(super) const OOM_EXIT: ExitStatus = ExitStatus {
    code: 0,
    signal: Some(125),
};

/// An exit as Slurm records it: a signal's death is `0:SIG`, not the
/// shell's `128+SIG`.
fn recorded(e: ExitStatus) -> ExitStatus {
    match e.signal {
        Some(sig) => ExitStatus {
            code: 0,
            signal: Some(sig),
        },
        None => e,
    }
}

/// Why a finished job ended as it did.
pub(super) fn final_reason(state: JobState, failure: bool) -> JobReason {
    match (state, failure) {
        (JobState::Failed, true) => JobReason::JobLaunchFailure,
        (JobState::Failed, false) | (JobState::OutOfMemory, _) => JobReason::NonZeroExitCode,
        (JobState::NodeFail, _) => JobReason::NodeDown,
        (JobState::Timeout, _) => JobReason::TimeLimit,
        _ => JobReason::None,
    }
}

impl JobRecord {
    /// A step of the current run started on `nodes` (the job's first).
    pub(super) fn step_started(
        &mut self,
        id: StepId,
        name: String,
        nodes: usize,
        tasks: u32,
        now: u64,
    ) {
        if self.steps.len() >= MAX_STEPS {
            return;
        }
        let on: Vec<String> = self
            .alloc
            .iter()
            .take(nodes)
            .map(|(n, _)| n.clone())
            .collect();
        let cpus = self
            .alloc
            .iter()
            .take(nodes)
            .map(|(_, a)| a.cpus.len() as u32)
            .sum();
        self.steps.push(StepTrack {
            id,
            name,
            left: on.clone(),
            nodes: on,
            tasks,
            cpus,
            start: now,
            end: None,
            exit: ExitStatus::default(),
        });
    }

    /// `node`'s part of a step of the current run exited.
    pub(super) fn step_part_exited(&mut self, id: StepId, node: &str, exit: ExitStatus, now: u64) {
        let Some(s) = self.steps.iter_mut().find(|s| s.id == id) else {
            return;
        };
        let before = s.left.len();
        s.left.retain(|n| n != node);
        if s.left.len() == before {
            return;
        }
        if exit.code > s.exit.code || (s.exit.signal.is_none() && exit.signal.is_some()) {
            s.exit = exit;
        }
        if s.left.is_empty() {
            s.end = Some(now);
        }
    }

    /// The current run as accounting records it (now, whatever its state).
    pub(super) fn acct(&self, now: u64) -> AcctJob {
        let spec = self.spec();
        let running = !self.alloc.is_empty();
        let req_tasks = spec.ntasks.unwrap_or(spec.nodes.unwrap_or(1));
        let req_nodes = spec.nodes.unwrap_or(1);
        let req_gpus = match spec.gpus {
            GpuAsk::None => 0,
            GpuAsk::PerNode(g) => g * req_nodes,
            GpuAsk::PerTask(g) => g * req_tasks,
            GpuAsk::Total(g) => g,
        };
        let req_cpus = req_tasks * spec.cpus_per_task.unwrap_or(1);
        let (alloc_nodes, alloc_cpus, alloc_gpus, alloc_mem) = if running {
            self.alloc
                .iter()
                .fold((0, 0, 0, 0), |(n, c, g, m), (_, a)| {
                    (
                        n + 1,
                        c + a.cpus.len() as u32,
                        g + a.gpus.len() as u32,
                        m + a.memory_mb,
                    )
                })
        } else {
            (0, 0, 0, 0)
        };
        let names: Vec<&str> = self.alloc.iter().map(|(n, _)| n.as_str()).collect();
        let end = self.end.get();
        let steps = self
            .steps
            .iter()
            .map(|s| {
                // A step the job's end cut short (or killed) is
                // CANCELLED, as Slurm 22.05's slurmdbd records it for a
                // job cancelled, timed out, requeued or lost with its
                // node (checked on one); one the OOM killer ended, so.
                let cut_by = match self.state {
                    JobState::Cancelled
                    | JobState::Timeout
                    | JobState::NodeFail
                    | JobState::Requeued => Some(JobState::Cancelled),
                    JobState::OutOfMemory => Some(JobState::OutOfMemory),
                    _ => None,
                };
                let state = match (s.end, cut_by) {
                    (Some(_), _) if s.exit.success() => JobState::Completed,
                    (Some(_), _) if s.exit == OOM_EXIT => JobState::OutOfMemory,
                    (None, _) if !self.state.is_final() => JobState::Running,
                    (_, Some(state)) => state,
                    (Some(_), None) => JobState::Failed,
                    (None, None) => JobState::Cancelled,
                };
                AcctStep {
                    step: s.id,
                    name: s.name.clone(),
                    nodelist: scheduler_core::hostlist::compress_sorted(&s.nodes),
                    nodes: s.nodes.len() as u32,
                    tasks: s.tasks,
                    cpus: s.cpus,
                    start: s.start,
                    end: s.end.or(if self.state.is_final() { end } else { None }),
                    state,
                    exit: recorded(s.exit),
                }
            })
            .collect();
        let steps: Vec<AcctStep> = steps;
        AcctJob {
            id: self.id,
            run: self.restarts,
            name: spec.name.clone(),
            user: self.user,
            account: spec.account.clone().unwrap_or_default(),
            partition: self.partition.to_string(),
            nodelist: scheduler_core::hostlist::compress_sorted(&names),
            alloc_nodes,
            alloc_cpus,
            alloc_gpus,
            alloc_mem_mb: alloc_mem,
            req_nodes,
            req_cpus,
            req_mem_mb: spec.mem_mb.unwrap_or(0),
            req_gpus,
            submit: self.submit,
            eligible: spec.begin.unwrap_or(self.submit).max(self.submit),
            start: self.start.get(),
            end: if self.state.is_final() {
                end.or(Some(now))
            } else {
                None
            },
            time_limit: spec.time_limit.or_else(|| {
                self.end_by
                    .get()
                    .zip(self.start.get())
                    .map(|(e, s)| e.saturating_sub(s))
            }),
            // A job whose end is decided while its nodes clean up shows
            // that end, as Slurm's sacct shows CANCELLED for a cancelled
            // job still completing (squeue shows CG).
            state: match (self.state, self.kill.as_ref()) {
                (JobState::Completing, Some(super::Kill::Cancelled)) => JobState::Cancelled,
                (JobState::Completing, Some(super::Kill::Timeout)) => JobState::Timeout,
                _ => self.shown_state(),
            },
            // Slurm's sacct shows why a job last waited, not why it
            // ended: None for one that started at once (checked on
            // 22.05: a FAILED job reads None there, though scontrol says
            // NonZeroExitCode).
            reason: match (self.start.get(), &self.failure) {
                (Some(_), None) => JobReason::None,
                _ => final_reason(self.state, self.failure.is_some()),
            },
            // A job ended before its first step reported takes the
            // step's death as its own (a cancelled job's `0:15`).
            // A cancelled job's line shows 0:0 (its batch step the
            // signal), as Slurm's slurmdbd records it; a job ended before
            // its first step reported otherwise takes the step's death.
            exit: recorded(
                match self.steps.iter().find(|s| s.id == self.primary_step()) {
                    // Slurm's job line reads 0:0 also for a job that timed
                    // out, was requeued or lost its node (checked on one).
                    _ if matches!(
                        self.state,
                        JobState::Cancelled
                            | JobState::Timeout
                            | JobState::NodeFail
                            | JobState::Requeued
                    ) || matches!(
                        self.kill.as_ref(),
                        Some(super::Kill::Cancelled | super::Kill::Timeout)
                    ) =>
                    {
                        ExitStatus::default()
                    }
                    Some(s) if self.exit == ExitStatus::default() && self.state.is_final() => {
                        s.exit
                    }
                    _ => self.exit,
                },
            ),
            cancelled_by: self.cancelled_by,
            usage: self.used,
            work_dir: spec.work_dir.clone(),
            comment: spec.comment.clone().unwrap_or_default(),
            wckey: spec.wckey.clone().unwrap_or_default(),
            steps,
            array: self
                .array
                .as_deref()
                .and_then(|a| a.task.map(|t| (a.job, t))),
        }
    }
}

/// Whether a record answers a query whose users are already resolved
/// (`users` empty: anyone's). The SQL in [`super::acctdb`] asks the same.
pub fn matches(q: &AcctQuery, users: &[u32], j: &AcctJob) -> bool {
    (q.ids.is_empty() || q.ids.contains(&j.id) || j.array.is_some_and(|(a, _)| q.ids.contains(&a)))
        && (users.is_empty() || users.contains(&j.user.uid))
        && (q.states.is_empty() || q.states.contains(&j.state))
        && j.id > q.after
        && q.end.is_none_or(|e| j.eligible <= e)
        && q.start.is_none_or(|s| j.end.is_none_or(|end| end >= s))
}

/// Only the last run of each job, unless `duplicates` (sacct's `-D`);
/// sorted by job id and run.
pub fn last_runs(mut jobs: Vec<AcctJob>, duplicates: bool) -> Vec<AcctJob> {
    jobs.sort_by_key(|j| (j.id, j.run));
    // Later sources came later in the list: the same run twice keeps the
    // last copy.
    jobs.dedup_by(|later, earlier| {
        if later.id == earlier.id && later.run == earlier.run {
            std::mem::swap(later, earlier);
            true
        } else {
            false
        }
    });
    if !duplicates {
        let mut seen: HashSet<JobId> = HashSet::new();
        jobs.reverse();
        jobs.retain(|j| seen.insert(j.id));
        jobs.reverse();
    }
    jobs
}

impl Controller {
    /// Whether runs are recorded for accounting.
    pub(super) fn accounting(&self) -> bool {
        self.cfg.accounting.is_some()
    }

    /// Queues a run's record for accounting.
    pub(super) fn account(&mut self, rec: AcctJob) {
        if self.accounting() {
            self.acct_out.push(rec);
        }
    }

    /// Records for the jobs among `ids` that have ended since their last
    /// record; they are marked so (and stored so, with their record).
    pub(super) fn account_ended(&mut self, ids: &[JobId]) {
        if !self.accounting() {
            return;
        }
        for id in ids {
            let Some(j) = self.jobs.get_mut_unstored(id) else {
                continue;
            };
            if j.state.is_final() && !j.accounted {
                j.accounted = true;
                let rec = j.acct(j.end.get().unwrap_or(j.submit));
                self.acct_out.push(rec);
            }
        }
    }

    /// The records queued since the last call.
    pub fn take_acct(&mut self) -> Vec<AcctJob> {
        std::mem::take(&mut self.acct_out)
    }

    /// Whose records `who` may read for `q`: empty for everyone's, `None`
    /// for no one's.
    pub fn acct_users(&self, q: &AcctQuery, who: Ident) -> Option<Vec<u32>> {
        let privileged = self.privileged(who);
        let private = self.cfg.accounting.as_ref().is_none_or(|a| a.private);
        if private && !privileged {
            // `-u` naming only others: none of theirs, and not the
            // caller's own either (Slurm's private data shows nothing).
            if !q.users.is_empty() && !q.users.contains(&who.uid) {
                return None;
            }
            return Some(vec![who.uid]);
        }
        if !q.users.is_empty() {
            return Some(q.users.clone());
        }
        Some(if q.all_users || who.uid == 0 {
            Vec::new()
        } else {
            vec![who.uid]
        })
    }

    /// The jobs the controller still holds that answer `q`: pending and
    /// running ones (which accounting has no record of yet) and finished
    /// ones still shown by squeue.
    pub fn acct_live(&self, q: &AcctQuery, users: &[u32], now: u64) -> Vec<AcctJob> {
        // In id order from the page's start; the cheap filters come before
        // a record is built, and no more than a page is built (this runs
        // under the controller's lock).
        let from = JobId(q.after.0.saturating_add(1));
        let candidates: Box<dyn Iterator<Item = &JobRecord>> = if q.ids.is_empty() {
            Box::new(self.jobs.range(from..).map(|(_, j)| j))
        } else {
            // An array's id names its tasks too (ids after its own).
            let mut ids: std::collections::BTreeSet<JobId> = q.ids.iter().copied().collect();
            for id in &q.ids {
                let Some(n) = self.jobs.get(id).and_then(|j| j.spec().array) else {
                    continue;
                };
                let last = JobId(id.0 + u64::from(n.len()));
                ids.extend(
                    self.jobs
                        .range(JobId(id.0 + 1)..=last)
                        .filter(|(_, t)| t.array_id() == Some(*id))
                        .map(|(t, _)| *t),
                );
            }
            Box::new(
                ids.into_iter()
                    .filter(move |id| *id >= from)
                    .filter_map(|id| self.jobs.get(&id)),
            )
        };
        candidates
            // An array's own record is no job: its tasks are.
            .filter(|j| j.array.as_deref().is_none_or(|a| a.task.is_some()))
            .filter(|j| users.is_empty() || users.contains(&j.user.uid))
            .filter(|j| q.states.is_empty() || q.states.contains(&j.state))
            .map(|j| {
                let mut a = j.acct(now);
                if j.state == JobState::Pending {
                    a.reason = self.view(j, false, now).reason;
                }
                a
            })
            .filter(|a| matches(q, users, a))
            .take(corral_proto::msg::ACCT_PER_PAGE + 1)
            .collect()
    }
}

/// Bytes of records one `sacct` answer carries: half a frame, so the
/// answer (and the agent's relay of it) stays well inside one.
pub const ACCT_PAGE_BYTES: usize = (corral_proto::MAX_FRAME / 2) as usize;

/// One answer's page of `jobs` (ascending by id, a job's runs together),
/// at most [`corral_proto::msg::ACCT_PER_PAGE`] records and
/// [`ACCT_PAGE_BYTES`] bytes, never splitting a job's runs; `next` is
/// where the next page starts (ids above it), as the database's page
/// said or as this cut. A job whose runs alone are larger than a page is
/// an error that names it.
pub fn page(
    mut jobs: Vec<AcctJob>,
    mut next: Option<JobId>,
) -> Result<(Vec<AcctJob>, Option<JobId>), String> {
    use corral_proto::msg::ACCT_PER_PAGE;
    let mut total = 0usize;
    let mut cut = None;
    for (i, j) in jobs.iter().enumerate() {
        total = total.saturating_add(corral_proto::frame::encoded_len(j));
        if i >= ACCT_PER_PAGE || total > ACCT_PAGE_BYTES {
            cut = Some(i);
            break;
        }
    }
    if let Some(i) = cut {
        let id = jobs[i].id;
        let keep = jobs.iter().position(|j| j.id == id).unwrap_or(i);
        if keep == 0 {
            // One job's runs fill the page alone: by rows, the rest of
            // its runs come next; by bytes, it cannot be carried.
            if total <= ACCT_PAGE_BYTES {
                jobs.truncate(ACCT_PER_PAGE);
                return Ok((jobs, Some(id)));
            }
            return Err(format!(
                "job {id}'s accounting records take more than the {ACCT_PAGE_BYTES} bytes one answer carries; leave it out with -j"
            ));
        }
        jobs.truncate(keep);
        next = Some(JobId(id.0 - 1));
    }
    Ok((jobs, next))
}
