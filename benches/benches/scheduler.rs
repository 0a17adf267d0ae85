//! Criterion benches for scheduler-core. Each states its budget; the
//! figures land in the issue notes, not in assertions.
//!
//! `cargo bench -p benches --bench scheduler`

use std::hint::black_box;
use std::time::Duration;

use corral_sim::synthetic::{busy_cluster_with_queue, single_gpu_stream};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use scheduler_core::SchedulerConfig;

/// Budget: one full pass (priority + conservative backfill over the whole
/// queue) with 10,000 pending jobs on 1,000 nodes × 8 GPUs, ≤ 20 ms.
fn pass_10k_jobs_1k_nodes(c: &mut Criterion) {
    let (s, _) = busy_cluster_with_queue(1_000, 10_000, SchedulerConfig::default(), 1);
    let mut g = c.benchmark_group("full_pass");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    g.bench_function("10k_pending_1k_nodes_conservative", |b| {
        b.iter_batched(
            || s.clone(),
            |mut s| {
                let d = s.schedule(1);
                // Dropping a whole cluster is not part of a pass.
                (s, black_box(d))
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

/// Budget: 100,000 pending jobs on 10,000 nodes × 8 GPUs, ≤ 500 ms.
fn pass_100k_jobs_10k_nodes(c: &mut Criterion) {
    let (s, _) = busy_cluster_with_queue(10_000, 100_000, SchedulerConfig::default(), 2);
    let mut g = c.benchmark_group("full_pass");
    g.sample_size(10).measurement_time(Duration::from_secs(30));
    g.bench_function("100k_pending_10k_nodes_conservative", |b| {
        b.iter_batched(
            || s.clone(),
            |mut s| {
                let d = s.schedule(1);
                // Dropping a whole cluster is not part of a pass.
                (s, black_box(d))
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

/// Budget: ≥ 100,000 start decisions per second for single-GPU jobs on
/// 10,000 busy nodes (10,000 jobs ended, 10,000 submitted, one pass).
fn single_gpu_starts(c: &mut Criterion) {
    const FREED: usize = 10_000;
    let s = single_gpu_stream(10_000, FREED, 3);
    let mut g = c.benchmark_group("start_decisions");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    g.throughput(Throughput::Elements(FREED as u64));
    g.bench_function("single_gpu_10k_busy_nodes", |b| {
        b.iter_batched(
            || s.clone(),
            |mut s| {
                let d = s.schedule(20);
                (s, black_box(d))
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group!(
    benches,
    pass_10k_jobs_1k_nodes,
    pass_100k_jobs_10k_nodes,
    single_gpu_starts
);
criterion_main!(benches);
