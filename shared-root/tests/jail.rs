//! Entering a real jail, as root: a tiny root in a temporary directory
//! whose `/usr` is the host's (read-only, so `/bin/sh` runs), with a
//! read-write submount, an extra under `/run/corral`, and the node's
//! `/etc/hosts`. Without root it says SKIPPED and checks nothing.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use shared_root::{Extra, Kernel, Plan, Submount};

fn root_layout(root: &Path) {
    shared_root::scaffold::host_usr(root, "corral-test-jail").expect("a tiny root");
    std::fs::create_dir(root.join("data")).expect("data dir");
}

#[test]
fn a_task_sees_the_jail_and_nothing_of_the_host() {
    if !nix::unistd::geteuid().is_root() {
        println!("SKIPPED (needs root): a_task_sees_the_jail_and_nothing_of_the_host");
        return;
    }
    let root = tempfile::tempdir().expect("root dir");
    root_layout(root.path());
    let data = tempfile::tempdir().expect("data dir");
    let mut marker = tempfile::NamedTempFile::new().expect("marker");
    marker.write_all(b"from-the-host\n").expect("marker");
    let plan = Plan::new(root.path());
    let mut plan = plan.with_host_usr();
    plan.submounts.push(Submount {
        name: "data".into(),
        source: data.path().to_path_buf(),
        target: "/data".into(),
        read_only: false,
    });
    plan.host_files = vec!["/etc/hosts".into(), "/etc/resolv.conf".into()];
    plan.extras = vec![Extra {
        name: "marker".into(),
        source: marker.path().to_path_buf(),
        read_only: true,
    }];
    let prepared = std::sync::Arc::new(plan.prepare().expect("a good plan"));
    let script = r#"
        cat /etc/os-release
        echo "dev: $(ls /dev | tr '\n' ' ')"
        echo written > /data/out && echo data-writable
        test -e /work && echo HOST-VISIBLE || echo host-hidden
        touch /usr/corral-jail-probe 2>/dev/null && echo USR-WRITABLE || echo usr-readonly
        echo "tmp entries: $(ls -A /tmp | wc -l)"
        cat /run/corral/marker
        test -r /proc/self/status && echo proc-ok
        echo "hosts bytes: $(wc -c < /etc/hosts)"
        touch /sys/corral-probe 2>/dev/null && echo SYS-WRITABLE || echo sys-readonly
        n=0; w=0
        while read -r id parent mm root mp opts rest; do
            case "$mp" in /sys/*) n=$((n+1)); case "$opts" in ro*) ;; *) w=1;; esac;; esac
        done < /proc/self/mountinfo
        echo "mounts under sys: $n"
        [ $w = 1 ] && echo SUBSYS-WRITABLE || echo subsys-readonly
    "#;
    let mut cmd = Command::new("/bin/sh");
    cmd.args(["-c", script]);
    let jail = prepared.clone();
    // SAFETY: `enter` makes system calls only, on strings prepared before
    // the fork; it allocates nothing and takes no lock.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(move || {
            jail.enter(&Kernel)
                .map_err(|f| std::io::Error::from_raw_os_error(f.errno as i32))
        });
    }
    let out = cmd.output().expect("the task starts in the jail");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("inside the jail:\n{stdout}");
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("ID=corral-test-jail"), "{stdout}");
    let dev = stdout
        .lines()
        .find_map(|l| l.strip_prefix("dev: "))
        .expect("a dev line");
    let mut dev: Vec<&str> = dev.split_whitespace().collect();
    dev.sort_unstable();
    assert_eq!(
        dev,
        [
            "fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout",
            "tty", "urandom", "zero"
        ]
    );
    for line in [
        "data-writable",
        "host-hidden",
        "usr-readonly",
        "tmp entries: 0",
        "from-the-host",
        "proc-ok",
        "sys-readonly",
        "subsys-readonly",
    ] {
        assert!(stdout.lines().any(|l| l == line), "{line:?} in {stdout}");
    }
    // The host's mounts under /sys are all there, and none is writable.
    let host_sys = std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter(|l| l.split(' ').nth(4).is_some_and(|m| m.starts_with("/sys/")))
        .count();
    assert!(
        stdout.contains(&format!("mounts under sys: {host_sys}")),
        "{stdout}"
    );
    let host_hosts = std::fs::metadata("/etc/hosts").expect("host hosts").len();
    assert!(
        stdout.contains(&format!("hosts bytes: {host_hosts}")),
        "{stdout}"
    );
    // The write went to the host's directory; nothing landed on the root.
    assert_eq!(
        std::fs::read_to_string(data.path().join("out")).expect("written through"),
        "written\n"
    );
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
fn a_failing_step_is_reported_by_name() {
    if !nix::unistd::geteuid().is_root() {
        println!("SKIPPED (needs root): a_failing_step_is_reported_by_name");
        return;
    }
    let root = tempfile::tempdir().expect("root dir");
    root_layout(root.path());
    let mut plan = Plan::new(root.path());
    // A submount whose target the shared root lacks.
    plan.submounts = vec![Submount {
        name: "scratch".into(),
        source: "/usr".into(),
        target: "/scratch".into(),
        read_only: true,
    }];
    let prepared = std::sync::Arc::new(plan.prepare().expect("a good plan"));
    let mut failed = None;
    let status = {
        let jail = prepared.clone();
        let mut cmd = Command::new("/bin/true");
        // SAFETY: as above.
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(move || {
                jail.enter(&Kernel).map_err(|f| {
                    // Step index in the high half, errno in the low.
                    std::io::Error::from_raw_os_error(((f.step as i32) << 16) | f.errno as i32)
                })
            });
        }
        cmd.status()
    };
    if let Err(e) = status {
        let raw = e.raw_os_error().expect("an errno");
        failed = Some(shared_root::Failed {
            step: (raw >> 16) as usize,
            errno: nix::errno::Errno::from_raw(raw & 0xffff),
        });
    }
    let failed = failed.expect("the jail cannot be entered");
    let text = shared_root::JailError::to_string(&prepared.error(failed));
    assert_eq!(text, "submount scratch: /usr at /scratch");
    assert_eq!(failed.errno, nix::errno::Errno::ENOENT);
}
