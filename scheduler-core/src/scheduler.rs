//! The scheduler: the queue, the node table, and the scheduling pass.
//!
//! Owns all job and node state the scheduling decisions depend on. It never
//! performs I/O, never reads a clock and never draws random numbers: every
//! input carries `now`, every iteration over state is in a stable order, and
//! ties are broken on ids. Same calls, same decisions.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use crate::error::{ControlError, SubmitError};
use crate::hash::FastMap;
use crate::hostlist;
use crate::model::{
    AccountId, Dependency, GpuRequest, HoldKind, JobId, JobOutcome, JobRequest, JobStatus, LostJob,
    NodeAdmin, NodeAllocation, NodeId, NodeInfo, NodeSpec, NodeState, PartitionId, PartitionSpec,
    PendingReason, PlannedNode, Reservation, Secs, StartDecision, UserId, INFINITE,
    MAX_GPUS_PER_NODE,
};
use crate::placement::{mask_indices, pick_gpus, score, score_bound, Capacity, Packing, Shape};
use crate::priority::{priority, Factors, FairShare, PriorityWeights};
use crate::quad_heap::QuadHeap;
use crate::timeline::{Free, Timeline, Use};

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
    Running {
        start: Secs,
        end_by: Secs,
        alloc: Vec<NodeAllocation>,
    },
}

#[derive(Clone)]
struct Job {
    name: String,
    user: UserId,
    account: AccountId,
    partition: PartitionId,
    shape: Shape,
    limit: Secs,
    required: Vec<NodeId>,
    exclude: Vec<NodeId>,
    features: Vec<String>,
    qos: u32,
    nice: i32,
    hold: Option<HoldKind>,
    begin: Secs,
    deps: Vec<Dependency>,
    requeue: bool,
    submit: Secs,
    priority: i64,
    state: State,
}

impl Job {
    fn is_pending(&self) -> bool {
        matches!(self.state, State::Pending { .. })
    }

    fn set_pending(&mut self, reason: PendingReason, plan: Option<Box<Reservation>>) {
        self.state = State::Pending { reason, plan };
    }

    fn planned(&self) -> Option<&Reservation> {
        match &self.state {
            State::Pending { plan, .. } => plan.as_deref(),
            State::Running { .. } => None,
        }
    }

    /// The nodes a job may use, before looking at what is free.
    fn eligibility(&self) -> EligKey {
        EligKey {
            partition: self.partition,
            features: self.features.clone(),
            required: self.required.clone(),
            exclude: self.exclude.clone(),
        }
    }
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct EligKey {
    partition: PartitionId,
    features: Vec<String>,
    required: Vec<NodeId>,
    exclude: Vec<NodeId>,
}

/// Jobs of one class (same eligible nodes and shape) are interchangeable
/// for placement, so what the pass learns about a class carries to its next
/// job: within a pass resources only get scarcer, so a node's earliest fit
/// only moves later, and a job cannot start before the last one of its
/// class and time limit did.
///
/// The heap holds every eligible node that could still host the class,
/// keyed by a lower bound of its earliest fit (for the shortest time limit
/// in the class, so the bound holds for every job of it) and then by how
/// well it fits there, so a search pops the few nodes it needs instead of
/// scanning all of them.
struct ClassState {
    /// The time limit the heap's bounds were computed for.
    key_len: Secs,
    /// The class's distinct time limits, ascending, and how many of its
    /// jobs with each are still to be placed this pass.
    lens: Vec<Secs>,
    remaining: Vec<u32>,
    /// Prefix maximum over `lens` of the starts given so far: a job with
    /// limit `lens[i]` cannot start before the max over `..=i`.
    floors: Vec<Secs>,
    heap: QuadHeap<HeapEntry>,
    /// Whether the heap holds every eligible node yet (built on first use).
    built: bool,
    /// Per eligible position: the node's version when its bound was exact.
    seen: Vec<u32>,
}

/// A shape whose jobs come with more distinct time limits than this in
/// one pass shares one heap among all of them.
const MAX_LIMITS_PER_CLASS: usize = 16;

/// (earliest-fit bound, fit score, position in the eligible list).
///
/// Packed into one integer, most significant first, so comparing entries
/// is one comparison: 62 bits of bound (every time before [`INFINITE`]),
/// 38 of score (GPUs left, groups broken, CPUs left up to 2^24) and 28 of
/// position.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct HeapEntry(u128);

impl HeapEntry {
    fn new(bound: Secs, score: (u32, u32, u32), pos: u32) -> Self {
        let score = (u128::from(score.0.min(127)) << 31)
            | (u128::from(score.1.min(127)) << 24)
            | u128::from(score.2.min((1 << 24) - 1));
        HeapEntry(
            (u128::from(bound.min(INFINITE)) << 66)
                | (score << 28)
                | u128::from(pos & ((1 << 28) - 1)),
        )
    }

    fn bound(self) -> Secs {
        (self.0 >> 66) as Secs
    }

    fn pos(self) -> u32 {
        (self.0 & ((1 << 28) - 1)) as u32
    }
}

impl ClassState {
    fn new(nodes: usize) -> Self {
        ClassState {
            key_len: INFINITE,
            lens: Vec::new(),
            remaining: Vec::new(),
            floors: Vec::new(),
            heap: QuadHeap::default(),
            built: false,
            seen: vec![u32::MAX; nodes],
        }
    }

    /// Counts one more job with this limit (before the pass places any).
    fn add_job(&mut self, len: Secs) {
        self.key_len = self.key_len.min(len);
        self.lens.push(len);
    }

    /// Turns the collected limits into the per-limit tables.
    fn seal(&mut self) {
        self.lens.sort_unstable();
        let mut lens: Vec<Secs> = Vec::new();
        for &len in &self.lens {
            if lens.last() == Some(&len) {
                *self
                    .remaining
                    .last_mut()
                    .expect("one count per distinct limit") += 1;
            } else {
                lens.push(len);
                self.remaining.push(1);
            }
        }
        self.lens = lens;
        self.floors = vec![0; self.lens.len() + 1];
    }

    fn index(&self, len: Secs) -> usize {
        self.lens.partition_point(|&l| l < len)
    }

    /// No job of this class with limit `len` starts before this.
    fn floor(&self, len: Secs) -> Secs {
        // Fenwick prefix maximum over limits up to `len`.
        let mut i = self.index(len) + 1;
        let mut m = 0;
        while i > 0 {
            m = m.max(self.floors[i]);
            i &= i - 1;
        }
        m
    }

    /// A job with limit `len` was placed at `start` (or cannot start
    /// before it): jobs no shorter cannot start earlier.
    fn raise_floor(&mut self, len: Secs, start: Secs) {
        let mut i = self.index(len) + 1;
        while i < self.floors.len() {
            self.floors[i] = self.floors[i].max(start);
            i += i & i.wrapping_neg();
        }
    }

    /// The earliest any job of the class still to be placed (this one
    /// included) may start: heap bounds must hold from here on.
    fn horizon(&self) -> Secs {
        match self.remaining.iter().position(|&c| c > 0) {
            Some(i) => self.floor(self.lens[i]),
            None => INFINITE,
        }
    }

    /// This job is done with.
    fn retire(&mut self, len: Secs) {
        let i = self.index(len);
        self.remaining[i] = self.remaining[i].saturating_sub(1);
    }
}

struct Candidate {
    node: NodeId,
    k: u32,
    free: Free,
    score: (u32, u32, u32),
}

enum Committed {
    Started(StartDecision),
    Reserved(Box<Reservation>),
    Gone,
}

struct Placement {
    start: Secs,
    /// Node, tasks on it, GPUs chosen there.
    nodes: Vec<(NodeId, u32, u64)>,
}

/// Per-pass state that outlives one job's search.
struct PassState {
    now: Secs,
    /// Start of every segment boundary where resources come free.
    releases: BTreeSet<Secs>,
    versions: Vec<u32>,
    candidates: Vec<Candidate>,
    /// Heap entries a search has taken out, and will put back.
    held: Vec<HeapEntry>,
    peeked: Vec<HeapEntry>,
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
    jobs: BTreeMap<JobId, Job>,
    finished: HashMap<JobId, JobOutcome>,
    fairshare: FairShare,
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
            finished: HashMap::new(),
            fairshare,
            timelines: Vec::new(),
        }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    // ----- partitions -------------------------------------------------

    /// Adds a partition; registered nodes whose names it lists join it.
    pub fn add_partition(&mut self, spec: PartitionSpec) -> Result<PartitionId, ControlError> {
        if self.partition_names.contains_key(&spec.name) {
            return Err(ControlError::DuplicatePartition(spec.name));
        }
        let all = spec.nodes.trim().eq_ignore_ascii_case("ALL");
        let names = if all {
            HashSet::new()
        } else {
            hostlist::expand(&spec.nodes)
                .map_err(|source| ControlError::PartitionNodes {
                    name: spec.name.clone(),
                    source,
                })?
                .into_iter()
                .collect()
        };
        let id = PartitionId(self.partitions.len() as u32);
        let mut p = Partition {
            spec,
            all,
            names,
            members: Vec::new(),
        };
        p.members = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| {
                n.as_ref()
                    .filter(|n| p.matches(&n.name))
                    .map(|_| NodeId(i as u32))
            })
            .collect();
        self.partition_names.insert(p.spec.name.clone(), id);
        self.partitions.push(p);
        Ok(id)
    }

    /// Changes a partition's limits and tier (not its nodes). Pending jobs
    /// over a lowered time limit wait with `PartitionTimeLimit`.
    pub fn update_partition_limits(
        &mut self,
        name: &str,
        default_time: Option<Secs>,
        max_time: Option<Secs>,
        priority_tier: u32,
    ) -> Result<(), ControlError> {
        let id = self
            .partition_id(name)
            .ok_or_else(|| ControlError::UnknownPartition(name.to_string()))?;
        let spec = &mut self.partitions[id.0 as usize].spec;
        spec.default_time = default_time;
        spec.max_time = max_time;
        spec.priority_tier = priority_tier;
        Ok(())
    }

    pub fn partition_id(&self, name: &str) -> Option<PartitionId> {
        self.partition_names.get(name).copied()
    }

    pub fn partition_spec(&self, id: PartitionId) -> Option<&PartitionSpec> {
        self.partitions.get(id.0 as usize).map(|p| &p.spec)
    }

    /// Member nodes of a partition, ascending.
    pub fn partition_nodes(&self, id: PartitionId) -> &[NodeId] {
        self.partitions
            .get(id.0 as usize)
            .map_or(&[], |p| &p.members)
    }

    // ----- nodes --------------------------------------------------------

    /// Registers a node. It is idle and in service at once.
    pub fn handle_node_added(&mut self, spec: NodeSpec) -> Result<NodeId, ControlError> {
        if self.node_names.contains_key(&spec.name) {
            return Err(ControlError::DuplicateNode(spec.name));
        }
        if spec.cpus == 0 {
            return Err(ControlError::NoCpus(spec.name));
        }
        if spec.gpus.len() > MAX_GPUS_PER_NODE {
            return Err(ControlError::TooManyGpus {
                name: spec.name,
                count: spec.gpus.len(),
            });
        }
        let mut gpus = 0u64;
        let mut groups: BTreeMap<u32, u64> = BTreeMap::new();
        for g in &spec.gpus {
            let bit = 1u64
                .checked_shl(g.index)
                .filter(|_| g.index < MAX_GPUS_PER_NODE as u32);
            match bit {
                Some(b) if gpus & b == 0 => {
                    gpus |= b;
                    *groups.entry(g.group).or_default() |= b;
                }
                _ => {
                    return Err(ControlError::BadGpuIndex {
                        name: spec.name,
                        index: g.index,
                    })
                }
            }
        }
        let cap = Capacity {
            cpus: spec.cpus,
            mem: spec.memory_mb,
            gpus,
            groups: groups.into_values().collect(),
        };
        let words = spec.cpus.div_ceil(64) as usize;
        let mut cpu_free = vec![u64::MAX; words];
        if spec.cpus % 64 != 0 {
            cpu_free[words - 1] = (1u64 << (spec.cpus % 64)) - 1;
        }
        let id = NodeId(self.nodes.len() as u32);
        for p in &mut self.partitions {
            if p.matches(&spec.name) {
                p.members.push(id);
            }
        }
        self.node_names.insert(spec.name.clone(), id);
        self.nodes.push(Some(NodeSlot {
            name: spec.name,
            free: cap.whole(),
            cap,
            gpu_count: gpus.count_ones(),
            features: spec.features,
            admin: NodeAdmin::Up,
            cpu_free,
            jobs: Vec::new(),
        }));
        Ok(id)
    }

    /// Sets a node's administrative state. Going down loses its running
    /// jobs: each ends in NODE_FAIL or, with `--requeue`, pends again.
    pub fn handle_node_admin(
        &mut self,
        now: Secs,
        id: NodeId,
        admin: NodeAdmin,
    ) -> Result<Vec<LostJob>, ControlError> {
        let node = self.slot_mut(id)?;
        let down = matches!(admin, NodeAdmin::Down { .. });
        node.admin = admin;
        Ok(if down {
            self.lose_jobs_on(now, id)
        } else {
            Vec::new()
        })
    }

    /// Removes a node for good (scale down, or an agent that will not
    /// return). Its running jobs are lost as with going down.
    pub fn handle_node_removed(
        &mut self,
        now: Secs,
        id: NodeId,
    ) -> Result<Vec<LostJob>, ControlError> {
        self.slot_mut(id)?;
        let lost = self.lose_jobs_on(now, id);
        if let Some(node) = self.nodes[id.0 as usize].take() {
            self.node_names.remove(&node.name);
        }
        for p in &mut self.partitions {
            p.members.retain(|&m| m != id);
        }
        Ok(lost)
    }

    fn slot_mut(&mut self, id: NodeId) -> Result<&mut NodeSlot, ControlError> {
        self.nodes
            .get_mut(id.0 as usize)
            .and_then(Option::as_mut)
            .ok_or(ControlError::UnknownNode(id))
    }

    fn slot(&self, id: NodeId) -> Option<&NodeSlot> {
        self.nodes.get(id.0 as usize).and_then(Option::as_ref)
    }

    fn lose_jobs_on(&mut self, now: Secs, id: NodeId) -> Vec<LostJob> {
        let jobs = self.slot(id).map(|n| n.jobs.clone()).unwrap_or_default();
        let mut lost = Vec::with_capacity(jobs.len());
        for job in jobs {
            let requeue = self.jobs.get(&job).is_some_and(|j| j.requeue);
            self.release_allocation(now, job);
            if requeue {
                if let Some(j) = self.jobs.get_mut(&job) {
                    j.set_pending(PendingReason::None, None);
                }
                lost.push(LostJob::Requeued(job));
            } else {
                self.jobs.remove(&job);
                self.finished.insert(job, JobOutcome::NodeFail);
                lost.push(LostJob::Failed(job));
            }
        }
        lost
    }

    pub fn node_id(&self, name: &str) -> Option<NodeId> {
        self.node_names.get(name).copied()
    }

    /// A node as `sinfo` shows it.
    pub fn node_info(&self, id: NodeId) -> Option<NodeInfo> {
        let n = self.slot(id)?;
        let alloc_cpus = n.cap.cpus - n.free.cpus;
        let busy = !n.jobs.is_empty();
        let state = match &n.admin {
            NodeAdmin::Down { .. } => NodeState::Down,
            NodeAdmin::Drain { .. } if busy => NodeState::Draining,
            NodeAdmin::Drain { .. } => NodeState::Drained,
            NodeAdmin::Up if !busy => NodeState::Idle,
            NodeAdmin::Up if n.free.cpus == 0 || (n.gpu_count > 0 && n.free.gpus == 0) => {
                NodeState::Allocated
            }
            NodeAdmin::Up => NodeState::Mixed,
        };
        let reason = match &n.admin {
            NodeAdmin::Up => None,
            NodeAdmin::Drain { reason } | NodeAdmin::Down { reason } => Some(reason.clone()),
        };
        Some(NodeInfo {
            id,
            name: n.name.clone(),
            state,
            reason,
            cpus: n.cap.cpus,
            alloc_cpus,
            memory_mb: n.cap.mem,
            alloc_memory_mb: n.cap.mem - n.free.mem,
            gpus: n.gpu_count,
            alloc_gpus: n.gpu_count - n.free.gpu_count(),
            features: n.features.clone(),
            jobs: n.jobs.clone(),
        })
    }

    /// Registered nodes, ascending by id.
    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.is_some())
            .map(|(i, _)| NodeId(i as u32))
    }

    // ----- jobs ---------------------------------------------------------

    /// Accepts a job into the queue, or says why it never could run.
    pub fn submit(&mut self, now: Secs, id: JobId, req: JobRequest) -> Result<(), SubmitError> {
        if self.jobs.contains_key(&id) || self.finished.contains_key(&id) {
            return Err(SubmitError::DuplicateJob(id));
        }
        let job = self.validate(now, req)?;
        self.jobs.insert(id, job);
        Ok(())
    }

    fn validate(&self, now: Secs, req: JobRequest) -> Result<Job, SubmitError> {
        let invalid = |s: &str| Err(SubmitError::Invalid(s.to_string()));
        let pid = match &req.partition {
            Some(name) => self
                .partition_id(name)
                .ok_or_else(|| SubmitError::UnknownPartition(name.clone()))?,
            None => self
                .partitions
                .iter()
                .position(|p| p.spec.is_default)
                .map(|i| PartitionId(i as u32))
                .ok_or(SubmitError::NoDefaultPartition)?,
        };
        let part = &self.partitions[pid.0 as usize];
        let qos_name = req.qos.as_deref().unwrap_or("normal");
        let qos = self
            .cfg
            .qos
            .iter()
            .find(|(n, _)| n == qos_name)
            .map(|&(_, p)| p)
            .ok_or_else(|| SubmitError::UnknownQos(qos_name.to_string()))?;
        if req.cpus_per_task == 0 {
            return invalid("cpus per task must be at least 1");
        }
        if req.nodes == Some(0) || req.ntasks == Some(0) || req.ntasks_per_node == Some(0) {
            return invalid("node and task counts must be at least 1");
        }
        let max_time = part.spec.max_time.unwrap_or(INFINITE);
        let limit = match req.time_limit {
            Some(0) => return invalid("time limit must be at least one second"),
            Some(t) => t.min(INFINITE),
            None => part.spec.default_time.unwrap_or(max_time),
        };
        if limit > max_time {
            return Err(SubmitError::TimeLimit {
                partition: part.spec.name.clone(),
                limit,
                max: max_time,
            });
        }
        let resolve = |names: &[String]| -> Result<Vec<NodeId>, SubmitError> {
            let mut ids = Vec::with_capacity(names.len());
            for name in names {
                let id = self
                    .node_id(name)
                    .ok_or_else(|| SubmitError::UnknownNode(name.clone()))?;
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
            ids.sort_unstable();
            Ok(ids)
        };
        let required = resolve(&req.nodelist)?;
        let exclude = resolve(&req.exclude)?;
        if required.iter().any(|r| exclude.contains(r)) {
            return invalid("a node is both required and excluded");
        }
        if let Some(r) = required.iter().find(|r| !part.members.contains(r)) {
            return Err(SubmitError::NodeConfigUnavailable(format!(
                "node {} is not in partition {}",
                self.slot(*r).map_or("?", |n| n.name.as_str()),
                part.spec.name
            )));
        }
        let mut features: Vec<String> = req
            .features
            .iter()
            .filter(|f| !f.is_empty())
            .cloned()
            .collect();
        features.sort();
        features.dedup();
        for d in &req.dependencies {
            let target = match *d {
                Dependency::After(j)
                | Dependency::AfterOk(j)
                | Dependency::AfterNotOk(j)
                | Dependency::AfterAny(j) => j,
                Dependency::Singleton => continue,
            };
            if !self.jobs.contains_key(&target) && !self.finished.contains_key(&target) {
                return Err(SubmitError::UnknownDependency(target));
            }
        }

        // Nodes this job could ever use, whatever their state.
        let usable = || {
            part.members
                .iter()
                .filter(|m| !exclude.contains(m))
                .filter_map(|&m| self.slot(m))
                .filter(|n| features.iter().all(|f| n.features.contains(f)))
        };
        let most_gpus = || usable().map(|n| n.gpu_count).max().unwrap_or(0);
        let shape = self.shape(&req, &part.spec.name, most_gpus, required.len())?;
        // Stop looking as soon as enough nodes could hold it.
        let mut fits: Vec<u32> = Vec::new();
        let mut units = 0u64;
        for n in usable() {
            let k = shape.tasks_fit(n.cap.whole(), &n.cap);
            if k == 0 {
                continue;
            }
            fits.push(k);
            units += u64::from(k);
            let count = fits.len();
            let done = if shape.uniform() {
                count >= shape.nodes_min as usize
            } else {
                count >= shape.nodes_min as usize
                    && count <= shape.nodes_max as usize
                    && units >= u64::from(shape.tasks)
            };
            if done {
                break;
            }
        }
        let enough = if shape.uniform() {
            fits.len() >= shape.nodes_min as usize
        } else {
            fits.sort_unstable_by(|a, b| b.cmp(a));
            let most: u64 = fits
                .iter()
                .take(shape.nodes_max as usize)
                .map(|&k| u64::from(k))
                .sum();
            fits.len() >= shape.nodes_min as usize && most >= u64::from(shape.tasks)
        };
        if !enough {
            return Err(SubmitError::NodeConfigUnavailable(if fits.is_empty() {
                format!(
                    "no node in partition {} can hold one task ({} CPUs, {} GPUs, {} MB per node{})",
                    part.spec.name,
                    shape.cpus_per_task,
                    shape.gpus_per_task + shape.gpus_per_node,
                    shape.mem_per_node,
                    if shape.exclusive { ", exclusive" } else { "" }
                )
            } else {
                format!(
                    "partition {} has {} nodes that fit, the job needs {} nodes for {} tasks",
                    part.spec.name,
                    fits.len(),
                    shape.nodes_min,
                    shape.tasks
                )
            }));
        }
        Ok(Job {
            name: req.name,
            user: req.user,
            account: req.account,
            partition: pid,
            shape,
            limit,
            required,
            exclude,
            features,
            qos,
            nice: req.nice,
            hold: req.hold.then_some(HoldKind::User),
            begin: req.begin_time.unwrap_or(now),
            deps: req.dependencies,
            requeue: req.requeue,
            submit: now,
            priority: 0,
            state: State::Pending {
                // A hold is known now; everything else waits for a pass.
                reason: if req.hold {
                    PendingReason::JobHeldUser
                } else {
                    PendingReason::None
                },
                plan: None,
            },
        })
    }

    /// Turns the request's node, task and GPU counts into a shape.
    fn shape(
        &self,
        req: &JobRequest,
        partition: &str,
        most_gpus: impl FnOnce() -> u32,
        required: usize,
    ) -> Result<Shape, SubmitError> {
        let invalid = |s: String| Err(SubmitError::Invalid(s));
        let (mut nodes_min, mut nodes_max, mut tasks, mut tasks_per_node) =
            match (req.nodes, req.ntasks, req.ntasks_per_node) {
                (Some(n), Some(t), Some(tpn)) if u64::from(n) * u64::from(tpn) < u64::from(t) => {
                    return invalid(format!(
                        "{t} tasks do not fit {n} nodes at {tpn} tasks per node"
                    ));
                }
                (n, t, Some(tpn)) => {
                    let n = n.unwrap_or(1).max(t.map_or(1, |t| t.div_ceil(tpn)));
                    (n, n, n.saturating_mul(tpn), Some(tpn))
                }
                (Some(n), Some(t), None) if t < n => {
                    return invalid(format!("{t} tasks cannot cover {n} nodes"));
                }
                (Some(n), Some(t), None) => (n, n, t, None),
                (Some(n), None, None) => (n, n, n, Some(1)),
                (None, Some(t), None) => (1, t, t, None),
                (None, None, None) => (1, 1, 1, Some(1)),
            };
        let (mut gpus_per_node, gpus_per_task) = match req.gpus {
            GpuRequest::None | GpuRequest::Total(_) => (0, 0),
            GpuRequest::PerNode(g) => (g, 0),
            GpuRequest::PerTask(g) => (0, g),
        };
        if let GpuRequest::Total(total) = req.gpus {
            // The node count is fixed by -N or --ntasks-per-node; otherwise
            // the fewest nodes over which the GPUs divide evenly.
            let fixed = req.nodes.is_some() || req.ntasks_per_node.is_some();
            let n = if fixed {
                nodes_min
            } else {
                let most = most_gpus();
                if most == 0 {
                    return Err(SubmitError::NodeConfigUnavailable(format!(
                        "partition {partition} has no GPUs"
                    )));
                }
                let mut n = total.div_ceil(most).max(1);
                while total % n != 0 {
                    n += 1;
                }
                n
            };
            if total % n != 0 {
                return invalid(format!(
                    "--gpus={total} does not divide evenly over {n} nodes"
                ));
            }
            if !fixed {
                if req.ntasks.is_some_and(|t| t < n) {
                    return invalid(format!(
                        "{tasks} tasks cannot cover the {n} nodes --gpus={total} needs"
                    ));
                }
                if req.ntasks.is_none() {
                    tasks = n;
                    tasks_per_node = Some(1);
                }
                nodes_min = n;
                nodes_max = n;
            }
            gpus_per_node = total / n;
        }
        if (required as u32) > nodes_max {
            return invalid(format!(
                "{required} required nodes exceed the {nodes_max} nodes asked for"
            ));
        }
        let exclusive = req.exclusive;
        // Exclusive jobs hold the whole node's memory whatever they ask.
        let mem_per_node = req.memory_per_node_mb.unwrap_or(0);
        Ok(Shape {
            nodes_min,
            nodes_max,
            tasks,
            tasks_per_node,
            cpus_per_task: req.cpus_per_task,
            gpus_per_task,
            gpus_per_node,
            mem_per_node,
            exclusive,
        })
    }

    /// Cancels a job. A pending job is gone at once; a running one must be
    /// killed by the driver, which then reports it finished.
    pub fn cancel(&mut self, id: JobId) -> Result<Cancelled, ControlError> {
        let job = self.jobs.get(&id).ok_or(ControlError::UnknownJob(id))?;
        match &job.state {
            State::Pending { .. } => {
                self.jobs.remove(&id);
                self.finished.insert(id, JobOutcome::Cancelled);
                Ok(Cancelled::Pending)
            }
            State::Running { alloc, .. } => Ok(Cancelled::Running(alloc.clone())),
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
        let reason = match job.hold {
            Some(HoldKind::Admin) => PendingReason::JobHeldAdmin,
            _ => PendingReason::JobHeldUser,
        };
        job.set_pending(reason, None);
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
        Ok(())
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
        self.jobs.remove(&id);
        self.finished.insert(id, outcome);
        Ok(())
    }

    /// Frees a running job's resources on every node and charges its usage.
    fn release_allocation(&mut self, now: Secs, id: JobId) {
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        let State::Running { start, alloc, .. } = std::mem::replace(
            &mut job.state,
            State::Pending {
                reason: PendingReason::None,
                plan: None,
            },
        ) else {
            return;
        };
        let (user, account) = (job.user, job.account);
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
        let secs = now.saturating_sub(start) as f64;
        let billing = cpus as f64 + self.cfg.gpu_billing_weight * gpus as f64;
        self.fairshare.charge(now, user, account, billing * secs);
    }

    /// Where a job stands now.
    pub fn job_status(&self, id: JobId) -> Option<JobStatus> {
        if let Some(outcome) = self.finished.get(&id) {
            return Some(JobStatus::Finished(*outcome));
        }
        let job = self.jobs.get(&id)?;
        Some(match &job.state {
            State::Pending { reason, plan } => JobStatus::Pending {
                reason: *reason,
                expected_start: plan.as_ref().map(|p| p.start),
                priority: job.priority,
            },
            State::Running {
                start,
                end_by,
                alloc,
            } => JobStatus::Running {
                start: *start,
                end_by: *end_by,
                nodes: alloc.clone(),
            },
        })
    }

    /// A pending job's reservation from the last pass, if it holds one.
    pub fn reservation(&self, id: JobId) -> Option<&Reservation> {
        self.jobs.get(&id)?.planned()
    }

    /// Jobs pending or running, ascending by id.
    pub fn active_jobs(&self) -> impl Iterator<Item = JobId> + '_ {
        self.jobs.keys().copied()
    }

    pub fn pending_count(&self) -> usize {
        self.jobs.values().filter(|j| j.is_pending()).count()
    }

    /// The earliest time a pass is due although no event arrives: a begin
    /// time is reached, or a running job reaches its time limit.
    pub fn next_wakeup(&self, now: Secs) -> Option<Secs> {
        self.jobs
            .values()
            .filter_map(|j| match j.state {
                State::Pending { .. } if j.begin > now => Some(j.begin),
                State::Running { end_by, .. } if end_by < INFINITE => Some(end_by),
                _ => None,
            })
            .min()
    }

    /// Jobs whose time limit has passed at `now`: the driver ends them
    /// (TIMEOUT) and reports them finished.
    pub fn overdue_jobs(&self, now: Secs) -> Vec<JobId> {
        self.jobs
            .iter()
            .filter(|(_, j)| matches!(j.state, State::Running { end_by, .. } if end_by <= now))
            .map(|(&id, _)| id)
            .collect()
    }

    // ----- the pass -------------------------------------------------------

    /// One scheduling pass over the whole queue. Returns the jobs that start
    /// now; every other pending job gets a reason and, where the policy
    /// reserves for it, an expected start.
    pub fn schedule(&mut self, now: Secs) -> Vec<StartDecision> {
        let mut pass = self.build_timelines(now);
        let queue = self.rank(now);

        // Group the queue into classes first: a class's heap is keyed by
        // earliest fits for the shortest time limit among its jobs, which
        // bounds the earliest fit of every job in it from below.
        let mut elig_index: FastMap<EligKey, usize> = FastMap::default();
        // Jobs with no features, required or excluded nodes: by partition.
        let mut simple_elig: FastMap<PartitionId, usize> = FastMap::default();
        let mut elig_lists: Vec<(Vec<NodeId>, bool)> = Vec::new();
        let mut class_index: FastMap<(usize, Shape, Secs), usize> = FastMap::default();
        let mut classes: Vec<ClassState> = Vec::new();
        let mut plan: Vec<(JobId, usize, usize)> = Vec::with_capacity(queue.len());
        let mut keyed: Vec<(JobId, usize, Shape, Secs)> = Vec::with_capacity(queue.len());
        let mut limits: FastMap<(usize, Shape), Vec<Secs>> = FastMap::default();
        for id in queue {
            let Some(job) = self.jobs.get(&id) else {
                continue;
            };
            let simple =
                job.features.is_empty() && job.required.is_empty() && job.exclude.is_empty();
            let ei = match simple.then(|| simple_elig.get(&job.partition)).flatten() {
                Some(&i) => i,
                None => {
                    let key = job.eligibility();
                    match elig_index.get(&key) {
                        Some(&i) => i,
                        None => {
                            elig_lists.push(self.eligible_nodes(&key));
                            elig_index.insert(key, elig_lists.len() - 1);
                            if simple {
                                simple_elig.insert(job.partition, elig_lists.len() - 1);
                            }
                            elig_lists.len() - 1
                        }
                    }
                }
            };
            let seen = limits.entry((ei, job.shape)).or_default();
            if seen.len() <= MAX_LIMITS_PER_CLASS && !seen.contains(&job.limit) {
                seen.push(job.limit);
            }
            keyed.push((id, ei, job.shape, job.limit));
        }
        // A class per time limit gives exact heap keys; where a shape comes
        // with many limits, one class for all of them (keyed by the
        // shortest) keeps the number of heaps small.
        for (id, ei, shape, limit) in keyed {
            let shared = elig_lists[ei].0.len() > self.cfg.split_limits_up_to_nodes
                || limits
                    .get(&(ei, shape))
                    .is_some_and(|l| l.len() > MAX_LIMITS_PER_CLASS);
            let key = (ei, shape, if shared { 0 } else { limit });
            let ci = *class_index.entry(key).or_insert_with(|| {
                classes.push(ClassState::new(elig_lists[ei].0.len()));
                classes.len() - 1
            });
            classes[ci].add_job(limit);
            plan.push((id, ei, ci));
        }
        for c in &mut classes {
            c.seal();
        }

        let mut decisions = Vec::new();
        // Partitions whose first waiting job has been seen: that one shows
        // `Resources`, the ones behind it `Priority`.
        let mut blocked = vec![false; self.partitions.len()];
        let mut first_blocked =
            |p: PartitionId| !std::mem::replace(&mut blocked[p.0 as usize], true);
        let mut reservations = 0usize;
        for (id, ei, ci) in plan {
            let Some(job) = self.jobs.get(&id) else {
                continue;
            };
            let partition = job.partition;
            if self.cfg.policy == BackfillPolicy::Fcfs && reservations > 0 {
                classes[ci].retire(job.limit);
                // Strict order: nothing passes the first waiting job, so
                // there is nothing to search for.
                let reason = if first_blocked(partition) {
                    PendingReason::Resources
                } else {
                    PendingReason::Priority
                };
                if let Some(j) = self.jobs.get_mut(&id) {
                    j.set_pending(reason, None);
                }
                continue;
            }
            let (eligible, required_ok) = &elig_lists[ei];
            let class = &mut classes[ci];
            let shape = job.shape;
            let limit = job.limit;
            let until = match self.cfg.policy {
                BackfillPolicy::Easy if reservations > 0 => now,
                _ => INFINITE,
            };
            let from = now.max(class.floor(limit));
            let horizon = now.max(class.horizon());
            class.retire(limit);
            let found = if *required_ok {
                let search = Search {
                    timelines: &self.timelines,
                    nodes: &self.nodes,
                    packing: self.cfg.packing,
                    eligible,
                    required: &job.required,
                    shape: &shape,
                    len: limit,
                };
                let found = search.run(&mut pass, class, from, until, horizon);
                if self.cfg.verify_search {
                    let slow = search.scan(&mut pass, from, until).map(|p| p.start);
                    assert_eq!(
                        found.as_ref().map(|p| p.start),
                        slow,
                        "search for job {id} disagrees with a full scan"
                    );
                }
                found
            } else {
                None
            };
            // Keep last pass's placement when it still starts as early as
            // anything new: plans stay stable, and a backfilled job (which
            // was placed around that reservation) cannot reshuffle the
            // reservations behind it.
            let found = match (found, job.planned()) {
                (Some(p), Some(old)) if old.start == p.start => {
                    let keep = old.nodes.iter().all(|pn| {
                        eligible.binary_search(&pn.node).is_ok()
                            && planned_fits(
                                &self.timelines[pn.node.0 as usize],
                                old.start,
                                limit,
                                pn,
                            )
                    });
                    Some(if keep {
                        let nodes = old
                            .nodes
                            .iter()
                            .map(|pn| {
                                (
                                    pn.node,
                                    pn.tasks,
                                    pn.gpus.iter().fold(0u64, |m, &g| m | 1u64 << g),
                                )
                            })
                            .collect();
                        Placement {
                            start: old.start,
                            nodes,
                        }
                    } else {
                        p
                    })
                }
                (found, _) => found,
            };
            match found {
                Some(p) => {
                    class.raise_floor(limit, p.start);
                    match self.commit(&mut pass, id, (shape, limit), p) {
                        Committed::Started(d) => decisions.push(d),
                        Committed::Reserved(plan) => {
                            reservations += 1;
                            let reason = if first_blocked(partition) {
                                PendingReason::Resources
                            } else {
                                PendingReason::Priority
                            };
                            if let Some(j) = self.jobs.get_mut(&id) {
                                j.set_pending(reason, Some(plan));
                            }
                        }
                        Committed::Gone => {}
                    }
                }
                None => {
                    let reason = if until == now {
                        class.raise_floor(limit, now + 1);
                        if first_blocked(partition) {
                            PendingReason::Resources
                        } else {
                            PendingReason::Priority
                        }
                    } else {
                        class.raise_floor(limit, INFINITE);
                        // Never within the plan: either the nodes it needs
                        // are out of service, or jobs without a time limit
                        // hold them.
                        if *required_ok && self.fits_when_empty(eligible, &shape) {
                            PendingReason::Resources
                        } else {
                            PendingReason::ReqNodeNotAvail
                        }
                    };
                    if let Some(j) = self.jobs.get_mut(&id) {
                        j.set_pending(reason, None);
                    }
                }
            }
        }
        decisions
    }

    /// Whether the nodes, were they empty, could hold the job.
    fn fits_when_empty(&self, eligible: &[NodeId], shape: &Shape) -> bool {
        let (mut nodes, mut units) = (0usize, 0u64);
        for n in eligible.iter().filter_map(|&n| self.slot(n)) {
            let k = shape.tasks_fit(n.cap.whole(), &n.cap);
            if k > 0 {
                nodes += 1;
                units += u64::from(k);
            }
        }
        nodes >= shape.nodes_min as usize && (shape.uniform() || units >= u64::from(shape.tasks))
    }

    /// Fresh availability profiles for every node in service.
    fn build_timelines(&mut self, now: Secs) -> PassState {
        let mut releases = BTreeSet::new();
        self.timelines
            .resize_with(self.nodes.len(), Timeline::default);
        for (i, node) in self.nodes.iter().enumerate() {
            let Some(node) = node.as_ref().filter(|n| n.usable()) else {
                continue;
            };
            let tl = &mut self.timelines[i];
            tl.reset(now, node.free);
            for job in &node.jobs {
                let Some(State::Running { end_by, alloc, .. }) =
                    self.jobs.get(job).map(|j| &j.state)
                else {
                    continue;
                };
                let Some(a) = alloc.iter().find(|a| a.node.0 as usize == i) else {
                    continue;
                };
                // A job past its limit still holds its resources until the
                // driver reports it gone.
                let end = (*end_by).max(now + 1);
                let gpus = a.gpus.iter().fold(0u64, |m, &g| m | 1u64 << g);
                tl.release_at(
                    end,
                    Use {
                        cpus: a.cpus.len() as u32,
                        mem: a.memory_mb,
                        gpus,
                    },
                );
                if end < INFINITE {
                    releases.insert(end);
                }
            }
        }
        PassState {
            now,
            releases,
            versions: vec![0; self.nodes.len()],
            candidates: Vec::new(),
            held: Vec::new(),
            peeked: Vec::new(),
        }
    }

    /// The nodes a class of jobs may use now, and whether all the nodes it
    /// requires are among them.
    fn eligible_nodes(&self, key: &EligKey) -> (Vec<NodeId>, bool) {
        let members = self.partition_nodes(key.partition);
        let list: Vec<NodeId> = members
            .iter()
            .copied()
            .filter(|m| !key.exclude.contains(m))
            .filter(|&m| {
                self.slot(m).is_some_and(|n| {
                    n.usable() && key.features.iter().all(|f| n.features.contains(f))
                })
            })
            .collect();
        let required_ok = key.required.iter().all(|r| list.binary_search(r).is_ok());
        (list, required_ok)
    }

    /// Sets reasons on pending jobs that cannot be considered, and returns
    /// the others in priority order.
    fn rank(&mut self, now: Secs) -> Vec<JobId> {
        let (mut total_cpus, mut total_gpus) = (0u64, 0u64);
        for n in self.nodes.iter().flatten() {
            total_cpus += u64::from(n.cap.cpus);
            total_gpus += u64::from(n.gpu_count);
        }
        let max_tier = self
            .partitions
            .iter()
            .map(|p| p.spec.priority_tier)
            .max()
            .unwrap_or(0)
            .max(1);
        let max_qos = self.cfg.qos.iter().map(|q| q.1).max().unwrap_or(0).max(1);
        let mut users: BTreeSet<UserId> = self.fairshare.known_users().collect();
        let mut any_singleton = false;
        for j in self.jobs.values() {
            users.insert(j.user);
            any_singleton |= j.deps.contains(&Dependency::Singleton);
        }
        // The first job (running first, then lowest id) of each user and
        // name, only when some job waits on it.
        let mut first_of_name: HashMap<(UserId, String), JobId> = HashMap::new();
        if any_singleton {
            for (&id, j) in &self.jobs {
                let e = first_of_name.entry((j.user, j.name.clone())).or_insert(id);
                if matches!(j.state, State::Running { .. }) {
                    *e = id;
                }
            }
        }
        let parties = users.len();
        let mut fs_cache: FastMap<(UserId, AccountId), f64> = FastMap::default();
        // One walk in id order decides each pending job: blocked (with a
        // reason) or ranked (with a priority); a second walk writes back.
        let mut order: Vec<(i64, Secs, JobId)> = Vec::new();
        let mut verdicts: Vec<Result<i64, PendingReason>> = Vec::new();
        for (&id, j) in &self.jobs {
            if !j.is_pending() {
                continue;
            }
            let part = &self.partitions[j.partition.0 as usize].spec;
            let blocked = if let Some(h) = j.hold {
                Some(match h {
                    HoldKind::User => PendingReason::JobHeldUser,
                    HoldKind::Admin => PendingReason::JobHeldAdmin,
                })
            } else if j.begin > now {
                Some(PendingReason::BeginTime)
            } else if j.limit > part.max_time.unwrap_or(INFINITE) {
                Some(PendingReason::PartitionTimeLimit)
            } else if j.deps.is_empty() {
                None
            } else {
                self.dependency_reason(id, j, &first_of_name)
            };
            if let Some(reason) = blocked {
                verdicts.push(Err(reason));
                continue;
            }
            let fs = *fs_cache
                .entry((j.user, j.account))
                .or_insert_with(|| self.fairshare.factor(now, j.user, j.account, parties));
            let size = if j.shape.total_gpus() > 0 && total_gpus > 0 {
                f64::from(j.shape.total_gpus()) / total_gpus as f64
            } else {
                f64::from(j.shape.tasks.saturating_mul(j.shape.cpus_per_task))
                    / total_cpus.max(1) as f64
            };
            let p = priority(
                &self.cfg.weights,
                Factors {
                    age: now.saturating_sub(j.submit),
                    size,
                    partition: f64::from(part.priority_tier) / f64::from(max_tier),
                    qos: f64::from(j.qos) / f64::from(max_qos),
                    fairshare: fs,
                    nice: j.nice,
                },
            );
            verdicts.push(Ok(p));
            order.push((p, j.submit, id));
        }
        let mut verdict = verdicts.into_iter();
        for j in self.jobs.values_mut().filter(|j| j.is_pending()) {
            match verdict.next() {
                Some(Ok(p)) => j.priority = p,
                Some(Err(reason)) => j.set_pending(reason, None),
                None => break,
            }
        }
        order.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        order.into_iter().map(|(_, _, id)| id).collect()
    }

    fn dependency_reason(
        &self,
        id: JobId,
        job: &Job,
        first_of_name: &HashMap<(UserId, String), JobId>,
    ) -> Option<PendingReason> {
        let mut waiting = false;
        for d in &job.deps {
            let state = |j: JobId| -> (Option<JobOutcome>, bool) {
                let started = self
                    .jobs
                    .get(&j)
                    .is_some_and(|j| matches!(j.state, State::Running { .. }));
                (self.finished.get(&j).copied(), started)
            };
            let ok = match *d {
                Dependency::After(j) => {
                    let (fin, started) = state(j);
                    Some(fin.is_some() || started || !self.jobs.contains_key(&j))
                }
                Dependency::AfterOk(j) => match state(j).0 {
                    Some(o) if o.succeeded() => Some(true),
                    Some(_) => None,
                    None => Some(false),
                },
                Dependency::AfterNotOk(j) => match state(j).0 {
                    Some(o) if !o.succeeded() => Some(true),
                    Some(_) => None,
                    None => Some(false),
                },
                Dependency::AfterAny(j) => Some(state(j).0.is_some()),
                Dependency::Singleton => Some(
                    first_of_name
                        .get(&(job.user, job.name.clone()))
                        .is_none_or(|&first| first == id),
                ),
            };
            match ok {
                None => return Some(PendingReason::DependencyNeverSatisfied),
                Some(false) => waiting = true,
                Some(true) => {}
            }
        }
        waiting.then_some(PendingReason::Dependency)
    }

    /// Applies a placement: reserves it on the profiles and, if it starts
    /// now, allocates exact CPUs and GPUs and marks the job running.
    fn commit(
        &mut self,
        pass: &mut PassState,
        id: JobId,
        (shape, limit): (Shape, Secs),
        p: Placement,
    ) -> Committed {
        let end = p.start.saturating_add(limit).min(INFINITE);
        let starts_now = p.start == pass.now;
        let mut allocs = Vec::new();
        let mut planned = Vec::new();
        for &(n, k, gpus) in &p.nodes {
            let Some(node) = self.nodes[n.0 as usize].as_mut() else {
                continue;
            };
            let u = shape.usage(k, gpus, &node.cap);
            self.timelines[n.0 as usize].reserve(p.start, end, u);
            pass.versions[n.0 as usize] += 1;
            if starts_now {
                let cpus = node.take_cpus(u.cpus);
                node.free.cpus -= u.cpus;
                node.free.mem -= u.mem;
                node.free.gpus &= !u.gpus;
                node.jobs.push(id);
                allocs.push(NodeAllocation {
                    node: n,
                    tasks: k,
                    cpus,
                    gpus: mask_indices(u.gpus),
                    memory_mb: u.mem,
                });
            } else {
                planned.push(PlannedNode {
                    node: n,
                    tasks: k,
                    cpus: u.cpus,
                    gpus: mask_indices(u.gpus),
                    memory_mb: u.mem,
                });
            }
        }
        if end < INFINITE {
            pass.releases.insert(end);
        }
        if !starts_now {
            return Committed::Reserved(Box::new(Reservation {
                start: p.start,
                end,
                nodes: planned,
            }));
        }
        let Some(job) = self.jobs.get_mut(&id) else {
            return Committed::Gone;
        };
        job.state = State::Running {
            start: p.start,
            end_by: end,
            alloc: allocs.clone(),
        };
        Committed::Started(StartDecision {
            job: id,
            end_by: end,
            nodes: allocs,
        })
    }

    /// Checks the scheduler's bookkeeping: no CPU or GPU held twice, no node
    /// over capacity, exclusive jobs alone, free counts matching the
    /// allocations. Cheap enough for tests and fuzzing, not for every call.
    pub fn audit(&self) -> Result<(), String> {
        for (i, node) in self.nodes.iter().enumerate() {
            let Some(node) = node else { continue };
            let mut cpus_seen: HashSet<u32> = HashSet::new();
            let mut gpus_seen = 0u64;
            let (mut cpus, mut mem) = (0u32, 0u64);
            for job in &node.jobs {
                let j = self
                    .jobs
                    .get(job)
                    .ok_or(format!("node {} lists unknown job {job}", node.name))?;
                let State::Running { alloc, .. } = &j.state else {
                    return Err(format!(
                        "node {} lists job {job} that is not running",
                        node.name
                    ));
                };
                if j.shape.exclusive && node.jobs.len() != 1 {
                    return Err(format!("exclusive job {job} shares node {}", node.name));
                }
                let a = alloc
                    .iter()
                    .find(|a| a.node.0 as usize == i)
                    .ok_or(format!("job {job} has no allocation on {}", node.name))?;
                for &c in &a.cpus {
                    if c >= node.cap.cpus || !cpus_seen.insert(c) {
                        return Err(format!(
                            "CPU {c} of {} given twice or out of range",
                            node.name
                        ));
                    }
                }
                for &g in &a.gpus {
                    let bit = 1u64 << g;
                    if node.cap.gpus & bit == 0 || gpus_seen & bit != 0 {
                        return Err(format!("GPU {g} of {} given twice or missing", node.name));
                    }
                    gpus_seen |= bit;
                }
                cpus += a.cpus.len() as u32;
                mem += a.memory_mb;
            }
            if cpus > node.cap.cpus || mem > node.cap.mem {
                return Err(format!("node {} over capacity", node.name));
            }
            let expect = Free {
                cpus: node.cap.cpus - cpus,
                mem: node.cap.mem - mem,
                gpus: node.cap.gpus & !gpus_seen,
            };
            if node.free != expect {
                return Err(format!(
                    "node {} free {:?} != {:?}",
                    node.name, node.free, expect
                ));
            }
            let free_bits: u32 = node.cpu_free.iter().map(|w| w.count_ones()).sum();
            if free_bits != node.free.cpus {
                return Err(format!(
                    "node {} CPU bitmap disagrees with free count",
                    node.name
                ));
            }
        }
        for (id, j) in &self.jobs {
            if let State::Running { alloc, .. } = &j.state {
                for a in alloc {
                    let on = self.slot(a.node).is_some_and(|n| n.jobs.contains(id));
                    if !on {
                        return Err(format!("running job {id} missing from node {}", a.node));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Whether a node can still give a planned share over `[start, start+len)`.
fn planned_fits(tl: &Timeline, start: Secs, len: Secs, pn: &PlannedNode) -> bool {
    let free = tl.window(start, len);
    let gpus = pn.gpus.iter().fold(0u64, |m, &g| m | 1u64 << g);
    free.cpus >= pn.cpus && free.mem >= pn.memory_mb && free.gpus & gpus == gpus
}

/// One job's search for its earliest start on its class's nodes.
struct Search<'a> {
    timelines: &'a [Timeline],
    nodes: &'a [Option<NodeSlot>],
    packing: Packing,
    eligible: &'a [NodeId],
    required: &'a [NodeId],
    shape: &'a Shape,
    len: Secs,
}

impl Search<'_> {
    fn cap(&self, n: NodeId) -> Option<&Capacity> {
        self.nodes[n.0 as usize].as_ref().map(|s| &s.cap)
    }

    /// Earliest start at or after `t` of at least one task for `len`.
    fn earliest(&self, n: NodeId, t: Secs, len: Secs) -> Secs {
        let Some(cap) = self.cap(n) else {
            return INFINITE;
        };
        let shape = self.shape;
        self.timelines[n.0 as usize].earliest(t, len, |f| shape.tasks_fit(f, cap) > 0)
    }

    /// The node as a candidate at `t`, with its real fit for this job.
    fn candidate(&self, n: NodeId, t: Secs) -> Option<Candidate> {
        let cap = self.cap(n)?;
        let free = self.timelines[n.0 as usize].window(t, self.len);
        let k = self.shape.tasks_fit(free, cap).min(self.shape.tasks);
        let gpus = pick_gpus(free.gpus, self.shape.gpus_for(k, cap), cap, self.packing);
        Some(Candidate {
            node: n,
            k,
            free,
            score: score(self.shape, k, free, gpus, cap, self.packing),
        })
    }

    /// A heap entry for a node whose bound is `bound` (for the class's
    /// key length).
    fn entry(&self, n: NodeId, bound: Secs, key_len: Secs, pos: u32) -> HeapEntry {
        let Some(cap) = self.cap(n) else {
            return HeapEntry::new(bound, (0, 0, 0), pos);
        };
        let free = self.timelines[n.0 as usize].window(bound, key_len);
        let k = self.shape.tasks_fit(free, cap).min(self.shape.tasks);
        HeapEntry::new(
            bound,
            score_bound(self.shape, k, free, cap, self.packing),
            pos,
        )
    }

    /// The most tasks a node could ever hold.
    fn most(&self, n: NodeId) -> u32 {
        self.cap(n).map_or(0, |cap| {
            self.shape.tasks_fit(cap.whole(), cap).min(self.shape.tasks)
        })
    }

    /// Whether nodes that fit can hold the job, by count and tasks (an
    /// upper estimate when `ks` is not given).
    fn enough(&self, have: usize, units: u64, ks: Option<&[Candidate]>) -> bool {
        let shape = self.shape;
        if shape.uniform() {
            return have >= shape.nodes_min as usize;
        }
        if have < shape.nodes_min as usize || units < u64::from(shape.tasks) {
            return false;
        }
        // At most `nodes_max` nodes: the ones holding the most tasks.
        match ks {
            Some(c) if c.len() > shape.nodes_max as usize => {
                let mut k: Vec<u32> = c.iter().map(|c| c.k).collect();
                k.sort_unstable_by(|a, b| b.cmp(a));
                k.iter()
                    .take(shape.nodes_max as usize)
                    .map(|&k| u64::from(k))
                    .sum::<u64>()
                    >= u64::from(shape.tasks)
            }
            _ => true,
        }
    }

    /// The same answer as [`Search::run`] the slow way: every node at every
    /// instant where something comes free.
    fn scan(&self, pass: &mut PassState, from: Secs, until: Secs) -> Option<Placement> {
        let mut times: Vec<Secs> = std::iter::once(from)
            .chain(pass.releases.range(from + 1..).copied())
            .collect();
        times.retain(|&t| t <= until && t < INFINITE);
        for t in times {
            let mut cands: Vec<Candidate> = self
                .eligible
                .iter()
                .filter(|&&n| self.earliest(n, t, self.len) == t)
                .filter_map(|&n| self.candidate(n, t))
                .collect();
            if let Some(chosen) = select(self.shape, self.required, &mut cands) {
                let nodes = chosen.into_iter().map(|(c, k)| (c.node, k, 0)).collect();
                return Some(Placement { start: t, nodes });
            }
        }
        None
    }

    /// The earliest start no earlier than `from` and no later than `until`,
    /// with the nodes and GPUs to use. `horizon` is the earliest start any
    /// job of the class still to come may search from; bounds put back in
    /// the heap hold from there.
    fn run(
        &self,
        pass: &mut PassState,
        class: &mut ClassState,
        from: Secs,
        until: Secs,
        horizon: Secs,
    ) -> Option<Placement> {
        let need_nodes = self.shape.nodes_min as usize;
        if self.eligible.len() < need_nodes {
            return None;
        }
        if !class.built {
            // Every node's earliest fit from the horizon, scored, at once.
            class.built = true;
            let mut entries = Vec::with_capacity(self.eligible.len());
            for (pos, &n) in self.eligible.iter().enumerate() {
                let e = self.earliest(n, horizon, class.key_len);
                class.seen[pos] = pass.versions[n.0 as usize];
                if e < INFINITE {
                    entries.push(self.entry(n, e, class.key_len, pos as u32));
                }
            }
            class.heap = QuadHeap::from_vec(entries);
        }
        let mut held = std::mem::take(&mut pass.held);
        let mut peeked = std::mem::take(&mut pass.peeked);
        held.clear();
        let mut t = from;
        let result = loop {
            if t > until || t >= INFINITE {
                break None;
            }
            pass.candidates.clear();
            let mut units = 0u64;
            // Required nodes must all fit at `t`.
            let mut required_next = t;
            for &r in self.required {
                let e = self.earliest(r, t, self.len);
                if e == t {
                    if let Some(c) = self.candidate(r, t) {
                        units += u64::from(c.k);
                        pass.candidates.push(c);
                    }
                } else {
                    required_next = required_next.max(e);
                }
            }
            if required_next > t {
                t = required_next;
                continue;
            }
            // Pop nodes whose bound says they might fit at `t`, best fit
            // first, until the job has enough of them.
            while !self.enough(pass.candidates.len(), units, Some(&pass.candidates)) {
                let Some(top) = class.heap.peek() else {
                    break;
                };
                let (bound, pos) = (top.bound(), top.pos());
                if bound > t {
                    break;
                }
                let n = self.eligible[pos as usize];
                if self.required.contains(&n) {
                    class.heap.pop();
                    held.push(HeapEntry::new(bound, (0, 0, 0), pos));
                    continue;
                }
                let version = pass.versions[n.0 as usize];
                let exact =
                    bound == t && class.seen[pos as usize] == version && self.len == class.key_len;
                let e = if exact {
                    t
                } else {
                    self.earliest(n, t, self.len)
                };
                class.seen[pos as usize] = version;
                if e == t {
                    let Some(c) = self.candidate(n, t) else {
                        class.heap.pop();
                        continue;
                    };
                    // Keys are optimistic (a node's fit only worsens as the
                    // pass reserves, except where it was never scored), so
                    // a node whose real key is worse goes back in line if
                    // another may now fit better.
                    let real = HeapEntry::new(t, c.score, pos);
                    if t == horizon && top < real {
                        class.heap.replace_top(real);
                        if class.heap.peek().is_some_and(|first| first < real) {
                            continue;
                        }
                    }
                    class.heap.pop();
                    units += u64::from(c.k);
                    pass.candidates.push(c);
                    // Back in line after the search, optimistically scored.
                    let key = if t == horizon {
                        t
                    } else {
                        self.earliest(n, horizon, class.key_len)
                    };
                    held.push(HeapEntry::new(key, (0, 0, 0), pos));
                    continue;
                }
                let key = if self.len == class.key_len && t == horizon {
                    e
                } else {
                    self.earliest(n, horizon, class.key_len)
                };
                if key >= INFINITE {
                    class.heap.pop();
                } else if key > t {
                    // Re-keyed in place: one sift instead of a pop and a push.
                    let fresh = self.entry(n, key, class.key_len, pos);
                    class.heap.replace_top(fresh);
                } else {
                    class.heap.pop();
                    held.push(self.entry(n, key, class.key_len, pos));
                }
            }
            let have = pass.candidates.len();
            if let Some(chosen) = select(self.shape, self.required, &mut pass.candidates) {
                let nodes = chosen
                    .into_iter()
                    .map(|(c, k)| {
                        let gpus = self.cap(c.node).map_or(0, |cap| {
                            pick_gpus(c.free.gpus, self.shape.gpus_for(k, cap), cap, self.packing)
                        });
                        (c.node, k, gpus)
                    })
                    .collect();
                break Some(Placement { start: t, nodes });
            }
            // Not enough at `t`. The next start worth trying: resources must
            // come free somewhere, and enough further nodes must be able to
            // host the job by then.
            class.heap.extend(held.drain(..));
            let mut next = pass
                .releases
                .range(t + 1..)
                .next()
                .copied()
                .unwrap_or(INFINITE);
            let mut more_units = units;
            let mut more_nodes = have;
            let mut bound = None;
            peeked.clear();
            while let Some(entry) = class.heap.pop() {
                peeked.push(entry);
                let n = self.eligible[entry.pos() as usize];
                if self.required.contains(&n) {
                    continue;
                }
                more_nodes += 1;
                more_units += u64::from(self.most(n));
                if self.enough(more_nodes, more_units, None) {
                    bound = Some(entry.bound());
                    break;
                }
            }
            class.heap.extend(peeked.drain(..));
            match bound {
                Some(b) => next = next.max(b),
                None => break None,
            }
            t = next;
        };
        class.heap.extend(held.drain(..));
        pass.held = held;
        pass.peeked = peeked;
        result
    }
}

/// Chooses nodes among those that fit at one instant, or `None` if they
/// are not enough. Returns each chosen node with its task count.
fn select(
    shape: &Shape,
    required: &[NodeId],
    cands: &mut Vec<Candidate>,
) -> Option<Vec<(Candidate, u32)>> {
    let key = |c: &Candidate| (c.score, c.node);
    let mut chosen: Vec<Candidate> = Vec::new();
    for r in required {
        let i = cands.iter().position(|c| c.node == *r)?;
        chosen.push(cands.swap_remove(i));
    }
    if let Some(tpn) = shape.tasks_per_node {
        let n = shape.nodes_min as usize;
        let more = n.checked_sub(chosen.len())?;
        if cands.len() < more {
            return None;
        }
        if more > 0 && more < cands.len() {
            cands.select_nth_unstable_by_key(more - 1, key);
        }
        let mut rest: Vec<Candidate> = cands.drain(..more).collect();
        rest.sort_unstable_by_key(key);
        chosen.extend(rest);
        return Some(chosen.into_iter().map(|c| (c, tpn)).collect());
    }
    let tasks = shape.tasks;
    let (nmin, nmax) = (shape.nodes_min as usize, shape.nodes_max as usize);
    if chosen.is_empty() && nmin <= 1 {
        if let Some(i) = (0..cands.len())
            .filter(|&i| cands[i].k >= tasks)
            .min_by_key(|&i| key(&cands[i]))
        {
            return Some(vec![(cands.swap_remove(i), tasks)]);
        }
    }
    cands.sort_unstable_by_key(|c| (std::cmp::Reverse(c.k), c.score, c.node));
    let mut have: u64 = chosen.iter().map(|c| u64::from(c.k)).sum();
    for c in cands.drain(..) {
        if (have >= u64::from(tasks) && chosen.len() >= nmin) || chosen.len() >= nmax {
            break;
        }
        have += u64::from(c.k);
        chosen.push(c);
    }
    if have < u64::from(tasks) || chosen.len() < nmin || chosen.len() > nmax {
        return None;
    }
    // One task on each node, then fill nodes in order.
    let mut left = tasks.saturating_sub(chosen.len() as u32);
    Some(
        chosen
            .into_iter()
            .map(|c| {
                let extra = (c.k - 1).min(left);
                left -= extra;
                (c, 1 + extra)
            })
            .collect(),
    )
}
