//! Times single passes of the bench workloads without criterion's
//! repetitions: `cargo run --release -p corral-replay --example probe -- NODES JOBS`.
use std::time::Instant;

use corral_replay::synthetic::{busy_cluster_with_queue, single_gpu_stream};
use scheduler_core::SchedulerConfig;

fn main() {
    if std::env::args().nth(1).as_deref() == Some("stream") {
        let t = Instant::now();
        let s = single_gpu_stream(10_000, 10_000, 3);
        println!("setup {:.2} s", t.elapsed().as_secs_f64());
        for _ in 0..3 {
            let mut c = s.clone();
            let t = Instant::now();
            let started = c.schedule(20).len();
            let secs = t.elapsed().as_secs_f64();
            println!(
                "pass {:.2} ms, {started} starts, {:.0} starts/s",
                secs * 1e3,
                started as f64 / secs
            );
        }
        return;
    }
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (nodes, jobs) = (
        args.first().copied().unwrap_or(1000),
        args.get(1).copied().unwrap_or(10_000),
    );
    let t = Instant::now();
    let (s, _) = busy_cluster_with_queue(nodes, jobs, SchedulerConfig::default(), 1);
    println!(
        "setup {:.2} s, pending {}",
        t.elapsed().as_secs_f64(),
        s.pending_count()
    );
    let mut times = Vec::new();
    let mut started = 0;
    for _ in 0..9 {
        let mut c = s.clone();
        let t = Instant::now();
        started = c.schedule(1).len();
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "pass min {:.2} ms, median {:.2} ms, started {started}",
        times[0],
        times[times.len() / 2]
    );
}
