//! Ranking and pending reasons: which jobs a pass considers, in what
//! order, and why each waiting job waits.

use super::{Job, Scheduler, State};
use std::collections::{BTreeSet, HashMap};

use crate::hash::FastMap;
use crate::model::{
    AccountId, Dependency, HoldKind, JobId, JobOutcome, PartitionId, PendingReason, Secs, UserId,
    INFINITE,
};
use crate::priority::{priority, Factors};

impl Scheduler {
    /// Sets reasons on pending jobs that cannot be considered, and returns
    /// the others in priority order.
    pub(super) fn rank(&mut self, now: Secs) -> Vec<JobId> {
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
        users.extend(self.held_users.keys().copied());
        let mut any_singleton = false;
        // One walk over the jobs not held: each one's user, whether any
        // waits as a singleton, and the pending ones to look at again.
        // Held jobs are never read: their users are counted apart and
        // their reason was set when they were held.
        let mut candidates: Vec<JobId> = Vec::new();
        let mut last_user = None;
        for id in &self.unheld {
            let Some(j) = self.jobs.get(id) else { continue };
            // Jobs come in runs of one user's: the set sees each run once.
            if last_user != Some(j.user) {
                users.insert(j.user);
                last_user = Some(j.user);
            }
            any_singleton |= j.deps().contains(&Dependency::Singleton);
            if j.is_pending() {
                candidates.push(*id);
            }
        }
        // The first job (running first, then lowest id) of each user and
        // name, only when some job waits on it.
        let mut first_of_name: HashMap<(UserId, &str), JobId> = HashMap::new();
        if any_singleton {
            for (&id, j) in &self.jobs {
                let e = first_of_name.entry((j.user, &*j.name)).or_insert(id);
                if matches!(j.state, State::Running(_)) {
                    *e = id;
                }
            }
        }
        let parties = users.len();
        self.fair_parties = parties;
        let mut fs_cache: FastMap<(UserId, AccountId), f64> = FastMap::default();
        // Each candidate is blocked (with a reason) or ranked (with a
        // priority); a second look writes back.
        let mut order: Vec<(i64, Secs, JobId)> = Vec::new();
        // A job blocked by its begin time, a dependency or a limit still
        // has its priority, as Slurm's (only a held one reads 0).
        let mut verdicts: Vec<(i64, Option<PendingReason>)> = Vec::with_capacity(candidates.len());
        for &id in &candidates {
            let j = &self.jobs[&id];
            let part = &self.partitions[j.partition.0 as usize].spec;
            // A held job is in `held` and never a candidate; were the
            // index ever wrong, it still would not be ranked.
            let blocked = if let Some(h) = j.hold {
                Some(match h {
                    HoldKind::User => PendingReason::JobHeldUser,
                    HoldKind::Admin => PendingReason::JobHeldAdmin,
                })
            } else if j.begin > now {
                Some(PendingReason::BeginTime)
            } else if j.limit > part.max_time.unwrap_or(INFINITE) {
                Some(PendingReason::PartitionTimeLimit)
            } else if j.deps().is_empty() {
                None
            } else {
                self.dependency_reason(id, j, &first_of_name)
            };
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
            verdicts.push((p, blocked));
            if blocked.is_none() {
                order.push((p, j.submit, id));
            }
        }
        for (id, (p, blocked)) in candidates.into_iter().zip(verdicts) {
            if let Some(j) = self.jobs.get_mut(&id) {
                j.priority = p;
                if let Some(reason) = blocked {
                    j.set_pending(reason, None);
                }
            }
        }
        order.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        order.into_iter().map(|(_, _, id)| id).collect()
    }

    pub(super) fn dependency_reason(
        &self,
        id: JobId,
        job: &Job,
        first_of_name: &HashMap<(UserId, &str), JobId>,
    ) -> Option<PendingReason> {
        let (mut waiting, mut never, mut met) = (false, false, false);
        for d in job.deps() {
            // A job the scheduler no longer holds and never saw end was
            // a task of an array cancelled while it waited.
            let state = |j: JobId| -> (Option<JobOutcome>, bool) {
                let job = self.jobs.get(&j);
                let started = job.is_some_and(|j| matches!(j.state, State::Running(_)));
                let fin = self.finished.get(&j).copied().or_else(|| {
                    (job.is_none() && !self.task_waiting(j)).then_some(JobOutcome::Cancelled)
                });
                (fin, started)
            };
            let target = match *d {
                Dependency::After(j)
                | Dependency::AfterOk(j)
                | Dependency::AfterNotOk(j)
                | Dependency::AfterAny(j) => Some(j),
                Dependency::Singleton => None,
            };
            let whole = target.and_then(|a| self.array_dependency(a, d));
            let ok = match *d {
                _ if whole.is_some() => whole.flatten(),
                Dependency::After(j) => {
                    let (fin, started) = state(j);
                    Some(fin.is_some() || started)
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
                        .get(&(job.user, &*job.name))
                        .is_none_or(|&first| first == id),
                ),
            };
            match ok {
                None => never = true,
                Some(false) => waiting = true,
                Some(true) => met = true,
            }
        }
        if job.deps_any() {
            // One met is enough; never, only when none can be.
            if met || job.deps().is_empty() {
                None
            } else if waiting {
                Some(PendingReason::Dependency)
            } else {
                Some(PendingReason::DependencyNeverSatisfied)
            }
        } else if never {
            Some(PendingReason::DependencyNeverSatisfied)
        } else {
            waiting.then_some(PendingReason::Dependency)
        }
    }
}

/// Which partitions' first blocked job has been seen in this pass. The
/// first job that cannot start in a partition waits for `Resources`; the
/// ones ranked behind it wait for `Priority`, as in Slurm.
pub(super) struct Blocked {
    seen: Vec<bool>,
}

impl Blocked {
    pub(super) fn new(partitions: usize) -> Self {
        Blocked {
            seen: vec![false; partitions],
        }
    }

    /// The reason for the next blocked job of `partition`, in rank order.
    pub(super) fn reason(&mut self, partition: PartitionId) -> PendingReason {
        let seen = std::mem::replace(&mut self.seen[partition.0 as usize], true);
        if seen {
            PendingReason::Priority
        } else {
            PendingReason::Resources
        }
    }
}
