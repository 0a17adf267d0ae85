//! The scheduler: the queue, the node table, and the scheduling pass.
//!
//! Owns all job and node state the scheduling decisions depend on. It never
//! performs I/O, never reads a clock and never draws random numbers: every
//! input carries `now`, every iteration over state is in a stable order, and
//! ties are broken on ids. Same calls, same decisions.

mod admission;
mod adopt;
mod array;
pub use adopt::AdoptError;
mod audit;
mod nodes;
mod pass;
mod ranking;
mod search;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use crate::error::ControlError;
use crate::model::{
    AccountId, Dependency, HoldKind, JobId, JobOutcome, JobStatus, NodeAdmin, NodeAllocation,
    NodeId, PartitionId, PartitionSpec, PendingReason, Reservation, Secs, UserId, INFINITE,
};
use crate::placement::{Capacity, Packing, Shape};
use crate::priority::{FairShare, PriorityWeights};
use crate::timeline::{Free, Timeline};

/// A user's and their account's fair-share usage (`Scheduler::share_usage`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ShareUsage {
    pub user: f64,
    pub account: f64,
    pub total: f64,
    /// 1 for no usage, falling towards 0.
    pub factor: f64,
}

/// How a pass treats jobs that cannot start now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BackfillPolicy {
    /// Every waiting job gets a reservation; a job starts early only where
    /// it delays none of them.
    #[default]
    Conservative,
    /// Only the first waiting job gets a reservation; others start early
    /// where they do not delay it.
    Easy,
    /// Strict order: no job starts before one ahead of it.
    Fcfs,
}

/// Everything that tunes the scheduler. Fixed for its lifetime.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    pub policy: BackfillPolicy,
    pub packing: Packing,
    pub weights: PriorityWeights,
    /// Fair-share usage halves every this many seconds.
    pub fairshare_half_life: Secs,
    /// QOS names and their priorities; jobs that name none get `normal`.
    pub qos: Vec<(String, u32)>,
    /// Fair-share charge per GPU-second, relative to a CPU-second.
    pub gpu_billing_weight: f64,
    /// Above this many eligible nodes, one search class serves every time
    /// limit of a job shape. A class per limit gives exact heap keys (fewer
    /// nodes looked at per search) but costs a heap build over every node
    /// per limit, and each reservation later stales its node in every
    /// heap; with many nodes the heaps stop fitting in cache and that cost
    /// wins. Measured with the `probe` example (min of nine passes): 1,000
    /// nodes and 10,000 jobs, 18 ms split against 47 ms shared; 10,000
    /// nodes and 100,000 jobs, 644 ms split against 311 ms shared. A speed
    /// knob only: decisions are the same either way.
    pub split_limits_up_to_nodes: usize,
    /// Cross-check every search against a scan of every node at every
    /// candidate time, and panic if it found a later start. Slow; for
    /// tests and fuzzing.
    pub verify_search: bool,
    /// Under conservative backfill, how many of an array's waiting tasks
    /// each pass plans (one search each); tasks beyond wait unplanned,
    /// and jobs behind them may take what they would have had (Slurm's
    /// `bf_max_job_array_resv`, 20 by default there).
    pub array_reservations: u32,
    /// Seconds a requeued job waits before it may start again (its begin
    /// time becomes the requeue's time plus this), after a node failure
    /// or [`Scheduler::requeue`]. Slurm waits about two minutes; 0 here.
    pub requeue_delay: Secs,
    /// What a job that asks for no memory holds (Slurm's `DefMemPerCPU`).
    pub default_memory: DefaultMemory,
}

/// The memory of a job that asks for none (no `--mem`, `--mem-per-cpu`,
/// `--mem-per-gpu`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DefaultMemory {
    /// None: it is placed as if it needed no memory (and its driver sets
    /// no limit). A memory-blind cluster, and the replay of traces.
    #[default]
    Nothing,
    /// Each task holds its node's memory in proportion to its CPUs there
    /// (rounded down), so jobs without a memory ask never crowd out each
    /// other or one that asked.
    ShareOfNode,
    /// Each CPU holds this many MB.
    PerCpu(u64),
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            policy: BackfillPolicy::Conservative,
            packing: Packing::BestFit,
            weights: PriorityWeights::default(),
            fairshare_half_life: 7 * 24 * 3600,
            qos: vec![("normal".to_string(), 0)],
            gpu_billing_weight: 8.0,
            split_limits_up_to_nodes: 4096,
            verify_search: false,
            array_reservations: 1000,
            requeue_delay: 0,
            default_memory: DefaultMemory::Nothing,
        }
    }
}

/// What [`Scheduler::cancel`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cancelled {
    /// The job was pending and is now gone (CANCELLED).
    Pending,
    /// The job is running: the driver kills it and then reports
    /// [`JobOutcome::Cancelled`] through [`Scheduler::handle_job_finished`].
    Running(Vec<NodeAllocation>),
}

#[derive(Clone)]
struct NodeSlot {
    name: String,
    cap: Capacity,
    gpu_count: u32,
    /// The model of all its GPUs, lowercase (`None`: untyped or mixed).
    gpu_model: Option<String>,
    features: Vec<String>,
    admin: NodeAdmin,
    /// Free right now.
    free: Free,
    /// Bit per CPU, set when free.
    cpu_free: Vec<u64>,
    jobs: Vec<JobId>,
}

impl NodeSlot {
    fn usable(&self) -> bool {
        self.admin == NodeAdmin::Up
    }

    /// Whether its GPUs are of the model a job names (any, when none):
    /// the model as detected (`nvidia_h200`) or without its vendor
    /// (`h200`), as sites name them in their own gres.conf.
    fn gpus_of(&self, model: Option<&str>) -> bool {
        model.is_none_or(|m| {
            self.gpu_model
                .as_deref()
                .is_some_and(|g| g == m || g.strip_prefix("nvidia_") == Some(m))
        })
    }

    fn take_cpus(&mut self, n: u32) -> Vec<u32> {
        let mut out = Vec::with_capacity(n as usize);
        for (w, word) in self.cpu_free.iter_mut().enumerate() {
            while *word != 0 && out.len() < n as usize {
                let bit = word.trailing_zeros();
                *word &= !(1u64 << bit);
                out.push(w as u32 * 64 + bit);
            }
            if out.len() == n as usize {
                break;
            }
        }
        out
    }
}

#[derive(Clone)]
struct Partition {
    spec: PartitionSpec,
    all: bool,
    names: HashSet<String>,
    /// Member nodes, ascending.
    members: Vec<NodeId>,
}

impl Partition {
    fn matches(&self, name: &str) -> bool {
        self.all || self.names.contains(name)
    }
}

#[derive(Clone)]
enum State {
    Pending {
        reason: PendingReason,
        plan: Option<Box<Reservation>>,
    },
    /// Boxed: a pending job's state is 16 bytes, not the 56 a running
    /// one needs (a queue is mostly pending jobs).
    Running(Box<Run>),
}

#[derive(Clone)]
struct Run {
    start: Secs,
    /// When its time limit ends it: `start + limit + paused`, or never
    /// while it is suspended.
    end_by: Secs,
    /// Fixed once it starts.
    alloc: Box<[NodeAllocation]>,
    /// Seconds it spent suspended and resumed since; they do not count
    /// against its limit.
    paused: Secs,
    /// Suspended since then (`scontrol suspend`), if it is.
    suspended: Option<Secs>,
}

impl State {
    fn running(start: Secs, end_by: Secs, alloc: Box<[NodeAllocation]>) -> State {
        State::Running(Box::new(Run {
            start,
            end_by,
            alloc,
            paused: 0,
            suspended: None,
        }))
    }
}

#[derive(Clone)]
struct Job {
    /// Read only for `--dependency=singleton`.
    name: Box<str>,
    user: UserId,
    account: AccountId,
    partition: PartitionId,
    shape: Shape,
    limit: Secs,
    /// Where it may run beyond its partition, and what it waits on: boxed
    /// and absent for most jobs ([`Asks`]).
    asks: Option<Box<Asks>>,
    qos: u32,
    nice: i32,
    hold: Option<HoldKind>,
    begin: Secs,
    requeue: bool,
    submit: Secs,
    priority: i64,
    state: State,
    /// What it is of an array, if anything (boxed: most jobs are none).
    array: Option<Box<array::Role>>,
}

/// What few jobs ask: nodes, features or a GPU model (`-w`, `-x`, `-C`,
/// `--gres=gpu:TYPE:N`), and dependencies (`-d`). Five empty lists and
/// options took a hundred bytes of every queued job; boxed, a job that
/// asks none of them carries one empty pointer.
#[derive(Clone, Default)]
struct Asks {
    nodes: NodeAsk,
    deps: Vec<Dependency>,
    /// Any one of `deps` suffices (`?`), rather than all (`,`).
    deps_any: bool,
}

/// The nodes a job may use within its partition.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
struct NodeAsk {
    required: Vec<NodeId>,
    exclude: Vec<NodeId>,
    features: Vec<String>,
    /// Any one of `features` suffices (`-C a|b`).
    features_any: bool,
    /// Only nodes whose GPUs are all of this model (lowercase).
    gpu_type: Option<String>,
}

impl NodeAsk {
    /// Any node of the partition will do.
    fn is_any(&self) -> bool {
        self.features.is_empty()
            && self.required.is_empty()
            && self.exclude.is_empty()
            && self.gpu_type.is_none()
    }
}

/// What a job that asks nothing asks.
static NO_NODE_ASK: NodeAsk = NodeAsk {
    required: Vec::new(),
    exclude: Vec::new(),
    features: Vec::new(),
    features_any: false,
    gpu_type: None,
};

impl Job {
    fn node_ask(&self) -> &NodeAsk {
        self.asks.as_deref().map_or(&NO_NODE_ASK, |a| &a.nodes)
    }

    fn deps(&self) -> &[Dependency] {
        self.asks.as_deref().map_or(&[], |a| &a.deps)
    }

    fn deps_any(&self) -> bool {
        self.asks.as_deref().is_some_and(|a| a.deps_any)
    }

    fn is_pending(&self) -> bool {
        matches!(self.state, State::Pending { .. })
    }

    /// Pending, and not to start before `t`, its own begin time.
    fn waits_until(&self, t: Secs) -> bool {
        self.is_pending() && self.begin == t
    }

    fn set_pending(&mut self, reason: PendingReason, plan: Option<Box<Reservation>>) {
        self.state = State::Pending { reason, plan };
    }

    /// The array it belongs to (its own id for an array's entry).
    fn array_id(&self) -> Option<JobId> {
        self.array.as_deref().and_then(array::Role::array_id)
    }

    fn planned(&self) -> Option<&Reservation> {
        match &self.state {
            State::Pending { plan, .. } => plan.as_deref(),
            State::Running(_) => None,
        }
    }

    /// The nodes a job may use, before looking at what is free.
    fn eligibility(&self) -> EligKey {
        EligKey {
            partition: self.partition,
            nodes: self.node_ask().clone(),
        }
    }
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct EligKey {
    partition: PartitionId,
    nodes: NodeAsk,
}

/// The scheduler. Calls in any order:
///
/// 1. [`add_partition`](Self::add_partition) for each partition (nodes may
///    register before or after).
/// 2. [`handle_node_added`](Self::handle_node_added) as nodes register;
///    [`handle_node_admin`](Self::handle_node_admin) and
///    [`handle_node_removed`](Self::handle_node_removed) as they change.
/// 3. [`submit`](Self::submit), [`cancel`](Self::cancel),
///    [`hold`](Self::hold), [`release`](Self::release) as users ask.
/// 4. [`schedule`](Self::schedule) after events: it returns the jobs to
///    start now, with their exact CPUs and GPUs. They count as running from
///    that moment.
/// 5. [`handle_job_finished`](Self::handle_job_finished) when a job ends.
///
/// [`next_wakeup`](Self::next_wakeup) says when a pass is due even if
/// nothing else happens (a begin time, a time limit).
#[derive(Clone)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    nodes: Vec<Option<NodeSlot>>,
    node_names: HashMap<String, NodeId>,
    partitions: Vec<Partition>,
    partition_names: HashMap<String, PartitionId>,
    /// Boxed: B-tree nodes filled in id order stay about half full.
    jobs: BTreeMap<JobId, Box<Job>>,
    /// The jobs split in two: the pending ones with a hold (and whose
    /// they are, with how many each user has), and all the others. A pass
    /// walks the others and never reads a held job (ten thousand held
    /// jobs read in every pass doubled ctld's CPU per job). Kept by
    /// [`Scheduler::note_hold`] wherever a job comes or changes its hold
    /// and [`Scheduler::forget_job`] wherever one goes; the audit checks
    /// both.
    held: BTreeMap<JobId, UserId>,
    held_users: BTreeMap<UserId, u32>,
    unheld: BTreeSet<JobId>,
    finished: HashMap<JobId, JobOutcome>,
    /// Pending jobs that may not start before a time of their own
    /// (`--begin`, a requeue's delay), by that time: filed by
    /// [`Scheduler::note_hold`] and [`Scheduler::queue_again`], read by
    /// [`Scheduler::next_wakeup`] (an entry whose job started, went or
    /// waits for another time is passed over) and pruned by each pass of
    /// those no job waits for any more.
    /// The clock tick asked every job for its begin time twice a second.
    delayed: BTreeSet<(Secs, JobId)>,
    /// Arrays with a task not yet ended, by the array's id.
    arrays: BTreeMap<JobId, array::Book>,
    fairshare: FairShare,
    /// The users fair-share split among at the last pass (`share_usage`
    /// reads it rather than walking the queue again).
    fair_parties: usize,
    timelines: Vec<Timeline>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("nodes", &self.node_names.len())
            .field("partitions", &self.partitions.len())
            .field("jobs", &self.jobs.len())
            .finish()
    }
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig) -> Self {
        let fairshare = FairShare::new(cfg.fairshare_half_life);
        Scheduler {
            cfg,
            nodes: Vec::new(),
            node_names: HashMap::new(),
            partitions: Vec::new(),
            partition_names: HashMap::new(),
            jobs: BTreeMap::new(),
            held: BTreeMap::new(),
            held_users: BTreeMap::new(),
            unheld: BTreeSet::new(),
            finished: HashMap::new(),
            delayed: BTreeSet::new(),
            arrays: BTreeMap::new(),
            fairshare,
            fair_parties: 0,
            timelines: Vec::new(),
        }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    // ----- control and status -------------------------------------------

    /// Cancels a job. A pending job is gone at once; a running one must be
    /// killed by the driver, which then reports it finished.
    pub fn cancel(&mut self, id: JobId) -> Result<Cancelled, ControlError> {
        let job = self.jobs.get(&id).ok_or(ControlError::UnknownJob(id))?;
        match &job.state {
            State::Pending { .. } => {
                let waiting = job.array.as_deref().map_or(1, array::Role::waiting_count);
                let of = job.array.as_deref().and_then(array::Role::array_id);
                self.jobs.remove(&id);
                self.forget_job(id);
                match of {
                    // The array's waiting tasks go; its id's outcome is
                    // the whole array's, once every task ended.
                    Some(a) if a == id => self.array_tasks_ended(a, waiting, false),
                    Some(a) => {
                        self.finished.insert(id, JobOutcome::Cancelled);
                        self.array_tasks_ended(a, 1, false);
                    }
                    None => {
                        self.finished.insert(id, JobOutcome::Cancelled);
                    }
                }
                Ok(Cancelled::Pending)
            }
            State::Running(r) => Ok(Cancelled::Running(r.alloc.to_vec())),
        }
    }

    /// Holds a pending job (`scontrol hold`, or an admin's hold).
    pub fn hold(&mut self, id: JobId, kind: HoldKind) -> Result<(), ControlError> {
        let job = self.jobs.get_mut(&id).ok_or(ControlError::UnknownJob(id))?;
        if !job.is_pending() {
            return Err(ControlError::NotPending(id));
        }
        if job.hold != Some(HoldKind::Admin) {
            job.hold = Some(kind);
        }
        self.note_hold(id);
        Ok(())
    }

    /// Releases a hold. A user cannot release an admin's hold.
    pub fn release(&mut self, id: JobId, by: HoldKind) -> Result<(), ControlError> {
        let job = self.jobs.get_mut(&id).ok_or(ControlError::UnknownJob(id))?;
        if !job.is_pending() {
            return Err(ControlError::NotPending(id));
        }
        if job.hold == Some(HoldKind::Admin) && by == HoldKind::User {
            return Err(ControlError::AdminHold(id));
        }
        job.hold = None;
        self.note_hold(id);
        Ok(())
    }

    /// A running job goes back to the queue (`scontrol requeue`, once the
    /// driver has ended its processes): its resources are free, its usage
    /// is charged, and it may start again after `requeue_delay`, with its
    /// age counted from now, as a new submission's. With `hold`, it waits
    /// held as well.
    pub fn requeue(
        &mut self,
        now: Secs,
        id: JobId,
        hold: Option<HoldKind>,
    ) -> Result<(), ControlError> {
        let job = self.jobs.get(&id).ok_or(ControlError::UnknownJob(id))?;
        if job.is_pending() {
            return Err(ControlError::NotRunning(id));
        }
        self.release_allocation(now, id);
        self.queue_again(now, id);
        if let (Some(kind), Some(job)) = (hold, self.jobs.get_mut(&id)) {
            job.hold = Some(kind);
            self.note_hold(id);
        }
        Ok(())
    }

    /// Files job `id` as held or not, as it is now; a held job's reason
    /// is its hold from here on (a pass no longer writes it).
    pub(super) fn note_hold(&mut self, id: JobId) {
        let Some(j) = self.jobs.get_mut(&id) else {
            return self.forget_job(id);
        };
        let held = match (j.is_pending(), j.hold) {
            (true, Some(HoldKind::User)) => Some(PendingReason::JobHeldUser),
            (true, Some(HoldKind::Admin)) => Some(PendingReason::JobHeldAdmin),
            _ => None,
        };
        let user = j.user;
        if j.is_pending() && j.begin > j.submit {
            self.delayed.insert((j.begin, id));
        }
        match held {
            Some(reason) => {
                j.set_pending(reason, None);
                self.unheld.remove(&id);
                if self.held.insert(id, user).is_none() {
                    *self.held_users.entry(user).or_default() += 1;
                }
            }
            None => {
                self.unheld.insert(id);
                self.unhold(id);
            }
        }
    }

    /// Job `id` is gone from the table.
    pub(super) fn forget_job(&mut self, id: JobId) {
        self.unheld.remove(&id);
        self.unhold(id);
    }

    fn unhold(&mut self, id: JobId) {
        let Some(user) = self.held.remove(&id) else {
            return;
        };
        if let std::collections::btree_map::Entry::Occupied(mut e) = self.held_users.entry(user) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }

    /// A job whose run ended without finishing it waits again, from now
    /// and for `requeue_delay`.
    pub(super) fn queue_again(&mut self, now: Secs, id: JobId) {
        let delay = self.cfg.requeue_delay;
        if let Some(j) = self.jobs.get_mut(&id) {
            j.begin = now.saturating_add(delay);
            j.submit = now;
            if delay > 0 {
                self.delayed.insert((j.begin, id));
            }
            let reason = match delay {
                0 => PendingReason::None,
                _ => PendingReason::BeginTime,
            };
            j.set_pending(reason, None);
        }
    }

    /// A running job ended. Its resources are free for the next pass and
    /// its usage is charged to fair-share.
    pub fn handle_job_finished(
        &mut self,
        now: Secs,
        id: JobId,
        outcome: JobOutcome,
    ) -> Result<(), ControlError> {
        let job = self.jobs.get(&id).ok_or(ControlError::UnknownJob(id))?;
        if job.is_pending() {
            return Err(ControlError::NotRunning(id));
        }
        self.release_allocation(now, id);
        let of = self.jobs.remove(&id).and_then(|j| j.array_id());
        self.forget_job(id);
        self.finished.insert(id, outcome);
        if let Some(a) = of {
            self.array_tasks_ended(a, 1, outcome.succeeded());
        }
        Ok(())
    }

    /// Frees a running job's resources on every node and charges its usage.
    fn release_allocation(&mut self, now: Secs, id: JobId) {
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        let State::Running(run) = std::mem::replace(
            &mut job.state,
            State::Pending {
                reason: PendingReason::None,
                plan: None,
            },
        ) else {
            return;
        };
        let Run {
            start,
            alloc,
            paused,
            suspended,
            ..
        } = *run;
        let (user, account) = (job.user, job.account);
        if let Some(a) = job.array_id() {
            self.array_task_stopped(a);
        }
        let (mut cpus, mut gpus) = (0u64, 0u64);
        for a in &alloc {
            cpus += a.cpus.len() as u64;
            gpus += a.gpus.len() as u64;
            let Some(node) = self
                .nodes
                .get_mut(a.node.0 as usize)
                .and_then(Option::as_mut)
            else {
                continue;
            };
            node.free.cpus += a.cpus.len() as u32;
            node.free.mem += a.memory_mb;
            for &c in &a.cpus {
                node.cpu_free[(c / 64) as usize] |= 1u64 << (c % 64);
            }
            for &g in &a.gpus {
                node.free.gpus |= 1u64 << g;
            }
            node.jobs.retain(|&j| j != id);
        }
        // Time spent suspended is not charged.
        let stopped = paused.saturating_add(suspended.map_or(0, |s| now.saturating_sub(s)));
        let secs = now.saturating_sub(start).saturating_sub(stopped) as f64;
        let billing = cpus as f64 + self.cfg.gpu_billing_weight * gpus as f64;
        self.fairshare.charge(now, user, account, billing * secs);
    }

    /// Fair-share as `sshare` shows it: the decayed usage (billing units
    /// × seconds) of `user`, of `account` and of the whole cluster, and
    /// the factor a job of theirs is ranked by now, split among as many
    /// users as the last pass counted (no walk of the queue: `sshare` is
    /// served under the controller's lock).
    pub fn share_usage(&self, now: Secs, user: UserId, account: AccountId) -> ShareUsage {
        let parties = self.fair_parties.max(1);
        let (user_usage, account_usage, total) = self.fairshare.usage(now, user, account);
        ShareUsage {
            user: user_usage,
            account: account_usage,
            total,
            factor: self.fairshare.factor(now, user, account, parties),
        }
    }

    /// Whether a dependency may name `id`: a job waiting, running or
    /// finished, an array, or one of an array's tasks still waiting.
    pub fn knows_job(&self, id: JobId) -> bool {
        self.jobs.contains_key(&id)
            || self.finished.contains_key(&id)
            || self.arrays.contains_key(&id)
            || self.task_waiting(id)
    }

    /// Forgets how job `id` ended, so that its id may be given to a new
    /// job (ids wrap at the controller's `MaxJobId`); a job still waiting
    /// or running is kept. Whether it was forgotten.
    pub fn forget_finished(&mut self, id: JobId) -> bool {
        if self.jobs.contains_key(&id) || self.arrays.contains_key(&id) || self.task_waiting(id) {
            return false;
        }
        self.finished.remove(&id).is_some()
    }

    /// Where a job stands now.
    pub fn job_status(&self, id: JobId) -> Option<JobStatus> {
        // The jobs first: a listing asks this of every pending job, and
        // the finished ones' hash costs more than the tree's search.
        let Some(job) = self.jobs.get(&id) else {
            return self.finished.get(&id).map(|o| JobStatus::Finished(*o));
        };
        Some(Self::status_of(job))
    }

    /// [`Scheduler::job_status`] of jobs asked in ascending id order, as
    /// a listing asks: the job table is walked once instead of searched
    /// for each job.
    pub fn statuses(&self) -> Statuses<'_> {
        Statuses::from(self, JobId(0))
    }

    fn status_of(job: &Job) -> JobStatus {
        match &job.state {
            State::Pending { reason, plan } => JobStatus::Pending {
                reason: *reason,
                expected_start: plan.as_ref().map(|p| p.start),
                priority: job.priority,
            },
            State::Running(r) => JobStatus::Running {
                start: r.start,
                end_by: r.end_by,
                nodes: r.alloc.to_vec(),
            },
        }
    }

    /// A pending job's reservation from the last pass, if it holds one.
    pub fn reservation(&self, id: JobId) -> Option<&Reservation> {
        self.jobs.get(&id)?.planned()
    }

    /// Jobs pending or running, ascending by id.
    pub fn active_jobs(&self) -> impl Iterator<Item = JobId> + '_ {
        self.jobs.keys().copied()
    }

    /// The partition a job was admitted to (the default one when it named
    /// none), while the scheduler holds it.
    pub fn job_partition(&self, id: JobId) -> Option<&str> {
        let j = self.jobs.get(&id)?;
        let p = self.partitions.get(j.partition.0 as usize)?;
        Some(&p.spec.name)
    }

    pub fn pending_count(&self) -> usize {
        self.jobs.values().filter(|j| j.is_pending()).count()
    }

    /// The earliest time a pass is due although no event arrives: a begin
    /// time is reached, or a running job reaches its time limit. Costs
    /// the running jobs and the delayed ones, not the queue.
    pub fn next_wakeup(&self, now: Secs) -> Option<Secs> {
        let begin = self
            .delayed
            .range((now.saturating_add(1), JobId(0))..)
            .find(|&&(t, id)| self.waits_until(id, t))
            .map(|&(t, _)| t);
        let end = self
            .running()
            .map(|(_, r)| r.end_by)
            .filter(|&e| e < INFINITE)
            .min();
        begin.into_iter().chain(end).min()
    }

    /// Whether job `id` is pending and may not start before `t`.
    fn waits_until(&self, id: JobId, t: Secs) -> bool {
        self.jobs.get(&id).is_some_and(|j| j.waits_until(t))
    }

    /// Drops the begin times no job waits for any more (it started, went,
    /// or was given another). One reached stays while its job is pending:
    /// [`Scheduler::next_wakeup`] looks only past `now`.
    fn prune_delayed(&mut self) {
        let jobs = &self.jobs;
        self.delayed
            .retain(|&(t, id)| jobs.get(&id).is_some_and(|j| j.waits_until(t)));
    }

    /// The running jobs, each once (on the list of its first node), with
    /// their runs: what the nodes hold, not the queue.
    fn running(&self) -> impl Iterator<Item = (JobId, &Run)> + '_ {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.as_ref().map(|n| (i, n)))
            .flat_map(move |(i, n)| {
                n.jobs
                    .iter()
                    .filter_map(move |&id| match &self.jobs.get(&id)?.state {
                        State::Running(r) if r.alloc.first()?.node.0 as usize == i => {
                            Some((id, &**r))
                        }
                        _ => None,
                    })
            })
    }

    /// Jobs whose time limit has passed at `now`, ascending by id: the
    /// driver ends them (TIMEOUT) and reports them finished.
    pub fn overdue_jobs(&self, now: Secs) -> Vec<JobId> {
        let mut due: Vec<JobId> = self
            .running()
            .filter(|(_, r)| r.end_by <= now)
            .map(|(id, _)| id)
            .collect();
        due.sort_unstable();
        due
    }
}
/// Jobs' statuses asked in ascending id order ([`Scheduler::statuses`]).
/// Asked out of order, or far ahead, it searches as
/// [`Scheduler::job_status`] does.
pub struct Statuses<'a> {
    sched: &'a Scheduler,
    walk: std::iter::Peekable<std::collections::btree_map::Range<'a, JobId, Box<Job>>>,
    /// [`Statuses::AHEAD`] jobs past `walk`, each fetched into the cache
    /// as `walk` comes near: every job is a box of its own, and reading
    /// ten thousand of them in turn left a listing waiting on memory for
    /// each.
    ahead: std::collections::btree_map::Range<'a, JobId, Box<Job>>,
}

impl std::fmt::Debug for Statuses<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Statuses").finish_non_exhaustive()
    }
}

impl<'a> Statuses<'a> {
    /// How many jobs it steps over before it searches instead.
    const STRIDE: usize = 16;
    /// How far ahead of the walk jobs are fetched.
    const AHEAD: usize = 8;

    fn from(sched: &'a Scheduler, id: JobId) -> Statuses<'a> {
        let walk = sched.jobs.range(id..);
        let mut ahead = walk.clone();
        for (_, job) in ahead.by_ref().take(Self::AHEAD) {
            crate::prefetch(&**job);
        }
        Statuses {
            sched,
            walk: walk.peekable(),
            ahead,
        }
    }

    fn step(&mut self) {
        self.walk.next();
        if let Some((_, job)) = self.ahead.next() {
            crate::prefetch(&**job);
        }
    }

    pub fn status(&mut self, id: JobId) -> Option<JobStatus> {
        for _ in 0..Self::STRIDE {
            match self.walk.peek() {
                Some((&k, _)) if k < id => self.step(),
                Some((&k, job)) if k == id => return Some(Scheduler::status_of(job)),
                // Past it, or at the end: not live, perhaps finished.
                _ => return self.sched.job_status(id),
            }
        }
        *self = Statuses::from(self.sched, id);
        match self.walk.peek() {
            Some((&k, job)) if k == id => Some(Scheduler::status_of(job)),
            _ => self.sched.job_status(id),
        }
    }
}

#[cfg(test)]
mod status_tests {
    use super::*;
    use crate::model::{JobRequest, NodeSpec, PartitionSpec, UserId};

    /// A walk of the statuses answers as the search does, asked in order
    /// with gaps, far ahead, and backwards.
    #[test]
    fn statuses_in_order_answer_as_job_status_does() {
        let mut s = Scheduler::new(SchedulerConfig::default());
        let mut p = PartitionSpec::new("p", "n0");
        p.is_default = true;
        s.add_partition(p).unwrap();
        s.handle_node_added(NodeSpec::new("n0", 4, 1000)).unwrap();
        for id in (1..200).filter(|i| i % 3 != 0) {
            s.submit(0, JobId(id), JobRequest::new(UserId(1))).unwrap();
        }
        let started = s.schedule(0);
        assert_eq!(started.len(), 4);
        for d in &started[..2] {
            s.handle_job_finished(1, d.job, JobOutcome::Completed)
                .unwrap();
        }
        let asks = [
            (0..210).collect::<Vec<u64>>(),
            vec![5, 7, 150, 151, 40, 2, 199, 500],
        ];
        for ask in asks {
            let mut walk = s.statuses();
            for id in ask {
                assert_eq!(walk.status(JobId(id)), s.job_status(JobId(id)), "job {id}");
            }
        }
    }
}

#[cfg(test)]
mod size_tests {
    /// Every queued job is one boxed `Job`: 152 bytes is a 160-byte
    /// allocation (glibc), where the 200 before (a running job's state
    /// inline, an eight-byte tasks-per-node option) took 208.
    #[test]
    fn a_queued_job_takes_at_most_152_bytes() {
        assert!(std::mem::size_of::<super::Job>() <= 152);
        assert_eq!(std::mem::size_of::<super::State>(), 16);
        assert_eq!(std::mem::size_of::<crate::placement::Shape>(), 48);
    }
}
