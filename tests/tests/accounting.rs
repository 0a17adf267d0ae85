//! Accounting on each database it supports: SQLite (always), PostgreSQL
//! and MariaDB (real servers started here; `.ci/run` installs them, and
//! where one is not installed its part prints SKIPPED).

use std::time::Duration;

use corral_ctl::ctld::acctdb::AcctDb;
use corral_e2e::{db, Env, Opts};
use corral_proto::msg::{
    AcctJob, AcctQuery, AcctStep, ExitStatus, Ident, JobId, JobReason, JobState, JobUsage, StepId,
    ACCT_PER_PAGE,
};

fn rec(id: u64, run: u32, uid: u32, state: JobState, end: Option<u64>) -> AcctJob {
    AcctJob {
        id: JobId(id),
        array: None,
        run,
        name: format!("job-{id}"),
        user: Ident { uid, gid: 100 },
        account: String::new(),
        partition: "gpu".into(),
        nodelist: "worker-[0-1]".into(),
        alloc_nodes: 2,
        alloc_cpus: 16,
        alloc_mem_mb: 64_000,
        alloc_gpus: 4,
        req_nodes: 2,
        req_cpus: 16,
        req_mem_mb: 32_000,
        req_gpus: 4,
        submit: 1000 + id,
        eligible: 1000 + id,
        start: end.map(|e| e - 100),
        end,
        time_limit: Some(3600),
        state,
        reason: if state == JobState::Failed {
            JobReason::NonZeroExitCode
        } else {
            JobReason::None
        },
        exit: ExitStatus {
            code: i32::from(state == JobState::Failed) * 3,
            signal: (state == JobState::Cancelled).then_some(15),
        },
        cancelled_by: (state == JobState::Cancelled).then_some(0),
        usage: end.map(|_| JobUsage {
            cpu_ms: 1234 * id,
            max_rss_kb: 4096,
        }),
        work_dir: "/home/u/ünïcode dir".into(),
        comment: String::new(),
        wckey: if id % 2 == 0 {
            "submitit".into()
        } else {
            String::new()
        },
        steps: match end {
            Some(e) => vec![
                AcctStep {
                    step: StepId(0),
                    name: "python".into(),
                    nodelist: "worker-[0-1]".into(),
                    nodes: 2,
                    tasks: 8,
                    cpus: 16,
                    start: e - 90,
                    end: Some(e - 1),
                    state: JobState::Completed,
                    exit: ExitStatus::default(),
                },
                AcctStep {
                    step: StepId::BATCH,
                    name: "batch".into(),
                    nodelist: "worker-0".into(),
                    nodes: 1,
                    tasks: 1,
                    cpus: 8,
                    start: e - 100,
                    end: Some(e),
                    state,
                    exit: ExitStatus::default(),
                },
            ],
            None => Vec::new(),
        },
    }
}

/// Every run the query selects, page by page.
async fn all_pages(db: &AcctDb, mut q: AcctQuery, users: &[u32]) -> Vec<AcctJob> {
    let mut out = Vec::new();
    loop {
        let (page, next) = db.query(&q, users).await.expect("query");
        assert!(page.len() <= ACCT_PER_PAGE);
        out.extend(page);
        match next {
            Some(n) => q.after = n,
            None => return out,
        }
    }
}

async fn exercise(url: &str) {
    let patience = Duration::from_secs(20);
    let db = AcctDb::connect(url, "c1", patience)
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    assert_eq!(db.version().await.expect("version"), 3);
    // Connecting again runs no migration twice; another cluster shares
    // the database without seeing this one's jobs.
    let again = AcctDb::connect(url, "c1", patience).await.expect("again");
    let other = AcctDb::connect(url, "c2", patience).await.expect("other");

    let mut j1 = rec(1, 0, 1000, JobState::Running, None);
    let j2a = rec(2, 0, 1000, JobState::Requeued, Some(1900));
    let j2b = rec(2, 1, 1000, JobState::Failed, Some(2100));
    let mut j3 = rec(3, 0, 1001, JobState::Cancelled, None);
    j3.time_limit = None;
    db.write(&[j1.clone(), j2a.clone(), j2b.clone(), j3.clone()])
        .await
        .expect("write");
    // The same run written again (a controller that died before it
    // forgot the record) replaces it: no double.
    j1 = rec(1, 0, 1000, JobState::Completed, Some(3000));
    again.write(&[j1.clone()]).await.expect("rewrite");
    again.write(&[j1.clone()]).await.expect("rewrite twice");
    other
        .write(&[rec(1, 0, 5, JobState::Timeout, Some(1500))])
        .await
        .expect("other");
    assert_eq!(db.count().await.expect("count"), 4);
    assert_eq!(other.count().await.expect("count"), 1);

    let everything = all_pages(&db, AcctQuery::default(), &[]).await;
    assert_eq!(
        everything,
        vec![j1.clone(), j2a, j2b.clone(), j3.clone()],
        "{url}: round trip"
    );

    let by_user = all_pages(&db, AcctQuery::default(), &[1001]).await;
    assert_eq!(by_user, vec![j3.clone()]);
    let failed = AcctQuery {
        states: vec![JobState::Failed, JobState::Completed],
        ..AcctQuery::default()
    };
    let ids: Vec<(u64, u32)> = all_pages(&db, failed, &[])
        .await
        .iter()
        .map(|j| (j.id.0, j.run))
        .collect();
    assert_eq!(ids, [(1, 0), (2, 1)]);
    let one = AcctQuery {
        ids: vec![JobId(2)],
        allocations: true,
        ..AcctQuery::default()
    };
    let runs = all_pages(&db, one, &[]).await;
    assert_eq!(runs.len(), 2);
    // -X: no steps fetched.
    assert!(runs.iter().all(|j| j.steps.is_empty()));
    // A window: in the system at some time in [2000, 2050]: the run
    // that ended at 1900 and the job submitted later are out; the one
    // without an end is in.
    let window = AcctQuery {
        start: Some(2000),
        end: Some(2050),
        ..AcctQuery::default()
    };
    let ids: Vec<(u64, u32)> = all_pages(&db, window, &[])
        .await
        .iter()
        .map(|j| (j.id.0, j.run))
        .collect();
    assert_eq!(ids, [(1, 0), (2, 1), (3, 0)]);

    // Tasks of an array (4) are found by their own ids and by the
    // array's (`sacct -j 4`).
    let mut t0 = rec(5, 0, 1000, JobState::Completed, Some(1000));
    t0.array = Some((JobId(4), 0));
    let mut t7 = rec(6, 0, 1000, JobState::Failed, Some(1000));
    t7.array = Some((JobId(4), 7));
    db.write(&[t0.clone(), t7.clone()])
        .await
        .expect("write tasks");
    let by = |id: u64| AcctQuery {
        ids: vec![JobId(id)],
        ..AcctQuery::default()
    };
    assert_eq!(
        all_pages(&db, by(4), &[]).await,
        vec![t0, t7.clone()],
        "{url}"
    );
    assert_eq!(all_pages(&db, by(6), &[]).await, vec![t7], "{url}");

    // Pages: many jobs, each once, in order, steps on the right runs.
    let many: Vec<AcctJob> = (10..10 + 2 * ACCT_PER_PAGE as u64 + 7)
        .map(|i| rec(i, 0, 1002, JobState::Completed, Some(5000 + i)))
        .collect();
    for chunk in many.chunks(400) {
        db.write(chunk).await.expect("write many");
    }
    let got = all_pages(&db, AcctQuery::default(), &[1002]).await;
    assert_eq!(got.len(), many.len());
    assert_eq!(got, many, "{url}: every page, every step");
    db.close().await;
    again.close().await;
    other.close().await;
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn each_database_keeps_each_run_once_and_answers_sacct_queries() {
    let rt = runtime();
    let dir = tempfile::tempdir().expect("tmp");
    let sqlite = format!("sqlite://{}", dir.path().join("acct.sqlite").display());
    rt.block_on(exercise(&sqlite));
    // The file is in write-ahead-log mode (one fsync a transaction):
    // bytes 18 and 19 of its header are 2 then, 1 with a rollback journal.
    let header = std::fs::read(dir.path().join("acct.sqlite")).expect("read the file");
    assert_eq!(header.get(18..20), Some(&[2u8, 2][..]), "not in WAL mode");

    match db::postgres() {
        Ok(pg) => {
            rt.block_on(exercise(&pg.url));
            println!("PostgreSQL: ok");
        }
        Err(why) => println!("SKIPPED PostgreSQL: {why}"),
    }
    match db::mariadb() {
        Ok(m) => {
            rt.block_on(exercise(&m.url));
            println!("MariaDB: ok");
        }
        Err(why) => println!("SKIPPED MariaDB: {why}"),
    }
}

/// The JobName field of a `-P` line (a script's file name).
fn name(line: &str) -> &str {
    line.split('|').nth(1).unwrap_or("")
}

/// `sacct -P --noheader -o FIELDS -j IDS`, lines.
fn sacct(env: &Env, ids: &[u64], fields: &str) -> Vec<String> {
    let ids: Vec<String> = ids.iter().map(u64::to_string).collect();
    env.ok(&["sacct", "-P", "-n", "-o", fields, "-j", &ids.join(",")])
        .lines()
        .map(str::to_string)
        .collect()
}

/// Runs in the accounting database, waited for.
fn wait_count(url: &str, want: u64, secs: u64) {
    let rt = runtime();
    rt.block_on(async {
        let t0 = std::time::Instant::now();
        let mut last = String::new();
        while t0.elapsed() < Duration::from_secs(secs) {
            match AcctDb::connect(url, "corral-up", Duration::from_secs(2)).await {
                Ok(db) => {
                    let n = db.count().await.expect("count");
                    db.close().await;
                    assert!(
                        n <= want,
                        "{n} runs in the database, more than the {want} that ran"
                    );
                    if n == want {
                        return;
                    }
                    last = format!("{n} runs");
                }
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("the database never held {want} runs: {last}");
    });
}

#[test]
fn sacct_reports_what_ran_with_steps_states_and_exit_codes() {
    let env = Env::start(Opts {
        durable: true,
        ..Opts::default()
    });
    let ok = env.sbatch(
        &["-J", "fine", "-N", "2"],
        "#!/bin/sh\nsrun -N2 hostname\nsrun -J probe -N1 true\nexit 0\n",
    );
    let bad = env.sbatch(&["-J", "broken"], "#!/bin/sh\nexit 3\n");
    let long = env.sbatch(&["-N", "2", "--gres=gpu:1"], "#!/bin/sh\nsleep 300\n");
    let held = env.sbatch(&["-H"], "#!/bin/sh\ntrue\n");
    env.wait_state(long, &["RUNNING"], 30);
    env.ok(&["scancel", &long.to_string(), &held.to_string()]);
    for j in [ok, bad, long, held] {
        env.wait_state(j, &["COMPLETED", "FAILED", "CANCELLED"], 60);
    }
    let lines = sacct(
        &env,
        &[ok, bad, long, held],
        "JobID,JobName,State,ExitCode,NNodes",
    );
    assert_eq!(
        lines,
        [
            format!("{ok}|fine|COMPLETED|0:0|2"),
            format!("{ok}.batch|batch|COMPLETED|0:0|1"),
            format!("{ok}.0|hostname|COMPLETED|0:0|2"),
            // `srun -J` names its step.
            format!("{ok}.1|probe|COMPLETED|0:0|1"),
            format!("{bad}|broken|FAILED|3:0|1"),
            format!("{bad}.batch|batch|FAILED|3:0|1"),
            // As Slurm 22.05 with slurmdbd: the cancelled job's line
            // 0:0, its batch step's the signal, without who.
            format!("{long}|{}|CANCELLED by 0|0:0|2", name(&lines[6])),
            format!("{long}.batch|batch|CANCELLED|0:15|1"),
            format!("{held}|{}|CANCELLED by 0|0:0|1", name(&lines[8])),
        ],
    );
    // scontrol shows how the cancelled job's batch step died.
    let shown = env.ok(&["scontrol", "show", "job", &long.to_string()]);
    assert!(shown.contains("ExitCode=0:15"), "{shown}");
    // submitit's form: -j repeated; snakemake's: --clusters all, --name.
    let repeated = env.ok(&[
        "sacct",
        "-X",
        "-n",
        "--parsable2",
        "-o",
        "JobID,State",
        "-j",
        &ok.to_string(),
        "-j",
        &bad.to_string(),
    ]);
    assert_eq!(repeated, format!("{ok}|COMPLETED\n{bad}|FAILED\n"));
    let named = env.ok(&[
        "sacct",
        "-X",
        "-n",
        "--parsable2",
        "--clusters",
        "all",
        "--format=JobIdRaw,State",
        "--name",
        "broken",
        "-j",
        &format!("{ok},{bad}"),
    ]);
    assert_eq!(named, format!("{bad}|FAILED\n"));
    // Allocations only; GPUs in the TRES.
    let x: Vec<String> = env
        .ok(&[
            "sacct",
            "-X",
            "-P",
            "-n",
            "-o",
            "JobID,AllocTRES",
            "-j",
            &long.to_string(),
        ])
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(x.len(), 1, "{x:?}");
    assert!(
        x[0].contains("gres/gpu=2") && x[0].ends_with("node=2"),
        "{x:?}"
    );
    // The records reached the database (SQLite beside the state).
    let db = env.cluster.spec.dir.join("state").join("accounting.sqlite");
    wait_count(&format!("sqlite://{}", db.display()), 4, 30);
    // The default layout and an unknown job.
    let out = env.ok(&["sacct", "-j", &bad.to_string()]);
    assert!(
        out.starts_with("JobID           JobName  Partition"),
        "{out}"
    );
    assert_eq!(env.ok(&["sacct", "-n", "-j", "999999"]), "");
    let (code, _, err) = env.run(&["sacct", "-o", "JobID,Bogus"]);
    assert_eq!(code, 1);
    assert_eq!(
        err.trim(),
        "sacct: error: Invalid field requested: \"Bogus\""
    );
    // A query too large for the database's bound values: one line.
    let many: Vec<String> = (1..=10_001).map(|i| i.to_string()).collect();
    let (code, _, err) = env.run(&["sacct", "-j", &many.join(",")]);
    assert_eq!(code, 1);
    assert_eq!(
        err.trim(),
        "sacct: error: Too many jobs, users and states in one query (at most 10000)"
    );
}

#[test]
fn sacct_records_time_limits_and_memory_kills() {
    let env = Env::start(Opts {
        durable: true,
        nodes: 1,
        ..Opts::default()
    });
    let late = env.sbatch(
        &["-J", "late", "-t", "0:02"], // one minute: limits are whole minutes
        "#!/bin/sh\ntrap '' TERM\nsleep 300\n",
    );
    // Memory kills need the job's cgroup, so root.
    let hungry = corral_e2e::is_root().then(|| {
        env.sbatch(
            &["-J", "hungry", "--mem=32M"],
            "#!/bin/sh\ntail /dev/zero\n",
        )
    });
    env.wait_state(late, &["TIMEOUT", "FAILED", "COMPLETED"], 120);
    let mut ids = vec![late];
    if let Some(h) = hungry {
        env.wait_state(h, &["OUT_OF_MEMORY", "FAILED", "COMPLETED"], 60);
        ids.push(h);
    } else {
        eprintln!("SKIPPED (needs root): sacct of a job killed for memory");
    }
    let lines = sacct(&env, &ids, "JobID,JobName,State,ExitCode");
    // The time limit's SIGTERM was ignored: SIGKILL ended it. As Slurm
    // 22.05's slurmdbd records it: the job's line 0:0, its batch step
    // CANCELLED with the signal.
    let mut want = vec![
        format!("{late}|late|TIMEOUT|0:0"),
        format!("{late}.batch|batch|CANCELLED|0:9"),
    ];
    if let Some(h) = hungry {
        // As Slurm 22.05's slurmdbd records it (checked on one, with
        // task/cgroup): 0:125, whatever the shell made of the kill.
        want.push(format!("{h}|hungry|OUT_OF_MEMORY|0:125"));
        want.push(format!("{h}.batch|batch|OUT_OF_MEMORY|0:125"));
    }
    assert_eq!(lines, want);
}

#[test]
fn an_accounting_database_outage_loses_and_doubles_nothing() {
    let mut pg = match db::postgres() {
        Ok(pg) => pg,
        Err(why) => {
            println!("SKIPPED: {why}");
            return;
        }
    };
    let mut env = Env::start(Opts {
        durable: true,
        extra_config: format!("\n[accounting]\nurl = \"{}\"\n", pg.url),
        ..Opts::default()
    });
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(env.sbatch(&[], "#!/bin/sh\ntrue\n"));
    }
    for &j in &ids {
        env.wait_state(j, &["COMPLETED"], 60);
    }
    wait_count(&pg.url, 3, 30);
    // The database goes away: jobs still run and finish.
    pg.stop();
    for _ in 0..3 {
        ids.push(env.sbatch(&[], "#!/bin/sh\ntrue\n"));
    }
    for &j in &ids[3..] {
        env.wait_state(j, &["COMPLETED"], 60);
    }
    let (code, _, err) = env.run(&["sacct", "-j", &ids[0].to_string()]);
    assert_eq!(code, 1);
    assert!(err.contains("Problem talking to the database"), "{err}");
    // The controller dies with records waiting; they wait in its state.
    env.cluster.kill_ctld(nix::sys::signal::Signal::SIGKILL);
    env.cluster.restart_ctld().expect("ctld starts again");
    pg.start().expect("the database starts again");
    wait_count(&pg.url, 6, 60);
    let lines = sacct(&env, &ids, "JobID,State");
    let jobs: Vec<&String> = lines.iter().filter(|l| !l.contains('.')).collect();
    assert_eq!(jobs.len(), 6, "{lines:?}");
    assert!(
        jobs.iter().all(|l| l.ends_with("|COMPLETED")),
        "{lines:?}\n{}",
        pg.log()
    );
}

/// `--wait`, `--comment`, `--mail-type`/`--mail-user`, time limits in
/// whole minutes, and an input environment variable between `#SBATCH`
/// and the command line, through the real commands.
#[test]
fn sbatch_options_scripts_rely_on() {
    let env = Env::start(Opts {
        durable: true,
        nodes: 1,
        ..Opts::default()
    });
    // --wait: sbatch's exit is the job's; a signal's end is 1.
    let run = |args: &[&str]| {
        let mut a = vec!["sbatch"];
        a.extend_from_slice(args);
        env.run(&a)
    };
    let (code, out, err) = run(&[
        "--wait",
        "--comment",
        "sweep 3",
        "--mail-type=end,FAIL",
        "--mail-user=ada@example.com",
        "--wckey=submitit",
        "-A",
        "ml",
        "--wrap",
        "exit 3",
    ]);
    assert_eq!(code, 3, "{err}");
    let id: u64 = out
        .trim()
        .strip_prefix("Submitted batch job ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(
        sacct(&env, &[id], "JobID,State,ExitCode,Comment,Account,WCKey")[0],
        format!("{id}|FAILED|3:0|sweep 3|ml|submitit")
    );
    let squeued = env.ok(&[
        "squeue",
        "-h",
        "-t",
        "all",
        "-j",
        &id.to_string(),
        "-o",
        "%k|%w",
    ]);
    assert_eq!(squeued.trim(), "sweep 3|submitit");
    let (code, _, err) = run(&["-W", "--wrap", "kill -9 $$"]);
    assert_eq!(code, 1, "{err}");
    let (code, _, err) = run(&["--mail-type=SOMETIMES", "--wrap", "true"]);
    assert_eq!(code, 1);
    assert_eq!(err.trim(), "sbatch: error: --mail-type=SOMETIMES invalid");
    // Limits are whole minutes; 0 is none.
    let limit = |args: &[&str], vars: &[(&str, &str)]| {
        let mut a = vec!["sbatch", "--parsable", "-H"];
        a.extend_from_slice(args);
        a.extend_from_slice(&["--wrap", "true"]);
        let o = env
            .cmd(&a)
            .envs(vars.iter().copied())
            .output()
            .expect("sbatch");
        let (code, out, err) = corral_e2e::out(o);
        assert_eq!(code, 0, "{err}");
        let id = out.trim().to_string();
        env.ok(&["squeue", "-h", "-j", &id, "-o", "%l"])
            .trim()
            .to_string()
    };
    assert!(limit(&["-t", "5:30"], &[]).ends_with("6:00"));
    assert_eq!(limit(&["-t", "0"], &[]), "UNLIMITED");
    assert!(limit(&[], &[("SBATCH_TIMELIMIT", "20")]).ends_with("20:00"));
    assert!(limit(&["-t", "30"], &[("SBATCH_TIMELIMIT", "20")]).ends_with("30:00"));
    let (code, _, err) = corral_e2e::out(
        env.cmd(&["sbatch", "--wrap", "true"])
            .env("SBATCH_TIMELIMIT", "soon")
            .output()
            .expect("sbatch"),
    );
    assert_eq!(code, 1);
    assert!(
        err.contains("invalid time limit specification: soon"),
        "{err}"
    );
    env.ok(&["scancel", "-t", "PENDING"]);
    // --open-mode=append keeps what the file had; the default truncates.
    let (code, _, _) = run(&["-W", "--open-mode=append", "-o", "log2", "--wrap", "echo a"]);
    assert_eq!(code, 0);
    run(&["-W", "--open-mode=append", "-o", "log2", "--wrap", "echo b"]);
    assert_eq!(env.read("log2"), "a\nb\n");
    run(&["-W", "-o", "log2", "--wrap", "echo c"]);
    assert_eq!(env.read("log2"), "c\n");
}
