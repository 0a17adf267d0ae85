//! The agent's process table: which runs of which jobs have steps on this
//! node, and the process groups of their tasks whose leaders are alive.
//!
//! A small state machine with no I/O: each call changes the table and
//! returns the process groups the caller must signal. The agent holds it
//! under one lock and signals while holding it, so a group it signals is
//! one the table still lists. It must never list a group whose leader has
//! been reaped: the kernel may hand that id to someone else's process.
//!
//! Per job, only its latest run here counts: a requeued job's new run
//! replaces the old one (whose groups are killed), and news of an older
//! run is ignored.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use corral_proto::msg::{AgentMsg, JobId, JobRun, Launched, SignalTo, StepId};
use nix::sys::signal::Signal;

/// This node's processes of one job, of its latest run here.
#[derive(Debug, Default)]
struct JobProcs {
    run: u32,
    /// Running steps and their live task groups.
    steps: HashMap<StepId, Vec<u32>>,
    /// ctld asked to end the run: no new steps start.
    terminating: bool,
    /// The batch step was launched here.
    batch: bool,
    /// One more than the highest numbered step launched here.
    next: u32,
    /// When its batch step ended it here, on a node of its own
    /// ([`ProcTable::end_batch_alone`]): nothing of it runs.
    done_at: Option<Instant>,
    /// Then, once its cgroup is gone: the `BatchDone` that said so, sent
    /// again on each new connection while the run is kept.
    outcome: Option<AgentMsg>,
}

impl JobProcs {
    fn new(run: u32) -> Self {
        JobProcs {
            run,
            ..JobProcs::default()
        }
    }

    fn groups(&self) -> Vec<u32> {
        self.steps.values().flatten().copied().collect()
    }

    /// Whether `step` was launched here before (ctld sends a launch again
    /// when it cannot know it arrived).
    fn launched(&self, step: StepId) -> bool {
        if step == StepId::BATCH {
            self.batch
        } else {
            step.0 < self.next
        }
    }

    fn mark_launched(&mut self, step: StepId) {
        if step == StepId::BATCH {
            self.batch = true;
        } else {
            self.next = self.next.max(step.0.saturating_add(1));
        }
    }
}

/// Whether a step may start.
#[derive(Debug, PartialEq, Eq)]
pub enum StepStart {
    /// It may; `replaced` lists the groups of an older run of the job that
    /// this newer run replaces, to kill.
    Go { replaced: Vec<u32> },
    /// The run is ending, or a newer run of the job is here.
    Refused,
    /// The step was launched here already: this launch is a copy, sent
    /// again by a controller that could not know the first arrived.
    Again,
}

/// What [`ProcTable::terminate`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Termination {
    /// Nothing of the run is left here: the job is clean on this node.
    Clean,
    /// These groups get SIGCONT and SIGTERM now, and whatever of the run
    /// is still listed after the grace period gets SIGKILL.
    Signal(Vec<u32>),
}

/// Every job's processes on this node.
#[derive(Debug, Default)]
pub struct ProcTable {
    jobs: HashMap<JobId, JobProcs>,
    /// The latest end among the ended runs [`ProcTable::prune_done`]
    /// forgot: every run launched here after it is still known.
    forgot_through: Option<Instant>,
}

impl ProcTable {
    /// Every live group of every run here.
    pub fn all_groups(&self) -> Vec<u32> {
        self.jobs.values().flat_map(JobProcs::groups).collect()
    }

    /// Runs with a step here (for heartbeats and registration); not
    /// those already ended here.
    pub fn running(&self) -> Vec<JobRun> {
        self.jobs
            .iter()
            .filter(|(_, j)| j.done_at.is_none())
            .map(|(&job, j)| JobRun { job, run: j.run })
            .collect()
    }

    /// The steps each run here was sent (for registration).
    pub fn launched(&self) -> Vec<Launched> {
        let mut v: Vec<Launched> = self
            .jobs
            .iter()
            .map(|(&job, j)| Launched {
                run: JobRun { job, run: j.run },
                batch: j.batch,
                next: j.next,
            })
            .collect();
        v.sort_unstable_by_key(|l| l.run);
        v
    }

    /// A step of a run is about to start.
    pub fn begin_step(&mut self, job: JobRun, step: StepId) -> StepStart {
        let j = self
            .jobs
            .entry(job.job)
            .or_insert_with(|| JobProcs::new(job.run));
        let mut kill = Vec::new();
        if j.run < job.run {
            kill = std::mem::replace(j, JobProcs::new(job.run)).groups();
        }
        if j.run != job.run {
            return StepStart::Refused;
        }
        if j.launched(step) {
            return StepStart::Again;
        }
        j.mark_launched(step);
        if j.terminating {
            return StepStart::Refused;
        }
        j.steps.entry(step).or_default();
        StepStart::Go { replaced: kill }
    }

    /// Lists a step's task groups once they exist; false if the run is
    /// ending or no longer the job's latest here (the caller kills them).
    pub fn add_groups(&mut self, job: JobRun, step: StepId, groups: &[u32]) -> bool {
        let Some(j) = self.jobs.get_mut(&job.job) else {
            return false;
        };
        if j.terminating || j.run != job.run {
            return false;
        }
        j.steps.entry(step).or_default().extend_from_slice(groups);
        true
    }

    /// A task's leader was reaped: its group leaves the table. The caller
    /// then kills what the group left running.
    pub fn group_exited(&mut self, job: JobRun, step: StepId, pgid: u32) {
        if let Some(groups) = self
            .jobs
            .get_mut(&job.job)
            .filter(|j| j.run == job.run)
            .and_then(|j| j.steps.get_mut(&step))
        {
            groups.retain(|&g| g != pgid);
        }
    }

    /// The live groups of a run: of one step, or of all its steps.
    pub fn groups(&self, job: JobRun, to: SignalTo) -> Vec<u32> {
        let Some(j) = self.jobs.get(&job.job).filter(|j| j.run == job.run) else {
            return Vec::new();
        };
        j.steps
            .iter()
            .filter(|(s, _)| match to {
                SignalTo::All => true,
                SignalTo::Step(want) => want == **s,
                SignalTo::Steps => **s != StepId::BATCH,
            })
            .flat_map(|(_, g)| g.iter().copied())
            .collect()
    }

    /// Whether `step` of the run is running here.
    pub fn has_step(&self, job: JobRun, step: StepId) -> bool {
        self.jobs
            .get(&job.job)
            .is_some_and(|j| j.run == job.run && j.steps.contains_key(&step))
    }

    /// ctld ends a run here. An older run than the one here is already
    /// gone; a newer one takes what is here with it.
    pub fn terminate(&mut self, job: JobRun) -> Termination {
        let Some(j) = self.jobs.get_mut(&job.job).filter(|j| j.run <= job.run) else {
            return Termination::Clean;
        };
        if j.run < job.run {
            // The newer run was launched nothing here.
            (j.batch, j.next) = (false, 0);
        }
        j.run = job.run;
        j.terminating = true;
        if j.steps.is_empty() {
            // Leftovers of ended steps died with their leaders.
            self.jobs.remove(&job.job);
            return Termination::Clean;
        }
        Termination::Signal(j.groups())
    }

    /// The batch step of a run that has this node alone ended. True when
    /// the run was not ending and had no other step here: nothing of it
    /// is left once its cgroup is emptied, so the agent cleans up and
    /// tells ctld at once ([`corral_proto::msg::AgentMsg::BatchDone`])
    /// instead of waiting for a `Terminate`. The run then stays listed as
    /// launched, and ending (no step starts), until a `Terminate` or a
    /// newer run takes it, or [`ProcTable::prune_done`] finds it old: a
    /// controller that did not hear of its end must not send its batch
    /// step again, and hears the end again instead
    /// ([`ProcTable::ended_outcomes`]).
    pub fn end_batch_alone(&mut self, job: JobRun, now: Instant) -> bool {
        let Some(j) = self.jobs.get_mut(&job.job).filter(|j| j.run == job.run) else {
            return false;
        };
        if j.terminating || j.steps.keys().any(|s| *s != StepId::BATCH) {
            return false;
        }
        j.steps.clear();
        j.terminating = true;
        j.done_at = Some(now);
        true
    }

    /// Forgets the runs [`ProcTable::end_batch_alone`] ended longer than
    /// `keep` ago, and the oldest of them beyond `most`.
    pub fn prune_done(&mut self, now: Instant, keep: Duration, most: usize) {
        let mut forgot = self.forgot_through;
        self.jobs.retain(|_, j| match j.done_at {
            Some(t) if now.saturating_duration_since(t) > keep => {
                forgot = forgot.max(Some(t));
                false
            }
            _ => true,
        });
        self.forgot_through = forgot;
        // Counted first: on each heartbeat, and rarely over.
        if self.jobs.values().filter(|j| j.done_at.is_some()).count() <= most {
            return;
        }
        let mut done: Vec<(Instant, JobId)> = self
            .jobs
            .iter()
            .filter_map(|(&id, j)| j.done_at.map(|t| (t, id)))
            .collect();
        done.sort_unstable();
        for (t, id) in &done[..done.len() - most] {
            self.jobs.remove(id);
            self.forgot_through = self.forgot_through.max(Some(*t));
        }
    }

    /// Up to when ended runs were forgotten: a run launched later is in
    /// [`ProcTable::launched`] until a `Terminate` takes it; one launched
    /// earlier may have ended here unheard (a controller that could not
    /// store its end) and been forgotten. None: nothing forgotten.
    pub fn forgot_through(&self) -> Option<Instant> {
        self.forgot_through
    }

    /// Keeps `msg` (the run's `BatchDone`) with a run
    /// [`ProcTable::end_batch_alone`] ended, if it is still kept.
    pub fn record_outcome(&mut self, job: JobRun, msg: AgentMsg) {
        if let Some(j) = self
            .jobs
            .get_mut(&job.job)
            .filter(|j| j.run == job.run && j.done_at.is_some())
        {
            j.outcome = Some(msg);
        }
    }

    /// The `BatchDone` of every ended run still kept, oldest first.
    pub fn ended_outcomes(&self) -> Vec<AgentMsg> {
        let mut v: Vec<(Instant, &AgentMsg)> = self
            .jobs
            .values()
            .filter_map(|j| Some((j.done_at?, j.outcome.as_ref()?)))
            .collect();
        v.sort_by_key(|(t, _)| *t);
        v.into_iter().map(|(_, m)| m.clone()).collect()
    }

    /// A step of a run ended (or never started). True when the run was
    /// ending and this was its last step here: the job is clean on this
    /// node and leaves the table.
    pub fn end_step(&mut self, job: JobRun, step: StepId) -> bool {
        let Some(j) = self.jobs.get_mut(&job.job).filter(|j| j.run == job.run) else {
            return false;
        };
        j.steps.remove(&step);
        let cleaned = j.terminating && j.steps.is_empty();
        if cleaned {
            self.jobs.remove(&job.job);
        }
        cleaned
    }
}

/// Sends a signal to a whole process group; a group already gone is fine.
pub(crate) fn signal_group(pgid: u32, sig: Signal) {
    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid as i32), sig);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(job: u64, run: u32) -> JobRun {
        JobRun {
            job: JobId(job),
            run,
        }
    }

    #[test]
    fn a_step_is_had_from_its_start_to_its_end_in_its_own_run() {
        let mut t = ProcTable::default();
        assert!(!t.has_step(run(1, 0), StepId::BATCH));
        assert_eq!(
            t.begin_step(run(1, 0), StepId::BATCH),
            StepStart::Go { replaced: vec![] }
        );
        assert!(t.has_step(run(1, 0), StepId::BATCH));
        assert!(!t.has_step(run(1, 0), StepId(0)), "another step");
        assert!(!t.has_step(run(1, 1), StepId::BATCH), "another run");
        t.end_step(run(1, 0), StepId::BATCH);
        assert!(!t.has_step(run(1, 0), StepId::BATCH));
    }

    fn sorted(mut v: Vec<u32>) -> Vec<u32> {
        v.sort_unstable();
        v
    }

    #[test]
    fn a_signal_for_the_steps_spares_the_batch_shell_and_one_for_it_only_it() {
        let mut t = ProcTable::default();
        for (step, g) in [(StepId::BATCH, 50), (StepId(0), 100), (StepId(1), 200)] {
            assert_eq!(
                t.begin_step(run(2, 0), step),
                StepStart::Go { replaced: vec![] }
            );
            assert!(t.add_groups(run(2, 0), step, &[g]));
        }
        assert_eq!(sorted(t.groups(run(2, 0), SignalTo::Steps)), [100, 200]);
        assert_eq!(t.groups(run(2, 0), SignalTo::Step(StepId::BATCH)), [50]);
        assert_eq!(sorted(t.groups(run(2, 0), SignalTo::All)), [50, 100, 200]);
    }

    #[test]
    fn a_step_lists_its_groups_until_their_leaders_exit() {
        let mut t = ProcTable::default();
        assert_eq!(
            t.begin_step(run(1, 0), StepId(0)),
            StepStart::Go { replaced: vec![] }
        );
        assert!(t.add_groups(run(1, 0), StepId(0), &[100, 101]));
        assert_eq!(
            t.begin_step(run(1, 0), StepId(1)),
            StepStart::Go { replaced: vec![] }
        );
        assert!(t.add_groups(run(1, 0), StepId(1), &[200]));
        assert_eq!(sorted(t.groups(run(1, 0), SignalTo::All)), [100, 101, 200]);
        assert_eq!(
            sorted(t.groups(run(1, 0), SignalTo::Step(StepId(0)))),
            [100, 101]
        );
        t.group_exited(run(1, 0), StepId(0), 100);
        assert_eq!(t.groups(run(1, 0), SignalTo::Step(StepId(0))), [101]);
        assert_eq!(t.running(), [run(1, 0)]);
        // News of another run of the job changes nothing.
        t.group_exited(run(1, 1), StepId(0), 101);
        assert!(t.groups(run(1, 1), SignalTo::All).is_empty());
        assert_eq!(t.groups(run(1, 0), SignalTo::Step(StepId(0))), [101]);
    }

    #[test]
    fn a_newer_run_replaces_the_old_one_and_kills_its_groups() {
        let mut t = ProcTable::default();
        t.begin_step(run(1, 0), StepId(0));
        t.add_groups(run(1, 0), StepId(0), &[100]);
        assert_eq!(
            t.begin_step(run(1, 1), StepId(0)),
            StepStart::Go {
                replaced: vec![100]
            }
        );
        assert_eq!(t.running(), [run(1, 1)]);
        // The old run can neither start steps nor add groups any more.
        assert_eq!(t.begin_step(run(1, 0), StepId(1)), StepStart::Refused);
        assert!(!t.add_groups(run(1, 0), StepId(0), &[300]));
        // Its late end is not the new run's.
        assert!(!t.end_step(run(1, 0), StepId(0)));
        assert_eq!(t.running(), [run(1, 1)]);
    }

    #[test]
    fn termination_refuses_new_steps_and_cleans_after_the_last() {
        let mut t = ProcTable::default();
        t.begin_step(run(7, 0), StepId(0));
        t.add_groups(run(7, 0), StepId(0), &[100]);
        assert_eq!(t.terminate(run(7, 0)), Termination::Signal(vec![100]));
        assert_eq!(t.begin_step(run(7, 0), StepId(1)), StepStart::Refused);
        assert!(!t.add_groups(run(7, 0), StepId(0), &[101]));
        t.group_exited(run(7, 0), StepId(0), 100);
        assert!(t.end_step(run(7, 0), StepId(0)));
        assert!(t.running().is_empty());
    }

    #[test]
    fn terminating_what_is_not_here_is_clean_at_once() {
        let mut t = ProcTable::default();
        assert_eq!(t.terminate(run(3, 0)), Termination::Clean);
        // A run whose steps all ended is clean too, and leaves the table.
        t.begin_step(run(4, 0), StepId(0));
        t.end_step(run(4, 0), StepId(0));
        assert_eq!(t.terminate(run(4, 0)), Termination::Clean);
        assert!(t.running().is_empty());
        // An older run's terminate does not touch a newer one.
        t.begin_step(run(5, 2), StepId(0));
        t.add_groups(run(5, 2), StepId(0), &[500]);
        assert_eq!(t.terminate(run(5, 1)), Termination::Clean);
        assert_eq!(t.groups(run(5, 2), SignalTo::All), [500]);
    }

    #[test]
    fn a_newer_runs_terminate_takes_the_older_run_with_it() {
        let mut t = ProcTable::default();
        t.begin_step(run(2, 0), StepId(0));
        t.add_groups(run(2, 0), StepId(0), &[42]);
        assert_eq!(t.terminate(run(2, 1)), Termination::Signal(vec![42]));
        assert_eq!(t.running(), [run(2, 1)]);
        assert!(t.end_step(run(2, 1), StepId(0)));
        assert!(t.running().is_empty());
    }

    #[test]
    fn a_launch_sent_again_is_not_run_twice_and_registration_says_what_arrived() {
        let mut t = ProcTable::default();
        let go = StepStart::Go { replaced: vec![] };
        assert_eq!(t.begin_step(run(1, 0), StepId::BATCH), go);
        assert_eq!(t.begin_step(run(1, 0), StepId(0)), go);
        assert_eq!(t.begin_step(run(1, 0), StepId(2)), go);
        // Copies: running, ended, or skipped over (a step before the
        // highest was sent before it, on the same ordered stream).
        assert_eq!(t.begin_step(run(1, 0), StepId::BATCH), StepStart::Again);
        assert!(!t.end_step(run(1, 0), StepId(0)));
        assert_eq!(t.begin_step(run(1, 0), StepId(0)), StepStart::Again);
        assert_eq!(t.begin_step(run(1, 0), StepId(1)), StepStart::Again);
        assert_eq!(t.begin_step(run(1, 0), StepId(3)), go);
        t.begin_step(run(2, 4), StepId(0));
        let l = t.launched();
        assert_eq!(
            l,
            [
                Launched {
                    run: run(1, 0),
                    batch: true,
                    next: 4
                },
                Launched {
                    run: run(2, 4),
                    batch: false,
                    next: 1
                }
            ]
        );
        assert!(l[0].has(StepId(3)) && !l[0].has(StepId(4)) && l[0].has(StepId::BATCH));
        assert!(!l[1].has(StepId::BATCH));
        // A newer run starts with nothing launched.
        assert_eq!(t.begin_step(run(1, 1), StepId(0)), go);
        assert_eq!(t.launched()[0].next, 1);
        assert!(!t.launched()[0].batch);
        // Terminated: a new step is refused, and its copy ignored.
        t.terminate(run(2, 4));
        assert_eq!(t.begin_step(run(2, 4), StepId(1)), StepStart::Refused);
        assert_eq!(t.begin_step(run(2, 4), StepId(1)), StepStart::Again);
    }

    /// A batch step that ends alone ends its run here: the run is no
    /// longer running but stays launched (its batch step is not started
    /// again, no other step starts) until a Terminate, a newer run or the
    /// prune takes it. With another step still here, or once ending, the
    /// usual way holds.
    #[test]
    fn a_batch_step_ending_alone_leaves_its_run_launched_until_pruned() {
        let go = StepStart::Go { replaced: vec![] };
        let t0 = Instant::now();
        let keep = Duration::from_secs(240);
        let mut t = ProcTable::default();
        assert_eq!(t.begin_step(run(1, 0), StepId::BATCH), go);
        assert!(t.add_groups(run(1, 0), StepId::BATCH, &[10]));
        t.group_exited(run(1, 0), StepId::BATCH, 10);
        assert!(!t.end_batch_alone(run(1, 1), t0), "not the run here");
        assert!(t.end_batch_alone(run(1, 0), t0));
        assert!(t.running().is_empty());
        assert!(t.all_groups().is_empty());
        assert_eq!(
            t.launched(),
            [Launched {
                run: run(1, 0),
                batch: true,
                next: 0
            }]
        );
        assert_eq!(t.begin_step(run(1, 0), StepId::BATCH), StepStart::Again);
        assert_eq!(t.begin_step(run(1, 0), StepId(0)), StepStart::Refused);
        // Its end is kept with it, for a new connection to send again;
        // another run's is not.
        let done = |r: JobRun| AgentMsg::BatchDone {
            job: r,
            exit: corral_proto::msg::ExitStatus::default(),
            oom: false,
            usage: None,
        };
        assert!(t.ended_outcomes().is_empty(), "not before it is made");
        t.record_outcome(run(1, 0), done(run(1, 0)));
        t.record_outcome(run(1, 1), done(run(1, 1)));
        t.record_outcome(run(9, 0), done(run(9, 0)));
        let kept = t.ended_outcomes();
        assert!(
            matches!(kept.as_slice(), [AgentMsg::BatchDone { job, .. }] if *job == run(1, 0)),
            "{kept:?}"
        );
        t.prune_done(t0 + keep, keep, 10);
        assert_eq!(t.launched().len(), 1, "kept for as long as told");
        assert_eq!(t.forgot_through(), None, "nothing forgotten yet");
        t.prune_done(t0 + keep + Duration::from_secs(1), keep, 10);
        assert!(t.launched().is_empty());
        assert_eq!(t.forgot_through(), Some(t0), "forgotten up to its end");
        assert!(t.ended_outcomes().is_empty(), "gone with its run");
        // No more than told: the oldest go first; running runs stay.
        for (job, secs) in [(10, 3), (11, 1), (12, 2)] {
            t.begin_step(run(job, 0), StepId::BATCH);
            assert!(t.end_batch_alone(run(job, 0), t0 + Duration::from_secs(secs)));
        }
        t.begin_step(run(13, 0), StepId::BATCH);
        t.prune_done(t0 + Duration::from_secs(4), keep, 2);
        assert_eq!(
            t.forgot_through(),
            Some(t0 + Duration::from_secs(1)),
            "the latest end forgotten for room"
        );
        let mut left: Vec<u64> = t.launched().iter().map(|l| l.run.job.0).collect();
        left.sort_unstable();
        assert_eq!(left, [10, 12, 13]);
        t.prune_done(t0 + Duration::from_secs(4), keep, 0);
        assert_eq!(t.running(), [run(13, 0)]);
        assert_eq!(t.launched().len(), 1);
        t.terminate(run(13, 0));
        assert!(t.end_step(run(13, 0), StepId::BATCH));
        // A Terminate takes it at once, and finds it clean.
        t.begin_step(run(2, 0), StepId::BATCH);
        assert!(t.end_batch_alone(run(2, 0), t0));
        assert_eq!(t.terminate(run(2, 0)), Termination::Clean);
        assert!(t.launched().is_empty());
        // A newer run of the job replaces it.
        t.begin_step(run(3, 0), StepId::BATCH);
        assert!(t.end_batch_alone(run(3, 0), t0));
        assert_eq!(t.begin_step(run(3, 1), StepId::BATCH), go);
        assert_eq!(t.running(), [run(3, 1)]);
        // Another step of the run still here: not alone.
        t.begin_step(run(4, 0), StepId::BATCH);
        t.begin_step(run(4, 0), StepId(0));
        assert!(!t.end_batch_alone(run(4, 0), t0));
        assert!(!t.end_step(run(4, 0), StepId::BATCH));
        assert_eq!(t.running().len(), 2);
        // Ending already (a Terminate came first): the usual way.
        t.begin_step(run(5, 0), StepId::BATCH);
        assert!(t.add_groups(run(5, 0), StepId::BATCH, &[50]));
        assert_eq!(t.terminate(run(5, 0)), Termination::Signal(vec![50]));
        assert!(!t.end_batch_alone(run(5, 0), t0));
        assert!(
            t.end_step(run(5, 0), StepId::BATCH),
            "cleaned the usual way"
        );
    }
}
