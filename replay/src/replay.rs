//! Replays a [`Workload`] through the real scheduler in virtual time: jobs
//! arrive at their submit time, run for their recorded run time, and the
//! scheduler decides everything in between. Measures what a site would
//! (waits, slowdown, utilisation) and what the scheduler costs (time per
//! pass).

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::time::Instant;

use scheduler_core::{
    BackfillPolicy, GpuRequest, JobId, JobOutcome, JobStatus, Packing, PartitionSpec,
    PriorityWeights, Scheduler, SchedulerConfig, Secs,
};
use serde::Serialize;

use crate::trace::Workload;

/// Bounded slowdown threshold, seconds.
pub const TAU: f64 = 10.0;

#[derive(Clone, Copy, Debug)]
pub struct Options {
    pub policy: BackfillPolicy,
    pub packing: Packing,
    /// Jobs never end: the machine fills up in arrival order, as in the
    /// fragmentation experiments of the Alibaba trace's paper. Utilisation
    /// is then the busy share at the end.
    pub fill: bool,
    /// What `w`'s jobs that ran past their limit were made to do (the
    /// caller applied it with [`Workload::apply_overrun`]), and how many.
    pub overrun: (crate::trace::Overrun, usize),
}

/// What a replay measured. Field names are the JSON keys.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub trace: String,
    pub policy: String,
    pub packing: String,
    pub nodes: usize,
    pub jobs: usize,
    pub unplaced_jobs: usize,
    /// What was done with jobs that ran past their requested time
    /// (`extend`: their recorded time, the estimate raised; `kill`: cut at
    /// the limit), and how many did.
    pub overrun: String,
    pub overrun_jobs: usize,
    /// Busy share of the primary resource (GPUs where the machine has
    /// them, else CPUs) from first submit to last end.
    pub utilization: f64,
    pub mean_wait_s: f64,
    pub mean_bounded_slowdown: f64,
    pub max_wait_s: f64,
    pub makespan_s: f64,
    pub passes: usize,
    pub pass_p50_us: f64,
    pub pass_p99_us: f64,
    pub pass_max_us: f64,
    pub wall_s: f64,
    /// When the first job in line was blocked: the GPUs that were free but
    /// could not serve it (too few on their node, or their node short of
    /// CPUs or memory), as a share of all GPUs; the mean over those
    /// passes. GPU machines only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_fragmentation: Option<f64>,
}

impl std::fmt::Display for Report {
    /// The table `corral-sim` prints: one `name value` line per figure.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = self;
        let rows: Vec<(&str, String)> = vec![
            ("trace", r.trace.clone()),
            ("policy", r.policy.clone()),
            ("packing", r.packing.clone()),
            ("nodes", r.nodes.to_string()),
            ("jobs", r.jobs.to_string()),
            ("unplaced jobs", r.unplaced_jobs.to_string()),
            (
                "overran their limit",
                format!("{} ({})", r.overrun_jobs, r.overrun),
            ),
            ("utilization", format!("{:.3}", r.utilization)),
            ("mean wait", format!("{:.0} s", r.mean_wait_s)),
            (
                "mean bounded slowdown",
                format!("{:.1}", r.mean_bounded_slowdown),
            ),
            ("max wait", format!("{:.0} s", r.max_wait_s)),
            ("makespan", format!("{:.0} s", r.makespan_s)),
            ("passes", r.passes.to_string()),
            (
                "pass p50 / p99 / max",
                format!(
                    "{:.0} / {:.0} / {:.0} µs",
                    r.pass_p50_us, r.pass_p99_us, r.pass_max_us
                ),
            ),
            ("wall", format!("{:.2} s", r.wall_s)),
        ];
        for (k, v) in rows {
            writeln!(f, "{k:<24}{v}")?;
        }
        if let Some(g) = r.gpu_fragmentation {
            writeln!(f, "{:<24}{g:.3}", "gpu fragmentation")?;
        }
        Ok(())
    }
}

/// The state of the machine after an event, for charts.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub t: Secs,
    pub busy: f64,
    pub queued: usize,
}

/// Replays `w`. `progress` is told how many jobs have been submitted.
pub fn replay(
    w: &Workload,
    opts: Options,
    mut progress: impl FnMut(usize),
) -> (Report, Vec<Sample>) {
    let wall = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig {
        policy: opts.policy,
        packing: opts.packing,
        weights: PriorityWeights::age_only(),
        ..SchedulerConfig::default()
    });
    let mut all = PartitionSpec::new("all", "ALL");
    all.is_default = true;
    s.add_partition(all).expect("one fresh partition");
    // Free (cpus, mem, gpus) per node, indexed like the scheduler's ids.
    let mut free: Vec<(u32, u64, u32)> = Vec::with_capacity(w.nodes.len());
    for n in &w.nodes {
        s.handle_node_added(n.clone())
            .expect("trace nodes have distinct names");
        free.push((n.cpus, n.memory_mb, n.gpus.len() as u32));
    }
    let total_cpus: u64 = w.nodes.iter().map(|n| u64::from(n.cpus)).sum();
    let total_gpus: u64 = w.nodes.iter().map(|n| n.gpus.len() as u64).sum();
    let gpu_machine = total_gpus > 0;

    let mut ends: BinaryHeap<Reverse<(Secs, JobId)>> = BinaryHeap::new();
    let mut pending: BTreeSet<JobId> = BTreeSet::new();
    let (mut busy_cpus, mut busy_gpus) = (0u64, 0u64);
    let mut used = 0f64; // resource-seconds of the primary resource
    let (mut waits, mut slowdown_sum, mut max_wait) = (0f64, 0f64, 0f64);
    let mut started = 0usize;
    let mut unplaced = 0usize;
    let mut pass_us: Vec<f64> = Vec::new();
    let mut frag: Vec<f64> = Vec::new();
    let mut samples = Vec::new();
    let first_submit = w.jobs.first().map_or(0, |j| j.submit);
    let mut last_end = first_submit;
    let mut next = 0usize;

    loop {
        let t_submit = w.jobs.get(next).map(|j| j.submit);
        let t_end = ends.peek().map(|Reverse((t, _))| *t);
        let now = match (t_submit, t_end) {
            (None, None) => break,
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) => a,
            (None, Some(b)) => b,
        };
        while let Some(&Reverse((t, id))) = ends.peek() {
            if t > now {
                break;
            }
            ends.pop();
            if let Some(JobStatus::Running { nodes, .. }) = s.job_status(id) {
                for a in &nodes {
                    let f = &mut free[a.node.0 as usize];
                    f.0 += a.cpus.len() as u32;
                    f.1 += a.memory_mb;
                    f.2 += a.gpus.len() as u32;
                    busy_cpus -= a.cpus.len() as u64;
                    busy_gpus -= a.gpus.len() as u64;
                }
            }
            s.handle_job_finished(now, id, JobOutcome::Completed)
                .expect("a running job ends once");
            last_end = last_end.max(now);
        }
        while let Some(j) = w.jobs.get(next).filter(|j| j.submit <= now) {
            let id = JobId(next as u64 + 1);
            match s.submit(now, id, j.request.clone()) {
                Ok(()) => {
                    pending.insert(id);
                }
                Err(_) => unplaced += 1,
            }
            next += 1;
        }
        progress(next);

        let t0 = Instant::now();
        let starts = s.schedule(now);
        pass_us.push(t0.elapsed().as_secs_f64() * 1e6);

        for d in starts {
            let idx = (d.job.0 - 1) as usize;
            let job = &w.jobs[idx];
            pending.remove(&d.job);
            let (mut cpus, mut gpus) = (0u64, 0u64);
            for a in &d.nodes {
                let f = &mut free[a.node.0 as usize];
                f.0 -= a.cpus.len() as u32;
                f.1 -= a.memory_mb;
                f.2 -= a.gpus.len() as u32;
                cpus += a.cpus.len() as u64;
                gpus += a.gpus.len() as u64;
            }
            busy_cpus += cpus;
            busy_gpus += gpus;
            let runtime = job.runtime;
            used += runtime as f64
                * if gpu_machine {
                    gpus as f64
                } else {
                    cpus as f64
                };
            let wait = (now - job.submit) as f64;
            waits += wait;
            max_wait = max_wait.max(wait);
            slowdown_sum += ((wait + runtime as f64) / (runtime as f64).max(TAU)).max(1.0);
            started += 1;
            if !opts.fill {
                ends.push(Reverse((now + runtime, d.job)));
            }
        }

        if gpu_machine {
            if let Some(&head) = pending.first() {
                let req = &w.jobs[(head.0 - 1) as usize].request;
                let need_gpus = match req.gpus {
                    GpuRequest::PerNode(g) | GpuRequest::Total(g) => g,
                    GpuRequest::PerTask(g) => g * req.ntasks.unwrap_or(1),
                    GpuRequest::None => 0,
                };
                let free_gpus: u64 = free.iter().map(|f| u64::from(f.2)).sum();
                if need_gpus > 0 && free_gpus > 0 {
                    let mem = req.memory_per_node_mb.unwrap_or(0);
                    let stranded: u64 = free
                        .iter()
                        .filter(|f| f.2 < need_gpus || f.0 < req.cpus_per_task || f.1 < mem)
                        .map(|f| u64::from(f.2))
                        .sum();
                    frag.push(stranded as f64 / total_gpus as f64);
                }
            }
        }
        samples.push(Sample {
            t: now,
            busy: if gpu_machine {
                busy_gpus as f64 / total_gpus as f64
            } else {
                busy_cpus as f64 / total_cpus.max(1) as f64
            },
            queued: pending.len(),
        });
    }
    unplaced += pending.len();

    pass_us.sort_by(f64::total_cmp);
    let pct = |p: f64| -> f64 {
        if pass_us.is_empty() {
            return 0.0;
        }
        pass_us[((pass_us.len() - 1) as f64 * p).round() as usize]
    };
    let capacity = if gpu_machine { total_gpus } else { total_cpus } as f64;
    let makespan = if opts.fill {
        let last_submit = w.jobs.last().map_or(first_submit, |j| j.submit);
        let busy = if gpu_machine { busy_gpus } else { busy_cpus };
        let span = last_submit.saturating_sub(first_submit) as f64;
        // Busy share at the end, expressed over the span like the rest.
        used = busy as f64 * span.max(1.0);
        span
    } else {
        last_end.saturating_sub(first_submit) as f64
    };
    let n = started.max(1) as f64;
    let report = Report {
        trace: w.name.clone(),
        policy: format!("{:?}", opts.policy).to_lowercase(),
        packing: match opts.packing {
            Packing::BestFit => "best-fit".into(),
            Packing::FirstFit => "first-fit".into(),
        },
        nodes: w.nodes.len(),
        jobs: started,
        unplaced_jobs: unplaced,
        overrun: match opts.overrun.0 {
            crate::trace::Overrun::Extend => "extend".into(),
            crate::trace::Overrun::Kill => "kill".into(),
        },
        overrun_jobs: opts.overrun.1,
        utilization: if makespan > 0.0 {
            used / (capacity * makespan)
        } else {
            0.0
        },
        mean_wait_s: waits / n,
        mean_bounded_slowdown: slowdown_sum / n,
        max_wait_s: max_wait,
        makespan_s: makespan,
        passes: pass_us.len(),
        pass_p50_us: pct(0.5),
        pass_p99_us: pct(0.99),
        pass_max_us: pass_us.last().copied().unwrap_or(0.0),
        wall_s: wall.elapsed().as_secs_f64(),
        // No blocked head, nothing stranded (and an empty sum is -0.0).
        gpu_fragmentation: gpu_machine.then(|| {
            if frag.is_empty() {
                0.0
            } else {
                frag.iter().sum::<f64>() / frag.len() as f64
            }
        }),
    };
    (report, samples)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::TraceJob;
    use scheduler_core::{JobRequest, NodeSpec, UserId};

    fn workload() -> Workload {
        // One 4-CPU node. A wide job waits behind a long one; a short job
        // can backfill into the gap.
        let job = |submit, runtime, tasks, limit| {
            let mut request = JobRequest::new(UserId(1));
            request.ntasks = Some(tasks);
            request.time_limit = Some(limit);
            TraceJob {
                submit,
                runtime,
                request,
            }
        };
        Workload {
            name: "tiny".into(),
            nodes: vec![NodeSpec::new("n0", 4, 1000)],
            jobs: vec![job(0, 100, 2, 100), job(1, 50, 4, 50), job(2, 90, 2, 90)],
            skipped: 0,
        }
    }

    #[test]
    fn backfill_beats_fcfs_on_a_tiny_trace() {
        let run = |policy| {
            replay(
                &workload(),
                Options {
                    policy,
                    packing: Packing::BestFit,
                    fill: false,
                    overrun: Default::default(),
                },
                |_| {},
            )
            .0
        };
        let fcfs = run(BackfillPolicy::Fcfs);
        let easy = run(BackfillPolicy::Easy);
        assert_eq!(fcfs.jobs, 3);
        // FCFS: job 3 waits until 150; EASY starts it at 2 in the gap.
        assert!(
            (fcfs.mean_wait_s - (0.0 + 99.0 + 148.0) / 3.0).abs() < 1e-9,
            "{fcfs:?}"
        );
        assert!(
            (easy.mean_wait_s - (0.0 + 99.0 + 0.0) / 3.0).abs() < 1e-9,
            "{easy:?}"
        );
        assert!(easy.mean_bounded_slowdown < fcfs.mean_bounded_slowdown);
        assert_eq!(easy.makespan_s, 150.0);
        // 2*100 + 4*50 + 2*90 CPU-seconds over 4 CPUs × 150 s.
        assert!((easy.utilization - 580.0 / 600.0).abs() < 1e-9);
    }
}
