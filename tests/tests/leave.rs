//! Nodes come and go: an agent stopped with SIGTERM drains its node, lets
//! its running job finish, leaves `sinfo` and exits; a new agent with the
//! same certificate joins and gets work.

use std::time::{Duration, Instant};

use corral_e2e::{Env, Opts};

/// Whether the process is gone (or a zombie nobody has reaped yet).
fn exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

fn sigterm(pid: u32) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
}

#[test]
fn a_stopped_agent_drains_lets_its_job_finish_and_leaves_and_a_new_one_joins() {
    let mut env = Env::start(Opts {
        nodes: 2,
        heartbeat_timeout: 3,
        ..Opts::default()
    });
    let job = env.sbatch(
        &["-w", "worker-1", "-o", "/dev/null"],
        "#!/bin/sh\nsleep 3\n",
    );
    env.wait_state(job, &["RUNNING"], 10);
    let pid = env.cluster.agent_pid(1).expect("worker-1's agent");
    sigterm(pid);
    env.wait_node("worker-1", "drng", true, 10);
    let node = env.ok(&["scontrol", "show", "node", "worker-1"]);
    assert!(
        node.contains("Reason=node_leaving: its agent is stopping"),
        "{node}"
    );
    // The job finishes; then the node is gone and its agent has exited.
    assert_eq!(
        env.wait_state(job, &["COMPLETED", "FAILED"], 15),
        "COMPLETED"
    );
    env.wait_sinfo("worker-1 gone", |s| !s.contains("worker-1"), 10);
    let t0 = Instant::now();
    while !exited(pid) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the agent did not exit"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Scaling up again is starting an agent.
    env.cluster.restart_agent(1).expect("a new agent");
    env.wait_node("worker-1", "idle", true, 10);
    let out = env.ok(&[
        "srun",
        "-w",
        "worker-1",
        "-D",
        "/",
        "sh",
        "-c",
        "echo $SLURMD_NODENAME",
    ]);
    assert_eq!(out.trim(), "worker-1");
}

/// A second SIGTERM does not wait out the grace: the agent ends its jobs
/// and exits at once. (`corral up` killed while it stops its cluster
/// leaves its agents exactly that: its SIGTERM, then the kernel's when it
/// dies, and no ctld to confirm a leave.)
#[test]
fn a_second_sigterm_stops_a_leaving_agent_at_once() {
    let env = Env::start(Opts {
        nodes: 2,
        heartbeat_timeout: 3,
        ..Opts::default()
    });
    // A marker no other test's job runs.
    let job = env.sbatch(
        &["-w", "worker-1", "-o", "/dev/null"],
        "#!/bin/sh\nsleep 97.531\n",
    );
    env.wait_state(job, &["RUNNING"], 10);
    let running = || {
        std::process::Command::new("pgrep")
            .args(["-f", "sleep 97.531"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    assert!(running(), "the job's process");
    let pid = env.cluster.agent_pid(1).expect("worker-1's agent");
    sigterm(pid);
    env.wait_node("worker-1", "drng", true, 10);
    // Leaving, with the job's 300 s of grace ahead of it.
    std::thread::sleep(Duration::from_millis(500));
    assert!(!exited(pid), "the agent left before its job ended");
    sigterm(pid);
    let t0 = Instant::now();
    while !exited(pid) {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the agent did not stop on a second SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let t0 = Instant::now();
    while running() {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the job outlived its agent"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
