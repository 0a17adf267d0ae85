//! Jobs in the shared root (`corral up --jail`), as root: every node's
//! jobs see the same root, not the host's, and the cluster's commands work
//! inside. Without root it says SKIPPED and checks nothing.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use corral_e2e::{is_root, Env, Opts};

#[test]
fn jobs_on_every_node_run_in_the_one_shared_root() {
    if !is_root() {
        println!("SKIPPED (needs root): jobs_on_every_node_run_in_the_one_shared_root");
        return;
    }
    let root = tempfile::tempdir().expect("root dir");
    shared_root::scaffold::host_usr(root.path(), "corral-e2e-jail").expect("a tiny root");
    let home = root.path().join("home");
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    let env = Env::start(Opts {
        nodes: 2,
        jail: Some(root.path().to_path_buf()),
        // The tiny root borrows the host's /usr for its shell and tools.
        jail_submounts: vec!["/usr:/usr:ro".into()],
        ..Opts::default()
    });
    // On worker-0: the jail's os-release, no host path, a file left in
    // the shared root, and the cluster's commands from inside. The job's
    // PID namespace: its steps see its processes (the batch shell's
    // background sleep), not the host's (the agent).
    let agent = env.cluster.agent_pid(0).expect("the agent's pid");
    let first = env.sbatch(
        &["-w", "worker-0", "-D", "/home", "-o", "first.out"],
        &format!(
            "#!/bin/sh\n\
             cat /etc/os-release\n\
             test -e /work || echo no-host-root\n\
             echo hello-from-worker-0 > /home/shared.txt\n\
             srun -N1 -w worker-0 echo srun-inside\n\
             scontrol show hostnames\n\
             sleep 30 &\n\
             srun -N1 -w worker-0 sh -c \"test -d /proc/$! && echo step-sees-the-batch\"\n\
             test -e /proc/{agent} && echo SEES-THE-AGENT || echo agent-hidden\n\
             grep -q pid-init /proc/1/cmdline && echo pid-1-is-the-holder\n\
             kill $!\n"
        ),
    );
    let st = env.wait_state(first, &["COMPLETED", "FAILED"], 60);
    let out = std::fs::read_to_string(home.join("first.out")).unwrap_or_default();
    let why = env.ok(&["scontrol", "show", "job", &first.to_string()]);
    assert_eq!(st, "COMPLETED", "{why}\n{out}");
    for line in [
        "ID=corral-e2e-jail",
        "no-host-root",
        "srun-inside",
        "worker-0",
        "step-sees-the-batch",
        "agent-hidden",
        "pid-1-is-the-holder",
    ] {
        assert!(out.lines().any(|l| l == line), "{line:?} in:\n{out}");
    }
    // On worker-1: the same root, so the file is there.
    let second = env.sbatch(
        &["-w", "worker-1", "-D", "/home", "-o", "second.out"],
        "#!/bin/sh\ncat /home/shared.txt\nls /dev\n",
    );
    let st = env.wait_state(second, &["COMPLETED", "FAILED"], 60);
    let out = std::fs::read_to_string(home.join("second.out")).unwrap_or_default();
    let why = env.ok(&["scontrol", "show", "job", &second.to_string()]);
    assert_eq!(st, "COMPLETED", "{why}\n{out}");
    assert!(out.contains("hello-from-worker-0"), "{out}");
    // Simulated GPUs have no device nodes: none is exposed.
    assert!(!out.contains("nvidia"), "{out}");
    // Nothing of the jail's machinery was written on the root.
    assert!(std::fs::read_dir(root.path().join("run"))
        .expect("run")
        .next()
        .is_none());
    assert!(std::fs::read_dir(root.path().join("dev"))
        .expect("dev")
        .next()
        .is_none());
}

#[test]
fn a_job_sees_only_its_own_gpus_device_nodes() {
    if !is_root() {
        println!("SKIPPED (needs root): a_job_sees_only_its_own_gpus_device_nodes");
        return;
    }
    use nix::sys::stat::{makedev, mknod, Mode, SFlag};
    let root = tempfile::tempdir().expect("root dir");
    shared_root::scaffold::host_usr(root.path(), "corral-e2e-jail").expect("a tiny root");
    // A node's /dev with four GPUs (NVIDIA's major 195) and the usual
    // devices, made up: without a driver they open to nothing, but they
    // are there to be shown or hidden.
    let dev = tempfile::tempdir().expect("dev dir");
    let mut nodes: Vec<(String, u64, u64)> =
        (0..4).map(|i| (format!("nvidia{i}"), 195, i)).collect();
    nodes.push(("nvidiactl".into(), 195, 255));
    for (name, minor) in [
        ("null", 3),
        ("zero", 5),
        ("full", 7),
        ("random", 8),
        ("urandom", 9),
    ] {
        nodes.push((name.into(), 1, minor));
    }
    nodes.push(("tty".into(), 5, 0));
    for (name, major, minor) in &nodes {
        let mode = Mode::from_bits_truncate(0o666);
        mknod(
            &dev.path().join(name),
            SFlag::S_IFCHR,
            mode,
            makedev(*major, *minor),
        )
        .expect("mknod");
    }
    // The node's "driver": a library and a tool, bound into GPU tasks.
    let driver = tempfile::tempdir().expect("driver dir");
    let lib = driver.path().join("libnvidia-ml.so.1");
    std::fs::write(&lib, "the node's driver\n").expect("lib");
    let smi = driver.path().join("nvidia-smi");
    std::fs::write(&smi, "#!/bin/sh\necho smi from the node\n").expect("tool");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let env = Env::start(Opts {
        nodes: 1,
        gpus: 4,
        jail: Some(root.path().to_path_buf()),
        jail_submounts: vec!["/usr:/usr:ro".into()],
        jail_dev: Some(dev.path().to_path_buf()),
        jail_driver_files: vec![lib, smi],
        ..Opts::default()
    });
    let script = "ls /dev | grep nvidia | tr '\\n' ' '; echo; echo $CUDA_VISIBLE_DEVICES";
    let out = env.ok(&["srun", "-N1", "--gres=gpu:1", "-D", "/", "sh", "-c", script]);
    let mut lines = out.lines();
    let shown: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    let gpu = lines.next().unwrap_or("").trim().to_string();
    assert_eq!(gpu.len(), 1, "one GPU, by index: {out}");
    let mut want = vec![format!("nvidia{gpu}"), "nvidiactl".to_string()];
    want.sort();
    let mut shown: Vec<String> = shown.into_iter().map(String::from).collect();
    shown.sort();
    assert_eq!(
        shown, want,
        "only its GPU's node and the control node: {out}"
    );
    // The node's driver is there for a GPU task, found by the loader and
    // on PATH; nothing of it is written onto the shared root.
    let out = env.ok(&[
        "srun",
        "-N1",
        "--gres=gpu:1",
        "-D",
        "/",
        "sh",
        "-c",
        "cat /run/corral/driver/lib/libnvidia-ml.so.1; nvidia-smi; echo $LD_LIBRARY_PATH",
    ]);
    // First on the loader's path, before whatever the submitter had.
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[..2],
        ["the node's driver", "smi from the node"],
        "{out}"
    );
    assert!(
        lines[2] == "/run/corral/driver/lib" || lines[2].starts_with("/run/corral/driver/lib:"),
        "{out}"
    );
    assert!(!root.path().join("run/corral").exists());
    // A job without GPUs sees no NVIDIA device at all, and no driver.
    let out = env.ok(&[
        "srun",
        "-N1",
        "-D",
        "/",
        "sh",
        "-c",
        "test -e /run/corral/driver && echo driver || echo none",
    ]);
    assert_eq!(out.trim(), "none", "{out}");
    let out = env.ok(&[
        "srun",
        "-N1",
        "-D",
        "/",
        "sh",
        "-c",
        "ls /dev | grep -c nvidia || true",
    ]);
    assert_eq!(out.trim(), "0", "{out}");
}

/// The Docker socket is root on the node: only an exclusive job of a
/// member of `docker_group` (here `dockerusers`, root in it) gets it, not
/// a shared job, nor an exclusive one of a user outside the group.
#[test]
fn only_an_exclusive_job_gets_the_nodes_docker_socket() {
    if !is_root() {
        println!("SKIPPED (needs root): only_an_exclusive_job_gets_the_nodes_docker_socket");
        return;
    }
    let root = tempfile::tempdir().expect("root dir");
    shared_root::scaffold::host_usr(root.path(), "corral-e2e-jail").expect("a tiny root");
    let etc = root.path().join("etc");
    std::fs::write(etc.join("passwd"), "root:x:0:0:root:/root:/bin/sh\n").expect("passwd");
    std::fs::write(etc.join("group"), "root:x:0:\ndockerusers:x:2999:root\n").expect("group");
    // A stand-in for dockerd's socket.
    let sockets = tempfile::tempdir().expect("socket dir");
    let docker = sockets.path().join("docker.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&docker).expect("socket");
    let env = Env::start(Opts {
        nodes: 1,
        jail: Some(root.path().to_path_buf()),
        jail_submounts: vec!["/usr:/usr:ro".into()],
        jail_docker_socket: Some(docker),
        jail_docker_group: Some("dockerusers".into()),
        ..Opts::default()
    });
    let probe = "test -S /run/corral/docker.sock && echo socket || echo no-socket; \
                 echo \"DOCKER_HOST=[$DOCKER_HOST]\"";
    let shared = env.ok(&["srun", "-N1", "-D", "/", "sh", "-c", probe]);
    assert_eq!(shared, "no-socket\nDOCKER_HOST=[]\n");
    let alone = env.ok(&["srun", "-N1", "--exclusive", "-D", "/", "sh", "-c", probe]);
    assert_eq!(
        alone,
        "socket\nDOCKER_HOST=[unix:///run/corral/docker.sock]\n"
    );
    // A user outside the group, alone on the node: no socket.
    let out = env
        .cmd_as(
            23_480,
            &["srun", "-N1", "--exclusive", "-D", "/", "sh", "-c", probe],
        )
        .output()
        .expect("srun as another user");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "no-socket\nDOCKER_HOST=[]\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_busybox_root_runs_jobs_and_the_clusters_commands_inside() {
    if !is_root() {
        println!("SKIPPED (needs root): a_busybox_root_runs_jobs_and_the_clusters_commands_inside");
        return;
    }
    if shared_root::scaffold::find_program("busybox").is_none() {
        // .ci/run installs busybox-static; a developer's machine may not.
        println!("SKIPPED (needs busybox-static): a_busybox_root_runs_jobs_and_the_clusters_commands_inside");
        return;
    }
    let dir = tempfile::tempdir().expect("dir");
    let root = dir.path().join("root");
    let o = std::process::Command::new(corral_e2e::bin_dir().join("corral"))
        .args(["jail", "init", "--busybox"])
        .arg(&root)
        .output()
        .expect("corral jail init");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = std::process::Command::new(corral_e2e::bin_dir().join("corral"))
        .args(["jail", "check"])
        .arg(&root)
        .output()
        .expect("corral jail check");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    // Self-contained: no host /usr.
    let env = Env::start(Opts {
        nodes: 1,
        jail: Some(root.clone()),
        ..Opts::default()
    });
    let job = env.sbatch(
        &["-D", "/home", "-o", "bb.out"],
        "#!/bin/sh\ncat /etc/os-release\nbusybox | head -n 1 | cut -d' ' -f1\nsrun hostname\nscontrol show hostnames\n",
    );
    let st = env.wait_state(job, &["COMPLETED", "FAILED"], 60);
    let out = std::fs::read_to_string(root.join("home/bb.out")).unwrap_or_default();
    let why = env.ok(&["scontrol", "show", "job", &job.to_string()]);
    assert_eq!(st, "COMPLETED", "{why}\n{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[..2], ["ID=corral-busybox", "BusyBox"], "{out}");
    assert!(
        lines.contains(&"worker-0"),
        "srun and scontrol inside: {out}"
    );
}

#[test]
fn jail_shell_puts_a_login_user_into_the_shared_root_with_the_clusters_commands() {
    if !is_root() {
        println!("SKIPPED (needs root): jail_shell_puts_a_login_user_into_the_shared_root_with_the_clusters_commands");
        return;
    }
    let root = tempfile::tempdir().expect("root dir");
    shared_root::scaffold::host_usr(root.path(), "corral-login").expect("a tiny root");
    let home = root.path().join("home");
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    // A user only the shared root knows.
    std::fs::write(
        root.path().join("etc/passwd"),
        "root:x:0:0::/root:/bin/sh\nada:x:4100:4100::/home:/bin/sh\n",
    )
    .expect("passwd");
    std::fs::write(root.path().join("etc/group"), "root:x:0:\nada:x:4100:\n").expect("group");
    let env = Env::start(Opts {
        nodes: 1,
        jail: Some(root.path().to_path_buf()),
        jail_submounts: vec!["/usr:/usr:ro".into()],
        ..Opts::default()
    });
    // As sudo would run it for ada, with the cluster's corral.toml (whose
    // [jail] names the root, its submounts and the cluster's commands).
    let config = env.cluster.spec.dir.join("corral.toml");
    let inside = "cat /etc/os-release; id -un; pwd; \
                  sbatch --parsable -o login.out --wrap 'echo from-the-login-shell'; \
                  test -e /work || echo no-host-root";
    let o = std::process::Command::new(corral_e2e::bin_dir().join("corral"))
        .args(["jail", "shell", "--config"])
        .arg(&config)
        .args(["--", "sh", "-c", inside])
        .env("SUDO_UID", "4100")
        .env("SUDO_GID", "4100")
        .env("CORRAL_AGENT_SOCKET", env.cluster.socket(0))
        .output()
        .expect("corral jail shell");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[..3], ["ID=corral-login", "ada", "/home"], "{out}");
    assert_eq!(lines.last(), Some(&"no-host-root"), "{out}");
    // The job it submitted is ada's, and ran in the same root.
    let job: u64 = lines[3].trim().parse().expect("a job id");
    assert_eq!(
        env.wait_state(job, &["COMPLETED", "FAILED"], 30),
        "COMPLETED"
    );
    let shown = env.ok(&["scontrol", "show", "job", &job.to_string()]);
    assert!(shown.contains("(4100) GroupId="), "ada's job: {shown}");
    let written = std::fs::read_to_string(home.join("login.out")).expect("output in the root");
    assert_eq!(written, "from-the-login-shell\n");

    // Run for ada, it takes nothing of hers: not a root, a submount or a
    // configuration she names (her own root brings her own /etc/group
    // and set-user-ID files), and what it runs gains no privileges.
    let as_ada = |args: &[&str], envs: &[(&str, &Path)]| {
        let mut c = std::process::Command::new(corral_e2e::bin_dir().join("corral"));
        c.args(args)
            .env("SUDO_UID", "4100")
            .env("SUDO_GID", "4100")
            .env_remove("CORRAL_CONF");
        for (k, v) in envs {
            c.env(k, v);
        }
        let o = c.output().expect("corral jail shell");
        (
            o.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let hers = tempfile::tempdir().expect("her root");
    shared_root::scaffold::host_usr(hers.path(), "her-root").expect("her root");
    std::os::unix::fs::chown(hers.path(), Some(4100), Some(4100)).expect("chown");
    let her_conf = hers.path().join("corral.toml");
    std::fs::write(
        &her_conf,
        format!("[jail]\nroot = \"{}\"\n", hers.path().display()),
    )
    .expect("her config");
    std::os::unix::fs::chown(&her_conf, Some(4100), Some(4100)).expect("chown");
    let her_dir = hers.path().to_str().expect("utf-8");
    for (args, want) in [
        (
            vec!["jail", "shell", her_dir, "--", "id"],
            "drop DIR and --submount",
        ),
        (
            vec![
                "jail",
                "shell",
                "--config",
                config.to_str().unwrap(),
                "--submount",
                "/etc:/mnt",
                "--",
                "id",
            ],
            "drop DIR and --submount",
        ),
        (
            vec![
                "jail",
                "shell",
                "--config",
                her_conf.to_str().unwrap(),
                "--",
                "id",
            ],
            "is not owned by root",
        ),
    ] {
        let (code, out, err) = as_ada(&args, &[]);
        assert_ne!(code, 0, "{args:?} ran: {out}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    // $CORRAL_CONF of hers is not read either.
    let (code, out, err) = as_ada(
        &["jail", "shell", "--", "id"],
        &[("CORRAL_CONF", her_conf.as_path())],
    );
    assert_ne!(code, 0, "ran in her root: {out}");
    assert!(
        !err.contains("her-root") && !out.contains("her-root"),
        "{err}"
    );
    // A set-user-ID root program in the cluster's root runs as ada.
    let suid = root.path().join("opt/suid-id");
    std::fs::create_dir_all(suid.parent().unwrap()).expect("opt");
    std::fs::copy("/usr/bin/id", &suid).expect("id");
    std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).expect("setuid");
    let (code, out, err) = as_ada(
        &[
            "jail",
            "shell",
            "--config",
            config.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "/opt/suid-id -u; grep NoNewPrivs /proc/self/status",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "4100", "set-user-ID did nothing: {out}");
    assert!(lines[1].ends_with("\t1"), "no_new_privs: {out}");
}
