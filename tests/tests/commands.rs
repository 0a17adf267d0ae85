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
          beta|PD|JobHeldUser|2|500M|1|N/A|(null)|0|NO|(null)|1-00:00:00||worker-0|(null)\n\
          delta|PD|JobHeldUser|1|0|1|N/A|(null)|0|OK|(null)|UNLIMITED|||afterok:{A}(unfulfilled)\n\
          gamma|R|None|1|0|1|gres:gpu:2|(null)|0|OK|(null)|10:00|worker-1||(null)\n"),
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
        (&["squeue", "-h", "-o", "%Z %o", "-j", "{A}"], 0, "{WORK} alpha\n"),
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
