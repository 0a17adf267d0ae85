//! The `corral` multi-call binary: one file per command. Called as
//! `sbatch …` (a symlink) or `corral sbatch …`. Each command parses its
//! arguments with clap, talks to the local agent, prints in Slurm's
//! layouts, and reports a mistake as one `CMD: error: …` line with a
//! non-zero exit.

use std::ffi::OsString;

use corral_proto::msg::JobId;
use std::future::Future;

pub mod assoc;
pub mod certs;
pub mod format;
pub mod jail;
pub mod jail_shell;
pub mod opts;
pub mod sacct;
pub mod salloc;
pub mod sbatch;
pub mod scancel;
pub mod scontrol;
pub mod sinfo;
pub mod squeue;
pub mod srun;
pub mod up;
pub mod words;

/// The commands `corral` answers to by name.
pub const COMMANDS: [&str; 10] = [
    "sbatch", "srun", "salloc", "squeue", "sinfo", "scancel", "scontrol", "sacct", "sacctmgr",
    "sshare",
];

/// Prints `CMD: error: MESSAGE` (each line of a message of several) and
/// gives the exit code 1.
pub fn fail(cmd: &str, msg: impl std::fmt::Display) -> i32 {
    let mut text = String::new();
    for line in msg.to_string().lines() {
        text.push_str(&format!("{cmd}: error: {line}\n"));
    }
    // Nowhere to say it (a closed stderr) leaves only the exit code.
    let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), text.as_bytes());
    1
}

/// Writes a command's whole output to stdout in one piece and gives its
/// exit code. A reader that stopped early (`scontrol show hostnames
/// $SLURM_JOB_NODELIST | head -n1`) is not an error: 0, quietly, so a
/// script under `set -o pipefail` goes on. Any other failure to write (a
/// full disk) is one error line and 1.
pub fn emit(cmd: &str, text: &str) -> i32 {
    emit_with(cmd, |out| std::io::Write::write_all(out, text.as_bytes()))
}

/// [`emit`] of what `write` writes to standard output.
pub fn emit_with(
    cmd: &str,
    write: impl FnOnce(&mut std::io::StdoutLock<'static>) -> std::io::Result<()>,
) -> i32 {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match write(&mut out).and_then(|()| out.flush()) {
        Ok(()) => 0,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(e) => fail(cmd, format!("writing the output: {e}")),
    }
}

/// Lets a pipe on standard output hold `bytes` at once (up to the 1 MiB
/// an unprivileged process may ask for), so that a long output is written
/// in one go and the command ends without waiting, 64 KiB at a time, for
/// its reader (`squeue | wc -l`). Standard output that is not a pipe, a
/// pipe already that large, or a refusal (the user's pipe pages spent)
/// is left as it is.
pub fn room_in_pipe(bytes: usize) {
    use std::os::fd::AsRawFd as _;
    grow_pipe(std::io::stdout().as_raw_fd(), bytes);
}

/// [`room_in_pipe`] of the pipe `fd` writes to.
fn grow_pipe(fd: std::os::fd::RawFd, bytes: usize) {
    use nix::fcntl::{fcntl, FcntlArg};
    const MOST: usize = 1 << 20;
    let want = bytes.min(MOST);
    match fcntl(fd, FcntlArg::F_GETPIPE_SZ) {
        Ok(now) if usize::try_from(now).is_ok_and(|n| n < want) => {
            let _ = fcntl(fd, FcntlArg::F_SETPIPE_SZ(want as nix::libc::c_int));
        }
        _ => {}
    }
}

/// `println!` that neither panics on a closed stdout nor dies of
/// SIGPIPE: a line of a long-running command's chatter (`corral up`).
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        let _ = std::io::Write::write_all(
            &mut std::io::stdout().lock(),
            format!("{}\n", format_args!($($arg)*)).as_bytes(),
        );
    }};
}

/// Lets SIGPIPE end this process, as it ends Slurm's `srun` when its
/// reader goes away (the other commands write once and take EPIPE as the
/// end instead).
pub fn sigpipe_ends_the_process() {
    // SAFETY: restoring the default disposition installs no handler; it
    // is called at the start of srun's main, before its runtime starts
    // any thread.
    #[allow(unsafe_code)]
    unsafe {
        let _ = nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigDfl,
        );
    }
}

/// Turns a clap outcome into an exit: help and version print as usual,
/// a mistake becomes one line.
pub fn parse<T: clap::Parser>(cmd: &str, args: &[OsString]) -> Result<T, i32> {
    T::try_parse_from(args).map_err(|e| match e.kind() {
        clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
            let _ = e.print();
            0
        }
        _ => {
            let text = e.to_string();
            let line = text
                .lines()
                .next()
                .unwrap_or("invalid arguments")
                .trim_start_matches("error: ");
            fail(cmd, line)
        }
    })
}

/// Runs a command's async body on a small runtime.
pub fn block_on<F: Future<Output = i32>>(cmd: &str, f: F) -> i32 {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => {
            let code = rt.block_on(f);
            // A read of stdin may still block in a helper thread.
            rt.shutdown_background();
            code
        }
        Err(e) => fail(cmd, e),
    }
}

/// A user's name from the node's passwd, or the uid as text. Remembered:
/// squeue asks once per job, and each lookup reads the user database.
pub fn user_name(uid: u32) -> String {
    let mut name = String::new();
    with_user_name(uid, |n| name.push_str(n));
    name
}

/// Lends a user's name (see [`user_name`]) without copying it.
pub fn with_user_name(uid: u32, f: impl FnOnce(&str)) {
    type Last = std::cell::RefCell<Option<(u32, String)>>;
    thread_local! {
        static NAMES: std::cell::RefCell<std::collections::HashMap<u32, String>> =
            Default::default();
        /// The last one lent: a listing's lines are mostly one user's,
        /// and squeue hashed the same uid for each of ten thousand.
        static LAST: Last = const { std::cell::RefCell::new(None) };
    }
    LAST.with_borrow_mut(|last| {
        if last.as_ref().is_none_or(|(u, _)| *u != uid) {
            let name = NAMES.with_borrow_mut(|names| {
                names.entry(uid).or_insert_with(|| passwd_name(uid)).clone()
            });
            *last = Some((uid, name));
        }
        if let Some((_, name)) = last {
            f(name)
        }
    })
}

/// A user's name as the node's passwd has it, or the uid as text.
fn passwd_name(uid: u32) -> String {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_else(|| uid.to_string())
}

/// A group's name, or the gid as text. Remembered, as user names are.
pub fn group_name(gid: u32) -> String {
    thread_local! {
        static NAMES: std::cell::RefCell<std::collections::HashMap<u32, String>> =
            Default::default();
    }
    NAMES.with(|names| {
        names
            .borrow_mut()
            .entry(gid)
            .or_insert_with(|| {
                nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid))
                    .ok()
                    .flatten()
                    .map(|g| g.name)
                    .unwrap_or_else(|| gid.to_string())
            })
            .clone()
    })
}

/// A user given by name or number.
pub fn parse_user(s: &str) -> Result<u32, String> {
    if let Ok(uid) = s.parse::<u32>() {
        return Ok(uid);
    }
    nix::unistd::User::from_name(s)
        .ok()
        .flatten()
        .map(|u| u.uid.as_raw())
        .ok_or_else(|| format!("Invalid user: {s}"))
}

/// A comma-separated list of job ids.
pub fn parse_ids(s: &str) -> Result<Vec<JobId>, String> {
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.trim()
                .parse::<u64>()
                .map(JobId)
                .map_err(|_| format!("Invalid job id specified: {p}"))
        })
        .collect()
}

fn usage() -> i32 {
    eprintln!(
        "usage: corral COMMAND [ARGS]\n\ncommands: sbatch srun salloc squeue sinfo scancel scontrol sacct\n          up (a cluster on this machine), sim (trace replay), certs (cluster certificates),\n          jail (prepare and check a shared root)"
    );
    2
}

/// `corral sim ARGS` runs `corral-sim ARGS`, found beside this binary or
/// on `PATH`. The replay (charts, trace decoding) stays out of the binary
/// every `sbatch` starts, which keeps its start-up small.
fn sim(args: &[OsString]) -> i32 {
    use std::os::unix::process::CommandExt;
    let beside = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("corral-sim")))
        .filter(|p| p.is_file());
    let program = beside.unwrap_or_else(|| "corral-sim".into());
    let err = std::process::Command::new(&program)
        .arg0("corral sim")
        .args(&args[1..])
        .exec();
    eprintln!(
        "corral sim: error: cannot run {}: {err} (build it with `cargo build -p corral-replay`)",
        program.display()
    );
    1
}

/// Entry point of the multi-call binary; returns the exit code.
pub fn main(argv: Vec<OsString>) -> i32 {
    let prog = argv
        .first()
        .and_then(|p| std::path::Path::new(p).file_name())
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (cmd, args) = if COMMANDS.contains(&prog.as_str()) {
        (prog, argv)
    } else {
        match argv.get(1) {
            Some(c) => (c.to_string_lossy().into_owned(), argv[1..].to_vec()),
            None => return usage(),
        }
    };
    match cmd.as_str() {
        "sbatch" => sbatch::main(&args),
        "srun" => srun::main(&args),
        "salloc" => salloc::main(&args),
        "squeue" => squeue::main(&args),
        "sinfo" => sinfo::main(&args),
        "scancel" => scancel::main(&args),
        "scontrol" => scontrol::main(&args),
        "sacct" => sacct::main(&args),
        "sacctmgr" => assoc::sacctmgr_main(&args),
        "sshare" => assoc::sshare_main(&args),
        "up" => up::main(&args),
        "certs" => certs::main(&args),
        "jail" => jail::main(&args),
        "sim" => sim(&args),
        "-h" | "--help" | "help" => {
            usage();
            0
        }
        "-V" | "--version" => emit("corral", &format!("corral {}\n", env!("CARGO_PKG_VERSION"))),
        other => {
            eprintln!("corral: error: unknown command {other}");
            usage()
        }
    }
}

#[cfg(test)]
mod tests {
    use nix::fcntl::{fcntl, FcntlArg};
    use std::os::fd::AsRawFd as _;

    /// A pipe grows to hold a long output (up to 1 MiB), never shrinks,
    /// and what is not a pipe is left alone.
    #[test]
    fn a_pipe_grows_to_hold_a_long_output() {
        let (r, w) = nix::unistd::pipe().unwrap();
        let size = || fcntl(w.as_raw_fd(), FcntlArg::F_GETPIPE_SZ).unwrap() as usize;
        let before = size();
        super::grow_pipe(w.as_raw_fd(), 300_000);
        assert!(size() >= 300_000 && size() > before, "{}", size());
        let grown = size();
        super::grow_pipe(w.as_raw_fd(), 1_000);
        assert_eq!(size(), grown, "not shrunk");
        super::grow_pipe(w.as_raw_fd(), 64 << 20);
        assert!(size() <= 1 << 20, "{}", size());
        drop(r);
        let file = tempfile::tempfile().unwrap();
        super::grow_pipe(file.as_raw_fd(), 300_000);
    }
}
