//! An interactive step on this node: dial srun back, start the tasks with
//! pipes, stream their output up and their stdin and signals down.

use std::sync::Arc;
use std::time::Duration;

use corral_proto::msg::{ExitStatus, Launch, SignalTo, StepDown, StepIo, StepUp, TaskFiles};
use corral_proto::{read_frame, tls, write_frame};
use nix::sys::signal::Signal;
use std::os::fd::{AsRawFd, OwnedFd};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::agent::{error_chain, Agent, StepError};
use crate::launch::{Io, TaskSpec};
use crate::procs::signal_group;
use crate::task::{expand_pattern, PatternVars};

async fn pump<R: AsyncRead + Unpin>(mut r: R, task: u32, stderr: bool, tx: mpsc::Sender<StepUp>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let msg = StepUp::Output {
                    task,
                    stderr,
                    data: buf[..n].to_vec(),
                };
                if tx.send(msg).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// A terminal for `--pty`: (master, slave), the slave the task's user's
/// (through its descriptor) and writable by it alone.
fn open_terminal(user: corral_proto::msg::Ident) -> nix::Result<(OwnedFd, OwnedFd)> {
    let pty = nix::pty::openpty(None, None)?;
    nix::unistd::fchown(
        pty.slave.as_raw_fd(),
        Some(nix::unistd::Uid::from_raw(user.uid)),
        Some(nix::unistd::Gid::from_raw(user.gid)),
    )?;
    nix::sys::stat::fchmod(
        pty.slave.as_raw_fd(),
        nix::sys::stat::Mode::from_bits_truncate(0o620),
    )?;
    Ok((pty.master, pty.slave))
}

nix::ioctl_write_ptr_bad!(tiocswinsz, nix::libc::TIOCSWINSZ, nix::pty::Winsize);

/// Sets the terminal's size (its foreground process group gets SIGWINCH).
#[allow(unsafe_code)]
fn set_window_size(master: &OwnedFd, rows: u16, cols: u16) {
    let ws = nix::pty::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one `winsize` from the pointer, which
    // points at `ws`, alive for the call; the descriptor is open (owned).
    let _ = unsafe { tiocswinsz(master.as_raw_fd(), &ws) };
}

/// Where one task's standard streams go: streamed to and from srun (task
/// 0 alone reads srun's input), or the files `srun -o/-e/-i` name, each
/// pattern expanded for this task (the error stream goes with the output
/// when only `-o` is given; `-i none` reads nothing).
pub(crate) fn task_io(
    l: &Launch,
    files: &TaskFiles,
    node: &str,
    user: &str,
    task: u32,
) -> (Io, Io, Io) {
    let vars = PatternVars {
        job: l.job.0,
        name: &l.name,
        node,
        user,
        step: Some(l.step.0),
        array: l.array.map(|a| (a.job.0, a.task)),
        task: Some(task),
        node_index: Some(l.node_index),
    };
    // Relative to the directory the task starts in (its working
    // directory, or /tmp when that cannot be entered).
    let file = |p: &str| std::path::PathBuf::from(expand_pattern(p, &vars));
    let stdin = match files.stdin.as_deref() {
        Some("none") => Io::Null,
        Some(p) => Io::Input(file(p)),
        None if task == 0 => Io::Piped,
        None => Io::Null,
    };
    let stdout = files
        .stdout
        .as_deref()
        .map_or(Io::Piped, |p| Io::Path(file(p)));
    let stderr = match (files.stderr.as_deref(), files.stdout.as_deref()) {
        (Some(p), _) | (None, Some(p)) => Io::Path(file(p)),
        (None, None) => Io::Piped,
    };
    (stdin, stdout, stderr)
}

/// srun's connection, with the step's hello sent on it.
type Dialed = (quinn::Connection, quinn::SendStream, quinn::RecvStream);

/// srun's connection being made. The agent starts it as a step's launch
/// arrives, so the QUIC and TLS handshake (a few milliseconds: the larger
/// part of a short `srun`'s time here) goes on while the step's cgroup is
/// made and its tasks start. Dropped unfinished, it is abandoned.
pub(crate) struct Dialing {
    addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<Result<Dialed, StepError>>,
}

impl Drop for Dialing {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Dials srun for this node's part of the step `l` and says hello.
pub(crate) fn dial(agent: &Arc<Agent>, l: &Launch, io: StepIo) -> Dialing {
    let endpoint = agent.endpoint.clone();
    let hello = StepUp::Hello {
        secret: io.secret,
        node: agent.name().to_string(),
        node_index: l.node_index,
        step_nodes: l.step_nodes,
        ntasks: l.ntasks,
        tasks: (l.first_task..l.first_task + l.tasks_here).collect(),
    };
    let task = tokio::spawn(async move {
        let cfg = tls::pinned_client_config(io.cert_sha256).map_err(StepError::Pin)?;
        let dial = |e: Box<dyn std::error::Error + Send + Sync>| StepError::Dial {
            addr: io.addr,
            source: e,
        };
        let conn = endpoint
            .connect_with(cfg, io.addr, "srun")
            .map_err(|e| dial(e.into()))?
            .await
            .map_err(|e| dial(e.into()))?;
        let (mut send, recv) = conn.open_bi().await.map_err(StepError::Stream)?;
        write_frame(&mut send, &hello)
            .await
            .map_err(StepError::Hello)?;
        Ok((conn, send, recv))
    });
    Dialing {
        addr: io.addr,
        task,
    }
}

/// Tells srun this node's part of the step failed before any task ran
/// (its cgroup could not be made, the run is ending): without it, srun
/// inside an allocation waits for a dial-back that never comes. Best
/// effort, a few seconds at most: srun that cannot be reached is not
/// waiting either.
pub(crate) async fn tell_failed(mut dialing: Dialing, message: String) {
    let told = async {
        let Ok(Ok((conn, mut send, _recv))) = (&mut dialing.task).await else {
            return;
        };
        if write_frame(&mut send, &StepUp::Failed { message })
            .await
            .is_ok()
        {
            let _ = send.finish();
            let _ = send.stopped().await;
        }
        conn.close(0u32.into(), b"failed");
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), told).await;
}

/// Runs this node's tasks of a step; returns the worst exit. The tasks
/// start while `dialing` is still under way; their output waits for it,
/// and if srun cannot be reached they are killed and the step fails.
pub(crate) async fn run(
    agent: &Arc<Agent>,
    l: &Launch,
    argv: &[String],
    files: &TaskFiles,
    cgroup: Option<Arc<crate::cgroup::Join>>,
    mut dialing: Dialing,
) -> Result<ExitStatus, StepError> {
    let (user, groups) = agent.user_of(l);
    let jail = agent.jail_for(l, groups.as_deref())?;
    let pid_ns = agent.pid_ns_for(l, jail.is_some())?;
    let tasks: Vec<u32> = (l.first_task..l.first_task + l.tasks_here).collect();

    // Up to srun: once connected, everything the tasks send, in order;
    // if the connection never comes, nothing (drained so no task waits).
    let (tx, mut rx) = mpsc::channel::<StepUp>(256);
    let (connected, on_connect) = tokio::sync::oneshot::channel();
    let addr = dialing.addr;
    let writer = tokio::spawn(async move {
        let dialed = match (&mut dialing.task).await {
            Ok(r) => r,
            Err(e) => Err(StepError::Dial {
                addr,
                source: e.into(),
            }),
        };
        match dialed {
            Ok((conn, mut send, recv)) => {
                let _ = connected.send(Ok((conn, recv)));
                while let Some(msg) = rx.recv().await {
                    if write_frame(&mut send, &msg).await.is_err() {
                        break;
                    }
                }
                let _ = send.finish();
                Some(send)
            }
            Err(e) => {
                let _ = connected.send(Err(e));
                while rx.recv().await.is_some() {}
                None
            }
        }
    });

    let run = l.job_run();
    let mut stdin0 = None;
    let mut waits = Vec::new();
    let mut opened = std::collections::HashSet::new();
    // `--pty`: task 0's terminal, whose size srun sets.
    let mut terminal: Option<Arc<OwnedFd>> = None;
    for (local, &task) in tasks.iter().enumerate() {
        let mut tty = None;
        if task == 0 && files.pty {
            match open_terminal(l.user) {
                Ok((master, slave)) => {
                    terminal = Some(Arc::new(master));
                    tty = Some(slave);
                }
                Err(e) => {
                    let text = format!("corral-agent: error: no terminal for --pty: {e}\n");
                    let _ = tx
                        .send(StepUp::Output {
                            task,
                            stderr: true,
                            data: text.into_bytes(),
                        })
                        .await;
                }
            }
        }
        let (stdin, mut stdout, mut stderr) = task_io(l, files, agent.name(), &user, task);
        // Tasks here sharing a file: the first truncates it (its open is
        // done once its spawn returns), the others append.
        for io in [&mut stdout, &mut stderr] {
            if let Io::Path(p) = io {
                if !opened.insert(p.clone()) {
                    *io = Io::Append(p.clone());
                }
            }
        }
        let on_terminal = tty.is_some();
        let spec = TaskSpec {
            pid_ns: pid_ns.clone(),
            tty,
            umask: crate::task::umask_of(&l.env),
            cgroup: cgroup.clone(),
            groups: groups.clone(),
            jail: jail.clone(),
            argv: argv.to_vec(),
            env: agent.env_for(l, &user, groups.as_deref(), local as u32),
            cwd: l.work_dir.clone().into(),
            user: l.user,
            stdin,
            stdout,
            stderr,
        };
        match agent.cfg.launcher.spawn(spec) {
            Ok(mut child) => {
                let pgid = child.id();
                if let Some(pid) = pgid {
                    // Recorded before its wait starts, so the exit always
                    // comes after.
                    if !agent.add_groups(run, l.step, &[pid]) {
                        signal_group(pid, Signal::SIGKILL);
                    }
                }
                let mut out = None;
                match terminal.as_ref().filter(|_| on_terminal) {
                    // The terminal's other side: output from it, input to it.
                    Some(m) => {
                        let side = || -> Option<tokio::fs::File> {
                            let fd = m.try_clone().ok()?;
                            Some(tokio::fs::File::from_std(std::fs::File::from(fd)))
                        };
                        out = side().map(|r| tokio::spawn(pump(r, task, false, tx.clone())));
                        stdin0 = side().map(|w| Box::new(w) as Box<dyn AsyncWrite + Unpin + Send>);
                    }
                    None if task == 0 => {
                        stdin0 = child
                            .stdin
                            .take()
                            .map(|w| Box::new(w) as Box<dyn AsyncWrite + Unpin + Send>);
                    }
                    None => {}
                }
                let out = out.or_else(|| {
                    child
                        .stdout
                        .take()
                        .map(|o| tokio::spawn(pump(o, task, false, tx.clone())))
                });
                let err = child
                    .stderr
                    .take()
                    .map(|e| tokio::spawn(pump(e, task, true, tx.clone())));
                let tx = tx.clone();
                let agent = agent.clone();
                let step = l.step;
                waits.push(tokio::spawn(async move {
                    let st = child
                        .wait()
                        .await
                        .map(ExitStatus::from)
                        .unwrap_or(ExitStatus {
                            code: 1,
                            signal: None,
                        });
                    // A step ends with its task: what it left running in its
                    // process group goes too (and releases the pipes).
                    if let Some(g) = pgid {
                        agent.group_exited(run, step, g);
                    }
                    // Output first, then the exit: srun prints in order.
                    for h in [out, err].into_iter().flatten() {
                        let _ = tokio::time::timeout(Duration::from_secs(2), h).await;
                    }
                    let _ = tx.send(StepUp::TaskExit { task, exit: st }).await;
                    st
                }));
            }
            Err(e) => {
                let text = format!("corral-agent: error: {}: {}\n", argv[0], error_chain(&e));
                let _ = tx
                    .send(StepUp::Output {
                        task,
                        stderr: true,
                        data: text.into_bytes(),
                    })
                    .await;
                let st = ExitStatus {
                    code: 2,
                    signal: None,
                };
                let _ = tx.send(StepUp::TaskExit { task, exit: st }).await;
                waits.push(tokio::spawn(async move { st }));
            }
        }
    }
    drop(tx);
    // Its tasks are in: the step's cgroup descriptors need not stay open.
    drop(cgroup);

    let dialed = match on_connect.await {
        Ok(r) => r,
        Err(e) => Err(StepError::Dial {
            addr,
            source: e.into(),
        }),
    };
    let (conn, mut recv) = match dialed {
        Ok(c) => c,
        Err(e) => {
            // No srun to serve: the tasks that started go, and the step
            // fails as it did when the dial came first.
            agent.signal(run, SignalTo::Step(l.step), Signal::SIGKILL);
            for w in waits {
                let _ = w.await;
            }
            let _ = writer.await;
            return Err(e);
        }
    };

    // srun → tasks: stdin to task 0, signals to the live ones.
    let sig_agent = agent.clone();
    let step = l.step;
    let reader = tokio::spawn(async move {
        loop {
            match read_frame::<_, StepDown>(&mut recv).await {
                Ok(Some(StepDown::Stdin(data))) => {
                    if let Some(w) = stdin0.as_mut() {
                        // Flushed: a terminal's side is written from a
                        // blocking thread, and only a flush waits for it.
                        if w.write_all(&data).await.is_err() || w.flush().await.is_err() {
                            stdin0 = None;
                        }
                    }
                }
                Ok(Some(StepDown::StdinEof)) => stdin0 = None,
                Ok(Some(StepDown::Signal(s))) => {
                    if let Ok(sig) = Signal::try_from(s) {
                        sig_agent.signal(run, SignalTo::Step(step), sig);
                    }
                }
                Ok(Some(StepDown::WindowSize { rows, cols })) => {
                    if let Some(m) = &terminal {
                        set_window_size(m, rows, cols);
                    }
                }
                Ok(None) | Err(_) => return,
            }
        }
    });

    let mut worst = ExitStatus::default();
    for w in waits {
        let st = w.await.unwrap_or(ExitStatus {
            code: 1,
            signal: None,
        });
        if st.code > worst.code {
            worst = st;
        }
    }
    if let Ok(Some(send)) = writer.await {
        // Give srun the chance to read everything before the connection
        // goes; it closes once every task of the step has exited.
        let _ = tokio::time::timeout(Duration::from_secs(5), send.stopped()).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), conn.closed()).await;
    reader.abort();
    Ok(worst)
}

/// An IPv6 UDP socket with receive offload (`UDP_GRO`) on, held for the
/// agent's life, bound to nothing (it receives nothing) and closed on
/// exec.
///
/// Why: each srun (and salloc) on this node opens a QUIC endpoint, and
/// quinn probes the kernel's offloads on a throwaway IPv6 socket. Turning
/// `UDP_GRO` on for the first IPv6 socket in the system flips a kernel
/// static key, and closing the last one flips it back: both patch kernel
/// text on every CPU. While this socket is open the key stays on, so a
/// step's srun pays neither (`hyperfine -N 'srun -N1 true'` on `corral up`,
/// 3 alternations: p50 9.2-9.6 ms without it, 8.5-9.3 ms with it; srun's
/// system time 1.7-2.3 ms against 1.6-1.8 ms). None where the kernel has
/// no IPv6 or no UDP offload: nothing to keep on.
#[allow(unsafe_code)]
pub fn hold_udp_offload_key() -> Option<OwnedFd> {
    use nix::libc;
    use std::os::fd::FromRawFd;
    // SAFETY: socket(2) takes no pointers.
    let fd = unsafe { libc::socket(libc::AF_INET6, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: as above: a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let on: libc::c_int = 1;
    // SAFETY: the option value points at `on`, alive for the call, and
    // the length is its size; the descriptor is open (owned above).
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_UDP,
            libc::UDP_GRO,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    (r == 0).then_some(fd)
}

#[cfg(test)]
mod offload_tests {
    use super::*;

    #[test]
    fn the_held_socket_has_receive_offload_on_and_is_closed_on_exec() {
        // A kernel without IPv6 has no key to hold; this one has both.
        let Some(fd) = hold_udp_offload_key() else {
            panic!("no IPv6 UDP socket with UDP_GRO on this machine");
        };
        let mut on: nix::libc::c_int = 0;
        let mut len = std::mem::size_of::<nix::libc::c_int>() as nix::libc::socklen_t;
        // SAFETY: `on` and `len` are alive for the call and `len` is
        // `on`'s size; the descriptor is open.
        #[allow(unsafe_code)]
        let r = unsafe {
            nix::libc::getsockopt(
                fd.as_raw_fd(),
                nix::libc::SOL_UDP,
                nix::libc::UDP_GRO,
                (&mut on as *mut nix::libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(r, 0, "getsockopt UDP_GRO");
        assert_eq!(on, 1);
        let flags =
            nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_GETFD).expect("F_GETFD");
        assert_ne!(flags & nix::libc::FD_CLOEXEC, 0);
    }
}
