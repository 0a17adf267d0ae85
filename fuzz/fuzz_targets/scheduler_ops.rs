//! Arbitrary sequences of scheduler calls on an arbitrary small cluster.
//! They go through the shared `testing::Driver`: after every call the
//! bookkeeping audit holds (no CPU or GPU given twice, no node over
//! capacity, exclusive jobs alone), every start is what its job asked for,
//! the plan never promises a resource twice, and every search is
//! cross-checked against a full scan.
#![no_main]

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use scheduler_core::testing::{self, Driver, JobPlan, NodeShape, Op, Runtime};
use scheduler_core::*;

#[derive(Arbitrary, Debug)]
struct Node {
    cpus: u8,
    gpus: u8,
    per_group: u8,
    feature: bool,
}

#[derive(Arbitrary, Debug)]
struct Job {
    nodes: Option<u8>,
    tasks: Option<u8>,
    tasks_per_node: Option<u8>,
    cpus_per_task: u8,
    gpus: u8,
    gpu_kind: u8,
    exclusive: bool,
    limit: u16,
    runtime: u16,
    user: u8,
    constraint: bool,
    dep: Option<(u8, u8)>,
    hold: bool,
}

#[derive(Arbitrary, Debug)]
enum RawOp {
    Submit(Job),
    Cancel(u8),
    Hold(u8),
    Release(u8),
    Requeue(u8),
    Update(u8, i16, u16),
    Limit(u8, u16),
    Suspend(u8),
    Continue(u8),
    Drain(u8),
    Resume(u8),
    Down(u8),
    Remove(u8),
    AddNode(Node),
    Advance(u16),
    Pass,
}

#[derive(Arbitrary, Debug)]
struct Input {
    policy: u8,
    first_fit: bool,
    shared_classes: bool,
    nodes: Vec<Node>,
    ops: Vec<RawOp>,
}

fn shape(n: &Node) -> NodeShape {
    NodeShape {
        cpus: u32::from(n.cpus % 32).max(1),
        memory_mb: 4096,
        gpus: u32::from(n.gpus % 9),
        per_group: u32::from(n.per_group % 5),
        fast: n.feature,
    }
}

fn plan(j: &Job) -> JobPlan {
    let mut r = JobRequest::new(UserId(u32::from(j.user % 4)));
    r.nodes = j.nodes.map(|n| u32::from(n % 4));
    r.ntasks = j.tasks.map(|n| u32::from(n % 12));
    r.ntasks_per_node = j.tasks_per_node.map(|n| u32::from(n % 4));
    r.cpus_per_task = u32::from(j.cpus_per_task % 6);
    let g = u32::from(j.gpus % 9);
    r.gpus = match j.gpu_kind % 4 {
        0 => GpuRequest::None,
        1 => GpuRequest::PerNode(g),
        2 => GpuRequest::PerTask(g),
        _ => GpuRequest::Total(g),
    };
    r.exclusive = j.exclusive;
    r.time_limit = Some(Secs::from(j.limit));
    r.hold = j.hold;
    if j.constraint {
        r.features.push("fast".into());
    }
    JobPlan {
        runtime: Runtime::Secs(Secs::from(j.runtime).max(1)),
        ..JobPlan::new(r)
    }
}

fn op(o: &RawOp) -> Op {
    match o {
        RawOp::Submit(j) => Op::Submit {
            job: Box::new(plan(j)),
            dep: j.dep,
        },
        RawOp::Cancel(k) => Op::Cancel(*k),
        RawOp::Hold(k) => Op::Hold(*k),
        RawOp::Release(k) => Op::Release(*k),
        RawOp::Requeue(k) => Op::Requeue(*k),
        RawOp::Update(job, nice, limit) => Op::Update {
            job: *job,
            nice: *nice,
            limit: *limit,
        },
        RawOp::Limit(job, limit) => Op::Limit {
            job: *job,
            limit: *limit,
        },
        RawOp::Suspend(k) => Op::Suspend(*k),
        RawOp::Continue(k) => Op::Continue(*k),
        RawOp::Drain(k) => Op::Drain(*k),
        RawOp::Resume(k) => Op::Resume(*k),
        RawOp::Down(k) => Op::Down(*k),
        RawOp::Remove(k) => Op::Remove(*k),
        RawOp::AddNode(n) => Op::AddNode(shape(n)),
        RawOp::Advance(d) => Op::Advance(*d),
        RawOp::Pass => Op::Pass,
    }
}

fuzz_target!(|input: Input| {
    if input.nodes.len() > 8 || input.ops.len() > 200 {
        return;
    }
    let mut all = PartitionSpec::new("all", "ALL");
    all.max_time = Some(50_000);
    let mut d = Driver::new(
        SchedulerConfig {
            policy: testing::policy(input.policy),
            requeue_delay: 30,
            packing: if input.first_fit {
                Packing::FirstFit
            } else {
                Packing::BestFit
            },
            split_limits_up_to_nodes: if input.shared_classes { 0 } else { 4096 },
            ..SchedulerConfig::default()
        },
        all,
    );
    for n in &input.nodes {
        d.add_node(&shape(n));
    }
    let mut added = input.nodes.len();
    for o in &input.ops {
        let op = op(o);
        if matches!(op, Op::AddNode(_)) {
            if added >= 16 {
                continue;
            }
            added += 1;
        }
        if let Err(e) = d.apply(&op) {
            panic!("after {op:?}: {e}");
        }
    }
});
