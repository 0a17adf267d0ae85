//! One job's search for its earliest start over its class's nodes, and
//! the choice of nodes among those that fit at one instant.

use super::pass::{ClassState, PassState};
use super::NodeSlot;

use crate::model::{NodeId, PlannedNode, Secs, INFINITE};
use crate::placement::{pick_gpus, score, score_bound, Capacity, Packing, Shape};
use crate::quad_heap::QuadHeap;
use crate::timeline::{Free, Timeline};

/// (earliest-fit bound, fit score, position in the eligible list).
///
/// Packed into one integer, most significant first, so comparing entries
/// is one comparison: 62 bits of bound (every time before [`INFINITE`]),
/// 38 of score (GPUs left, groups broken, CPUs left up to 2^24) and 28 of
/// position.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct HeapEntry(u128);

impl HeapEntry {
    pub(super) fn new(bound: Secs, score: (u32, u32, u32), pos: u32) -> Self {
        let score = (u128::from(score.0.min(127)) << 31)
            | (u128::from(score.1.min(127)) << 24)
            | u128::from(score.2.min((1 << 24) - 1));
        HeapEntry(
            (u128::from(bound.min(INFINITE)) << 66)
                | (score << 28)
                | u128::from(pos & ((1 << 28) - 1)),
        )
    }

    pub(super) fn bound(self) -> Secs {
        (self.0 >> 66) as Secs
    }

    pub(super) fn pos(self) -> u32 {
        (self.0 & ((1 << 28) - 1)) as u32
    }
}

pub(super) struct Candidate {
    pub(super) node: NodeId,
    pub(super) k: u32,
    pub(super) free: Free,
    pub(super) score: (u32, u32, u32),
}

pub(super) struct Placement {
    pub(super) start: Secs,
    /// Node, tasks on it, GPUs chosen there.
    pub(super) nodes: Vec<(NodeId, u32, u64)>,
}

/// Whether a node can still give a planned share over `[start, start+len)`.
pub(super) fn planned_fits(tl: &Timeline, start: Secs, len: Secs, pn: &PlannedNode) -> bool {
    let free = tl.window(start, len);
    let gpus = pn.gpus.iter().fold(0u64, |m, &g| m | 1u64 << g);
    free.cpus >= pn.cpus && free.mem >= pn.memory_mb && free.gpus & gpus == gpus
}

/// One job's search for its earliest start on its class's nodes.
pub(super) struct Search<'a> {
    pub(super) timelines: &'a [Timeline],
    pub(super) nodes: &'a [Option<NodeSlot>],
    pub(super) packing: Packing,
    pub(super) eligible: &'a [NodeId],
    pub(super) required: &'a [NodeId],
    pub(super) shape: &'a Shape,
    pub(super) len: Secs,
}

impl Search<'_> {
    pub(super) fn cap(&self, n: NodeId) -> Option<&Capacity> {
        self.nodes[n.0 as usize].as_ref().map(|s| &s.cap)
    }

    /// Earliest start at or after `t` of at least one task for `len`.
    pub(super) fn earliest(&self, n: NodeId, t: Secs, len: Secs) -> Secs {
        let Some(cap) = self.cap(n) else {
            return INFINITE;
        };
        let shape = self.shape;
        self.timelines[n.0 as usize].earliest(t, len, |f| shape.tasks_fit(f, cap) > 0)
    }

    /// The node as a candidate at `t`, with its real fit for this job.
    pub(super) fn candidate(&self, n: NodeId, t: Secs) -> Option<Candidate> {
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
    pub(super) fn entry(&self, n: NodeId, bound: Secs, key_len: Secs, pos: u32) -> HeapEntry {
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
    pub(super) fn most(&self, n: NodeId) -> u32 {
        self.cap(n).map_or(0, |cap| {
            self.shape.tasks_fit(cap.whole(), cap).min(self.shape.tasks)
        })
    }

    /// Whether nodes that fit can hold the job, by count and tasks (an
    /// upper estimate when `ks` is not given).
    pub(super) fn enough(&self, have: usize, units: u64, ks: Option<&[Candidate]>) -> bool {
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
    pub(super) fn scan(&self, pass: &mut PassState, from: Secs, until: Secs) -> Option<Placement> {
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
    pub(super) fn run(
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
pub(super) fn select(
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
    if let Some(tpn) = shape.tasks_per_node.map(std::num::NonZeroU32::get) {
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
    // Whole nodes: the tasks dealt round, one at a time to each node with
    // room, as Slurm lays a job's tasks over whole nodes (checked on
    // 22.05: `-N2 --exclusive -n4` on 4-CPU nodes runs 2 + 2).
    if shape.exclusive {
        let mut counts = vec![1u32; chosen.len()];
        let mut left = tasks.saturating_sub(chosen.len() as u32);
        while left > 0 {
            let before = left;
            for (n, c) in counts.iter_mut().zip(&chosen) {
                if left > 0 && *n < c.k {
                    *n += 1;
                    left -= 1;
                }
            }
            if left == before {
                break;
            }
        }
        return Some(chosen.into_iter().zip(counts).collect());
    }
    // Otherwise one task on each node, then fill nodes in order (the
    // CPUs follow the tasks: `-N2 -n4` takes 3 + 1, as Slurm's).
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
