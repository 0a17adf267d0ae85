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
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
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
