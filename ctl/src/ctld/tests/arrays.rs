//! Job arrays through the controller: one record until tasks start, a
//! record per task from then, `%N`, cancels of all or some, dependencies
//! on the whole, and a restart in the middle.

use super::harness::{job, Sim};
use super::relaunch::{registered, restarted};
use super::*;
use corral_proto::msg::{ArraySpec, Dep, DepCond, IndexRun};

fn array(first: u32, count: u32, step: u32, throttle: u32) -> ArraySpec {
    ArraySpec {
        runs: vec![IndexRun { first, count, step }],
        throttle,
    }
}

fn all_views(c: &Controller) -> Vec<JobView> {
    c.job_views(&JobFilter::default(), 0)
}

fn ids(views: &[JobView]) -> Vec<String> {
    views.iter().map(crate::cli::squeue::job_id).collect()
}

#[test]
fn an_array_is_one_record_until_its_tasks_start_then_each_is_a_job() {
    let mut sim = Sim::new(1);
    let mut plan = job().runs(5);
    plan.spec.array = Some(array(0, 20, 5, 3));
    let a = sim.submit(plan);
    // Its tasks keep the ids after its own.
    let next = sim.submit(job());
    assert_eq!(next.0, a.0 + 21);
    // A dependency on the whole array, and one on its task 5.
    let mut whole = job();
    whole.spec.dependencies = vec![Dep::AfterOk(a)];
    let whole = sim.submit(whole);
    let mut one = job();
    one.spec.dependencies = vec![Dep::Task {
        cond: DepCond::AfterOk,
        job: a,
        task: 5,
    }];
    let one = sim.submit(one);
    assert_eq!(ids(&all_views(&sim.c))[0], format!("{a}_[0-95:5%3]"));
    assert_eq!(sim.c.jobs.map.len(), 4, "one record for the twenty tasks");

    sim.run_for(1);
    let v = all_views(&sim.c);
    let shown = ids(&v);
    for t in [0, 5, 10] {
        assert!(shown.contains(&format!("{a}_{t}")), "{shown:?}");
    }
    assert!(shown.contains(&format!("{a}_[15-95:5%3]")), "{shown:?}");
    let entry = v.iter().find(|j| j.id == a).unwrap();
    assert_eq!(entry.reason, JobReason::JobArrayTaskLimit);
    // Task 5 is job a+2, with its own record.
    let t5 = v
        .iter()
        .find(|j| j.array.as_ref().and_then(|x| x.task) == Some(5))
        .unwrap();
    assert_eq!((t5.id.0, t5.state), (a.0 + 2, JobState::Running));
    assert_eq!(t5.stdout.as_deref(), Some("slurm-%A_%a.out"));

    // Waiting task 90 is cancelled alone; a task never heard of is refused.
    let only = |t| JobFilter {
        tasks: vec![(a, t)],
        ..Default::default()
    };
    sim.c.cancel(ALICE, &only(90), None, sim.now).unwrap();
    assert!(sim.c.cancel(ALICE, &only(91), None, sim.now).is_err());
    assert!(sim.c.cancel(BOB, &only(95), None, sim.now).is_err());
    let left = ids(&all_views(&sim.c));
    assert!(left.contains(&format!("{a}_[15-85:5,95%3]")), "{left:?}");
    // squeue -j a_95 shows that task alone.
    let v = sim.c.job_views(&only(95), 0);
    assert_eq!(ids(&v), [format!("{a}_95")]);

    // The first three end; the one on task 5 may start, not the whole's.
    sim.run_for(6);
    assert_eq!(sim.state(one), JobState::Running);
    assert_eq!(sim.state(whole), JobState::Pending);
    // Three at a time, 5 s each: 19 tasks in 7 rounds.
    sim.run_for(40);
    assert_eq!(sim.state(whole), JobState::Pending);
    let v = sim.c.job_views(
        &JobFilter {
            ids: vec![a],
            ..Default::default()
        },
        0,
    );
    assert_eq!(v.len(), 19, "every task that ran, as its own job");
    assert!(v.iter().all(|j| j.state == JobState::Completed));
    // Task 90 was cancelled: the array did not all succeed, so its
    // afterok dependant can never run.
    assert_eq!(sim.view(whole).reason, JobReason::DependencyNeverSatisfied);
}

#[test]
fn scancel_of_the_array_ends_its_running_and_waiting_tasks() {
    let mut sim = Sim::new(1);
    let mut plan = job().runs(100);
    plan.spec.array = Some(array(1, 100, 1, 0));
    let a = sim.submit(plan);
    sim.run_for(1);
    // 8 CPUs: eight tasks run.
    let running = all_views(&sim.c)
        .iter()
        .filter(|j| j.state == JobState::Running)
        .count();
    assert_eq!(running, 8);
    let f = JobFilter {
        ids: vec![a],
        ..Default::default()
    };
    sim.c.cancel(ALICE, &f, None, sim.now).unwrap();
    sim.run_for(7);
    let v = sim.c.job_views(&f, 0);
    assert_eq!(v.len(), 8, "the waiting ones never became jobs");
    assert!(v.iter().all(|j| j.state == JobState::Cancelled), "{v:?}");
    // The array's own record ended too, unseen, and took no accounting.
    let rec = sim.c.jobs.get(&a).unwrap();
    assert!(rec.state.is_final() && rec.accounted);
}

#[test]
fn an_array_survives_a_restart_with_what_waits_and_what_ended() {
    let mut c = cluster(1);
    let mut spec = batch("#!/bin/sh\necho $SLURM_ARRAY_TASK_ID\n");
    spec.array = Some(array(0, 6, 1, 2));
    let a = c.submit(ALICE, spec, 0).unwrap();
    let mut after = batch("x");
    after.dependencies = vec![Dep::AfterOk(a)];
    let after = c.submit(ALICE, after, 0).unwrap();
    c.schedule(1);
    let l = launches(&mut c);
    assert_eq!(l.len(), 2, "two at a time");
    let env = l[0].1.array.expect("a task's launch names its array");
    assert_eq!((env.job, env.task, env.count, env.max), (a, 0, 6, 5));
    // Task 0 ends; task 1 runs on.
    let t0 = l[0].1.job;
    let t1 = l[1].1.job;
    for m in [
        AgentMsg::StepExited {
            job: r0(t0),
            step: StepId::BATCH,
            exit: ExitStatus::default(),
            oom: false,
        },
        AgentMsg::JobCleaned {
            job: r0(t0),
            usage: None,
        },
    ] {
        c.agent_message("worker-0", m, 2);
    }
    c.schedule(3);
    let l = launches(&mut c);
    assert_eq!(l.len(), 1);
    let t2 = l[0].1.job;
    let mut c = restarted(&mut c, 4);
    let runs = [r0(t1), r0(t2)];
    let sent: Vec<corral_proto::msg::Launched> = runs
        .iter()
        .map(|&run| corral_proto::msg::Launched {
            run,
            batch: true,
            next: 0,
        })
        .collect();
    c.register(registered("worker-0", 1, &runs, &sent), 5)
        .unwrap();
    // Adopted; the array still waits for its last three, two at a time.
    assert_eq!(state(&c, t1), JobState::Running);
    assert!(launches(&mut c).is_empty());
    assert_eq!(c.schedule(6), 0, "its %2 is taken by the adopted two");
    // Every task ends in turn; the dependant starts after the last.
    let mut done = vec![t1, t2];
    let mut now = 7;
    while let Some(t) = done.pop() {
        for m in [
            AgentMsg::StepExited {
                job: r0(t),
                step: StepId::BATCH,
                exit: ExitStatus::default(),
                oom: false,
            },
            AgentMsg::JobCleaned {
                job: r0(t),
                usage: None,
            },
        ] {
            c.agent_message("worker-0", m, now);
        }
        now += 1;
        c.schedule(now);
        for (_, l) in launches(&mut c) {
            if l.job == after {
                assert!(done.is_empty(), "the dependant started early");
                continue;
            }
            done.push(l.job);
        }
    }
    assert_eq!(state(&c, after), JobState::Running);
}

/// Each of an array's tasks counts as a job against the user's and the
/// cluster's limits (Slurm's MaxSubmitJobs counts them): ten jobs a user
/// are one array of eight and two jobs, and the count falls as tasks end.
#[test]
fn an_arrays_tasks_count_against_the_job_limits() {
    let cfg =
        config_with("requeue_delay = 0\n[limits]\nmax_jobs_per_user = 10\nmax_job_count = 12");
    let mut sim = Sim::with(cfg, 1);
    let mut plan = job().runs(5);
    plan.spec.array = Some(array(0, 8, 1, 0));
    let a = sim.submit(plan);
    let mut again = batch("x");
    again.array = Some(array(0, 3, 1, 0));
    let e = sim
        .c
        .submit(ALICE, again.clone(), sim.now)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(
            "8 unfinished jobs and 3 more (an array's tasks each count), the limit per user is 10"
        ),
        "{e}"
    );
    sim.submit(job().runs(5));
    sim.submit(job().runs(5));
    let e = sim
        .c
        .submit(ALICE, batch("x"), sim.now)
        .unwrap_err()
        .to_string();
    assert!(e.contains("10 unfinished jobs and 1 more"), "{e}");
    // The cluster's count: Bob's two fit, a third does not.
    sim.c.submit(BOB, batch("x"), sim.now).unwrap();
    sim.c.submit(BOB, batch("x"), sim.now).unwrap();
    let e = sim
        .c
        .submit(BOB, batch("x"), sim.now)
        .unwrap_err()
        .to_string();
    assert!(e.contains("the cluster holds its limit of 12 jobs"), "{e}");
    // 8 CPUs: the array's eight run first and end; its tasks no longer count.
    sim.run_for(7);
    assert!(sim.state(a).is_final(), "{:?}", sim.state(a));
    sim.c.submit(ALICE, again, sim.now).unwrap();
}

/// Ids wrap back to 1 past `max_job_id`, skipping every id a job still
/// holds (a pending job's, an array's and its tasks'); ids freed by
/// forgotten jobs are given again.
#[test]
fn job_ids_wrap_at_max_job_id_skipping_those_in_use() {
    let cfg = config_with("requeue_delay = 0\nmin_job_age = 0\n[limits]\nmax_job_id = 20");
    let mut sim = Sim::with(cfg, 1);
    // 1 runs long; 2 ends and is forgotten; 3 is an array whose tasks
    // are 4 to 6, held while it waits.
    let long = sim.submit(job().runs(1000));
    let short = sim.submit(job().runs(1));
    let mut plan = job().runs(1000);
    plan.spec.array = Some(array(0, 3, 1, 0));
    plan.spec.cpus_per_task = Some(8);
    let a = sim.submit(plan);
    assert_eq!((long.0, short.0, a.0), (1, 2, 3));
    sim.run_for(5);
    assert!(sim.c.jobs.get(&short).is_none(), "forgotten");
    // 7 to 20, then round again.
    let mut got = Vec::new();
    for _ in 7..=20 {
        got.push(sim.c.submit(BOB, batch("x"), sim.now).unwrap().0);
    }
    assert_eq!(got, (7..=20).collect::<Vec<_>>());
    let next = sim.c.submit(BOB, batch("x"), sim.now).unwrap();
    assert_eq!(next.0, 2, "the forgotten job's id");
    // An array of two needs three ids in a row: none free below 20.
    let mut two = batch("x");
    two.array = Some(array(0, 2, 1, 0));
    let e = sim.c.submit(BOB, two, sim.now).unwrap_err().to_string();
    assert!(e.contains("no job id up to MaxJobId=20 is free"), "{e}");
}

/// MaxArraySize is Slurm's 1001 by default: indices up to 1000.
#[test]
fn arrays_are_held_to_max_array_size() {
    let mut c = cluster(1);
    let mut spec = batch("x");
    spec.array = Some(array(0, 1001, 1, 0));
    c.submit(ALICE, spec.clone(), 0).unwrap();
    spec.array = Some(array(1001, 1, 1, 0));
    let e = c.submit(ALICE, spec, 0).unwrap_err().to_string();
    assert!(
        e.contains("index 1001 is over the limit (MaxArraySize=1001)"),
        "{e}"
    );
    let view = c.config_view();
    let get = |k: &str| {
        view.iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(get("MaxArraySize").as_deref(), Some("1001"));
    assert_eq!(get("MaxJobId").as_deref(), Some("67043328"));
    assert!(get("SchedulerParameters")
        .unwrap()
        .contains("bf_max_job_array_resv=20"));
}

/// A hostile array whose counts add past a u32 is refused in one line,
/// not a panic (its tasks are counted before the array is checked).
#[test]
fn an_array_whose_counts_overflow_is_refused() {
    let mut c = cluster(1);
    let mut spec = batch("x");
    spec.array = Some(ArraySpec {
        runs: vec![
            IndexRun {
                first: 0,
                count: u32::MAX,
                step: 1,
            },
            IndexRun {
                first: 0,
                count: u32::MAX,
                step: 1,
            },
        ],
        throttle: 0,
    });
    let e = c.submit(ALICE, spec, 0).unwrap_err().to_string();
    assert!(e.contains("the cluster holds its limit"), "{e}");
}
