//! The scheduling pass: rank the queue, group it into classes, search
//! each job's earliest start, and commit starts and reservations.

use super::array::ArraySlots;
use super::ranking::Blocked;
use super::search::{planned_fits, Candidate, HeapEntry, Placement, Search};
use super::{BackfillPolicy, EligKey, Scheduler, State};
use std::collections::BTreeSet;

use crate::hash::FastMap;
use crate::model::{
    JobId, NodeAllocation, NodeId, PartitionId, PendingReason, PlannedNode, Reservation, Secs,
    StartDecision, INFINITE,
};
use crate::placement::{mask_indices, Shape};
use crate::quad_heap::QuadHeap;
use crate::timeline::{Timeline, Use};

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
pub(super) struct ClassState {
    /// The time limit the heap's bounds were computed for.
    pub(super) key_len: Secs,
    /// The class's distinct time limits, ascending, and how many of its
    /// jobs with each are still to be placed this pass.
    pub(super) lens: Vec<Secs>,
    pub(super) remaining: Vec<u32>,
    /// Prefix maximum over `lens` of the starts given so far: a job with
    /// limit `lens[i]` cannot start before the max over `..=i`.
    pub(super) floors: Vec<Secs>,
    pub(super) heap: QuadHeap<HeapEntry>,
    /// Whether the heap holds every eligible node yet (built on first use).
    pub(super) built: bool,
    /// Per eligible position: the node's version when its bound was exact.
    pub(super) seen: Vec<u32>,
}

/// A shape whose jobs come with more distinct time limits than this in
/// one pass shares one heap among all of them.
pub(super) const MAX_LIMITS_PER_CLASS: usize = 16;

impl ClassState {
    pub(super) fn new(nodes: usize) -> Self {
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
    pub(super) fn add_job(&mut self, len: Secs) {
        self.key_len = self.key_len.min(len);
        self.lens.push(len);
    }

    /// Turns the collected limits into the per-limit tables.
    pub(super) fn seal(&mut self) {
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

    pub(super) fn index(&self, len: Secs) -> usize {
        self.lens.partition_point(|&l| l < len)
    }

    /// No job of this class with limit `len` starts before this.
    pub(super) fn floor(&self, len: Secs) -> Secs {
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
    pub(super) fn raise_floor(&mut self, len: Secs, start: Secs) {
        let mut i = self.index(len) + 1;
        while i < self.floors.len() {
            self.floors[i] = self.floors[i].max(start);
            i += i & i.wrapping_neg();
        }
    }

    /// The earliest any job of the class still to be placed (this one
    /// included) may start: heap bounds must hold from here on.
    pub(super) fn horizon(&self) -> Secs {
        match self.remaining.iter().position(|&c| c > 0) {
            Some(i) => self.floor(self.lens[i]),
            None => INFINITE,
        }
    }

    /// This job is done with.
    pub(super) fn retire(&mut self, len: Secs) {
        let i = self.index(len);
        self.remaining[i] = self.remaining[i].saturating_sub(1);
    }
}

pub(super) enum Committed {
    Started(StartDecision),
    Reserved(Box<Reservation>),
    Gone,
}

/// The ranked queue grouped into classes: each job with its eligible node
/// list and its class, in queue order.
struct Classes {
    /// Eligible nodes, and whether the required nodes are among them.
    eligible: Vec<(Vec<NodeId>, bool)>,
    classes: Vec<ClassState>,
    /// (job, index into `eligible`, index into `classes`).
    plan: Vec<(JobId, usize, usize)>,
}

/// Per-pass state that outlives one job's search.
pub(super) struct PassState {
    pub(super) now: Secs,
    /// Start of every segment boundary where resources come free.
    pub(super) releases: BTreeSet<Secs>,
    pub(super) versions: Vec<u32>,
    pub(super) candidates: Vec<Candidate>,
    /// Heap entries a search has taken out, and will put back.
    pub(super) held: Vec<HeapEntry>,
    pub(super) peeked: Vec<HeapEntry>,
}

impl Scheduler {
    // ----- the pass -------------------------------------------------------

    /// One scheduling pass over the whole queue. Returns the jobs that start
    /// now; every other pending job gets a reason and, where the policy
    /// reserves for it, an expected start.
    pub fn schedule(&mut self, now: Secs) -> Vec<StartDecision> {
        self.prune_delayed();
        let mut pass = self.build_timelines(now);
        let queue = self.rank(now);
        let Classes {
            eligible: elig_lists,
            mut classes,
            plan,
        } = self.group_classes(queue);

        let mut decisions = Vec::new();
        let mut blocked = Blocked::new(self.partitions.len());
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
                let reason = blocked.reason(partition);
                if let Some(j) = self.jobs.get_mut(&id) {
                    j.set_pending(reason, None);
                }
                continue;
            }
            let (eligible, required_ok) = &elig_lists[ei];
            let class = &mut classes[ci];
            let shape = job.shape;
            let limit = job.limit;
            // An array's entry is searched again after each task it
            // starts, and under conservative backfill after each task it
            // reserves for, up to `array_reservations`: each of its tasks
            // is planned as a job of its own would be. Its `%N` is kept
            // with `slots`, the ends of its tasks running or planned.
            let mut slots = self.array_slots(id, now);
            let mut planned = 0u32;
            // Last pass's plans, one per task in line: kept where they
            // still hold, as any job's is.
            let old_later: Vec<Reservation> = match slots {
                Some(_) => self.take_later_plans(id),
                None => Vec::new(),
            };
            let mut new_plans: Vec<Reservation> = Vec::new();
            let mut placed = 0usize;
            let reason = loop {
                let Some(job) = self.jobs.get(&id) else {
                    break None;
                };
                let until = match self.cfg.policy {
                    BackfillPolicy::Easy if reservations > 0 => now,
                    _ => INFINITE,
                };
                // At its %N, the next task starts when one of its own
                // ends; a start so found says nothing of the class's.
                let hold = slots.as_mut().and_then(ArraySlots::next_hold);
                if hold == Some(INFINITE) {
                    break (planned == 0).then_some(PendingReason::JobArrayTaskLimit);
                }
                let from = now.max(class.floor(limit)).max(hold.unwrap_or(0));
                let horizon = now.max(class.horizon());
                let found = if *required_ok {
                    let search = Search {
                        timelines: &self.timelines,
                        nodes: &self.nodes,
                        packing: self.cfg.packing,
                        eligible,
                        required: &job.node_ask().required,
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
                let old = match placed {
                    0 => job.planned(),
                    n => old_later.get(n - 1),
                };
                let found =
                    found.map(|p| keep_previous_plan(&self.timelines, old, eligible, limit, p));
                placed += 1;
                let Some(p) = found else {
                    if planned > 0 {
                        break None;
                    }
                    if hold.is_some() {
                        break Some(PendingReason::JobArrayTaskLimit);
                    }
                    if until == now {
                        class.raise_floor(limit, now + 1);
                        break Some(blocked.reason(partition));
                    }
                    class.raise_floor(limit, INFINITE);
                    // Never within the plan: either the nodes it needs
                    // are out of service, or jobs without a time limit
                    // hold them.
                    break if *required_ok && self.fits_when_empty(eligible, &shape) {
                        Some(PendingReason::Resources)
                    } else {
                        Some(PendingReason::ReqNodeNotAvail)
                    };
                };
                if hold.is_none() {
                    class.raise_floor(limit, p.start);
                }
                if let Some(sl) = slots.as_mut() {
                    sl.taken(p.start.saturating_add(limit).min(INFINITE));
                }
                // A task of an array starts as a job of its own.
                let entry = slots.is_some() && self.jobs.contains_key(&id);
                let target = match p.start == now && entry {
                    true => self.split_task(id).unwrap_or(id),
                    false => id,
                };
                match self.commit(&mut pass, target, (shape, limit), p) {
                    Committed::Started(d) => {
                        decisions.push(d);
                        if target != id && self.jobs.contains_key(&id) {
                            continue;
                        }
                        break None;
                    }
                    Committed::Reserved(plan) => {
                        reservations += 1;
                        planned += 1;
                        if planned == 1 {
                            // The entry shows its next task's plan.
                            let reason = match hold {
                                Some(_) => PendingReason::JobArrayTaskLimit,
                                None => blocked.reason(partition),
                            };
                            if let Some(j) = self.jobs.get_mut(&id) {
                                j.set_pending(reason, Some(plan));
                            }
                        } else {
                            new_plans.push(*plan);
                        }
                        let more = slots.is_some()
                            && self.cfg.policy == BackfillPolicy::Conservative
                            && planned < self.cfg.array_reservations
                            && self
                                .jobs
                                .get(&id)
                                .and_then(|j| j.array.as_deref())
                                .is_some_and(|r| planned < r.waiting_count());
                        if more {
                            continue;
                        }
                        break None;
                    }
                    Committed::Gone => break None,
                }
            };
            class.retire(limit);
            if slots.is_some() {
                self.keep_later_plans(id, new_plans);
            }
            let Some(reason) = reason else {
                continue;
            };
            if let Some(j) = self.jobs.get_mut(&id) {
                j.set_pending(reason, None);
            }
        }
        decisions
    }

    /// Groups the ranked queue into classes. A class's heap is keyed by
    /// earliest fits for the shortest time limit among its jobs, which
    /// bounds the earliest fit of every job in it from below. Returns the
    /// plan in queue order: each job with its eligible list and class.
    fn group_classes(&self, queue: Vec<JobId>) -> Classes {
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
            let simple = job.node_ask().is_any();
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
        Classes {
            eligible: elig_lists,
            classes,
            plan,
        }
    }

    /// Whether the nodes, were they empty, could hold the job.
    pub(super) fn fits_when_empty(&self, eligible: &[NodeId], shape: &Shape) -> bool {
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
    pub(super) fn build_timelines(&mut self, now: Secs) -> PassState {
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
                let Some(State::Running(run)) = self.jobs.get(job).map(|j| &j.state) else {
                    continue;
                };
                let (end_by, alloc) = (run.end_by, &run.alloc);
                let Some(a) = alloc.iter().find(|a| a.node.0 as usize == i) else {
                    continue;
                };
                // A job past its limit still holds its resources until the
                // driver reports it gone.
                let end = end_by.max(now + 1);
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
    pub(super) fn eligible_nodes(&self, key: &EligKey) -> (Vec<NodeId>, bool) {
        let (partition, key) = (key.partition, &key.nodes);
        let members = self.partition_nodes(partition);
        let list: Vec<NodeId> = members
            .iter()
            .copied()
            .filter(|m| !key.exclude.contains(m))
            .filter(|&m| {
                self.slot(m).is_some_and(|n| {
                    n.usable()
                        && n.gpus_of(key.gpu_type.as_deref())
                        && crate::model::features_met(&n.features, &key.features, key.features_any)
                })
            })
            .collect();
        let required_ok = key.required.iter().all(|r| list.binary_search(r).is_ok());
        (list, required_ok)
    }

    /// Applies a placement: reserves it on the profiles and, if it starts
    /// now, allocates exact CPUs and GPUs and marks the job running.
    pub(super) fn commit(
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
        job.state = State::running(p.start, end, allocs.clone().into());
        let array = job.running_task_of();
        if let Some(a) = array {
            self.array_task_started(a);
        }
        Committed::Started(StartDecision {
            job: id,
            array,
            end_by: end,
            nodes: allocs,
        })
    }
}

/// Keeps last pass's placement when it still starts as early as what
/// the search found: plans stay stable, and a backfilled job (which was
/// placed around that reservation) cannot reshuffle the reservations
/// behind it.
fn keep_previous_plan(
    timelines: &[Timeline],
    old: Option<&Reservation>,
    eligible: &[NodeId],
    limit: Secs,
    found: Placement,
) -> Placement {
    let Some(old) = old else {
        return found;
    };
    let keep = old.start == found.start
        && old.nodes.iter().all(|pn| {
            eligible.binary_search(&pn.node).is_ok()
                && planned_fits(&timelines[pn.node.0 as usize], old.start, limit, pn)
        });
    if !keep {
        return found;
    }
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
}
