//! The Python launchers ML teams drive Slurm with, run unmodified against
//! a Corral cluster: each installed from PyPI, at a pinned version, into
//! a virtual environment under `target/launchers` (kept between runs),
//! then its own documented usage run and its results asserted. Without
//! Python or PyPI a test says SKIPPED and why.

use std::path::{Path, PathBuf};
use std::process::Command;

use corral_e2e::{Env, Opts};

/// A virtual environment with `package` installed, made once; `Err` says
/// why there is none.
fn venv(name: &str, package: &str) -> Result<PathBuf, String> {
    let dir = corral_e2e::bin_dir()
        .parent()
        .unwrap_or(Path::new("target"))
        .join("launchers")
        .join(name);
    let python = dir.join("bin/python");
    let ready = dir.join(".installed");
    if ready.exists() {
        return Ok(python);
    }
    let run = |c: &mut Command| -> Result<(), String> {
        let out = c.output().map_err(|e| format!("{c:?}: {e}"))?;
        if out.status.success() {
            return Ok(());
        }
        let err = String::from_utf8_lossy(&out.stderr);
        Err(format!(
            "{c:?} failed: {}",
            err.lines().last().unwrap_or_default()
        ))
    };
    run(Command::new("python3").args(["-m", "venv"]).arg(&dir))?;
    run(Command::new("timeout")
        .args(["300"])
        .arg(dir.join("bin/pip"))
        .args(["install", "-q", "--disable-pip-version-check"])
        .args(package.split_whitespace()))?;
    std::fs::write(&ready, package).map_err(|e| e.to_string())?;
    Ok(python)
}

/// Runs `tests/launchers/SCRIPT` with the cluster's commands and a
/// folder of its own (`work/FOLDER`), for at most four minutes; what it
/// printed, once it succeeded.
fn run_check(python: &Path, script: &str, env: &Env, folder: &str) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("launchers")
        .join(script);
    let out = Command::new("timeout")
        .arg("240")
        .arg(python)
        .arg(script)
        .arg(env.work.join(folder))
        .envs(env.env())
        .current_dir(&env.work)
        .output()
        .expect("python runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}\n{err}");
    println!("{text}");
    text
}

/// `key value` lines as a script printed them.
fn value<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|v| v.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no {key:?} in:\n{out}"))
}

/// submitit 1.5.2: a function's result, a raising function's exception
/// (its trace in submitit's FailedJobError, as with Slurm), an array by
/// `map_array`, a 2-node × 2-task job whose ranks come back, and a
/// cancel that ends CANCELLED. Its script carries `--wckey`, and it polls
/// with `sacct -j A -j B`: both once refused.
#[test]
fn submitit_runs_functions_arrays_and_multi_node_jobs() {
    let python = match venv("submitit-1.5.2", "submitit==1.5.2") {
        Ok(p) => p,
        Err(why) => {
            println!("SKIPPED (cannot install submitit from PyPI): {why}");
            return;
        }
    };
    let env = Env::start(Opts {
        nodes: 2,
        durable: true,
        ..Opts::default()
    });
    let text = run_check(&python, "submitit_check.py", &env, "submitit");
    assert_eq!(value(&text, "result"), "5");
    assert_eq!(value(&text, "raised"), "True");
    assert_eq!(value(&text, "array"), "[11, 22, 33]");
    assert_eq!(
        value(&text, "ranks"),
        "[(0, 0, 4, 0, 2), (1, 1, 4, 0, 2), (2, 0, 4, 1, 2), (3, 1, 4, 1, 2)]"
    );
    assert!(value(&text, "cancelled").starts_with("CANCELLED"), "{text}");
    let secs: f64 = value(&text, "seconds").parse().expect("seconds");
    println!("one job through submitit, submitted to result: {secs} s");
}

/// snakemake 9.27.1 with its Slurm executor (plugin 2.8.0): a workflow of
/// three jobs and one that gathers their outputs completes, once with the
/// three as one array polled by squeue, and once as single jobs polled by
/// its default, sacct (`--clusters all --name RUNID`). (An array polled
/// by sacct never ends: the plugin falls back from `A_T` to the array's
/// own id, which in Slurm the last task takes and in Corral none does.) The gathering job names its
/// account, which the plugin checks through `sacctmgr -s list user`; the
/// others get the user's default from `[accounts]`.
#[test]
fn snakemake_runs_a_workflow_through_its_slurm_executor() {
    let packages = "snakemake==9.27.1 snakemake-executor-plugin-slurm==2.8.0";
    let python = match venv("snakemake-9.27.1", packages) {
        Ok(p) => p,
        Err(why) => {
            println!("SKIPPED (cannot install snakemake from PyPI): {why}");
            return;
        }
    };
    let out = Command::new("id").arg("-un").output().expect("id runs");
    let me = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let env = Env::start(Opts {
        nodes: 2,
        extra_config: format!(
            "[accounts]\ndefault = \"general\"\n[accounts.users]\n{me:?} = [\"ml\", \"vision\"]\n"
        ),
        ..Opts::default()
    });
    let dir = env.work.join("snakemake");
    std::fs::create_dir_all(&dir).unwrap();
    let snakefile = Path::new(env!("CARGO_MANIFEST_DIR")).join("launchers/snakemake/Snakefile");
    std::fs::copy(snakefile, dir.join("Snakefile")).unwrap();
    let snakemake = python.with_file_name("snakemake");
    for (how, args) in [
        (
            "an array, squeue",
            &[
                "--slurm-array-jobs",
                "make",
                "--slurm-status-command",
                "squeue",
            ][..],
        ),
        ("single jobs, sacct", &["--forceall"]),
    ] {
        let _ = std::fs::remove_file(dir.join("gathered.txt"));
        let t0 = std::time::Instant::now();
        let out = Command::new("timeout")
            .arg("240")
            .arg(&snakemake)
            .args(["--executor", "slurm", "--jobs", "4", "--latency-wait", "5"])
            .args(["--slurm-init-seconds-before-status-checks", "1"])
            .args(["--seconds-between-status-checks", "1"])
            .args(args)
            .envs(env.env())
            .current_dir(&dir)
            .output()
            .expect("snakemake runs");
        let log = format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{how}: {log}");
        assert!(log.contains("5 of 5 steps (100%) done"), "{how}: {log}");
        let gathered = std::fs::read_to_string(dir.join("gathered.txt")).unwrap();
        assert_eq!(gathered, "a b c ", "{how}");
        println!(
            "snakemake, {how}: the workflow took {:.1} s",
            t0.elapsed().as_secs_f64()
        );
    }
    // Each job charged the account it should: the gathering job's named
    // one, the others the user's default.
    let acct = env.ok(&[
        "sacct",
        "-X",
        "-n",
        "-P",
        "-o",
        "JobName,Account,State",
        "-S",
        "2020-01-01",
    ]);
    let lines: Vec<&str> = acct.lines().collect();
    assert_eq!(lines.len(), 8, "{acct}");
    assert!(lines.iter().all(|l| l.ends_with("|COMPLETED")), "{acct}");
    assert_eq!(
        lines.iter().filter(|l| l.contains("|vision|")).count(),
        2,
        "{acct}"
    );
    assert_eq!(
        lines.iter().filter(|l| l.contains("|ml|")).count(),
        6,
        "{acct}"
    );
}

/// dask-jobqueue 0.9.0's `SLURMCluster`: two worker jobs from its own
/// script (`-J`, `-e/-o` with `%J`, `-p`, `-n`, `--cpus-per-task`,
/// `--mem`, `-t`), a map over them, and `close` cancelling them.
#[test]
fn dask_jobqueue_runs_workers_as_jobs() {
    let python = match venv(
        "dask-jobqueue-0.9.0",
        "dask-jobqueue==0.9.0 distributed==2026.11.0",
    ) {
        Ok(p) => p,
        Err(why) => {
            println!("SKIPPED (cannot install dask-jobqueue from PyPI): {why}");
            return;
        }
    };
    let env = Env::start(Opts {
        nodes: 2,
        ..Opts::default()
    });
    let text = run_check(&python, "dask_check.py", &env, "dask");
    assert_eq!(value(&text, "workers"), "2");
    assert_eq!(value(&text, "sum"), "285");
    assert_eq!(value(&text, "running"), "2");
    // One worker a job; the two jobs on the cluster's nodes.
    let nodes = value(&text, "nodes");
    assert!(nodes.contains("worker-"), "{nodes}");
    assert_eq!(value(&text, "left"), "0", "close cancels the worker jobs");
    let secs: f64 = value(&text, "seconds").parse().expect("seconds");
    println!("dask-jobqueue: two workers up {secs} s after scale");
}

/// torchrun's shape without PyTorch (its wheel pulls the CUDA libraries,
/// too big for CI): the minGPT-ddp batch script's rendezvous on the first
/// node of `SLURM_JOB_NODELIST`, every rank connecting to it over TCP,
/// ranks and world size from Slurm's variables (2 nodes × 2 tasks).
#[test]
fn a_torchrun_like_rendezvous_finds_every_rank() {
    let env = Env::start(Opts {
        nodes: 2,
        ..Opts::default()
    });
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("launchers");
    let out = env.work.join("ddp.out");
    let rendezvous = format!("RENDEZVOUS={}", here.join("rendezvous.py").display());
    let id = env
        .ok(&[
            "sbatch",
            "--parsable",
            "--export",
            &format!("ALL,{rendezvous}"),
            "-o",
            &out.to_string_lossy(),
            &here.join("torchrun_like.sh").to_string_lossy(),
        ])
        .trim()
        .parse()
        .expect("a job id");
    let st = env.wait_state(id, &["COMPLETED", "FAILED", "CANCELLED"], 90);
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    assert_eq!(st, "COMPLETED", "{text}");
    let mut ranks: Vec<&str> = text.lines().filter(|l| l.starts_with("rank ")).collect();
    ranks.sort_unstable();
    assert_eq!(
        ranks,
        [
            "rank 0 world 4 local 0 node 0 head-saw 4",
            "rank 1 world 4 local 1 node 0 head-saw 4",
            "rank 2 world 4 local 0 node 1 head-saw 4",
            "rank 3 world 4 local 1 node 1 head-saw 4",
        ],
        "{text}"
    );
    assert!(text.starts_with("head worker-0 "), "{text}");
}

/// Nextflow's Slurm executor's shape (Nextflow needs a JVM, more than CI
/// should fetch): each task's `.command.run` with the directives it
/// writes (`-J`, `-o` its `.command.log`, `--no-requeue`, `--signal
/// B:USR2@30` with a blank, `-c`, `-t HH:MM:SS`, `--mem NM`, `-p`),
/// submitted by `sbatch .command.run` from the task's directory, the id
/// read from "Submitted batch job N", and the states polled with its
/// `squeue --noheader -o '%i %t' -t all -p QUEUE -u USER`, each line two
/// columns, until every task is CD or F.
#[test]
fn a_nextflow_like_executor_sees_its_tasks_end() {
    let env = Env::start(Opts {
        nodes: 1,
        ..Opts::default()
    });
    let user = nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten()
        .map(|u| u.name)
        .expect("this user's name");
    let mut ids = Vec::new();
    for (task, body) in [
        (
            "hello",
            "echo \"hello from $SLURM_JOB_NAME cpus $SLURM_CPUS_PER_TASK\"",
        ),
        ("broken", "exit 3"),
    ] {
        let dir = env.work.join(format!("work-{task}"));
        std::fs::create_dir_all(&dir).expect("task directory");
        let log = dir.join(".command.log");
        let script = format!(
            "#!/bin/bash\n#SBATCH -J nf-{task}\n#SBATCH -o {}\n#SBATCH --no-requeue\n\
             #SBATCH --signal B:USR2@30\n#SBATCH -c 2\n#SBATCH -t 00:10:00\n\
             #SBATCH --mem 512M\n#SBATCH -p gpu\n{body}\n",
            log.display()
        );
        std::fs::write(dir.join(".command.run"), script).expect("script");
        let o = env
            .cmd(&["sbatch", ".command.run"])
            .current_dir(&dir)
            .output()
            .expect("sbatch");
        let (code, out, err) = corral_e2e::out(o);
        assert_eq!(code, 0, "{err}");
        let id: u64 = out
            .lines()
            .find_map(|l| l.strip_prefix("Submitted batch job "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("{out}"));
        ids.push((id, log));
    }
    let t0 = std::time::Instant::now();
    let states = loop {
        let out = env.ok(&[
            "squeue",
            "--noheader",
            "-o",
            "%i %t",
            "-t",
            "all",
            "-p",
            "gpu",
            "-u",
            &user,
        ]);
        let states: Vec<(u64, String)> = out
            .lines()
            .map(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                assert_eq!(cols.len(), 2, "a line Nextflow reads: {l:?}");
                (cols[0].parse().expect("an id"), cols[1].to_string())
            })
            .collect();
        let of = |id: u64| {
            states
                .iter()
                .find(|(i, _)| *i == id)
                .map(|(_, s)| s.clone())
        };
        let now: Vec<Option<String>> = ids.iter().map(|(id, _)| of(*id)).collect();
        if now.iter().all(|s| matches!(s.as_deref(), Some("CD" | "F"))) {
            break now;
        }
        assert!(t0.elapsed().as_secs() < 60, "still {now:?}");
        std::thread::sleep(std::time::Duration::from_millis(300));
    };
    assert_eq!(states, [Some("CD".to_string()), Some("F".to_string())]);
    let log = std::fs::read_to_string(&ids[0].1).expect("the task's log");
    assert_eq!(log, "hello from nf-hello cpus 2\n");
}

/// PyTorch Lightning's SLURM environment, read as Lightning reads it
/// (`tests/launchers/lightning_env.py`): a 2-node × 2-task job's srun
/// tasks are detected, have SLURM_NTASKS_PER_NODE, and agree on the main
/// address and port; and a job named `bash` is not taken for one.
#[test]
fn lightning_reads_its_slurm_environment() {
    let env = Env::start(Opts {
        nodes: 2,
        ..Opts::default()
    });
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("launchers")
        .join("lightning_env.py");
    let run = format!("srun python3 {}", script.display());
    let id = env.sbatch(
        &[
            "-J",
            "train",
            "-N",
            "2",
            "--ntasks-per-node=2",
            "-o",
            "lightning.out",
        ],
        &format!("#!/bin/sh\n{run}\n"),
    );
    let st = env.wait_state(id, &["COMPLETED", "FAILED", "CANCELLED"], 60);
    let text = env.read("lightning.out");
    assert_eq!(st, "COMPLETED", "{text}");
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_unstable();
    let main = format!("main worker-0:{}", 15000 + id % 10000);
    let want: Vec<String> = [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)]
        .iter()
        .map(|(g, l, n)| format!("global {g} local {l} node {n} world 4 per-node 2 {main}"))
        .collect();
    assert_eq!(lines, want, "{text}");
    let bash = env.sbatch(
        &["-J", "bash", "-o", "bash.out"],
        &format!("#!/bin/sh\n{run}\n"),
    );
    assert_eq!(env.wait_state(bash, &["COMPLETED", "FAILED"], 60), "FAILED");
    assert!(env.read("bash.out").contains("not detected"));
}
