//! What one pending job costs the controller in memory: heap bytes live
//! after submitting 10,000 held jobs, counted by a global allocator that
//! wraps the system's. Two figures: the whole controller (job table and
//! scheduler core, with a store, so scripts and environments have left
//! for it) and the scheduler core alone.
//!
//! Budget: ≤ 1 KiB per pending job in the whole controller (the
//! durability issue's aim). The cluster bench reports the resident size
//! of a real corral-ctld, which adds the allocator's own overhead.
//!
//! `cargo bench -p benches --bench memory`

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use corral_ctl::ctld::config::Config;
use corral_ctl::ctld::store::Store;
use corral_ctl::ctld::Controller;
use corral_proto::msg::{Ident, JobKind, JobSpec};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use scheduler_core::{JobId, JobRequest, NodeSpec, PartitionSpec, Scheduler, SchedulerConfig};

mod common;

/// Heap bytes live now.
static LIVE: AtomicIsize = AtomicIsize::new(0);

struct Counting;

// SAFETY: every call goes to the system allocator with the caller's
// arguments; the counter only observes sizes.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's layout, passed on.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: `p` came from `alloc` with this layout.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        // SAFETY: as `dealloc` and `alloc`.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const JOBS: usize = 10_000;
const NODES: usize = 64;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// A job as `sbatch` sends it: a short script, a typical environment
/// (about 2 KiB in 40 variables), output to a file.
fn spec(i: usize) -> JobSpec {
    JobSpec {
        name: format!("train-{}", i % 100),
        hold: true,
        work_dir: "/home/ada/experiments/run-42".into(),
        env: (0..40)
            .map(|v| (format!("VARIABLE_{v}"), "x".repeat(40)))
            .collect(),
        kind: JobKind::Batch {
            script: "#!/bin/sh\n#SBATCH -N1\nsrun python train.py --epochs 10\n".into(),
            args: vec![],
            stdout: Some("logs/%j.out".into()),
            stderr: None,
        },
        ..JobSpec::default()
    }
}

fn controller(state: &std::path::Path) -> Controller {
    let text = format!(
        "state_dir = \"{}\"\n[limits]\nmax_jobs_per_user = 1000000\n\
         [[partition]]\nname = \"gpu\"\nnodes = \"worker-[0-63]\"\ndefault = true\n",
        state.display()
    );
    let cfg = Config::parse(std::path::Path::new("bench.toml"), &text).expect("config");
    let mut ctl = Controller::new(cfg).expect("controller");
    common::register_nodes(&mut ctl, NODES, 1);
    ctl
}

const WHO: Ident = Ident {
    uid: 1000,
    gid: 1000,
};

/// Submits `JOBS` held jobs, committing every 100 as the server's group
/// commits do; returns heap bytes per job.
fn controller_bytes_per_job() -> f64 {
    let dir = tempfile::tempdir().expect("dir");
    let state = dir.path().join("state");
    let store = Store::open(&state).expect("store");
    let mut ctl = controller(&state);
    store.commit(&[ctl.take_changes()]).expect("commit");
    let before = live();
    for chunk in 0..JOBS / 100 {
        for i in 0..100 {
            ctl.submit(WHO, spec(chunk * 100 + i), 2).expect("submit");
        }
        let changes = ctl.take_changes();
        store.commit(&[changes]).expect("commit");
    }
    let per = (live() - before) as f64 / JOBS as f64;
    drop(ctl);
    per
}

/// Heap bytes one more submission of `job` costs a controller that
/// already queues 100 jobs (the tables' first allocations and the store's
/// caches are not the job's).
fn controller_bytes_for(job: JobSpec) -> f64 {
    let dir = tempfile::tempdir().expect("dir");
    let state = dir.path().join("state");
    let store = Store::open(&state).expect("store");
    let mut ctl = controller(&state);
    for i in 0..100 {
        ctl.submit(WHO, spec(i), 2).expect("submit");
    }
    store.commit(&[ctl.take_changes()]).expect("commit");
    let before = live();
    ctl.submit(WHO, job, 2).expect("submit");
    store.commit(&[ctl.take_changes()]).expect("commit");
    let bytes = (live() - before) as f64;
    drop(ctl);
    bytes
}

/// One held array of 100,000 tasks against one held job. Budget: the
/// array costs what one job costs, not 100,000 of them (≤ 1 KiB more).
fn array_and_job_bytes() -> (f64, f64) {
    let mut array = spec(0);
    array.array = Some(corral_proto::msg::ArraySpec {
        runs: vec![corral_proto::msg::IndexRun {
            first: 0,
            count: 100_000,
            step: 1,
        }],
        throttle: 0,
    });
    (controller_bytes_for(array), controller_bytes_for(spec(0)))
}

/// The scheduler core alone, with the request ctld makes of such a job.
fn core_bytes_per_job() -> f64 {
    let mut s = Scheduler::new(SchedulerConfig::default());
    let mut p = PartitionSpec::new("gpu", "worker-[0-63]");
    p.is_default = true;
    s.add_partition(p).expect("partition");
    for i in 0..NODES {
        let n = NodeSpec::new(format!("worker-{i}"), 64, 512_000);
        s.handle_node_added(n).expect("node");
    }
    let before = live();
    for i in 0..JOBS {
        let mut r = JobRequest::new(scheduler_core::UserId(1000));
        r.name = format!("train-{}", i % 100);
        r.hold = true;
        s.submit(2, JobId(i as u64 + 1), r).expect("submit");
    }
    let per = (live() - before) as f64 / JOBS as f64;
    drop(s);
    per
}

fn benches(c: &mut Criterion) {
    let whole = controller_bytes_per_job();
    let core = core_bytes_per_job();
    let (array, one) = array_and_job_bytes();
    println!(
        "heap per pending job: {whole:.0} B in the controller (budget ≤ 1024 B), \
         of which {core:.0} B in the scheduler core; a held array of 100,000 tasks \
         costs {array:.0} B where one held job costs {one:.0} B (budget: ≤ 1024 B more)"
    );
    let mut g = c.benchmark_group("memory");
    g.sample_size(10);
    // What a submission costs the controller (no store): the time side
    // of the same records. Budget: 10 ms for the 1,000 (measured 6.2 ms
    // on 2 Dec 2026, 12.7 ms before the payload was taken out ahead of
    // packing).
    g.bench_function("submit_1000_held", |b| {
        b.iter_batched(
            || {
                let dir = tempfile::tempdir().expect("dir");
                let ctl = controller(&dir.path().join("state"));
                (dir, ctl)
            },
            |(dir, mut ctl)| {
                for i in 0..1000 {
                    ctl.submit(WHO, spec(i), 2).expect("submit");
                }
                (dir, ctl)
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group!(memory, benches);
criterion_main!(memory);
