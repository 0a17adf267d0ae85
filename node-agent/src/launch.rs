//! Starting a task: the one seam every process of a job goes through.
//!
//! [`Launcher::spawn`] takes a [`TaskSpec`] (argv, environment, directory,
//! identity, stdio) and returns a running child in its own process group.
//! [`ProcessLauncher`] does it with [`crate::spawn`] (a clone that shares
//! the agent's memory until the exec, as `posix_spawn`'s, rather than a
//! fork that copies it), joining the task's cgroup and jail and dropping
//! to the user between the clone and the exec.
//!
//! It is the privileged seam only: what a task sees (Slurm's environment,
//! output file names) lives in [`crate::task`].

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;

use corral_proto::msg::Ident;

/// Why a task could not start. Each step the child takes between clone and
/// exec has its own variant, so a user sees which one failed.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("this agent runs as uid {agent} and cannot start tasks for uid {user}")]
    NotRoot { agent: u32, user: u32 },
    #[error("execve {program}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("empty command")]
    EmptyCommand,
    #[error("{path}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("becoming uid {uid}")]
    Identity {
        uid: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("chdir {dir}")]
    Chdir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "working directory {dir} belongs to another user, who may change what is in it (a shared directory is setgid and group-writable)"
    )]
    ForeignDir { dir: PathBuf },
    #[error("open output file {path}")]
    Output {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("open input file {path}")]
    Input {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("output file {path} is not a regular file or a terminal")]
    OutputKind { path: PathBuf },
    #[error("preparing the task")]
    Setup(#[source] std::io::Error),
    #[error("entering the jail")]
    Jail(#[source] shared_root::JailError),
    #[error("joining the step's cgroup")]
    Cgroup(#[source] std::io::Error),
    #[error("environment variable {key} holds a NUL byte")]
    Environment { key: String },
    #[error(
        "PATH lists {dirs} directories; at most {} are searched",
        crate::spawn::MAX_SEARCH_DIRS
    )]
    SearchPath { dirs: usize },
}

/// Where one of a task's standard streams goes.
#[derive(Debug)]
pub enum Io {
    Null,
    Piped,
    /// A file the task itself opens (created or truncated) once it runs as
    /// its user, so a user can never make the agent write where they may
    /// not.
    Path(PathBuf),
    /// The same, appended to rather than truncated (`--open-mode=append`).
    Append(PathBuf),
    /// A file the task reads (standard input only), opened the same way.
    Input(PathBuf),
}

impl Io {
    fn path(&self) -> Option<&PathBuf> {
        match self {
            Io::Path(p) | Io::Append(p) | Io::Input(p) => Some(p),
            _ => None,
        }
    }

    fn open_as(&self) -> OpenAs {
        match self {
            Io::Append(_) => OpenAs::Append,
            Io::Input(_) => OpenAs::Read,
            _ => OpenAs::Truncate,
        }
    }
}

/// How the child opens a file of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpenAs {
    Truncate,
    Append,
    Read,
}

/// Files to open in the child: (path, descriptors to point at it, how).
type Redirects = Vec<(CString, Vec<i32>, OpenAs)>;

fn c_path(p: &std::path::Path) -> Result<CString, LaunchError> {
    CString::new(p.as_os_str().as_encoded_bytes()).map_err(|_| LaunchError::File {
        path: p.to_path_buf(),
        source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
    })
}

/// The files to open (output, then an input), and their paths in the
/// same order (for errors), each saying whether it is the input.
fn redirects(
    stdin: &Io,
    stdout: &Io,
    stderr: &Io,
) -> Result<(Redirects, Vec<(PathBuf, bool)>), LaunchError> {
    let mut out: Vec<(&PathBuf, Vec<i32>, OpenAs)> = Vec::new();
    match (stdout.path(), stderr.path()) {
        (Some(a), Some(b)) if a == b => out.push((a, vec![1, 2], stdout.open_as())),
        (a, b) => {
            out.extend(a.map(|a| (a, vec![1], stdout.open_as())));
            out.extend(b.map(|b| (b, vec![2], stderr.open_as())));
        }
    }
    if let Io::Input(p) = stdin {
        out.push((p, vec![0], OpenAs::Read));
    }
    let paths = out
        .iter()
        .map(|(p, _, how)| ((*p).clone(), matches!(how, OpenAs::Read)))
        .collect();
    let files = out
        .into_iter()
        .map(|(p, fds, append)| Ok((c_path(p)?, fds, append)))
        .collect::<Result<_, LaunchError>>()?;
    Ok((files, paths))
}

/// Everything needed to start one task.
#[derive(Debug)]
pub struct TaskSpec {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub user: Ident,
    pub stdin: Io,
    pub stdout: Io,
    pub stderr: Io,
    /// The jail to enter first (then every path above is the jail's).
    pub jail: Option<Arc<shared_root::Prepared>>,
    /// The user's groups, when the caller resolved them (a jail's users are
    /// its root's); `None`: the node's group database.
    pub groups: Option<Arc<[u32]>>,
    /// The step's cgroup, joined first (so everything the task runs,
    /// the jail's setup included, is in it).
    pub cgroup: Option<Arc<crate::cgroup::Join>>,
    /// A terminal's slave side (`srun --pty`): the task's three streams
    /// and, in a session of its own, its controlling terminal (the
    /// streams above are then unused).
    pub tty: Option<std::os::fd::OwnedFd>,
    /// The job's PID namespace on this node (a jailed job's), which the
    /// task starts in; `None`: the agent's.
    pub pid_ns: Option<Arc<crate::pidns::PidNamespace>>,
    /// The file mode mask the task starts with (the submitter's,
    /// `SLURM_UMASK`); `None`: the agent's.
    pub umask: Option<u32>,
}

/// Held (shared) from clone to exec by every spawn, and (exclusive) by
/// whoever has a file open for writing that a task will exec, such as a
/// batch script: a child cloned meanwhile would inherit that descriptor
/// until its own exec, and the script's exec would fail with ETXTBSY
/// ("Text file busy") while any process holds it open for writing.
pub static FORK_LOCK: parking_lot::RwLock<()> = parking_lot::RwLock::new(());

/// Starts tasks. Implementations must put each task in its own process
/// group (its pid is the group id) and run it as `spec.user`.
pub trait Launcher: Send + Sync + std::fmt::Debug {
    fn spawn(&self, spec: TaskSpec) -> Result<crate::spawn::Task, LaunchError>;
}

/// clone/exec on the host: supplementary groups, gid and uid of the user,
/// a process group of its own, and death with the agent.
#[derive(Debug, Default)]
pub struct ProcessLauncher;

/// The user's supplementary groups from the node's group database, or just
/// the primary group when the uid has no passwd entry.
fn groups_of(user: Ident) -> Vec<nix::unistd::Gid> {
    let gid = nix::unistd::Gid::from_raw(user.gid);
    let name = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(user.uid))
        .ok()
        .flatten()
        .and_then(|u| CString::new(u.name).ok());
    name.and_then(|n| nix::unistd::getgrouplist(&n, gid).ok())
        .unwrap_or_else(|| vec![gid])
}

impl Launcher for ProcessLauncher {
    fn spawn(&self, spec: TaskSpec) -> Result<crate::spawn::Task, LaunchError> {
        use crate::spawn::{self, SpawnError, Stdio3};
        let me = nix::unistd::geteuid().as_raw();
        let switch = me != spec.user.uid;
        if switch && me != 0 {
            return Err(LaunchError::NotRoot {
                agent: me,
                user: spec.user.uid,
            });
        }
        let (program, args) = spec.argv.split_first().ok_or(LaunchError::EmptyCommand)?;
        let (files, paths) = match &spec.tty {
            Some(_) => (Vec::new(), Vec::new()),
            None => redirects(&spec.stdin, &spec.stdout, &spec.stderr)?,
        };
        let cwd = c_path(&spec.cwd)?;
        // The environment goes to execve as it is built here (`ChildEnv`),
        // and the program is looked up in its PATH (the last, as there).
        let env = ChildEnv::new(&spec.env)?;
        let path = spec.env.iter().rev().find(|(k, _)| k == "PATH");
        let exec =
            spawn::Exec::new(program, args, path.map(|(_, v)| v.as_str())).map_err(
                |e| match e {
                    spawn::ExecError::Nul => LaunchError::Spawn {
                        program: program.clone(),
                        source: std::io::Error::new(
                            std::io::ErrorKind::InvalidInput,
                            "the command holds a NUL byte",
                        ),
                    },
                    spawn::ExecError::SearchPath(dirs) => LaunchError::SearchPath { dirs },
                },
            )?;
        // The streams: a terminal for all three (in a session of its
        // own, set up by the child), or each nowhere or a pipe (a file the
        // task opens itself goes nowhere until it does).
        let mut ours: [Option<OwnedFd>; 3] = [None, None, None];
        let mut theirs: [Option<OwnedFd>; 3] = [None, None, None];
        let null = spawn::dev_null().map_err(LaunchError::Setup)?;
        let mut stdio = Stdio3([null; 3]);
        match &spec.tty {
            Some(t) => stdio = Stdio3([t.as_raw_fd(); 3]),
            None => {
                for (i, io) in [&spec.stdin, &spec.stdout, &spec.stderr]
                    .into_iter()
                    .enumerate()
                {
                    if let Io::Piped = io {
                        let (r, w) = spawn::pipe().map_err(LaunchError::Setup)?;
                        let (child, parent) = if i == 0 { (r, w) } else { (w, r) };
                        stdio.0[i] = child.as_raw_fd();
                        theirs[i] = Some(child);
                        ours[i] = Some(parent);
                    }
                }
            }
        }
        let groups = switch.then(|| match &spec.groups {
            Some(gids) => gids
                .iter()
                .map(|&g| nix::unistd::Gid::from_raw(g))
                .collect(),
            None => groups_of(spec.user),
        });
        let setup = ChildSetup {
            cgroup: spec.cgroup.clone(),
            jail: spec.jail.clone(),
            user: spec.user,
            groups,
            cwd,
            files,
            fd_limit: fd_limit(),
            tty: spec.tty.is_some(),
            umask: spec.umask,
        };
        let forking = FORK_LOCK.read();
        let pid_ns = match &spec.pid_ns {
            Some(ns) => spawn::PidNs::Of(ns.fd()),
            None => spawn::PidNs::Current,
        };
        let spawned = spawn::spawn_with(
            &exec,
            stdio,
            spec.tty.is_none(),
            pid_ns,
            &|| match setup.run() {
                Ok(()) => 0,
                Err(code) => code,
            },
            // SAFETY: called in the child only, while this thread waits.
            #[allow(unsafe_code)]
            &|| unsafe { env.envp() },
        );
        drop(forking);
        drop(theirs);
        let (pid, pidfd) = spawned.map_err(|e| {
            let e = match e {
                SpawnError::Os(e) => e,
                SpawnError::Child(code) => std::io::Error::from_raw_os_error(code),
            };
            let jail = spec.jail.as_deref();
            stage_error(e, program, &spec.cwd, spec.user, &paths, jail)
        })?;
        let mut task = spawn::Task::new(pid, pidfd);
        let [stdin, stdout, stderr] = ours;
        use tokio::net::unix::pipe::{Receiver, Sender};
        task.stdin = stdin
            .map(Sender::from_owned_fd)
            .transpose()
            .map_err(LaunchError::Setup)?;
        task.stdout = stdout
            .map(Receiver::from_owned_fd)
            .transpose()
            .map_err(LaunchError::Setup)?;
        task.stderr = stderr
            .map(Receiver::from_owned_fd)
            .transpose()
            .map_err(LaunchError::Setup)?;
        Ok(task)
    }
}

/// The steps the child takes between clone and exec. A failing step
/// returns its errno tagged with the step (`stage << 16 | errno`); the
/// child leaves that number for the parent ([`crate::spawn::spawn`]), and
/// [`stage_error`] turns it back into the step's own [`LaunchError`].
mod stage {
    pub const SHIFT: i32 = 16;
    pub const IDENTITY: i32 = 1;
    pub const CHDIR: i32 = 2;
    /// + index of the file (0 to 2: outputs, then an input).
    pub const OUTPUT: i32 = 3;
    /// + index of the file (0 to 2).
    pub const OUTPUT_KIND: i32 = 10;
    pub const SETUP: i32 = 7;
    pub const JAIL: i32 = 8;
    pub const CGROUP: i32 = 9;
    pub const FOREIGN_DIR: i32 = 13;

    /// A failed jail step as one errno-sized number: errno (below 256 on
    /// Linux) in bits 0–7, the step's low byte in bits 8–15, the stage in
    /// 16–23 and the step's next 7 bits in 24–30, so up to
    /// [`shared_root::MAX_STEPS`] steps stay distinct. Arithmetic only:
    /// safe between fork and exec.
    pub fn jail(step: usize, errno: i32) -> i32 {
        let step = step as i32;
        ((step >> 8) & 0x7f) << 24 | JAIL << SHIFT | (step & 0xff) << 8 | (errno & 0xff)
    }

    /// The step and errno [`jail`] packed.
    pub fn jail_parts(raw: i32) -> (usize, i32) {
        let step = ((raw >> 24) & 0x7f) << 8 | ((raw >> 8) & 0xff);
        (step as usize, raw & 0xff)
    }
}

fn stage_error(
    e: std::io::Error,
    program: &str,
    cwd: &std::path::Path,
    user: Ident,
    outputs: &[(PathBuf, bool)],
    jail: Option<&shared_root::Prepared>,
) -> LaunchError {
    let raw = e.raw_os_error().unwrap_or(0);
    let errno = std::io::Error::from_raw_os_error(raw & 0xffff);
    // A relative file is opened in the task's directory: named with it.
    let output = |i: i32| cwd.join(outputs.get(i as usize).cloned().unwrap_or_default().0);
    let is_input = |i: i32| outputs.get(i as usize).is_some_and(|(_, input)| *input);
    match (raw >> stage::SHIFT) & 0xff {
        stage::JAIL => {
            let (step, errno) = stage::jail_parts(raw);
            match jail {
                Some(j) => LaunchError::Jail(j.error(shared_root::Failed {
                    step,
                    errno: nix::errno::Errno::from_raw(errno),
                })),
                None => LaunchError::Setup(std::io::Error::from_raw_os_error(errno)),
            }
        }
        stage::IDENTITY => LaunchError::Identity {
            uid: user.uid,
            source: errno,
        },
        stage::CHDIR => LaunchError::Chdir {
            dir: cwd.to_path_buf(),
            source: errno,
        },
        s @ (stage::OUTPUT..=5) if is_input(s - stage::OUTPUT) => LaunchError::Input {
            path: output(s - stage::OUTPUT),
            source: errno,
        },
        s @ (stage::OUTPUT..=5) => LaunchError::Output {
            path: output(s - stage::OUTPUT),
            source: errno,
        },
        s @ (stage::OUTPUT_KIND..=12) => LaunchError::OutputKind {
            path: output(s - stage::OUTPUT_KIND),
        },
        stage::FOREIGN_DIR => LaunchError::ForeignDir {
            dir: cwd.to_path_buf(),
        },
        stage::SETUP => LaunchError::Setup(errno),
        stage::CGROUP => LaunchError::Cgroup(errno),
        _ => LaunchError::Spawn {
            program: program.to_string(),
            source: e,
        },
    }
}

/// Whether a task of `user` (with `groups`) must not work in a directory
/// of these attributes (owner, group, mode): it belongs to another user
/// than root or the task's own (root's tasks may work anywhere), who may write it (or chmod it to), so what the task reads and runs
/// there is theirs (in a shared root's `/home`, anyone could have made
/// `/home/<someone else>`). A project directory shared on purpose, setgid
/// and group-writable for a group of the user's, is not. Arithmetic only:
/// safe between fork and exec.
fn foreign(
    (owner, group, mode): (u32, u32, u32),
    user: Ident,
    groups: &[nix::unistd::Gid],
) -> bool {
    if user.uid == 0 || owner == 0 || owner == user.uid || mode & 0o200 == 0 {
        return false;
    }
    let member = group == user.gid || groups.iter().any(|g| g.as_raw() == group);
    let shared = mode & 0o2000 != 0 && mode & 0o020 != 0 && member;
    !shared
}

/// The highest descriptor number a child may have inherited.
fn fd_limit() -> i32 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(soft, _)| soft.min(1 << 20) as i32)
        .unwrap_or(1 << 16)
}

/// The task's environment as exec takes it, built before the clone.
/// `SLURM_TASK_PID` is the one entry only the child knows: it writes its
/// own pid into the slot kept for it and hands the array to execve,
/// allocating nothing.
struct ChildEnv {
    /// Own what the pointers name (never touched once built, except the
    /// pid slot, through `pid_slot`).
    _entries: Vec<CString>,
    _pid: Vec<u8>,
    /// Where the pid's digits go in `_pid` (after `SLURM_TASK_PID=`).
    pid_slot: *mut u8,
    /// Null-terminated, as `environ`.
    ptrs: Vec<*const nix::libc::c_char>,
}

// SAFETY: the pointers name heap buffers owned by the same value, which
// stay where they are when it moves; they are read, and the pid slot
// written, only in the cloned child, while the thread that owns them waits.
#[allow(unsafe_code)]
unsafe impl Send for ChildEnv {}
// SAFETY: as for `Send`: the parent never reads or writes through them.
#[allow(unsafe_code)]
unsafe impl Sync for ChildEnv {}

const TASK_PID: &[u8] = b"SLURM_TASK_PID=";

impl ChildEnv {
    /// Each name once (the last value wins), as a command's `envs` would.
    fn new(env: &[(String, String)]) -> Result<ChildEnv, LaunchError> {
        let mut seen = std::collections::HashSet::with_capacity(env.len());
        let mut entries = Vec::with_capacity(env.len());
        for (k, v) in env.iter().rev() {
            if k.as_bytes() == &TASK_PID[..TASK_PID.len() - 1] || !seen.insert(k.as_str()) {
                continue;
            }
            let mut e = Vec::with_capacity(k.len() + v.len() + 2);
            e.extend_from_slice(k.as_bytes());
            e.push(b'=');
            e.extend_from_slice(v.as_bytes());
            let e = CString::new(e).map_err(|_| LaunchError::Environment { key: k.clone() })?;
            entries.push(e);
        }
        entries.reverse();
        // The name, up to 20 digits and the NUL.
        let mut pid = vec![0u8; TASK_PID.len() + 21];
        pid[..TASK_PID.len()].copy_from_slice(TASK_PID);
        let base = pid.as_mut_ptr();
        // SAFETY: TASK_PID.len() is within the buffer just made.
        #[allow(unsafe_code)]
        let pid_slot = unsafe { base.add(TASK_PID.len()) };
        let mut ptrs: Vec<*const nix::libc::c_char> = entries.iter().map(|e| e.as_ptr()).collect();
        ptrs.push(base.cast_const().cast());
        ptrs.push(std::ptr::null());
        Ok(ChildEnv {
            _entries: entries,
            _pid: pid,
            pid_slot,
            ptrs,
        })
    }

    /// In the child, last before exec: its pid into the slot, and the
    /// array for execve. Async-signal-safe: getpid and writes into memory
    /// prepared before the clone. (Never through `environ`: the child
    /// shares the agent's memory, and that is the agent's.)
    ///
    /// # Safety
    /// Only in the child between clone and exec, while the thread that
    /// owns this value waits for it (nothing else reads the slot).
    #[allow(unsafe_code)]
    unsafe fn envp(&self) -> *const *const nix::libc::c_char {
        let mut n = u64::from(nix::libc::getpid().unsigned_abs());
        let mut digits = [0u8; 20];
        let mut len = 0;
        loop {
            digits[len] = b'0' + (n % 10) as u8;
            len += 1;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        for i in 0..len {
            // SAFETY: at most 20 digits and the NUL fit the slot's 21 bytes.
            self.pid_slot.add(i).write(digits[len - 1 - i]);
        }
        self.pid_slot.add(len).write(0);
        self.ptrs.as_ptr()
    }
}

/// What the child does between clone and exec, prepared before the clone.
struct ChildSetup {
    cgroup: Option<Arc<crate::cgroup::Join>>,
    jail: Option<Arc<shared_root::Prepared>>,
    user: Ident,
    groups: Option<Vec<nix::unistd::Gid>>,
    cwd: CString,
    files: Redirects,
    fd_limit: i32,
    /// Standard input is a terminal to make the controlling one of a new
    /// session.
    tty: bool,
    umask: Option<u32>,
}

impl ChildSetup {
    /// In order: join the step's cgroup, if any; enter the jail, if any
    /// (as root: mounts need it); drop to the user; enter the working
    /// directory as the user (so a directory the user may not enter stays
    /// closed); open the output files as the user, refusing anything that
    /// is not a regular file or a terminal and never blocking (a FIFO
    /// would hang the clone in the agent); default signal handling; death
    /// with the agent; and every descriptor above 2 closed at exec (the
    /// agent may have inherited some). A failed step is its raw error:
    /// `stage << 16 | errno` ([`stage_error`] reads it back).
    ///
    /// Runs in the child [`crate::spawn::spawn`] makes, which shares the
    /// agent's memory: it calls only async-signal-safe system calls (the
    /// jail's mounts and pivot_root on strings prepared before the clone,
    /// setsid and the TIOCSCTTY ioctl on descriptor 0, setgroups, setgid,
    /// setuid, umask, chdir, open, write (of `oom_score_adj`), fstat, fcntl, dup2, close, sigaction,
    /// prctl, close_range) on data prepared before it, and allocates and
    /// writes nothing of the agent's.
    #[allow(unsafe_code)]
    fn run(&self) -> Result<(), i32> {
        use nix::errno::Errno;
        use nix::fcntl::{fcntl, open, FcntlArg, OFlag};
        use nix::sys::signal::{signal, SigHandler, Signal};
        use nix::sys::stat::{fstat, Mode, SFlag};
        use nix::unistd::{chdir, close, dup2, setgid, setgroups, setuid, Gid, Uid};
        let user = self.user;
        let fail = |stage: i32, e: Errno| (stage << stage::SHIFT) | e as i32;
        // The agent is shielded from the OOM killer and the clone inherits
        // that: a task is not (raising it back needs no privilege).
        if let Ok(fd) = open(
            c"/proc/self/oom_score_adj",
            OFlag::O_WRONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            // SAFETY: a write of a static byte to a descriptor this child
            // just opened; async-signal-safe.
            unsafe {
                nix::libc::write(fd, b"0".as_ptr().cast(), 1);
            }
            let _ = close(fd);
        }
        if self.tty {
            nix::unistd::setsid().map_err(|e| fail(stage::SETUP, e))?;
            // SAFETY: TIOCSCTTY on descriptor 0 takes an integer argument.
            if unsafe { nix::libc::ioctl(0, nix::libc::TIOCSCTTY, 0) } != 0 {
                return Err(fail(stage::SETUP, Errno::last()));
            }
        }
        if let Some(cg) = &self.cgroup {
            cg.enter().map_err(|e| fail(stage::CGROUP, e))?;
        }
        if let Some(jail) = &self.jail {
            jail.enter(&shared_root::Kernel)
                .map_err(|f| stage::jail(f.step, f.errno as i32))?;
        }
        if let Some(groups) = &self.groups {
            setgroups(groups).map_err(|e| fail(stage::IDENTITY, e))?;
            setgid(Gid::from_raw(user.gid)).map_err(|e| fail(stage::IDENTITY, e))?;
            setuid(Uid::from_raw(user.uid)).map_err(|e| fail(stage::IDENTITY, e))?;
        }
        if let Some(m) = self.umask {
            nix::sys::stat::umask(Mode::from_bits_truncate(m));
        }
        // A directory the user cannot enter (missing on this node or in
        // the jail, or closed to them): the task runs in /tmp and its
        // standard error says so, as Slurm's slurmstepd does. Tried as
        // the user, so a closed directory stays closed.
        let mut moved = None;
        if let Err(e) = chdir(self.cwd.as_c_str()) {
            chdir(c"/tmp").map_err(|_| fail(stage::CHDIR, e))?;
            moved = Some(e);
        }
        if let Some(groups) = &self.groups {
            let dir = nix::sys::stat::stat(c".").map_err(|e| fail(stage::CHDIR, e))?;
            if foreign((dir.st_uid, dir.st_gid, dir.st_mode), user, groups) {
                return Err(fail(stage::FOREIGN_DIR, Errno::EPERM));
            }
        }
        for (i, (path, fds, how)) in self.files.iter().enumerate() {
            let i = i as i32;
            let mode = match how {
                OpenAs::Append => OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_APPEND,
                OpenAs::Truncate => OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC,
                OpenAs::Read => OFlag::O_RDONLY,
            };
            let flags = mode | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
            let fd = match open(path.as_c_str(), flags, Mode::from_bits_truncate(0o644)) {
                Ok(fd) => fd,
                // A FIFO nobody reads.
                Err(Errno::ENXIO) => return Err(fail(stage::OUTPUT_KIND + i, Errno::UnknownErrno)),
                Err(e) => return Err(fail(stage::OUTPUT + i, e)),
            };
            let st = fstat(fd).map_err(|e| fail(stage::OUTPUT + i, e))?;
            let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
            if kind != SFlag::S_IFREG && kind != SFlag::S_IFCHR {
                return Err(fail(stage::OUTPUT_KIND + i, Errno::UnknownErrno));
            }
            // Blocking again; appending stays.
            let keep = if *how == OpenAs::Append {
                OFlag::O_APPEND
            } else {
                OFlag::empty()
            };
            fcntl(fd, FcntlArg::F_SETFL(keep)).map_err(|e| fail(stage::OUTPUT + i, e))?;
            for &target in fds {
                dup2(fd, target).map_err(|e| fail(stage::OUTPUT + i, e))?;
            }
            close(fd).map_err(|e| fail(stage::OUTPUT + i, e))?;
        }
        if let Some(e) = moved {
            let cwd = self.cwd.as_bytes();
            for part in [
                &b"corral-agent: error: couldn't chdir to `"[..],
                cwd,
                b"': ",
                e.desc().as_bytes(),
                b": going to /tmp instead\n",
            ] {
                // SAFETY: a write of bytes prepared before the clone (or
                // static) to descriptor 2; async-signal-safe. A lost
                // note does not stop the task.
                unsafe {
                    nix::libc::write(2, part.as_ptr().cast(), part.len());
                }
            }
        }
        // A task starts with default signal handling, whatever the agent
        // inherited (an agent started from a background shell has SIGINT
        // ignored, and a shell cannot trap what it inherits ignored).
        for sig in [
            Signal::SIGHUP,
            Signal::SIGINT,
            Signal::SIGQUIT,
            Signal::SIGTERM,
            Signal::SIGUSR1,
            Signal::SIGUSR2,
            Signal::SIGTSTP,
            Signal::SIGTTIN,
            Signal::SIGTTOU,
            Signal::SIGPIPE,
        ] {
            // SAFETY: SIG_DFL installs no handler: nothing to uphold.
            unsafe { signal(sig, SigHandler::SigDfl) }.map_err(|e| fail(stage::SETUP, e))?;
        }
        // After the uid change: changing credentials clears it.
        nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(|e| fail(stage::SETUP, e))?;
        // Descriptors the agent inherited without close-on-exec stay
        // behind: marked close-on-exec, so an exec that fails still leaves
        // them to the agent.
        // SAFETY: close_range with the CLOEXEC flag closes nothing now.
        let marked = unsafe {
            nix::libc::syscall(
                nix::libc::SYS_close_range,
                3u32,
                u32::MAX,
                nix::libc::CLOSE_RANGE_CLOEXEC,
            )
        };
        if marked != 0 {
            for fd in 3..self.fd_limit {
                // SAFETY: F_SETFD on a number that may name nothing only fails.
                let _ = unsafe { nix::libc::fcntl(fd, nix::libc::F_SETFD, nix::libc::FD_CLOEXEC) };
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::os::unix::fs::OpenOptionsExt;

    fn me() -> Ident {
        Ident {
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
        }
    }

    pub(crate) fn task(argv: &[&str], cwd: &std::path::Path, stdout: Io) -> TaskSpec {
        TaskSpec {
            tty: None,
            umask: None,
            argv: argv.iter().map(|a| a.to_string()).collect(),
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            cwd: cwd.to_path_buf(),
            user: me(),
            stdin: Io::Null,
            stdout,
            stderr: Io::Null,
            jail: None,
            groups: None,
            cgroup: None,
            pid_ns: None,
        }
    }

    /// A tiny root borrowing the host's /usr, with `/data` from `data`.
    fn jail(root: &std::path::Path, data: &std::path::Path) -> shared_root::Plan {
        shared_root::scaffold::host_usr(root, "corral-launch-jail").expect("a tiny root");
        std::fs::create_dir(root.join("data")).expect("data dir");
        let mut plan = shared_root::Plan::new(root).with_host_usr();
        plan.submounts.push(shared_root::Submount {
            name: "data".into(),
            source: data.to_path_buf(),
            target: "/data".into(),
            read_only: false,
        });
        plan
    }

    #[test]
    fn a_task_runs_in_its_jail_with_paths_of_the_jail() {
        if !nix::unistd::geteuid().is_root() {
            println!("SKIPPED (needs root): a_task_runs_in_its_jail_with_paths_of_the_jail");
            return;
        }
        let (root, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let plan = jail(root.path(), data.path());
        // The directory and the output file are the jail's paths.
        let mut spec = task(
            &[
                "/bin/sh",
                "-c",
                "cat /etc/os-release; pwd; test -e /work || echo no-host",
            ],
            std::path::Path::new("/data"),
            Io::Path("/data/out".into()),
        );
        spec.jail = Some(Arc::new(plan.prepare().unwrap()));
        let st = spawn_within(spec, 10).unwrap();
        assert!(st.success());
        let out = std::fs::read_to_string(data.path().join("out")).unwrap();
        assert_eq!(out, "ID=corral-launch-jail\n/data\nno-host\n");
    }

    /// A task sees the environment it was given, each name once (the
    /// last value), nothing of the agent's own, and its pid as
    /// `SLURM_TASK_PID` (whatever the list said); a NUL in a value is
    /// refused before anything forks.
    #[test]
    fn a_task_sees_its_environment_and_its_own_pid() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("env");
        let mut spec = task(
            &[
                "sh",
                "-c",
                "echo \"$SLURM_TASK_PID $$ $WHO ${CARGO:-none}\"",
            ],
            dir.path(),
            Io::Path(out.clone()),
        );
        spec.env.extend([
            ("WHO".to_string(), "first".to_string()),
            ("SLURM_TASK_PID".to_string(), "1".to_string()),
            ("WHO".to_string(), "last".to_string()),
        ]);
        assert!(spawn_within(spec, 10).unwrap().success());
        let got = std::fs::read_to_string(&out).unwrap();
        let words: Vec<&str> = got.split_whitespace().collect();
        assert_eq!(words.len(), 4, "{got}");
        assert_eq!(
            words[0], words[1],
            "SLURM_TASK_PID is the task's pid: {got}"
        );
        assert_ne!(words[0], "1");
        assert_eq!(&words[2..], ["last", "none"], "{got}");
        let mut bad = task(&["true"], dir.path(), Io::Null);
        bad.env.push(("X".into(), "a\0b".into()));
        assert!(matches!(
            ProcessLauncher.spawn(bad),
            Err(LaunchError::Environment { key }) if key == "X"
        ));
    }

    /// `--open-mode`: an output file is truncated by default, appended to
    /// with `Io::Append` (a requeued job's log keeps its earlier runs).
    #[test]
    fn output_files_are_truncated_or_appended_to() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let run = |text: &str, io: Io| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let spec = task(&["/bin/sh", "-c", &format!("echo {text}")], dir.path(), io);
            let st = rt
                .block_on(async { ProcessLauncher.spawn(spec).unwrap().wait().await })
                .unwrap();
            assert!(st.success());
            std::fs::read_to_string(&out).unwrap()
        };
        assert_eq!(run("one", Io::Path(out.clone())), "one\n");
        assert_eq!(run("two", Io::Append(out.clone())), "one\ntwo\n");
        assert_eq!(run("three", Io::Path(out.clone())), "three\n");
    }

    /// `srun -i FILE`: a task reads its standard input from a file it
    /// opens itself; a FIFO (which could hang it) is refused.
    #[test]
    fn standard_input_comes_from_a_file_the_task_opens() {
        let dir = tempfile::tempdir().unwrap();
        let (input, out) = (dir.path().join("in"), dir.path().join("out"));
        std::fs::write(&input, "from a file\n").unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut spec = task(&["/bin/cat"], dir.path(), Io::Path(out.clone()));
        spec.stdin = Io::Input(input);
        let st = rt
            .block_on(async { ProcessLauncher.spawn(spec).unwrap().wait().await })
            .unwrap();
        assert!(st.success());
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "from a file\n");
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let mut spec = task(&["/bin/cat"], dir.path(), Io::Null);
        spec.stdin = Io::Input(fifo.clone());
        let err = spawn_within(spec, 10).unwrap_err();
        assert!(
            matches!(err, LaunchError::OutputKind { ref path } if *path == fifo),
            "{err:?}"
        );
        // An input that is not there is said to be the input.
        let missing = dir.path().join("missing");
        let mut spec = task(&["/bin/cat"], dir.path(), Io::Path(out.clone()));
        spec.stdin = Io::Input(missing.clone());
        let err = spawn_within(spec, 10).unwrap_err();
        assert!(
            matches!(err, LaunchError::Input { ref path, .. } if *path == missing),
            "{err:?}"
        );
        assert!(err.to_string().starts_with("open input file"), "{err}");
    }

    /// A task does not keep the agent's shield from the OOM killer: its
    /// `oom_score_adj` is set back to 0 before exec. (The shield itself,
    /// -1000, needs a kernel that lets root lower it; this test raises
    /// the parent's instead, which any process may.)
    #[test]
    fn a_task_does_not_inherit_the_agents_oom_score_adj() {
        let adj = "/proc/self/oom_score_adj";
        let before = std::fs::read_to_string(adj).unwrap();
        std::fs::write(adj, "100").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("adj");
        let spec = task(&["/bin/cat", adj], dir.path(), Io::Path(out.clone()));
        let st = spawn_within(spec, 10);
        // Back as it was, whatever the task did.
        let _ = std::fs::write(adj, before.trim());
        assert!(st.unwrap().success());
        assert_eq!(std::fs::read_to_string(&out).unwrap().trim(), "0");
    }

    #[test]
    fn a_jail_failure_keeps_its_step_and_errno_for_every_possible_step() {
        for step in [0, 1, 127, 128, 200, 255, 256, shared_root::MAX_STEPS - 1] {
            for errno in [1, 2, 13, 133] {
                let raw = stage::jail(step, errno);
                assert!(raw > 0, "an errno-sized positive number");
                assert_eq!((raw >> stage::SHIFT) & 0xff, stage::JAIL);
                assert_eq!(stage::jail_parts(raw), (step, errno));
            }
        }
    }

    #[test]
    fn a_jailed_task_gets_the_groups_of_the_roots_own_files() {
        use std::os::unix::fs::PermissionsExt;
        if !nix::unistd::geteuid().is_root() {
            println!("SKIPPED (needs root): a_jailed_task_gets_the_groups_of_the_roots_own_files");
            return;
        }
        let (root, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let open = std::fs::Permissions::from_mode(0o777);
        std::fs::set_permissions(data.path(), open).unwrap();
        let plan = jail(root.path(), data.path());
        // A user only the shared root knows, in a group only it knows.
        std::fs::write(
            root.path().join("etc/passwd"),
            "jailuser:x:4242:4242::/home:/bin/sh\n",
        )
        .unwrap();
        std::fs::write(
            root.path().join("etc/group"),
            "jailuser:x:4242:\nlab:x:4343:jailuser\n",
        )
        .unwrap();
        let mut spec = task(
            &[
                "/bin/sh",
                "-c",
                "id -u; id -G; test -e /proc/1 && echo SEES-PID-1 || echo pid-1-hidden",
            ],
            std::path::Path::new("/data"),
            Io::Path("/data/ids".into()),
        );
        spec.user = Ident {
            uid: 4242,
            gid: 4242,
        };
        spec.groups = crate::jail::identity(root.path(), spec.user).1;
        spec.jail = Some(Arc::new(plan.prepare().unwrap()));
        assert!(spawn_within(spec, 10).unwrap().success());
        let ids = std::fs::read_to_string(data.path().join("ids")).unwrap();
        // The jail's /proc hides other users' processes (pid 1 is root's).
        assert_eq!(ids, "4242\n4242 4343\npid-1-hidden\n");
    }

    #[test]
    fn a_jail_that_cannot_be_entered_names_its_step() {
        if !nix::unistd::geteuid().is_root() {
            println!("SKIPPED (needs root): a_jail_that_cannot_be_entered_names_its_step");
            return;
        }
        let (root, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut plan = jail(root.path(), data.path());
        plan.submounts.push(shared_root::Submount {
            name: "scratch".into(),
            source: data.path().to_path_buf(),
            target: "/scratch".into(),
            read_only: false,
        });
        let mut spec = task(&["/bin/true"], std::path::Path::new("/"), Io::Null);
        spec.jail = Some(Arc::new(plan.prepare().unwrap()));
        let err = spawn_within(spec, 10).unwrap_err();
        let text = corral_proto::error_chain(&err);
        assert_eq!(
            text,
            format!(
                "entering the jail: submount scratch: {} at /scratch: No such file or directory (os error 2)",
                data.path().display()
            )
        );
    }

    /// Spawns on a thread of its own and gives up after `secs`: a spawn
    /// that blocks is a failure, not a hung test.
    fn spawn_within(spec: TaskSpec, secs: u64) -> Result<std::process::ExitStatus, LaunchError> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let r = rt.block_on(async {
                let mut child = ProcessLauncher.spawn(spec)?;
                Ok(child.wait().await.expect("wait"))
            });
            let _ = tx.send(r);
        });
        rx.recv_timeout(std::time::Duration::from_secs(secs))
            .expect("spawn blocked")
    }

    /// A task in a job's PID namespace is the agent's child (its exit
    /// status read through its pidfd) but sees only its namespace, where
    /// it is not PID 1, so a plain SIGTERM still ends it; the namespace's
    /// holder going takes whatever is left in it.
    #[test]
    fn a_task_in_a_jobs_pid_namespace_is_still_the_agents_child() {
        if !nix::unistd::geteuid().is_root() {
            println!(
                "SKIPPED (needs root): a_task_in_a_jobs_pid_namespace_is_still_the_agents_child"
            );
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let ns = Arc::new(
            crate::pidns::PidNamespace::held_by("/bin/sleep".as_ref(), &["1000".into()]).unwrap(),
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let out = dir.path().join("pids");
        let mut spec = task(
            &[
                "/bin/sh",
                "-c",
                "echo $$; ls /proc/1/ns >/dev/null && echo ok",
            ],
            dir.path(),
            Io::Path(out.clone()),
        );
        spec.pid_ns = Some(ns.clone());
        let mut t = ProcessLauncher.spawn(spec).unwrap();
        let host_pid = t.id().unwrap();
        let st = rt.block_on(t.wait()).unwrap();
        assert!(st.success());
        // The host's /proc is still mounted here: the namespace shows in
        // the task's own pid, 2 or above, not the host's.
        let text = std::fs::read_to_string(&out).unwrap();
        let inner: u32 = text.lines().next().unwrap().parse().unwrap();
        assert!(inner >= 2 && inner != host_pid, "{text}");
        // A plain SIGTERM ends a task there (PID 1 would ignore it).
        let mut spec = task(&["/bin/sleep", "100"], dir.path(), Io::Null);
        spec.pid_ns = Some(ns.clone());
        let mut t = ProcessLauncher.spawn(spec).unwrap();
        let pid = nix::unistd::Pid::from_raw(t.id().unwrap() as i32);
        let theirs = std::fs::read_link(format!("/proc/{pid}/ns/pid")).unwrap();
        let holder =
            std::fs::read_link(format!("/proc/{}/ns/pid", ns.holder_pid().unwrap())).unwrap();
        assert_eq!(theirs, holder, "in the holder's namespace");
        assert_ne!(theirs, std::fs::read_link("/proc/self/ns/pid").unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        use std::os::unix::process::ExitStatusExt;
        let st = rt.block_on(t.wait()).unwrap();
        assert_eq!(st.signal(), Some(15));
        // The agent's own children start in its namespace again.
        let mut t = ProcessLauncher
            .spawn(task(&["/bin/sleep", "100"], dir.path(), Io::Null))
            .unwrap();
        let back = std::fs::read_link(format!("/proc/{}/ns/pid", t.id().unwrap())).unwrap();
        assert_eq!(back, std::fs::read_link("/proc/self/ns/pid").unwrap());
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(t.id().unwrap() as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        let _ = rt.block_on(t.wait());
        // A task left in the namespace goes with its holder.
        let mut spec = task(&["/bin/sleep", "100"], dir.path(), Io::Null);
        spec.pid_ns = Some(ns.clone());
        let mut left = ProcessLauncher.spawn(spec).unwrap();
        drop(ns);
        let st = rt.block_on(left.wait()).unwrap();
        assert_eq!(st.signal(), Some(9), "killed with its namespace");
    }

    #[test]
    fn a_directory_another_user_may_change_is_foreign_unless_shared_by_group() {
        let alice = Ident {
            uid: 1000,
            gid: 1000,
        };
        let lab = [nix::unistd::Gid::from_raw(50)];
        // Hers, root's, or one its owner cannot write: hers to use.
        assert!(!foreign((1000, 1000, 0o40700), alice, &lab));
        assert!(!foreign((0, 0, 0o41777), alice, &lab));
        assert!(!foreign((1001, 1001, 0o40555), alice, &lab));
        // Bob's, however open to her: his.
        assert!(foreign((1001, 1001, 0o40777), alice, &lab));
        assert!(foreign((1001, 50, 0o40775), alice, &lab));
        assert!(foreign((1001, 1001, 0o42775), alice, &lab), "not her group");
        // A project directory of her group, setgid and group-writable.
        assert!(!foreign((1001, 50, 0o42775), alice, &lab));
        assert!(!foreign((1001, 1000, 0o42770), alice, &[]));
        assert!(!foreign(
            (1001, 1001, 0o40777),
            Ident { uid: 0, gid: 0 },
            &[]
        ));
    }

    /// As Slurm's: a working directory missing on the node runs the task
    /// in /tmp, and says so on its standard error; relative output files
    /// land there too.
    #[test]
    fn a_missing_directory_runs_the_task_in_tmp_and_says_so() {
        let tmp = tempfile::tempdir().unwrap();
        let gone = tmp.path().join("gone");
        let (out, err) = (tmp.path().join("out"), tmp.path().join("err"));
        let mut spec = task(&["sh", "-c", "pwd"], &gone, Io::Path(out.clone()));
        spec.stderr = Io::Path(err.clone());
        let st = spawn_within(spec, 10).expect("runs");
        assert!(st.success());
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "/tmp\n");
        assert_eq!(
            std::fs::read_to_string(&err).unwrap(),
            format!(
                "corral-agent: error: couldn't chdir to `{}': No such file or directory: going to /tmp instead\n",
                gone.display()
            )
        );
    }

    #[test]
    fn a_fifo_as_output_fails_the_task_without_blocking() {
        let tmp = tempfile::tempdir().unwrap();
        let fifo = tmp.path().join("ff");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
        let err =
            spawn_within(task(&["true"], tmp.path(), Io::Path(fifo.clone())), 10).unwrap_err();
        assert!(
            matches!(err, LaunchError::OutputKind { ref path } if *path == fifo),
            "{err:?}"
        );
        // With a reader on the other end the open would succeed: still refused.
        let reader = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap();
        let err =
            spawn_within(task(&["true"], tmp.path(), Io::Path(fifo.clone())), 10).unwrap_err();
        assert!(matches!(err, LaunchError::OutputKind { .. }), "{err:?}");
        drop(reader);
        // A regular file and /dev/null are fine.
        let ok = spawn_within(
            task(&["true"], tmp.path(), Io::Path(tmp.path().join("o"))),
            10,
        );
        assert!(ok.unwrap().success());
        let ok = spawn_within(
            task(&["true"], tmp.path(), Io::Path("/dev/null".into())),
            10,
        );
        assert!(ok.unwrap().success());
    }

    #[test]
    fn a_task_starts_with_only_its_three_standard_descriptors() {
        // A descriptor without close-on-exec, as an agent may inherit.
        let leaked = nix::fcntl::open(
            "/dev/null",
            nix::fcntl::OFlag::O_RDONLY,
            nix::sys::stat::Mode::empty(),
        )
        .unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("fds");
        let st = spawn_within(
            task(
                &["sh", "-c", "ls /proc/$$/fd"],
                tmp.path(),
                Io::Path(out.clone()),
            ),
            10,
        )
        .unwrap();
        nix::unistd::close(leaked).unwrap();
        assert!(st.success());
        let fds = std::fs::read_to_string(&out).unwrap();
        let fds: Vec<&str> = fds.split_whitespace().collect();
        assert_eq!(fds, ["0", "1", "2"], "descriptors of the task");
    }
}
