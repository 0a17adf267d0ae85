//! A foreign driver embedding scheduler-core: it owns the clock, the job
//! table and the "launch", and asks the core only for decisions.
//!
//! `cargo run -p scheduler-core --example embed`

use std::collections::BTreeMap;

use scheduler_core::{
    GpuRequest, JobId, JobOutcome, JobRequest, NodeSpec, PartitionSpec, Scheduler, SchedulerConfig,
    UserId,
};

/// The host system's own notion of a job: a command and how long it runs.
struct HostJob {
    command: &'static str,
    gpus: u32,
    runtime: u64,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut core = Scheduler::new(SchedulerConfig::default());
    let mut part = PartitionSpec::new("gpu", "dgx-[0-1]");
    part.is_default = true;
    part.max_time = Some(24 * 3600);
    core.add_partition(part)?;
    for i in 0..2 {
        core.handle_node_added(NodeSpec::new(format!("dgx-{i}"), 128, 1_000_000).with_gpus(8, 4))?;
    }

    let host_jobs = [
        HostJob {
            command: "train-llm",
            gpus: 8,
            runtime: 3600,
        },
        HostJob {
            command: "finetune",
            gpus: 4,
            runtime: 1200,
        },
        HostJob {
            command: "eval",
            gpus: 1,
            runtime: 300,
        },
        HostJob {
            command: "train-vit",
            gpus: 8,
            runtime: 1800,
        },
        HostJob {
            command: "sweep",
            gpus: 2,
            runtime: 600,
        },
    ];
    for (i, hj) in host_jobs.iter().enumerate() {
        let mut req = JobRequest::new(UserId(1000 + i as u32 % 2));
        req.name = hj.command.to_string();
        req.gpus = GpuRequest::PerNode(hj.gpus);
        req.time_limit = Some(hj.runtime * 2);
        core.submit(0, JobId(i as u64), req)?;
    }

    // The driver's event loop: pass, "launch", advance to the next end.
    let mut clock = 0u64;
    let mut running: BTreeMap<JobId, u64> = BTreeMap::new();
    loop {
        for start in core.schedule(clock) {
            let hj = &host_jobs[start.job.0 as usize];
            let gpus: Vec<String> = start
                .nodes
                .iter()
                .map(|n| format!("{:?}", n.gpus))
                .collect();
            println!(
                "t={clock:>5} launch {:<10} on {:?} GPUs {}",
                hj.command,
                start.nodes.iter().map(|n| n.node).collect::<Vec<_>>(),
                gpus.join(" ")
            );
            running.insert(start.job, clock + hj.runtime);
        }
        for id in core.active_jobs().collect::<Vec<_>>() {
            if let Some(r) = core.reservation(id) {
                println!(
                    "t={clock:>5}   {:<10} expected at {}",
                    host_jobs[id.0 as usize].command, r.start
                );
            }
        }
        let Some((&id, &end)) = running.iter().min_by_key(|(_, &e)| e) else {
            break;
        };
        clock = end;
        running.remove(&id);
        core.handle_job_finished(clock, id, JobOutcome::Completed)?;
        println!("t={clock:>5} done   {}", host_jobs[id.0 as usize].command);
    }
    Ok(())
}
