//! Jobs through the real binaries: batch, srun, steps, GPUs.

use std::collections::HashSet;
use std::time::Duration;

use corral_e2e::{Env, Opts};

#[test]
fn sbatch_shows_in_squeue_completes_and_writes_its_output() {
    let env = Env::start(Opts::default());
    let id = env.sbatch(
        &["-J", "hello", "-o", "out-%j-%x.txt"],
        "#!/bin/sh\n#SBATCH -n 1\necho \"hello from $SLURM_JOB_ID on $SLURMD_NODENAME\"\nsleep 1\n",
    );
    let q = env.ok(&["squeue"]);
    let line = q
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&id.to_string()))
        .unwrap_or_else(|| panic!("job {id} not in squeue:\n{q}"));
    assert!(
        line.contains("hello") && (line.contains(" R ") || line.contains(" PD ")),
        "{line}"
    );
    assert_eq!(
        env.wait_state(id, &["COMPLETED", "FAILED"], 20),
        "COMPLETED"
    );
    let out = env.read(&format!("out-{id}-hello.txt"));
    assert!(
        out.starts_with(&format!("hello from {id} on worker-")),
        "{out:?}"
    );
    // Finished jobs leave the default squeue view.
    assert!(!env.ok(&["squeue", "-h"]).contains(&format!(" {id} ")));
    // --wrap and the default output name.
    let id = env
        .ok(&["sbatch", "--parsable", "--wrap", "echo wrapped"])
        .trim()
        .parse::<u64>()
        .unwrap();
    env.wait_state(id, &["COMPLETED"], 20);
    assert_eq!(env.read(&format!("slurm-{id}.out")), "wrapped\n");
    // A failing script fails with its code.
    let id = env
        .ok(&["sbatch", "--parsable", "--wrap", "exit 7"])
        .trim()
        .parse::<u64>()
        .unwrap();
    env.wait_state(id, &["FAILED"], 20);
    let show = env.ok(&["scontrol", "show", "job", &id.to_string()]);
    assert!(
        show.contains("JobState=FAILED") && show.contains("ExitCode=7:0"),
        "{show}"
    );
}

#[test]
fn srun_labels_four_tasks_on_two_nodes() {
    let env = Env::start(Opts::default());
    let (code, out, err) = env.run(&[
        "srun",
        "-N2",
        "-n4",
        "-l",
        "sh",
        "-c",
        "echo $SLURMD_NODENAME $SLURM_PROCID",
    ]);
    assert_eq!(code, 0, "{err}");
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    assert_eq!(lines.len(), 4, "{out}");
    let nodes: HashSet<&str> = lines
        .iter()
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    assert_eq!(nodes.len(), 2, "{out}");
    for (i, l) in lines.iter().enumerate() {
        let w: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(w[0], format!("{i}:"), "{out}");
        assert_eq!(w[2], i.to_string(), "label and SLURM_PROCID agree: {out}");
    }
    // The highest task exit code is srun's; stdin reaches task 0.
    let (code, _, _) = env.run(&["srun", "-n2", "sh", "-c", "exit $((SLURM_PROCID + 4))"]);
    assert_eq!(code, 5);
    let mut c = env.cmd(&["srun", "cat"]);
    c.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"through stdin\n")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "through stdin\n");
    // srun's input /dev/null and its output a file (as inside a batch
    // job, where srun reads and writes them without tokio's threads):
    // task 0's input ends at once, and every task's output is in the
    // file, labelled.
    let file = env.work.join("srun-to-a-file.out");
    let mut c = env.cmd(&["srun", "-N2", "-n2", "-l", "sh", "-c", "cat; echo end"]);
    c.stdout(std::fs::File::create(&file).unwrap());
    let mut child = c.spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("srun with /dev/null as input did not end: task 0 never saw its input end");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
    let out = std::fs::read_to_string(&file).unwrap();
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    assert_eq!(lines, ["0: end", "1: end"], "{out}");
}

#[test]
fn steps_of_a_two_node_batch_job_see_slurm_variables() {
    let env = Env::start(Opts::default());
    let script = "#!/bin/sh\n#SBATCH -N 2\n#SBATCH --ntasks-per-node=1\n#SBATCH -c 1\n\
        srun -l sh -c 'echo $SLURM_JOB_ID $SLURM_NNODES $SLURM_NTASKS $SLURM_PROCID $SLURM_NODEID $SLURM_LOCALID $SLURM_JOB_NODELIST $SLURMD_NODENAME $SLURM_JOB_PARTITION $SLURM_CPUS_PER_TASK $SLURM_SUBMIT_DIR $SLURM_JOB_NAME'\n";
    let id = env.sbatch(&["-J", "vars"], script);
    env.wait_state(id, &["COMPLETED"], 30);
    let out = env.read(&format!("slurm-{id}.out"));
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    assert_eq!(lines.len(), 2, "{out}");
    let work = env.work.to_string_lossy().into_owned();
    for (i, l) in lines.iter().enumerate() {
        let w: Vec<&str> = l.split_whitespace().collect();
        let want = [
            &format!("{i}:"),
            &id.to_string(),
            "2",
            "2",
            &i.to_string(),
            &i.to_string(),
            "0",
            "worker-[0-1]",
            &format!("worker-{i}"),
            "gpu",
            "1",
            &work,
            "vars",
        ];
        assert_eq!(w, want, "{out}");
    }
}

/// What launchers (torchrun wrappers, MPI, Lightning) compute ranks and
/// per-node counts from, in the batch script and in its step: a job of
/// two nodes with two tasks each, submitted with `-D` elsewhere.
#[test]
fn the_job_and_its_step_describe_their_shape_as_slurm_does() {
    let env = Env::start(Opts::default());
    std::fs::create_dir(env.work.join("run")).expect("dir");
    let script = "#!/bin/sh\n#SBATCH -N 2\n#SBATCH --ntasks-per-node=2\n\
        echo batch $SLURM_TASKS_PER_NODE $SLURM_JOB_CPUS_PER_NODE $SLURM_NTASKS_PER_NODE $SLURM_SUBMIT_DIR $SLURM_SUBMIT_HOST ${SLURM_STEP_ID:-nostep} $(pwd)\n\
        srun -l sh -c 'echo $SLURM_STEP_NODELIST $SLURM_STEP_TASKS_PER_NODE $SLURM_TASKS_PER_NODE $SLURM_GTIDS $SLURM_STEP_ID $SLURM_LAUNCH_NODE_IPADDR'\n";
    let id = env.sbatch(&["-D", "run", "-o", "out"], script);
    env.wait_state(id, &["COMPLETED"], 30);
    let out = std::fs::read_to_string(env.work.join("run/out")).expect("output");
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    let work = env.work.to_string_lossy().into_owned();
    let host = nix::unistd::gethostname().unwrap().into_string().unwrap();
    assert_eq!(
        lines[0], "0: worker-[0-1] 2(x2) 2(x2) 0,1 0 127.0.0.1",
        "{out}"
    );
    assert_eq!(
        lines[1], "1: worker-[0-1] 2(x2) 2(x2) 0,1 0 127.0.0.1",
        "{out}"
    );
    assert_eq!(
        lines[2], "2: worker-[0-1] 2(x2) 2(x2) 2,3 0 127.0.0.1",
        "{out}"
    );
    assert_eq!(
        lines[3], "3: worker-[0-1] 2(x2) 2(x2) 2,3 0 127.0.0.1",
        "{out}"
    );
    let cpus = lines[4]
        .split_whitespace()
        .nth(2)
        .unwrap_or_default()
        .to_string();
    assert_eq!(
        lines[4],
        format!("batch 2(x2) {cpus} 2 {work} {host} nostep {work}/run"),
        "{out}"
    );
    assert!(cpus.ends_with("(x2)"), "{cpus}");
}

#[test]
fn gpu_jobs_get_distinct_gpus() {
    let env = Env::start(Opts::default());
    // Four 2-GPU jobs fill 2 nodes × 4 GPUs; all run at once.
    let ids: Vec<u64> = (0..4)
        .map(|_| {
            env.sbatch(
                &["--gres=gpu:2"],
                "#!/bin/sh\necho $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES\nsleep 2\n",
            )
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let running = env.ok(&["squeue", "-h", "-t", "R", "-o", "%i"]);
    assert_eq!(
        running.lines().count(),
        4,
        "all four run together:\n{running}"
    );
    let mut seen = HashSet::new();
    for id in ids {
        env.wait_state(id, &["COMPLETED"], 30);
        let out = env.read(&format!("slurm-{id}.out"));
        let (node, gpus) = out
            .trim()
            .split_once(' ')
            .unwrap_or_else(|| panic!("{out:?}"));
        let gpus: Vec<&str> = gpus.split(',').collect();
        assert_eq!(gpus.len(), 2, "{out}");
        for g in gpus {
            assert!(
                seen.insert(format!("{node}/{g}")),
                "GPU {node}/{g} given twice"
            );
        }
    }
    assert_eq!(seen.len(), 8);
    // --gpus-per-task: each task its own GPU.
    let out = env.ok(&[
        "srun",
        "-n2",
        "-N1",
        "--gpus-per-task=1",
        "-l",
        "sh",
        "-c",
        "echo $CUDA_VISIBLE_DEVICES",
    ]);
    let gpus: HashSet<&str> = out
        .lines()
        .map(|l| l.split_whitespace().nth(1).unwrap_or(""))
        .collect();
    assert_eq!(gpus.len(), 2, "{out}");
    assert!(
        !gpus.contains("") && gpus.iter().all(|g| !g.contains(',')),
        "{out}"
    );
}

#[test]
fn bad_input_gets_one_line_errors() {
    let env = Env::start(Opts {
        nodes: 1,
        ..Opts::default()
    });
    for (args, want) in [
        (
            vec!["sbatch", "--bogus", "--wrap", "true"],
            "sbatch: error: unexpected argument '--bogus'",
        ),
        (
            vec!["sbatch", "-p", "nope", "--wrap", "true"],
            "sbatch: error: Batch job submission failed: Invalid partition name specified",
        ),
        (
            vec!["sbatch", "--gres=gpu:99", "--wrap", "true"],
            "sbatch: error: Batch job submission failed:",
        ),
        (
            vec!["sbatch", "-t", "soon", "--wrap", "true"],
            "sbatch: error: invalid time limit",
        ),
        (
            vec!["squeue", "-j", "999999"],
            "slurm_load_jobs error: Invalid job id specified",
        ),
        (
            vec!["scontrol", "show", "job", "424242"],
            "slurm_load_jobs error: Invalid job id specified",
        ),
        (
            vec!["squeue", "-t", "sideways"],
            "squeue: error: Invalid job state specified",
        ),
    ] {
        let (code, _, err) = env.run(&args);
        assert_ne!(code, 0, "{args:?}");
        assert!(err.starts_with(want), "{args:?}: {err:?}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err:?}");
    }
    let script = env.work.join("noshebang.sh");
    std::fs::write(&script, "echo hi\n").unwrap();
    let (code, _, err) = env.run(&["sbatch", script.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("The first line must start with #!"), "{err}");
}

#[test]
fn sinfo_and_scontrol_views() {
    let env = Env::start(Opts::default());
    let s = env.ok(&["sinfo"]);
    assert_eq!(
        s,
        "PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST\ngpu*         up   infinite      2   idle worker-[0-1]\n"
    );
    env.ok(&[
        "scontrol",
        "update",
        "NodeName=worker-1",
        "State=DRAIN",
        "Reason=fan failure",
    ]);
    let r = env.ok(&["sinfo", "-R", "-h"]);
    assert!(
        r.starts_with("fan failure") && r.trim_end().ends_with("worker-1"),
        "{r}"
    );
    let n = env.ok(&["scontrol", "show", "node", "worker-1"]);
    assert!(
        n.contains("NodeName=worker-1")
            && n.contains("State=IDLE+DRAIN ")
            && n.contains("Reason=fan failure"),
        "{n}"
    );
    // A drained node gets no new work.
    let id = env.sbatch(&["-w", "worker-1"], "#!/bin/sh\ntrue\n");
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(env.state(id), "PENDING");
    env.ok(&["scontrol", "update", "NodeName=worker-1", "State=RESUME"]);
    env.wait_state(id, &["COMPLETED"], 20);
    assert_eq!(
        env.ok(&["scontrol", "show", "hostnames", "w-[1-2],x"]),
        "w-1\nw-2\nx\n"
    );
    assert_eq!(
        env.ok(&["scontrol", "show", "hostlist", "w-1,w-2,w-3"]),
        "w-[1-3]\n"
    );
    // Expressions too, in the order given or sorted, or a file of names.
    assert_eq!(
        env.ok(&["scontrol", "show", "hostlist", "n[3-4],n[1-2] m1"]),
        "n[3-4,1-2],m1\n"
    );
    assert_eq!(
        env.ok(&["scontrol", "show", "hostlistsorted", "n[3-4],n[1-2] m1"]),
        "m1,n[1-4]\n"
    );
    let file = env.work.join("hosts.txt");
    std::fs::write(&file, "n3,n1\nn2\n").unwrap();
    let file = file.to_str().unwrap();
    assert_eq!(
        env.ok(&["scontrol", "show", "hostlist", file]),
        "n[3,1-2]\n"
    );
    let (code, out, err) = env.run(&["scontrol", "show", "hostlist", "n[3-1]"]);
    assert!(
        code == 1 && out.is_empty() && err.trim().lines().count() == 1,
        "{code} {out} {err}"
    );
    let p = env.ok(&["scontrol", "show", "partition"]);
    assert!(
        p.starts_with("PartitionName=gpu") && p.contains("Nodes=worker-[0-1]"),
        "{p}"
    );
    // Hold and release.
    let id = env
        .ok(&["sbatch", "--parsable", "-H", "--wrap", "true"])
        .trim()
        .to_string();
    std::thread::sleep(Duration::from_millis(300));
    let q = env.ok(&["squeue", "-h", "-j", &id]);
    assert!(
        q.contains("(JobHeldUser)") || q.contains("(JobHeldAdmin)"),
        "{q}"
    );
    env.ok(&["scontrol", "release", &id]);
    env.wait_state(id.parse().unwrap(), &["COMPLETED"], 20);
}

#[test]
fn ctrl_c_reaches_the_tasks_and_a_second_cancels() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let env = Env::start(Opts {
        nodes: 1,
        ..Opts::default()
    });
    let wait_running = |n: usize| {
        for _ in 0..200 {
            if env.ok(&["squeue", "-h", "-t", "R"]).lines().count() >= n {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("srun's job never ran");
    };
    let mut c = env.cmd(&[
        "srun",
        "sh",
        "-c",
        "trap 'echo got INT; exit 7' INT; sleep 30 & wait",
    ]);
    c.stdout(std::process::Stdio::piped());
    let child = c.spawn().unwrap();
    wait_running(1);
    std::thread::sleep(Duration::from_millis(300));
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "got INT\n");
    assert_eq!(o.status.code(), Some(7));

    let mut c = env.cmd(&[
        "srun",
        "-J",
        "stubborn",
        "sh",
        "-c",
        "trap '' INT; sleep 30",
    ]);
    c.stderr(std::process::Stdio::piped());
    let child = c.spawn().unwrap();
    wait_running(1);
    std::thread::sleep(Duration::from_millis(300));
    let pid = Pid::from_raw(child.id() as i32);
    kill(pid, Signal::SIGINT).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    kill(pid, Signal::SIGINT).unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let id = env.ok(&["squeue", "-h", "-t", "all", "-n", "stubborn", "-o", "%i"]);
    assert_eq!(
        env.wait_state(id.trim().parse().unwrap(), &["CANCELLED"], 20),
        "CANCELLED"
    );
}

#[test]
fn dependencies_and_begin_times_hold_jobs_back() {
    let env = Env::start(Opts {
        nodes: 1,
        ..Opts::default()
    });
    let reason = |id: u64| {
        env.ok(&["squeue", "-h", "-j", &id.to_string(), "-o", "%r"])
            .trim()
            .to_string()
    };
    let a = env.sbatch(&[], "#!/bin/sh\nsleep 1\n");
    let b = env.sbatch(&["-d", &format!("afterok:{a}")], "#!/bin/sh\ntrue\n");
    let c = env.sbatch(
        &["--dependency", &format!("afternotok:{a}")],
        "#!/bin/sh\ntrue\n",
    );
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(reason(b), "Dependency");
    env.wait_state(a, &["COMPLETED"], 20);
    env.wait_state(b, &["COMPLETED"], 20);
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(reason(c), "DependencyNeverSatisfied");
    env.ok(&["scancel", &c.to_string()]);
    let d = env.sbatch(&["--begin", "now+2"], "#!/bin/sh\ntrue\n");
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(reason(d), "BeginTime");
    env.wait_state(d, &["COMPLETED"], 20);
}

/// `salloc`: an allocation whose command runs here, with `srun` inside it
/// running steps on the allocation's nodes; the command's exit is the
/// allocation's; the seed system's own line works.
#[test]
fn salloc_runs_its_command_here_and_srun_inside_uses_the_allocation() {
    let env = Env::start(Opts::default());
    let (code, out, err) = env.run(&[
        "salloc",
        "-N2",
        "srun",
        "-l",
        "sh",
        "-c",
        "echo $SLURMD_NODENAME $SLURM_JOB_NUM_NODES",
    ]);
    assert_eq!(code, 0, "{err}");
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    assert_eq!(lines, ["0: worker-0 2", "1: worker-1 2"], "{err}");
    let id: u64 = err
        .lines()
        .find_map(|l| l.strip_prefix("salloc: Granted job allocation "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        err.contains(&format!("salloc: Relinquishing job allocation {id}")),
        "{err}"
    );
    assert_eq!(
        env.wait_state(id, &["COMPLETED", "FAILED"], 20),
        "COMPLETED"
    );
    // The seed system's verification line, with a command for its shell.
    let (code, out, err) = env.run(&[
        "salloc",
        "--nodes=1",
        "--ntasks=1",
        "--mem=1G",
        "--time=00:20:00",
        "--gres=gpu:1",
        "sh",
        "-c",
        "echo $SLURM_NNODES $SLURM_NTASKS; srun sh -c 'echo gpus=$CUDA_VISIBLE_DEVICES'; exit 7",
    ]);
    assert_eq!(code, 7, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "1 1", "{out}");
    assert!(
        lines[1].starts_with("gpus=") && lines[1].len() == "gpus=0".len(),
        "one GPU: {out}"
    );
    let id = err
        .lines()
        .find_map(|l| l.strip_prefix("salloc: Granted job allocation "))
        .unwrap_or_else(|| panic!("{err}"))
        .trim()
        .parse()
        .expect("id");
    assert_eq!(env.wait_state(id, &["COMPLETED", "FAILED"], 20), "FAILED");
    let shown = env.ok(&["scontrol", "show", "job", &id.to_string()]);
    assert!(shown.contains("ExitCode=7:0"), "{shown}");
}

/// srun options training scripts use: `-u`, `--cpu-bind`, `--mpi` are
/// accepted; `-K` ends the step at a task's bad exit; `--jobid` runs a
/// step in a running job of one's own (a shell on one's job's node).
#[test]
fn srun_takes_the_options_training_scripts_use() {
    let env = Env::start(Opts::default());
    let out = env.ok(&[
        "srun",
        "-u",
        "--cpu-bind=cores",
        "--mpi=none",
        "-n2",
        "-l",
        "sh",
        "-c",
        "echo $SLURM_PROCID",
    ]);
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    assert_eq!(lines, ["0: 0", "1: 1"]);
    let (code, _, err) = env.run(&["srun", "--mpi=openmpi", "true"]);
    assert_eq!(code, 1);
    assert!(err.starts_with("srun: error: "), "{err}");
    let t0 = std::time::Instant::now();
    let (code, _, err) = env.run(&[
        "srun",
        "-n2",
        "-K",
        "sh",
        "-c",
        "if [ $SLURM_PROCID = 1 ]; then exit 3; fi; exec sleep 60",
    ]);
    // As Slurm 22.05's: the other task gets SIGTERM, which ends it, and
    // srun's exit is the worst (143), the task said "Terminated".
    assert_eq!(code, 143, "{err}");
    assert!(err.contains("--kill-on-bad-exit"), "{err}");
    assert!(err.contains("task 0: Terminated"), "{err}");
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(30),
        "not waited for the sleep"
    );
    // Its TERM trap runs...
    let (code, out, err) = env.run(&[
        "srun",
        "-n2",
        "-K",
        "sh",
        "-c",
        "if [ $SLURM_PROCID = 1 ]; then sleep 0.5; exit 3; fi; \
         trap 'echo trapped; exit 7' TERM; sleep 60 & wait",
    ]);
    assert_eq!((code, out.as_str()), (7, "trapped\n"), "{err}");
    // ...and a task that ignores it is killed KillWait (1 s here) later.
    let t0 = std::time::Instant::now();
    let (code, _, err) = env.run(&[
        "srun",
        "-n2",
        "-K",
        "sh",
        "-c",
        "if [ $SLURM_PROCID = 1 ]; then sleep 0.5; exit 3; fi; \
         trap '' TERM; while :; do sleep 0.1; done",
    ]);
    assert_eq!(code, 137, "{err}");
    assert!(err.contains("task 0: Killed"), "{err}");
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(20),
        "killed, not left to run"
    );
    let job = env.sbatch(&["-o", "/dev/null"], "#!/bin/sh\nsleep 60\n");
    env.wait_state(job, &["RUNNING"], 20);
    let out = env.ok(&[
        "srun",
        &format!("--jobid={job}"),
        "sh",
        "-c",
        "echo in $SLURM_JOB_ID",
    ]);
    assert_eq!(out, format!("in {job}\n"));
    env.ok(&["scancel", &job.to_string()]);
}

/// `-d` with `?` (any of) and `--kill-on-invalid-dep`.
#[test]
fn dependencies_any_of_and_kill_on_invalid_dep() {
    let env = Env::start(Opts::default());
    let fails = env.sbatch(&["-o", "/dev/null"], "#!/bin/sh\nexit 1\n");
    let dep = |d: String, extra: &[&str]| {
        let mut args = vec!["-o", "/dev/null", "-d", &d];
        args.extend_from_slice(extra);
        env.sbatch(&args, "#!/bin/sh\ntrue\n")
    };
    let either = dep(format!("afterok:{fails}?afternotok:{fails}"), &[]);
    let killed = dep(format!("afterok:{fails}"), &["--kill-on-invalid-dep=yes"]);
    let stuck = dep(format!("afterok:{fails}"), &["--kill-on-invalid-dep=no"]);
    assert_eq!(
        env.wait_state(either, &["COMPLETED", "FAILED"], 30),
        "COMPLETED"
    );
    assert_eq!(env.wait_state(killed, &["CANCELLED"], 30), "CANCELLED");
    let reason = env.ok(&["squeue", "-h", "-j", &stuck.to_string(), "-o", "%T %r"]);
    assert_eq!(reason.trim(), "PENDING DependencyNeverSatisfied");
    let (code, _, err) = env.run(&["sbatch", "--kill-on-invalid-dep=maybe", "--wrap", "true"]);
    assert_eq!(code, 1);
    assert!(err.contains("--kill-on-invalid-dep"), "{err}");
    let (code, _, err) = env.run(&[
        "sbatch",
        "-d",
        "afterok:1?afterok:2,afterok:3",
        "--wrap",
        "true",
    ]);
    assert_eq!(code, 1);
    assert!(err.contains("do not mix"), "{err}");
    env.ok(&["scancel", &stuck.to_string()]);
}

/// Scripts are bytes: one written in Latin-1 (not UTF-8) runs as written,
/// its `#SBATCH` lines still read.
#[test]
fn a_script_that_is_not_utf8_runs_as_written() {
    let env = Env::start(Opts::default());
    let script: &[u8] = b"#!/bin/sh\n#SBATCH -J caf\xe9-ignored\n#SBATCH -o latin1.out\n# d\xe9j\xe0 vu\necho '\xe9t\xe9'\n";
    std::fs::write(env.work.join("latin1.sh"), script).expect("script");
    let out = env.ok(&["sbatch", "--parsable", "-J", "latin1", "latin1.sh"]);
    let id: u64 = out.trim().parse().expect("id");
    assert_eq!(
        env.wait_state(id, &["COMPLETED", "FAILED"], 30),
        "COMPLETED"
    );
    let got = std::fs::read(env.work.join("latin1.out")).expect("output");
    assert_eq!(got, b"\xe9t\xe9\n");
}

/// The "one srun per GPU" fan-out: inside a 2-GPU job, two concurrent
/// `srun --gres=gpu:1` steps each see one GPU, not the same one; a step
/// that asks for none sees the job's two.
#[test]
fn one_gpu_steps_in_a_two_gpu_job_see_one_gpu_each() {
    let env = Env::start(Opts::default());
    // Three one-GPU steps at once: two run, the third waits for a GPU
    // (as Slurm's srun, saying so), while one that overlaps runs at once.
    // `--exact`: each holds one of the job's four CPUs, not all of them
    // (as Slurm 22.05's steps, which otherwise run one after another).
    let script = "#!/bin/sh\n#SBATCH --gres=gpu:2\n#SBATCH -c 4\n#SBATCH -o fan.out\n\
        srun --exact --gres=gpu:1 sh -c 'echo one=$CUDA_VISIBLE_DEVICES; sleep 2' &\n\
        srun --exact --gres=gpu:1 sh -c 'echo one=$CUDA_VISIBLE_DEVICES; sleep 2' &\n\
        sleep 1\n\
        srun --exact --gres=gpu:1 sh -c 'echo three=$CUDA_VISIBLE_DEVICES' &\n\
        srun --overlap --gres=gpu:1 sh -c 'echo overlap=$CUDA_VISIBLE_DEVICES' &\n\
        wait\n\
        srun sh -c 'echo all=$CUDA_VISIBLE_DEVICES'\n";
    let id = env.sbatch(&[], script);
    assert_eq!(
        env.wait_state(id, &["COMPLETED", "FAILED"], 40),
        "COMPLETED"
    );
    let out = env.read("fan.out");
    let mut ones: Vec<&str> = out.lines().filter_map(|l| l.strip_prefix("one=")).collect();
    ones.sort();
    assert_eq!(ones.len(), 2, "{out}");
    assert!(
        ones.iter().all(|g| !g.contains(',') && !g.is_empty()),
        "{out}"
    );
    assert_ne!(ones[0], ones[1], "{out}");
    let all = out
        .lines()
        .find_map(|l| l.strip_prefix("all="))
        .unwrap_or_default();
    let mut all: Vec<&str> = all.split(',').collect();
    all.sort();
    assert_eq!(all, ones, "{out}");
    assert!(
        out.contains(&format!(
            "srun: Job {id} step creation temporarily disabled, retrying (Requested GPUs are busy"
        )),
        "{out}"
    );
    for which in ["three=", "overlap="] {
        let g = out.lines().find_map(|l| l.strip_prefix(which));
        assert!(g.is_some_and(|g| ones.contains(&g)), "{which} {out}");
    }
    // The waiting step started after the overlapping one printed.
    let at = |p: &str| out.find(p).unwrap_or(usize::MAX);
    assert!(at("overlap=") < at("three="), "{out}");
}

/// A job array through the real commands: each task a job of its own
/// with its index in `SLURM_ARRAY_*` and its own `slurm-%A_%a.out`, `%N`
/// running two at a time, squeue folding what waits and `-r` listing it,
/// a waiting task cancelled by `123_12`, and dependencies on one task and
/// on the whole array.
#[test]
fn an_array_runs_each_task_as_a_job_with_its_index() {
    let env = Env::start(Opts::default());
    let a = env.sbatch(
        &["-a", "0-12:4%2", "-J", "sweep"],
        "#!/bin/sh\necho \"$SLURM_ARRAY_JOB_ID $SLURM_ARRAY_TASK_ID $SLURM_ARRAY_TASK_COUNT \
         $SLURM_ARRAY_TASK_MIN $SLURM_ARRAY_TASK_MAX $SLURM_ARRAY_TASK_STEP $SLURM_JOB_ID\"\nsleep 3\n",
    );
    let dep = |d: String| env.sbatch(&["-o", "/dev/null", "-d", &d], "#!/bin/sh\ntrue\n");
    let on_first = dep(format!("afterok:{a}_0"));
    let on_all_ok = dep(format!("afterok:{a}"));
    let on_all_any = dep(format!("afterany:{a}"));
    // Two run; the other two wait as one line, or one each with -r.
    let id = a.to_string();
    let t0 = std::time::Instant::now();
    let q = loop {
        let q = env.ok(&["squeue", "-h", "-j", &id, "-o", "%i %T"]);
        if q.matches("RUNNING").count() == 2 {
            break q;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "{q}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(q.contains(&format!("{a}_0 RUNNING")), "{q}");
    assert!(q.contains(&format!("{a}_4 RUNNING")), "{q}");
    assert!(q.contains(&format!("{a}_[8,12%2] PENDING")), "{q}");
    let r = env.ok(&["squeue", "-h", "-r", "-j", &id, "-o", "%i"]);
    let lines: HashSet<&str> = r.lines().collect();
    let want = [0, 4, 8, 12].map(|t| format!("{a}_{t}"));
    assert_eq!(lines, want.iter().map(String::as_str).collect(), "{r}");
    // The waiting task 12 is cancelled alone.
    env.ok(&["scancel", &format!("{a}_12")]);
    let r = env.ok(&["squeue", "-h", "-r", "-j", &id, "-o", "%i"]);
    assert!(!r.contains(&format!("{a}_12")), "{r}");
    let (code, _, err) = env.run(&["scancel", &format!("{a}_13")]);
    assert_eq!(code, 1);
    assert!(err.contains("Invalid job id specified"), "{err}");

    assert_eq!(
        env.wait_state(on_all_any, &["COMPLETED", "FAILED"], 40),
        "COMPLETED"
    );
    assert_eq!(env.state(on_first), "COMPLETED");
    let reason = env.ok(&["squeue", "-h", "-j", &on_all_ok.to_string(), "-o", "%T %r"]);
    assert_eq!(reason.trim(), "PENDING DependencyNeverSatisfied");
    for (pos, t) in [0u64, 4, 8].into_iter().enumerate() {
        let out = env.read(&format!("slurm-{a}_{t}.out"));
        let job = a + 1 + pos as u64;
        assert_eq!(out, format!("{a} {t} 4 0 12 4 {job}\n"), "task {t}");
    }
    assert!(env.read(&format!("slurm-{a}_12.out")).is_empty());
    let show = env.ok(&["scontrol", "show", "job", &(a + 1).to_string()]);
    assert!(
        show.starts_with(&format!(
            "JobId={} ArrayJobId={a} ArrayTaskId=0 JobName=sweep",
            a + 1
        )),
        "{show}"
    );
    env.ok(&["scancel", &on_all_ok.to_string()]);
    // An index over the cluster's limit is refused in one line.
    let (code, _, err) = env.run(&["sbatch", "-a", "0-200000", "--wrap", "true"]);
    assert_eq!(code, 1);
    assert!(err.contains("MaxArraySize"), "{err}");
}

/// `sbatch --test-only`: one line on standard error saying when, where
/// and in which partition; nothing is queued.
#[test]
fn test_only_says_where_the_job_would_start() {
    let env = Env::start(Opts::default());
    let (code, out, err) = env.run(&["sbatch", "--test-only", "-n", "2", "--wrap", "true"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.is_empty(), "{out}");
    let line = err.trim();
    assert!(
        line.starts_with("sbatch: Job ")
            && line.contains(" to start at 20")
            && line.contains(" using 2 processors on nodes worker-")
            && line.ends_with(" in partition gpu"),
        "{line}"
    );
    assert!(env.ok(&["squeue", "-h", "-t", "all"]).is_empty());
    let (code, _, err) = env.run(&["sbatch", "--test-only", "-H", "--wrap", "true"]);
    assert_eq!(code, 1);
    assert_eq!(
        err.trim(),
        "sbatch: error: Job would not start: JobHeldUser"
    );
}

/// GPUs by model: nodes say which (`Gres=gpu:nvidia_h200:4`, as Slurm's
/// NVML detection names them); `--gres=gpu:h200:1` runs, by the detected
/// name or without its vendor, and a model no node has is refused.
#[test]
fn gpus_are_asked_for_by_model() {
    let env = Env::start(Opts {
        gpu_model: Some("nvidia_h200".into()),
        ..Opts::default()
    });
    let show = env.ok(&["scontrol", "show", "node", "worker-0"]);
    assert!(show.contains("Gres=gpu:nvidia_h200:4"), "{show}");
    for gres in ["gpu:h200:1", "gpu:nvidia_h200:2"] {
        let id = env.sbatch(
            &["--gres", gres, "-o", "typed-%j.out"],
            "#!/bin/sh\necho $CUDA_VISIBLE_DEVICES\n",
        );
        assert_eq!(
            env.wait_state(id, &["COMPLETED", "FAILED"], 30),
            "COMPLETED"
        );
        let seen = env.read(&format!("typed-{id}.out"));
        let n = gres.rsplit(':').next().unwrap().parse::<usize>().unwrap();
        assert_eq!(seen.trim().split(',').count(), n, "{seen}");
    }
    let (code, _, err) = env.run(&["sbatch", "--gres=gpu:a100:1", "--wrap", "true"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("Requested node configuration is not available")
            && err.contains("GPUs of type a100"),
        "{err}"
    );
}

/// `srun -o/-e/-i`: each task's files on its node, named by pattern;
/// tasks sharing one file all land in it; input read from a file.
#[test]
fn srun_writes_and_reads_each_tasks_files() {
    let env = Env::start(Opts::default());
    let out = env.ok(&[
        "srun",
        "-N2",
        "-n4",
        "-o",
        "rank-%t-of-%j.%s-on-%N-%n.txt",
        "sh",
        "-c",
        "echo $SLURM_PROCID; echo err >&2",
    ]);
    assert!(out.is_empty(), "{out}");
    let names: Vec<String> = std::fs::read_dir(&env.work)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("rank-"))
        .collect();
    assert_eq!(names.len(), 4, "{names:?}");
    // Each node of the step has one index (%n) for its name (%N).
    let mut index_of = std::collections::HashMap::new();
    for t in 0..4 {
        let name = names
            .iter()
            .find(|n| n.starts_with(&format!("rank-{t}-of-")))
            .unwrap_or_else(|| panic!("task {t}: {names:?}"));
        let (_, on) = name.split_once(".0-on-").expect("step 0, then the node");
        let (node, index) = on.trim_end_matches(".txt").rsplit_once('-').unwrap();
        assert_eq!(
            *index_of
                .entry(node.to_string())
                .or_insert(index.to_string()),
            index
        );
        assert_eq!(env.read(name), format!("{t}\nerr\n"), "{name}");
    }
    let mut indices: Vec<&String> = index_of.values().collect();
    indices.sort();
    assert_eq!(indices, ["0", "1"], "{names:?}");
    // One file for three tasks: all three lines, none lost.
    env.ok(&[
        "srun",
        "-n3",
        "-e",
        "/dev/null",
        "-o",
        "shared.txt",
        "echo",
        "hi",
    ]);
    assert_eq!(env.read("shared.txt"), "hi\nhi\nhi\n");
    // One file named for the user and the step, for tasks on two nodes
    // and both their streams: srun writes it, so no node truncates
    // another's lines.
    env.ok(&[
        "srun",
        "-N2",
        "-n4",
        "-o",
        "both-%u-%j.%s.txt",
        "sh",
        "-c",
        "echo out; echo err >&2",
    ]);
    let both = std::fs::read_dir(&env.work)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("both-") && n.ends_with(".0.txt"))
        .expect("named with the job and step");
    let me = nix::unistd::User::from_uid(nix::unistd::getuid())
        .unwrap()
        .expect("the tests' user has a name")
        .name;
    assert!(both.starts_with(&format!("both-{me}-")), "{both}");
    let text = env.read(&both);
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        ["err"; 4].into_iter().chain(["out"; 4]).collect::<Vec<_>>()
    );
    std::fs::write(env.work.join("in-0.txt"), "zero\n").unwrap();
    std::fs::write(env.work.join("in-1.txt"), "one\n").unwrap();
    let out = env.ok(&["srun", "-n2", "-l", "-i", "in-%t.txt", "cat"]);
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    assert_eq!(lines, ["0: zero", "1: one"]);
    let (code, _, err) = env.run(&["srun", "-i", "missing-%t.txt", "cat"]);
    assert_ne!(code, 0);
    assert!(err.contains("missing-0.txt"), "{err}");
}

/// `srun --pty sh`: an interactive shell on a terminal of its own, whose
/// size is srun's terminal's, where Ctrl-C interrupts the shell's command
/// (not srun), and whose exit code is srun's.
#[test]
fn srun_pty_gives_an_interactive_shell_its_terminal() {
    use std::io::{Read, Write};
    use std::process::Stdio;
    use std::sync::{Arc, Mutex};
    let env = Env::start(Opts::default());
    let size = nix::pty::Winsize {
        ws_row: 33,
        ws_col: 101,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = nix::pty::openpty(Some(&size), None).expect("a terminal for srun");
    let end = || Stdio::from(pty.slave.try_clone().expect("slave"));
    let mut child = env
        .cmd(&["srun", "--pty", "sh"])
        .stdin(end())
        .stdout(end())
        .stderr(end())
        .spawn()
        .expect("srun");
    drop(pty.slave);
    let mut master = std::fs::File::from(pty.master);
    let seen = Arc::new(Mutex::new(Vec::<u8>::new()));
    let reader = {
        let seen = seen.clone();
        let mut r = master.try_clone().expect("master");
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = r.read(&mut buf) {
                if n == 0 {
                    break;
                }
                seen.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        })
    };
    let wait_for = |what: &str, secs: u64| {
        let t0 = std::time::Instant::now();
        loop {
            let text = String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
            if text.contains(what) {
                return text;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(secs),
                "{what:?} not seen in {secs}s:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    master
        .write_all(b"stty size; tty; echo answer=$((6*7))\n")
        .unwrap();
    let text = wait_for("answer=42", 30);
    assert!(text.contains("33 101"), "{text}");
    assert!(text.contains("/dev/pts/"), "{text}");
    let t0 = std::time::Instant::now();
    master.write_all(b"sleep 30\n").unwrap();
    std::thread::sleep(Duration::from_millis(700));
    master.write_all(b"\x03").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    master.write_all(b"echo still=$((1+1))\n").unwrap();
    wait_for("still=2", 15);
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "Ctrl-C did not stop the sleep"
    );
    master.write_all(b"exit 3\n").unwrap();
    let status = child.wait().expect("srun ends");
    assert_eq!(status.code(), Some(3));
    drop(master);
    let _ = reader.join();
}

/// What Slurm passes of the submitter and the cluster: the file mode
/// mask (which tasks start with: a file they make has it), the nice
/// value, `-m`'s distribution, and where the controller is.
#[test]
fn tasks_start_with_the_submitters_umask_and_see_the_cluster() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::start(Opts::default());
    let corral = corral_e2e::bin_dir().join("corral");
    let task = "umask; echo $SLURM_UMASK $SLURM_PRIO_PROCESS $SLURM_DISTRIBUTION; \
                echo $SLURM_WORKING_CLUSTER; touch made";
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "umask 027; exec nice -n 3 {} srun -m cyclic sh -c '{task}'",
            corral.display()
        ))
        .envs(env.env())
        .current_dir(&env.work)
        .output()
        .expect("srun");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "0027", "{text}");
    let nice: i32 = lines[1].split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(nice >= 3, "{text}");
    assert!(
        lines[1].starts_with("0027 ") && lines[1].ends_with(" cyclic"),
        "{text}"
    );
    let controller = lines[2];
    assert!(
        controller.starts_with("corral-up:127.0.0.1:") && controller.ends_with(":9728:109"),
        "{text}"
    );
    let mode = std::fs::metadata(env.work.join("made"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o640, "made with the submitter's mask");
    let (code, _, err) = env.run(&["srun", "-m", "sideways", "true"]);
    assert_eq!(code, 1);
    assert!(err.contains("Invalid --distribution"), "{err}");
}

/// A salloc killed outright (SIGKILL: no chance to give its allocation
/// back) stops saying it is alive, and its allocation ends within the
/// cluster's `allocation_timeout`; one alive past that keeps its own.
#[test]
fn a_killed_sallocs_allocation_ends_and_a_live_one_stays() {
    let env = Env::start(Opts {
        extra_config: "allocation_timeout = 15\n".into(),
        ..Opts::default()
    });
    let start = |secs: u32| {
        env.cmd(&["salloc", "-N1", "sleep", &secs.to_string()])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("salloc")
    };
    // Its allocation's id, from what it says; the rest of what it says
    // is read on (a closed pipe would end it).
    let granted = |child: &mut std::process::Child| -> u64 {
        use std::io::BufRead;
        let err = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                if let Some(id) = line.strip_prefix("salloc: Granted job allocation ") {
                    let _ = tx.send(id.trim().parse::<u64>().expect("id"));
                }
            }
        });
        rx.recv_timeout(Duration::from_secs(30))
            .expect("an allocation")
    };
    let mut killed = start(300);
    let mut live = start(25);
    let (k, l) = (granted(&mut killed), granted(&mut live));
    killed.kill().expect("SIGKILL");
    let _ = killed.wait();
    let t0 = std::time::Instant::now();
    assert_eq!(env.wait_state(k, &["CANCELLED"], 40), "CANCELLED");
    assert!(t0.elapsed() >= Duration::from_secs(10), "ended too soon");
    assert_eq!(env.state(l), "RUNNING", "alive past the timeout");
    assert!(live.wait().expect("salloc").success());
    assert_eq!(env.wait_state(l, &["COMPLETED"], 20), "COMPLETED");
}

/// A pipeline as people write it: preprocess, then a training array that
/// waits for it (`afterok`), then an evaluation that waits for the whole
/// array (`afterok` on the array's id); each step reads what the one
/// before wrote.
#[test]
fn a_preprocess_train_array_evaluate_pipeline_runs_in_order() {
    let env = Env::start(Opts::default());
    let pre = env.sbatch(
        &["-o", "/dev/null"],
        "#!/bin/sh\nsleep 1; echo data > prepared.txt\n",
    );
    let train = env.sbatch(
        &[
            "-a",
            "0-3%2",
            "-o",
            "/dev/null",
            "-d",
            &format!("afterok:{pre}"),
        ],
        "#!/bin/sh\ntest -s prepared.txt || exit 9\n\
         echo model-$SLURM_ARRAY_TASK_ID > model-$SLURM_ARRAY_TASK_ID.txt\n",
    );
    let eval = env.sbatch(
        &["-o", "eval.out", "-d", &format!("afterok:{train}")],
        "#!/bin/sh\ncat model-0.txt model-1.txt model-2.txt model-3.txt\n",
    );
    assert_eq!(
        env.wait_state(eval, &["COMPLETED", "FAILED", "CANCELLED"], 60),
        "COMPLETED"
    );
    assert_eq!(env.read("eval.out"), "model-0\nmodel-1\nmodel-2\nmodel-3\n");
    let states = env.ok(&[
        "sacct",
        "-n",
        "-X",
        "-P",
        "-j",
        &train.to_string(),
        "-o",
        "JobID,State",
    ]);
    let mut lines: Vec<&str> = states.lines().collect();
    lines.sort();
    let want: Vec<String> = (0..4).map(|t| format!("{train}_{t}|COMPLETED")).collect();
    assert_eq!(lines, want, "{states}");
}
