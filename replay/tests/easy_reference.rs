//! The replay checked against an independent EASY backfilling, written
//! here from the textbook rule in a few dozen lines: on a slice of each
//! shared SWF trace (jobs need CPUs from one pool, as Corral's replay asks
//! for an SWF job's processors as one-CPU tasks spread over the nodes),
//! both must give the same figures without backfilling (FCFS), and with
//! EASY the same utilisation and a mean bounded slowdown within a fence.

use std::collections::VecDeque;
use std::path::PathBuf;

use corral_replay::replay::{replay, Options, TAU};
use corral_replay::trace::{read_swf, MachineOverride, Overrun, Workload};
use scheduler_core::{BackfillPolicy, Packing};

struct Figures {
    utilization: f64,
    slowdown: f64,
    jobs: usize,
}

/// EASY: jobs in arrival order; the first that does not fit gets a
/// reservation at the earliest time enough CPUs are free by the running
/// jobs' limits (the shadow time); a later job may start now if it fits
/// and either ends by its limit before the shadow time or takes only CPUs
/// the reservation leaves over. Run times are the recorded ones.
fn easy(w: &Workload, backfill: bool) -> Figures {
    let total: u64 = w.nodes.iter().map(|n| u64::from(n.cpus)).sum();
    let need = |i: usize| u64::from(w.jobs[i].request.ntasks.unwrap_or(1));
    let limit = |i: usize| w.jobs[i].request.time_limit.unwrap_or(u64::MAX);
    // (start, end by run time, end by limit, cpus) of running jobs.
    let mut running: Vec<(u64, u64, u64, u64)> = Vec::new();
    let mut queue: VecDeque<usize> = VecDeque::new();
    let (mut free, mut next, mut now) = (total, 0usize, 0u64);
    let (mut used, mut slowdown, mut started, mut last_end) = (0f64, 0f64, 0usize, 0u64);
    let first = w.jobs.first().map_or(0, |j| j.submit);
    loop {
        // Ends first, then arrivals, at the next event.
        running.retain(|r| {
            if r.1 <= now {
                free += r.3;
                last_end = last_end.max(r.1);
            }
            r.1 > now
        });
        while next < w.jobs.len() && w.jobs[next].submit <= now {
            if need(next) <= total {
                queue.push_back(next);
            }
            next += 1;
        }
        let mut start = |i: usize, free: &mut u64, running: &mut Vec<_>| {
            let j = &w.jobs[i];
            *free -= need(i);
            running.push((now, now + j.runtime, now.saturating_add(limit(i)), need(i)));
            used += j.runtime as f64 * need(i) as f64;
            let wait = (now - j.submit) as f64;
            slowdown += ((wait + j.runtime as f64) / (j.runtime as f64).max(TAU)).max(1.0);
            started += 1;
        };
        while let Some(&head) = queue.front() {
            if need(head) > free {
                break;
            }
            queue.pop_front();
            start(head, &mut free, &mut running);
        }
        if let Some(&head) = queue.front().filter(|_| backfill) {
            // The shadow time and the CPUs left over at it.
            let mut ends: Vec<(u64, u64)> = running.iter().map(|r| (r.2, r.3)).collect();
            ends.sort_unstable();
            let (mut avail, mut shadow) = (free, u64::MAX);
            for (t, c) in ends {
                avail += c;
                if avail >= need(head) {
                    shadow = t;
                    break;
                }
            }
            let mut extra = avail.saturating_sub(need(head));
            let mut k = 1;
            while k < queue.len() {
                let i = queue[k];
                let fits = need(i) <= free;
                let before = now.saturating_add(limit(i)) <= shadow;
                if fits && (before || need(i) <= extra) {
                    if !before {
                        extra -= need(i);
                    }
                    queue.remove(k);
                    start(i, &mut free, &mut running);
                } else {
                    k += 1;
                }
            }
        }
        let t_end = running.iter().map(|r| r.1).min();
        let t_arrive = w.jobs.get(next).map(|j| j.submit);
        now = match (t_end, t_arrive) {
            (None, None) => break,
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or(now),
        };
    }
    let span = last_end.saturating_sub(first) as f64;
    Figures {
        utilization: used / (total as f64 * span),
        slowdown: slowdown / started.max(1) as f64,
        jobs: started,
    }
}

/// The first `jobs` jobs of a trace, arriving `load` times as fast (a
/// light slice queues nothing and tests no backfilling).
fn slice(trace: &str, jobs: usize, load: u64) -> Workload {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/traces")
        .join(trace);
    let mut w = read_swf(&path, &MachineOverride::default())
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    w.jobs.truncate(jobs);
    for j in &mut w.jobs {
        j.submit /= load;
    }
    w.apply_overrun(Overrun::Extend);
    w
}

fn check(trace: &str, jobs: usize, load: u64) {
    let w = slice(trace, jobs, load);
    for (policy, backfill) in [(BackfillPolicy::Fcfs, false), (BackfillPolicy::Easy, true)] {
        compare(trace, &w, policy, backfill);
    }
}

fn compare(trace: &str, w: &Workload, policy: BackfillPolicy, backfill: bool) {
    let reference = easy(w, backfill);
    let (corral, _) = replay(
        w,
        Options {
            policy,
            packing: Packing::BestFit,
            fill: false,
            overrun: (Overrun::Extend, 0),
        },
        |_| {},
    );
    println!(
        "{trace} {policy:?}: {} jobs; utilisation {:.4} (reference {:.4}), bounded slowdown {:.3} (reference {:.3})",
        corral.jobs, corral.utilization, reference.utilization, corral.mean_bounded_slowdown, reference.slowdown
    );
    assert_eq!(corral.jobs, reference.jobs, "{trace}: jobs started");
    if !backfill {
        // No backfilling: one order, one schedule, the same figures.
        assert!(
            (corral.utilization - reference.utilization).abs() < 1e-9
                && (corral.mean_bounded_slowdown - reference.slowdown).abs()
                    < 1e-9 * reference.slowdown,
            "{trace}: FCFS differs from the reference"
        );
        return;
    }
    let du = (corral.utilization - reference.utilization).abs() / reference.utilization;
    assert!(
        du < 0.01,
        "{trace}: utilisation {} vs {}",
        corral.utilization,
        reference.utilization
    );
    // Measured: Corral's EASY gives a lower mean bounded slowdown than the
    // textbook rule on both slices (0.90 of it on KTH, 0.72 on NASA at
    // four times its load) with the same utilisation; FCFS is identical,
    // so the difference is in which jobs backfill. The textbook rule
    // counts CPUs; Corral reserves exact nodes for the first waiting job,
    // and may take nodes idle now that the textbook rule leaves to a job
    // running past the reservation (KTH's 58th job, 2 CPUs, waits 13 s in
    // Corral and none in the reference), and the schedules part from
    // there. The bound fences it: never worse than the textbook EASY by
    // more than 5%, never better by more than 40%.
    let ratio = corral.mean_bounded_slowdown / reference.slowdown;
    assert!(
        (0.6..1.05).contains(&ratio),
        "{trace}: bounded slowdown {} vs {} (ratio {ratio:.3})",
        corral.mean_bounded_slowdown,
        reference.slowdown
    );
}

#[test]
fn kth_slice_matches_an_independent_easy() {
    check("KTH-SP2-1996-2.1-cln.swf.gz", 3000, 1);
}

#[test]
fn nasa_slice_matches_an_independent_easy() {
    check("NASA-iPSC-1993-3.1-cln.swf.gz", 3000, 4);
}
