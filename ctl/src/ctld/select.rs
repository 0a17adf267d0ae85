//! Which jobs a query or a cancel selects, as sets: a filter costs O(1)
//! per job however long its lists are, and its size is bounded before any
//! of it is built, so no request can make the controller scan
//! jobs × entries.

use std::collections::{BTreeSet, HashSet};

use super::CtldError;
use corral_proto::msg::{JobFilter, JobId, JobState};

/// The most entries one list of a filter may carry (`squeue -j` with
/// this many ids is far past any script's need).
pub const MAX_FILTER_ENTRIES: usize = 100_000;

/// A checked [`JobFilter`]; `None` fields select all.
#[derive(Debug, Default)]
pub struct Selector {
    pub ids: Option<BTreeSet<JobId>>,
    users: Option<HashSet<u32>>,
    /// Bit `i` for `JobState::ALL[i]`; 0 selects all.
    states: u16,
    partitions: Option<HashSet<String>>,
    names: Option<HashSet<String>>,
    /// Tasks of arrays named by index (`123_7`), until the controller
    /// resolves them ([`crate::ctld::Controller::resolve_arrays`]).
    pub tasks: Vec<(JobId, u32)>,
    /// Of an array's tasks still waiting, only these positions (for an
    /// array named only by some of its tasks).
    pub only: std::collections::HashMap<JobId, Vec<u32>>,
    /// Paging: only jobs with ids above this.
    pub after: JobId,
    /// Views with what jobs asked and their steps.
    pub detail: bool,
    /// Views without the texts few fields show ([`JobFilter::brief`]).
    pub brief: bool,
    /// Views from the head of each spec only ([`JobFilter::bare`]).
    pub bare: bool,
}

fn state_bit(s: JobState) -> u16 {
    let i = JobState::ALL.iter().position(|&x| x == s).unwrap_or(0);
    1 << i
}

fn set<T: std::hash::Hash + Eq>(v: Vec<T>) -> Option<HashSet<T>> {
    (!v.is_empty()).then(|| v.into_iter().collect())
}

impl Selector {
    /// Checks the sizes, then builds the sets (call it before taking the
    /// controller's lock).
    pub fn new(f: JobFilter) -> Result<Selector, CtldError> {
        for (what, n) in [
            ("job ids", f.ids.len()),
            ("users", f.users.len()),
            ("states", f.states.len()),
            ("partitions", f.partitions.len()),
            ("names", f.names.len()),
            ("array tasks", f.tasks.len()),
        ] {
            if n > MAX_FILTER_ENTRIES {
                return Err(CtldError::FilterTooLarge { what, count: n });
            }
        }
        Ok(Selector {
            ids: (!f.ids.is_empty()).then(|| f.ids.into_iter().collect()),
            users: set(f.users),
            states: f.states.into_iter().fold(0, |m, s| m | state_bit(s)),
            partitions: set(f.partitions),
            names: set(f.names),
            tasks: f.tasks,
            detail: f.detail,
            brief: f.brief,
            bare: f.bare,
            only: Default::default(),
            after: f.after,
        })
    }

    pub fn matches<'n>(
        &self,
        id: JobId,
        uid: u32,
        state: JobState,
        partition: &str,
        name: impl FnOnce() -> &'n str,
    ) -> bool {
        self.ids.as_ref().is_none_or(|s| s.contains(&id))
            && self.users.as_ref().is_none_or(|s| s.contains(&uid))
            && (self.states == 0 || self.states & state_bit(state) != 0)
            && self
                .partitions
                .as_ref()
                .is_none_or(|s| s.contains(partition))
            // Last, and only when asked for: a job's name is decoded from
            // its spec (a flood of filters that match nothing stays cheap).
            && self.names.as_ref().is_none_or(|s| s.contains(name()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_selects_all_and_lists_are_sets() {
        let all = Selector::new(JobFilter::default()).unwrap();
        assert!(all.matches(JobId(1), 5, JobState::Failed, "p", || "n"));
        let f = JobFilter {
            users: vec![5; 1000],
            states: vec![JobState::Running; 100_000],
            names: vec!["n".into()],
            ..JobFilter::default()
        };
        let s = Selector::new(f).unwrap();
        assert!(s.matches(JobId(1), 5, JobState::Running, "p", || "n"));
        assert!(!s.matches(JobId(1), 6, JobState::Running, "p", || "n"));
        assert!(!s.matches(JobId(1), 5, JobState::Pending, "p", || "n"));
        assert!(!s.matches(JobId(1), 5, JobState::Running, "p", || "m"));
    }

    #[test]
    fn oversized_filters_are_refused() {
        let f = JobFilter {
            states: vec![JobState::Running; MAX_FILTER_ENTRIES + 1],
            ..JobFilter::default()
        };
        let e = Selector::new(f).unwrap_err().to_string();
        assert!(e.starts_with("Too many states"), "{e}");
    }
}
