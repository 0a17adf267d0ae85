//! Ending jobs: scancel, time limits, a node that dies and comes back.

use std::time::Duration;

use corral_e2e::{Env, Opts};
use nix::sys::signal::Signal;

fn alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

fn wait_for_file(env: &Env, name: &str) -> String {
    for _ in 0..200 {
        let s = env.read(name);
        if !s.trim().is_empty() {
            return s;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{name} never written");
}

#[test]
fn scancel_kills_the_jobs_processes() {
    let env = Env::start(Opts::default());
    let id = env.sbatch(&[], "#!/bin/sh\nsleep 300 &\necho $! > sleeper.pid\nwait\n");
    let pid: i32 = wait_for_file(&env, "sleeper.pid").trim().parse().unwrap();
    assert!(alive(pid));
    env.ok(&["scancel", &id.to_string()]);
    assert_eq!(env.wait_state(id, &["CANCELLED"], 20), "CANCELLED");
    for _ in 0..100 {
        if !alive(pid) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!alive(pid), "the job's background process survived scancel");
    // scancel by name and state.
    let a = env.sbatch(
        &["-J", "victim", "-w", "worker-0", "--exclusive"],
        "#!/bin/sh\nsleep 300\n",
    );
    let b = env.sbatch(
        &["-J", "victim", "-w", "worker-0", "--exclusive"],
        "#!/bin/sh\nsleep 300\n",
    );
    env.wait_state(a, &["RUNNING"], 20);
    env.ok(&["scancel", "-n", "victim", "-t", "PENDING"]);
    assert_eq!(env.wait_state(b, &["CANCELLED"], 20), "CANCELLED");
    assert_eq!(env.state(a), "RUNNING");
    env.ok(&["scancel", "-n", "victim"]);
    env.wait_state(a, &["CANCELLED"], 20);
}

#[test]
fn time_limit_turns_into_timeout() {
    let env = Env::start(Opts::default());
    // Limits are whole minutes, as Slurm's (`-t 0:02` would be one).
    let id = env.sbatch(&["-t", "1"], "#!/bin/sh\ntrap '' TERM\nsleep 300\n");
    assert_eq!(
        env.wait_state(id, &["TIMEOUT", "FAILED", "COMPLETED"], 120),
        "TIMEOUT"
    );
}

#[test]
fn a_killed_agent_downs_its_node_and_rejoins() {
    let mut env = Env::start(Opts {
        heartbeat_timeout: 2,
        ..Opts::default()
    });
    let failing = env.sbatch(
        &["-w", "worker-1", "--no-requeue"],
        "#!/bin/sh\nsleep 300\n",
    );
    // Requeueable by default, as Slurm's batch jobs.
    let requeued = env.sbatch(&["-w", "worker-1"], "#!/bin/sh\nsleep 300\n");
    env.wait_state(failing, &["RUNNING"], 20);
    env.wait_state(requeued, &["RUNNING"], 20);
    env.cluster.kill_agent(1, Signal::SIGKILL);
    env.wait_sinfo(
        "worker-1 down",
        |s| {
            s.lines()
                .any(|l| l.starts_with("worker-1") && l.contains("down"))
        },
        20,
    );
    assert_eq!(env.wait_state(failing, &["NODE_FAIL"], 10), "NODE_FAIL");
    assert_eq!(env.state(requeued), "PENDING");
    let r = env.ok(&["sinfo", "-R", "-h"]);
    assert!(
        r.contains("Not responding") && r.contains("worker-1"),
        "{r}"
    );
    env.cluster.restart_agent(1).unwrap();
    env.wait_sinfo(
        "worker-1 back",
        |s| {
            s.lines()
                .any(|l| l.starts_with("worker-1") && !l.contains("down"))
        },
        20,
    );
    // The requeued job runs again on the returned node.
    env.wait_state(requeued, &["RUNNING"], 20);
    let show = env.ok(&["scontrol", "show", "job", &requeued.to_string()]);
    assert!(show.contains("Restarts=1"), "{show}");
    env.ok(&["scancel", &requeued.to_string()]);
}

/// Lightning's auto-requeue pattern: `--signal=SIGUSR1@90` reaches the
/// training step before the limit (here 58 s before a one-minute limit,
/// so about 2 s after the start); with `B:` it reaches the batch shell
/// instead. Each job traps it, says so, and ends well before its limit.
#[test]
fn a_limit_signal_reaches_the_steps_or_with_b_the_batch_shell() {
    let env = Env::start(Opts::default());
    let trap =
        |what: &str| format!("trap 'echo {what} got USR1; exit 0' USR1; sleep 300 & wait $!");
    let batch = env.sbatch(
        &["-t", "1", "--signal=B:USR1@58", "-o", "batch.out"],
        &format!("#!/bin/sh\n{}\n", trap("shell")),
    );
    let step = env.sbatch(
        &["-t", "1", "--signal=SIGUSR1@58", "-o", "step.out"],
        &format!(
            "#!/bin/sh\ntrap 'echo shell got USR1' USR1\nsrun sh -c \"{}\"\necho step done\n",
            trap("step")
        ),
    );
    for (id, file, want) in [
        (batch, "batch.out", "shell got USR1\n"),
        (step, "step.out", "step got USR1\nstep done\n"),
    ] {
        assert_eq!(
            env.wait_state(id, &["COMPLETED", "TIMEOUT", "FAILED", "CANCELLED"], 50),
            "COMPLETED"
        );
        let got = std::fs::read_to_string(env.work.join(file)).expect("output");
        assert_eq!(got, want, "job {id}");
    }
}

/// Lightning's auto-requeue, whole: `--signal=B:USR1@58` reaches the
/// batch shell about 2 s in; its trap saves a checkpoint and runs
/// `scontrol requeue $SLURM_JOB_ID`; the run is ended, the job waits its
/// `requeue_delay` (here 2 s, Slurm's two minutes by default) and runs
/// again as run 1, which resumes from the checkpoint and completes.
/// Accounting keeps both runs.
#[test]
fn a_job_that_traps_its_limit_signal_requeues_itself_and_resumes() {
    let env = Env::start(Opts::default());
    let script = "#!/bin/bash\n\
        #SBATCH -t 1\n\
        #SBATCH --signal=B:USR1@58\n\
        #SBATCH -o lightning.out\n\
        #SBATCH --open-mode=append\n\
        echo \"run ${SLURM_RESTART_COUNT:-0} starts\"\n\
        if [ -f ckpt ]; then echo \"resumed from $(cat ckpt)\"; exit 0; fi\n\
        trap 'echo epoch-3 > ckpt; echo saved, requeueing; scontrol requeue $SLURM_JOB_ID; sleep 30' USR1\n\
        sleep 300 & wait $!\n\
        echo never here\n";
    let id = env.sbatch(&[], script);
    assert_eq!(
        env.wait_state(id, &["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"], 60),
        "COMPLETED"
    );
    assert_eq!(
        env.read("lightning.out"),
        "run 0 starts\nsaved, requeueing\nrun 1 starts\nresumed from epoch-3\n"
    );
    let show = env.ok(&["scontrol", "show", "job", &id.to_string()]);
    assert!(show.contains("Restarts=1"), "{show}");
    let runs = env.ok(&[
        "sacct",
        "-j",
        &id.to_string(),
        "-D",
        "-X",
        "-n",
        "-P",
        "-o",
        "State",
    ]);
    assert_eq!(runs, "REQUEUED\nCOMPLETED\n");
    // A job that asked not to be requeued is told so, and keeps running.
    let fixed = env.sbatch(
        &["--no-requeue", "-o", "/dev/null"],
        "#!/bin/sh\nsleep 300\n",
    );
    env.wait_state(fixed, &["RUNNING"], 20);
    let (code, _, err) = env.run(&["scontrol", "requeue", &fixed.to_string()]);
    assert_eq!(code, 1);
    assert!(
        err.contains("Requested operation is presently disabled"),
        "{err}"
    );
    assert_eq!(env.state(fixed), "RUNNING");
    env.ok(&["scancel", &fixed.to_string()]);
}
