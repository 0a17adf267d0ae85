//! Property tests: random clusters, random event sequences, and the rules
//! that must hold whatever happens.

use std::collections::BTreeMap;

use proptest::prelude::*;
use scheduler_core::*;

#[derive(Clone, Debug)]
struct NodeGen {
    cpus: u32,
    gpus: u32,
    per_group: u32,
    feature: bool,
}

fn node_gen() -> impl Strategy<Value = NodeGen> {
    (1u32..=16, 0u32..=8, 0u32..=4, any::<bool>()).prop_map(|(cpus, gpus, per_group, feature)| {
        NodeGen {
            cpus,
            gpus,
            per_group,
            feature,
        }
    })
}

#[derive(Clone, Debug)]
struct JobGen {
    nodes: Option<u32>,
    tasks: Option<u32>,
    tasks_per_node: Option<u32>,
    cpus_per_task: u32,
    gpus: GpuRequest,
    exclusive: bool,
    limit: Secs,
    /// Run time as a share of the limit, in percent.
    runs_pct: u64,
    user: u32,
    constraint: bool,
    dep: Option<(u8, u8)>,
}

fn job_gen() -> impl Strategy<Value = JobGen> {
    (
        proptest::option::weighted(0.3, 1u32..=3),
        proptest::option::weighted(0.5, 1u32..=6),
        proptest::option::weighted(0.2, 1u32..=3),
        1u32..=4,
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
        proptest::option::weighted(0.15, (0u8..4, any::<u8>())),
    )
        .prop_map(
            |(
                nodes,
                tasks,
                tasks_per_node,
                cpus_per_task,
                gpus,
                exclusive,
                limit,
                runs_pct,
                user,
                constraint,
                dep,
            )| {
                JobGen {
                    nodes,
                    tasks,
                    tasks_per_node,
                    cpus_per_task,
                    gpus,
                    exclusive,
                    limit,
                    runs_pct,
                    user,
                    constraint,
                    dep,
                }
            },
        )
}

#[derive(Clone, Debug)]
enum Op {
    Submit(JobGen),
    Cancel(u8),
    Hold(u8),
    Release(u8),
    Drain(u8),
    Resume(u8),
    Down(u8),
    Remove(u8),
    Advance(u16),
    Pass,
}

fn op_gen() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => job_gen().prop_map(Op::Submit),
        1 => any::<u8>().prop_map(Op::Cancel),
        1 => any::<u8>().prop_map(Op::Hold),
        1 => any::<u8>().prop_map(Op::Release),
        1 => any::<u8>().prop_map(Op::Drain),
        1 => any::<u8>().prop_map(Op::Resume),
        1 => any::<u8>().prop_map(Op::Down),
        1 => any::<u8>().prop_map(Op::Remove),
        4 => (1u16..400).prop_map(Op::Advance),
        4 => Just(Op::Pass),
    ]
}

fn request(g: &JobGen) -> JobRequest {
    let mut r = JobRequest::new(UserId(g.user));
    r.nodes = g.nodes;
    r.ntasks = g.tasks;
    r.ntasks_per_node = g.tasks_per_node;
    r.cpus_per_task = g.cpus_per_task;
    r.gpus = g.gpus;
    r.exclusive = g.exclusive;
    r.time_limit = Some(g.limit);
    if g.constraint {
        r.features.push("fast".into());
    }
    r
}

/// Drives a scheduler through a sequence and records everything it said.
struct World {
    s: Scheduler,
    now: Secs,
    next_job: u64,
    jobs: BTreeMap<JobId, JobGen>,
    ends: BTreeMap<JobId, Secs>,
    log: Vec<String>,
}

impl World {
    /// `shared`: one search class for all time limits of a shape (the
    /// large-cluster path), else a class per limit.
    fn new(policy: BackfillPolicy, nodes: &[NodeGen], shared: bool) -> World {
        Self::with(
            SchedulerConfig {
                policy,
                split_limits_up_to_nodes: if shared { 0 } else { 4096 },
                ..SchedulerConfig::default()
            },
            nodes,
        )
    }

    /// A world on `nodes` with this configuration; every search is
    /// cross-checked against a full scan.
    fn with(cfg: SchedulerConfig, nodes: &[NodeGen]) -> World {
        let mut s = Scheduler::new(SchedulerConfig {
            verify_search: true,
            ..cfg
        });
        let mut p = PartitionSpec::new("all", "ALL");
        p.is_default = true;
        s.add_partition(p).expect("partition");
        for (i, n) in nodes.iter().enumerate() {
            let mut spec =
                NodeSpec::new(format!("n{i}"), n.cpus, 1000).with_gpus(n.gpus, n.per_group);
            if n.feature {
                spec.features.push("fast".into());
            }
            s.handle_node_added(spec).expect("node");
        }
        World {
            s,
            now: 0,
            next_job: 1,
            jobs: BTreeMap::new(),
            ends: BTreeMap::new(),
            log: Vec::new(),
        }
    }

    fn pick_job(&self, k: u8) -> Option<JobId> {
        let ids: Vec<JobId> = self.s.active_jobs().collect();
        (!ids.is_empty()).then(|| ids[k as usize % ids.len()])
    }

    fn pick_node(&self, k: u8) -> Option<NodeId> {
        let ids: Vec<NodeId> = self.s.node_ids().collect();
        (!ids.is_empty()).then(|| ids[k as usize % ids.len()])
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match op {
            Op::Submit(g) => {
                let mut r = request(g);
                if let Some((kind, k)) = g.dep {
                    if let Some(target) = self.pick_job(k) {
                        r.dependencies.push(match kind {
                            0 => Dependency::AfterOk(target),
                            1 => Dependency::AfterAny(target),
                            2 => Dependency::AfterNotOk(target),
                            _ => Dependency::Singleton,
                        });
                    }
                }
                let id = JobId(self.next_job);
                self.next_job += 1;
                let res = self.s.submit(self.now, id, r);
                self.log.push(format!(
                    "submit {id} {:?}",
                    res.as_ref().map_err(ToString::to_string)
                ));
                if res.is_ok() {
                    self.jobs.insert(id, g.clone());
                }
            }
            Op::Cancel(k) => {
                if let Some(j) = self.pick_job(*k) {
                    if let Ok(Cancelled::Running(_)) = self.s.cancel(j) {
                        self.ends.remove(&j);
                        self.s
                            .handle_job_finished(self.now, j, JobOutcome::Cancelled)
                            .expect("finish");
                    }
                }
            }
            Op::Hold(k) => {
                if let Some(j) = self.pick_job(*k) {
                    let _ = self.s.hold(j, HoldKind::User);
                }
            }
            Op::Release(k) => {
                if let Some(j) = self.pick_job(*k) {
                    let _ = self.s.release(j, HoldKind::User);
                }
            }
            Op::Drain(k) | Op::Resume(k) | Op::Down(k) | Op::Remove(k) => {
                if let Some(n) = self.pick_node(*k) {
                    let lost = match op {
                        Op::Drain(_) => self.s.handle_node_admin(
                            self.now,
                            n,
                            NodeAdmin::Drain { reason: "t".into() },
                        ),
                        Op::Resume(_) => self.s.handle_node_admin(self.now, n, NodeAdmin::Up),
                        Op::Down(_) => self.s.handle_node_admin(
                            self.now,
                            n,
                            NodeAdmin::Down { reason: "t".into() },
                        ),
                        _ => self.s.handle_node_removed(self.now, n),
                    }
                    .expect("known node");
                    for l in lost {
                        let (LostJob::Failed(j) | LostJob::Requeued(j)) = l;
                        self.ends.remove(&j);
                    }
                }
            }
            Op::Advance(d) => {
                self.now += Secs::from(*d);
                let due: Vec<JobId> = self
                    .ends
                    .iter()
                    .filter(|(_, &e)| e <= self.now)
                    .map(|(&j, _)| j)
                    .collect();
                for j in due {
                    self.ends.remove(&j);
                    self.s
                        .handle_job_finished(self.now, j, JobOutcome::Completed)
                        .expect("finish");
                }
            }
            Op::Pass => self.pass()?,
        }
        self.s.audit().map_err(TestCaseError::fail)?;
        Ok(())
    }

    fn pass(&mut self) -> Result<(), TestCaseError> {
        let starts = self.s.schedule(self.now);
        for d in &starts {
            let g = &self.jobs[&d.job];
            check_shape(&self.s, g, d)?;
            let runtime = ((d.end_by - self.now) * g.runs_pct / 100).max(1);
            self.ends.insert(d.job, self.now + runtime);
            self.log.push(format!("{} start {:?}", self.now, d));
        }
        for j in self.s.active_jobs().collect::<Vec<_>>() {
            self.log.push(format!("{j} {:?}", self.s.job_status(j)));
        }
        check_plan(&self.s, self.now)
    }
}

/// The pass's plan is a schedule that can be kept: running jobs and every
/// reservation together never put a node over its CPUs or memory or give a
/// GPU to two jobs at once. So no job started by backfill takes anything a
/// reservation was promised.
fn check_plan(s: &Scheduler, now: Secs) -> Result<(), TestCaseError> {
    // node -> (start, end, job, cpus, mem, gpus)
    type Use = (Secs, Secs, JobId, u32, u64, Vec<u32>);
    let mut uses: BTreeMap<NodeId, Vec<Use>> = BTreeMap::new();
    for j in s.active_jobs() {
        match s.job_status(j) {
            Some(JobStatus::Running { end_by, nodes, .. }) => {
                for a in nodes {
                    let u = (
                        now,
                        end_by.max(now + 1),
                        j,
                        a.cpus.len() as u32,
                        a.memory_mb,
                        a.gpus,
                    );
                    uses.entry(a.node).or_default().push(u);
                }
            }
            Some(JobStatus::Pending {
                expected_start: Some(t),
                ..
            }) => {
                let r = s
                    .reservation(j)
                    .expect("a job with an expected start holds a reservation");
                prop_assert_eq!(r.start, t);
                prop_assert!(r.start > now);
                for a in &r.nodes {
                    let u = (r.start, r.end, j, a.cpus, a.memory_mb, a.gpus.clone());
                    uses.entry(a.node).or_default().push(u);
                }
            }
            _ => {}
        }
    }
    for (node, list) in uses {
        let info = s.node_info(node).expect("planned node exists");
        let mut times: Vec<Secs> = list.iter().map(|u| u.0).collect();
        times.sort_unstable();
        times.dedup();
        for t in times {
            let live: Vec<_> = list.iter().filter(|u| u.0 <= t && t < u.1).collect();
            let cpus: u32 = live.iter().map(|u| u.3).sum();
            let mem: u64 = live.iter().map(|u| u.4).sum();
            prop_assert!(
                cpus <= info.cpus,
                "node {} has {} CPUs planned at {}",
                info.name,
                cpus,
                t
            );
            prop_assert!(mem <= info.memory_mb);
            let mut gpus: Vec<u32> = live.iter().flat_map(|u| u.5.iter().copied()).collect();
            let n = gpus.len();
            gpus.sort_unstable();
            gpus.dedup();
            prop_assert_eq!(
                gpus.len(),
                n,
                "a GPU of {} planned twice at {}",
                info.name,
                t
            );
            prop_assert!(gpus.iter().all(|&g| g < info.gpus));
        }
    }
    Ok(())
}

/// A start decision gives the job exactly what it asked for.
fn check_shape(s: &Scheduler, g: &JobGen, d: &StartDecision) -> Result<(), TestCaseError> {
    let tasks: u32 = d.nodes.iter().map(|a| a.tasks).sum();
    let want_tasks = match (g.nodes, g.tasks, g.tasks_per_node) {
        (_, _, Some(_)) => tasks, // rounded up to whole nodes
        (_, Some(t), None) => t,
        (Some(n), None, None) => n,
        // --gpus=T alone: one task on each node the GPUs are spread over.
        (None, None, None) if matches!(g.gpus, GpuRequest::Total(_)) => d.nodes.len() as u32,
        (None, None, None) => 1,
    };
    prop_assert_eq!(tasks, want_tasks.max(1));
    if let Some(n) = g.nodes {
        prop_assert_eq!(d.nodes.len() as u32, n);
    }
    let mut seen = std::collections::BTreeSet::new();
    for a in &d.nodes {
        prop_assert!(seen.insert(a.node), "node twice in one job");
        let info = s.node_info(a.node).expect("node exists");
        prop_assert!(a.tasks >= 1);
        if let Some(tpn) = g.tasks_per_node {
            prop_assert_eq!(a.tasks, tpn);
        }
        if g.constraint {
            prop_assert!(info.features.iter().any(|f| f == "fast"));
        }
        if g.exclusive {
            prop_assert_eq!(a.cpus.len() as u32, info.cpus);
            prop_assert_eq!(a.gpus.len() as u32, info.gpus);
            continue;
        }
        prop_assert_eq!(a.cpus.len() as u32, a.tasks * g.cpus_per_task);
        let gpus = match g.gpus {
            GpuRequest::None => 0,
            GpuRequest::PerNode(n) => n,
            GpuRequest::PerTask(n) => n * a.tasks,
            GpuRequest::Total(_) => a.gpus.len() as u32,
        };
        prop_assert_eq!(a.gpus.len() as u32, gpus);
    }
    if let (GpuRequest::Total(n), false) = (g.gpus, g.exclusive) {
        prop_assert_eq!(d.nodes.iter().map(|a| a.gpus.len() as u32).sum::<u32>(), n);
    }
    Ok(())
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
        let mut w = World::new(policy, &nodes, shared);
        for op in &ops {
            w.apply(op)?;
        }
        w.pass()?;
    }

    /// Same inputs, same decisions.
    #[test]
    fn decisions_are_deterministic(
        nodes in proptest::collection::vec(node_gen(), 1..5),
        ops in proptest::collection::vec(op_gen(), 1..60),
    ) {
        let run = || -> Result<Vec<String>, TestCaseError> {
            let mut w = World::new(BackfillPolicy::Conservative, &nodes, false);
            for op in &ops {
                w.apply(op)?;
            }
            w.pass()?;
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
        let mut w = World::with(
            SchedulerConfig {
                policy,
                packing: if first_fit { Packing::FirstFit } else { Packing::BestFit },
                weights: PriorityWeights::age_only(),
                split_limits_up_to_nodes: if shared { 0 } else { 4096 },
                ..SchedulerConfig::default()
            },
            &nodes,
        );
        for g in &jobs {
            let g = JobGen { runs_pct: 100, dep: None, ..g.clone() };
            w.apply(&Op::Submit(g))?;
        }
        w.pass()?;
        let mut promised = BTreeMap::new();
        let mut started = BTreeMap::new();
        for j in w.s.active_jobs().collect::<Vec<_>>() {
            match w.s.job_status(j) {
                Some(JobStatus::Pending { expected_start, .. }) => {
                    // FCFS reserves only for the first job in line.
                    prop_assert!(fcfs || expected_start.is_some(), "job {} got no reservation", j);
                    if let Some(t) = expected_start {
                        promised.insert(j, t);
                    }
                }
                Some(JobStatus::Running { start, .. }) => { started.insert(j, start); }
                other => prop_assert!(false, "{:?}", other),
            }
        }
        while let Some(&next) = w.ends.values().min() {
            let d = next - w.now;
            w.now += d;
            let due: Vec<JobId> = w.ends.iter().filter(|(_, &e)| e <= w.now).map(|(&j, _)| j).collect();
            for j in due {
                w.ends.remove(&j);
                w.s.handle_job_finished(w.now, j, JobOutcome::Completed).expect("finish");
            }
            let starts = w.s.schedule(w.now);
            w.s.audit().map_err(TestCaseError::fail)?;
            check_plan(&w.s, w.now)?;
            for s in starts {
                let g = &w.jobs[&s.job];
                check_shape(&w.s, g, &s)?;
                w.ends.insert(s.job, s.end_by);
                started.insert(s.job, w.now);
            }
        }
        for (j, t) in promised {
            prop_assert_eq!(started.get(&j).copied(), Some(t), "job {} promised {}", j, t);
        }
    }
}
