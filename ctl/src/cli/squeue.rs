//! `squeue`: the queue, in Slurm's default layout or a `-o` format.

use std::ffi::OsString;

use clap::Parser;
use corral_proto::msg::{format_indices, JobFilter, JobState, JobView};
use scheduler_core::hostlist;

use super::opts::parse_job_list;
use super::{block_on, fail, parse, parse_user, user_name, words};
use crate::client::Client;
use crate::ctld::server::now;
use crate::timefmt::{elapsed, limit, timestamp};

const CMD: &str = "squeue";

/// Slurm's default squeue format.
pub const DEFAULT_FORMAT: &str = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R";

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
    /// Output format (%i %P %j %u %t %T %M %l %D %C %R %N %r %S %V %Q %b).
    #[arg(short = 'o', long = "format")]
    pub format: Option<String>,
    /// Show expected start times of pending jobs.
    #[arg(long)]
    pub start: bool,
    /// An array's waiting tasks one per line (by default they share one,
    /// as `123_[8-99]`).
    #[arg(short = 'r', long = "array")]
    pub array: bool,
}

/// Builds the job filter from the arguments.
pub fn filter(a: &SqueueArgs) -> Result<JobFilter, String> {
    let mut f = JobFilter::default();
    if let Some(j) = &a.jobs {
        (f.ids, f.tasks) = parse_job_list(j)?;
    }
    if let Some(u) = &a.user {
        f.users = u.split(',').map(parse_user).collect::<Result<_, _>>()?;
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
        None if f.ids.is_empty() && f.tasks.is_empty() => {
            f.states = vec![JobState::Pending, JobState::Running, JobState::Completing];
        }
        None => {}
    }
    Ok(f)
}

/// One field of a format: `%[.][width]X`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    Field {
        right: bool,
        width: Option<usize>,
        code: char,
    },
}

/// Parses a Slurm-style format string.
pub fn parse_format(s: &str) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            text.push(c);
            continue;
        }
        let right = chars.next_if_eq(&'.').is_some();
        let mut width = None;
        while let Some(d) = chars.peek().and_then(|d| d.to_digit(10)) {
            width = Some(width.unwrap_or(0usize) * 10 + d as usize);
            chars.next();
        }
        match chars.next() {
            Some(code) => {
                if !text.is_empty() {
                    out.push(Piece::Text(std::mem::take(&mut text)));
                }
                out.push(Piece::Field { right, width, code });
            }
            None => text.push('%'),
        }
    }
    if !text.is_empty() {
        out.push(Piece::Text(text));
    }
    out
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

fn header(code: char) -> &'static str {
    match code {
        'i' | 'A' | 'F' => "JOBID",
        'K' => "ARRAY_TASK_ID",
        'P' => "PARTITION",
        'j' => "NAME",
        'u' => "USER",
        't' => "ST",
        'T' => "STATE",
        'M' => "TIME",
        'l' => "TIME_LIMIT",
        'D' => "NODES",
        'C' => "CPUS",
        'R' => "NODELIST(REASON)",
        'N' => "NODELIST",
        'r' => "REASON",
        'S' => "START_TIME",
        'V' => "SUBMIT_TIME",
        'Q' => "PRIORITY",
        'b' => "TRES_PER_NODE",
        'k' => "COMMENT",
        _ => "?",
    }
}

/// How long a job has run (or ran): squeue's TIME, scontrol's RunTime.
pub fn run_secs(j: &JobView, now: u64) -> u64 {
    match (j.start_time, j.state) {
        (Some(s), JobState::Running) => now.saturating_sub(s),
        (Some(s), _) => j.end_time.unwrap_or(now).min(now).saturating_sub(s),
        _ => 0,
    }
}

fn field(j: &JobView, code: char, now: u64) -> String {
    let reason = || format!("({})", words::job_reason(j.reason));
    match code {
        'i' => job_id(j),
        'A' => j.id.to_string(),
        'F' => j.array.as_ref().map_or(j.id, |a| a.job).to_string(),
        'K' => match &j.array {
            None => "N/A".into(),
            Some(a) => match a.task {
                Some(t) => t.to_string(),
                None => format_indices(&a.waiting, a.throttle),
            },
        },
        'P' => j.partition.clone(),
        'j' => j.name.clone(),
        'u' => user_name(j.user.uid),
        't' => j.state.code().to_string(),
        'T' => j.state.name().to_string(),
        'M' => elapsed(run_secs(j, now)),
        'l' => limit(j.time_limit, "UNLIMITED"),
        'D' => j.num_nodes.to_string(),
        'C' => j.num_cpus.to_string(),
        'R' => match j.state {
            JobState::Pending => reason(),
            _ if j.nodes.is_empty() => reason(),
            _ => hostlist::compress_sorted(&j.nodes),
        },
        'N' => hostlist::compress_sorted(&j.nodes),
        'r' => words::job_reason(j.reason).to_string(),
        'S' => j
            .start_time
            .or(j.expected_start)
            .map_or("N/A".into(), timestamp),
        'V' => timestamp(j.submit_time),
        'Q' => j.priority.to_string(),
        'b' => {
            if j.gpus == 0 {
                "N/A".into()
            } else {
                format!("gres/gpu:{}", j.gpus / j.num_nodes.max(1))
            }
        }
        'k' => j.comment.clone().unwrap_or_else(|| "(null)".into()),
        other => format!("%{other}"),
    }
}

/// A job's id as squeue writes it: `123`, a task of an array `123_7`, an
/// array's waiting tasks `123_[8-99%4]` (one of them: `123_8`).
pub fn job_id(j: &JobView) -> String {
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

/// Renders jobs with a format; `header` adds the title line.
pub fn render(jobs: &[JobView], format: &str, with_header: bool, now: u64) -> String {
    let pieces = parse_format(format);
    let mut out = String::new();
    let mut line = |get: &dyn Fn(char) -> String| {
        let mut l = String::new();
        for p in &pieces {
            match p {
                Piece::Text(t) => l.push_str(t),
                Piece::Field { right, width, code } => {
                    l.push_str(&fit(&get(*code), *width, *right))
                }
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    if with_header {
        line(&|c| header(c).to_string());
    }
    for j in jobs {
        line(&|c| field(j, c, now));
    }
    out
}

/// Slurm's default order: partition, then state, then priority (highest
/// first), then id.
pub fn sort(jobs: &mut [JobView]) {
    jobs.sort_by(|a, b| {
        let rank = |s: JobState| JobState::ALL.iter().position(|x| *x == s).unwrap_or(0);
        a.partition
            .cmp(&b.partition)
            .then(rank(a.state).cmp(&rank(b.state)))
            .then(b.priority.cmp(&a.priority))
            .then(a.id.cmp(&b.id))
    });
}

pub fn main(args: &[OsString]) -> i32 {
    let a: SqueueArgs = match parse(CMD, args) {
        Ok(a) => a,
        Err(code) => return code,
    };
    let f = match filter(&a) {
        Ok(f) => f,
        Err(e) => return fail(CMD, e),
    };
    let format = match (&a.format, a.start) {
        (Some(f), _) => f.clone(),
        (None, true) => "%.18i %.9P %.8j %.8u %.2t %.19S %.6D %R".to_string(),
        (None, false) => DEFAULT_FORMAT.to_string(),
    };
    block_on(CMD, async move {
        let mut c = match Client::connect().await {
            Ok(c) => c,
            Err(e) => return fail(CMD, e),
        };
        // One job named that the controller does not know at all is an
        // error, as Slurm's (one it knows that the other filters leave
        // out is not): `while squeue -j $id` loops end on it.
        let one = (f.ids.len() == 1 && f.tasks.is_empty()).then(|| f.ids[0]);
        match c.jobs(f).await {
            Ok(jobs) if jobs.is_empty() && one.is_some() => {
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
                    Ok(_) => super::emit(CMD, &render(&[], &format, !a.noheader, now())),
                    Err(e) => fail(CMD, e),
                }
            }
            Ok(jobs) => {
                let mut jobs = if a.array { expand_arrays(jobs) } else { jobs };
                sort(&mut jobs);
                let text = render(&jobs, &format, !a.noheader, now());
                super::emit(CMD, &text)
            }
            Err(e) => fail(CMD, e),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
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
        assert!(f.states.is_empty(), "a job named by id shows in any state");
    }

    #[test]
    fn formats_parse_and_truncate() {
        assert_eq!(
            parse_format("%i|%.5j"),
            vec![
                Piece::Field {
                    right: false,
                    width: None,
                    code: 'i'
                },
                Piece::Text("|".into()),
                Piece::Field {
                    right: true,
                    width: Some(5),
                    code: 'j'
                },
            ]
        );
        assert_eq!(fit("abcdefgh", Some(3), true), "abc");
        assert_eq!(fit("ab", Some(4), false), "ab  ");
    }

    #[test]
    fn default_states_hide_finished_jobs() {
        let a = SqueueArgs::try_parse_from(["squeue"]).unwrap();
        assert_eq!(filter(&a).unwrap().states.len(), 3);
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
}
