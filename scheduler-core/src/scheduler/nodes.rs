//! Partitions and the node registry: nodes join, change state and leave;
//! a node that leaves takes its running jobs with it.

use super::{NodeSlot, Partition, Scheduler};
use std::collections::{BTreeMap, HashSet};

use crate::error::ControlError;
use crate::hostlist;
use crate::model::{
    JobOutcome, LostJob, NodeAdmin, NodeId, NodeInfo, NodeSpec, NodeState, PartitionId,
    PartitionSpec, Secs, MAX_GPUS_PER_NODE,
};
use crate::placement::Capacity;

impl Scheduler {
    /// Adds a partition; registered nodes whose names it lists join it.
    pub fn add_partition(&mut self, spec: PartitionSpec) -> Result<PartitionId, ControlError> {
        if self.partition_names.contains_key(&spec.name) {
            return Err(ControlError::DuplicatePartition(spec.name));
        }
        let all = spec.nodes.trim().eq_ignore_ascii_case("ALL");
        let names = if all {
            HashSet::new()
        } else {
            hostlist::expand(&spec.nodes)
                .map_err(|source| ControlError::PartitionNodes {
                    name: spec.name.clone(),
                    source,
                })?
                .into_iter()
                .collect()
        };
        let id = PartitionId(self.partitions.len() as u32);
        let mut p = Partition {
            spec,
            all,
            names,
            members: Vec::new(),
        };
        p.members = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| {
                n.as_ref()
                    .filter(|n| p.matches(&n.name))
                    .map(|_| NodeId(i as u32))
            })
            .collect();
        self.partition_names.insert(p.spec.name.clone(), id);
        self.partitions.push(p);
        Ok(id)
    }

    /// Changes a partition's limits and tier (not its nodes). Pending jobs
    /// over a lowered time limit wait with `PartitionTimeLimit`.
    pub fn update_partition_limits(
        &mut self,
        name: &str,
        default_time: Option<Secs>,
        max_time: Option<Secs>,
        priority_tier: u32,
    ) -> Result<(), ControlError> {
        let id = self
            .partition_id(name)
            .ok_or_else(|| ControlError::UnknownPartition(name.to_string()))?;
        let spec = &mut self.partitions[id.0 as usize].spec;
        spec.default_time = default_time;
        spec.max_time = max_time;
        spec.priority_tier = priority_tier;
        Ok(())
    }

    pub fn partition_id(&self, name: &str) -> Option<PartitionId> {
        self.partition_names.get(name).copied()
    }

    pub fn partition_spec(&self, id: PartitionId) -> Option<&PartitionSpec> {
        self.partitions.get(id.0 as usize).map(|p| &p.spec)
    }

    /// Member nodes of a partition, ascending.
    pub fn partition_nodes(&self, id: PartitionId) -> &[NodeId] {
        self.partitions
            .get(id.0 as usize)
            .map_or(&[], |p| &p.members)
    }

    // ----- nodes --------------------------------------------------------

    /// Registers a node. It is idle and in service at once.
    pub fn handle_node_added(&mut self, spec: NodeSpec) -> Result<NodeId, ControlError> {
        if self.node_names.contains_key(&spec.name) {
            return Err(ControlError::DuplicateNode(spec.name));
        }
        if spec.cpus == 0 {
            return Err(ControlError::NoCpus(spec.name));
        }
        if spec.gpus.len() > MAX_GPUS_PER_NODE {
            return Err(ControlError::TooManyGpus {
                name: spec.name,
                count: spec.gpus.len(),
            });
        }
        let mut gpus = 0u64;
        let mut groups: BTreeMap<u32, u64> = BTreeMap::new();
        for g in &spec.gpus {
            let bit = 1u64
                .checked_shl(g.index)
                .filter(|_| g.index < MAX_GPUS_PER_NODE as u32);
            match bit {
                Some(b) if gpus & b == 0 => {
                    gpus |= b;
                    *groups.entry(g.group).or_default() |= b;
                }
                _ => {
                    return Err(ControlError::BadGpuIndex {
                        name: spec.name,
                        index: g.index,
                    })
                }
            }
        }
        let cap = Capacity {
            cpus: spec.cpus,
            mem: spec.memory_mb,
            gpus,
            groups: groups.into_values().collect(),
        };
        let words = spec.cpus.div_ceil(64) as usize;
        let mut cpu_free = vec![u64::MAX; words];
        if spec.cpus % 64 != 0 {
            cpu_free[words - 1] = (1u64 << (spec.cpus % 64)) - 1;
        }
        let id = NodeId(self.nodes.len() as u32);
        for p in &mut self.partitions {
            if p.matches(&spec.name) {
                p.members.push(id);
            }
        }
        self.node_names.insert(spec.name.clone(), id);
        self.nodes.push(Some(NodeSlot {
            name: spec.name,
            free: cap.whole(),
            cap,
            gpu_count: gpus.count_ones(),
            gpu_model: crate::model::node_gpu_model(&spec.gpus),
            features: spec.features,
            admin: NodeAdmin::Up,
            cpu_free,
            jobs: Vec::new(),
        }));
        Ok(id)
    }

    /// Sets a node's administrative state. Going down loses its running
    /// jobs: each ends in NODE_FAIL or, with `--requeue`, pends again.
    pub fn handle_node_admin(
        &mut self,
        now: Secs,
        id: NodeId,
        admin: NodeAdmin,
    ) -> Result<Vec<LostJob>, ControlError> {
        let node = self.slot_mut(id)?;
        let down = matches!(admin, NodeAdmin::Down { .. });
        node.admin = admin;
        Ok(if down {
            self.lose_jobs_on(now, id)
        } else {
            Vec::new()
        })
    }

    /// Removes a node for good (scale down, or an agent that will not
    /// return). Its running jobs are lost as with going down.
    pub fn handle_node_removed(
        &mut self,
        now: Secs,
        id: NodeId,
    ) -> Result<Vec<LostJob>, ControlError> {
        self.slot_mut(id)?;
        let lost = self.lose_jobs_on(now, id);
        if let Some(node) = self.nodes[id.0 as usize].take() {
            self.node_names.remove(&node.name);
        }
        for p in &mut self.partitions {
            p.members.retain(|&m| m != id);
        }
        Ok(lost)
    }

    pub(super) fn slot_mut(&mut self, id: NodeId) -> Result<&mut NodeSlot, ControlError> {
        self.nodes
            .get_mut(id.0 as usize)
            .and_then(Option::as_mut)
            .ok_or(ControlError::UnknownNode(id))
    }

    pub(super) fn slot(&self, id: NodeId) -> Option<&NodeSlot> {
        self.nodes.get(id.0 as usize).and_then(Option::as_ref)
    }

    pub(super) fn lose_jobs_on(&mut self, now: Secs, id: NodeId) -> Vec<LostJob> {
        let jobs = self.slot(id).map(|n| n.jobs.clone()).unwrap_or_default();
        let mut lost = Vec::with_capacity(jobs.len());
        for job in jobs {
            let requeue = self.jobs.get(&job).is_some_and(|j| j.requeue);
            self.release_allocation(now, job);
            if requeue {
                self.queue_again(now, job);
                lost.push(LostJob::Requeued(job));
            } else {
                self.jobs.remove(&job);
                self.forget_job(job);
                self.finished.insert(job, JobOutcome::NodeFail);
                lost.push(LostJob::Failed(job));
            }
        }
        lost
    }

    pub fn node_id(&self, name: &str) -> Option<NodeId> {
        self.node_names.get(name).copied()
    }

    /// A node as `sinfo` shows it.
    pub fn node_info(&self, id: NodeId) -> Option<NodeInfo> {
        let n = self.slot(id)?;
        let alloc_cpus = n.cap.cpus - n.free.cpus;
        let busy = !n.jobs.is_empty();
        let state = match &n.admin {
            NodeAdmin::Down { .. } => NodeState::Down,
            NodeAdmin::Drain { .. } if busy => NodeState::Draining,
            NodeAdmin::Drain { .. } => NodeState::Drained,
            NodeAdmin::Up if !busy => NodeState::Idle,
            NodeAdmin::Up if n.free.cpus == 0 || (n.gpu_count > 0 && n.free.gpus == 0) => {
                NodeState::Allocated
            }
            NodeAdmin::Up => NodeState::Mixed,
        };
        let reason = match &n.admin {
            NodeAdmin::Up => None,
            NodeAdmin::Drain { reason } | NodeAdmin::Down { reason } => Some(reason.clone()),
        };
        Some(NodeInfo {
            id,
            name: n.name.clone(),
            state,
            reason,
            cpus: n.cap.cpus,
            alloc_cpus,
            memory_mb: n.cap.mem,
            alloc_memory_mb: n.cap.mem - n.free.mem,
            gpus: n.gpu_count,
            alloc_gpus: n.gpu_count - n.free.gpu_count(),
            features: n.features.clone(),
            jobs: n.jobs.clone(),
        })
    }

    /// Registered nodes, ascending by id.
    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.is_some())
            .map(|(i, _)| NodeId(i as u32))
    }
}
