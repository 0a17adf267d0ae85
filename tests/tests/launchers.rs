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
        .args(["install", "-q", "--disable-pip-version-check", package]))?;
    std::fs::write(&ready, package).map_err(|e| e.to_string())?;
    Ok(python)
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
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("launchers/submitit_check.py");
    let out = Command::new(python)
        .arg(script)
        .arg(env.work.join("submitit"))
        .envs(env.env())
        .current_dir(&env.work)
        .output()
        .expect("python runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}\n{err}");
    println!("{text}");
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
