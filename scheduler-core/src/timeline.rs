//! A node's availability profile: free CPUs, memory and the exact set of
//! free GPUs as a step function of time, from the pass's `now` onwards.
//! Running jobs release their resources at their end; reservations take
//! resources over a window. Only changes that a pass makes go in; it never
//! decides anything.

use crate::model::{Secs, INFINITE};

/// Free resources on one node over some stretch of time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Free {
    pub cpus: u32,
    pub mem: u64,
    /// Bit `i` set: GPU `i` is free.
    pub gpus: u64,
}

impl Free {
    /// The resources free throughout both stretches.
    pub fn meet(self, o: Free) -> Free {
        Free {
            cpus: self.cpus.min(o.cpus),
            mem: self.mem.min(o.mem),
            gpus: self.gpus & o.gpus,
        }
    }

    pub fn gpu_count(self) -> u32 {
        self.gpus.count_ones()
    }
}

/// Resources a job holds on one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Use {
    pub cpus: u32,
    pub mem: u64,
    pub gpus: u64,
}

/// Segments `(start, free)`, sorted by start; each lasts until the next one
/// starts and the last one forever.
#[derive(Clone, Debug, Default)]
pub(crate) struct Timeline {
    segs: Vec<(Secs, Free)>,
}

impl Timeline {
    /// Starts the profile at `origin` with `free` from then on.
    pub fn reset(&mut self, origin: Secs, free: Free) {
        self.segs.clear();
        self.segs.push((origin, free));
    }

    /// Index of the segment in force at `t` (`t` at or after the origin).
    fn seg_at(&self, t: Secs) -> usize {
        self.segs
            .partition_point(|&(s, _)| s <= t)
            .saturating_sub(1)
    }

    /// Ensures a segment starts exactly at `t`; returns its index.
    fn split(&mut self, t: Secs) -> usize {
        let i = self.seg_at(t);
        if self.segs[i].0 == t {
            return i;
        }
        let free = self.segs[i].1;
        self.segs.insert(i + 1, (t, free));
        i + 1
    }

    /// Resources held by a running job come back at `t`.
    pub fn release_at(&mut self, t: Secs, u: Use) {
        if t >= INFINITE {
            return;
        }
        let i = self.split(t);
        for (_, f) in &mut self.segs[i..] {
            f.cpus += u.cpus;
            f.mem += u.mem;
            f.gpus |= u.gpus;
        }
    }

    /// Takes resources over `[start, end)`. The caller has checked they are
    /// free there (see [`Timeline::window`]).
    pub fn reserve(&mut self, start: Secs, end: Secs, u: Use) {
        let i = self.split(start);
        let j = if end >= INFINITE {
            self.segs.len()
        } else {
            self.split(end)
        };
        for (_, f) in &mut self.segs[i..j] {
            debug_assert!(f.cpus >= u.cpus && f.mem >= u.mem && f.gpus & u.gpus == u.gpus);
            f.cpus -= u.cpus;
            f.mem -= u.mem;
            f.gpus &= !u.gpus;
        }
    }

    /// What is free throughout `[start, start + len)`.
    pub fn window(&self, start: Secs, len: Secs) -> Free {
        let end = start.saturating_add(len.max(1));
        let mut i = self.seg_at(start);
        let mut acc = self.segs[i].1;
        while i + 1 < self.segs.len() && self.segs[i + 1].0 < end {
            i += 1;
            acc = acc.meet(self.segs[i].1);
        }
        acc
    }

    /// The earliest `s >= from` such that `fits` holds for what is free
    /// throughout `[s, s + len)`, or [`INFINITE`] if none. `fits` must be
    /// monotone: if it holds for some resources it holds for more.
    pub fn earliest(&self, from: Secs, len: Secs, fits: impl Fn(Free) -> bool) -> Secs {
        let len = len.max(1);
        let mut i = self.seg_at(from);
        'start: while i < self.segs.len() {
            let s = self.segs[i].0.max(from);
            if s >= INFINITE {
                return INFINITE;
            }
            let end = s.saturating_add(len);
            let mut acc = self.segs[i].1;
            if !fits(acc) {
                i += 1;
                continue;
            }
            let mut j = i;
            while j + 1 < self.segs.len() && self.segs[j + 1].0 < end {
                j += 1;
                acc = acc.meet(self.segs[j].1);
                if !fits(acc) {
                    // A segment that cannot host the job alone rules out
                    // every start before it ends; otherwise only the
                    // combination failed, so try the next start.
                    i = if fits(self.segs[j].1) { i + 1 } else { j + 1 };
                    continue 'start;
                }
            }
            return s;
        }
        INFINITE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free(cpus: u32, gpus: u64) -> Free {
        Free { cpus, mem: 0, gpus }
    }

    #[test]
    fn release_and_reserve_shape_the_profile() {
        let mut t = Timeline::default();
        t.reset(0, free(2, 0b0011));
        t.release_at(
            100,
            Use {
                cpus: 6,
                mem: 0,
                gpus: 0b1100,
            },
        );
        assert_eq!(t.window(0, 10), free(2, 0b0011));
        assert_eq!(t.window(50, 100), free(2, 0b0011));
        assert_eq!(t.window(100, 10), free(8, 0b1111));
        t.reserve(
            120,
            200,
            Use {
                cpus: 8,
                mem: 0,
                gpus: 0b0001,
            },
        );
        assert_eq!(t.window(100, 30), free(0, 0b1110));
        assert_eq!(t.window(200, 1), free(8, 0b1111));
    }

    #[test]
    fn earliest_skips_blocked_windows() {
        let mut t = Timeline::default();
        t.reset(0, free(4, 0));
        t.release_at(
            100,
            Use {
                cpus: 4,
                mem: 0,
                gpus: 0,
            },
        );
        // Hole of 4 CPUs in [300, 400).
        t.reserve(
            300,
            400,
            Use {
                cpus: 8,
                mem: 0,
                gpus: 0,
            },
        );
        let need = |n: u32| move |f: Free| f.cpus >= n;
        assert_eq!(t.earliest(0, 50, need(4)), 0);
        assert_eq!(t.earliest(0, 50, need(8)), 100);
        assert_eq!(t.earliest(0, 250, need(8)), 400);
        assert_eq!(t.earliest(0, 200, need(8)), 100);
        assert_eq!(t.earliest(0, 10, need(9)), INFINITE);
    }

    #[test]
    fn earliest_needs_the_same_gpus_throughout() {
        let mut t = Timeline::default();
        t.reset(0, free(8, 0b01));
        // GPU 0 is taken in [10, 20); GPU 1 frees at 5.
        t.release_at(
            5,
            Use {
                cpus: 0,
                mem: 0,
                gpus: 0b10,
            },
        );
        t.reserve(
            10,
            20,
            Use {
                cpus: 0,
                mem: 0,
                gpus: 0b01,
            },
        );
        let two = |f: Free| f.gpu_count() >= 2;
        assert_eq!(t.earliest(0, 3, two), 5);
        assert_eq!(t.earliest(0, 6, two), 20);
        let one = |f: Free| f.gpu_count() >= 1;
        assert_eq!(t.earliest(0, 30, one), 5);
    }
}
