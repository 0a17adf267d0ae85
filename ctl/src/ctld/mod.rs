//! corral-ctld: the controller's state, every change to it, and the
//! service around it.
//!
//! [`Controller`] owns the scheduler, the job table and the node registry.
//! Each input (a request, an agent's message, a clock tick) is one method
//! call that changes state and queues the messages agents must receive in
//! an outbox the caller drains. Nothing in it does I/O or reads a clock:
//! `now` comes in, so every path is testable without a network, and making
//! state durable (a later issue) means journaling these calls, here only.
//!
//! Its `impl` is split by concern: `nodes` (registration, heartbeats,
//! health, node loss, operators' node updates), `jobs` (submission and
//! the job lifecycle: step exits, completion, clean-up, time limits,
//! cancel, hold), `admission` (what a user may submit), `launch` (the
//! `Launch` messages for batch jobs and steps, built in one place),
//! `views` (squeue, sinfo, scontrol), `wire` (where wire types meet the
//! core's). [`server`] is the async service around it; [`config`] its
//! checked configuration.

pub mod accounts;
pub(crate) mod acct;
pub mod acctdb;
mod admission;
mod array;
mod checks;
pub mod config;
mod durable;
mod error;
mod jobs;
pub mod journal;
mod launch;
mod nodes;
mod packed;
mod select;
pub mod server;
pub mod store;
mod views;
mod wire;

use std::collections::{BTreeMap, HashMap, HashSet};

use corral_proto::cred::{CredError, Token, Verifier};
use corral_proto::msg::{
    CtldMsg, ExitStatus, Ident, JobId, JobKind, JobRun, JobSpec, JobState, JobUsage, NodeUpdate,
    Registration, SendSignal, Stats, StepId, Suspension,
};
use scheduler_core::{NodeAllocation, Scheduler, SchedulerConfig};

use crate::ctld::config::Config;

pub use error::{CtldError, KillRefusal, RequeueRefusal, SuspendRefusal};
pub use select::{Selector, MAX_FILTER_ENTRIES};
pub use views::natural;

/// The most GPUs one request may name (per node, per task or in all).
pub const MAX_GPUS: u32 = 1 << 16;

/// The most features one `-C` may name, and the longest one: each job's
/// list is compared with nodes' on every pass.
pub const MAX_FEATURES: usize = 64;
pub const MAX_FEATURE_LEN: usize = 128;

/// The widest `--nice` (Slurm's range).
pub const MAX_NICE: u32 = 2_147_483_645;

/// Why a job is being ended before its own exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum Kill {
    Cancelled,
    Timeout,
    /// `scontrol requeue` (with `hold`: `requeuehold`): once its nodes are
    /// clean, the job waits again for a new run.
    Requeue {
        hold: bool,
        by_operator: bool,
    },
}

/// A job's share of one node: the core's allocation without the core's
/// node id (which a restarted controller numbers anew).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct StoredAlloc {
    tasks: u32,
    cpus: Vec<u32>,
    gpus: Vec<u32>,
    memory_mb: u64,
    /// The node's agent when the run started ([`Registration::instance`]):
    /// one that registers with another restarted, and the run died there.
    agent: u64,
}

impl StoredAlloc {
    fn of(a: NodeAllocation, agent: u64) -> StoredAlloc {
        StoredAlloc {
            tasks: a.tasks,
            cpus: a.cpus,
            gpus: a.gpus,
            memory_mb: a.memory_mb,
            agent,
        }
    }

    fn on(&self, node: scheduler_core::NodeId) -> NodeAllocation {
        NodeAllocation {
            node,
            tasks: self.tasks,
            cpus: self.cpus.clone(),
            gpus: self.gpus.clone(),
            memory_mb: self.memory_mb,
        }
    }
}

/// The job table. Every change goes through it, so it knows which
/// records changed since the store last took them ([`JobTable::take_dirty`]).
/// Records are boxed: a B-tree's nodes filled in id order stay about half
/// full, and half-empty slots the size of a record cost more than the
/// record's pointer.
#[derive(Debug, Default)]
struct JobTable {
    map: BTreeMap<JobId, Box<JobRecord>>,
    dirty: std::collections::BTreeSet<JobId>,
    /// Jobs that may be running or completing: each job that starts (or
    /// is read back running or completing) is put here, and those that
    /// are neither are dropped when next looked at. Scans for running and
    /// completing jobs (a node registering) walk this, not the whole
    /// queue.
    started: std::collections::BTreeSet<JobId>,
    /// The same jobs by the nodes they were placed on, pruned the same
    /// way: what a node registering looks at costs what the node holds,
    /// not what the cluster runs (a restart re-registers every node, and
    /// walking every running job for each made it quadratic: 5,000 nodes
    /// took longer than the heartbeat timeout).
    by_node: HashMap<String, std::collections::BTreeSet<JobId>>,
    /// Partition names, one string each: ten thousand jobs in one
    /// partition held ten thousand copies of its name (40 bytes a job
    /// with the allocator's share).
    names: HashSet<std::sync::Arc<str>>,
    /// Ended jobs by when they ended, oldest first, for
    /// [`JobTable::forget_ended`]: each record read back or taken to be
    /// stored again ([`JobTable::take_dirty`]) is filed here if it has
    /// ended. An entry whose job has since run again (a requeue) no
    /// longer matches its record and is dropped.
    ended: std::collections::BTreeSet<(u64, JobId)>,
}

impl JobTable {
    /// The one shared string for a partition's name.
    fn name(&mut self, s: &str) -> std::sync::Arc<str> {
        if let Some(n) = self.names.get(s) {
            return n.clone();
        }
        let n: std::sync::Arc<str> = s.into();
        self.names.insert(n.clone());
        n
    }

    fn get(&self, id: &JobId) -> Option<&JobRecord> {
        self.map.get(id).map(|r| &**r)
    }

    /// A record to change: it will be stored again.
    fn get_mut(&mut self, id: &JobId) -> Option<&mut JobRecord> {
        let r = self.map.get_mut(id);
        if r.is_some() {
            self.dirty.insert(*id);
        }
        r.map(|r| &mut **r)
    }

    /// A record to change, not to store again (what is stored elsewhere
    /// or not at all).
    fn get_mut_unstored(&mut self, id: &JobId) -> Option<&mut JobRecord> {
        self.map.get_mut(id).map(|r| &mut **r)
    }

    /// A record to change only if `wanted` says so: a message about
    /// another run leaves it unstored.
    fn get_mut_if(
        &mut self,
        id: &JobId,
        wanted: impl FnOnce(&JobRecord) -> bool,
    ) -> Option<&mut JobRecord> {
        if !self.get(id).is_some_and(wanted) {
            return None;
        }
        self.get_mut(id)
    }

    /// A new record; its partition name comes from [`JobTable::name`] (a
    /// submission's) or from the record it copies (an array's task).
    fn insert(&mut self, id: JobId, r: JobRecord) {
        self.dirty.insert(id);
        self.map.insert(id, Box::new(r));
    }

    /// Takes a record out; the store deletes it too. What it kept no
    /// longer counts against its user.
    fn remove(&mut self, id: JobId, usage: &mut HashMap<u32, Usage>) {
        if let Some(r) = self.map.remove(&id) {
            r.unkeep(usage);
            self.dirty.insert(id);
        }
    }

    /// Files job `id` under its end, if it has ended.
    fn file_if_ended(&mut self, id: JobId) {
        let end = self.get(&id).filter(|j| j.state.is_final());
        if let Some(end) = end.and_then(|j| j.end.get()) {
            self.ended.insert((end, id));
        }
    }

    /// Forgets the jobs that ended more than `age` seconds before `now`
    /// (and deletes them from the store). Costs what it forgets, not the
    /// table: a tick with 50,000 jobs pending walked them all twice a
    /// second, holding the controller.
    fn forget_ended(&mut self, now: u64, age: u64, usage: &mut HashMap<u32, Usage>) {
        while let Some(&(end, id)) = self.ended.first() {
            if now.saturating_sub(end) <= age {
                break;
            }
            self.ended.pop_first();
            let still = self
                .get(&id)
                .is_some_and(|j| j.state.is_final() && j.end.get() == Some(end));
            if still {
                self.remove(id, usage);
            }
        }
    }

    /// A record read back from the store: nothing to store again. Its
    /// partition name, read as its own string, becomes the shared one.
    fn restore(&mut self, mut r: JobRecord) {
        r.partition = self.name(&r.partition);
        if matches!(r.state, JobState::Running | JobState::Completing) {
            self.mark_started(r.id, r.alloc.iter().map(|(n, _)| n.as_str()));
        }
        let id = r.id;
        self.map.insert(id, Box::new(r));
        self.file_if_ended(id);
    }

    /// A job started running on these nodes.
    fn mark_started<'a>(&mut self, id: JobId, nodes: impl Iterator<Item = &'a str>) {
        self.started.insert(id);
        for n in nodes {
            self.by_node.entry(n.to_string()).or_default().insert(id);
        }
    }

    /// The jobs running or completing that were placed on `node` (some
    /// may have left it since: callers look at each job's allocation), in
    /// id order.
    fn live_on(&mut self, node: &str) -> Vec<JobId> {
        let map = &self.map;
        let Some(set) = self.by_node.get_mut(node) else {
            return Vec::new();
        };
        set.retain(|id| {
            map.get(id)
                .is_some_and(|j| matches!(j.state, JobState::Running | JobState::Completing))
        });
        let ids = set.iter().copied().collect();
        if set.is_empty() {
            self.by_node.remove(node);
        }
        ids
    }

    /// [`JobTable::live_on`], in one state.
    fn live_on_in(&mut self, node: &str, state: JobState) -> Vec<JobId> {
        let mut ids = self.live_on(node);
        ids.retain(|id| self.map.get(id).is_some_and(|j| j.state == state));
        ids
    }

    /// The jobs running now, in id order.
    fn running_ids(&mut self) -> Vec<JobId> {
        self.live_ids(JobState::Running)
    }

    fn live_ids(&mut self, state: JobState) -> Vec<JobId> {
        let map = &self.map;
        self.started.retain(|id| {
            map.get(id)
                .is_some_and(|j| matches!(j.state, JobState::Running | JobState::Completing))
        });
        self.started
            .iter()
            .copied()
            .filter(|id| map.get(id).is_some_and(|j| j.state == state))
            .collect()
    }

    fn values(&self) -> impl Iterator<Item = &JobRecord> {
        self.map.values().map(|r| &**r)
    }

    fn range(
        &self,
        r: impl std::ops::RangeBounds<JobId>,
    ) -> impl DoubleEndedIterator<Item = (&JobId, &JobRecord)> {
        self.map.range(r).map(|(id, r)| (id, &**r))
    }

    /// The records changed since the last call, to be stored; those
    /// that ended are filed for [`JobTable::forget_ended`] on the way.
    fn take_dirty(&mut self) -> std::collections::BTreeSet<JobId> {
        let dirty = std::mem::take(&mut self.dirty);
        for &id in &dirty {
            self.file_if_ended(id);
        }
        dirty
    }
}

/// A job as the controller keeps it. What only a run that started has
/// (its nodes, steps, usage) is in [`RunPart`], boxed and absent while the
/// job pends: most of a queue never ran, and the record is a third smaller
/// without it. The record derefs to it, so `j.alloc` reads the run's nodes
/// (none while pending), and writing one makes the box.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct JobRecord {
    id: JobId,
    user: Ident,
    /// Encoded: read it with [`JobRecord::spec`], change it with
    /// [`JobRecord::spec_mut`].
    spec: packed::PackedSpec,
    /// One string for every job of the partition ([`JobTable::name`]).
    partition: std::sync::Arc<str>,
    submit: u64,
    state: JobState,
    start: Stamp,
    end: Stamp,
    /// When its time limit ends the current run.
    end_by: Stamp,
    exit: ExitStatus,
    /// Times the job was requeued: the number of its current run.
    restarts: u32,
    failure: Option<Box<str>>,
    /// Bytes of script, arguments and environment held for it (counted
    /// against its user until it is final).
    bytes: u64,
    /// The current run's final record went to accounting.
    accounted: bool,
    /// Its script and environment are in the store, not here.
    payload_stored: bool,
    /// What it still keeps once final (its packed spec) counts against
    /// its user until it is forgotten ([`Usage::kept`]). Not stored: a
    /// restart counts the final records it reads back.
    #[serde(skip)]
    kept: bool,
    run_part: Option<Box<RunPart>>,
    /// What it is of an array (`--array`), if anything.
    array: Option<Box<ArrayPart>>,
}

/// A time (milliseconds) or none, in eight bytes rather than an
/// `Option<u64>`'s sixteen: a record holds three, and a queue holds
/// tens of thousands of records. Stored as the `Option<u64>` it stands
/// for, so the store's records read as before.
#[derive(Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(from = "Option<u64>", into = "Option<u64>")]
struct Stamp(u64);

impl Stamp {
    const NONE: Stamp = Stamp(0);

    /// `t` (`u64::MAX`, which no clock reaches, reads back one less).
    fn at(t: u64) -> Stamp {
        Stamp(t.saturating_add(1))
    }

    fn get(self) -> Option<u64> {
        self.0.checked_sub(1)
    }

    fn is_none(self) -> bool {
        self.0 == 0
    }
}

impl From<Option<u64>> for Stamp {
    fn from(t: Option<u64>) -> Stamp {
        t.map_or(Stamp::NONE, Stamp::at)
    }
}

impl From<Stamp> for Option<u64> {
    fn from(s: Stamp) -> Option<u64> {
        s.get()
    }
}

impl std::fmt::Debug for Stamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.get().fmt(f)
    }
}

/// A job array in the job table: one record (the array's, with the
/// array's id) for the tasks not yet started, and one record per task
/// from its start (a copy of the array's, with the id the core gave it).
/// The array's record stays, hidden once no task waits, until every
/// task ended: its payload is what its tasks' launches carry, and its
/// tally is what a restarted controller gives the core back.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct ArrayPart {
    /// The array's id.
    job: JobId,
    /// A task's index; `None` in the array's own record.
    task: Option<u32>,
    /// The array's record: positions of the tasks not yet started.
    waiting: Vec<(u32, u32)>,
    /// The array's record: tasks ended, and whether one failed.
    ended: u32,
    failed: bool,
    /// The array's record: its tasks (from its spec, at submission and
    /// when read back).
    #[serde(skip)]
    tasks: u32,
}

impl ArrayPart {
    /// The array's own record, once none of its tasks waits.
    fn spent(&self) -> bool {
        self.task.is_none() && self.waiting.is_empty()
    }
}

/// What a job has once it started: see [`JobRecord`].
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
struct RunPart {
    alloc: Vec<(String, StoredAlloc)>,
    kill: Option<Kill>,
    /// Nodes still running the job's first step (batch or srun's).
    primary_left: HashSet<String>,
    /// Nodes that have not yet confirmed the job's processes are gone.
    cleaning: HashSet<String>,
    next_step: u32,
    /// A process was killed for exceeding the memory limit.
    oom: bool,
    /// What its nodes reported using.
    used: Option<JobUsage>,
    /// The current run's steps, for accounting.
    steps: Vec<acct::StepTrack>,
    /// Who cancelled it.
    cancelled_by: Option<u32>,
    /// Later steps of the current run still running somewhere, with what
    /// builds their launches again (for a node that never got one).
    open_steps: Vec<launch::OpenStep>,
    /// `--signal` was sent to this run.
    limit_signalled: bool,
    /// `scontrol suspend`: the run's suspensions, once it had one.
    suspension: Option<Suspension>,
}

/// The run part of a job that has none.
static NO_RUN: std::sync::LazyLock<RunPart> = std::sync::LazyLock::new(RunPart::default);

impl std::ops::Deref for JobRecord {
    type Target = RunPart;
    fn deref(&self) -> &RunPart {
        self.run_part.as_deref().unwrap_or(&NO_RUN)
    }
}

impl std::ops::DerefMut for JobRecord {
    fn deref_mut(&mut self) -> &mut RunPart {
        self.run_part.get_or_insert_with(Box::default)
    }
}

impl JobRecord {
    /// Its spec, decoded (each call decodes: read it once per use).
    fn spec(&self) -> JobSpec {
        self.spec.get()
    }

    /// Its spec to change; encoded again at the end of the statement
    /// (or when the guard goes).
    fn spec_mut(&mut self) -> packed::SpecEdit<'_> {
        self.spec.edit()
    }

    /// Its state as squeue and selections see it: a running job that is
    /// suspended is SUSPENDED.
    fn shown_state(&self) -> JobState {
        match self.state {
            JobState::Running if self.suspended() => JobState::Suspended,
            s => s,
        }
    }

    /// Whether its processes are stopped now (`scontrol suspend`).
    fn suspended(&self) -> bool {
        self.suspension.is_some_and(|s| s.since.is_some())
    }

    /// A suspension still going at the run's end ends with it (at `now`).
    fn end_suspension(&mut self, now: u64) {
        if let Some(s) = self.run_part.as_mut().and_then(|r| r.suspension.as_mut()) {
            if let Some(since) = s.since.take() {
                s.paused = s.paused.saturating_add(now.saturating_sub(since));
            }
        }
    }

    /// A finished job keeps what squeue and scontrol show, not its script
    /// and environment (kilobytes each, and finished jobs linger for
    /// `min_job_age`); what it held no longer counts against its user.
    fn shed(&mut self, usage: &mut HashMap<u32, Usage>, unfinished: &mut u64) {
        if self.bytes != u64::MAX {
            let weight = self.weight();
            if let Some(u) = usage.get_mut(&self.user.uid) {
                u.jobs = u.jobs.saturating_sub(weight);
                u.bytes = u.bytes.saturating_sub(self.bytes);
            }
            *unfinished = unfinished.saturating_sub(weight);
            self.bytes = u64::MAX;
        }
        let mut spec = self.spec_mut();
        spec.env = Vec::new();
        if let JobKind::Batch { script, .. } = &mut spec.kind {
            *script = Vec::new();
        }
        drop(spec);
        self.keep(usage);
    }

    /// The jobs this record counts as against the limits while it is
    /// unfinished: an array's own record, its tasks that have not ended
    /// (its tasks' records count nothing); any other, one.
    fn weight(&self) -> u64 {
        match self.array.as_deref() {
            Some(a) if a.task.is_none() => u64::from(a.tasks.saturating_sub(a.ended)),
            _ => 1,
        }
    }

    /// A final record starts counting what it keeps against its user.
    fn keep(&mut self, usage: &mut HashMap<u32, Usage>) {
        if !self.kept {
            self.kept = true;
            usage.entry(self.user.uid).or_default().kept += self.kept_bytes();
        }
    }

    /// A record leaves the table: what it kept no longer counts.
    fn unkeep(&self, usage: &mut HashMap<u32, Usage>) {
        if self.kept {
            if let Some(u) = usage.get_mut(&self.user.uid) {
                u.kept = u.kept.saturating_sub(self.kept_bytes());
                if u.is_empty() {
                    usage.remove(&self.user.uid);
                }
            }
        }
    }

    /// What a final record holds on the state disk and in memory: its
    /// packed spec and the rest of the record.
    fn kept_bytes(&self) -> u64 {
        (self.spec.len() + std::mem::size_of::<JobRecord>()) as u64
    }

    /// Sends a signal to the job's tasks on every node it holds.
    fn send_signal(&self, sig: SendSignal, outbox: &mut Vec<(String, CtldMsg)>) {
        let run = self.run();
        for (n, _) in &self.alloc {
            outbox.push((
                n.clone(),
                CtldMsg::Signal {
                    job: run,
                    to: sig.to,
                    signal: sig.signal,
                },
            ));
        }
    }

    /// The job loses its nodes: every node but `except` is told to end its
    /// part (in `outbox`), and the job holds no node any more.
    fn release_nodes(&mut self, except: Option<&str>, outbox: &mut Vec<(String, CtldMsg)>) {
        let run = self.run();
        for (n, _) in &self.alloc {
            if Some(n.as_str()) != except {
                outbox.push((
                    n.clone(),
                    CtldMsg::Terminate {
                        job: run,
                        grace_ms: 0,
                    },
                ));
            }
        }
        self.alloc.clear();
        self.primary_left.clear();
        self.cleaning.clear();
        self.open_steps.clear();
    }

    /// Back to pending for a new run (`--requeue` after a node failure, or
    /// `scontrol requeue`), submitted anew at `now` and not to start
    /// before `delay` seconds have passed, as the core waits (the begin
    /// time is kept in its spec, so a restarted controller waits as
    /// long). Returns the accounting record of the run that ended
    /// (`REQUEUED`).
    fn reset_for_requeue(&mut self, now: u64, delay: u64) -> corral_proto::msg::AcctJob {
        let mut ended = self.acct(now);
        ended.state = JobState::Requeued;
        ended.end = Some(self.end.get().unwrap_or(now));
        // Its steps ended with the run: none stays RUNNING in `sacct -D`.
        for s in &mut ended.steps {
            if s.state == JobState::Running {
                s.state = JobState::Cancelled;
                s.end = ended.end;
            }
        }
        self.submit = now;
        self.spec_mut().begin = Some(now.saturating_add(delay));
        // Its nodes were released: nothing of the run is left to keep.
        self.run_part = None;
        self.accounted = false;
        self.end = Stamp::NONE;
        self.state = JobState::Pending;
        self.start = Stamp::NONE;
        self.end_by = Stamp::NONE;
        self.exit = ExitStatus::default();
        self.restarts += 1;
        ended
    }

    fn run(&self) -> JobRun {
        JobRun {
            job: self.id,
            run: self.restarts,
        }
    }

    /// CPUs per task, normalised at submit.
    fn cpus_per_task(&self) -> u32 {
        self.spec().cpus_per_task.unwrap_or(1)
    }

    /// The step whose end ends the job (an allocation has none: it is
    /// `BATCH`, which none of its steps is).
    fn primary_step(&self) -> StepId {
        match self.spec.kind() {
            packed::Kind::Batch | packed::Kind::Allocation => StepId::BATCH,
            packed::Kind::Interactive => StepId(0),
        }
    }
}

#[derive(Debug)]
struct NodeRecord {
    id: scheduler_core::NodeId,
    reg: Registration,
    boot: u64,
    last_seen: u64,
    connected: bool,
    not_responding: bool,
    /// An operator's drain or down: (state, reason, by, at).
    admin: Option<(NodeUpdate, String, u32, u64)>,
    /// The agent's own word that it cannot take work: (why, since). The
    /// node drains for it and comes back when the agent says it is well.
    problem: Option<(String, u64)>,
    /// The agent is stopping: (since, the end of the grace for its jobs).
    leaving: Option<(u64, u64)>,
    /// An active check failed here: (`<check>: <detail>`, since). Lifted
    /// by an operator's RESUME.
    check_failed: Option<(String, u64)>,
}

/// A refusal to show the user.
pub type Refusal = CtldError;

/// The controller's state.
#[derive(Debug)]
pub struct Controller {
    cfg: Config,
    sched: Scheduler,
    jobs: JobTable,
    next_job: u64,
    /// Whether ids have wrapped at `max_job_id` since the start: only then
    /// may the core still know an id that no record holds.
    ids_wrapped: bool,
    /// Running jobs read back from the store, waiting for their nodes to
    /// register so they can be adopted (not scheduled over meanwhile).
    adopting: HashSet<JobId>,
    /// Pending jobs submitted `--kill-on-invalid-dep=yes`: looked at after
    /// each pass.
    kill_on_invalid_dep: std::collections::BTreeSet<JobId>,
    /// Until then, no pass runs (a restart's recovery window).
    recovering_until: u64,
    /// Restored running jobs a returning node did not list.
    missing_runs: HashSet<JobId>,
    /// Restored pending jobs, queued again when the recovery ends (their
    /// nodes must be known to the core first).
    requeue_after_recovery: Vec<JobId>,
    /// Nodes the store knew that have not registered since the restart.
    awaiting_nodes: HashSet<String>,
    /// Operators' node states read back from the store, applied when the
    /// node registers.
    restored_admin: HashMap<String, (NodeUpdate, String, u32, u64)>,
    /// Nodes whose operator state changed since the store took them.
    nodes_dirty: std::collections::BTreeSet<String>,
    nodes: BTreeMap<String, NodeRecord>,
    verifier: Verifier,
    outbox: Vec<(String, CtldMsg)>,
    /// Set by any change a pass might act on.
    dirty: bool,
    /// When the scheduler next wants a pass without any event.
    wake_at: Option<u64>,
    /// When each running `salloc` allocation's salloc last said it is
    /// alive (not stored: a restarted controller starts counting anew).
    allocation_seen: HashMap<JobId, u64>,
    /// The latest time a call carried: when an array whose last task
    /// ended in a call without one (a commit's) is recorded as ended.
    clock: u64,
    stats: Stats,
    /// Unfinished jobs and their bytes, per user and in all.
    usage: HashMap<u32, Usage>,
    unfinished: u64,
    /// Active health checks in flight and when nodes last ran them.
    checks: checks::ActiveChecks,
    /// Accounting records of runs that ended since the store took them.
    acct_out: Vec<corral_proto::msg::AcctJob>,
    /// Scripts and environments of jobs submitted since the store took
    /// them (with a store, they live there, not here).
    payloads_out: Vec<(u64, Option<crate::ctld::store::NewPayload>)>,
}

/// What one user has queued, and what their finished jobs still keep.
#[derive(Clone, Copy, Debug, Default)]
struct Usage {
    /// Unfinished jobs.
    jobs: u64,
    /// Script, argument and environment bytes of the unfinished jobs.
    bytes: u64,
    /// Bytes of the final records still held (until `min_job_age`
    /// forgets them): their names, comments and paths are in the store.
    kept: u64,
}

impl Usage {
    fn is_empty(&self) -> bool {
        self.jobs == 0 && self.bytes == 0 && self.kept == 0
    }
}

impl Controller {
    pub fn new(cfg: Config) -> Result<Controller, Refusal> {
        let mut sched = Scheduler::new(SchedulerConfig {
            policy: cfg.policy,
            weights: cfg.weights.clone(),
            requeue_delay: cfg.requeue_delay,
            default_memory: cfg.limits.default_memory(),
            array_reservations: cfg.array_reservations,
            ..SchedulerConfig::default()
        });
        for p in &cfg.partitions {
            sched.add_partition(p.clone()).map_err(CtldError::Control)?;
        }
        Ok(Controller {
            cfg,
            sched,
            jobs: JobTable::default(),
            next_job: 1,
            ids_wrapped: false,
            adopting: HashSet::new(),
            kill_on_invalid_dep: std::collections::BTreeSet::new(),
            recovering_until: 0,
            missing_runs: HashSet::new(),
            requeue_after_recovery: Vec::new(),
            awaiting_nodes: HashSet::new(),
            restored_admin: HashMap::new(),
            nodes_dirty: std::collections::BTreeSet::new(),
            nodes: BTreeMap::new(),
            verifier: Verifier::default(),
            outbox: Vec::new(),
            dirty: false,
            wake_at: None,
            clock: 0,
            allocation_seen: HashMap::new(),
            stats: Stats::default(),
            usage: HashMap::new(),
            unfinished: 0,
            checks: checks::ActiveChecks::default(),
            acct_out: Vec::new(),
            payloads_out: Vec::new(),
        })
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Messages for agents queued by the calls so far.
    pub fn take_outbox(&mut self) -> Vec<(String, CtldMsg)> {
        std::mem::take(&mut self.outbox)
    }

    /// Whether a pass may start something.
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// Whether a pass may start something (and clears the flag).
    pub fn take_dirty(&mut self) -> bool {
        std::mem::replace(&mut self.dirty, false)
    }

    /// Root and the configured operators.
    pub fn privileged(&self, who: Ident) -> bool {
        who.uid == 0 || self.cfg.operators.contains(&who.uid)
    }

    /// Checks a credential: who the request is for.
    pub fn authenticate(&mut self, token: &Token, now_ms: u64) -> Result<Ident, CredError> {
        self.verifier.verify(token, now_ms)
    }

    // ---- scheduling --------------------------------------------------

    /// Counts for `sdiag`-style monitoring.
    pub fn stats(&self) -> Stats {
        let mut s = self.stats;
        s.pending = 0;
        s.running = 0;
        s.completing = 0;
        for j in self.jobs.values() {
            match j.state {
                JobState::Pending => s.pending += 1,
                JobState::Running => s.running += 1,
                JobState::Completing => s.completing += 1,
                _ => {}
            }
        }
        s
    }

    /// `scontrol reconfigure`: the settings of a `corral.toml` read again
    /// take effect without a restart and without losing a job: timeouts,
    /// operators, `min_job_age`, the limits, and each partition's time
    /// limits and tier. What only a restart can change (the cluster's
    /// name, address, certificates, state, accounting, jail, policy,
    /// requeue delay, health checks, which partitions exist and their
    /// nodes) must be as it is, or nothing changes. Returns what changed.
    pub fn reconfigure(&mut self, who: Ident, new: Config) -> Result<Vec<String>, Refusal> {
        if !self.privileged(who) {
            return Err(CtldError::AccessDenied);
        }
        let old = &self.cfg;
        let same =
            |a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| format!("{a:?}") == format!("{b:?}");
        let parts_shape = |c: &Config| -> Vec<(String, String, bool)> {
            c.partitions
                .iter()
                .map(|p| (p.name.clone(), p.nodes.clone(), p.is_default))
                .collect()
        };
        for (key, fixed) in [
            ("cluster", same(&old.cluster, &new.cluster)),
            ("listen", same(&old.listen, &new.listen)),
            ("certs", same(&old.certs, &new.certs)),
            ("state_dir", same(&old.state_dir, &new.state_dir)),
            ("accounting", same(&old.accounting, &new.accounting)),
            ("jail", same(&old.jail, &new.jail)),
            ("policy", same(&old.policy, &new.policy)),
            (
                "array_reservations",
                old.array_reservations == new.array_reservations,
            ),
            ("priority", same(&old.weights, &new.weights)),
            ("requeue_delay", old.requeue_delay == new.requeue_delay),
            (
                "default_mem_per_cpu",
                old.limits.default_mem_per_cpu == new.limits.default_mem_per_cpu,
            ),
            ("health", same(&old.health, &new.health)),
            (
                "active checks",
                same(&old.active_checks, &new.active_checks),
            ),
            ("partitions", parts_shape(old) == parts_shape(&new)),
        ] {
            if !fixed {
                return Err(CtldError::Reconfigure(key));
            }
        }
        let mut changed = Vec::new();
        for (p, q) in old.partitions.iter().zip(&new.partitions) {
            if (p.default_time, p.max_time, p.priority_tier)
                != (q.default_time, q.max_time, q.priority_tier)
            {
                changed.push(format!("partition {}", q.name));
            }
        }
        for q in new.partitions.iter() {
            if changed.contains(&format!("partition {}", q.name)) {
                self.sched
                    .update_partition_limits(&q.name, q.default_time, q.max_time, q.priority_tier)
                    .map_err(CtldError::Control)?;
            }
        }
        for (key, differs) in [
            (
                "heartbeat_timeout",
                old.heartbeat_timeout != new.heartbeat_timeout,
            ),
            ("kill_wait", old.kill_wait != new.kill_wait),
            (
                "allocation_timeout",
                old.allocation_timeout != new.allocation_timeout,
            ),
            ("leave_grace", old.leave_grace != new.leave_grace),
            ("operators", old.operators != new.operators),
            ("min_job_age", old.min_job_age != new.min_job_age),
            ("limits", !same(&old.limits, &new.limits)),
            ("accounts", old.accounts != new.accounts),
        ] {
            if differs {
                changed.push(key.to_string());
            }
        }
        let check_user = self.cfg.check_user;
        self.cfg = Config { check_user, ..new };
        self.dirty = true;
        Ok(changed)
    }

    /// `scontrol show config`: the settings scripts read, under Slurm's
    /// names, in Slurm's (alphabetical) order.
    pub fn config_view(&self) -> Vec<(String, String)> {
        let c = &self.cfg;
        let secs = |s: u64| format!("{s} sec");
        let policy = match c.policy {
            scheduler_core::BackfillPolicy::Conservative => "conservative",
            _ => "easy",
        };
        let mut kv: Vec<(&str, String)> = vec![
            (
                "AccountingStorageType",
                if c.accounting.is_some() {
                    "accounting_storage/corral".into()
                } else {
                    "accounting_storage/none".into()
                },
            ),
            ("ClusterName", c.cluster.clone()),
            (
                "DefMemPerCPU",
                match c.limits.default_mem_per_cpu {
                    None => "share of the node".into(),
                    Some(0) => "UNLIMITED".into(),
                    Some(mb) => mb.to_string(),
                },
            ),
            ("KillWait", secs(c.kill_wait)),
            ("MaxArraySize", c.limits.max_array_size.to_string()),
            ("MaxJobCount", c.limits.max_job_count.to_string()),
            ("MaxJobId", c.limits.max_job_id.to_string()),
            ("MaxStepCount", c.limits.max_step_count.to_string()),
            ("MinJobAge", secs(c.min_job_age)),
            ("PriorityMaxAge", crate::timefmt::elapsed(c.weights.max_age)),
            ("PriorityType", "priority/multifactor".into()),
            ("PriorityWeightAge", c.weights.age.to_string()),
            ("PriorityWeightFairshare", c.weights.fairshare.to_string()),
            ("PriorityWeightJobSize", c.weights.size.to_string()),
            ("PriorityWeightPartition", c.weights.partition.to_string()),
            ("PriorityWeightQOS", c.weights.qos.to_string()),
            (
                "SchedulerParameters",
                format!(
                    "backfill={policy},bf_max_job_array_resv={}",
                    c.array_reservations
                ),
            ),
            ("SchedulerType", "sched/backfill".into()),
            ("SelectType", "select/cons_tres".into()),
            ("SlurmctldHost[0]", c.listen.ip().to_string()),
            ("SlurmctldPort", c.listen.port().to_string()),
            ("SlurmdTimeout", secs(c.heartbeat_timeout)),
            ("SLURM_VERSION", "22.05.8".into()),
            (
                "StateSaveLocation",
                c.state_dir
                    .as_ref()
                    .map_or("(null)".into(), |d| d.display().to_string()),
            ),
        ];
        kv.sort_by_key(|(k, _)| k.to_ascii_lowercase());
        kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }

    /// Records how long the last pass took (measured by the driver).
    pub fn record_pass(&mut self, micros: u64) {
        self.stats.passes += 1;
        self.stats.last_pass_us = micros;
    }

    /// Runs a scheduling pass and queues the launches it decides.
    pub fn schedule(&mut self, now: u64) -> usize {
        // After a restart, running jobs' nodes must be back (and their
        // resources held) before anything else is placed.
        if self.recovering() {
            return 0;
        }
        let starts = self.sched.schedule(now);
        let n = starts.len();
        for d in starts {
            self.start(now, d);
        }
        self.cancel_invalid_dependencies(now);
        n
    }

    /// `--kill-on-invalid-dep=yes`: a job whose dependency can never be
    /// met is cancelled (as by its owner) rather than left pending.
    fn cancel_invalid_dependencies(&mut self, now: u64) {
        let ids: Vec<JobId> = self.kill_on_invalid_dep.iter().copied().collect();
        for id in ids {
            let status = self.sched.job_status(wire::core_id(id));
            if let Some(scheduler_core::JobStatus::Pending { reason, .. }) = status {
                if reason != scheduler_core::PendingReason::DependencyNeverSatisfied {
                    continue;
                }
                if let Some(owner) = self.jobs.get(&id).map(|j| j.user) {
                    let filter = corral_proto::msg::JobFilter {
                        ids: vec![id],
                        ..Default::default()
                    };
                    tracing::info!(job = %id, "dependency never satisfied: cancelled");
                    let _ = self.cancel(owner, &filter, None, now);
                }
            }
            self.kill_on_invalid_dep.remove(&id);
        }
    }

    pub(super) fn node_name(&self, id: scheduler_core::NodeId) -> String {
        self.sched.node_info(id).map(|i| i.name).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests;
