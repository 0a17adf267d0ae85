//! `corral jail shell`: a login node's way into the shared root. The
//! caller gets a shell (or runs a command) in the same root every job runs
//! in, with the cluster's commands on `PATH` and the node's agent socket
//! inside, so `pip install --user`, `sbatch` and `squeue` work as they do
//! in a job. Entering a mount namespace needs root: users come in through
//! sudo (or an sshd `ForceCommand`) and are themselves inside, by the
//! shared root's own `/etc/passwd` and `/etc/group`.

use std::ffi::CString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};

use shared_root::config::JailSection;
use shared_root::{Extra, Failed, Kernel, Plan, Prepared, Submount};

/// Where the cluster's `corral.toml` is, unless given.
pub const DEFAULT_CONFIG: &str = "/etc/corral/corral.toml";

/// What to enter and as whom.
#[derive(Debug)]
pub struct ShellArgs {
    pub dir: Option<PathBuf>,
    pub config: Option<PathBuf>,
    pub submounts: Vec<Submount>,
    pub command: Vec<String>,
}

/// The user sudo ran us for (`SUDO_UID`, `SUDO_GID`), else root.
fn caller() -> (u32, u32) {
    let var = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u32>().ok());
    match (var("SUDO_UID"), var("SUDO_GID")) {
        (Some(uid), Some(gid)) => (uid, gid),
        _ => (0, 0),
    }
}

/// The `[jail]` section of the cluster's configuration, if there is one.
/// Run for another user, only a file root alone could have written is
/// read ([`trusted`]), and never one named by the caller's environment.
fn section(config: Option<&Path>, for_other: bool) -> Result<Option<JailSection>, String> {
    let env = std::env::var_os("CORRAL_CONF")
        .map(PathBuf::from)
        .filter(|_| !for_other);
    let path = match config.map(Path::to_path_buf).or(env) {
        Some(p) => p,
        None if Path::new(DEFAULT_CONFIG).exists() => DEFAULT_CONFIG.into(),
        None => return Ok(None),
    };
    if for_other {
        trusted(&path, false)?;
    }
    JailSection::load(&path).map_err(|e| corral_proto::error_chain(&e))
}

/// Refuses `path` unless only root could have put it there: every
/// component owned by root, none a symbolic link, no directory on the
/// way writable by others (unless sticky, where only an entry's owner
/// may replace it), and the last not writable by group or others (a
/// socket's mode is not its access: only its place is checked).
pub fn trusted(path: &Path, socket: bool) -> Result<(), String> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let refuse = |why: String| {
        Err(format!(
            "{}: {why}; refused when run for another user",
            path.display()
        ))
    };
    if !path.is_absolute() {
        return refuse("not an absolute path".into());
    }
    let mut at = PathBuf::from("/");
    let parts: Vec<_> = path.components().skip(1).collect();
    for (i, part) in parts.iter().enumerate() {
        at.push(part);
        let m = match std::fs::symlink_metadata(&at) {
            Ok(m) => m,
            Err(e) => return refuse(format!("{}: {e}", at.display())),
        };
        if m.file_type().is_symlink() {
            return refuse(format!("{} is a symbolic link", at.display()));
        }
        if m.uid() != 0 {
            return refuse(format!("{} is not owned by root", at.display()));
        }
        let mode = m.permissions().mode();
        let last = i + 1 == parts.len();
        if last {
            if !socket && mode & 0o022 != 0 {
                return refuse("writable by others than root".into());
            }
        } else if mode & 0o022 != 0 && mode & 0o1000 == 0 {
            // A sticky one (/tmp) is safe for root's own entries, which
            // the owner check of the next component makes sure of.
            return refuse(format!("{} is writable by others than root", at.display()));
        }
    }
    Ok(())
}

/// A failure of the child between fork and exec: the jail's step and
/// errno (`step << 8 | errno`), or an errno alone for the identity and
/// directory steps (`IDENTITY << 8 | errno`).
const IDENTITY: i32 = shared_root::MAX_STEPS as i32;

/// Runs the shell; returns its exit code.
pub fn run(a: ShellArgs) -> Result<i32, String> {
    if !nix::unistd::geteuid().is_root() {
        return Err(
            "entering the shared root needs root: run it with sudo (you are yourself inside)"
                .into(),
        );
    }
    let (uid, gid) = caller();
    // Run for someone else (sudo), nothing the caller names is taken: a
    // root of their own brings their own /etc/group and set-user-ID
    // files, a configuration or submount of theirs mounts what they like.
    let for_other = uid != 0;
    if for_other && (a.dir.is_some() || !a.submounts.is_empty()) {
        return Err(format!(
            "run for another user (sudo), the shared root and its submounts come from {DEFAULT_CONFIG} only: \
             drop DIR and --submount"
        ));
    }
    let section = section(a.config.as_deref(), for_other)?.unwrap_or_default();
    let root = match a.dir.clone() {
        Some(d) => d,
        None if !section.root.as_os_str().is_empty() => section.root.clone(),
        None => {
            return Err(format!(
            "no shared root: give DIR, or a [jail] section in {DEFAULT_CONFIG} (or $CORRAL_CONF)"
        ))
        }
    };
    if for_other {
        trusted(&root, false)?;
    }
    let account = shared_root::users::account(&root, uid);
    let name = account
        .as_ref()
        .map_or_else(|| uid.to_string(), |a| a.name.clone());
    let groups: Vec<nix::unistd::Gid> = match &account {
        Some(acc) => shared_root::users::groups(&root, &acc.name, gid),
        None => vec![gid],
    }
    .into_iter()
    .map(nix::unistd::Gid::from_raw)
    .collect();
    let home = account
        .as_ref()
        .map(|a| a.home.clone())
        .filter(|h| root.join(h.trim_start_matches('/')).is_dir())
        .unwrap_or_else(|| "/".into());
    let shell = account
        .as_ref()
        .map(|a| a.shell.clone())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "/bin/sh".into());

    let mut plan = Plan::new(&root);
    plan.submounts = if a.submounts.is_empty() {
        section.submounts.clone()
    } else {
        a.submounts.clone()
    };
    plan.host_files.extend(section.host_files.iter().cloned());
    let bin = match section.bin.clone() {
        Some(b) => b,
        None => std::env::current_exe()
            .map_err(|e| format!("finding the cluster's commands: {e}"))?
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default(),
    };
    plan.extras.push(Extra {
        name: "bin".into(),
        source: bin,
        read_only: true,
    });
    let socket = std::env::var_os("CORRAL_AGENT_SOCKET")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/run/corral/agent.sock".into());
    // The caller may name the node's socket, not what is bound there.
    let has_socket = socket.exists() && (!for_other || trusted(&socket, true).is_ok());
    if has_socket {
        plan.extras.push(Extra {
            name: "agent.sock".into(),
            source: socket,
            read_only: true,
        });
    }
    let prepared = std::sync::Arc::new(
        plan.prepare()
            .map_err(|e| format!("the shared root: {}", corral_proto::error_chain(&e)))?,
    );

    let (program, args) = match a.command.split_first() {
        Some((p, rest)) => (p.clone(), rest.to_vec()),
        None => (shell.clone(), Vec::new()),
    };
    let mut cmd = std::process::Command::new(&program);
    cmd.args(&args).env_clear();
    let path = "/run/corral/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    cmd.env("PATH", path)
        .env("HOME", &home)
        .env("USER", &name)
        .env("LOGNAME", &name)
        .env("SHELL", &shell);
    if let Some(term) = std::env::var_os("TERM") {
        cmd.env("TERM", term);
    }
    if has_socket {
        cmd.env("CORRAL_AGENT_SOCKET", "/run/corral/agent.sock");
    }
    let home_c = CString::new(home.clone()).map_err(|_| format!("bad home directory {home}"))?;
    enter_in_child(&mut cmd, prepared.clone(), uid, gid, groups, home_c);
    match cmd.status() {
        Ok(st) => Ok(st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))),
        Err(e) => Err(child_error(e, &prepared, &program, uid)),
    }
}

/// Names what failed between fork and exec.
fn child_error(e: std::io::Error, prepared: &Prepared, program: &str, uid: u32) -> String {
    let Some(raw) = e.raw_os_error().filter(|r| *r > 0xff) else {
        return format!("{program}: {e}");
    };
    let (step, errno) = ((raw >> 8) as usize, raw & 0xff);
    if step == IDENTITY as usize {
        let e = std::io::Error::from_raw_os_error(errno);
        return format!("becoming uid {uid}: {e}");
    }
    let failed = Failed {
        step,
        errno: nix::errno::Errno::from_raw(errno),
    };
    format!(
        "entering the shared root: {}",
        corral_proto::error_chain(&prepared.error(failed))
    )
}

/// Between fork and exec: the jail, then the caller's identity, then the
/// home directory (as the user).
#[allow(unsafe_code)]
fn enter_in_child(
    cmd: &mut std::process::Command,
    prepared: std::sync::Arc<Prepared>,
    uid: u32,
    gid: u32,
    groups: Vec<nix::unistd::Gid>,
    home: CString,
) {
    use nix::unistd::{chdir, setgid, setgroups, setuid, Gid, Uid};
    let fail = |code: i32| std::io::Error::from_raw_os_error(code);
    // SAFETY: runs in the forked child before exec; it calls only the
    // jail's prepared mount calls, setgroups, setgid, setuid, prctl and chdir on
    // data made before the fork, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            prepared
                .enter(&Kernel)
                .map_err(|f| fail(((f.step as i32) << 8) | (f.errno as i32 & 0xff)))?;
            let id = |e: nix::errno::Errno| fail((IDENTITY << 8) | (e as i32 & 0xff));
            setgroups(&groups).map_err(id)?;
            setgid(Gid::from_raw(gid)).map_err(id)?;
            setuid(Uid::from_raw(uid)).map_err(id)?;
            // Nothing exec'd from here gains privileges (set-user-ID
            // files, file capabilities), whatever a mount lets through.
            nix::sys::prctl::set_no_new_privs().map_err(id)?;
            if chdir(home.as_c_str()).is_err() {
                chdir(c"/").map_err(id)?;
            }
            Ok(())
        });
    }
}
