//! What the controller keeps across restarts: each call's changes for the
//! store ([`Controller::take_changes`]), and a restart from them
//! ([`Controller::restore`]): pending jobs queue again with their ids and
//! submit times; running and completing jobs are adopted back onto their
//! exact CPUs and GPUs as their nodes register, and no pass runs until
//! they are (or until the recovery window ends, when a job whose nodes
//! did not come back, or came back without it, is lost as on a node
//! failure).

use std::collections::HashSet;

use corral_proto::msg::{JobId, JobRun, JobState, NodeUpdate};

use super::store::{Changes, Loaded};
use super::wire::core_id;
use super::{Controller, JobRecord};

/// An operator's drain or down, as stored: (state, reason, by, at).
type Admin = (NodeUpdate, String, u32, u64);

fn encode<T: serde::Serialize>(v: &T) -> Vec<u8> {
    // Plain data into a Vec cannot fail to encode.
    bincode::serde::encode_to_vec(v, bincode::config::standard()).unwrap_or_default()
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    bincode::serde::decode_from_slice(bytes, bincode::config::standard())
        .map(|(v, _)| v)
        .map_err(|e| e.to_string())
}

impl Controller {
    /// What changed since the last call: records to write or delete,
    /// operators' node states, the next job id.
    pub fn take_changes(&mut self) -> Changes {
        self.sync_arrays();
        let ids = self.jobs.take_dirty();
        // Before the records are encoded: each is stored marked as
        // accounted, in the same transaction as its accounting record.
        let ids: Vec<JobId> = ids.into_iter().collect();
        self.account_ended(&ids);
        // A job that ended (or is gone) no longer needs its payload.
        for id in &ids {
            match self.jobs.get_mut_unstored(id) {
                Some(j) if j.payload_stored && j.state.is_final() => {
                    j.payload_stored = false;
                    self.payloads_out.push((id.0, None));
                }
                Some(_) => {}
                None if self.cfg.state_dir.is_some() => self.payloads_out.push((id.0, None)),
                None => {}
            }
        }
        let jobs = ids
            .into_iter()
            .map(|id| (id.0, self.jobs.get(&id).map(encode)))
            .collect();
        let acct = self.take_acct().iter().map(encode).collect();
        // Every registered node, with its operator state: a restart waits
        // for them.
        let nodes = std::mem::take(&mut self.nodes_dirty)
            .into_iter()
            .map(|name| {
                let rec = self.nodes.get(&name).map(|n| encode(&n.admin));
                (name, rec)
            })
            .collect();
        Changes {
            jobs,
            nodes,
            acct,
            payloads: std::mem::take(&mut self.payloads_out),
            next_job: self.next_job,
        }
    }

    /// Rebuilds the state a store held. Call before any agent registers.
    pub fn restore(&mut self, loaded: Loaded, now: u64) -> Result<(), String> {
        let mut max_id = 0;
        for bytes in &loaded.jobs {
            let mut j: JobRecord = decode(bytes)?;
            max_id = max_id.max(j.id.0);
            let id = j.id;
            if j.array.as_deref().is_some_and(|a| a.task.is_none()) {
                let tasks = j.spec().array.map_or(0, |a| a.len());
                if let Some(a) = j.array.as_deref_mut() {
                    a.tasks = tasks;
                }
            }
            if !j.state.is_final() && j.bytes != u64::MAX {
                let weight = j.weight();
                let u = self.usage.entry(j.user.uid).or_default();
                u.jobs += weight;
                u.bytes += j.bytes;
                self.unfinished += weight;
            }
            if j.state.is_final() {
                j.keep(&mut self.usage);
            }
            if j.state == JobState::Pending && j.spec().kill_on_invalid_dep {
                self.kill_on_invalid_dep.insert(id);
            }
            match j.state {
                JobState::Pending => self.requeue_after_recovery.push(id),
                JobState::Running | JobState::Completing => {
                    self.adopting.insert(id);
                }
                _ => {}
            }
            // Read back as it was: nothing to store again.
            self.jobs.restore(j);
        }
        for (name, bytes) in &loaded.nodes {
            let admin: Option<Admin> = decode(bytes)?;
            if let Some(a) = admin {
                self.restored_admin.insert(name.clone(), a);
            }
            self.awaiting_nodes.insert(name.clone());
        }
        self.requeue_after_recovery.sort_unstable();
        self.next_job = loaded.next_job.max(max_id + 1);
        // Until the nodes are back (or a heartbeat timeout), nothing is
        // placed: running jobs must hold their resources first.
        self.recovering_until = now + self.cfg.heartbeat_timeout;
        if self.awaiting_nodes.is_empty() {
            self.finish_recovery(now);
        }
        self.dirty = true;
        tracing::info!(
            jobs = loaded.jobs.len(),
            adopting = self.adopting.len(),
            next_job = self.next_job,
            "state restored"
        );
        Ok(())
    }

    /// Whether passes wait for the restart's recovery.
    pub(super) fn recovering(&self) -> bool {
        self.recovering_until != 0
    }

    /// A node registered after a restart: once all the store knew are
    /// back, the recovery ends.
    pub(super) fn node_returned(&mut self, now: u64, name: &str) {
        if self.awaiting_nodes.remove(name) && self.awaiting_nodes.is_empty() {
            self.finish_recovery(now);
        }
    }

    /// Node `node` registered: restored jobs on it whose nodes are all
    /// here now are adopted back onto them.
    pub(super) fn adopt_ready(&mut self, now: u64, node: &str) {
        let ready: Vec<JobId> = self
            .jobs
            .live_on(node)
            .into_iter()
            .filter(|id| self.adopting.contains(id))
            .filter(|id| {
                self.jobs.get(id).is_some_and(|j| {
                    j.alloc.iter().all(|(n, _)| {
                        self.nodes
                            .get(n)
                            .is_some_and(|r| r.connected && !r.not_responding)
                    })
                })
            })
            .collect();
        for id in ready {
            self.adopting.remove(&id);
            let Some(j) = self.jobs.get(&id) else {
                continue;
            };
            let alloc = j
                .alloc
                .iter()
                .filter_map(|(n, a)| self.nodes.get(n).map(|r| a.on(r.id)))
                .collect();
            let req = j.core_request();
            let start = j.start.get().unwrap_or(now);
            let suspension = j.suspension;
            let adopted = self
                .sched
                .adopt(j.submit, start, core_id(id), req, alloc)
                .and_then(|end_by| match suspension {
                    // Its suspensions: the time they took is not counted,
                    // and one still going goes on.
                    Some(s) => self
                        .sched
                        .restore_suspension(core_id(id), s.paused, s.since)
                        .map_err(Into::into),
                    None => Ok(end_by),
                });
            match adopted {
                Ok(end_by) => {
                    if let Some(j) = self.jobs.get_mut(&id) {
                        j.end_by = (end_by < scheduler_core::INFINITE).then_some(end_by).into();
                    }
                    tracing::info!(job = %id, "running job adopted after a restart");
                }
                Err(e) => self.lose_restored(now, id, &format!("not adopted: {e}"), true),
            }
        }
        self.dirty = true;
    }

    /// The recovery window ended: restored jobs whose nodes did not come
    /// back are lost as on a node failure.
    pub(super) fn end_recovery(&mut self, now: u64) {
        if self.recovering_until != 0 && now >= self.recovering_until {
            self.finish_recovery(now);
        }
    }

    /// The end of a restart's recovery: jobs not adopted are lost, and
    /// pending jobs queue again.
    fn finish_recovery(&mut self, now: u64) {
        if self.recovering_until == 0 {
            return;
        }
        self.recovering_until = 0;
        self.awaiting_nodes.clear();
        let left: Vec<JobId> = self.adopting.drain().collect();
        for id in left {
            self.lose_restored(now, id, "its nodes did not come back", true);
        }
        // Adopted, but a node came back without it and never said it
        // ended: its processes died with that node's agent.
        let missing: Vec<JobId> = self.missing_runs.drain().collect();
        for id in missing {
            if self
                .jobs
                .get(&id)
                .is_some_and(|j| j.state == JobState::Running)
            {
                let _ = self.sched.handle_job_finished(
                    now,
                    core_id(id),
                    scheduler_core::JobOutcome::NodeFail,
                );
                self.lose_restored(now, id, "its node came back without it", true);
            }
        }
        for id in std::mem::take(&mut self.requeue_after_recovery) {
            // Cancelled meanwhile: nothing to queue.
            let Some(j) = self.jobs.get(&id).filter(|j| j.state == JobState::Pending) else {
                continue;
            };
            let req = j.core_request();
            if let Err(e) = self.sched.submit(j.submit, core_id(id), req) {
                if let Some(j) = self.jobs.get_mut(&id) {
                    j.state = JobState::Failed;
                    j.failure = Some(format!("not queued again after a restart: {e}").into());
                    j.end = super::Stamp::at(now);
                    j.shed(&mut self.usage, &mut self.unfinished);
                }
            }
        }
        self.dirty = true;
    }

    /// A restored job that cannot be adopted: requeued if it asked, else
    /// NODE_FAIL; whatever of it still runs is ended.
    fn lose_restored(&mut self, now: u64, id: JobId, why: &str, may_requeue: bool) {
        tracing::warn!(job = %id, why, "running job lost across a restart");
        let Some(j) = self.jobs.get_mut(&id) else {
            return;
        };
        j.release_nodes(None, &mut self.outbox);
        let adopted = self.sched.job_status(core_id(id)).is_some();
        if may_requeue && j.spec().requeue && j.state == JobState::Running && !adopted {
            let ended = j.reset_for_requeue(now, self.cfg.requeue_delay);
            let req = j.core_request();
            let submit = j.submit;
            self.account(ended);
            let _ = self.sched.submit(submit, core_id(id), req);
        } else {
            if j.state == JobState::Running {
                j.state = JobState::NodeFail;
            } else {
                // It was completing: what it did stands.
                j.state = if j.exit.success() {
                    JobState::Completed
                } else {
                    JobState::Failed
                };
            }
            if j.end.is_none() {
                j.end = super::Stamp::at(now);
            }
            if !may_requeue && j.failure.is_none() {
                j.failure = Some(why.into());
            }
            j.shed(&mut self.usage, &mut self.unfinished);
            self.stats.finished += 1;
        }
    }

    /// Runs `name` listed when it registered, checked against restored
    /// jobs. A restored running job placed there by another agent than
    /// this one died with that agent (it restarted): it is lost at the end
    /// of the recovery window unless heard of. One placed by this agent
    /// whose first step the agent was sent is in its list; one whose
    /// launch never arrived gets it again ([`Controller::send_missed_launches`]).
    /// One whose first step this agent neither runs nor remembers, though
    /// it started before the agent forgot ended runs (`forgot`, Unix ms),
    /// ended here while this controller could not store its end: the
    /// agent's word stands, and it is ended now, neither adopted (it would
    /// hold its resources for ever) nor launched or queued again (it ran).
    pub(super) fn runs_on_return(
        &mut self,
        now: u64,
        name: &str,
        instance: u64,
        forgot: u64,
        running: &HashSet<JobRun>,
        launched: &[corral_proto::msg::Launched],
    ) {
        let restored: Vec<JobId> = self
            .jobs
            .live_on(name)
            .into_iter()
            .filter(|id| self.adopting.contains(id))
            .collect();
        let mut missing = Vec::new();
        let mut ended = Vec::new();
        for id in restored {
            let Some(j) = self.jobs.get(&id) else {
                continue;
            };
            if j.state != JobState::Running || running.contains(&j.run()) {
                continue;
            }
            if j.alloc
                .iter()
                .any(|(n, a)| n == name && a.agent != instance)
            {
                missing.push(id);
                continue;
            }
            let remembered = launched.iter().any(|l| l.run == j.run());
            // Clocks of two hosts: a few seconds either way.
            let forgotten = forgot > 0
                && j.start
                    .get()
                    .is_some_and(|s| s.saturating_mul(1000) <= forgot.saturating_add(5000));
            if j.primary_left.contains(name) && !remembered && forgotten {
                ended.push(id);
            }
        }
        self.missing_runs.extend(missing);
        for id in ended {
            self.adopting.remove(&id);
            self.lose_restored(
                now,
                id,
                &format!("its run ended on {name} while the controller could not store its end"),
                false,
            );
        }
    }
}
