//! A small world for scheduling stories: a cluster, a clock, jobs that run
//! for a set time. `Sim::new().nodes(2, gpus(8))`, `sim.submit(job().gpus(4))`,
//! `sim.run_until_idle()`, then ask when and where each job ran.
#![allow(dead_code)]

use scheduler_core::testing::{Driver, JobPlan, Run, Runtime};
use scheduler_core::*;

/// A node template.
#[derive(Clone, Debug)]
pub struct Kind {
    pub cpus: u32,
    pub mem: u64,
    pub gpus: u32,
    pub per_group: u32,
    pub features: Vec<String>,
}

/// 64 CPUs, 512 GB, `n` GPUs in groups of 4.
pub fn gpus(n: u32) -> Kind {
    Kind {
        cpus: 64,
        mem: 512_000,
        gpus: n,
        per_group: 4,
        features: Vec::new(),
    }
}

/// `n` CPUs and no GPUs.
pub fn cpus(n: u32) -> Kind {
    Kind {
        cpus: n,
        mem: 64_000,
        gpus: 0,
        per_group: 0,
        features: Vec::new(),
    }
}

impl Kind {
    pub fn feature(mut self, f: &str) -> Self {
        self.features.push(f.to_string());
        self
    }
}

/// A job and how long it will really run.
#[derive(Clone, Debug)]
pub struct JobDef {
    pub req: JobRequest,
    pub runtime: Option<Secs>,
    pub fails: bool,
}

pub fn job() -> JobDef {
    let mut req = JobRequest::new(UserId(1));
    req.time_limit = Some(100);
    JobDef {
        req,
        runtime: None,
        fails: false,
    }
}

impl JobDef {
    pub fn gpus(mut self, n: u32) -> Self {
        self.req.gpus = GpuRequest::PerNode(n);
        self
    }
    pub fn gpus_per_task(mut self, n: u32) -> Self {
        self.req.gpus = GpuRequest::PerTask(n);
        self
    }
    pub fn total_gpus(mut self, n: u32) -> Self {
        self.req.gpus = GpuRequest::Total(n);
        self
    }
    pub fn nodes(mut self, n: u32) -> Self {
        self.req.nodes = Some(n);
        self
    }
    pub fn tasks(mut self, n: u32) -> Self {
        self.req.ntasks = Some(n);
        self
    }
    pub fn cpus(mut self, n: u32) -> Self {
        self.req.cpus_per_task = n;
        self
    }
    pub fn mem_per_cpu(mut self, mb: u64) -> Self {
        self.req.memory_per_cpu_mb = Some(mb);
        self
    }
    pub fn mem_per_gpu(mut self, mb: u64) -> Self {
        self.req.memory_per_gpu_mb = Some(mb);
        self
    }
    pub fn mem_whole(mut self) -> Self {
        self.req.memory_whole_node = true;
        self
    }
    pub fn time(mut self, t: Secs) -> Self {
        self.req.time_limit = Some(t);
        self
    }
    /// Runs for `t` seconds (default: its whole time limit).
    pub fn runs(mut self, t: Secs) -> Self {
        self.runtime = Some(t);
        self
    }
    pub fn exclusive(mut self) -> Self {
        self.req.exclusive = true;
        self
    }
    pub fn user(mut self, u: u32) -> Self {
        self.req.user = UserId(u);
        self.req.account = AccountId(u);
        self
    }
    pub fn name(mut self, n: &str) -> Self {
        self.req.name = n.to_string();
        self
    }
    pub fn partition(mut self, p: &str) -> Self {
        self.req.partition = Some(p.to_string());
        self
    }
    pub fn after(mut self, d: Dependency) -> Self {
        self.req.dependencies.push(d);
        self
    }
    /// Any one dependency suffices (`-d a?b`).
    pub fn any_dependency(mut self) -> Self {
        self.req.dependencies_any = true;
        self
    }
    pub fn fails(mut self) -> Self {
        self.fails = true;
        self
    }
    pub fn held(mut self) -> Self {
        self.req.hold = true;
        self
    }
    pub fn begin(mut self, t: Secs) -> Self {
        self.req.begin_time = Some(t);
        self
    }
    pub fn requeue(mut self) -> Self {
        self.req.requeue = true;
        self
    }
    pub fn nodelist(mut self, names: &[&str]) -> Self {
        self.req.nodelist = names.iter().map(|s| s.to_string()).collect();
        self
    }
    pub fn constraint(mut self, f: &str) -> Self {
        self.req.features.push(f.to_string());
        self
    }
    /// Any one of the constraints suffices (`-C a|b`).
    pub fn any_constraint(mut self) -> Self {
        self.req.features_any = true;
        self
    }
}

pub struct Sim {
    pub d: Driver,
}

impl Sim {
    /// One partition `batch` over every node; first-come-first-served
    /// priority so stories read in submit order.
    pub fn new() -> Self {
        Self::with(SchedulerConfig {
            weights: PriorityWeights::age_only(),
            ..SchedulerConfig::default()
        })
    }

    /// Like [`Sim::new`], with some settings changed.
    pub fn tuned(change: impl FnOnce(&mut SchedulerConfig)) -> Self {
        let mut cfg = SchedulerConfig {
            weights: PriorityWeights::age_only(),
            ..SchedulerConfig::default()
        };
        change(&mut cfg);
        Self::with(cfg)
    }

    pub fn with(cfg: SchedulerConfig) -> Self {
        let mut p = PartitionSpec::new("batch", "ALL");
        p.max_time = Some(100_000);
        Sim {
            d: Driver::new(cfg, p),
        }
    }

    /// Adds `n` nodes named `node-<i>`.
    pub fn nodes(mut self, n: usize, kind: Kind) -> Self {
        for _ in 0..n {
            let name = format!("node-{}", self.d.s.node_ids().count());
            let spec = NodeSpec::new(name, kind.cpus, kind.mem)
                .with_gpus(kind.gpus, kind.per_group)
                .with_features(kind.features.clone());
            self.d.add_named(spec);
        }
        self
    }

    pub fn node(&self, name: &str) -> NodeId {
        self.d.s.node_id(name).expect("known node")
    }

    pub fn try_submit(&mut self, def: JobDef) -> Result<JobId, SubmitError> {
        self.d.submit(JobPlan {
            req: def.req,
            runtime: def.runtime.map_or(Runtime::Limit, Runtime::Secs),
            outcome: if def.fails {
                JobOutcome::Failed { exit_code: 1 }
            } else {
                JobOutcome::Completed
            },
        })
    }

    pub fn submit(&mut self, def: JobDef) -> JobId {
        self.try_submit(def).expect("submit accepted")
    }

    /// One scheduling pass at the current time.
    pub fn pass(&mut self) -> Vec<StartDecision> {
        self.d.pass().expect("the pass keeps every invariant")
    }

    /// Moves the clock to `t`, ending the jobs whose run is over by then.
    pub fn advance_to(&mut self, t: Secs) {
        self.d
            .advance_to(t)
            .expect("the passes keep every invariant");
    }

    /// Passes and job ends until nothing more can happen.
    pub fn run_until_idle(&mut self) {
        self.d
            .run_until_idle()
            .expect("the passes keep every invariant");
    }

    pub fn start(&self, id: JobId) -> Option<Secs> {
        self.d.runs.get(&id).map(|r| r.start)
    }

    pub fn run(&self, id: JobId) -> &Run {
        self.d.runs.get(&id).expect("job ran")
    }

    /// Names of the nodes a job ran on.
    pub fn node_names(&self, id: JobId) -> Vec<String> {
        self.run(id)
            .nodes
            .iter()
            .map(|a| self.d.s.node_info(a.node).expect("node").name)
            .collect()
    }

    pub fn reason(&self, id: JobId) -> PendingReason {
        match self.d.s.job_status(id) {
            Some(JobStatus::Pending { reason, .. }) => reason,
            other => panic!("job {id} is not pending: {other:?}"),
        }
    }

    pub fn expected(&self, id: JobId) -> Option<Secs> {
        match self.d.s.job_status(id) {
            Some(JobStatus::Pending { expected_start, .. }) => expected_start,
            other => panic!("job {id} is not pending: {other:?}"),
        }
    }
}
