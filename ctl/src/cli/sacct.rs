//! `sacct`: finished (and current) jobs and their steps from accounting,
//! in Slurm's layouts: fixed-width columns (`-o Field%width`), or
//! delimited (`-p`, `-P`, `--delimiter`).

use std::ffi::OsString;

use clap::Parser;
use corral_proto::msg::{AcctJob, AcctQuery, AcctStep, ExitStatus, JobId, JobState, StepId};

use super::{block_on, fail, parse, parse_user, user_name, words};
use crate::client::Client;
use crate::ctld::server::now;
use crate::timefmt::{cpu_time, limit, parse_when, timestamp};

const CMD: &str = "sacct";

/// Slurm's default fields.
pub const DEFAULT_FORMAT: &str = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode";
const BRIEF_FORMAT: &str = "JobID,State,ExitCode";
/// `-l`: Slurm 22.05's long layout. Corral measures a job's CPU time and
/// largest RSS only, so most of the usage columns stay empty.
const LONG_FORMAT: &str = "JobID,JobIDRaw,JobName,Partition,MaxVMSize,MaxVMSizeNode,MaxVMSizeTask,AveVMSize,MaxRSS,MaxRSSNode,MaxRSSTask,AveRSS,MaxPages,MaxPagesNode,MaxPagesTask,AvePages,MinCPU,MinCPUNode,MinCPUTask,AveCPU,NTasks,AllocCPUS,Elapsed,State,ExitCode,AveCPUFreq,ReqCPUFreqMin,ReqCPUFreqMax,ReqCPUFreqGov,ReqMem,ConsumedEnergy,MaxDiskRead,MaxDiskReadNode,MaxDiskReadTask,AveDiskRead,MaxDiskWrite,MaxDiskWriteNode,MaxDiskWriteTask,AveDiskWrite,ReqTRES,AllocTRES,TRESUsageInAve,TRESUsageInMax,TRESUsageInMaxNode,TRESUsageInMaxTask,TRESUsageInMin,TRESUsageInMinNode,TRESUsageInMinTask,TRESUsageInTot,TRESUsageOutMax,TRESUsageOutMaxNode,TRESUsageOutMaxTask,TRESUsageOutAve,TRESUsageOutTot";

/// Display accounting data for jobs and job steps.
#[derive(Debug, Parser)]
#[command(name = "sacct", version, disable_help_flag = true)]
pub struct SacctArgs {
    /// Print help.
    #[arg(long, action = clap::ArgAction::Help)]
    pub help: Option<bool>,
    /// Only these jobs or steps (`123`, `123.batch`, `123.0`; comma
    /// separated; repeatable, as submitit gives them).
    #[arg(short = 'j', long = "jobs", action = clap::ArgAction::Append)]
    pub jobs: Vec<String>,
    /// Only these users' jobs (names or uids, comma separated; repeatable).
    #[arg(short = 'u', long = "user", alias = "uid", action = clap::ArgAction::Append)]
    pub user: Vec<String>,
    /// Only jobs of these names (comma separated; repeatable).
    #[arg(long = "name", action = clap::ArgAction::Append)]
    pub name: Vec<String>,
    /// The clusters to ask (`all`, or names): Corral is one cluster, whose
    /// jobs every value shows (snakemake asks `--clusters all`).
    #[arg(short = 'M', long = "clusters", action = clap::ArgAction::Append)]
    pub clusters: Vec<String>,
    /// Every user's jobs.
    #[arg(short = 'a', long = "allusers")]
    pub allusers: bool,
    /// Jobs in the system after this time (default: midnight).
    #[arg(short = 'S', long = "starttime")]
    pub start: Option<String>,
    /// Jobs in the system before this time (default: now).
    #[arg(short = 'E', long = "endtime")]
    pub end: Option<String>,
    /// Only jobs in these states (CD,F,CA,TO,NF,OOM,PD,R,RQ or long names;
    /// repeatable).
    #[arg(short = 's', long = "state", action = clap::ArgAction::Append)]
    pub state: Vec<String>,
    /// Jobs only, not their steps.
    #[arg(short = 'X', long = "allocations")]
    pub allocations: bool,
    /// Every run of a requeued job.
    #[arg(short = 'D', long = "duplicates")]
    pub duplicates: bool,
    /// No header.
    #[arg(short = 'n', long = "noheader")]
    pub noheader: bool,
    /// Fields end with the delimiter (`|`).
    #[arg(short = 'p', long = "parsable")]
    pub parsable: bool,
    /// Fields are separated by the delimiter, without one at the end.
    #[arg(short = 'P', long = "parsable2")]
    pub parsable2: bool,
    /// The delimiter of -p and -P.
    #[arg(long = "delimiter")]
    pub delimiter: Option<String>,
    /// Fields to show, comma separated, each optionally `%WIDTH`.
    #[arg(short = 'o', long = "format")]
    pub format: Option<String>,
    /// JobID, State and ExitCode only.
    #[arg(short = 'b', long = "brief")]
    pub brief: bool,
    /// Slurm's long layout (`-l`).
    #[arg(short = 'l', long = "long")]
    pub long: bool,
    /// List the fields -o knows.
    #[arg(short = 'e', long = "helpformat")]
    pub helpformat: bool,
}

/// A field sacct can show and its default width (negative: left
/// justified), as Slurm's.
const FIELDS: &[(&str, i32)] = &[
    ("Account", 10),
    ("AllocCPUS", 10),
    ("AllocNodes", 10),
    ("AllocTRES", 10),
    ("AveCPU", 10),
    ("AveCPUFreq", 10),
    ("AveDiskRead", 14),
    ("AveDiskWrite", 14),
    ("AvePages", 10),
    ("AveRSS", 10),
    ("AveVMSize", 10),
    ("Comment", 14),
    ("ConsumedEnergy", 14),
    ("CPUTime", 10),
    ("CPUTimeRAW", 10),
    ("DerivedExitCode", 15),
    ("Elapsed", 10),
    ("ElapsedRaw", 10),
    ("Eligible", 19),
    ("End", 19),
    ("ExitCode", 8),
    ("GID", 6),
    ("Group", 9),
    ("JobID", -12),
    ("JobIDRaw", -12),
    ("JobName", 10),
    ("MaxDiskRead", 12),
    ("MaxDiskReadNode", 15),
    ("MaxDiskReadTask", 15),
    ("MaxDiskWrite", 12),
    ("MaxDiskWriteNode", 16),
    ("MaxDiskWriteTask", 16),
    ("MaxPages", 8),
    ("MaxPagesNode", 12),
    ("MaxPagesTask", 14),
    ("MaxRSS", 10),
    ("MaxRSSNode", 10),
    ("MaxRSSTask", 10),
    ("MaxVMSize", 10),
    ("MaxVMSizeNode", 14),
    ("MaxVMSizeTask", 14),
    ("MinCPU", 10),
    ("MinCPUNode", 10),
    ("MinCPUTask", 10),
    ("NCPUS", 10),
    ("NNodes", 8),
    ("NodeList", 15),
    ("NTasks", 8),
    ("Partition", 10),
    ("Reason", 22),
    ("ReqCPUFreqGov", 13),
    ("ReqCPUFreqMax", 13),
    ("ReqCPUFreqMin", 13),
    ("ReqCPUS", 8),
    ("ReqMem", 10),
    ("ReqNodes", 8),
    ("ReqTRES", 10),
    ("Restarts", 8),
    ("Start", 19),
    ("State", 10),
    ("Submit", 19),
    ("Timelimit", 10),
    ("TimelimitRaw", 10),
    ("TotalCPU", 10),
    ("TRESUsageInAve", 14),
    ("TRESUsageInMax", 14),
    ("TRESUsageInMaxNode", 18),
    ("TRESUsageInMaxTask", 18),
    ("TRESUsageInMin", 14),
    ("TRESUsageInMinNode", 18),
    ("TRESUsageInMinTask", 18),
    ("TRESUsageInTot", 14),
    ("TRESUsageOutAve", 15),
    ("TRESUsageOutMax", 15),
    ("TRESUsageOutMaxNode", 19),
    ("TRESUsageOutMaxTask", 19),
    ("TRESUsageOutTot", 15),
    ("UID", 6),
    ("User", 9),
    ("WCKey", 10),
    ("WCKeyID", 10),
    ("WorkDir", 20),
];

/// One column: a known field (its name as Slurm spells it) and width.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: &'static str,
    pub width: i32,
}

/// The widest column `-o Field%width` may ask for (a typo's ten digits
/// would otherwise pad every cell with gigabytes of spaces).
pub const MAX_WIDTH: u32 = 4096;

/// `Name%width` (a negative width: left aligned): the name and the
/// width if one is given; `None` for a width that is no number or over
/// [`MAX_WIDTH`].
pub(super) fn split_width(part: &str) -> Option<(&str, Option<i32>)> {
    match part.split_once('%') {
        Some((n, w)) => {
            let w: i32 = w
                .parse()
                .ok()
                .filter(|w: &i32| w.unsigned_abs() <= MAX_WIDTH)?;
            Some((n, Some(w)))
        }
        None => Some((part, None)),
    }
}

/// Parses `-o`: `Field[%width],…`, names in any case.
pub fn parse_columns(format: &str) -> Result<Vec<Column>, String> {
    let mut out = Vec::new();
    for part in format.split(',').filter(|p| !p.trim().is_empty()) {
        let part = part.trim();
        let (name, width) =
            split_width(part).ok_or_else(|| format!("Invalid field requested: \"{part}\""))?;
        let &(known, default) = FIELDS
            .iter()
            .find(|(f, _)| f.eq_ignore_ascii_case(name))
            .ok_or_else(|| format!("Invalid field requested: \"{name}\""))?;
        out.push(Column {
            name: known,
            width: width.unwrap_or(default),
        });
    }
    if out.is_empty() {
        return Err("No fields requested".into());
    }
    Ok(out)
}

/// `-j 123,123.batch,124.0`: the jobs, and the steps asked for by job
/// (a job named without a step shows whole).
type StepPick = Vec<(JobId, Option<StepId>)>;

/// What `-j` names: a job (or an array, all its tasks), or one task of
/// an array (`123_7`), and a step of it or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pick {
    pub job: JobId,
    pub task: Option<u32>,
    pub step: Option<StepId>,
}

impl Pick {
    fn names(&self, j: &AcctJob) -> bool {
        match self.task {
            None => self.job == j.id || j.array.is_some_and(|(a, _)| a == self.job),
            Some(t) => j.array == Some((self.job, t)),
        }
    }
}

fn parse_jobs(s: &str) -> Result<Vec<Pick>, String> {
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let bad = || format!("Invalid job id specified: {p}");
            let (job, step) = match p.split_once('.') {
                Some((j, st)) => (j, Some(st)),
                None => (p, None),
            };
            let (job, task) = match job.trim().split_once('_') {
                Some((a, t)) => (a, Some(t.parse().map_err(|_| bad())?)),
                None => (job.trim(), None),
            };
            let job = JobId(job.parse().map_err(|_| bad())?);
            let step = match step {
                None => None,
                Some("batch") => Some(StepId::BATCH),
                Some(n) => Some(StepId(n.parse().map_err(|_| bad())?)),
            };
            Ok(Pick { job, task, step })
        })
        .collect()
}

/// The jobs `picks` name (all of them when none is picked), and the
/// steps picked by each job's own id.
pub fn picked(jobs: &mut Vec<AcctJob>, picks: &[Pick]) -> StepPick {
    if picks.is_empty() {
        return Vec::new();
    }
    jobs.retain(|j| picks.iter().any(|p| p.names(j)));
    let mut out = Vec::new();
    for p in picks {
        for j in jobs.iter().filter(|j| p.names(j)) {
            out.push((j.id, p.step));
        }
    }
    out
}

/// The query the arguments ask, and the steps picked by `-j`.
pub fn query(a: &SacctArgs, now: u64) -> Result<(AcctQuery, Vec<Pick>), String> {
    let mut q = AcctQuery {
        all_users: a.allusers,
        allocations: a.allocations,
        duplicates: a.duplicates,
        ..AcctQuery::default()
    };
    let mut picks = Vec::new();
    for j in &a.jobs {
        picks.extend(parse_jobs(j)?);
    }
    // A task is asked for by its array's id, and picked out after.
    q.ids = picks.iter().map(|p| p.job).collect();
    q.ids.dedup();
    for u in &a.user {
        for user in u.split(',').filter(|s| !s.is_empty()) {
            q.users.push(parse_user(user)?);
        }
    }
    for s in &a.state {
        for st in s.split(',').filter(|s| !s.is_empty()) {
            q.states
                .push(JobState::parse(st).ok_or_else(|| format!("Invalid state: {st}"))?);
        }
    }
    q.start = match &a.start {
        Some(s) => Some(parse_when(s, now)?),
        // Slurm's default window starts at midnight, unless jobs or
        // states are named.
        None if q.ids.is_empty() && q.states.is_empty() => Some(now / 86400 * 86400),
        None => None,
    };
    q.end = match &a.end {
        Some(e) => Some(parse_when(e, now)?),
        None => None,
    };
    Ok((q, picks))
}

/// A line of output: a job or one of its steps.
enum Line<'a> {
    Job(&'a AcctJob),
    Step(&'a AcctJob, &'a AcctStep),
}

fn exit_code(e: ExitStatus) -> String {
    format!("{}:{}", e.code, e.signal.unwrap_or(0))
}

fn when(t: Option<u64>) -> String {
    t.map_or("Unknown".into(), timestamp)
}

fn mem(mb: u64) -> String {
    if mb > 0 && mb % 1024 == 0 {
        format!("{}G", mb / 1024)
    } else {
        format!("{mb}M")
    }
}

/// `cpu=2,gres/gpu=1,mem=8G,node=1`-style TRES (billing first for jobs).
fn tres(billing: Option<u32>, cpus: u32, gpus: u32, mem_mb: u64, nodes: u32) -> String {
    let mut parts = Vec::new();
    if let Some(b) = billing {
        parts.push(format!("billing={b}"));
    }
    parts.push(format!("cpu={cpus}"));
    if gpus > 0 {
        parts.push(format!("gres/gpu={gpus}"));
    }
    if mem_mb > 0 {
        parts.push(format!("mem={}", mem(mem_mb)));
    }
    parts.push(format!("node={nodes}"));
    parts.join(",")
}

fn state_text(state: JobState, cancelled_by: Option<u32>) -> String {
    match (state, cancelled_by) {
        (JobState::Cancelled, Some(uid)) => format!("CANCELLED by {uid}"),
        _ => state.name().to_string(),
    }
}

fn elapsed_secs(start: Option<u64>, end: Option<u64>, now: u64) -> u64 {
    match start {
        Some(s) => end.unwrap_or(now).saturating_sub(s),
        None => 0,
    }
}

fn value(line: &Line<'_>, field: &str, now: u64) -> String {
    match line {
        Line::Job(j) => job_value(j, field, now),
        Line::Step(j, s) => step_value(j, s, field, now),
    }
}

/// sacct's JobID: a task of an array as `123_7`, any other job by id.
fn job_id(j: &AcctJob) -> String {
    match j.array {
        Some((a, t)) => format!("{a}_{t}"),
        None => j.id.to_string(),
    }
}

fn job_value(j: &AcctJob, field: &str, now: u64) -> String {
    let elapsed = elapsed_secs(j.start, j.end, now);
    match field {
        "JobID" => job_id(j),
        "JobIDRaw" => j.id.to_string(),
        "JobName" => j.name.clone(),
        "Partition" => j.partition.clone(),
        "Account" => j.account.clone(),
        "User" => user_name(j.user.uid),
        "UID" => j.user.uid.to_string(),
        "Group" => super::group_name(j.user.gid),
        "GID" => j.user.gid.to_string(),
        "AllocCPUS" | "NCPUS" => j.alloc_cpus.to_string(),
        "AllocNodes" => j.alloc_nodes.to_string(),
        "NNodes" => j
            .alloc_nodes
            .max(if j.start.is_none() { j.req_nodes } else { 0 })
            .to_string(),
        "NodeList" if j.nodelist.is_empty() => "None assigned".into(),
        "NodeList" => j.nodelist.clone(),
        "AllocTRES" if j.alloc_nodes == 0 => String::new(),
        "AllocTRES" => tres(
            Some(j.alloc_cpus),
            j.alloc_cpus,
            j.alloc_gpus,
            j.alloc_mem_mb,
            j.alloc_nodes,
        ),
        "ReqTRES" => tres(
            Some(j.req_cpus),
            j.req_cpus,
            j.req_gpus,
            j.req_mem_mb,
            j.req_nodes,
        ),
        "ReqCPUS" => j.req_cpus.to_string(),
        "ReqMem" => mem(j.req_mem_mb),
        "ReqNodes" => j.req_nodes.to_string(),
        "NTasks" => String::new(),
        "State" => state_text(j.state, j.cancelled_by),
        "ExitCode" => exit_code(j.exit),
        "DerivedExitCode" => {
            // The worst of its srun steps (the batch script's own exit is
            // ExitCode), as Slurm's.
            let worst = j
                .steps
                .iter()
                .filter(|s| s.step != StepId::BATCH)
                .map(|s| s.exit)
                .max_by_key(|e| (e.code, e.signal));
            exit_code(worst.unwrap_or_default())
        }
        "Elapsed" => limit(Some(elapsed), "00:00:00"),
        "ElapsedRaw" => elapsed.to_string(),
        "CPUTime" => limit(Some(elapsed * u64::from(j.alloc_cpus)), "00:00:00"),
        "CPUTimeRAW" => (elapsed * u64::from(j.alloc_cpus)).to_string(),
        "Submit" => timestamp(j.submit),
        "Eligible" => timestamp(j.eligible),
        "Start" => when(j.start),
        "End" => when(j.end),
        "Timelimit" => limit(j.time_limit, "UNLIMITED"),
        "TimelimitRaw" => j
            .time_limit
            .map_or("UNLIMITED".into(), |s| s.div_ceil(60).to_string()),
        "MaxRSS" => j
            .usage
            .map_or(String::new(), |u| format!("{}K", u.max_rss_kb)),
        "TotalCPU" => j.usage.map_or(cpu_time(0), |u| cpu_time(u.cpu_ms)),
        "Reason" => words::job_reason(j.reason).to_string(),
        "Comment" => j.comment.clone(),
        // Recorded, though no wckey is tracked: Slurm 22.05 without
        // TrackWCKey shows the job's, and id 0 (a step shows neither).
        "WCKey" => j.wckey.clone(),
        "WCKeyID" => "0".into(),
        "WorkDir" => j.work_dir.clone(),
        // No frequency was asked for (Slurm's word on a job's line).
        "ReqCPUFreqMin" | "ReqCPUFreqMax" | "ReqCPUFreqGov" => "Unknown".into(),
        "Restarts" => j.run.to_string(),
        _ => String::new(),
    }
}

fn step_value(j: &AcctJob, s: &AcctStep, field: &str, now: u64) -> String {
    let elapsed = elapsed_secs(Some(s.start), s.end, now);
    match field {
        "JobID" => format!("{}.{}", job_id(j), s.step),
        "JobIDRaw" => format!("{}.{}", j.id, s.step),
        "JobName" => s.name.clone(),
        "Account" => j.account.clone(),
        "AllocCPUS" | "NCPUS" => s.cpus.to_string(),
        "AllocNodes" | "NNodes" => s.nodes.to_string(),
        "NodeList" => s.nodelist.clone(),
        // The job's memory on the step's nodes (Slurm's step TRES).
        "AllocTRES" => tres(
            None,
            s.cpus,
            0,
            j.alloc_mem_mb * u64::from(s.nodes) / u64::from(j.alloc_nodes.max(1)),
            s.nodes,
        ),
        "NTasks" => s.tasks.to_string(),
        // Nothing measured or asked of them: 0, as Slurm's steps show
        // without an energy plugin.
        "AveCPUFreq" | "ReqCPUFreqMin" | "ReqCPUFreqMax" | "ReqCPUFreqGov" | "ConsumedEnergy" => {
            "0".into()
        }
        "ReqCPUS" => s.cpus.to_string(),
        "ReqNodes" => s.nodes.to_string(),
        // A step shows CANCELLED, without who: the job's line says it.
        "State" => state_text(s.state, None),
        // A step lost with its node never said how it ended.
        "ExitCode" if j.state == JobState::NodeFail && s.state == JobState::Cancelled => {
            String::new()
        }
        "ExitCode" => exit_code(s.exit),
        "Elapsed" => limit(Some(elapsed), "00:00:00"),
        "ElapsedRaw" => elapsed.to_string(),
        "CPUTime" => limit(Some(elapsed * u64::from(s.cpus)), "00:00:00"),
        "CPUTimeRAW" => (elapsed * u64::from(s.cpus)).to_string(),
        "Submit" | "Eligible" | "Start" => timestamp(s.start),
        "End" => when(s.end),
        "Restarts" => j.run.to_string(),
        _ => String::new(),
    }
}

/// How output is laid out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    Columns,
    /// Every field followed by the delimiter.
    Parsable(String),
    /// Fields separated by the delimiter.
    Parsable2(String),
}

/// A value with the delimiter in it escaped (`\x7c` for `|`), so a job
/// named `a|b` cannot shift the columns a parser reads.
fn delimited<'a>(text: &'a str, d: &str) -> std::borrow::Cow<'a, str> {
    if d.is_empty() || !text.contains(d) {
        return std::borrow::Cow::Borrowed(text);
    }
    let escaped: String = d.chars().map(|c| format!("\\x{:02x}", c as u32)).collect();
    std::borrow::Cow::Owned(text.replace(d, &escaped))
}

pub(super) fn cell(out: &mut String, text: &str, width: i32, layout: &Layout, last: bool) {
    match layout {
        Layout::Parsable(d) => {
            out.push_str(&delimited(text, d));
            out.push_str(d);
        }
        Layout::Parsable2(d) => {
            out.push_str(&delimited(text, d));
            if !last {
                out.push_str(d);
            }
        }
        Layout::Columns => {
            let w = width.unsigned_abs() as usize;
            let n = text.chars().count();
            let shown: String = if n > w {
                // Too long: cut, with `+` saying so.
                let mut t: String = text.chars().take(w.saturating_sub(1)).collect();
                t.push('+');
                t
            } else {
                text.to_string()
            };
            if width < 0 {
                out.push_str(&format!("{shown:<w$} "));
            } else {
                out.push_str(&format!("{shown:>w$} "));
            }
        }
    }
}

/// A table's header: the names, cut to their widths in columns (then a
/// line of dashes), whole when parsable.
pub(super) fn write_header(out: &mut String, columns: &[(&str, i32)], layout: &Layout) {
    let last = columns.len().saturating_sub(1);
    for (i, &(name, width)) in columns.iter().enumerate() {
        let w = width.unsigned_abs() as usize;
        let name: String = match layout {
            Layout::Columns => name.chars().take(w).collect(),
            _ => name.to_string(),
        };
        cell(out, &name, width, layout, i == last);
    }
    out.push('\n');
    if *layout == Layout::Columns {
        for &(_, width) in columns {
            out.push_str(&"-".repeat(width.unsigned_abs() as usize));
            out.push(' ');
        }
        out.push('\n');
    }
}

/// Renders jobs and their steps (as picked by `-j`).
pub fn render(
    jobs: &[AcctJob],
    columns: &[Column],
    layout: &Layout,
    header: bool,
    picks: &StepPick,
    now: u64,
) -> String {
    let mut out = String::new();
    let last = columns.len().saturating_sub(1);
    if header {
        let heads: Vec<(&str, i32)> = columns.iter().map(|c| (c.name, c.width)).collect();
        write_header(&mut out, &heads, layout);
    }
    let mut emit = |line: Line<'_>| {
        for (i, c) in columns.iter().enumerate() {
            cell(
                &mut out,
                &value(&line, c.name, now),
                c.width,
                layout,
                i == last,
            );
        }
        out.push('\n');
    };
    for j in jobs {
        let steps_picked: Vec<StepId> = picks
            .iter()
            .filter(|(id, s)| *id == j.id && s.is_some())
            .filter_map(|(_, s)| *s)
            .collect();
        let whole = steps_picked.is_empty();
        if whole {
            emit(Line::Job(j));
        }
        // The batch step first, then the numbered ones.
        let mut steps: Vec<&AcctStep> = j
            .steps
            .iter()
            .filter(|s| whole || steps_picked.contains(&s.step))
            .collect();
        steps.sort_by_key(|s| (s.step != StepId::BATCH, s.step));
        for s in steps {
            emit(Line::Step(j, s));
        }
    }
    out
}

pub fn main(args: &[OsString]) -> i32 {
    let a: SacctArgs = match parse(CMD, args) {
        Ok(a) => a,
        Err(code) => return code,
    };
    if a.helpformat {
        let names: Vec<&str> = FIELDS.iter().map(|(n, _)| *n).collect();
        let mut text = String::new();
        for row in names.chunks(5) {
            let line: Vec<String> = row.iter().map(|n| format!("{n:<18}")).collect();
            text.push_str(line.join(" ").trim_end());
            text.push('\n');
        }
        return super::emit(CMD, &text);
    }
    let now = now();
    let (q, picks) = match query(&a, now) {
        Ok(q) => q,
        Err(e) => return fail(CMD, e),
    };
    let format = match (&a.format, a.brief) {
        (Some(f), _) => f.clone(),
        (None, true) => BRIEF_FORMAT.to_string(),
        (None, false) if a.long => LONG_FORMAT.to_string(),
        (None, false) => DEFAULT_FORMAT.to_string(),
    };
    let columns = match parse_columns(&format) {
        Ok(c) => c,
        Err(e) => return fail(CMD, e),
    };
    let delimiter = a.delimiter.clone().unwrap_or_else(|| "|".into());
    let layout = if a.parsable2 {
        Layout::Parsable2(delimiter)
    } else if a.parsable {
        Layout::Parsable(delimiter)
    } else {
        Layout::Columns
    };
    block_on(CMD, async move {
        let mut c = match Client::connect().await {
            Ok(c) => c,
            Err(e) => return fail(CMD, e),
        };
        match c.accounting(q).await {
            Ok(mut jobs) => {
                let names: Vec<&str> = a
                    .name
                    .iter()
                    .flat_map(|n| n.split(','))
                    .filter(|n| !n.is_empty())
                    .collect();
                if !names.is_empty() {
                    jobs.retain(|j| names.contains(&j.name.as_str()));
                }
                let picks = picked(&mut jobs, &picks);
                let text = render(&jobs, &columns, &layout, !a.noheader, &picks, now);
                super::emit(CMD, &text)
            }
            Err(e) => fail(CMD, e),
        }
    })
}

#[cfg(test)]
#[path = "sacct_reference.rs"]
mod reference;

#[cfg(test)]
mod tests {
    use super::*;
    use corral_proto::msg::{Ident, JobReason, JobUsage};

    fn job(id: u64, state: JobState) -> AcctJob {
        AcctJob {
            id: JobId(id),
            array: None,
            run: 0,
            name: "train-resnet".into(),
            user: Ident { uid: 0, gid: 0 },
            account: "ml".into(),
            partition: "gpu".into(),
            nodelist: "worker-[0-1]".into(),
            alloc_nodes: 2,
            alloc_cpus: 8,
            alloc_mem_mb: 16384,
            alloc_gpus: 2,
            req_nodes: 2,
            req_cpus: 8,
            req_mem_mb: 8192,
            req_gpus: 2,
            submit: 1_796_000_000,
            eligible: 1_796_000_000,
            start: Some(1_796_000_010),
            end: Some(1_796_003_671),
            time_limit: Some(7200),
            state,
            reason: JobReason::None,
            exit: ExitStatus::default(),
            cancelled_by: None,
            usage: Some(JobUsage {
                cpu_ms: 62_512,
                max_rss_kb: 1180,
            }),
            work_dir: "/home/ml".into(),
            comment: String::new(),
            wckey: String::new(),
            steps: vec![
                AcctStep {
                    step: StepId(0),
                    name: "python".into(),
                    nodelist: "worker-[0-1]".into(),
                    nodes: 2,
                    tasks: 2,
                    cpus: 8,
                    start: 1_796_000_011,
                    end: Some(1_796_003_670),
                    state: JobState::Completed,
                    exit: ExitStatus::default(),
                },
                AcctStep {
                    step: StepId::BATCH,
                    name: "batch".into(),
                    nodelist: "worker-0".into(),
                    nodes: 1,
                    tasks: 1,
                    cpus: 4,
                    start: 1_796_000_010,
                    end: Some(1_796_003_671),
                    state: JobState::Completed,
                    exit: ExitStatus::default(),
                },
            ],
        }
    }

    fn cols(f: &str) -> Vec<Column> {
        parse_columns(f).unwrap()
    }

    #[test]
    fn default_layout() {
        let out = render(
            &[job(7, JobState::Completed)],
            &cols(DEFAULT_FORMAT),
            &Layout::Columns,
            true,
            &Vec::new(),
            0,
        );
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines,
            [
                "JobID           JobName  Partition    Account  AllocCPUS      State ExitCode ",
                "------------ ---------- ---------- ---------- ---------- ---------- -------- ",
                "7            train-res+        gpu         ml          8  COMPLETED      0:0 ",
                "7.batch           batch                    ml          4  COMPLETED      0:0 ",
                "7.0              python                    ml          8  COMPLETED      0:0 ",
            ]
        );
    }

    #[test]
    fn a_delimiter_in_a_value_is_escaped() {
        let mut j = job(7, JobState::Completed);
        j.name = "a|b".into();
        let cols = parse_columns("JobID,JobName,State").unwrap();
        let out = render(
            &[j],
            &cols,
            &Layout::Parsable2("|".into()),
            false,
            &Vec::new(),
            0,
        );
        assert_eq!(out.lines().next(), Some("7|a\\x7cb|COMPLETED"));
    }

    #[test]
    fn parsable_fields_widths_and_states() {
        let mut j = job(9, JobState::Cancelled);
        j.cancelled_by = Some(1000);
        j.exit = ExitStatus {
            code: 0,
            signal: Some(15),
        };
        let f = "JobID,State,ExitCode,Elapsed,ElapsedRaw,Start,End,AllocTRES,ReqTRES,MaxRSS,TotalCPU,Timelimit,NodeList";
        let out = render(
            &[j.clone()],
            &cols(f),
            &Layout::Parsable2("|".into()),
            true,
            &vec![(JobId(9), None)],
            0,
        );
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], f.replace(',', "|"));
        assert_eq!(
            lines[1],
            "9|CANCELLED by 1000|0:15|01:01:01|3661|2026-11-30T00:53:30|2026-11-30T01:54:31|\
             billing=8,cpu=8,gres/gpu=2,mem=16G,node=2|billing=8,cpu=8,gres/gpu=2,mem=8G,node=2|\
             1180K|01:02.512|02:00:00|worker-[0-1]"
        );
        // -p ends every field with the delimiter; -j 9.0 shows that step only.
        let out = render(
            &[j],
            &cols("JobID,JobName%20,NTasks"),
            &Layout::Parsable(";".into()),
            false,
            &vec![(JobId(9), Some(StepId(0)))],
            0,
        );
        assert_eq!(out, "9.0;python;2;\n");
        // A width: right-justified, cut with `+`.
        let out = render(
            &[job(3, JobState::Failed)],
            &cols("jobname%5,state%-8"),
            &Layout::Columns,
            false,
            &Vec::new(),
            0,
        );
        assert_eq!(out.lines().next(), Some("trai+ FAILED   "));
    }

    #[test]
    fn arguments_become_a_query() {
        let now = 1_796_000_000;
        let a = SacctArgs::try_parse_from(["sacct"]).unwrap();
        let (q, _) = query(&a, now).unwrap();
        assert_eq!(q.start, Some(now / 86400 * 86400), "midnight by default");
        let a = SacctArgs::try_parse_from(["sacct", "-j", "5,6.batch", "-X", "-s", "CD,failed"])
            .unwrap();
        let (q, picks) = query(&a, now).unwrap();
        assert_eq!(q.ids, [JobId(5), JobId(6)]);
        assert_eq!(
            picks[1],
            Pick {
                job: JobId(6),
                task: None,
                step: Some(StepId::BATCH)
            }
        );
        assert_eq!(q.start, None);
        assert!(q.allocations);
        assert_eq!(q.states, [JobState::Completed, JobState::Failed]);
        for bad in [
            &["sacct", "-j", "x"][..],
            &["sacct", "-s", "bogus"],
            &["sacct", "-S", "yesterday-ish"],
        ] {
            let a = SacctArgs::try_parse_from(bad).unwrap();
            assert!(query(&a, now).is_err(), "{bad:?}");
        }
        assert!(parse_columns("JobID,Nonsense").is_err());
        assert!(parse_columns("JobID%x").is_err());
        assert!(parse_columns("JobID%4096,State%-4096").is_ok());
        let e = parse_columns("JobID%2000000000").unwrap_err();
        assert_eq!(e, "Invalid field requested: \"JobID%2000000000\"");
    }

    /// `-j 7_2` is the array 7's task 2 (asked for by the array's id,
    /// picked out after), `-j 7` all its tasks, `-j 7_2.batch` a step.
    #[test]
    fn an_array_task_is_picked_by_its_array_id() {
        let a = SacctArgs::try_parse_from(["sacct", "-j", "7_2,9", "-j", "7_1.batch"]).unwrap();
        let (q, picks) = query(&a, 0).unwrap();
        assert_eq!(q.ids, [JobId(7), JobId(9), JobId(7)]);
        let task = |id: u64, t: u32| AcctJob {
            array: Some((JobId(7), t)),
            ..job(id, JobState::Completed)
        };
        let all = vec![
            task(8, 0),
            task(9, 1),
            task(10, 2),
            job(11, JobState::Failed),
        ];
        let mut jobs = all.clone();
        let steps = picked(&mut jobs, &picks);
        // 9 is task 1 and a job named by its own id.
        let ids: Vec<u64> = jobs.iter().map(|j| j.id.0).collect();
        assert_eq!(ids, [9, 10]);
        assert_eq!(
            steps,
            [
                (JobId(10), None),
                (JobId(9), None),
                (JobId(9), Some(StepId::BATCH))
            ]
        );
        let a = SacctArgs::try_parse_from(["sacct", "-j", "7"]).unwrap();
        let (_, picks) = query(&a, 0).unwrap();
        let mut jobs = all.clone();
        picked(&mut jobs, &picks);
        assert_eq!(jobs.len(), 3);
        for bad in ["7_", "7_x", "_2", "7_2_3"] {
            let a = SacctArgs::try_parse_from(["sacct", "-j", bad]).unwrap();
            assert!(query(&a, 0).is_err(), "{bad}");
        }
    }

    /// The launchers' own queries parse: submitit repeats `-j`;
    /// snakemake's executor asks `--clusters all` and `--name`.
    #[test]
    fn the_launchers_queries_parse() {
        let now = 1_796_000_000;
        let submitit = [
            "sacct",
            "-o",
            "JobID,State,NodeList",
            "--parsable2",
            "-j",
            "3",
            "-j",
            "4",
            "-j",
            "5",
        ];
        let a = SacctArgs::try_parse_from(submitit).unwrap();
        let (q, _) = query(&a, now).unwrap();
        assert_eq!(q.ids, [JobId(3), JobId(4), JobId(5)]);
        let snakemake = [
            "sacct",
            "-X",
            "--parsable2",
            "--clusters",
            "all",
            "--noheader",
            "--format=JobIdRaw,State",
            "--starttime",
            "2026-12-07T10:00",
            "--endtime",
            "now",
            "--name",
            "e3b0c442-run",
        ];
        let a = SacctArgs::try_parse_from(snakemake).unwrap();
        assert_eq!(a.name, ["e3b0c442-run"]);
        assert!(parse_columns(a.format.as_deref().unwrap()).is_ok());
        query(&a, now).unwrap();
        let a = SacctArgs::try_parse_from(["sacct", "-u", "1000", "-u", "1001,1002"]).unwrap();
        assert_eq!(query(&a, now).unwrap().0.users, [1000, 1001, 1002]);
    }
}
