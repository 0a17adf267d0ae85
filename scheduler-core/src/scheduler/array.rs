//! Job arrays: one entry for all of an array's waiting tasks, split into
//! a job of its own as each task starts.
//!
//! The entry is ranked and searched like any job; where the search finds a
//! start now, the lowest waiting position is split off (a copy of the
//! entry, as job `id + 1 + position`) and started, and the search runs
//! again for the next, until the array's `%N` is reached, nothing waits,
//! or the next task must wait: then the entry holds the reservation for
//! its next task. A 100,000-task array costs one entry until its tasks
//! start.
//!
//! The [`Book`] counts what the dependencies on a whole array need (how
//! many tasks run, how many ended, whether one failed); once every task
//! ended, the array's id is finished like a job's: completed if all
//! succeeded.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::{Job, Scheduler, State};
use crate::error::ControlError;
use crate::model::{ArrayRequest, JobId, JobOutcome, PendingReason, Reservation, Secs, INFINITE};

/// What a job is of an array.
#[derive(Clone, Debug)]
pub(super) enum Role {
    /// The array's entry: its tasks not yet started, and the plans of
    /// the ones after its next (whose plan is the entry's own).
    Entry {
        id: JobId,
        waiting: Vec<(u32, u32)>,
        later: Vec<Reservation>,
    },
    /// A task split off the array `array`.
    Task { array: JobId },
}

impl Role {
    pub(super) fn array_id(&self) -> Option<JobId> {
        Some(match self {
            Role::Entry { id, .. } => *id,
            Role::Task { array } => *array,
        })
    }

    /// How many tasks this job stands for while it waits.
    pub(super) fn waiting_count(&self) -> u32 {
        match self {
            Role::Entry { waiting, .. } => waiting.iter().map(|(a, b)| b - a).sum(),
            Role::Task { .. } => 1,
        }
    }
}

/// An array's tally, kept until every task ended.
#[derive(Clone, Debug, Default)]
pub(super) struct Book {
    pub(super) tasks: u32,
    pub(super) throttle: u32,
    /// Tasks running now.
    pub(super) running: u32,
    /// Tasks ended (cancelled while waiting included).
    pub(super) ended: u32,
    /// Some task did not succeed.
    pub(super) failed: bool,
}

/// The most ranges an array's waiting positions may be cut into (each
/// cancel of one waiting task may add one); a restore that brings more is
/// refused.
pub const MAX_WAITING_RANGES: usize = 1 << 16;

/// Removes position `p` from ascending half-open ranges; whether it was there.
fn take_position(ranges: &mut Vec<(u32, u32)>, p: u32) -> bool {
    let Some(i) = ranges.iter().position(|&(a, b)| a <= p && p < b) else {
        return false;
    };
    let (a, b) = ranges[i];
    match (a == p, p + 1 == b) {
        (true, true) => {
            ranges.remove(i);
        }
        (true, false) => ranges[i].0 = p + 1,
        (false, true) => ranges[i].1 = p,
        (false, false) => {
            ranges[i].1 = p;
            ranges.insert(i + 1, (p + 1, b));
        }
    }
    true
}

impl Scheduler {
    /// The entry of an array being admitted: its role, and its book
    /// (which tasks a restore hands back may already have opened).
    pub(super) fn open_array(
        &mut self,
        id: JobId,
        req: &ArrayRequest,
    ) -> Result<Option<Box<Role>>, crate::SubmitError> {
        let invalid = |s: &str| Err(crate::SubmitError::Invalid(s.to_string()));
        if req.tasks == 0 {
            return invalid("an array needs at least one task");
        }
        let waiting = match &req.waiting {
            None => vec![(0, req.tasks)],
            Some(w) => {
                let ordered = w.windows(2).all(|p| p[0].1 < p[1].0);
                if w.len() > MAX_WAITING_RANGES
                    || !ordered
                    || w.iter().any(|&(a, b)| a >= b || b > req.tasks)
                {
                    return invalid("an array's waiting tasks are not ascending ranges of it");
                }
                w.clone()
            }
        };
        let book = self.arrays.entry(id).or_default();
        book.tasks = req.tasks;
        book.throttle = req.throttle;
        book.ended = book.ended.saturating_add(req.ended);
        book.failed |= req.failed;
        if waiting.is_empty() {
            self.close_array_if_done(id);
            return Ok(None);
        }
        Ok(Some(Box::new(Role::Entry {
            id,
            waiting,
            later: Vec::new(),
        })))
    }

    /// A task the driver hands back (restored, requeued): it counts in
    /// its array's book.
    pub(super) fn join_array(&mut self, array: JobId) -> Box<Role> {
        self.arrays.entry(array).or_default();
        Box::new(Role::Task { array })
    }

    /// Splits the lowest waiting task off the array entry `id`: a pending
    /// job of its own, returned. The entry goes once nothing waits.
    pub(super) fn split_task(&mut self, id: JobId) -> Option<JobId> {
        let first = match self.jobs.get(&id)?.array.as_deref() {
            Some(Role::Entry { waiting, .. }) => waiting.first()?.0,
            _ => return None,
        };
        self.split_position(id, first)
    }

    /// Splits the waiting task at `position` off the array entry `array`
    /// (`scontrol hold|release|update 123_7` while it waits, as Slurm
    /// splits it off its array's record): a pending job of its own, as a
    /// requeued task is, keeping the entry's hold, and taking a slot of
    /// the array's `%N` once it runs.
    pub fn split_array_task(&mut self, array: JobId, position: u32) -> Result<JobId, ControlError> {
        self.split_position(array, position)
            .ok_or(ControlError::UnknownJob(task_id(array, position)))
    }

    fn split_position(&mut self, id: JobId, position: u32) -> Option<JobId> {
        let entry = self.jobs.get_mut(&id)?;
        let Some(Role::Entry { waiting, .. }) = entry.array.as_deref_mut() else {
            return None;
        };
        if !take_position(waiting, position) {
            return None;
        }
        let a = position;
        let empty = waiting.is_empty();
        let mut task: Job = (**entry).clone();
        task.array = Some(Box::new(Role::Task { array: id }));
        task.set_pending(PendingReason::None, None);
        if empty {
            self.jobs.remove(&id);
            self.forget_job(id);
        }
        let tid = task_id(id, a);
        self.jobs.insert(tid, Box::new(task));
        self.note_hold(tid);
        Some(tid)
    }

    /// A task of `array` started.
    pub(super) fn array_task_started(&mut self, array: JobId) {
        if let Some(b) = self.arrays.get_mut(&array) {
            b.running += 1;
        }
    }

    /// A task of `array` stopped running (ended, or requeued).
    pub(super) fn array_task_stopped(&mut self, array: JobId) {
        if let Some(b) = self.arrays.get_mut(&array) {
            b.running = b.running.saturating_sub(1);
        }
    }

    /// `n` tasks of `array` ended, successfully or not.
    pub(super) fn array_tasks_ended(&mut self, array: JobId, n: u32, succeeded: bool) {
        if let Some(b) = self.arrays.get_mut(&array) {
            b.ended = b.ended.saturating_add(n);
            b.failed |= !succeeded;
        }
        self.close_array_if_done(array);
    }

    fn close_array_if_done(&mut self, array: JobId) {
        let Some(b) = self.arrays.get(&array) else {
            return;
        };
        // (A book a restored task opened before its array came back
        // knows no size yet.)
        if b.tasks == 0 || b.ended < b.tasks || self.jobs.contains_key(&array) {
            return;
        }
        let outcome = if b.failed {
            JobOutcome::Failed { exit_code: 1 }
        } else {
            JobOutcome::Completed
        };
        self.arrays.remove(&array);
        self.finished.insert(array, outcome);
    }

    /// Cancels one task of an array that has not started (`scancel
    /// 123_7` while it waits): position `position` leaves the entry.
    pub fn cancel_array_task(&mut self, array: JobId, position: u32) -> Result<(), ControlError> {
        let entry = self
            .jobs
            .get_mut(&array)
            .ok_or(ControlError::UnknownJob(array))?;
        let Some(Role::Entry { waiting, .. }) = entry.array.as_deref_mut() else {
            return Err(ControlError::UnknownJob(array));
        };
        if !take_position(waiting, position) {
            return Err(ControlError::UnknownJob(task_id(array, position)));
        }
        if waiting.is_empty() {
            self.jobs.remove(&array);
            self.forget_job(array);
        }
        self.finished
            .insert(task_id(array, position), JobOutcome::Cancelled);
        self.array_tasks_ended(array, 1, false);
        Ok(())
    }

    /// The positions of an array's tasks not yet started, as ascending
    /// half-open ranges (empty once all started, or for another job).
    pub fn array_waiting(&self, array: JobId) -> &[(u32, u32)] {
        match self.jobs.get(&array).and_then(|j| j.array.as_deref()) {
            Some(Role::Entry { waiting, .. }) => waiting,
            _ => &[],
        }
    }

    /// An array's tasks ended so far, and whether one failed; `None` once
    /// every task ended (its outcome is then the array id's), or for a
    /// job that is no array.
    pub fn array_tally(&self, array: JobId) -> Option<(u32, bool)> {
        self.arrays.get(&array).map(|b| (b.ended, b.failed))
    }

    /// Whether `id` is a task of an array that has not started yet.
    pub(super) fn task_waiting(&self, id: JobId) -> bool {
        let Some((&array, _)) = self.arrays.range(..id).next_back() else {
            return false;
        };
        let Some(p) = id.0.checked_sub(array.0 + 1) else {
            return false;
        };
        u32::try_from(p).is_ok_and(|p| {
            self.array_waiting(array)
                .iter()
                .any(|&(a, b)| a <= p && p < b)
        })
    }

    /// A dependency on a whole array, while one of its tasks has not
    /// ended: `Some(true)` met, `Some(false)` waiting, `None` never.
    /// (`None` as the result: `array` is no live array.)
    pub(super) fn array_dependency(
        &self,
        array: JobId,
        d: &crate::model::Dependency,
    ) -> Option<Option<bool>> {
        use crate::model::Dependency;
        let b = self.arrays.get(&array)?;
        Some(match d {
            // Every task started (or was cancelled before it could).
            Dependency::After(_) => Some(!self.jobs.contains_key(&array)),
            Dependency::AfterOk(_) if b.failed => None,
            _ => Some(false),
        })
    }

    /// The plans of an array entry's tasks after its next, from the last
    /// pass, taken out (the pass makes new ones).
    pub(super) fn take_later_plans(&mut self, id: JobId) -> Vec<Reservation> {
        match self.jobs.get_mut(&id).and_then(|j| j.array.as_deref_mut()) {
            Some(Role::Entry { later, .. }) => std::mem::take(later),
            _ => Vec::new(),
        }
    }

    /// This pass's plans of an array entry's tasks after its next.
    pub(super) fn keep_later_plans(&mut self, id: JobId, plans: Vec<Reservation>) {
        if let Some(Role::Entry { later, .. }) =
            self.jobs.get_mut(&id).and_then(|j| j.array.as_deref_mut())
        {
            *later = plans;
        }
    }

    /// The slots of the array entry `id` for one pass: the ends of its
    /// running tasks. A task waiting again (requeued) takes a slot of its
    /// array's `%N` as the entry does. `None` for a job that is neither,
    /// or a task of an array without a `%N`.
    pub(super) fn array_slots(&self, id: JobId, now: Secs) -> Option<ArraySlots> {
        // Most queues hold no array: no lookup per job then.
        if self.arrays.is_empty() {
            return None;
        }
        let (array, entry) = match self.jobs.get(&id)?.array.as_deref()? {
            Role::Entry { id, .. } => (*id, true),
            Role::Task { array } => (*array, false),
        };
        let b = self.arrays.get(&array)?;
        if !entry && b.throttle == 0 {
            return None;
        }
        // Its tasks are the ids after its own.
        let last = JobId(array.0 + u64::from(b.tasks));
        let ends = if b.throttle == 0 {
            BinaryHeap::new()
        } else {
            self.jobs
                .range(JobId(array.0 + 1)..=last)
                .filter_map(|(_, j)| match j.state {
                    State::Running(ref r) if j.running_task_of() == Some(array) => {
                        Some(Reverse(r.end_by.max(now + 1)))
                    }
                    _ => None,
                })
                .collect()
        };
        Some(ArraySlots {
            throttle: b.throttle,
            ends,
        })
    }
}

/// An array's `%N` within one pass: when each of the tasks it runs or
/// plans ends. A task waits for a slot once `throttle` are taken.
pub(super) struct ArraySlots {
    throttle: u32,
    ends: BinaryHeap<Reverse<Secs>>,
}

impl ArraySlots {
    /// The earliest the next task may start by the `%N` (`INFINITE` when
    /// the tasks in its way have no limit); `None` for no wait. The slot
    /// it waits for is taken from the heap.
    pub(super) fn next_hold(&mut self) -> Option<Secs> {
        if self.throttle == 0 || self.ends.len() < self.throttle as usize {
            return None;
        }
        self.ends.pop().map(|Reverse(t)| t.min(INFINITE))
    }

    /// The next task is placed, to end at `end`.
    pub(super) fn taken(&mut self, end: Secs) {
        if self.throttle > 0 {
            self.ends.push(Reverse(end));
        }
    }
}

/// The job id of the task at `position` of array `array`.
pub fn task_id(array: JobId, position: u32) -> JobId {
    JobId(array.0 + 1 + u64::from(position))
}

impl Job {
    /// Whether it is a running task of an array, and which.
    pub(super) fn running_task_of(&self) -> Option<JobId> {
        match (self.array.as_deref(), &self.state) {
            (Some(Role::Task { array }), State::Running(_)) => Some(*array),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::take_position;
    use crate::model::{ArrayRequest, Dependency, JobOutcome, NodeSpec, PartitionSpec};
    use crate::*;

    /// Two nodes of 4 CPUs.
    fn cluster() -> Scheduler {
        let mut s = Scheduler::new(SchedulerConfig {
            verify_search: true,
            ..SchedulerConfig::default()
        });
        let mut p = PartitionSpec::new("cpu", "n[0-1]");
        p.is_default = true;
        s.add_partition(p).unwrap();
        for n in ["n0", "n1"] {
            s.handle_node_added(NodeSpec::new(n, 4, 1000)).unwrap();
        }
        s
    }

    fn array(tasks: u32, throttle: u32) -> JobRequest {
        let mut r = JobRequest::new(UserId(1));
        r.time_limit = Some(100);
        r.array = Some(ArrayRequest::new(tasks, throttle));
        r
    }

    fn ids(d: &[StartDecision]) -> Vec<u64> {
        d.iter().map(|d| d.job.0).collect()
    }

    #[test]
    fn an_array_is_one_entry_until_its_tasks_start_and_fills_what_is_free() {
        let mut s = cluster();
        s.submit(0, JobId(10), array(100_000, 0)).unwrap();
        assert_eq!(s.active_jobs().count(), 1, "one entry for 100,000 tasks");
        let started = s.schedule(0);
        // Eight CPUs, one task each: tasks 0..8 as jobs 11..19.
        assert_eq!(ids(&started), (11..19).collect::<Vec<_>>());
        assert!(started.iter().all(|d| d.array == Some(JobId(10))));
        assert_eq!(s.active_jobs().count(), 9);
        assert_eq!(s.array_waiting(JobId(10)), [(8, 100_000)]);
        // The entry holds the reservation of its next task.
        match s.job_status(JobId(10)) {
            Some(JobStatus::Pending {
                expected_start: Some(100),
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        s.audit().unwrap();
        s.handle_job_finished(50, JobId(11), JobOutcome::Completed)
            .unwrap();
        assert_eq!(ids(&s.schedule(50)), [19]);
        s.audit().unwrap();
    }

    #[test]
    fn a_throttle_caps_running_tasks_and_says_so() {
        let mut s = cluster();
        s.submit(0, JobId(1), array(6, 2)).unwrap();
        assert_eq!(ids(&s.schedule(0)), [2, 3]);
        match s.job_status(JobId(1)) {
            Some(JobStatus::Pending { reason, .. }) => {
                assert_eq!(reason, PendingReason::JobArrayTaskLimit)
            }
            other => panic!("{other:?}"),
        }
        // Another job may use what the throttle leaves.
        s.submit(1, JobId(20), JobRequest::new(UserId(2))).unwrap();
        assert_eq!(ids(&s.schedule(1)), [20]);
        s.handle_job_finished(5, JobId(2), JobOutcome::Completed)
            .unwrap();
        assert_eq!(ids(&s.schedule(5)), [4]);
        s.audit().unwrap();
    }

    #[test]
    fn dependencies_on_a_whole_array_wait_for_every_task() {
        let mut s = cluster();
        s.submit(0, JobId(1), array(3, 0)).unwrap();
        let mut after = JobRequest::new(UserId(1));
        after.dependencies = vec![Dependency::AfterOk(JobId(1))];
        s.submit(0, JobId(10), after).unwrap();
        let mut on_one = JobRequest::new(UserId(1));
        on_one.dependencies = vec![Dependency::AfterOk(JobId(3))];
        s.submit(0, JobId(11), on_one).unwrap();
        let mut not_ok = JobRequest::new(UserId(1));
        not_ok.dependencies = vec![Dependency::AfterNotOk(JobId(1))];
        s.submit(0, JobId(12), not_ok).unwrap();
        assert_eq!(ids(&s.schedule(0)), [2, 3, 4]);
        s.handle_job_finished(1, JobId(3), JobOutcome::Completed)
            .unwrap();
        // One task done: its dependant starts, the array's waits.
        assert_eq!(ids(&s.schedule(1)), [11]);
        s.handle_job_finished(2, JobId(2), JobOutcome::Completed)
            .unwrap();
        assert!(s.schedule(2).is_empty());
        s.handle_job_finished(3, JobId(4), JobOutcome::Completed)
            .unwrap();
        assert_eq!(ids(&s.schedule(3)), [10]);
        assert_eq!(
            s.job_status(JobId(1)),
            Some(JobStatus::Finished(JobOutcome::Completed))
        );
        match s.job_status(JobId(12)) {
            Some(JobStatus::Pending { reason, .. }) => {
                assert_eq!(reason, PendingReason::DependencyNeverSatisfied)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_failed_task_fails_afterok_at_once_and_cancelled_tasks_end_the_array() {
        let mut s = cluster();
        s.submit(0, JobId(1), array(10, 1)).unwrap();
        let mut after = JobRequest::new(UserId(1));
        after.dependencies = vec![Dependency::AfterOk(JobId(1))];
        s.submit(0, JobId(20), after).unwrap();
        let mut any = JobRequest::new(UserId(1));
        any.dependencies = vec![Dependency::AfterAny(JobId(1))];
        s.submit(0, JobId(21), any).unwrap();
        assert_eq!(ids(&s.schedule(0)), [2]);
        s.handle_job_finished(1, JobId(2), JobOutcome::Failed { exit_code: 3 })
            .unwrap();
        assert_eq!(ids(&s.schedule(1)), [3]);
        match s.job_status(JobId(20)) {
            Some(JobStatus::Pending { reason, .. }) => {
                assert_eq!(reason, PendingReason::DependencyNeverSatisfied)
            }
            other => panic!("{other:?}"),
        }
        // One waiting task is cancelled, then the rest with the entry.
        s.cancel_array_task(JobId(1), 5).unwrap();
        assert_eq!(s.array_waiting(JobId(1)), [(2, 5), (6, 10)]);
        assert_eq!(s.array_tally(JobId(1)), Some((2, true)));
        assert!(s.cancel_array_task(JobId(1), 5).is_err());
        assert_eq!(s.cancel(JobId(1)), Ok(Cancelled::Pending));
        assert_eq!(s.array_tally(JobId(1)), Some((9, true)));
        s.handle_job_finished(2, JobId(3), JobOutcome::Completed)
            .unwrap();
        assert_eq!(s.array_tally(JobId(1)), None);
        assert_eq!(ids(&s.schedule(2)), [21]);
    }

    #[test]
    fn a_restored_array_keeps_what_waits_and_what_ended() {
        let mut s = cluster();
        let mut r = array(10, 0);
        if let Some(a) = &mut r.array {
            a.waiting = Some(vec![(7, 10)]);
            a.ended = 5;
        }
        s.submit(0, JobId(1), r).unwrap();
        // Tasks 5 and 6 were running: handed back as tasks of the array.
        let mut task = JobRequest::new(UserId(1));
        task.time_limit = Some(100);
        task.array_of = Some(JobId(1));
        s.submit(0, JobId(7), task.clone()).unwrap();
        s.submit(0, JobId(8), task).unwrap();
        let mut started = ids(&s.schedule(0));
        started.sort_unstable();
        assert_eq!(started, [7, 8, 9, 10, 11]);
        for (t, id) in [1, 2, 3, 4, 5].into_iter().zip(7..) {
            s.handle_job_finished(t, JobId(id), JobOutcome::Completed)
                .unwrap();
        }
        assert_eq!(
            s.job_status(JobId(1)),
            Some(JobStatus::Finished(JobOutcome::Completed))
        );
        let mut bad = array(3, 0);
        if let Some(a) = &mut bad.array {
            a.waiting = Some(vec![(2, 1)]);
        }
        assert!(s.submit(0, JobId(50), bad).is_err());
    }

    #[test]
    fn a_position_leaves_its_range_whichever_part_of_it() {
        let mut r = vec![(0, 10), (20, 21)];
        assert!(take_position(&mut r, 0));
        assert!(take_position(&mut r, 9));
        assert!(take_position(&mut r, 5));
        assert!(take_position(&mut r, 20));
        assert!(!take_position(&mut r, 5));
        assert!(!take_position(&mut r, 15));
        assert_eq!(r, vec![(1, 5), (6, 9)]);
    }
}
