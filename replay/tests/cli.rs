//! corral-sim as a user runs it: a tiny trace in, one JSON object out; a
//! bad trace gets one line on stderr and a non-zero exit.

use std::process::Command;

fn sim(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_corral-sim"))
        .args(args)
        .output()
        .expect("corral-sim runs")
}

fn temp(name: &str, body: &str) -> String {
    let dir = std::env::temp_dir().join(format!("corral-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let p = dir.join(name);
    std::fs::write(&p, body).expect("write");
    p.display().to_string()
}

#[test]
fn replays_an_swf_trace_to_json() {
    let trace = temp(
        "tiny.swf",
        "; MaxProcs: 4\n; MaxNodes: 4\n\
         1 0 0 100 2 -1 -1 2 100 -1 1 1 1 -1 -1 -1 -1 -1\n\
         2 1 0 50 4 -1 -1 4 50 -1 1 2 2 -1 -1 -1 -1 -1\n\
         3 2 0 90 2 -1 -1 2 90 -1 1 1 1 -1 -1 -1 -1 -1\n",
    );
    let out = sim(&[&trace, "--policy", "easy", "--json", "--quiet"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let report: serde_json::Value = serde_json::from_str(text.trim()).expect("one JSON object");
    for key in [
        "jobs",
        "utilization",
        "mean_wait_s",
        "mean_bounded_slowdown",
        "max_wait_s",
        "makespan_s",
        "pass_p50_us",
        "pass_p99_us",
        "pass_max_us",
        "wall_s",
        "overrun",
        "overrun_jobs",
    ] {
        assert!(report.get(key).is_some(), "missing {key}: {text}");
    }
    assert_eq!(report["jobs"], 3);
    assert_eq!(
        report["overrun"], "extend",
        "the literature's convention by default"
    );
    assert_eq!(report["overrun_jobs"], 0);
    // Job 3 backfills into the gap before job 2's reservation.
    assert_eq!(report["mean_wait_s"].as_f64(), Some(99.0 / 3.0));
}

#[test]
fn a_broken_trace_is_one_line_and_a_failure() {
    let trace = temp("broken.swf", "1 2 three\n");
    let out = sim(&[&trace, "--quiet"]);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).expect("utf-8");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.starts_with("corral-sim: "), "{err}");
    let missing = sim(&["/no/such/trace.swf"]);
    assert!(!missing.status.success());
}

/// A job that ran 150 s of its 100 s request: by default it runs its
/// recorded time (its estimate raised); with `--overrun kill` it is cut at
/// its limit. Either way the report counts it.
#[test]
fn overruns_are_extended_by_default_or_killed() {
    let trace = temp(
        "over.swf",
        "; MaxProcs: 1\n; MaxNodes: 1\n\
         1 0 0 150 1 -1 -1 1 100 -1 1 1 1 -1 -1 -1 -1 -1\n",
    );
    let report = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec![trace.as_str(), "--json", "--quiet"];
        args.extend_from_slice(extra);
        let out = sim(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("one JSON object")
    };
    let extended = report(&[]);
    assert_eq!(extended["overrun_jobs"], 1);
    assert_eq!(extended["makespan_s"].as_f64(), Some(150.0));
    let killed = report(&["--overrun", "kill"]);
    assert_eq!(
        (&killed["overrun"], &killed["overrun_jobs"]),
        (&"kill".into(), &1.into())
    );
    assert_eq!(killed["makespan_s"].as_f64(), Some(100.0));
    let out = sim(&[&trace, "--overrun", "sideways", "--quiet"]);
    assert!(!out.status.success());
}
