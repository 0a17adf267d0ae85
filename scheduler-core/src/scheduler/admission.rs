//! Admission: a [`JobRequest`] becomes an admitted job with a fixed
//! shape, or a typed [`SubmitError`] saying why it never could run.

use super::{Asks, Job, NodeAsk, Run, Scheduler, State};

use crate::error::{ControlError, SubmitError, UpdateError};
use crate::model::{
    Dependency, GpuRequest, HoldKind, JobId, JobRequest, NodeId, PartitionId, PendingReason, Secs,
    INFINITE,
};
use crate::placement::Shape;

impl Scheduler {
    /// Accepts a job into the queue, or says why it never could run.
    pub fn submit(&mut self, now: Secs, id: JobId, req: JobRequest) -> Result<(), SubmitError> {
        if self.jobs.contains_key(&id) || self.finished.contains_key(&id) {
            return Err(SubmitError::DuplicateJob(id));
        }
        let (array, array_of) = (req.array.clone(), req.array_of);
        let mut job = self.validate(now, req)?;
        if let Some(a) = &array {
            match self.open_array(id, a)? {
                Some(role) => job.array = Some(role),
                // Restored with every task started: only its book.
                None => return Ok(()),
            }
        } else if let Some(a) = array_of {
            job.array = Some(self.join_array(a));
        }
        self.jobs.insert(id, Box::new(job));
        self.note_hold(id);
        Ok(())
    }

    /// A pending job's request changes (`scontrol update JobId=…`): the new
    /// request is checked as a submission is, and the job keeps its submit
    /// time (its age), its hold and its id. Tasks of an array and an
    /// array's waiting tasks are not changed this way.
    pub fn update(&mut self, id: JobId, req: JobRequest) -> Result<(), UpdateError> {
        let old = self.jobs.get(&id).ok_or(ControlError::UnknownJob(id))?;
        if !old.is_pending() {
            return Err(ControlError::NotPending(id).into());
        }
        // A task split off its array (`scontrol update 12_3`) stays its
        // array's; the entry of waiting tasks is not updated this way.
        let task_of = match old.array.as_deref() {
            None => None,
            Some(role @ super::array::Role::Task { .. }) if req.array.is_none() => {
                Some(Box::new(role.clone()))
            }
            Some(_) => {
                return Err(SubmitError::Invalid(
                    "a job array's waiting tasks are updated one by one (ARRAY_TASK)".into(),
                )
                .into())
            }
        };
        let (submit, hold) = (old.submit, old.hold);
        let mut job = self.validate(submit, req)?;
        job.hold = hold.or(job.hold);
        if task_of.is_some() {
            job.array = task_of;
        }
        self.jobs.insert(id, Box::new(job));
        self.note_hold(id);
        Ok(())
    }

    /// A running job's time limit changes (`scontrol update JobId=…
    /// TimeLimit=`): its end moves to its start plus the new limit plus
    /// the time it spent suspended (`None`: no limit), which the next pass
    /// plans around; a limit already passed makes it overdue at once.
    /// Returns the new end (while it is suspended, the end it has once
    /// resumed at the moment of its suspension).
    pub fn set_running_limit(
        &mut self,
        id: JobId,
        limit: Option<Secs>,
    ) -> Result<Secs, ControlError> {
        let job = self.jobs.get_mut(&id).ok_or(ControlError::UnknownJob(id))?;
        let State::Running(run) = &mut job.state else {
            return Err(ControlError::NotRunning(id));
        };
        let Run {
            start,
            end_by,
            paused,
            suspended,
            ..
        } = &mut **run;
        job.limit = limit.unwrap_or(INFINITE);
        let end = limit_end(*start, job.limit, *paused);
        if suspended.is_none() {
            *end_by = end;
        }
        Ok(end)
    }

    /// A running job is suspended at `now` (`scontrol suspend`): it keeps
    /// its resources, and its time limit stops counting, so it is never
    /// overdue and the passes plan it as running on. Suspending a
    /// suspended job changes nothing.
    pub fn suspend(&mut self, now: Secs, id: JobId) -> Result<(), ControlError> {
        let job = self.jobs.get_mut(&id).ok_or(ControlError::UnknownJob(id))?;
        let State::Running(run) = &mut job.state else {
            return Err(ControlError::NotRunning(id));
        };
        let Run {
            end_by, suspended, ..
        } = &mut **run;
        if suspended.is_none() {
            *suspended = Some(now);
            *end_by = INFINITE;
        }
        Ok(())
    }

    /// A suspended job runs again at `now` (`scontrol resume`): its end
    /// moves later by the time it was suspended. Returns the new end.
    pub fn resume(&mut self, now: Secs, id: JobId) -> Result<Secs, ControlError> {
        let job = self.jobs.get_mut(&id).ok_or(ControlError::UnknownJob(id))?;
        let limit = job.limit;
        let State::Running(run) = &mut job.state else {
            return Err(ControlError::NotRunning(id));
        };
        let Run {
            start,
            end_by,
            paused,
            suspended,
            ..
        } = &mut **run;
        let since = suspended.take().ok_or(ControlError::NotSuspended(id))?;
        *paused = paused.saturating_add(now.saturating_sub(since));
        *end_by = limit_end(*start, limit, *paused);
        Ok(*end_by)
    }

    /// What a restarted driver knows of a running job's suspensions (after
    /// [`Scheduler::adopt`]): `paused` seconds suspended before, and
    /// suspended since `since` now. Returns its end, as
    /// [`Scheduler::set_running_limit`] does.
    pub fn restore_suspension(
        &mut self,
        id: JobId,
        paused: Secs,
        since: Option<Secs>,
    ) -> Result<Secs, ControlError> {
        let job = self.jobs.get_mut(&id).ok_or(ControlError::UnknownJob(id))?;
        let limit = job.limit;
        let State::Running(run) = &mut job.state else {
            return Err(ControlError::NotRunning(id));
        };
        let Run {
            start,
            end_by,
            paused: p,
            suspended,
            ..
        } = &mut **run;
        *p = paused;
        *suspended = since;
        let end = limit_end(*start, limit, paused);
        *end_by = if since.is_some() { INFINITE } else { end };
        Ok(end)
    }

    /// Whether a running job is suspended.
    pub fn is_suspended(&self, id: JobId) -> bool {
        self.jobs
            .get(&id)
            .is_some_and(|j| matches!(&j.state, State::Running(r) if r.suspended.is_some()))
    }

    pub(super) fn validate(&self, now: Secs, req: JobRequest) -> Result<Job, SubmitError> {
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
            if !self.knows_job(target) {
                return Err(SubmitError::UnknownDependency(target));
            }
        }

        // Nodes this job could ever use, whatever their state.
        let gpu_type = req.gpu_type.as_ref().map(|t| t.to_ascii_lowercase());
        let usable = || {
            part.members
                .iter()
                .filter(|m| !exclude.contains(m))
                .filter_map(|&m| self.slot(m))
                .filter(|n| n.gpus_of(gpu_type.as_deref()))
                .filter(|n| crate::model::features_met(&n.features, &features, req.features_any))
        };
        if let (Some(t), None) = (&gpu_type, usable().next()) {
            return Err(SubmitError::NodeConfigUnavailable(format!(
                "no node in partition {} has GPUs of type {t}",
                part.spec.name
            )));
        }
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
        let nodes = NodeAsk {
            required,
            exclude,
            features,
            features_any: req.features_any,
            gpu_type,
        };
        let asks = (nodes != NodeAsk::default() || !req.dependencies.is_empty()).then(|| {
            Box::new(Asks {
                nodes,
                deps: req.dependencies,
                deps_any: req.dependencies_any,
            })
        });
        Ok(Job {
            name: req.name.into(),
            user: req.user,
            account: req.account,
            partition: pid,
            shape,
            limit,
            asks,
            qos,
            nice: req.nice,
            hold: req.hold.then_some(HoldKind::User),
            begin: req.begin_time.unwrap_or(now),
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
            array: None,
        })
    }

    /// Turns the request's node, task and GPU counts into a shape.
    pub(super) fn shape(
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
        let mem_per_gpu = req.memory_per_gpu_mb.unwrap_or(0);
        // Saturating: a request this large fits no node and is refused.
        let mem_per_node = req
            .memory_per_node_mb
            .unwrap_or(0)
            .saturating_add(mem_per_gpu.saturating_mul(u64::from(gpus_per_node)));
        let asks_none = req.memory_per_node_mb.is_none()
            && req.memory_per_cpu_mb.is_none()
            && req.memory_per_gpu_mb.is_none()
            && !req.memory_whole_node;
        let (per_cpu, mem_share) = match (asks_none, self.cfg.default_memory) {
            (true, super::DefaultMemory::PerCpu(mb)) => (Some(mb), false),
            (true, super::DefaultMemory::ShareOfNode) => (None, !exclusive),
            _ => (req.memory_per_cpu_mb, false),
        };
        let mem_per_task = per_cpu
            .unwrap_or(0)
            .saturating_mul(u64::from(req.cpus_per_task))
            .saturating_add(mem_per_gpu.saturating_mul(u64::from(gpus_per_task)));
        Ok(Shape {
            nodes_min,
            nodes_max,
            tasks,
            // Zero was refused above.
            tasks_per_node: tasks_per_node.and_then(std::num::NonZeroU32::new),
            cpus_per_task: req.cpus_per_task,
            gpus_per_task,
            gpus_per_node,
            mem_per_node,
            mem_per_task,
            mem_whole: req.memory_whole_node,
            mem_share,
            exclusive,
        })
    }
}

/// When a job started at `start` with `limit` reaches it, having been
/// suspended `paused` seconds (`INFINITE`: never).
fn limit_end(start: Secs, limit: Secs, paused: Secs) -> Secs {
    if limit >= INFINITE {
        return INFINITE;
    }
    start
        .saturating_add(limit)
        .saturating_add(paused)
        .min(INFINITE - 1)
}

#[cfg(test)]
mod tests {
    use crate::model::{GpuRequest, NodeSpec, PartitionSpec};
    use crate::*;

    #[test]
    fn a_typed_gpu_request_goes_only_to_nodes_of_that_model() {
        let mut s = Scheduler::new(SchedulerConfig::default());
        let mut p = PartitionSpec::new("gpu", "n[0-2]");
        p.is_default = true;
        s.add_partition(p).unwrap();
        let typed = |name: &str, model: &str| {
            let mut n = NodeSpec::new(name, 8, 1000).with_gpus(4, 0);
            for g in &mut n.gpus {
                g.model = model.into();
            }
            n
        };
        s.handle_node_added(typed("n0", "a100")).unwrap();
        s.handle_node_added(typed("n1", "NVIDIA_H200")).unwrap();
        // Mixed: no typed request goes there.
        let mut mixed = typed("n2", "h200");
        mixed.gpus[0].model = "a100".into();
        s.handle_node_added(mixed).unwrap();
        let ask = |t: Option<&str>| {
            let mut r = JobRequest::new(UserId(1));
            r.gpus = GpuRequest::PerNode(2);
            r.gpu_type = t.map(String::from);
            r
        };
        for id in 1..=3 {
            s.submit(0, JobId(id), ask(Some("h200"))).unwrap();
        }
        let started = s.schedule(0);
        assert_eq!(started.len(), 2, "two fit on the one H200 node");
        let n1 = s.node_id("n1").unwrap();
        assert!(started.iter().all(|d| d.nodes[0].node == n1));
        match s.submit(0, JobId(9), ask(Some("v100"))) {
            Err(SubmitError::NodeConfigUnavailable(m)) => {
                assert!(m.contains("GPUs of type v100"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        // Untyped, any node will do.
        s.submit(0, JobId(10), ask(None)).unwrap();
        assert_eq!(s.schedule(0).len(), 1);
        s.audit().unwrap();
    }
}
