//! Workload traces: the Standard Workload Format (plain or gzip) and the
//! Alibaba GPU trace (a node list and a pod list). Both become a
//! [`Workload`]: a machine and jobs with submit time, run time, time limit
//! and a request.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use scheduler_core::{AccountId, GpuRequest, JobRequest, NodeSpec, Secs, UserId};

/// Why a trace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot read {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {msg}")]
    Parse {
        path: PathBuf,
        line: usize,
        msg: String,
    },
    #[error(
        "{0}: no machine size in the trace header (MaxProcs); give --nodes and --cpus-per-node"
    )]
    NoMachine(PathBuf),
}

/// One job of a trace.
#[derive(Clone, Debug)]
pub struct TraceJob {
    pub submit: Secs,
    /// The recorded run time (see [`Workload::apply_overrun`] for a job
    /// that ran past its time limit).
    pub runtime: Secs,
    pub request: JobRequest,
}

/// What a replay does with a job that ran past its requested time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Overrun {
    /// The literature's convention: it runs its recorded time, and its
    /// estimate (the time limit) is raised to that.
    #[default]
    Extend,
    /// A live cluster's: it is cut at its limit.
    Kill,
}

impl Workload {
    /// Applies `mode` to every job that ran past its time limit; returns
    /// how many did.
    pub fn apply_overrun(&mut self, mode: Overrun) -> usize {
        let mut over = 0;
        for j in &mut self.jobs {
            let Some(limit) = j.request.time_limit else {
                continue;
            };
            if j.runtime <= limit {
                continue;
            }
            over += 1;
            match mode {
                Overrun::Extend => j.request.time_limit = Some(j.runtime),
                Overrun::Kill => j.runtime = limit,
            }
        }
        over
    }
}

/// A machine and the jobs that ran on it, sorted by submit time.
#[derive(Clone, Debug)]
pub struct Workload {
    pub name: String,
    pub nodes: Vec<NodeSpec>,
    pub jobs: Vec<TraceJob>,
    /// Records skipped as unusable (no size, negative run time).
    pub skipped: usize,
}

/// Overrides of the machine a trace describes.
#[derive(Clone, Debug, Default)]
pub struct MachineOverride {
    pub nodes: Option<u32>,
    pub cpus_per_node: Option<u32>,
    pub gpus_per_node: Option<u32>,
}

fn open(path: &Path) -> Result<Box<dyn BufRead>, TraceError> {
    let io = |source| TraceError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut reader = BufReader::new(file);
    let gz = reader.fill_buf().map_err(io)?.starts_with(&[0x1f, 0x8b]);
    Ok(if gz {
        Box::new(BufReader::new(flate2::read::MultiGzDecoder::new(reader)))
    } else {
        Box::new(reader) as Box<dyn BufRead>
    })
}

fn read_all(path: &Path) -> Result<String, TraceError> {
    let mut s = String::new();
    open(path)?
        .read_to_string(&mut s)
        .map_err(|source| TraceError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(s)
}

/// Reads an SWF trace. Each job asks for its processors as tasks of one
/// CPU spread over the machine's nodes; its time limit is the requested
/// time, or the run time where the trace has none.
pub fn read_swf(path: &Path, machine: &MachineOverride) -> Result<Workload, TraceError> {
    let text = read_all(path)?;
    let (mut max_procs, mut max_nodes) = (None, None);
    let mut jobs = Vec::new();
    let mut skipped = 0;
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if let Some(header) = line.strip_prefix(';') {
            if let Some((k, v)) = header.split_once(':') {
                let v = v.trim().parse::<u32>().ok();
                match k.trim() {
                    "MaxProcs" => max_procs = v,
                    "MaxNodes" => max_nodes = v,
                    _ => {}
                }
            }
            continue;
        }
        if line.is_empty() {
            continue;
        }
        let f: Vec<i64> = line
            .split_whitespace()
            .map(|x| x.parse::<f64>().map(|v| v as i64))
            .collect::<Result<_, _>>()
            .map_err(|e| TraceError::Parse {
                path: path.to_path_buf(),
                line: i + 1,
                msg: format!("not a number: {e}"),
            })?;
        if f.len() < 18 {
            return Err(TraceError::Parse {
                path: path.to_path_buf(),
                line: i + 1,
                msg: format!("{} fields, SWF has 18", f.len()),
            });
        }
        let (submit, run, alloc, req_procs, req_time, user) = (f[1], f[3], f[4], f[7], f[8], f[11]);
        let procs = if req_procs > 0 { req_procs } else { alloc };
        if submit < 0 || run < 0 || procs <= 0 {
            skipped += 1;
            continue;
        }
        let limit = if req_time > 0 { req_time } else { run.max(1) };
        let mut request = JobRequest::new(UserId(user.max(0) as u32));
        request.account = AccountId(f[12].max(0) as u32);
        request.ntasks = Some(procs as u32);
        request.time_limit = Some(limit as Secs);
        jobs.push(TraceJob {
            submit: submit as Secs,
            // Past its request or not: `apply_overrun` decides.
            runtime: run as Secs,
            request,
        });
    }
    let nodes_n = machine.nodes.or(max_nodes).or(max_procs);
    let Some(nodes_n) = nodes_n else {
        return Err(TraceError::NoMachine(path.to_path_buf()));
    };
    let cpus = machine
        .cpus_per_node
        .unwrap_or_else(|| match (max_procs, max_nodes) {
            (Some(p), Some(n)) if n > 0 && machine.nodes.is_none() => (p / n).max(1),
            _ => 1,
        });
    let nodes = (0..nodes_n)
        .map(|i| {
            NodeSpec::new(format!("n{i}"), cpus, 1 << 20)
                .with_gpus(machine.gpus_per_node.unwrap_or(0), 4)
        })
        .collect();
    jobs.sort_by_key(|j| j.submit);
    Ok(Workload {
        name: path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        nodes,
        jobs,
        skipped,
    })
}

fn csv_rows(path: &Path) -> Result<(Vec<String>, Vec<Vec<String>>), TraceError> {
    let text = read_all(path)?;
    let mut lines = text.lines();
    let header: Vec<String> = lines
        .next()
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().to_string())
        .collect();
    let rows = lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split(',').map(|s| s.trim().to_string()).collect())
        .collect();
    Ok((header, rows))
}

fn column(path: &Path, header: &[String], name: &str) -> Result<usize, TraceError> {
    header
        .iter()
        .position(|h| h == name)
        .ok_or_else(|| TraceError::Parse {
            path: path.to_path_buf(),
            line: 1,
            msg: format!("no column {name:?}"),
        })
}

fn num(path: &Path, line: usize, v: &str) -> Result<i64, TraceError> {
    if v.is_empty() {
        return Ok(-1);
    }
    v.parse::<f64>()
        .map(|x| x as i64)
        .map_err(|_| TraceError::Parse {
            path: path.to_path_buf(),
            line,
            msg: format!("not a number: {v:?}"),
        })
}

/// Reads the Alibaba GPU trace: `nodes` (`sn,cpu_milli,memory_mib,gpu,model`)
/// and `pods` (`name,cpu_milli,memory_mib,num_gpu,gpu_milli,...,
/// creation_time,deletion_time,scheduled_time`). Fractional GPUs round up to
/// one whole GPU; the run time is deletion minus scheduled (or creation)
/// time and doubles as the time limit. `gpus_per_group` sets the topology
/// groups (the trace has none; 0 puts each node's GPUs in one group).
pub fn read_alibaba(
    nodes: &Path,
    pods: &Path,
    gpus_per_group: u32,
) -> Result<Workload, TraceError> {
    let (h, rows) = csv_rows(nodes)?;
    let (c_sn, c_cpu, c_mem, c_gpu) = (
        column(nodes, &h, "sn")?,
        column(nodes, &h, "cpu_milli")?,
        column(nodes, &h, "memory_mib")?,
        column(nodes, &h, "gpu")?,
    );
    let mut specs = Vec::with_capacity(rows.len());
    for (i, r) in rows.iter().enumerate() {
        let get = |c: usize| r.get(c).map_or("", String::as_str);
        let cpus = (num(nodes, i + 2, get(c_cpu))?.max(0) as u64).div_ceil(1000) as u32;
        let mem = num(nodes, i + 2, get(c_mem))?.max(0) as u64;
        let gpus = num(nodes, i + 2, get(c_gpu))?.clamp(0, 64) as u32;
        specs.push(
            NodeSpec::new(get(c_sn).to_string(), cpus.max(1), mem).with_gpus(gpus, gpus_per_group),
        );
    }
    let (h, rows) = csv_rows(pods)?;
    let c_cpu = column(pods, &h, "cpu_milli")?;
    let c_mem = column(pods, &h, "memory_mib")?;
    let c_ngpu = column(pods, &h, "num_gpu")?;
    // The resampled lists have no times: pods arrive one a second, in
    // order, and never end (replay them with --fill).
    let c_create = column(pods, &h, "creation_time").ok();
    let c_delete = column(pods, &h, "deletion_time").ok();
    let c_sched = column(pods, &h, "scheduled_time").ok();
    let mut jobs = Vec::with_capacity(rows.len());
    let mut skipped = 0;
    for (i, r) in rows.iter().enumerate() {
        let line = i + 2;
        let get = |c: usize| r.get(c).map_or("", String::as_str);
        let field = |c: Option<usize>| match c {
            Some(c) => num(pods, line, get(c)),
            None => Ok(-1),
        };
        let (create, delete, sched) = (field(c_create)?, field(c_delete)?, field(c_sched)?);
        let (create, runtime) = match (c_create, c_delete) {
            (Some(_), Some(_)) => {
                let started = if sched >= 0 { sched } else { create };
                if create < 0 || delete < started {
                    skipped += 1;
                    continue;
                }
                (create, (delete - started).max(1) as Secs)
            }
            _ => (i as i64, scheduler_core::INFINITE),
        };
        let mut request = JobRequest::new(UserId(0));
        request.cpus_per_task = (num(pods, line, get(c_cpu))?.max(0) as u64)
            .div_ceil(1000)
            .max(1) as u32;
        request.memory_per_node_mb = Some(num(pods, line, get(c_mem))?.max(0) as u64);
        let gpus = num(pods, line, get(c_ngpu))?.max(0) as u32;
        if gpus > 0 {
            request.gpus = GpuRequest::PerNode(gpus);
        }
        request.time_limit = (runtime < scheduler_core::INFINITE).then_some(runtime);
        jobs.push(TraceJob {
            submit: create as Secs,
            runtime,
            request,
        });
    }
    jobs.sort_by_key(|j| j.submit);
    Ok(Workload {
        name: pods
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        nodes: specs,
        jobs,
        skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn temp(name: &str, body: &[u8]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("corral-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let p = dir.join(name);
        std::fs::File::create(&p)
            .and_then(|mut f| f.write_all(body))
            .expect("write");
        p
    }

    const SWF: &str = "; MaxProcs: 8\n; MaxNodes: 4\n\
        1 0 5 100 2 -1 -1 2 200 -1 1 3 3 -1 -1 -1 -1 -1\n\
        2 10 0 500 -1 -1 -1 4 300 -1 1 4 4 -1 -1 -1 -1 -1\n\
        3 20 0 -1 1 -1 -1 1 60 -1 0 4 4 -1 -1 -1 -1 -1\n";

    #[test]
    fn swf_plain_and_gzip_read_the_same() {
        let plain =
            read_swf(&temp("t.swf", SWF.as_bytes()), &MachineOverride::default()).expect("plain");
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(SWF.as_bytes()).expect("gzip");
        let packed = read_swf(
            &temp("t.swf.gz", &gz.finish().expect("gzip")),
            &MachineOverride::default(),
        )
        .expect("gz");
        assert_eq!(plain.nodes.len(), 4);
        assert_eq!(plain.nodes[0].cpus, 2);
        assert_eq!(plain.jobs.len(), 2);
        assert_eq!(plain.skipped, 1);
        assert_eq!(plain.jobs[1].runtime, 500, "the recorded run time");
        assert_eq!(plain.jobs[1].request.ntasks, Some(4));
        assert_eq!(packed.jobs.len(), plain.jobs.len());
        assert_eq!(packed.jobs[0].request, plain.jobs[0].request);
    }

    /// Job 2 of the trace ran 500 s of its 300 s request.
    #[test]
    fn an_overrun_is_extended_or_killed() {
        let read = || read_swf(&temp("o.swf", SWF.as_bytes()), &MachineOverride::default());
        let mut extend = read().expect("read");
        assert_eq!(extend.apply_overrun(Overrun::Extend), 1);
        assert_eq!(extend.jobs[1].runtime, 500);
        assert_eq!(extend.jobs[1].request.time_limit, Some(500));
        let mut kill = read().expect("read");
        assert_eq!(kill.apply_overrun(Overrun::Kill), 1);
        assert_eq!(kill.jobs[1].runtime, 300);
        assert_eq!(kill.jobs[1].request.time_limit, Some(300));
        // Within its request, a job is left as it is.
        assert_eq!(
            (kill.jobs[0].runtime, kill.jobs[0].request.time_limit),
            (100, Some(200))
        );
    }

    #[test]
    fn swf_reports_bad_lines() {
        let err =
            read_swf(&temp("bad.swf", b"1 2 3\n"), &MachineOverride::default()).expect_err("bad");
        assert!(err.to_string().contains(":1: 3 fields"), "{err}");
    }

    #[test]
    fn alibaba_rounds_fractional_gpus_up() {
        let nodes = temp(
            "n.csv",
            b"sn,cpu_milli,memory_mib,gpu,model\nx,32000,1000,8,V100\n",
        );
        let pods = temp(
            "p.csv",
            b"name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n\
              a,1500,10,1,460,,LS,Running,5,105,10\n\
              b,1000,10,0,0,,LS,Running,0,50,0\n",
        );
        let w = read_alibaba(&nodes, &pods, 0).expect("read");
        assert_eq!(w.nodes[0].gpus.len(), 8);
        assert_eq!(w.jobs[0].request.gpus, GpuRequest::None);
        assert_eq!(w.jobs[1].request.gpus, GpuRequest::PerNode(1));
        assert_eq!(w.jobs[1].request.cpus_per_task, 2);
        assert_eq!(w.jobs[1].runtime, 95);
    }
}
