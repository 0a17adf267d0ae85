//! A fleet: many simulated nodes in one process, each speaking to ctld
//! exactly as an agent does (its own certificate, connection, credential
//! key, heartbeats and simulated GPUs), none running anything. A batch
//! job "runs" for its time limit scaled down, then reports its end as an
//! agent does: alone on the node, in one `BatchDone` (kept, and sent
//! again on each new connection, for as long as the agent keeps it);
//! otherwise as the batch step's exit, the clean node following on the
//! controller's terminate, which is answered at once. It measures the
//! controller at a scale one machine cannot run real agents at
//! (thousands of nodes).
//!
//! What a node keeps is the agent's own process table
//! ([`ProcTable`]), with no process in it: which runs it holds, which of
//! their steps it was sent, and the runs ended here, so that a controller
//! restarted under it adopts its jobs as it would a real node's.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral_proto::cred::{Minter, DEFAULT_TTL_MS};
use corral_proto::msg::{
    read_response, AgentMsg, CtldMsg, ExitStatus, GpuInfo, Ident, JobRun, Launch, LaunchKind, Open,
    Registration, Request, Response, StepId,
};
use corral_proto::tls::{self, CertFiles, Identity};
use corral_proto::{now_ms, read_frame, write_frame};
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};

use crate::agent::{AgentError, Recent, Reconnect, ENDED_KEEP};
use crate::procs::{ProcTable, StepStart, Termination};

/// What every node of a fleet is.
#[derive(Clone, Debug)]
pub struct FleetConfig {
    pub ctld: SocketAddr,
    /// Holds `ca.pem` and each node's `NAME.pem` and `NAME.key`.
    pub certs: PathBuf,
    pub names: Vec<String>,
    pub cpus: u32,
    pub memory_mb: u64,
    pub gpus: u32,
    pub gpu_model: String,
    /// A batch job runs for its time limit times this (no limit: none).
    pub time_scale: f64,
    /// Nodes sharing one UDP socket.
    pub nodes_per_endpoint: usize,
}

/// A batch job for a fleet: it "runs" its limit (times the fleet's
/// scale); its script is never run.
pub fn job(name: &str, work_dir: &str, limit: u64, exclusive: bool) -> corral_proto::msg::JobSpec {
    use corral_proto::msg::{JobKind, JobSpec};
    JobSpec {
        name: name.into(),
        work_dir: work_dir.into(),
        time_limit: Some(limit),
        exclusive,
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        kind: JobKind::Batch {
            script: b"#!/bin/sh\ntrue\n".to_vec(),
            args: vec![],
            stdout: Some("/dev/null".into()),
            stderr: None,
        },
        ..JobSpec::default()
    }
}

/// What the fleet did, counted over all its nodes.
#[derive(Debug, Default)]
pub struct Counters {
    /// Welcomes received (a node counts once per connection).
    pub registrations: AtomicU64,
    pub heartbeats: AtomicU64,
    pub launches: AtomicU64,
    /// Batch jobs of several nodes whose simulated run ended
    /// (`StepExited` sent).
    pub exits: AtomicU64,
    /// `JobCleaned` sent.
    pub cleaned: AtomicU64,
    /// Batch jobs alone on their node whose simulated run ended
    /// (`BatchDone` sent).
    pub done: AtomicU64,
    /// Nodes connected and registered now.
    pub connected: AtomicUsize,
}

/// A running fleet; its nodes stop when it is dropped.
pub struct Fleet {
    nodes: Vec<Arc<SimNode>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    pub counters: Arc<Counters>,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("nodes", &self.nodes.len())
            .field("counters", &self.counters)
            .finish()
    }
}

/// One simulated node.
struct SimNode {
    name: String,
    cfg: Arc<FleetConfig>,
    index: u32,
    minter: Minter,
    key: Vec<u8>,
    instance: u64,
    endpoint: quinn::Endpoint,
    client: quinn::ClientConfig,
    /// The connection to ctld now, with its session's number (as the
    /// agent's: quinn's `stable_id` is an address, which a new connection
    /// may reuse, and a request waiting for a connection other than the one
    /// that failed it would then wait for ever).
    conn: watch::Sender<Option<(u64, quinn::Connection)>>,
    up: mpsc::UnboundedSender<AgentMsg>,
    /// The agent's table, which lists no process group here: a step
    /// "runs" from its launch to its simulated end.
    procs: Mutex<ProcTable>,
    recent: Mutex<Recent>,
    counters: Arc<Counters>,
    /// Times this node registered.
    registered: AtomicU64,
}

impl Fleet {
    /// Loads every node's certificate and starts its session. Must be
    /// called inside a tokio runtime.
    pub fn start(cfg: FleetConfig) -> Result<Fleet, AgentError> {
        let cfg = Arc::new(cfg);
        let counters = Arc::new(Counters::default());
        let mut nodes = Vec::with_capacity(cfg.names.len());
        let mut rxs = Vec::with_capacity(cfg.names.len());
        let mut endpoint = None;
        for (i, name) in cfg.names.iter().enumerate() {
            if i % cfg.nodes_per_endpoint.max(1) == 0 || endpoint.is_none() {
                endpoint = Some(tls::client_endpoint(cfg.ctld)?);
            }
            let id = Identity::load(&CertFiles::in_dir(&cfg.certs, name))?;
            let (minter, key) = Minter::generate(name.clone(), DEFAULT_TTL_MS)?;
            let (up, rx) = mpsc::unbounded_channel();
            nodes.push(Arc::new(SimNode {
                name: name.clone(),
                cfg: cfg.clone(),
                index: i as u32,
                minter,
                key,
                instance: corral_proto::cred::random_u64()?,
                endpoint: endpoint.clone().expect("set above"),
                client: tls::client_config(&id)?,
                conn: watch::channel(None).0,
                up,
                procs: Mutex::new(ProcTable::default()),
                recent: Mutex::new(Recent::default()),
                counters: counters.clone(),
                registered: AtomicU64::new(0),
            }));
            rxs.push(rx);
        }
        let tasks = nodes
            .iter()
            .zip(rxs)
            .map(|(n, rx)| tokio::spawn(n.clone().control_loop(rx)))
            .collect();
        Ok(Fleet {
            nodes,
            tasks,
            counters,
        })
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Nodes registered now.
    pub fn connected(&self) -> usize {
        self.counters.connected.load(Ordering::Relaxed)
    }

    /// Times each node registered so far.
    pub fn registrations_by_node(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .map(|n| n.registered.load(Ordering::Relaxed))
            .collect()
    }

    /// Runs held by all nodes now, short of those ended and kept.
    pub fn runs(&self) -> usize {
        self.nodes
            .iter()
            .map(|n| n.procs.lock().running().len())
            .sum()
    }

    /// Runs ended in a `BatchDone` and kept by all nodes now.
    pub fn ended(&self) -> usize {
        self.nodes
            .iter()
            .map(|n| n.procs.lock().ended_outcomes().len())
            .sum()
    }

    /// Sends `request` to ctld through node `node` as `who` would through
    /// its agent, waiting up to `wait` for the node to be connected. As
    /// the agent's relay does, a request that never left, or one that
    /// only reads, goes again on the node's next connection when its
    /// connection was lost (a controller restarting).
    pub async fn request(
        &self,
        node: usize,
        who: Ident,
        request: Request,
        wait: Duration,
    ) -> Result<Response, String> {
        let n = self.nodes.get(node).ok_or("no such node")?;
        let repeatable = matches!(
            request,
            Request::Stats | Request::Jobs(_) | Request::Nodes | Request::Ping
        );
        let deadline = tokio::time::Instant::now() + wait;
        let mut failed_on = None;
        let mut rx = n.conn.subscribe();
        loop {
            let conn = tokio::time::timeout_at(deadline, async {
                loop {
                    let current = rx.borrow_and_update().clone();
                    if let Some(c) = current.filter(|(n, _)| Some(*n) != failed_on) {
                        return Ok(c);
                    }
                    if rx.changed().await.is_err() {
                        return Err("node stopped".to_string());
                    }
                }
            })
            .await
            .map_err(|_| format!("{} not connected within {wait:?}", n.name))??;
            let (session, conn) = conn;
            let token = n.minter.mint(who, now_ms()).map_err(|e| e.to_string())?;
            let (mut send, mut recv) = match conn.open_bi().await {
                Ok(s) => s,
                Err(_) => {
                    failed_on = Some(session);
                    continue;
                }
            };
            let open = Open::Request {
                token,
                request: request.clone(),
            };
            if write_frame(&mut send, &open).await.is_err() {
                failed_on = Some(session);
                continue;
            }
            let _ = send.finish();
            let answer = tokio::time::timeout_at(deadline, read_response(&mut recv));
            match answer.await {
                Ok(Ok(Some(r))) => return Ok(r),
                Ok(_) if repeatable => failed_on = Some(session),
                Ok(Ok(None)) => return Err("ctld closed the stream".into()),
                Ok(Err(e)) => return Err(e.to_string()),
                Err(_) => return Err(format!("no answer within {wait:?}")),
            }
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        for n in &self.nodes {
            if let Some((_, c)) = n.conn.send_replace(None) {
                c.close(0u32.into(), b"fleet stopped");
            }
        }
    }
}

impl SimNode {
    fn registration(&self) -> Registration {
        let running = self.running();
        let (launched, forgot) = {
            let procs = self.procs.lock();
            (procs.launched(), procs.forgot_through())
        };
        let gpus = (0..self.cfg.gpus)
            .map(|g| GpuInfo {
                index: g,
                uuid: format!("GPU-fleet-{:08x}-{g:04x}", self.index),
                memory_mb: 141_312,
                group: g / 4,
                model: self.cfg.gpu_model.clone(),
            })
            .collect();
        Registration {
            name: self.name.clone(),
            cpus: self.cfg.cpus,
            memory_mb: self.cfg.memory_mb,
            gpus,
            features: Vec::new(),
            credential_key: self.key.clone(),
            running,
            launched,
            forgot_ended_before: crate::agent::unix_ms(forgot),
            instance: self.instance,
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            os: crate::os_name(),
        }
    }

    /// The runs held, short of those ended and kept.
    fn running(&self) -> Vec<JobRun> {
        let mut v = self.procs.lock().running();
        v.sort_unstable();
        v
    }

    fn send_up(&self, msg: AgentMsg) {
        let _ = self.up.send(msg);
    }

    /// The agent's reconnection rule ([`Reconnect`]).
    async fn control_loop(self: Arc<Self>, mut rx: mpsc::UnboundedReceiver<AgentMsg>) {
        let mut again = Reconnect::default();
        loop {
            let timed_out = match self.session(&mut rx, again.connect_wait()).await {
                Err(AgentError::Refused(r)) => {
                    tracing::error!(node = %self.name, reason = %r, "refused");
                    return;
                }
                Err(e) => {
                    tracing::debug!(node = %self.name, error = %crate::agent::error_chain(&e), "lost ctld");
                    matches!(e, AgentError::ConnectTimeout(_))
                }
                Ok(()) => return,
            };
            let registered = self.conn.send_replace(None).is_some();
            if registered {
                self.counters.connected.fetch_sub(1, Ordering::Relaxed);
            }
            tokio::time::sleep(again.after(registered, timed_out)).await;
        }
    }

    async fn session(
        self: &Arc<Self>,
        rx: &mut mpsc::UnboundedReceiver<AgentMsg>,
        wait: Duration,
    ) -> Result<(), AgentError> {
        let (conn, mut send, mut recv, welcome) = crate::agent::register(
            &self.endpoint,
            &self.client,
            self.cfg.ctld,
            wait,
            &self.registration(),
        )
        .await?;
        let heartbeat = welcome.heartbeat;
        self.counters.registrations.fetch_add(1, Ordering::Relaxed);
        self.counters.connected.fetch_add(1, Ordering::Relaxed);
        let session = self.registered.fetch_add(1, Ordering::Relaxed);
        self.conn.send_replace(Some((session, conn.clone())));
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
        let mut out = vec![AgentMsg::Health { problem: None }];
        let now = Instant::now();
        let ended = {
            let mut procs = self.procs.lock();
            procs.prune_done(now, ENDED_KEEP, Recent::MOST);
            procs.ended_outcomes()
        };
        out.extend(crate::agent::replay(&mut self.recent.lock(), ended, now));
        for msg in &out {
            if let Err(e) = write_frame(&mut send, msg).await {
                reader.abort();
                return Err(e.into());
            }
        }
        // Nodes registered together heartbeat at different moments, as
        // agents started at different times do.
        let spread = heartbeat.as_millis() as u64 * u64::from(self.index % 97) / 97;
        let first = tokio::time::Instant::now() + Duration::from_millis(spread);
        let mut tick = tokio::time::interval_at(first, heartbeat);
        let result = loop {
            tokio::select! {
                r = &mut reader => break Err(r.unwrap_or(AgentError::Closed)),
                msg = rx.recv() => {
                    let Some(msg) = msg else { break Ok(()) };
                    self.recent.lock().push(Instant::now(), &msg);
                    if let Err(e) = write_frame(&mut send, &msg).await {
                        break Err(e.into());
                    }
                }
                _ = tick.tick() => {
                    self.procs
                        .lock()
                        .prune_done(Instant::now(), ENDED_KEEP, Recent::MOST);
                    let hb = AgentMsg::Heartbeat { running: self.running() };
                    if let Err(e) = write_frame(&mut send, &hb).await {
                        break Err(e.into());
                    }
                    self.counters.heartbeats.fetch_add(1, Ordering::Relaxed);
                }
            }
        };
        reader.abort();
        conn.close(0u32.into(), b"reconnect");
        result
    }

    fn handle(self: &Arc<Self>, msg: CtldMsg) {
        match msg {
            CtldMsg::Launch(l) => self.launch(l),
            CtldMsg::Terminate { job, .. } => {
                // Nothing runs: a batch step still "running" ends at once
                // (the only step a simulated node keeps), and with it the
                // run.
                let mut procs = self.procs.lock();
                let clean = match procs.terminate(job) {
                    Termination::Clean => true,
                    Termination::Signal(_) => procs.end_step(job, StepId::BATCH),
                };
                drop(procs);
                if clean {
                    self.job_cleaned(job);
                }
            }
            // Nothing runs to signal, freeze or thaw.
            CtldMsg::Signal { .. } | CtldMsg::Suspend { .. } => {}
            CtldMsg::Farewell | CtldMsg::Welcome { .. } | CtldMsg::Refused { .. } => {}
        }
    }

    /// A batch step's simulated run ended. Alone on this node (where no
    /// other step runs: a simulated node runs none), the run ends with
    /// it, in one `BatchDone` (the agent's `end_batch_alone`); otherwise
    /// its exit goes up and the controller's terminate follows.
    fn batch_ended(&self, run: JobRun, step: StepId, alone: bool) {
        let mut procs = self.procs.lock();
        // Ended meanwhile (cancelled, requeued): nothing to say.
        if !procs.has_step(run, step) {
            return;
        }
        let exit = ExitStatus::default();
        if alone && procs.end_batch_alone(run, Instant::now()) {
            let done = AgentMsg::BatchDone {
                job: run,
                exit,
                oom: false,
                usage: None,
            };
            procs.record_outcome(run, done.clone());
            drop(procs);
            self.counters.done.fetch_add(1, Ordering::Relaxed);
            self.send_up(done);
        } else {
            let cleaned = procs.end_step(run, step);
            drop(procs);
            self.counters.exits.fetch_add(1, Ordering::Relaxed);
            self.send_up(AgentMsg::StepExited {
                job: run,
                step,
                exit,
                oom: false,
            });
            if cleaned {
                self.job_cleaned(run);
            }
        }
    }

    fn launch(self: &Arc<Self>, l: Launch) {
        let (run, step) = (l.job_run(), l.step);
        // The agent's rules: a copy of a launch is ignored, a step of a
        // run that is ending (or older than the one here) fails.
        match self.procs.lock().begin_step(run, step) {
            StepStart::Go { .. } => {}
            StepStart::Again => return,
            StepStart::Refused => return self.step_failed(run, step, "the job is ending"),
        }
        self.counters.launches.fetch_add(1, Ordering::Relaxed);
        match l.what {
            LaunchKind::Batch { .. } => {
                let secs = l.time_limit.map_or(0.0, |t| t as f64 * self.cfg.time_scale);
                let alone = l.job_nodes.len() == 1;
                let me = self.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
                    me.batch_ended(run, step, alone);
                });
            }
            // No srun to dial back: a simulated node runs no steps.
            LaunchKind::Step { .. } => {
                self.step_failed(run, step, "a simulated node runs no steps")
            }
        }
    }

    /// A step that will not run leaves the table, as the agent's does; the
    /// run's last step here, on a run that is ending, leaves the node
    /// clean.
    fn step_failed(&self, run: JobRun, step: StepId, message: &str) {
        let cleaned = self.procs.lock().end_step(run, step);
        self.send_up(AgentMsg::LaunchFailed {
            job: run,
            step,
            message: message.into(),
        });
        if cleaned {
            self.job_cleaned(run);
        }
    }

    fn job_cleaned(&self, run: JobRun) {
        self.counters.cleaned.fetch_add(1, Ordering::Relaxed);
        self.send_up(AgentMsg::JobCleaned {
            job: run,
            usage: None,
        });
    }
}
