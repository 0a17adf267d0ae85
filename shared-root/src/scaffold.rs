//! A throw-away shared root that borrows the host's `/usr` (read-only):
//! enough for `/bin/sh` and the usual tools, for tests and demos on a
//! machine without debootstrap. A real cluster's root is a full
//! distribution on shared storage.

use std::path::Path;

use crate::plan::{Plan, Submount};

/// Lays out `dir` as a root: the directories a jail mounts over, the
/// usrmerge links, an `/etc/os-release` naming `id`, and empty
/// `/etc/hosts` and `/etc/resolv.conf` for the node's to cover.
pub fn host_usr(dir: &Path, id: &str) -> std::io::Result<()> {
    for d in ["proc", "sys", "dev", "tmp", "run", "etc", "usr", "home"] {
        std::fs::create_dir_all(dir.join(d))?;
    }
    for (link, to) in [
        ("bin", "usr/bin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
        ("sbin", "usr/sbin"),
    ] {
        if std::fs::symlink_metadata(dir.join(link)).is_err() {
            std::os::unix::fs::symlink(to, dir.join(link))?;
        }
    }
    std::fs::write(dir.join("etc/os-release"), format!("ID={id}\n"))?;
    std::fs::write(dir.join("etc/hosts"), "")?;
    std::fs::write(dir.join("etc/resolv.conf"), "")?;
    Ok(())
}

impl Plan {
    /// Adds the host's `/usr` at `/usr`, read-only (see [`host_usr`]).
    pub fn with_host_usr(mut self) -> Plan {
        self.submounts.push(Submount {
            name: "usr".into(),
            source: "/usr".into(),
            target: "/usr".into(),
            read_only: true,
        });
        self
    }
}
