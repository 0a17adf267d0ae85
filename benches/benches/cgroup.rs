//! What a job's cgroup costs a step, as root on this machine's hierarchy
//! (v1 on CI): creating the job's and the step's cgroups with limits,
//! then ending both (the kill check, usage, removal). No process joins:
//! this is the agent's own work per step, which `srun -N1 true` pays.
//!
//! | bench                       | budget     |
//! |-----------------------------|------------|
//! | cgroup/job_and_step_cycle   | ≤ 2 ms     |
//!
//! Run: `cargo bench -p benches --bench cgroup` (as root; otherwise it
//! prints SKIPPED and measures nothing).

use corral_agent::cgroup::{Cgroups, Layout, Limits};
use corral_proto::msg::{JobId, JobRun, StepId};
use criterion::{criterion_group, criterion_main, Criterion};

fn benches(c: &mut Criterion) {
    if !nix::unistd::geteuid().is_root() {
        println!("SKIPPED (needs root): cgroup/job_and_step_cycle");
        return;
    }
    let layout = Layout::detect().expect("cgroups");
    let parent = format!("corral-bench-{}", std::process::id());
    let cg = Cgroups::new(layout, &parent, "n0", Some(1024)).expect("node cgroups");
    let limits = Limits {
        cpus: vec![0],
        memory_bytes: Some(1 << 30),
        denied: Vec::new(),
    };
    let mut id = 0u64;
    let mut g = c.benchmark_group("cgroup");
    g.bench_function("job_and_step_cycle", |b| {
        b.iter(|| {
            id += 1;
            let job = JobRun {
                job: JobId(id),
                run: 0,
            };
            cg.create_job(job, &limits).expect("job");
            let join = cg.create_step(job, StepId(0)).expect("step");
            drop(join);
            cg.end_step(job, StepId(0), 0);
            cg.end_job(job)
        })
    });
    g.finish();
    cg.remove_all();
}

criterion_group!(cgroup, benches);
criterion_main!(cgroup);
