//! `corral up` itself: a cluster from one command, for any user.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use corral_e2e::{bin_dir, is_root, out};

#[test]
fn corral_up_runs_a_command_against_a_fresh_cluster_as_a_normal_user() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    // The binaries where any user can reach them.
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    for b in ["corral", "corral-ctld", "corral-agent"] {
        std::fs::copy(bin_dir().join(b), bin.join(b)).unwrap();
    }
    let script = "srun -N2 -l sh -c 'id -u' && j=$(sbatch --parsable --wrap 'echo batch ran') && \
        while [ -n \"$(squeue -h -j $j -t PD,R,CG)\" ]; do sleep 0.1; done && cat slurm-$j.out && \
        scontrol update NodeName=worker-1 State=DRAIN Reason=mine && sinfo -h -t drain && exit 3";
    let mut c = Command::new(bin.join("corral"));
    c.args([
        "up",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--",
        "sh",
        "-c",
        script,
    ])
    .current_dir(tmp.path())
    .env("TMPDIR", tmp.path());
    let uid = if is_root() {
        c.uid(23_458).gid(23_458);
        23_458
    } else {
        nix::unistd::getuid().as_raw()
    };
    let (code, o, e) = out(c.output().unwrap());
    assert_eq!(code, 3, "the command's exit code is corral up's: {e}");
    let lines: Vec<&str> = o.lines().collect();
    assert_eq!(lines.len(), 4, "{o}\n{e}");
    assert!(
        lines[..2].iter().all(|l| l.ends_with(&format!(": {uid}"))),
        "{o}"
    );
    assert_eq!(lines[2], "batch ran");
    // The invoking user operates their own cluster.
    assert!(
        lines[3].contains("drain") && lines[3].ends_with("worker-1"),
        "{o}"
    );
    // Its temporary directory is gone afterwards.
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("corral-up-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn ctrl_c_under_corral_up_reaches_the_tasks_not_the_cluster() {
    use nix::sys::signal::{killpg, Signal};
    use nix::unistd::Pid;
    let tmp = tempfile::tempdir().unwrap();
    let out_file = tmp.path().join("out.txt");
    // Started with SIGINT ignored (as from a background shell): tasks must
    // still get default handling. The terminal's Ctrl-C is a SIGINT to the
    // whole foreground process group.
    let inner =
        "srun sh -c 'trap \"echo task got INT; exit 5\" INT; sleep 30 & wait'; echo srun=\\$?";
    let script = format!(
        "trap '' INT; exec {} up --nodes 1 --gpus-per-node 1 -- sh -c \"trap '' INT; {}\"",
        bin_dir().join("corral").display(),
        inner.replace('"', "\\\"")
    );
    let mut child = Command::new("sh")
        .args(["-c", &script])
        .current_dir(tmp.path())
        .env("TMPDIR", tmp.path())
        .stdout(std::fs::File::create(&out_file).unwrap())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let pgid = Pid::from_raw(child.id() as i32);
    let t0 = std::time::Instant::now();
    // Wait until the task runs (its job shows up as running).
    loop {
        let running = std::fs::read_dir(tmp.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .any(|e| e.file_name().to_string_lossy().starts_with("corral-up-"));
        if running && t0.elapsed() > std::time::Duration::from_secs(3) {
            break;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(60),
            "cluster never came up"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    killpg(pgid, Signal::SIGINT).unwrap();
    let st = child.wait().unwrap();
    let out = std::fs::read_to_string(&out_file).unwrap();
    assert!(out.contains("task got INT"), "{out}");
    assert!(
        out.contains("srun=5"),
        "srun reports the task's exit: {out}"
    );
    assert_eq!(st.code(), Some(0), "{out}");
}
