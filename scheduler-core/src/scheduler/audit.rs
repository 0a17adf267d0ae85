//! The audit: the scheduler checks its own bookkeeping.

use super::{Scheduler, State};
use crate::{JobId, Secs, INFINITE};
use std::collections::HashSet;

use crate::timeline::Free;

impl Scheduler {
    /// Checks the scheduler's bookkeeping: no CPU or GPU held twice, no node
    /// over capacity, exclusive jobs alone, free counts matching the
    /// allocations. Cheap enough for tests and fuzzing, not for every call.
    pub fn audit(&self) -> Result<(), String> {
        // The held index is exactly the pending jobs with a hold.
        let mut held_users: std::collections::BTreeMap<_, u32> = Default::default();
        for (&id, j) in &self.jobs {
            let is = j.is_pending() && j.hold.is_some();
            if is != self.held.contains_key(&id) {
                return Err(format!("job {id} held {is} but the index says otherwise"));
            }
            if is {
                *held_users.entry(j.user).or_default() += 1;
                if self.held[&id] != j.user {
                    return Err(format!("held job {id} indexed under another user"));
                }
            }
        }
        // Every job waiting for a time of its own is filed under it, and
        // every running job is on its first node's list (what the clock's
        // questions walk instead of the queue).
        for (&id, j) in &self.jobs {
            if j.is_pending() && j.begin > j.submit && !self.delayed.contains(&(j.begin, id)) {
                return Err(format!("job {id} waits until {} unfiled", j.begin));
            }
            if let State::Running(r) = &j.state {
                let first = r.alloc.first().map(|a| a.node.0 as usize);
                let listed = first
                    .and_then(|n| self.nodes.get(n)?.as_ref())
                    .is_some_and(|n| n.jobs.contains(&id));
                if !listed {
                    return Err(format!("running job {id} is not on its first node's list"));
                }
            }
        }
        // The clock's questions answer as a walk of every job would, at
        // the times where their answers change (none before the latest
        // submission: the clock does not go back).
        let latest = self.jobs.values().map(|j| j.submit).max().unwrap_or(0);
        let mut probes: Vec<Secs> = self
            .jobs
            .values()
            .flat_map(|j| match &j.state {
                State::Running(r) => [r.end_by, j.begin],
                State::Pending { .. } => [j.begin, j.submit],
            })
            .filter(|&t| t < INFINITE)
            .flat_map(|t| [t.saturating_sub(1), t, t.saturating_add(1)])
            .collect();
        probes.retain(|&t| t >= latest);
        probes.sort_unstable();
        probes.dedup();
        for &now in probes.iter().take(64) {
            let wake = self
                .jobs
                .values()
                .filter_map(|j| match &j.state {
                    State::Pending { .. } if j.begin > now => Some(j.begin),
                    State::Running(r) if r.end_by < INFINITE => Some(r.end_by),
                    _ => None,
                })
                .min();
            if wake != self.next_wakeup(now) {
                return Err(format!("next wakeup at {now}: {wake:?} by a walk"));
            }
            let overdue: Vec<JobId> = self
                .jobs
                .iter()
                .filter(|(_, j)| matches!(&j.state, State::Running(r) if r.end_by <= now))
                .map(|(&id, _)| id)
                .collect();
            if overdue != self.overdue_jobs(now) {
                return Err(format!("overdue at {now}: {overdue:?} by a walk"));
            }
        }
        // A job is live or finished, never both (`job_status` asks the
        // live ones first).
        if let Some(id) = self.jobs.keys().find(|id| self.finished.contains_key(id)) {
            return Err(format!("job {id} is both live and finished"));
        }
        let unheld = self.jobs.keys().filter(|id| !self.held.contains_key(id));
        if !unheld.eq(self.unheld.iter()) {
            return Err("the jobs not held are filed wrongly".into());
        }
        if self.held.len() != held_users.values().sum::<u32>() as usize {
            return Err("the held index names jobs that are gone".into());
        }
        if held_users != self.held_users {
            return Err("held jobs counted per user wrongly".into());
        }
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
                let State::Running(run) = &j.state else {
                    return Err(format!(
                        "node {} lists job {job} that is not running",
                        node.name
                    ));
                };
                if j.shape.exclusive && node.jobs.len() != 1 {
                    return Err(format!("exclusive job {job} shares node {}", node.name));
                }
                let a = run
                    .alloc
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
            if let State::Running(run) = &j.state {
                for a in &run.alloc {
                    let on = self.slot(a.node).is_some_and(|n| n.jobs.contains(id));
                    if !on {
                        return Err(format!("running job {id} missing from node {}", a.node));
                    }
                }
            }
        }
        // Each array's count of running tasks is what runs of it, and
        // within its `%N`.
        let mut running: std::collections::HashMap<crate::model::JobId, u32> = Default::default();
        for j in self.jobs.values() {
            if let Some(a) = j.running_task_of() {
                *running.entry(a).or_default() += 1;
            }
        }
        for (id, b) in &self.arrays {
            let n = running.remove(id).unwrap_or(0);
            if b.running != n {
                return Err(format!("array {id} counts {} running, {n} run", b.running));
            }
            if b.throttle > 0 && n > b.throttle {
                return Err(format!("array {id} runs {n}, over its %{}", b.throttle));
            }
        }
        if let Some((id, _)) = running.into_iter().next() {
            return Err(format!("tasks of array {id} run without its book"));
        }
        Ok(())
    }
}
