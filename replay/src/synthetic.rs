//! Synthetic clusters and queues for the benches: GPU nodes, a mix of job
//! sizes like an ML cluster's, and a seeded generator so every run builds
//! the same state.

use scheduler_core::{
    GpuRequest, JobId, JobRequest, NodeSpec, PartitionSpec, Scheduler, SchedulerConfig, Secs,
    UserId,
};

/// SplitMix64: small, seeded, good enough to pick job sizes.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// A scheduler with `nodes` nodes of 64 CPUs and `gpus` GPUs (NVLink
/// groups of 4), one default partition over all of them.
pub fn cluster(nodes: usize, gpus: u32, cfg: SchedulerConfig) -> Scheduler {
    let mut s = Scheduler::new(cfg);
    let mut p = PartitionSpec::new("gpu", "ALL");
    p.is_default = true;
    s.add_partition(p).expect("fresh partition");
    for i in 0..nodes {
        s.handle_node_added(NodeSpec::new(format!("gpu-{i}"), 64, 1_024_000).with_gpus(gpus, 4))
            .expect("distinct names");
    }
    s
}

/// One job of the mix: 1, 2, 4 or 8 GPUs on one node, or 2 or 4 whole
/// nodes; 8 CPUs per GPU; a time limit of 1 to 24 hours.
pub fn mixed_job(rng: &mut Rng, users: u32) -> JobRequest {
    let mut r = JobRequest::new(UserId(rng.below(u64::from(users)) as u32));
    let roll = rng.below(100);
    let (nodes, gpus) = match roll {
        0..40 => (1, 1),
        40..60 => (1, 2),
        60..75 => (1, 4),
        75..90 => (1, 8),
        90..97 => (2, 8),
        _ => (4, 8),
    };
    if nodes > 1 {
        r.nodes = Some(nodes);
    }
    r.gpus = GpuRequest::PerNode(gpus);
    r.cpus_per_task = 8 * gpus;
    const LIMITS: [Secs; 5] = [3600, 2 * 3600, 4 * 3600, 8 * 3600, 24 * 3600];
    r.time_limit = Some(LIMITS[rng.below(5) as usize]);
    r
}

/// A cluster whose GPUs are all busy with running jobs of the mix, ending
/// at staggered times, plus `pending` more jobs of the mix waiting. The
/// next pass (at time 1) has the whole queue to plan. Returns the
/// scheduler and the next free job id.
pub fn busy_cluster_with_queue(
    nodes: usize,
    pending: usize,
    cfg: SchedulerConfig,
    seed: u64,
) -> (Scheduler, u64) {
    let mut s = cluster(nodes, 8, cfg);
    let mut rng = Rng::new(seed);
    let mut id = 1u64;
    // Fill the machine: single-node jobs until a pass starts no more.
    loop {
        let batch = nodes * 2;
        for _ in 0..batch {
            let mut r = mixed_job(&mut rng, 64);
            r.nodes = None;
            s.submit(0, JobId(id), r).expect("valid job");
            id += 1;
        }
        let started = s.schedule(0).len();
        if started < batch / 4 {
            break;
        }
    }
    // Whatever did not start stays queued, and the rest of the queue joins.
    let queued = s.pending_count();
    for _ in queued..pending {
        s.submit(0, JobId(id), mixed_job(&mut rng, 64))
            .expect("valid job");
        id += 1;
    }
    (s, id)
}

/// `nodes` nodes with every GPU running a one-GPU job; then `freed` of
/// those jobs end and `freed` one-GPU jobs are submitted. The next pass
/// makes `freed` start decisions.
pub fn single_gpu_stream(nodes: usize, freed: usize, seed: u64) -> Scheduler {
    let mut s = cluster(nodes, 8, SchedulerConfig::default());
    let mut id = 1u64;
    let one_gpu = |rng: &mut Rng| {
        let mut r = JobRequest::new(UserId(rng.below(64) as u32));
        r.gpus = GpuRequest::PerNode(1);
        r.cpus_per_task = 8;
        r.time_limit = Some(3600 + rng.below(20_000));
        r
    };
    let mut rng = Rng::new(seed);
    for _ in 0..nodes * 8 {
        s.submit(0, JobId(id), one_gpu(&mut rng))
            .expect("valid job");
        id += 1;
    }
    let started = s.schedule(0);
    assert_eq!(started.len(), nodes * 8, "every GPU busy");
    // End `freed` distinct jobs, spread evenly over the machine.
    let total = nodes as u64 * 8;
    let stride = (total / freed.max(1) as u64).max(1);
    let mut ended = 0;
    let mut victim = 1 + rng.below(stride);
    while ended < freed && victim <= total {
        s.handle_job_finished(10, JobId(victim), scheduler_core::JobOutcome::Completed)
            .expect("every job is running");
        ended += 1;
        victim += stride;
    }
    for _ in 0..freed {
        s.submit(10, JobId(id), one_gpu(&mut rng))
            .expect("valid job");
        id += 1;
    }
    s
}

/// A workload of the job mix arriving over time on `nodes` 8-GPU nodes:
/// Poisson-like arrivals at `load` times the rate the machine can serve
/// on average, run times between a tenth of and the full time limit.
pub fn ml_mix_workload(nodes: usize, jobs: usize, load: f64, seed: u64) -> crate::trace::Workload {
    let mut rng = Rng::new(seed);
    let specs = (0..nodes)
        .map(|i| NodeSpec::new(format!("gpu-{i}"), 64, 1_024_000).with_gpus(8, 4))
        .collect();
    let mut list = Vec::with_capacity(jobs);
    let mut t = 0u64;
    // Mean GPU-seconds per job of the mix, estimated from a sample.
    let mut probe = Rng::new(seed ^ 0x5eed);
    let mean_work: f64 = (0..2000)
        .map(|_| {
            let r = mixed_job(&mut probe, 1);
            let g = match r.gpus {
                GpuRequest::PerNode(g) => g,
                _ => 0,
            };
            f64::from(g * r.nodes.unwrap_or(1)) * r.time_limit.unwrap_or(0) as f64 * 0.55
        })
        .sum::<f64>()
        / 2000.0;
    let mean_gap = mean_work / (nodes as f64 * 8.0 * load.max(1e-6));
    for _ in 0..jobs {
        let request = mixed_job(&mut rng, 16);
        let limit = request.time_limit.unwrap_or(3600);
        let runtime = limit / 10 + rng.below(limit - limit / 10 + 1);
        // Exponential gaps from a uniform draw.
        let u = (rng.below(1 << 30) as f64 + 0.5) / f64::from(1u32 << 30);
        t += (-u.ln() * mean_gap) as u64;
        list.push(crate::trace::TraceJob {
            submit: t,
            runtime,
            request,
        });
    }
    crate::trace::Workload {
        name: format!("ml-mix-{nodes}x8-{jobs}"),
        nodes: specs,
        jobs: list,
        skipped: 0,
    }
}
