//! `salloc`: get an allocation, run a command (by default the user's
//! shell) here with `SLURM_JOB_ID` and friends set, so that `srun` inside
//! it runs steps on the allocation; when the command ends, the allocation
//! ends with its exit code.

use std::ffi::OsString;
use std::time::Duration;

use clap::Parser;
use corral_proto::msg::{
    ExitStatus, JobFilter, JobId, JobKind, JobState, JobView, Request, Response,
};

use super::opts::{switch, value, InputVar, JobOpts};
use super::{block_on, fail, parse};
use crate::client::Client;

const CMD: &str = "salloc";

/// Obtain a job allocation and run a command in it.
#[derive(Debug, Parser)]
#[command(name = "salloc", version, args_override_self = true)]
pub struct SallocArgs {
    #[command(flatten)]
    pub job: JobOpts,
    /// The command and its arguments (default: $SHELL, or /bin/sh).
    #[arg(trailing_var_arg = true)]
    pub command: Vec<String>,
}

/// salloc's input environment variables (its man page's, of the options
/// Corral has).
const SALLOC_INPUT: &[InputVar] = &[
    value("SALLOC_ACCOUNT", "--account"),
    switch("SALLOC_EXCLUSIVE", "--exclusive"),
    value("SALLOC_GRES", "--gres"),
    value("SALLOC_PARTITION", "--partition"),
    value("SALLOC_QOS", "--qos"),
    value("SALLOC_TIMELIMIT", "--time"),
];

/// The variables the command runs with, from the granted allocation.
pub fn allocation_env(v: &JobView, ntasks_given: bool) -> Vec<(String, String)> {
    let nodelist = scheduler_core::hostlist::compress(&v.nodes);
    let mut env = vec![
        ("SLURM_JOB_ID".to_string(), v.id.to_string()),
        ("SLURM_JOBID".to_string(), v.id.to_string()),
        ("SLURM_JOB_NAME".to_string(), v.name.clone()),
        ("SLURM_JOB_NODELIST".to_string(), nodelist.clone()),
        ("SLURM_NODELIST".to_string(), nodelist),
        ("SLURM_JOB_NUM_NODES".to_string(), v.nodes.len().to_string()),
        ("SLURM_NNODES".to_string(), v.nodes.len().to_string()),
        ("SLURM_JOB_PARTITION".to_string(), v.partition.clone()),
        ("SLURM_SUBMIT_DIR".to_string(), v.work_dir.clone()),
    ];
    if ntasks_given {
        env.push(("SLURM_NTASKS".to_string(), v.num_tasks.to_string()));
        env.push(("SLURM_NPROCS".to_string(), v.num_tasks.to_string()));
    }
    if v.mem_mb > 0 {
        env.push(("SLURM_MEM_PER_NODE".to_string(), v.mem_mb.to_string()));
    }
    if let Ok(h) = nix::unistd::gethostname() {
        if let Ok(h) = h.into_string() {
            env.push(("SLURM_SUBMIT_HOST".to_string(), h));
        }
    }
    env
}

/// The job's view, if the controller still has it.
async fn view(c: &mut Client, job: JobId) -> Result<Option<JobView>, String> {
    let views = c
        .jobs(JobFilter {
            ids: vec![job],
            ..JobFilter::default()
        })
        .await?;
    Ok(views.into_iter().find(|v| v.id == job))
}

/// Says the allocation is over (the command's exit, or a cancel while it
/// still waits).
async fn end(job: JobId, exit: ExitStatus) {
    if let Ok(mut c) = Client::connect().await {
        let _ = c.call(Request::EndAllocation { job, exit }).await;
    }
}

pub fn main(args: &[OsString]) -> i32 {
    let mut merged: Vec<OsString> = args.iter().take(1).cloned().collect();
    merged.extend(super::opts::input_options(SALLOC_INPUT, |v| {
        std::env::var(v).ok()
    }));
    merged.extend(args.iter().skip(1).cloned());
    let a: SallocArgs = match parse(CMD, &merged) {
        Ok(a) => a,
        Err(code) => return code,
    };
    let mut spec = match a.job.to_spec() {
        Ok(s) => s,
        Err(e) => return fail(CMD, e),
    };
    let command = if a.command.is_empty() {
        vec![std::env::var("SHELL").unwrap_or_else(|_| "/bin/sh".into())]
    } else {
        a.command.clone()
    };
    if spec.name.is_empty() {
        spec.name = std::path::Path::new(&command[0])
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "salloc".into());
    }
    let cwd = match std::env::current_dir() {
        Ok(d) => match &a.job.chdir {
            Some(c) => d.join(c),
            None => d,
        },
        Err(e) => return fail(CMD, format!("current directory: {e}")),
    };
    spec.work_dir = cwd.to_string_lossy().into_owned();
    spec.requeue = false;
    spec.kind = JobKind::Allocation;
    let ntasks_given = a.job.ntasks.is_some();
    block_on(CMD, async move {
        let mut c = match Client::connect().await {
            Ok(c) => c,
            Err(e) => return fail(CMD, format!("Job submit/allocate failed: {e}")),
        };
        let job = match c.ok(Request::Submit(spec)).await {
            Ok(Response::Submitted { job }) => job,
            Ok(other) => return fail(CMD, format!("unexpected answer {other:?}")),
            Err(e) => return fail(CMD, format!("Job submit/allocate failed: {e}")),
        };
        let quiet = a.job.quiet;
        // Ctrl-C while waiting gives the allocation up; once granted, it
        // is the command's (salloc only outlives it).
        let interrupted = tokio::signal::ctrl_c();
        tokio::pin!(interrupted);
        let mut said_waiting = false;
        let mut pause = Duration::from_millis(50);
        let granted = loop {
            match view(&mut c, job).await {
                Ok(Some(v)) if v.state == JobState::Running => break v,
                Ok(Some(v)) if v.state.is_final() => {
                    return fail(CMD, format!("Job allocation {job} has been revoked."));
                }
                Ok(Some(_)) => {}
                Ok(None) => return fail(CMD, format!("Job allocation {job} has been revoked.")),
                Err(e) => return fail(CMD, e),
            }
            // As Slurm's: a job granted at once says only that; one that
            // waits says so (the poll's first 150 ms count as at once).
            if !said_waiting && pause >= Duration::from_millis(200) {
                if !quiet {
                    eprintln!("{CMD}: Pending job allocation {job}");
                    eprintln!("{CMD}: job {job} queued and waiting for resources");
                }
                said_waiting = true;
            }
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = &mut interrupted => {
                    end(job, ExitStatus::default()).await;
                    return fail(CMD, format!("Job allocation {job} has been revoked."));
                }
            }
            pause = (pause * 2).min(Duration::from_secs(1));
        };
        if !quiet {
            if said_waiting {
                eprintln!("{CMD}: job {job} has been allocated resources");
            }
            eprintln!("{CMD}: Granted job allocation {job}");
        }
        // Alive every 5 s: a salloc that is killed (or whose host goes)
        // stops saying so, and the controller ends the allocation.
        let alive = tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(5));
            loop {
                every.tick().await;
                if let Ok(mut c) = Client::connect().await {
                    let _ = c.ok(Request::AllocationAlive { job }).await;
                }
            }
        });
        let mut cmd = tokio::process::Command::new(&command[0]);
        cmd.args(&command[1..])
            .envs(allocation_env(&granted, ntasks_given));
        let status = match cmd.spawn() {
            Ok(mut child) => loop {
                // The terminal's Ctrl-C reaches the command too; salloc
                // stays for it.
                tokio::select! {
                    st = child.wait() => break st,
                    _ = tokio::signal::ctrl_c() => {}
                }
            },
            Err(e) => Err(e),
        };
        let (exit, code) = match status {
            Ok(st) => {
                let exit = ExitStatus::from(st);
                (exit, exit.code)
            }
            Err(e) => {
                eprintln!("{CMD}: error: {}: {e}", command[0]);
                (
                    ExitStatus {
                        code: 127,
                        signal: None,
                    },
                    127,
                )
            }
        };
        alive.abort();
        if !quiet {
            eprintln!("{CMD}: Relinquishing job allocation {job}");
        }
        end(job, exit).await;
        code
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn salloc_takes_the_seed_systems_line() {
        let a = SallocArgs::try_parse_from([
            "salloc",
            "--nodes=1",
            "--ntasks=1",
            "--mem=4G",
            "--time=00:20:00",
            "--gres=gpu:1",
        ])
        .unwrap();
        assert!(a.command.is_empty());
        let spec = a.job.to_spec().unwrap();
        assert_eq!(spec.nodes, Some(1));
        assert_eq!(spec.mem_mb, Some(4096));
        assert_eq!(spec.time_limit, Some(20 * 60));
        assert_eq!(spec.gpus, corral_proto::msg::GpuAsk::PerNode(1));
        let a = SallocArgs::try_parse_from(["salloc", "-N2", "srun", "-l", "hostname"]).unwrap();
        assert_eq!(a.command, ["srun", "-l", "hostname"]);
    }
}
