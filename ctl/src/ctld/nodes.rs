//! The node registry: agents register, beat, report their health and
//! vanish; operators drain, down and resume nodes.

use super::admission::printable;
use super::wire::{node_spec, wire_id};
use super::{Controller, CtldError, JobRecord, NodeRecord, Refusal};
use std::collections::HashSet;

use corral_proto::msg::{CtldMsg, Ident, JobRun, JobState, NodeUpdate, Registration};
use scheduler_core::{hostlist, LostJob, NodeAdmin};

/// The drain reason of a node whose agent is stopping.
pub(super) const LEAVING: &str = "node_leaving: its agent is stopping";

impl Controller {
    // ---- nodes -------------------------------------------------------

    /// An agent registers (its certificate already checked for the name).
    pub fn register(&mut self, mut reg: Registration, now: u64) -> Result<(), Refusal> {
        if reg.name.is_empty() || reg.name.len() > 256 {
            return Err(CtldError::BadNodeName);
        }
        self.verifier.register(&reg.name, &reg.credential_key);
        self.dirty = true;
        if let Some(n) = self.nodes.get_mut(&reg.name) {
            let id = n.id;
            let running: HashSet<JobRun> = reg.running.iter().copied().collect();
            n.reg = reg;
            n.last_seen = now;
            n.connected = true;
            n.problem = None;
            let was_down = std::mem::replace(&mut n.not_responding, false);
            let name = n.reg.name.clone();
            let (instance, launched) = (n.reg.instance, std::mem::take(&mut n.reg.launched));
            // Runs placed here by another agent than this one: the agent
            // restarted and their tasks died with it. (A run it does not
            // list may just have nothing here yet: a batch job's other
            // nodes, or a launch lost with the connection, sent again.)
            let lost_runs = self
                .jobs
                .live_on_in(&name, JobState::Running)
                .iter()
                .any(|id| {
                    self.jobs.get(id).is_some_and(|j| {
                        j.alloc
                            .iter()
                            .any(|(n, a)| *n == name && a.agent != instance)
                    })
                });
            if !was_down && lost_runs {
                self.node_lost(now, &name, "Agent restarted");
                if let Some(n) = self.nodes.get_mut(&name) {
                    n.not_responding = false;
                }
            }
            self.end_strays(now, &name, &running);
            self.send_missed_launches(&name, instance, &launched);
            let admin = self.admin_state(&name);
            self.sched
                .handle_node_admin(now, id, admin)
                .map_err(CtldError::Control)?;
            return Ok(());
        }
        let spec = node_spec(&reg);
        let id = self
            .sched
            .handle_node_added(spec)
            .map_err(CtldError::Control)?;
        let running: HashSet<JobRun> = reg.running.iter().copied().collect();
        let name = reg.name.clone();
        let (instance, launched) = (reg.instance, std::mem::take(&mut reg.launched));
        let forgot = reg.forgot_ended_before;
        let admin = self.restored_admin.remove(&name);
        self.nodes.insert(
            name.clone(),
            NodeRecord {
                id,
                reg,
                boot: now,
                last_seen: now,
                connected: true,
                not_responding: false,
                admin,
                problem: None,
                leaving: None,
                check_failed: None,
            },
        );
        if self.nodes.get(&name).is_some_and(|n| n.admin.is_some()) {
            let admin = self.admin_state(&name);
            let _ = self.sched.handle_node_admin(now, id, admin);
        }
        self.nodes_dirty.insert(name.clone());
        // Runs of restored jobs stay (they are adopted); others end.
        self.runs_on_return(now, &name, instance, forgot, &running, &launched);
        self.end_strays(now, &name, &running);
        self.send_missed_launches(&name, instance, &launched);
        self.adopt_ready(now, &name);
        self.node_returned(now, &name);
        Ok(())
    }

    /// Ends on `name` the runs its agent has that are not placed there
    /// (jobs that failed or were requeued while it was silent), completes
    /// the clean-ups that waited on runs it no longer has, and sends again
    /// the `Terminate` of a clean-up that waits on a run it still has (the
    /// first may have been lost with a connection, or in a controller's
    /// send buffers when it died: COMPLETING was stored, the message was
    /// not, and the node would wait for it for good).
    pub(super) fn end_strays(&mut self, now: u64, name: &str, running: &HashSet<JobRun>) {
        for r in running {
            let placed = self.jobs.get(&r.job).is_some_and(|j| {
                !j.state.is_final() && j.run() == *r && j.alloc.iter().any(|(n, _)| n == name)
            });
            if !placed {
                self.outbox.push((
                    name.to_string(),
                    CtldMsg::Terminate {
                        job: *r,
                        grace_ms: 0,
                    },
                ));
            }
        }
        let (mut done, mut again) = (Vec::new(), Vec::new());
        for id in self.jobs.live_on_in(name, JobState::Completing) {
            let Some(j) = self.jobs.get(&id) else {
                continue;
            };
            if !j.cleaning.contains(name) {
                continue;
            }
            match running.contains(&j.run()) {
                false => done.push(j.run()),
                // A cancel's or a limit's grace, as the first had.
                true => again.push((j.run(), j.kill.is_some())),
            }
        }
        for r in done {
            self.cleaned(now, name, r);
        }
        for (job, killed) in again {
            let grace_ms = if killed { self.cfg.kill_wait * 1000 } else { 0 };
            self.outbox
                .push((name.to_string(), CtldMsg::Terminate { job, grace_ms }));
        }
    }

    /// Something arrived from the agent at `at` (no heartbeat list).
    pub fn heard(&mut self, name: &str, at: u64) {
        if let Some(n) = self.nodes.get_mut(name) {
            n.last_seen = n.last_seen.max(at);
        }
    }

    /// An agent's heartbeat, passed on by the server without holding up
    /// the agent's stream: `at` is when it arrived, `running` the runs it
    /// listed. A node that was marked not responding while its agent
    /// stayed connected is back: its stale runs are ended there.
    pub fn heartbeat(&mut self, name: &str, at: u64, running: &[JobRun]) {
        let Some(n) = self.nodes.get_mut(name) else {
            return;
        };
        n.last_seen = n.last_seen.max(at);
        if !(n.not_responding && n.connected) {
            return;
        }
        n.not_responding = false;
        let id = n.id;
        tracing::info!(node = %name, "node responding again");
        let running: HashSet<JobRun> = running.iter().copied().collect();
        self.end_strays(at, name, &running);
        let admin = self.admin_state(name);
        let _ = self.sched.handle_node_admin(at, id, admin);
        self.dirty = true;
    }

    pub(super) fn admin_state(&self, name: &str) -> NodeAdmin {
        let Some(n) = self.nodes.get(name) else {
            return NodeAdmin::Down {
                reason: "Unknown".into(),
            };
        };
        if n.not_responding {
            return NodeAdmin::Down {
                reason: "Not responding".into(),
            };
        }
        match &n.admin {
            Some((NodeUpdate::Drain | NodeUpdate::Fail, reason, _, _)) => NodeAdmin::Drain {
                reason: reason.clone(),
            },
            Some((NodeUpdate::Down, reason, _, _)) => NodeAdmin::Down {
                reason: reason.clone(),
            },
            _ if n.leaving.is_some() => NodeAdmin::Drain {
                reason: LEAVING.into(),
            },
            _ => match n.problem.as_ref().or(n.check_failed.as_ref()) {
                Some((why, _)) => NodeAdmin::Drain {
                    reason: format!("node_problem: {why}"),
                },
                None => NodeAdmin::Up,
            },
        }
    }

    /// The agent's connection ended (it may come back).
    pub fn disconnected(&mut self, name: &str) {
        if let Some(n) = self.nodes.get_mut(name) {
            n.connected = false;
        }
    }

    /// The agent says whether it can take work.
    pub(super) fn health(&mut self, node: &str, problem: Option<String>, now: u64) {
        let Some(n) = self.nodes.get_mut(node) else {
            return;
        };
        if n.problem.as_ref().map(|(p, _)| p) == problem.as_ref() {
            return;
        }
        match &problem {
            Some(p) => tracing::warn!(%node, problem = %p, "node unhealthy; draining it"),
            None => tracing::info!(%node, "node healthy again"),
        }
        n.problem = problem.map(|p| (p, now));
        let id = n.id;
        let admin = self.admin_state(node);
        let _ = self.sched.handle_node_admin(now, id, admin);
        self.dirty = true;
    }

    pub(super) fn node_lost(&mut self, now: u64, name: &str, reason: &str) {
        let Some(n) = self.nodes.get_mut(name) else {
            return;
        };
        n.not_responding = true;
        let id = n.id;
        let lost = self
            .sched
            .handle_node_admin(
                now,
                id,
                NodeAdmin::Down {
                    reason: reason.into(),
                },
            )
            .unwrap_or_default();
        for l in lost {
            let (job, requeued) = match l {
                LostJob::Failed(j) => (wire_id(j), false),
                LostJob::Requeued(j) => (wire_id(j), true),
            };
            let Some(j) = self.jobs.get_mut(&job) else {
                continue;
            };
            // The job's other nodes end their part.
            j.release_nodes(Some(name), &mut self.outbox);
            if requeued {
                let ended = j.reset_for_requeue(now, self.cfg.requeue_delay);
                self.account(ended);
            } else {
                j.state = JobState::NodeFail;
                j.end = super::Stamp::at(now);
                j.shed(&mut self.usage, &mut self.unfinished);
                self.stats.finished += 1;
            }
        }
        // Completions that waited on the lost node.
        let waiting: Vec<JobRun> = self
            .jobs
            .live_on_in(name, JobState::Completing)
            .iter()
            .filter_map(|id| self.jobs.get(id))
            .filter(|j| j.cleaning.contains(name))
            .map(JobRecord::run)
            .collect();
        for run in waiting {
            self.cleaned(now, name, run);
        }
        self.dirty = true;
    }

    /// `scontrol update NodeName=… State=…`.
    pub fn update_node(
        &mut self,
        who: Ident,
        names: &str,
        state: NodeUpdate,
        reason: Option<String>,
        now: u64,
    ) -> Result<(), Refusal> {
        if !self.privileged(who) {
            return Err(CtldError::AccessDenied);
        }
        let list = hostlist::expand(names).map_err(|e| CtldError::UnknownNode(e.to_string()))?;
        if let Some(bad) = list.iter().find(|n| !self.nodes.contains_key(*n)) {
            return Err(CtldError::UnknownNode(bad.clone()));
        }
        if state != NodeUpdate::Resume && reason.as_deref().is_none_or(str::is_empty) {
            return Err(CtldError::ReasonRequired);
        }
        if let Some(r) = &reason {
            printable("reason", r)?;
        }
        // RESUME cannot bring back a node whose agent is gone: say so
        // rather than report a change that did not happen.
        if state == NodeUpdate::Resume {
            if let Some(n) = list
                .iter()
                .filter_map(|n| self.nodes.get(n))
                .find(|n| !n.connected)
            {
                return Err(CtldError::NodeNotResponding(n.reg.name.clone()));
            }
        }
        for name in list {
            let Some(n) = self.nodes.get_mut(&name) else {
                continue;
            };
            n.admin = match state {
                NodeUpdate::Resume => None,
                s => Some((s, reason.clone().unwrap_or_default(), who.uid, now)),
            };
            self.nodes_dirty.insert(name.clone());
            if state == NodeUpdate::Resume {
                // Connected (checked above): it answers. A failed active
                // check's drain is the operator's to lift too.
                n.not_responding = false;
                n.check_failed = None;
            }
            let id = n.id;
            if state == NodeUpdate::Down {
                self.node_lost(now, &name, reason.as_deref().unwrap_or("down"));
                if let Some(n) = self.nodes.get_mut(&name) {
                    // Still connected: it answers, it is only out of service.
                    n.not_responding = !n.connected;
                }
            }
            let admin = self.admin_state(&name);
            self.sched
                .handle_node_admin(now, id, admin)
                .map_err(CtldError::Control)?;
        }
        self.dirty = true;
        Ok(())
    }

    /// The node's agent is stopping: drain it; its jobs get `grace_ms`.
    pub(super) fn leaving(&mut self, node: &str, grace_ms: u64, now: u64) {
        let Some(n) = self.nodes.get_mut(node) else {
            return;
        };
        tracing::info!(%node, grace_ms, "agent stopping; draining its node");
        n.leaving = Some((now, now + grace_ms.div_ceil(1000)));
        let id = n.id;
        let admin = self.admin_state(node);
        let _ = self.sched.handle_node_admin(now, id, admin);
        self.dirty = true;
    }

    /// Removes nodes whose agents are leaving once their jobs are done,
    /// or once the grace is over (their jobs then fail or requeue).
    pub(super) fn finish_leaving(&mut self, now: u64) {
        let due: Vec<(String, bool)> = self
            .nodes
            .values()
            .filter_map(|n| {
                let (_, deadline) = n.leaving?;
                let busy = self
                    .sched
                    .node_info(n.id)
                    .is_some_and(|i| !i.jobs.is_empty());
                (!busy || now >= deadline).then(|| (n.reg.name.clone(), busy))
            })
            .collect();
        for (name, busy) in due {
            if busy {
                self.node_lost(now, &name, "node_leaving: grace expired");
            }
            let Some(n) = self.nodes.remove(&name) else {
                continue;
            };
            let _ = self.sched.handle_node_removed(now, n.id);
            self.nodes_dirty.insert(name.clone());
            tracing::info!(node = %name, "node left the cluster");
            self.outbox.push((name, CtldMsg::Farewell));
            self.dirty = true;
        }
    }

    /// `scontrol delete NodeName=…` (operators): each node leaves as if its
    /// agent had been stopped, its jobs given the configured grace.
    pub fn delete_nodes(&mut self, who: Ident, names: &str, now: u64) -> Result<(), Refusal> {
        if !self.privileged(who) {
            return Err(CtldError::AccessDenied);
        }
        let list = hostlist::expand(names).map_err(|e| CtldError::UnknownNode(e.to_string()))?;
        if let Some(bad) = list.iter().find(|n| !self.nodes.contains_key(*n)) {
            return Err(CtldError::UnknownNode(bad.clone()));
        }
        let grace_ms = self.cfg.leave_grace * 1000;
        for name in list {
            self.leaving(&name, grace_ms, now);
        }
        // Idle ones go at once.
        self.finish_leaving(now);
        Ok(())
    }
}
