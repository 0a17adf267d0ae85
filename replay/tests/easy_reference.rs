//! The replay checked against an independent EASY backfilling, written
//! here from the textbook rule in a few dozen lines: on a slice of each
//! shared SWF trace (jobs need CPUs from one pool, as Corral's replay asks
//! for an SWF job's processors as one-CPU tasks spread over the nodes),
//! both must give the same figures without backfilling (FCFS), and with
//! EASY the same utilisation and a mean bounded slowdown within a fence.
//! On the shared GPU trace (Alibaba's, where each task needs CPUs, memory
//! and GPUs on one node) the reference places jobs on nodes itself, best
//! fit, and reserves one node for the first waiting job; placement then
//! differs from Corral's in places, so both policies are fenced.

use std::collections::VecDeque;
use std::path::PathBuf;

use corral_replay::replay::{replay, Options, TAU};
use corral_replay::trace::{read_alibaba, read_swf, MachineOverride, Overrun, TraceJob, Workload};
use scheduler_core::{BackfillPolicy, GpuRequest, Packing};

struct Figures {
    utilization: f64,
    slowdown: f64,
    jobs: usize,
}

/// What a reference's started jobs add up to.
#[derive(Default)]
struct Tally {
    /// Run time times the measured resource (CPUs or GPUs), summed.
    used: f64,
    slowdown: f64,
    started: usize,
    last_end: u64,
}

impl Tally {
    /// `job` started at `now` on `units` of the measured resource.
    fn start(&mut self, job: &TraceJob, now: u64, units: u64) {
        self.used += job.runtime as f64 * units as f64;
        let wait = (now - job.submit) as f64;
        self.slowdown += ((wait + job.runtime as f64) / (job.runtime as f64).max(TAU)).max(1.0);
        self.started += 1;
    }

    /// Utilisation of `capacity` units from the first submit to the last
    /// end, and the mean bounded slowdown.
    fn figures(&self, w: &Workload, capacity: u64) -> Figures {
        let first = w.jobs.first().map_or(0, |j| j.submit);
        let span = self.last_end.saturating_sub(first) as f64;
        Figures {
            utilization: self.used / (capacity as f64 * span),
            slowdown: self.slowdown / self.started.max(1) as f64,
            jobs: self.started,
        }
    }
}

/// The next event: the first end or the next arrival; none when no job
/// runs and none is left to arrive.
fn next_event(first_end: Option<u64>, w: &Workload, next: usize) -> Option<u64> {
    let arrival = w.jobs.get(next).map(|j| j.submit);
    first_end.into_iter().chain(arrival).min()
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
    let mut tally = Tally::default();
    loop {
        // Ends first, then arrivals, at the next event.
        running.retain(|r| {
            if r.1 <= now {
                free += r.3;
                tally.last_end = tally.last_end.max(r.1);
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
            tally.start(j, now, need(i));
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
        match next_event(running.iter().map(|r| r.1).min(), w, next) {
            Some(t) => now = t,
            None => break,
        }
    }
    tally.figures(w, total)
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

/// What a job needs on its one node: CPUs, memory (MB) and GPUs.
type Need = [u64; 3];

fn fits(free: &Need, need: &Need) -> bool {
    free.iter().zip(need).all(|(f, n)| f >= n)
}

/// Best fit: of the nodes in `nodes` where `need` fits now, the one left
/// with the fewest free GPUs, then CPUs, then memory.
fn best_fit(free: &[Need], need: &Need, nodes: impl Iterator<Item = usize>) -> Option<usize> {
    nodes.filter(|&n| fits(&free[n], need)).min_by_key(|&n| {
        let f = &free[n];
        (f[2] - need[2], f[0] - need[0], f[1] - need[1], n)
    })
}

/// EASY over nodes: jobs in arrival order, each on one node; the first
/// that fits nowhere reserves the node where enough frees up soonest by
/// the running jobs' limits (its shadow time); a later job may start now
/// where it fits if it ends by its limit before the shadow time, or on
/// another node, or on the reserved one out of what the reservation
/// leaves over there. GPU-seconds make the utilisation.
fn easy_nodes(w: &Workload, backfill: bool) -> Figures {
    let cap: Vec<Need> = w
        .nodes
        .iter()
        .map(|n| [u64::from(n.cpus), n.memory_mb, n.gpus.len() as u64])
        .collect();
    let gpus_total: u64 = cap.iter().map(|c| c[2]).sum();
    let need = |i: usize| -> Need {
        let r = &w.jobs[i].request;
        let gpus = match r.gpus {
            GpuRequest::PerNode(g) => u64::from(g),
            _ => 0,
        };
        let cpus = u64::from(r.cpus_per_task) * u64::from(r.ntasks.unwrap_or(1));
        [cpus, r.memory_per_node_mb.unwrap_or(0), gpus]
    };
    let limit = |i: usize| w.jobs[i].request.time_limit.unwrap_or(u64::MAX);
    let mut free = cap.clone();
    // (end by run time, end by limit, node, need) of running jobs.
    let mut running: Vec<(u64, u64, usize, Need)> = Vec::new();
    let mut queue: VecDeque<usize> = VecDeque::new();
    let (mut next, mut now) = (0usize, 0u64);
    let mut tally = Tally::default();
    loop {
        running.retain(|r| {
            if r.0 <= now {
                (0..3).for_each(|k| free[r.2][k] += r.3[k]);
                tally.last_end = tally.last_end.max(r.0);
            }
            r.0 > now
        });
        while next < w.jobs.len() && w.jobs[next].submit <= now {
            if cap.iter().any(|c| fits(c, &need(next))) {
                queue.push_back(next);
            }
            next += 1;
        }
        let mut start = |i: usize, n: usize, free: &mut Vec<Need>, running: &mut Vec<_>| {
            let (j, d) = (&w.jobs[i], need(i));
            (0..3).for_each(|k| free[n][k] -= d[k]);
            running.push((now + j.runtime, now.saturating_add(limit(i)), n, d));
            tally.start(j, now, d[2]);
        };
        while let Some(&head) = queue.front() {
            let Some(n) = best_fit(&free, &need(head), 0..cap.len()) else {
                break;
            };
            queue.pop_front();
            start(head, n, &mut free, &mut running);
        }
        if let Some(&head) = queue.front().filter(|_| backfill) {
            // Each node's earliest time for the head by the limits; the
            // soonest is reserved, with what it has over at that time.
            let h = need(head);
            let mut reserved: Option<(u64, usize, Need)> = None;
            for n in (0..cap.len()).filter(|&n| fits(&cap[n], &h)) {
                let mut ends: Vec<(u64, Need)> = running
                    .iter()
                    .filter(|r| r.2 == n)
                    .map(|r| (r.1, r.3))
                    .collect();
                ends.sort_unstable();
                let mut avail = free[n];
                for (t, d) in ends {
                    (0..3).for_each(|k| avail[k] += d[k]);
                    if fits(&avail, &h) {
                        if reserved.is_none_or(|(soonest, ..)| t < soonest) {
                            let over = [avail[0] - h[0], avail[1] - h[1], avail[2] - h[2]];
                            reserved = Some((t, n, over));
                        }
                        break;
                    }
                }
            }
            // The head fits some node once that node's jobs end, so one is
            // always reserved.
            let (shadow, r, mut extra) = reserved.expect("a node fits the head");
            let mut k = 1;
            while k < queue.len() {
                let i = queue[k];
                let d = need(i);
                let place = if now.saturating_add(limit(i)) <= shadow {
                    best_fit(&free, &d, 0..cap.len())
                } else {
                    best_fit(&free, &d, (0..cap.len()).filter(|&n| n != r)).or_else(|| {
                        (fits(&free[r], &d) && fits(&extra, &d)).then(|| {
                            (0..3).for_each(|x| extra[x] -= d[x]);
                            r
                        })
                    })
                };
                match place {
                    Some(n) => {
                        queue.remove(k);
                        start(i, n, &mut free, &mut running);
                    }
                    None => k += 1,
                }
            }
        }
        match next_event(running.iter().map(|r| r.0).min(), w, next) {
            Some(t) => now = t,
            None => break,
        }
    }
    tally.figures(w, gpus_total)
}

/// A slice of the Alibaba GPU trace: `jobs` tasks from its `from`th (by
/// arrival) on its first `nodes` GPU nodes, arriving `load` times as fast.
fn gpu_slice(from: usize, jobs: usize, nodes: usize, load: u64) -> Workload {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/traces/gpu/alibaba-gpu-v2023");
    let mut w = read_alibaba(
        &dir.join("openb_node_list_gpu_node.csv"),
        &dir.join("openb_pod_list_default.csv"),
        0,
    )
    .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    w.nodes.truncate(nodes);
    w.jobs.drain(..from.min(w.jobs.len()));
    w.jobs.truncate(jobs);
    let first = w.jobs.first().map_or(0, |j| j.submit);
    for j in &mut w.jobs {
        j.submit = (j.submit - first) / load;
    }
    w
}

fn check(trace: &str, jobs: usize, load: u64) {
    let w = slice(trace, jobs, load);
    for (policy, backfill) in [(BackfillPolicy::Fcfs, false), (BackfillPolicy::Easy, true)] {
        compare(trace, &w, policy, backfill);
    }
}

/// Corral's replay of `w` under `policy`, best fit.
fn corral_figures(w: &Workload, policy: BackfillPolicy) -> Figures {
    let (r, _) = replay(
        w,
        Options {
            policy,
            packing: Packing::BestFit,
            fill: false,
            overrun: (Overrun::Extend, 0),
        },
        |_| {},
    );
    Figures {
        utilization: r.utilization,
        slowdown: r.mean_bounded_slowdown,
        jobs: r.jobs,
    }
}

/// Corral's utilisation within 1% of the reference's.
fn assert_same_utilisation(what: &str, corral: &Figures, reference: &Figures) {
    let du = (corral.utilization - reference.utilization).abs() / reference.utilization;
    assert!(
        du < 0.01,
        "{what}: utilisation {} vs {}",
        corral.utilization,
        reference.utilization
    );
}

fn compare(trace: &str, w: &Workload, policy: BackfillPolicy, backfill: bool) {
    let reference = easy(w, backfill);
    let corral = corral_figures(w, policy);
    println!(
        "{trace} {policy:?}: {} jobs; utilisation {:.4} (reference {:.4}), bounded slowdown {:.3} (reference {:.3})",
        corral.jobs, corral.utilization, reference.utilization, corral.slowdown, reference.slowdown
    );
    assert_eq!(corral.jobs, reference.jobs, "{trace}: jobs started");
    if !backfill {
        // No backfilling: one order, one schedule, the same figures.
        assert!(
            (corral.utilization - reference.utilization).abs() < 1e-9
                && (corral.slowdown - reference.slowdown).abs() < 1e-9 * reference.slowdown,
            "{trace}: FCFS differs from the reference"
        );
        return;
    }
    assert_same_utilisation(trace, &corral, &reference);
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
    let ratio = corral.slowdown / reference.slowdown;
    assert!(
        (0.6..1.05).contains(&ratio),
        "{trace}: bounded slowdown {} vs {} (ratio {ratio:.3})",
        corral.slowdown,
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

/// A GPU slice: the same jobs start under both; utilisation the same;
/// the mean bounded slowdown close under FCFS and within a fence under
/// EASY; and backfilling helps both alike.
fn check_gpu(from: usize, jobs: usize, nodes: usize, load: u64) {
    let w = gpu_slice(from, jobs, nodes, load);
    let name = format!("alibaba from {from}, {jobs} tasks, {nodes} nodes, {load}x");
    let mut gains = Vec::new();
    for (policy, backfill) in [(BackfillPolicy::Fcfs, false), (BackfillPolicy::Easy, true)] {
        let (c, r) = (corral_figures(&w, policy), easy_nodes(&w, backfill));
        println!(
            "{name} {policy:?}: {} jobs; utilisation {:.4} (reference {:.4}), bounded slowdown {:.3} (reference {:.3})",
            c.jobs, c.utilization, r.utilization, c.slowdown, r.slowdown
        );
        assert_eq!(c.jobs, r.jobs, "{name} {policy:?}: jobs started");
        assert_same_utilisation(&format!("{name} {policy:?}"), &c, &r);
        // Measured (6 Dec): FCFS 0.996 and 0.990 of the reference, EASY
        // 1.008 and 0.906. Both place each job on one node by best fit,
        // but by different keys (Corral's packing counts a penalty for
        // GPUs it would strand without CPUs or memory beside the GPUs
        // left, then topology groups broken; the reference only the
        // free GPUs, CPUs and memory left), so even FCFS may part where
        // the keys disagree, and EASY's choices compound it.
        let fence = if backfill { 0.85..1.15 } else { 0.95..1.05 };
        let ratio = c.slowdown / r.slowdown;
        assert!(
            fence.contains(&ratio),
            "{name} {policy:?}: bounded slowdown {} vs {} (ratio {ratio:.3})",
            c.slowdown,
            r.slowdown
        );
        gains.push((c.slowdown, r.slowdown));
    }
    // Backfilling cuts the slowdown in both, by a like share (measured:
    // Corral to 0.814 and 0.815 of its FCFS, the reference 0.804 and
    // 0.890).
    let (corral, reference) = (gains[1].0 / gains[0].0, gains[1].1 / gains[0].1);
    assert!(
        corral < 0.95 && reference < 0.95 && (corral - reference).abs() < 0.1,
        "{name}: EASY over FCFS {corral:.3} in Corral, {reference:.3} in the reference"
    );
}

#[test]
fn alibaba_gpu_slices_match_an_independent_easy() {
    // Slices loaded enough that jobs queue: on 40 to 100 of the trace's
    // GPU nodes at up to 8 times its recorded rate, no job waited. About
    // 16 s unoptimised.
    check_gpu(1000, 1000, 8, 1000);
    check_gpu(3000, 1000, 12, 1000);
}
