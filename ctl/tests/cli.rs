//! The corral binary without a cluster: commands that need none, and
//! mistakes that must read as one line.

use std::process::Command;

fn corral(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(args)
        .env("CORRAL_AGENT_SOCKET", "/nonexistent/agent.sock")
        .output()
        .expect("running corral");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn certs_init_and_issue() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    assert_eq!(corral(&["certs", "init", d]).0, 0);
    let (code, _, err) = corral(&["certs", "init", d]);
    assert_eq!(code, 1);
    assert!(
        err.starts_with("corral certs: error:") && err.contains("already exists"),
        "{err}"
    );
    assert_eq!(corral(&["certs", "issue", d, "worker-0"]).0, 0);
    assert_eq!(corral(&["certs", "issue", d, "corral-ctld"]).0, 0);
    for f in [
        "ca.pem",
        "ca.key",
        "worker-0.pem",
        "worker-0.key",
        "corral-ctld.pem",
    ] {
        assert!(dir.path().join(f).exists(), "{f}");
    }
}

#[test]
fn no_agent_and_bad_commands_are_one_line() {
    let (code, _, err) = corral(&["squeue"]);
    assert_eq!(code, 1);
    assert!(
        err.starts_with("squeue: error: Unable to contact slurm controller"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1);
    let (code, _, err) = corral(&["sbatch", "--wrap", "true"]);
    assert_eq!(code, 1);
    assert!(
        err.starts_with("sbatch: error: Batch job submission failed: Unable to contact"),
        "{err}"
    );
    let (code, _, err) = corral(&["frobnicate"]);
    assert_ne!(code, 0);
    assert!(
        err.starts_with("corral: error: unknown command frobnicate"),
        "{err}"
    );
    let (code, _, err) = corral(&["up", "--nodes", "0"]);
    assert_eq!(code, 1);
    assert!(err.starts_with("corral up: error:"), "{err}");
}

#[test]
fn ctld_refuses_bad_flags_and_configs_in_one_line() {
    let ctld = env!("CARGO_BIN_EXE_corral-ctld");
    let run = |args: &[&str]| {
        let o = Command::new(ctld)
            .args(args)
            .output()
            .expect("running corral-ctld");
        (
            o.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, err) = run(&["--bogus"]);
    assert_eq!(code, 2);
    assert!(
        err.starts_with("corral-ctld: error: unexpected argument"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("corral.toml");
    std::fs::write(&conf, "[[partition]]\nname = \"p\"\nnodes = \"w-[9-1]\"\n").unwrap();
    let (code, err) = run(&["--config", conf.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(
        err.starts_with("corral-ctld: error:") && err.contains("partition p"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    // Valid config, but no certificates where it says.
    std::fs::write(
        &conf,
        format!(
            "certs = \"{}\"\n[[partition]]\nname = \"p\"\nnodes = \"ALL\"\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let (code, err) = run(&[
        "--config",
        conf.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
    ]);
    assert_eq!(code, 1);
    assert!(err.contains("certificates in"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

/// `scontrol show hostnames $SLURM_JOB_NODELIST | head -n1` under `set -o
/// pipefail` (the MASTER_ADDR line of multi-node training scripts): the
/// reader leaving early is not the command's failure (it died of SIGPIPE,
/// 141, in 3 of 6 runs with 256 names), for a list that fits a pipe's
/// buffer and for one far larger, whose write meets EPIPE.
#[test]
fn a_reader_that_stops_early_ends_the_command_quietly() {
    for (list, runs) in [("node[0-255]", 20), ("node[0-199999]", 5)] {
        for _ in 0..runs {
            let o = Command::new("bash")
                .arg("-c")
                .arg(r#"set -o pipefail; "$0" scontrol show hostnames "$1" | head -n1"#)
                .arg(env!("CARGO_BIN_EXE_corral"))
                .arg(list)
                .output()
                .expect("bash");
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(0), "{list}: {err}");
            assert_eq!(String::from_utf8_lossy(&o.stdout), "node0\n");
            assert!(err.is_empty(), "{list}: {err}");
        }
    }
}

#[test]
fn jail_init_debootstrap_runs_debootstrap_or_says_it_is_missing() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("dir");
    // Without debootstrap anywhere on PATH (an empty PATH still finds the
    // system directories, so only check where it is truly absent).
    if shared_root::scaffold::find_program("debootstrap").is_none() {
        let o = Command::new(env!("CARGO_BIN_EXE_corral"))
            .args(["jail", "init", "--debootstrap", "bookworm"])
            .arg(dir.path().join("a"))
            .output()
            .expect("corral");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1));
        assert!(err.contains("debootstrap is not installed"), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
    // A stand-in debootstrap records how it was called.
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).expect("bin");
    let fake = bin.join("debootstrap");
    let log = dir.path().join("args");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\necho \"$@\" > {}\nmkdir -p \"$3/etc\"\n",
            log.display()
        ),
    )
    .expect("fake");
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let root = dir.path().join("root");
    let o = Command::new(env!("CARGO_BIN_EXE_corral"))
        .args([
            "jail",
            "init",
            "--debootstrap",
            "trixie",
            "--mirror",
            "http://deb.example/debian",
        ])
        .arg(&root)
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .output()
        .expect("corral");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let args = std::fs::read_to_string(&log).expect("debootstrap ran");
    assert_eq!(
        args.trim(),
        format!(
            "--variant=minbase trixie {} http://deb.example/debian",
            root.display()
        )
    );
    for d in ["proc", "sys", "dev", "tmp", "run", "home"] {
        assert!(root.join(d).is_dir(), "{d}");
    }
    // Flags that do not go together are one line too.
    let o = Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(["jail", "init", "--busybox", "--debootstrap", "x", "/tmp/x"])
        .output()
        .expect("corral");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot be used with"), "{err}");
}
