//! corral-ctld killed with SIGKILL and started again: every job it
//! acknowledged is back with its id, pending jobs run, running jobs keep
//! running on their nodes (adopted, not rerun) and finish with their own
//! exit codes, and job ids never repeat.

use std::time::Duration;

use corral_e2e::{Env, Opts, Unmount};
use nix::sys::signal::Signal;

/// The daemons' logs, for a failure's message.
fn logs(env: &Env) -> String {
    ["ctld", "worker-0", "worker-1"]
        .iter()
        .map(|n| {
            let log = std::fs::read_to_string(env.cluster.spec.dir.join(format!("log/{n}.log")));
            format!("==== {n}\n{}", log.unwrap_or_default())
        })
        .collect()
}

#[test]
fn a_killed_controller_comes_back_with_every_job_and_keeps_the_running_ones() {
    let mut env = Env::start(Opts {
        nodes: 2,
        heartbeat_timeout: 5,
        ..Opts::default()
    });
    // A two-node job that runs across the restart and ends with its own
    // code, a job that only starts after it, and a held one.
    let marker = env.work.join("runs");
    let steps = env.work.join("steps");
    let long = env.sbatch(
        &["-N2", "-o", "long.out"],
        &format!(
            "#!/bin/sh\nwhile [ ! -e go ]; do sleep 0.01; done\necho started >> {}\nsrun -l sh -c 'echo $SLURM_NODEID >> {}; sleep 4; echo $SLURM_NODEID'\nexit 3\n",
            marker.display(),
            steps.display()
        ),
    );
    env.wait_state(long, &["RUNNING"], 10);
    let queued = env.sbatch(
        &["-N2", "--exclusive", "-o", "/dev/null"],
        "#!/bin/sh\ntrue\n",
    );
    let held = env.sbatch(&["-H", "-o", "/dev/null"], "#!/bin/sh\ntrue\n");
    assert_eq!(env.state(queued), "PENDING");
    // The controller dies as the script starts its step: the step's
    // submission, its answer or its launches may be on their way. Each
    // must arrive once: stored steps are launched again to nodes that did
    // not get them, and srun's repeated ask is the same step.
    std::fs::write(env.work.join("go"), "").expect("go");
    let t0 = std::time::Instant::now();
    while !marker.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the script did not start"
        );
        std::thread::sleep(Duration::from_millis(5));
    }

    env.cluster.kill_ctld(Signal::SIGKILL);
    std::thread::sleep(Duration::from_millis(500));
    env.cluster.restart_ctld().expect("ctld starts again");
    // The agents notice within a keep-alive and register again.
    let t0 = std::time::Instant::now();
    while env.run(&["squeue", "-h"]).0 != 0 {
        if t0.elapsed() > Duration::from_secs(20) {
            panic!("the cluster did not come back:\n{}", logs(&env));
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    // Everything acknowledged is there, in the state it was.
    let shown = env.ok(&["scontrol", "show", "job", &held.to_string()]);
    assert!(shown.contains("JobState=PENDING"), "{shown}");
    let st = env.state(long);
    assert!(
        st == "RUNNING" || st == "COMPLETING" || st == "FAILED",
        "{st}"
    );
    // The running job finishes where it ran, once, with its exit code.
    assert_eq!(env.wait_state(long, &["FAILED", "COMPLETED"], 30), "FAILED");
    let shown = env.ok(&["scontrol", "show", "job", &long.to_string()]);
    assert!(shown.contains("ExitCode=3:0"), "{shown}");
    let runs = std::fs::read_to_string(&marker).unwrap_or_default();
    assert_eq!(runs, "started\n", "not rerun");
    let mut out: Vec<String> = env.read("long.out").lines().map(String::from).collect();
    out.sort();
    assert_eq!(out, ["0: 0", "1: 1"], "{}", logs(&env));
    let mut ran: Vec<String> = std::fs::read_to_string(&steps)
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect();
    ran.sort();
    assert_eq!(
        ran,
        ["0", "1"],
        "the step ran once on each node\n{}",
        logs(&env)
    );
    // The job that waited runs after it; new ids continue after the old.
    assert_eq!(
        env.wait_state(queued, &["COMPLETED", "FAILED"], 30),
        "COMPLETED"
    );
    let next = env.sbatch(&["-o", "/dev/null"], "#!/bin/sh\ntrue\n");
    assert!(next > held, "ids never repeat: {next} after {held}");
    env.ok(&["scontrol", "release", &held.to_string()]);
    assert_eq!(env.wait_state(held, &["COMPLETED"], 30), "COMPLETED");
}

#[test]
fn submissions_through_repeated_kills_lose_nothing_acknowledged_and_repeat_no_id() {
    let mut env = Env::start(Opts {
        nodes: 2,
        heartbeat_timeout: 5,
        ..Opts::default()
    });
    let script = env.work.join("job.sh");
    std::fs::write(&script, "#!/bin/sh\ntrue\n").expect("script");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // A client submitting held jobs as fast as it can; what it was told
    // is what counts.
    let submitter = {
        let stop = stop.clone();
        let cmd = env.cmd(&["sbatch", "--parsable", "-H", "-o", "/dev/null", "job.sh"]);
        let (program, args, envs, dir) = (
            cmd.get_program().to_owned(),
            cmd.get_args().map(|a| a.to_owned()).collect::<Vec<_>>(),
            cmd.get_envs()
                .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned())))
                .collect::<Vec<_>>(),
            env.work.clone(),
        );
        std::thread::spawn(move || {
            let mut acked = Vec::new();
            let mut refused = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let o = std::process::Command::new(&program)
                    .args(&args)
                    .envs(envs.iter().map(|(k, v)| (k, v)))
                    .current_dir(&dir)
                    .output()
                    .expect("sbatch");
                match String::from_utf8_lossy(&o.stdout).trim().parse::<u64>() {
                    Ok(id) if o.status.success() => acked.push(id),
                    _ => refused += 1,
                }
            }
            (acked, refused)
        })
    };
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(700));
        env.cluster.kill_ctld(Signal::SIGKILL);
        std::thread::sleep(Duration::from_millis(300));
        env.cluster.restart_ctld().expect("ctld starts again");
    }
    std::thread::sleep(Duration::from_millis(700));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (acked, refused) = submitter.join().expect("submitter");
    println!(
        "{} submissions acknowledged, {refused} refused",
        acked.len()
    );
    assert!(
        acked.len() > 10,
        "submissions went through: {} ({refused} refused)",
        acked.len()
    );
    let mut unique = acked.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), acked.len(), "no id acknowledged twice");
    // Every acknowledged job is there, exactly once, held.
    let listed = env.ok(&["squeue", "-h", "-t", "all", "-o", "%i %T"]);
    let mut seen = std::collections::HashMap::new();
    for l in listed.lines() {
        let mut f = l.split_whitespace();
        let (Some(id), Some(st)) = (f.next(), f.next()) else {
            continue;
        };
        *seen.entry(id.parse::<u64>().expect("id")).or_insert(0) += 1;
        assert_eq!(st, "PENDING", "{l}");
    }
    for id in &acked {
        assert_eq!(
            seen.get(id),
            Some(&1),
            "job {id} acknowledged, listed {:?}",
            seen.get(id)
        );
    }
    // And they all run to completion.
    let ids: Vec<String> = acked.iter().map(u64::to_string).collect();
    let mut release = vec!["scontrol", "release"];
    release.extend(ids.iter().map(String::as_str));
    env.ok(&release);
    for id in &acked {
        let st = env.wait_state(*id, &["COMPLETED", "FAILED", "NODE_FAIL", "CANCELLED"], 60);
        let shown = env.ok(&["scontrol", "show", "job", &id.to_string()]);
        assert_eq!(st, "COMPLETED", "{shown}");
    }
}

/// A cluster whose controller keeps its state and its log on one small
/// tmpfs of `mib` MiB (as a state disk shared with the log would be);
/// `limits` goes in `[limits]`. The mounts go with the returned guards.
fn on_small_disk(mib: u32, limits: &str) -> (Env, std::path::PathBuf, Vec<Unmount>) {
    let mut env = Env::start(Opts {
        nodes: 1,
        durable: true,
        extra_config: format!("[limits]\n{limits}\n"),
        ..Opts::default()
    });
    let dir = env.cluster.spec.dir.clone();
    let state = dir.join("state");
    env.cluster.kill_ctld(Signal::SIGKILL);
    let saved = dir.join("state.saved");
    std::fs::rename(&state, &saved).expect("moving the state aside");
    std::fs::create_dir(&state).expect("mount point");
    let ok = std::process::Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            &format!("size={mib}m,mode=0700"),
            "tmpfs",
        ])
        .arg(&state)
        .status()
        .expect("mount");
    assert!(ok.success(), "mounting a tmpfs");
    let mut guards = vec![Unmount(state.clone())];
    for e in std::fs::read_dir(&saved).expect("saved state") {
        let e = e.expect("entry");
        std::fs::copy(e.path(), state.join(e.file_name())).expect("copying the state");
    }
    // The log moves onto the same disk.
    let log = state.join("log");
    std::fs::create_dir(&log).expect("log dir");
    let ok = std::process::Command::new("mount")
        .arg("--bind")
        .arg(&log)
        .arg(dir.join("log"))
        .status()
        .expect("mount --bind");
    assert!(ok.success(), "binding the log");
    guards.insert(0, Unmount(dir.join("log")));
    env.cluster.restart_ctld().expect("ctld starts again");
    (env, state, guards)
}

/// Fills what is left of the filesystem of `dir` with a file, returned.
fn fill(dir: &std::path::Path) -> std::path::PathBuf {
    use std::io::Write;
    let filler = dir.join("filler");
    let mut f = std::fs::File::create(&filler).expect("filler");
    let block = vec![0u8; 64 << 10];
    while f.write_all(&block).is_ok() {}
    let _ = f.flush();
    filler
}

/// Submits until the controller takes one; its id.
fn first_taken(env: &Env, submit: &dyn Fn(&Env) -> (i32, String, String), within: u64) -> u64 {
    let t0 = std::time::Instant::now();
    loop {
        let (code, out, err) = submit(env);
        if code == 0 {
            return out.trim().parse().expect("id");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(within),
            "submissions still refused: {err}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The disk filled past any reserve (by something else), with the log
/// on it too, and submissions of large scripts: each refused with one
/// line; once space returns submissions are taken again without a
/// restart (a log line that could not be written panicked the writer
/// and lost its batch, and every submission was refused for good), and
/// after a crash exactly the acknowledged jobs are there.
#[test]
fn a_full_state_disk_refuses_submissions_and_recovers_when_space_returns() {
    if !corral_e2e::is_root() {
        println!("SKIPPED (a small tmpfs for the state needs root)");
        return;
    }
    let (mut env, state, _unmount) = on_small_disk(32, "state_reserve = 0");
    let script = env.work.join("held.sh");
    // Large, as the scripts that filled a disk were: a refused
    // submission's script must not wait in the store's queue.
    let mut body = String::from("#!/bin/sh\ntrue\n");
    body.push_str(&format!("#{}\n", "x".repeat(512 << 10)));
    std::fs::write(&script, body).expect("script");
    let script = script.to_string_lossy().into_owned();
    let submit = |env: &Env| env.run(&["sbatch", "--parsable", "-H", "-o", "/dev/null", &script]);
    let mut acked = vec![first_taken(&env, &submit, 30)];

    // The disk fills up, to the last byte of the log's page.
    let filler = fill(&state);
    {
        use std::io::Write;
        let log = env.cluster.spec.dir.join("log").join("ctld.log");
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(log)
            .expect("log");
        while f
            .write_all(b"filler filler filler filler filler filler\n")
            .is_ok()
        {}
    }
    // Submissions go on until the store needs space it cannot get; then
    // each is refused with one line, and nothing refused is kept.
    let mut refusal = None;
    for _ in 0..300 {
        let (code, out, err) = submit(&env);
        if code == 0 {
            acked.push(out.trim().parse().expect("id"));
        } else {
            refusal = Some(err);
            break;
        }
    }
    let err = refusal.expect("a full disk must refuse submissions");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(
            "sbatch: error: Batch job submission failed: Unable to save the controller's state"
        ),
        "{err}"
    );
    for _ in 0..5 {
        let (code, _, _) = submit(&env);
        assert_ne!(code, 0, "still full: still refused");
    }
    // The controller still answers.
    assert_eq!(env.run(&["squeue", "-h"]).0, 0, "ctld alive");
    std::thread::sleep(Duration::from_secs(3));

    // Space returns: submissions are taken again, without a restart.
    std::fs::remove_file(&filler).expect("freeing the disk");
    acked.push(first_taken(&env, &submit, 20));

    // After a crash, exactly the acknowledged jobs are there.
    env.cluster.kill_ctld(Signal::SIGKILL);
    env.cluster.restart_ctld().expect("ctld starts again");
    let t0 = std::time::Instant::now();
    let listed = loop {
        let (code, out, _) = env.run(&["squeue", "-h", "-t", "all", "-o", "%i"]);
        if code == 0 {
            break out;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "ctld did not come back"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut listed: Vec<u64> = listed
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    listed.sort_unstable();
    acked.sort_unstable();
    assert_eq!(listed, acked, "every acknowledged job, and only those");
}

/// One user's large held jobs fill the state disk up to its reserve and
/// no further: new jobs (sbatch and srun) are refused in one line that
/// says why, while a running job still completes and is stored, and a
/// cancel still works; once space returns jobs are taken again.
#[test]
fn the_state_disk_keeps_a_reserve_for_running_jobs() {
    if !corral_e2e::is_root() {
        println!("SKIPPED (a small tmpfs for the state needs root)");
        return;
    }
    let (env, state, _unmount) = on_small_disk(32, "state_reserve = 4194304");
    // Other files on the disk, removed at the end.
    let other = state.join("other");
    std::fs::write(&other, vec![1u8; 8 << 20]).expect("other file");
    let running = env.ok(&[
        "sbatch",
        "--parsable",
        "-o",
        "/dev/null",
        "--wrap",
        "sleep 4",
    ]);
    let running: u64 = running.trim().parse().expect("id");
    env.wait_state(running, &["RUNNING"], 20);
    let script = env.work.join("big.sh");
    let mut body = String::from("#!/bin/sh\ntrue\n");
    body.push_str(&format!("#{}\n", "x".repeat(1 << 20)));
    std::fs::write(&script, body).expect("script");
    let script = script.to_string_lossy().into_owned();
    let mut held = 0;
    let refusal = loop {
        let (code, _, err) = env.run(&["sbatch", "-H", "-o", "/dev/null", &script]);
        if code != 0 {
            break err;
        }
        held += 1;
        assert!(held < 64, "32 MiB never ran short");
    };
    assert_eq!(refusal.lines().count(), 1, "{refusal}");
    assert!(
        refusal.contains("Resource temporarily unavailable: the controller's state disk has")
            && refusal.contains("under the 4 MiB it keeps for running jobs"),
        "{refusal}"
    );
    let st = nix::sys::statvfs::statvfs(&state).expect("statvfs");
    let free = st.blocks_available() as u64 * st.fragment_size() as u64;
    assert!(
        free > 1 << 20,
        "the reserve is still there: {free} bytes free"
    );
    let (code, _, err) = env.run(&["srun", "true"]);
    assert_ne!(code, 0);
    assert!(err.contains("Resource temporarily unavailable"), "{err}");
    // What runs goes on: the running job completes, cancels work.
    assert_eq!(
        env.wait_state(running, &["COMPLETED", "FAILED"], 30),
        "COMPLETED"
    );
    env.ok(&["scancel", "-u", "root", "-t", "PENDING"]);
    // Space returns (another file removed: redb keeps its file's size,
    // reusing the cancelled jobs' pages), and jobs are taken again.
    std::fs::remove_file(&other).expect("removing the other file");
    let submit =
        |env: &Env| env.run(&["sbatch", "--parsable", "-o", "/dev/null", "--wrap", "true"]);
    let taken = first_taken(&env, &submit, 20);
    env.wait_state(taken, &["COMPLETED"], 30);
}

#[test]
fn an_srun_streaming_through_a_controller_outage_finishes_and_is_accounted() {
    let mut env = Env::start(Opts {
        nodes: 2,
        heartbeat_timeout: 5,
        durable: true,
        ..Opts::default()
    });
    let mut srun = env.cmd(&[
        "srun",
        "-N2",
        "-l",
        "sh",
        "-c",
        "for i in 1 2 3 4 5 6 7 8; do echo $i; sleep 0.5; done; exit 4",
    ]);
    let srun = srun
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("srun");
    std::thread::sleep(Duration::from_millis(1200));
    env.cluster.kill_ctld(Signal::SIGKILL);
    std::thread::sleep(Duration::from_millis(1000));
    env.cluster.restart_ctld().expect("ctld starts again");
    let o = srun.wait_with_output().expect("srun ends");
    let (code, out, err) = corral_e2e::out(o);
    assert_eq!(code, 4, "srun's exit is its tasks': {err}");
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort_unstable();
    let want: Vec<String> = (0..2)
        .flat_map(|t| (1..=8).map(move |i| format!("{t}: {i}")))
        .collect();
    assert_eq!(lines, want, "every line, once: {err}");
    // Accounted once, with its exit code and a run time that spans the
    // outage.
    let t0 = std::time::Instant::now();
    let line = loop {
        let (code, o, _) = env.run(&[
            "sacct",
            "-X",
            "-n",
            "-P",
            "-o",
            "JobName,State,ExitCode,ElapsedRaw,NNodes",
        ]);
        if code == 0 && o.contains("FAILED") {
            break o;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "not accounted: {o}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let f: Vec<&str> = line.trim().split('|').collect();
    assert_eq!(
        (f[0], f[1], f[2], f[4]),
        ("sh", "FAILED", "4:0", "2"),
        "{line}"
    );
    let elapsed: u64 = f[3].parse().expect("ElapsedRaw");
    assert!((3..=15).contains(&elapsed), "{line}");
}

/// A one-node batch job whose script ends while the controller is down:
/// its agent cleans up at once and says so in one message (`BatchDone`),
/// which the controller never got. Back, the controller must neither run
/// the script again (the agent still lists its batch step as launched)
/// nor lose the job: it hears the end again and records the script's own
/// exit code.
#[test]
fn a_batch_job_that_ends_while_the_controller_is_down_is_not_run_again() {
    let mut env = Env::start(Opts {
        nodes: 1,
        heartbeat_timeout: 5,
        ..Opts::default()
    });
    let marker = env.work.join("runs");
    let go = env.work.join("go");
    let job = env.sbatch(
        &["-o", "/dev/null"],
        &format!(
            "#!/bin/sh\nwhile [ ! -e {} ]; do sleep 0.01; done\necho ran >> {}\nexit 4\n",
            go.display(),
            marker.display()
        ),
    );
    env.wait_state(job, &["RUNNING"], 10);
    env.cluster.kill_ctld(Signal::SIGKILL);
    std::fs::write(&go, "").expect("go");
    let t0 = std::time::Instant::now();
    while !marker.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the script did not end"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // The agent has cleaned up and queued its news by now.
    std::thread::sleep(Duration::from_millis(500));
    env.cluster.restart_ctld().expect("ctld starts again");
    assert_eq!(
        env.wait_state(job, &["FAILED", "COMPLETED"], 30),
        "FAILED",
        "{}",
        logs(&env)
    );
    let shown = env.ok(&["scontrol", "show", "job", &job.to_string()]);
    assert!(shown.contains("ExitCode=4:0"), "{shown}");
    // Long enough for a launch sent again to have run the script.
    std::thread::sleep(Duration::from_millis(1500));
    let runs = std::fs::read_to_string(&marker).unwrap_or_default();
    assert_eq!(runs, "ran\n", "run once\n{}", logs(&env));
    // The node is free for the next job.
    let next = env.sbatch(&["-o", "/dev/null"], "#!/bin/sh\ntrue\n");
    assert_eq!(env.wait_state(next, &["COMPLETED"], 30), "COMPLETED");
}
