//! A 4-ary min-heap of `Copy + Ord` keys. With 16-byte keys the four
//! children of a slot share one 64-byte cache line, so a sift touches half
//! as many lines as a binary heap's; the scheduler's class heaps are
//! sift-bound.

#[derive(Clone, Debug)]
pub(crate) struct QuadHeap<T> {
    data: Vec<T>,
}

impl<T: Copy + Ord> Default for QuadHeap<T> {
    fn default() -> Self {
        QuadHeap { data: Vec::new() }
    }
}

impl<T: Copy + Ord> QuadHeap<T> {
    /// Builds a heap from any order in linear time.
    pub fn from_vec(data: Vec<T>) -> Self {
        let mut h = QuadHeap { data };
        if h.data.len() > 1 {
            for i in (0..=(h.data.len() - 2) / 4).rev() {
                h.sift_down(i);
            }
        }
        h
    }

    pub fn peek(&self) -> Option<T> {
        self.data.first().copied()
    }

    pub fn push(&mut self, item: T) {
        self.data.push(item);
        let mut i = self.data.len() - 1;
        while i > 0 {
            let parent = (i - 1) / 4;
            if self.data[parent] <= item {
                break;
            }
            self.data[i] = self.data[parent];
            i = parent;
        }
        self.data[i] = item;
    }

    pub fn pop(&mut self) -> Option<T> {
        let last = self.data.pop()?;
        if self.data.is_empty() {
            return Some(last);
        }
        let top = std::mem::replace(&mut self.data[0], last);
        self.sift_down(0);
        Some(top)
    }

    /// Replaces the smallest key (the heap is not empty) and restores
    /// order: one sift instead of a pop and a push.
    pub fn replace_top(&mut self, item: T) {
        debug_assert!(!self.data.is_empty());
        self.data[0] = item;
        self.sift_down(0);
    }

    pub fn extend(&mut self, items: impl IntoIterator<Item = T>) {
        for i in items {
            self.push(i);
        }
    }

    fn sift_down(&mut self, mut i: usize) {
        let n = self.data.len();
        let item = self.data[i];
        loop {
            let first = 4 * i + 1;
            if first >= n {
                break;
            }
            let end = (first + 4).min(n);
            let mut best = first;
            for c in first + 1..end {
                if self.data[c] < self.data[best] {
                    best = c;
                }
            }
            if self.data[best] >= item {
                break;
            }
            self.data[i] = self.data[best];
            i = best;
        }
        self.data[i] = item;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn pops_in_order(xs in proptest::collection::vec(any::<u32>(), 0..200), ys in proptest::collection::vec(any::<u32>(), 0..50), r in any::<u32>()) {
            let mut h = QuadHeap::from_vec(xs.clone());
            h.extend(ys.iter().copied());
            let mut all: Vec<u32> = xs.into_iter().chain(ys).collect();
            if h.peek().is_some() {
                h.replace_top(r);
                all.sort_unstable();
                all[0] = r;
            }
            all.sort_unstable();
            let mut out = Vec::new();
            while let Some(x) = h.pop() {
                out.push(x);
            }
            prop_assert_eq!(out, all);
        }
    }
}
