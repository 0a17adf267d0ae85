//! A PID namespace per jailed job on a node: its tasks see one another and
//! nothing else, so a job cannot reach the host (`/proc/<pid>/root` of a
//! process outside the jail) through `/proc`.
//!
//! The namespace's first process, its init, is a holder the agent starts
//! for the run: `corral-agent --pid-init`, which reaps what is orphaned in
//! the namespace and does nothing else. Tasks are not its children: the
//! agent's thread enters the namespace for its children (`setns` on the
//! holder's pidfd, `CLONE_NEWPID`) just for the clone of each task, so a
//! task stays the agent's child (waited for through its pidfd, its exit
//! status the agent's to read) and is never the namespace's PID 1, which
//! would ignore every signal it has no handler for (`scancel`'s SIGTERM
//! to a plain shell). The holder is killed when the run is cleaned up,
//! and with it anything still in the namespace.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use nix::libc;

/// A run's PID namespace: its holder, whose pidfd names the namespace.
#[derive(Debug)]
pub struct PidNamespace {
    holder: crate::spawn::Task,
    pidfd: OwnedFd,
}

impl PidNamespace {
    /// Starts a holder in a new PID namespace: `exe --pid-init` (the
    /// agent's own binary), its streams on `/dev/null`.
    pub fn new(exe: &std::path::Path) -> std::io::Result<PidNamespace> {
        PidNamespace::held_by(exe, &[PID_INIT.to_string()])
    }

    /// One whose holder is `program args` (tests: any long sleep).
    pub fn held_by(program: &std::path::Path, args: &[String]) -> std::io::Result<PidNamespace> {
        let program = program.to_string_lossy().into_owned();
        let exec = crate::spawn::Exec::new(&program, args, None)
            .map_err(|_| std::io::Error::other("the agent's path holds a NUL byte"))?;
        let null = crate::spawn::dev_null()?;
        let stdio = crate::spawn::Stdio3([null; 3]);
        let empty: [*const libc::c_char; 1] = [std::ptr::null()];
        let envp = Envp(empty.as_ptr());
        let spawned =
            crate::spawn::spawn_with(&exec, stdio, true, crate::spawn::PidNs::New, &|| 0, &|| {
                envp.get()
            });
        let (pid, pidfd) = spawned.map_err(|e| match e {
            crate::spawn::SpawnError::Os(e) => e,
            crate::spawn::SpawnError::Child(code) => std::io::Error::from_raw_os_error(code),
        })?;
        let ours = pidfd.try_clone()?;
        Ok(PidNamespace {
            holder: crate::spawn::Task::new(pid, pidfd),
            pidfd: ours,
        })
    }

    /// Whether this kernel gives jobs namespaces of their own: one made,
    /// entered and left (entering by pidfd needs Linux 5.8). Why not, if not.
    pub fn supported(exe: &std::path::Path) -> Result<(), std::io::Error> {
        let ns = PidNamespace::new(exe)?;
        drop(Entered::enter(ns.fd())?);
        Ok(())
    }

    /// What a task's spawn enters: the holder's pidfd.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.pidfd.as_fd()
    }

    /// Kills the holder, with everything left in the namespace, and waits
    /// for it to be gone.
    pub async fn end(mut self) {
        self.kill();
        let _ = self.holder.wait().await;
    }

    fn kill(&self) {
        // SAFETY: pidfd_send_signal on a pidfd this process owns.
        #[allow(unsafe_code)]
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            );
        }
    }

    /// The holder's pid (in the agent's namespace).
    pub fn holder_pid(&self) -> Option<u32> {
        self.holder.id()
    }
}

impl Drop for PidNamespace {
    /// Kills the holder, and with it everything left in the namespace;
    /// the holder is reaped in the background.
    fn drop(&mut self) {
        self.kill();
    }
}

/// An environment pointer the spawn's closure may hand to the child.
struct Envp(*const *const libc::c_char);

impl Envp {
    fn get(&self) -> *const *const libc::c_char {
        self.0
    }
}
// SAFETY: it points at an empty, null-terminated array on the caller's
// stack that outlives the spawn, read only by the child.
#[allow(unsafe_code)]
unsafe impl Sync for Envp {}

/// The argument that makes `corral-agent` a namespace's holder.
pub const PID_INIT: &str = "--pid-init";

/// The holder's life, as PID 1 of a job's namespace: reap every child the
/// namespace orphans to it, until it is killed. Never returns.
pub fn holder_main() -> ! {
    // SAFETY: plain signal-mask calls and waits on this process's own
    // children; nothing is allocated.
    #[allow(unsafe_code)]
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        loop {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::sigwaitinfo(&set, &mut info);
            while libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) > 0 {}
        }
    }
}

/// Makes the calling thread's children start in the PID namespace of the
/// process `pidfd` names, and puts it back when dropped.
pub(crate) struct Entered {
    own: OwnedFd,
}

impl Entered {
    pub(crate) fn enter(pidfd: BorrowedFd<'_>) -> std::io::Result<Entered> {
        // The thread's own namespace, to come back to.
        let own = OwnedFd::from(std::fs::File::open("/proc/thread-self/ns/pid")?);
        nix::sched::setns(pidfd, nix::sched::CloneFlags::CLONE_NEWPID)?;
        Ok(Entered { own })
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        if let Err(e) = nix::sched::setns(&self.own, nix::sched::CloneFlags::CLONE_NEWPID) {
            // The thread's later children would start in the job's
            // namespace: nothing safe is left to do.
            eprintln!("corral-agent: cannot return to the agent's PID namespace: {e}");
            std::process::abort();
        }
    }
}
