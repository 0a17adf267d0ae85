//! A batch job's script on this node: written into the spool as the
//! user's file, run with its output in files, removed after.

use std::path::{Path, PathBuf};

use corral_proto::msg::{ExitStatus, Ident, Launch};
use nix::sys::signal::Signal;

use crate::agent::{Agent, StepError};
use crate::launch::{Io, TaskSpec};
use crate::procs::signal_group;
use crate::task::{expand_pattern, PatternVars};

/// Where a batch script's output goes: patterns for its files, and
/// whether they are appended to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Output<'a> {
    pub stdout: &'a str,
    pub stderr: Option<&'a str>,
    pub append: bool,
}

impl Agent {
    pub(crate) async fn run_batch(
        &self,
        l: &Launch,
        script: &[u8],
        args: &[String],
        out: Output<'_>,
        cgroup: Option<std::sync::Arc<crate::cgroup::Join>>,
    ) -> Result<ExitStatus, StepError> {
        let Output {
            stdout,
            stderr,
            append,
        } = out;
        let (user, groups) = self.user_of(l);
        let vars = PatternVars {
            job: l.job.0,
            name: &l.name,
            node: &self.cfg.name,
            user: &user,
            step: None,
            array: l.array.map(|a| (a.job.0, a.task)),
            task: None,
            node_index: None,
        };
        let cwd = PathBuf::from(&l.work_dir);
        // Relative files are opened in the directory the script starts
        // in: its working directory, or /tmp when that cannot be entered.
        let out_path = PathBuf::from(expand_pattern(stdout, &vars));
        let err_path = match stderr {
            Some(p) => PathBuf::from(expand_pattern(p, &vars)),
            None => out_path.clone(),
        };
        // Per run: an older run ending late removes only its own script.
        let path = self.cfg.spool.join(format!("job{}.{}.sh", l.job, l.run));
        write_script(&path, script, l.user).map_err(|source| StepError::Script {
            path: path.clone(),
            source,
        })?;
        let jail = self.jail_for(l, groups.as_deref())?;
        let env = self.env_for(l, &user, groups.as_deref(), 0);
        let script = match jail {
            Some(_) => crate::jail::spool_path(&path),
            None => path.clone(),
        };
        let pid_ns = self.pid_ns_for(l, jail.is_some())?;
        let spec = TaskSpec {
            pid_ns,
            tty: None,
            umask: crate::task::umask_of(&l.env),
            cgroup,
            groups,
            jail,
            argv: std::iter::once(script.to_string_lossy().into_owned())
                .chain(args.iter().cloned())
                .collect(),
            env,
            cwd,
            user: l.user,
            stdin: Io::Null,
            stdout: if append {
                Io::Append(out_path)
            } else {
                Io::Path(out_path)
            },
            stderr: if append {
                Io::Append(err_path)
            } else {
                Io::Path(err_path)
            },
        };
        let spawned = self.cfg.launcher.spawn(spec);
        let run = l.job_run();
        let result = match spawned {
            Ok(mut child) => {
                let pid = child.id();
                if let Some(pid) = pid {
                    if !self.add_groups(run, l.step, &[pid]) {
                        signal_group(pid, Signal::SIGKILL);
                    }
                }
                let st = child.wait().await;
                if let Some(pid) = pid {
                    self.group_exited(run, l.step, pid);
                }
                st.map(ExitStatus::from).map_err(StepError::Wait)
            }
            Err(e) => Err(e.into()),
        };
        let _ = std::fs::remove_file(&path);
        result
    }
}

/// Writes a batch script into the spool, owned by the job's user, and
/// leaves nothing behind when it fails (a full spool must not break the
/// node for later jobs). The file is created new, never through a link,
/// and its owner is changed through the open descriptor, so nothing a
/// user swaps in at that path can be chowned.
pub fn write_script(path: &Path, script: &[u8], who: Ident) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    // No task forks while the script is open for writing (see FORK_LOCK).
    let _no_forks = crate::launch::FORK_LOCK.write();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o700)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)?;
    let written = f.write_all(script).and_then(|()| {
        if nix::unistd::geteuid().is_root() {
            std::os::unix::fs::fchown(&f, Some(who.uid), Some(who.gid))?;
        }
        Ok(())
    });
    if written.is_err() {
        drop(f);
        let _ = std::fs::remove_file(path);
    }
    written
}
