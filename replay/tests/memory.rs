//! Core memory per pending job, measured with a counting allocator: the
//! budget is 1 KiB, with and without the reservations a pass gives.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use corral_replay::synthetic::{cluster, mixed_job, Rng};
use scheduler_core::{JobId, SchedulerConfig};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only
// counts the bytes live.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: `ptr` came from this allocator with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const BUDGET: f64 = 1024.0;

#[test]
fn a_pending_job_costs_under_a_kibibyte() {
    const JOBS: u64 = 50_000;
    let mut s = cluster(500, 8, SchedulerConfig::default());
    // Fill the machine so the queue stays queued.
    let mut rng = Rng::new(11);
    let mut id = 1u64;
    for _ in 0..4000 {
        let mut r = mixed_job(&mut rng, 16);
        r.nodes = None;
        s.submit(0, JobId(id), r).expect("valid");
        id += 1;
    }
    s.schedule(0);
    let before = LIVE.load(Ordering::Relaxed);
    let pending_before = s.pending_count();
    for _ in 0..JOBS {
        s.submit(0, JobId(id), mixed_job(&mut rng, 16))
            .expect("valid");
        id += 1;
    }
    let queued = (s.pending_count() - pending_before) as f64;
    let submitted = (LIVE.load(Ordering::Relaxed) - before) as f64 / queued;
    s.schedule(1);
    let planned = (LIVE.load(Ordering::Relaxed) - before) as f64 / queued;
    println!(
        "memory per pending job: {submitted:.0} B queued, {planned:.0} B with its reservation"
    );
    assert!(submitted < BUDGET, "{submitted} B per queued job");
    assert!(planned < BUDGET, "{planned} B per planned job");
}
