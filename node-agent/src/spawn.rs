//! Starting a process without copying the agent.
//!
//! `fork` copies the agent's page tables and marks every writable page
//! copy-on-write; the child then faults on the pages it touches before
//! exec, exec throws the copy away, and the agent's own threads fault
//! again on each page they write next. `cargo bench -p benches --bench
//! launch` (`/bin/true` started and waited for from a process holding an
//! agent's 10 MiB): 1.24–1.32 ms by fork/exec, 0.58–0.60 ms through this
//! module. [`spawn`] does what `posix_spawn` does:
//! `clone(CLONE_VM | CLONE_VFORK)`, the child running on a stack of its
//! own in the agent's memory while the calling thread waits for its exec
//! (or exit), and nothing copied.
//!
//! What that asks of the child, and how it is kept:
//! - It shares the agent's memory: it allocates nothing, writes nothing
//!   the agent reads (but the one error word it leaves when it fails, read
//!   after it is gone), and never returns from its function: it execs or
//!   `_exit`s. The code it runs is the launcher's setup, which already had
//!   to be async-signal-safe between fork and exec.
//! - No handler of the agent's may run in it: every signal is blocked in
//!   the calling thread before the clone and in the child until each
//!   handled signal is back to its default; the task starts with an empty
//!   mask, as a child of `std::process::Command` does.
//! - The environment is passed to `execve` (never through `environ`, which
//!   is the agent's).
//! - The program is looked up in the task's `PATH` as `execvp` would,
//!   each candidate made before the clone.
//!
//! The task is waited for through a pidfd (from the clone itself, so the
//! pid cannot be reused before it is opened) registered with tokio: no
//! signal handler, and no other waiter takes its status.

use std::ffi::{c_int, c_void, CString};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::{AtomicI32, Ordering};

use nix::errno::Errno;
use nix::libc;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

const READABLE: Interest = Interest::READABLE;

/// The child's stack: the launcher's setup and the jail's steps run on
/// it (they allocate nothing and do not recurse); a guard page below it,
/// so an overflow faults instead of writing over the agent's memory.
const STACK: usize = 256 << 10;
const GUARD: usize = 4 << 10;

/// What `execvp` needs, made before the clone: the candidates for the
/// program (one when it names a path), the argument and environment
/// arrays, and room to run a file without a `#!` line through `/bin/sh`.
#[derive(Debug)]
pub struct Exec {
    paths: Vec<CString>,
    _args: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    /// `/bin/sh`, the candidate (put in by the child), the arguments.
    sh_argv: Vec<*const libc::c_char>,
}

// SAFETY: the pointers name the `CString`s owned by the same value (heap
// buffers that stay put when it moves) or static strings; only the child
// writes (one slot of `sh_argv`), while the thread that owns the value
// waits for it.
#[allow(unsafe_code)]
unsafe impl Send for Exec {}
// SAFETY: as for `Send`.
#[allow(unsafe_code)]
unsafe impl Sync for Exec {}

const SH: &std::ffi::CStr = c"/bin/sh";
/// The search path when the task has no `PATH` (glibc's `_CS_PATH`).
const DEFAULT_PATH: &str = "/bin:/usr/bin";

/// Why a command cannot be exec'd as given.
#[derive(Debug, PartialEq, Eq)]
pub enum ExecError {
    /// The program or an argument holds a NUL byte.
    Nul,
    /// The task's `PATH` lists more directories than are searched.
    SearchPath(usize),
}

/// The most `PATH` elements searched. The path comes from the job's
/// environment, which may be megabytes: each element is a candidate made
/// by the root agent, and tried by an exec while the thread that started
/// the task waits.
pub const MAX_SEARCH_DIRS: usize = 4096;

impl Exec {
    /// `program` looked up in `path` (the task's `PATH`) as `execvp`
    /// does: a name with a slash is used as it is; an empty element is
    /// the working directory.
    pub fn new(program: &str, args: &[String], path: Option<&str>) -> Result<Exec, ExecError> {
        let nul = |_| ExecError::Nul;
        let paths = if program.contains('/') {
            vec![CString::new(program).map_err(nul)?]
        } else {
            let path = path.unwrap_or(DEFAULT_PATH);
            let dirs = path.split(':').count();
            if dirs > MAX_SEARCH_DIRS {
                return Err(ExecError::SearchPath(dirs));
            }
            path.split(':')
                .map(|dir| match dir {
                    "" => CString::new(program),
                    d => CString::new(format!("{}/{program}", d.trim_end_matches('/'))),
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(nul)?
        };
        let mut all = Vec::with_capacity(args.len() + 1);
        all.push(CString::new(program).map_err(nul)?);
        for a in args {
            all.push(CString::new(a.as_str()).map_err(nul)?);
        }
        let mut argv: Vec<*const libc::c_char> = all.iter().map(|a| a.as_ptr()).collect();
        argv.push(std::ptr::null());
        let mut sh_argv = vec![SH.as_ptr(), std::ptr::null()];
        sh_argv.extend(all[1..].iter().map(|a| a.as_ptr()));
        sh_argv.push(std::ptr::null());
        Ok(Exec {
            paths,
            _args: all,
            argv,
            sh_argv,
        })
    }

    /// In the child: exec each candidate in turn, as `execvp` does (past
    /// a missing file or a directory it may not search, on to the next);
    /// a file the kernel cannot run goes to `/bin/sh`. Returns only on
    /// failure, with the errno.
    ///
    /// # Safety
    /// In the cloned child only, with `envp` a null-terminated array that
    /// outlives the call.
    #[allow(unsafe_code)]
    unsafe fn exec(&self, envp: *const *const libc::c_char) -> Errno {
        let mut denied = false;
        for p in &self.paths {
            libc::execve(p.as_ptr(), self.argv.as_ptr(), envp);
            match Errno::last() {
                Errno::EACCES => denied = true,
                Errno::ENOENT
                | Errno::ENOTDIR
                | Errno::ESTALE
                | Errno::ENODEV
                | Errno::ETIMEDOUT => {}
                Errno::ENOEXEC => {
                    // The one slot of the array the child writes.
                    let slot = self.sh_argv.as_ptr().cast_mut().add(1);
                    slot.write(p.as_ptr());
                    libc::execve(SH.as_ptr(), self.sh_argv.as_ptr(), envp);
                    return Errno::last();
                }
                e => return e,
            }
        }
        if denied {
            Errno::EACCES
        } else {
            Errno::ENOENT
        }
    }
}

/// The descriptors a child's standard streams become (each dup'ed onto
/// 0, 1, 2 in the child; they stay open in the caller).
#[derive(Clone, Copy, Debug)]
pub struct Stdio3(pub [RawFd; 3]);

/// What the child runs: `setup` (returns a raw error, as the launcher's
/// stages encode it, or 0), then the exec. Shared with the child through
/// its one argument.
struct Shared<'a> {
    stdio: Stdio3,
    process_group: bool,
    setup: &'a (dyn Fn() -> i32 + Sync),
    exec: &'a Exec,
    envp: &'a (dyn Fn() -> *const *const libc::c_char + Sync),
    /// Left by a child that did not exec: a launcher stage's raw error,
    /// or an exec errno.
    error: AtomicI32,
}

/// The child's whole life: never returns.
#[allow(unsafe_code)]
extern "C" fn child_main(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `Shared` of `spawn`'s frame, which waits (the
    // clone is a vfork) until this child has exec'd or exited.
    let s = unsafe { &*(arg as *const Shared<'_>) };
    let error = match unsafe { child_steps(s) } {
        Ok(never) => match never {},
        Err(code) => code,
    };
    s.error.store(error, Ordering::Release);
    // SAFETY: _exit runs no atexit handlers or destructors (the memory
    // is the agent's).
    unsafe { libc::_exit(127) }
}

/// Signals back to their defaults, the standard streams, the process
/// group, the caller's setup, an empty mask, exec.
///
/// # Safety
/// In the cloned child only (see [`child_main`]).
#[allow(unsafe_code)]
unsafe fn child_steps(s: &Shared<'_>) -> Result<std::convert::Infallible, i32> {
    // Handlers of the agent's are the agent's code: none may run here.
    // Everything is still blocked (the caller's mask), so resetting them
    // before unblocking anything is enough.
    for sig in 1..=libc::SIGRTMAX() {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
            continue;
        }
        if old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
        }
    }
    for (target, &fd) in s.stdio.0.iter().enumerate() {
        let target = target as RawFd;
        let r = if fd == target {
            // Already in place: only close-on-exec to clear.
            libc::fcntl(fd, libc::F_SETFD, 0)
        } else {
            libc::dup2(fd, target)
        };
        if r < 0 {
            return Err(Errno::last() as i32);
        }
    }
    if s.process_group && libc::setpgid(0, 0) != 0 {
        return Err(Errno::last() as i32);
    }
    match (s.setup)() {
        0 => {}
        code => return Err(code),
    }
    let envp = (s.envp)();
    let mut none: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut none);
    libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    Err(s.exec.exec(envp) as i32)
}

/// The child's stack, with a guard page below it; unmapped on drop.
struct Stack {
    base: *mut c_void,
    len: usize,
}

impl Stack {
    #[allow(unsafe_code)]
    fn new() -> std::io::Result<Stack> {
        let len = STACK + GUARD;
        // SAFETY: a fresh private anonymous mapping; nothing else names it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let stack = Stack { base, len };
        // SAFETY: the lowest page of the mapping just made.
        if unsafe { libc::mprotect(base, GUARD, libc::PROT_NONE) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// The top, 16-byte aligned (the mapping is page-aligned).
    #[allow(unsafe_code)]
    fn top(&self) -> *mut c_void {
        // SAFETY: one past the end of the mapping, which clone's stack wants.
        unsafe { self.base.cast::<u8>().add(self.len).cast() }
    }
}

impl Drop for Stack {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made; the child that used it has
        // exec'd or exited.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// Why [`spawn`] gave no task.
#[derive(Debug)]
pub enum SpawnError {
    /// The clone itself (or its stack) failed.
    Os(std::io::Error),
    /// The child failed before exec: the raw code it left.
    Child(i32),
}

/// The PID namespace a child starts in.
#[derive(Clone, Copy, Debug)]
pub enum PidNs<'a> {
    /// The agent's.
    Current,
    /// A new one, the child its PID 1 (a job's holder, [`crate::pidns`]).
    New,
    /// That of the process this pidfd names (a job's holder).
    Of(std::os::fd::BorrowedFd<'a>),
}

/// Starts a child that runs `setup` and then execs `exec` with the
/// environment `envp` returns (called in the child), its standard streams
/// `stdio`, in a process group of its own when `process_group`. Returns
/// once it has exec'd, with its pid and a pidfd.
///
/// `setup` and `envp` run in a child that shares the caller's memory:
/// they must be async-signal-safe, allocate nothing, and write nothing
/// the caller's process reads.
pub fn spawn(
    exec: &Exec,
    stdio: Stdio3,
    process_group: bool,
    setup: &(dyn Fn() -> i32 + Sync),
    envp: &(dyn Fn() -> *const *const libc::c_char + Sync),
) -> Result<(u32, OwnedFd), SpawnError> {
    spawn_with(exec, stdio, process_group, PidNs::Current, setup, envp)
}

/// [`spawn`], the child in the PID namespace `pid_ns` says: for
/// [`PidNs::Of`], the calling thread's children start there for this
/// clone alone (`setns`, undone before this returns), so the child is
/// still this process's.
#[allow(unsafe_code)]
pub fn spawn_with(
    exec: &Exec,
    stdio: Stdio3,
    process_group: bool,
    pid_ns: PidNs<'_>,
    setup: &(dyn Fn() -> i32 + Sync),
    envp: &(dyn Fn() -> *const *const libc::c_char + Sync),
) -> Result<(u32, OwnedFd), SpawnError> {
    let stack = Stack::new().map_err(SpawnError::Os)?;
    let entered = match pid_ns {
        PidNs::Of(fd) => Some(crate::pidns::Entered::enter(fd).map_err(SpawnError::Os)?),
        PidNs::Current | PidNs::New => None,
    };
    let new_ns = if matches!(pid_ns, PidNs::New) {
        libc::CLONE_NEWPID
    } else {
        0
    };
    let shared = Shared {
        stdio,
        process_group,
        setup,
        exec,
        envp,
        error: AtomicI32::new(0),
    };
    let mut pidfd: c_int = -1;
    // SAFETY: sigset_t is plain data, filled by sigfillset.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: blocking every signal in this thread until the child has
    // exec'd (the child inherits the mask; no agent handler runs in it),
    // then restoring the mask. The clone: the child runs `child_main` on
    // `stack` with `shared`, both alive in this frame, which the vfork
    // keeps waiting until the child has exec'd or exited; CLONE_PIDFD
    // puts the pidfd in `pidfd`.
    let pid = unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::clone(
            child_main,
            stack.top(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | new_ns | libc::SIGCHLD,
            &shared as *const Shared<'_> as *mut c_void,
            &mut pidfd as *mut c_int,
        );
        let err = std::io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        drop(entered);
        if pid < 0 {
            return Err(SpawnError::Os(err));
        }
        pid
    };
    drop(stack);
    // SAFETY: CLONE_PIDFD gave this descriptor to this process; nothing
    // else owns it.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    match shared.error.load(Ordering::Acquire) {
        0 => Ok((pid as u32, pidfd)),
        code => {
            // It has exited (the vfork returned without an exec): reap it.
            let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
            Err(SpawnError::Child(code))
        }
    }
}

/// A started task: its pid, its pidfd, the parent's ends of its piped
/// streams. Waited for with [`Task::wait`]; one dropped unwaited is
/// reaped in the background.
#[derive(Debug)]
pub struct Task {
    pid: u32,
    pidfd: Option<OwnedFd>,
    watched: Option<AsyncFd<OwnedFd>>,
    status: Option<std::process::ExitStatus>,
    pub stdin: Option<tokio::net::unix::pipe::Sender>,
    pub stdout: Option<tokio::net::unix::pipe::Receiver>,
    pub stderr: Option<tokio::net::unix::pipe::Receiver>,
}

impl Task {
    pub fn new(pid: u32, pidfd: OwnedFd) -> Task {
        Task {
            pid,
            pidfd: Some(pidfd),
            watched: None,
            status: None,
            stdin: None,
            stdout: None,
            stderr: None,
        }
    }

    /// Its pid (the id of its process group too): `Some` always, as
    /// tokio's child says until it is reaped.
    pub fn id(&self) -> Option<u32> {
        self.status.is_none().then_some(self.pid)
    }

    /// Its status, once it has ended; `None` while it runs.
    fn reap(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
        let pid = nix::unistd::Pid::from_raw(self.pid as i32);
        let raw = match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, code)) => (code & 0xff) << 8,
            Ok(WaitStatus::Signaled(_, sig, core)) => sig as i32 | if core { 0x80 } else { 0 },
            Ok(_) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let st = std::process::ExitStatus::from_raw(raw);
        self.status = Some(st);
        self.pidfd = None;
        self.watched = None;
        Ok(Some(st))
    }

    /// Waits for it to end and reaps it. Cancel-safe: a wait dropped
    /// half-way leaves the task to the next.
    pub async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        if let Some(st) = self.status {
            return Ok(st);
        }
        if self.watched.is_none() {
            let fd = self.pidfd.take().ok_or(std::io::ErrorKind::NotFound)?;
            // SAFETY: an `OwnedFd` stays open, and the same, until the
            // `AsyncFd` holding it is dropped.
            #[allow(unsafe_code)]
            let watched = unsafe { AsyncFd::register_with_interest(fd, READABLE) };
            self.watched = Some(watched?);
        }
        loop {
            if let Some(st) = self.reap()? {
                return Ok(st);
            }
            let watched = self.watched.as_ref().ok_or(std::io::ErrorKind::NotFound)?;
            // A pidfd is readable once its process has ended.
            let mut ready = watched.readable().await?;
            ready.clear_ready();
        }
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        if self.status.is_some() || matches!(self.reap(), Ok(Some(_)) | Err(_)) {
            return;
        }
        // Still running: reaped when it ends, as tokio reaps its orphans.
        let fd = self
            .watched
            .take()
            .map(AsyncFd::into_inner)
            .or(self.pidfd.take());
        let Some(fd) = fd else { return };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut rest = Task::new(self.pid, fd);
        handle.spawn(async move {
            let _ = rest.wait().await;
        });
    }
}

/// A pipe for one of a task's streams: (the child's end, the parent's
/// end), both close-on-exec (the child's is dup'ed onto its number).
pub fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    Ok((r, w))
}

/// `/dev/null`, opened once for every task's streams that go nowhere.
pub fn dev_null() -> std::io::Result<RawFd> {
    static NULL: std::sync::OnceLock<OwnedFd> = std::sync::OnceLock::new();
    if let Some(fd) = NULL.get() {
        return Ok(fd.as_raw_fd());
    }
    let fd = nix::fcntl::open(
        "/dev/null",
        nix::fcntl::OFlag::O_RDWR | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    // Another thread's, if it was first (this one is closed).
    let _ = NULL.set(owned(fd));
    Ok(NULL.get().map_or(-1, |f| f.as_fd().as_raw_fd()))
}

#[allow(unsafe_code)]
fn owned(fd: RawFd) -> OwnedFd {
    // SAFETY: a descriptor just returned by open(2), owned by no one else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

#[cfg(test)]
mod tests {
    use super::{Exec, ExecError, MAX_SEARCH_DIRS};
    use crate::launch::{Io, Launcher, ProcessLauncher, TaskSpec};
    use std::os::unix::fs::PermissionsExt;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// A task of this process's user with only `path` as its PATH.
    fn spec(argv: &[&str], dir: &std::path::Path, path: &str, stdout: Io) -> TaskSpec {
        let mut spec = crate::launch::tests::task(argv, dir, stdout);
        spec.env = vec![("PATH".into(), path.into())];
        spec
    }

    /// The candidates, as execvp tries them: a name with a slash as it
    /// is; each PATH element (an empty one is the working directory);
    /// glibc's default without a PATH; a NUL anywhere refused.
    #[test]
    fn candidates_follow_execvp() {
        let names = |e: Exec| -> Vec<String> {
            e.paths
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect()
        };
        let e = Exec::new("./run", &[], Some("/bin")).unwrap();
        assert_eq!(names(e), ["./run"]);
        let e = Exec::new("x", &["a".into()], Some("/opt/bin/::rel")).unwrap();
        assert_eq!(names(e), ["/opt/bin/x", "x", "rel/x"]);
        assert_eq!(
            names(Exec::new("x", &[], None).unwrap()),
            ["/bin/x", "/usr/bin/x"]
        );
        assert_eq!(
            Exec::new("x", &["a\0b".into()], None).unwrap_err(),
            ExecError::Nul
        );
        assert_eq!(Exec::new("x\0", &[], None).unwrap_err(), ExecError::Nul);
        // A path of a job's own making is bounded; a name with a slash
        // searches nothing.
        let long = ":".repeat(MAX_SEARCH_DIRS);
        let err = Exec::new("x", &[], Some(&long)).unwrap_err();
        assert_eq!(err, ExecError::SearchPath(MAX_SEARCH_DIRS + 1));
        assert!(Exec::new("./x", &[], Some(&long)).is_ok());
        let most = ":".repeat(MAX_SEARCH_DIRS - 1);
        let e = Exec::new("x", &[], Some(&most)).unwrap();
        assert_eq!(names(e).len(), MAX_SEARCH_DIRS);
    }

    fn script(path: &std::path::Path, text: &str, mode: u32) {
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// The program is looked up in the task's PATH, not the agent's, as
    /// execvp would: past a directory without it and past a file there
    /// that may not be run, to the first that may; a file without `#!`
    /// runs through /bin/sh; a name found nowhere fails the spawn.
    #[test]
    fn the_program_is_found_in_the_tasks_path_as_execvp_finds_it() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b, c) = (
            tmp.path().join("a"),
            tmp.path().join("b"),
            tmp.path().join("c"),
        );
        for d in [&a, &b, &c] {
            std::fs::create_dir(d).unwrap();
        }
        // Not executable: skipped.
        script(&b.join("hello"), "#!/bin/sh\necho from-b\n", 0o644);
        // No `#!`: run by /bin/sh, with its arguments.
        script(&c.join("hello"), "echo from-c \"$1\"\n", 0o755);
        let out = tmp.path().join("out");
        let path = format!("{}:{}:{}", a.display(), b.display(), c.display());
        let rt = rt();
        let st = rt.block_on(async {
            let io = Io::Path(out.clone());
            let mut task = ProcessLauncher
                .spawn(spec(&["hello", "arg"], tmp.path(), &path, io))
                .unwrap();
            task.wait().await.unwrap()
        });
        assert!(st.success());
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "from-c arg\n");
        let fails = |path: &std::path::Path| {
            let path = path.to_str().unwrap();
            let spawned = rt.block_on(async {
                ProcessLauncher.spawn(spec(&["hello"], tmp.path(), path, Io::Null))
            });
            corral_proto::error_chain(&spawned.unwrap_err())
        };
        // Found nowhere: the spawn fails, naming the program.
        let text = fails(&a);
        assert!(text.starts_with("execve hello: No such file"), "{text}");
        // Only one that may not be run: permission denied, as execvp says.
        let text = fails(&b);
        assert!(
            text.starts_with("execve hello: Permission denied"),
            "{text}"
        );
    }

    /// The spawning thread blocks every signal while the child runs in
    /// the agent's memory; the task still starts with none blocked, even
    /// one the spawning thread had blocked itself (and with the agent's
    /// handlers gone, as after any exec).
    #[test]
    fn a_task_starts_with_no_signal_blocked() {
        use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow, Signal};
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("status");
        let rt = rt();
        let st = rt.block_on(async {
            // A handler of the process's own, and a signal blocked here.
            let _usr1 =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())
                    .unwrap();
            let mut blocked = SigSet::empty();
            blocked.add(Signal::SIGUSR2);
            pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&blocked), None).unwrap();
            let spawned = ProcessLauncher.spawn(spec(
                &["cat", "/proc/self/status"],
                tmp.path(),
                "/usr/bin:/bin",
                Io::Path(out.clone()),
            ));
            pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&blocked), None).unwrap();
            spawned.unwrap().wait().await.unwrap()
        });
        assert!(st.success());
        let status = std::fs::read_to_string(&out).unwrap();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(str::trim)
                .unwrap_or("missing")
                .to_string()
        };
        assert_eq!(field("SigBlk:"), "0000000000000000", "{status}");
        assert_eq!(field("SigCgt:"), "0000000000000000", "{status}");
    }

    /// A task's piped output reaches the agent, and its status is the
    /// one it exited with; a task dropped without a wait is still reaped
    /// (no zombie left behind).
    #[test]
    fn piped_output_exit_status_and_no_zombie_for_a_dropped_task() {
        let tmp = tempfile::tempdir().unwrap();
        let rt = rt();
        rt.block_on(async {
            use tokio::io::AsyncReadExt;
            let mut task = ProcessLauncher
                .spawn(spec(
                    &["sh", "-c", "echo out; exit 3"],
                    tmp.path(),
                    "/usr/bin:/bin",
                    Io::Piped,
                ))
                .unwrap();
            let mut text = String::new();
            task.stdout
                .take()
                .unwrap()
                .read_to_string(&mut text)
                .await
                .unwrap();
            assert_eq!(text, "out\n");
            let st = task.wait().await.unwrap();
            assert_eq!(st.code(), Some(3));
            assert_eq!(task.id(), None, "no pid once reaped");
            let task = ProcessLauncher
                .spawn(spec(
                    &["sleep", "0.2"],
                    tmp.path(),
                    "/usr/bin:/bin",
                    Io::Null,
                ))
                .unwrap();
            let pid = task.id().unwrap();
            drop(task);
            let proc_dir = std::path::PathBuf::from(format!("/proc/{pid}"));
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while proc_dir.exists() && std::time::Instant::now() < deadline {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            assert!(!proc_dir.exists(), "task {pid} left unreaped");
        });
    }
}
