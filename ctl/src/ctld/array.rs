//! Job arrays in the controller: an array is one record until its tasks
//! start ([`ArrayPart`]); the core splits each task off as it starts
//! (`StartDecision::array`), and the controller copies the array's
//! record for it. What the array's record keeps for a restart (the tasks
//! still waiting, the tally of those ended) is brought up to date from the
//! core before each commit.

use std::collections::BTreeSet;

use corral_proto::msg::{ArrayEnv, ArraySpec, ArrayView, Dep, DepCond, JobId, JobSpec, JobState};
use scheduler_core::{ArrayRequest, JobRequest};

use super::wire::{core_id, job_request};
use super::{ArrayPart, Controller, CtldError, JobRecord};
use corral_proto::msg::Ident;

/// The most runs an array's index list may have (`1,3,5,...` is a run
/// each).
pub const MAX_INDEX_RUNS: usize = 10_000;

impl JobRecord {
    /// What the core is asked for this record, again (a restart, a
    /// requeue): an array's with what of it is left, a task's naming its
    /// array.
    pub(super) fn core_request(&self) -> JobRequest {
        let spec = self.spec();
        let mut req = job_request(self.user, &spec);
        match (self.array.as_deref(), &spec.array) {
            (Some(a), Some(spec)) if a.task.is_none() => {
                req.array = Some(ArrayRequest {
                    tasks: spec.len(),
                    throttle: spec.throttle,
                    waiting: Some(a.waiting.clone()),
                    ended: a.ended,
                    failed: a.failed,
                });
            }
            (Some(a), _) => req.array_of = Some(core_id(a.job)),
            (None, _) => {}
        }
        req
    }

    /// Where a batch script's output goes when `-o` says nothing: an
    /// array's tasks each to their own file, as Slurm's.
    pub(super) fn default_output(array: bool) -> &'static str {
        if array {
            "slurm-%A_%a.out"
        } else {
            "slurm-%j.out"
        }
    }

    /// The array's record once no task of it waits: never shown.
    pub(super) fn spent_array(&self) -> bool {
        self.array.as_deref().is_some_and(ArrayPart::spent)
    }

    /// What a task sees of its array.
    pub(super) fn array_env(&self) -> Option<ArrayEnv> {
        let a = self.array.as_deref()?;
        let spec = self.spec().array?;
        Some(ArrayEnv {
            job: a.job,
            task: a.task?,
            count: spec.len(),
            min: spec.min(),
            max: spec.max(),
            step: spec.step(),
        })
    }

    /// The array's id, for the record of an array or of one of its tasks.
    pub(super) fn array_id(&self) -> Option<JobId> {
        self.array.as_deref().map(|a| a.job)
    }

    /// Its place in an array, as squeue shows it; `waiting` are the
    /// positions of the array's tasks still waiting.
    pub(super) fn array_view(
        &self,
        spec: Option<&ArraySpec>,
        waiting: &[(u32, u32)],
    ) -> Option<ArrayView> {
        let a = self.array.as_deref()?;
        let spec = spec?;
        let waiting = match a.task {
            Some(_) => Vec::new(),
            None => waiting
                .iter()
                .flat_map(|&(from, to)| spec.slice(from, to))
                .collect(),
        };
        Some(ArrayView {
            job: a.job,
            task: a.task,
            waiting,
            throttle: spec.throttle,
        })
    }
}

impl Controller {
    /// Checks an `--array` and the dependencies: those on jobs nobody
    /// knows are dropped, and those on single tasks of arrays become
    /// dependencies on the tasks' job ids.
    pub(super) fn admit_array(&self, spec: &mut JobSpec) -> Result<(), CtldError> {
        if let Some(a) = &spec.array {
            let bad = |why: &str| Err(CtldError::BadArray(why.to_string()));
            if a.runs.is_empty() || a.runs.len() > MAX_INDEX_RUNS {
                return bad("it names no task, or too many runs of them");
            }
            let max = self.cfg.limits.max_array_size;
            let mut next = 0u64;
            for r in &a.runs {
                if r.count == 0 || r.step == 0 {
                    return bad("an empty run");
                }
                let last = u64::from(r.first) + u64::from(r.count - 1) * u64::from(r.step);
                if u64::from(r.first) < next {
                    return bad("indices must ascend");
                }
                if last >= u64::from(max) {
                    return Err(CtldError::BadArray(format!(
                        "index {last} is over the limit (MaxArraySize={max})"
                    )));
                }
                next = last + 1;
            }
            if !matches!(spec.kind, corral_proto::msg::JobKind::Batch { .. }) {
                return bad("only batch jobs can be arrays");
            }
        }
        // A condition on a job nobody knows (long forgotten, or never
        // submitted) counts as met, as Slurm 22.05 counts it (measured:
        // `-d afterok:999998` and `-d afterok:999998_3` both run).
        let known = |id: JobId| self.jobs.get(&id).is_some() || self.sched.knows_job(core_id(id));
        spec.dependencies.retain(|d| match *d {
            Dep::Task { job, .. } => known(job),
            Dep::After(j) | Dep::AfterOk(j) | Dep::AfterNotOk(j) | Dep::AfterAny(j) => known(j),
            Dep::Singleton => true,
        });
        for d in &mut spec.dependencies {
            let Dep::Task { cond, job, task } = *d else {
                continue;
            };
            let array = self
                .jobs
                .get(&job)
                .filter(|j| j.array.as_deref().is_some_and(|a| a.task.is_none()))
                .and_then(|j| j.spec().array)
                .ok_or(CtldError::UnknownDependencyTask(job, task))?;
            let pos = array
                .position(task)
                .ok_or(CtldError::UnknownDependencyTask(job, task))?;
            let id = JobId(job.0 + 1 + u64::from(pos));
            *d = match cond {
                DepCond::After => Dep::After(id),
                DepCond::AfterOk => Dep::AfterOk(id),
                DepCond::AfterNotOk => Dep::AfterNotOk(id),
                DepCond::AfterAny => Dep::AfterAny(id),
            };
        }
        Ok(())
    }

    /// The core split task `id` off array `array` to start it: its record
    /// is the array's, copied.
    pub(super) fn split_task(&mut self, array: JobId, id: JobId) {
        if self.jobs.get(&id).is_some() {
            return;
        }
        let Some(entry) = self.jobs.get(&array) else {
            return;
        };
        let index =
            id.0.checked_sub(array.0 + 1)
                .and_then(|p| u32::try_from(p).ok())
                .and_then(|p| entry.spec().array?.index(p));
        let Some(index) = index else {
            return;
        };
        let mut task = entry.clone();
        task.id = id;
        task.array = Some(Box::new(ArrayPart {
            job: array,
            task: Some(index),
            waiting: Vec::new(),
            ended: 0,
            failed: false,
            tasks: 0,
        }));
        // The array's record holds its payload and counts against its
        // user; its tasks do neither.
        task.bytes = u64::MAX;
        task.payload_stored = false;
        task.kept = false;
        self.jobs.insert(id, task);
        self.sync_array(array);
    }

    /// Brings arrays' records up to date with the core before a commit:
    /// those whose tasks changed (ended, or started).
    pub(super) fn sync_arrays(&mut self) {
        let arrays: BTreeSet<JobId> = self
            .jobs
            .dirty
            .iter()
            .filter_map(|id| self.jobs.get(id))
            .filter(|j| j.array.as_deref().is_some_and(|a| a.task.is_some()))
            .filter_map(JobRecord::array_id)
            .collect();
        for a in arrays {
            self.sync_array(a);
        }
    }

    /// The array's record takes the core's word for what waits and what
    /// ended; once every task ended, it ends too (hidden, and without an
    /// accounting record of its own: its tasks have theirs).
    pub(super) fn sync_array(&mut self, array: JobId) {
        let waiting = self.sched.array_waiting(core_id(array)).to_vec();
        let tally = self.sched.array_tally(core_id(array));
        let outcome = self.sched.job_status(core_id(array));
        let Some(j) = self.jobs.get_mut(&array) else {
            return;
        };
        if j.state.is_final() {
            return;
        }
        let Some(a) = j.array.as_deref_mut().filter(|a| a.task.is_none()) else {
            return;
        };
        a.waiting = waiting;
        match tally {
            Some((ended, failed)) => {
                // Tasks that ended no longer count against the limits.
                let gone = u64::from(ended.saturating_sub(a.ended));
                a.ended = ended;
                a.failed = failed;
                if j.bytes != u64::MAX && gone > 0 {
                    if let Some(u) = self.usage.get_mut(&j.user.uid) {
                        u.jobs = u.jobs.saturating_sub(gone);
                    }
                    self.unfinished = self.unfinished.saturating_sub(gone);
                }
            }
            None if a.waiting.is_empty() => {
                use scheduler_core::{JobOutcome, JobStatus};
                j.state = match outcome {
                    Some(JobStatus::Finished(JobOutcome::Completed)) => JobState::Completed,
                    _ => JobState::Failed,
                };
                j.accounted = true;
                j.end = super::Stamp::at(self.clock);
                j.shed(&mut self.usage, &mut self.unfinished);
            }
            None => {}
        }
    }
}

impl Controller {
    /// Task `index` of array `array`: its position, its job id
    /// (`array + 1 + position`) and the array's owner; refused when no
    /// such array or task is known.
    fn task_slot(&self, array: JobId, index: u32) -> Result<(u32, JobId, u32), CtldError> {
        let unknown = || CtldError::UnknownTask(array, index);
        let entry = self
            .jobs
            .get(&array)
            .filter(|j| j.array.as_deref().is_some_and(|a| a.task.is_none()))
            .ok_or_else(unknown)?;
        let pos = entry
            .spec()
            .array
            .and_then(|s| s.position(index))
            .ok_or_else(unknown)?;
        Ok((pos, JobId(array.0 + 1 + u64::from(pos)), entry.user.uid))
    }

    /// Task `index` of `array` as a job of its own ([`Request::ArrayTask`]):
    /// its record if it has one; while it waits, split off the array's
    /// record (its owner or an operator only) into a pending record of
    /// its own, id `array + 1 + position`, as one split off to start.
    ///
    /// [`Request::ArrayTask`]: corral_proto::msg::Request::ArrayTask
    pub fn array_task(&mut self, who: Ident, array: JobId, index: u32) -> Result<JobId, CtldError> {
        let unknown = CtldError::UnknownTask(array, index);
        let (pos, task, owner) = self.task_slot(array, index)?;
        if self.jobs.get(&task).is_some() {
            return Ok(task);
        }
        if owner != who.uid && !self.privileged(who) {
            return Err(CtldError::AccessDenied);
        }
        let split = self
            .sched
            .split_array_task(core_id(array), pos)
            .map_err(|_| unknown)?;
        debug_assert_eq!(super::wire::wire_id(split), task);
        self.split_task(array, task);
        self.dirty = true;
        Ok(task)
    }

    /// Resolves what a selection says of arrays: an array's id selects
    /// its tasks' records too, and `123_7` selects that task's record or,
    /// while it waits, the array's record for that task alone. A task
    /// that does not exist is refused.
    pub fn resolve_arrays(&self, sel: &mut super::Selector) -> Result<(), CtldError> {
        let tasks = std::mem::take(&mut sel.tasks);
        if sel.ids.is_none() && tasks.is_empty() {
            return Ok(());
        }
        let whole = sel.ids.clone().unwrap_or_default();
        let mut add = Vec::new();
        for id in sel.ids.iter().flatten() {
            let Some(spec) = self
                .jobs
                .get(id)
                .filter(|j| j.array.as_deref().is_some_and(|a| a.task.is_none()))
                .and_then(|j| j.spec().array)
            else {
                continue;
            };
            let last = JobId(id.0 + u64::from(spec.len()));
            add.extend(
                self.jobs
                    .range(JobId(id.0 + 1)..=last)
                    .filter(|(_, t)| t.array_id() == Some(*id))
                    .map(|(t, _)| *t),
            );
        }
        for (array, index) in tasks {
            let unknown = CtldError::UnknownTask(array, index);
            let (pos, task, _) = self.task_slot(array, index)?;
            if self.jobs.get(&task).is_some() {
                add.push(task);
            } else if self
                .sched
                .array_waiting(core_id(array))
                .iter()
                .any(|&(a, b)| a <= pos && pos < b)
            {
                add.push(array);
                if !whole.contains(&array) {
                    sel.only.entry(array).or_default().push(pos);
                }
            } else {
                // Ended, and forgotten since.
                return Err(unknown);
            }
        }
        sel.ids.get_or_insert_with(Default::default).extend(add);
        Ok(())
    }
}
