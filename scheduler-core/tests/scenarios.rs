//! Scheduling stories, one rule each.

mod harness;

use harness::{cpus, gpus, job, Kind, Sim};
use scheduler_core::*;

#[test]
fn backfill_fills_a_hole_without_delaying_the_reserved_job() {
    let mut sim = Sim::new().nodes(2, gpus(8));
    let a = sim.submit(job().gpus(8).time(100)); // node A busy until 100
    let b = sim.submit(job().gpus(4).time(1000)); // half of node B until 1000
    sim.pass();
    let big = sim.submit(job().nodes(2).gpus(8).time(500)); // needs both nodes
    let short = sim.submit(job().gpus(4).time(900)); // fits B's free half, ends before 1000
    let long = sim.submit(job().gpus(8).time(2000)); // would fit A at 100, but delays `big`
    sim.pass();
    assert_eq!(sim.start(short), Some(0), "backfilled into B's free GPUs");
    assert_eq!(sim.expected(big), Some(1000));
    assert_eq!(sim.reason(big), PendingReason::Resources);
    assert_eq!(sim.expected(long), Some(1500), "queued after the gang job");
    assert_eq!(sim.reason(long), PendingReason::Priority);
    sim.run_until_idle();
    assert_eq!(sim.start(a), Some(0));
    assert_eq!(sim.start(b), Some(0));
    assert_eq!(sim.start(big), Some(1000));
    assert_eq!(sim.start(long), Some(1500));
}

#[test]
fn backfill_that_would_delay_a_reservation_waits() {
    let mut sim = Sim::new().nodes(1, cpus(8));
    sim.submit(job().tasks(4).time(100));
    let wide = sim.submit(job().tasks(8).time(100)); // waits for all 8 CPUs at 100
    let fits = sim.submit(job().tasks(4).time(100)); // ends at 100: fine
    let too_long = sim.submit(job().tasks(4).time(101)); // would overlap `wide`
    sim.pass();
    assert_eq!(sim.start(fits), Some(0));
    assert_eq!(sim.expected(wide), Some(100));
    assert_eq!(sim.expected(too_long), Some(200));
    sim.run_until_idle();
    assert_eq!(sim.start(wide), Some(100));
    assert_eq!(sim.start(too_long), Some(200));
}

#[test]
fn easy_reserves_only_for_the_first_waiting_job() {
    let mut sim = Sim::tuned(|c| c.policy = BackfillPolicy::Easy).nodes(1, cpus(8));
    sim.submit(job().tasks(8).time(100));
    let first = sim.submit(job().tasks(8).time(100));
    let second = sim.submit(job().tasks(8).time(100));
    sim.pass();
    assert_eq!(sim.expected(first), Some(100));
    assert_eq!(sim.expected(second), None);
    sim.run_until_idle();
    assert_eq!(sim.start(second), Some(200));
}

#[test]
fn fcfs_never_lets_a_later_job_pass() {
    let mut sim = Sim::tuned(|c| c.policy = BackfillPolicy::Fcfs).nodes(1, cpus(8));
    sim.submit(job().tasks(4).time(100));
    let wide = sim.submit(job().tasks(8).time(100));
    let small = sim.submit(job().tasks(1).time(10)); // would fit now
    sim.run_until_idle();
    assert_eq!(sim.start(wide), Some(100));
    assert_eq!(
        sim.start(small),
        Some(200),
        "behind the wide job, not around it"
    );
}

#[test]
fn small_gpu_jobs_pack_into_one_node_and_one_group() {
    let mut sim = Sim::new().nodes(2, gpus(8));
    let ones: Vec<JobId> = (0..3).map(|_| sim.submit(job().gpus(1))).collect();
    sim.pass();
    let four = sim.submit(job().gpus(4));
    sim.pass();
    let eight = sim.submit(job().gpus(8));
    sim.pass();
    for &j in &ones {
        assert_eq!(sim.node_names(j), ["node-0"]);
    }
    let mut used: Vec<u32> = ones
        .iter()
        .flat_map(|&j| sim.run(j).nodes[0].gpus.clone())
        .collect();
    used.sort();
    assert_eq!(used, [0, 1, 2], "one topology group, lowest first");
    assert_eq!(sim.node_names(four), ["node-0"]);
    assert_eq!(
        sim.run(four).nodes[0].gpus,
        [4, 5, 6, 7],
        "a whole free group"
    );
    assert_eq!(
        sim.node_names(eight),
        ["node-1"],
        "a whole node stayed free"
    );
}

#[test]
fn first_fit_strands_gpus_that_best_fit_keeps_whole() {
    // Node 0 has 6 free GPUs, node 1 has 2 free (each half of a group used).
    let story = |packing: Packing| {
        let mut sim = Sim::tuned(|c| c.packing = packing).nodes(2, gpus(8));
        sim.submit(job().gpus(2).nodelist(&["node-0"]).time(1000));
        sim.submit(job().gpus(6).nodelist(&["node-1"]).time(1000));
        sim.pass();
        let two = sim.submit(job().gpus(2).time(1000));
        let six = sim.submit(job().gpus(6).time(1000));
        sim.pass();
        (sim.start(two), sim.start(six))
    };
    assert_eq!(story(Packing::BestFit), (Some(0), Some(0)));
    assert_eq!(story(Packing::FirstFit), (Some(0), None));
}

#[test]
fn best_fit_does_not_strand_gpus_without_cpus() {
    let small = Kind {
        cpus: 16,
        mem: 64_000,
        gpus: 4,
        per_group: 0,
        features: Vec::new(),
    };
    let mut sim = Sim::new().nodes(2, small);
    // node-0: 2 GPUs and 4 CPUs free; node-1: 3 GPUs and 12 CPUs free.
    sim.submit(job().gpus(2).cpus(12).nodelist(&["node-0"]).time(1000));
    sim.submit(job().gpus(1).cpus(4).nodelist(&["node-1"]).time(1000));
    sim.pass();
    // Plain best fit would pick node-0 and leave its last GPU without a
    // CPU to use it.
    let j = sim.submit(job().gpus(1).cpus(4).time(1000));
    sim.pass();
    assert_eq!(sim.node_names(j), ["node-1"]);
    let fits_tightly = sim.submit(job().gpus(2).cpus(4).time(1000));
    sim.pass();
    assert_eq!(
        sim.node_names(fits_tightly),
        ["node-0"],
        "uses the whole remainder"
    );
}

#[test]
fn gpus_per_task_gives_each_task_its_own_gpus() {
    let mut sim = Sim::new().nodes(2, gpus(8));
    let j = sim.submit(job().tasks(6).gpus_per_task(2));
    sim.pass();
    let run = sim.run(j);
    let tasks: u32 = run.nodes.iter().map(|a| a.tasks).sum();
    assert_eq!(tasks, 6);
    for a in &run.nodes {
        assert_eq!(a.gpus.len() as u32, a.tasks * 2);
        let mut g = a.gpus.clone();
        g.sort();
        g.dedup();
        assert_eq!(g.len(), a.gpus.len(), "distinct GPUs per task");
    }
    assert_eq!(
        run.nodes.len(),
        2,
        "4 tasks fill one node, 2 go to the next"
    );
}

#[test]
fn total_gpus_spread_evenly_over_the_fewest_nodes() {
    let mut sim = Sim::new().nodes(3, gpus(8));
    let j = sim.submit(job().total_gpus(16));
    sim.pass();
    let run = sim.run(j);
    assert_eq!(run.nodes.len(), 2);
    assert!(run.nodes.iter().all(|a| a.gpus.len() == 8));
}

#[test]
fn a_gang_starts_on_all_its_nodes_at_once() {
    let mut sim = Sim::new().nodes(3, gpus(8));
    sim.submit(job().gpus(8).time(50).nodelist(&["node-0"]));
    sim.submit(job().gpus(8).time(300).nodelist(&["node-1"]));
    sim.pass();
    let gang = sim.submit(job().nodes(3).gpus(8).time(100));
    sim.run_until_idle();
    let run = sim.run(gang);
    assert_eq!(run.start, 300, "waits for the last node, not the first");
    assert_eq!(run.nodes.len(), 3);
}

#[test]
fn exclusive_jobs_take_whole_idle_nodes_and_share_nothing() {
    let mut sim = Sim::new().nodes(2, gpus(8));
    let small = sim.submit(job().gpus(1).time(100));
    sim.pass();
    let ex = sim.submit(job().exclusive().time(100));
    let other = sim.submit(job().gpus(1).time(100));
    sim.pass();
    assert_eq!(sim.node_names(small), ["node-0"]);
    assert_eq!(sim.node_names(ex), ["node-1"]);
    assert_eq!(sim.run(ex).nodes[0].gpus.len(), 8);
    assert_eq!(sim.run(ex).nodes[0].cpus.len(), 64);
    assert_eq!(sim.node_names(other), ["node-0"]);
    let ex2 = sim.submit(job().exclusive().time(100));
    sim.pass();
    assert_eq!(sim.expected(ex2), Some(100));
    sim.run_until_idle();
    assert_eq!(sim.start(ex2), Some(100));
}

#[test]
fn dependencies_wait_run_or_never_run() {
    let mut sim = Sim::new().nodes(1, cpus(8));
    let ok = sim.submit(job().time(10));
    let bad = sim.submit(job().time(20).fails());
    let after_ok = sim.submit(job().after(Dependency::AfterOk(ok)));
    let after_bad_ok = sim.submit(job().after(Dependency::AfterOk(bad)));
    let after_bad_notok = sim.submit(job().after(Dependency::AfterNotOk(bad)));
    let after_any = sim.submit(job().after(Dependency::AfterAny(bad)));
    let after_start = sim.submit(job().after(Dependency::After(ok)));
    sim.pass();
    assert_eq!(sim.reason(after_ok), PendingReason::Dependency);
    sim.pass(); // `ok` has started now
    assert_eq!(
        sim.start(after_start),
        Some(0),
        "`after` needs only the start"
    );
    sim.run_until_idle();
    assert_eq!(sim.start(after_ok), Some(10));
    assert_eq!(sim.start(after_bad_notok), Some(20));
    assert_eq!(sim.start(after_any), Some(20));
    assert_eq!(
        sim.reason(after_bad_ok),
        PendingReason::DependencyNeverSatisfied
    );
}

/// `-d afterok:a?afterok:b`: the first condition met starts the job; it
/// is never satisfied only once none can be.
#[test]
fn any_of_several_dependencies_starts_a_job_at_the_first_met() {
    let mut sim = Sim::new().nodes(1, cpus(8));
    let slow = sim.submit(job().time(50));
    let fast = sim.submit(job().time(10));
    let bad = sim.submit(job().time(5).fails());
    let either = sim.submit(
        job()
            .after(Dependency::AfterOk(slow))
            .after(Dependency::AfterOk(fast))
            .any_dependency(),
    );
    let both = sim.submit(
        job()
            .after(Dependency::AfterOk(slow))
            .after(Dependency::AfterOk(fast)),
    );
    let bad_or_slow = sim.submit(
        job()
            .after(Dependency::AfterOk(bad))
            .after(Dependency::AfterOk(slow))
            .any_dependency(),
    );
    let bad_or_bad = sim.submit(
        job()
            .after(Dependency::AfterOk(bad))
            .after(Dependency::AfterNotOk(fast))
            .any_dependency(),
    );
    sim.run_until_idle();
    assert_eq!(sim.start(either), Some(10));
    assert_eq!(sim.start(both), Some(50));
    assert_eq!(
        sim.start(bad_or_slow),
        Some(50),
        "one failed, the other held"
    );
    assert_eq!(
        sim.reason(bad_or_bad),
        PendingReason::DependencyNeverSatisfied
    );
}

#[test]
fn singleton_runs_one_job_of_a_name_at_a_time() {
    let mut sim = Sim::new().nodes(1, cpus(8));
    let a = sim.submit(job().name("train").after(Dependency::Singleton).time(50));
    let b = sim.submit(job().name("train").after(Dependency::Singleton).time(50));
    let other = sim.submit(job().name("eval").after(Dependency::Singleton).time(50));
    sim.pass();
    assert_eq!(sim.reason(b), PendingReason::Dependency);
    sim.run_until_idle();
    assert_eq!(sim.start(a), Some(0));
    assert_eq!(sim.start(other), Some(0));
    assert_eq!(sim.start(b), Some(50));
}

/// Which of a small job and a large one queued after it starts first once
/// the node frees: their start times (one node of 8 CPUs, both 100 s).
fn small_then_large(cfg: SchedulerConfig) -> (Option<Secs>, Option<Secs>) {
    let mut sim = Sim::with(cfg).nodes(1, cpus(8));
    sim.submit(job().tasks(8).time(100));
    sim.pass();
    let small = sim.submit(job().tasks(2).time(100));
    let large = sim.submit(job().tasks(8).time(100));
    sim.run_until_idle();
    (sim.start(small), sim.start(large))
}

#[test]
fn by_default_one_users_jobs_start_in_submit_order_whatever_their_size() {
    assert_eq!(
        small_then_large(SchedulerConfig::default()),
        (Some(100), Some(200))
    );
}

#[test]
fn a_size_weight_puts_the_large_job_first() {
    let cfg = SchedulerConfig {
        weights: PriorityWeights {
            size: 1_000,
            ..PriorityWeights::default()
        },
        ..SchedulerConfig::default()
    };
    assert_eq!(small_then_large(cfg), (Some(200), Some(100)));
}

#[test]
fn fair_share_puts_the_light_user_first() {
    let cfg = SchedulerConfig {
        weights: PriorityWeights {
            age: 0,
            size: 0,
            partition: 0,
            qos: 0,
            fairshare: 10_000,
            max_age: 1,
        },
        ..SchedulerConfig::default()
    };
    let mut sim = Sim::with(cfg).nodes(1, gpus(8));
    // User 1 burns the node for a while.
    sim.submit(job().user(1).gpus(8).time(1000));
    sim.run_until_idle();
    sim.submit(job().user(2).gpus(1).time(10)); // user 2 shows up, tiny usage
    sim.run_until_idle();
    let heavy = sim.submit(job().user(1).gpus(8).time(100));
    let light = sim.submit(job().user(2).gpus(8).time(100));
    sim.pass();
    assert_eq!(sim.start(light), Some(sim.d.now));
    assert_eq!(sim.reason(heavy), PendingReason::Resources);
    let Some(JobStatus::Pending { priority, .. }) = sim.d.s.job_status(heavy) else {
        panic!("heavy user's job waits")
    };
    assert!(
        priority < 10_000,
        "usage lowered the fair-share factor: {priority}"
    );
}

#[test]
fn usage_decays_with_the_half_life() {
    // User 1 used much long ago, user 2 a little just now. With a short
    // half-life the old usage has faded and user 1 comes first; with a very
    // long one user 1 is still the heavy user.
    let order = |half_life: Secs| {
        let cfg = SchedulerConfig {
            weights: PriorityWeights {
                age: 0,
                size: 0,
                partition: 0,
                qos: 0,
                fairshare: 10_000,
                max_age: 1,
            },
            fairshare_half_life: half_life,
            ..SchedulerConfig::default()
        };
        let mut sim = Sim::with(cfg).nodes(1, cpus(8));
        sim.submit(job().user(1).tasks(8).time(100));
        sim.run_until_idle();
        sim.advance_to(1100);
        sim.submit(job().user(2).time(10));
        sim.run_until_idle();
        sim.submit(job().user(3).tasks(8).time(1000)); // fills the node
        sim.pass();
        let one = sim.submit(job().user(1));
        let two = sim.submit(job().user(2));
        sim.pass();
        let prio = |j| match sim.d.s.job_status(j) {
            Some(JobStatus::Pending { priority, .. }) => priority,
            other => panic!("{other:?}"),
        };
        prio(one) > prio(two)
    };
    assert!(order(100), "ten half-lives on, the old usage has faded");
    assert!(!order(1_000_000_000), "without decay user 1 stays heavy");
}

#[test]
fn a_drained_node_gets_no_new_work_but_keeps_its_jobs() {
    let mut sim = Sim::new().nodes(2, cpus(4));
    let running = sim.submit(job().tasks(2).time(100).nodelist(&["node-0"]));
    sim.pass();
    let n0 = sim.node("node-0");
    sim.d
        .s
        .handle_node_admin(
            sim.d.now,
            n0,
            NodeAdmin::Drain {
                reason: "bad fan".into(),
            },
        )
        .expect("drain");
    assert_eq!(
        sim.d.s.node_info(n0).map(|n| n.state),
        Some(NodeState::Draining)
    );
    let next: Vec<JobId> = (0..3)
        .map(|_| sim.submit(job().tasks(2).time(100)))
        .collect();
    sim.pass();
    assert_eq!(sim.node_names(next[0]), ["node-1"]);
    assert_eq!(sim.node_names(next[1]), ["node-1"]);
    assert_eq!(sim.expected(next[2]), Some(100));
    let pinned = sim.submit(job().nodelist(&["node-0"]));
    sim.pass();
    assert_eq!(sim.reason(pinned), PendingReason::ReqNodeNotAvail);
    sim.run_until_idle();
    assert_eq!(sim.run(running).end, 100, "the running job was left alone");
    assert_eq!(
        sim.d.s.node_info(n0).map(|n| n.state),
        Some(NodeState::Drained)
    );
    sim.d
        .s
        .handle_node_admin(sim.d.now, n0, NodeAdmin::Up)
        .expect("resume");
    sim.pass();
    assert_eq!(sim.start(pinned), Some(sim.d.now));
}

#[test]
fn a_lost_node_reports_its_jobs_and_requeues_those_that_asked() {
    let mut sim = Sim::new().nodes(2, gpus(8));
    let plain = sim.submit(job().gpus(4).nodelist(&["node-0"]));
    let requeue = sim.submit(job().gpus(4).nodelist(&["node-0"]).requeue());
    sim.pass();
    let n0 = sim.node("node-0");
    let mut lost = sim
        .d
        .s
        .handle_node_admin(
            5,
            n0,
            NodeAdmin::Down {
                reason: "not responding".into(),
            },
        )
        .expect("down");
    lost.sort_by_key(|l| match l {
        LostJob::Failed(j) | LostJob::Requeued(j) => *j,
    });
    assert_eq!(lost, [LostJob::Failed(plain), LostJob::Requeued(requeue)]);
    assert_eq!(
        sim.d.s.job_status(plain),
        Some(JobStatus::Finished(JobOutcome::NodeFail))
    );
    sim.d.s.audit().expect("consistent after loss");
    sim.d.now = 5;
    sim.pass();
    assert_eq!(sim.reason(requeue), PendingReason::ReqNodeNotAvail);
    let removed = sim.d.s.handle_node_removed(6, n0).expect("remove");
    assert!(removed.is_empty());
    assert!(sim.d.s.node_info(n0).is_none());
}

#[test]
fn a_requeued_job_frees_its_gpus_and_waits_the_delay_before_it_runs_again() {
    let mut sim = Sim::tuned(|c| c.requeue_delay = 120).nodes(1, gpus(8));
    let a = sim.submit(job().gpus(8).time(1000).runs(500));
    sim.pass();
    assert_eq!(sim.start(a), Some(0));
    let b = sim.submit(job().gpus(4).time(100).runs(100));
    sim.d.now = 10;
    // The driver ended the run's processes; the job queues again.
    sim.d.s.requeue(10, a, None).expect("requeue a running job");
    sim.d.ends.remove(&a);
    sim.d.s.audit().expect("consistent after the requeue");
    assert_eq!(
        sim.d.s.requeue(10, a, None),
        Err(ControlError::NotRunning(a)),
        "a pending job is not requeued"
    );
    sim.pass();
    assert_eq!(
        sim.start(b),
        Some(10),
        "the freed GPUs went to the next job"
    );
    assert_eq!(sim.reason(a), PendingReason::BeginTime);
    sim.advance_to(129);
    sim.pass();
    assert_eq!(sim.start(a), Some(0), "not before now + requeue_delay");
    sim.d.now = 130;
    sim.pass();
    assert_eq!(sim.start(a), Some(130), "its second run");
    // Held as well: it waits for a release, not only for the delay.
    let mut sim = Sim::tuned(|c| c.requeue_delay = 120).nodes(1, gpus(8));
    let c = sim.submit(job().gpus(1).time(1000).runs(500));
    sim.pass();
    assert_eq!(sim.start(c), Some(0));
    let now = sim.d.now;
    sim.d
        .s
        .requeue(now, c, Some(HoldKind::User))
        .expect("requeue held");
    sim.d.ends.remove(&c);
    // Held from the requeue on, before any pass (a pass no longer reads
    // held jobs), and in the held index the audit checks.
    assert_eq!(sim.reason(c), PendingReason::JobHeldUser);
    sim.d.s.audit().unwrap();
    sim.d.now = now + 1_000;
    sim.pass();
    assert_eq!(sim.reason(c), PendingReason::JobHeldUser);
    sim.d.s.release(c, HoldKind::User).unwrap();
    sim.d.s.audit().unwrap();
    sim.pass();
    assert_eq!(sim.start(c), Some(now + 1_000), "released, it runs again");
    sim.d.s.audit().unwrap();
}

#[test]
fn impossible_requests_are_refused_at_submit() {
    let mut sim = Sim::new().nodes(2, gpus(8));
    let err = |sim: &mut Sim, def| sim.try_submit(def).expect_err("refused");
    assert!(matches!(
        err(&mut sim, job().gpus(9)),
        SubmitError::NodeConfigUnavailable(_)
    ));
    assert!(matches!(
        err(&mut sim, job().nodes(3)),
        SubmitError::NodeConfigUnavailable(_)
    ));
    assert!(matches!(
        err(&mut sim, job().time(200_000)),
        SubmitError::TimeLimit { .. }
    ));
    assert!(matches!(
        err(&mut sim, job().partition("nope")),
        SubmitError::UnknownPartition(_)
    ));
    assert!(matches!(
        err(&mut sim, job().nodelist(&["ghost"])),
        SubmitError::UnknownNode(_)
    ));
    assert!(matches!(
        err(&mut sim, job().constraint("h100")),
        SubmitError::NodeConfigUnavailable(_)
    ));
    assert!(matches!(
        err(&mut sim, job().cpus(65)),
        SubmitError::NodeConfigUnavailable(_)
    ));
    assert!(matches!(
        err(&mut sim, job().after(Dependency::AfterOk(JobId(999)))),
        SubmitError::UnknownDependency(_)
    ));
    assert!(matches!(
        err(&mut sim, job().nodes(2).tasks(1)),
        SubmitError::Invalid(_)
    ));
    let mut bad_qos = job();
    bad_qos.req.qos = Some("bogus".into());
    assert!(matches!(err(&mut sim, bad_qos), SubmitError::UnknownQos(_)));
    let msg = err(&mut sim, job().gpus(9)).to_string();
    assert!(
        msg.starts_with("requested node configuration is not available"),
        "{msg}"
    );
    assert_eq!(
        sim.d.s.pending_count(),
        0,
        "nothing refused sits in the queue"
    );
}

#[test]
fn reasons_for_held_begin_and_partition_limit() {
    let mut sim = Sim::tuned(|c| c.weights.max_age = 1000).nodes(1, cpus(4));
    let held = sim.submit(job().held());
    let later = sim.submit(job().begin(500));
    let long = sim.submit(job().time(50_000));
    sim.d
        .s
        .update_partition_limits("batch", None, Some(1000), 1)
        .expect("update");
    sim.pass();
    assert_eq!(sim.reason(held), PendingReason::JobHeldUser);
    assert_eq!(sim.reason(later), PendingReason::BeginTime);
    assert_eq!(sim.reason(long), PendingReason::PartitionTimeLimit);
    // Blocked, they keep a priority (squeue %Q, -S p, scontrol top treat
    // them as other pending jobs, as Slurm's); a held job's is 0.
    sim.advance_to(100);
    sim.pass();
    let priority = |id| match sim.d.s.job_status(id) {
        Some(JobStatus::Pending { priority, .. }) => priority,
        other => panic!("{other:?}"),
    };
    assert!(priority(later) > 0 && priority(long) > 0);
    assert_eq!(priority(held), 0);
    assert_eq!(sim.reason(later), PendingReason::BeginTime);
    assert_eq!(sim.d.s.next_wakeup(sim.d.now), Some(500));
    sim.d.s.hold(held, HoldKind::Admin).expect("admin hold");
    assert_eq!(
        sim.d.s.release(held, HoldKind::User),
        Err(ControlError::AdminHold(held))
    );
    sim.d
        .s
        .release(held, HoldKind::Admin)
        .expect("admin release");
    sim.advance_to(500);
    sim.pass();
    assert_eq!(sim.start(held), Some(500));
    assert_eq!(sim.start(later), Some(500));
}

#[test]
fn a_hold_shows_as_the_reason_before_any_pass() {
    let mut sim = Sim::new().nodes(1, cpus(4));
    let held = sim.submit(job().held());
    assert_eq!(sim.reason(held), PendingReason::JobHeldUser);
    let other = sim.submit(job().begin(500));
    assert_eq!(sim.reason(other), PendingReason::None);
    sim.d.s.hold(other, HoldKind::Admin).expect("admin hold");
    assert_eq!(sim.reason(other), PendingReason::JobHeldAdmin);
}

#[test]
fn behind_a_job_without_a_time_limit_the_reason_is_resources() {
    let mut sim = Sim::new().nodes(1, cpus(4));
    sim.d
        .s
        .update_partition_limits("batch", None, None, 1)
        .expect("unlimited partition");
    let mut forever = job().tasks(4);
    forever.req.time_limit = None;
    sim.submit(forever);
    let next = sim.submit(job().tasks(1));
    sim.pass();
    assert_eq!(sim.reason(next), PendingReason::Resources);
    assert_eq!(
        sim.expected(next),
        None,
        "no promise behind an unlimited job"
    );
}

#[test]
fn cancel_removes_pending_and_asks_the_driver_to_kill_running() {
    let mut sim = Sim::new().nodes(1, cpus(4));
    let run = sim.submit(job().tasks(4));
    let wait = sim.submit(job().tasks(4));
    sim.pass();
    assert_eq!(sim.d.s.cancel(wait), Ok(Cancelled::Pending));
    assert_eq!(
        sim.d.s.job_status(wait),
        Some(JobStatus::Finished(JobOutcome::Cancelled))
    );
    let Ok(Cancelled::Running(alloc)) = sim.d.s.cancel(run) else {
        panic!("running job")
    };
    assert_eq!(alloc[0].cpus, [0, 1, 2, 3]);
    sim.d
        .s
        .handle_job_finished(3, run, JobOutcome::Cancelled)
        .expect("finish");
    assert_eq!(
        sim.d.s.cancel(JobId(77)),
        Err(ControlError::UnknownJob(JobId(77)))
    );
}

#[test]
fn constraints_and_required_nodes_steer_placement() {
    let mut sim = Sim::new()
        .nodes(2, gpus(8))
        .nodes(1, gpus(8).feature("h200"));
    let h200 = sim.submit(job().gpus(1).constraint("h200"));
    let pinned = sim.submit(job().gpus(1).nodelist(&["node-1"]));
    sim.pass();
    assert_eq!(sim.node_names(h200), ["node-2"]);
    assert_eq!(sim.node_names(pinned), ["node-1"]);
}

/// `-C a100|h200`: a node with either will do, and a two-node job may
/// mix them; `-C a100&h200` needs both on each node, and none has.
#[test]
fn a_constraint_of_alternatives_takes_any_node_with_one() {
    let mut sim = Sim::new()
        .nodes(1, gpus(8))
        .nodes(1, gpus(8).feature("a100"))
        .nodes(1, gpus(8).feature("h200"));
    let either = sim.submit(
        job()
            .nodes(2)
            .gpus(1)
            .constraint("a100")
            .constraint("h200")
            .any_constraint(),
    );
    sim.pass();
    assert_eq!(sim.node_names(either), ["node-1", "node-2"]);
    let both = sim.try_submit(job().constraint("a100").constraint("h200"));
    assert!(both.is_err(), "no node has both");
}

/// `--mem-per-cpu` grows with the tasks a node takes (and limits how
/// many it takes), `--mem-per-gpu` with its GPUs, `--mem=0` takes each
/// node's whole memory.
#[test]
fn memory_per_cpu_per_gpu_and_whole_node() {
    // 8 CPUs and 64,000 MB per node.
    let mut sim = Sim::new().nodes(2, cpus(8));
    // 6 tasks at 20,000 MB each: three fit a node by memory.
    let spread = sim.submit(job().tasks(6).mem_per_cpu(20_000));
    sim.pass();
    let r = sim.run(spread);
    let per_node: Vec<(u32, u64)> = r.nodes.iter().map(|a| (a.tasks, a.memory_mb)).collect();
    assert_eq!(per_node, [(3, 60_000), (3, 60_000)]);
    sim.run_until_idle();
    let whole = sim.submit(job().mem_whole());
    let small = sim.submit(job().tasks(1).mem_per_cpu(1_000));
    sim.pass();
    let w = sim.run(whole);
    assert_eq!(w.nodes[0].memory_mb, 64_000);
    assert_ne!(
        sim.node_names(small),
        sim.node_names(whole),
        "no memory left beside it"
    );
    let mut gpu = Sim::new().nodes(1, gpus(8));
    let g = gpu.submit(job().gpus(2).mem_per_gpu(1_000));
    gpu.pass();
    assert_eq!(gpu.run(g).nodes[0].memory_mb, 2_000);
}

#[test]
fn nodes_that_register_later_join_their_partition() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    let mut p = PartitionSpec::new("gpu", "worker-[0-1]");
    p.is_default = true;
    s.add_partition(p).expect("partition");
    s.add_partition(PartitionSpec::new("other", "login-0"))
        .expect("partition");
    s.add_partition(PartitionSpec::new("everything", "ALL"))
        .expect("partition");
    let w1 = s
        .handle_node_added(NodeSpec::new("worker-1", 8, 1000).with_gpus(2, 0))
        .expect("node");
    let stray = s
        .handle_node_added(NodeSpec::new("stray", 8, 1000))
        .expect("node");
    let gpu = s.partition_id("gpu").expect("gpu");
    assert_eq!(s.partition_nodes(gpu), [w1]);
    assert!(!s.partition_nodes(gpu).contains(&stray));
    let everything = s.partition_id("everything").expect("everything");
    assert_eq!(
        s.partition_nodes(everything),
        [w1, stray],
        "a node may be in several partitions"
    );
    let mut req = JobRequest::new(UserId(5));
    req.gpus = GpuRequest::PerNode(2);
    s.submit(0, JobId(1), req).expect("submit");
    let starts = s.schedule(0);
    assert_eq!(starts[0].nodes[0].node, w1);
    assert_eq!(starts[0].nodes[0].gpus, [0, 1]);
    assert!(s
        .handle_node_added(NodeSpec::new("worker-1", 8, 1000))
        .is_err());
}

#[test]
fn a_pending_job_updated_keeps_its_age_and_hold_and_is_checked_again() {
    let mut sim = Sim::new().nodes(1, cpus(4));
    let busy = sim.submit(job().time(1000));
    let held = sim.submit(job().held());
    sim.pass();
    assert_eq!(sim.start(busy), Some(0));
    // A lower priority and a partition named: accepted, still held.
    let mut nicer = job().req;
    nicer.nice = 100;
    nicer.partition = Some("batch".into());
    sim.d.s.update(held, nicer).expect("update");
    sim.pass();
    assert_eq!(sim.reason(held), PendingReason::JobHeldUser);
    // Refused as a submission would be: a partition that does not exist,
    // a shape no node has; the job stays as it was.
    let mut nowhere = job().req;
    nowhere.partition = Some("nowhere".into());
    assert!(matches!(
        sim.d.s.update(held, nowhere),
        Err(UpdateError::Submit(SubmitError::UnknownPartition(_)))
    ));
    let mut huge = job().req;
    huge.ntasks = Some(64);
    assert!(matches!(
        sim.d.s.update(held, huge),
        Err(UpdateError::Submit(_))
    ));
    // A running job is not changed this way.
    assert_eq!(
        sim.d.s.update(busy, job().req),
        Err(UpdateError::Control(ControlError::NotPending(busy)))
    );
    // Released, it runs with its new shape once the node is free.
    sim.d.s.release(held, HoldKind::User).expect("release");
    sim.advance_to(1000);
    sim.pass();
    assert_eq!(sim.start(held), Some(1000));
}

#[test]
fn a_running_jobs_new_limit_moves_the_plans_behind_it() {
    let mut sim = Sim::new().nodes(1, cpus(4));
    let mut whole = job().time(1000);
    whole.req.ntasks = Some(4);
    let running = sim.submit(whole);
    sim.pass();
    assert_eq!(sim.start(running), Some(0));
    let mut next = job().time(100);
    next.req.ntasks = Some(4);
    let waiting = sim.submit(next);
    sim.pass();
    assert_eq!(sim.d.s.reservation(waiting).map(|r| r.start), Some(1000));
    // Shortened: the waiting job's plan moves up; the job is overdue at
    // its new end.
    assert_eq!(sim.d.s.set_running_limit(running, Some(400)), Ok(400));
    sim.pass();
    assert_eq!(sim.d.s.reservation(waiting).map(|r| r.start), Some(400));
    assert_eq!(sim.d.s.overdue_jobs(400), [running]);
    assert_eq!(
        sim.d.s.set_running_limit(waiting, Some(10)),
        Err(ControlError::NotRunning(waiting))
    );
}

#[test]
fn a_suspended_job_keeps_its_nodes_and_its_limit_stops_counting() {
    let mut sim = Sim::new().nodes(1, cpus(4));
    let mut whole = job().time(1000);
    whole.req.ntasks = Some(4);
    let running = sim.submit(whole);
    sim.pass();
    assert_eq!(sim.start(running), Some(0));
    let mut next = job().time(100);
    next.req.ntasks = Some(4);
    let waiting = sim.submit(next);
    // Suspended at 100: the node stays its, and it is never overdue
    // while suspended, nor planned to end.
    sim.d.s.suspend(100, running).expect("suspend");
    assert!(sim.d.s.is_suspended(running));
    assert_eq!(sim.d.s.suspend(150, running), Ok(()), "twice is no change");
    sim.d.now = 2000;
    sim.pass();
    assert_eq!(sim.start(waiting), None);
    assert_eq!(sim.reason(waiting), PendingReason::Resources);
    assert!(sim.d.s.overdue_jobs(5000).is_empty());
    assert_eq!(sim.d.s.next_wakeup(2000), None);
    // Shortened while suspended: the end it will have counts from the
    // suspension.
    assert_eq!(sim.d.s.set_running_limit(running, Some(900)), Ok(900));
    assert!(sim.d.s.overdue_jobs(5000).is_empty());
    // Resumed at 2000 after 1900 s: it ends 1900 s later than its limit.
    assert_eq!(sim.d.s.resume(2000, running), Ok(2800));
    assert!(!sim.d.s.is_suspended(running));
    assert_eq!(
        sim.d.s.resume(2001, running),
        Err(ControlError::NotSuspended(running))
    );
    assert!(sim.d.s.overdue_jobs(2799).is_empty());
    assert_eq!(sim.d.s.overdue_jobs(2800), [running]);
    assert_eq!(sim.d.s.next_wakeup(2000), Some(2800));
    sim.pass();
    assert_eq!(sim.d.s.reservation(waiting).map(|r| r.start), Some(2800));
    // Suspended twice: both pauses count.
    sim.d.s.suspend(2100, running).expect("suspend again");
    assert_eq!(sim.d.s.resume(2200, running), Ok(2900));
    // A job that is not running cannot be either.
    assert_eq!(
        sim.d.s.suspend(2200, waiting),
        Err(ControlError::NotRunning(waiting))
    );
    assert_eq!(
        sim.d.s.resume(2200, waiting),
        Err(ControlError::NotRunning(waiting))
    );
    // A restarted driver gives the pauses back after adopting.
    assert_eq!(
        sim.d.s.restore_suspension(running, 500, Some(2300)),
        Ok(1400)
    );
    assert!(sim.d.s.is_suspended(running));
    assert_eq!(sim.d.s.resume(2400, running), Ok(1500));
}

/// A job's tasks over its nodes as Slurm 22.05 lays them (checked on
/// 4-CPU nodes): `-N2 -n4` takes 3 + 1 (CPUs follow the tasks, the
/// first node filled), `-N2 --exclusive -n4` whole nodes with the tasks
/// dealt round, 2 + 2.
#[test]
fn tasks_lie_over_nodes_as_slurms() {
    let per_node = |exclusive: bool| {
        let mut sim = Sim::new().nodes(2, cpus(4));
        let mut j = job().nodes(2).tasks(4).time(100).runs(100);
        if exclusive {
            j = j.exclusive();
        }
        let id = sim.submit(j);
        sim.pass();
        let mut t: Vec<u32> = sim.run(id).nodes.iter().map(|a| a.tasks).collect();
        t.sort_unstable_by(|a, b| b.cmp(a));
        t
    };
    assert_eq!(per_node(false), [3, 1]);
    assert_eq!(per_node(true), [2, 2]);
}
