//! The spool as a root daemon must keep it: scripts chowned through their
//! descriptor (never by a path a user can swap), and no start from a
//! directory others can write.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use corral_agent::batch::write_script;
use corral_agent::spool::{check_private_dir, UnsafeDir};
use corral_proto::msg::Ident;
use corral_proto::tls::{self, Role};

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

#[test]
fn directories_others_can_write_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let open = tmp.path().join("open");
    std::fs::create_dir(&open).unwrap();
    chmod(&open, 0o777);
    let spool = open.join("spool");
    std::fs::create_dir(&spool).unwrap();
    chmod(&spool, 0o755);
    // The spool itself is private, but a parent lets anyone rename it.
    let err = check_private_dir(&spool).unwrap_err();
    assert!(
        matches!(err, UnsafeDir::Writable { ref path, .. } if *path == open),
        "{err}"
    );
    // World-writable even with the sticky bit: refused for the spool itself.
    chmod(&open, 0o755);
    chmod(&spool, 0o1777);
    assert!(matches!(
        check_private_dir(&spool),
        Err(UnsafeDir::Writable { .. })
    ));
    chmod(&spool, 0o755);
    check_private_dir(&spool).unwrap();

    // The agent says so in one line and does not start.
    chmod(&spool, 0o777);
    let certs = tmp.path().join("certs");
    tls::init_ca(&certs).unwrap();
    tls::issue(&certs, "n", Role::Agent).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_corral-agent"))
        .args(["--name", "n", "--ctld", "127.0.0.1:9"])
        .arg("--certs")
        .arg(&certs)
        .arg("--spool")
        .arg(&spool)
        .arg("--socket")
        .arg(tmp.path().join("s.sock"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("is writable by others"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

/// A user who can write the spool directory replaces each new script with
/// a link to a file of root's, as fast as it can, while the agent writes
/// scripts there: the file outside the spool never changes owner.
#[test]
fn swapped_links_in_the_spool_chown_nothing_outside_it() {
    if !nix::unistd::geteuid().is_root() {
        println!("SKIPPED (needs root): racing another uid");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    chmod(tmp.path(), 0o755);
    let victim = tmp.path().join("victim");
    std::fs::write(&victim, "root's\n").unwrap();
    for (mode, name) in [(0o777, "open"), (0o1777, "sticky")] {
        let spool = tmp.path().join(name);
        std::fs::create_dir(&spool).unwrap();
        chmod(&spool, mode);
        let script = spool.join("job1.sh");
        // A tight loop in Python where there is one (fast enough to hit the
        // window between a create and a chown by path), else in sh.
        let (shell, racer) = if Path::new("/usr/bin/python3").exists() {
            (
                "/usr/bin/python3",
                format!(
                    "import os, time\nend = time.time() + 4\nwhile time.time() < end:\n    \
                     try: os.unlink({s:?})\n    except OSError: pass\n    \
                     try: os.symlink({v:?}, {s:?})\n    except OSError: pass\n",
                    s = script.display().to_string(),
                    v = victim.display().to_string()
                ),
            )
        } else {
            (
                "/bin/sh",
                format!(
                    "end=$(($(date +%s) + 4)); while [ $(date +%s) -lt $end ]; do \
                     rm -f {s} 2>/dev/null; ln -s {v} {s} 2>/dev/null; done",
                    s = script.display(),
                    v = victim.display()
                ),
            )
        };
        let mut racer = {
            use std::os::unix::process::CommandExt;
            Command::new(shell)
                .args(["-c", &racer])
                .uid(23_470)
                .gid(23_470)
                .spawn()
                .unwrap()
        };
        let who = Ident {
            uid: 23_471,
            gid: 23_471,
        };
        let t0 = Instant::now();
        let mut written = 0;
        while t0.elapsed() < Duration::from_secs(3) {
            if write_script(&script, b"#!/bin/sh\ntrue\n", who).is_ok() {
                written += 1;
            }
        }
        let _ = racer.kill();
        let _ = racer.wait();
        let m = std::fs::metadata(&victim).unwrap();
        assert_eq!((m.uid(), m.gid()), (0, 0), "{name} spool: victim chowned");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root's\n");
        assert!(written > 0, "{name} spool: no script was ever written");
    }
}
