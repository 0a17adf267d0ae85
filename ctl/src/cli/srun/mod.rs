//! `srun`: run a command as a job (or as a step of the allocation it is
//! called in) with its output streamed back live.
//!
//! srun opens its own QUIC endpoint with a throwaway certificate; the
//! launch carries its address, the certificate's hash and a secret, and the
//! agents of the step's nodes dial back. Output arrives per task, stdin
//! goes to task 0, Ctrl-C is forwarded to the tasks and a second Ctrl-C
//! within a second cancels. The exit code is the highest of the tasks'.

use std::collections::HashMap;
use std::ffi::OsString;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use corral_proto::msg::{
    JobFilter, JobId, JobKind, JobState, LocalRequest, Request, Response, StepDown, StepIo,
    StepSpec, StepUp,
};
use corral_proto::{read_frame, tls, write_frame};
use parking_lot::Mutex;
use ring::rand::SecureRandom;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, Notify};

mod terminal;
mod watch;

use watch::{Action, Event, Watcher};

use super::opts::JobOpts;
use super::{block_on, fail, parse};
use crate::client::Client;

const CMD: &str = "srun";

/// Run a parallel job.
#[derive(Debug, Parser)]
#[command(name = "srun", version, args_override_self = true)]
pub struct SrunArgs {
    #[command(flatten)]
    pub job: JobOpts,
    /// Prefix each output line with its task id.
    #[arg(short = 'l', long)]
    pub label: bool,
    /// Pass output on as it comes (srun does so already: accepted).
    #[arg(short = 'u', long)]
    pub unbuffered: bool,
    /// CPU binding of tasks (accepted: tasks are held to the job's CPUs by
    /// its cgroup, not bound one by one).
    #[arg(long = "cpu-bind", alias = "cpu_bind")]
    pub cpu_bind: Option<String>,
    /// MPI wiring: none (the default) or pmix (accepted: no PMIx server
    /// runs; tasks see Slurm's variables only).
    #[arg(long, value_parser = ["none", "pmix", "pmi2"])]
    pub mpi: Option<String>,
    /// End the step when a task exits non-zero (0: do not).
    #[arg(
        short = 'K',
        long = "kill-on-bad-exit",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "1"
    )]
    pub kill_on_bad_exit: Option<u8>,
    /// Run as a step of this job of one's own (a shell on one's job's node).
    #[arg(long)]
    pub jobid: Option<u64>,
    /// Inside a job: share CPUs and GPUs with the job's other steps rather
    /// than wait for ones they do not hold.
    #[arg(long)]
    pub overlap: bool,
    /// Inside a job: hold only the CPUs the step's tasks ask for on each
    /// node (`--exclusive` and `-c` do the same), so steps run side by
    /// side; without it a step holds all of the job's CPUs on its nodes.
    #[arg(long)]
    pub exact: bool,
    /// Each task's standard output to a file on its node (patterns: %t
    /// task, %n node of the step, %N node name, %j job, %s step, %x, %u).
    #[arg(short = 'o', long)]
    pub output: Option<String>,
    /// Each task's standard error to a file (default: with -o's).
    #[arg(short = 'e', long)]
    pub error: Option<String>,
    /// Each task's standard input from a file (a pattern as -o), or
    /// `none`.
    #[arg(short = 'i', long)]
    pub input: Option<String>,
    /// Task 0 on a terminal of its own, driven by this one (an
    /// interactive shell: `srun --pty bash`).
    #[arg(long)]
    pub pty: bool,
    /// The command and its arguments.
    #[arg(required = true, trailing_var_arg = true)]
    pub command: Vec<String>,
}

/// Output of one task, cut into lines (as Slurm's srun without
/// `--unbuffered`: two tasks' lines never mix), labelled with `-l`.
#[derive(Debug, Default)]
struct Labeller {
    partial: HashMap<(u32, bool), Vec<u8>>,
}

/// The most of a line kept back waiting for its end; past it, what was
/// kept goes out as it is.
const MAX_PARTIAL: usize = 64 << 10;

impl Labeller {
    /// Complete lines of `data`, each with the label when `width` says
    /// one; keeps the rest (up to [`MAX_PARTIAL`]).
    fn feed(&mut self, task: u32, stderr: bool, data: &[u8], width: Option<usize>) -> Vec<u8> {
        let buf = self.partial.entry((task, stderr)).or_default();
        buf.extend_from_slice(data);
        let mut out = Vec::new();
        while let Some(i) = buf.iter().position(|&b| b == b'\n') {
            if let Some(width) = width {
                out.extend_from_slice(format!("{task:>width$}: ").as_bytes());
            }
            out.extend(buf.drain(..=i));
        }
        if buf.len() > MAX_PARTIAL {
            if let Some(width) = width {
                out.extend_from_slice(format!("{task:>width$}: ").as_bytes());
            }
            out.append(buf);
        }
        out
    }

    /// Whatever is left of a task's output once it exits (labelled, on a
    /// line of its own).
    fn flush(&mut self, task: u32, stderr: bool, width: Option<usize>) -> Vec<u8> {
        match self.partial.remove(&(task, stderr)) {
            Some(rest) if !rest.is_empty() => match width {
                Some(width) => {
                    let mut out = format!("{task:>width$}: ").into_bytes();
                    out.extend(rest);
                    out.push(b'\n');
                    out
                }
                None => rest,
            },
            _ => Vec::new(),
        }
    }
}

/// What the nodes' links share with srun's loop (the counting and the
/// rules live in [`watch::Watcher`]).
#[derive(Debug, Default)]
struct Progress {
    /// Tasks of the step, for label widths.
    ntasks: u32,
    links: Vec<mpsc::UnboundedSender<StepDown>>,
    stdin_link: Option<mpsc::UnboundedSender<StepDown>>,
    failures: Vec<String>,
}

impl Session {
    /// The link to task 0's node, once it dialed in (every waiter is
    /// woken: stdin's pump and, with --pty, the window size's).
    async fn stdin_link(&self) -> mpsc::UnboundedSender<StepDown> {
        loop {
            let ready = self.stdin_ready.notified();
            tokio::pin!(ready);
            // Registered before looking, so a wake between is not lost.
            ready.as_mut().enable();
            if let Some(l) = self.progress.lock().stdin_link.clone() {
                return l;
            }
            ready.await;
        }
    }
}

#[derive(Debug)]
struct Session {
    secret: [u8; 32],
    label: bool,
    /// Task output goes out in whole lines (not `--unbuffered`).
    lines: bool,
    progress: Mutex<Progress>,
    /// Events for the watcher, in the order they happened.
    events: mpsc::UnboundedSender<Event>,
    /// Wakes the stdin pump once task 0's node has dialed in.
    stdin_ready: Notify,
    labeller: Mutex<Labeller>,
    /// The step's output files srun writes itself.
    sinks: Sinks,
    /// srun's own standard output and error, where writing to them
    /// cannot wait (see [`Stream::of`]).
    own: [Stream; 2],
}

/// One of srun's own standard streams, and how it is served.
///
/// tokio reads and writes the standard streams on its blocking pool (a
/// terminal or pipe may make a call wait), which costs srun a thread for
/// each and a hand-off for each write. A regular file and `/dev/null`
/// never make a call wait, and they are what srun has inside a batch
/// job: its output goes to the job's file, its input is `/dev/null`. So
/// those are written on the session's own thread, and `/dev/null` as
/// input is its end at once, with no reader at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stream {
    /// A terminal, pipe, socket or anything else that may block.
    Waits,
    /// A regular file.
    File,
    /// `/dev/null`.
    Null,
}

impl Stream {
    fn of(fd: std::os::fd::BorrowedFd<'_>) -> Stream {
        use nix::sys::stat::{fstat, major, minor, SFlag};
        let Ok(st) = fstat(std::os::fd::AsRawFd::as_raw_fd(&fd)) else {
            return Stream::Waits;
        };
        let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
        if kind == SFlag::S_IFREG {
            Stream::File
        } else if kind == SFlag::S_IFCHR && major(st.st_rdev) == 1 && minor(st.st_rdev) == 3 {
            Stream::Null
        } else {
            Stream::Waits
        }
    }

    fn waits(self) -> bool {
        self == Stream::Waits
    }
}

/// An output file srun writes: one for the whole step, shared by its
/// standard output and error when both go there.
type Sink = Arc<Mutex<std::fs::File>>;

/// A step's output named once for all its tasks (a name without `%t`,
/// `%n` or `%N`) is written here, from the tasks' output as it comes, as
/// Slurm's srun does: tasks on several nodes each opening the one file
/// would truncate and overwrite one another's lines.
#[derive(Debug, Default)]
struct Sinks {
    stdout: Option<Sink>,
    stderr: Option<Sink>,
}

/// Which of `-o` and `-e` srun writes itself (the patterns, unexpanded);
/// the rest go to the tasks' nodes as before.
fn own_files(output: Option<&str>, error: Option<&str>) -> (Option<String>, Option<String>) {
    use corral_proto::pattern::names_task_or_node as each;
    let out = output.filter(|o| !each(o));
    let err = match (error, output) {
        // Standard error alone to the nodes' files would follow their
        // standard output's (per task): leave both to the nodes.
        (Some(e), Some(o)) if !each(e) && each(o) => None,
        (Some(e), _) => (!each(e)).then_some(e),
        (None, _) => out,
    };
    (out.map(Into::into), err.map(Into::into))
}

impl Sinks {
    /// Opens (truncating) the files srun writes, named for the step.
    fn open(
        own: &(Option<String>, Option<String>),
        cwd: &std::path::Path,
        v: &corral_proto::pattern::PatternVars<'_>,
    ) -> Result<Sinks, String> {
        let path = |p: &str| cwd.join(corral_proto::pattern::expand_pattern(p, v));
        let open = |p: &std::path::Path| -> Result<Sink, String> {
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(p)
                .map(|f| Arc::new(Mutex::new(f)))
                .map_err(|e| format!("Could not open output file {}: {e}", p.display()))
        };
        let out = own.0.as_deref().map(path);
        let err = own.1.as_deref().map(path);
        let stdout = out.as_deref().map(open).transpose()?;
        let stderr = match (&err, &out, &stdout) {
            (Some(e), Some(o), Some(f)) if e == o => Some(f.clone()),
            (Some(e), _, _) => Some(open(e)?),
            (None, _, _) => None,
        };
        Ok(Sinks { stdout, stderr })
    }
}

impl Session {
    fn width(&self) -> usize {
        let n = self.progress.lock().ntasks.max(1) - 1;
        n.to_string().len()
    }

    /// The label's width, when lines are labelled.
    fn label_width(&self) -> Option<usize> {
        self.label.then(|| self.width())
    }

    async fn output(&self, task: u32, stderr: bool, data: &[u8]) {
        let bytes = if self.lines {
            let w = self.label_width();
            self.labeller.lock().feed(task, stderr, data, w)
        } else {
            data.to_vec()
        };
        self.emit(stderr, &bytes).await;
    }

    /// Output to its file, if srun writes one, or to srun's own stream.
    async fn emit(&self, stderr: bool, bytes: &[u8]) {
        let sink = if stderr {
            &self.sinks.stderr
        } else {
            &self.sinks.stdout
        };
        match sink {
            Some(f) => {
                use std::io::Write;
                if let Err(e) = f.lock().write_all(bytes) {
                    eprintln!("{CMD}: error: writing output: {e}");
                }
            }
            None => write_out(stderr, self.own[usize::from(stderr)], bytes).await,
        }
    }
}

async fn write_out(stderr: bool, stream: Stream, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    if !stream.waits() {
        use std::io::Write;
        let _ = if stderr {
            std::io::stderr().lock().write_all(bytes)
        } else {
            let mut o = std::io::stdout().lock();
            o.write_all(bytes).and_then(|()| o.flush())
        };
    } else if stderr {
        let mut e = tokio::io::stderr();
        let _ = e.write_all(bytes).await;
        let _ = e.flush().await;
    } else {
        let mut o = tokio::io::stdout();
        let _ = o.write_all(bytes).await;
        let _ = o.flush().await;
    }
}

async fn agent_link(s: Arc<Session>, conn: quinn::Connection) {
    let Ok((mut send, mut recv)) = conn.accept_bi().await else {
        return;
    };
    let hello =
        tokio::time::timeout(Duration::from_secs(10), read_frame::<_, StepUp>(&mut recv)).await;
    let (node, tasks) = match hello {
        Ok(Ok(Some(StepUp::Hello {
            secret,
            node,
            step_nodes,
            ntasks,
            tasks,
            ..
        }))) if secret == s.secret => {
            s.progress.lock().ntasks = ntasks;
            let _ = s.events.send(Event::NodeDialed {
                at: Instant::now(),
                step_nodes,
                ntasks,
            });
            (node, tasks)
        }
        _ => {
            conn.close(1u32.into(), b"who are you");
            return;
        }
    };
    let (tx, mut rx) = mpsc::unbounded_channel::<StepDown>();
    {
        let mut p = s.progress.lock();
        p.links.push(tx.clone());
        if tasks.contains(&0) {
            p.stdin_link = Some(tx);
            s.stdin_ready.notify_waiters();
        }
    }
    tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            if write_frame(&mut send, &m).await.is_err() {
                break;
            }
        }
    });
    loop {
        match read_frame::<_, StepUp>(&mut recv).await {
            Ok(Some(StepUp::Output { task, stderr, data })) => s.output(task, stderr, &data).await,
            Ok(Some(StepUp::TaskExit { task, exit })) => {
                if s.lines {
                    let w = s.label_width();
                    for stderr in [false, true] {
                        let rest = s.labeller.lock().flush(task, stderr, w);
                        s.emit(stderr, &rest).await;
                    }
                }
                if !exit.success() {
                    s.progress.lock().failures.push(match exit.signal {
                        Some(sig) => format!("{node}: task {task}: {}", signal_words(sig)),
                        None => format!("{node}: task {task}: Exited with exit code {}", exit.code),
                    });
                }
                let _ = s.events.send(Event::TaskExited { exit });
            }
            Ok(Some(StepUp::Failed { message })) => {
                s.progress
                    .lock()
                    .failures
                    .push(format!("{node}: {message}"));
                // None of this node's tasks will run: each counts as
                // exited, failed, so the step ends when the rest do.
                let exit = corral_proto::msg::ExitStatus {
                    code: 1,
                    signal: None,
                };
                for _ in &tasks {
                    let _ = s.events.send(Event::TaskExited { exit });
                }
            }
            Ok(Some(StepUp::Hello { .. })) => {}
            Ok(None) | Err(_) => break,
        }
    }
}

fn random_secret() -> Result<[u8; 32], String> {
    let mut b = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut b)
        .map_err(|_| "no system randomness".to_string())?;
    Ok(b)
}

/// srun's questions about its job's state, on one connection to the
/// local agent kept for the session (opened again only after a failure).
#[derive(Debug, Default)]
struct StatusLink {
    client: Option<Client>,
}

impl StatusLink {
    async fn job_state(&mut self, job: JobId) -> Option<JobState> {
        if self.client.is_none() {
            self.client = Client::connect().await.ok();
        }
        let c = self.client.as_mut()?;
        let asked = c
            .call(Request::Jobs(JobFilter {
                ids: vec![job],
                ..Default::default()
            }))
            .await;
        match asked {
            Ok(Response::Jobs(v)) => v.first().map(|j| j.state),
            Ok(_) => None,
            Err(_) => {
                self.client = None;
                None
            }
        }
    }
}

/// This node's address as the cluster sees it, from the local agent
/// over the connection the submission then takes; loopback when the agent
/// cannot say. A connection whose question failed is not trusted with
/// the next one: the client connects again.
async fn node_address(c: &mut Client) -> IpAddr {
    let loopback = IpAddr::from([127, 0, 0, 1]);
    match c.local(LocalRequest::NodeAddress).await {
        Ok(Response::Address(ip)) => ip,
        Ok(_) => loopback,
        Err(_) => {
            if let Ok(fresh) = Client::connect().await {
                *c = fresh;
            }
            loopback
        }
    }
}

/// The cluster's KillWait (`scontrol show config`), for `-K`; Slurm's
/// default, 30 s, when the controller does not say.
async fn kill_wait() -> Duration {
    let said = match Client::connect().await {
        Ok(mut c) => match c.ok(Request::Config).await {
            Ok(Response::Config(kv)) => kv
                .into_iter()
                .find(|(k, _)| k == "KillWait")
                .and_then(|(_, v)| v.trim_end_matches(" sec").parse::<u64>().ok()),
            _ => None,
        },
        Err(_) => None,
    };
    Duration::from_secs(said.unwrap_or(30))
}

/// How srun reports a task a signal ended: the signal's description, as
/// Slurm's srun prints it (strsignal's words: "Terminated", "Killed").
fn signal_words(sig: i32) -> String {
    let known = match sig {
        1 => "Hangup",
        2 => "Interrupt",
        3 => "Quit",
        4 => "Illegal instruction",
        5 => "Trace/breakpoint trap",
        6 => "Aborted",
        7 => "Bus error",
        8 => "Floating point exception",
        9 => "Killed",
        10 => "User defined signal 1",
        11 => "Segmentation fault",
        12 => "User defined signal 2",
        13 => "Broken pipe",
        14 => "Alarm clock",
        15 => "Terminated",
        24 => "CPU time limit exceeded",
        25 => "File size limit exceeded",
        _ => return format!("Unknown signal {sig}"),
    };
    known.to_string()
}

async fn cancel(job: JobId) {
    if let Ok(mut c) = Client::connect().await {
        let _ = c
            .call(Request::Cancel {
                filter: JobFilter {
                    ids: vec![job],
                    ..Default::default()
                },
                signal: None,
            })
            .await;
    }
}

async fn run(a: SrunArgs) -> i32 {
    let secret = match random_secret() {
        Ok(s) => s,
        Err(e) => return fail(CMD, e),
    };
    let (server_cfg, cert_sha256) = match tls::step_server_config() {
        Ok(c) => c,
        Err(e) => return fail(CMD, e),
    };
    let mut client = match Client::connect().await {
        Ok(c) => c,
        Err(e) => return fail(CMD, e),
    };
    // Agents dial back to this node's address as ctld sees it (or
    // CORRAL_SRUN_HOST); the endpoint listens on every interface.
    let host: IpAddr = match std::env::var("CORRAL_SRUN_HOST") {
        Ok(h) => match h.parse() {
            Ok(ip) => ip,
            Err(_) => return fail(CMD, format!("CORRAL_SRUN_HOST is not an IP address: {h}")),
        },
        Err(_) => node_address(&mut client).await,
    };
    let bind = SocketAddr::new(
        if host.is_ipv4() {
            IpAddr::from([0, 0, 0, 0])
        } else {
            IpAddr::from([0u16; 8])
        },
        0,
    );
    let endpoint = match tls::server_endpoint(bind, server_cfg) {
        Ok(e) => e,
        Err(e) => return fail(CMD, e),
    };
    let addr = match endpoint.local_addr() {
        Ok(a) => SocketAddr::new(host, a.port()),
        Err(e) => return fail(CMD, e),
    };
    let io = StepIo {
        addr,
        cert_sha256,
        secret,
    };
    let cwd = match std::env::current_dir() {
        Ok(d) => match &a.job.chdir {
            Some(c) => d.join(c),
            None => d,
        },
        Err(e) => return fail(CMD, format!("current directory: {e}")),
    };
    let in_allocation = a
        .jobid
        .or_else(|| {
            std::env::var("SLURM_JOB_ID")
                .ok()
                .and_then(|j| j.parse::<u64>().ok())
        })
        .map(JobId);
    let own = own_files(a.output.as_deref(), a.error.as_deref());
    let files = corral_proto::msg::TaskFiles {
        stdout: a.output.clone().filter(|_| own.0.is_none()),
        stderr: a.error.clone().filter(|_| own.1.is_none()),
        stdin: a.input.clone(),
        pty: a.pty,
    };
    let mut name = String::new();
    let (job, step) = if let Some(job) = in_allocation {
        let (nodes, gpus, nodelist, exclude, cpus_per_task) = match a.job.to_spec() {
            Ok(s) => (s.nodes, s.gpus, s.nodelist, s.exclude, s.cpus_per_task),
            Err(e) => return fail(CMD, e),
        };
        // The step's own GPUs on each of its nodes (`--gres=gpu:N`,
        // `--gpus-per-node=N`; `-G N` on one node).
        let gpus_per_node = match gpus {
            corral_proto::msg::GpuAsk::PerNode(n) => Some(n),
            corral_proto::msg::GpuAsk::Total(n) if nodes.is_none_or(|k| k == 1) => Some(n),
            _ => None,
        };
        let env = match a.job.job_env() {
            Ok(e) => e,
            Err(e) => return fail(CMD, e),
        };
        let spec = StepSpec {
            job,
            name: a.job.job_name.clone().filter(|n| !n.is_empty()),
            nodes,
            ntasks: a.job.ntasks,
            gpus_per_node,
            overlap: a.overlap,
            // `-c` on srun's own line implies `--exact`, as 22.05's does
            // (measured: `srun -n1 -c1` steps of one job run side by side).
            exact: a.exact || a.job.exclusive || cpus_per_task.is_some(),
            cpus_per_task,
            nodelist,
            exclude,
            files: files.clone(),
            argv: a.command.clone(),
            work_dir: cwd.to_string_lossy().into_owned(),
            env,
            io,
        };
        // GPUs other steps hold: wait for them, as Slurm's srun does.
        let mut said = false;
        loop {
            match client.ok(Request::SubmitStep(spec.clone())).await {
                Ok(Response::StepCreated { job, step }) => {
                    if said && !a.job.quiet {
                        eprintln!("{CMD}: Step created for job {job}");
                    }
                    name = std::env::var("SLURM_JOB_NAME").unwrap_or_default();
                    break (job, Some(step));
                }
                Ok(Response::Busy(why)) => {
                    if !said && !a.job.quiet {
                        eprintln!(
                            "{CMD}: Job {job} step creation temporarily disabled, retrying ({why})"
                        );
                        said = true;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                }
                Ok(other) => return fail(CMD, format!("unexpected answer {other:?}")),
                Err(e) => return fail(CMD, format!("Unable to create step for job {job}: {e}")),
            }
        }
    } else {
        let mut spec = match a.job.to_spec() {
            Ok(s) => s,
            Err(e) => return fail(CMD, e),
        };
        if spec.name.is_empty() {
            spec.name = std::path::Path::new(&a.command[0])
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "srun".into());
        }
        spec.work_dir = cwd.to_string_lossy().into_owned();
        spec.requeue = false;
        name.clone_from(&spec.name);
        spec.kind = JobKind::Interactive {
            files: files.clone(),
            argv: a.command.clone(),
            io,
        };
        match client.ok(Request::Submit(spec)).await {
            Ok(Response::Submitted { job }) => (job, None),
            Ok(other) => return fail(CMD, format!("unexpected answer {other:?}")),
            Err(e) => return fail(CMD, format!("Unable to allocate resources: {e}")),
        }
    };
    drop(client);
    let (step_mode, step) = (step.is_some(), step.map_or(0, |s| s.0));
    // The user's name only names srun's own files (`%u`): no lookup of
    // the user database on the way to the step otherwise.
    let user = match own {
        (None, None) => String::new(),
        _ => super::user_name(nix::unistd::getuid().as_raw()),
    };
    let vars = corral_proto::pattern::PatternVars {
        job: job.0,
        name: &name,
        node: "",
        user: &user,
        step: Some(step),
        array: None,
        task: None,
        node_index: None,
    };
    let sinks = match Sinks::open(&own, &cwd, &vars) {
        Ok(s) => s,
        Err(e) => {
            if !step_mode {
                cancel(job).await;
            }
            return fail(CMD, e);
        }
    };

    let (events, mut event_rx) = mpsc::unbounded_channel();
    let s = Arc::new(Session {
        secret,
        label: a.label,
        lines: a.label || !(a.unbuffered || a.pty),
        progress: Mutex::new(Progress::default()),
        events,
        stdin_ready: Notify::new(),
        labeller: Mutex::new(Labeller::default()),
        sinks,
        own: [
            Stream::of(std::io::stdout().as_fd()),
            Stream::of(std::io::stderr().as_fd()),
        ],
    });
    let acceptor = {
        let s = s.clone();
        let endpoint = endpoint.clone();
        tokio::spawn(async move {
            while let Some(inc) = endpoint.accept().await {
                let s = s.clone();
                tokio::spawn(async move {
                    if let Ok(conn) = inc.await {
                        agent_link(s, conn).await;
                    }
                });
            }
        })
    };
    // --pty: this terminal, raw while the step runs, drives task 0's;
    // its size goes there now and whenever it changes.
    let raw = a.pty.then(terminal::Raw::enter).flatten();
    if a.pty {
        let s = s.clone();
        tokio::spawn(async move {
            let mut winch =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()).ok();
            loop {
                let link = s.stdin_link().await;
                if let Some((rows, cols)) = terminal::size() {
                    let _ = link.send(StepDown::WindowSize { rows, cols });
                }
                let Some(w) = winch.as_mut() else {
                    return;
                };
                if w.recv().await.is_none() {
                    return;
                }
            }
        });
    }
    // stdin → task 0 (`/dev/null`: its end, with no reader).
    if Stream::of(std::io::stdin().as_fd()) == Stream::Null {
        let s = s.clone();
        tokio::spawn(async move {
            let _ = s.stdin_link().await.send(StepDown::StdinEof);
        });
    } else {
        let s = s.clone();
        tokio::spawn(async move {
            let mut stdin = tokio::io::stdin();
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                let n = stdin.read(&mut buf).await.unwrap_or(0);
                let link = s.stdin_link().await;
                if n == 0 {
                    let _ = link.send(StepDown::StdinEof);
                    return;
                }
                let _ = link.send(StepDown::Stdin(buf[..n].to_vec()));
            }
        });
    }
    let kill_on_bad_exit = a.kill_on_bad_exit.is_some_and(|k| k != 0);
    let kill_wait = match kill_on_bad_exit {
        true => kill_wait().await,
        false => Duration::ZERO,
    };
    let mut watcher = Watcher::new(job, step_mode, addr, Instant::now())
        .kill_on_bad_exit(kill_on_bad_exit, kill_wait);
    let mut status = StatusLink::default();
    let mut poll = tokio::time::interval(Duration::from_millis(500));
    poll.tick().await;
    let code = 'session: loop {
        let event = tokio::select! {
            Some(e) = event_rx.recv() => e,
            _ = tokio::signal::ctrl_c() => Event::Interrupt { at: Instant::now() },
            _ = poll.tick() => {
                let state = match watcher.wants_job_state() {
                    true => status.job_state(job).await,
                    false => None,
                };
                Event::Tick { at: Instant::now(), job: state }
            }
        };
        for action in watcher.handle(event) {
            match action {
                // -Q: errors only.
                Action::Say(line) if a.job.quiet && !line.contains("error:") => {}
                Action::Say(line) => eprintln!("{line}"),
                Action::SignalAll(sig) => {
                    for l in &s.progress.lock().links {
                        let _ = l.send(StepDown::Signal(sig as i32));
                    }
                }
                Action::CancelJob => cancel(job).await,
                Action::Finish(code) => break 'session code,
            }
        }
    };
    // The terminal as it was, before anything more is said on it.
    drop(raw);
    acceptor.abort();
    endpoint.close(0u32.into(), b"done");
    // Let the connections' drivers send the close, so agents finish the
    // step at once (waiting for the whole draining period would cost ~20
    // ms). close() woke them; on this one-thread runtime a yield runs
    // every woken task before this one again, and a second covers a
    // driver woken by the first. (A 1 ms sleep here cost 2 ms: the
    // timer's granularity.)
    for _ in 0..2 {
        tokio::task::yield_now().await;
    }
    for f in &s.progress.lock().failures {
        eprintln!("srun: error: {f}");
    }
    code
}

pub fn main(args: &[OsString]) -> i32 {
    super::sigpipe_ends_the_process();
    // The environment's options before the command line's: the later wins.
    let mut merged: Vec<OsString> = args.iter().take(1).cloned().collect();
    merged.extend(super::opts::input_options(super::opts::SRUN_INPUT, |v| {
        std::env::var(v).ok()
    }));
    merged.extend(args.iter().skip(1).cloned());
    let a: SrunArgs = match parse(CMD, &merged) {
        Ok(a) => a,
        Err(code) => return code,
    };
    block_on(CMD, run(a))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// srun writes a file named once for the whole step; a file per task
    /// or node is the nodes' to open; standard error follows standard
    /// output unless it is named.
    #[test]
    fn srun_writes_the_files_named_once_for_the_step() {
        let own = |o: Option<&str>, e: Option<&str>| own_files(o, e);
        let s = |v: &str| Some(v.to_string());
        assert_eq!(own(None, None), (None, None));
        assert_eq!(own(Some("out.txt"), None), (s("out.txt"), s("out.txt")));
        assert_eq!(own(Some("o-%j"), Some("e-%j")), (s("o-%j"), s("e-%j")));
        assert_eq!(own(Some("o-%t"), None), (None, None));
        assert_eq!(own(Some("o-%t"), Some("e.txt")), (None, None));
        assert_eq!(own(Some("o.txt"), Some("e-%N")), (s("o.txt"), None));
        assert_eq!(own(None, Some("e.txt")), (None, s("e.txt")));
        // Both named the same: one file, opened once.
        let dir = std::env::temp_dir().join(format!("corral-srun-sinks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("j-7.0.txt"), "old run\n").unwrap();
        let vars = corral_proto::pattern::PatternVars {
            job: 7,
            name: "x",
            node: "",
            user: "u",
            step: Some(0),
            array: None,
            task: None,
            node_index: None,
        };
        let sinks = Sinks::open(&own(Some("j-%j.%s.txt"), None), &dir, &vars).unwrap();
        let (o, e) = (sinks.stdout.unwrap(), sinks.stderr.unwrap());
        assert!(Arc::ptr_eq(&o, &e));
        {
            use std::io::Write;
            o.lock().write_all(b"out\n").unwrap();
            e.lock().write_all(b"err\n").unwrap();
        }
        assert_eq!(
            std::fs::read_to_string(dir.join("j-7.0.txt")).unwrap(),
            "out\nerr\n"
        );
        let refused = Sinks::open(&own(Some("no-such-dir/x"), None), &dir, &vars).unwrap_err();
        assert!(
            refused.starts_with("Could not open output file"),
            "{refused}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn kill_on_bad_exit_takes_a_value_only_with_equals() {
        let k = |argv: &[&str]| {
            let a = SrunArgs::try_parse_from(argv).unwrap();
            (a.kill_on_bad_exit, a.command)
        };
        assert_eq!(
            k(&["srun", "-K", "sh", "x"]),
            (Some(1), vec!["sh".into(), "x".into()])
        );
        assert_eq!(k(&["srun", "--kill-on-bad-exit=0", "true"]).0, Some(0));
        assert_eq!(k(&["srun", "-K=1", "true"]).0, Some(1));
        assert_eq!(k(&["srun", "true"]).0, None);
    }

    #[test]
    fn labels_whole_lines_and_keeps_partials() {
        let mut l = Labeller::default();
        assert_eq!(l.feed(3, false, b"a\nb", Some(2)), b" 3: a\n".to_vec());
        assert_eq!(l.feed(3, false, b"c\n", Some(2)), b" 3: bc\n".to_vec());
        assert!(l.feed(1, true, b"x", Some(1)).is_empty());
        assert_eq!(l.flush(1, true, Some(1)), b"1: x\n".to_vec());
        assert!(l.flush(3, false, Some(2)).is_empty());
        // Unlabelled, lines are still whole: two tasks' halves do not mix.
        assert!(l.feed(0, false, b"rank 0", None).is_empty());
        assert_eq!(l.feed(1, false, b"rank 1\n", None), b"rank 1\n".to_vec());
        assert_eq!(
            l.feed(0, false, b" up\nmore", None),
            b"rank 0 up\n".to_vec()
        );
        assert_eq!(l.flush(0, false, None), b"more".to_vec());
        // A line too long to hold goes out as it is.
        let long = vec![b'x'; MAX_PARTIAL + 1];
        assert_eq!(l.feed(2, false, &long, None), long);
    }

    #[test]
    fn command_is_required_and_options_stop_at_it() {
        assert!(SrunArgs::try_parse_from(["srun", "-N2"]).is_err());
        let a = SrunArgs::try_parse_from(["srun", "-N2", "-l", "hostname", "-n", "3"]).unwrap();
        assert_eq!(a.command, vec!["hostname", "-n", "3"]);
        assert!(a.label);
        assert_eq!(a.job.nodes.as_deref(), Some("2"));
    }
}
