//! `scontrol`: show jobs, nodes and partitions in Slurm's key=value
//! layout; expand and compress hostlists; drain and resume nodes; hold
//! and release jobs.

use std::ffi::OsString;

use corral_proto::msg::{
    JobFilter, JobId, JobState, JobView, NodeUpdate, NodeView, PartitionView, Request, Response,
};
use scheduler_core::hostlist;

use super::{block_on, emit, fail, group_name, parse_ids, user_name, words};
use crate::client::Client;
use crate::ctld::server::now;
use crate::timefmt::{limit, timestamp};

const CMD: &str = "scontrol";

fn t(v: Option<u64>) -> String {
    v.map_or("Unknown".into(), timestamp)
}

/// `scontrol show job` for one job, as Slurm 22.05 lays it out: one
/// record of `Key=Value` lines (joined on one line with `oneliner`).
pub fn show_job(j: &JobView, now: u64) -> String {
    use super::squeue::{gres, output_path, size_mb, tres};
    let pending = j.state == JobState::Pending;
    let null = |v: &Option<String>| v.clone().unwrap_or_else(|| "(null)".into());
    let list = |v: &[String]| {
        if v.is_empty() {
            "(null)".to_string()
        } else {
            hostlist::compress_sorted(v)
        }
    };
    let mut lines: Vec<String> = Vec::with_capacity(32);
    let mut first = format!("JobId={}", j.id);
    if let Some(a) = &j.array {
        let task = match a.task {
            Some(t) => t.to_string(),
            None => corral_proto::msg::format_indices(&a.waiting, a.throttle),
        };
        first.push_str(&format!(" ArrayJobId={} ArrayTaskId={task}", a.job));
        if a.throttle > 0 && a.task.is_none() {
            first.push_str(&format!(" ArrayTaskThrottle={}", a.throttle));
        }
    }
    first.push_str(&format!(" JobName={}", j.name));
    lines.push(first);
    lines.push(format!(
        "UserId={}({}) GroupId={}({}) MCS_label=N/A",
        user_name(j.user.uid),
        j.user.uid,
        group_name(j.user.gid),
        j.user.gid
    ));
    lines.push(format!(
        "Priority={} Nice={} Account={} QOS={}",
        j.priority,
        j.ask().nice,
        null(&j.ask().account),
        j.ask().qos.as_deref().unwrap_or("normal")
    ));
    lines.push(format!(
        "JobState={} Reason={} Dependency={}",
        j.state.name(),
        words::job_reason(j.reason),
        null(&j.ask().dependency)
    ));
    if let Some(f) = &j.failure {
        lines.push(format!("FailReason={f}"));
    }
    // A signal's number is the second half; a code the first.
    let (code, signal) = match j.exit.signal {
        Some(s) => (0, s),
        None => (j.exit.code, 0),
    };
    lines.push(format!(
        "Requeue={} Restarts={} BatchFlag={} Reboot=0 ExitCode={code}:{signal}",
        u8::from(j.requeue),
        j.restarts,
        u8::from(j.batch),
    ));
    lines.push(format!(
        "RunTime={} TimeLimit={} TimeMin=N/A",
        limit(Some(super::squeue::run_secs(j, now)), "00:00:00"),
        limit(j.time_limit, "UNLIMITED")
    ));
    let eligible = j.ask().begin.unwrap_or(0).max(j.submit_time);
    lines.push(format!(
        "SubmitTime={} EligibleTime={}",
        timestamp(j.submit_time),
        timestamp(eligible)
    ));
    lines.push(format!("AccrueTime={}", timestamp(eligible)));
    let start = j
        .start_time
        .or(j.expected_start)
        .or(pending.then_some(j.ask().begin).flatten());
    let end = match (j.end_time, pending) {
        (Some(e), _) => Some(e),
        (None, true) => j.expected_start.zip(j.time_limit).map(|(s, l)| s + l),
        (None, false) => None,
    };
    lines.push(format!(
        "StartTime={} EndTime={} Deadline=N/A",
        t(start),
        t(end)
    ));
    let (suspended_at, pre_suspend) = j.suspension.map_or(("None".into(), 0), |s| {
        (timestamp(s.changed), s.pre_suspend)
    });
    lines.push(format!(
        "SuspendTime={suspended_at} SecsPreSuspend={pre_suspend} LastSchedEval={} Scheduler=Main",
        timestamp(j.start_time.unwrap_or(j.submit_time))
    ));
    lines.push(format!(
        "Partition={} AllocNode:Sid={}:0",
        j.partition,
        null(&j.ask().submit_host)
    ));
    lines.push(format!(
        "ReqNodeList={} ExcNodeList={}",
        list(&j.ask().req_nodes),
        list(&j.ask().exc_nodes)
    ));
    let mut nodelist = format!("NodeList={}", hostlist::compress_sorted(&j.nodes));
    if pending && !j.ask().sched_nodes.is_empty() {
        nodelist.push_str(&format!(
            " SchedNodeList={}",
            hostlist::compress_sorted(&j.ask().sched_nodes)
        ));
    }
    lines.push(nodelist);
    if let (true, Some(host)) = (j.batch, j.nodes.first()) {
        lines.push(format!("BatchHost={host}"));
    }
    let num_nodes = match (pending, j.ask().nodes) {
        (true, Some(n)) => format!("{n}-{n}"),
        _ => j.num_nodes.to_string(),
    };
    lines.push(format!(
        "NumNodes={num_nodes} NumCPUs={} NumTasks={} CPUs/Task={} ReqB:S:C:T=0:0:*:*",
        j.num_cpus, j.num_tasks, j.cpus_per_task
    ));
    lines.push(format!("TRES={}", tres(j)));
    lines.push(format!(
        "Socks/Node=* NtasksPerN:B:S:C={}:0:*:* CoreSpec=*",
        j.ask().ntasks_per_node.unwrap_or(0)
    ));
    let memory = match j.ask().mem_per_cpu_mb {
        Some(m) => format!("MinMemoryCPU={}", size_mb(m)),
        None => format!("MinMemoryNode={}", size_mb(j.mem_mb)),
    };
    lines.push(format!(
        "MinCPUsNode={} {memory} MinTmpDiskNode=0",
        j.min_cpus()
    ));
    lines.push(format!(
        "Features={} DelayBoot=00:00:00",
        null(&j.ask().features)
    ));
    lines.push(format!(
        "OverSubscribe={} Contiguous=0 Licenses=(null) Network=(null)",
        if j.ask().exclusive { "NO" } else { "OK" }
    ));
    // Corral's own: what the job's cgroups measured (Slurm leaves it to
    // sstat and sacct).
    if let Some(u) = j.usage {
        lines.push(format!(
            "TotalCPU={} MaxRSS={}K",
            crate::timefmt::cpu_time(u.cpu_ms),
            u.max_rss_kb
        ));
    }
    lines.push(format!("Command={}", j.command));
    lines.push(format!("WorkDir={}", j.work_dir));
    if let Some(c) = &j.comment {
        // Slurm leaves a blank after the comment.
        lines.push(format!("Comment={c} "));
    }
    if let Some(out) = &j.stdout {
        let err = j.stderr.as_deref().unwrap_or(out);
        lines.push(format!("StdErr={}", output_path(j, err)));
        lines.push("StdIn=/dev/null".into());
        lines.push(format!("StdOut={}", output_path(j, out)));
    }
    lines.push("Power=".into());
    if let Some(m) = j.ask().mem_per_gpu_mb {
        lines.push(format!("MemPerTres=gres:gpu:{m}"));
    }
    for (key, n) in [
        ("TresPerJob", j.ask().gpus_total),
        ("TresPerNode", j.ask().gpus_per_node),
        ("TresPerTask", j.ask().gpus_per_task),
    ] {
        if n.is_some() {
            lines.push(format!("{key}={}", gres(j, n)));
        }
    }
    if let (Some(user), Some(kind)) = (&j.mail_user, &j.mail_type) {
        lines.push(format!("MailUser={user} MailType={kind}"));
    }
    lines.join("\n   ")
}

/// Records as `scontrol show` prints them: each ends with a line of three
/// blanks and a blank line; with `oneliner`, each is one line.
fn records(recs: Vec<String>, oneliner: bool) -> String {
    let mut out = String::new();
    for r in recs {
        if oneliner {
            out.push_str(&r.replace("\n   ", " "));
            out.push_str(" \n");
        } else {
            out.push_str(&r);
            out.push_str("\n   \n\n");
        }
    }
    out
}

/// `scontrol show steps`: each running step of the jobs.
pub fn show_steps(jobs: &[JobView], only: Option<&str>) -> Vec<String> {
    let mut out = Vec::new();
    for j in jobs {
        for s in &j.steps {
            let id = format!("{}.{}", super::squeue::job_id(j), s.id);
            if only.is_some_and(|o| o != id && o != j.id.to_string()) {
                continue;
            }
            out.push(format!(
                "StepId={id} UserId={} StartTime={} TimeLimit=UNLIMITED\n   \
                 State=RUNNING Partition={} NodeList={}\n   \
                 Nodes={} CPUs={} Tasks={} Name={} Network=(null)\n   \
                 TRES=cpu={}\n   ResvPorts=(null)\n   CPUFreqReq=Default\n   \
                 SrunHost:Pid=(null):0",
                j.user.uid,
                timestamp(s.start),
                j.partition,
                hostlist::compress_sorted(&s.nodes),
                s.nodes.len(),
                s.cpus,
                s.tasks,
                s.name,
                s.cpus
            ));
        }
    }
    out
}

/// `scontrol show node` for one node, in Slurm 22.05's layout.
pub fn show_node(n: &NodeView) -> String {
    let feats = if n.features.is_empty() {
        "(null)".to_string()
    } else {
        n.features.join(",")
    };
    let gres = match (n.gpus, &n.gpu_model) {
        (0, _) => "(null)".to_string(),
        (g, Some(m)) => format!("gpu:{m}:{g}"),
        (g, None) => format!("gpu:{g}"),
    };
    let mut cfg = format!(
        "cpu={},mem={},billing={}",
        n.cpus,
        super::squeue::size_mb(n.memory_mb),
        n.cpus
    );
    if n.gpus > 0 {
        cfg.push_str(&format!(",gres/gpu={}", n.gpus));
    }
    let mut alloc = String::new();
    if n.alloc_cpus > 0 {
        alloc = format!("cpu={}", n.alloc_cpus);
        if n.alloc_memory_mb > 0 {
            alloc.push_str(&format!(
                ",mem={}",
                super::squeue::size_mb(n.alloc_memory_mb)
            ));
        }
        if n.alloc_gpus > 0 {
            alloc.push_str(&format!(",gres/gpu={}", n.alloc_gpus));
        }
    }
    let mut lines = vec![
        // Slurm leaves a blank at the end of this line and of Partitions.
        format!(
            "NodeName={} Arch={} CoresPerSocket=1 ",
            n.name,
            std::env::consts::ARCH
        ),
        format!(
            "CPUAlloc={} CPUEfctv={} CPUTot={} CPULoad=N/A",
            n.alloc_cpus, n.cpus, n.cpus
        ),
        format!("AvailableFeatures={feats}"),
        format!("ActiveFeatures={feats}"),
        format!("Gres={gres}"),
        format!(
            "NodeAddr={} NodeHostName={} Version=22.05.8",
            n.name, n.name
        ),
        // Slurm leaves a blank at its end too.
        format!("OS={} ", n.os),
        format!(
            "RealMemory={} AllocMem={} FreeMem=N/A Sockets={} Boards=1",
            n.memory_mb, n.alloc_memory_mb, n.cpus
        ),
        format!(
            "State={} ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A",
            super::words::node_state_full(n)
        ),
        format!("Partitions={} ", n.partitions.join(",")),
        format!(
            "BootTime={} SlurmdStartTime={}",
            timestamp(n.boot_time),
            timestamp(n.boot_time)
        ),
        format!("LastBusyTime={}", timestamp(n.last_seen)),
        format!("CfgTRES={cfg}"),
        format!("AllocTRES={alloc}"),
        "CapWatts=n/a".into(),
        "CurrentWatts=0 AveWatts=0".into(),
        "ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s".into(),
    ];
    if let Some(r) = &n.reason {
        lines.push(format!(
            "Reason={} [{}@{}]",
            r,
            n.reason_user
                .map(user_name)
                .unwrap_or_else(|| "root".into()),
            t(n.reason_time)
        ));
    }
    lines.join("\n   ")
}

/// `scontrol show partition` for one partition, in Slurm 22.05's layout.
pub fn show_partition(p: &PartitionView) -> String {
    let nodes = if p.nodes.is_empty() {
        "(null)".to_string()
    } else {
        hostlist::compress_sorted(&p.nodes)
    };
    let mut tres = format!(
        "cpu={},node={},billing={}",
        p.total_cpus,
        p.nodes.len(),
        p.total_cpus
    );
    if p.total_gpus > 0 {
        tres.push_str(&format!(",gres/gpu={}", p.total_gpus));
    }
    [
        format!("PartitionName={}", p.name),
        "AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL".into(),
        format!(
            "AllocNodes=ALL Default={} QoS=N/A",
            if p.is_default { "YES" } else { "NO" }
        ),
        format!(
            "DefaultTime={} DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO",
            p.default_time
                .map_or("NONE".into(), |d| limit(Some(d), "NONE"))
        ),
        format!(
            "MaxNodes=UNLIMITED MaxTime={} MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED",
            limit(p.max_time, "UNLIMITED")
        ),
        format!("Nodes={nodes}"),
        format!(
            "PriorityJobFactor=1 PriorityTier={} RootOnly=NO ReqResv=NO OverSubscribe=NO",
            p.priority_tier
        ),
        "OverTimeLimit=NONE PreemptMode=OFF".into(),
        format!(
            "State=UP TotalCPUs={} TotalNodes={} SelectTypeParameters=NONE",
            p.total_cpus,
            p.nodes.len()
        ),
        "JobDefaults=(null)".into(),
        "DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED".into(),
        format!("TRES={tres}"),
    ]
    .join("\n   ")
}

/// What a command line asks for.
#[derive(Debug, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)]
pub enum Action {
    Hostnames(String),
    /// `show hostlist` / `show hostlistsorted`: names, an expression, or
    /// the absolute path of a file of them.
    Hostlist {
        list: String,
        sorted: bool,
    },
    Remote(Request),
    /// `update JobId=…`: the same changes to each job.
    UpdateJobs(Vec<JobId>, corral_proto::msg::JobChanges),
    /// `ping`.
    Ping,
    /// `show config [KEY]`.
    ShowConfig(Option<String>),
    /// `show steps [JOB[.STEP]]`.
    ShowSteps(Option<String>),
    /// `show job [ID|ARRAY_TASK]`.
    ShowJobs(Option<(JobId, Option<u32>)>),
    ShowNodes(Option<String>),
    ShowPartitions(Option<String>),
}

/// The most a hostlist file may hold.
const HOSTLIST_FILE_MAX: u64 = 16 << 20;

/// `show hostlist`'s input: the list itself, or, as Slurm takes it, the
/// names in the file an absolute path names (separated by commas or
/// lines).
fn hostlist_input(list: &str) -> Result<String, String> {
    if !list.starts_with('/') {
        return Ok(list.to_string());
    }
    use std::io::Read as _;
    let mut text = String::new();
    std::fs::File::open(list)
        .and_then(|f| f.take(HOSTLIST_FILE_MAX + 1).read_to_string(&mut text))
        .map_err(|e| format!("cannot read host list {list}: {e}"))?;
    if text.len() as u64 > HOSTLIST_FILE_MAX {
        return Err(format!(
            "host list {list} is over {HOSTLIST_FILE_MAX} bytes"
        ));
    }
    Ok(text)
}

/// `scontrol update JobId=ID[,ID] Key=Value...`: what to change in each
/// job (one request each).
fn job_update(args: &[String], now: u64) -> Result<Action, String> {
    let mut ids = Vec::new();
    let mut ch = corral_proto::msg::JobChanges::default();
    for kv in args {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("Invalid input: {kv}"))?;
        match k.to_ascii_lowercase().as_str() {
            "jobid" => ids = job_ids("update", &[v.to_string()])?,
            "timelimit" if v.starts_with(['+', '-']) => {
                let secs = crate::timefmt::parse_job_limit(&v[1..])?
                    .ok_or_else(|| format!("Invalid TimeLimit specification: {v}"))?;
                let secs = i64::try_from(secs).map_err(|_| format!("Invalid TimeLimit: {v}"))?;
                ch.time_limit_by = Some(if v.starts_with('-') { -secs } else { secs });
            }
            "timelimit" => {
                ch.time_limit = Some(
                    if v.eq_ignore_ascii_case("unlimited") || v.eq_ignore_ascii_case("infinite") {
                        None
                    } else {
                        crate::timefmt::parse_job_limit(v)?
                    },
                )
            }
            "nice" => {
                ch.nice = Some(
                    v.parse::<i32>()
                        .ok()
                        .filter(|n| n.abs() <= 2_147_483_645)
                        .ok_or_else(|| format!("Invalid nice value: {v}"))?,
                )
            }
            "name" | "jobname" => ch.name = Some(v.to_string()),
            "comment" => ch.comment = Some(v.to_string()),
            "partition" => ch.partition = Some(v.to_string()),
            "numnodes" | "reqnodes" => {
                let count = |t: &str| {
                    t.parse::<u32>()
                        .ok()
                        .filter(|&n| n > 0)
                        .ok_or_else(|| format!("Invalid node count: {v}"))
                };
                let (min, max) = match v.split_once('-') {
                    Some((a, b)) => (count(a)?, Some(count(b)?)),
                    None => (count(v)?, None),
                };
                if max.is_some_and(|m| m < min) {
                    return Err(format!("Invalid node count: {v}"));
                }
                (ch.nodes, ch.nodes_max) = (Some(min), max);
            }
            "dependency" => {
                ch.dependency = Some(if v.is_empty() || v.eq_ignore_ascii_case("none") {
                    (Vec::new(), false)
                } else {
                    super::opts::parse_dependency(v)?
                })
            }
            "starttime" | "begintime" => {
                ch.begin = Some(if v.eq_ignore_ascii_case("now") {
                    None
                } else {
                    Some(crate::timefmt::parse_begin(v, now)?)
                })
            }
            _ => return Err(format!("Update of this parameter is not supported: {kv}")),
        }
    }
    match ids.as_slice() {
        [] => Err("update needs JobId=".into()),
        _ => Ok(Action::UpdateJobs(ids, ch)),
    }
}

/// Parses `scontrol` arguments (after the program name).
pub fn action(args: &[String]) -> Result<Action, String> {
    let lower: Vec<String> = args.iter().map(|a| a.to_ascii_lowercase()).collect();
    let word = |i: usize| lower.get(i).map(String::as_str);
    if word(0) == Some("show") && args.len() > 3 {
        return Err("too many arguments for keyword:show".into());
    }
    match (word(0), word(1)) {
        (Some("ping"), _) => Ok(Action::Ping),
        (Some("show"), Some("config")) => Ok(Action::ShowConfig(args.get(2).cloned())),
        (Some("show"), Some("step" | "steps")) => Ok(Action::ShowSteps(args.get(2).cloned())),
        (Some("show"), Some("hostnames")) => {
            let expr = match args.get(2) {
                Some(e) => e.clone(),
                None => std::env::var("SLURM_JOB_NODELIST").map_err(|_| {
                    "no hostlist given and SLURM_JOB_NODELIST is not set".to_string()
                })?,
            };
            Ok(Action::Hostnames(expr))
        }
        (Some("show"), Some(w @ ("hostlist" | "hostlistsorted"))) => {
            let list = args
                .get(2)
                .ok_or_else(|| format!("show {w} needs a list of host names"))?;
            Ok(Action::Hostlist {
                list: list.clone(),
                sorted: w == "hostlistsorted",
            })
        }
        (Some("show"), Some("job" | "jobs")) => Ok(Action::ShowJobs(
            args.get(2)
                .map(|s| {
                    let bad = || format!("Invalid job id specified: {s}");
                    match s.split_once('_') {
                        Some((a, t)) => Ok((
                            JobId(a.parse().map_err(|_| bad())?),
                            Some(t.parse().map_err(|_| bad())?),
                        )),
                        None => s
                            .parse::<u64>()
                            .map(|j| (JobId(j), None))
                            .map_err(|_| bad()),
                    }
                })
                .transpose()?,
        )),
        (Some("show"), Some("node" | "nodes")) => Ok(Action::ShowNodes(args.get(2).cloned())),
        (Some("show"), Some("partition" | "partitions")) => {
            Ok(Action::ShowPartitions(args.get(2).cloned()))
        }
        (Some("show"), other) => Err(format!(
            "invalid entity:{} for keyword:show",
            other.unwrap_or("")
        )),
        (Some(h @ ("hold" | "uhold" | "holdu" | "release")), _) => {
            let ids = job_ids(h, &args[1..])?;
            Ok(Action::Remote(match h {
                "release" => Request::Release { ids },
                _ => Request::Hold {
                    ids,
                    user: h != "hold",
                },
            }))
        }
        (Some("reconfigure"), _) => Ok(Action::Remote(Request::Reconfigure)),
        (Some("top"), _) => Ok(Action::Remote(Request::Top {
            ids: job_ids("top", &args[1..])?,
        })),
        (Some(r @ ("suspend" | "resume")), _) => Ok(Action::Remote(Request::Suspend {
            ids: job_ids(r, &args[1..])?,
            resume: r == "resume",
        })),
        (Some(r @ ("requeue" | "requeuehold")), _) => Ok(Action::Remote(Request::Requeue {
            ids: job_ids(r, &args[1..])?,
            hold: r == "requeuehold",
        })),
        (Some("update"), _)
            if args[1..].iter().any(|kv| {
                kv.split_once('=')
                    .is_some_and(|(k, _)| k.eq_ignore_ascii_case("jobid"))
            }) =>
        {
            job_update(&args[1..], crate::ctld::server::now())
        }
        (Some("update"), _) => {
            let mut names = None;
            let mut state = None;
            let mut reason = None;
            for kv in &args[1..] {
                let (k, v) = kv
                    .split_once('=')
                    .ok_or_else(|| format!("Invalid input: {kv}"))?;
                match k.to_ascii_lowercase().as_str() {
                    "nodename" => names = Some(v.to_string()),
                    "state" => {
                        state = Some(match v.to_ascii_lowercase().as_str() {
                            "drain" => NodeUpdate::Drain,
                            "resume" | "idle" | "undrain" => NodeUpdate::Resume,
                            "down" => NodeUpdate::Down,
                            "fail" => NodeUpdate::Fail,
                            _ => return Err(format!("Invalid node state specified: {v}")),
                        })
                    }
                    "reason" => reason = Some(v.to_string()),
                    _ => return Err(format!("Update of this parameter is not supported: {kv}")),
                }
            }
            let names = names.ok_or("update needs NodeName=")?;
            let state = state.ok_or("update needs State=")?;
            Ok(Action::Remote(Request::UpdateNode {
                names,
                state,
                reason,
            }))
        }
        (Some("delete"), _) => {
            let names = args[1..]
                .iter()
                .find_map(|kv| {
                    kv.split_once('=')
                        .filter(|(k, _)| k.eq_ignore_ascii_case("nodename"))
                        .map(|(_, v)| v.to_string())
                })
                .ok_or("delete needs NodeName=")?;
            Ok(Action::Remote(Request::DeleteNodes { names }))
        }
        (Some(other), _) => Err(format!("invalid keyword: {other}")),
        (None, _) => Err("no command given (show, update, hold, release)".into()),
    }
}

/// The job ids a command names (`3,4 5`): at least one.
/// The `A_T` pieces of a job list (`12_3,14`): their places and tasks.
fn task_pieces(list: &str) -> Vec<(usize, JobId, u32)> {
    list.split(',')
        .enumerate()
        .filter_map(|(i, p)| {
            let (a, t) = p.trim().split_once('_')?;
            Some((i, JobId(a.parse().ok()?), t.parse().ok()?))
        })
        .collect()
}

/// `hold|release|update|requeue|top|suspend 12_3`: each array task named
/// becomes its job id, asked of the controller, which splits a task that
/// still waits in its array's record off into a record of its own (as
/// Slurm's does), so the command acts on that task alone.
fn resolve_tasks(rest: &mut [String]) -> Result<(), String> {
    let command = rest.first().map(|c| c.to_ascii_lowercase());
    let update = command.as_deref() == Some("update");
    if !update
        && !matches!(
            command.as_deref(),
            Some(
                "hold"
                    | "uhold"
                    | "holdu"
                    | "release"
                    | "top"
                    | "suspend"
                    | "resume"
                    | "requeue"
                    | "requeuehold"
            )
        )
    {
        return Ok(());
    }
    // (argument, prefix kept, its list)
    let mut lists: Vec<(usize, String, String)> = Vec::new();
    for (i, arg) in rest.iter().enumerate().skip(1) {
        match arg.split_once('=') {
            Some((k, v)) if update && k.eq_ignore_ascii_case("jobid") => {
                lists.push((i, format!("{k}="), v.to_string()))
            }
            _ if !update => lists.push((i, String::new(), arg.clone())),
            _ => {}
        }
    }
    if lists.iter().all(|(_, _, l)| task_pieces(l).is_empty()) {
        return Ok(());
    }
    let mut answer: Result<Vec<(usize, String)>, String> = Ok(Vec::new());
    let out = &mut answer;
    block_on(CMD, async move {
        let mut c = match Client::connect().await {
            Ok(c) => c,
            Err(e) => {
                *out = Err(e.to_string());
                return 1;
            }
        };
        let mut done = Vec::new();
        for (i, prefix, list) in lists {
            let mut parts: Vec<String> = list.split(',').map(str::to_string).collect();
            for (k, array, task) in task_pieces(&list) {
                match c.ok(Request::ArrayTask { array, task }).await {
                    Ok(Response::Affected { jobs }) if jobs.len() == 1 => {
                        parts[k] = jobs[0].to_string()
                    }
                    Ok(other) => {
                        *out = Err(format!("unexpected answer {other:?}"));
                        return 1;
                    }
                    Err(e) => {
                        *out = Err(e);
                        return 1;
                    }
                }
            }
            done.push((i, format!("{prefix}{}", parts.join(","))));
        }
        *out = Ok(done);
        0
    });
    for (i, arg) in answer? {
        rest[i] = arg;
    }
    Ok(())
}

fn job_ids(command: &str, args: &[String]) -> Result<Vec<JobId>, String> {
    let ids: Vec<JobId> = args
        .iter()
        .map(|s| parse_ids(s))
        .collect::<Result<Vec<_>, _>>()?
        .concat();
    if ids.is_empty() {
        return Err(format!("{command} needs job ids"));
    }
    Ok(ids)
}

async fn remote(req: Request) -> Result<Response, String> {
    let mut c = Client::connect().await.map_err(|e| e.to_string())?;
    c.ok(req).await
}

pub fn main(args: &[OsString]) -> i32 {
    let rest: Vec<String> = args[1..]
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    // Options, before the command or anywhere after it (Slurm's getopt
    // takes `scontrol show job -o` too): `-o` prints each record on one
    // line; the others change nothing Corral prints.
    let mut rest = rest;
    let mut oneliner = false;
    while let Some(first) = rest.first() {
        match first.as_str() {
            "-o" | "--oneliner" | "oneliner" => oneliner = true,
            "-d" | "--details" | "-a" | "--all" | "-Q" | "--quiet" | "-v" | "--verbose" => {}
            _ => break,
        }
        rest.remove(0);
    }
    rest.retain(|a| match a.as_str() {
        "-o" | "--oneliner" => {
            oneliner = true;
            false
        }
        "-d" | "--details" | "-a" | "--all" | "-Q" | "--quiet" | "-v" | "--verbose" => false,
        _ => true,
    });
    if rest.first().is_some_and(|a| a == "-h" || a == "--help") {
        return emit(CMD, "usage: scontrol show job|node|partition [NAME] | show hostnames|hostlist LIST\n       scontrol update NodeName=LIST State=DRAIN|RESUME|DOWN [Reason=TEXT]\n       scontrol hold|release|requeue|requeuehold JOBID[,JOBID]\n");
    }
    if let Err(e) = resolve_tasks(&mut rest) {
        return fail(CMD, e);
    }
    let act = match action(&rest) {
        Ok(a) => a,
        Err(e) => return fail(CMD, e),
    };
    match act {
        Action::Hostnames(expr) => match hostlist::expand(&expr) {
            Ok(names) => {
                let mut text = String::with_capacity(names.len() * 12);
                for n in names {
                    text.push_str(&n);
                    text.push('\n');
                }
                emit(CMD, &text)
            }
            Err(e) => fail(CMD, format!("Invalid hostlist: {expr}: {e}")),
        },
        Action::Hostlist { list, sorted } => {
            let list = match hostlist_input(&list) {
                Ok(l) => l,
                Err(e) => return fail(CMD, e),
            };
            match hostlist::expand(&list) {
                Ok(names) if sorted => {
                    emit(CMD, &format!("{}\n", hostlist::compress_sorted(&names)))
                }
                Ok(names) => emit(CMD, &format!("{}\n", hostlist::compress(&names))),
                Err(e) => fail(CMD, format!("Invalid hostlist: {list}: {e}")),
            }
        }
        other => block_on(CMD, async move {
            let (req, show) = match other {
                // A task still waiting shows its array's record for it
                // alone (`ArrayTaskId=7`), as Slurm's.
                Action::ShowJobs(id) => (
                    Request::Jobs(JobFilter {
                        ids: id
                            .filter(|(_, t)| t.is_none())
                            .map(|(j, _)| j)
                            .into_iter()
                            .collect(),
                        tasks: id.and_then(|(j, t)| Some((j, t?))).into_iter().collect(),
                        detail: true,
                        ..Default::default()
                    }),
                    Some(id.map(|(j, _)| j.to_string())),
                ),
                Action::ShowSteps(which) => {
                    let job = which
                        .as_deref()
                        .and_then(|w| w.split(['.', '_']).next())
                        .and_then(|j| j.parse::<u64>().ok());
                    let filter = JobFilter {
                        ids: job.map(JobId).into_iter().collect(),
                        states: vec![JobState::Running],
                        detail: true,
                        ..Default::default()
                    };
                    return match remote(Request::Jobs(filter)).await {
                        Ok(Response::Jobs(jobs)) => {
                            let steps = show_steps(&jobs, which.as_deref());
                            if steps.is_empty() {
                                return match which {
                                    Some(w) => fail(CMD, format!("Job step {w} not found")),
                                    None => emit(CMD, "No job steps in the system\n"),
                                };
                            }
                            let text: String = steps
                                .into_iter()
                                .map(|r| {
                                    if oneliner {
                                        format!("{}\n", r.replace("\n   ", " "))
                                    } else {
                                        format!("{r}\n\n")
                                    }
                                })
                                .collect();
                            emit(CMD, &text)
                        }
                        Ok(other) => fail(CMD, format!("unexpected answer {other:?}")),
                        Err(e) => fail(CMD, e),
                    };
                }
                Action::ShowConfig(key) => {
                    return match remote(Request::Config).await {
                        Ok(Response::Config(kv)) => {
                            let width = kv.iter().map(|(k, _)| k.len()).max().unwrap_or(0).max(23);
                            let mut text =
                                format!("Configuration data as of {}\n", timestamp(now()));
                            let mut any = false;
                            for (k, v) in &kv {
                                if key.as_ref().is_some_and(|w| !k.eq_ignore_ascii_case(w)) {
                                    continue;
                                }
                                any = true;
                                text.push_str(&format!("{k:<width$} = {v}\n"));
                            }
                            if !any {
                                return fail(
                                    CMD,
                                    format!(
                                        "Invalid configuration parameter {}",
                                        key.unwrap_or_default()
                                    ),
                                );
                            }
                            emit(CMD, &text)
                        }
                        Ok(other) => fail(CMD, format!("unexpected answer {other:?}")),
                        Err(e) => fail(CMD, e),
                    };
                }
                Action::Ping => {
                    // The controller names its own address.
                    return match remote(Request::Config).await {
                        Ok(Response::Config(kv)) => {
                            let host = kv
                                .iter()
                                .find(|(k, _)| k == "SlurmctldHost[0]")
                                .map_or("localhost", |(_, v)| v.as_str());
                            emit(CMD, &format!("Slurmctld(primary) at {host} is UP\n"))
                        }
                        Ok(other) => fail(CMD, format!("unexpected answer {other:?}")),
                        Err(e) => {
                            let _ = emit(CMD, "Slurmctld(primary) is DOWN\n");
                            fail(CMD, e)
                        }
                    };
                }
                Action::UpdateJobs(ids, changes) => {
                    let mut c = match Client::connect().await {
                        Ok(c) => c,
                        Err(e) => return fail(CMD, e),
                    };
                    let mut code = 0;
                    for id in ids {
                        let req = Request::UpdateJob {
                            id,
                            changes: changes.clone(),
                        };
                        if let Err(e) = c.ok(req).await {
                            code = fail(CMD, e);
                        }
                    }
                    return code;
                }
                Action::ShowNodes(n) => (Request::Nodes, Some(n)),
                Action::ShowPartitions(p) => (Request::Partitions, Some(p)),
                Action::Remote(r) => (r, None),
                Action::Hostnames(_) | Action::Hostlist { .. } => return 0,
            };
            let resp = match req {
                // Every page: `show job` of a queue past one page (5,000
                // jobs, finished ones included) showed the first page only.
                Request::Jobs(f) => {
                    let mut c = match Client::connect().await {
                        Ok(c) => c,
                        Err(e) => return fail(CMD, e.to_string()),
                    };
                    match c.jobs(f).await {
                        Ok(jobs) => Response::Jobs(jobs),
                        Err(e) => return fail(CMD, e),
                    }
                }
                req => match remote(req).await {
                    Ok(r) => r,
                    Err(e) => return fail(CMD, e),
                },
            };
            let want = show.flatten();
            let recs = match resp {
                Response::Jobs(jobs) => {
                    if jobs.is_empty() {
                        return match want {
                            // Slurm's very words, without the usual prefix.
                            Some(_) => {
                                let line = b"slurm_load_jobs error: Invalid job id specified\n";
                                let _ =
                                    std::io::Write::write_all(&mut std::io::stderr().lock(), line);
                                1
                            }
                            None => emit(CMD, "No jobs in the system\n"),
                        };
                    }
                    jobs.iter().map(|j| show_job(j, now())).collect::<Vec<_>>()
                }
                Response::Nodes(nodes) => {
                    let names = match &want {
                        Some(w) => match hostlist::expand(w) {
                            Ok(n) => Some(n),
                            Err(e) => return fail(CMD, format!("Invalid hostlist: {w}: {e}")),
                        },
                        None => None,
                    };
                    let sel: Vec<String> = nodes
                        .iter()
                        .filter(|n| names.as_ref().is_none_or(|w| w.contains(&n.name)))
                        .map(show_node)
                        .collect();
                    if sel.is_empty() {
                        return fail(CMD, format!("Node {} not found", want.unwrap_or_default()));
                    }
                    sel
                }
                Response::Partitions(parts) => {
                    let sel: Vec<String> = parts
                        .iter()
                        .filter(|p| want.as_ref().is_none_or(|w| *w == p.name))
                        .map(show_partition)
                        .collect();
                    if sel.is_empty() {
                        return fail(
                            CMD,
                            format!("Partition {} not found", want.unwrap_or_default()),
                        );
                    }
                    sel
                }
                Response::Done | Response::Affected { .. } => return 0,
                other => return fail(CMD, format!("unexpected answer {other:?}")),
            };
            emit(CMD, &records(recs, oneliner))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_every_command() {
        assert_eq!(
            action(&words("show hostnames w-[1-2]")),
            Ok(Action::Hostnames("w-[1-2]".into()))
        );
        assert_eq!(
            action(&words("show job 5")),
            Ok(Action::ShowJobs(Some((JobId(5), None))))
        );
        assert_eq!(
            action(&words("show job 5_7")),
            Ok(Action::ShowJobs(Some((JobId(5), Some(7)))))
        );
        assert!(action(&words("show job 5_x")).is_err());
        assert_eq!(
            task_pieces("12_3,14,15_0"),
            [(0, JobId(12), 3), (2, JobId(15), 0)]
        );
        assert_eq!(action(&words("show nodes")), Ok(Action::ShowNodes(None)));
        assert_eq!(
            action(&words("update NodeName=w-1 State=DRAIN Reason=fan")),
            Ok(Action::Remote(Request::UpdateNode {
                names: "w-1".into(),
                state: NodeUpdate::Drain,
                reason: Some("fan".into())
            }))
        );
        assert!(
            matches!(action(&words("hold 3,4")), Ok(Action::Remote(Request::Hold { ids, user: false })) if ids == vec![JobId(3), JobId(4)])
        );
        assert!(
            matches!(action(&words("requeue 7")), Ok(Action::Remote(Request::Requeue { ids, hold: false })) if ids == vec![JobId(7)])
        );
        assert!(
            matches!(action(&words("requeuehold 7,8")), Ok(Action::Remote(Request::Requeue { ids, hold: true })) if ids == vec![JobId(7), JobId(8)])
        );
        assert!(action(&words("requeue")).is_err());
        assert!(action(&words("requeue seven")).is_err());
        assert!(
            matches!(action(&words("suspend 7,8 9")), Ok(Action::Remote(Request::Suspend { ids, resume: false })) if ids == vec![JobId(7), JobId(8), JobId(9)])
        );
        assert!(
            matches!(action(&words("resume 7")), Ok(Action::Remote(Request::Suspend { ids, resume: true })) if ids == vec![JobId(7)])
        );
        assert!(action(&words("suspend")).is_err());
        assert!(action(&words("resume x")).is_err());
        assert!(action(&words("update NodeName=w-1 State=sideways")).is_err());
        assert!(action(&words("frobnicate")).is_err());
        assert!(action(&words("show job x")).is_err());
    }

    #[test]
    fn delete_names_nodes_by_hostlist() {
        assert_eq!(
            action(&words("delete NodeName=worker-[1-2]")),
            Ok(Action::Remote(Request::DeleteNodes {
                names: "worker-[1-2]".into()
            }))
        );
        assert!(action(&words("delete")).is_err());
    }

    /// `scontrol show job` of the running and the pending job of the
    /// squeue field table, line for line as Slurm 22.05 printed them for
    /// the same jobs (times are the fixture's; `QOS=normal` where Slurm
    /// without accounting says `(null)`; `AllocNode:Sid` has no session).
    #[test]
    fn show_job_lays_out_every_key_as_slurm() {
        let jobs = crate::cli::squeue::tests::table_jobs();
        let want_run = [
            "JobId=135 JobName=run1",
            "   UserId=root(0) GroupId=root(0) MCS_label=N/A",
            "   Priority=4294901683 Nice=0 Account=(null) QOS=normal",
            "   JobState=RUNNING Reason=None Dependency=(null)",
            "   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0",
            "   RunTime=00:01:42 TimeLimit=00:30:00 TimeMin=N/A",
            "   SubmitTime=1970-01-01T00:16:40 EligibleTime=1970-01-01T00:16:40",
            "   AccrueTime=1970-01-01T00:16:40",
            "   StartTime=1970-01-01T00:16:40 EndTime=1970-01-01T00:46:40 Deadline=N/A",
            "   SuspendTime=None SecsPreSuspend=0 LastSchedEval=1970-01-01T00:16:40 Scheduler=Main",
            "   Partition=p AllocNode:Sid=(null):0",
            "   ReqNodeList=(null) ExcNodeList=(null)",
            "   NodeList=n1",
            "   BatchHost=n1",
            "   NumNodes=1 NumCPUs=2 NumTasks=1 CPUs/Task=2 ReqB:S:C:T=0:0:*:*",
            "   TRES=cpu=2,mem=1000M,node=1,billing=2,gres/gpu=1",
            "   Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=*",
            "   MinCPUsNode=2 MinMemoryNode=1000M MinTmpDiskNode=0",
            "   Features=(null) DelayBoot=00:00:00",
            "   OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null)",
            "   Command=x",
            "   WorkDir=/tmp/slurm",
            "   Comment=hi ",
            "   StdErr=/tmp/slurm/r1.out",
            "   StdIn=/dev/null",
            "   StdOut=/tmp/slurm/r1.out",
            "   Power=",
            "   TresPerNode=gres:gpu:1",
        ]
        .join("\n");
        assert_eq!(show_job(&jobs[2], 1_102), want_run);
        let pend = show_job(&jobs[0], 1_102);
        for line in [
            "   NodeList=\n",
            "   NumNodes=2 NumCPUs=2",
            "   MinCPUsNode=1 MinMemoryCPU=500M MinTmpDiskNode=0\n",
            "   OverSubscribe=NO ",
            "   StdErr=/tmp/slurm/slurm-136.out\n",
            "   StartTime=Unknown EndTime=Unknown",
        ] {
            assert!(pend.contains(line), "{line:?} not in\n{pend}");
        }
        assert!(!pend.contains("BatchHost"), "{pend}");
        let held = show_job(&jobs[1], 1_102);
        for line in [
            "   Priority=0 Nice=5 Account=acct QOS=normal\n",
            "   JobState=PENDING Reason=JobHeldUser Dependency=afterok:1(unfulfilled)\n",
            "   SubmitTime=1970-01-01T00:16:40 EligibleTime=1970-01-01T01:16:40\n",
            "   StartTime=1970-01-01T01:16:40 EndTime=Unknown Deadline=N/A\n",
            "   ReqNodeList=n1 ExcNodeList=n2\n",
        ] {
            assert!(held.contains(line), "{line:?} not in\n{held}");
        }
        // -N given shows as a range while pending.
        let mut two = jobs[0].clone();
        two.ask.get_or_insert_with(Default::default).nodes = Some(2);
        assert!(show_job(&two, 0).contains("   NumNodes=2-2 NumCPUs=2"));
        // --mem-per-gpu, as Slurm 22.05 shows it (checked on one): no
        // memory a node, MemPerTres after Power, the memory in TRES.
        let mut per_gpu = jobs[2].clone();
        let ask = per_gpu.ask.get_or_insert_with(Default::default);
        (ask.mem_per_gpu_mb, ask.gpus_per_node) = (Some(1024), Some(2));
        (per_gpu.mem_mb, per_gpu.gpus) = (0, 2);
        let shown = show_job(&per_gpu, 1_102);
        for line in [
            "   TRES=cpu=2,mem=2G,node=1,billing=2,gres/gpu=2\n",
            "   MinCPUsNode=2 MinMemoryNode=0 MinTmpDiskNode=0\n",
            "   Power=\n   MemPerTres=gres:gpu:1024\n   TresPerNode=gres:gpu:2",
        ] {
            assert!(shown.contains(line), "{line:?} not in\n{shown}");
        }
        // Records: a line of three blanks and a blank line after each; one
        // line each with -o, a blank before the newline.
        let recs = records(vec!["A=1\n   B=2".into(), "A=3".into()], false);
        assert_eq!(recs, "A=1\n   B=2\n   \n\nA=3\n   \n\n");
        assert_eq!(records(vec!["A=1\n   B=2".into()], true), "A=1 B=2 \n");
    }

    #[test]
    fn show_errors_in_slurms_words() {
        assert_eq!(
            action(&words("show bogus")),
            Err("invalid entity:bogus for keyword:show".into())
        );
        assert_eq!(
            action(&words("show job 1 2")),
            Err("too many arguments for keyword:show".into())
        );
        assert_eq!(action(&words("ping")), Ok(Action::Ping));
        assert_eq!(
            action(&words("show config MinJobAge")),
            Ok(Action::ShowConfig(Some("MinJobAge".into())))
        );
        assert_eq!(
            action(&words("show steps 12.0")),
            Ok(Action::ShowSteps(Some("12.0".into())))
        );
        assert!(
            matches!(action(&words("uhold 3")), Ok(Action::Remote(Request::Hold { ids, user: true })) if ids == vec![JobId(3)])
        );
        assert!(
            matches!(action(&words("top 4,3")), Ok(Action::Remote(Request::Top { ids })) if ids == vec![JobId(4), JobId(3)])
        );
    }

    /// Node states as Slurm 22.05's `scontrol show node` and sinfo wrote
    /// them (measured: a drained idle node, a node whose slurmd was
    /// killed, `State=FAIL` on an idle node, jobs whose processes ignore
    /// SIGTERM while cancelled, beside a running job and alone).
    #[test]
    fn node_states_as_slurm_writes_them() {
        use crate::cli::sinfo::tests::node;
        use crate::cli::words::{node_state, node_state_full, node_state_long};
        use corral_proto::msg::NodeState;
        let drained = node("n2", NodeState::Drained);
        assert_eq!(node_state_full(&drained), "IDLE+DRAIN");
        let mut lost = node("n2", NodeState::Down);
        lost.not_responding = true;
        assert_eq!(node_state_full(&lost), "DOWN+NOT_RESPONDING");
        let mut busy = node("n1", NodeState::Draining);
        busy.alloc_cpus = 1;
        assert_eq!(node_state_full(&busy), "MIXED+DRAIN");
        busy.alloc_cpus = busy.cpus;
        assert_eq!(node_state_full(&busy), "ALLOCATED+DRAIN");
        assert!(show_node(&lost).contains("\n   State=DOWN+NOT_RESPONDING ThreadsPerCore=1 "));
        let each = |n: &NodeView| (node_state_full(n), node_state(n), node_state_long(n));
        let mut failed = node("n2", NodeState::Drained);
        failed.fail = true;
        assert_eq!(each(&failed), ("IDLE+FAIL".into(), "fail".into(), "fail"));
        let mut failing = node("n2", NodeState::Draining);
        failing.fail = true;
        failing.alloc_cpus = 1;
        assert_eq!(
            each(&failing),
            ("MIXED+FAIL".into(), "failg".into(), "failing")
        );
        let mut ending = node("n1", NodeState::Mixed);
        ending.completing = true;
        assert_eq!(
            each(&ending),
            ("MIXED+COMPLETING".into(), "comp".into(), "completing")
        );
        ending.state = NodeState::Idle;
        assert_eq!(each(&ending).0, "IDLE+COMPLETING");
        ending.state = NodeState::Draining;
        ending.alloc_cpus = 1;
        assert_eq!(
            each(&ending),
            ("MIXED+COMPLETING+DRAIN".into(), "drng".into(), "draining")
        );
    }
}

#[cfg(test)]
mod update_tests {
    use super::*;

    #[test]
    fn a_relative_time_limit_moves_the_jobs_own() {
        let args = |v: &str| vec!["JobId=5".to_string(), format!("TimeLimit={v}")];
        for (v, by) in [("+5", 300), ("-3", -180), ("+1:00:00", 3600)] {
            match job_update(&args(v), 0).unwrap() {
                Action::UpdateJobs(ids, ch) => {
                    assert_eq!(ids, [JobId(5)]);
                    assert_eq!((ch.time_limit_by, ch.time_limit), (Some(by), None), "{v}");
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(job_update(&args("+x"), 0).is_err());
        assert!(job_update(&args("+0"), 0).is_err());
    }
}
