//! Cheap task migration: the cgroup2 root's `favordynmods` option.
//!
//! Every task joins its step's cgroup between fork and exec (a write to
//! `cgroup.procs`, a *migration*). The kernel guards migrations with one
//! global lock taken for writing, and unless the cgroup2 root carries
//! `favordynmods` (Linux 6.0 and later) that write first waits for an RCU
//! grace period. Measured on the CI machine (Linux 6.18, v1 controllers
//! with a hybrid `unified` mount): one migration 12.7 ms at the median
//! (4.9–24.5 ms), 9.5 ms of one `srun -N1 true`'s 24 ms spent in it;
//! with the option 0.43 ms, and `srun -N1 true` 14 ms. The kernel's
//! documentation names the trade: forks and exits take the lock's slower
//! shared path. The option is global (the lock is), and from Linux 6.18
//! it cannot be turned off again until the machine restarts (the kernel
//! then locks per thread group, and says so in its log if asked to).
//!
//! The agent turns it on at start when it runs jobs in cgroups, unless
//! told not to (`--cgroup-favordynmods off`): it remounts the cgroup2
//! mount with its own options kept and `favordynmods` added, then reads
//! the mount table again to see it took (in a cgroup namespace other than
//! the host's the kernel ignores root options without an error). With
//! no cgroup2 mount (a v1-only machine) it does nothing: mounting one
//! just for this would set the root's other options too.
//!
//! [`plan`] decides from the mount table and is tested without root;
//! [`apply`] makes the one call through [`shared_root::Syscall`], so the
//! call itself is checked with the recording implementation.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::MsFlags;
use shared_root::Syscall;

/// The root option this module is about.
pub const OPTION: &str = "favordynmods";

/// A cgroup2 mount, as the mount table shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cgroup2Mount {
    pub point: PathBuf,
    /// The mount's own options (`rw,nosuid,nodev,noexec,relatime`).
    pub mount_options: Vec<String>,
    /// The cgroup2 root's options (`rw,nsdelegate,memory_recursiveprot`).
    pub super_options: Vec<String>,
}

impl Cgroup2Mount {
    /// Whether the root's options include `favordynmods`.
    pub fn favors(&self) -> bool {
        self.super_options.iter().any(|o| o == OPTION)
    }
}

/// What to do about `favordynmods`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// The root has it already.
    AlreadyOn,
    /// No cgroup2 mount to remount.
    NoCgroup2,
    /// Remount `target` with its mount flags kept and `data` as the
    /// root's options (its own plus `favordynmods`).
    Remount {
        target: PathBuf,
        flags: MsFlags,
        data: String,
    },
}

/// How it ended, for the agent's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    AlreadyOn,
    TurnedOn {
        mount: PathBuf,
    },
    NoCgroup2,
    /// The remount succeeded but the mount table does not show the
    /// option: the agent is not in the host's cgroup namespace.
    Ignored {
        mount: PathBuf,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum DynmodsError {
    #[error("reading the mount table")]
    Mounts(#[source] std::io::Error),
    #[error("remounting {mount} with {data}")]
    Remount {
        mount: PathBuf,
        data: String,
        #[source]
        source: Errno,
    },
    #[error("mount path or option with a NUL byte: {0:?}")]
    Nul(String),
}

/// The mount flags to keep on a remount: what `MS_REMOUNT` resets
/// unless it is given again.
fn mount_flags(options: &[String]) -> MsFlags {
    let mut flags = MsFlags::MS_REMOUNT;
    for o in options {
        flags |= match o.as_str() {
            "ro" => MsFlags::MS_RDONLY,
            "nosuid" => MsFlags::MS_NOSUID,
            "nodev" => MsFlags::MS_NODEV,
            "noexec" => MsFlags::MS_NOEXEC,
            "relatime" => MsFlags::MS_RELATIME,
            "noatime" => MsFlags::MS_NOATIME,
            "nodiratime" => MsFlags::MS_NODIRATIME,
            "strictatime" => MsFlags::MS_STRICTATIME,
            _ => MsFlags::empty(),
        };
    }
    flags
}

/// Decides from the cgroup2 mounts: any one with the option means the
/// (single, global) root has it; otherwise the first is remounted.
pub fn plan(mounts: &[Cgroup2Mount]) -> Plan {
    if mounts.iter().any(Cgroup2Mount::favors) {
        return Plan::AlreadyOn;
    }
    let Some(m) = mounts.first() else {
        return Plan::NoCgroup2;
    };
    // The root's options are all set again by a remount: keep each one
    // it has (`rw`/`ro` are the mount's, not the root's).
    let mut data: Vec<&str> = m
        .super_options
        .iter()
        .map(String::as_str)
        .filter(|o| !matches!(*o, "rw" | "ro") && !o.is_empty())
        .collect();
    data.push(OPTION);
    Plan::Remount {
        target: m.point.clone(),
        flags: mount_flags(&m.mount_options),
        data: data.join(","),
    }
}

/// Carries out a [`Plan::Remount`]; the others need no call.
pub fn apply(sys: &impl Syscall, plan: &Plan) -> Result<(), DynmodsError> {
    let Plan::Remount {
        target,
        flags,
        data,
    } = plan
    else {
        return Ok(());
    };
    let c = |s: &[u8]| CString::new(s).map_err(|_| DynmodsError::Nul(data.clone()));
    let (source, point, fstype, opts) = (
        c(b"cgroup2")?,
        c(target.as_os_str().as_bytes())?,
        c(b"cgroup2")?,
        c(data.as_bytes())?,
    );
    sys.mount(Some(&source), &point, Some(&fstype), *flags, Some(&opts))
        .map_err(|source| DynmodsError::Remount {
            mount: target.clone(),
            data: data.clone(),
            source,
        })
}

/// The cgroup2 mounts in `mountinfo` (the text of `/proc/PID/mountinfo`,
/// parsed by procfs as `Layout::detect` does); each option list sorted,
/// so a remount's options are the same from run to run.
pub fn parse_mountinfo(mountinfo: &str) -> Result<Vec<Cgroup2Mount>, DynmodsError> {
    use procfs::FromBufRead;
    let sorted = |o: std::collections::HashMap<String, Option<String>>| -> Vec<String> {
        let mut v: Vec<String> = o
            .into_iter()
            .map(|(k, v)| match v {
                Some(v) => format!("{k}={v}"),
                None => k,
            })
            .collect();
        v.sort();
        v
    };
    let all = procfs::process::MountInfos::from_buf_read(mountinfo.as_bytes())
        .map_err(|e| DynmodsError::Mounts(std::io::Error::other(e)))?;
    Ok(all
        .into_iter()
        .filter(|m| m.fs_type == "cgroup2")
        .map(|m| Cgroup2Mount {
            point: PathBuf::from(unescape(&m.mount_point.to_string_lossy())),
            mount_options: sorted(m.mount_options),
            super_options: sorted(m.super_options),
        })
        .collect())
}

/// The mount table escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn read_mounts(mountinfo: &Path) -> Result<Vec<Cgroup2Mount>, DynmodsError> {
    parse_mountinfo(&std::fs::read_to_string(mountinfo).map_err(DynmodsError::Mounts)?)
}

/// Whether the cgroup2 root has `favordynmods`, by the mount table at
/// `mountinfo`. (On Linux 6.18 the kernel keeps its effect after the
/// option is removed again, which the table does not show.)
pub fn is_on(mountinfo: &Path) -> Result<bool, DynmodsError> {
    Ok(read_mounts(mountinfo)?.iter().any(Cgroup2Mount::favors))
}

/// Turns `favordynmods` on for this machine if it is off, reading the
/// mount table at `mountinfo` (`/proc/self/mountinfo`) before and after.
pub fn favor(sys: &impl Syscall, mountinfo: &Path) -> Result<Outcome, DynmodsError> {
    let p = plan(&read_mounts(mountinfo)?);
    apply(sys, &p)?;
    Ok(match p {
        Plan::AlreadyOn => Outcome::AlreadyOn,
        Plan::NoCgroup2 => Outcome::NoCgroup2,
        Plan::Remount { target, .. } => {
            if is_on(mountinfo)? {
                Outcome::TurnedOn { mount: target }
            } else {
                Outcome::Ignored { mount: target }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared_root::Recorder;

    // From a hybrid machine (CI's) and a systemd one (pure v2).
    const HYBRID: &str = "\
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const SYSTEMD: &str = "\
25 21 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
30 25 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

    #[test]
    fn reads_cgroup2_mounts_with_both_option_lists() {
        let m = parse_mountinfo(SYSTEMD).expect("parses");
        assert_eq!(
            m,
            [Cgroup2Mount {
                point: "/sys/fs/cgroup".into(),
                mount_options: ["nodev", "noexec", "nosuid", "relatime", "rw"]
                    .map(String::from)
                    .to_vec(),
                super_options: ["memory_recursiveprot", "nsdelegate", "rw"]
                    .map(String::from)
                    .to_vec(),
            }]
        );
        assert!(!m[0].favors());
        assert_eq!(parse_mountinfo(HYBRID).expect("parses").len(), 1);
        assert!(parse_mountinfo("garbage\n1 2 - cgroup2\n").is_err());
        // An escaped space in a mount point.
        let odd = "41 31 0:38 / /mnt/cg\\040two rw - cgroup2 cgroup2 rw\n";
        let m = parse_mountinfo(odd).expect("parses");
        assert_eq!(m[0].point, Path::new("/mnt/cg two"));
    }

    #[test]
    fn a_remount_keeps_the_roots_options_and_the_mounts_flags() {
        let plan = plan(&parse_mountinfo(SYSTEMD).expect("parses"));
        assert_eq!(
            plan,
            Plan::Remount {
                target: "/sys/fs/cgroup".into(),
                flags: MsFlags::MS_REMOUNT
                    | MsFlags::MS_NOSUID
                    | MsFlags::MS_NODEV
                    | MsFlags::MS_NOEXEC
                    | MsFlags::MS_RELATIME,
                data: "memory_recursiveprot,nsdelegate,favordynmods".into(),
            }
        );
        let rec = Recorder::default();
        apply(&rec, &plan).expect("recorded");
        assert_eq!(
            rec.calls(),
            ["mount cgroup2 /sys/fs/cgroup cgroup2 \
              MS_NOSUID|MS_NODEV|MS_NOEXEC|MS_REMOUNT|MS_RELATIME \
              memory_recursiveprot,nsdelegate,favordynmods"]
        );
    }

    #[test]
    fn nothing_is_called_when_the_option_is_on_or_there_is_no_cgroup2() {
        let on = SYSTEMD.replace("memory_recursiveprot", "memory_recursiveprot,favordynmods");
        for (table, want) in [
            (on.as_str(), Plan::AlreadyOn),
            (
                "39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n",
                Plan::NoCgroup2,
            ),
        ] {
            let p = plan(&parse_mountinfo(table).expect("parses"));
            assert_eq!(p, want);
            let rec = Recorder::default();
            apply(&rec, &p).expect("no call");
            assert!(rec.calls().is_empty());
        }
    }
}
