//! GPU health drains and lifts by itself: a fault injected in a node's
//! simulated GPU file drains it within a check interval with the check's
//! reason, clearing the fault brings it back, and an operator's drain is
//! not lifted by a passing check.

use std::time::Duration;

use corral_e2e::{Env, Opts};

fn gpus(count: u32, fault: Option<(u32, &str)>) -> String {
    (0..count)
        .map(|g| match fault {
            Some((bad, line)) if bad == g => format!("[[gpu]]\nindex = {g}\n{line}\n"),
            _ => format!("[[gpu]]\nindex = {g}\n"),
        })
        .collect()
}

fn node_line(env: &Env, node: &str) -> String {
    env.ok(&["sinfo", "-N", "-h"])
        .lines()
        .find(|l| l.starts_with(node))
        .unwrap_or_default()
        .to_string()
}

#[test]
fn a_sick_gpu_drains_its_node_until_it_is_well_and_an_admin_drain_stays() {
    // Checks run with each heartbeat: every second here.
    let env = Env::start(Opts {
        nodes: 2,
        gpus: 4,
        heartbeat_timeout: 3,
        ..Opts::default()
    });
    let file = env.cluster.gpu_file(1);
    std::fs::write(&file, gpus(4, Some((2, "xid = 79")))).expect("inject a fault");
    env.wait_node("worker-1", "drain", true, 10);
    // sinfo -R shows the reason's first 20 characters, as Slurm's does.
    let short = env.ok(&["sinfo", "-R", "-h"]);
    assert!(short.contains("node_problem: gpu: G"), "{short}");
    let node = env.ok(&["scontrol", "show", "node", "worker-1"]);
    assert!(
        node.contains("Reason=node_problem: gpu: GPU 2: XID 79"),
        "{node}"
    );
    // A job that needs the sick node waits.
    let job = env.sbatch(&["-w", "worker-1", "-o", "/dev/null"], "#!/bin/sh\ntrue\n");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(env.state(job), "PENDING");
    // Cleared: the node comes back by itself and takes the job.
    std::fs::write(&file, gpus(4, None)).expect("clear the fault");
    env.wait_state(job, &["COMPLETED"], 15);
    assert!(!node_line(&env, "worker-1").contains("drain"));

    // Other faults read the same way.
    std::fs::write(&file, gpus(4, Some((0, "lost = true")))).expect("lose a GPU");
    env.wait_node("worker-1", "drain", true, 10);
    let node = env.ok(&["scontrol", "show", "node", "worker-1"]);
    assert!(
        node.contains("Reason=node_problem: gpu: GPU 0 fell off the bus"),
        "{node}"
    );
    std::fs::write(&file, gpus(4, None)).expect("clear the fault");

    // An operator's drain is the operator's to lift: passing checks keep it.
    env.ok(&[
        "scontrol",
        "update",
        "NodeName=worker-0",
        "State=DRAIN",
        "Reason=maintenance",
    ]);
    std::thread::sleep(Duration::from_secs(3));
    let line = node_line(&env, "worker-0");
    assert!(line.contains("drain"), "{line}");
    let node = env.ok(&["scontrol", "show", "node", "worker-0"]);
    assert!(node.contains("Reason=maintenance"), "{node}");
}

#[test]
fn an_operators_command_check_drains_the_node_it_fails_on_until_it_passes() {
    let dir = tempfile::tempdir().expect("dir");
    let flag = dir.path().join("sick");
    // Fails on the node whose flag file exists, saying why on stdout.
    let env = Env::start(Opts {
        nodes: 2,
        heartbeat_timeout: 3,
        extra_config: format!(
            "[[health.command]]\nname = \"scratch\"\n\
             command = \"if [ -e {}-$CORRAL_NODE_NAME ]; then echo /scratch is full; exit 1; fi\"\n\
             timeout = 5\n",
            flag.display()
        ),
        ..Opts::default()
    });
    let sick = format!("{}-worker-1", flag.display());
    std::fs::write(&sick, "").expect("make worker-1 sick");
    env.wait_node("worker-1", "drain", true, 10);
    let node = env.ok(&["scontrol", "show", "node", "worker-1"]);
    assert!(
        node.contains("Reason=node_problem: scratch: /scratch is full"),
        "{node}"
    );
    assert!(!node_line(&env, "worker-0").contains("drain"));
    std::fs::remove_file(&sick).expect("well again");
    env.wait_node("worker-1", "drain", false, 10);
}

#[test]
fn a_failing_active_check_drains_the_node_it_ran_on() {
    // The check fails on worker-1 only; it runs on idle nodes, one at a
    // time, as the controller's user.
    let env = Env::start(Opts {
        nodes: 2,
        heartbeat_timeout: 3,
        extra_config: "[[health.active]]\nname = \"burn\"\n\
             script = \"#!/bin/sh\\n[ \\\"$SLURMD_NODENAME\\\" != worker-1 ]\\n\"\n\
             interval = 3600\ntime_limit = \"1:00\"\n"
            .into(),
        ..Opts::default()
    });
    let drained = env.wait_node("worker-1", "drain", true, 20);
    let node = env.ok(&["scontrol", "show", "node", "worker-1"]);
    assert!(
        node.contains("Reason=node_problem: burn: exit code 1"),
        "{node}\n{drained}"
    );
    // worker-0 ran it too (it was due first) and passed.
    let runs = env.ok(&[
        "squeue",
        "-h",
        "-t",
        "all",
        "-n",
        "health:burn",
        "-o",
        "%N %T",
    ]);
    assert!(runs.contains("worker-0 COMPLETED"), "{runs}");
    assert!(!node_line(&env, "worker-0").contains("drain"));
    // The operator looks, and puts it back.
    env.ok(&["scontrol", "update", "NodeName=worker-1", "State=RESUME"]);
    env.wait_node("worker-1", "idle", true, 10);
}
