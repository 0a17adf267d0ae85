//! Criterion benches for scheduler-core. Each states its budget; the
//! figures land in the issue notes, not in assertions.
//!
//! `cargo bench -p benches --bench scheduler`

use std::hint::black_box;
use std::time::Duration;

use corral_replay::synthetic::{busy_cluster_with_queue, single_gpu_stream};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use scheduler_core::{
    ArrayRequest, GpuRequest, JobId, JobRequest, Scheduler, SchedulerConfig, Secs, UserId,
};

/// Times one pass over a copy of `s`; cloning it and dropping it are not
/// part of the pass. `decisions`: report throughput in start decisions.
fn bench_pass(
    c: &mut Criterion,
    name: (&str, &str),
    s: &Scheduler,
    now: Secs,
    secs: u64,
    decisions: Option<u64>,
) {
    let (group, name) = name;
    let mut g = c.benchmark_group(group);
    g.sample_size(10)
        .measurement_time(Duration::from_secs(secs));
    if let Some(n) = decisions {
        g.throughput(Throughput::Elements(n));
    }
    g.bench_function(name, |b| {
        b.iter_batched(
            || s.clone(),
            |mut s| {
                let d = s.schedule(now);
                (s, black_box(d))
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

/// Budget: one full pass (priority + conservative backfill over the whole
/// queue) with 10,000 pending jobs on 1,000 nodes × 8 GPUs, ≤ 20 ms.
fn pass_10k_jobs_1k_nodes(c: &mut Criterion) {
    let (s, _) = busy_cluster_with_queue(1_000, 10_000, SchedulerConfig::default(), 1);
    bench_pass(
        c,
        ("full_pass", "10k_pending_1k_nodes_conservative"),
        &s,
        1,
        20,
        None,
    );
}

/// Budget: 100,000 pending jobs on 10,000 nodes × 8 GPUs, ≤ 500 ms.
fn pass_100k_jobs_10k_nodes(c: &mut Criterion) {
    let (s, _) = busy_cluster_with_queue(10_000, 100_000, SchedulerConfig::default(), 2);
    bench_pass(
        c,
        ("full_pass", "100k_pending_10k_nodes_conservative"),
        &s,
        1,
        30,
        None,
    );
}

/// Budget: ≥ 100,000 start decisions per second for single-GPU jobs on
/// 10,000 busy nodes (10,000 jobs ended, 10,000 submitted, one pass).
fn single_gpu_starts(c: &mut Criterion) {
    const FREED: usize = 10_000;
    let s = single_gpu_stream(10_000, FREED, 3);
    let name = ("start_decisions", "single_gpu_10k_busy_nodes");
    bench_pass(c, name, &s, 20, 20, Some(FREED as u64));
}

/// Budget: the 10,000-job queue of `full_pass` plus one 100,000-task
/// array (one GPU per task) costs one entry, and a pass plans it as the
/// 1,000 tasks `array_reservations` allows: ≤ 2× the pass without it.
fn pass_with_a_100k_task_array(c: &mut Criterion) {
    let (mut s, next) = busy_cluster_with_queue(1_000, 10_000, SchedulerConfig::default(), 1);
    let mut r = JobRequest::new(UserId(7));
    r.gpus = GpuRequest::PerNode(1);
    r.cpus_per_task = 1;
    r.time_limit = Some(3600);
    r.array = Some(ArrayRequest::new(100_000, 0));
    s.submit(0, JobId(next), r).expect("the array is valid");
    bench_pass(
        c,
        ("full_pass", "10k_pending_plus_100k_task_array_1k_nodes"),
        &s,
        1,
        20,
        None,
    );
}

/// Budget: a cluster at its job limit in arrays (1,000 arrays of 1,001
/// one-GPU tasks, as many users at ctld's limits may queue) on 1,000
/// busy nodes, with ctld's 20 reservations an array (Slurm's
/// `bf_max_job_array_resv`): a pass ≤ 100 ms (16 ms measured; 419 ms
/// with the core's default of 1,000).
fn pass_with_1k_arrays_of_1001(c: &mut Criterion) {
    let cfg = SchedulerConfig {
        array_reservations: 20,
        ..SchedulerConfig::default()
    };
    let (mut s, next) = busy_cluster_with_queue(1_000, 0, cfg, 1);
    for i in 0..1_000u64 {
        let mut r = JobRequest::new(UserId(10 + (i % 100) as u32));
        r.gpus = GpuRequest::PerNode(1);
        r.cpus_per_task = 1;
        r.time_limit = Some(3600);
        r.array = Some(ArrayRequest::new(1001, 0));
        s.submit(0, JobId(next + i * 1002), r)
            .expect("the array is valid");
    }
    bench_pass(
        c,
        ("full_pass", "1k_arrays_of_1001_1k_nodes_20_reservations"),
        &s,
        1,
        10,
        None,
    );
}

/// Budget: 10,000 held jobs beside a queue of 100 on 16 nodes add at most
/// 100 µs to a pass (a pass skips held jobs by their ids; reading each of
/// them in every pass doubled ctld's CPU per tiny job).
fn pass_with_10k_held(c: &mut Criterion) {
    let (mut s, next) = busy_cluster_with_queue(16, 100, SchedulerConfig::default(), 4);
    bench_pass(c, ("held", "100_pending_16_nodes"), &s, 1, 10, None);
    for i in 0..10_000 {
        let mut r = JobRequest::new(UserId(9));
        r.gpus = GpuRequest::PerNode(1);
        r.time_limit = Some(600);
        r.hold = true;
        s.submit(0, JobId(next + i), r)
            .expect("a held job is valid");
    }
    bench_pass(
        c,
        ("held", "100_pending_16_nodes_plus_10k_held"),
        &s,
        1,
        10,
        None,
    );
}

criterion_group!(
    benches,
    pass_with_10k_held,
    pass_10k_jobs_1k_nodes,
    pass_with_a_100k_task_array,
    pass_with_1k_arrays_of_1001,
    pass_100k_jobs_10k_nodes,
    single_gpu_starts
);
criterion_main!(benches);
