//! The rules of an srun session, without I/O: events come in with the
//! instant they happened, actions come out. srun's loop feeds it what its
//! endpoint, the terminal and the controller say, and carries out what it
//! answers, so every rule users feel has a unit test:
//!
//! - a second Ctrl-C within a second ends the step (the first forwards
//!   SIGINT to the tasks);
//! - once one node has dialled back, the others get [`NODE_DIAL_WAIT`];
//!   a node that cannot reach srun never will, so the step is given up;
//! - a job that ends before any of its tasks dialled back is reported, not
//!   waited for forever;
//! - the step is done when every node dialled back and every task exited,
//!   and srun exits with the highest exit code of the tasks.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use corral_proto::msg::{ExitStatus, JobId, JobState};
use nix::sys::signal::Signal;

/// How long the rest of a step's nodes may take to dial back once the
/// first has.
pub const NODE_DIAL_WAIT: Duration = Duration::from_secs(10);

/// Two interrupts closer than this end the step.
pub const DOUBLE_INTERRUPT: Duration = Duration::from_secs(1);

/// A job whose state is final this long after its first node dialled back,
/// with nodes still missing, has lost them.
const ENDED_GRACE: Duration = Duration::from_secs(2);

/// A job seen ending this long with no node dialled back never reached srun.
const NEVER_REACHED_GRACE: Duration = Duration::from_millis(300);

/// Before this, a pending job is not worth a "waiting" line.
const QUIET_PENDING: Duration = Duration::from_secs(1);

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A node of the step dialled back and said how large the step is.
    NodeDialed {
        at: Instant,
        step_nodes: u32,
        ntasks: u32,
    },
    /// A task ended.
    TaskExited { exit: ExitStatus },
    /// The user pressed Ctrl-C.
    Interrupt { at: Instant },
    /// Time passed; `job` is the job's state if srun asked
    /// ([`Watcher::wants_job_state`]) and got an answer.
    Tick { at: Instant, job: Option<JobState> },
}

/// What srun must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Print this line on stderr.
    Say(String),
    /// Send this signal to every task of the step.
    SignalAll(Signal),
    /// Cancel the job (srun made it: not a step of someone's allocation).
    CancelJob,
    /// The session is over; srun exits with this code.
    Finish(i32),
}

/// One srun session's state.
#[derive(Debug)]
pub struct Watcher {
    job: JobId,
    /// A step inside an existing allocation (not a job srun made).
    step_mode: bool,
    /// Where agents dial back (for the error that says they did not).
    addr: SocketAddr,
    started: Instant,
    step_nodes: Option<u32>,
    ntasks: u32,
    nodes_seen: u32,
    exited: u32,
    worst: ExitStatus,
    first_hello: Option<Instant>,
    last_interrupt: Option<Instant>,
    said_waiting: bool,
    /// When the job was first seen ended with no node dialled back.
    ended_unreached: Option<Instant>,
    /// `-K`: a task's non-zero exit ends the step; the first such exit.
    kill_on_bad_exit: bool,
    bad_exit: Option<ExitStatus>,
    /// `-K`: the others got SIGTERM; SIGKILL follows `kill_wait` (the
    /// cluster's KillWait) after, at `kill_at`, once.
    kill_wait: Duration,
    kill_at: Option<Instant>,
    killed: bool,
}

impl Watcher {
    pub fn new(job: JobId, step_mode: bool, addr: SocketAddr, started: Instant) -> Self {
        Watcher {
            job,
            step_mode,
            addr,
            started,
            step_nodes: None,
            ntasks: 0,
            nodes_seen: 0,
            exited: 0,
            worst: ExitStatus::default(),
            first_hello: None,
            last_interrupt: None,
            said_waiting: false,
            ended_unreached: None,
            kill_on_bad_exit: false,
            bad_exit: None,
            kill_wait: Duration::ZERO,
            kill_at: None,
            killed: false,
        }
    }

    /// `-K/--kill-on-bad-exit`: the first task to exit non-zero ends the
    /// step's other tasks as Slurm's srun does: SIGTERM (their traps run),
    /// then SIGKILL `kill_wait` later to those still running. srun's exit
    /// is then the worst of all (143 for a task the TERM ended).
    pub fn kill_on_bad_exit(mut self, on: bool, kill_wait: Duration) -> Self {
        self.kill_on_bad_exit = on;
        self.kill_wait = kill_wait;
        self
    }

    /// Whether the next tick needs the job's state (asking costs a round
    /// trip to the controller).
    pub fn wants_job_state(&self) -> bool {
        if self.nodes_seen == 0 {
            return true;
        }
        !self.step_mode && self.missing() > 0
    }

    fn missing(&self) -> u32 {
        self.step_nodes
            .map_or(0, |n| n.saturating_sub(self.nodes_seen))
    }

    fn done(&self) -> bool {
        self.step_nodes.is_some_and(|n| self.nodes_seen >= n) && self.exited >= self.ntasks
    }

    /// Feeds one event; returns what to do, `Finish` last when it ends.
    pub fn handle(&mut self, e: Event) -> Vec<Action> {
        let mut out = Vec::new();
        match e {
            Event::NodeDialed {
                at,
                step_nodes,
                ntasks,
            } => {
                self.step_nodes = Some(step_nodes);
                self.ntasks = ntasks;
                self.nodes_seen += 1;
                self.first_hello.get_or_insert(at);
            }
            Event::TaskExited { exit } => {
                self.exited += 1;
                if exit.code > self.worst.code {
                    self.worst = exit;
                }
                if self.kill_on_bad_exit && exit.code != 0 && self.bad_exit.is_none() {
                    self.bad_exit = Some(exit);
                    if self.exited < self.ntasks {
                        out.push(Action::Say(format!(
                            "srun: error: a task of job {} exited with exit code {}: terminating the step's other tasks (--kill-on-bad-exit)",
                            self.job, exit.code
                        )));
                        out.push(Action::SignalAll(Signal::SIGTERM));
                    }
                }
            }
            Event::Interrupt { at } => {
                if self
                    .last_interrupt
                    .is_some_and(|t| at.saturating_duration_since(t) < DOUBLE_INTERRUPT)
                {
                    out.push(Action::Say("srun: forcing job termination".into()));
                    out.push(if self.step_mode {
                        Action::SignalAll(Signal::SIGKILL)
                    } else {
                        Action::CancelJob
                    });
                    out.push(Action::Finish(130));
                    return out;
                }
                out.push(Action::Say(
                    "srun: interrupt (one more within 1 sec to abort)".into(),
                ));
                self.last_interrupt = Some(at);
                out.push(Action::SignalAll(Signal::SIGINT));
            }
            Event::Tick { at, job } => self.tick(at, job, &mut out),
        }
        if !matches!(out.last(), Some(Action::Finish(_))) && self.done() {
            out.push(Action::Finish(self.worst.code));
        }
        out
    }

    fn tick(&mut self, at: Instant, job: Option<JobState>, out: &mut Vec<Action>) {
        let id = self.job;
        if self.bad_exit.is_some() && !self.killed && self.exited < self.ntasks {
            match self.kill_at {
                None => self.kill_at = Some(at + self.kill_wait),
                Some(k) if at >= k => {
                    out.push(Action::SignalAll(Signal::SIGKILL));
                    self.killed = true;
                }
                Some(_) => {}
            }
        }
        if let Some(first) = self.first_hello {
            let missing = self.missing();
            if missing == 0 {
                return;
            }
            let since = at.saturating_duration_since(first);
            let late = since > NODE_DIAL_WAIT;
            // No answer counts as gone: the job is not there to wait for.
            let ended =
                !self.step_mode && job.is_none_or(JobState::is_final) && since > ENDED_GRACE;
            if late || ended {
                out.push(Action::Say(format!(
                    "srun: error: only {} of {} nodes of job {id} connected back to srun at {}",
                    self.nodes_seen,
                    self.nodes_seen + missing,
                    self.addr
                )));
                out.push(Action::SignalAll(Signal::SIGKILL));
                if !self.step_mode {
                    out.push(Action::CancelJob);
                }
                out.push(Action::Finish(1));
            }
            return;
        }
        match job {
            Some(JobState::Pending)
                if !self.said_waiting
                    && at.saturating_duration_since(self.started) > QUIET_PENDING =>
            {
                out.push(Action::Say(format!(
                    "srun: job {id} queued and waiting for resources"
                )));
                self.said_waiting = true;
            }
            Some(st) if st.is_final() || st == JobState::Completing => {
                // A launch that never reached us: give the dial-back that
                // may be in flight a moment, then say so.
                let seen = *self.ended_unreached.get_or_insert(at);
                if at.saturating_duration_since(seen) >= NEVER_REACHED_GRACE {
                    out.push(Action::Say(format!(
                        "srun: error: job {id} ended before its tasks reached srun: {}",
                        st.name()
                    )));
                    out.push(Action::Finish(1));
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADDR: &str = "10.0.0.1:4000";

    fn watcher(step_mode: bool) -> (Watcher, Instant) {
        let t0 = Instant::now();
        let addr = ADDR.parse().expect("address");
        (Watcher::new(JobId(7), step_mode, addr, t0), t0)
    }

    fn ms(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    fn dialed(at: Instant, step_nodes: u32, ntasks: u32) -> Event {
        Event::NodeDialed {
            at,
            step_nodes,
            ntasks,
        }
    }

    fn exited(code: i32) -> Event {
        Event::TaskExited {
            exit: ExitStatus { code, signal: None },
        }
    }

    fn says(actions: &[Action], text: &str) -> bool {
        actions
            .iter()
            .any(|a| matches!(a, Action::Say(s) if s.contains(text)))
    }

    /// As Slurm 22.05's srun -K (checked on one, KillWait=5): the others
    /// get SIGTERM, those still running SIGKILL KillWait later, and
    /// srun's exit is the worst task's (143 for one the TERM ended, 137
    /// for one the KILL did, 7 for one whose TERM trap exited 7).
    #[test]
    fn kill_on_bad_exit_terminates_then_kills_and_exits_with_the_worst_code() {
        let t0 = Instant::now();
        let addr = ADDR.parse().expect("address");
        let mut w =
            Watcher::new(JobId(7), true, addr, t0).kill_on_bad_exit(true, Duration::from_secs(5));
        assert!(w.handle(dialed(ms(t0, 10), 1, 3)).is_empty());
        assert!(w.handle(exited(0)).is_empty());
        let a = w.handle(exited(3));
        assert!(says(&a, "exited with exit code 3"), "{a:?}");
        assert_eq!(a.last(), Some(&Action::SignalAll(Signal::SIGTERM)));
        let tick = |w: &mut Watcher, at| w.handle(Event::Tick { at, job: None });
        assert!(tick(&mut w, ms(t0, 1000)).is_empty(), "KillWait starts");
        assert!(tick(&mut w, ms(t0, 5500)).is_empty());
        assert_eq!(
            tick(&mut w, ms(t0, 6000)),
            [Action::SignalAll(Signal::SIGKILL)]
        );
        assert!(tick(&mut w, ms(t0, 7000)).is_empty(), "once");
        assert_eq!(w.handle(exited(137)), [Action::Finish(137)]);
        // A task whose TERM ended it: 143, over the first bad exit's 3.
        let mut w =
            Watcher::new(JobId(7), true, addr, t0).kill_on_bad_exit(true, Duration::from_secs(5));
        w.handle(dialed(ms(t0, 10), 1, 2));
        w.handle(exited(3));
        assert_eq!(w.handle(exited(143)), [Action::Finish(143)]);
        // Without -K, the others run on and the worst code counts.
        let (mut w, t0) = watcher(true);
        w.handle(dialed(ms(t0, 10), 1, 2));
        assert!(w.handle(exited(3)).is_empty());
        assert_eq!(w.handle(exited(0)), [Action::Finish(3)]);
    }

    #[test]
    fn done_when_every_node_dialled_and_every_task_exited_with_the_worst_code() {
        let (mut w, t0) = watcher(false);
        assert!(w.handle(dialed(ms(t0, 10), 2, 3)).is_empty());
        assert!(w.handle(exited(0)).is_empty());
        assert!(w.handle(exited(3)).is_empty());
        // Every task of the node that dialled ended, but a node is missing.
        assert!(w.handle(dialed(ms(t0, 20), 2, 3)).is_empty());
        assert_eq!(w.handle(exited(1)), [Action::Finish(3)]);
    }

    #[test]
    fn one_interrupt_forwards_sigint_and_a_second_within_a_second_ends_it() {
        let (mut w, t0) = watcher(false);
        let first = w.handle(Event::Interrupt { at: ms(t0, 0) });
        assert!(says(&first, "one more within 1 sec"));
        assert!(first.contains(&Action::SignalAll(Signal::SIGINT)));
        // Too late to count as the second: forwarded again.
        let again = w.handle(Event::Interrupt { at: ms(t0, 1500) });
        assert!(again.contains(&Action::SignalAll(Signal::SIGINT)));
        let last = w.handle(Event::Interrupt { at: ms(t0, 1900) });
        assert!(says(&last, "forcing job termination"));
        assert_eq!(last[1..], [Action::CancelJob, Action::Finish(130)]);
    }

    #[test]
    fn a_double_interrupt_in_a_step_kills_the_tasks_and_leaves_the_allocation() {
        let (mut w, t0) = watcher(true);
        w.handle(Event::Interrupt { at: ms(t0, 0) });
        let last = w.handle(Event::Interrupt { at: ms(t0, 200) });
        assert_eq!(
            last[1..],
            [Action::SignalAll(Signal::SIGKILL), Action::Finish(130)]
        );
    }

    #[test]
    fn nodes_that_never_dial_back_are_given_up_after_the_wait() {
        let (mut w, t0) = watcher(true);
        w.handle(dialed(ms(t0, 0), 3, 3));
        assert!(!w.wants_job_state(), "a step does not ask the controller");
        assert!(w
            .handle(Event::Tick {
                at: ms(t0, 9_000),
                job: None
            })
            .is_empty());
        let out = w.handle(Event::Tick {
            at: ms(t0, 10_500),
            job: None,
        });
        assert!(says(
            &out,
            "only 1 of 3 nodes of job 7 connected back to srun at 10.0.0.1:4000"
        ));
        assert_eq!(
            out[1..],
            [Action::SignalAll(Signal::SIGKILL), Action::Finish(1)]
        );
    }

    #[test]
    fn a_job_that_ended_with_nodes_missing_is_given_up_sooner_and_cancelled() {
        let (mut w, t0) = watcher(false);
        w.handle(dialed(ms(t0, 0), 2, 2));
        assert!(w.wants_job_state());
        let running = Some(JobState::Running);
        assert!(w
            .handle(Event::Tick {
                at: ms(t0, 1_000),
                job: running
            })
            .is_empty());
        // Ended, but within the grace: the other node may still come.
        let failed = Some(JobState::Failed);
        assert!(w
            .handle(Event::Tick {
                at: ms(t0, 1_500),
                job: failed
            })
            .is_empty());
        let out = w.handle(Event::Tick {
            at: ms(t0, 2_500),
            job: failed,
        });
        assert_eq!(
            out[1..],
            [
                Action::SignalAll(Signal::SIGKILL),
                Action::CancelJob,
                Action::Finish(1)
            ]
        );
    }

    #[test]
    fn a_job_that_ends_before_any_task_dials_back_is_reported() {
        let (mut w, t0) = watcher(false);
        let pending = Some(JobState::Pending);
        assert!(w
            .handle(Event::Tick {
                at: ms(t0, 500),
                job: pending
            })
            .is_empty());
        let out = w.handle(Event::Tick {
            at: ms(t0, 1_200),
            job: pending,
        });
        assert!(says(&out, "job 7 queued and waiting for resources"));
        // Said once.
        assert!(w
            .handle(Event::Tick {
                at: ms(t0, 1_700),
                job: pending
            })
            .is_empty());
        let failed = Some(JobState::Failed);
        assert!(w
            .handle(Event::Tick {
                at: ms(t0, 2_000),
                job: failed
            })
            .is_empty());
        let out = w.handle(Event::Tick {
            at: ms(t0, 2_500),
            job: failed,
        });
        assert!(says(
            &out,
            "job 7 ended before its tasks reached srun: FAILED"
        ));
        assert_eq!(out.last(), Some(&Action::Finish(1)));
    }

    #[test]
    fn a_late_dial_back_after_the_job_was_seen_ending_still_counts() {
        let (mut w, t0) = watcher(false);
        let completing = Some(JobState::Completing);
        assert!(w
            .handle(Event::Tick {
                at: ms(t0, 500),
                job: completing
            })
            .is_empty());
        w.handle(dialed(ms(t0, 600), 1, 1));
        assert_eq!(w.handle(exited(0)), [Action::Finish(0)]);
    }
}
