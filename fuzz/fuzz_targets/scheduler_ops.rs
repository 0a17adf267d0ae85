//! Arbitrary sequences of scheduler calls on an arbitrary small cluster.
//! After every call the bookkeeping audit holds (no CPU or GPU given
//! twice, no node over capacity, exclusive jobs alone), and every search
//! is cross-checked against a full scan.
#![no_main]

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
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
enum Op {
    Submit(Job),
    Cancel(u8),
    Hold(u8),
    Release(u8),
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
    ops: Vec<Op>,
}

fn node_spec(i: usize, n: &Node) -> NodeSpec {
    let mut spec = NodeSpec::new(format!("n{i}"), u32::from(n.cpus % 32).max(1), 4096)
        .with_gpus(u32::from(n.gpus % 9), u32::from(n.per_group % 5));
    if n.feature {
        spec.features.push("fast".into());
    }
    spec
}

fuzz_target!(|input: Input| {
    if input.nodes.len() > 8 || input.ops.len() > 200 {
        return;
    }
    let policy = match input.policy % 3 {
        0 => BackfillPolicy::Conservative,
        1 => BackfillPolicy::Easy,
        _ => BackfillPolicy::Fcfs,
    };
    let mut s = Scheduler::new(SchedulerConfig {
        policy,
        packing: if input.first_fit {
            Packing::FirstFit
        } else {
            Packing::BestFit
        },
        verify_search: true,
        split_limits_up_to_nodes: if input.shared_classes { 0 } else { 4096 },
        ..SchedulerConfig::default()
    });
    let mut all = PartitionSpec::new("all", "ALL");
    all.is_default = true;
    all.max_time = Some(50_000);
    s.add_partition(all).expect("partition");
    let mut added = 0usize;
    for n in &input.nodes {
        s.handle_node_added(node_spec(added, n)).expect("node");
        added += 1;
    }
    let mut now: Secs = 0;
    let mut next_job = 1u64;
    let mut ends: Vec<(JobId, Secs)> = Vec::new();
    let mut runtimes: std::collections::HashMap<JobId, Secs> = Default::default();
    let pick_job = |s: &Scheduler, k: u8| {
        let ids: Vec<JobId> = s.active_jobs().collect();
        (!ids.is_empty()).then(|| ids[k as usize % ids.len()])
    };
    let pick_node = |s: &Scheduler, k: u8| {
        let ids: Vec<NodeId> = s.node_ids().collect();
        (!ids.is_empty()).then(|| ids[k as usize % ids.len()])
    };
    for op in input.ops {
        match op {
            Op::Submit(j) => {
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
                if let Some((kind, k)) = j.dep {
                    if let Some(t) = pick_job(&s, k) {
                        r.dependencies.push(match kind % 5 {
                            0 => Dependency::After(t),
                            1 => Dependency::AfterOk(t),
                            2 => Dependency::AfterNotOk(t),
                            3 => Dependency::AfterAny(t),
                            _ => Dependency::Singleton,
                        });
                    }
                }
                let id = JobId(next_job);
                next_job += 1;
                if s.submit(now, id, r).is_ok() {
                    runtimes.insert(id, Secs::from(j.runtime).max(1));
                }
            }
            Op::Cancel(k) => {
                if let Some(j) = pick_job(&s, k) {
                    if let Ok(Cancelled::Running(_)) = s.cancel(j) {
                        ends.retain(|e| e.0 != j);
                        s.handle_job_finished(now, j, JobOutcome::Cancelled)
                            .expect("running");
                    }
                }
            }
            Op::Hold(k) => {
                if let Some(j) = pick_job(&s, k) {
                    let _ = s.hold(j, HoldKind::User);
                }
            }
            Op::Release(k) => {
                if let Some(j) = pick_job(&s, k) {
                    let _ = s.release(j, HoldKind::User);
                }
            }
            Op::Drain(k) | Op::Resume(k) | Op::Down(k) | Op::Remove(k) => {
                let Some(n) = pick_node(&s, k) else { continue };
                let lost = match op {
                    Op::Drain(_) => {
                        s.handle_node_admin(now, n, NodeAdmin::Drain { reason: "f".into() })
                    }
                    Op::Resume(_) => s.handle_node_admin(now, n, NodeAdmin::Up),
                    Op::Down(_) => {
                        s.handle_node_admin(now, n, NodeAdmin::Down { reason: "f".into() })
                    }
                    _ => s.handle_node_removed(now, n),
                }
                .expect("known node");
                for l in lost {
                    let (LostJob::Failed(j) | LostJob::Requeued(j)) = l;
                    ends.retain(|e| e.0 != j);
                }
            }
            Op::AddNode(n) => {
                if added < 16 {
                    s.handle_node_added(node_spec(added, &n))
                        .expect("fresh name");
                    added += 1;
                }
            }
            Op::Advance(d) => {
                now += Secs::from(d);
                let (due, rest): (Vec<_>, Vec<_>) = ends.iter().partition(|e| e.1 <= now);
                ends = rest;
                for (j, _) in due {
                    s.handle_job_finished(now, j, JobOutcome::Completed)
                        .expect("running");
                }
            }
            Op::Pass => {
                for d in s.schedule(now) {
                    let run = runtimes.get(&d.job).copied().unwrap_or(1);
                    ends.push((d.job, (now + run).min(d.end_by)));
                }
            }
        }
        s.audit().expect("audit");
    }
});
