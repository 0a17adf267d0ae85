//! Property tests: random clusters, random event sequences, and the rules
//! that must hold whatever happens.

use std::collections::BTreeMap;

use proptest::prelude::*;
use scheduler_core::testing::{Driver, JobPlan, NodeShape, Op, Runtime};
use scheduler_core::*;

fn node_gen() -> impl Strategy<Value = NodeShape> {
    (1u32..=16, 0u32..=8, 0u32..=4, any::<bool>()).prop_map(|(cpus, gpus, per_group, fast)| {
        NodeShape {
            cpus,
            memory_mb: 1000,
            gpus,
            per_group,
            fast,
        }
    })
}

fn job_gen() -> impl Strategy<Value = JobPlan> {
    (
        (
            proptest::option::weighted(0.3, 1u32..=3),
            proptest::option::weighted(0.5, 1u32..=6),
            proptest::option::weighted(0.2, 1u32..=3),
            1u32..=4,
        ),
        prop_oneof![
            3 => Just(GpuRequest::None),
            3 => (1u32..=4).prop_map(GpuRequest::PerNode),
            1 => (1u32..=2).prop_map(GpuRequest::PerTask),
            1 => (1u32..=8).prop_map(GpuRequest::Total),
        ],
        proptest::bool::weighted(0.15),
        1u64..=300,
        1u64..=100,
        0u32..3,
        proptest::bool::weighted(0.1),
        proptest::option::weighted(0.15, (1u32..=6, 0u32..=2)),
    )
        .prop_map(
            |(
                (nodes, tasks, tasks_per_node, cpus_per_task),
                gpus,
                exclusive,
                limit,
                runs_pct,
                user,
                constraint,
                array,
            )| {
                let mut r = JobRequest::new(UserId(user));
                r.nodes = nodes;
                r.ntasks = tasks;
                r.ntasks_per_node = tasks_per_node;
                r.cpus_per_task = cpus_per_task;
                r.gpus = gpus;
                r.exclusive = exclusive;
                r.time_limit = Some(limit);
                if constraint {
                    r.features.push("fast".into());
                }
                r.array = array
                    .map(|(tasks, throttle)| scheduler_core::ArrayRequest::new(tasks, throttle));
                JobPlan {
                    runtime: Runtime::PercentOfLimit(runs_pct),
                    ..JobPlan::new(r)
                }
            },
        )
}

fn op_gen() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (job_gen(), proptest::option::weighted(0.15, (0u8..5, any::<u8>())))
            .prop_map(|(job, dep)| Op::Submit { job: Box::new(job), dep }),
        1 => any::<u8>().prop_map(Op::Cancel),
        1 => any::<u8>().prop_map(Op::Hold),
        1 => any::<u8>().prop_map(Op::Release),
        1 => any::<u8>().prop_map(Op::Requeue),
        1 => (any::<u8>(), -50i16..200, 1u16..2000)
            .prop_map(|(job, nice, limit)| Op::Update { job, nice, limit }),
        1 => (any::<u8>(), 1u16..2000).prop_map(|(job, limit)| Op::Limit { job, limit }),
        1 => any::<u8>().prop_map(Op::Suspend),
        1 => any::<u8>().prop_map(Op::Continue),
        1 => any::<u8>().prop_map(Op::Drain),
        1 => any::<u8>().prop_map(Op::Resume),
        1 => any::<u8>().prop_map(Op::Down),
        1 => any::<u8>().prop_map(Op::Remove),
        4 => (1u16..400).prop_map(Op::Advance),
        4 => Just(Op::Pass),
    ]
}

/// `shared`: one search class for all time limits of a shape (the
/// large-cluster path), else a class per limit.
fn world(policy: BackfillPolicy, nodes: &[NodeShape], shared: bool) -> Driver {
    Driver::with_nodes(
        SchedulerConfig {
            policy,
            split_limits_up_to_nodes: if shared { 0 } else { 4096 },
            requeue_delay: 30,
            ..SchedulerConfig::default()
        },
        nodes,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// No CPU or GPU given twice, no node over capacity, exclusive jobs
    /// alone (the audit), and every start exactly what was asked for.
    #[test]
    fn bookkeeping_holds_under_any_events(
        nodes in proptest::collection::vec(node_gen(), 1..6),
        ops in proptest::collection::vec(op_gen(), 1..80),
        policy in prop_oneof![Just(BackfillPolicy::Conservative), Just(BackfillPolicy::Easy), Just(BackfillPolicy::Fcfs)],
        shared in any::<bool>(),
    ) {
        let mut w = world(policy, &nodes, shared);
        for op in &ops {
            w.apply(op).map_err(TestCaseError::fail)?;
        }
        w.pass().map_err(TestCaseError::fail)?;
    }

    /// Same inputs, same decisions.
    #[test]
    fn decisions_are_deterministic(
        nodes in proptest::collection::vec(node_gen(), 1..5),
        ops in proptest::collection::vec(op_gen(), 1..60),
    ) {
        let run = || -> Result<Vec<String>, TestCaseError> {
            let mut w = world(BackfillPolicy::Conservative, &nodes, false);
            w.logging = true;
            for op in &ops {
                w.apply(op).map_err(TestCaseError::fail)?;
            }
            w.pass().map_err(TestCaseError::fail)?;
            Ok(w.log)
        };
        prop_assert_eq!(run()?, run()?);
    }

    /// With conservative backfill (and FCFS for its one reservation), when every job runs exactly
    /// its time limit and nothing else happens, every job starts exactly
    /// when its first reservation said: no later backfill decision delayed
    /// a reserved start, and no reservation was a promise it could not keep.
    #[test]
    fn reservations_are_kept(
        nodes in proptest::collection::vec(node_gen(), 1..5),
        jobs in proptest::collection::vec(job_gen(), 1..40),
        fcfs in any::<bool>(),
        first_fit in any::<bool>(),
        shared in any::<bool>(),
    ) {
        let policy = if fcfs { BackfillPolicy::Fcfs } else { BackfillPolicy::Conservative };
        let mut w = Driver::with_nodes(
            SchedulerConfig {
                policy,
                packing: if first_fit { Packing::FirstFit } else { Packing::BestFit },
                weights: PriorityWeights::age_only(),
                split_limits_up_to_nodes: if shared { 0 } else { 4096 },
                ..SchedulerConfig::default()
            },
            &nodes,
        );
        for job in &jobs {
            let job = JobPlan { runtime: Runtime::Limit, ..job.clone() };
            w.apply(&Op::Submit { job: Box::new(job), dep: None }).map_err(TestCaseError::fail)?;
        }
        let first = w.pass().map_err(TestCaseError::fail)?;
        let mut promised = BTreeMap::new();
        let mut started: BTreeMap<JobId, Secs> = first.iter().map(|d| (d.job, 0)).collect();
        for j in w.s.active_jobs().collect::<Vec<_>>() {
            match w.s.job_status(j) {
                Some(JobStatus::Pending { expected_start, reason, .. }) => {
                    // FCFS reserves only for the first job in line; an
                    // array at its %N waits for its own tasks, unplanned.
                    let throttled = reason == PendingReason::JobArrayTaskLimit;
                    prop_assert!(fcfs || throttled || expected_start.is_some(), "job {} got no reservation", j);
                    // An array's entry holds the reservation of its next task.
                    let next = w.s.array_waiting(j).first().map_or(j, |&(p, _)| JobId(j.0 + 1 + u64::from(p)));
                    if let Some(t) = expected_start {
                        promised.insert(next, t);
                    }
                }
                Some(JobStatus::Running { .. }) => {}
                other => prop_assert!(false, "{:?}", other),
            }
        }
        for (t, d) in w.run_until_idle().map_err(TestCaseError::fail)? {
            started.entry(d.job).or_insert(t);
        }
        for (j, t) in promised {
            prop_assert_eq!(started.get(&j).copied(), Some(t), "job {} promised {}", j, t);
        }
    }
}
