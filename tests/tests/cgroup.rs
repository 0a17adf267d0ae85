//! Jobs in their cgroups, through the whole cluster (as root; agents put
//! each job in a cgroup when they run as root): a job over `--mem` ends
//! OUT_OF_MEMORY, `scancel` leaves no process behind (a double-forked
//! daemon included), a GPU job can open only its own GPU's device, and
//! `scontrol show job` shows what a job used. Without root each test says
//! SKIPPED and checks nothing.

use std::time::{Duration, Instant};

use corral_e2e::{is_root, Env, Opts};

fn root_or_skip(test: &str) -> bool {
    if !is_root() {
        println!("SKIPPED (needs root): {test}");
    }
    is_root()
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

fn show_job(env: &Env, job: u64) -> String {
    env.ok(&["scontrol", "show", "job", &job.to_string()])
}

#[test]
fn a_job_over_its_memory_ends_out_of_memory() {
    if !root_or_skip("a_job_over_its_memory_ends_out_of_memory") {
        return;
    }
    let env = Env::start(Opts {
        nodes: 1,
        ..Opts::default()
    });
    // tail keeps every byte of a file without newlines.
    let job = env.sbatch(
        &["--mem=32M", "-o", "oom.out"],
        "#!/bin/sh\ntail /dev/zero\necho survived\n",
    );
    let st = env.wait_state(job, &["OUT_OF_MEMORY", "COMPLETED", "FAILED"], 60);
    assert_eq!(st, "OUT_OF_MEMORY", "{}", show_job(&env, job));
    let shown = show_job(&env, job);
    assert!(shown.contains("JobState=OUT_OF_MEMORY"), "{shown}");
    let rss: u64 = shown
        .split_whitespace()
        .find_map(|w| w.strip_prefix("MaxRSS="))
        .and_then(|v| v.trim_end_matches('K').parse().ok())
        .unwrap_or_else(|| panic!("no MaxRSS in {shown}"));
    assert!(
        (16 * 1024..=33 * 1024).contains(&rss),
        "peak near the 32M limit: {rss}K"
    );
    let code = env.ok(&[
        "squeue",
        "-h",
        "-t",
        "all",
        "-j",
        &job.to_string(),
        "-o",
        "%t",
    ]);
    assert_eq!(code.trim(), "OOM");
}

#[test]
fn scancel_leaves_no_process_of_the_job_behind_not_even_a_daemon() {
    if !root_or_skip("scancel_leaves_no_process_of_the_job_behind_not_even_a_daemon") {
        return;
    }
    let env = Env::start(Opts {
        nodes: 1,
        ..Opts::default()
    });
    let pidfile = env.work.join("daemon.pid");
    let script = format!(
        "#!/bin/sh\nsetsid sh -c 'sleep 600 & echo $! > {}.tmp; mv {0}.tmp {0}'\nsleep 600\n",
        pidfile.display()
    );
    let job = env.sbatch(&["-o", "/dev/null"], &script);
    env.wait_state(job, &["RUNNING"], 10);
    let t0 = Instant::now();
    let pid: i32 = loop {
        if let Some(p) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            break p;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no daemon started");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(alive(pid));
    env.ok(&["scancel", &job.to_string()]);
    env.wait_state(job, &["CANCELLED"], 15);
    // The job is CANCELLED once its node reported it clean.
    assert!(!alive(pid), "the daemon {pid} outlived its job");
}

#[test]
fn a_gpu_job_opens_only_its_own_gpu_and_reports_its_cpu_time() {
    if !root_or_skip("a_gpu_job_opens_only_its_own_gpu_and_reports_its_cpu_time") {
        return;
    }
    use nix::sys::stat::{makedev, mknod, Mode, SFlag};
    let env = Env::start(Opts {
        nodes: 1,
        gpus: 2,
        ..Opts::default()
    });
    // Device nodes of both GPUs (no driver: an allowed open fails with
    // ENXIO, a denied one with EPERM).
    let devs = env.work.join("dev");
    std::fs::create_dir(&devs).expect("dev dir");
    for i in 0..2 {
        mknod(
            &devs.join(format!("nvidia{i}")),
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            makedev(195, i),
        )
        .expect("mknod");
    }
    let script = format!(
        "#!/bin/sh\necho gpus=$SLURM_JOB_GPUS\n\
         for i in 0 1; do dd if={}/nvidia$i of=/dev/null count=1 2>&1 | head -n1 | sed \"s/^/$i: /\"; done\n\
         i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done\n",
        devs.display()
    );
    let job = env.sbatch(&["--gres=gpu:1", "-o", "gpu.out"], &script);
    assert_eq!(
        env.wait_state(job, &["COMPLETED", "FAILED"], 60),
        "COMPLETED"
    );
    let out = env.read("gpu.out");
    let mine: u32 = out
        .lines()
        .find_map(|l| l.strip_prefix("gpus="))
        .and_then(|g| g.trim().parse().ok())
        .unwrap_or_else(|| panic!("no GPU in {out}"));
    for i in 0..2u32 {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("{i}: ")))
            .unwrap_or_else(|| panic!("no line for GPU {i}: {out}"));
        if i == mine {
            assert!(line.contains("No such device"), "its own GPU: {out}");
        } else {
            assert!(line.contains("Operation not permitted"), "GPU {i}: {out}");
        }
    }
    let shown = show_job(&env, job);
    let cpu = shown
        .split_whitespace()
        .find_map(|w| w.strip_prefix("TotalCPU="))
        .unwrap_or_else(|| panic!("no TotalCPU in {shown}"));
    assert_ne!(cpu, "00:00.000", "a busy loop used CPU time: {shown}");
}

/// `scontrol suspend` freezes the job's cgroup: its processes make no
/// progress (a counter it writes stops) until `scontrol resume`; squeue
/// and scontrol show it SUSPENDED; cancelled while suspended, it ends and
/// leaves nothing behind.
#[test]
fn a_suspended_job_makes_no_progress_until_resumed_and_cancels_cleanly() {
    if !root_or_skip("a_suspended_job_makes_no_progress_until_resumed_and_cancels_cleanly") {
        return;
    }
    let env = Env::start(Opts {
        nodes: 1,
        ..Opts::default()
    });
    let count = env.work.join("count");
    let script = format!(
        "#!/bin/sh\necho $$ > {0}.pid\ni=0\nwhile :; do i=$((i+1)); echo $i > {0}.tmp; mv {0}.tmp {0}; sleep 0.02; done\n",
        count.display()
    );
    let job = env.sbatch(&["-o", "/dev/null", "-t", "10"], &script);
    env.wait_state(job, &["RUNNING"], 10);
    let read = || -> u64 {
        std::fs::read_to_string(&count)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    };
    let t0 = Instant::now();
    while read() < 3 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the job never counted"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let id = job.to_string();
    env.ok(&["scontrol", "suspend", &id]);
    // The freeze takes effect within moments; then nothing moves.
    std::thread::sleep(Duration::from_millis(300));
    let stopped = read();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(read(), stopped, "a suspended job went on counting");
    let st = env.ok(&["squeue", "-h", "-j", &id, "-o", "%t %T"]);
    assert_eq!(st.trim(), "S SUSPENDED");
    let shown = show_job(&env, job);
    assert!(shown.contains("JobState=SUSPENDED"), "{shown}");
    assert!(!shown.contains("SuspendTime=None"), "{shown}");
    let (code, _, err) = env.run(&["scontrol", "resume", "999999"]);
    assert_eq!(code, 1);
    assert!(err.contains("Invalid job id specified"), "{err}");
    env.ok(&["scontrol", "resume", &id]);
    let t0 = Instant::now();
    while read() <= stopped + 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "a resumed job did not go on"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(env.state(job), "RUNNING");
    // Suspended again, then cancelled: it ends, its shell with it.
    env.ok(&["scontrol", "suspend", &id]);
    let pid: i32 = std::fs::read_to_string(env.work.join("count.pid"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .expect("the job's pid");
    assert!(alive(pid));
    env.ok(&["scancel", &id]);
    env.wait_state(job, &["CANCELLED"], 15);
    assert!(!alive(pid), "the suspended job's shell {pid} outlived it");
}
