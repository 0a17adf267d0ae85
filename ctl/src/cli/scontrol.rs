//! `scontrol`: show jobs, nodes and partitions in Slurm's key=value
//! layout; expand and compress hostlists; drain and resume nodes; hold
//! and release jobs.

use std::ffi::OsString;

use corral_proto::msg::{
    JobFilter, JobId, JobView, NodeUpdate, NodeView, PartitionView, Request, Response,
};
use scheduler_core::hostlist;

use super::{block_on, emit, fail, group_name, parse_ids, user_name, words};
use crate::client::Client;
use crate::ctld::server::now;
use crate::timefmt::{cpu_time, limit, timestamp};

const CMD: &str = "scontrol";

fn t(v: Option<u64>) -> String {
    v.map_or("Unknown".into(), timestamp)
}

/// `scontrol show job` for one job.
pub fn show_job(j: &JobView, now: u64) -> String {
    let run = limit(Some(super::squeue::run_secs(j, now)), "00:00:00");
    let nodes = if j.nodes.is_empty() {
        "(null)".to_string()
    } else {
        hostlist::compress_sorted(&j.nodes)
    };
    let mut s = String::new();
    s.push_str(&format!("JobId={}", j.id));
    if let Some(a) = &j.array {
        let task = match a.task {
            Some(t) => t.to_string(),
            None => corral_proto::msg::format_indices(&a.waiting, a.throttle),
        };
        s.push_str(&format!(" ArrayJobId={} ArrayTaskId={task}", a.job));
        if a.throttle > 0 && a.task.is_none() {
            s.push_str(&format!(" ArrayTaskThrottle={}", a.throttle));
        }
    }
    s.push_str(&format!(" JobName={}\n", j.name));
    s.push_str(&format!(
        "   UserId={}({}) GroupId={}({}) MCS_label=N/A\n",
        user_name(j.user.uid),
        j.user.uid,
        group_name(j.user.gid),
        j.user.gid
    ));
    s.push_str(&format!(
        "   Priority={} Nice=0 Account={} QOS=normal\n",
        j.priority,
        user_name(j.user.uid)
    ));
    s.push_str(&format!(
        "   JobState={} Reason={} Dependency=(null)\n",
        j.state.name(),
        words::job_reason(j.reason)
    ));
    if let Some(f) = &j.failure {
        s.push_str(&format!("   FailReason={f}\n"));
    }
    s.push_str(&format!(
        "   Requeue={} Restarts={} BatchFlag={} Reboot=0 ExitCode={}:{}\n",
        u8::from(j.requeue),
        j.restarts,
        u8::from(j.batch),
        if j.exit.signal.is_some() {
            0
        } else {
            j.exit.code
        },
        j.exit.signal.unwrap_or(0)
    ));
    s.push_str(&format!(
        "   RunTime={run} TimeLimit={} TimeMin=N/A\n",
        limit(j.time_limit, "UNLIMITED")
    ));
    s.push_str(&format!(
        "   SubmitTime={} EligibleTime={}\n",
        timestamp(j.submit_time),
        timestamp(j.submit_time)
    ));
    s.push_str(&format!(
        "   StartTime={} EndTime={} Deadline=N/A\n",
        t(j.start_time.or(j.expected_start)),
        t(j.end_time)
    ));
    s.push_str(&format!("   Partition={} AllocNode:Sid=N/A\n", j.partition));
    s.push_str(&format!("   NodeList={nodes}\n"));
    s.push_str(&format!(
        "   NumNodes={} NumCPUs={} NumTasks={} CPUs/Task={} ReqB:S:C:T=0:0:*:*\n",
        j.num_nodes, j.num_cpus, j.num_tasks, j.cpus_per_task
    ));
    let mut tres = format!("cpu={},mem={}M,node={}", j.num_cpus, j.mem_mb, j.num_nodes);
    if j.gpus > 0 {
        tres.push_str(&format!(",gres/gpu={}", j.gpus));
    }
    s.push_str(&format!("   TRES={tres}\n"));
    if let Some(u) = j.usage {
        s.push_str(&format!(
            "   TotalCPU={} MaxRSS={}K\n",
            cpu_time(u.cpu_ms),
            u.max_rss_kb
        ));
    }
    s.push_str(&format!("   Command={}\n", j.command));
    s.push_str(&format!("   WorkDir={}\n", j.work_dir));
    if j.batch {
        let out = j.stdout.clone().unwrap_or_default();
        s.push_str(&format!(
            "   StdErr={} StdIn=/dev/null StdOut={}\n",
            j.stderr.clone().unwrap_or_else(|| out.clone()),
            out
        ));
    }
    s
}

/// `scontrol show node` for one node.
pub fn show_node(n: &NodeView) -> String {
    let mut s = String::new();
    s.push_str(&format!("NodeName={} CoresPerSocket=1\n", n.name));
    s.push_str(&format!(
        "   CPUAlloc={} CPUEfctv={} CPUTot={}\n",
        n.alloc_cpus, n.cpus, n.cpus
    ));
    let feats = if n.features.is_empty() {
        "(null)".to_string()
    } else {
        n.features.join(",")
    };
    s.push_str(&format!(
        "   AvailableFeatures={feats}\n   ActiveFeatures={feats}\n"
    ));
    s.push_str(&format!(
        "   Gres={}\n",
        if n.gpus > 0 {
            match &n.gpu_model {
                Some(m) => format!("gpu:{m}:{}", n.gpus),
                None => format!("gpu:{}", n.gpus),
            }
        } else {
            "(null)".into()
        }
    ));
    s.push_str(&format!("   NodeAddr={} NodeHostName={}\n", n.name, n.name));
    s.push_str(&format!(
        "   RealMemory={} AllocMem={}\n",
        n.memory_mb, n.alloc_memory_mb
    ));
    s.push_str(&format!(
        "   State={}{}\n",
        words::node_state_long(n.state).to_ascii_uppercase(),
        if n.not_responding { "*" } else { "" }
    ));
    let mut cfg = format!("cpu={},mem={}M", n.cpus, n.memory_mb);
    if n.gpus > 0 {
        cfg.push_str(&format!(",gres/gpu={}", n.gpus));
    }
    s.push_str(&format!("   CfgTRES={cfg}\n"));
    let mut alloc = String::new();
    if n.alloc_cpus > 0 {
        alloc = format!("cpu={},mem={}M", n.alloc_cpus, n.alloc_memory_mb);
        if n.alloc_gpus > 0 {
            alloc.push_str(&format!(",gres/gpu={}", n.alloc_gpus));
        }
    }
    s.push_str(&format!("   AllocTRES={alloc}\n"));
    if let Some(r) = &n.reason {
        s.push_str(&format!(
            "   Reason={} [{}@{}]\n",
            r,
            n.reason_user
                .map(user_name)
                .unwrap_or_else(|| "root".into()),
            t(n.reason_time)
        ));
    }
    s
}

/// `scontrol show partition` for one partition.
pub fn show_partition(p: &PartitionView) -> String {
    let nodes = if p.nodes.is_empty() {
        "(null)".to_string()
    } else {
        hostlist::compress_sorted(&p.nodes)
    };
    format!(
        "PartitionName={}\n   AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL\n   Default={} \
         MaxNodes=UNLIMITED MaxTime={}\n   Nodes={}\n   PriorityTier={} State=UP TotalCPUs={} \
         TotalNodes={}\n   DefaultTime={} TRES=cpu={},node={},gres/gpu={}\n",
        p.name,
        if p.is_default { "YES" } else { "NO" },
        limit(p.max_time, "UNLIMITED"),
        nodes,
        p.priority_tier,
        p.total_cpus,
        p.nodes.len(),
        p.default_time
            .map_or("NONE".into(), |d| limit(Some(d), "NONE")),
        p.total_cpus,
        p.nodes.len(),
        p.total_gpus
    )
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
    ShowJobs(Option<JobId>),
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

/// Parses `scontrol` arguments (after the program name).
pub fn action(args: &[String]) -> Result<Action, String> {
    let lower: Vec<String> = args.iter().map(|a| a.to_ascii_lowercase()).collect();
    let word = |i: usize| lower.get(i).map(String::as_str);
    match (word(0), word(1)) {
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
                    s.parse::<u64>()
                        .map(JobId)
                        .map_err(|_| format!("Invalid job id specified: {s}"))
                })
                .transpose()?,
        )),
        (Some("show"), Some("node" | "nodes")) => Ok(Action::ShowNodes(args.get(2).cloned())),
        (Some("show"), Some("partition" | "partitions")) => {
            Ok(Action::ShowPartitions(args.get(2).cloned()))
        }
        (Some("show"), other) => Err(format!(
            "invalid entity: {} for keyword: show",
            other.unwrap_or("")
        )),
        (Some(h @ ("hold" | "uhold" | "release")), _) => {
            let ids = job_ids(h, &args[1..])?;
            Ok(Action::Remote(if h == "release" {
                Request::Release { ids }
            } else {
                Request::Hold { ids }
            }))
        }
        (Some(r @ ("requeue" | "requeuehold")), _) => Ok(Action::Remote(Request::Requeue {
            ids: job_ids(r, &args[1..])?,
            hold: r == "requeuehold",
        })),
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

fn join(parts: Vec<String>) -> String {
    parts.join("\n")
}

pub fn main(args: &[OsString]) -> i32 {
    let rest: Vec<String> = args[1..]
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if rest.first().is_some_and(|a| a == "-h" || a == "--help") {
        return emit(CMD, "usage: scontrol show job|node|partition [NAME] | show hostnames|hostlist LIST\n       scontrol update NodeName=LIST State=DRAIN|RESUME|DOWN [Reason=TEXT]\n       scontrol hold|release|requeue|requeuehold JOBID[,JOBID]\n");
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
                Action::ShowJobs(id) => (
                    Request::Jobs(JobFilter {
                        ids: id.into_iter().collect(),
                        ..Default::default()
                    }),
                    Some(id.map(|i| i.to_string())),
                ),
                Action::ShowNodes(n) => (Request::Nodes, Some(n)),
                Action::ShowPartitions(p) => (Request::Partitions, Some(p)),
                Action::Remote(r) => (r, None),
                Action::Hostnames(_) | Action::Hostlist { .. } => return 0,
            };
            let resp = match remote(req).await {
                Ok(r) => r,
                Err(e) => return fail(CMD, e),
            };
            let want = show.flatten();
            let text = match resp {
                Response::Jobs(jobs) => {
                    if jobs.is_empty() {
                        return fail(
                            CMD,
                            match want {
                                Some(id) => format!("Invalid job id specified: {id}"),
                                None => "No jobs in the system".into(),
                            },
                        );
                    }
                    join(jobs.iter().map(|j| show_job(j, now())).collect())
                }
                Response::Nodes(nodes) => {
                    let names = match &want {
                        Some(w) => match hostlist::expand(w) {
                            Ok(n) => Some(n),
                            Err(e) => return fail(CMD, format!("invalid hostlist {w}: {e}")),
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
                    join(sel)
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
                    join(sel)
                }
                Response::Done | Response::Affected { .. } => return 0,
                other => return fail(CMD, format!("unexpected answer {other:?}")),
            };
            emit(CMD, &format!("{text}\n"))
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
            Ok(Action::ShowJobs(Some(JobId(5))))
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
            matches!(action(&words("hold 3,4")), Ok(Action::Remote(Request::Hold { ids })) if ids == vec![JobId(3), JobId(4)])
        );
        assert!(
            matches!(action(&words("requeue 7")), Ok(Action::Remote(Request::Requeue { ids, hold: false })) if ids == vec![JobId(7)])
        );
        assert!(
            matches!(action(&words("requeuehold 7,8")), Ok(Action::Remote(Request::Requeue { ids, hold: true })) if ids == vec![JobId(7), JobId(8)])
        );
        assert!(action(&words("requeue")).is_err());
        assert!(action(&words("requeue seven")).is_err());
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
}
