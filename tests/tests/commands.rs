//! squeue, sinfo, scontrol and scancel on a cluster in a known state:
//! each row an invocation and the exact output expected, written from
//! Slurm's man pages and settled against Slurm 22.05 where a detail was
//! unclear (the field-by-field table of values is in the CLI's unit tests;
//! these rows check the options through the real binaries).

use std::time::Duration;

use corral_e2e::{Env, Opts};

/// Replaces `{NAME}` placeholders with their values.
fn fill(text: &str, vars: &[(&str, String)]) -> String {
    let mut s = text.to_string();
    for (k, v) in vars {
        s = s.replace(&format!("{{{k}}}"), v);
    }
    s
}

/// Runs each row (`corral` arguments, placeholders filled) and checks its
/// exit code and standard output exactly; returns the rows that differ.
fn check(env: &Env, vars: &[(&str, String)], rows: &[(&[&str], i32, &str)]) -> Vec<String> {
    let mut bad = Vec::new();
    for (args, code, want) in rows {
        let args: Vec<String> = args.iter().map(|a| fill(a, vars)).collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (got_code, out, err) = env.run(&args);
        let want = fill(want, vars);
        if got_code != *code || out != want {
            bad.push(format!(
                "{args:?}: exit {got_code} (want {code})\n--- got\n{out}--- want\n{want}--- stderr\n{err}"
            ));
        }
    }
    bad
}

/// Three jobs in a state that does not change while the rows run: two held
/// (one depending on the other), one running a long sleep on worker-1.
fn known_state(env: &Env) -> Vec<(&'static str, String)> {
    let submit = |args: &[&str]| -> String {
        let mut a = vec!["sbatch", "--parsable"];
        a.extend_from_slice(args);
        env.ok(&a).trim().to_string()
    };
    let a = submit(&[
        "-H",
        "-J",
        "alpha",
        "-A",
        "acct1",
        "--nice=3",
        "-t",
        "30",
        "-c",
        "2",
        "--mem=2G",
        "--comment=c1",
        "--wrap",
        "true",
    ]);
    let b = submit(&[
        "-H",
        "-J",
        "beta",
        "-t",
        "1-00:00",
        "-N",
        "2",
        "--mem-per-cpu=500",
        "--exclusive",
        "-x",
        "worker-0",
        "--wrap",
        "true",
    ]);
    let c = submit(&[
        "-J",
        "gamma",
        "-t",
        "10",
        "--gres=gpu:2",
        "-w",
        "worker-1",
        "--wrap",
        "sleep 300",
    ]);
    let d = submit(&[
        "-H",
        "-J",
        "delta",
        "-d",
        &format!("afterok:{a}"),
        "--wrap",
        "true",
    ]);
    env.wait_state(c.parse().expect("job id"), &["RUNNING"], 20);
    vec![
        ("A", a),
        ("B", b),
        ("C", c),
        ("D", d),
        ("WORK", env.work.to_string_lossy().into_owned()),
    ]
}

#[test]
fn squeue_options_and_formats() {
    let env = Env::start(Opts {
        nodes: 3,
        ..Opts::default()
    });
    let vars = known_state(&env);
    #[rustfmt::skip]
    let rows: &[(&[&str], i32, &str)] = &[
        (&["squeue", "-h", "-S", "j", "-o", "%j|%t|%r|%D|%m|%c|%b|%a|%y|%h|%k|%l|%n|%x|%E"], 0,
         "alpha|PD|JobHeldUser|1|2G|2|N/A|acct1|3|OK|c1|30:00|||(null)\n\
          beta|PD|JobHeldUser|2|500M|1|N/A|default|0|NO|(null)|1-00:00:00||worker-0|(null)\n\
          delta|PD|JobHeldUser|1|0|1|N/A|default|0|OK|(null)|UNLIMITED|||afterok:{A}(unfulfilled)\n\
          gamma|R|None|1|0|1|gres:gpu:2|default|0|OK|(null)|10:00|worker-1||(null)\n"),
        // Sorting: descending ids; state descending then name.
        (&["squeue", "-h", "-S", "-i", "-o", "%i"], 0, "{D}\n{C}\n{B}\n{A}\n"),
        (&["squeue", "-h", "-S", "-t,j", "-o", "%j"], 0, "gamma\nalpha\nbeta\ndelta\n"),
        // The default order: partition, state, priority, id.
        (&["squeue", "-h", "-o", "%j"], 0, "alpha\nbeta\ndelta\ngamma\n"),
        // Filters the controller does not know: account, QOS, nodes.
        (&["squeue", "-h", "-A", "acct1", "-o", "%j"], 0, "alpha\n"),
        (&["squeue", "-h", "-q", "normal", "-S", "j", "-o", "%j"], 0, "alpha\nbeta\ndelta\ngamma\n"),
        (&["squeue", "-h", "-q", "high", "-o", "%j"], 0, ""),
        (&["squeue", "-h", "-w", "worker-[0-1]", "-o", "%j"], 0, "gamma\n"),
        (&["squeue", "-h", "--me", "-t", "R", "-o", "%j"], 0, "gamma\n"),
        (&["squeue", "-h", "-t", "PD", "-n", "beta,delta", "-o", "%j"], 0, "beta\ndelta\n"),
        // -O: names, widths, right-justification; values padded, no gaps.
        (&["squeue", "-j", "{C}", "-O", "Name:8,StateCompact:.4,tres-per-node,NodeList:0"], 0,
         "NAME      STTRES_PER_NODE       NODELIST\n\
          gamma      Rgres:gpu:2          worker-1\n"),
        // Steps: the batch step of the running job.
        (&["squeue", "-h", "-s", "-o", "%i %j %N %A"], 0, "{C}.batch batch worker-1 1\n"),
        (&["squeue", "-h", "-s", "{C}.0", "-o", "%i"], 0, ""),
        // --start: pending jobs only, by start time.
        (&["squeue", "-h", "--start", "-o", "%j %S", "-n", "alpha"], 0, "alpha N/A\n"),
        (&["squeue", "-h", "-o", "%Z %o", "-j", "{A}"], 0, "{WORK} (null)\n"),
        // Bad input: one line, exit 1.
        (&["squeue", "-O", "Bogus"], 1, ""),
        (&["squeue", "-S", "i="], 1, ""),
        (&["squeue", "-o", "%i", "-O", "jobid"], 1, ""),
        (&["squeue", "-w", "worker-[2-1]"], 1, ""),
    ];
    let mut bad = check(&env, &vars, rows);
    // -l: the state spelled out and the time limit, in Slurm's columns.
    let long = format!(
        "{:>18} {:>9} {:>8} {:>8} {:>8} {:>10} {:>9} {:>6} {}\n",
        vars[0].1, "gpu", "alpha", "root", "PENDING", "0:00", "30:00", 1, "(JobHeldUser)"
    );
    bad.extend(check(
        &env,
        &vars,
        &[(&["squeue", "-h", "-l", "-j", "{A}"], 0, &long)],
    ));
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    // SQUEUE_FORMAT and SQUEUE_SORT fill what the command line leaves out.
    let out = env
        .cmd(&["squeue", "-h", "-t", "PD"])
        .env("SQUEUE_FORMAT", "%j:%t")
        .env("SQUEUE_SORT", "-j")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "delta:PD\nbeta:PD\nalpha:PD\n"
    );
    // SLURM_TIME_FORMAT: the submit time in the format given.
    let out = env
        .cmd(&["squeue", "-h", "-j", &vars[0].1, "-o", "%V"])
        .env("SLURM_TIME_FORMAT", "%Y/%s")
        .output()
        .unwrap();
    let v = String::from_utf8_lossy(&out.stdout);
    let (year, secs) = v.trim().split_once('/').expect("YEAR/SECS");
    assert!(year.len() == 4 && secs.parse::<u64>().is_ok(), "{v}");
    // A finished job named by id: the header alone, unless -t says.
    let done = env
        .ok(&["sbatch", "--parsable", "--wrap", "true"])
        .trim()
        .to_string();
    env.wait_state(done.parse().expect("job id"), &["COMPLETED"], 20);
    assert_eq!(env.ok(&["squeue", "-j", &done, "-o", "%i"]), "JOBID\n");
    assert_eq!(
        env.ok(&["squeue", "-h", "-j", &done, "-t", "all", "-o", "%T"]),
        "COMPLETED\n"
    );
    // -i prints again and again until stopped.
    let mut child = env
        .cmd(&["squeue", "-i", "1", "-o", "%i"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.matches("JOBID").count() >= 2, "{text}");
}

/// The `Key=Value` pairs of one `scontrol -o` record.
fn pairs(line: &str) -> Vec<(String, String)> {
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn scontrol_shows_and_manages_as_slurm_does() {
    let env = Env::start(Opts {
        nodes: 3,
        ..Opts::default()
    });
    let vars = known_state(&env);
    let (a, c) = (vars[0].1.clone(), vars[2].1.clone());
    // One record per line with -o, every key Slurm prints for a job.
    let held = env.ok(&["scontrol", "-o", "show", "job", &a]);
    assert_eq!(held.lines().count(), 1, "{held}");
    // Slurm takes the option after the command too.
    let after = env.ok(&["scontrol", "show", "job", &a, "-o"]);
    assert_eq!(pairs(&after).len(), pairs(&held).len(), "{after}");
    assert_eq!(after.lines().count(), 1, "{after}");
    let keys: Vec<String> = pairs(&held).into_iter().map(|(k, _)| k).collect();
    for key in [
        "JobId",
        "JobName",
        "UserId",
        "GroupId",
        "MCS_label",
        "Priority",
        "Nice",
        "Account",
        "QOS",
        "JobState",
        "Reason",
        "Dependency",
        "Requeue",
        "Restarts",
        "BatchFlag",
        "Reboot",
        "ExitCode",
        "RunTime",
        "TimeLimit",
        "TimeMin",
        "SubmitTime",
        "EligibleTime",
        "AccrueTime",
        "StartTime",
        "EndTime",
        "Deadline",
        "SuspendTime",
        "SecsPreSuspend",
        "LastSchedEval",
        "Scheduler",
        "Partition",
        "AllocNode:Sid",
        "ReqNodeList",
        "ExcNodeList",
        "NodeList",
        "NumNodes",
        "NumCPUs",
        "NumTasks",
        "CPUs/Task",
        "ReqB:S:C:T",
        "TRES",
        "Socks/Node",
        "NtasksPerN:B:S:C",
        "CoreSpec",
        "MinCPUsNode",
        "MinMemoryNode",
        "MinTmpDiskNode",
        "Features",
        "DelayBoot",
        "OverSubscribe",
        "Contiguous",
        "Licenses",
        "Network",
        "Command",
        "WorkDir",
        "Comment",
        "StdErr",
        "StdIn",
        "StdOut",
        "Power",
    ] {
        assert!(keys.iter().any(|k| k == key), "{key} missing from {held}");
    }
    let get = |rec: &str, key: &str| {
        pairs(rec)
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
            .unwrap_or_default()
    };
    assert_eq!(get(&held, "Nice"), "3");
    assert_eq!(get(&held, "Account"), "acct1");
    // Command: a script's path as sbatch found it, with its arguments;
    // `(null)` for --wrap, as Slurm's.
    assert_eq!(get(&held, "Command"), "(null)");
    std::fs::write(env.work.join("named.sh"), "#!/bin/sh\ntrue\n").unwrap();
    let named = env.ok(&["sbatch", "--parsable", "-H", "named.sh", "one", "two"]);
    let shown = env.ok(&["scontrol", "show", "job", named.trim()]);
    let want = format!(
        "   Command={} one two\n",
        env.work.join("named.sh").display()
    );
    assert!(shown.contains(&want), "{shown}");
    env.ok(&["scancel", named.trim()]);
    assert_eq!(get(&held, "TimeLimit"), "00:30:00");
    assert_eq!(get(&held, "MinMemoryNode"), "2G");
    assert_eq!(get(&held, "MinCPUsNode"), "2");
    let work = env.work.to_string_lossy();
    assert_eq!(get(&held, "StdOut"), format!("{work}/slurm-{a}.out"));
    // The running job: its batch host and its batch step.
    let run = env.ok(&["scontrol", "-o", "show", "job", &c]);
    assert_eq!(get(&run, "BatchHost"), "worker-1");
    assert_eq!(get(&run, "TresPerNode"), "gres:gpu:2");
    let steps = env.ok(&["scontrol", "-o", "show", "steps", &c]);
    assert!(steps.starts_with(&format!("StepId={c}.batch ")), "{steps}");
    assert_eq!(get(&steps, "NodeList"), "worker-1");
    // show config: the keys scripts read.
    let cfg = env.ok(&["scontrol", "show", "config"]);
    assert!(cfg.starts_with("Configuration data as of "), "{cfg}");
    for key in [
        "ClusterName",
        "MinJobAge",
        "MaxJobCount",
        "SlurmctldHost[0]",
        "SlurmctldPort",
    ] {
        assert!(
            cfg.lines().any(|l| l.starts_with(key) && l.contains(" = ")),
            "{key} not in {cfg}"
        );
    }
    let one = env.ok(&["scontrol", "show", "config", "MinJobAge"]);
    assert_eq!(one.lines().count(), 2, "{one}");
    assert!(env.ok(&["scontrol", "ping"]).ends_with(" is UP\n"));
    // uhold by root is a user hold; hold by root an admin hold. (Job B
    // needs worker-1, which the running job keeps busy.)
    let b = vars[1].1.clone();
    env.ok(&["scontrol", "release", &b]);
    env.ok(&["scontrol", "uhold", &b]);
    assert_eq!(
        env.ok(&["squeue", "-h", "-j", &b, "-o", "%r"]),
        "JobHeldUser\n"
    );
    env.ok(&["scontrol", "release", &b]);
    env.ok(&["scontrol", "hold", &b]);
    assert_eq!(
        env.ok(&["squeue", "-h", "-j", &b, "-o", "%r"]),
        "JobHeldAdmin\n"
    );
    // update JobId=: a pending job's request changes.
    env.ok(&[
        "scontrol",
        "update",
        &format!("JobId={b}"),
        "TimeLimit=2:00:00",
        "Name=beta2",
        "Nice=7",
        "Comment=moved",
    ]);
    assert_eq!(
        env.ok(&["squeue", "-h", "-j", &b, "-o", "%j|%l|%y|%k|%r"]),
        "beta2|2:00:00|7|moved|JobHeldAdmin\n"
    );
    let (code, _, e) = env.run(&["scontrol", "update", &format!("JobId={c}"), "Nice=1"]);
    assert_eq!(
        (code, e.as_str()),
        (
            1,
            format!("scontrol: error: Job is no longer pending execution for job {c}\n").as_str()
        )
    );
    // A running job's limit: shorter by anyone who owns it.
    env.ok(&["scontrol", "update", &format!("JobId={c}"), "TimeLimit=5"]);
    assert_eq!(env.ok(&["squeue", "-h", "-j", &c, "-o", "%l"]), "5:00\n");
    let (code, _, e) = env.run(&["scontrol", "update", &format!("JobId={b}"), "Color=red"]);
    assert!(
        code == 1 && e.contains("Update of this parameter is not supported"),
        "{e}"
    );
    // Errors: Slurm's words, exit 1.
    for (args, err) in [
        (
            vec!["scontrol", "show", "job", "424242"],
            "slurm_load_jobs error: Invalid job id specified\n",
        ),
        (
            vec!["scontrol", "show", "bogus"],
            "scontrol: error: invalid entity:bogus for keyword:show\n",
        ),
        (
            vec!["scontrol", "show", "job", "1", "2"],
            "scontrol: error: too many arguments for keyword:show\n",
        ),
    ] {
        let (code, out, e) = env.run(&args);
        assert_eq!((code, out.as_str(), e.as_str()), (1, "", err), "{args:?}");
    }
    for (verb, why) in [
        ("suspend", "Job is pending execution"),
        ("resume", "Job is pending execution"),
    ] {
        let (code, out, e) = env.run(&["scontrol", verb, &b]);
        let want = format!("scontrol: error: {why} for job {b}\n");
        assert_eq!((code, out.as_str()), (1, ""), "{verb}");
        assert_eq!(e, want, "{verb}");
    }
    let (code, _, e) = env.run(&["scontrol", "resume", &c]);
    assert_eq!(
        (code, e),
        (
            1,
            format!("scontrol: error: Job is not suspended for job {c}\n")
        )
    );
    // reconfigure: corral.toml read again, applied without a restart.
    let toml = env.cluster.spec.dir.join("corral.toml");
    let text = std::fs::read_to_string(&toml).unwrap();
    let kill_wait = text
        .lines()
        .find(|l| l.starts_with("kill_wait"))
        .expect("kill_wait in corral.toml")
        .to_string();
    std::fs::write(&toml, text.replace(&kill_wait, "kill_wait = 7")).unwrap();
    env.ok(&["scontrol", "reconfigure"]);
    assert!(
        env.ok(&["scontrol", "show", "config", "KillWait"])
            .ends_with("= 7 sec\n"),
        "kill_wait not applied"
    );
    assert!(env.state(b.parse().unwrap()) == "PENDING", "jobs are kept");
    // A broken file changes nothing and says why, in one line.
    std::fs::write(&toml, "this is = = not toml").unwrap();
    let (code, _, e) = env.run(&["scontrol", "reconfigure"]);
    assert!(code == 1 && e.lines().count() == 1, "{code} {e}");
    std::fs::write(&toml, text.replace(&kill_wait, "kill_wait = 7")).unwrap();
    // A node drained while idle, as Slurm writes it.
    env.ok(&[
        "scontrol",
        "update",
        "NodeName=worker-2",
        "State=DRAIN",
        "Reason=fan",
    ]);
    let node = env.ok(&["scontrol", "-o", "show", "node", "worker-2"]);
    assert_eq!(get(&node, "State"), "IDLE+DRAIN");
    // The agent's kernel, as `uname -srv` (Slurm's OS=).
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("release");
    assert!(
        node.contains(&format!(" OS=Linux {} ", release.trim())),
        "{node}"
    );
    assert!(node.contains(" Reason=fan [root@"), "{node}");
    // State=FAIL: its own word and flag; sinfo -t selects it by name.
    env.ok(&[
        "scontrol",
        "update",
        "NodeName=worker-2",
        "State=FAIL",
        "Reason=flaky",
    ]);
    let node = env.ok(&["scontrol", "-o", "show", "node", "worker-2"]);
    assert_eq!(get(&node, "State"), "IDLE+FAIL");
    let failed = env.ok(&["sinfo", "-h", "-N", "-t", "fail", "-o", "%N %t %T %E"]);
    assert_eq!(failed, "worker-2 fail fail flaky\n");
    env.ok(&["scontrol", "update", "NodeName=worker-2", "State=RESUME"]);
}

#[test]
fn scancel_selects_as_slurm_does() {
    use std::io::Write;
    let env = Env::start(Opts {
        nodes: 3,
        ..Opts::default()
    });
    let vars = known_state(&env);
    let (a, b, c, d) = (
        vars[0].1.clone(),
        vars[1].1.clone(),
        vars[2].1.clone(),
        vars[3].1.clone(),
    );
    let state = |id: &str| env.state(id.parse().expect("job id"));
    // -i: the answer decides, one question per job.
    let ask = |answer: &str| {
        let mut child = env
            .cmd(&["scancel", "-i", &d])
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(answer.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let question = ask("n\n");
    assert_eq!(
        question,
        format!("Cancel job_id={d} name=delta partition=gpu [y/n]? ")
    );
    assert_eq!(state(&d), "PENDING");
    ask("y\n");
    assert_eq!(state(&d), "CANCELLED");
    // -A: only that account's jobs.
    env.ok(&["scancel", "-A", "acct1"]);
    assert_eq!(state(&a), "CANCELLED");
    assert_eq!(state(&b), "PENDING");
    // -w: only jobs on those nodes; -v says what it does.
    let (code, _, err) = env.run(&["scancel", "-v", "-w", "worker-1"]);
    assert_eq!(
        (code, err.as_str()),
        (0, format!("scancel: Terminating job {c}\n").as_str())
    );
    env.wait_state(c.parse().unwrap(), &["CANCELLED"], 20);
    assert_eq!(state(&b), "PENDING");
    // States as a list; --me.
    env.ok(&["scancel", "--me", "--state=PD,R"]);
    assert_eq!(state(&b), "CANCELLED");
    // An array's tasks by index.
    let arr = env
        .ok(&[
            "sbatch",
            "--parsable",
            "-H",
            "--array=1-4",
            "--wrap",
            "true",
        ])
        .trim()
        .to_string();
    env.ok(&["scancel", &format!("{arr}_[1-2]")]);
    let left = env.ok(&["squeue", "-h", "-r", "-j", &arr, "-o", "%i"]);
    assert_eq!(left, format!("{arr}_3\n{arr}_4\n"));
    // Bad input: one line, exit 1.
    let (code, _, err) = env.run(&["scancel", "-w", "worker-[3-1]"]);
    assert!(code == 1 && err.lines().count() == 1, "{code} {err}");
}

/// `scontrol show|hold|release|update ARRAY_TASK` of a task still waiting
/// in its array's record, as Slurm 22.05 takes them (checked on one):
/// `show` prints the array's record for that task alone; the others
/// split the task off into a job of its own, which the command changes.
#[test]
fn scontrol_acts_on_one_waiting_array_task() {
    let env = Env::start(Opts {
        nodes: 1,
        ..Opts::default()
    });
    let arr: u64 = env
        .ok(&[
            "sbatch",
            "--parsable",
            "-H",
            "--array=0-3",
            "-o",
            "/dev/null",
            "--wrap",
            "true",
        ])
        .trim()
        .parse()
        .expect("array id");
    let task = |t: u32| format!("{arr}_{t}");
    let shown = env.ok(&["scontrol", "show", "job", &task(2)]);
    assert!(
        shown.starts_with(&format!("JobId={arr} ArrayJobId={arr} ArrayTaskId=2 ")),
        "{shown}"
    );
    env.ok(&[
        "scontrol",
        "update",
        &format!("JobId={}", task(3)),
        "TimeLimit=5",
    ]);
    env.ok(&["scontrol", "release", &task(2)]);
    // Task 2 (position 2) runs as job arr + 3, alone.
    assert_eq!(env.wait_state(arr + 3, &["COMPLETED"], 20), "COMPLETED");
    let left = env.ok(&["squeue", "-h", "-r", "-j", &arr.to_string(), "-o", "%i %r"]);
    assert_eq!(
        left,
        format!("{arr}_0 JobHeldUser\n{arr}_1 JobHeldUser\n{arr}_3 JobHeldUser\n")
    );
    let limit = env.ok(&["squeue", "-h", "-j", &task(3), "-o", "%l"]);
    assert_eq!(limit.trim(), "5:00");
    let (code, _, err) = env.run(&["scontrol", "hold", &task(9)]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}
