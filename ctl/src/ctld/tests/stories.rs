//! Lifecycle stories: the controller with fake agents, in virtual time.

use super::harness::{job, Sim};
use super::*;

#[test]
fn a_job_runs_completes_and_its_node_is_free_again() {
    let mut sim = Sim::new(1);
    let id = sim.submit(job().runs(30));
    assert_eq!(sim.view(id).partition, "gpu", "the default partition");
    // The pass at 1 s starts it; its tasks end 30 s later.
    sim.run_for(30);
    assert_eq!(sim.state(id), JobState::Running);
    sim.run_for(1);
    assert_eq!(sim.state(id), JobState::Completed);
    assert!(sim.running_on("worker-0").is_empty());
    let next = sim.submit(job().exits(3));
    sim.run_for(20);
    assert_eq!(sim.state(next), JobState::Failed);
    assert_eq!(sim.view(next).exit.code, 3);
}

/// A job that ended is kept `min_job_age` (300 s) after its end, then
/// forgotten and deleted from the store; jobs pending or running are
/// kept however old; a controller started again forgets what it read
/// back on the same clock.
#[test]
fn ended_jobs_are_forgotten_min_job_age_after_their_end() {
    let mut sim = Sim::new(1);
    let short = sim.submit(job().runs(5));
    let long = sim.submit(job().runs(400));
    let held = sim.submit(job().runs(5));
    sim.c.hold(ALICE, &[held], false).unwrap();
    while !sim.state(short).is_final() {
        sim.step();
    }
    let ended = sim.now;
    sim.run_for(300);
    assert!(sim.c.jobs.get(&short).is_some(), "kept for 300 s");
    sim.step();
    assert!(sim.c.jobs.get(&short).is_none(), "forgotten after 300 s");
    assert!(!sim.stored_job(short), "and deleted from the store");
    assert_eq!(sim.now - ended, 301);
    assert_eq!(sim.state(long), JobState::Running);
    assert_eq!(sim.state(held), JobState::Pending);
    while !sim.state(long).is_final() {
        sim.step();
    }
    let ended = sim.now;
    sim.run_for(100);
    let mut c = sim.restarted();
    c.register(super::reg("worker-0", 4), sim.now).unwrap();
    c.tick(ended + 300);
    assert!(c.jobs.get(&long).is_some(), "read back, kept for 300 s");
    c.tick(ended + 301);
    assert!(c.jobs.get(&long).is_none(), "read back, forgotten after");
    let h = c.jobs.get(&held).unwrap();
    assert_eq!(h.state, JobState::Pending, "{:?}", h.failure);
}

#[test]
fn a_lost_node_fails_its_jobs_and_requeues_those_that_asked() {
    let mut sim = Sim::new(2);
    let plain = sim.submit(job().runs(100).on("worker-0"));
    let again = sim.submit(job().runs(100).on("worker-0").requeue());
    sim.run_for(2);
    assert_eq!(sim.state(plain), JobState::Running);
    assert_eq!(sim.state(again), JobState::Running);
    sim.take_away("worker-0");
    // The heartbeat timeout is 10 s.
    sim.run_for(9);
    assert_eq!(sim.state(plain), JobState::Running);
    sim.run_for(3);
    assert_eq!(sim.state(plain), JobState::NodeFail);
    // Pinned to the lost node, the requeued job waits for it.
    assert_eq!(sim.state(again), JobState::Pending);
    assert_eq!(sim.view(again).restarts, 1);
}

#[test]
fn a_requeued_job_runs_again_elsewhere_and_completes() {
    let mut sim = Sim::new(2);
    let id = sim.submit(job().runs(20).requeue().nodes(1));
    sim.run_for(2);
    let first = sim.view(id).nodes[0].clone();
    sim.take_away(&first);
    sim.run_for(12);
    let second = sim.view(id);
    assert_eq!(second.state, JobState::Running, "{second:?}");
    assert_eq!(second.restarts, 1);
    assert_ne!(second.nodes[0], first);
    sim.run_for(21);
    assert_eq!(sim.state(id), JobState::Completed);
}

/// `scontrol requeue`: the run is ended as a cancel ends it, the job
/// waits Slurm's two minutes (`BeginTime`), then runs again as run 1;
/// `requeuehold` also holds it. Refused: another user's job, a pending
/// one, one submitted with `--no-requeue`.
#[test]
fn scontrol_requeue_ends_the_run_and_runs_the_job_again_after_the_delay() {
    let mut sim = Sim::with(super::config_with("requeue_delay = 120"), 1);
    let id = sim.submit(job().runs(1_000).requeue());
    let fixed = sim.submit(job().runs(1_000));
    sim.run_for(2);
    assert_eq!(sim.state(id), JobState::Running);
    let now = sim.now;
    let refused = |r: Result<Vec<JobId>, CtldError>| r.expect_err("refused").to_string();
    assert_eq!(
        refused(sim.c.requeue(BOB, &[id], false, now)),
        format!("Access/permission denied for job {id}")
    );
    assert_eq!(
        refused(sim.c.requeue(ALICE, &[fixed], false, now)),
        format!("Requested operation is presently disabled for job {fixed}")
    );
    assert_eq!(sim.c.requeue(ALICE, &[id, id], false, now), Ok(vec![id]));
    sim.deliver();
    let v = sim.view(id);
    assert_eq!((v.state, v.restarts), (JobState::Pending, 1));
    assert_eq!(v.reason, JobReason::BeginTime);
    assert_eq!(
        refused(sim.c.requeue(ALICE, &[id], false, now)),
        format!("Job is pending execution for job {id}")
    );
    sim.run_for(110);
    assert_eq!(sim.state(id), JobState::Pending, "not before the delay");
    sim.run_for(15);
    assert_eq!(sim.state(id), JobState::Running, "its second run");
    assert_eq!(sim.view(id).restarts, 1);
    // Held as well: the delay passes and it still waits for a release.
    let now = sim.now;
    assert_eq!(sim.c.requeue(ALICE, &[id], true, now), Ok(vec![id]));
    sim.deliver();
    sim.run_for(200);
    let v = sim.view(id);
    assert_eq!(
        (v.state, v.reason, v.restarts),
        (JobState::Pending, JobReason::JobHeldUser, 2)
    );
    sim.c.hold(ALICE, &[id], true).expect("released");
    sim.run_for(2);
    assert_eq!(sim.state(id), JobState::Running);
    // A hostile list of ids is refused whole, before any job is looked at.
    let many: Vec<JobId> = (0..=crate::ctld::MAX_FILTER_ENTRIES as u64)
        .map(JobId)
        .collect();
    let now = sim.now;
    assert!(matches!(
        sim.c.requeue(ALICE, &many, false, now),
        Err(CtldError::FilterTooLarge { .. })
    ));
}

#[test]
fn a_job_over_its_limit_times_out_and_is_cleaned_up() {
    let mut sim = Sim::new(1);
    let id = sim.submit(job().runs(1_000).limit(60));
    sim.run_for(59);
    assert_eq!(sim.state(id), JobState::Running);
    sim.run_for(3);
    assert_eq!(sim.state(id), JobState::Timeout);
    assert!(sim.running_on("worker-0").is_empty());
    assert_eq!(sim.view(id).reason, JobReason::TimeLimit);
}

#[test]
fn a_cancel_that_crosses_the_launch_ends_the_job_cleanly() {
    let mut sim = Sim::new(1);
    let id = sim.submit(job().runs(100));
    // The pass sends the launch; the cancel comes before the agent has
    // even heard of it, so its terminate follows the launch on the wire.
    assert!(sim.c.take_dirty());
    sim.c.schedule(sim.now);
    sim.c
        .cancel(
            ALICE,
            &JobFilter {
                ids: vec![id],
                ..Default::default()
            },
            None,
            sim.now,
        )
        .expect("Alice cancels her job");
    sim.deliver();
    assert_eq!(sim.state(id), JobState::Cancelled);
    assert!(sim.running_on("worker-0").is_empty());
    // The node takes the next job.
    let next = sim.submit(job().runs(5));
    sim.run_for(10);
    assert_eq!(sim.state(next), JobState::Completed);
}

#[test]
fn a_stopping_agent_drains_its_node_lets_its_job_finish_and_leaves() {
    let mut sim = Sim::new(2);
    let id = sim.submit(job().runs(20).on("worker-1"));
    sim.run_for(2);
    sim.stop_agent("worker-1", 60);
    let late = sim.submit(job().runs(5).on("worker-1"));
    sim.run_for(5);
    assert_eq!(sim.state(id), JobState::Running, "running jobs finish");
    assert_eq!(
        sim.state(late),
        JobState::Pending,
        "nothing new starts there"
    );
    let n = sim
        .c
        .node_views()
        .into_iter()
        .find(|n| n.name == "worker-1");
    let reason = n.and_then(|n| n.reason).unwrap_or_default();
    assert_eq!(reason, "node_leaving: its agent is stopping");
    sim.run_for(20);
    assert_eq!(sim.state(id), JobState::Completed);
    assert!(sim.farewell("worker-1"));
    assert!(
        sim.c.node_views().iter().all(|n| n.name != "worker-1"),
        "the node is gone"
    );
}

#[test]
fn a_stopping_agents_jobs_end_with_the_grace_and_requeue_if_they_asked() {
    let mut sim = Sim::new(2);
    let plain = sim.submit(job().runs(1_000).nodes(1).on("worker-1"));
    let again = sim.submit(job().runs(30).requeue().nodes(1));
    sim.run_for(2);
    assert_eq!(sim.state(again), JobState::Running);
    sim.stop_agent("worker-0", 10);
    sim.stop_agent("worker-1", 10);
    sim.run_for(12);
    assert_eq!(sim.state(plain), JobState::NodeFail);
    // Requeued, it waits for a node: both are gone.
    assert_eq!(sim.state(again), JobState::Pending);
    assert_eq!(sim.view(again).restarts, 1);
    assert!(sim.c.node_views().is_empty(), "both nodes left");
}

#[test]
fn operators_delete_nodes_idle_ones_at_once_busy_ones_after_their_jobs() {
    let mut sim = Sim::new(3);
    let id = sim.submit(job().runs(10).on("worker-1"));
    sim.run_for(2);
    let refused = sim.c.delete_nodes(ALICE, "worker-0", sim.now).unwrap_err();
    assert_eq!(refused.to_string(), "Access/permission denied");
    let unknown = sim.c.delete_nodes(ROOT, "worker-9", sim.now).unwrap_err();
    assert_eq!(unknown.to_string(), "Invalid node name specified: worker-9");
    sim.c
        .delete_nodes(ROOT, "worker-[0-1]", sim.now)
        .expect("an operator deletes nodes");
    sim.deliver();
    assert!(sim.farewell("worker-0"), "idle: gone at once");
    assert!(!sim.farewell("worker-1"), "busy: its job finishes first");
    sim.run_for(10);
    assert_eq!(sim.state(id), JobState::Completed);
    assert!(sim.farewell("worker-1"));
    let left: Vec<String> = sim.c.node_views().into_iter().map(|n| n.name).collect();
    assert_eq!(left, ["worker-2"]);
}

/// `scontrol suspend` and `resume`: the job's processes stop on its
/// nodes and its time limit stops counting; resumed, it ends later by the
/// time it was stopped. Operators only; a pending, finished or running
/// (for resume) job is refused in Slurm's words.
#[test]
fn a_suspended_job_stops_its_limit_and_ends_that_much_later() {
    let mut sim = Sim::new(1);
    let id = sim.submit(job().runs(1_000).limit(60));
    sim.run_for(2);
    let mut whole = job().runs(1_000);
    whole.spec.cpus_per_task = Some(8);
    let waiting = sim.submit(whole);
    let start = sim.view(id).start_time.expect("started");
    let run = JobRun { job: id, run: 0 };
    sim.run_for(8);
    let now = sim.now;
    let refused = |r: Result<Vec<JobId>, CtldError>| r.expect_err("refused").to_string();
    assert_eq!(
        refused(sim.c.suspend(ALICE, &[id], false, now)),
        format!("Access/permission denied for job {id}"),
        "owners may not, as in Slurm"
    );
    assert_eq!(
        refused(sim.c.suspend(ROOT, &[id], true, now)),
        format!("Job is not suspended for job {id}")
    );
    assert_eq!(
        refused(sim.c.suspend(ROOT, &[id, waiting], false, now)),
        format!("Job is pending execution for job {waiting}")
    );
    assert_eq!(
        refused(sim.c.suspend(ROOT, &[JobId(999)], false, now)),
        "Invalid job id specified: 999"
    );
    assert_eq!(sim.state(id), JobState::Running, "refused whole");
    assert_eq!(sim.c.suspend(ROOT, &[id, id], false, now), Ok(vec![id]));
    sim.deliver();
    assert!(sim.frozen_on("worker-0", run));
    let v = sim.view(id);
    assert_eq!(v.state, JobState::Suspended);
    let s = v.suspension.expect("its suspension");
    assert_eq!((s.since, s.changed, s.paused), (Some(now), now, 0));
    assert_eq!(s.pre_suspend, now - start);
    // Selections see it as SUSPENDED.
    let f = JobFilter {
        states: vec![JobState::Suspended],
        ..Default::default()
    };
    assert_eq!(sim.c.job_views(&f, now).len(), 1);
    // Again: no change. Its steps wait.
    assert_eq!(sim.c.suspend(ROOT, &[id], false, now + 1), Ok(vec![id]));
    let e = sim
        .c
        .submit_step(ALICE, super::step_spec(id, "x", 1), now)
        .expect_err("no steps while suspended")
        .to_string();
    assert_eq!(
        e,
        format!("Job {id} is suspended: its steps wait for scontrol resume")
    );
    // Far past its limit, it is not timed out, and its node stays its.
    sim.run_for(100);
    assert_eq!(sim.state(id), JobState::Suspended);
    assert_eq!(sim.state(waiting), JobState::Pending);
    let resumed = sim.now;
    assert_eq!(sim.c.suspend(ROOT, &[id], true, resumed), Ok(vec![id]));
    sim.deliver();
    assert!(!sim.frozen_on("worker-0", run));
    let v = sim.view(id);
    assert_eq!(v.state, JobState::Running);
    let s = v.suspension.expect("kept");
    assert_eq!((s.since, s.paused, s.changed), (None, 100, resumed));
    let end = start + 60 + 100;
    assert_eq!(v.end_time, Some(end), "its end moved by the suspension");
    // Run time leaves the suspension out: 10 s before, 5 after.
    sim.run_for(5);
    assert_eq!(
        crate::cli::squeue::run_secs(&sim.view(id), sim.now),
        sim.now - start - 100
    );
    sim.run_for(end - sim.now - 1);
    assert_eq!(sim.state(id), JobState::Running);
    sim.run_for(2);
    assert_eq!(sim.state(id), JobState::Timeout);
    assert_eq!(sim.view(id).suspension.map(|s| s.paused), Some(100));
    let now = sim.now;
    assert_eq!(
        refused(sim.c.suspend(ROOT, &[id], false, now)),
        format!("Job/step already completing or completed for job {id}")
    );
}

/// A suspended job cancelled ends as any (its node thaws it first); one
/// requeued waits held, as Slurm's; a suspension still going when the
/// controller restarts is kept, and the job's limit with it.
#[test]
fn a_suspended_job_is_cancelled_requeued_held_and_kept_over_a_restart() {
    let mut sim = Sim::with(super::config_with("requeue_delay = 0"), 2);
    let a = sim.submit(job().runs(1_000).on("worker-0"));
    let b = sim.submit(job().runs(1_000).requeue().on("worker-1"));
    sim.run_for(2);
    let now = sim.now;
    assert_eq!(sim.c.suspend(ROOT, &[a, b], false, now), Ok(vec![a, b]));
    sim.deliver();
    sim.c
        .cancel(
            ALICE,
            &JobFilter {
                ids: vec![a],
                ..Default::default()
            },
            None,
            now,
        )
        .expect("cancelled");
    sim.deliver();
    assert_eq!(sim.state(a), JobState::Cancelled);
    assert!(!sim.frozen_on("worker-0", JobRun { job: a, run: 0 }));
    assert_eq!(sim.c.requeue(ROOT, &[b], false, now), Ok(vec![b]));
    sim.deliver();
    sim.run_for(5);
    let v = sim.view(b);
    assert_eq!(
        (v.state, v.reason),
        (JobState::Pending, JobReason::JobHeldAdmin)
    );
    assert_eq!(v.suspension, None, "a new run has none");
    // Released, it runs again; suspended, the controller restarts.
    sim.c.hold(ROOT, &[b], true).expect("released");
    sim.run_for(2);
    assert_eq!(sim.state(b), JobState::Running);
    let now = sim.now;
    sim.c.suspend(ROOT, &[b], false, now).expect("suspended");
    sim.deliver();
    let before = sim.view(b);
    let mut c2 = sim.restarted();
    for n in ["worker-0", "worker-1"] {
        let running: Vec<JobRun> = (n == "worker-1")
            .then_some(JobRun { job: b, run: 1 })
            .into_iter()
            .collect();
        c2.register(super::relaunch::registered(n, 1, &running, &[]), now + 1)
            .expect("registers");
    }
    let after = view(&c2, b);
    assert_eq!(after.state, JobState::Suspended);
    assert_eq!(after.suspension, before.suspension);
    // Told again where it stands, in case the first word was lost.
    let told: Vec<CtldMsg> = c2
        .take_outbox()
        .into_iter()
        .filter(|(n, _)| n == "worker-1")
        .map(|(_, m)| m)
        .collect();
    assert!(
        told.iter()
            .any(|m| matches!(m, CtldMsg::Suspend { job, stop: true } if job.job == b)),
        "{told:?}"
    );
    // Never overdue while suspended (its nodes beating); resumed, it runs
    // on.
    let later = now + 10_000;
    for (n, running) in [
        ("worker-0", vec![]),
        ("worker-1", vec![JobRun { job: b, run: 1 }]),
    ] {
        c2.agent_message(n, AgentMsg::Heartbeat { running }, later);
    }
    c2.tick(later);
    assert_eq!(view(&c2, b).state, JobState::Suspended);
    assert_eq!(c2.suspend(ROOT, &[b], true, now + 10_000), Ok(vec![b]));
    assert_eq!(view(&c2, b).state, JobState::Running);
}
