//! What a job's cgroup costs a step, as root on this machine's hierarchy
//! (v1 on CI): setting the job's and the step's cgroups up with limits,
//! then ending both (the kill check, usage, removal). No process joins:
//! this is the agent's own work per step, which `srun -N1 true` pays. On
//! v1 each cycle after the first reuses the last one's cgroup (renamed to
//! a spare as it ends, back to a job's name as the next starts:
//! `corral_agent::cgroup` `spare`), as the agent does: 517 µs a cycle
//! making and removing, 325 µs reusing (5 Dec, this machine).
//!
//! `cgroup/join` is what a task adds: a child forked, moved into its
//! step's cgroup through the agent's `Join` (as every task is between
//! fork and exec), exiting, waited for. The move is the part that needs
//! the cgroup2 root's `favordynmods` (which the agent turns on at start,
//! `cgroup::dynmods`): without it each one waits for an RCU grace period,
//! measured 12.7 ms at the median on the CI machine, and the budget is
//! missed by far. The bench prints whether the mount table shows the
//! option; on Linux 6.18 the kernel keeps its effect after it is removed
//! again, so "off" there can still measure the fast path.
//!
//! | bench                       | budget     |
//! |-----------------------------|------------|
//! | cgroup/job_and_step_cycle   | ≤ 2 ms     |
//! | cgroup/join                 | ≤ 1 ms     |
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
    let on = corral_agent::cgroup::dynmods::is_on(std::path::Path::new("/proc/self/mountinfo"))
        .unwrap_or(false);
    println!(
        "cgroup/join: favordynmods is {}",
        if on { "on" } else { "off" }
    );
    let job = JobRun {
        job: JobId(u64::MAX),
        run: 0,
    };
    cg.create_job(job, &limits).expect("job");
    let mut step = 0u32;
    #[allow(unsafe_code)]
    g.bench_function("join", |b| {
        b.iter(|| {
            step += 1;
            let join = cg.create_step(job, StepId(step)).expect("step");
            // SAFETY: the child only writes to descriptors opened before
            // the fork and exits; it touches no lock or allocator.
            match unsafe { nix::unistd::fork() }.expect("fork") {
                nix::unistd::ForkResult::Child => {
                    let code = i32::from(join.enter().is_err());
                    // SAFETY: _exit ends the child without running the
                    // parent's destructors or flushing its buffers.
                    unsafe { nix::libc::_exit(code) }
                }
                nix::unistd::ForkResult::Parent { child } => {
                    let st = nix::sys::wait::waitpid(child, None).expect("wait");
                    assert_eq!(st, nix::sys::wait::WaitStatus::Exited(child, 0));
                }
            }
            drop(join);
            cg.end_step(job, StepId(step), 0);
        })
    });
    cg.end_job(job);
    g.finish();
    cg.remove_all();
}

criterion_group!(cgroup, benches);
criterion_main!(cgroup);
