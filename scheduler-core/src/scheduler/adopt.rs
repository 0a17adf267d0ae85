//! Adoption: a job already running when its driver (re)started, placed
//! back exactly where it runs, so a restarted controller keeps its jobs
//! instead of losing or rerunning them.

use super::{Scheduler, State};

use crate::error::ControlError;
use crate::model::{JobId, JobRequest, NodeAllocation, Secs, INFINITE};

/// Why a running job could not be adopted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AdoptError {
    #[error(transparent)]
    Submit(#[from] crate::error::SubmitError),
    #[error(transparent)]
    Control(#[from] ControlError),
    #[error("job {job}: node {node} does not have {what} free for it")]
    Busy {
        job: JobId,
        node: String,
        what: &'static str,
    },
}

impl Scheduler {
    /// Takes back a job that runs on `alloc` since `start` (submitted at
    /// `submit` as `req`): its CPUs, memory and GPUs are held again and it
    /// ends by its time limit from `start`, as if this scheduler had
    /// started it. Nothing changes if any part of `alloc` is unknown or
    /// taken. Returns when it must end.
    pub fn adopt(
        &mut self,
        submit: Secs,
        start: Secs,
        id: JobId,
        req: JobRequest,
        alloc: Vec<NodeAllocation>,
    ) -> Result<Secs, AdoptError> {
        let array_of = req.array_of;
        let mut job = self.validate(submit, req)?;
        if self.jobs.contains_key(&id) || self.finished.contains_key(&id) {
            return Err(crate::error::SubmitError::DuplicateJob(id).into());
        }
        // Check every node first: adoption is all or nothing.
        for a in &alloc {
            let node = self
                .nodes
                .get(a.node.0 as usize)
                .and_then(Option::as_ref)
                .ok_or(ControlError::UnknownNode(a.node))?;
            let busy = |what| AdoptError::Busy {
                job: id,
                node: node.name.clone(),
                what,
            };
            let cpu_free = |c: u32| {
                node.cpu_free
                    .get((c / 64) as usize)
                    .is_some_and(|w| w & (1u64 << (c % 64)) != 0)
            };
            if !a.cpus.iter().all(|&c| cpu_free(c)) {
                return Err(busy("the CPUs"));
            }
            if !a
                .gpus
                .iter()
                .all(|&g| g < 64 && node.free.gpus & (1u64 << g) != 0)
            {
                return Err(busy("the GPUs"));
            }
            if node.free.mem < a.memory_mb {
                return Err(busy("the memory"));
            }
        }
        for a in &alloc {
            let Some(node) = self.nodes[a.node.0 as usize].as_mut() else {
                continue;
            };
            for &c in &a.cpus {
                node.cpu_free[(c / 64) as usize] &= !(1u64 << (c % 64));
            }
            node.free.cpus -= a.cpus.len() as u32;
            node.free.mem -= a.memory_mb;
            for &g in &a.gpus {
                node.free.gpus &= !(1u64 << g);
            }
            node.jobs.push(id);
        }
        let end_by = start.saturating_add(job.limit).min(INFINITE);
        job.state = State::running(start, end_by, alloc.into());
        if let Some(a) = array_of {
            job.array = Some(self.join_array(a));
            self.array_task_started(a);
        }
        self.jobs.insert(id, Box::new(job));
        self.note_hold(id);
        Ok(end_by)
    }
}

#[cfg(test)]
mod tests {
    use crate::model::{GpuRequest, JobOutcome, NodeSpec, PartitionSpec};
    use crate::*;

    fn cluster() -> Scheduler {
        let mut s = Scheduler::new(SchedulerConfig::default());
        let mut p = PartitionSpec::new("gpu", "n[0-1]");
        p.is_default = true;
        s.add_partition(p).unwrap();
        for n in ["n0", "n1"] {
            s.handle_node_added(NodeSpec::new(n, 4, 1000).with_gpus(2, 0))
                .unwrap();
        }
        s
    }

    fn req(gpus: u32) -> JobRequest {
        let mut r = JobRequest::new(UserId(1));
        r.cpus_per_task = 4;
        r.exclusive = gpus > 0;
        r.gpus = GpuRequest::PerNode(gpus);
        r.time_limit = Some(100);
        r
    }

    #[test]
    fn an_adopted_job_holds_its_exact_resources_until_it_finishes() {
        let mut s = cluster();
        let n0 = s.node_id("n0").unwrap();
        let alloc = vec![NodeAllocation {
            node: n0,
            tasks: 1,
            cpus: vec![0, 1, 2, 3],
            gpus: vec![0, 1],
            memory_mb: 1000,
        }];
        assert_eq!(s.adopt(5, 10, JobId(7), req(2), alloc.clone()), Ok(110));
        assert!(s.audit().is_ok(), "{:?}", s.audit());
        // The same resources cannot be adopted twice.
        let again = s.adopt(5, 10, JobId(8), req(2), alloc);
        assert!(matches!(again, Err(AdoptError::Busy { .. })), "{again:?}");
        // A new job needing a whole node goes to the other one.
        s.submit(20, JobId(9), req(2)).unwrap();
        let started = s.schedule(20);
        assert_eq!(started.len(), 1);
        assert_eq!(s.node_info(started[0].nodes[0].node).unwrap().name, "n1");
        // The adopted job's time limit counts from its start.
        assert_eq!(s.overdue_jobs(111), [JobId(7)]);
        s.handle_job_finished(111, JobId(7), JobOutcome::Timeout)
            .unwrap();
        s.submit(112, JobId(10), req(2)).unwrap();
        assert_eq!(s.schedule(112).len(), 1, "n0 is free again");
        assert!(s.audit().is_ok());
    }

    #[test]
    fn an_unknown_node_or_cpu_adopts_nothing() {
        let mut s = cluster();
        let n0 = s.node_id("n0").unwrap();
        let bad = vec![NodeAllocation {
            node: n0,
            tasks: 1,
            cpus: vec![9],
            gpus: vec![],
            memory_mb: 10,
        }];
        assert!(s.adopt(0, 0, JobId(1), req(0), bad).is_err());
        assert!(s.job_status(JobId(1)).is_none());
        assert_eq!(s.node_info(n0).unwrap().alloc_cpus, 0);
    }
}
