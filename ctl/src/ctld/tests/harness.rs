//! A controller with fake agents in virtual time, for lifecycle stories:
//! `Sim::new(2)`, `sim.submit(job().runs(30))`, `sim.run_for(60)`, then ask
//! what state each job reached and what each node still runs.
//!
//! A fake agent does what the real one does with ctld's messages, in the
//! order they arrive: a `Launch` starts a step that "exits" after the job's
//! planned run time with its planned code; `Signal` and `Terminate` end the
//! run's steps (a terminated step exits by signal), after which it answers
//! `JobCleaned`; a heartbeat each second lists what it runs. An agent taken
//! away answers nothing, as a node whose network died.

use std::collections::{BTreeMap, HashMap};

use super::*;
use corral_proto::msg::StepId;

/// A job for the story: its spec, how long its tasks run and how they end.
#[derive(Clone, Debug)]
pub struct Plan {
    pub spec: JobSpec,
    pub runs: u64,
    pub code: i32,
}

/// A batch job that runs 10 s and succeeds.
pub fn job() -> Plan {
    Plan {
        spec: batch("#!/bin/sh\ntrue\n"),
        runs: 10,
        code: 0,
    }
}

impl Plan {
    pub fn runs(mut self, secs: u64) -> Self {
        self.runs = secs;
        self
    }
    pub fn exits(mut self, code: i32) -> Self {
        self.code = code;
        self
    }
    pub fn limit(mut self, secs: u64) -> Self {
        self.spec.time_limit = Some(secs);
        self
    }
    pub fn requeue(mut self) -> Self {
        self.spec.requeue = true;
        self
    }
    pub fn nodes(mut self, n: u32) -> Self {
        self.spec.nodes = Some(n);
        self
    }
    pub fn on(mut self, node: &str) -> Self {
        self.spec.nodelist = vec![node.into()];
        self
    }
}

/// One step running on a fake node.
#[derive(Clone, Copy, Debug)]
struct Task {
    ends: u64,
    exit: ExitStatus,
}

#[derive(Debug, Default)]
struct FakeAgent {
    /// Taken away: hears nothing, says nothing.
    gone: bool,
    /// Steps running here, by run and step.
    tasks: BTreeMap<(JobRun, StepId), Task>,
    /// ctld said the node has left.
    farewell: bool,
    /// Runs stopped by `scontrol suspend`, since when.
    frozen: BTreeMap<JobRun, u64>,
}

impl FakeAgent {
    fn running(&self) -> Vec<JobRun> {
        let mut v: Vec<JobRun> = self.tasks.keys().map(|(r, _)| *r).collect();
        v.dedup();
        v
    }
}

/// The controller and its fake nodes.
#[derive(Debug)]
pub struct Sim {
    pub c: Controller,
    pub now: u64,
    agents: BTreeMap<String, FakeAgent>,
    plans: HashMap<JobId, Plan>,
    /// What the controller stored so far, as a store would hold it.
    stored: Stored,
}

/// A store's contents: job records, node records, the next job id.
#[derive(Debug, Default)]
struct Stored {
    jobs: BTreeMap<u64, Vec<u8>>,
    nodes: BTreeMap<String, Vec<u8>>,
    next_job: u64,
}

impl Sim {
    /// `n` nodes `worker-<i>` with 8 CPUs and 4 GPUs each.
    pub fn new(n: usize) -> Self {
        Sim::with(config(), n)
    }

    /// Like [`Sim::new`], with this configuration.
    pub fn with(cfg: Config, n: usize) -> Self {
        let mut sim = Sim {
            c: Controller::new(cfg).expect("the test configuration is valid"),
            now: 0,
            agents: BTreeMap::new(),
            plans: HashMap::new(),
            stored: Default::default(),
        };
        for i in 0..n {
            let name = format!("worker-{i}");
            sim.c
                .register(reg(&name, 4), 0)
                .expect("a fresh node registers");
            sim.agents.insert(name, FakeAgent::default());
        }
        sim
    }

    /// Submits as Alice; the job starts at the next pass.
    pub fn submit(&mut self, plan: Plan) -> JobId {
        let id = self
            .c
            .submit(ALICE, plan.spec.clone(), self.now)
            .expect("the story's job is accepted");
        self.plans.insert(id, plan);
        id
    }

    /// The node stops answering (its agent, or its network, died).
    pub fn take_away(&mut self, node: &str) {
        if let Some(a) = self.agents.get_mut(node) {
            a.gone = true;
        }
    }

    /// The node's agent stops (SIGTERM): it asks to leave with `grace`
    /// seconds for its jobs.
    pub fn stop_agent(&mut self, node: &str, grace: u64) {
        self.c.agent_message(
            node,
            AgentMsg::Leaving {
                grace_ms: grace * 1000,
            },
            self.now,
        );
        self.deliver();
    }

    /// Whether ctld told the node's agent it has left.
    pub fn farewell(&self, node: &str) -> bool {
        self.agents.get(node).is_some_and(|a| a.farewell)
    }

    /// Whether the fake node holds the run stopped.
    pub fn frozen_on(&self, node: &str, run: JobRun) -> bool {
        self.agents
            .get(node)
            .is_some_and(|a| a.frozen.contains_key(&run))
    }

    /// What the fake node still runs.
    pub fn running_on(&self, node: &str) -> Vec<JobRun> {
        self.agents
            .get(node)
            .map(FakeAgent::running)
            .unwrap_or_default()
    }

    pub fn state(&self, id: JobId) -> JobState {
        state(&self.c, id)
    }

    pub fn view(&self, id: JobId) -> JobView {
        view(&self.c, id)
    }

    /// Hands ctld's messages to the agents and their answers back, until
    /// nothing more is said at this instant.
    pub fn deliver(&mut self) {
        loop {
            let outbox = self.c.take_outbox();
            if outbox.is_empty() {
                return;
            }
            for (node, msg) in outbox {
                let replies = self.agent_hears(&node, msg);
                for r in replies {
                    self.c.agent_message(&node, r, self.now);
                }
            }
        }
    }

    fn agent_hears(&mut self, node: &str, msg: CtldMsg) -> Vec<AgentMsg> {
        let now = self.now;
        let Some(agent) = self.agents.get_mut(node).filter(|a| !a.gone) else {
            return Vec::new();
        };
        match msg {
            CtldMsg::Launch(l) => {
                // A task of an array runs its array's plan.
                let plan = self
                    .plans
                    .get(&l.job)
                    .or_else(|| self.plans.get(&l.array?.job));
                let (runs, code) = plan.map_or((1, 0), |p| (p.runs, p.code));
                agent.tasks.insert(
                    (l.job_run(), l.step),
                    Task {
                        ends: now + runs,
                        exit: ExitStatus { code, signal: None },
                    },
                );
                Vec::new()
            }
            CtldMsg::Signal { job, .. } | CtldMsg::Terminate { job, .. } => {
                let killed = matches!(msg, CtldMsg::Terminate { .. });
                let mut out = Vec::new();
                if killed {
                    agent.frozen.remove(&job);
                }
                let here: Vec<(JobRun, StepId)> = agent
                    .tasks
                    .keys()
                    .filter(|(r, _)| r.job == job.job && r.run <= job.run)
                    .copied()
                    .collect();
                for key in here {
                    agent.tasks.remove(&key);
                    out.push(AgentMsg::StepExited {
                        job: key.0,
                        step: key.1,
                        exit: ExitStatus {
                            code: 128 + 15,
                            signal: Some(15),
                        },
                        oom: false,
                    });
                }
                if killed {
                    out.push(AgentMsg::JobCleaned { job, usage: None });
                }
                out
            }
            CtldMsg::Suspend { job, stop } => {
                // A stopped task's end moves by the time it was stopped.
                match (stop, agent.frozen.get(&job).copied()) {
                    (true, None) => {
                        agent.frozen.insert(job, now);
                    }
                    (false, Some(since)) => {
                        agent.frozen.remove(&job);
                        for ((r, _), t) in agent.tasks.iter_mut() {
                            if *r == job {
                                t.ends += now - since;
                            }
                        }
                    }
                    _ => {}
                }
                Vec::new()
            }
            CtldMsg::Farewell => {
                agent.farewell = true;
                Vec::new()
            }
            CtldMsg::Welcome { .. } | CtldMsg::Refused { .. } => Vec::new(),
        }
    }

    /// One second: tasks due end, every agent beats, ctld ticks and
    /// passes, and messages flow until all is said.
    pub fn step(&mut self) {
        self.now += 1;
        let now = self.now;
        let mut said: Vec<(String, AgentMsg)> = Vec::new();
        for (name, a) in self.agents.iter_mut().filter(|(_, a)| !a.gone) {
            let due: Vec<(JobRun, StepId)> = a
                .tasks
                .iter()
                .filter(|((r, _), t)| t.ends <= now && !a.frozen.contains_key(r))
                .map(|(k, _)| *k)
                .collect();
            for key in due {
                if let Some(t) = a.tasks.remove(&key) {
                    said.push((
                        name.clone(),
                        AgentMsg::StepExited {
                            job: key.0,
                            step: key.1,
                            exit: t.exit,
                            oom: false,
                        },
                    ));
                }
            }
            said.push((
                name.clone(),
                AgentMsg::Heartbeat {
                    running: a.running(),
                },
            ));
        }
        for (node, m) in said {
            self.c.agent_message(&node, m, now);
        }
        self.deliver();
        self.c.tick(now);
        if self.c.take_dirty() {
            self.c.schedule(now);
        }
        self.deliver();
        // As the server after each call: what changed goes to the store.
        self.store();
    }

    /// What changed goes to the sim's store.
    pub fn store(&mut self) {
        let changes = self.c.take_changes();
        for (id, r) in changes.jobs {
            match r {
                Some(r) => self.stored.jobs.insert(id, r),
                None => self.stored.jobs.remove(&id),
            };
        }
        for (n, r) in changes.nodes {
            match r {
                Some(r) => self.stored.nodes.insert(n, r),
                None => self.stored.nodes.remove(&n),
            };
        }
        self.stored.next_job = changes.next_job;
    }

    /// A controller started again from what this one stored (its outbox
    /// and anything not stored lost with it), at `now`; no node has
    /// registered with it yet.
    pub fn restarted(&mut self) -> Controller {
        self.store();
        let loaded = crate::ctld::store::Loaded {
            jobs: self.stored.jobs.values().cloned().collect(),
            nodes: self
                .stored
                .nodes
                .iter()
                .map(|(n, r)| (n.clone(), r.clone()))
                .collect(),
            next_job: self.stored.next_job,
        };
        let mut c = Controller::new(config()).expect("the test configuration is valid");
        c.restore(loaded, self.now).expect("restored");
        c
    }

    /// Whether the sim's store holds the job's record.
    pub fn stored_job(&self, id: JobId) -> bool {
        self.stored.jobs.contains_key(&id.0)
    }

    pub fn run_for(&mut self, secs: u64) {
        for _ in 0..secs {
            self.step();
        }
    }
}
