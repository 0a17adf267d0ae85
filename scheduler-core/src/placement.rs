//! Placement: which nodes, how many tasks on each, which GPUs. Reads as
//! filter, then score: [`Shape::tasks_fit`] filters a node by what is free
//! on it over the job's window; [`score`] ranks the nodes that pass;
//! [`pick_gpus`] chooses the exact GPUs on a chosen node. Pure functions;
//! the search over time lives in the scheduler.

use crate::timeline::{Free, Use};
use std::num::NonZeroU32;

/// How nodes and GPUs are chosen among those that fit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Packing {
    /// Never strand GPUs (leave them free on a node short of CPUs or memory
    /// to use them) where another node would do; then fewest free GPUs
    /// left on the node, fewest whole topology groups broken, fewest free
    /// CPUs left: keeps whole nodes and whole groups free for the jobs
    /// that need them.
    #[default]
    BestFit,
    /// The lowest-numbered node that fits, its lowest-numbered GPUs.
    FirstFit,
}

/// What a node can hold at most.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Capacity {
    pub cpus: u32,
    pub mem: u64,
    /// Bit `i`: the node has GPU `i`.
    pub gpus: u64,
    /// One mask per topology group.
    pub groups: Vec<u64>,
}

impl Capacity {
    pub fn whole(&self) -> Free {
        Free {
            cpus: self.cpus,
            mem: self.mem,
            gpus: self.gpus,
        }
    }
}

/// A validated job request reduced to what placement needs: how many
/// nodes, tasks and resources per task and per node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Shape {
    pub nodes_min: u32,
    pub nodes_max: u32,
    pub tasks: u32,
    /// `Some(k)`: every node runs exactly `k` tasks. `None`: tasks spread
    /// over `nodes_min..=nodes_max` nodes, at least one on each. (Never
    /// zero, which keeps the option in four bytes: the shape in 48, every
    /// queued job 8 bytes smaller.)
    pub tasks_per_node: Option<NonZeroU32>,
    pub cpus_per_task: u32,
    pub gpus_per_task: u32,
    pub gpus_per_node: u32,
    pub mem_per_node: u64,
    /// Memory each task adds on its node (`--mem-per-cpu` times its CPUs,
    /// `--mem-per-gpu` times its GPUs).
    pub mem_per_task: u64,
    /// `--mem=0`: each node's whole memory.
    pub mem_whole: bool,
    /// No memory asked, and the default is a share: each task holds its
    /// node's memory in proportion to its CPUs ([`Shape::task_mem`]).
    pub mem_share: bool,
    pub exclusive: bool,
}

impl Shape {
    /// The most tasks of this job that `free` can host (0: the node does
    /// not fit). Monotone in `free`, as the time search needs.
    pub fn tasks_fit(&self, free: Free, cap: &Capacity) -> u32 {
        let avail = if self.exclusive {
            if free != cap.whole() {
                return 0;
            }
            free
        } else {
            free
        };
        if avail.mem < self.mem_per_node || (self.mem_whole && avail.mem < cap.mem) {
            return 0;
        }
        let by_mem = match self.task_mem(cap) {
            0 => u32::MAX,
            m => ((avail.mem - self.mem_per_node) / m).min(u64::from(u32::MAX)) as u32,
        };
        let gpus = avail.gpu_count();
        if gpus < self.gpus_per_node {
            return 0;
        }
        let by_cpu = avail.cpus / self.cpus_per_task.max(1);
        let by_gpu = match self.gpus_per_task {
            0 => u32::MAX,
            g => (gpus - self.gpus_per_node) / g,
        };
        let most = self.tasks_per_node.map_or(self.tasks, NonZeroU32::get);
        let k = by_cpu.min(by_gpu).min(by_mem).min(most);
        match self.tasks_per_node {
            Some(exact) if k < exact.get() => 0,
            _ => k,
        }
    }

    /// Memory one task adds on a node of `cap`: what it asked, or its
    /// CPUs' share of the node's (rounded down, so shares never add up
    /// to more than the node has).
    pub fn task_mem(&self, cap: &Capacity) -> u64 {
        if self.mem_share {
            cap.mem.saturating_mul(u64::from(self.cpus_per_task)) / u64::from(cap.cpus.max(1))
        } else {
            self.mem_per_task
        }
    }

    /// GPUs needed on a node that runs `k` tasks.
    pub fn gpus_for(&self, k: u32, cap: &Capacity) -> u32 {
        if self.exclusive {
            cap.gpus.count_ones()
        } else {
            self.gpus_per_node + k * self.gpus_per_task
        }
    }

    /// What `k` tasks hold on a node, GPUs given by `gpus`.
    pub fn usage(&self, k: u32, gpus: u64, cap: &Capacity) -> Use {
        if self.exclusive {
            Use {
                cpus: cap.cpus,
                mem: cap.mem,
                gpus: cap.gpus,
            }
        } else {
            Use {
                cpus: k * self.cpus_per_task,
                mem: if self.mem_whole {
                    cap.mem
                } else {
                    self.mem_per_node
                        .saturating_add(u64::from(k).saturating_mul(self.task_mem(cap)))
                },
                gpus,
            }
        }
    }

    /// Whether every node runs the same number of tasks.
    pub fn uniform(&self) -> bool {
        self.tasks_per_node.is_some()
    }

    /// GPUs the whole job holds when it runs `tasks` tasks (for size
    /// factors and usage).
    pub fn total_gpus(&self) -> u32 {
        self.gpus_per_node * self.nodes_min + self.gpus_per_task * self.tasks
    }
}

fn lowest_bits(mask: u64, n: u32) -> u64 {
    let mut out = 0u64;
    let mut m = mask;
    for _ in 0..n {
        if m == 0 {
            break;
        }
        let bit = m & m.wrapping_neg();
        out |= bit;
        m &= !bit;
    }
    out
}

/// Chooses `n` GPUs out of `free` (which has at least `n`). Best fit takes
/// them from the fullest topology group that can hold all `n`, or else from
/// as few groups as possible; first fit takes the lowest indices.
pub(crate) fn pick_gpus(free: u64, n: u32, cap: &Capacity, packing: Packing) -> u64 {
    debug_assert!(free.count_ones() >= n);
    if n == 0 {
        return 0;
    }
    if packing == Packing::FirstFit || cap.groups.len() <= 1 {
        return lowest_bits(free, n);
    }
    let best_single = cap
        .groups
        .iter()
        .map(|&g| free & g)
        .filter(|m| m.count_ones() >= n)
        .min_by_key(|m| m.count_ones());
    if let Some(m) = best_single {
        return lowest_bits(m, n);
    }
    // Whole groups, most free first (ties in group order), until enough.
    let mut out = 0u64;
    let mut left = n;
    let mut used = 0u64; // bit per group index already taken
    while left > 0 {
        let best = cap
            .groups
            .iter()
            .enumerate()
            .filter(|(i, _)| used & (1u64 << i) == 0)
            .map(|(i, &g)| (i, free & g))
            .max_by(|a, b| a.1.count_ones().cmp(&b.1.count_ones()).then(b.0.cmp(&a.0)));
        let Some((i, m)) = best.filter(|(_, m)| *m != 0) else {
            break;
        };
        used |= 1u64 << i;
        let take = lowest_bits(m, left);
        left -= take.count_ones();
        out |= take;
    }
    out
}

/// Whole topology groups that were free and that `taken` splits.
fn groups_broken(free: u64, taken: u64, cap: &Capacity) -> u32 {
    cap.groups
        .iter()
        .filter(|&&g| free & g == g && taken & g != 0 && taken & g != g)
        .count() as u32
}

/// Rank of a node for a job (lower is better). `free` is what is free over
/// the job's window; `gpus` the GPUs [`pick_gpus`] chose there.
pub(crate) fn score(
    shape: &Shape,
    k: u32,
    free: Free,
    gpus: u64,
    cap: &Capacity,
    packing: Packing,
) -> (u32, u32, u32) {
    let mut s = score_bound(shape, k, free, cap, packing);
    if packing == Packing::BestFit && shape.gpus_for(k, cap) > 0 {
        // The one thing the bound leaves out needs the actual GPUs.
        let used = shape.usage(k, gpus, cap);
        s.1 = groups_broken(free.gpus, used.gpus, cap);
    }
    s
}

/// A penalty for leaving GPUs free on a node without the CPUs or memory to
/// use them (less than a quarter of the node's per-GPU share): such GPUs
/// are stranded, so placements that do it rank after every one that does
/// not.
fn stranding(cap: &Capacity, gpus_left: u32, cpus_left: u32, mem_left: u64) -> u32 {
    let gpus = u64::from(cap.gpus.count_ones());
    if gpus_left == 0 || gpus == 0 {
        return 0;
    }
    let left = u64::from(gpus_left);
    let short_cpus = u64::from(cpus_left) * gpus * 4 < left * u64::from(cap.cpus);
    let short_mem = cap.mem > 0 && mem_left * gpus * 4 < left * cap.mem;
    if short_cpus || short_mem {
        64
    } else {
        0
    }
}

/// A lower bound of [`score`] that needs no GPU choice: exact but for the
/// topology groups broken, counted as none. Heap keys use it, so they stay
/// optimistic and the real score is taken when a node comes up.
pub(crate) fn score_bound(
    shape: &Shape,
    k: u32,
    free: Free,
    cap: &Capacity,
    packing: Packing,
) -> (u32, u32, u32) {
    if packing == Packing::FirstFit {
        return (0, 0, 0);
    }
    let used = shape.usage(k, 0, cap);
    let cpus_left = free.cpus.saturating_sub(used.cpus);
    let need = shape.gpus_for(k, cap);
    let gpus_left = free.gpu_count().saturating_sub(need);
    let mem_left = free.mem.saturating_sub(used.mem);
    let primary = gpus_left + stranding(cap, gpus_left, cpus_left, mem_left);
    if need == 0 {
        // CPU-only work goes where GPUs are scarce, so that free GPUs keep
        // the CPUs they need.
        (primary, cpus_left, 0)
    } else {
        (primary, 0, cpus_left)
    }
}

/// Indices of the set bits, ascending.
pub(crate) fn mask_indices(mask: u64) -> Vec<u32> {
    let mut out = Vec::with_capacity(mask.count_ones() as usize);
    let mut m = mask;
    while m != 0 {
        out.push(m.trailing_zeros());
        m &= m - 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eight_gpu_node() -> Capacity {
        Capacity {
            cpus: 64,
            mem: 512_000,
            gpus: 0xff,
            groups: vec![0x0f, 0xf0],
        }
    }

    fn shape(gpus_per_node: u32) -> Shape {
        Shape {
            nodes_min: 1,
            nodes_max: 1,
            tasks: 1,
            tasks_per_node: NonZeroU32::new(1),
            cpus_per_task: 1,
            gpus_per_task: 0,
            gpus_per_node,
            mem_per_node: 0,
            mem_per_task: 0,
            mem_share: false,
            mem_whole: false,
            exclusive: false,
        }
    }

    /// Without a memory ask, a task holds its CPUs' share of the node's
    /// memory: the fit stops where memory runs out, and shares never
    /// add up to more than the node has.
    #[test]
    fn a_share_of_the_node_is_priced_by_the_tasks_cpus() {
        let cap = eight_gpu_node();
        let mut s = shape(0);
        s.tasks = 64;
        s.tasks_per_node = None;
        s.cpus_per_task = 4;
        s.mem_share = true;
        assert_eq!(s.task_mem(&cap), 32_000);
        let whole = cap.whole();
        assert_eq!(s.tasks_fit(whole, &cap), 16, "all the CPUs' worth");
        let short = Free {
            mem: 100_000,
            ..whole
        };
        assert_eq!(s.tasks_fit(short, &cap), 3, "memory binds first");
        assert_eq!(s.usage(3, 0, &cap).mem, 96_000);
        let odd = Capacity {
            cpus: 3,
            mem: 1000,
            gpus: 0,
            groups: vec![],
        };
        s.cpus_per_task = 1;
        assert_eq!(s.task_mem(&odd) * 3, 999, "rounded down");
        assert_eq!(s.tasks_fit(odd.whole(), &odd), 3);
    }

    #[test]
    fn gpus_come_from_the_fullest_group_that_holds_them() {
        let cap = eight_gpu_node();
        // Group 0 has GPUs 2,3 free; group 1 is all free.
        let free = 0b1111_1100;
        assert_eq!(pick_gpus(free, 2, &cap, Packing::BestFit), 0b0000_1100);
        assert_eq!(pick_gpus(free, 3, &cap, Packing::BestFit), 0b0111_0000);
        assert_eq!(pick_gpus(free, 6, &cap, Packing::BestFit), 0b1111_1100);
        assert_eq!(pick_gpus(free, 3, &cap, Packing::FirstFit), 0b0001_1100);
    }

    #[test]
    fn filter_counts_tasks_and_respects_exclusive() {
        let cap = eight_gpu_node();
        let whole = cap.whole();
        let per_task = Shape {
            tasks: 8,
            tasks_per_node: None,
            gpus_per_task: 2,
            gpus_per_node: 0,
            ..shape(0)
        };
        assert_eq!(per_task.tasks_fit(whole, &cap), 4);
        let ex = Shape {
            exclusive: true,
            ..shape(0)
        };
        assert_eq!(ex.tasks_fit(whole, &cap), 1);
        let busy = Free { cpus: 63, ..whole };
        assert_eq!(ex.tasks_fit(busy, &cap), 0);
        assert_eq!(shape(9).tasks_fit(whole, &cap), 0);
    }

    #[test]
    fn best_fit_prefers_the_fuller_node() {
        let cap = eight_gpu_node();
        let s = shape(2);
        let empty = cap.whole();
        let half = Free {
            gpus: 0xf0,
            ..empty
        };
        let a = score(
            &s,
            1,
            empty,
            pick_gpus(empty.gpus, 2, &cap, Packing::BestFit),
            &cap,
            Packing::BestFit,
        );
        let b = score(
            &s,
            1,
            half,
            pick_gpus(half.gpus, 2, &cap, Packing::BestFit),
            &cap,
            Packing::BestFit,
        );
        assert!(b < a, "{b:?} < {a:?}");
    }
}
