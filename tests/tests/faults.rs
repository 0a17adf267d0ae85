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
    let failing = env.sbatch(&["-w", "worker-1"], "#!/bin/sh\nsleep 300\n");
    let requeued = env.sbatch(&["-w", "worker-1", "--requeue"], "#!/bin/sh\nsleep 300\n");
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
