//! The controller's state machine, driven without a network.

use super::*;

mod arrays;
mod harness;
mod relaunch;
mod stories;
use corral_proto::msg::{
    AgentMsg, CtldMsg, ExitStatus, GpuAsk, GpuInfo, Ident, JobFilter, JobKind, JobReason, JobRun,
    JobSpec, JobState, JobUsage, JobView, Launch, NodeUpdate, NodeView, Registration, StepIo,
    StepSpec, JOBS_PER_PAGE,
};

/// A node's state in Slurm's long words, `*` when not responding.
fn node_state(n: &NodeView) -> String {
    let star = if n.not_responding { "*" } else { "" };
    format!("{}{star}", crate::cli::words::node_state_long(n))
}

const ALICE: Ident = Ident {
    uid: 1000,
    gid: 1000,
};
const BOB: Ident = Ident {
    uid: 1001,
    gid: 1001,
};
const ROOT: Ident = Ident { uid: 0, gid: 0 };

/// The first run of a job.
fn r0(job: JobId) -> JobRun {
    JobRun { job, run: 0 }
}

/// The tests' cluster. A requeued job may start again at once (Slurm's
/// two-minute `requeue_delay` is tested on its own), so stories of node
/// loss read without the wait.
fn config() -> Config {
    config_with("requeue_delay = 0")
}

/// The tests' cluster with other top-level settings.
fn config_with(settings: &str) -> Config {
    Config::parse(
        std::path::Path::new("t.toml"),
        &format!("heartbeat_timeout = 10\nkill_wait = 5\n{settings}\n[[partition]]\nname = \"gpu\"\nnodes = \"worker-[0-3]\"\ndefault = true\n"),
    )
    .unwrap()
}

fn reg(name: &str, gpus: u32) -> Registration {
    Registration {
        name: name.into(),
        cpus: 8,
        memory_mb: 16_000,
        gpus: (0..gpus)
            .map(|i| GpuInfo {
                index: i,
                uuid: format!("GPU-{name}-{i}"),
                memory_mb: 1000,
                group: 0,
                model: String::new(),
            })
            .collect(),
        features: vec![],
        credential_key: vec![7; 32],
        running: vec![],
        launched: Vec::new(),
        forgot_ended_before: 0,
        instance: 1,
        agent_version: "t".into(),
        os: String::new(),
    }
}

/// One node, `worker-0`, under these settings (top-level keys, then
/// tables such as `[limits]`).
fn cluster_with(settings: &str) -> Controller {
    let mut c = Controller::new(config_with(settings)).unwrap();
    c.register(reg("worker-0", 4), 0).unwrap();
    c
}

fn cluster(nodes: usize) -> Controller {
    let mut c = Controller::new(config()).unwrap();
    for i in 0..nodes {
        c.register(reg(&format!("worker-{i}"), 4), 0).unwrap();
    }
    c
}

fn batch(script: &str) -> JobSpec {
    JobSpec {
        name: "job".into(),
        work_dir: "/tmp".into(),
        kind: JobKind::Batch {
            script: script.into(),
            args: vec![],
            stdout: None,
            stderr: None,
        },
        ..JobSpec::default()
    }
}

/// A step of `job` from its own srun running `argv`, with srun's
/// defaults (the job's nodes, no GPUs of its own, holding all of the
/// job's CPUs there); `secret` tells one srun from another.
fn step_spec(job: JobId, argv: &str, secret: u8) -> StepSpec {
    StepSpec {
        name: None,
        job,
        nodes: None,
        ntasks: None,
        gpus_per_node: None,
        overlap: false,
        exact: false,
        cpus_per_task: None,
        nodelist: vec![],
        exclude: vec![],
        files: Default::default(),
        argv: vec![argv.into()],
        work_dir: "/tmp".into(),
        env: vec![],
        io: StepIo {
            addr: "127.0.0.1:9".parse().unwrap(),
            cert_sha256: [0; 32],
            secret: [secret; 32],
        },
    }
}

fn launches(c: &mut Controller) -> Vec<(String, Launch)> {
    c.take_outbox()
        .into_iter()
        .filter_map(|(n, m)| match m {
            CtldMsg::Launch(l) => Some((n, l)),
            _ => None,
        })
        .collect()
}

fn state(c: &Controller, id: JobId) -> JobState {
    c.job_views(
        &JobFilter {
            ids: vec![id],
            ..Default::default()
        },
        0,
    )[0]
    .state
}

#[test]
fn batch_job_runs_completes_and_frees_its_node() {
    let mut c = cluster(2);
    let id = c.submit(ALICE, batch("#!/bin/sh\ntrue\n"), 10).unwrap();
    assert_eq!(state(&c, id), JobState::Pending);
    assert_eq!(c.schedule(10), 1);
    let l = launches(&mut c);
    assert_eq!(l.len(), 1, "a batch script runs on the first node only");
    let (node, launch) = &l[0];
    assert_eq!(launch.step, StepId::BATCH);
    assert_eq!(state(&c, id), JobState::Running);
    c.agent_message(
        node,
        AgentMsg::StepExited {
            job: r0(id),
            step: StepId::BATCH,
            exit: ExitStatus::default(),
            oom: false,
        },
        12,
    );
    assert_eq!(state(&c, id), JobState::Completing);
    let terms: Vec<_> = c.take_outbox();
    assert!(matches!(terms[0].1, CtldMsg::Terminate { job, .. } if job == r0(id)));
    c.agent_message(
        node,
        AgentMsg::JobCleaned {
            job: r0(id),
            usage: None,
        },
        12,
    );
    assert_eq!(state(&c, id), JobState::Completed);
    assert!(c.node_views().iter().all(|n| node_state(n) == "idle"));
}

/// A batch job on one node whose agent reports its end and its clean
/// node in one message: no Terminate goes out, the job ends with the
/// script's code and the node's usage, and the node is free at once.
/// Sent again (a new connection), the message changes nothing.
#[test]
fn a_batch_job_alone_on_its_node_ends_in_one_message() {
    let mut c = cluster(2);
    let id = c.submit(ALICE, batch("#!/bin/sh\nexit 3\n"), 10).unwrap();
    assert_eq!(c.schedule(10), 1);
    let (node, _) = launches(&mut c).remove(0);
    let done = AgentMsg::BatchDone {
        job: r0(id),
        exit: ExitStatus {
            code: 3,
            signal: None,
        },
        oom: false,
        usage: Some(JobUsage {
            cpu_ms: 40,
            max_rss_kb: 512,
        }),
    };
    c.agent_message(&node, done.clone(), 12);
    let out = c.take_outbox();
    assert!(
        !out.iter()
            .any(|(_, m)| matches!(m, CtldMsg::Terminate { .. })),
        "{out:?}"
    );
    let v = &c.job_views(&JobFilter::default(), 12)[0];
    assert_eq!(v.state, JobState::Failed);
    assert_eq!(v.exit.code, 3);
    assert_eq!(v.usage.map(|u| (u.cpu_ms, u.max_rss_kb)), Some((40, 512)));
    assert!(c.node_views().iter().all(|n| node_state(n) == "idle"));
    c.agent_message(&node, done, 13);
    assert!(c.take_outbox().is_empty());
    let v = &c.job_views(&JobFilter::default(), 13)[0];
    assert_eq!((v.state, v.exit.code), (JobState::Failed, 3));
    assert_eq!(v.usage.map(|u| u.cpu_ms), Some(40), "usage counted once");
    // A process killed for memory: OUT_OF_MEMORY, as with StepExited.
    let id = c.submit(ALICE, batch("x"), 14).unwrap();
    c.schedule(14);
    let (node, _) = launches(&mut c).remove(0);
    c.agent_message(
        &node,
        AgentMsg::BatchDone {
            job: r0(id),
            exit: ExitStatus {
                code: 137,
                signal: Some(9),
            },
            oom: true,
            usage: None,
        },
        15,
    );
    assert_eq!(state(&c, id), JobState::OutOfMemory);
    // Shown as Slurm's accounting records it (checked on 22.05): 0:125.
    let oom = c.jobs.get(&id).unwrap().acct(15);
    let oom_exit = ExitStatus {
        code: 0,
        signal: Some(125),
    };
    assert_eq!(oom.exit, oom_exit);
    let steps: Vec<_> = oom.steps.iter().map(|s| (s.state, s.exit)).collect();
    assert_eq!(steps, [(JobState::OutOfMemory, oom_exit)]);
}

/// The batch step ends on its own while a cancel's Terminate is on its
/// way: the node's one message ends the clean-up (the job stays
/// CANCELLED), and the agent's later answer to the Terminate is news of
/// nothing.
#[test]
fn a_batch_end_that_crosses_a_cancel_finishes_its_clean_up() {
    let mut c = cluster(1);
    let id = c.submit(ALICE, batch("x"), 0).unwrap();
    c.schedule(0);
    let (node, _) = launches(&mut c).remove(0);
    let f = JobFilter {
        ids: vec![id],
        ..Default::default()
    };
    c.cancel(ALICE, &f, None, 1).unwrap();
    assert_eq!(state(&c, id), JobState::Completing);
    assert!(c
        .take_outbox()
        .iter()
        .any(|(_, m)| matches!(m, CtldMsg::Terminate { .. })));
    c.agent_message(
        &node,
        AgentMsg::BatchDone {
            job: r0(id),
            exit: ExitStatus::default(),
            oom: false,
            usage: None,
        },
        2,
    );
    assert_eq!(state(&c, id), JobState::Cancelled);
    assert!(c.node_views().iter().all(|n| node_state(n) == "idle"));
    c.agent_message(
        &node,
        AgentMsg::JobCleaned {
            job: r0(id),
            usage: None,
        },
        3,
    );
    assert_eq!(state(&c, id), JobState::Cancelled);
    assert!(c.take_outbox().is_empty());
}

#[test]
fn failing_exit_is_failed_with_its_code() {
    let mut c = cluster(1);
    let id = c.submit(ALICE, batch("x"), 0).unwrap();
    c.schedule(0);
    let (node, _) = launches(&mut c).remove(0);
    let exit = ExitStatus {
        code: 3,
        signal: None,
    };
    c.agent_message(
        &node,
        AgentMsg::StepExited {
            job: r0(id),
            step: StepId::BATCH,
            exit,
            oom: false,
        },
        1,
    );
    c.agent_message(
        &node,
        AgentMsg::JobCleaned {
            job: r0(id),
            usage: None,
        },
        1,
    );
    let v = &c.job_views(&JobFilter::default(), 1)[0];
    assert_eq!((v.state, v.exit.code), (JobState::Failed, 3));
}

/// A bare view (`JobFilter::bare`) reads only the head of a job's spec,
/// yet every field squeue calls bare prints from it just as from the
/// whole view: jobs running on two nodes, failed, waiting for
/// resources, held, and an array.
#[test]
fn bare_views_print_every_bare_field_as_whole_views_do() {
    use crate::cli::squeue::{bare, named_fields, Layout, SqueueArgs};
    use clap::Parser as _;
    let mut c = cluster(2);
    let mut wide = batch("#!/bin/sh\ntrue\n");
    (wide.name, wide.nodes, wide.ntasks) = ("wide".into(), Some(2), Some(4));
    (wide.time_limit, wide.mem_mb) = (Some(600), Some(512));
    wide.gpus = GpuAsk::PerNode(2);
    let running = c.submit(ALICE, wide.clone(), 0).unwrap();
    let failing = c.submit(BOB, batch("x"), 0).unwrap();
    c.schedule(0);
    let l = launches(&mut c);
    let (node, launch) = l.iter().find(|(_, x)| x.job == failing).unwrap();
    finish(&mut c, node, launch, 3, 5);
    // Waits for the running job's nodes.
    c.submit(BOB, wide.clone(), 6).unwrap();
    let mut held = batch("x");
    (held.hold, held.name) = (true, "held".into());
    c.submit(ALICE, held, 7).unwrap();
    let mut array = batch("x");
    array.array = Some(corral_proto::msg::ArraySpec {
        runs: vec![corral_proto::msg::IndexRun {
            first: 1,
            count: 4,
            step: 1,
        }],
        throttle: 0,
    });
    c.submit(ALICE, array, 8).unwrap();
    c.schedule(9);

    let fields: Vec<&str> = named_fields()
        .filter(|&(f, _)| bare(f))
        .map(|(_, n)| n)
        .collect();
    let args = ["squeue", "-O", &fields.join(",")];
    let layout = Layout::of(&SqueueArgs::try_parse_from(args).unwrap()).unwrap();
    assert!(layout.bare && fields.len() > 30, "{fields:?}");
    let list = |bare| {
        let f = JobFilter {
            brief: true,
            bare,
            ..JobFilter::default()
        };
        c.job_views(&f, 70)
    };
    let (whole, bare_views) = (list(false), list(true));
    assert!(whole.len() >= 5, "{}", whole.len());
    let v = bare_views.iter().find(|v| v.id == running).unwrap();
    assert_eq!(
        (v.num_cpus, v.mem_mb, v.num_nodes),
        (0, 0, 2),
        "bare indeed"
    );
    assert_eq!(
        v.time_limit,
        Some(600),
        "a running job's limit is its run's"
    );
    let print = |v: &Vec<JobView>| layout.print(vec![v.clone()], false, 70);
    assert_eq!(print(&bare_views), print(&whole));
    assert!(print(&whole).contains("wide"));
}

/// A brief view (`JobFilter::brief`, a squeue layout without text
/// fields) leaves out the texts, and only them.
#[test]
fn brief_views_leave_out_only_the_texts() {
    let mut c = cluster(1);
    let mut spec = batch("#!/bin/sh\ntrue\n");
    spec.name = "train".into();
    spec.work_dir = "/home/ada/run".into();
    spec.script_path = Some("/home/ada/run.sh".into());
    spec.comment = Some("note".into());
    spec.mail_type = Some("END".into());
    spec.mail_user = Some("ada".into());
    spec.time_limit = Some(600);
    spec.cpus_per_task = Some(2);
    spec.kind = JobKind::Batch {
        script: b"#!/bin/sh\ntrue\n".to_vec(),
        args: vec!["a".into(), "b".into()],
        stdout: Some("out-%j".into()),
        stderr: Some("err-%j".into()),
    };
    spec.hold = true;
    c.submit(ALICE, spec, 0).unwrap();
    let full = c.job_views(&JobFilter::default(), 1).remove(0);
    assert_eq!(full.work_dir, "/home/ada/run");
    assert_eq!(full.command, "/home/ada/run.sh a b");
    assert_eq!(full.stdout.as_deref(), Some("out-%j"));
    assert_eq!(full.stderr.as_deref(), Some("err-%j"));
    assert_eq!(full.comment.as_deref(), Some("note"));
    assert_eq!(full.mail_type.as_deref(), Some("END"));
    assert_eq!(full.mail_user.as_deref(), Some("ada"));
    let brief = c
        .job_views(
            &JobFilter {
                brief: true,
                ..JobFilter::default()
            },
            1,
        )
        .remove(0);
    let mut expected = full.clone();
    expected.work_dir = String::new();
    expected.command = String::new();
    (expected.stdout, expected.stderr) = (None, None);
    (expected.comment, expected.mail_type, expected.mail_user) = (None, None, None);
    assert_eq!(brief, expected);
    assert_eq!((brief.name.as_str(), brief.num_cpus), ("train", 2));
    assert_eq!(brief.time_limit, Some(600));
    // A job without --output shows Slurm's default file.
    let id = c.submit(ALICE, batch("#!/bin/sh\n"), 0).unwrap();
    let v = c
        .job_views(
            &JobFilter {
                ids: vec![id],
                ..JobFilter::default()
            },
            1,
        )
        .remove(0);
    assert_eq!(
        (v.stdout.as_deref(), v.command.as_str()),
        (Some("slurm-%j.out"), "(null)")
    );
}

#[test]
fn an_oom_kill_ends_the_job_out_of_memory_with_its_nodes_usage() {
    let mut c = cluster(2);
    let mut spec = batch("x");
    spec.nodes = Some(2);
    let id = c.submit(ALICE, spec, 0).unwrap();
    c.schedule(0);
    let (first, _) = launches(&mut c).remove(0);
    let killed = ExitStatus {
        code: 128 + 9,
        signal: Some(9),
    };
    c.agent_message(
        &first,
        AgentMsg::StepExited {
            job: r0(id),
            step: StepId::BATCH,
            exit: killed,
            oom: true,
        },
        1,
    );
    let used = |cpu_ms, max_rss_kb| Some(JobUsage { cpu_ms, max_rss_kb });
    // A report from a node not cleaning this job counts for nothing.
    c.agent_message(
        "worker-9",
        AgentMsg::JobCleaned {
            job: r0(id),
            usage: used(1, 1 << 30),
        },
        2,
    );
    c.agent_message(
        "worker-0",
        AgentMsg::JobCleaned {
            job: r0(id),
            usage: used(1500, 4096),
        },
        2,
    );
    assert_eq!(state(&c, id), JobState::Completing);
    c.agent_message(
        "worker-1",
        AgentMsg::JobCleaned {
            job: r0(id),
            usage: used(250, 8192),
        },
        2,
    );
    let v = &c.job_views(&JobFilter::default(), 2)[0];
    assert_eq!(v.state, JobState::OutOfMemory);
    assert_eq!(v.state.code(), "OOM");
    // CPU time adds up over nodes; peak memory is the largest node's.
    assert_eq!(v.usage, used(1750, 8192));
    let shown = crate::cli::scontrol::show_job(v, 2);
    assert!(
        shown.contains("   TotalCPU=00:01.750 MaxRSS=8192K\n"),
        "{shown}"
    );
}

#[test]
fn only_owners_and_operators_cancel() {
    let mut c = cluster(1);
    let id = c.submit(BOB, batch("x"), 0).unwrap();
    let f = JobFilter {
        ids: vec![id],
        ..Default::default()
    };
    let e = c.cancel(ALICE, &f, None, 1).unwrap_err().to_string();
    assert!(e.contains("Access/permission denied"), "{e}");
    assert_eq!(state(&c, id), JobState::Pending);
    // A filter that selects someone else's job is refused for that job,
    // as Slurm's scancel reports it, and cancels nothing of theirs.
    let all = JobFilter::default();
    let e = c.cancel(ALICE, &all, None, 1).unwrap_err().to_string();
    assert_eq!(
        e,
        format!("Kill job error on job id {id}: Access/permission denied")
    );
    assert_eq!(state(&c, id), JobState::Pending);
    assert_eq!(c.cancel(ROOT, &f, None, 1).unwrap(), vec![id]);
    assert_eq!(state(&c, id), JobState::Cancelled);
    let e = c.hold(ALICE, &[id], false).unwrap_err().to_string();
    assert!(
        e.contains("Invalid") || e.contains("denied") || e.contains("not pending"),
        "{e}"
    );
}

#[test]
fn cancelling_a_running_job_terminates_it_with_grace() {
    let mut c = cluster(1);
    let id = c.submit(ALICE, batch("x"), 0).unwrap();
    c.schedule(0);
    let (node, _) = launches(&mut c).remove(0);
    c.cancel(
        ALICE,
        &JobFilter {
            ids: vec![id],
            ..Default::default()
        },
        None,
        1,
    )
    .unwrap();
    let out = c.take_outbox();
    assert!(matches!(
        out[0].1,
        CtldMsg::Terminate { grace_ms: 5000, .. }
    ));
    assert_eq!(state(&c, id), JobState::Completing);
    // The batch shell dies of the SIGTERM: the job shows it
    // (ExitCode=0:15), as Slurm's scontrol does.
    let killed = ExitStatus {
        code: 0,
        signal: Some(15),
    };
    c.agent_message(
        &node,
        AgentMsg::StepExited {
            job: r0(id),
            step: StepId::BATCH,
            exit: killed,
            oom: false,
        },
        2,
    );
    c.agent_message(
        &node,
        AgentMsg::JobCleaned {
            job: r0(id),
            usage: None,
        },
        2,
    );
    assert_eq!(state(&c, id), JobState::Cancelled);
    assert_eq!(view(&c, id).exit, killed);
}

#[test]
fn time_limit_turns_into_timeout() {
    let mut c = cluster(1);
    let mut spec = batch("x");
    spec.time_limit = Some(60);
    let id = c.submit(ALICE, spec, 0).unwrap();
    c.schedule(0);
    let (node, _) = launches(&mut c).remove(0);
    c.agent_message(
        &node,
        AgentMsg::Heartbeat {
            running: vec![r0(id)],
        },
        55,
    );
    c.tick(59);
    assert_eq!(state(&c, id), JobState::Running);
    c.agent_message(
        &node,
        AgentMsg::Heartbeat {
            running: vec![r0(id)],
        },
        60,
    );
    c.tick(60);
    assert_eq!(state(&c, id), JobState::Completing);
    c.agent_message(
        &node,
        AgentMsg::JobCleaned {
            job: r0(id),
            usage: None,
        },
        61,
    );
    assert_eq!(state(&c, id), JobState::Timeout);
}

/// `--signal=[B:]SIG@TIME`: once per run (the mark is in the run's part,
/// which a requeue drops), TIME seconds before the limit, to the steps or
/// (B:) the batch shell.
#[test]
fn a_limit_signal_goes_once_per_run_before_the_limit() {
    use corral_proto::msg::{LimitSignal, SendSignal, SignalTo};
    let signals = |c: &mut Controller| -> Vec<(String, SignalTo, i32)> {
        c.take_outbox()
            .into_iter()
            .filter_map(|(n, m)| match m {
                CtldMsg::Signal { to, signal, .. } => Some((n, to, signal)),
                _ => None,
            })
            .collect()
    };
    for to in [SignalTo::Steps, SignalTo::Step(StepId::BATCH)] {
        let mut c = cluster(1);
        let mut spec = batch("x");
        spec.time_limit = Some(600);
        spec.limit_signal = Some(LimitSignal {
            signal: SendSignal { signal: 10, to },
            before: 90,
        });
        let id = c.submit(ALICE, spec, 0).unwrap();
        c.schedule(0);
        let (node, _) = launches(&mut c).remove(0);
        let alive = |c: &mut Controller, now| {
            c.agent_message(
                &node,
                AgentMsg::Heartbeat {
                    running: vec![r0(id)],
                },
                now,
            )
        };
        alive(&mut c, 509);
        c.tick(509);
        assert!(signals(&mut c).is_empty(), "too early");
        alive(&mut c, 510);
        c.tick(510);
        assert_eq!(signals(&mut c), [(node.clone(), to, 10)]);
        alive(&mut c, 511);
        c.tick(511);
        assert!(signals(&mut c).is_empty(), "once per run");
        assert_eq!(state(&c, id), JobState::Running);
    }
    // A job without its own limit is early for its partition's default.
    let cfg = Config::parse(
        std::path::Path::new("t.toml"),
        "heartbeat_timeout = 1000\n[[partition]]\nname = \"gpu\"\nnodes = \"worker-[0-3]\"\n\
         default = true\ndefault_time = \"10\"\n",
    )
    .unwrap();
    let mut c = Controller::new(cfg).unwrap();
    c.register(reg("worker-0", 4), 0).unwrap();
    let mut spec = batch("x");
    spec.limit_signal = Some(LimitSignal {
        signal: SendSignal {
            signal: 10,
            to: SignalTo::Steps,
        },
        before: 60,
    });
    c.submit(ALICE, spec, 0).unwrap();
    c.schedule(0);
    let _ = launches(&mut c);
    c.tick(539);
    assert!(signals(&mut c).is_empty());
    c.tick(540);
    assert_eq!(
        signals(&mut c).len(),
        1,
        "60 s before the partition's 10 minutes"
    );
    // Without any time limit there is nothing to be early for.
    let mut c = cluster(1);
    let mut spec = batch("x");
    spec.limit_signal = Some(LimitSignal {
        signal: SendSignal {
            signal: 10,
            to: SignalTo::Steps,
        },
        before: 90,
    });
    c.submit(ALICE, spec, 0).unwrap();
    c.schedule(0);
    let _ = launches(&mut c);
    c.tick(100_000);
    assert!(signals(&mut c).is_empty());
}

/// salloc's allocation launches nothing; its end comes from salloc, with
/// the command's exit, and only its owner (or an operator) may say it.
#[test]
fn an_allocation_launches_nothing_and_ends_when_its_owner_says() {
    let mut c = cluster(1);
    let spec = JobSpec {
        kind: JobKind::Allocation,
        ..batch("")
    };
    let id = c.submit(ALICE, spec.clone(), 0).unwrap();
    c.schedule(0);
    assert!(launches(&mut c).is_empty());
    assert_eq!(state(&c, id), JobState::Running);
    let exit = ExitStatus {
        code: 7,
        signal: None,
    };
    let e = c.end_allocation(BOB, id, exit, 1).unwrap_err().to_string();
    assert!(e.contains("Access/permission denied"), "{e}");
    let batch_job = c.submit(ALICE, batch("x"), 0).unwrap();
    let e = c
        .end_allocation(ALICE, batch_job, exit, 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("not an allocation"), "{e}");
    c.end_allocation(ALICE, id, exit, 1).unwrap();
    assert_eq!(state(&c, id), JobState::Completing);
    let node = c.take_outbox().into_iter().find_map(|(n, m)| match m {
        CtldMsg::Terminate { .. } => Some(n),
        _ => None,
    });
    c.agent_message(
        &node.expect("its node is told to end it"),
        AgentMsg::JobCleaned {
            job: r0(id),
            usage: None,
        },
        2,
    );
    assert_eq!(state(&c, id), JobState::Failed);
    assert_eq!(view(&c, id).exit, exit);
    // One still waiting is withdrawn.
    let mut full = spec;
    full.exclusive = true;
    full.nodes = Some(1);
    let waiting = c.submit(ALICE, full, 3).unwrap();
    assert_eq!(state(&c, waiting), JobState::Pending);
    c.end_allocation(ALICE, waiting, ExitStatus::default(), 4)
        .unwrap();
    assert_eq!(state(&c, waiting), JobState::Cancelled);
}

/// `-C a100|h200` takes nodes with either; `-C a100&h200` is refused
/// when no node has both.
#[test]
fn constraints_pick_nodes_by_their_features() {
    let mut c = Controller::new(config()).unwrap();
    for (name, f) in [("worker-0", "a100"), ("worker-1", "h200"), ("worker-2", "")] {
        let mut r = reg(name, 4);
        r.features = vec![f.to_string()];
        c.register(r, 0).unwrap();
    }
    let mut either = batch("x");
    either.nodes = Some(2);
    either.constraint = vec!["a100".into(), "h200".into()];
    either.constraint_any = true;
    let id = c.submit(ALICE, either.clone(), 0).unwrap();
    c.schedule(0);
    let _ = launches(&mut c);
    assert_eq!(view(&c, id).nodes, ["worker-0", "worker-1"]);
    either.constraint_any = false;
    let e = c.submit(ALICE, either.clone(), 1).unwrap_err().to_string();
    assert!(
        e.contains("Requested node configuration is not available"),
        "{e}"
    );
    // A hostile frame's feature list is bounded: every pass compares it.
    either.constraint = vec!["f".into(); 100_000];
    let e = c.submit(ALICE, either.clone(), 1).unwrap_err().to_string();
    assert!(e.contains("100000 features, the most is 64"), "{e}");
    either.constraint = vec!["x".repeat(1 << 20)];
    let e = c.submit(ALICE, either, 1).unwrap_err().to_string();
    assert!(e.starts_with("Invalid feature specification"), "{e}");
}

/// `srun --gres=gpu:1` inside a 2-GPU job: each concurrent step gets a
/// GPU no other open step holds; a third waits for one to end (refused
/// until then); the job's cgroup keeps both.
#[test]
fn concurrent_one_gpu_steps_get_distinct_gpus_of_their_job() {
    let mut c = cluster(1);
    let mut spec = batch("x");
    spec.gpus = corral_proto::msg::GpuAsk::PerNode(2);
    spec.cpus_per_task = Some(4);
    let id = c.submit(ALICE, spec, 0).unwrap();
    c.schedule(0);
    let job_gpus = launches(&mut c)[0].1.gpus.clone();
    assert_eq!(job_gpus.len(), 2);
    let step = |secret: u8| StepSpec {
        name: None,
        ntasks: Some(1),
        gpus_per_node: Some(1),
        exact: true,
        ..step_spec(id, "train", secret)
    };
    let mut seen = Vec::new();
    for secret in [1, 2] {
        c.submit_step(ALICE, step(secret), 1).unwrap();
        let l = launches(&mut c);
        assert_eq!(l[0].1.gpus, job_gpus, "the job's cgroup keeps both");
        seen.push(l[0].1.step_gpus.clone().expect("its own GPU"));
    }
    assert_eq!(seen[0].len(), 1);
    assert_ne!(seen[0], seen[1], "distinct GPUs");
    let e = c.submit_step(ALICE, step(3), 1).unwrap_err().to_string();
    assert!(e.contains("Requested GPUs are busy"), "{e}");
    c.agent_message(
        "worker-0",
        AgentMsg::StepExited {
            job: r0(id),
            step: StepId(0),
            exit: ExitStatus::default(),
            oom: false,
        },
        2,
    );
    c.submit_step(ALICE, step(3), 3).unwrap();
    let l = launches(&mut c);
    assert_eq!(l[0].1.step_gpus.as_ref(), Some(&seen[0]), "the freed one");
    // Both held again: an --overlap step takes one anyway, and holds it
    // from none.
    let mut shared = step(4);
    shared.overlap = true;
    c.submit_step(ALICE, shared.clone(), 4).unwrap();
    assert_eq!(
        launches(&mut c)[0].1.step_gpus.as_ref().map(Vec::len),
        Some(1)
    );
    shared.io.secret = [5; 32];
    c.submit_step(ALICE, shared, 4).unwrap();
    assert!(c.submit_step(ALICE, step(6), 4).is_err(), "still busy");
}

/// A job may start `max_step_count` steps (Slurm's MaxStepCount), ended
/// ones counting: the next is refused in one line, not queued.
#[test]
fn a_job_starts_at_most_max_step_count_steps() {
    let limits = "requeue_delay = 0\n[limits]\nmax_step_count = 3";
    let mut c = cluster_with(limits);
    let id = c.submit(ALICE, batch("x"), 0).unwrap();
    c.schedule(0);
    launches(&mut c);
    let overlap = |secret: u8| StepSpec {
        name: None,
        overlap: true,
        ..step_spec(id, "t", secret)
    };
    for secret in 1..=3 {
        c.submit_step(ALICE, overlap(secret), 1).unwrap();
        let step = launches(&mut c)[0].1.step;
        if secret == 3 {
            break;
        }
        c.agent_message(
            "worker-0",
            AgentMsg::StepExited {
                job: r0(id),
                step,
                exit: ExitStatus::default(),
                oom: false,
            },
            2,
        );
    }
    let e = c.submit_step(ALICE, overlap(4), 3).unwrap_err().to_string();
    assert_eq!(e, "Step limit reached for this job: 3 steps (MaxStepCount)");
    assert!(launches(&mut c).is_empty());
    // The same srun asking again (its answer lost) still gets its step.
    assert_eq!(c.submit_step(ALICE, overlap(3), 3).unwrap().1, StepId(2));
}

/// Steps hold CPUs as Slurm 22.05's do: a plain step all of the job's
/// CPUs on its nodes, one with `--exact` its tasks' own, one with
/// `--overlap` none (and it waits for none); a step that finds too few
/// free is `Busy` for srun to wait out, one that asks more than the job
/// has is refused. An interactive job's first step holds all it runs on.
#[test]
fn steps_hold_the_cpus_they_run_on_unless_they_overlap() {
    let mut c = cluster(1);
    let mut spec = batch("x");
    spec.cpus_per_task = Some(4);
    let id = c.submit(ALICE, spec, 0).unwrap();
    c.schedule(0);
    launches(&mut c);
    let step = |secret: u8, exact: bool, ntasks: u32, cpus: Option<u32>| StepSpec {
        name: None,
        ntasks: Some(ntasks),
        exact,
        cpus_per_task: cpus,
        ..step_spec(id, "work", secret)
    };
    let busy = |r: Result<(JobId, StepId), CtldError>| match r {
        Err(e @ CtldError::StepCpus { .. }) => e.to_string(),
        other => panic!("not busy: {other:?}"),
    };
    let (_, plain) = c.submit_step(ALICE, step(1, false, 1, None), 1).unwrap();
    let e = busy(c.submit_step(ALICE, step(2, true, 1, None), 1));
    assert!(e.starts_with("Requested nodes are busy"), "{e}");
    let mut shared = step(3, false, 1, None);
    shared.overlap = true;
    c.submit_step(ALICE, shared, 1)
        .expect("an overlapping step runs");
    let ended = |c: &mut Controller, step| {
        c.agent_message(
            "worker-0",
            AgentMsg::StepExited {
                job: r0(id),
                step,
                exit: ExitStatus::default(),
                oom: false,
            },
            2,
        )
    };
    ended(&mut c, plain);
    c.submit_step(ALICE, step(2, true, 1, None), 2)
        .expect("one CPU");
    c.submit_step(ALICE, step(4, true, 1, Some(2)), 2)
        .expect("two more");
    busy(c.submit_step(ALICE, step(5, true, 2, None), 2));
    c.submit_step(ALICE, step(6, true, 1, None), 2)
        .expect("the last one");
    let e = c.submit_step(ALICE, step(7, true, 5, None), 2).unwrap_err();
    assert!(
        matches!(
            e,
            CtldError::StepCpusOverJob {
                want: 5,
                job: 4,
                ..
            }
        ),
        "{e:?}"
    );
    // An srun job's own tasks hold its CPUs: a step joining it waits
    // unless it overlaps.
    let mut c = cluster(1);
    let mut spec = batch("x");
    spec.kind = JobKind::Interactive {
        argv: vec!["sleep".into()],
        io: step(0, false, 1, None).io,
        files: Default::default(),
    };
    let srun_job = c.submit(ALICE, spec, 0).unwrap();
    c.schedule(0);
    launches(&mut c);
    let mut join = step(8, true, 1, None);
    join.job = srun_job;
    busy(c.submit_step(ALICE, join.clone(), 1));
    join.overlap = true;
    c.submit_step(ALICE, join, 1).expect("overlapping");
}

/// `srun -w`/`-x` inside a job: the step runs on the job's nodes it
/// names (or not the ones it excludes), and tells its tasks which.
#[test]
fn a_step_runs_on_the_nodes_it_names_of_its_job() {
    let mut c = cluster(3);
    let mut spec = batch("x");
    spec.nodes = Some(3);
    let id = c.submit(ALICE, spec, 0).unwrap();
    c.schedule(0);
    launches(&mut c);
    let step = |secret: u8, nodelist: &[&str], exclude: &[&str], nodes: Option<u32>| StepSpec {
        name: None,
        nodes,
        overlap: true,
        nodelist: nodelist.iter().map(|s| s.to_string()).collect(),
        exclude: exclude.iter().map(|s| s.to_string()).collect(),
        ..step_spec(id, "hostname", secret)
    };
    let on = |c: &mut Controller| -> Vec<(String, u32, Vec<String>)> {
        let mut v: Vec<_> = launches(c)
            .into_iter()
            .map(|(n, l)| (n, l.node_index, l.shape.step_nodes))
            .collect();
        v.sort();
        v
    };
    c.submit_step(ALICE, step(1, &["worker-2"], &[], None), 1)
        .unwrap();
    assert_eq!(
        on(&mut c),
        [("worker-2".into(), 0, vec!["worker-2".into()])]
    );
    c.submit_step(ALICE, step(2, &[], &["worker-0"], None), 1)
        .unwrap();
    let both = vec!["worker-1".to_string(), "worker-2".to_string()];
    assert_eq!(
        on(&mut c),
        [
            ("worker-1".into(), 0, both.clone()),
            ("worker-2".into(), 1, both)
        ]
    );
    // The first nodes, as before: not named in the launch.
    c.submit_step(ALICE, step(3, &[], &[], Some(2)), 1).unwrap();
    assert!(on(&mut c).iter().all(|(_, _, named)| named.is_empty()));
    let e = c
        .submit_step(ALICE, step(4, &["worker-9"], &[], None), 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("worker-9 is not one of the job's nodes"), "{e}");
    assert!(c
        .submit_step(ALICE, step(5, &["worker-1"], &["worker-1"], None), 1)
        .is_err());
}

/// `--mem-per-cpu` and `--mem=0` become the memory a job's nodes give it
/// (and its cgroup's limit on each).
#[test]
fn memory_per_cpu_and_whole_node_reach_the_launch() {
    let mut c = cluster(1);
    let mut spec = batch("x");
    spec.ntasks = Some(3);
    spec.mem_per_cpu_mb = Some(1000);
    c.submit(ALICE, spec, 0).unwrap();
    c.schedule(0);
    assert_eq!(launches(&mut c)[0].1.memory_mb, 3000);
    let mut c = cluster(1);
    let mut spec = batch("x");
    spec.mem_whole = true;
    c.submit(ALICE, spec, 0).unwrap();
    c.schedule(0);
    assert_eq!(launches(&mut c)[0].1.memory_mb, 16_000, "the node's all");
}

#[test]
fn silent_node_goes_down_and_its_jobs_fail_or_requeue() {
    let mut c = cluster(2);
    let a = c.submit(ALICE, batch("x"), 0).unwrap();
    let mut spec = batch("x");
    spec.requeue = true;
    spec.exclusive = true;
    let b = c.submit(ALICE, spec, 0).unwrap();
    c.schedule(0);
    let l = launches(&mut c);
    assert_eq!(l.len(), 2);
    let node_a = l.iter().find(|(_, l)| l.job == a).unwrap().0.clone();
    let node_b = l.iter().find(|(_, l)| l.job == b).unwrap().0.clone();
    assert_ne!(node_a, node_b);
    // Both nodes go silent.
    c.tick(11);
    assert_eq!(state(&c, a), JobState::NodeFail);
    assert_eq!(state(&c, b), JobState::Pending);
    assert!(c.node_views().iter().all(|n| node_state(n) == "down*"));
    // An agent that comes back is the same node, and the requeued job runs.
    c.register(reg(&node_b, 4), 12).unwrap();
    assert_eq!(
        c.node_views()
            .iter()
            .filter(|n| node_state(n) == "idle")
            .count(),
        1
    );
    c.schedule(12);
    let l = launches(&mut c);
    assert_eq!(l[0].1.job, b);
    assert_eq!(l[0].0, node_b);
    assert_eq!(
        c.job_views(
            &JobFilter {
                ids: vec![b],
                ..Default::default()
            },
            12
        )[0]
        .restarts,
        1
    );
}

#[test]
fn restarted_agent_loses_its_jobs_at_once() {
    let mut c = cluster(1);
    let id = c.submit(ALICE, batch("x"), 0).unwrap();
    c.schedule(0);
    launches(&mut c);
    // The same agent again (a connection lost and made again): nothing
    // lost. Another one: the agent restarted, and the job died with it.
    c.register(reg("worker-0", 4), 2).unwrap();
    assert_eq!(state(&c, id), JobState::Running);
    let mut again = reg("worker-0", 4);
    again.instance = 2;
    c.register(again, 3).unwrap();
    assert_eq!(state(&c, id), JobState::NodeFail);
    assert_eq!(node_state(&c.node_views()[0]), "idle");
}

#[test]
fn steps_spread_tasks_over_the_allocation() {
    let mut c = cluster(2);
    let mut spec = batch("x");
    spec.nodes = Some(2);
    spec.gpus = GpuAsk::PerNode(2);
    let id = c.submit(ALICE, spec, 0).unwrap();
    // A step of a job with a limit is told the job's limit, not a date.
    let mut limited = batch("x");
    limited.time_limit = Some(600);
    let lid = c.submit(ALICE, limited, 1000).unwrap();
    c.schedule(1000);
    launches(&mut c);
    let io = StepIo {
        addr: "127.0.0.1:9".parse().unwrap(),
        cert_sha256: [0; 32],
        secret: [1; 32],
    };
    let step = StepSpec {
        name: None,
        ntasks: Some(5),
        io,
        ..step_spec(id, "hostname", 0)
    };
    let e = c
        .submit_step(BOB, step.clone(), 20)
        .unwrap_err()
        .to_string();
    assert!(e.contains("denied"), "{e}");
    let (_, s) = c.submit_step(ALICE, step, 20).unwrap();
    assert_eq!(s, StepId(0));
    let l = launches(&mut c);
    let shape: Vec<_> = l
        .iter()
        .map(|(_, l)| (l.node_index, l.first_task, l.tasks_here, l.gpus.len()))
        .collect();
    assert!(
        l.iter().all(|(_, l)| l.time_limit.is_none()),
        "no limit: none passed on"
    );
    assert_eq!(shape, vec![(0, 0, 3, 2), (1, 3, 2, 2)]);
    let step = StepSpec {
        name: None,
        io,
        ..step_spec(lid, "true", 0)
    };
    c.submit_step(ALICE, step, 20).unwrap();
    let l = launches(&mut c);
    assert_eq!(l.len(), 1);
    assert_eq!(l[0].1.time_limit, Some(600));
}

#[test]
fn drains_need_an_operator_and_a_reason() {
    let mut c = cluster(2);
    assert!(c
        .update_node(ALICE, "worker-0", NodeUpdate::Drain, Some("x".into()), 0)
        .is_err());
    assert!(c
        .update_node(ROOT, "worker-0", NodeUpdate::Drain, None, 0)
        .is_err());
    assert!(c
        .update_node(ROOT, "worker-9", NodeUpdate::Drain, Some("x".into()), 0)
        .is_err());
    c.update_node(
        ROOT,
        "worker-[0-1]",
        NodeUpdate::Drain,
        Some("bad fan".into()),
        5,
    )
    .unwrap();
    let v = c.node_views();
    assert!(v
        .iter()
        .all(|n| node_state(n) == "drained" && n.reason.as_deref() == Some("bad fan")));
    let id = c.submit(ALICE, batch("x"), 6).unwrap();
    assert_eq!(c.schedule(6), 0);
    c.update_node(ROOT, "worker-1", NodeUpdate::Resume, None, 7)
        .unwrap();
    assert_eq!(c.schedule(7), 1);
    assert_eq!(state(&c, id), JobState::Running);
}

/// `State=FAIL`: out of use as a drain is, shown as Slurm's `fail`
/// (`failg` while a job still runs), lifted by RESUME; a node whose job is
/// being ended shows COMPLETING until it confirms the job is gone.
#[test]
fn fail_and_completing_nodes_show_as_slurms() {
    let mut c = cluster(2);
    let id = c.submit(ALICE, batch("x"), 1).unwrap();
    assert_eq!(c.schedule(1), 1);
    let on = launches(&mut c)[0].0.clone();
    let other = if on == "worker-0" {
        "worker-1"
    } else {
        "worker-0"
    };
    assert!(
        c.update_node(ROOT, other, NodeUpdate::Fail, None, 2)
            .is_err(),
        "a reason is required"
    );
    c.update_node(
        ROOT,
        "worker-[0-1]",
        NodeUpdate::Fail,
        Some("flaky".into()),
        2,
    )
    .unwrap();
    let words = |c: &Controller| -> Vec<String> {
        c.node_views()
            .iter()
            .map(|n| format!("{} {}", n.name, crate::cli::words::node_state_full(n)))
            .collect()
    };
    let want_fail = |busy: &str| {
        let mut v = vec![format!("{on} {busy}+FAIL"), format!("{other} IDLE+FAIL")];
        v.sort();
        v
    };
    assert_eq!(words(&c), want_fail("MIXED"));
    let next = c.submit(ALICE, batch("x"), 3).unwrap();
    assert_eq!(c.schedule(3), 0, "nothing starts on a failed node");
    c.update_node(ROOT, other, NodeUpdate::Resume, None, 4)
        .unwrap();
    assert_eq!(c.schedule(4), 1);
    assert_eq!(state(&c, next), JobState::Running);
    let _ = c.take_outbox();
    // Cancelled: its node is completing until it says the job is clean.
    let f = JobFilter {
        ids: vec![id],
        ..Default::default()
    };
    c.cancel(ALICE, &f, None, 5).unwrap();
    let n = |c: &Controller| c.node_views().into_iter().find(|n| n.name == on).unwrap();
    assert!(n(&c).completing);
    assert_eq!(crate::cli::words::node_state(&n(&c)), "failg");
    c.update_node(ROOT, &on, NodeUpdate::Resume, None, 6)
        .unwrap();
    assert_eq!(crate::cli::words::node_state(&n(&c)), "comp");
    c.agent_message(
        &on,
        AgentMsg::JobCleaned {
            job: JobRun { job: id, run: 0 },
            usage: None,
        },
        7,
    );
    assert!(!n(&c).completing);
    assert_eq!(crate::cli::words::node_state(&n(&c)), "idle");
}

#[test]
fn submit_refusals_read_like_slurm() {
    let mut c = cluster(1);
    let mut spec = batch("x");
    spec.partition = Some("nope".into());
    let e = c.submit(ALICE, spec, 0).unwrap_err().to_string();
    assert!(e.starts_with("Invalid partition name specified"), "{e}");
    let mut spec = batch("x");
    spec.gpus = GpuAsk::PerNode(64);
    assert!(c.submit(ALICE, spec, 0).is_err());
    assert!(c.job_views(&JobFilter::default(), 0).is_empty());
}

#[test]
fn natural_order_of_node_names() {
    let mut v = vec!["worker-10", "worker-2", "a", "worker-1"];
    v.sort_by(|a, b| natural(a, b));
    assert_eq!(v, vec!["a", "worker-1", "worker-2", "worker-10"]);
}

#[test]
fn job_queries_come_in_pages() {
    let mut c = cluster(1);
    let n = JOBS_PER_PAGE as u64 + 10;
    for _ in 0..n {
        let mut s = batch("x");
        s.hold = true;
        c.submit(ALICE, s, 0).unwrap();
    }
    let first = c.job_views(&JobFilter::default(), 0);
    assert_eq!(first.len(), JOBS_PER_PAGE);
    let rest = c.job_views(
        &JobFilter {
            after: first.last().unwrap().id,
            ..Default::default()
        },
        0,
    );
    assert_eq!(rest.len(), 10);
    assert_eq!(rest.last().unwrap().id, JobId(n));
}

#[test]
fn a_begin_time_wakes_the_scheduler() {
    let mut c = cluster(1);
    let mut s = batch("x");
    s.begin = Some(100);
    let id = c.submit(ALICE, s, 10).unwrap();
    assert_eq!(c.schedule(10), 0);
    c.take_dirty();
    c.agent_message("worker-0", AgentMsg::Heartbeat { running: vec![] }, 95);
    c.tick(95);
    assert!(!c.take_dirty());
    c.agent_message("worker-0", AgentMsg::Heartbeat { running: vec![] }, 100);
    c.tick(100);
    assert!(c.take_dirty(), "the begin time asks for a pass");
    assert_eq!(c.schedule(100), 1);
    assert_eq!(state(&c, id), JobState::Running);
}

fn view(c: &Controller, id: JobId) -> JobView {
    c.job_views(
        &JobFilter {
            ids: vec![id],
            detail: true,
            ..Default::default()
        },
        0,
    )
    .remove(0)
}

#[test]
fn a_node_heard_again_comes_back_and_ends_its_stale_runs() {
    let mut c = cluster(2);
    let mut spec = batch("x");
    spec.requeue = true;
    let id = c.submit(ALICE, spec, 0).unwrap();
    let plain = c.submit(ALICE, batch("x"), 0).unwrap();
    c.schedule(0);
    let l = launches(&mut c);
    let node = l.iter().find(|(_, l)| l.job == id).unwrap().0.clone();
    let other = if node == "worker-0" {
        "worker-1"
    } else {
        "worker-0"
    };
    // The agent stalls (still connected) past the timeout; the other
    // node keeps talking.
    c.agent_message(other, AgentMsg::Heartbeat { running: vec![] }, 11);
    c.tick(11);
    let down = c.node_views().into_iter().find(|n| n.name == node).unwrap();
    assert_eq!(node_state(&down), "down*");
    assert_eq!(state(&c, id), JobState::Pending);
    // It is heard again, still running the old run: back in service, and
    // the old run is ended there.
    c.take_outbox();
    c.agent_message(
        &node,
        AgentMsg::Heartbeat {
            running: vec![r0(id)],
        },
        12,
    );
    let back = c.node_views().into_iter().find(|n| n.name == node).unwrap();
    assert!(!back.not_responding, "{}", node_state(&back));
    let out = c.take_outbox();
    assert!(
        out.iter()
            .any(|(n, m)| *n == node
                && matches!(m, CtldMsg::Terminate { job, .. } if *job == r0(id))),
        "{out:?}"
    );
    // The requeued job runs again as run 1; the old run's exit, arriving
    // late, is not credited to it.
    c.schedule(12);
    let l = launches(&mut c);
    let (new_node, launch) = l.iter().find(|(_, l)| l.job == id).unwrap();
    assert_eq!(launch.run, 1);
    let stale = ExitStatus {
        code: 143,
        signal: Some(15),
    };
    c.agent_message(
        &node,
        AgentMsg::StepExited {
            job: r0(id),
            step: StepId::BATCH,
            exit: stale,
            oom: false,
        },
        13,
    );
    c.agent_message(
        &node,
        AgentMsg::JobCleaned {
            job: r0(id),
            usage: None,
        },
        13,
    );
    assert_eq!(
        state(&c, id),
        JobState::Running,
        "a stale exit ended the new run"
    );
    let run1 = JobRun { job: id, run: 1 };
    c.agent_message(
        new_node,
        AgentMsg::StepExited {
            job: run1,
            step: StepId::BATCH,
            exit: ExitStatus::default(),
            oom: false,
        },
        14,
    );
    c.agent_message(
        new_node,
        AgentMsg::JobCleaned {
            job: run1,
            usage: None,
        },
        14,
    );
    assert_eq!(state(&c, id), JobState::Completed);
    let _ = plain;
}

#[test]
fn resume_of_a_disconnected_node_is_refused_and_of_a_connected_one_works() {
    let mut c = cluster(2);
    c.tick(11);
    assert!(c.node_views().iter().all(|n| node_state(n) == "down*"));
    c.disconnected("worker-1");
    let e = c
        .update_node(ROOT, "worker-1", NodeUpdate::Resume, None, 12)
        .unwrap_err()
        .to_string();
    assert!(e.contains("worker-1 is not responding"), "{e}");
    c.update_node(ROOT, "worker-0", NodeUpdate::Resume, None, 12)
        .unwrap();
    let w0 = c
        .node_views()
        .into_iter()
        .find(|n| n.name == "worker-0")
        .unwrap();
    assert_eq!(node_state(&w0), "idle");
}

#[test]
fn negative_nice_is_for_operators_and_the_range_is_bounded() {
    let mut c = cluster(1);
    // A job holding the whole node, so the others wait and are ranked.
    let mut blocker = batch("x");
    blocker.cpus_per_task = Some(8);
    c.submit(ALICE, blocker, 0).unwrap();
    c.schedule(0);
    let mut s = batch("x");
    s.nice = -2_147_483_648;
    let e = c.submit(ALICE, s.clone(), 0).unwrap_err().to_string();
    assert!(e.contains("only operators"), "{e}");
    let e = c.submit(ROOT, s.clone(), 0).unwrap_err().to_string();
    assert!(e.contains("Invalid nice value"), "{e}");
    s.nice = -100;
    let id = c.submit(ROOT, s.clone(), 0).unwrap();
    assert!(c.submit(ALICE, s, 0).is_err());
    let mut s = batch("x");
    s.nice = 2_147_483_645;
    let low = c.submit(ALICE, s, 0).unwrap();
    c.schedule(1);
    let (hi, lo) = (view(&c, id).priority, view(&c, low).priority);
    assert!(hi > lo && lo > -3_000_000_000, "{hi} {lo}");
}

#[test]
fn control_characters_in_names_and_paths_are_refused() {
    let mut c = cluster(1);
    for mutate in [
        (|s: &mut JobSpec| s.name = "evil\u{1b}[2J\nJobId=1 UserId=root(0)".into())
            as fn(&mut JobSpec),
        |s| s.work_dir = "/tmp/\n".into(),
        |s| s.partition = Some("gpu\r".into()),
        |s| {
            s.kind = JobKind::Batch {
                script: "x".into(),
                args: vec![],
                stdout: Some("o\u{7}".into()),
                stderr: None,
            }
        },
    ] {
        let mut s = batch("x");
        mutate(&mut s);
        let e = c.submit(ALICE, s, 0).unwrap_err().to_string();
        assert!(e.contains("control characters"), "{e}");
    }
    assert!(c.job_views(&JobFilter::default(), 0).is_empty());
}

#[test]
fn per_user_limits_refuse_with_a_reason_and_free_up_as_jobs_end() {
    let mut cfg = config();
    cfg.limits.max_jobs_per_user = 3;
    cfg.limits.max_script_size = 1000;
    cfg.limits.max_bytes_per_user = 2000;
    let mut c = Controller::new(cfg).unwrap();
    c.register(reg("worker-0", 4), 0).unwrap();
    let e = c
        .submit(ALICE, batch(&"x".repeat(1001)), 0)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("Batch script is too large"), "{e}");
    let held = |n: usize| {
        let mut s = batch(&"x".repeat(n));
        s.hold = true;
        s
    };
    let a = c.submit(ALICE, held(10), 0).unwrap();
    c.submit(ALICE, held(10), 0).unwrap();
    c.submit(ALICE, held(10), 0).unwrap();
    let e = c.submit(ALICE, held(10), 0).unwrap_err().to_string();
    assert!(
        e.contains("job submit limit") && e.contains("limit per user is 3"),
        "{e}"
    );
    // Others are not held to Alice's count; operators not at all.
    c.submit(BOB, held(10), 0).unwrap();
    c.submit(ROOT, held(10), 0).unwrap();
    // A finished job frees its place.
    c.cancel(
        ALICE,
        &JobFilter {
            ids: vec![a],
            ..Default::default()
        },
        None,
        1,
    )
    .unwrap();
    c.submit(ALICE, held(10), 1).unwrap();
    // Bytes: Bob's two large scripts exceed his share.
    c.submit(BOB, held(990), 1).unwrap();
    let e = c.submit(BOB, held(990), 1).unwrap_err().to_string();
    assert!(e.contains("bytes"), "{e}");
}

#[test]
fn a_launch_failure_names_its_step_and_node() {
    let mut c = cluster(1);
    let id = c.submit(ALICE, batch("x"), 0).unwrap();
    c.schedule(0);
    let (node, _) = launches(&mut c).remove(0);
    c.agent_message(
        &node,
        AgentMsg::LaunchFailed {
            job: r0(id),
            step: StepId::BATCH,
            message: "chdir /home/alice: Permission denied (os error 13)".into(),
        },
        1,
    );
    c.agent_message(
        &node,
        AgentMsg::JobCleaned {
            job: r0(id),
            usage: None,
        },
        1,
    );
    let v = view(&c, id);
    assert_eq!(
        (v.state, v.reason),
        (JobState::Failed, JobReason::JobLaunchFailure)
    );
    assert_eq!(
        v.failure.as_deref(),
        Some("batch step on worker-0: chdir /home/alice: Permission denied (os error 13)")
    );
}

#[test]
fn an_unhealthy_agent_drains_its_node_until_it_is_well() {
    let mut c = cluster(1);
    c.agent_message(
        "worker-0",
        AgentMsg::Health {
            problem: Some("agent: too many open files: 1000 of 1024 in use".into()),
        },
        5,
    );
    let n = c.node_views().remove(0);
    assert_eq!(node_state(&n), "drained");
    assert_eq!(
        n.reason.as_deref(),
        Some("node_problem: agent: too many open files: 1000 of 1024 in use")
    );
    let id = c.submit(ALICE, batch("x"), 5).unwrap();
    assert_eq!(c.schedule(5), 0, "a drained node takes no work");
    c.agent_message("worker-0", AgentMsg::Health { problem: None }, 6);
    assert_eq!(node_state(&c.node_views()[0]), "idle");
    assert_eq!(c.schedule(6), 1);
    assert_eq!(state(&c, id), JobState::Running);
}

fn with_active_check() -> Controller {
    let cfg = Config::parse(
        std::path::Path::new("t.toml"),
        "heartbeat_timeout = 10\nkill_wait = 5\n\
         [[health.active]]\nname = \"burn\"\nscript = \"#!/bin/sh\\nburn\\n\"\ninterval = 600\n\
         [[partition]]\nname = \"gpu\"\nnodes = \"worker-[0-3]\"\ndefault = true\n",
    )
    .unwrap();
    let mut c = Controller::new(cfg).unwrap();
    for i in 0..2 {
        c.register(reg(&format!("worker-{i}"), 4), 0).unwrap();
    }
    c
}

/// Both nodes' agents beat, then the clock ticks.
fn tick_alive(c: &mut Controller, now: u64) {
    for n in ["worker-0", "worker-1"] {
        c.heartbeat(n, now, &[]);
    }
    c.tick(now);
}

fn node_reason(c: &Controller, name: &str) -> Option<String> {
    c.node_views()
        .into_iter()
        .find(|n| n.name == name)
        .and_then(|n| n.reason)
}

/// Ends a launched batch job with `code` on its node.
fn finish(c: &mut Controller, node: &str, l: &Launch, code: i32, now: u64) {
    let exit = ExitStatus { code, signal: None };
    let step = StepId::BATCH;
    let job = l.job_run();
    c.agent_message(
        node,
        AgentMsg::StepExited {
            job,
            step,
            exit,
            oom: false,
        },
        now,
    );
    c.agent_message(node, AgentMsg::JobCleaned { job, usage: None }, now);
}

#[test]
fn an_active_check_runs_on_idle_nodes_and_its_failure_drains_them() {
    let mut c = with_active_check();
    tick_alive(&mut c, 100);
    assert_eq!(c.schedule(100), 1);
    let (node, l) = launches(&mut c).remove(0);
    assert_eq!(node, "worker-0", "the node that waited longest, by name");
    assert_eq!(l.name, "health:burn");
    assert_eq!(l.user.uid, 0);
    assert!(l.exclusive);
    // One run of a check at a time.
    tick_alive(&mut c, 101);
    assert_eq!(c.schedule(101), 0);
    finish(&mut c, &node, &l, 3, 102);
    assert_eq!(
        node_reason(&c, "worker-0").as_deref(),
        Some("node_problem: burn: exit code 3")
    );
    // The next run goes to the other node; it passes, and that node stays.
    tick_alive(&mut c, 103);
    assert_eq!(c.schedule(103), 1);
    let (node, l) = launches(&mut c).remove(0);
    assert_eq!(node, "worker-1");
    finish(&mut c, &node, &l, 0, 104);
    assert_eq!(node_reason(&c, "worker-1"), None);
    // Nobody is due before the interval; the failed node gets no run.
    tick_alive(&mut c, 200);
    assert_eq!(c.schedule(200), 0);
    // An operator's RESUME lifts the check's drain.
    c.update_node(ROOT, "worker-0", NodeUpdate::Resume, None, 201)
        .unwrap();
    assert_eq!(node_reason(&c, "worker-0"), None);
}

#[test]
fn an_active_check_that_cannot_start_at_once_is_withdrawn() {
    let mut c = with_active_check();
    // worker-1 runs a user's job, so only worker-0 is idle.
    let mut spec = batch("x");
    spec.nodelist = vec!["worker-1".into()];
    let user = c.submit(ALICE, spec, 0).unwrap();
    c.schedule(0);
    launches(&mut c);
    tick_alive(&mut c, 100);
    // Before the pass, the idle node is drained by an operator.
    c.update_node(
        ROOT,
        "worker-0",
        NodeUpdate::Drain,
        Some("cabling".into()),
        100,
    )
    .unwrap();
    assert_eq!(c.schedule(100), 0);
    let pending = c.job_views(&JobFilter::default(), 100);
    let check = pending
        .iter()
        .find(|j| j.name == "health:burn")
        .expect("the check's run");
    assert_eq!(check.state, JobState::Pending);
    let check = check.id;
    tick_alive(&mut c, 101);
    assert_eq!(state(&c, check), JobState::Cancelled);
    assert_eq!(state(&c, user), JobState::Running);
    assert_eq!(node_reason(&c, "worker-0").as_deref(), Some("cabling"));
}

/// A cluster whose controller keeps accounting records.
fn accounted_cluster(nodes: usize) -> Controller {
    let cfg = Config::parse(
        std::path::Path::new("t.toml"),
        "heartbeat_timeout = 10\nkill_wait = 5\n[accounting]\nurl = \"sqlite:///nowhere.sqlite\"\n\
         [[partition]]\nname = \"gpu\"\nnodes = \"worker-[0-3]\"\ndefault = true\n",
    )
    .unwrap();
    let mut c = Controller::new(cfg).unwrap();
    for i in 0..nodes {
        c.register(reg(&format!("worker-{i}"), 4), 0).unwrap();
    }
    c
}

/// The accounting records the calls so far made, as the store gets them.
fn records(c: &mut Controller) -> Vec<corral_proto::msg::AcctJob> {
    c.take_changes()
        .acct
        .iter()
        .map(|b| {
            bincode::serde::decode_from_slice(b, bincode::config::standard())
                .unwrap()
                .0
        })
        .collect()
}

/// A job that timed out, as Slurm 22.05's slurmdbd records it (checked
/// on one): its line 0:0, its batch step CANCELLED with the signal that
/// ended it; and, as sacct's Reason, why it waited (None: it started at
/// once), not why it ended.
#[test]
fn a_timed_out_job_is_recorded_as_slurms() {
    let mut c = accounted_cluster(1);
    let mut spec = batch("x");
    spec.time_limit = Some(60);
    let id = c.submit(ALICE, spec, 0).unwrap();
    c.schedule(0);
    let (node, _) = launches(&mut c).remove(0);
    c.agent_message(
        &node,
        AgentMsg::Heartbeat {
            running: vec![r0(id)],
        },
        60,
    );
    c.tick(60);
    let killed = ExitStatus {
        code: 137,
        signal: Some(9),
    };
    c.agent_message(
        &node,
        AgentMsg::StepExited {
            job: r0(id),
            step: StepId::BATCH,
            exit: killed,
            oom: false,
        },
        62,
    );
    c.agent_message(
        &node,
        AgentMsg::JobCleaned {
            job: r0(id),
            usage: None,
        },
        62,
    );
    let r = records(&mut c);
    let j = r.iter().find(|j| j.id == id).expect("its record");
    assert_eq!(
        (j.state, j.exit, j.reason),
        (JobState::Timeout, ExitStatus::default(), JobReason::None)
    );
    let st: Vec<_> = j.steps.iter().map(|s| (s.step, s.state, s.exit)).collect();
    assert_eq!(
        st,
        [(
            StepId::BATCH,
            JobState::Cancelled,
            ExitStatus {
                code: 0,
                signal: Some(9)
            }
        )]
    );
}

#[test]
fn each_run_that_ends_leaves_one_accounting_record() {
    let mut c = accounted_cluster(2);
    // A batch job with an srun step on both nodes, completed.
    let mut spec = batch("x");
    spec.nodes = Some(2);
    spec.gpus = GpuAsk::PerNode(1);
    let ok = c.submit(ALICE, spec, 10).unwrap();
    c.schedule(11);
    let (first, _) = launches(&mut c).remove(0);
    let step = StepSpec {
        name: None,
        argv: vec!["/usr/bin/python3".into(), "train.py".into()],
        ..step_spec(ok, "", 1)
    };
    let (_, s) = c.submit_step(ALICE, step, 12).unwrap();
    assert!(records(&mut c).is_empty(), "nothing ended yet");
    for (n, code) in [("worker-0", 0), ("worker-1", 2)] {
        let exit = ExitStatus { code, signal: None };
        c.agent_message(
            n,
            AgentMsg::StepExited {
                job: r0(ok),
                step: s,
                exit,
                oom: false,
            },
            20,
        );
    }
    let exit = ExitStatus::default();
    c.agent_message(
        &first,
        AgentMsg::StepExited {
            job: r0(ok),
            step: StepId::BATCH,
            exit,
            oom: false,
        },
        21,
    );
    for n in ["worker-0", "worker-1"] {
        c.agent_message(
            n,
            AgentMsg::JobCleaned {
                job: r0(ok),
                usage: None,
            },
            22,
        );
    }
    let r = records(&mut c);
    assert_eq!(r.len(), 1);
    let j = &r[0];
    assert_eq!((j.id, j.run, j.state), (ok, 0, JobState::Completed));
    assert_eq!((j.submit, j.start, j.end), (10, Some(11), Some(21)));
    assert_eq!((j.alloc_nodes, j.alloc_gpus, j.req_gpus), (2, 2, 2));
    assert_eq!(j.nodelist, "worker-[0-1]");
    let steps: Vec<_> = j
        .steps
        .iter()
        .map(|s| {
            (
                s.step,
                s.name.as_str(),
                s.nodes,
                s.state,
                s.exit.code,
                s.end,
            )
        })
        .collect();
    assert_eq!(
        steps,
        [
            (StepId::BATCH, "batch", 1, JobState::Completed, 0, Some(21)),
            (StepId(0), "python3", 2, JobState::Failed, 2, Some(20)),
        ]
    );
    // Nothing more for it, however often it changes hands again.
    c.tick(23);
    assert!(records(&mut c).is_empty());

    // A requeued run leaves REQUEUED, then its next run its own end.
    let mut spec = batch("x");
    spec.requeue = true;
    let rq = c.submit(BOB, spec, 30).unwrap();
    c.schedule(30);
    let (node, _) = launches(&mut c).remove(0);
    let other = if node == "worker-0" {
        "worker-1"
    } else {
        "worker-0"
    };
    c.agent_message(other, AgentMsg::Heartbeat { running: vec![] }, 45);
    c.tick(45);
    let r = records(&mut c);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(
        (r[0].id, r[0].run, r[0].state, r[0].end),
        (rq, 0, JobState::Requeued, Some(45))
    );
    // Its batch step ended with the run, not RUNNING for ever.
    let st: Vec<_> = r[0]
        .steps
        .iter()
        .map(|s| (s.step, s.state, s.end))
        .collect();
    assert_eq!(st, [(StepId::BATCH, JobState::Cancelled, Some(45))]);
    assert_eq!(state(&c, rq), JobState::Pending);

    // A pending job cancelled: who did it, no steps, no start.
    let held = c.submit(BOB, batch("x"), 50).unwrap();
    c.cancel(
        ROOT,
        &JobFilter {
            ids: vec![held],
            ..Default::default()
        },
        None,
        51,
    )
    .unwrap();
    let r = records(&mut c);
    let h = r
        .iter()
        .find(|j| j.id == held)
        .expect("the cancelled job's record");
    assert_eq!(
        (h.state, h.cancelled_by, h.start, h.end),
        (JobState::Cancelled, Some(0), None, Some(51))
    );
    assert!(h.steps.is_empty());

    // A submission whose record could not be stored is withdrawn: gone
    // from the queue and the table, deleted from the store, unaccounted.
    let w = c.submit(ALICE, batch("x"), 60).unwrap();
    let _ = c.take_changes();
    c.withdraw(w, 61);
    let changes = c.take_changes();
    assert!(changes
        .jobs
        .iter()
        .any(|(id, rec)| *id == w.0 && rec.is_none()));
    assert!(changes.acct.is_empty());
    assert!(c
        .job_views(
            &JobFilter {
                ids: vec![w],
                ..Default::default()
            },
            61
        )
        .is_empty());
}

#[test]
fn with_a_store_scripts_and_environments_leave_memory_until_the_job_ends() {
    let cfg = Config::parse(
        std::path::Path::new("t.toml"),
        "state_dir = \"/nowhere\"\n[accounting]\nenabled = false\n\
         [[partition]]\nname = \"gpu\"\nnodes = \"worker-[0-3]\"\ndefault = true\n",
    )
    .unwrap();
    let mut c = Controller::new(cfg).unwrap();
    c.register(reg("worker-0", 4), 0).unwrap();
    let mut spec = batch("#!/bin/sh\necho a big script\n");
    spec.env = vec![("HOME".into(), "/home/alice".into())];
    let id = c.submit(ALICE, spec, 1).unwrap();
    let changes = c.take_changes();
    let (pid, p) = changes.payloads[0].clone();
    assert_eq!(pid, id.0);
    let p = p.unwrap();
    let env: Vec<(String, String)> =
        bincode::serde::decode_from_slice(&p.env, bincode::config::standard())
            .unwrap()
            .0;
    assert_eq!(env, [("HOME".to_string(), "/home/alice".to_string())]);
    assert_eq!(
        p.script.as_deref(),
        Some(&b"#!/bin/sh\necho a big script\n"[..])
    );
    let j = c.jobs.get(&id).unwrap();
    assert!(j.spec().env.is_empty());
    assert!(matches!(&j.spec().kind, JobKind::Batch { script, .. } if script.is_empty()));
    // The launch carries no payload: the server fills it from the store.
    c.schedule(2);
    let l = launches(&mut c);
    assert!(l[0].1.env.is_empty());
    let exit = ExitStatus::default();
    c.agent_message(
        "worker-0",
        AgentMsg::StepExited {
            job: r0(id),
            step: StepId::BATCH,
            exit,
            oom: false,
        },
        3,
    );
    c.agent_message(
        "worker-0",
        AgentMsg::JobCleaned {
            job: r0(id),
            usage: None,
        },
        3,
    );
    let changes = c.take_changes();
    assert_eq!(
        changes.payloads,
        [(id.0, None)],
        "deleted once the job ended"
    );
}

/// `srun -J name` names the step (squeue `-s`, sacct JobName); without
/// it the step is its program's file name; a name with a control
/// character is refused.
#[test]
fn srun_j_names_the_step() {
    let mut c = cluster(1);
    let id = c.submit(ALICE, batch("x"), 1).unwrap();
    c.schedule(1);
    let _ = launches(&mut c);
    let named = StepSpec {
        name: Some("train".into()),
        overlap: true,
        ..step_spec(id, "/usr/bin/python3", 1)
    };
    c.submit_step(ALICE, named, 2).unwrap();
    let plain = StepSpec {
        overlap: true,
        ..step_spec(id, "/usr/bin/python3", 2)
    };
    c.submit_step(ALICE, plain, 2).unwrap();
    let names: Vec<String> = c
        .jobs
        .get(&id)
        .unwrap()
        .steps
        .iter()
        .map(|s| s.name.clone())
        .collect();
    assert!(names.contains(&"train".to_string()), "{names:?}");
    assert!(names.contains(&"python3".to_string()), "{names:?}");
    let bad = StepSpec {
        name: Some("a\u{1b}b".into()),
        ..step_spec(id, "true", 3)
    };
    assert!(c.submit_step(ALICE, bad, 3).is_err());
}

#[test]
fn a_run_accounts_at_most_max_steps_steps() {
    let mut c = accounted_cluster(1);
    let id = c.submit(ALICE, batch("x"), 1).unwrap();
    c.schedule(1);
    let _ = launches(&mut c);
    for i in 0..super::acct::MAX_STEPS + 5 {
        let mut secret = [1; 32];
        secret[..8].copy_from_slice(&(i as u64).to_le_bytes());
        let step = StepSpec {
            name: None,
            ntasks: Some(1),
            overlap: true,
            io: StepIo {
                secret,
                ..step_spec(id, "", 0).io
            },
            ..step_spec(id, "true", 0)
        };
        c.submit_step(ALICE, step, 2).unwrap();
    }
    let j = c.jobs.get(&id).unwrap();
    assert_eq!(j.steps.len(), super::acct::MAX_STEPS);
    // What builds launches again is bounded the same way.
    assert_eq!(j.open_steps.len(), 1024);
}

#[test]
fn a_pending_job_keeps_no_run_part_until_it_starts_and_a_requeue_drops_it() {
    let mut c = cluster(1);
    let mut spec = batch("x");
    spec.requeue = true;
    let id = c.submit(ALICE, spec, 0).unwrap();
    // Views, holds and releases read the (absent) run part: none is made.
    let _ = c.job_views(&JobFilter::default(), 0);
    c.hold(ALICE, &[id], false).unwrap();
    c.hold(ALICE, &[id], true).unwrap();
    assert!(c.jobs.get(&id).unwrap().run_part.is_none());
    c.schedule(1);
    launches(&mut c);
    let j = c.jobs.get(&id).unwrap();
    assert_eq!(j.alloc.len(), 1);
    assert!(j.run_part.is_some());
    // Its node goes silent: requeued, pending again, and nothing of the
    // old run is left.
    c.tick(1 + 11);
    let j = c.jobs.get(&id).unwrap();
    assert_eq!((j.state, j.restarts), (JobState::Pending, 1));
    assert!(j.run_part.is_none());
}

#[test]
fn test_only_says_when_and_where_and_submits_nothing() {
    use corral_proto::msg::Response;
    let mut c = cluster(2);
    let mut whole = batch("x");
    whole.nodes = Some(2);
    whole.exclusive = true;
    whole.time_limit = Some(600);
    let ask = |c: &Controller, spec: JobSpec| c.test_only(ALICE, spec, 10);
    match ask(&c, whole.clone()).unwrap() {
        Response::WouldStart {
            job,
            start,
            nodes,
            cpus,
            partition,
        } => {
            assert_eq!((job, start, cpus), (JobId(1), 10, 16));
            assert_eq!(nodes, ["worker-0", "worker-1"]);
            assert_eq!(partition, "gpu");
        }
        other => panic!("{other:?}"),
    }
    assert!(c.job_views(&JobFilter::default(), 10).is_empty());
    // Once the cluster is taken for 600 s, it would start then.
    let first = c.submit(ALICE, whole.clone(), 10).unwrap();
    assert_eq!(first, JobId(1), "the test took no id");
    c.schedule(10);
    match ask(&c, whole.clone()).unwrap() {
        Response::WouldStart { job, start, .. } => assert_eq!((job, start), (JobId(2), 610)),
        other => panic!("{other:?}"),
    }
    assert_eq!(c.job_views(&JobFilter::default(), 10).len(), 1);
    // Held, it would not start; refused as a submission would be.
    whole.hold = true;
    let e = ask(&c, whole.clone()).unwrap_err().to_string();
    assert_eq!(e, "Job would not start: JobHeldUser");
    whole.hold = false;
    whole.partition = Some("nope".into());
    assert!(ask(&c, whole).is_err());
}

/// `scontrol update NumNodes=` as Slurm 22.05 takes it (checked on one):
/// a job given `-N` may not grow past it, one given none grows with its
/// tasks; and a pending job's task count is its nodes times
/// `--ntasks-per-node`.
#[test]
fn scontrol_update_numnodes_keeps_to_what_the_job_asked() {
    use corral_proto::msg::JobChanges;
    let mut c = cluster(3);
    let nodes = |n: u32, max: Option<u32>| JobChanges {
        nodes: Some(n),
        nodes_max: max,
        ..JobChanges::default()
    };
    let held = |f: &dyn Fn(&mut JobSpec)| {
        let mut s = batch("x");
        s.hold = true;
        f(&mut s);
        s
    };
    let one = c.submit(ALICE, held(&|s| s.nodes = Some(1)), 0).unwrap();
    let e = c.update_job(ALICE, one, &nodes(2, None)).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("Node count specification invalid for job {one}")
    );
    assert_eq!(view(&c, one).ask().nodes, Some(1), "left as it was");
    // Naming a larger most is taken.
    c.update_job(ALICE, one, &nodes(2, Some(2))).unwrap();
    assert_eq!(view(&c, one).ask().nodes, Some(2));
    // -n2 without -N: three nodes, three tasks.
    let two = c.submit(ALICE, held(&|s| s.ntasks = Some(2)), 0).unwrap();
    c.update_job(ALICE, two, &nodes(3, None)).unwrap();
    let v = view(&c, two);
    assert_eq!((v.ask().nodes, v.num_tasks, v.num_cpus), (Some(3), 3, 3));
    // -N2 --ntasks-per-node=3 -c1 waits as 6 tasks.
    let six = c
        .submit(
            ALICE,
            held(&|s| {
                s.nodes = Some(2);
                s.ntasks_per_node = Some(3);
                s.cpus_per_task = Some(1);
            }),
            0,
        )
        .unwrap();
    let v = view(&c, six);
    assert_eq!((v.num_tasks, v.num_cpus), (6, 6));
    // --wckey is kept (squeue's %w), not refused.
    let keyed = c
        .submit(ALICE, held(&|s| s.wckey = Some("submitit".into())), 0)
        .unwrap();
    assert_eq!(view(&c, keyed).ask().wckey.as_deref(), Some("submitit"));
    assert_eq!(view(&c, six).ask().wckey, None);
}

#[test]
fn scontrol_update_changes_a_pending_job_within_the_owners_rights() {
    use corral_proto::msg::JobChanges;
    let mut c = cluster(1);
    let mut s = batch("x");
    s.hold = true;
    s.time_limit = Some(3600);
    let id = c.submit(ALICE, s, 0).unwrap();
    // The owner shortens the limit, renames, comments, raises nice.
    let ch = JobChanges {
        time_limit: Some(Some(600)),
        nice: Some(10),
        name: Some("renamed".into()),
        comment: Some("why".into()),
        ..JobChanges::default()
    };
    c.update_job(ALICE, id, &ch).unwrap();
    let v = view(&c, id);
    assert_eq!(
        (
            v.time_limit,
            v.ask().nice,
            v.name.as_str(),
            v.comment.as_deref()
        ),
        (Some(600), 10, "renamed", Some("why"))
    );
    assert_eq!(v.reason, JobReason::JobHeldUser, "still held");
    // Only an operator lengthens the limit or sets a negative nice.
    let longer = JobChanges {
        time_limit: Some(Some(7200)),
        ..JobChanges::default()
    };
    let e = c.update_job(ALICE, id, &longer).unwrap_err().to_string();
    assert!(e.starts_with("Access/permission denied"), "{e}");
    let e = c
        .update_job(
            ALICE,
            id,
            &JobChanges {
                nice: Some(-5),
                ..JobChanges::default()
            },
        )
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("Access/permission denied"), "{e}");
    c.update_job(ROOT, id, &longer).unwrap();
    assert_eq!(view(&c, id).time_limit, Some(7200));
    // Relative: `TimeLimit=-N` the owner may, `+N` only an operator.
    let by = |secs: i64| JobChanges {
        time_limit_by: Some(secs),
        ..JobChanges::default()
    };
    c.update_job(ALICE, id, &by(-1800)).unwrap();
    assert_eq!(view(&c, id).time_limit, Some(5400));
    let e = c.update_job(ALICE, id, &by(60)).unwrap_err().to_string();
    assert!(e.starts_with("Access/permission denied"), "{e}");
    c.update_job(ROOT, id, &by(600)).unwrap();
    assert_eq!(view(&c, id).time_limit, Some(6000));
    assert!(
        c.update_job(ROOT, id, &by(-5970)).is_err(),
        "under a minute"
    );
    assert_eq!(view(&c, id).time_limit, Some(6000));
    // Not another user's job; not a partition that does not exist (and
    // the job is left as it was).
    assert!(c.update_job(BOB, id, &ch).is_err());
    let e = c
        .update_job(
            ALICE,
            id,
            &JobChanges {
                partition: Some("nowhere".into()),
                ..JobChanges::default()
            },
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("nowhere"), "{e}");
    assert_eq!(view(&c, id).partition, "gpu");
    // A job that started is no longer updated this way.
    c.hold(ALICE, &[id], true).unwrap();
    c.schedule(0);
    assert_eq!(view(&c, id).state, JobState::Running);
    let e = c.update_job(ALICE, id, &ch).unwrap_err().to_string();
    assert_eq!(
        e,
        format!("Job is no longer pending execution for job {id}")
    );
}

#[test]
fn a_running_jobs_limit_moves_its_end_within_the_owners_rights() {
    use corral_proto::msg::JobChanges;
    let mut c = cluster(1);
    let mut s = batch("x");
    s.time_limit = Some(3600);
    let id = c.submit(ALICE, s, 0).unwrap();
    c.schedule(0);
    let (node, _) = launches(&mut c).remove(0);
    assert_eq!(state(&c, id), JobState::Running);
    let limit = |l: u64| JobChanges {
        time_limit: Some(Some(l)),
        ..JobChanges::default()
    };
    // Shorter: the owner may; the end moves.
    c.update_job(ALICE, id, &limit(600)).unwrap();
    assert_eq!(view(&c, id).time_limit, Some(600));
    assert_eq!(view(&c, id).end_time, Some(600));
    // Longer: only an operator.
    assert!(c.update_job(ALICE, id, &limit(1200)).is_err());
    c.update_job(ROOT, id, &limit(1200)).unwrap();
    assert_eq!(view(&c, id).end_time, Some(1200));
    // Anything else of a running job is refused.
    let renamed = JobChanges {
        name: Some("x".into()),
        ..JobChanges::default()
    };
    assert!(c.update_job(ALICE, id, &renamed).is_err());
    // A limit already passed ends it at the next tick, as TIMEOUT would.
    c.update_job(ALICE, id, &limit(60)).unwrap();
    c.agent_message(
        &node,
        AgentMsg::Heartbeat {
            running: vec![r0(id)],
        },
        100,
    );
    c.tick(100);
    assert_eq!(state(&c, id), JobState::Completing);
}

#[test]
fn a_waiting_job_shows_where_its_reservation_would_start_it() {
    let mut c = cluster(2);
    let mut whole = batch("x");
    whole.nodes = Some(2);
    whole.exclusive = true;
    whole.time_limit = Some(600);
    let running = c.submit(ALICE, whole.clone(), 0).unwrap();
    c.schedule(0);
    assert_eq!(state(&c, running), JobState::Running);
    let waiting = c.submit(ALICE, whole, 1).unwrap();
    c.schedule(1);
    let v = view(&c, waiting);
    assert_eq!(v.expected_start, Some(600));
    assert_eq!(v.ask().sched_nodes.len(), 2, "{:?}", v.ask().sched_nodes);
    let show = crate::cli::scontrol::show_job(&v, 1);
    assert!(
        show.contains("   NodeList= SchedNodeList=worker-[0-1]\n"),
        "{show}"
    );
}

#[test]
fn scontrol_top_puts_the_named_jobs_first_among_their_owners() {
    let mut c = cluster(1);
    let mut whole = batch("x");
    whole.nodes = Some(1);
    whole.exclusive = true;
    whole.time_limit = Some(600);
    let busy = c.submit(ALICE, whole.clone(), 0).unwrap();
    c.schedule(0);
    assert_eq!(state(&c, busy), JobState::Running);
    let a = c.submit(ALICE, whole.clone(), 1).unwrap();
    let b = c.submit(ALICE, whole.clone(), 2).unwrap();
    let d = c.submit(ALICE, whole, 3).unwrap();
    c.schedule(10);
    let prio = |c: &Controller, id| view(c, id).priority;
    assert!(prio(&c, a) >= prio(&c, b) && prio(&c, b) >= prio(&c, d));
    // Only an operator (Slurm's default).
    assert!(c.top(ALICE, &[d]).is_err());
    c.top(ROOT, &[d, b]).unwrap();
    c.schedule(11);
    assert!(
        prio(&c, d) > prio(&c, b) && prio(&c, b) > prio(&c, a),
        "{} {} {}",
        prio(&c, d),
        prio(&c, b),
        prio(&c, a)
    );
    assert!(view(&c, d).ask().nice < 0);
    // A started job is not moved.
    assert!(c.top(ROOT, &[busy]).is_err());
}

#[test]
fn reconfigure_applies_what_needs_no_restart_and_refuses_the_rest() {
    let mut c = cluster(1);
    let mut s = batch("x");
    s.hold = true;
    let id = c.submit(ALICE, s, 0).unwrap();
    let with = |top: &str, partition: &str| {
        Config::parse(
            std::path::Path::new("t.toml"),
            &format!(
                "heartbeat_timeout = 10\nrequeue_delay = 0\n{top}\n[[partition]]\nname = \"gpu\"\nnodes = \"worker-[0-3]\"\ndefault = true\n{partition}\n"
            ),
        )
        .unwrap()
    };
    // Only an operator.
    assert!(c.reconfigure(ALICE, with("kill_wait = 9", "")).is_err());
    // Timeouts and a partition's limits change live; the job stays.
    let changed = c
        .reconfigure(ROOT, with("kill_wait = 9", "max_time = \"30\""))
        .unwrap();
    assert_eq!(changed, ["partition gpu", "kill_wait"]);
    let kv = c.config_view();
    assert!(
        kv.contains(&("KillWait".to_string(), "9 sec".to_string())),
        "{kv:?}"
    );
    assert_eq!(c.partition_views()[0].max_time, Some(1800));
    assert_eq!(view(&c, id).state, JobState::Pending);
    // A job over the new limit is refused as at submit.
    let mut long = batch("x");
    long.time_limit = Some(3600);
    assert!(c.submit(ALICE, long, 1).is_err());
    // What only a restart changes: nothing changes.
    let e = c
        .reconfigure(ROOT, with("kill_wait = 2\ncluster = \"other\"", ""))
        .unwrap_err()
        .to_string();
    assert!(e.contains("cluster changes only with a restart"), "{e}");
    assert!(c
        .config_view()
        .contains(&("KillWait".to_string(), "9 sec".to_string())));
    // The priority weights too (the scheduler was made with them).
    let e = c
        .reconfigure(ROOT, with("[priority]\nsize = 1000", ""))
        .unwrap_err()
        .to_string();
    assert!(e.contains("priority changes only with a restart"), "{e}");
    let kv = c.config_view();
    for (k, v) in [
        ("PriorityWeightJobSize", "0"),
        ("PriorityWeightFairshare", "10000"),
        ("PriorityMaxAge", "7-00:00:00"),
    ] {
        assert!(kv.contains(&(k.to_string(), v.to_string())), "{k}: {kv:?}");
    }
}

#[test]
fn an_update_cannot_grow_a_job_past_its_owners_bytes() {
    use corral_proto::msg::JobChanges;
    let mut c = cluster_with("[limits]\nmax_bytes_per_user = 900");
    let mut s = batch("x");
    s.hold = true;
    let id = c.submit(ALICE, s, 0).unwrap();
    let big = JobChanges {
        comment: Some("x".repeat(1000)),
        ..JobChanges::default()
    };
    let e = c.update_job(ALICE, id, &big).unwrap_err().to_string();
    assert!(e.contains("the limit per user is 900"), "{e}");
    // Longer than any comment may be, whatever the user's bytes.
    let huge = JobChanges {
        comment: Some("x".repeat(1025)),
        ..JobChanges::default()
    };
    let e = c.update_job(ROOT, id, &huge).unwrap_err().to_string();
    assert_eq!(e, "Invalid comment: longer than 1024 bytes");
    assert_eq!(view(&c, id).comment, None, "nothing changed");
    // A small one fits.
    let small = JobChanges {
        comment: Some("fine".into()),
        ..JobChanges::default()
    };
    c.update_job(ALICE, id, &small).unwrap();
    assert_eq!(view(&c, id).comment.as_deref(), Some("fine"));
    // Hostile values: a nice out of range.
    let wild = JobChanges {
        nice: Some(i32::MAX),
        ..JobChanges::default()
    };
    assert!(c.update_job(ROOT, id, &wild).is_err());
    // top with more ids than any filter may hold is refused whole.
    let many: Vec<JobId> = (0..=crate::ctld::MAX_FILTER_ENTRIES as u64)
        .map(JobId)
        .collect();
    assert!(c.top(ROOT, &many).is_err());
}

#[test]
fn a_stamp_is_stored_as_the_option_it_stands_for() {
    let cfg = bincode::config::standard();
    for t in [
        None,
        Some(0),
        Some(1),
        Some(1_764_000_000_000),
        Some(u64::MAX - 1),
    ] {
        let stamp = Stamp::from(t);
        assert_eq!(stamp.get(), t);
        assert_eq!(stamp.is_none(), t.is_none());
        let as_stamp = bincode::serde::encode_to_vec(stamp, cfg).unwrap();
        let as_option = bincode::serde::encode_to_vec(t, cfg).unwrap();
        assert_eq!(as_stamp, as_option, "{t:?}");
        let (back, _): (Stamp, usize) = bincode::serde::decode_from_slice(&as_option, cfg).unwrap();
        assert_eq!(back, stamp);
    }
    // A record's three times take eight bytes each, and its spec's kind
    // rides in the spec's bytes: 152 bytes in all, a 160-byte chunk of
    // glibc's malloc (184 bytes took 192).
    assert_eq!(std::mem::size_of::<Stamp>(), 8);
    assert!(
        std::mem::size_of::<JobRecord>() <= 152,
        "{}",
        std::mem::size_of::<JobRecord>()
    );
}

/// Every free text a job keeps after it ends is bounded at submission
/// (names and comments at `max_text_len`, paths at `max_path_len`), and
/// refused in one line naming what and the limit.
#[test]
fn free_texts_are_bounded_at_submission() {
    let mut c = cluster(1);
    let long = |n: usize| "n".repeat(n);
    let mut ok = batch("true");
    ok.name = long(1024);
    ok.comment = Some(long(1024));
    ok.work_dir = format!("/{}", long(4095));
    c.submit(ALICE, ok, 0).unwrap();
    type Set = fn(&mut JobSpec, String);
    let cases: [(&str, usize, Set); 8] = [
        ("job name", 1025, |s, t| s.name = t),
        ("wckey", 1025, |s, t| s.wckey = Some(t)),
        ("comment", 1025, |s, t| s.comment = Some(t)),
        ("partition, QOS or account name", 1025, |s, t| {
            s.account = Some(t)
        }),
        ("mail user", 1025, |s, t| s.mail_user = Some(t)),
        ("working directory", 4097, |s, t| s.work_dir = t),
        ("submit directory", 4097, |s, t| s.submit_dir = Some(t)),
        ("output file name", 4097, |s, t| {
            s.kind = JobKind::Batch {
                script: b"true".to_vec(),
                args: vec![],
                stdout: Some(t),
                stderr: None,
            }
        }),
    ];
    for (what, n, set) in cases {
        let mut s = batch("true");
        set(&mut s, long(n));
        let e = c.submit(ALICE, s, 0).unwrap_err().to_string();
        let max = if n > 2000 { 4096 } else { 1024 };
        assert_eq!(e, format!("Invalid {what}: longer than {max} bytes"));
    }
    // The bounds are the operator's to set.
    let mut c = cluster_with("[limits]\nmax_text_len = 16");
    let mut s = batch("true");
    s.name = long(17);
    let e = c.submit(ALICE, s, 0).unwrap_err().to_string();
    assert_eq!(e, "Invalid job name: longer than 16 bytes");
    // A name that reorders or breaks other users' lines is refused.
    for evil in ["x\u{202e}gpj.exe", "a\u{2028}JobId=1", "b\u{2066}c"] {
        let mut s = batch("true");
        s.name = evil.into();
        let e = c.submit(ALICE, s, 0).unwrap_err();
        assert!(
            matches!(e, CtldError::ControlCharacters { what: "job name" }),
            "{evil:?}: {e}"
        );
    }
}

/// What a user's finished jobs keep (their records, until `min_job_age`
/// forgets them) counts against the user's bytes: a user whose jobs end
/// at once cannot fill the state disk with them.
#[test]
fn finished_jobs_keep_counting_against_their_user_until_forgotten() {
    let mut c = cluster_with("min_job_age = 100\n[limits]\nmax_bytes_per_user = 20000");
    let mut s = batch("true");
    s.comment = Some("c".repeat(1000));
    let mut ended = 0;
    let refused = loop {
        let id = match c.submit(ALICE, s.clone(), 1) {
            Ok(id) => id,
            Err(e) => break e.to_string(),
        };
        c.schedule(1);
        let (node, l) = launches(&mut c).remove(0);
        finish(&mut c, &node, &l, 0, 1);
        assert_eq!(state(&c, id), JobState::Completed);
        c.take_changes();
        ended += 1;
        assert!(ended < 100, "finished jobs never counted");
    };
    assert!(refused.contains("what finished jobs keep"), "{refused}");
    assert!(ended >= 5, "{ended} jobs before the limit");
    // Another user is not held by it.
    let mut b = s.clone();
    b.hold = true;
    c.submit(BOB, b, 1).unwrap();
    // Once forgotten, the room is back.
    c.tick(200);
    c.submit(ALICE, s, 200).unwrap();
}

/// A job that asks for no memory holds its CPUs' share of the node's
/// (or `default_mem_per_cpu` MB a CPU), in the scheduler and in the
/// limit its launch carries: it neither crowds out a job that asked
/// nor runs without a limit beside it.
#[test]
fn a_job_without_a_memory_ask_holds_its_share_of_the_node() {
    let mut c = cluster(1);
    let mut asks = batch("true");
    asks.mem_mb = Some(15_000);
    let first = c.submit(ALICE, asks, 0).unwrap();
    c.schedule(0);
    let l = launches(&mut c);
    assert_eq!(l.len(), 1);
    assert_eq!(l[0].1.memory_mb, 15_000);
    // Four CPUs' share of 16,000 MB on 8 CPUs is 8,000: it waits.
    let mut four = batch("true");
    four.ntasks = Some(4);
    let second = c.submit(BOB, four, 1).unwrap();
    c.schedule(1);
    assert!(launches(&mut c).is_empty(), "no room for its share");
    assert_eq!(state(&c, second), JobState::Pending);
    assert_eq!(state(&c, first), JobState::Running);
    // Alone on a node, one CPU's share is its cgroup's limit.
    let mut c = cluster(1);
    c.submit(ALICE, batch("true"), 0).unwrap();
    c.schedule(0);
    assert_eq!(launches(&mut c).remove(0).1.memory_mb, 2000);
    // Set per CPU, or none.
    for (setting, want) in [
        ("default_mem_per_cpu = 500", 500),
        ("default_mem_per_cpu = 0", 0),
    ] {
        let mut c = cluster_with(&format!("[limits]\n{setting}"));
        let mut two = batch("true");
        two.cpus_per_task = Some(2);
        c.submit(ALICE, two, 0).unwrap();
        c.schedule(0);
        assert_eq!(
            launches(&mut c).remove(0).1.memory_mb,
            want * 2,
            "{setting}"
        );
    }
}

/// `sacct`'s answers are paged by bytes as well as rows, a job's runs
/// kept together; a job too large for any answer is an error naming it
/// (a few huge records once broke every operator's sacct).
#[test]
fn accounting_pages_are_bounded_by_bytes_too() {
    use crate::ctld::acct::{page, ACCT_PAGE_BYTES};
    let mut c = cluster_with(
        "requeue_delay = 0\n[limits]\nmax_text_len = 8000000\nmax_bytes_per_user = 100000000",
    );
    let mut record = |comment_mb: usize| {
        let mut spec = batch("x");
        spec.comment = Some("c".repeat(comment_mb << 20));
        let id = c.submit(ALICE, spec, 0).unwrap();
        c.jobs.get(&id).unwrap().acct(0)
    };
    let (a, b, d) = (record(1), record(2), record(2));
    // 1 + 2 MiB fit in 4; the third starts the next page.
    let (got, next) = page(vec![a.clone(), b.clone(), d.clone()], None).unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(next, Some(JobId(d.id.0 - 1)));
    // Two runs of one job stay on one page.
    let mut b1 = b.clone();
    b1.run = 1;
    let (got, next) = page(vec![a.clone(), b.clone(), b1], None).unwrap();
    assert_eq!((got.len(), next), (1, Some(a.id)));
    // A record larger than a page is refused, by name.
    let huge = record(5);
    let e = page(vec![huge.clone(), a.clone()], None).unwrap_err();
    assert_eq!(
        e,
        format!("job {}'s accounting records take more than the {ACCT_PAGE_BYTES} bytes one answer carries; leave it out with -j", huge.id)
    );
    // Small ones: the database's own bound stays.
    let (got, next) = page(vec![a.clone()], Some(JobId(77))).unwrap();
    assert_eq!((got.len(), next), (1, Some(JobId(77))));
}

/// With private accounting (the default), `sacct -u other` from an
/// ordinary user shows nothing, not the caller's own jobs; naming
/// herself among others shows hers; root sees whom it names.
#[test]
fn sacct_for_other_users_shows_an_ordinary_user_nothing() {
    let c = cluster(1);
    let q = |users: Vec<u32>| corral_proto::msg::AcctQuery {
        users,
        ..Default::default()
    };
    assert_eq!(c.acct_users(&q(vec![BOB.uid]), ALICE), None);
    assert_eq!(
        c.acct_users(&q(vec![BOB.uid, ALICE.uid]), ALICE),
        Some(vec![ALICE.uid])
    );
    assert_eq!(c.acct_users(&q(vec![]), ALICE), Some(vec![ALICE.uid]));
    assert_eq!(c.acct_users(&q(vec![BOB.uid]), ROOT), Some(vec![BOB.uid]));
}

/// An array's tasks cancelled while they wait each leave an accounting
/// record (CANCELLED, never started, under the task's id and index), as
/// the tasks that ran do.
#[test]
fn cancelled_waiting_array_tasks_are_accounted() {
    use corral_proto::msg::{ArraySpec, IndexRun};
    let mut c = accounted_cluster(1);
    let mut spec = batch("x");
    spec.array = Some(ArraySpec {
        runs: vec![IndexRun {
            first: 10,
            count: 4,
            step: 10,
        }],
        throttle: 0,
    });
    spec.hold = true;
    let a = c.submit(ALICE, spec, 5).unwrap();
    // Task 20 alone, then the rest.
    let only = JobFilter {
        tasks: vec![(a, 20)],
        ..Default::default()
    };
    c.cancel(ALICE, &only, None, 6).unwrap();
    let r = records(&mut c);
    let got: Vec<_> = r
        .iter()
        .map(|j| (j.id, j.array, j.state, j.start, j.end))
        .collect();
    assert_eq!(
        got,
        [(
            JobId(a.0 + 2),
            Some((a, 20)),
            JobState::Cancelled,
            None,
            Some(6)
        )]
    );
    let all = JobFilter {
        ids: vec![a],
        ..Default::default()
    };
    c.cancel(ALICE, &all, None, 7).unwrap();
    let r = records(&mut c);
    let got: Vec<_> = r
        .iter()
        .map(|j| (j.id.0 - a.0, j.array.map(|x| x.1)))
        .collect();
    assert_eq!(got, [(1, Some(10)), (3, Some(30)), (4, Some(40))]);
    assert!(r.iter().all(|j| j.cancelled_by == Some(ALICE.uid)));
}

#[test]
fn a_job_naming_no_account_gets_its_users_default_and_usage_is_charged_there() {
    let mut c = cluster_with(
        "[accounts]\ndefault = \"general\"\n[accounts.users]\n\"1000\" = [\"ml\", \"vision\"]\n",
    );
    let a = c.submit(ALICE, batch("x"), 1).unwrap();
    let b = c.submit(BOB, batch("x"), 1).unwrap();
    let mut named = batch("x");
    named.account = Some("vision".into());
    let v = c.submit(ALICE, named, 1).unwrap();
    assert_eq!(view(&c, a).ask().account.as_deref(), Some("ml"));
    assert_eq!(view(&c, b).ask().account.as_deref(), Some("general"));
    assert_eq!(view(&c, v).ask().account.as_deref(), Some("vision"));
    // Alice's first job runs 100 s and is charged to ml, not vision.
    c.schedule(1);
    let (node, l) = launches(&mut c)
        .into_iter()
        .find(|(_, l)| l.job_run().job == a)
        .unwrap();
    assert_eq!(l.shape.account.as_deref(), Some("ml"));
    finish(&mut c, &node, &l, 0, 101);
    let list = c.associations(ALICE, "alice".into(), 101);
    let row = |acct: &str| list.list.iter().find(|r| r.account == acct).unwrap();
    assert!(row("ml").account_usage > 0.0, "{list:?}");
    assert_eq!(row("vision").account_usage, 0.0);
    assert!(row("ml").fairshare < 1.0);
    assert!(row("ml").default && !row("vision").default);
    // Bob is not listed: his line is the default account, as he asked.
    let list = c.associations(BOB, "bob".into(), 101);
    assert!(list
        .list
        .iter()
        .any(|r| r.user == "bob" && r.account == "general" && r.default));
    // With no default, a job of an unlisted user names none, as before.
    let mut c = cluster_with("[accounts]\ndefault = \"\"\n");
    let b = c.submit(BOB, batch("x"), 1).unwrap();
    assert_eq!(view(&c, b).ask().account, None);
}
