//! `corral up` itself: a cluster from one command, for any user.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use corral_e2e::{bin_dir, is_root, out};

#[test]
fn corral_up_runs_a_command_against_a_fresh_cluster_as_a_normal_user() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    // Like /tmp: anyone may create, only owners may rename or remove.
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
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

/// Runs a batch job to completion inside `corral up`, from a script.
const BATCH_RUNS: &str = "j=$(sbatch --parsable --wrap 'echo batch ran') || exit 1; \
    for i in $(seq 200); do s=$(squeue -h -t all -j $j -o %T); \
    [ \"$s\" = COMPLETED ] && exit 0; [ \"$s\" = FAILED ] && exit 4; sleep 0.1; done; exit 5";

#[test]
fn a_relative_dir_works_and_the_logs_are_private() {
    use std::os::unix::fs::MetadataExt;
    let tmp = tempfile::tempdir().unwrap();
    let o = Command::new(bin_dir().join("corral"))
        .args([
            "up",
            "--nodes",
            "1",
            "--gpus-per-node",
            "0",
            "--dir",
            "cl",
            "--",
        ])
        .args(["sh", "-c", BATCH_RUNS])
        .current_dir(tmp.path())
        .output()
        .unwrap();
    let (code, _, e) = out(o);
    assert_eq!(code, 0, "the batch job failed under a relative --dir: {e}");
    let logs = tmp.path().join("cl").join("log");
    for name in ["ctld.log", "worker-0.log"] {
        let mode = std::fs::metadata(logs.join(name)).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600, "{name} is readable by others");
    }
}

#[test]
fn a_cluster_directory_others_can_write_is_refused_in_one_line() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let open = tmp.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let t0 = std::time::Instant::now();
    let o = Command::new(bin_dir().join("corral"))
        .args(["up", "--nodes", "1", "--gpus-per-node", "0", "--", "true"])
        .env("TMPDIR", &open)
        .output()
        .unwrap();
    let (code, _, e) = out(o);
    assert_eq!(code, 1, "{e}");
    assert!(e.contains("is writable by others"), "{e}");
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(20),
        "gave up only after {:?}",
        t0.elapsed()
    );
}

fn pid_of(dir: &std::path::Path, name: &str) -> i32 {
    std::fs::read_to_string(dir.join("pids").join(name))
        .unwrap_or_default()
        .trim()
        .parse()
        .unwrap_or(0)
}

fn alive(pid: i32) -> bool {
    pid > 0
        && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

#[test]
fn corral_up_restarts_a_killed_daemon_and_its_daemons_die_with_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cluster");
    // The command kills the controller and an agent, then works on: both
    // are back within seconds, with the job it submitted before.
    let script = format!(
        "j=$(sbatch --parsable -H --wrap true) && \
         kill -9 $(cat {d}/pids/ctld) $(cat {d}/pids/worker-1) && \
         for i in $(seq 100); do squeue -h -j $j >/dev/null 2>&1 && break; sleep 0.1; done && \
         for i in $(seq 100); do [ \"$(sinfo -h -N -t idle | wc -l)\" = 2 ] && break; sleep 0.1; done && \
         squeue -h -j $j -o %T && srun -N2 -l true && echo revived",
        d = dir.display()
    );
    let (code, o, e) = out(Command::new(bin_dir().join("corral"))
        .args(["up", "--nodes", "2", "--dir"])
        .arg(&dir)
        .args(["--", "sh", "-c", &script])
        .current_dir(tmp.path())
        .output()
        .unwrap());
    assert_eq!(code, 0, "{o}\n{e}");
    assert_eq!(o, "PENDING\nrevived\n", "{e}");
    assert!(
        e.contains("corral up: corral-ctld signal: 9 (SIGKILL); started again"),
        "{e}"
    );
    assert!(
        e.contains("corral up: worker-1's agent signal: 9 (SIGKILL); started again"),
        "{e}"
    );

    // `corral up` killed with SIGKILL: its daemons stop too.
    let dir = tmp.path().join("orphans");
    let mut up = Command::new(bin_dir().join("corral"))
        .args(["up", "--nodes", "2", "--dir"])
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // It prints the environment once the cluster is up.
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(up.stdout.take().unwrap()),
        &mut first,
    )
    .unwrap();
    let pids: Vec<i32> = ["ctld", "worker-0", "worker-1"]
        .iter()
        .map(|n| pid_of(&dir, n))
        .collect();
    assert!(pids.iter().all(|&p| alive(p)), "{pids:?}");
    up.kill().unwrap();
    up.wait().unwrap();
    let t0 = std::time::Instant::now();
    while pids.iter().any(|&p| alive(p)) {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "daemons outlived a killed corral up: {:?}",
            pids.iter().filter(|&&p| alive(p)).collect::<Vec<_>>()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
