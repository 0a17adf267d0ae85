//! sacct against what a Slurm 22.05 with slurmdbd over MariaDB printed
//! for the same jobs (`benches/slurmdbd.sh`, two 4-CPU nodes `n1`, `n2`,
//! 8000 MB each, KillWait 5): the records below are those jobs as Corral
//! keeps them, and `testdata/sacct-slurmdbd-22.05.txt` holds Slurm's
//! output, each section under its `### ` heading, run on 7 Dec 2026:
//!
//! - 48 `ok`: `srun -J stepa true; true`, COMPLETED with a step;
//! - 49 `bad`: `exit 3`, FAILED;
//! - 50 `slow`: `-t 1`, `sleep 300`, TIMEOUT;
//! - 51 `killme`: cancelled by root while running;
//! - 54 `lost`: `--no-requeue`, its node's slurmd killed and the node
//!   set DOWN: NODE_FAIL;
//! - 56 `again`: `scontrol requeue` while running (REQUEUED), then its
//!   second run COMPLETED.

use super::*;
use corral_proto::msg::{Ident, JobReason};

const REFERENCE: &str = include_str!("testdata/sacct-slurmdbd-22.05.txt");

/// One section of Slurm's output.
fn section(name: &str) -> String {
    let start = REFERENCE
        .find(&format!("### {name}\n"))
        .unwrap_or_else(|| panic!("no section {name}"))
        + name.len()
        + 5;
    let rest = &REFERENCE[start..];
    rest[..rest.find("### ").unwrap_or(rest.len())].to_string()
}

fn step(
    id: StepId,
    name: &str,
    node: &str,
    (start, end): (u64, u64),
    state: JobState,
    exit: ExitStatus,
) -> AcctStep {
    AcctStep {
        step: id,
        name: name.into(),
        nodelist: node.into(),
        nodes: 1,
        tasks: 1,
        cpus: 1,
        start,
        end: Some(end),
        state,
        exit,
    }
}

const fn code(code: i32) -> ExitStatus {
    ExitStatus { code, signal: None }
}

/// A death by signal as ctld records it (`0:SIG`).
const fn signal(s: i32) -> ExitStatus {
    ExitStatus {
        code: 0,
        signal: Some(s),
    }
}

/// The reference's jobs, as Corral's accounting records them.
fn jobs() -> Vec<AcctJob> {
    let job =
        |id: u64, name: &str, node: &str, times: [u64; 4], state: JobState, exit: ExitStatus| {
            AcctJob {
                id: JobId(id),
                array: None,
                run: 0,
                name: name.into(),
                user: Ident { uid: 0, gid: 0 },
                account: "root".into(),
                partition: "p".into(),
                nodelist: node.into(),
                alloc_nodes: 1,
                alloc_cpus: 1,
                alloc_mem_mb: 8000,
                alloc_gpus: 0,
                req_nodes: 1,
                req_cpus: 1,
                req_mem_mb: 8000,
                req_gpus: 0,
                submit: times[0],
                eligible: times[1],
                start: Some(times[2]),
                end: Some(times[3]),
                time_limit: None,
                state,
                reason: JobReason::None,
                exit,
                cancelled_by: None,
                usage: None,
                work_dir: "/tmp".into(),
                comment: String::new(),
                wckey: String::new(),
                steps: Vec::new(),
            }
        };
    let batch =
        |node: &str, t: (u64, u64), state, exit| step(StepId::BATCH, "batch", node, t, state, exit);
    let (t31, t32, t35) = (1_796_677_471, 1_796_677_472, 1_796_677_475);
    let mut ok = job(
        48,
        "ok",
        "n1",
        [t31, t31, t32, t32],
        JobState::Completed,
        code(0),
    );
    ok.steps = vec![
        step(
            StepId(0),
            "stepa",
            "n1",
            (t32, t32),
            JobState::Completed,
            code(0),
        ),
        batch("n1", (t32, t32), JobState::Completed, code(0)),
    ];
    let mut bad = job(
        49,
        "bad",
        "n2",
        [t31, t31, t32, t32],
        JobState::Failed,
        code(3),
    );
    bad.steps = vec![batch("n2", (t32, t32), JobState::Failed, code(3))];
    let t48 = 1_796_677_548;
    let mut slow = job(
        50,
        "slow",
        "n1",
        [t31, t31, t35, t48],
        JobState::Timeout,
        code(0),
    );
    slow.time_limit = Some(60);
    slow.steps = vec![batch("n1", (t35, t48), JobState::Cancelled, signal(15))];
    let mut killed = job(
        51,
        "killme",
        "n2",
        [t31, t31, t35, t35],
        JobState::Cancelled,
        code(0),
    );
    killed.cancelled_by = Some(0);
    killed.steps = vec![batch("n2", (t35, t35), JobState::Cancelled, signal(15))];
    let (t49, t51, t53) = (1_796_677_489, 1_796_677_491, 1_796_677_493);
    let mut lost = job(
        54,
        "lost",
        "n2",
        [t49, t49, t51, t53],
        JobState::NodeFail,
        code(0),
    );
    lost.steps = vec![batch(
        "n2",
        (t51, t53),
        JobState::Cancelled,
        ExitStatus::default(),
    )];
    let (t57, t58, t59) = (1_796_677_557, 1_796_677_558, 1_796_677_559);
    let mut first = job(
        56,
        "again",
        "n1",
        [t57, t57, t58, t59],
        JobState::Requeued,
        code(0),
    );
    first.steps = vec![batch("n1", (t58, t59), JobState::Cancelled, signal(15))];
    let (t00, t22, t26) = (1_796_677_680, 1_796_677_702, 1_796_677_706);
    let mut second = job(
        56,
        "again",
        "n1",
        [t59, t00, t22, t26],
        JobState::Completed,
        code(0),
    );
    second.run = 1;
    second.steps = vec![batch("n1", (t22, t26), JobState::Completed, code(0))];
    vec![ok, bad, slow, killed, lost, first, second]
}

fn sacct(jobs: &[AcctJob], format: &str, layout: &Layout, allocations: bool) -> String {
    let columns = parse_columns(format).expect("columns");
    let mut jobs = jobs.to_vec();
    if allocations {
        for j in &mut jobs {
            j.steps.clear();
        }
    }
    render(&jobs, &columns, layout, true, &Vec::new(), 1_796_678_000)
}

/// The latest run of each job (sacct without -D).
fn latest(jobs: Vec<AcctJob>) -> Vec<AcctJob> {
    let mut out: Vec<AcctJob> = Vec::new();
    for j in jobs {
        match out.iter_mut().find(|o| o.id == j.id) {
            Some(o) if o.run < j.run => *o = j,
            Some(_) => {}
            None => out.push(j),
        }
    }
    out
}

#[test]
fn the_default_layout_is_slurms() {
    let cols = Layout::Columns;
    assert_eq!(
        sacct(&latest(jobs()), DEFAULT_FORMAT, &cols, false),
        section("default")
    );
    assert_eq!(
        sacct(&latest(jobs()), DEFAULT_FORMAT, &cols, true),
        section("-X")
    );
    assert_eq!(sacct(&jobs(), DEFAULT_FORMAT, &cols, false), section("-D"));
}

#[test]
fn states_in_full_and_parsable_brief_are_slurms() {
    let wide = sacct(
        &latest(jobs()),
        "JobID,State%20,ExitCode",
        &Layout::Columns,
        true,
    );
    assert_eq!(wide, section("state widths"));
    let brief = sacct(
        &latest(jobs()),
        BRIEF_FORMAT,
        &Layout::Parsable("|".into()),
        true,
    );
    assert_eq!(brief, section("-p -X brief"));
}

/// Every field Corral keeps, job lines and step lines, as Slurm's
/// (`Timelimit` and `Reason` of the requeued job's second run left out:
/// Slurm shows 365-00:00:00 and BeginTime there, leftovers of its
/// requeue).
#[test]
fn fields_of_job_and_step_lines_are_slurms() {
    let format = "JobID,JobIDRaw,JobName,Partition,Account,AllocCPUS,State,ExitCode,Elapsed,ElapsedRaw,NNodes,NodeList,Submit,Eligible,Start,End,Timelimit,ReqMem,AllocTRES,ReqTRES,NCPUS,NTasks,ReqCPUS,ReqNodes,AllocNodes,DerivedExitCode,User,UID,Group,GID,CPUTime,CPUTimeRAW,Reason,WorkDir";
    let ours = sacct(&jobs(), format, &Layout::Parsable2("|".into()), false);
    let theirs = section("-P -D -o");
    let second_run = |l: &str| l.starts_with("56|") && l.contains("|COMPLETED|");
    for (i, (a, b)) in ours.lines().zip(theirs.lines()).enumerate() {
        if second_run(a) && second_run(b) {
            let cut = |l: &str| {
                let f: Vec<&str> = l.split('|').collect();
                [&f[..16], &f[17..32], &f[33..]].concat().join("|")
            };
            assert_eq!(cut(a), cut(b), "line {i}");
        } else {
            assert_eq!(a, b, "line {i}");
        }
    }
    assert_eq!(ours.lines().count(), theirs.lines().count());
}

/// `-l`: Slurm's columns and widths; a job's line as Slurm's (the usage
/// columns empty: nothing measured them for a job that ran no time).
#[test]
fn the_long_layout_is_slurms() {
    let bad: Vec<AcctJob> = jobs().into_iter().filter(|j| j.id == JobId(49)).collect();
    assert_eq!(
        sacct(&bad, LONG_FORMAT, &Layout::Columns, true),
        section("-l -X")
    );
}

/// `-S`/`-E`: the jobs Slurm listed for each window (among these; its
/// cluster had others), through Corral's parsing and selection.
#[test]
fn windows_select_as_slurms() {
    let now = 1_796_678_000;
    let pick = |args: &[&str]| -> Vec<String> {
        let mut argv = vec!["sacct", "-X"];
        argv.extend_from_slice(args);
        let a = SacctArgs::try_parse_from(argv).expect("arguments");
        let (q, _) = query(&a, now).expect("a query");
        let found: Vec<AcctJob> = jobs()
            .into_iter()
            .filter(|j| crate::ctld::acct::matches(&q, &[], j))
            .collect();
        crate::ctld::acct::last_runs(found, q.duplicates)
            .iter()
            .map(|j| format!("{}|{}", j.id, state_text(j.state, j.cancelled_by)))
            .collect()
    };
    let cases: [(&[&str], &[&str]); 6] = [
        (
            &["-S", "2026-12-07T21:05:00", "-E", "2026-12-07T21:05:50"],
            &["50|TIMEOUT"],
        ),
        (
            &["-S", "2026-12-07T21:04:40", "-E", "2026-12-07T21:04:50"],
            &["50|TIMEOUT", "54|NODE_FAIL"],
        ),
        (&["-S", "2026-12-07T21:05:49"], &["56|COMPLETED"]),
        (
            &["-D", "-S", "2026-12-07T21:05:49"],
            &["56|REQUEUED", "56|COMPLETED"],
        ),
        (
            &["-E", "2026-12-07T21:04:33"],
            &[
                "48|COMPLETED",
                "49|FAILED",
                "50|TIMEOUT",
                "51|CANCELLED by 0",
            ],
        ),
        (
            &["-S", "2026-12-07T21:04:32", "-E", "2026-12-07T21:04:32"],
            &[
                "48|COMPLETED",
                "49|FAILED",
                "50|TIMEOUT",
                "51|CANCELLED by 0",
            ],
        ),
    ];
    for (args, want) in cases {
        assert_eq!(pick(args), want, "{args:?}");
    }
}
