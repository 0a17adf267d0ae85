//! Options shared by `sbatch` and `srun` (the resource request), and their
//! translation into a [`JobSpec`].

use std::path::PathBuf;

use clap::Args;
use corral_proto::msg::{
    ArraySpec, Dep, DepCond, GpuAsk, IndexRun, JobId, JobSpec, LimitSignal, SendSignal, SignalTo,
    StepId,
};

use crate::timefmt::parse_job_limit;

/// The resource options of sbatch and srun, spelled as Slurm spells them.
#[derive(Args, Debug, Clone, Default)]
pub struct JobOpts {
    /// Job name.
    #[arg(short = 'J', long = "job-name")]
    pub job_name: Option<String>,
    /// Partition.
    #[arg(short = 'p', long)]
    pub partition: Option<String>,
    /// Number of nodes (N, or MIN-MAX: MIN is used).
    #[arg(short = 'N', long)]
    pub nodes: Option<String>,
    /// Number of tasks.
    #[arg(short = 'n', long)]
    pub ntasks: Option<u32>,
    /// CPUs per task.
    #[arg(short = 'c', long = "cpus-per-task")]
    pub cpus_per_task: Option<u32>,
    /// Tasks per node.
    #[arg(long = "ntasks-per-node")]
    pub ntasks_per_node: Option<u32>,
    /// Task distribution: block, cyclic, arbitrary or plane=N (recorded
    /// in SLURM_DISTRIBUTION; tasks are placed in blocks).
    #[arg(short = 'm', long)]
    pub distribution: Option<String>,
    /// CPUs for each GPU the job's tasks hold (instead of -c).
    #[arg(long = "cpus-per-gpu", conflicts_with = "cpus_per_task")]
    pub cpus_per_gpu: Option<u32>,
    /// Tasks for each GPU (with --gpus, or GPUs for -n's tasks).
    #[arg(long = "ntasks-per-gpu")]
    pub ntasks_per_gpu: Option<u32>,
    /// Memory per node (MB, or with a K/M/G/T suffix; 0: the whole node's).
    #[arg(long, overrides_with_all = ["mem_per_cpu", "mem_per_gpu"])]
    pub mem: Option<String>,
    /// Memory per CPU (as --mem).
    #[arg(long = "mem-per-cpu", overrides_with_all = ["mem", "mem_per_gpu"])]
    pub mem_per_cpu: Option<String>,
    /// Memory per GPU (as --mem).
    #[arg(long = "mem-per-gpu", overrides_with_all = ["mem", "mem_per_cpu"])]
    pub mem_per_gpu: Option<String>,
    /// Generic resources: gpu:N or gpu:TYPE:N.
    #[arg(long)]
    pub gres: Option<String>,
    /// GPUs for the whole job: N or TYPE:N.
    #[arg(short = 'G', long)]
    pub gpus: Option<String>,
    /// GPUs per task.
    #[arg(long = "gpus-per-task")]
    pub gpus_per_task: Option<String>,
    /// GPUs per node.
    #[arg(long = "gpus-per-node")]
    pub gpus_per_node: Option<String>,
    /// Whole nodes only.
    #[arg(long)]
    pub exclusive: bool,
    /// Time limit (minutes, MM:SS, HH:MM:SS, D-HH[:MM[:SS]], UNLIMITED;
    /// rounded up to whole minutes; 0 is no limit).
    #[arg(short = 't', long)]
    pub time: Option<String>,
    /// Working directory.
    #[arg(short = 'D', long)]
    pub chdir: Option<PathBuf>,
    /// Nodes the job must use (hostlist).
    #[arg(short = 'w', long)]
    pub nodelist: Option<String>,
    /// Nodes the job must not use (hostlist).
    #[arg(short = 'x', long)]
    pub exclude: Option<String>,
    /// Environment to pass: ALL (default), NONE, or [ALL,]VAR[=VALUE],...
    #[arg(long)]
    pub export: Option<String>,
    /// Requeue the job when its node fails (a batch job's default, as
    /// Slurm's `JobRequeue=1`).
    #[arg(long, overrides_with = "no_requeue")]
    pub requeue: bool,
    /// Never requeue the job.
    #[arg(long = "no-requeue", overrides_with = "requeue")]
    pub no_requeue: bool,
    /// Submit held.
    #[arg(short = 'H', long)]
    pub hold: bool,
    /// Account (recorded: sacct's Account, SLURM_JOB_ACCOUNT; fair-share
    /// goes by user until accounts exist).
    #[arg(short = 'A', long)]
    pub account: Option<String>,
    /// Start after other jobs: after|afterok|afternotok|afterany:ID[:ID...][,...], or singleton.
    #[arg(short = 'd', long)]
    pub dependency: Option<String>,
    /// Node features: a&b (all), a|b (any one), a,b (all).
    #[arg(short = 'C', long)]
    pub constraint: Option<String>,
    /// Cancel the job when a dependency can never be met: yes or no.
    #[arg(long = "kill-on-invalid-dep")]
    pub kill_on_invalid_dep: Option<String>,
    /// Start no earlier than: now+N[s|m|h|d], HH:MM[:SS], YYYY-MM-DD[THH:MM[:SS]] (UTC).
    #[arg(long)]
    pub begin: Option<String>,
    /// Quality of service.
    #[arg(short = 'q', long)]
    pub qos: Option<String>,
    /// Lower the job's priority by this much.
    #[arg(long, allow_hyphen_values = true)]
    pub nice: Option<i32>,
    /// Signal the job's steps (with B:, only the batch shell) TIME seconds
    /// (default 60) before its time limit: [{R|B}:]SIG[@TIME].
    #[arg(long)]
    pub signal: Option<String>,
    /// A comment kept with the job (sacct's Comment).
    #[arg(long)]
    pub comment: Option<String>,
    /// When to mail: NONE, BEGIN, END, FAIL, REQUEUE, ALL, INVALID_DEPEND,
    /// STAGE_OUT, TIME_LIMIT, TIME_LIMIT_90, TIME_LIMIT_80, TIME_LIMIT_50,
    /// ARRAY_TASKS, comma-separated (recorded with the job).
    #[arg(long = "mail-type")]
    pub mail_type: Option<String>,
    /// Whom to mail (recorded with the job).
    #[arg(long = "mail-user")]
    pub mail_user: Option<String>,
    /// A workload characterization key (Slurm's WCKey; submitit gives
    /// `--wckey=submitit`): recorded (squeue `%w`, sacct WCKey); nothing
    /// is accounted by it, as in a Slurm without TrackWCKey.
    #[arg(long)]
    pub wckey: Option<String>,
    /// Say nothing but errors (sbatch: not even the job id).
    #[arg(short = 'Q', long)]
    pub quiet: bool,
}

/// Parses `-C`: features joined by `&` or `,` (all of them) or by `|`
/// (any one); `true` with `|`. Brackets, counts and a mix of the two
/// joins are refused.
pub fn parse_constraint(s: &str) -> Result<(Vec<String>, bool), String> {
    let bad = |why: &str| format!("Invalid feature specification: {s}: {why}");
    if s.contains(['[', ']', '*', '(', ')']) {
        return Err(bad("brackets and counts are not supported"));
    }
    let any = s.contains('|');
    if any && s.contains(['&', ',']) {
        return Err(bad("& and | do not mix"));
    }
    let features: Vec<String> = s
        .split(['&', ',', '|'])
        .map(|f| f.trim().to_string())
        .collect();
    if features.iter().any(|f| f.is_empty()) {
        return Err(bad("an empty feature"));
    }
    let any = any && features.len() > 1;
    Ok((features, any))
}

/// Parses `--signal=[{R|B}:]SIG[@TIME]` (`R`, reservation overlap, is
/// accepted and has nothing to change here).
pub fn parse_limit_signal(s: &str) -> Result<LimitSignal, String> {
    let bad = || format!("Invalid --signal specification: {s}");
    let (flags, rest) = match s.split_once(':') {
        Some((f, r)) if !f.is_empty() && f.chars().all(|c| matches!(c, 'B' | 'R' | 'b' | 'r')) => {
            (f, r)
        }
        Some(_) => return Err(bad()),
        None => ("", s),
    };
    let (sig, before) = match rest.split_once('@') {
        Some((sig, t)) => (sig, t.parse::<u16>().map_err(|_| bad())?),
        None => (rest, 60),
    };
    let signal = super::scancel::parse_signal(sig).map_err(|_| bad())?;
    let to = if flags.contains(['B', 'b']) {
        SignalTo::Step(StepId::BATCH)
    } else {
        SignalTo::Steps
    };
    Ok(LimitSignal {
        signal: SendSignal { signal, to },
        before: u32::from(before),
    })
}

/// Slurm's `--mail-type` names.
const MAIL_TYPES: [&str; 13] = [
    "NONE",
    "BEGIN",
    "END",
    "FAIL",
    "REQUEUE",
    "ALL",
    "INVALID_DEPEND",
    "STAGE_OUT",
    "TIME_LIMIT",
    "TIME_LIMIT_90",
    "TIME_LIMIT_80",
    "TIME_LIMIT_50",
    "ARRAY_TASKS",
];

/// Checks `--mail-type` (names in any case, comma-separated) and gives
/// it in Slurm's spelling.
pub fn parse_mail_type(s: &str) -> Result<String, String> {
    let mut out = Vec::new();
    for t in s.split(',') {
        let up = t.trim().to_ascii_uppercase();
        match MAIL_TYPES.iter().find(|m| **m == up) {
            Some(m) => out.push(*m),
            None => return Err(format!("--mail-type={s} invalid")),
        }
    }
    Ok(out.join(","))
}

/// An option an input environment variable stands for: the variable, the
/// long flag it gives, and whether that flag is a switch (set by any
/// value) rather than taking the variable's value.
#[derive(Debug)]
pub struct InputVar {
    pub var: &'static str,
    pub flag: &'static str,
    pub switch: bool,
}

pub const fn value(var: &'static str, flag: &'static str) -> InputVar {
    InputVar {
        var,
        flag,
        switch: false,
    }
}

pub const fn switch(var: &'static str, flag: &'static str) -> InputVar {
    InputVar {
        var,
        flag,
        switch: true,
    }
}

/// sbatch's input environment variables (its man page's INPUT
/// ENVIRONMENT VARIABLES, those of options Corral has).
pub const SBATCH_INPUT: &[InputVar] = &[
    value("SBATCH_ACCOUNT", "--account"),
    value("SBATCH_ARRAY_INX", "--array"),
    value("SBATCH_CONSTRAINT", "--constraint"),
    value("SBATCH_CPUS_PER_GPU", "--cpus-per-gpu"),
    switch("SBATCH_EXCLUSIVE", "--exclusive"),
    value("SBATCH_MEM_PER_CPU", "--mem-per-cpu"),
    value("SBATCH_MEM_PER_GPU", "--mem-per-gpu"),
    value("SBATCH_EXPORT", "--export"),
    value("SBATCH_GPUS", "--gpus"),
    value("SBATCH_GPUS_PER_NODE", "--gpus-per-node"),
    value("SBATCH_GPUS_PER_TASK", "--gpus-per-task"),
    value("SBATCH_GRES", "--gres"),
    value("SBATCH_JOB_NAME", "--job-name"),
    value("SBATCH_MEM_PER_NODE", "--mem"),
    switch("SBATCH_NO_REQUEUE", "--no-requeue"),
    value("SBATCH_PARTITION", "--partition"),
    value("SBATCH_QOS", "--qos"),
    switch("SBATCH_REQUEUE", "--requeue"),
    value("SBATCH_TIMELIMIT", "--time"),
    value("SBATCH_WCKEY", "--wckey"),
];

/// srun's: only those that name the request, not the `SLURM_*` shape a
/// job's own environment carries (`SLURM_NTASKS` inside a batch job is
/// the job's, and would silently become every step's).
pub const SRUN_INPUT: &[InputVar] = &[
    value("SLURM_ACCOUNT", "--account"),
    switch("SLURM_EXCLUSIVE", "--exclusive"),
    value("SLURM_EXPORT_ENV", "--export"),
    value("SLURM_PARTITION", "--partition"),
    value("SLURM_QOS", "--qos"),
    value("SLURM_TIMELIMIT", "--time"),
    value("SLURM_WCKEY", "--wckey"),
];

/// The options the environment gives, as flags to put between a
/// script's directives and the command line (later flags win: the
/// command line over the environment over `#SBATCH`). An empty variable
/// counts as unset.
pub fn input_options(
    table: &[InputVar],
    lookup: impl Fn(&str) -> Option<String>,
) -> Vec<std::ffi::OsString> {
    let mut out = Vec::new();
    for v in table {
        match lookup(v.var) {
            Some(val) if !val.is_empty() => out.push(if v.switch {
                v.flag.into()
            } else {
                format!("{}={val}", v.flag).into()
            }),
            _ => {}
        }
    }
    out
}

/// The most tasks one `--array` may name (Slurm's largest `MaxArraySize`
/// is 4,000,001; the controller holds its own, smaller, limit).
pub const MAX_ARRAY_TASKS: u64 = 4_000_001;

/// Parses `--array`: indices `N`, ranges `A-B`, stepped ranges `A-B:S`,
/// joined by `,`, then `%N` for how many may run at once. Runs are put
/// in order; overlapping ones are refused.
pub fn parse_array(s: &str) -> Result<ArraySpec, String> {
    let bad = || format!("Invalid job array specification: {s}");
    let (list, throttle) = match s.split_once('%') {
        Some((l, t)) => (l, t.parse::<u32>().map_err(|_| bad())?),
        None => (s, 0),
    };
    let num = |t: &str| t.trim().parse::<u32>().map_err(|_| bad());
    let mut runs = Vec::new();
    let mut total = 0u64;
    for part in list.split(',') {
        let (range, step) = match part.split_once(':') {
            Some((r, st)) => (r, num(st)?),
            None => (part, 1),
        };
        let (first, last) = match range.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None if !part.contains(':') => (num(range)?, num(range)?),
            None => return Err(bad()),
        };
        if step == 0 || last < first {
            return Err(bad());
        }
        let count = (last - first) / step + 1;
        total += u64::from(count);
        if total > MAX_ARRAY_TASKS {
            return Err(format!("{}: too many tasks", bad()));
        }
        runs.push(IndexRun { first, count, step });
    }
    runs.sort_by_key(|r| r.first);
    for w in runs.windows(2) {
        let last = w[0].first + (w[0].count - 1) * w[0].step;
        if w[1].first <= last {
            return Err(format!("{}: indices overlap", bad()));
        }
    }
    Ok(ArraySpec { runs, throttle })
}

/// Jobs by id, and tasks of arrays by array and index.
pub type JobList = (Vec<JobId>, Vec<(JobId, u32)>);

/// Parses a list of job ids as scancel and squeue take them: `123`,
/// `123_7` (one task of an array), `123_[1-3,5]` (some of them).
pub fn parse_job_list(s: &str) -> Result<JobList, String> {
    let bad = |p: &str| format!("Invalid job id specified: {p}");
    let (mut ids, mut tasks) = (Vec::new(), Vec::new());
    // Commas inside brackets belong to the task list.
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    for p in parts.into_iter().map(str::trim).filter(|p| !p.is_empty()) {
        let job = |t: &str| t.parse::<u64>().map(JobId).map_err(|_| bad(p));
        match p.split_once('_') {
            None => ids.push(job(p)?),
            Some((j, t)) => {
                let j = job(j)?;
                let list = t.strip_prefix('[').and_then(|t| t.strip_suffix(']'));
                match list {
                    Some(l) => {
                        let spec = parse_array(l).map_err(|_| bad(p))?;
                        if spec.throttle > 0 || u64::from(spec.len()) > MAX_FILTER_TASKS {
                            return Err(bad(p));
                        }
                        for r in &spec.runs {
                            for k in 0..r.count {
                                tasks.push((j, r.first + k * r.step));
                            }
                        }
                    }
                    None => tasks.push((j, t.parse::<u32>().map_err(|_| bad(p))?)),
                }
            }
        }
    }
    Ok((ids, tasks))
}

/// The most tasks one bracketed list of a job list names.
const MAX_FILTER_TASKS: u64 = 100_000;

/// Parses `--dependency`: conditions joined by `,` (all must hold) or by
/// `?` (any one suffices; the two do not mix); `true` with `?`.
pub fn parse_dependency(s: &str) -> Result<(Vec<Dep>, bool), String> {
    let bad = || format!("Job dependency problem: invalid specification {s}");
    let any = s.contains('?');
    if any && s.contains(',') {
        return Err(format!(
            "Job dependency problem: `,` (all of) and `?` (any of) do not mix: {s}"
        ));
    }
    let mut out = Vec::new();
    for cond in s.split([',', '?']).filter(|c| !c.is_empty()) {
        if cond == "singleton" {
            out.push(Dep::Singleton);
            continue;
        }
        let mut parts = cond.split(':');
        let kind = parts.next().ok_or_else(bad)?;
        let (make, cond): (fn(JobId) -> Dep, DepCond) = match kind {
            "after" => (Dep::After, DepCond::After),
            "afterok" => (Dep::AfterOk, DepCond::AfterOk),
            "afternotok" => (Dep::AfterNotOk, DepCond::AfterNotOk),
            "afterany" => (Dep::AfterAny, DepCond::AfterAny),
            _ => return Err(bad()),
        };
        let mut any = false;
        for id in parts {
            // `123_7`: one task of an array.
            out.push(match id.split_once('_') {
                Some((j, t)) => Dep::Task {
                    cond,
                    job: JobId(j.parse::<u64>().map_err(|_| bad())?),
                    task: t.parse::<u32>().map_err(|_| bad())?,
                },
                None => make(JobId(id.parse::<u64>().map_err(|_| bad())?)),
            });
            any = true;
        }
        if !any {
            return Err(bad());
        }
    }
    Ok((out, any))
}

fn count(what: &str, s: &str) -> Result<u32, String> {
    // gpu:N, gpu:TYPE:N, TYPE:N or N.
    let n = s.rsplit(':').next().unwrap_or(s);
    gpu_count(n).ok_or_else(|| format!("invalid {what} specification: {s}"))
}

pub use crate::ctld::MAX_GPUS;

/// A GPU count: digits only, at most [`MAX_GPUS`].
fn gpu_count(n: &str) -> Option<u32> {
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse::<u32>().ok().filter(|&g| g <= MAX_GPUS)
}

/// The GPU model a `--gres` or `--gpus*` value names, if any:
/// `gpu:TYPE:N`, `gpu:TYPE` (a word, not a count), or for `--gpus*`
/// `TYPE:N`. One model per job.
pub fn gpu_type(s: &str, gres: bool) -> Result<Option<String>, String> {
    let mut found: Option<String> = None;
    for item in s.split(',').filter(|i| !i.is_empty() && *i != "none") {
        let parts: Vec<&str> = item.split(':').collect();
        let t = match (gres, parts.as_slice()) {
            (true, ["gpu", t, _]) => Some(*t),
            (true, ["gpu", t]) if t.starts_with(|c: char| c.is_ascii_alphabetic()) => Some(*t),
            (false, ["gpu", t, _]) | (false, [t, _]) if *t != "gpu" => Some(*t),
            _ => None,
        };
        if let Some(t) = t {
            if found.as_deref().is_some_and(|f| f != t) {
                return Err(format!(
                    "Invalid generic resource (gres) specification: {s}: one GPU type per job"
                ));
            }
            found = Some(t.to_string());
        }
    }
    Ok(found)
}

/// `--gres=gpu[:TYPE][:N][,...]`: the GPUs per node.
pub fn parse_gres(s: &str) -> Result<u32, String> {
    let mut gpus: u32 = 0;
    for item in s.split(',') {
        if item == "none" || item.is_empty() {
            continue;
        }
        let mut parts = item.split(':');
        let bad = || format!("Invalid generic resource (gres) specification: {item}");
        if parts.next() != Some("gpu") {
            return Err(bad());
        }
        let rest: Vec<&str> = parts.collect();
        let n = match rest.as_slice() {
            [] => 1,
            // gpu:N, or gpu:TYPE meaning one of that type. A type name
            // starts with a letter: `gpu:-1` is a bad count, not a type.
            [n] if n.starts_with(|c: char| c.is_ascii_alphabetic()) => 1,
            [n] | [_, n] => gpu_count(n).ok_or_else(bad)?,
            _ => return Err(bad()),
        };
        gpus = gpus
            .checked_add(n)
            .filter(|&g| g <= MAX_GPUS)
            .ok_or_else(bad)?;
    }
    Ok(gpus)
}

/// `--mem`: megabytes, with an optional K, M, G or T suffix.
pub fn parse_mem(s: &str) -> Result<Option<u64>, String> {
    let bad = || format!("invalid memory constraint: {s}");
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let mult = match c.to_ascii_uppercase() {
                'K' => 1.0 / 1024.0,
                'M' => 1.0,
                'G' => 1024.0,
                'T' => 1024.0 * 1024.0,
                _ => return Err(bad()),
            };
            (&s[..i], mult)
        }
        _ => (s, 1.0),
    };
    let n: f64 = num.parse().map_err(|_| bad())?;
    if !n.is_finite() || n < 0.0 {
        return Err(bad());
    }
    let mb = (n * mult).ceil() as u64;
    Ok((mb > 0).then_some(mb))
}

/// The environment to send, as `--export` says.
/// The submitter's file mode mask, as Slurm passes it (`0022`).
pub fn umask_text() -> String {
    use nix::sys::stat::{umask, Mode};
    let old = umask(Mode::from_bits_truncate(0o077));
    umask(old);
    format!("{:04o}", old.bits())
}

/// The submitting process's nice value. (Read from `/proc/self/stat`
/// before: the kernel gathers the whole line of statistics for that, 3%
/// of a one-shot `sbatch`'s samples in `perf record`.)
pub fn nice_value() -> Option<i32> {
    use nix::errno::Errno;
    use nix::libc;
    Errno::clear();
    // SAFETY: getpriority takes no pointers; it reads this process's
    // own scheduling priority.
    #[allow(unsafe_code)]
    let n = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    // -1 is a nice value too: only errno tells a failure.
    (n != -1 || Errno::last_raw() == 0).then_some(n)
}

impl JobOpts {
    /// The job's environment: what `--export` passes, and what Slurm adds
    /// of the submitter (`SLURM_UMASK`, `SLURM_PRIO_PROCESS`, and
    /// `SLURM_DISTRIBUTION` with `-m`).
    pub fn job_env(&self) -> Result<Vec<(String, String)>, String> {
        let mut env = exported_env(self.export.as_deref())?;
        let mut set = |k: &str, v: String| {
            env.retain(|(key, _)| key != k);
            env.push((k.to_string(), v));
        };
        set("SLURM_UMASK", umask_text());
        if let Some(n) = nice_value() {
            set("SLURM_PRIO_PROCESS", n.to_string());
        }
        if let Some(d) = &self.distribution {
            let kind = d.split([':', ',']).next().unwrap_or_default();
            let plane = kind
                .strip_prefix("plane=")
                .is_some_and(|n| n.parse::<u32>().is_ok_and(|n| n > 0));
            if !(plane || ["block", "cyclic", "arbitrary", "*"].contains(&kind)) {
                return Err(format!("Invalid --distribution specification: {d}"));
            }
            set("SLURM_DISTRIBUTION", d.clone());
        }
        Ok(env)
    }
}

pub fn exported_env(export: Option<&str>) -> Result<Vec<(String, String)>, String> {
    let spec = export.unwrap_or("ALL");
    let mut all = false;
    let mut env = Vec::new();
    for item in spec.split(',').filter(|s| !s.is_empty()) {
        match item {
            "ALL" => all = true,
            "NONE" => {}
            _ => match item.split_once('=') {
                Some((k, v)) => env.push((k.to_string(), v.to_string())),
                None => {
                    if let Ok(v) = std::env::var(item) {
                        env.push((item.to_string(), v));
                    }
                }
            },
        }
    }
    if all {
        let explicit: Vec<String> = env.iter().map(|(k, _)| k.clone()).collect();
        for (k, v) in std::env::vars() {
            if !explicit.contains(&k) {
                env.push((k, v));
            }
        }
    } else {
        // Slurm still passes its own variables.
        for (k, v) in std::env::vars() {
            if k.starts_with("SLURM_") && !env.iter().any(|(e, _)| *e == k) {
                env.push((k, v));
            }
        }
    }
    Ok(env)
}

fn list(s: &Option<String>) -> Result<Vec<String>, String> {
    match s {
        None => Ok(Vec::new()),
        Some(s) => {
            scheduler_core::hostlist::expand(s).map_err(|e| format!("invalid node list {s}: {e}"))
        }
    }
}

impl JobOpts {
    /// The request part of a [`JobSpec`] (name, kind and directory are
    /// the command's to fill in).
    pub fn to_spec(&self) -> Result<JobSpec, String> {
        let nodes = match &self.nodes {
            None => None,
            Some(s) => {
                let min = s.split('-').next().unwrap_or(s);
                Some(
                    min.parse::<u32>()
                        .map_err(|_| format!("invalid node count `{s}`"))?,
                )
            }
        };
        let mut gpus = GpuAsk::None;
        let mut gpu_model = None;
        if let Some(g) = &self.gres {
            let n = parse_gres(g)?;
            if n > 0 {
                gpus = GpuAsk::PerNode(n);
                gpu_model = gpu_type(g, true)?;
            }
        }
        if let Some(g) = &self.gpus_per_node {
            gpus = GpuAsk::PerNode(count("--gpus-per-node", g)?);
            gpu_model = gpu_type(g, false)?;
        }
        if let Some(g) = &self.gpus {
            gpus = GpuAsk::Total(count("--gpus", g)?);
            gpu_model = gpu_type(g, false)?;
        }
        if let Some(g) = &self.gpus_per_task {
            gpus = GpuAsk::PerTask(count("--gpus-per-task", g)?);
            gpu_model = gpu_type(g, false)?;
        }
        if matches!(
            gpus,
            GpuAsk::PerNode(0) | GpuAsk::Total(0) | GpuAsk::PerTask(0)
        ) {
            gpus = GpuAsk::None;
        }
        let (constraint, constraint_any) = match &self.constraint {
            Some(c) => parse_constraint(c)?,
            None => (Vec::new(), false),
        };
        let (dependencies, dependency_any) = match &self.dependency {
            Some(d) => parse_dependency(d)?,
            None => (Vec::new(), false),
        };
        let time_limit = match &self.time {
            Some(t) => parse_job_limit(t)?,
            None => None,
        };
        let mem_mb = match &self.mem {
            Some(m) => parse_mem(m)?,
            None => None,
        };
        // `--mem=0` (the one value parse_mem gives no size for).
        let mem_whole = self.mem.is_some() && mem_mb.is_none();
        let mem_per_cpu_mb = self
            .mem_per_cpu
            .as_deref()
            .map(parse_mem)
            .transpose()?
            .flatten();
        let mem_per_gpu_mb = self
            .mem_per_gpu
            .as_deref()
            .map(parse_mem)
            .transpose()?
            .flatten();
        if self.ntasks == Some(0)
            || self.cpus_per_task == Some(0)
            || nodes == Some(0)
            || self.cpus_per_gpu == Some(0)
            || self.ntasks_per_gpu == Some(0)
        {
            return Err("invalid count: node, task and CPU counts must be positive".into());
        }
        let (mut ntasks, mut ntasks_per_node) = (self.ntasks, self.ntasks_per_node);
        // --ntasks-per-gpu: tasks from the GPUs asked for, or GPUs for the
        // tasks asked for.
        if let Some(k) = self.ntasks_per_gpu {
            let too_many = || "invalid --ntasks-per-gpu: too many tasks".to_string();
            match gpus {
                GpuAsk::Total(g) => ntasks = Some(g.checked_mul(k).ok_or_else(too_many)?),
                GpuAsk::PerNode(g) => {
                    ntasks_per_node = Some(g.checked_mul(k).ok_or_else(too_many)?)
                }
                GpuAsk::PerTask(_) => {
                    return Err("--ntasks-per-gpu and --gpus-per-task do not mix".into())
                }
                GpuAsk::None => match self.ntasks {
                    Some(n) => gpus = GpuAsk::Total(n.div_ceil(k)),
                    None => return Err("--ntasks-per-gpu needs --gpus or --ntasks".into()),
                },
            }
        }
        // --cpus-per-gpu: each task's CPUs from the GPUs it holds.
        let mut cpus_per_task = self.cpus_per_task;
        if let Some(c) = self.cpus_per_gpu {
            let per_node_tasks = ntasks_per_node.unwrap_or(1);
            let (gpus_each, tasks_each) = match gpus {
                GpuAsk::PerTask(g) => (g, 1),
                GpuAsk::PerNode(g) => (g, per_node_tasks),
                GpuAsk::Total(g) => (g, ntasks.unwrap_or(nodes.unwrap_or(1))),
                GpuAsk::None => return Err("--cpus-per-gpu needs GPUs".into()),
            };
            let cpus = c
                .checked_mul(gpus_each)
                .ok_or("invalid --cpus-per-gpu: too many CPUs")?;
            cpus_per_task = Some(cpus.div_ceil(tasks_each.max(1)).max(1));
        }
        Ok(JobSpec {
            array: None,
            gpu_type: gpu_model.filter(|_| gpus != GpuAsk::None),
            name: self.job_name.clone().unwrap_or_default(),
            partition: self.partition.clone(),
            nodes,
            ntasks,
            ntasks_per_node,
            cpus_per_task,
            mem_mb,
            mem_whole,
            mem_per_cpu_mb,
            mem_per_gpu_mb,
            gpus,
            exclusive: self.exclusive,
            time_limit,
            nodelist: list(&self.nodelist)?,
            exclude: list(&self.exclude)?,
            // Requeueable unless told not to; srun's own allocations are
            // never requeued (there is no one to rerun their command for).
            requeue: !self.no_requeue,
            hold: self.hold,
            dependencies,
            dependency_any,
            kill_on_invalid_dep: match self.kill_on_invalid_dep.as_deref() {
                None | Some("no") => false,
                Some("yes") => true,
                Some(other) => {
                    return Err(format!(
                        "Invalid --kill-on-invalid-dep specification: {other}"
                    ))
                }
            },
            begin: match &self.begin {
                Some(b) => Some(crate::timefmt::parse_begin(
                    b,
                    corral_proto::now_ms() / 1000,
                )?),
                None => None,
            },
            qos: self.qos.clone(),
            account: self.account.clone(),
            constraint,
            constraint_any,
            limit_signal: self.signal.as_deref().map(parse_limit_signal).transpose()?,
            submit_dir: std::env::current_dir()
                .ok()
                .map(|d| d.to_string_lossy().into_owned()),
            submit_host: nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok()),
            open_append: false,
            script_path: None,
            comment: self.comment.clone(),
            mail_type: self.mail_type.as_deref().map(parse_mail_type).transpose()?,
            mail_user: self.mail_user.clone(),
            wckey: self.wckey.clone(),
            nice: self.nice.unwrap_or(0),
            work_dir: String::new(),
            env: self.job_env()?,
            kind: Default::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The nice value is the kernel's (as `/proc/thread-self/stat` shows
    /// it), raised step by step in a thread of its own.
    #[test]
    fn nice_value_is_the_kernels() {
        std::thread::spawn(|| {
            let stat = || -> i32 {
                let s = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
                let (_, rest) = s.rsplit_once(") ").unwrap();
                rest.split_whitespace().nth(16).unwrap().parse().unwrap()
            };
            assert_eq!(nice_value(), Some(stat()));
            for v in [2, 7, 19] {
                // SAFETY: no pointers; on Linux it sets this thread's
                // nice value only.
                #[allow(unsafe_code)]
                let r = unsafe { nix::libc::setpriority(nix::libc::PRIO_PROCESS, 0, v) };
                assert_eq!(r, 0);
                assert_eq!(nice_value(), Some(v));
                assert_eq!(stat(), v);
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn gres_forms() {
        assert_eq!(parse_gres("gpu:2"), Ok(2));
        assert_eq!(parse_gres("gpu"), Ok(1));
        assert_eq!(parse_gres("gpu:h200:4"), Ok(4));
        assert_eq!(parse_gres("gpu:h200"), Ok(1));
        assert!(parse_gres("fpga:1").is_err());
        assert!(parse_gres("gpu:a:b").is_err());
        // Negative and wrapping counts are refused, not read as 1 or 0.
        assert!(parse_gres("gpu:-1").is_err());
        assert!(parse_gres("gpu:h200:-1").is_err());
        assert!(parse_gres("gpu:2147483648,gpu:2147483648").is_err());
        assert!(parse_gres("gpu:4294967295,gpu:1").is_err());
        assert_eq!(parse_gres("gpu:1,gpu:2"), Ok(3));
        assert_eq!(gpu_type("gpu:h200:4", true), Ok(Some("h200".into())));
        assert_eq!(gpu_type("gpu:h200", true), Ok(Some("h200".into())));
        assert_eq!(gpu_type("gpu:4", true), Ok(None));
        assert_eq!(gpu_type("h200:4", false), Ok(Some("h200".into())));
        assert_eq!(gpu_type("gpu:a100:1", false), Ok(Some("a100".into())));
        assert_eq!(gpu_type("4", false), Ok(None));
        assert!(gpu_type("gpu:a100:1,gpu:h200:1", true).is_err());
    }

    #[test]
    fn mem_units() {
        assert_eq!(parse_mem("100"), Ok(Some(100)));
        assert_eq!(parse_mem("2G"), Ok(Some(2048)));
        assert_eq!(parse_mem("512k"), Ok(Some(1)));
        assert_eq!(parse_mem("0"), Ok(None));
        assert!(parse_mem("lots").is_err());
        assert!(parse_mem("-1").is_err());
    }

    #[test]
    fn export_none_keeps_only_named_and_slurm() {
        let env = exported_env(Some("NONE,FOO=bar")).unwrap();
        assert!(env.contains(&("FOO".into(), "bar".into())));
        assert!(!env.iter().any(|(k, _)| k == "PATH"));
        let env = exported_env(None).unwrap();
        assert!(env.iter().any(|(k, _)| k == "PATH"));
    }

    proptest::proptest! {
        /// Every spelling of every signal, with and without flags and a
        /// time, parses back to what it says; any text parses or is
        /// refused, never panics.
        #[test]
        fn limit_signals_round_trip(
            sig in 1i32..32,
            named in proptest::bool::ANY,
            prefix in proptest::bool::ANY,
            flags in proptest::option::of("[RB]{1,2}"),
            before in proptest::option::of(0u16..=u16::MAX),
        ) {
            let Ok(s) = nix::sys::signal::Signal::try_from(sig) else {
                return Ok(());
            };
            let name = match (named, prefix) {
                (true, true) => s.as_str().to_string(),
                (true, false) => s.as_str().trim_start_matches("SIG").to_string(),
                (false, _) => sig.to_string(),
            };
            let mut text = String::new();
            if let Some(f) = &flags {
                text.push_str(f);
                text.push(':');
            }
            text.push_str(&name);
            if let Some(b) = before {
                text.push_str(&format!("@{b}"));
            }
            let to = if flags.as_deref().is_some_and(|f| f.contains('B')) {
                SignalTo::Step(StepId::BATCH)
            } else {
                SignalTo::Steps
            };
            let want = LimitSignal {
                signal: SendSignal { signal: sig, to },
                before: u32::from(before.unwrap_or(60)),
            };
            proptest::prop_assert_eq!(parse_limit_signal(&text), Ok(want));
        }

        #[test]
        fn any_signal_text_parses_or_is_refused(text in "\\PC{0,24}") {
            let _ = parse_limit_signal(&text);
        }
    }

    #[test]
    fn limit_signals_parse_in_slurms_forms() {
        let p = |s| parse_limit_signal(s).map(|l| (l.signal.signal, l.signal.to, l.before));
        let steps = SignalTo::Steps;
        let batch = SignalTo::Step(StepId::BATCH);
        assert_eq!(p("SIGUSR1@90"), Ok((10, steps, 90)));
        assert_eq!(p("USR1"), Ok((10, steps, 60)));
        assert_eq!(p("10@0"), Ok((10, steps, 0)));
        assert_eq!(p("B:USR2@30"), Ok((12, batch, 30)));
        assert_eq!(p("R:TERM@5"), Ok((15, steps, 5)));
        assert_eq!(p("RB:sigterm"), Ok((15, batch, 60)));
        for bad in [
            "",
            "X:USR1",
            ":USR1",
            "USR1@",
            "USR1@-1",
            "USR1@65536",
            "NOPE@5",
            "999",
        ] {
            assert!(p(bad).is_err(), "{bad}");
        }
    }

    proptest::proptest! {
        /// Any list of conditions, joined by `,` or by `?`, parses back to
        /// itself; any text parses or is refused.
        #[test]
        fn dependencies_round_trip(
            conds in proptest::collection::vec((0u8..5, 1u64..1_000_000), 1..6),
            any in proptest::bool::ANY,
        ) {
            let deps: Vec<Dep> = conds
                .iter()
                .map(|&(k, id)| match k {
                    0 => Dep::After(JobId(id)),
                    1 => Dep::AfterOk(JobId(id)),
                    2 => Dep::AfterNotOk(JobId(id)),
                    3 => Dep::AfterAny(JobId(id)),
                    _ => Dep::Singleton,
                })
                .collect();
            let text: Vec<String> = deps
                .iter()
                .map(|d| match d {
                    Dep::After(j) => format!("after:{}", j.0),
                    Dep::AfterOk(j) => format!("afterok:{}", j.0),
                    Dep::AfterNotOk(j) => format!("afternotok:{}", j.0),
                    Dep::AfterAny(j) => format!("afterany:{}", j.0),
                    Dep::Singleton => "singleton".to_string(),
                    Dep::Task { .. } => unreachable!("not generated"),
                })
                .collect();
            let joined = text.join(if any { "?" } else { "," });
            let any = any && deps.len() > 1;
            proptest::prop_assert_eq!(parse_dependency(&joined), Ok((deps, any)));
        }

        #[test]
        fn any_dependency_text_parses_or_is_refused(text in "\\PC{0,32}") {
            let _ = parse_dependency(&text);
        }

        /// A job list written from ids and tasks reads back as them;
        /// any text parses or is refused.
        #[test]
        fn job_lists_round_trip(
            ids in proptest::collection::vec(0u64..1_000_000, 0..5),
            tasks in proptest::collection::vec((0u64..1_000_000, 0u32..100_000), 0..5),
            junk in "[0-9_,\\[\\]-]{0,24}",
        ) {
            let mut text: Vec<String> = ids.iter().map(u64::to_string).collect();
            text.extend(tasks.iter().map(|(j, t)| format!("{j}_{t}")));
            let (got_ids, got_tasks) = parse_job_list(&text.join(",")).unwrap();
            let want_ids: Vec<JobId> = ids.iter().map(|&i| JobId(i)).collect();
            let want_tasks: Vec<(JobId, u32)> = tasks.iter().map(|&(j, t)| (JobId(j), t)).collect();
            proptest::prop_assert_eq!(got_ids, want_ids);
            proptest::prop_assert_eq!(got_tasks, want_tasks);
            let _ = parse_job_list(&junk);
        }

        /// Whatever `--array` text comes, it parses or is refused; what
        /// parses names ascending, disjoint indices whose positions and
        /// indices map both ways.
        #[test]
        fn array_specs_parse_to_ordered_runs(text in "[0-9,:%-]{0,24}") {
            if let Ok(a) = parse_array(&text) {
                let n = a.len();
                proptest::prop_assert!(n > 0);
                let mut prev = None;
                for p in 0..n.min(1000) {
                    let i = a.index(p).unwrap();
                    proptest::prop_assert!(prev.is_none_or(|q| q < i));
                    proptest::prop_assert_eq!(a.position(i), Some(p));
                    prev = Some(i);
                }
            }
        }
    }

    proptest::proptest! {
        /// Indices written as Slurm's `--array` takes them (single ones,
        /// ranges, stepped ranges, in any order, with or without `%N`)
        /// parse to exactly those indices, ascending, and that throttle.
        #[test]
        fn array_specs_round_trip(
            runs in proptest::collection::vec((0u32..50, 1u32..20, 1u32..5), 1..6),
            throttle in proptest::option::of(1u32..100),
            reversed in proptest::bool::ANY,
        ) {
            let mut next = 0u32;
            let mut parts = Vec::new();
            let mut want = Vec::new();
            for (gap, count, step) in runs {
                let first = next + gap;
                let last = first + (count - 1) * step;
                want.extend((0..count).map(|k| first + k * step));
                parts.push(match (count, step) {
                    (1, _) => first.to_string(),
                    (_, 1) => format!("{first}-{last}"),
                    _ => format!("{first}-{last}:{step}"),
                });
                next = last + 1;
            }
            if reversed {
                parts.reverse();
            }
            let mut text = parts.join(",");
            if let Some(t) = throttle {
                text.push_str(&format!("%{t}"));
            }
            let a = parse_array(&text).unwrap();
            let got: Vec<u32> = (0..a.len()).map(|p| a.index(p).unwrap()).collect();
            proptest::prop_assert_eq!(got, want);
            proptest::prop_assert_eq!(a.throttle, throttle.unwrap_or(0));
        }
    }

    #[test]
    fn array_specs_as_slurm_writes_them() {
        let a = parse_array("0-15:4").unwrap();
        assert_eq!((a.len(), a.min(), a.max(), a.step()), (4, 0, 12, 4));
        assert_eq!(a.index(3), Some(12));
        assert_eq!(a.position(8), Some(2));
        assert_eq!(a.position(9), None);
        let a = parse_array("7,1,3,5-9%2").unwrap_err();
        assert!(a.contains("overlap"), "{a}");
        let a = parse_array("9,1,3,5-7%2").unwrap();
        assert_eq!(a.throttle, 2);
        assert_eq!((a.len(), a.min(), a.max(), a.step()), (6, 1, 9, 1));
        assert_eq!(
            corral_proto::msg::format_indices(&a.runs, a.throttle),
            "1,3,5-7,9%2"
        );
        assert_eq!(corral_proto::msg::format_indices(&a.slice(2, 5), 0), "5-7");
        for bad in ["", "5-1", "1-9:0", "a", "1-", "3%x", "1:2"] {
            assert!(parse_array(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn job_lists_name_jobs_tasks_and_sets_of_tasks() {
        let (ids, tasks) = parse_job_list("12,13_7,14_[1-3,9]").unwrap();
        assert_eq!(ids, [JobId(12)]);
        assert_eq!(
            tasks,
            [
                (JobId(13), 7),
                (JobId(14), 1),
                (JobId(14), 2),
                (JobId(14), 3),
                (JobId(14), 9)
            ]
        );
        for bad in ["x", "1_x", "1_[2", "1_[0-9999999]"] {
            assert!(parse_job_list(bad).is_err(), "{bad}");
        }
        let (deps, _) = parse_dependency("afterok:4_2:5").unwrap();
        assert_eq!(
            deps,
            [
                Dep::Task {
                    cond: DepCond::AfterOk,
                    job: JobId(4),
                    task: 2
                },
                Dep::AfterOk(JobId(5))
            ]
        );
    }

    #[test]
    fn cpus_per_gpu_and_ntasks_per_gpu_become_the_shape() {
        #[derive(clap::Parser)]
        struct T {
            #[command(flatten)]
            job: JobOpts,
        }
        let spec = |args: &[&str]| {
            let mut argv = vec!["t"];
            argv.extend_from_slice(args);
            <T as clap::Parser>::try_parse_from(argv)
                .map_err(|e| e.to_string())?
                .job
                .to_spec()
        };
        let s = spec(&["--gpus-per-node=4", "--cpus-per-gpu=6"]).unwrap();
        assert_eq!((s.cpus_per_task, s.gpus), (Some(24), GpuAsk::PerNode(4)));
        let s = spec(&[
            "--gpus-per-node=4",
            "--ntasks-per-node=4",
            "--cpus-per-gpu=6",
        ])
        .unwrap();
        assert_eq!(s.cpus_per_task, Some(6));
        let s = spec(&["--gpus-per-task=2", "--cpus-per-gpu=3", "-n", "4"]).unwrap();
        assert_eq!(s.cpus_per_task, Some(6));
        let s = spec(&["--gpus=8", "--ntasks-per-gpu=2", "--cpus-per-gpu=4"]).unwrap();
        assert_eq!((s.ntasks, s.cpus_per_task), (Some(16), Some(2)));
        let s = spec(&["-n", "5", "--ntasks-per-gpu=2"]).unwrap();
        assert_eq!(s.gpus, GpuAsk::Total(3));
        let s = spec(&["--gres=gpu:2", "--ntasks-per-gpu=1"]).unwrap();
        assert_eq!(s.ntasks_per_node, Some(2));
        for bad in [
            &["--cpus-per-gpu=2"][..],
            &["--cpus-per-gpu=2", "-c", "2", "--gpus=1"],
            &["--ntasks-per-gpu=2"],
            &["--gpus-per-task=1", "--ntasks-per-gpu=2", "-n", "2"],
            &["--gpus=1", "--cpus-per-gpu=0"],
        ] {
            assert!(spec(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn memory_per_node_per_cpu_per_gpu_and_whole() {
        #[derive(clap::Parser)]
        struct T {
            #[command(flatten)]
            job: JobOpts,
        }
        let spec = |args: &[&str]| {
            let mut argv = vec!["t"];
            argv.extend_from_slice(args);
            <T as clap::Parser>::try_parse_from(argv)
                .unwrap()
                .job
                .to_spec()
                .unwrap()
        };
        let s = spec(&["--mem=0"]);
        assert!(s.mem_whole && s.mem_mb.is_none());
        let s = spec(&["--mem-per-cpu=2G"]);
        assert_eq!(
            (s.mem_per_cpu_mb, s.mem_mb, s.mem_whole),
            (Some(2048), None, false)
        );
        let s = spec(&["--mem=4G", "--mem-per-gpu=10G"]);
        assert_eq!(
            (s.mem_mb, s.mem_per_gpu_mb),
            (None, Some(10240)),
            "the last wins"
        );
        let s = spec(&["--mem-per-cpu=1G", "--mem=4G"]);
        assert_eq!((s.mem_mb, s.mem_per_cpu_mb), (Some(4096), None));
    }

    #[test]
    fn constraints_parse() {
        let v = |fs: &[&str]| fs.iter().map(|f| f.to_string()).collect::<Vec<_>>();
        assert_eq!(parse_constraint("a100"), Ok((v(&["a100"]), false)));
        assert_eq!(
            parse_constraint("a100|h200"),
            Ok((v(&["a100", "h200"]), true))
        );
        assert_eq!(parse_constraint("ib&a100"), Ok((v(&["ib", "a100"]), false)));
        assert_eq!(parse_constraint("ib,a100"), Ok((v(&["ib", "a100"]), false)));
        for bad in ["", "a|", "a&b|c", "[a|b]", "a*2", "a,,b"] {
            assert!(parse_constraint(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn dependencies_parse() {
        assert_eq!(
            parse_dependency("afterok:3:4,afterany:5"),
            Ok((
                vec![
                    Dep::AfterOk(JobId(3)),
                    Dep::AfterOk(JobId(4)),
                    Dep::AfterAny(JobId(5))
                ],
                false
            ))
        );
        assert_eq!(
            parse_dependency("afterok:3?afternotok:4"),
            Ok((
                vec![Dep::AfterOk(JobId(3)), Dep::AfterNotOk(JobId(4))],
                true
            ))
        );
        assert_eq!(
            parse_dependency("singleton"),
            Ok((vec![Dep::Singleton], false))
        );
        for bad in [
            "afterok",
            "afterok:x",
            "before:3",
            "afterok:3?afterany:4,afterok:5",
        ] {
            assert!(parse_dependency(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn opts_become_a_spec() {
        let o = JobOpts {
            nodes: Some("2-4".into()),
            gres: Some("gpu:2".into()),
            time: Some("1:00".into()),
            nodelist: Some("worker-[0-1]".into()),
            ..Default::default()
        };
        let s = o.to_spec().unwrap();
        assert_eq!(s.nodes, Some(2));
        assert_eq!(s.gpus, GpuAsk::PerNode(2));
        assert_eq!(s.time_limit, Some(60));
        assert_eq!(s.nodelist, vec!["worker-0", "worker-1"]);
        let bad = JobOpts {
            ntasks: Some(0),
            ..Default::default()
        };
        assert!(bad.to_spec().is_err());
    }
}
