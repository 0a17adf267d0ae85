//! Active health checks: small jobs the controller runs on idle nodes
//! (`[[health.active]]` in `corral.toml`), such as a GPU burn-in or a
//! two-node communication test. A run is submitted only onto nodes that
//! are idle and due, at the top of the queue; one that does not start in
//! the pass right after is withdrawn, so a check never holds nodes back
//! from users' work and never preempts it. A failed run drains the nodes
//! it ran on (`node_problem: <check>: <detail>`); an operator's RESUME
//! lifts that drain (the check cannot run on a drained node to see it
//! pass).

use std::collections::HashMap;

use corral_proto::msg::{JobFilter, JobId, JobKind, JobSpec, JobState};
use scheduler_core::NodeState;

use super::{Controller, MAX_NICE};

/// Runs of the configured checks: what is in flight and when each node
/// last ran each check.
#[derive(Debug, Default)]
pub(super) struct ActiveChecks {
    /// Check index → its run in flight: (job, nodes).
    running: HashMap<usize, (JobId, Vec<String>)>,
    /// (check index, node) → when the node last got a run of it.
    last: HashMap<(usize, String), u64>,
}

impl Controller {
    /// Each tick: withdraws runs that did not start, and submits a run of
    /// each check that is not in flight onto idle nodes that are due.
    pub(super) fn active_checks(&mut self, now: u64) {
        let pending: Vec<JobId> = self
            .checks
            .running
            .values()
            .map(|(id, _)| *id)
            .filter(|id| {
                self.jobs
                    .get(id)
                    .is_some_and(|j| j.state == JobState::Pending)
            })
            .collect();
        if !pending.is_empty() {
            let filter = JobFilter {
                ids: pending,
                ..JobFilter::default()
            };
            let _ = self.cancel(self.cfg.check_user, &filter, None, now);
            // Not run after all: those nodes are due again.
            let unrun: Vec<String> = self
                .checks
                .running
                .values()
                .filter(|(id, _)| self.jobs.get(id).is_some_and(|j| j.start.is_none()))
                .flat_map(|(_, nodes)| nodes.iter().cloned())
                .collect();
            self.checks
                .last
                .retain(|(_, node), _| !unrun.contains(node));
        }
        self.checks
            .running
            .retain(|_, (id, _)| self.jobs.get(id).is_some_and(|j| !j.state.is_final()));
        for i in 0..self.cfg.active_checks.len() {
            if self.checks.running.contains_key(&i) {
                continue;
            }
            let check = &self.cfg.active_checks[i];
            let interval = check.interval;
            let mut due: Vec<(u64, String)> = self
                .nodes
                .values()
                .filter(|n| n.connected && !n.not_responding && n.admin.is_none())
                .filter(|n| n.leaving.is_none() && n.problem.is_none() && n.check_failed.is_none())
                .filter(|n| {
                    self.sched
                        .node_info(n.id)
                        .is_some_and(|info| info.state == NodeState::Idle)
                })
                .filter_map(|n| {
                    let last = self.checks.last.get(&(i, n.reg.name.clone())).copied();
                    match last {
                        Some(t) if now.saturating_sub(t) < interval => None,
                        _ => Some((last.unwrap_or(0), n.reg.name.clone())),
                    }
                })
                .collect();
            if due.len() < check.nodes as usize {
                continue;
            }
            // The nodes that waited longest first.
            due.sort();
            let nodes: Vec<String> = due
                .into_iter()
                .take(check.nodes as usize)
                .map(|(_, n)| n)
                .collect();
            let spec = JobSpec {
                name: format!("health:{}", check.name),
                nodes: Some(check.nodes),
                nodelist: nodes.clone(),
                exclusive: true,
                time_limit: Some(check.time_limit),
                // Ahead of every user's job (a privileged user's nice).
                nice: -(MAX_NICE as i32),
                work_dir: "/".into(),
                kind: JobKind::Batch {
                    script: check.script.clone().into_bytes(),
                    args: Vec::new(),
                    stdout: Some("/dev/null".into()),
                    stderr: None,
                },
                ..JobSpec::default()
            };
            match self.submit(self.cfg.check_user, spec, now) {
                Ok(id) => {
                    for n in &nodes {
                        self.checks.last.insert((i, n.clone()), now);
                    }
                    self.checks.running.insert(i, (id, nodes));
                }
                Err(e) => {
                    tracing::warn!(check = %self.cfg.active_checks[i].name, error = %e, "active check not submitted");
                }
            }
        }
    }

    /// A job reached its final state: if it was an active check's run,
    /// a failure drains the nodes it ran on.
    pub(super) fn active_check_done(&mut self, job: JobId, now: u64) {
        let Some(i) = self
            .checks
            .running
            .iter()
            .find(|(_, (id, _))| *id == job)
            .map(|(i, _)| *i)
        else {
            return;
        };
        let Some((_, nodes)) = self.checks.running.remove(&i) else {
            return;
        };
        let Some(j) = self.jobs.get(&job) else {
            return;
        };
        let detail = match j.state {
            JobState::Completed | JobState::Cancelled => return,
            JobState::Timeout => {
                format!("timed out after {} s", self.cfg.active_checks[i].time_limit)
            }
            JobState::OutOfMemory => "out of memory".to_string(),
            _ => match &j.failure {
                Some(f) => f.to_string(),
                None if j.exit.signal.is_some() => {
                    format!("killed by signal {}", j.exit.signal.unwrap_or(0))
                }
                None => format!("exit code {}", j.exit.code),
            },
        };
        let why = format!("{}: {detail}", self.cfg.active_checks[i].name);
        for name in nodes {
            let Some(n) = self.nodes.get_mut(&name) else {
                continue;
            };
            tracing::warn!(node = %name, problem = %why, "active check failed; draining the node");
            n.check_failed = Some((why.clone(), now));
            let id = n.id;
            let admin = self.admin_state(&name);
            let _ = self.sched.handle_node_admin(now, id, admin);
        }
        self.dirty = true;
    }
}
