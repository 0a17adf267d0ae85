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
