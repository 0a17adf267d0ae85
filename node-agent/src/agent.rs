//! The agent's runtime: one long-lived mutual-TLS connection to ctld
//! (register, heartbeat, launches down, step state up), reconnecting when
//! it drops; the table of this node's job processes; and the handling of
//! launch, signal and terminate orders.
//!
//! The agent never decides anything about jobs: it runs what ctld says and
//! reports what happened.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral_proto::cred::{Minter, DEFAULT_TTL_MS};
pub use corral_proto::error_chain;
use corral_proto::msg::{
    AgentMsg, CtldMsg, ExitStatus, GpuInfo, HealthConfig, Ident, JobRun, Launch, LaunchKind, Open,
    Registration, Request, Response, SignalTo, StepId,
};
use corral_proto::tls::{self, CertFiles, Identity, TlsError, CTLD_NAME};
use corral_proto::{now_ms, read_frame, write_frame, WireError};
use nix::sys::signal::Signal;
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};

use crate::launch::Launcher;
use crate::procs::{signal_group, ProcTable, StepStart, Termination};
use crate::resources::Resources;
use crate::spool::{create_private_dir, UnsafeDir};

/// Everything an agent needs to run.
#[derive(Debug)]
pub struct AgentConfig {
    pub name: String,
    pub cluster: String,
    pub ctld: SocketAddr,
    pub certs: CertFiles,
    /// The Unix socket CLIs on this node talk to.
    pub socket: PathBuf,
    /// Where batch scripts are written before they run.
    pub spool: PathBuf,
    pub resources: Resources,
    pub gpus: Vec<GpuInfo>,
    pub features: Vec<String>,
    pub launcher: Arc<dyn Launcher>,
    /// Report batch scripts as completed without running them: measures
    /// the control plane without the machine's fork/exec cost.
    pub no_exec: bool,
    /// Run every task in this jail (`None`: on the host's filesystem).
    pub jail: Option<crate::jail::JailConfig>,
    /// GPU index → the minor number of its `/dev/nvidiaN` (absent: the
    /// index).
    pub gpu_minors: std::collections::HashMap<u32, u32>,
    /// Where GPU health readings come from, and the checks on them.
    pub gpu_health: Option<(Arc<dyn crate::gpu::GpuBackend>, crate::health::GpuChecks)>,
    /// Put each job in its own cgroup (`None`: no limits, processes
    /// tracked by their process groups only, unless
    /// [`Agent::use_cgroups`] is called before the agent connects).
    pub cgroups: Option<Arc<crate::cgroup::Cgroups>>,
    /// Live tasks one user may have on the node (`--max-user-tasks`;
    /// [`crate::budget::Budget::default_user_tasks`] by default).
    pub max_user_tasks: u32,
}

/// Why the agent could not start or lost its controller.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("certificates")]
    Tls(#[from] TlsError),
    #[error("credentials")]
    Cred(#[from] corral_proto::cred::CredError),
    #[error("connect to ctld")]
    Connect(#[from] quinn::ConnectError),
    #[error("connection to ctld")]
    Connection(#[from] quinn::ConnectionError),
    #[error("wire")]
    Wire(#[from] WireError),
    #[error("ctld refused registration: {0}")]
    Refused(String),
    #[error("ctld closed the control stream")]
    Closed,
    #[error("no answer from ctld within {} s", .0.as_secs())]
    ConnectTimeout(Duration),
    #[error("{path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("unsafe directory")]
    UnsafeDir(#[from] UnsafeDir),
}

/// Why a step could not run its tasks on this node. Its text, with its
/// causes, is what ctld shows as the job's `FailReason` and srun prints.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error("job is ending")]
    Ending,
    #[error("writing the script {path}")]
    Script {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Launch(#[from] crate::launch::LaunchError),
    #[error("waiting for the task")]
    Wait(#[source] std::io::Error),
    #[error("srun's certificate")]
    Pin(#[source] TlsError),
    #[error("connect to srun at {addr}")]
    Dial {
        addr: SocketAddr,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("stream to srun")]
    Stream(#[source] quinn::ConnectionError),
    #[error("hello to srun")]
    Hello(#[source] WireError),
    #[error("the node's jail")]
    Jail(#[source] shared_root::PlanError),
    #[error("the job's cgroup")]
    Cgroup(#[source] crate::cgroup::CgroupError),
    #[error("refused on this node")]
    Budget(#[source] crate::budget::Refusal),
    #[error("the job's PID namespace")]
    PidNamespace(#[source] std::io::Error),
}

/// A launch's tasks taken from its user's budget ([`Agent::take_budget`]).
struct BudgetHeld<'a> {
    agent: &'a Agent,
    uid: u32,
    tasks: u32,
}

impl Drop for BudgetHeld<'_> {
    fn drop(&mut self) {
        self.agent.budget.lock().release(self.uid, self.tasks);
    }
}

/// What of the node's own failed a launch: the node stays a problem
/// (drained, `node_problem: launch: …`) until that check passes, so jobs
/// are not sent one after another to fail there, as Slurm drains a node
/// whose batch launch failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeFault {
    /// The spool took no script: passes once a probe file is written.
    Spool,
    /// No job cgroup could be made or joined: passes once a probe cgroup
    /// is made.
    Cgroup,
    /// The agent ran out of descriptors: passes once twice the
    /// descriptor check's reserve is free.
    Descriptors,
    /// Anything else of the node's (its jail, becoming the user):
    /// passes [`NodeFault::RETRY`] later, when the next launch tries.
    Other,
}

impl NodeFault {
    pub const RETRY: Duration = Duration::from_secs(300);
}

impl StepError {
    /// Whether the launch failed through the node's fault, and what of it;
    /// `None` for what is the job's own (its directory, its files, its
    /// command, its user's budget) or srun's.
    pub fn node_fault(&self) -> Option<NodeFault> {
        use crate::launch::LaunchError as L;
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(e) = cause {
            let errno = e
                .downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::raw_os_error);
            if matches!(errno, Some(nix::libc::EMFILE | nix::libc::ENFILE)) {
                return Some(NodeFault::Descriptors);
            }
            cause = e.source();
        }
        match self {
            StepError::Script { .. } => Some(NodeFault::Spool),
            StepError::Cgroup(_) | StepError::Launch(L::Cgroup(_)) => Some(NodeFault::Cgroup),
            StepError::Jail(_)
            | StepError::PidNamespace(_)
            | StepError::Launch(L::Jail(_) | L::Setup(_) | L::Identity { .. }) => {
                Some(NodeFault::Other)
            }
            _ => None,
        }
    }
}

/// A launch that failed through the node's fault, kept until its check
/// passes.
#[derive(Debug, Clone)]
struct LaunchProblem {
    fault: NodeFault,
    line: String,
    since: Instant,
}

/// How long a relayed request waits for ctld's answer.
pub const RELAY_TIMEOUT: Duration = Duration::from_secs(10);

/// When to try ctld again, and how long an attempt may take. A handshake
/// begun while ctld was down (restarting) waits out QUIC's growing
/// retransmission delays, so a fresh one after 2 s is quicker; but when
/// thousands of nodes reconnect at once, ctld's handshakes queue past
/// 2 s, and giving up on them only queues more (2,000 simulated nodes
/// took 58 s to register so). So an attempt that timed out gives the
/// next twice as long, up to 16 s, and the pause between attempts (100
/// ms, doubling to 2 s) is spread by up to half of itself.
#[derive(Debug)]
pub struct Reconnect {
    backoff: Duration,
    wait: Duration,
}

impl Default for Reconnect {
    fn default() -> Self {
        Reconnect {
            backoff: Reconnect::FIRST_PAUSE,
            wait: Reconnect::FIRST_WAIT,
        }
    }
}

impl Reconnect {
    const FIRST_PAUSE: Duration = Duration::from_millis(100);
    const MOST_PAUSE: Duration = Duration::from_secs(2);
    const FIRST_WAIT: Duration = Duration::from_secs(2);
    const MOST_WAIT: Duration = Duration::from_secs(16);

    /// How long the next attempt may take.
    pub fn connect_wait(&self) -> Duration {
        self.wait
    }

    /// A session ended: after one that registered, the waits start afresh;
    /// after a timed-out attempt, the next may take longer. Returns the
    /// pause before the next attempt.
    pub fn after(&mut self, registered: bool, timed_out: bool) -> Duration {
        if registered {
            *self = Reconnect::default();
        } else if timed_out {
            self.wait = (self.wait * 2).min(Reconnect::MOST_WAIT);
        }
        let pause = self.backoff;
        self.backoff = (self.backoff * 2).min(Reconnect::MOST_PAUSE);
        let spread = corral_proto::cred::random_u64().unwrap_or(0) % 1000;
        pause + pause.mul_f64(spread as f64 / 2000.0)
    }
}

/// What ctld's `Welcome` said.
#[derive(Debug)]
pub struct Welcome {
    pub heartbeat: Duration,
    pub seen_as: std::net::IpAddr,
    pub health: HealthConfig,
}

/// One attempt to reach ctld: connect (within `wait`), open the control
/// stream, register, read the answer.
pub async fn register(
    endpoint: &quinn::Endpoint,
    client: &quinn::ClientConfig,
    ctld: SocketAddr,
    wait: Duration,
    reg: &Registration,
) -> Result<
    (
        quinn::Connection,
        quinn::SendStream,
        quinn::RecvStream,
        Welcome,
    ),
    AgentError,
> {
    let connecting = endpoint.connect_with(client.clone(), ctld, CTLD_NAME)?;
    let conn = tokio::time::timeout(wait, connecting)
        .await
        .map_err(|_| AgentError::ConnectTimeout(wait))??;
    let (mut send, mut recv) = conn.open_bi().await?;
    write_frame(&mut send, &Open::Control(reg.clone())).await?;
    match read_frame::<_, CtldMsg>(&mut recv).await? {
        Some(CtldMsg::Welcome {
            heartbeat_ms,
            seen_as,
            health,
        }) => {
            let heartbeat = Duration::from_millis(heartbeat_ms.max(100));
            let welcome = Welcome {
                heartbeat,
                seen_as,
                health,
            };
            Ok((conn, send, recv, welcome))
        }
        Some(CtldMsg::Refused { reason }) => Err(AgentError::Refused(reason)),
        _ => Err(AgentError::Closed),
    }
}

/// A running agent. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct Agent {
    pub(crate) cfg: AgentConfig,
    pub(crate) minter: Minter,
    key: Vec<u8>,
    pub(crate) endpoint: quinn::Endpoint,
    client: quinn::ClientConfig,
    /// The connection to ctld now, numbered (quinn's `stable_id` is an
    /// address, which a new connection may reuse).
    pub(crate) conn: watch::Sender<Option<(u64, quinn::Connection)>>,
    /// Connections made so far.
    sessions: std::sync::atomic::AtomicU64,
    up: mpsc::UnboundedSender<AgentMsg>,
    up_rx: Mutex<Option<mpsc::UnboundedReceiver<AgentMsg>>>,
    /// Held while signalling, so a signalled group is one it lists.
    procs: Mutex<ProcTable>,
    /// Each user's live tasks here, against their budget.
    budget: Mutex<crate::budget::Budget>,
    /// Tells the control session to report the node's health now.
    health_now: tokio::sync::Notify,
    /// Each jailed run's PID namespace here, made with its first task.
    pid_namespaces: Mutex<std::collections::HashMap<JobRun, Arc<crate::pidns::PidNamespace>>>,
    /// The agent's binary, which a PID namespace's holder runs; `None`
    /// where jobs get none (no jail, or a kernel without them).
    pid_ns_exe: Option<PathBuf>,
    /// This node's address as ctld sees it.
    seen_as: Mutex<Option<std::net::IpAddr>>,
    /// ctld has removed the node (after `leave`).
    farewell: tokio::sync::Notify,
    /// The node's job cgroups, once set up.
    cgroups: std::sync::OnceLock<Arc<crate::cgroup::Cgroups>>,
    /// The checks ctld configured (from its Welcome).
    health_cfg: watch::Sender<Option<HealthConfig>>,
    /// The latest result of each check.
    checks: Mutex<CheckResults>,
    /// What the node reported about its jobs lately, sent again on each
    /// new connection (see [`Recent`]).
    recent: Mutex<Recent>,
    /// Drawn at start: ctld tells a restarted agent from a reconnected one.
    instance: u64,
}

/// The job outcomes (step exits, clean-ups) written to ctld lately. A
/// write that succeeded may still be lost with its connection (QUIC
/// buffers it); a new connection sends them again, and ctld, which
/// ignores news it already has, takes what it missed.
#[derive(Debug, Default)]
pub struct Recent {
    sent: std::collections::VecDeque<(std::time::Instant, AgentMsg)>,
}

impl Recent {
    /// How long an outcome is sent again: longer than a dead connection
    /// takes to be noticed.
    pub const KEEP: Duration = Duration::from_secs(120);
    /// The most kept, whatever their age.
    pub const MOST: usize = 4096;

    /// Whether a message is an outcome worth sending again.
    pub fn worth_keeping(msg: &AgentMsg) -> bool {
        matches!(
            msg,
            AgentMsg::StepExited { .. }
                | AgentMsg::JobCleaned { .. }
                | AgentMsg::BatchDone { .. }
                | AgentMsg::LaunchFailed { .. }
        )
    }

    pub fn push(&mut self, now: std::time::Instant, msg: &AgentMsg) {
        if !Recent::worth_keeping(msg) {
            return;
        }
        self.sent.push_back((now, msg.clone()));
        self.prune(now);
    }

    fn prune(&mut self, now: std::time::Instant) {
        while self.sent.len() > Recent::MOST
            || self
                .sent
                .front()
                .is_some_and(|(t, _)| now.duration_since(*t) > Recent::KEEP)
        {
            self.sent.pop_front();
        }
    }

    /// What to send again on a new connection, oldest first.
    pub fn replay(&mut self, now: std::time::Instant) -> Vec<AgentMsg> {
        self.prune(now);
        self.sent.iter().map(|(_, m)| m.clone()).collect()
    }
}

/// How long the agent keeps a run whose batch step ended it on a node of
/// its own ([`ProcTable::end_batch_alone`]), and sends its `BatchDone`
/// again on each new connection: a controller down for longer, which
/// never stored that end, loses the job when its recovery ends (as on a
/// node failure) rather than sending its batch step again. At most
/// [`Recent::MOST`] such runs are kept, the oldest forgotten first.
pub(crate) const ENDED_KEEP: Duration = Duration::from_secs(900);

/// An instant of this process's clock as Unix milliseconds (0 for none).
pub(crate) fn unix_ms(t: Option<Instant>) -> u64 {
    let Some(t) = t else { return 0 };
    let ago = Instant::now().saturating_duration_since(t);
    std::time::SystemTime::now()
        .checked_sub(ago)
        .and_then(|w| w.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as u64)
        .max(1)
}

/// What a new connection sends first: the outcomes the last one may have
/// lost, oldest first, and the end of every ended run still kept that is
/// not among them.
pub(crate) fn replay(recent: &mut Recent, ended: Vec<AgentMsg>, now: Instant) -> Vec<AgentMsg> {
    let mut again = recent.replay(now);
    let done_of = |m: &AgentMsg| match m {
        AgentMsg::BatchDone { job, .. } => Some(*job),
        _ => None,
    };
    let sent: std::collections::HashSet<JobRun> = again.iter().filter_map(done_of).collect();
    again.extend(
        ended
            .into_iter()
            .filter(|m| done_of(m).is_some_and(|j| !sent.contains(&j))),
    );
    again
}

/// The latest word of each of the node's checks: `Some` is a problem.
#[derive(Debug, Default)]
struct CheckResults {
    gpu: Option<String>,
    /// In the configured order.
    commands: Vec<Option<String>>,
    /// The last launch that failed through the node's fault.
    launch: Option<LaunchProblem>,
}

impl Agent {
    pub fn new(cfg: AgentConfig) -> Result<Arc<Agent>, AgentError> {
        let id = Identity::load(&cfg.certs)?;
        let client = tls::client_config(&id)?;
        let endpoint = tls::client_endpoint(cfg.ctld)?;
        let (minter, key) = Minter::generate(cfg.name.clone(), DEFAULT_TTL_MS)?;
        let (up, up_rx) = mpsc::unbounded_channel();
        create_private_dir(&cfg.spool)?;
        if let Some(jail) = &cfg.jail {
            // What every task's jail needs, checked once at start (the
            // socket comes later, and is ours).
            let sources = jail.submounts.iter().map(|m| &m.source);
            for path in [&jail.root, &jail.bin].into_iter().chain(sources) {
                std::fs::metadata(path).map_err(|source| AgentError::Io {
                    path: path.clone(),
                    source,
                })?;
            }
        }
        let user_tasks = cfg.max_user_tasks;
        // Jailed jobs get a PID namespace each where the kernel allows.
        let pid_ns_exe = cfg.jail.as_ref().and_then(|_| {
            // The running binary, even once replaced on disk.
            let exe = PathBuf::from("/proc/self/exe");
            match crate::pidns::PidNamespace::supported(&exe) {
                Ok(()) => Some(exe),
                Err(e) => {
                    tracing::warn!(error = %e, "jailed jobs share the node's PID namespace: the kernel gives them none of their own");
                    None
                }
            }
        });
        let cgroups_once = std::sync::OnceLock::new();
        if let Some(cg) = cfg.cgroups.clone() {
            let _ = cgroups_once.set(cg);
        }
        Ok(Arc::new(Agent {
            cfg,
            minter,
            key,
            endpoint,
            client,
            conn: watch::channel(None).0,
            sessions: std::sync::atomic::AtomicU64::new(0),
            up,
            up_rx: Mutex::new(Some(up_rx)),
            procs: Mutex::new(ProcTable::default()),
            budget: Mutex::new(crate::budget::Budget::new(user_tasks)),
            health_now: tokio::sync::Notify::new(),
            pid_namespaces: Mutex::new(std::collections::HashMap::new()),
            pid_ns_exe,
            seen_as: Mutex::new(None),
            farewell: tokio::sync::Notify::new(),
            cgroups: cgroups_once,
            health_cfg: watch::channel(None).0,
            checks: Mutex::new(CheckResults::default()),
            recent: Mutex::new(Recent::default()),
            instance: corral_proto::cred::random_u64()?,
        }))
    }

    /// Puts jobs in these cgroups from now on (set up once the agent
    /// itself has started, so a mistaken start leaves none behind). False
    /// if the agent already has cgroups.
    pub fn use_cgroups(&self, cg: Arc<crate::cgroup::Cgroups>) -> bool {
        self.cgroups.set(cg).is_ok()
    }

    fn cgroups(&self) -> Option<Arc<crate::cgroup::Cgroups>> {
        self.cgroups.get().cloned()
    }

    /// Where other nodes reach this one, once ctld has said.
    pub fn address(&self) -> Option<std::net::IpAddr> {
        *self.seen_as.lock()
    }

    pub fn name(&self) -> &str {
        &self.cfg.name
    }

    fn registration(&self) -> Registration {
        // One look at the table: what runs and what it was sent agree.
        let (running, launched, forgot) = {
            let procs = self.procs.lock();
            let mut running = procs.running();
            running.sort_unstable();
            (running, procs.launched(), procs.forgot_through())
        };
        Registration {
            name: self.cfg.name.clone(),
            cpus: self.cfg.resources.cpus,
            memory_mb: self.cfg.resources.memory_mb,
            gpus: self.cfg.gpus.clone(),
            features: self.cfg.features.clone(),
            credential_key: self.key.clone(),
            running,
            launched,
            forgot_ended_before: unix_ms(forgot),
            instance: self.instance,
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            os: crate::os_name(),
        }
    }

    fn running(&self) -> Vec<JobRun> {
        let mut v = {
            let mut procs = self.procs.lock();
            procs.prune_done(Instant::now(), ENDED_KEEP, Recent::MOST);
            procs.running()
        };
        v.sort_unstable();
        v
    }

    fn send_up(&self, msg: AgentMsg) {
        // The receiver lives as long as the agent's control loop.
        let _ = self.up.send(msg);
    }

    /// Connects, registers and serves ctld forever, reconnecting after a
    /// loss. Returns only when ctld refuses the registration.
    pub async fn run_control(self: &Arc<Self>) -> Result<(), AgentError> {
        let Some(mut rx) = self.up_rx.lock().take() else {
            return Ok(());
        };
        let checks = tokio::spawn(self.clone().health_loop());
        let result = self.control_loop(&mut rx).await;
        checks.abort();
        result
    }

    async fn control_loop(
        self: &Arc<Self>,
        rx: &mut mpsc::UnboundedReceiver<AgentMsg>,
    ) -> Result<(), AgentError> {
        let mut again = Reconnect::default();
        loop {
            let timed_out = match self.session(rx, again.connect_wait()).await {
                Err(AgentError::Refused(r)) => return Err(AgentError::Refused(r)),
                Err(e) => {
                    tracing::warn!(error = %error_chain(&e), "lost ctld; reconnecting");
                    matches!(e, AgentError::ConnectTimeout(_))
                }
                Ok(()) => false,
            };
            let registered = self.conn.send_replace(None).is_some();
            tokio::time::sleep(again.after(registered, timed_out)).await;
        }
    }

    async fn session(
        self: &Arc<Self>,
        rx: &mut mpsc::UnboundedReceiver<AgentMsg>,
        wait: Duration,
    ) -> Result<(), AgentError> {
        let (conn, mut send, mut recv, welcome) = register(
            &self.endpoint,
            &self.client,
            self.cfg.ctld,
            wait,
            &self.registration(),
        )
        .await?;
        *self.seen_as.lock() = Some(welcome.seen_as);
        self.configure_checks(welcome.health).await;
        let heartbeat = welcome.heartbeat;
        tracing::info!(ctld = %self.cfg.ctld, "registered");
        let n = self
            .sessions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.conn.send_replace(Some((n, conn.clone())));
        let me = self.clone();
        let mut reader = tokio::spawn(async move {
            loop {
                match read_frame::<_, CtldMsg>(&mut recv).await {
                    Ok(Some(msg)) => me.handle(msg),
                    Ok(None) => return AgentError::Closed,
                    Err(e) => return AgentError::Wire(e),
                }
            }
        });
        // What the last connection may have lost goes again first.
        let ended = self.procs.lock().ended_outcomes();
        let again = replay(&mut self.recent.lock(), ended, std::time::Instant::now());
        for msg in &again {
            if let Err(e) = write_frame(&mut send, msg).await {
                reader.abort();
                return Err(e.into());
            }
        }
        let mut tick = tokio::time::interval(heartbeat);
        // ctld forgets a node's health when it registers: tell it again.
        let mut told: Option<Option<String>> = None;
        let result = loop {
            tokio::select! {
                r = &mut reader => break Err(r.unwrap_or(AgentError::Closed)),
                msg = rx.recv() => {
                    let Some(msg) = msg else { break Ok(()) };
                    // Kept before the write: a failed write is sent again
                    // on the next connection too.
                    self.recent.lock().push(std::time::Instant::now(), &msg);
                    if let Err(e) = write_frame(&mut send, &msg).await {
                        break Err(e.into());
                    }
                }
                now = async {
                    tokio::select! {
                        _ = tick.tick() => false,
                        _ = self.health_now.notified() => true,
                    }
                } => {
                    if !now {
                        let hb = AgentMsg::Heartbeat { running: self.running() };
                        if let Err(e) = write_frame(&mut send, &hb).await {
                            break Err(e.into());
                        }
                    }
                    let problem = self.health();
                    if told.as_ref() != Some(&problem) {
                        if let Some(p) = &problem {
                            tracing::warn!(problem = %p, "node unhealthy");
                        }
                        let msg = AgentMsg::Health { problem: problem.clone() };
                        if let Err(e) = write_frame(&mut send, &msg).await {
                            break Err(e.into());
                        }
                        told = Some(problem);
                    }
                }
            }
        };
        reader.abort();
        conn.close(0u32.into(), b"reconnect");
        result
    }

    fn handle(self: &Arc<Self>, msg: CtldMsg) {
        match msg {
            CtldMsg::Launch(l) => {
                // The step enters the table here, in the order ctld's
                // messages arrive, not when the spawned task first runs: a
                // Terminate right behind the Launch must find it (or the
                // task would start after this node reported the job clean).
                let (job, step) = (l.job_run(), l.step);
                match self.begin_step(job, step) {
                    StepStart::Go { .. } => {}
                    StepStart::Again => {
                        tracing::debug!(job = %job.job, %step, "launch sent again; already here");
                        return;
                    }
                    StepStart::Refused => {
                        let why = error_chain(&StepError::Ending);
                        self.end_step(job, step, Err(why));
                        return;
                    }
                }
                let me = self.clone();
                tokio::spawn(async move { me.launch(l).await });
            }
            CtldMsg::Signal { job, to, signal } => {
                let Ok(sig) = Signal::try_from(signal) else {
                    return;
                };
                self.signal(job, to, sig);
            }
            CtldMsg::Suspend { job, stop } => self.suspend(job, stop),
            CtldMsg::Terminate { job, grace_ms } => self.terminate(job, grace_ms),
            CtldMsg::Farewell => self.farewell.notify_one(),
            CtldMsg::Welcome { .. } | CtldMsg::Refused { .. } => {}
        }
    }

    /// Stops (`scontrol suspend`) or continues every process of a run
    /// here: its cgroup frozen or thawed, or on a node without a freezer,
    /// SIGSTOP or SIGCONT to its tasks' process groups (a process that
    /// left its group escapes that).
    fn suspend(&self, job: JobRun, stop: bool) {
        if self.cgroups().is_some_and(|cg| cg.freeze_job(job, stop)) {
            tracing::info!(job = %job.job, stop, "job's cgroup frozen or thawed");
            return;
        }
        let sig = if stop {
            Signal::SIGSTOP
        } else {
            Signal::SIGCONT
        };
        let procs = self.procs.lock();
        for g in procs.groups(job, SignalTo::All) {
            signal_group(g, sig);
        }
    }

    /// Ends a run of a job here. An older run than the one running here
    /// is already gone (the newer launch replaced it); a newer one takes
    /// what is here with it.
    fn terminate(self: &Arc<Self>, job: JobRun, grace_ms: u64) {
        {
            let mut procs = self.procs.lock();
            match procs.terminate(job) {
                Termination::Clean => {
                    drop(procs);
                    self.job_cleaned(job);
                    return;
                }
                Termination::Signal(groups) => {
                    // A suspended job hears its TERM: thawed first.
                    if let Some(cg) = self.cgroups() {
                        cg.freeze_job(job, false);
                    }
                    for g in groups {
                        signal_group(g, Signal::SIGCONT);
                        signal_group(g, Signal::SIGTERM);
                    }
                }
            }
        }
        let me = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(grace_ms)).await;
            {
                let procs = me.procs.lock();
                for g in procs.groups(job, SignalTo::All) {
                    signal_group(g, Signal::SIGKILL);
                }
            }
            // And what left its process group (setsid, double forks).
            if let Some(cg) = me.cgroups() {
                let _ = tokio::task::spawn_blocking(move || cg.kill_job(job)).await;
            }
        });
    }

    /// Records a step's process groups; false if the run is being ended
    /// or is no longer the job's latest here.
    pub(crate) fn add_groups(&self, job: JobRun, step: StepId, groups: &[u32]) -> bool {
        self.procs.lock().add_groups(job, step, groups)
    }

    /// A task's leader was reaped: its group leaves the table, then
    /// whatever it left running in the group is killed (a step ends with
    /// its task). Call it right after the wait, before anything else can
    /// signal the group.
    pub(crate) fn group_exited(&self, job: JobRun, step: StepId, pgid: u32) {
        self.procs.lock().group_exited(job, step, pgid);
        signal_group(pgid, Signal::SIGKILL);
    }

    /// Delivers a signal to the live task groups of a run that `to`
    /// names. The batch shell alone (`--signal=B:`, `scancel --batch`) is
    /// its group's leader only, as Slurm's: the shell's own children
    /// (what it runs in the background) are not signalled.
    pub(crate) fn signal(&self, job: JobRun, to: SignalTo, sig: Signal) {
        let procs = self.procs.lock();
        for g in procs.groups(job, to) {
            if to == SignalTo::Step(StepId::BATCH) {
                // A task's group is its leader's pid.
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(g as i32), sig);
            } else {
                signal_group(g, sig);
            }
        }
    }

    /// Registers a step of a run, unless the run is being ended or a
    /// newer run of the job is here, or the step was launched here before.
    /// A newer run replaces an older one, whose processes are killed.
    fn begin_step(&self, job: JobRun, step: StepId) -> StepStart {
        let mut procs = self.procs.lock();
        let start = procs.begin_step(job, step);
        if let StepStart::Go { replaced } = &start {
            for &g in replaced {
                signal_group(g, Signal::SIGKILL);
            }
        }
        start
    }

    fn end_step(
        self: &Arc<Self>,
        job: JobRun,
        step: StepId,
        exit: Result<(ExitStatus, bool), String>,
    ) {
        let cleaned = self.procs.lock().end_step(job, step);
        match exit {
            Err(message) => self.send_up(AgentMsg::LaunchFailed { job, step, message }),
            Ok((exit, oom)) => self.send_up(AgentMsg::StepExited {
                job,
                step,
                exit,
                oom,
            }),
        }
        if cleaned {
            self.job_cleaned(job);
        }
    }

    /// The batch step of a job on this node alone ended the run here
    /// ([`ProcTable::end_batch_alone`]): what its cgroup still holds is
    /// killed, its usage read, and ctld told of the exit and the clean
    /// node in one message.
    fn batch_done(self: &Arc<Self>, job: JobRun, (exit, oom): (ExitStatus, bool)) {
        self.clean_up(job, move |usage| AgentMsg::BatchDone {
            job,
            exit,
            oom,
            usage,
        });
    }

    /// Nothing of the run is left here: what its cgroup still holds is
    /// killed, its usage read, and ctld told.
    fn job_cleaned(self: &Arc<Self>, job: JobRun) {
        self.clean_up(job, move |usage| AgentMsg::JobCleaned { job, usage });
    }

    /// The PID namespace a task of `l` starts in: a jailed run's own,
    /// made (its holder started) with the run's first task here; `None`
    /// for a task outside the jail.
    pub(crate) fn pid_ns_for(
        &self,
        l: &Launch,
        jailed: bool,
    ) -> Result<Option<Arc<crate::pidns::PidNamespace>>, StepError> {
        let Some(exe) = self.pid_ns_exe.as_ref().filter(|_| jailed) else {
            return Ok(None);
        };
        let run = l.job_run();
        let mut all = self.pid_namespaces.lock();
        if let Some(ns) = all.get(&run) {
            return Ok(Some(ns.clone()));
        }
        // An older run of the job is gone (a newer one replaced it).
        all.retain(|r, _| r.job != run.job);
        let ns = crate::pidns::PidNamespace::new(exe).map_err(StepError::PidNamespace)?;
        let ns = Arc::new(ns);
        all.insert(run, ns.clone());
        Ok(Some(ns))
    }

    /// Kills what the run's cgroup still holds, reads its usage, sends
    /// `msg` with it, then removes the cgroup.
    fn clean_up(
        self: &Arc<Self>,
        job: JobRun,
        msg: impl FnOnce(Option<corral_proto::msg::JobUsage>) -> AgentMsg + Send + 'static,
    ) {
        // Its PID namespace goes, and with its holder whatever is left in it.
        if let Some(ns) = self.pid_namespaces.lock().remove(&job) {
            if let Ok(ns) = Arc::try_unwrap(ns) {
                tokio::spawn(ns.end());
            }
        }
        let Some(cg) = self.cgroups() else {
            self.send_end(job, msg(None));
            return;
        };
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            let u = cg.finish_job(job);
            me.send_end(
                job,
                msg(Some(corral_proto::msg::JobUsage {
                    cpu_ms: u.cpu_ns / 1_000_000,
                    max_rss_kb: u.max_rss_bytes / 1024,
                })),
            );
            cg.remove_job(job);
        });
    }

    /// Sends a message about a run's end; a `BatchDone` is kept with the
    /// ended run too, to be sent again on each new connection while the
    /// run is kept.
    fn send_end(&self, job: JobRun, msg: AgentMsg) {
        if matches!(msg, AgentMsg::BatchDone { .. }) {
            self.procs.lock().record_outcome(job, msg.clone());
        }
        self.send_up(msg);
    }

    /// Creates the step's cgroup (and its job's, with the job's limits,
    /// for its first step here); returns what tasks need to join it and
    /// the baseline its end compares OOM kills with.
    async fn step_cgroup(
        &self,
        l: &Launch,
    ) -> Result<Option<(Arc<crate::cgroup::Join>, u64)>, StepError> {
        let Some(cg) = self.cgroups() else {
            return Ok(None);
        };
        let limits = self.limits(l);
        let (job, step) = (l.job_run(), l.step);
        tokio::task::spawn_blocking(move || {
            // A cgroup set up just now says what it had counted before
            // the job (nothing, when made); one there already is read.
            let made = cg.create_job(job, &limits)?;
            let join = cg.create_step(job, step)?;
            let baseline = made.oom_baseline().unwrap_or_else(|| cg.oom_kills(job));
            Ok(Some((Arc::new(join), baseline)))
        })
        .await
        .unwrap_or_else(|e| {
            Err(crate::cgroup::CgroupError::Detect(format!(
                "cgroup setup panicked: {e}"
            )))
        })
        .map_err(StepError::Cgroup)
    }

    /// Takes the launch's tasks from its user's budget here, given back
    /// when what it returns is dropped (the step's end).
    fn take_budget(&self, l: &Launch) -> Result<BudgetHeld<'_>, StepError> {
        let tasks = match l.what {
            LaunchKind::Batch { .. } => 1,
            LaunchKind::Step { .. } => l.tasks_here,
        };
        let limit = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map_or(1024, |(soft, _)| soft);
        let open = crate::budget::open_fds();
        let uid = l.user.uid;
        self.budget
            .lock()
            .admit(uid, tasks, open, limit)
            .map_err(StepError::Budget)?;
        Ok(BudgetHeld {
            agent: self,
            uid,
            tasks,
        })
    }

    /// A job's limits on this node: its CPUs, its memory, and every GPU of
    /// the node it was not given denied.
    fn limits(&self, l: &Launch) -> crate::cgroup::Limits {
        let dev = self
            .cfg
            .jail
            .as_ref()
            .map_or_else(|| PathBuf::from("/dev"), |j| j.host_dev.clone());
        crate::cgroup::Limits {
            cpus: l.cpus.clone(),
            memory_bytes: (l.memory_mb > 0).then(|| l.memory_mb.saturating_mul(1 << 20)),
            denied: self
                .cfg
                .gpus
                .iter()
                .filter(|g| !l.gpus.contains(&g.index))
                .map(|g| crate::gpu::device_numbers(&dev, self.minor(g.index)))
                .collect(),
        }
    }

    /// Runs a step already in the table (see `handle`).
    async fn launch(self: Arc<Self>, l: Launch) {
        let (job, step) = (l.job_run(), l.step);
        match self.run_step(&l).await {
            // A batch job on this node alone: its end here is the job's
            // end, and the agent need not wait to be told to clean up.
            Ok(exit)
                if step == StepId::BATCH
                    && l.job_nodes.len() == 1
                    && self.procs.lock().end_batch_alone(job, Instant::now()) =>
            {
                self.batch_done(job, exit);
            }
            Ok(exit) => self.end_step(job, step, Ok(exit)),
            Err(e) => {
                let why = error_chain(&e);
                tracing::warn!(job = %job.job, run = job.run, step = %step, error = %why, "launch failed");
                if let Some(fault) = e.node_fault() {
                    self.launch_failed_here(fault, &why);
                }
                self.end_step(job, step, Err(why));
            }
        }
    }

    /// A step's tasks here, from its cgroup's creation to its removal:
    /// the worst exit, and whether a process was killed for memory while
    /// it ran.
    async fn run_step(self: &Arc<Self>, l: &Launch) -> Result<(ExitStatus, bool), StepError> {
        if matches!(l.what, LaunchKind::Batch { .. }) && self.cfg.no_exec {
            return Ok((ExitStatus::default(), false));
        }
        // srun's connection is made while the cgroup is.
        let dialing = match &l.what {
            LaunchKind::Step { io, .. } => Some(crate::step::dial(self, l, *io)),
            LaunchKind::Batch { .. } => None,
        };
        // Held until the step's end here.
        let cgroup = match self.take_budget(l) {
            Ok(held) => self.step_cgroup(l).await.map(|c| (held, c)),
            Err(e) => Err(e),
        };
        let (_held, join, before) = match cgroup {
            Ok((held, Some((join, before)))) => (held, Some(join), Some(before)),
            Ok((held, None)) => (held, None, None),
            Err(e) => {
                if let Some(d) = dialing {
                    crate::step::tell_failed(d, error_chain(&e)).await;
                }
                return Err(e);
            }
        };
        let result = match &l.what {
            LaunchKind::Batch {
                script,
                args,
                stdout,
                stderr,
                append,
            } => {
                let out = crate::batch::Output {
                    stdout,
                    stderr: stderr.as_deref(),
                    append: *append,
                };
                self.run_batch(l, script, args, out, join).await
            }
            LaunchKind::Step { argv, io, files } => {
                let d = dialing.unwrap_or_else(|| crate::step::dial(self, l, *io));
                crate::step::run(self, l, argv, files, join, d).await
            }
        };
        // What the step left behind goes with it.
        let (job, step) = (l.job_run(), l.step);
        let oom = match (before, self.cgroups()) {
            (Some(before), Some(cg)) => {
                tokio::task::spawn_blocking(move || cg.end_step(job, step, before))
                    .await
                    .unwrap_or(false)
            }
            _ => false,
        };
        result.map(|exit| (exit, oom))
    }

    pub(crate) fn env_for(
        &self,
        l: &Launch,
        user: &str,
        groups: Option<&[u32]>,
        local: u32,
    ) -> Vec<(String, String)> {
        let socket = match &self.cfg.jail {
            Some(_) => crate::jail::SOCKET.into(),
            None => self.cfg.socket.to_string_lossy(),
        };
        let mut env =
            crate::task::task_env(l, &self.cfg.name, user, local, &socket, &self.cfg.cluster);
        // Where the cluster's controller is, in Slurm's form
        // (cluster:host:port:protocol:select plugin; 22.05's numbers).
        env.retain(|(k, _)| k != "SLURM_WORKING_CLUSTER");
        env.push((
            "SLURM_WORKING_CLUSTER".into(),
            format!(
                "{}:{}:{}:9728:109",
                self.cfg.cluster,
                self.cfg.ctld.ip(),
                self.cfg.ctld.port()
            ),
        ));
        if let Some(jail) = &self.cfg.jail {
            // The cluster's commands first, as on a login node.
            if let Some((_, path)) = env.iter_mut().find(|(k, _)| k == "PATH") {
                *path = format!("{}:{path}", crate::jail::BIN);
            }
            if !l.gpus.is_empty() && !jail.driver_files.is_empty() {
                // The node's driver, bound in for this task: found first.
                if let Some((_, path)) = env.iter_mut().find(|(k, _)| k == "PATH") {
                    *path = format!("{path}:{}", shared_root::DRIVER_BIN);
                }
                match env.iter_mut().find(|(k, _)| k == "LD_LIBRARY_PATH") {
                    Some((_, v)) if !v.is_empty() => {
                        *v = format!("{}:{v}", shared_root::DRIVER_LIB);
                    }
                    Some((_, v)) => *v = shared_root::DRIVER_LIB.into(),
                    None => env.push(("LD_LIBRARY_PATH".into(), shared_root::DRIVER_LIB.into())),
                }
            }
            env.retain(|(k, _)| k != "DOCKER_HOST");
            if jail.docker_for(l.exclusive, groups) {
                env.push((
                    "DOCKER_HOST".into(),
                    format!("unix://{}", crate::jail::DOCKER),
                ));
            }
        }
        env
    }

    /// A launch failed through the node's fault: the node is a problem
    /// until the check for that passes, and the control session tells
    /// ctld now (before the next heartbeat, so no more jobs are sent here
    /// meanwhile).
    fn launch_failed_here(&self, fault: NodeFault, why: &str) {
        let line: String = why.chars().filter(|c| !c.is_control()).take(200).collect();
        tracing::warn!(?fault, problem = %line, "the node failed a launch; unhealthy until its check passes");
        self.checks.lock().launch = Some(LaunchProblem {
            fault,
            line,
            since: Instant::now(),
        });
        self.health_now.notify_one();
    }

    /// The launch problem, unless its check passes now (which clears it).
    fn launch_problem(&self) -> Option<String> {
        let p = self.checks.lock().launch.clone()?;
        let passed = match p.fault {
            NodeFault::Spool => crate::spool::probe(&self.cfg.spool).is_ok(),
            NodeFault::Cgroup => self.cgroups().is_none_or(|cg| cg.probe().is_ok()),
            NodeFault::Descriptors => {
                let limit =
                    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
                        .map_or(1024, |(soft, _)| soft);
                crate::budget::open_fds() + 2 * crate::health::FD_RESERVE <= limit
            }
            NodeFault::Other => p.since.elapsed() >= NodeFault::RETRY,
        };
        if !passed {
            return Some(format!("launch: {}", p.line));
        }
        let mut checks = self.checks.lock();
        if checks
            .launch
            .as_ref()
            .is_some_and(|now| now.since == p.since)
        {
            checks.launch = None;
            tracing::info!("the node's launch check passes again");
        }
        None
    }

    /// Why this node cannot take more work, if it cannot: the first
    /// failing check, as `<check>: <detail>` (the latest result of each).
    fn health(&self) -> Option<String> {
        crate::health::fd_problem()
            .or_else(|| self.launch_problem())
            .or_else(|| {
                let checks = self.checks.lock();
                checks
                    .gpu
                    .clone()
                    .or_else(|| checks.commands.iter().flatten().next().cloned())
            })
    }

    /// Takes ctld's checks: the GPU checks run once now (so the first
    /// heartbeat already tells a sick node), then the loop runs every
    /// check at its interval. The same checks again (a reconnection)
    /// change nothing.
    async fn configure_checks(self: &Arc<Self>, cfg: HealthConfig) {
        if self.health_cfg.borrow().as_ref() == Some(&cfg) {
            return;
        }
        self.check_gpus(&cfg).await;
        self.checks.lock().commands = vec![None; cfg.commands.len()];
        self.health_cfg.send_replace(Some(cfg));
    }

    /// Reads the GPUs and records what the built-in checks say.
    async fn check_gpus(self: &Arc<Self>, cfg: &HealthConfig) {
        let Some((backend, checks)) = self.cfg.gpu_health.clone() else {
            return;
        };
        let checks = checks.configured(cfg);
        let problem = tokio::task::spawn_blocking(move || checks.problem(backend.health()))
            .await
            .unwrap_or_else(|e| Some(format!("gpu: the check panicked: {e}")));
        self.checks.lock().gpu = problem;
    }

    /// Runs every configured check at its interval, starting over when
    /// ctld's checks change.
    async fn health_loop(self: Arc<Self>) {
        let mut rx = self.health_cfg.subscribe();
        loop {
            let cfg = rx.borrow_and_update().clone();
            let mut running = tokio::task::JoinSet::new();
            if let Some(cfg) = cfg {
                let every = |ms: u64| {
                    let mut t = tokio::time::interval(Duration::from_millis(ms.max(100)));
                    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    t
                };
                let me = self.clone();
                let gpu_cfg = cfg.clone();
                running.spawn(async move {
                    let mut t = every(gpu_cfg.interval_ms);
                    t.tick().await; // ran when configured
                    loop {
                        t.tick().await;
                        me.check_gpus(&gpu_cfg).await;
                    }
                });
                for (i, check) in cfg.commands.into_iter().enumerate() {
                    let me = self.clone();
                    running.spawn(async move {
                        let mut t = every(check.interval_ms);
                        loop {
                            t.tick().await;
                            let result = crate::health::run_command(&check, me.name()).await;
                            if let Some(slot) = me.checks.lock().commands.get_mut(i) {
                                *slot = result;
                            }
                        }
                    });
                }
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// The minor number of GPU `index`'s device node.
    fn minor(&self, index: u32) -> u32 {
        self.cfg.gpu_minors.get(&index).copied().unwrap_or(index)
    }

    /// A launch's user, resolved once for all its tasks: the name, and
    /// the groups when tasks run in the shared root (whose users are the
    /// root's); outside it the launcher asks the node's database.
    pub(crate) fn user_of(&self, l: &Launch) -> (String, Option<Arc<[u32]>>) {
        match &self.cfg.jail {
            Some(j) => crate::jail::identity(&j.root, l.user),
            None => (crate::task::user_name(l.user.uid), None),
        }
    }

    /// The jail a task of `l` enters, if this node jails its tasks.
    pub(crate) fn jail_for(
        &self,
        l: &Launch,
        groups: Option<&[u32]>,
    ) -> Result<Option<Arc<shared_root::Prepared>>, StepError> {
        let Some(cfg) = &self.cfg.jail else {
            return Ok(None);
        };
        let docker = cfg.docker_for(l.exclusive, groups);
        // The step's own GPUs only, when it asked for some.
        let gpus = l.step_gpus.as_deref().unwrap_or(&l.gpus);
        let minors: Vec<u32> = gpus.iter().map(|&g| self.minor(g)).collect();
        let plan = cfg.plan(&minors, docker, &self.cfg.socket, &self.cfg.spool);
        let prepared = plan.prepare().map_err(StepError::Jail)?;
        Ok(Some(Arc::new(prepared)))
    }

    /// Leaves the cluster (on SIGTERM): ctld drains the node, lets its
    /// jobs finish within `grace`, removes it and says farewell. Whatever
    /// still runs here then (or if ctld never answers) is killed.
    pub async fn leave(&self, grace: Duration) {
        let grace_ms = grace.as_millis().min(u128::from(u64::MAX)) as u64;
        self.send_up(AgentMsg::Leaving { grace_ms });
        let answered =
            tokio::time::timeout(grace + Duration::from_secs(30), self.farewell.notified());
        if answered.await.is_err() {
            tracing::warn!("ctld did not confirm the node left; stopping anyway");
        }
        self.kill_all();
    }

    /// Returns once ctld has removed the node (`scontrol delete`, or the
    /// end of `leave`).
    pub async fn removed(&self) {
        self.farewell.notified().await;
    }

    /// Kills every task still running here, and whatever the jobs' cgroups
    /// still hold.
    pub fn kill_all(&self) {
        self.pid_namespaces.lock().clear();
        {
            let procs = self.procs.lock();
            for g in procs.all_groups() {
                signal_group(g, Signal::SIGKILL);
            }
        }
        if let Some(cg) = self.cgroups() {
            cg.remove_all();
        }
    }

    /// Relays a CLI request to ctld with a fresh credential for `who`;
    /// returns ctld's answer as the frame it came in (its size and version
    /// checked), or an error of the agent's own as a frame.
    pub async fn relay(&self, who: Ident, request: Request) -> Relayed {
        let unreachable = || {
            Relayed::frame(frame_of(&Response::Error(
                "Unable to contact slurm controller (connect failure)".into(),
            )))
        };
        let deadline = tokio::time::Instant::now() + RELAY_TIMEOUT;
        // A request that may be repeated safely is sent again over the
        // agent's next connection when ctld went away under it (a restart);
        // a submission is not (ctld may have stored it before it died). A
        // step is: ctld knows a step it stored by its srun's secret.
        let repeatable = !matches!(request, Request::Submit(_));
        let mut failed_on: Option<u64> = None;
        loop {
            // While ctld is away (restarting), wait for the agent to
            // reconnect, as Slurm's commands retry, rather than fail at once.
            let mut rx = self.conn.subscribe();
            let next = tokio::time::timeout_at(deadline, async {
                loop {
                    let current = rx.borrow_and_update().clone();
                    if let Some(c) = current.filter(|(n, _)| Some(*n) != failed_on) {
                        return Some(c);
                    }
                    if rx.changed().await.is_err() {
                        return None;
                    }
                }
            });
            let Ok(Some((n, conn))) = next.await else {
                return unreachable();
            };
            let token = match self.minter.mint(who, now_ms()) {
                Ok(t) => t,
                Err(e) => return Relayed::frame(frame_of(&Response::Error(e.to_string()))),
            };
            let request = request.clone();
            // The answer goes back as it came, undecoded: a listing of
            // thousands of jobs is megabytes the caller decodes anyway.
            let exchange = async {
                let (mut send, mut recv) = conn.open_bi().await.ok()?;
                write_frame(&mut send, &Open::Request { token, request })
                    .await
                    .ok()?;
                let _ = send.finish();
                let first = corral_proto::read_raw_frame(&mut recv)
                    .await
                    .ok()
                    .flatten()?;
                Some((first, recv))
            };
            // A controller that died leaves the connection up until it is
            // reset or times out: give up by the deadline, as Slurm's
            // MessageTimeout does.
            match tokio::time::timeout_at(deadline, exchange).await {
                Ok(Some((first, recv))) => {
                    return Relayed {
                        rest: Response::frame_is_part(&first).then_some(recv),
                        first,
                    }
                }
                Ok(None) if repeatable => failed_on = Some(n),
                _ => return unreachable(),
            }
        }
    }
}

/// ctld's answer to a relayed request, undecoded: its first frame and,
/// when that is part of a listing ([`Response::JobsPart`]), the stream its
/// other parts come on, for the caller to pass on as they come.
#[derive(Debug)]
pub struct Relayed {
    pub first: Vec<u8>,
    pub rest: Option<quinn::RecvStream>,
}

impl Relayed {
    /// An answer of one frame.
    pub fn frame(first: Vec<u8>) -> Relayed {
        Relayed { first, rest: None }
    }

    /// Writes the answer to `w`: the first frame, then each further part
    /// as it comes from ctld (each within `RELAY_TIMEOUT`), up to the
    /// frame that ends the listing. A listing that breaks off ends with an
    /// error, so the reader never waits for a frame that will not come.
    pub async fn write_to<W: tokio::io::AsyncWrite + Unpin>(
        self,
        w: &mut W,
    ) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        w.write_all(&self.first).await?;
        let Some(mut rest) = self.rest else {
            return Ok(());
        };
        loop {
            let next = tokio::time::timeout(RELAY_TIMEOUT, corral_proto::read_raw_frame(&mut rest));
            let frame = match next.await {
                Ok(Ok(Some(f))) => f,
                _ => {
                    let broke = Response::Error("the controller's answer broke off".into());
                    return w.write_all(&frame_of(&broke)).await;
                }
            };
            w.write_all(&frame).await?;
            if !Response::frame_is_part(&frame) {
                return Ok(());
            }
        }
    }
}

/// An answer as one frame for a local client. A message that cannot be
/// encoded (none of the agent's own can: they are small) becomes an
/// error that can.
pub(crate) fn frame_of(resp: &Response) -> Vec<u8> {
    corral_proto::frame::encode(resp).unwrap_or_else(|e| {
        corral_proto::frame::encode(&Response::Error(format!("agent: {e}"))).unwrap_or_default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnects_wait_longer_after_timeouts_and_afresh_after_a_session() {
        let mut r = Reconnect::default();
        assert_eq!(r.connect_wait(), Duration::from_secs(2));
        let mut pauses = Vec::new();
        for _ in 0..8 {
            pauses.push(r.after(false, true));
        }
        assert_eq!(
            r.connect_wait(),
            Duration::from_secs(16),
            "doubled, then capped"
        );
        // 100 ms doubling to 2 s, each spread by at most half of itself.
        let base = [100, 200, 400, 800, 1600, 2000, 2000, 2000];
        for (p, b) in pauses.iter().zip(base) {
            let b = Duration::from_millis(b);
            assert!(*p >= b && *p <= b + b / 2, "{p:?} for {b:?}");
        }
        // A refused or lost connection that did not time out keeps the wait.
        r.after(false, false);
        assert_eq!(r.connect_wait(), Duration::from_secs(16));
        let p = r.after(true, false);
        assert!(p >= Duration::from_millis(100) && p <= Duration::from_millis(150));
        assert_eq!(
            r.connect_wait(),
            Duration::from_secs(2),
            "afresh after a session"
        );
    }

    #[test]
    fn recent_outcomes_are_sent_again_for_a_while_and_nothing_else() {
        let t0 = std::time::Instant::now();
        let run = JobRun {
            job: corral_proto::msg::JobId(7),
            run: 0,
        };
        let exited = AgentMsg::StepExited {
            job: run,
            step: StepId::BATCH,
            exit: ExitStatus::default(),
            oom: false,
        };
        let cleaned = AgentMsg::JobCleaned {
            job: run,
            usage: None,
        };
        let mut r = Recent::default();
        r.push(t0, &AgentMsg::Heartbeat { running: vec![] });
        r.push(t0, &exited);
        r.push(t0 + Duration::from_secs(60), &cleaned);
        let names = |v: Vec<AgentMsg>| {
            v.iter()
                .map(|m| format!("{m:?}")[..8].to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(r.replay(t0 + Duration::from_secs(61))),
            ["StepExit", "JobClean"]
        );
        // Older than KEEP: gone.
        assert_eq!(
            names(r.replay(t0 + Recent::KEEP + Duration::from_secs(1))),
            ["JobClean"]
        );
        // At most MOST, the newest kept.
        let mut r = Recent::default();
        for i in 0..Recent::MOST + 10 {
            r.push(t0 + Duration::from_millis(i as u64), &exited);
        }
        assert_eq!(r.replay(t0).len(), Recent::MOST);
    }

    /// A new connection sends the kept outcomes, then the end of each
    /// ended run they no longer hold, each end once.
    #[test]
    fn a_new_connection_sends_the_end_of_every_kept_ended_run_once() {
        let t0 = std::time::Instant::now();
        let run = |job| JobRun {
            job: corral_proto::msg::JobId(job),
            run: 0,
        };
        let done = |job| AgentMsg::BatchDone {
            job: run(job),
            exit: ExitStatus::default(),
            oom: false,
            usage: None,
        };
        let mut r = Recent::default();
        r.push(t0, &done(1));
        r.push(
            t0 + Recent::KEEP,
            &AgentMsg::JobCleaned {
                job: run(3),
                usage: None,
            },
        );
        r.push(t0 + Recent::KEEP, &done(2));
        let now = t0 + Recent::KEEP + Duration::from_secs(1);
        // Job 1's end left the kept outcomes; its run is still kept.
        let names = |v: Vec<AgentMsg>| {
            v.iter()
                .map(|m| match m {
                    AgentMsg::BatchDone { job, .. } => format!("done {}", job.job.0),
                    AgentMsg::JobCleaned { job, .. } => format!("cleaned {}", job.job.0),
                    other => format!("{other:?}"),
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(replay(&mut r, vec![done(1), done(2)], now)),
            ["cleaned 3", "done 2", "done 1"]
        );
        assert_eq!(
            names(replay(&mut r, Vec::new(), now)),
            ["cleaned 3", "done 2"]
        );
    }

    #[test]
    fn step_errors_read_as_one_line_with_their_causes() {
        let e = StepError::Script {
            path: "/var/spool/corral/job1.0.sh".into(),
            source: std::io::Error::from_raw_os_error(28),
        };
        assert_eq!(
            error_chain(&e),
            "writing the script /var/spool/corral/job1.0.sh: No space left on device (os error 28)"
        );
        let e = StepError::Dial {
            addr: "10.0.0.1:4000".parse().expect("address"),
            source: "timed out".into(),
        };
        assert_eq!(
            error_chain(&e),
            "connect to srun at 10.0.0.1:4000: timed out"
        );
    }
}
