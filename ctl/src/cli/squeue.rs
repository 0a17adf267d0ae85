//! `squeue`: the queue, in Slurm's default layout, a `-o` format of `%`
//! codes or a `-O` list of field names, sorted as `-S` says; jobs or, with
//! `-s`, their steps.

use std::borrow::Borrow;
use std::ffi::OsString;

use clap::Parser;
use corral_proto::msg::{format_indices, JobFilter, JobState, JobView, StepView};
use scheduler_core::hostlist;

use super::format::Token;
use super::opts::parse_job_list;
use super::{block_on, fail, group_name, parse, parse_user, user_name, words};
use crate::client::Client;
use crate::ctld::server::now;
use crate::timefmt::{
    elapsed, elapsed_into, push_int, push_uint, strftime, timestamp, timestamp_into,
};

const CMD: &str = "squeue";

/// Slurm's default squeue format.
pub const DEFAULT_FORMAT: &str = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R";
/// `-l`.
pub const LONG_FORMAT: &str = "%.18i %.9P %.8j %.8u %.8T %.10M %.9l %.6D %R";
/// `--start`.
pub const START_FORMAT: &str = "%.18i %.9P %.8j %.8u %.2t %.19S %.6D %20Y %R";
/// `-s`.
pub const STEP_FORMAT: &str = "%.15i %.8j %.9P %.8u %.9M %N";
/// Slurm's default order: partition, state, priority (highest first).
pub const DEFAULT_SORT: &str = "P,t,-p";
/// Lines a table makes room for at a time (those of one part of a
/// listing, as ctld sends them).
const ROOM_AHEAD: usize = 500;
/// The width of a `-O` field that names none.
const FORMAT2_WIDTH: usize = 20;

/// View the job queue.
#[derive(Debug, Parser)]
#[command(name = "squeue", version, disable_help_flag = true)]
pub struct SqueueArgs {
    /// Print help.
    #[arg(long, action = clap::ArgAction::Help)]
    pub help: Option<bool>,
    /// No header line.
    #[arg(short = 'h', long = "noheader")]
    pub noheader: bool,
    /// Only these users' jobs (names or uids, comma separated).
    #[arg(short = 'u', long = "user")]
    pub user: Option<String>,
    /// Only your own jobs.
    #[arg(long)]
    pub me: bool,
    /// Only these jobs.
    #[arg(short = 'j', long = "jobs")]
    pub jobs: Option<String>,
    /// Only jobs in these states (PD,R,… or `all`).
    #[arg(short = 't', long = "states")]
    pub states: Option<String>,
    /// Only these partitions.
    #[arg(short = 'p', long = "partition")]
    pub partition: Option<String>,
    /// Only jobs with these names.
    #[arg(short = 'n', long = "name")]
    pub name: Option<String>,
    /// Only jobs of these accounts.
    #[arg(short = 'A', long = "account")]
    pub account: Option<String>,
    /// Only jobs of these QOS.
    #[arg(short = 'q', long = "qos")]
    pub qos: Option<String>,
    /// Only jobs on these nodes (a hostlist).
    #[arg(short = 'w', long = "nodelist")]
    pub nodelist: Option<String>,
    /// Output format: `%` codes with optional `.` (right-justify) and width.
    #[arg(short = 'o', long = "format")]
    pub format: Option<String>,
    /// Output format: field names, each `name[:[.]width]`, comma separated.
    #[arg(short = 'O', long = "Format")]
    pub format2: Option<String>,
    /// Sort by these `%` codes (`-` before one for descending).
    #[arg(short = 'S', long = "sort", allow_hyphen_values = true)]
    pub sort: Option<String>,
    /// The long layout (with the job state spelled out and its time limit).
    #[arg(short = 'l', long = "long")]
    pub long: bool,
    /// Steps instead of jobs (all, or those listed: `12.0,13.batch`).
    #[arg(short = 's', long = "steps", num_args = 0..=1, default_missing_value = "")]
    pub steps: Option<String>,
    /// Show expected start times of pending jobs.
    #[arg(long)]
    pub start: bool,
    /// An array's waiting tasks one per line (by default they share one,
    /// as `123_[8-99]`).
    #[arg(short = 'r', long = "array")]
    pub array: bool,
    /// Print again every so many seconds.
    #[arg(short = 'i', long = "iterate")]
    pub iterate: Option<u64>,
    /// Jobs of hidden partitions too (every partition is shown already).
    #[arg(short = 'a', long = "all")]
    pub all: bool,
}

/// Fills what the command line left out from Slurm's `SQUEUE_*`
/// variables.
pub fn apply_env(a: &mut SqueueArgs, env: &dyn Fn(&str) -> Option<String>) {
    let fill = |slot: &mut Option<String>, var: &str| {
        if slot.is_none() {
            *slot = env(var).filter(|v| !v.is_empty());
        }
    };
    if a.format.is_none() && a.format2.is_none() {
        fill(&mut a.format, "SQUEUE_FORMAT");
        if a.format.is_none() {
            fill(&mut a.format2, "SQUEUE_FORMAT2");
        }
    }
    fill(&mut a.sort, "SQUEUE_SORT");
    fill(&mut a.account, "SQUEUE_ACCOUNT");
    fill(&mut a.partition, "SQUEUE_PARTITION");
    fill(&mut a.qos, "SQUEUE_QOS");
    fill(&mut a.states, "SQUEUE_STATES");
    fill(&mut a.user, "SQUEUE_USERS");
    fill(&mut a.name, "SQUEUE_NAMES");
    if !a.array && env("SQUEUE_ARRAY").is_some() {
        a.array = true;
    }
}

/// Builds the job filter from the arguments.
pub fn filter(a: &SqueueArgs) -> Result<JobFilter, String> {
    let mut f = JobFilter::default();
    if let Some(j) = &a.jobs {
        (f.ids, f.tasks) = parse_job_list(j)?;
    }
    if let Some(u) = &a.user {
        // A user unknown is said and dropped; with none left, nothing
        // matches (uid -1 is no one's), and squeue still exits 0, as
        // Slurm's.
        for name in u.split(',').filter(|n| !n.is_empty()) {
            match parse_user(name) {
                Ok(uid) => f.users.push(uid),
                Err(e) => eprintln!("squeue: error: {e}"),
            }
        }
        if f.users.is_empty() {
            f.users.push(u32::MAX);
        }
    }
    if a.me {
        f.users.push(nix::unistd::getuid().as_raw());
    }
    if let Some(p) = &a.partition {
        f.partitions = p.split(',').map(String::from).collect();
    }
    if let Some(n) = &a.name {
        f.names = n.split(',').map(String::from).collect();
    }
    match a.states.as_deref() {
        Some(s) if s.eq_ignore_ascii_case("all") => {}
        Some(s) => {
            f.states = s
                .split(',')
                .map(|st| {
                    JobState::parse(st).ok_or_else(|| format!("Invalid job state specified: {st}"))
                })
                .collect::<Result<_, _>>()?;
        }
        None if a.start => f.states = vec![JobState::Pending],
        // Named by id or not, a finished job shows only with -t (Slurm
        // 22.05: `squeue -j` of a job that just completed prints the
        // header alone).
        None => {
            f.states = vec![
                JobState::Pending,
                JobState::Running,
                JobState::Suspended,
                JobState::Completing,
            ]
        }
    }
    Ok(f)
}

/// What the controller's filter cannot say: accounts, QOS, nodes.
#[derive(Debug, Default)]
pub struct Extra {
    accounts: Vec<String>,
    qos: Vec<String>,
    nodes: Vec<String>,
}

impl Extra {
    pub fn of(a: &SqueueArgs) -> Result<Extra, String> {
        let list = |s: &Option<String>| -> Vec<String> {
            s.as_deref()
                .map(|s| {
                    s.split(',')
                        .filter(|x| !x.is_empty())
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default()
        };
        let nodes = match &a.nodelist {
            Some(w) => {
                hostlist::expand(w).map_err(|e| format!("Invalid node name specified: {e}"))?
            }
            None => Vec::new(),
        };
        Ok(Extra {
            accounts: list(&a.account),
            qos: list(&a.qos),
            nodes,
        })
    }

    pub fn keeps<S: Text>(&self, j: &JobView<S>) -> bool {
        let account = j.ask().account.as_deref().unwrap_or("");
        let qos = j.ask().qos.as_deref().unwrap_or("normal");
        (self.accounts.is_empty()
            || self
                .accounts
                .iter()
                .any(|a| a.eq_ignore_ascii_case(account)))
            && (self.qos.is_empty() || self.qos.iter().any(|q| q.eq_ignore_ascii_case(qos)))
            && (self.nodes.is_empty()
                || j.nodes.iter().any(|n| self.nodes.iter().any(|m| *m == **n)))
    }
}

/// What a view's texts may be: its own `String`s, or `&str`s borrowed
/// from the frame it was read from ([`Table::add_view`]).
pub trait Text: std::ops::Deref<Target = str> + AsRef<str> {}

impl<T: std::ops::Deref<Target = str> + AsRef<str>> Text for T {}

/// A field squeue can print, by `%` code or `-O` name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum F {
    JobArrayId,
    JobId,
    Account,
    ArrayJobId,
    ArrayTaskId,
    Name,
    User,
    Uid,
    Group,
    Gid,
    Partition,
    Qos,
    StateCompact,
    State,
    TimeUsed,
    TimeLimit,
    TimeLeft,
    NumNodes,
    NumCpus,
    NumTasks,
    MinMemory,
    MinCpus,
    CpusPerTask,
    TresPerNode,
    TresPerJob,
    TresPerTask,
    TresAlloc,
    ReasonList,
    Reason,
    NodeList,
    StartTime,
    SubmitTime,
    EndTime,
    EligibleTime,
    PendingTime,
    Dependency,
    PriorityLong,
    Priority,
    Nice,
    Command,
    WorkDir,
    Comment,
    ReqNodes,
    ExcNodes,
    OverSubscribe,
    Licenses,
    Features,
    Contiguous,
    MinTmpDisk,
    Sockets,
    Cores,
    Threads,
    Sct,
    Reservation,
    Wckey,
    CoreSpec,
    SchedNodes,
    BatchHost,
    BatchFlag,
    ExitCode,
    Requeue,
    RestartCnt,
    StdErr,
    StdIn,
    StdOut,
    MinTime,
    AllocNodes,
    /// Of a step (`-s`).
    StepId,
    StepName,
}

/// Every field: its `%` code (jobs), its `-O` names, its header.
const FIELDS: &[(F, Option<char>, &[&str], &str)] = &[
    (F::JobArrayId, Some('i'), &["jobarrayid"], "JOBID"),
    (F::JobId, Some('A'), &["jobid"], "JOBID"),
    (F::Account, Some('a'), &["account"], "ACCOUNT"),
    (F::ArrayJobId, Some('F'), &["arrayjobid"], "ARRAY_JOB_ID"),
    (F::ArrayTaskId, Some('K'), &["arraytaskid"], "ARRAY_TASK_ID"),
    (F::Name, Some('j'), &["name"], "NAME"),
    (F::User, Some('u'), &["username"], "USER"),
    (F::Uid, Some('U'), &["userid"], "UID"),
    (F::Group, Some('g'), &["groupname"], "GROUP"),
    (F::Gid, Some('G'), &["groupid"], "GROUP"),
    (F::Partition, Some('P'), &["partition"], "PARTITION"),
    (F::Qos, Some('q'), &["qos"], "QOS"),
    (F::StateCompact, Some('t'), &["statecompact"], "ST"),
    (F::State, Some('T'), &["state"], "STATE"),
    (F::TimeUsed, Some('M'), &["timeused"], "TIME"),
    (F::TimeLimit, Some('l'), &["timelimit"], "TIME_LIMIT"),
    (F::TimeLeft, Some('L'), &["timeleft"], "TIME_LEFT"),
    (F::NumNodes, Some('D'), &["numnodes"], "NODES"),
    (F::NumCpus, Some('C'), &["numcpus"], "CPUS"),
    (F::NumTasks, None, &["numtasks"], "TASKS"),
    (F::MinMemory, Some('m'), &["minmemory"], "MIN_MEMORY"),
    (F::MinCpus, Some('c'), &["mincpus"], "MIN_CPUS"),
    (
        F::CpusPerTask,
        None,
        &["cpus-per-task", "cpuspertask"],
        "CPUS_PER_TASK",
    ),
    (
        F::TresPerNode,
        Some('b'),
        &["tres-per-node"],
        "TRES_PER_NODE",
    ),
    (F::TresPerJob, None, &["tres-per-job"], "TRES_PER_JOB"),
    (F::TresPerTask, None, &["tres-per-task"], "TRES_PER_TASK"),
    (F::TresAlloc, None, &["tres-alloc"], "TRES_ALLOC"),
    (
        F::ReasonList,
        Some('R'),
        &["reasonlist"],
        "NODELIST(REASON)",
    ),
    (F::Reason, Some('r'), &["reason"], "REASON"),
    (F::NodeList, Some('N'), &["nodelist"], "NODELIST"),
    (F::StartTime, Some('S'), &["starttime"], "START_TIME"),
    (F::SubmitTime, Some('V'), &["submittime"], "SUBMIT_TIME"),
    (F::EndTime, Some('e'), &["endtime"], "END_TIME"),
    (F::EligibleTime, None, &["eligibletime"], "ELIGIBLE_TIME"),
    (F::PendingTime, None, &["pendingtime"], "PENDING_TIME"),
    (F::Dependency, Some('E'), &["dependency"], "DEPENDENCY"),
    (F::PriorityLong, Some('Q'), &["prioritylong"], "PRIORITY"),
    (F::Priority, Some('p'), &["priority"], "PRIORITY"),
    (F::Nice, Some('y'), &["nice"], "NICE"),
    (F::Command, Some('o'), &["command"], "COMMAND"),
    (F::WorkDir, Some('Z'), &["workdir"], "WORK_DIR"),
    (F::Comment, Some('k'), &["comment"], "COMMENT"),
    (F::ReqNodes, Some('n'), &["reqnodes"], "REQ_NODES"),
    (F::ExcNodes, Some('x'), &[], "EXC_NODES"),
    (
        F::OverSubscribe,
        Some('h'),
        &["oversubscribe"],
        "OVER_SUBSCRIBE",
    ),
    (F::Licenses, Some('W'), &["licenses"], "LICENSES"),
    (F::Features, Some('f'), &["feature"], "FEATURES"),
    (F::Contiguous, Some('O'), &["contiguous"], "CONTIGUOUS"),
    (F::MinTmpDisk, Some('d'), &["mintmpdisk"], "MIN_TMP_DISK"),
    (F::Sockets, Some('H'), &["sockets"], "SOCKETS_PER_NODE"),
    (F::Cores, Some('I'), &["cores"], "CORES_PER_SOCKET"),
    (F::Threads, Some('J'), &["threads"], "THREADS_PER_CORE"),
    (F::Sct, Some('z'), &["sct"], "S:C:T"),
    (F::Reservation, Some('v'), &["reservation"], "RESERVATION"),
    (F::Wckey, Some('w'), &["wckey"], "WCKEY"),
    (F::CoreSpec, Some('X'), &["corespec"], "CORE_SPEC"),
    (F::SchedNodes, Some('Y'), &["schednodes"], "SCHEDNODES"),
    (F::BatchHost, Some('B'), &["batchhost"], "EXEC_HOST"),
    (F::BatchFlag, None, &["batchflag"], "BATCH_FLAG"),
    (F::ExitCode, None, &["exit_code"], "EXIT_CODE"),
    (F::Requeue, None, &["requeue"], "REQUEUE"),
    (F::RestartCnt, None, &["restartcnt"], "RESTART_COUNT"),
    (F::StdErr, None, &["stderr"], "STDERR"),
    (F::StdIn, None, &["stdin"], "STDIN"),
    (F::StdOut, None, &["stdout"], "STDOUT"),
    (F::MinTime, None, &["mintime"], "TIME_MIN"),
    (F::AllocNodes, None, &["allocnodes"], "ALLOC_NODES"),
    (F::StepId, None, &["stepid"], "STEPID"),
    (F::StepName, None, &["stepname"], "STEP_NAME"),
];

/// Whether a field reads only a job's shape and state, never what it
/// asked beyond them ([`JobView::ask`]) or its steps: a layout of such
/// fields asks the controller for views without detail.
fn basic(f: F) -> bool {
    !matches!(
        f,
        F::Account
            | F::Qos
            | F::Wckey
            | F::Dependency
            | F::ReqNodes
            | F::ExcNodes
            | F::Features
            | F::OverSubscribe
            | F::MinMemory
            | F::MinCpus
            | F::TresPerNode
            | F::TresPerJob
            | F::TresPerTask
            | F::TresAlloc
            | F::StartTime
            | F::EligibleTime
            | F::PendingTime
            | F::Nice
            | F::AllocNodes
            | F::SchedNodes
            | F::StepId
            | F::StepName
    )
}

/// Whether a field shows one of the texts a brief view leaves out
/// ([`JobFilter::brief`]).
fn textual(f: F) -> bool {
    matches!(
        f,
        F::Command | F::WorkDir | F::Comment | F::StdOut | F::StdErr
    )
}

/// Whether a field shows the same from a bare view
/// ([`JobFilter::bare`]) as from a whole one: it reads only the job's
/// record, its state in the scheduler, its name and its node count. A
/// layout of such fields (`squeue`'s default is one) asks for bare views.
pub fn bare(f: F) -> bool {
    matches!(
        f,
        F::JobArrayId
            | F::JobId
            | F::ArrayJobId
            | F::ArrayTaskId
            | F::Name
            | F::User
            | F::Uid
            | F::Group
            | F::Gid
            | F::Partition
            | F::StateCompact
            | F::State
            | F::TimeUsed
            | F::NumNodes
            | F::ReasonList
            | F::Reason
            | F::NodeList
            | F::SubmitTime
            | F::PriorityLong
            | F::Priority
            | F::ExitCode
            | F::RestartCnt
            | F::Licenses
            | F::Reservation
            | F::Contiguous
            | F::MinTmpDisk
            | F::Sockets
            | F::Cores
            | F::Threads
            | F::Sct
            | F::CoreSpec
            | F::StdIn
            | F::MinTime
    )
}

/// Every job field squeue knows by an `-O` name, with that name.
#[cfg(test)]
pub(crate) fn named_fields() -> impl Iterator<Item = (F, &'static str)> {
    FIELDS
        .iter()
        .filter(|e| !matches!(e.0, F::StepId | F::StepName))
        .filter_map(|e| e.2.first().map(|n| (e.0, *n)))
}

/// The field a `%` code names, of jobs or (with `-s`) of steps.
fn by_code(code: char, steps: bool) -> Option<F> {
    if steps {
        return Some(match code {
            'i' => F::StepId,
            'j' => F::StepName,
            'A' => F::NumTasks,
            'C' => F::NumCpus,
            'l' => F::TimeLimit,
            'M' => F::TimeUsed,
            'N' => F::NodeList,
            'P' => F::Partition,
            'S' => F::StartTime,
            'u' => F::User,
            'U' => F::Uid,
            'b' => F::TresPerNode,
            _ => return None,
        });
    }
    FIELDS.iter().find(|e| e.1 == Some(code)).map(|e| e.0)
}

fn header(f: F, steps: bool) -> &'static str {
    match (f, steps) {
        (F::StepName | F::Name, true) => "NAME",
        (F::NumTasks, true) => "TASKS",
        _ => FIELDS.iter().find(|e| e.0 == f).map_or("?", |e| e.3),
    }
}

/// One column of a layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    Field {
        right: bool,
        width: Option<usize>,
        field: F,
    },
    /// A `%` code squeue does not know: printed as written.
    Unknown(String),
}

/// Parses a `-o` format of `%[.][width]code` pieces.
pub fn parse_format(s: &str, steps: bool) -> Vec<Piece> {
    super::format::tokens(s)
        .into_iter()
        .map(|t| match t {
            Token::Text(t) => Piece::Text(t),
            Token::Code {
                right,
                widest,
                width,
                code,
            } => match by_code(code, steps) {
                Some(field) if !widest => Piece::Field {
                    right,
                    width,
                    field,
                },
                // A code squeue does not know is printed as written.
                _ => {
                    let mut raw = String::from("%");
                    if right {
                        raw.push('.');
                    }
                    if widest {
                        raw.push('#');
                    }
                    if let Some(w) = width {
                        raw.push_str(&w.to_string());
                    }
                    raw.push(code);
                    Piece::Unknown(raw)
                }
            },
        })
        .collect()
}

/// Parses a `-O` format: `name[:[.][width][suffix]]`, comma separated; a
/// field without a width is 20 wide, `:0` as wide as its value.
pub fn parse_format2(s: &str, steps: bool) -> Result<Vec<Piece>, String> {
    let mut out = Vec::new();
    for item in super::format::items(s, FORMAT2_WIDTH) {
        let lower = item.name.to_ascii_lowercase();
        let field = FIELDS
            .iter()
            .find(|e| e.2.contains(&lower.as_str()))
            .map(|e| e.0)
            .filter(|f| steps || !matches!(f, F::StepId | F::StepName))
            .ok_or_else(|| format!("Invalid job format specification: {}", item.name))?;
        out.push(Piece::Field {
            right: item.right,
            width: item.width,
            field,
        });
        if !item.suffix.is_empty() {
            out.push(Piece::Text(item.suffix.to_string()));
        }
    }
    Ok(out)
}

/// Appends `s` padded or cut to a width, right- or left-justified (what
/// [`fit`] returns, without building it).
pub fn push_fit(out: &mut String, s: &str, width: Option<usize>, right: bool) {
    let Some(w) = width else {
        out.push_str(s);
        return;
    };
    let (cut, n) = if s.is_ascii() {
        let n = s.len().min(w);
        (&s[..n], n)
    } else {
        match s.char_indices().nth(w) {
            Some((i, _)) => (&s[..i], w),
            None => (s, s.chars().count()),
        }
    };
    let pad = w - n;
    if !right {
        out.push_str(cut);
    }
    push_spaces(out, pad);
    if right {
        out.push_str(cut);
    }
}

/// Appends `n` blanks (a slice at a time, not a char at a time: ten
/// thousand lines of padding).
fn push_spaces(out: &mut String, mut n: usize) {
    const BLANKS: &str = "                                ";
    while n > 0 {
        let k = n.min(BLANKS.len());
        out.push_str(&BLANKS[..k]);
        n -= k;
    }
}

/// Pads or truncates to a width, right- or left-justified.
pub fn fit(s: &str, width: Option<usize>, right: bool) -> String {
    match width {
        None => s.to_string(),
        Some(w) => {
            let t: String = s.chars().take(w).collect();
            if right {
                format!("{t:>w$}")
            } else {
                format!("{t:<w$}")
            }
        }
    }
}

/// How long a job has run (or ran): squeue's TIME, scontrol's RunTime.
/// Time it spent suspended does not count.
pub fn run_secs<S>(j: &JobView<S>, now: u64) -> u64 {
    let paused = j.suspension.map_or(0, |s| s.paused);
    let until = match (j.state, j.suspension.and_then(|s| s.since)) {
        (JobState::Suspended, Some(since)) => since,
        (JobState::Running | JobState::Suspended, _) => now,
        _ => j.end_time.unwrap_or(now).min(now),
    };
    match j.start_time {
        Some(s) => until.saturating_sub(s).saturating_sub(paused),
        None => 0,
    }
}

/// Megabytes as Slurm prints a size: `500M`, `4G`, `2T`.
pub fn size_mb(mb: u64) -> String {
    if mb == 0 {
        "0".into()
    } else if mb % (1 << 20) == 0 {
        format!("{}T", mb >> 20)
    } else if mb % 1024 == 0 {
        format!("{}G", mb >> 10)
    } else {
        format!("{mb}M")
    }
}

/// A job's memory ask as squeue's MIN_MEMORY shows it.
pub fn min_memory<S>(j: &JobView<S>) -> String {
    size_mb(j.ask().mem_per_cpu_mb.unwrap_or(j.mem_mb))
}

/// `gres:gpu[:type]:N`, Slurm 22.05's TRES text for a GPU count.
pub fn gres<S>(j: &JobView<S>, n: Option<u32>) -> String {
    match (n, &j.ask().gpu_type) {
        (Some(n), Some(t)) => format!("gres:gpu:{t}:{n}"),
        (Some(n), None) => format!("gres:gpu:{n}"),
        (None, _) => "N/A".into(),
    }
}

/// The job's TRES as Slurm lists them: `cpu=4,mem=8G,node=2,billing=4`
/// (and `gres/gpu=N`).
pub fn tres<S>(j: &JobView<S>) -> String {
    let mem = match (j.ask().mem_per_cpu_mb, j.ask().mem_per_gpu_mb) {
        (Some(per_cpu), _) => per_cpu * u64::from(j.num_cpus),
        (None, Some(per_gpu)) => per_gpu * u64::from(j.gpus),
        (None, None) => j.mem_mb * u64::from(j.num_nodes),
    };
    let mut s = format!("cpu={}", j.num_cpus);
    if mem > 0 {
        s.push_str(&format!(",mem={}", size_mb(mem)));
    }
    s.push_str(&format!(",node={},billing={}", j.num_nodes, j.num_cpus));
    if j.gpus > 0 {
        s.push_str(&format!(",gres/gpu={}", j.gpus));
    }
    s
}

/// An output path as Slurm shows it: the pattern expanded, relative to
/// the job's work directory.
pub fn output_path<S: Text>(j: &JobView<S>, pattern: &str) -> String {
    let user = user_name(j.user.uid);
    let vars = corral_proto::pattern::PatternVars {
        job: j.id.0,
        name: &j.name,
        node: j.nodes.first().map_or("%N", |n| &**n),
        user: &user,
        step: None,
        array: j.array.as_ref().and_then(|a| a.task.map(|t| (a.job.0, t))),
        task: None,
        node_index: None,
    };
    let path = corral_proto::pattern::expand_pattern(pattern, &vars);
    if path.starts_with('/') {
        path
    } else {
        format!("{}/{path}", j.work_dir.trim_end_matches('/'))
    }
}

fn or_null<S: Text>(v: &Option<S>) -> String {
    v.as_deref().unwrap_or("(null)").to_string()
}

fn value<S: Text>(j: &JobView<S>, f: F, now: u64) -> String {
    let reason = || format!("({})", words::job_reason(j.reason));
    let pending = j.state == JobState::Pending;
    match f {
        F::JobArrayId => job_id(j),
        F::JobId => j.id.to_string(),
        F::Account => or_null(&j.ask().account),
        F::ArrayJobId => j.array.as_ref().map_or(j.id, |a| a.job).to_string(),
        F::ArrayTaskId => match &j.array {
            None => "N/A".into(),
            Some(a) => match a.task {
                Some(t) => t.to_string(),
                None => format_indices(&a.waiting, a.throttle),
            },
        },
        F::Name | F::StepName => j.name.to_string(),
        F::User => user_name(j.user.uid),
        F::Uid => j.user.uid.to_string(),
        F::Group => group_name(j.user.gid),
        F::Gid => j.user.gid.to_string(),
        F::Partition => j.partition.to_string(),
        F::Qos => j.ask().qos.clone().unwrap_or_else(|| "normal".into()),
        F::StateCompact => j.state.code().to_string(),
        F::State => j.state.name().to_string(),
        F::TimeUsed => elapsed(run_secs(j, now)),
        F::TimeLimit => j.time_limit.map_or("UNLIMITED".into(), elapsed),
        F::TimeLeft => j.time_limit.map_or("UNLIMITED".into(), |l| {
            elapsed(l.saturating_sub(run_secs(j, now)))
        }),
        F::NumNodes => j.num_nodes.to_string(),
        F::NumCpus => j.num_cpus.to_string(),
        F::NumTasks => j.num_tasks.to_string(),
        F::MinMemory => min_memory(j),
        F::MinCpus => j.min_cpus().to_string(),
        F::CpusPerTask => j.cpus_per_task.to_string(),
        F::TresPerNode => gres(j, j.ask().gpus_per_node),
        F::TresPerJob => gres(j, j.ask().gpus_total),
        F::TresPerTask => gres(j, j.ask().gpus_per_task),
        F::TresAlloc => tres(j),
        F::ReasonList => match j.state {
            JobState::Pending => reason(),
            _ if j.nodes.is_empty() => reason(),
            _ => hostlist::compress_sorted(&j.nodes),
        },
        F::Reason => words::job_reason(j.reason).to_string(),
        F::NodeList => hostlist::compress_sorted(&j.nodes),
        F::StartTime => j
            .start_time
            .or(j.expected_start)
            .or(j.ask().begin)
            .map_or("N/A".into(), timestamp),
        F::SubmitTime => timestamp(j.submit_time),
        F::EndTime => match (j.end_time, pending) {
            (Some(e), _) => timestamp(e),
            (None, true) => j
                .expected_start
                .zip(j.time_limit)
                .map_or("N/A".into(), |(s, l)| timestamp(s + l)),
            (None, false) => "NONE".into(),
        },
        F::EligibleTime => timestamp(j.ask().begin.unwrap_or(0).max(j.submit_time)),
        F::PendingTime => {
            let eligible = j.ask().begin.unwrap_or(0).max(j.submit_time);
            let until = if pending {
                now
            } else {
                j.start_time.unwrap_or(now)
            };
            until.saturating_sub(eligible).to_string()
        }
        F::Dependency => or_null(&j.ask().dependency),
        F::PriorityLong => j.priority.to_string(),
        F::Priority => format!("{:.14}", j.priority.max(0) as f64 / f64::from(u32::MAX)),
        F::Nice => j.ask().nice.to_string(),
        F::Command => j.command.to_string(),
        F::WorkDir => j.work_dir.to_string(),
        F::Comment => or_null(&j.comment),
        F::ReqNodes => hostlist::compress_sorted(&j.ask().req_nodes),
        F::ExcNodes => hostlist::compress_sorted(&j.ask().exc_nodes),
        F::OverSubscribe => if j.ask().exclusive { "NO" } else { "OK" }.into(),
        F::SchedNodes if !j.ask().sched_nodes.is_empty() => {
            hostlist::compress_sorted(&j.ask().sched_nodes)
        }
        F::Wckey => or_null(&j.ask().wckey),
        F::Licenses | F::Reservation | F::SchedNodes => "(null)".into(),
        F::Features => or_null(&j.ask().features),
        F::Contiguous | F::MinTmpDisk => "0".into(),
        F::Sockets | F::Cores | F::Threads => "*".into(),
        F::Sct => "*:*:*".into(),
        F::CoreSpec => "N/A".into(),
        F::BatchHost => match (j.batch, j.nodes.first()) {
            (true, Some(n)) if !pending => n.to_string(),
            _ => "n/a".into(),
        },
        F::BatchFlag => u8::from(j.batch).to_string(),
        F::ExitCode => match j.exit.signal {
            Some(s) => format!("0:{s}"),
            None => j.exit.code.to_string(),
        },
        F::Requeue => u8::from(j.requeue).to_string(),
        F::RestartCnt => j.restarts.to_string(),
        F::StdOut => j
            .stdout
            .as_deref()
            .map_or("(null)".into(), |p| output_path(j, p)),
        F::StdErr => match (&j.stderr, &j.stdout) {
            (Some(p), _) | (None, Some(p)) => output_path(j, p),
            (None, None) => "(null)".into(),
        },
        F::StdIn => "/dev/null".into(),
        F::MinTime => "0:00".into(),
        F::AllocNodes => or_null(&j.ask().submit_host),
        F::StepId => j.id.to_string(),
    }
}

/// Writes a field's value: text the view holds, constants and numbers
/// straight into `buf` (a squeue of 10,000 jobs prints half a million
/// fields), the rest through [`value`].
fn value_into<S: Text>(buf: &mut String, j: &JobView<S>, f: F, now: u64) {
    let ask = j.ask();
    fn null<T: Text>(v: &Option<T>) -> &str {
        v.as_deref().unwrap_or("(null)")
    }
    let text: &str = match f {
        F::Name | F::StepName => &j.name,
        F::Partition => &j.partition,
        F::Command => &j.command,
        F::WorkDir => &j.work_dir,
        F::StateCompact => j.state.code(),
        F::State => j.state.name(),
        F::Reason => words::job_reason(j.reason),
        F::Qos => ask.qos.as_deref().unwrap_or("normal"),
        F::Account => null(&ask.account),
        F::Dependency => null(&ask.dependency),
        F::Features => null(&ask.features),
        F::Comment => null(&j.comment),
        F::AllocNodes => null(&ask.submit_host),
        F::OverSubscribe if ask.exclusive => "NO",
        F::OverSubscribe => "OK",
        F::SchedNodes if ask.sched_nodes.is_empty() => "(null)",
        F::Wckey => null(&ask.wckey),
        F::Licenses | F::Reservation => "(null)",
        F::Contiguous | F::MinTmpDisk => "0",
        F::Sockets | F::Cores | F::Threads => "*",
        F::Sct => "*:*:*",
        F::CoreSpec => "N/A",
        F::StdIn => "/dev/null",
        F::MinTime => "0:00",
        F::ReqNodes if ask.req_nodes.is_empty() => "",
        F::ExcNodes if ask.exc_nodes.is_empty() => "",
        F::NodeList if j.nodes.is_empty() => "",
        F::TresPerNode if ask.gpus_per_node.is_none() => "N/A",
        F::TresPerJob if ask.gpus_total.is_none() => "N/A",
        F::TresPerTask if ask.gpus_per_task.is_none() => "N/A",
        F::ArrayTaskId if j.array.is_none() => "N/A",
        F::JobArrayId if j.array.is_none() => {
            push_uint(buf, j.id.0);
            return;
        }
        F::JobId | F::ArrayJobId if j.array.is_none() => {
            push_uint(buf, j.id.0);
            return;
        }
        F::Uid | F::Gid | F::NumNodes | F::NumCpus | F::NumTasks | F::MinCpus | F::CpusPerTask => {
            let n = match f {
                F::Uid => j.user.uid,
                F::Gid => j.user.gid,
                F::NumNodes => j.num_nodes,
                F::NumCpus => j.num_cpus,
                F::NumTasks => j.num_tasks,
                F::MinCpus => j.min_cpus(),
                _ => j.cpus_per_task,
            };
            push_uint(buf, u64::from(n));
            return;
        }
        F::PriorityLong => {
            push_int(buf, j.priority);
            return;
        }
        F::ReasonList if j.state == JobState::Pending || j.nodes.is_empty() => {
            buf.push('(');
            buf.push_str(words::job_reason(j.reason));
            buf.push(')');
            return;
        }
        F::User => {
            super::with_user_name(j.user.uid, |n| buf.push_str(n));
            return;
        }
        F::Nice => {
            push_int(buf, i64::from(ask.nice));
            return;
        }
        F::TimeUsed => {
            elapsed_into(buf, run_secs(j, now));
            return;
        }
        F::TimeLimit | F::TimeLeft if j.time_limit.is_none() => "UNLIMITED",
        F::TimeLimit | F::TimeLeft => {
            let l = j.time_limit.unwrap_or(0);
            let secs = match f {
                F::TimeLeft => l.saturating_sub(run_secs(j, now)),
                _ => l,
            };
            elapsed_into(buf, secs);
            return;
        }
        F::SubmitTime | F::EligibleTime => {
            let t = match f {
                F::SubmitTime => j.submit_time,
                _ => ask.begin.unwrap_or(0).max(j.submit_time),
            };
            timestamp_into(buf, t);
            return;
        }
        F::StartTime => {
            match j.start_time.or(j.expected_start).or(ask.begin) {
                Some(t) => timestamp_into(buf, t),
                None => buf.push_str("N/A"),
            }
            return;
        }
        _ => {
            buf.push_str(&value(j, f, now));
            return;
        }
    };
    buf.push_str(text);
}

/// A step's value of a field (`-s`); fields of the job where the step has
/// none of its own.
fn step_value(j: &JobView, s: &StepView, f: F, now: u64) -> String {
    match f {
        F::StepId => format!("{}.{}", job_id(j), s.id),
        F::StepName | F::Name => s.name.clone(),
        F::NumTasks => s.tasks.to_string(),
        F::NumCpus => s.cpus.to_string(),
        F::TimeUsed => elapsed(now.saturating_sub(s.start)),
        F::TimeLimit => "UNLIMITED".into(),
        F::NodeList => hostlist::compress_sorted(&s.nodes),
        F::StartTime => timestamp(s.start),
        other => value(j, other, now),
    }
}

/// A job's id as squeue writes it: `123`, a task of an array `123_7`, an
/// array's waiting tasks `123_[8-99%4]` (one of them: `123_8`).
pub fn job_id<S>(j: &JobView<S>) -> String {
    let Some(a) = &j.array else {
        return j.id.to_string();
    };
    match (a.task, a.waiting.as_slice()) {
        (Some(t), _) => format!("{}_{t}", a.job),
        (None, [r]) if r.count == 1 => format!("{}_{}", a.job, r.first),
        (None, w) => format!("{}_[{}]", a.job, format_indices(w, a.throttle)),
    }
}

/// `-r`: an array's waiting tasks, one view each.
pub fn expand_arrays(jobs: Vec<JobView>) -> Vec<JobView> {
    let mut out = Vec::with_capacity(jobs.len());
    for j in jobs {
        let waiting = match &j.array {
            Some(a) if a.task.is_none() => a.waiting.clone(),
            _ => {
                out.push(j);
                continue;
            }
        };
        for r in waiting {
            for k in 0..r.count {
                let mut one = j.clone();
                if let Some(a) = one.array.as_mut() {
                    a.task = Some(r.first + k * r.step);
                    a.waiting.clear();
                }
                out.push(one);
            }
        }
    }
    out
}

fn line(
    pieces: &[Piece],
    out: &mut String,
    get: &impl Fn(F, &mut String),
    head: bool,
    steps: bool,
) {
    let mut v = String::with_capacity(64);
    for p in pieces {
        match p {
            Piece::Text(t) => out.push_str(t),
            Piece::Unknown(raw) => out.push_str(raw),
            Piece::Field {
                right,
                width,
                field,
            } => {
                v.clear();
                if head {
                    v.push_str(header(*field, steps));
                } else {
                    get(*field, &mut v);
                }
                // Slurm pads a right-justified duration to its width but
                // never cuts it (`%.9l` of `1-02:04:00` prints all ten).
                let duration = matches!(field, F::TimeUsed | F::TimeLimit | F::TimeLeft);
                if *right && duration && !head {
                    let pad = width.unwrap_or(0).saturating_sub(v.chars().count());
                    push_spaces(out, pad);
                    out.push_str(&v);
                } else {
                    push_fit(out, &v, *width, *right);
                }
            }
        }
    }
    out.push('\n');
}

/// Renders jobs (or references to them, in the order to print) with a
/// layout; `with_header` adds the title line.
pub fn render_pieces<J: Borrow<JobView>>(
    jobs: &[J],
    pieces: &[Piece],
    with_header: bool,
    now: u64,
) -> String {
    let mut out = String::with_capacity(64 * (jobs.len() + 1));
    if with_header {
        line(pieces, &mut out, &|_, _| {}, true, false);
    }
    let start = out.len();
    for (k, j) in jobs.iter().enumerate() {
        // Lines are alike: after the first, room for all of them at once
        // (an eighth more) rather than doubling and copying as it grows.
        if k == 1 {
            let first = out.len() - start;
            out.reserve(first.saturating_mul(jobs.len()) / 8 * 9);
        }
        let j = j.borrow();
        line(
            pieces,
            &mut out,
            &|f, buf| value_into(buf, j, f, now),
            false,
            false,
        );
    }
    out
}

/// Renders jobs with a `-o` format.
pub fn render(jobs: &[JobView], format: &str, with_header: bool, now: u64) -> String {
    render_pieces(jobs, &parse_format(format, false), with_header, now)
}

/// Renders the running steps of jobs (`-s`), in job then step order;
/// `only` keeps the steps listed (`12.0`, `13.batch`).
pub fn render_steps<J: Borrow<JobView>>(
    jobs: &[J],
    pieces: &[Piece],
    only: &[String],
    with_header: bool,
    now: u64,
) -> String {
    let mut out = String::new();
    if with_header {
        line(pieces, &mut out, &|_, _| {}, true, true);
    }
    let mut steps: Vec<(&JobView, &StepView)> = jobs
        .iter()
        .map(Borrow::borrow)
        .flat_map(|j: &JobView| j.steps.iter().map(move |s| (j, s)))
        .filter(|(j, s)| only.is_empty() || only.contains(&format!("{}.{}", job_id(j), s.id)))
        .collect();
    steps.sort_by_key(|(j, s)| (j.id, s.id));
    for (j, s) in steps {
        line(
            pieces,
            &mut out,
            &|f, buf| buf.push_str(&step_value(j, s, f, now)),
            false,
            true,
        );
    }
    out
}

/// One sort key: a field, descending or not.
type SortKey = (F, bool);

/// Parses `-S`: `%` codes, each with an optional `+` or `-`, commas
/// between them optional, as Slurm reads it.
pub fn parse_sort(s: &str) -> Result<Vec<SortKey>, String> {
    /// More keys than fields: a sort past them orders nothing more.
    const MAX_SORT_KEYS: usize = 64;
    let mut keys = Vec::new();
    let mut descending = false;
    for c in s.chars() {
        match c {
            ',' | ' ' => {}
            '-' => descending = true,
            '+' => descending = false,
            c => {
                let f =
                    by_code(c, false).ok_or_else(|| format!("Invalid sort specification: {c}"))?;
                keys.push((f, descending));
                descending = false;
                if keys.len() > MAX_SORT_KEYS {
                    return Err(format!(
                        "Invalid sort specification: more than {MAX_SORT_KEYS} keys"
                    ));
                }
            }
        }
    }
    Ok(keys)
}

/// What a field sorts by: numbers as numbers, times as times, text as
/// text.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum SortVal {
    Num(i128),
    Text(String),
}

fn sort_val<S: Text>(j: &JobView<S>, f: F, now: u64) -> SortVal {
    let n = |v: i128| SortVal::Num(v);
    match f {
        F::JobId | F::JobArrayId => n(i128::from(j.id.0)),
        F::ArrayJobId => n(i128::from(j.array.as_ref().map_or(j.id, |a| a.job).0)),
        F::ArrayTaskId => n(j.array.as_ref().and_then(|a| a.task).map_or(-1, i128::from)),
        F::Uid => n(i128::from(j.user.uid)),
        F::Gid => n(i128::from(j.user.gid)),
        F::StateCompact | F::State => n(i128::from(state_rank(j.state))),
        F::TimeUsed => n(i128::from(run_secs(j, now))),
        F::TimeLimit | F::TimeLeft => n(j.time_limit.map_or(i128::MAX, i128::from)),
        F::NumNodes => n(i128::from(j.num_nodes)),
        F::NumCpus => n(i128::from(j.num_cpus)),
        F::NumTasks => n(i128::from(j.num_tasks)),
        F::MinCpus => n(i128::from(j.min_cpus())),
        F::MinMemory => n(i128::from(j.ask().mem_per_cpu_mb.unwrap_or(j.mem_mb))),
        F::StartTime => n(j
            .start_time
            .or(j.expected_start)
            .or(j.ask().begin)
            .map_or(i128::MAX, i128::from)),
        F::SubmitTime => n(i128::from(j.submit_time)),
        F::EndTime => n(j.end_time.map_or(i128::MAX, i128::from)),
        F::PriorityLong | F::Priority => n(i128::from(j.priority)),
        F::Nice => n(i128::from(j.ask().nice)),
        other => SortVal::Text(value(j, other, now)),
    }
}

/// The jobs in the order the keys say (ties by job id). A view is
/// hundreds of bytes: the order is of references, so ten thousand views
/// are never moved (a sort moved each one about fourteen times).
pub fn sorted<'a>(
    jobs: impl IntoIterator<Item = &'a JobView>,
    keys: &[SortKey],
    now: u64,
) -> Vec<&'a JobView> {
    let mut order: Vec<&JobView> = jobs.into_iter().collect();
    // The default order is common and its keys are cheap: compare the
    // views themselves.
    if keys == parse_sort(DEFAULT_SORT).unwrap_or_default().as_slice() {
        order.sort_unstable_by(|a, b| default_order(a, b));
        return order;
    }
    let mut keyed: Vec<(Vec<SortVal>, &JobView)> = order
        .into_iter()
        .map(|j| (keys.iter().map(|&(f, _)| sort_val(j, f, now)).collect(), j))
        .collect();
    keyed.sort_unstable_by(|(a, ja), (b, jb)| {
        for (i, &(_, desc)) in keys.iter().enumerate() {
            let o = a[i].cmp(&b[i]);
            let o = if desc { o.reverse() } else { o };
            if o.is_ne() {
                return o;
            }
        }
        ja.id.cmp(&jb.id)
    });
    keyed.into_iter().map(|(_, j)| j).collect()
}

/// Slurm's default order: partition, then state, then priority (highest
/// first), then id.
fn default_order(a: &JobView, b: &JobView) -> std::cmp::Ordering {
    a.partition
        .cmp(&b.partition)
        .then(state_rank(a.state).cmp(&state_rank(b.state)))
        .then(b.priority.cmp(&a.priority))
        .then(a.id.cmp(&b.id))
}

/// Everything a run of squeue prints with, settled from the arguments.
#[derive(Debug)]
pub struct Layout {
    pieces: Vec<Piece>,
    sort: Vec<SortKey>,
    steps: Option<Vec<String>>,
    header: bool,
    /// `-l`: a date line above the header.
    dated: bool,
    /// Some field or sort key needs what jobs asked, or their steps.
    pub detail: bool,
    /// No field or sort key shows a text a brief view leaves out.
    pub brief: bool,
    /// Every field and sort key shows the same from a bare view.
    pub bare: bool,
}

impl Layout {
    pub fn of(a: &SqueueArgs) -> Result<Layout, String> {
        if a.format.is_some() && a.format2.is_some() {
            return Err("-O (--Format) is incompatible with -o (--format)".into());
        }
        let steps = a.steps.as_ref().map(|s| {
            s.split(',')
                .filter(|x| !x.is_empty())
                .map(String::from)
                .collect::<Vec<_>>()
        });
        let is_steps = steps.is_some();
        for f in [&a.format, &a.format2, &a.sort].into_iter().flatten() {
            super::format::check(f)?;
        }
        let pieces = match (&a.format, &a.format2) {
            (Some(f), _) => parse_format(f, is_steps),
            (None, Some(f)) => parse_format2(f, is_steps)?,
            (None, None) => parse_format(
                match (is_steps, a.start, a.long) {
                    (true, _, _) => STEP_FORMAT,
                    (false, true, _) => START_FORMAT,
                    (false, false, true) => LONG_FORMAT,
                    _ => DEFAULT_FORMAT,
                },
                is_steps,
            ),
        };
        let sort = match &a.sort {
            Some(s) => parse_sort(s)?,
            None if a.start => vec![(F::StartTime, false)],
            None => parse_sort(DEFAULT_SORT)?,
        };
        // Whether some field printed or sorted by is one `pred` says.
        let uses = |pred: fn(F) -> bool| {
            sort.iter().any(|&(f, _)| pred(f))
                || pieces
                    .iter()
                    .any(|p| matches!(p, Piece::Field { field, .. } if pred(*field)))
        };
        let detail = is_steps || a.account.is_some() || a.qos.is_some() || uses(|f| !basic(f));
        let brief = !uses(textual);
        let bare = !detail && !uses(|f| !bare(f));
        Ok(Layout {
            pieces,
            sort,
            steps,
            header: !a.noheader,
            dated: a.long && !a.noheader,
            detail,
            brief,
            bare,
        })
    }

    /// The whole output for these jobs, in the parts they came in.
    pub fn print(&self, parts: Vec<Vec<JobView>>, array: bool, now: u64) -> String {
        let mut t = self.table(array, now);
        for p in parts {
            t.add(&p, |_| true);
        }
        t.finish()
    }

    /// An output to make part by part ([`Table`]).
    pub fn table(&self, array: bool, now: u64) -> Table<'_> {
        Table {
            default_sort: self.sort == parse_sort(DEFAULT_SORT).unwrap_or_default(),
            layout: self,
            array,
            now,
            text: String::new(),
            rows: Vec::new(),
            keys: Vec::new(),
            partitions: Vec::new(),
            steps: Vec::new(),
        }
    }
}

/// squeue's output, made as a listing arrives: each job's line is
/// rendered, with its sort key, as its view is decoded (while ctld makes
/// the next part), and the view goes with it. At the end only keys
/// are sorted and lines copied. Keeping ten thousand views (over 5 MB)
/// to sort and render after the last part left squeue 10 ms of work
/// after the listing had come. A step layout (`-s`) keeps its views.
#[derive(Debug)]
pub struct Table<'l> {
    layout: &'l Layout,
    array: bool,
    now: u64,
    default_sort: bool,
    /// Every line, in the order the jobs came.
    text: String,
    rows: Vec<Row>,
    /// Each row's sort keys, in the order the rows came, for a layout
    /// not in Slurm's default order.
    keys: Vec<Box<[SortVal]>>,
    /// Partition names, in the order first seen (rows hold an index).
    partitions: Vec<String>,
    /// `-s`: the views themselves.
    steps: Vec<JobView>,
}

/// A line kept to print, and what Slurm's default order sorts it by:
/// partition, state, priority (highest first), then id. Rows stay in the
/// order they came (ties, an array's tasks under `-r`, keep it), so a
/// line ends where the next begins; an order of their places is sorted
/// instead. 32 bytes: ten thousand rows at 64 were most of a megabyte
/// of fresh memory to fault in, with the copies made as they grew.
#[derive(Debug)]
struct Row {
    id: u64,
    priority: i64,
    /// Where its line starts in the text.
    start: usize,
    partition: u32,
    state: u8,
}

const _: () = assert!(std::mem::size_of::<Row>() <= 32);

impl Table<'_> {
    /// Adds a part's jobs that `keep` says yes to.
    pub fn add(&mut self, part: &[JobView], keep: impl Fn(&JobView) -> bool) {
        for j in part {
            self.add_view(j, &keep);
        }
    }

    /// Adds one job if `keep` says yes to it (with `-r`, each of an
    /// array's waiting tasks). The view may borrow its
    /// texts ([`crate::client::read_job_views`]): a line is rendered from
    /// it and only a step layout (`-s`) keeps a copy.
    pub fn add_view<S>(&mut self, j: &JobView<S>, keep: impl Fn(&JobView<S>) -> bool)
    where
        S: Text + Clone + Into<String>,
    {
        // An array's waiting tasks differ only in their index, which
        // `keep` does not read: the one answer is theirs.
        if !keep(j) {
            return;
        }
        if self.array && j.array.as_ref().is_some_and(|a| a.task.is_none()) {
            for task in expand_arrays(vec![j.clone().map_texts(Into::into)]) {
                self.add_kept(&task);
            }
        } else {
            self.add_kept(j);
        }
    }

    fn add_kept<S: Text + Clone + Into<String>>(&mut self, j: &JobView<S>) {
        if self.layout.steps.is_some() {
            self.steps.push(j.clone().map_texts(Into::into));
            return;
        }
        let now = self.now;
        let start = self.text.len();
        line(
            &self.layout.pieces,
            &mut self.text,
            &|f, buf| value_into(buf, j, f, now),
            false,
            false,
        );
        // Lines are alike: after the first, room for a part's more at once.
        if self.rows.len() % ROOM_AHEAD == 0 {
            let len = self.text.len() - start;
            self.text.reserve(len.saturating_mul(ROOM_AHEAD) / 8 * 9);
        }
        let partition = if self.default_sort {
            match self.partitions.iter().position(|p| **p == *j.partition) {
                Some(i) => i,
                None => {
                    self.partitions.push(j.partition.to_string());
                    self.partitions.len() - 1
                }
            }
        } else {
            let keys = self.layout.sort.iter();
            self.keys
                .push(keys.map(|&(f, _)| sort_val(j, f, now)).collect());
            0
        };
        self.rows.push(Row {
            id: j.id.0,
            priority: j.priority,
            start,
            partition: partition as u32,
            state: state_rank(j.state),
        });
    }

    /// About how many bytes the output takes (its lines'; a step
    /// layout's are made at the end).
    pub fn bytes(&self) -> usize {
        self.text.len()
    }

    /// The whole output: date line, header, the lines in order.
    pub fn finish(self) -> String {
        let mut out = Vec::new();
        // Writing to memory fails only where allocation would.
        let _ = self.write_to(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    /// [`Table::finish`], written to `w` line by line as it is put in
    /// order (not first copied whole: ten thousand lines are most of a
    /// megabyte of fresh memory to fault in).
    pub fn write_to(self, w: &mut impl std::io::Write) -> std::io::Result<()> {
        use std::io::Write as _;
        let layout = self.layout;
        let mut out = String::new();
        if layout.dated {
            out.push_str(&strftime("%a %b %d %H:%M:%S %Y\n", self.now));
        }
        if let Some(only) = &layout.steps {
            let order = sorted(&self.steps, &layout.sort, self.now);
            out.push_str(&render_steps(
                &order,
                &layout.pieces,
                only,
                layout.header,
                self.now,
            ));
            return w.write_all(out.as_bytes());
        }
        if layout.header {
            line(&layout.pieces, &mut out, &|_, _| {}, true, false);
        }
        w.write_all(out.as_bytes())?;
        // Partitions by name: the index of each in that order.
        let mut by_name: Vec<usize> = (0..self.partitions.len()).collect();
        by_name.sort_unstable_by(|&a, &b| self.partitions[a].cmp(&self.partitions[b]));
        let mut rank = vec![0u32; by_name.len()];
        for (r, &i) in by_name.iter().enumerate() {
            rank[i] = r as u32;
        }
        let (rows, keys, sort) = (&self.rows, &self.keys, &layout.sort);
        let mut order: Vec<u32> = (0..rows.len() as u32).collect();
        order.sort_unstable_by(|&x, &y| {
            let (a, b) = (&rows[x as usize], &rows[y as usize]);
            let o = if self.default_sort {
                rank[a.partition as usize]
                    .cmp(&rank[b.partition as usize])
                    .then(a.state.cmp(&b.state))
                    .then(b.priority.cmp(&a.priority))
            } else {
                let (ka, kb) = (&keys[x as usize], &keys[y as usize]);
                let mut o = std::cmp::Ordering::Equal;
                for (i, &(_, desc)) in sort.iter().enumerate() {
                    let c = ka[i].cmp(&kb[i]);
                    o = if desc { c.reverse() } else { c };
                    if o.is_ne() {
                        break;
                    }
                }
                o
            };
            o.then(a.id.cmp(&b.id)).then(x.cmp(&y))
        });
        let mut w = std::io::BufWriter::with_capacity(64 << 10, w);
        for &i in &order {
            let i = i as usize;
            let end = rows.get(i + 1).map_or(self.text.len(), |r| r.start);
            w.write_all(&self.text.as_bytes()[rows[i].start..end])?;
        }
        w.flush()
    }
}

/// A state's place in Slurm's order of states (squeue's `t` key).
fn state_rank(s: JobState) -> u8 {
    JobState::ALL.iter().position(|x| *x == s).unwrap_or(0) as u8
}

pub fn main(args: &[OsString]) -> i32 {
    let mut a: SqueueArgs = match parse(CMD, args) {
        Ok(a) => a,
        Err(code) => return code,
    };
    apply_env(&mut a, &|k| std::env::var(k).ok());
    crate::timefmt::use_env_format(now());
    let (mut f, extra, layout) = match (filter(&a), Extra::of(&a), Layout::of(&a)) {
        (Ok(f), Ok(e), Ok(l)) => (f, e, l),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return fail(CMD, e),
    };
    f.detail = layout.detail;
    f.brief = layout.brief;
    f.bare = layout.bare;
    block_on(CMD, async move {
        let mut c = match Client::connect().await {
            Ok(c) => c,
            Err(e) => return fail(CMD, e),
        };
        loop {
            let code = once(&mut c, &f, &extra, &layout, a.array).await;
            match a.iterate {
                Some(secs) if code == 0 => {
                    tokio::time::sleep(std::time::Duration::from_secs(secs.max(1))).await;
                    if super::emit(CMD, "\n") != 0 {
                        return 1;
                    }
                }
                _ => return code,
            }
        }
    })
}

/// One look at the queue, printed.
async fn once(c: &mut Client, f: &JobFilter, extra: &Extra, layout: &Layout, array: bool) -> i32 {
    // One job named that the controller does not know at all is an
    // error, as Slurm's (one it knows that the other filters leave out is
    // not): `while squeue -j $id` loops end on it.
    let one = (f.ids.len() == 1 && f.tasks.is_empty()).then(|| f.ids[0]);
    let mut table = layout.table(array, now());
    let mut any = false;
    let listed = c
        .job_views_each(f.clone(), |j| {
            any = true;
            table.add_view(j, |j| extra.keeps(j));
        })
        .await;
    match listed {
        Ok(()) if !any && one.is_some() => {
            let only = JobFilter {
                ids: one.into_iter().collect(),
                ..JobFilter::default()
            };
            match c.jobs(only).await {
                Ok(known) if known.is_empty() => {
                    // Slurm's very line (scripts grep for it).
                    let line = b"slurm_load_jobs error: Invalid job id specified\n";
                    let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line);
                    1
                }
                Ok(_) => super::emit_with(CMD, |w| table.write_to(w)),
                Err(e) => fail(CMD, e),
            }
        }
        Ok(()) => {
            super::room_in_pipe(table.bytes());
            super::emit_with(CMD, |w| table.write_to(w))
        }
        Err(e) => fail(CMD, e),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use corral_proto::msg::StepView;

    #[test]
    fn sort_keys_are_bounded() {
        assert_eq!(parse_sort(&"i".repeat(64)).unwrap().len(), 64);
        assert_eq!(
            parse_sort(&"i".repeat(65)).unwrap_err(),
            "Invalid sort specification: more than 64 keys"
        );
    }
    use corral_proto::msg::{ExitStatus, Ident, JobId, JobReason};

    pub(crate) fn job(id: u64, state: JobState) -> JobView {
        JobView {
            id: JobId(id),
            name: "train".into(),
            user: Ident { uid: 0, gid: 0 },
            partition: "gpu".into(),
            state,
            reason: JobReason::Resources,
            priority: 10,
            submit_time: 0,
            start_time: (state == JobState::Running).then_some(100),
            end_time: None,
            expected_start: None,
            time_limit: None,
            nodes: if state == JobState::Running {
                vec!["worker-0".into(), "worker-1".into()]
            } else {
                vec![]
            },
            num_nodes: 2,
            num_tasks: 2,
            cpus_per_task: 1,
            num_cpus: 2,
            gpus: 0,
            mem_mb: 0,
            exit: ExitStatus::default(),
            work_dir: "/".into(),
            stdout: None,
            stderr: None,
            command: "x".into(),
            batch: true,
            requeue: false,
            restarts: 0,
            failure: None,
            usage: None,
            comment: None,
            mail_type: None,
            mail_user: None,
            array: None,
            ask: Default::default(),
            steps: Vec::new(),
            suspension: None,
        }
    }

    /// The layout squeue makes of these arguments.
    fn layout(args: &[&str]) -> Layout {
        let mut all = vec!["squeue"];
        all.extend_from_slice(args);
        Layout::of(&SqueueArgs::try_parse_from(all).unwrap()).unwrap()
    }

    /// A layout asks for brief views unless a field or sort key shows
    /// a text they leave out.
    #[test]
    fn only_layouts_without_text_fields_ask_for_brief_views() {
        assert!(layout(&[]).brief);
        assert!(layout(&["-l"]).brief);
        assert!(layout(&["--start"]).brief);
        assert!(layout(&["-o", "%i %j %R"]).brief);
        for text in [
            &["-o", "%i %Z"][..],
            &["-o", "%o"],
            &["-o", "%k"],
            &["-O", "jobid,stdout"],
            &["-O", "stderr"],
            &["-S", "Z"],
        ] {
            assert!(!layout(text).brief, "{text:?}");
        }
    }

    /// squeue's default layouts (and the wide one) ask for bare views;
    /// a field that reads more of the spec asks for whole ones.
    #[test]
    fn only_layouts_of_bare_fields_ask_for_bare_views() {
        assert!(layout(&[]).bare);
        assert!(layout(&["-h", "-t", "PD"]).bare);
        assert!(layout(&["-o", "%i %j %R %Q"]).bare);
        for whole in [
            &["-l"][..],
            &["--start"],
            &["-o", "%i %l"],
            &["-o", "%C"],
            &["-O", "jobid,timeleft"],
            &["-S", "l"],
            &["-s"],
            &["-A", "physics"],
        ] {
            assert!(!layout(whole).bare, "{whole:?}");
        }
    }

    #[test]
    fn default_layout_matches_slurm() {
        let jobs = vec![job(7, JobState::Running), job(8, JobState::Pending)];
        let out = render(&jobs, DEFAULT_FORMAT, true, 165);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[0],
            "             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)"
        );
        assert_eq!(
            lines[1],
            "                 7       gpu    train     root  R       1:05      2 worker-[0-1]"
        );
        assert_eq!(
            lines[2],
            "                 8       gpu    train     root PD       0:00      2 (Resources)"
        );
    }

    #[test]
    fn arrays_fold_their_waiting_tasks_and_unfold_with_r() {
        use corral_proto::msg::{ArrayView, IndexRun};
        let run = |first, count| IndexRun {
            first,
            count,
            step: 1,
        };
        let mut entry = job(40, JobState::Pending);
        entry.array = Some(ArrayView {
            job: JobId(40),
            task: None,
            waiting: vec![run(8, 92)],
            throttle: 4,
        });
        let mut task = job(45, JobState::Running);
        task.array = Some(ArrayView {
            job: JobId(40),
            task: Some(7),
            waiting: vec![],
            throttle: 4,
        });
        let out = render(&[entry.clone(), task.clone()], "%i %A %F %K", false, 0);
        assert_eq!(out, "40_[8-99%4] 40 40 8-99%4\n40_7 45 40 7\n");
        let plain = render(&[job(3, JobState::Pending)], "%i %F %K", false, 0);
        assert_eq!(plain, "3 3 N/A\n");
        if let Some(a) = entry.array.as_mut() {
            a.waiting = vec![run(8, 2), run(20, 1)];
            a.throttle = 0;
        }
        let all = expand_arrays(vec![entry.clone(), task]);
        let ids: Vec<String> = all.iter().map(job_id).collect();
        assert_eq!(ids, ["40_8", "40_9", "40_20", "40_7"]);
        if let Some(a) = entry.array.as_mut() {
            a.waiting = vec![run(20, 1)];
        }
        assert_eq!(job_id(&entry), "40_20");
        let a = SqueueArgs::try_parse_from(["squeue", "-j", "40_7", "-r"]).unwrap();
        let f = filter(&a).unwrap();
        assert_eq!(f.tasks, [(JobId(40), 7)]);
        assert_eq!(f.states.len(), 4, "a finished job shows only with -t");
    }

    #[test]
    fn formats_parse_and_truncate() {
        assert_eq!(
            parse_format("%i|%.5j%=", false),
            vec![
                Piece::Field {
                    right: false,
                    width: None,
                    field: F::JobArrayId
                },
                Piece::Text("|".into()),
                Piece::Field {
                    right: true,
                    width: Some(5),
                    field: F::Name
                },
                Piece::Unknown("%=".into()),
            ]
        );
        assert_eq!(fit("abcdefgh", Some(3), true), "abc");
        assert_eq!(fit("ab", Some(4), false), "ab  ");
    }

    #[test]
    fn default_states_hide_finished_jobs() {
        let a = SqueueArgs::try_parse_from(["squeue"]).unwrap();
        assert_eq!(filter(&a).unwrap().states.len(), 4);
        let a = SqueueArgs::try_parse_from(["squeue", "-t", "all"]).unwrap();
        assert!(filter(&a).unwrap().states.is_empty());
        let a = SqueueArgs::try_parse_from(["squeue", "-t", "CD,failed"]).unwrap();
        assert_eq!(
            filter(&a).unwrap().states,
            vec![JobState::Completed, JobState::Failed]
        );
        let a = SqueueArgs::try_parse_from(["squeue", "-t", "bogus"]).unwrap();
        assert!(filter(&a).is_err());
    }

    /// The three jobs of the field table, as Slurm 22.05 was given them:
    /// `sbatch -J run1 -t 30 --gres=gpu:1 -c 2 --mem=1000 --comment hi`
    /// (running on n1), `sbatch -J pend -t 1-02:04 -N 2 --mem-per-cpu=500
    /// --exclusive` (waiting for resources), `sbatch -J held -H --nice=5
    /// -w n1 -x n2 -A acct --begin=… -d afterok:1`.
    pub(crate) fn table_jobs() -> Vec<JobView> {
        let mut run = job(135, JobState::Running);
        run.name = "run1".into();
        run.partition = "p".into();
        run.nodes = vec!["n1".into()];
        run.num_nodes = 1;
        run.num_tasks = 1;
        run.cpus_per_task = 2;
        run.num_cpus = 2;
        run.gpus = 1;
        run.mem_mb = 1000;
        run.submit_time = 1_000;
        run.start_time = Some(1_000);
        run.time_limit = Some(1800);
        run.end_time = Some(2_800);
        run.priority = 4_294_901_683;
        run.comment = Some("hi".into());
        run.work_dir = "/tmp/slurm".into();
        run.stdout = Some("/tmp/slurm/r1.out".into());
        run.reason = JobReason::None;
        run.requeue = true;
        run.ask.get_or_insert_with(Default::default).gpus_per_node = Some(1);
        let mut pend = job(136, JobState::Pending);
        pend.name = "pend".into();
        pend.partition = "p".into();
        pend.num_cpus = 2;
        pend.submit_time = 1_000;
        pend.time_limit = Some(93_840);
        pend.priority = 4_294_901_682;
        pend.work_dir = "/tmp/slurm".into();
        pend.stdout = Some("slurm-%j.out".into());
        pend.ask.get_or_insert_with(Default::default).mem_per_cpu_mb = Some(500);
        pend.ask.get_or_insert_with(Default::default).exclusive = true;
        let mut held = job(137, JobState::Pending);
        held.name = "held".into();
        held.partition = "p".into();
        held.num_nodes = 1;
        held.num_tasks = 1;
        held.num_cpus = 1;
        held.submit_time = 1_000;
        held.priority = 0;
        held.reason = JobReason::JobHeldUser;
        held.work_dir = "/tmp/slurm".into();
        held.ask.get_or_insert_with(Default::default).nice = 5;
        held.ask.get_or_insert_with(Default::default).account = Some("acct".into());
        held.ask.get_or_insert_with(Default::default).begin = Some(4_600);
        held.ask.get_or_insert_with(Default::default).req_nodes = vec!["n1".into()];
        held.ask.get_or_insert_with(Default::default).exc_nodes = vec!["n2".into()];
        held.ask.get_or_insert_with(Default::default).dependency =
            Some("afterok:1(unfulfilled)".into());
        vec![pend, held, run]
    }

    /// Every `%` code, its header and its value for each of the three jobs,
    /// 102 s after they were submitted. The values are what Slurm 22.05's
    /// squeue printed for the same jobs, except where a row says why not.
    #[test]
    fn every_format_code_prints_as_slurm_does() {
        #[rustfmt::skip]
        let rows: &[(&str, &str, [&str; 3])] = &[
            ("%i", "JOBID", ["136", "137", "135"]),
            ("%A", "JOBID", ["136", "137", "135"]),
            ("%a", "ACCOUNT", ["(null)", "acct", "(null)"]),
            ("%F", "ARRAY_JOB_ID", ["136", "137", "135"]),
            ("%K", "ARRAY_TASK_ID", ["N/A", "N/A", "N/A"]),
            ("%j", "NAME", ["pend", "held", "run1"]),
            ("%u", "USER", ["root", "root", "root"]),
            ("%U", "UID", ["0", "0", "0"]),
            ("%g", "GROUP", ["root", "root", "root"]),
            ("%G", "GROUP", ["0", "0", "0"]),
            ("%P", "PARTITION", ["p", "p", "p"]),
            // Slurm without accounting prints (null); Corral's jobs run
            // under the normal QOS.
            ("%q", "QOS", ["normal", "normal", "normal"]),
            ("%t", "ST", ["PD", "PD", "R"]),
            ("%T", "STATE", ["PENDING", "PENDING", "RUNNING"]),
            ("%M", "TIME", ["0:00", "0:00", "1:42"]),
            ("%l", "TIME_LIMIT", ["1-02:04:00", "UNLIMITED", "30:00"]),
            ("%L", "TIME_LEFT", ["1-02:04:00", "UNLIMITED", "28:18"]),
            ("%D", "NODES", ["2", "1", "1"]),
            ("%C", "CPUS", ["2", "1", "2"]),
            ("%m", "MIN_MEMORY", ["500M", "0", "1000M"]),
            ("%c", "MIN_CPUS", ["1", "1", "2"]),
            ("%b", "TRES_PER_NODE", ["N/A", "N/A", "gres:gpu:1"]),
            ("%R", "NODELIST(REASON)", ["(Resources)", "(JobHeldUser)", "n1"]),
            ("%r", "REASON", ["Resources", "JobHeldUser", "None"]),
            ("%N", "NODELIST", ["", "", "n1"]),
            ("%S", "START_TIME", ["N/A", "1970-01-01T01:16:40", "1970-01-01T00:16:40"]),
            ("%V", "SUBMIT_TIME", ["1970-01-01T00:16:40", "1970-01-01T00:16:40", "1970-01-01T00:16:40"]),
            ("%e", "END_TIME", ["N/A", "N/A", "1970-01-01T00:46:40"]),
            ("%E", "DEPENDENCY", ["(null)", "afterok:1(unfulfilled)", "(null)"]),
            ("%Q", "PRIORITY", ["4294901682", "0", "4294901683"]),
            ("%p", "PRIORITY", ["0.99998472328297", "0.00000000000000", "0.99998472351581"]),
            ("%y", "NICE", ["0", "5", "0"]),
            ("%Z", "WORK_DIR", ["/tmp/slurm", "/tmp/slurm", "/tmp/slurm"]),
            ("%k", "COMMENT", ["(null)", "(null)", "hi"]),
            ("%n", "REQ_NODES", ["", "n1", ""]),
            ("%x", "EXC_NODES", ["", "n2", ""]),
            ("%h", "OVER_SUBSCRIBE", ["NO", "OK", "OK"]),
            ("%W", "LICENSES", ["(null)", "(null)", "(null)"]),
            ("%f", "FEATURES", ["(null)", "(null)", "(null)"]),
            ("%O", "CONTIGUOUS", ["0", "0", "0"]),
            ("%d", "MIN_TMP_DISK", ["0", "0", "0"]),
            ("%H", "SOCKETS_PER_NODE", ["*", "*", "*"]),
            ("%I", "CORES_PER_SOCKET", ["*", "*", "*"]),
            ("%J", "THREADS_PER_CORE", ["*", "*", "*"]),
            ("%z", "S:C:T", ["*:*:*", "*:*:*", "*:*:*"]),
            ("%v", "RESERVATION", ["(null)", "(null)", "(null)"]),
            ("%w", "WCKEY", ["(null)", "(null)", "(null)"]),
            ("%X", "CORE_SPEC", ["N/A", "N/A", "N/A"]),
            ("%Y", "SCHEDNODES", ["(null)", "(null)", "(null)"]),
            ("%B", "EXEC_HOST", ["n/a", "n/a", "n1"]),
        ];
        let jobs = table_jobs();
        let now = 1_102;
        for (code, head, values) in rows {
            let out = render(&jobs, code, true, now);
            let want = format!("{head}\n{}\n{}\n{}\n", values[0], values[1], values[2]);
            assert_eq!(out, want, "{code}");
        }
        // The -O names of the same fields.
        for (name, head, value) in [
            ("JobID", "JOBID", "135"),
            ("UserName", "USER", "root"),
            ("StateCompact", "ST", "R"),
            ("TimeUsed", "TIME", "1:42"),
            ("tres-per-node", "TRES_PER_NODE", "gres:gpu:1"),
            ("BatchHost", "EXEC_HOST", "n1"),
            ("cpus-per-task", "CPUS_PER_TASK", "2"),
            ("STDOUT", "STDOUT", "/tmp/slurm/r1.out"),
            ("STDERR", "STDERR", "/tmp/slurm/r1.out"),
            ("STDIN", "STDIN", "/dev/null"),
            ("NumTasks", "TASKS", "1"),
            ("Requeue", "REQUEUE", "1"),
            ("RestartCnt", "RESTART_COUNT", "0"),
            ("BatchFlag", "BATCH_FLAG", "1"),
            ("MinTime", "TIME_MIN", "0:00"),
            ("PendingTime", "PENDING_TIME", "0"),
            ("EligibleTime", "ELIGIBLE_TIME", "1970-01-01T00:16:40"),
        ] {
            let pieces = parse_format2(&format!("{name}:0"), false).unwrap();
            let out = render_pieces(&jobs[2..], &pieces, true, now);
            assert_eq!(out, format!("{head}\n{value}\n"), "{name}");
        }
        // A pending job's output file, expanded in its work directory.
        let pieces = parse_format2("STDOUT:0", false).unwrap();
        assert_eq!(
            render_pieces(&jobs[..1], &pieces, false, now),
            "/tmp/slurm/slurm-136.out\n"
        );
    }

    /// Widths and justification in both kinds of format, as Slurm 22.05
    /// pads them (trailing blanks kept).
    #[test]
    fn widths_pad_and_truncate_as_slurm_does() {
        let jobs = table_jobs();
        let run = &jobs[2..];
        assert_eq!(
            render(run, "%-10i|%10j|%.3j|%5i", true, 1_102),
            "%-10i|NAME      |NAM|JOBID\n%-10i|run1      |run|135  \n"
        );
        let pieces = parse_format2("name:2,jobid:.6,state", false).unwrap();
        assert_eq!(
            render_pieces(run, &pieces, true, 1_102),
            "NA JOBIDSTATE               \nru   135RUNNING             \n"
        );
        // Durations right-justified are padded, never cut; left-justified
        // they are cut as any field.
        assert_eq!(
            render(run, "%.3l|%.2M|%3l|%.2Q|%.5R", false, 1_102),
            "30:00|1:42|30:|42|   n1\n"
        );
        assert!(parse_format2("Nodes", false)
            .unwrap_err()
            .contains("Invalid job format specification: Nodes"));
    }

    #[test]
    fn sort_keys_read_as_slurm_reads_them() {
        let now = 1_102;
        let jobs = table_jobs();
        let ids = |keys: &str| {
            sorted(&jobs, &parse_sort(keys).unwrap(), now)
                .iter()
                .map(|j| j.id.0)
                .collect::<Vec<_>>()
        };
        assert_eq!(ids("-i"), [137, 136, 135]);
        assert_eq!(ids("j"), [137, 136, 135]);
        assert_eq!(ids("-t,i"), [135, 136, 137]);
        assert_eq!(ids(DEFAULT_SORT), [136, 137, 135]);
        // Ties fall to the id whatever order the views came in.
        let reversed: Vec<JobView> = jobs.iter().rev().cloned().collect();
        let order = sorted(&reversed, &parse_sort("P").unwrap(), now);
        assert_eq!(
            order.iter().map(|j| j.id.0).collect::<Vec<_>>(),
            [135, 136, 137]
        );
        assert_eq!(
            parse_sort("i,=").unwrap_err(),
            "Invalid sort specification: ="
        );
    }

    #[test]
    fn a_table_made_part_by_part_prints_what_the_whole_list_would() {
        let now = 1_102;
        // Many jobs over two partitions and several states and
        // priorities, in parts of uneven size, the parts not in order.
        let base = table_jobs();
        let mut jobs = Vec::new();
        for i in 0..60u64 {
            let mut j = base[(i % 3) as usize].clone();
            j.id = JobId(1000 + (i * 37) % 60);
            j.priority = (i % 7) as i64;
            j.partition = if i % 4 == 0 {
                "cpu".into()
            } else {
                "gpu".into()
            };
            jobs.push(j);
        }
        for args in [
            vec!["squeue"],
            vec!["squeue", "-l"],
            vec!["squeue", "-S", "-p,i"],
            vec!["squeue", "-S", "P,-t", "-o", "%i %P %t %p"],
            vec!["squeue", "-h", "-S", "j"],
        ] {
            let a = SqueueArgs::try_parse_from(args.clone()).unwrap();
            let layout = Layout::of(&a).unwrap();
            let order = sorted(&jobs, &layout.sort, now);
            let mut whole = String::new();
            if layout.dated {
                whole.push_str(&strftime("%a %b %d %H:%M:%S %Y\n", now));
            }
            whole.push_str(&render_pieces(&order, &layout.pieces, layout.header, now));
            let mut t = layout.table(false, now);
            for range in [40..60, 0..7, 7..40] {
                t.add(&jobs[range], |_| true);
            }
            assert_eq!(t.finish(), whole, "{args:?}");
        }
    }

    #[test]
    fn long_steps_and_start_layouts() {
        let now = 1_102;
        let mut jobs = table_jobs();
        let a = SqueueArgs::try_parse_from(["squeue", "-l"]).unwrap();
        let out = Layout::of(&a)
            .unwrap()
            .print(vec![jobs.clone()], false, now);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "Thu Jan 01 00:18:22 1970");
        assert_eq!(
            lines[1],
            "             JOBID PARTITION     NAME     USER    STATE       TIME TIME_LIMI  NODES NODELIST(REASON)"
        );
        assert_eq!(
            lines[2],
            "               136         p     pend     root  PENDING       0:00 1-02:04:00      2 (Resources)"
        );
        assert_eq!(
            lines[4],
            "               135         p     run1     root  RUNNING       1:42     30:00      1 n1"
        );
        jobs[2].steps = vec![
            StepView {
                id: corral_proto::msg::StepId::BATCH,
                name: "batch".into(),
                nodes: vec!["n1".into()],
                tasks: 1,
                cpus: 2,
                start: 1_000,
            },
            StepView {
                id: corral_proto::msg::StepId(0),
                name: "sleep".into(),
                nodes: vec!["n1".into()],
                tasks: 1,
                cpus: 2,
                start: 1_100,
            },
        ];
        let a = SqueueArgs::try_parse_from(["squeue", "-s"]).unwrap();
        assert_eq!(
            Layout::of(&a)
                .unwrap()
                .print(vec![jobs.clone()], false, now),
            [
                "         STEPID     NAME PARTITION     USER      TIME NODELIST\n",
                "          135.0    sleep         p     root      0:02 n1\n",
                "      135.batch    batch         p     root      1:42 n1\n",
            ]
            .concat()
        );
        let a =
            SqueueArgs::try_parse_from(["squeue", "-s", "-o", "%i %j %P %u %M %N %A %l"]).unwrap();
        assert_eq!(
            Layout::of(&a)
                .unwrap()
                .print(vec![jobs.clone()], false, now),
            "STEPID NAME PARTITION USER TIME NODELIST TASKS TIME_LIMIT\n\
             135.0 sleep p root 0:02 n1 1 UNLIMITED\n\
             135.batch batch p root 1:42 n1 1 UNLIMITED\n"
        );
        let a = SqueueArgs::try_parse_from(["squeue", "--start"]).unwrap();
        let out = Layout::of(&a)
            .unwrap()
            .print(vec![jobs[..2].to_vec()], false, now);
        assert_eq!(
            out,
            [
                "             JOBID PARTITION     NAME     USER ST          START_TIME  NODES SCHEDNODES           NODELIST(REASON)\n",
                "               137         p     held     root PD 1970-01-01T01:16:40      1 (null)               (JobHeldUser)\n",
                "               136         p     pend     root PD                 N/A      2 (null)               (Resources)\n",
            ]
            .concat()
        );
        let a = SqueueArgs::try_parse_from(["squeue", "-o", "%i", "-O", "jobid"]).unwrap();
        assert_eq!(
            Layout::of(&a).unwrap_err(),
            "-O (--Format) is incompatible with -o (--format)"
        );
    }

    #[test]
    fn environment_fills_what_the_command_line_left_out() {
        let env = |k: &str| match k {
            "SQUEUE_FORMAT" => Some("%i %j".to_string()),
            "SQUEUE_SORT" => Some("-i".to_string()),
            "SQUEUE_USERS" => Some("0".to_string()),
            _ => None,
        };
        let mut a = SqueueArgs::try_parse_from(["squeue"]).unwrap();
        apply_env(&mut a, &env);
        assert_eq!(a.format.as_deref(), Some("%i %j"));
        assert_eq!(a.sort.as_deref(), Some("-i"));
        assert_eq!(filter(&a).unwrap().users, [0]);
        // The command line wins, and -O on it keeps SQUEUE_FORMAT out.
        let mut a = SqueueArgs::try_parse_from(["squeue", "-O", "jobid", "-S", "j"]).unwrap();
        apply_env(&mut a, &env);
        assert_eq!(a.format, None);
        assert_eq!(a.sort.as_deref(), Some("j"));
        let env2 = |k: &str| (k == "SQUEUE_FORMAT2").then(|| "JobID:6,Name".to_string());
        let mut a = SqueueArgs::try_parse_from(["squeue"]).unwrap();
        apply_env(&mut a, &env2);
        assert_eq!(a.format2.as_deref(), Some("JobID:6,Name"));
    }

    /// An unknown user is an error said, not a failure: squeue answers
    /// with no jobs (uid -1, no one's) and exits 0, as Slurm's.
    #[test]
    fn an_unknown_user_matches_no_one() {
        let f = |u: &str| {
            let a = SqueueArgs::try_parse_from(["squeue", "-u", u]).unwrap();
            filter(&a).unwrap().users
        };
        assert_eq!(f("no-such-user-here"), [u32::MAX]);
        assert_eq!(f("no-such-user-here,0"), [0]);
        assert_eq!(f("1000"), [1000]);
    }

    #[test]
    fn account_qos_and_node_filters() {
        let jobs = table_jobs();
        let keep = |args: &[&str]| {
            let a = SqueueArgs::try_parse_from([&["squeue"], args].concat()).unwrap();
            let e = Extra::of(&a).unwrap();
            jobs.iter()
                .filter(|j| e.keeps(j))
                .map(|j| j.id.0)
                .collect::<Vec<_>>()
        };
        assert_eq!(keep(&["-A", "acct"]), [137]);
        assert_eq!(keep(&["-q", "normal"]), [136, 137, 135]);
        assert_eq!(keep(&["-q", "high"]), Vec::<u64>::new());
        assert_eq!(keep(&["-w", "n[1-2]"]), [135]);
        assert_eq!(keep(&["-w", "n2"]), Vec::<u64>::new());
        let a = SqueueArgs::try_parse_from(["squeue", "-w", "n[2-1]"]).unwrap();
        assert!(Extra::of(&a).is_err());
    }
}
