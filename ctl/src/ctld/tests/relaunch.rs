//! Launches that never reached their node (lost with a connection, or in
//! a controller's send buffers when it died) are sent again when the node
//! registers, and only those: an agent says which it was sent.

use super::*;
use corral_proto::msg::{LaunchKind, Launched};

const IO: StepIo = StepIo {
    addr: std::net::SocketAddr::V4(std::net::SocketAddrV4::new(
        std::net::Ipv4Addr::LOCALHOST,
        9,
    )),
    cert_sha256: [0; 32],
    secret: [1; 32],
};

/// A step from its own srun (`argv` makes its secret), overlapping the
/// job's others (steps here stay open side by side).
fn step(job: JobId, nodes: u32, argv: &str) -> StepSpec {
    let mut io = IO;
    io.secret[..argv.len().min(32)].copy_from_slice(&argv.as_bytes()[..argv.len().min(32)]);
    StepSpec {
        name: None,
        nodes: Some(nodes),
        overlap: true,
        work_dir: "/work".into(),
        env: vec![("STEP_ONLY".into(), "1".into())],
        io,
        ..super::step_spec(job, argv, 0)
    }
}

/// A controller that died and started again from what the first stored
/// (everything it acknowledged), its outbox lost with it.
pub(super) fn restarted(c: &mut Controller, now: u64) -> Controller {
    let changes = c.take_changes();
    let loaded = store::Loaded {
        jobs: changes.jobs.into_iter().filter_map(|(_, r)| r).collect(),
        nodes: changes
            .nodes
            .into_iter()
            .filter_map(|(n, r)| r.map(|r| (n, r)))
            .collect(),
        next_job: changes.next_job,
    };
    let mut c2 = Controller::new(config()).unwrap();
    c2.restore(loaded, now).unwrap();
    c2
}

pub(super) fn registered(
    name: &str,
    instance: u64,
    running: &[JobRun],
    launched: &[Launched],
) -> Registration {
    let mut r = reg(name, 4);
    r.instance = instance;
    r.running = running.to_vec();
    r.launched = launched.to_vec();
    r
}

/// What a node says it was sent of `run`.
fn had(run: JobRun, batch: bool, next: u32) -> Launched {
    Launched { run, batch, next }
}

/// What a launch says, for comparing one with its copy.
fn said(l: &[(String, Launch)]) -> Vec<String> {
    let mut v: Vec<String> = l.iter().map(|(n, l)| format!("{n} {l:?}")).collect();
    v.sort();
    v
}

#[test]
fn a_step_whose_launches_died_with_the_controller_is_sent_again_once() {
    let mut c = cluster(2);
    let mut spec = batch("#!/bin/sh\nsrun hostname\n");
    spec.nodes = Some(2);
    spec.env = vec![("JOB_ENV".into(), "x".into())];
    let id = c.submit(ALICE, spec, 0).unwrap();
    c.schedule(0);
    let first = launches(&mut c);
    assert_eq!(first.len(), 1, "the batch script, on the first node");
    let run = r0(id);
    // Step 0 on both nodes, step 1 on the first only: acknowledged (and
    // stored), but the controller dies before any launch leaves.
    c.submit_step(ALICE, step(id, 2, "hostname"), 5).unwrap();
    c.submit_step(ALICE, step(id, 1, "date"), 6).unwrap();
    let sent = launches(&mut c);
    assert_eq!(sent.len(), 3);
    let mut c = restarted(&mut c, 10);
    // srun for step 1 did not hear its answer and asks again: the same
    // step, not a second one.
    assert_eq!(
        c.submit_step(ALICE, step(id, 1, "date"), 10).unwrap(),
        (id, StepId(1))
    );
    assert!(launches(&mut c).is_empty());
    // worker-0 got the batch script and step 0 (a prefix of its stream),
    // worker-1 nothing.
    let w0 = had(run, true, 1);
    c.register(registered("worker-0", 1, &[run], &[w0]), 11)
        .unwrap();
    c.register(registered("worker-1", 1, &[], &[]), 11).unwrap();
    let again = launches(&mut c);
    let expect: Vec<(String, Launch)> = sent
        .iter()
        .filter(|(n, l)| !(n == "worker-0" && l.step == StepId(0)))
        .cloned()
        .collect();
    assert_eq!(
        said(&again),
        said(&expect),
        "exactly the lost ones, as they were"
    );
    assert!(again
        .iter()
        .all(|(_, l)| l.env.contains(&("JOB_ENV".into(), "x".into()))
            && l.env.contains(&("STEP_ONLY".into(), "1".into()))));
    assert_eq!(state(&c, id), JobState::Running, "adopted, not lost");
    // Registering again with everything: nothing more is sent.
    let all = had(run, true, 2);
    let w1 = had(run, false, 1);
    c.register(registered("worker-0", 1, &[run], &[all]), 12)
        .unwrap();
    c.register(registered("worker-1", 1, &[run], &[w1]), 12)
        .unwrap();
    assert!(launches(&mut c).is_empty());
    // Steps that ended everywhere are not sent again, even to a node
    // that claims to have had nothing.
    for (node, s) in [("worker-0", 0), ("worker-1", 0), ("worker-0", 1)] {
        c.agent_message(
            node,
            AgentMsg::StepExited {
                job: run,
                step: StepId(s),
                exit: ExitStatus::default(),
                oom: false,
            },
            13,
        );
    }
    c.register(registered("worker-1", 1, &[run], &[]), 14)
        .unwrap();
    assert!(launches(&mut c).is_empty());
    c.register(registered("worker-0", 1, &[run], &[]), 14)
        .unwrap();
    let l = launches(&mut c);
    assert_eq!(l.len(), 1);
    assert_eq!(l[0].1.step, StepId::BATCH, "only the script, still running");
    assert!(
        matches!(&l[0].1.what, LaunchKind::Batch { script, .. } if String::from_utf8_lossy(script).contains("srun"))
    );
}

#[test]
fn an_srun_jobs_first_step_lost_with_the_controller_is_sent_again() {
    let mut c = cluster(2);
    let spec = JobSpec {
        nodes: Some(2),
        work_dir: "/w".into(),
        kind: JobKind::Interactive {
            argv: vec!["hostname".into()],
            io: IO,
            files: Default::default(),
        },
        ..JobSpec::default()
    };
    let id = c.submit(ALICE, spec, 0).unwrap();
    c.schedule(0);
    let sent = launches(&mut c);
    assert_eq!(sent.len(), 2);
    let mut c = restarted(&mut c, 5);
    c.register(registered("worker-0", 1, &[], &[]), 6).unwrap();
    c.register(registered("worker-1", 1, &[], &[]), 6).unwrap();
    assert_eq!(said(&launches(&mut c)), said(&sent));
    assert_eq!(state(&c, id), JobState::Running);
}

#[test]
fn a_restarted_agent_is_not_sent_a_run_that_died_with_it() {
    let mut c = cluster(2);
    let mut spec = batch("x");
    spec.nodes = Some(2);
    let id = c.submit(ALICE, spec, 0).unwrap();
    c.schedule(0);
    launches(&mut c);
    c.submit_step(ALICE, step(id, 2, "hostname"), 1).unwrap();
    launches(&mut c);
    let run = r0(id);
    let mut c = restarted(&mut c, 5);
    let w0 = had(run, true, 1);
    c.register(registered("worker-0", 1, &[run], &[w0]), 6)
        .unwrap();
    // worker-1's agent restarted: step 0's part there died with it.
    c.register(registered("worker-1", 7, &[], &[]), 6).unwrap();
    assert!(launches(&mut c).is_empty(), "nothing runs twice");
    // Nothing is heard of it by the end of the recovery window: lost.
    c.tick(6 + 11);
    assert_eq!(state(&c, id), JobState::NodeFail);
}

#[test]
fn a_step_too_large_to_keep_still_runs_and_the_rest_stay_covered() {
    let mut c = cluster(1);
    let id = c.submit(ALICE, batch("x"), 0).unwrap();
    c.schedule(0);
    launches(&mut c);
    // A hostile srun: an environment of 2 MiB (a frame holds 8). It runs,
    // but the record does not keep it to send again.
    let mut huge = step(id, 1, "huge");
    huge.env = vec![("BIG".into(), "x".repeat(2 << 20))];
    let (_, s0) = c.submit_step(ALICE, huge, 1).unwrap();
    let l = launches(&mut c);
    assert_eq!(l.len(), 1);
    assert_eq!(l[0].1.step, s0);
    assert!(c.jobs.get(&id).unwrap().open_steps.is_empty());
    // A normal step after it is kept, and sent again to a node that lacks it.
    let (_, s1) = c.submit_step(ALICE, step(id, 1, "small"), 2).unwrap();
    launches(&mut c);
    assert_eq!(c.jobs.get(&id).unwrap().open_steps.len(), 1);
    let run = r0(id);
    c.register(registered("worker-0", 1, &[run], &[had(run, true, 1)]), 3)
        .unwrap();
    let again: Vec<StepId> = launches(&mut c).iter().map(|(_, l)| l.step).collect();
    assert_eq!(again, [s1]);
}

/// What `c` would send now of `Terminate`, by node.
fn terminates(c: &mut Controller) -> Vec<(String, JobRun)> {
    c.take_outbox()
        .into_iter()
        .filter_map(|(n, m)| match m {
            CtldMsg::Terminate { job, .. } => Some((n, job)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_terminate_lost_with_the_controller_is_sent_again_to_a_node_still_running_the_run() {
    // Found by the fleet test: the script exited and COMPLETING was
    // stored, but the controller died before its Terminate left. The
    // node registers again still holding the run and waits for a
    // Terminate that never came; the job stayed COMPLETING for good.
    let mut c = cluster(2);
    let mut spec = batch("x");
    spec.nodes = Some(2);
    let id = c.submit(ALICE, spec, 0).unwrap();
    c.schedule(0);
    launches(&mut c);
    let run = r0(id);
    c.agent_message(
        "worker-0",
        AgentMsg::StepExited {
            job: run,
            step: StepId::BATCH,
            exit: ExitStatus::default(),
            oom: false,
        },
        3,
    );
    assert_eq!(state(&c, id), JobState::Completing);
    assert_eq!(terminates(&mut c).len(), 2, "one to each node");
    let mut c = restarted(&mut c, 5);
    // worker-0 still holds the run; worker-1 had already cleaned it.
    let w0 = had(run, true, 0);
    c.register(registered("worker-0", 1, &[run], &[w0]), 6)
        .unwrap();
    c.register(registered("worker-1", 1, &[], &[]), 6).unwrap();
    assert_eq!(
        terminates(&mut c),
        vec![("worker-0".to_string(), run)],
        "again to the node that still runs it, and only there"
    );
    assert_eq!(state(&c, id), JobState::Completing);
    c.agent_message(
        "worker-0",
        AgentMsg::JobCleaned {
            job: run,
            usage: Default::default(),
        },
        7,
    );
    assert_eq!(state(&c, id), JobState::Completed);
}

/// Records read back from the store each bring their partition's name as
/// a string of their own; the restored table shares one again.
#[test]
fn restored_jobs_share_their_partitions_name() {
    let mut c = cluster(1);
    let a = c.submit(ALICE, super::batch("#!/bin/sh\n"), 0).unwrap();
    let b = c.submit(ALICE, super::batch("#!/bin/sh\n"), 0).unwrap();
    let shared = |c: &Controller| {
        let (ja, jb) = (c.jobs.get(&a).unwrap(), c.jobs.get(&b).unwrap());
        assert_eq!(&*ja.partition, "gpu");
        std::sync::Arc::ptr_eq(&ja.partition, &jb.partition)
    };
    assert!(shared(&c), "submissions share the name");
    let c2 = restarted(&mut c, 1);
    assert!(shared(&c2), "and so do the records read back");
}

/// A batch job stored as running whose run then ended on its node while
/// the controller could not store that (a full disk), and whose agent
/// has since forgotten the ended run: after a restart the agent's word
/// stands. The job ends, its CPUs are free, and nothing is launched
/// again; a run started after the agent last forgot anything, which the
/// agent does not know, is a launch that never arrived and is sent again.
#[test]
fn a_run_that_ended_unheard_and_was_forgotten_is_ended_not_adopted() {
    let mut c = cluster(1);
    let mut whole = batch("#!/bin/sh\ntrue\n");
    whole.ntasks = Some(8);
    let id = c.submit(ALICE, whole.clone(), 0).unwrap();
    c.schedule(0);
    assert_eq!(launches(&mut c).len(), 1);
    let mut c = restarted(&mut c, 2000);
    let mut r = registered("worker-0", 1, &[], &[]);
    r.forgot_ended_before = 1_000_000;
    c.register(r, 2000).unwrap();
    assert!(launches(&mut c).is_empty(), "not launched a second time");
    let v = view(&c, id);
    assert_eq!(v.state, JobState::NodeFail);
    assert!(
        v.failure
            .as_deref()
            .is_some_and(|f| f.contains("could not store its end")),
        "{v:?}"
    );
    // Its CPUs are free: a job of the whole node starts.
    let next = c.submit(ALICE, whole.clone(), 2001).unwrap();
    c.schedule(2001);
    assert_eq!(state(&c, next), JobState::Running);

    // Started after the agent forgot anything: a lost launch, sent again.
    let mut c = cluster(1);
    let id = c.submit(ALICE, whole, 3000).unwrap();
    c.schedule(3000);
    let first = launches(&mut c);
    let mut c = restarted(&mut c, 3010);
    let mut r = registered("worker-0", 1, &[], &[]);
    r.forgot_ended_before = 1_000_000;
    c.register(r, 3010).unwrap();
    assert_eq!(said(&launches(&mut c)), said(&first));
    assert_eq!(state(&c, id), JobState::Running);
}
