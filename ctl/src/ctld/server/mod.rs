//! corral-ctld's service: the QUIC endpoint, one task per stream, the
//! scheduling loop and the clock. It turns network input into calls on
//! [`Controller`] and carries the controller's outbox to agents; every
//! decision is the controller's.
//!
//! Scheduling passes are coalesced: any change that might start a job
//! wakes the scheduling task, which runs one pass for all changes so far.
//! Only that task runs passes, so never more than one is in flight. After
//! each it rests as long as the pass took (0.2 ms to 1 s), so requests
//! waiting on the controller's lock get at least half its time even when
//! every event asks for another pass: with 50,000 jobs pending a pass
//! takes about 100 ms, and resting only 2 ms after each (as before) left
//! submissions 2% of the controller (335 a second, against 5,800 with an
//! empty queue; `corral-fleet`).
//!
//! The store's commits are grouped too: the committer writes every call
//! queued since its last transaction in one, and first waits (2 ms at
//! most) for a pass that is due and short ([`Passes`]), so a job's
//! submission and its start reach the disk in one fdatasync.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral_proto::error_chain as chain;
use corral_proto::msg::{
    encode_in_listing, listing_frame, AgentMsg, CtldMsg, JobFilter, JobId, JobRun, LaunchKind,
    Open, Registration, Request, Response,
};
use corral_proto::ratelimit::LogLimiter;
use corral_proto::tls::{self, CertFiles, Identity, TlsError, CTLD_NAME};
use corral_proto::{now_ms, read_frame, warn_limited, write_frame, WireError};
use parking_lot::{Mutex, MutexGuard};
use tokio::sync::{mpsc, Notify, Semaphore};

use crate::ctld::config::Config;
use crate::ctld::store;
use crate::ctld::{Controller, Selector};

mod accounting;

/// Why the controller could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("certificates in {dir}")]
    Certs {
        dir: PathBuf,
        #[source]
        source: TlsError,
    },
    #[error("endpoint")]
    Endpoint(#[source] TlsError),
    #[error("controller: {0}")]
    State(String),
    #[error(transparent)]
    Store(#[from] crate::ctld::store::StoreError),
    #[error("{path}")]
    AddrFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Seconds since the Unix epoch.
pub fn now() -> u64 {
    now_ms() / 1000
}

/// What the server keeps of one agent's connection: its id, the sender of
/// its control stream, and its latest heartbeat.
#[derive(Debug)]
struct AgentLink {
    id: usize,
    /// Boxed: a channel allocates its slots 32 at a time, and 32 unboxed
    /// messages (a `Launch` is large) were 23 KiB per node.
    tx: mpsc::UnboundedSender<Box<CtldMsg>>,
    heard: Arc<Heard>,
}

/// An agent's latest heartbeat, recorded without the controller's lock so
/// that no request, however slow, can make a live node look silent. The
/// clock hands it to the controller.
#[derive(Debug, Default)]
struct Heard {
    /// When anything last arrived on the control stream (seconds).
    at: AtomicU64,
    /// The runs the latest heartbeat listed, until the clock takes them.
    running: Mutex<Option<Vec<JobRun>>>,
}

/// The most streams one agent's connection is allowed, once its
/// requests have filled the ones it had.
const MOST_AGENT_STREAMS: u64 = 4096;

/// Requests of one (unprivileged) user served at once.
const REQUESTS_PER_USER: usize = 2;

/// Where a stream stands after its first frame was read and served.
enum Phase {
    /// Nothing more to say (a refusal was sent, or the stream ended).
    Done,
    /// An agent's control stream.
    Control(Box<Registration>),
    /// The answer, to send now.
    Answer(Response),
    /// The answer, to send once the changes of `ticket` are stored (with
    /// the user's turn, held until then).
    Commit(Response, u64, Option<tokio::sync::OwnedSemaphorePermit>),
    /// A listing of jobs, to write as it is made (with the user's turn,
    /// held until it is written).
    Listing(JobFilter, Option<tokio::sync::OwnedSemaphorePermit>),
}

/// Lines a peer can cause are rate-limited.
static LOGS: std::sync::LazyLock<LogLimiter> = std::sync::LazyLock::new(LogLimiter::default);

/// Views built per hold of the controller's lock, and jobs looked at: a
/// large squeue is built in slices with the lock released between them.
const VIEWS_PER_SLICE: usize = 500;
/// A listing's first part is smaller, so its reader starts sooner.
const FIRST_PART_VIEWS: usize = 64;
/// A listing's part goes out once its views take this many bytes, however
/// few they are: a user's jobs may carry megabytes of text each, and one
/// part past [`corral_proto::MAX_FRAME`] broke every user's listing.
const PART_BYTES: usize = 1 << 20;
const SCAN_PER_SLICE: usize = 20_000;

/// Changes waiting for the store, and the messages for agents that must
/// not go out before them (a launch the store has not seen could run
/// twice after a crash).
#[derive(Debug, Default)]
struct Journal {
    batches: Vec<(store::Changes, Vec<(String, CtldMsg)>)>,
    /// The ticket of the latest batch queued.
    queued: u64,
}

/// How far the store has got: the latest ticket written, and the error of
/// the latest attempt if it failed.
#[derive(Clone, Debug, Default)]
struct Committed {
    ticket: u64,
    error: Option<String>,
}

/// How long a request waits for its changes to be stored.
const COMMIT_WAIT: Duration = Duration::from_secs(10);

/// The scheduling task's progress, as the committer sees it. A call that
/// wants a pass asks for one while it holds the controller; a pass answers
/// every ask made before it took the controller. The committer waits
/// (briefly) for the answer to what it is about to write, so a submission
/// and the start of its job, or a job's end and the start of the next,
/// share one transaction: one fdatasync before a launch instead of two.
#[derive(Debug, Default)]
struct Passes {
    asked: AtomicU64,
    answered: AtomicU64,
    /// The task rests after each pass: an ask made then waits out the rest,
    /// and the committer does not wait for it.
    resting: AtomicBool,
    /// How long the latest pass took (µs): the committer waits only for
    /// short ones, so a deep queue's 100 ms pass delays no commit.
    last_us: AtomicU64,
    done: Notify,
}

/// The longest pass the committer waits for, and how long it waits at most.
const PASS_WORTH_WAITING_US: u64 = 1_000;
const PASS_WAIT: Duration = Duration::from_millis(2);

impl Passes {
    /// Called with the controller held, by a call that wants a pass.
    fn ask(&self) {
        self.asked.fetch_add(1, Ordering::AcqRel);
    }

    /// Every ask up to `upto` (read while the pass held the controller)
    /// is answered: its changes are in the journal with the pass's own.
    fn answer(&self, upto: u64) {
        self.answered.fetch_max(upto, Ordering::AcqRel);
        self.done.notify_waiters();
    }

    fn rest(&self, resting: bool) {
        self.resting.store(resting, Ordering::Release);
        if resting {
            self.done.notify_waiters();
        }
    }

    /// Waits until the pass now due has run, if one is due, the task is
    /// not resting and the last pass was short; [`PASS_WAIT`] at most.
    async fn settle(&self) {
        let want = self.asked.load(Ordering::Acquire);
        let settled = || {
            self.answered.load(Ordering::Acquire) >= want || self.resting.load(Ordering::Acquire)
        };
        if settled() || self.last_us.load(Ordering::Relaxed) > PASS_WORTH_WAITING_US {
            return;
        }
        let deadline = tokio::time::sleep(PASS_WAIT);
        tokio::pin!(deadline);
        loop {
            let notified = self.done.notified();
            tokio::pin!(notified);
            // Registered before the check: an answer between the two wakes it.
            notified.as_mut().enable();
            if settled() {
                return;
            }
            tokio::select! {
                _ = notified => {}
                _ = &mut deadline => return,
            }
        }
    }
}

/// The running controller.
#[derive(Debug)]
pub struct Server {
    ctl: Mutex<Controller>,
    /// The durable state, where one is configured.
    store: Option<Arc<store::Store>>,
    journal: Mutex<Journal>,
    commit_kick: Notify,
    committed: tokio::sync::watch::Sender<Committed>,
    kick: Notify,
    passes: Passes,
    agents: Mutex<HashMap<String, AgentLink>>,
    /// Each user's turns at the controller (see [`REQUESTS_PER_USER`]).
    turns: Mutex<HashMap<u32, Arc<Semaphore>>>,
    /// The accounting database, where accounting is on.
    acct: Option<Arc<accounting::Accounting>>,
    /// The file the configuration came from (`scontrol reconfigure` reads
    /// it again); none when the server was built from a value.
    config_path: std::sync::OnceLock<std::path::PathBuf>,
}

impl Server {
    pub fn new(cfg: Config) -> Result<Arc<Server>, ServerError> {
        let store = match &cfg.state_dir {
            Some(dir) => Some(Arc::new(store::Store::open(dir)?)),
            None => None,
        };
        let acct = cfg
            .accounting
            .clone()
            .map(|a| Arc::new(accounting::Accounting::new(a, cfg.cluster.clone())));
        let mut ctl = Controller::new(cfg).map_err(|e| ServerError::State(e.to_string()))?;
        if let Some(s) = &store {
            let t0 = Instant::now();
            let loaded = s.load()?;
            ctl.restore(loaded, now()).map_err(ServerError::State)?;
            tracing::info!(took = ?t0.elapsed(), "state read back");
        }
        Ok(Arc::new(Server {
            store,
            journal: Mutex::new(Journal::default()),
            commit_kick: Notify::new(),
            committed: tokio::sync::watch::channel(Committed::default()).0,
            ctl: Mutex::new(ctl),
            kick: Notify::new(),
            passes: Passes::default(),
            agents: Mutex::new(HashMap::new()),
            turns: Mutex::new(HashMap::new()),
            acct,
            config_path: std::sync::OnceLock::new(),
        }))
    }

    /// Where `scontrol reconfigure` reads the configuration again.
    pub fn set_config_path(&self, path: std::path::PathBuf) {
        let _ = self.config_path.set(path);
    }

    /// Binds, then serves until the process ends. Writes the bound address
    /// to `addr_file` once it listens.
    pub async fn run(
        self: Arc<Self>,
        listen: SocketAddr,
        addr_file: Option<PathBuf>,
    ) -> Result<(), ServerError> {
        let dir = self.ctl.lock().config().certs.clone();
        let id = Identity::load(&CertFiles::in_dir(&dir, CTLD_NAME)).map_err(|source| {
            ServerError::Certs {
                dir: dir.clone(),
                source,
            }
        })?;
        let cfg = tls::server_config(&id).map_err(ServerError::Endpoint)?;
        let endpoint = tls::server_endpoint_for(listen, cfg, &id).map_err(ServerError::Endpoint)?;
        let bound = endpoint.local_addr().map_err(|e| {
            ServerError::Endpoint(TlsError::Bind {
                addr: listen,
                source: e,
            })
        })?;
        if let Some(path) = addr_file {
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, bound.to_string())
                .and_then(|()| std::fs::rename(&tmp, &path))
                .map_err(|source| ServerError::AddrFile { path, source })?;
        }
        tracing::info!(%bound, "corral-ctld listening");
        if self.store.is_none() {
            tracing::warn!("no state_dir in corral.toml: the queue is lost on restart");
        }
        tokio::spawn(self.clone().scheduling());
        tokio::spawn(self.clone().clock());
        tokio::spawn(self.clone().committer());
        tokio::spawn(self.clone().acct_writer());
        while let Some(incoming) = endpoint.accept().await {
            tokio::spawn(self.clone().connection(incoming));
        }
        Ok(())
    }

    /// Carries out what a call on the controller queued: its changes go
    /// to the store and, once stored, its messages to the agents. Returns
    /// the ticket to wait for (0: nothing to store).
    fn finish(&self, mut c: MutexGuard<'_, Controller>) -> u64 {
        let out = c.take_outbox();
        let mut changes = c.take_changes();
        let dirty = c.is_dirty();
        if dirty {
            // While the controller is held: the pass that takes it next
            // sees these changes, and answers this ask.
            self.passes.ask();
        }
        drop(c);
        if self.store.is_none() {
            if let Some(a) = &self.acct {
                a.keep_in_memory(std::mem::take(&mut changes.acct));
            }
        }
        let ticket = if self.store.is_none() || (changes.is_empty() && out.is_empty()) {
            if !out.is_empty() {
                // Nothing of it to store first.
                self.deliver(out);
            }
            0
        } else {
            let mut j = self.journal.lock();
            j.queued += 1;
            j.batches.push((changes, out));
            let t = j.queued;
            drop(j);
            self.commit_kick.notify_one();
            t
        };
        if dirty {
            self.kick.notify_one();
        }
        ticket
    }

    fn deliver(&self, mut out: Vec<(String, CtldMsg)>) {
        self.fill_launches(&mut out);
        let agents = self.agents.lock();
        for (node, msg) in out {
            match agents.get(&node) {
                Some(link) => {
                    let _ = link.tx.send(Box::new(msg));
                }
                None => tracing::debug!(%node, "message for a disconnected node dropped"),
            }
        }
    }

    /// Puts jobs' scripts and environments, kept in the store rather than
    /// in memory, back into their launches: the job's environment under
    /// the step's own (the step's wins), the script into a batch launch
    /// (a task of an array: the array's).
    fn fill_launches(&self, out: &mut [(String, CtldMsg)]) {
        let Some(store) = &self.store else {
            return;
        };
        let mut read: HashMap<JobId, Option<Arc<store::Payload>>> = HashMap::new();
        for (_, msg) in out.iter_mut() {
            let CtldMsg::Launch(l) = msg else {
                continue;
            };
            // A task of an array runs its array's script.
            let owner = l.array.map_or(l.job, |a| a.job);
            let payload = read
                .entry(owner)
                .or_insert_with(|| match store.payload(owner.0) {
                    Ok(p) => p.map(Arc::new),
                    Err(e) => {
                        warn_limited!(LOGS, "payload", job = %l.job, error = %chain(&e), "cannot read a job's script and environment");
                        None
                    }
                })
                .clone();
            let Some(p) = payload else {
                continue;
            };
            let own = std::mem::take(&mut l.env);
            let mut env = p.env.clone();
            for (k, v) in own {
                env.retain(|(key, _)| *key != k);
                env.push((k, v));
            }
            l.env = env;
            if let (LaunchKind::Batch { script, .. }, Some(s)) = (&mut l.what, &p.script) {
                if script.is_empty() {
                    script.clone_from(s);
                }
            }
        }
    }

    /// Writes what is queued, a batch of calls per transaction (calls
    /// made while one is written share the next), then lets their
    /// messages go. A failed write is retried; its waiters are told.
    async fn committer(self: Arc<Self>) {
        let Some(store) = self.store.clone() else {
            return;
        };
        let mut retry = Duration::from_millis(100);
        loop {
            self.commit_kick.notified().await;
            loop {
                self.passes.settle().await;
                let (batches, ticket) = {
                    let mut j = self.journal.lock();
                    (std::mem::take(&mut j.batches), j.queued)
                };
                if batches.is_empty() {
                    break;
                }
                let s = store.clone();
                let (changes, outs): (Vec<store::Changes>, Vec<_>) = batches.into_iter().unzip();
                if changes.iter().all(store::Changes::is_empty) {
                    // Only messages (a clock tick's): nothing to write
                    // first, and the batches before them are stored.
                    for out in outs {
                        self.deliver(out);
                    }
                    self.committed.send_replace(Committed {
                        ticket,
                        error: None,
                    });
                    continue;
                }
                let accounted = changes.iter().any(|c| !c.acct.is_empty());
                // The waiters hear it from the committing thread as soon
                // as the batch is on disk; its messages go once the
                // database has it too (a launch reads its script there).
                let me = self.clone();
                let (changes, result) = tokio::task::spawn_blocking(move || {
                    // A panic below (a log line that could not be written
                    // once did) must not take the changes with it: they
                    // are kept and written again.
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        s.commit_then(&changes, || {
                            me.committed.send_replace(Committed {
                                ticket,
                                error: None,
                            });
                        })
                    }))
                    .unwrap_or_else(|p| {
                        let why = p
                            .downcast_ref::<String>()
                            .map(String::as_str)
                            .or_else(|| p.downcast_ref::<&str>().copied())
                            .unwrap_or("a panic");
                        Err(store::StoreError::Db(format!("writing the state: {why}")))
                    });
                    (changes, r)
                })
                .await
                .unwrap_or_else(|e| (Vec::new(), Err(store::StoreError::Db(e.to_string()))));
                match result {
                    Ok(()) => {
                        retry = Duration::from_millis(100);
                        if let (true, Some(a)) = (accounted, &self.acct) {
                            a.kick.notify_one();
                        }
                        for out in outs {
                            if !out.is_empty() {
                                self.deliver(out);
                            }
                        }
                    }
                    Err(e) => {
                        let why = chain(&e);
                        warn_limited!(LOGS, "store", error = %why, "cannot save the controller's state; retrying");
                        // Back at the head of the queue, in order, as one
                        // batch: what waits for space is the state, not
                        // every change made to it meanwhile.
                        {
                            let mut j = self.journal.lock();
                            let later = std::mem::take(&mut j.batches);
                            let (later, later_outs): (Vec<_>, Vec<_>) = later.into_iter().unzip();
                            let all = store::Changes::coalesce(changes.into_iter().chain(later));
                            let out = outs.into_iter().chain(later_outs).flatten().collect();
                            j.batches = vec![(all, out)];
                        }
                        let last = self.committed.borrow().ticket;
                        self.committed.send_replace(Committed {
                            ticket: last,
                            error: Some(why),
                        });
                        tokio::time::sleep(retry).await;
                        retry = (retry * 2).min(Duration::from_secs(2));
                    }
                }
            }
        }
    }

    /// Waits until `ticket`'s changes are stored; the store's error if
    /// they are not (the caller must not acknowledge).
    async fn durable(&self, ticket: u64) -> Result<(), String> {
        if ticket == 0 {
            return Ok(());
        }
        let mut rx = self.committed.subscribe();
        let wait = async {
            loop {
                {
                    let c = rx.borrow_and_update();
                    if c.ticket >= ticket {
                        return Ok(());
                    }
                    if let Some(e) = &c.error {
                        return Err(e.clone());
                    }
                }
                if rx.changed().await.is_err() {
                    return Err("the controller is stopping".to_string());
                }
            }
        };
        tokio::time::timeout(COMMIT_WAIT, wait)
            .await
            .unwrap_or_else(|_| Err("saving the state took too long".into()))
    }

    async fn scheduling(self: Arc<Self>) {
        loop {
            self.kick.notified().await;
            let t0 = Instant::now();
            let started = {
                let mut c = self.ctl.lock();
                let asked = self.passes.asked.load(Ordering::Acquire);
                if !c.take_dirty() {
                    drop(c);
                    self.passes.answer(asked);
                    continue;
                }
                let started = c.schedule(now());
                let pass_us = t0.elapsed().as_micros() as u64;
                c.record_pass(pass_us);
                self.passes.last_us.store(pass_us, Ordering::Relaxed);
                self.finish(c);
                self.passes.answer(asked);
                started
            };
            let took = t0.elapsed();
            if started > 0 {
                tracing::debug!(started, ?took, "scheduling pass");
            }
            self.passes.rest(true);
            tokio::time::sleep(took.clamp(Duration::from_micros(200), Duration::from_secs(1)))
                .await;
            self.passes.rest(false);
        }
    }

    async fn clock(self: Arc<Self>) {
        let mut every = tokio::time::interval(Duration::from_millis(500));
        loop {
            every.tick().await;
            let heard: Vec<(String, u64, Option<Vec<JobRun>>)> = self
                .agents
                .lock()
                .iter()
                .map(|(name, l)| {
                    (
                        name.clone(),
                        l.heard.at.load(Ordering::Relaxed),
                        l.heard.running.lock().take(),
                    )
                })
                .collect();
            let mut c = self.ctl.lock();
            for (name, at, running) in heard {
                match running {
                    Some(running) => c.heartbeat(&name, at, &running),
                    None => c.heard(&name, at),
                }
            }
            c.tick(now());
            self.finish(c);
            // Forget the turns of users with nothing in flight.
            self.turns.lock().retain(|_, s| {
                s.available_permits() < REQUESTS_PER_USER || Arc::strong_count(s) > 1
            });
        }
    }

    async fn connection(self: Arc<Self>, incoming: quinn::Incoming) {
        let peer = incoming.remote_address();
        let conn = match incoming.await {
            Ok(c) => c,
            Err(e) => {
                warn_limited!(LOGS, "handshake", %peer, error = %e, "handshake refused");
                return;
            }
        };
        let logged = Arc::new(AtomicBool::new(false));
        // A node starts with few streams (quinn keeps each one's state
        // from the start); one whose requests fill half of them (a login
        // node's burst of sbatch) is given twice as many, up to
        // `MOST_AGENT_STREAMS`: a busy node gets the depth that keeps the
        // store's commits full, the thousands of quiet ones cost little.
        let open = Arc::new(AtomicU64::new(0));
        let mut allowed = u64::from(tls::AGENT_STREAMS);
        while let Ok((send, recv)) = conn.accept_bi().await {
            let now_open = open.fetch_add(1, Ordering::Relaxed) + 1;
            if now_open * 2 > allowed && allowed < MOST_AGENT_STREAMS {
                allowed = (allowed * 2).min(MOST_AGENT_STREAMS);
                conn.set_max_concurrent_bi_streams(
                    quinn::VarInt::from_u64(allowed).unwrap_or(quinn::VarInt::MAX),
                );
            }
            let (me, conn, logged, open) =
                (self.clone(), conn.clone(), logged.clone(), open.clone());
            tokio::spawn(async move {
                me.stream(conn, send, recv, logged).await;
                open.fetch_sub(1, Ordering::Relaxed);
            });
        }
    }

    /// One stream from an agent: its registration (the control stream) or
    /// one request. The request is read and served in a first phase that
    /// is boxed and gone before the wait for its commit, so a task waiting
    /// holds only its answer: a burst of thousands waiting at once would
    /// otherwise leave kilobytes each behind as holes in the heap.
    async fn stream(
        self: Arc<Self>,
        conn: quinn::Connection,
        mut send: quinn::SendStream,
        mut recv: quinn::RecvStream,
        logged: Arc<AtomicBool>,
    ) {
        let phase = Box::pin(self.first_phase(&conn, &mut send, &mut recv, &logged)).await;
        let resp = match phase {
            Phase::Done => return,
            Phase::Control(reg) => return Box::pin(self.control(conn, *reg, send, recv)).await,
            Phase::Answer(resp) => resp,
            Phase::Listing(f, turn) => {
                Box::pin(self.list_jobs(f, &mut send)).await;
                drop(turn);
                let _ = send.finish();
                return;
            }
            Phase::Commit(resp, ticket, turn) => {
                let resp = self.acknowledged(resp, ticket).await;
                drop(turn);
                resp
            }
        };
        let _ = write_frame(&mut send, &resp).await;
        let _ = send.finish();
    }

    /// Reads a stream's first frame and serves it, short of waiting for
    /// what it changed to be stored.
    async fn first_phase(
        &self,
        conn: &quinn::Connection,
        send: &mut quinn::SendStream,
        recv: &mut quinn::RecvStream,
        logged: &AtomicBool,
    ) -> Phase {
        let first =
            tokio::time::timeout(Duration::from_secs(10), read_frame::<_, Open>(recv)).await;
        let open = match first {
            Ok(Ok(Some(open))) => open,
            Ok(Ok(None)) => return Phase::Done,
            Ok(Err(e)) => {
                refuse(conn, send, recv, &e, logged).await;
                return Phase::Done;
            }
            Err(_) => {
                let _ = send.reset(1u32.into());
                return Phase::Done;
            }
        };
        match open {
            Open::Control(reg) => Phase::Control(Box::new(reg)),
            Open::Request { token, request } => self.request(&token, request).await,
        }
    }

    async fn request(&self, token: &corral_proto::cred::Token, request: Request) -> Phase {
        let now = now();
        let served = {
            let mut c = self.ctl.lock();
            let who = match c.authenticate(token, now_ms()) {
                Ok(who) => who,
                Err(e) => {
                    drop(c);
                    warn_limited!(LOGS, "credential", node = %token.claims.node, error = %e, "credential refused");
                    return Phase::Answer(Response::Error(format!(
                        "Invalid authentication credential: {e}"
                    )));
                }
            };
            // Operators' requests other than job views are served in the
            // same hold of the lock (the path of pipelined submissions).
            let privileged = c.privileged(who);
            if privileged
                && !matches!(
                    request,
                    Request::Jobs(_)
                        | Request::Accounting(_)
                        | Request::Associations
                        | Request::Reconfigure
                )
            {
                Err(self.serve(c, who, request, now))
            } else {
                Ok((who, privileged, request))
            }
        };
        let (who, privileged, request) = match served {
            Ok(next) => next,
            Err((resp, ticket)) => return Phase::Commit(resp, ticket, None),
        };
        // One user's requests are served a few at a time (a turn is held
        // until the answer is stored), so a flood of them queues behind
        // itself rather than ahead of everyone else.
        let turn = if privileged {
            None
        } else {
            let sem = self
                .turns
                .lock()
                .entry(who.uid)
                .or_insert_with(|| Arc::new(Semaphore::new(REQUESTS_PER_USER)))
                .clone();
            sem.acquire_owned().await.ok()
        };
        let request = match request {
            Request::Jobs(f) => return Phase::Listing(f, turn),
            Request::Accounting(q) => return Phase::Answer(self.accounting(who, q).await),
            Request::Associations => {
                // The caller's name, read before the lock is taken.
                let name = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(who.uid))
                    .ok()
                    .flatten()
                    .map_or_else(|| who.uid.to_string(), |u| u.name);
                let c = self.ctl.lock();
                return Phase::Answer(Response::Associations(c.associations(who, name, now)));
            }
            Request::Reconfigure if !privileged => {
                return Phase::Answer(Response::Error(
                    crate::ctld::CtldError::AccessDenied.to_string(),
                ));
            }
            Request::Reconfigure => {
                // Read (and checked) before the controller's lock is taken.
                let loaded = match self.config_path.get() {
                    Some(path) => Config::load(path).map_err(|e| e.to_string()),
                    None => Err("this controller was not started from a file".into()),
                };
                let mut c = self.ctl.lock();
                let resp = match loaded {
                    Ok(cfg) => match c.reconfigure(who, cfg) {
                        Ok(changed) => {
                            tracing::info!(uid = who.uid, ?changed, "reconfigured");
                            Response::Done
                        }
                        Err(e) => Response::Error(e.to_string()),
                    },
                    Err(e) => Response::Error(format!("Reconfiguration refused: {e}")),
                };
                let ticket = self.finish(c);
                return Phase::Commit(resp, ticket, turn);
            }
            other => other,
        };
        let (resp, ticket) = self.serve(self.ctl.lock(), who, request, now);
        Phase::Commit(resp, ticket, turn)
    }

    /// A request's answer, once what it changed is stored; else an error
    /// (nothing unsaved is acknowledged).
    async fn acknowledged(&self, resp: Response, ticket: u64) -> Response {
        match self.durable(ticket).await {
            // A refusal changed nothing worth waiting for.
            Ok(()) | Err(_) if matches!(resp, Response::Error(_)) => resp,
            Ok(()) => resp,
            Err(e) => {
                // A submission not stored is not kept either: the
                // submitter hears it failed, and it never runs.
                if let Response::Submitted { job } = resp {
                    let mut c = self.ctl.lock();
                    c.withdraw(job, now());
                    self.finish(c);
                }
                Response::Error(format!("Unable to save the controller's state: {e}"))
            }
        }
    }

    /// Why no new job is taken now: the state's filesystem is below its
    /// reserve, which completions, node traffic and accounting keep for
    /// themselves. None without a store, or when its room is unknown.
    fn state_disk_low(&self, c: &Controller) -> Option<crate::ctld::CtldError> {
        let (free, size) = self.store.as_ref()?.room().ok()?;
        let reserve = c.config().limits.reserve_on(size);
        (free < reserve).then_some(crate::ctld::CtldError::StateDiskLow {
            free_mib: free >> 20,
            reserve_mib: reserve >> 20,
        })
    }

    /// Carries out an authenticated request under the controller's lock.
    fn serve(
        &self,
        mut c: MutexGuard<'_, Controller>,
        who: corral_proto::msg::Ident,
        request: Request,
        now: u64,
    ) -> (Response, u64) {
        let resp = match request {
            Request::Submit(_) if self.committed.borrow().error.is_some() => {
                let e = self.committed.borrow().error.clone().unwrap_or_default();
                Response::Error(format!("Unable to save the controller's state: {e}"))
            }
            Request::Submit(spec) => match self.state_disk_low(&c) {
                Some(low) => Response::Error(low.to_string()),
                None => match c.submit(who, spec, now) {
                    Ok(job) => Response::Submitted { job },
                    Err(e) => Response::Error(e.to_string()),
                },
            },
            Request::TestOnly(spec) => match c.test_only(who, spec, now) {
                Ok(w) => w,
                Err(e) => Response::Error(e.to_string()),
            },
            Request::SubmitStep(step) => match c.submit_step(who, step, now) {
                Ok((job, step)) => Response::StepCreated { job, step },
                // The CPUs or GPUs it asks for are other steps', or the
                // job is suspended: srun waits, as Slurm's.
                Err(
                    e @ (crate::ctld::CtldError::StepGpus { .. }
                    | crate::ctld::CtldError::StepCpus { .. }
                    | crate::ctld::CtldError::StepWhileSuspended(_)),
                ) => Response::Busy(e.to_string()),
                Err(e) => Response::Error(e.to_string()),
            },
            Request::Cancel { filter, signal } => match c.cancel(who, &filter, signal, now) {
                Ok(jobs) => Response::Affected { jobs },
                Err(e) => Response::Error(e.to_string()),
            },
            Request::AllocationAlive { job } => match c.allocation_alive(who, job, now) {
                Ok(()) => Response::Done,
                Err(e) => Response::Error(e.to_string()),
            },
            Request::EndAllocation { job, exit } => match c.end_allocation(who, job, exit, now) {
                Ok(()) => Response::Done,
                Err(e) => Response::Error(e.to_string()),
            },
            Request::Hold { ids, user: true } => match c.user_hold(who, &ids) {
                Ok(jobs) => Response::Affected { jobs },
                Err(e) => Response::Error(e.to_string()),
            },
            Request::Hold { ids, user: false } => match c.hold(who, &ids, false) {
                Ok(jobs) => Response::Affected { jobs },
                Err(e) => Response::Error(e.to_string()),
            },
            Request::ArrayTask { array, task } => match c.array_task(who, array, task) {
                Ok(id) => Response::Affected { jobs: vec![id] },
                Err(e) => Response::Error(e.to_string()),
            },
            Request::Release { ids } => match c.hold(who, &ids, true) {
                Ok(jobs) => Response::Affected { jobs },
                Err(e) => Response::Error(e.to_string()),
            },
            Request::Requeue { ids, hold } => match c.requeue(who, &ids, hold, now) {
                Ok(jobs) => Response::Affected { jobs },
                Err(e) => Response::Error(e.to_string()),
            },
            Request::Suspend { ids, resume } => match c.suspend(who, &ids, resume, now) {
                Ok(jobs) => Response::Affected { jobs },
                Err(e) => Response::Error(e.to_string()),
            },
            // Job views never come here: `list_jobs` writes them in slices,
            // releasing the lock between them.
            Request::Jobs(_) => Response::Error("job views are served in slices".into()),
            Request::Accounting(_) => Response::Error("accounting is served apart".into()),
            Request::Associations => Response::Error("associations are served apart".into()),
            Request::Nodes => Response::Nodes(c.node_views()),
            Request::Partitions => Response::Partitions(c.partition_views()),
            Request::DeleteNodes { names } => match c.delete_nodes(who, &names, now) {
                Ok(()) => Response::Done,
                Err(e) => Response::Error(e.to_string()),
            },
            Request::UpdateNode {
                names,
                state,
                reason,
            } => match c.update_node(who, &names, state, reason, now) {
                Ok(()) => Response::Done,
                Err(e) => Response::Error(e.to_string()),
            },
            Request::Ping => Response::Done,
            Request::Stats => Response::Stats(c.stats()),
            Request::Config => Response::Config(c.config_view()),
            Request::Reconfigure => Response::Error("reconfigure is served apart".into()),
            Request::Top { ids } => match c.top(who, &ids) {
                Ok(jobs) => Response::Affected { jobs },
                Err(e) => Response::Error(e.to_string()),
            },
            Request::UpdateJob { id, changes } => match c.update_job(who, id, &changes) {
                Ok(()) => Response::Done,
                Err(e) => Response::Error(e.to_string()),
            },
        };
        let ticket = self.finish(c);
        (resp, ticket)
    }

    /// A listing of jobs, written as it is made: the filter's sets are
    /// made before the lock is taken, the lock is released between slices,
    /// and each [`VIEWS_PER_SLICE`] views (or [`PART_BYTES`]) go out as a
    /// [`Response::JobsPart`] while the next are made (the reader decodes
    /// one part as ctld makes the next); the last goes as
    /// [`Response::Jobs`]. A bare query's parts are compact
    /// ([`Response::CompactJobsPart`], then [`Response::CompactJobs`]). A
    /// reader that stops reading stops the listing where the stream's
    /// window fills.
    async fn list_jobs(&self, f: JobFilter, send: &mut quinn::SendStream) {
        // A bare query's views are mostly bare: sent compact.
        let compact = f.bare && !f.detail;
        let mut sel = match Selector::new(f) {
            Ok(s) => s,
            Err(e) => {
                let _ = write_frame(send, &Response::Error(e.to_string())).await;
                return;
            }
        };
        let resolved = self.ctl.lock().resolve_arrays(&mut sel);
        if let Err(e) = resolved {
            let _ = write_frame(send, &Response::Error(e.to_string())).await;
            return;
        }
        // The part being made: its views encoded one by one, straight
        // from the job table (texts borrowed, none copied), under the lock.
        let mut body = Vec::new();
        let mut count = 0;
        let mut per_part = FIRST_PART_VIEWS;
        loop {
            let mut broke = None;
            let next = self
                .ctl
                .lock()
                .each_job_view(&sel, per_part - count, SCAN_PER_SLICE, |v| {
                    broke = encode_in_listing(compact, v, &mut body).err();
                    count += 1;
                    broke.is_none() && body.len() < PART_BYTES
                });
            let full = count >= per_part || body.len() >= PART_BYTES;
            let frame = match (broke, next) {
                (Some(e), _) => Err(e),
                (None, Some(after)) if !full => {
                    sel.after = after;
                    tokio::task::yield_now().await;
                    continue;
                }
                (None, next) => listing_frame(next.is_none(), compact, count, &body),
            };
            let sent = match frame {
                Ok(f) => send.write_all(&f).await.is_ok(),
                Err(e) => {
                    let refused = Response::Error(format!("listing: {e}"));
                    let _ = write_frame(send, &refused).await;
                    return;
                }
            };
            match next {
                Some(after) if sent => sel.after = after,
                _ => return,
            }
            body.clear();
            count = 0;
            per_part = VIEWS_PER_SLICE;
        }
    }

    async fn control(
        self: Arc<Self>,
        conn: quinn::Connection,
        reg: Registration,
        mut send: quinn::SendStream,
        mut recv: quinn::RecvStream,
    ) {
        let name = reg.name.clone();
        if !tls::peer_is(&conn, &name) {
            tracing::warn!(node = %name, peer = %conn.remote_address(), "registration refused: certificate is for another name");
            let refused = CtldMsg::Refused {
                reason: format!("certificate does not name node {name}"),
            };
            let _ = write_frame(&mut send, &refused).await;
            let _ = send.finish();
            return;
        }
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (heartbeat_ms, health) = {
            let c = self.ctl.lock();
            (
                c.config().heartbeat_timeout * 1000 / 3,
                c.config().health.clone(),
            )
        };
        let _ = tx.send(Box::new(CtldMsg::Welcome {
            heartbeat_ms,
            seen_as: conn.remote_address().ip(),
            health,
        }));
        let link = conn.stable_id();
        let heard = Arc::new(Heard::default());
        heard.at.store(now(), Ordering::Relaxed);
        let registered = {
            let mut c = self.ctl.lock();
            let r = c.register(reg, now());
            if r.is_ok() {
                self.agents.lock().insert(
                    name.clone(),
                    AgentLink {
                        id: link,
                        tx,
                        heard: heard.clone(),
                    },
                );
            }
            self.finish(c);
            r
        };
        if let Err(reason) = registered {
            let reason = reason.to_string();
            let _ = write_frame(&mut send, &CtldMsg::Refused { reason }).await;
            let _ = send.finish();
            return;
        }
        tracing::info!(node = %name, "node registered");
        let writer = tokio::spawn(async move {
            while let Some(msg) = rx.recv().await {
                if write_frame(&mut send, &msg).await.is_err() {
                    break;
                }
            }
        });
        loop {
            match read_frame::<_, AgentMsg>(&mut recv).await {
                Ok(Some(AgentMsg::Heartbeat { running })) => {
                    heard.at.store(now(), Ordering::Relaxed);
                    *heard.running.lock() = Some(running);
                }
                Ok(Some(msg)) => {
                    heard.at.store(now(), Ordering::Relaxed);
                    let mut c = self.ctl.lock();
                    c.agent_message(&name, msg, now());
                    self.finish(c);
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(node = %name, error = %chain(&e), "control stream closed");
                    break;
                }
            }
        }
        writer.abort();
        let mut agents = self.agents.lock();
        if agents.get(&name).is_some_and(|l| l.id == link) {
            agents.remove(&name);
            drop(agents);
            self.ctl.lock().disconnected(&name);
        }
    }
}

/// Answers a bad first frame with an error and closes the stream; logs
/// once per connection.
async fn refuse(
    conn: &quinn::Connection,
    send: &mut quinn::SendStream,
    recv: &mut quinn::RecvStream,
    e: &WireError,
    logged: &AtomicBool,
) {
    if !logged.swap(true, Ordering::Relaxed) {
        warn_limited!(LOGS, "bad frame", peer = %conn.remote_address(), error = %chain(e), "bad frame; closing the stream");
    }
    let _ = recv.stop(1u32.into());
    let _ = write_frame(send, &Response::Error(format!("bad frame: {}", chain(e)))).await;
    let _ = send.finish();
}

#[cfg(test)]
mod tests {
    use super::*;
    // Virtual time: waits are exact, whatever the machine's load.
    use tokio::time::Instant;

    fn passes() -> Arc<Passes> {
        Arc::new(Passes::default())
    }

    #[tokio::test(start_paused = true)]
    async fn a_commit_waits_for_the_pass_its_changes_asked_for() {
        let p = passes();
        p.ask();
        let answering = p.clone();
        let answer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_micros(500)).await;
            answering.answer(1);
            Instant::now()
        });
        p.settle().await;
        let settled = Instant::now();
        let answered = answer.await.expect("answer");
        assert!(settled >= answered, "settled before the pass answered");
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_asked_or_a_resting_scheduler_is_not_waited_for() {
        let p = passes();
        let t0 = Instant::now();
        p.settle().await;
        // Asked and answered already.
        p.ask();
        p.answer(1);
        p.settle().await;
        // Asked while the scheduler rests: the pass comes after the rest.
        p.ask();
        p.rest(true);
        p.settle().await;
        assert!(t0.elapsed() < PASS_WAIT, "waited {:?}", t0.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_last_pass_or_an_unanswered_ask_delays_a_commit_at_most_a_moment() {
        let p = passes();
        p.last_us
            .store(PASS_WORTH_WAITING_US + 1, Ordering::Relaxed);
        p.ask();
        let t0 = Instant::now();
        p.settle().await;
        assert!(t0.elapsed() < PASS_WAIT, "waited {:?}", t0.elapsed());
        // A short last pass, but none answers: the wait ends by itself.
        p.last_us.store(10, Ordering::Relaxed);
        let t0 = Instant::now();
        p.settle().await;
        let waited = t0.elapsed();
        assert!(waited >= PASS_WAIT, "gave up after {waited:?}");
        assert!(waited < 2 * PASS_WAIT, "waited {waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn resting_wakes_a_waiting_commit() {
        let p = passes();
        p.ask();
        let resting = p.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_micros(300)).await;
            resting.rest(true);
        });
        let t0 = Instant::now();
        p.settle().await;
        assert!(p.resting.load(Ordering::Acquire), "settled before the rest");
        assert!(t0.elapsed() < PASS_WAIT, "waited {:?}", t0.elapsed());
    }
}
