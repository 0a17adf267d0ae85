//! One cgroup per job per node, one below it per step: the job's CPUs
//! (cpuset), memory limit, pids limit and GPU devices are set on the job's
//! cgroup; every task joins its step's cgroup before it execs, so it and
//! everything it forks stay there (setsid and double forks included: a
//! user cannot move a process out of a root-owned cgroup). The end of a
//! step and of a job kill what their cgroup holds, and the job's usage
//! (CPU time, peak memory, OOM kills) is read from it before it goes.
//!
//! Both cgroup versions: v1 (one hierarchy per controller; this is what
//! the CI machine has) and v2 (one unified hierarchy; device control by an
//! eBPF program, see [`bpf`]). Layout, under the configured parent:
//! `PARENT/NODE/job_ID.RUN/step_STEP`.
//!
//! The cgroup filesystem is written directly (a few files per job) rather
//! than through cgroups-rs: its v1 `create` drops mkdir errors, its v2
//! code assumes the unified hierarchy at `/sys/fs/cgroup` (a hybrid
//! machine mounts it elsewhere), and the parts that matter most here
//! (joining between fork and exec, killing through the freezer, the
//! device program) it does not have.

pub mod bpf;
pub mod dynmods;
mod spare;

use std::collections::BTreeSet;
use std::fs;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use corral_proto::msg::{JobRun, StepId};
use nix::sys::signal::Signal;

pub use bpf::Denied;
pub use spare::{JobCgroup, SPARES_KEPT, SPARE_MEMORY_MAX, SPARE_MIN_LIMIT};

/// A cgroup v1 controller the agent uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Controller {
    Cpuset,
    Memory,
    Pids,
    Devices,
    Freezer,
    Cpuacct,
}

impl Controller {
    pub const ALL: [Controller; 6] = [
        Controller::Cpuset,
        Controller::Memory,
        Controller::Pids,
        Controller::Devices,
        Controller::Freezer,
        Controller::Cpuacct,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Controller::Cpuset => "cpuset",
            Controller::Memory => "memory",
            Controller::Pids => "pids",
            Controller::Devices => "devices",
            Controller::Freezer => "freezer",
            Controller::Cpuacct => "cpuacct",
        }
    }
}

/// Where the node's cgroup hierarchies are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// A mount per controller (co-mounted controllers share one path).
    V1 { mounts: Vec<(Controller, PathBuf)> },
    /// The unified hierarchy's mount.
    V2 { root: PathBuf },
}

impl Layout {
    /// What this machine has: v1 when its controllers are mounted as v1
    /// hierarchies (a hybrid machine's `unified` mount holds none of
    /// them), else the cgroup2 mount.
    pub fn detect() -> Result<Layout, CgroupError> {
        let mounts = procfs::process::Process::myself()
            .and_then(|p| p.mountinfo())
            .map_err(|e| CgroupError::Detect(e.to_string()))?;
        let mut v1 = Vec::new();
        let mut v2 = None;
        for m in mounts.iter() {
            match m.fs_type.as_str() {
                "cgroup" => {
                    for c in Controller::ALL {
                        if m.super_options.contains_key(c.name()) {
                            v1.push((c, m.mount_point.clone()));
                        }
                    }
                }
                "cgroup2" if v2.is_none() => v2 = Some(m.mount_point.clone()),
                _ => {}
            }
        }
        let has = |c: Controller| v1.iter().any(|(x, _)| *x == c);
        if has(Controller::Memory) || has(Controller::Freezer) {
            v1.sort();
            v1.dedup_by(|a, b| a.0 == b.0);
            return Ok(Layout::V1 { mounts: v1 });
        }
        match v2 {
            Some(root) => Ok(Layout::V2 { root }),
            None => Err(CgroupError::Detect("no cgroup hierarchy is mounted".into())),
        }
    }
}

/// Why a cgroup operation failed.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("finding the cgroup hierarchies: {0}")]
    Detect(String),
    #[error("creating cgroup {path}")]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing {value:?} to {path}")]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: std::io::Error,
    },
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cgroup device control")]
    Devices(#[source] bpf::BpfError),
    #[error(
        "cgroup name {0:?}: one or more plain path components, no '.', '..' or '/' at the ends"
    )]
    BadName(String),
}

/// A cgroup path under each hierarchy's mount: plain components only, so
/// a parent or node name can never reach (and kill or remove) cgroups
/// outside the agent's own.
fn relative(name: &str, allow_empty: bool) -> Result<PathBuf, CgroupError> {
    let bad = || CgroupError::BadName(name.to_string());
    if name.is_empty() {
        return if allow_empty {
            Ok(PathBuf::new())
        } else {
            Err(bad())
        };
    }
    let p = Path::new(name);
    let plain = p
        .components()
        .all(|c| matches!(c, std::path::Component::Normal(_)));
    if !plain || name.starts_with('/') || name.ends_with('/') || name.contains("//") {
        return Err(bad());
    }
    Ok(p.to_path_buf())
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    fs::write(path, value).map_err(|source| CgroupError::Write {
        path: path.to_path_buf(),
        value: value.to_string(),
        source,
    })
}

/// Writes each of `values` to `path` in a write of its own (a cgroup
/// file takes one rule a write), all through one descriptor.
fn write_each(path: &Path, values: &[String]) -> Result<(), CgroupError> {
    let failed = |value: &String| {
        let value = value.clone();
        move |source| CgroupError::Write {
            path: path.to_path_buf(),
            value,
            source,
        }
    };
    let Some(first) = values.first() else {
        return Ok(());
    };
    let mut f = fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(failed(first))?;
    for v in values {
        std::io::Write::write_all(&mut f, v.as_bytes()).map_err(failed(v))?;
    }
    Ok(())
}

fn read(path: &Path) -> Result<String, CgroupError> {
    fs::read_to_string(path).map_err(|source| CgroupError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// A `key value` line's value in a flat-keyed cgroup file.
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

fn mkdir(path: &Path) -> Result<bool, CgroupError> {
    match fs::create_dir(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(source) => Err(CgroupError::Create {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Parses a cpu list (`0-3,8,10-11`).
pub fn parse_cpu_list(s: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
                    out.extend(a..=b.min(a.saturating_add(1 << 16)));
                }
            }
            None => out.extend(part.parse::<u32>().ok()),
        }
    }
    out
}

/// Formats CPU ids as a cpu list, ranges folded.
pub fn cpu_list(cpus: &BTreeSet<u32>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut it = cpus.iter().copied().peekable();
    while let Some(start) = it.next() {
        let mut end = start;
        while it.peek() == Some(&(end + 1)) {
            end += 1;
            it.next();
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
    }
    out.join(",")
}

/// What a job may use on this node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// The CPU ids the controller allocated.
    pub cpus: Vec<u32>,
    /// `None`: no memory limit.
    pub memory_bytes: Option<u64>,
    /// The GPU devices of this node the job was not given.
    pub denied: Vec<Denied>,
}

/// What a job used on this node, from its cgroup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub cpu_ns: u64,
    /// Peak memory of the job's processes together.
    pub max_rss_bytes: u64,
}

/// Descriptors of a step's `cgroup.procs` files, opened by the agent; a
/// task's child writes `0` to each between fork and exec, which moves it
/// into the step's cgroups before it runs anything.
#[derive(Debug)]
pub struct Join {
    procs: Vec<OwnedFd>,
}

impl Join {
    /// Moves the calling process into the step's cgroups. Only `write(2)`:
    /// safe between fork and exec.
    pub fn enter(&self) -> Result<(), nix::errno::Errno> {
        for fd in &self.procs {
            nix::unistd::write(fd, b"0")?;
        }
        Ok(())
    }
}

/// The fewest PIDs a job gets however few its CPUs: a shell, srun and a
/// program's threads.
pub const PIDS_FLOOR: u64 = 256;

/// The node's cgroups for jobs.
#[derive(Debug)]
pub struct Cgroups {
    layout: Layout,
    /// `PARENT/NODE`, relative to each hierarchy's mount.
    base: PathBuf,
    /// The CPUs jobs may be placed on (the parent's effective cpuset).
    host_cpus: Vec<u32>,
    /// v2: controllers enabled for jobs.
    v2_controllers: Vec<String>,
    /// The most PIDs (processes and threads) one job may have.
    pids_max: Option<u64>,
    /// PIDs a job gets for each of its CPUs (0: `pids_max` for every job).
    pids_per_cpu: u64,
    /// v1: the kernel accounts swap (`memory.memsw.*`).
    memsw: bool,
    /// v1: ended jobs' cgroups kept for the next jobs ([`spare`]).
    spares: parking_lot::Mutex<spare::Spares>,
}

impl Cgroups {
    /// Sets up `PARENT/NODE` in every hierarchy of `layout`: v1 cpusets
    /// copy their parent's CPUs and memory nodes; v2 enables the cpuset,
    /// memory, pids and cpu controllers down to it (those the kernel has).
    /// `NODE` may be empty only to name a whole cluster's parent
    /// ([`Cgroups::remove_cluster`]); `PARENT` never.
    pub fn new(
        layout: Layout,
        parent: &str,
        node: &str,
        pids_max: Option<u64>,
    ) -> Result<Cgroups, CgroupError> {
        let base = relative(parent, false)?.join(relative(node, true)?);
        if node.contains('/') {
            return Err(CgroupError::BadName(node.to_string()));
        }
        let mut cg = Cgroups {
            layout,
            base,
            host_cpus: Vec::new(),
            v2_controllers: Vec::new(),
            pids_max,
            pids_per_cpu: 0,
            memsw: false,
            spares: Default::default(),
        };
        if let Layout::V2 { root } = &cg.layout {
            let available = read(&root.join("cgroup.controllers"))?;
            cg.v2_controllers = ["cpuset", "cpu", "memory", "pids"]
                .into_iter()
                .filter(|c| available.split_whitespace().any(|a| a == *c))
                .map(String::from)
                .collect();
        }
        cg.make_base()?;
        match &cg.layout {
            Layout::V1 { .. } => {
                if let Some(dir) = cg.dir(Controller::Cpuset, &cg.base) {
                    cg.host_cpus = parse_cpu_list(&read(&dir.join("cpuset.effective_cpus"))?);
                }
                cg.memsw = cg
                    .dir(Controller::Memory, &cg.base)
                    .is_some_and(|d| d.join("memory.memsw.limit_in_bytes").exists());
            }
            Layout::V2 { root } => {
                if cg.has(Controller::Cpuset) {
                    let effective = root.join(&cg.base).join("cpuset.cpus.effective");
                    cg.host_cpus = parse_cpu_list(&read(&effective)?);
                }
            }
        }
        if cg.host_cpus.is_empty() {
            cg.host_cpus =
                (0..std::thread::available_parallelism().map_or(1, |n| n.get() as u32)).collect();
        }
        Ok(cg)
    }

    /// Makes `PARENT/NODE` in every hierarchy where it is missing, set up
    /// for jobs below it: v1 cpusets copy their parent's CPUs and memory
    /// nodes, and jobs and steps the node's (`clone_children`); v2
    /// enables the controllers in use down to it. Safe to repeat.
    fn make_base(&self) -> Result<(), CgroupError> {
        let mut rel = PathBuf::new();
        match &self.layout {
            Layout::V1 { .. } => {
                for part in self.base.components() {
                    rel.push(part);
                    for dir in self.dirs(&rel) {
                        mkdir(&dir)?;
                    }
                    if let Some(dir) = self.dir(Controller::Cpuset, &rel) {
                        cpuset_inherit(&dir)?;
                    }
                }
                if let Some(dir) = self.dir(Controller::Cpuset, &self.base) {
                    // Jobs and steps below copy the node's CPUs and memory
                    // nodes when they are made (a job then narrows its CPUs).
                    write(&dir.join("cgroup.clone_children"), "1")?;
                }
            }
            Layout::V2 { root } => {
                let enable: String = self
                    .v2_controllers
                    .iter()
                    .map(|c| format!("+{c}"))
                    .collect::<Vec<_>>()
                    .join(" ");
                let mut dir = root.clone();
                for part in self.base.components() {
                    if !enable.is_empty() {
                        write(&dir.join("cgroup.subtree_control"), &enable)?;
                    }
                    dir.push(part);
                    mkdir(&dir)?;
                }
                if !enable.is_empty() {
                    write(&dir.join("cgroup.subtree_control"), &enable)?;
                }
            }
        }
        Ok(())
    }

    /// A job gets `per_cpu` PIDs for each of its CPUs (at least
    /// [`PIDS_FLOOR`], at most the cap given to [`Cgroups::new`]), so one
    /// job's fork loop cannot take what the node's other jobs need; and
    /// all jobs of the node together at most `node_max` (the node's
    /// cgroup), leaving the rest of the machine's PID space to the agent
    /// and the system.
    pub fn with_pids(
        mut self,
        per_cpu: u64,
        node_max: Option<u64>,
    ) -> Result<Cgroups, CgroupError> {
        self.pids_per_cpu = per_cpu;
        if let (Some(max), Some(dir)) = (node_max, self.pids_dir(&self.base)) {
            write(&dir.join("pids.max"), &max.to_string())?;
        }
        Ok(self)
    }

    /// All jobs of the node together may use at most `bytes` of memory
    /// (the node's cgroup): what the node offers jobs, the machine's less
    /// what the agent keeps for itself and the system.
    pub fn with_memory(self, bytes: Option<u64>) -> Result<Cgroups, CgroupError> {
        let Some(bytes) = bytes else {
            return Ok(self);
        };
        match &self.layout {
            Layout::V1 { .. } => {
                if let Some(dir) = self.dir(Controller::Memory, &self.base) {
                    write(&dir.join("memory.limit_in_bytes"), &bytes.to_string())?;
                }
            }
            Layout::V2 { root } => {
                if self.has(Controller::Memory) {
                    write(
                        &root.join(&self.base).join("memory.max"),
                        &bytes.to_string(),
                    )?;
                }
            }
        }
        Ok(self)
    }

    fn pids_dir(&self, rel: &Path) -> Option<PathBuf> {
        match &self.layout {
            Layout::V1 { .. } => self.dir(Controller::Pids, rel),
            Layout::V2 { root } => self.has(Controller::Pids).then(|| root.join(rel)),
        }
    }

    /// The PIDs one job with `limits` may have.
    fn job_pids(&self, limits: &Limits) -> Option<u64> {
        if self.pids_per_cpu == 0 {
            return self.pids_max;
        }
        let share = self
            .pids_per_cpu
            .saturating_mul(limits.cpus.len() as u64)
            .max(PIDS_FLOOR);
        Some(self.pids_max.map_or(share, |cap| share.min(cap)))
    }

    /// Whether a controller is in use here.
    pub fn has(&self, c: Controller) -> bool {
        match &self.layout {
            Layout::V1 { mounts } => mounts.iter().any(|(x, _)| *x == c),
            Layout::V2 { .. } => match c {
                // The unified hierarchy always has freezing, device
                // programs and CPU accounting.
                Controller::Devices | Controller::Freezer | Controller::Cpuacct => true,
                _ => self.v2_controllers.iter().any(|x| x == c.name()),
            },
        }
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// `rel` in the hierarchy of `c` (v2: the one hierarchy).
    fn dir(&self, c: Controller, rel: &Path) -> Option<PathBuf> {
        match &self.layout {
            Layout::V1 { mounts } => mounts
                .iter()
                .find(|(x, _)| *x == c)
                .map(|(_, m)| m.join(rel)),
            Layout::V2 { root } => Some(root.join(rel)),
        }
    }

    /// `rel` in every hierarchy, each once.
    fn dirs(&self, rel: &Path) -> Vec<PathBuf> {
        match &self.layout {
            Layout::V1 { mounts } => {
                let mut v: Vec<PathBuf> = mounts.iter().map(|(_, m)| m.join(rel)).collect();
                v.sort();
                v.dedup();
                v
            }
            Layout::V2 { root } => vec![root.join(rel)],
        }
    }

    fn job_rel(&self, job: JobRun) -> PathBuf {
        self.base.join(format!("job_{}.{}", job.job.0, job.run))
    }

    fn step_rel(&self, job: JobRun, step: StepId) -> PathBuf {
        let name = if step == StepId::BATCH {
            "step_batch".to_string()
        } else {
            format!("step_{}", step.0)
        };
        self.job_rel(job).join(name)
    }

    /// Whether a job's cgroup can be made now: a `probe` cgroup made and
    /// removed under the node's in every hierarchy (what the node's
    /// health checks after a job's could not be made).
    pub fn probe(&self) -> Result<(), CgroupError> {
        let rel = self.base.join("probe");
        for dir in self.dirs(&rel) {
            mkdir(&dir)?;
            let _ = fs::remove_dir(&dir);
        }
        Ok(())
    }

    /// The job's cgroup in the hierarchy of `c`, if it is in use.
    pub fn job_dir(&self, c: Controller, job: JobRun) -> Option<PathBuf> {
        self.has(c)
            .then(|| self.dir(c, &self.job_rel(job)))
            .flatten()
    }

    /// The job's cgroup path in the first hierarchy (for tests and logs).
    pub fn job_path(&self, job: JobRun) -> PathBuf {
        self.dirs(&self.job_rel(job)).swap_remove(0)
    }

    /// The cpuset for allocated CPU ids: each id on the host CPU of the
    /// same rank, wrapping when a node declares more CPUs than the host
    /// has (simulated nodes on one machine).
    pub fn cpuset_for(&self, allocated: &[u32]) -> String {
        let host = &self.host_cpus;
        let set: BTreeSet<u32> = allocated
            .iter()
            .map(|&i| host[i as usize % host.len()])
            .collect();
        cpu_list(&set)
    }

    /// Sets the job's cgroup up with its limits, unless it exists (a later
    /// step of the same run): a spare renamed to it where one is kept
    /// ([`spare`]), else made.
    pub fn create_job(&self, job: JobRun, limits: &Limits) -> Result<JobCgroup, CgroupError> {
        let rel = self.job_rel(job);
        let cpus = self.cpuset_for(&limits.cpus);
        if let Some(reused) = self.reuse_spare(&rel, &cpus, limits) {
            return Ok(reused);
        }
        let created = match self.make_job_dirs(&rel) {
            // The node's own cgroup is gone (removed by hand, or by a
            // cluster of the same parent that shut down): made again, as
            // at start, rather than failing every job sent here.
            Err(CgroupError::Create { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                tracing::warn!(cgroup = %self.base.display(), "the node's cgroup was gone; made again");
                self.make_base()?;
                self.make_job_dirs(&rel)?
            }
            made => made?,
        };
        if !created {
            return Ok(JobCgroup::Existed);
        }
        let result = match &self.layout {
            Layout::V1 { .. } => self.limit_v1(&rel, &cpus, limits),
            Layout::V2 { .. } => self.limit_v2(&rel, &cpus, limits),
        };
        if result.is_err() {
            self.remove(&rel, &[]);
        }
        result.map(|()| JobCgroup::Made)
    }

    /// Makes `rel` in every hierarchy; true when it made any.
    fn make_job_dirs(&self, rel: &Path) -> Result<bool, CgroupError> {
        let mut created = false;
        for dir in self.dirs(rel) {
            created |= mkdir(&dir)?;
        }
        Ok(created)
    }

    fn limit_v1(&self, rel: &Path, cpus: &str, limits: &Limits) -> Result<(), CgroupError> {
        if let Some(dir) = self.dir(Controller::Cpuset, rel) {
            // Memory nodes came from the node's cgroup (clone_children).
            write(&dir.join("cpuset.cpus"), cpus)?;
        }
        if let (Some(dir), Some(bytes)) = (self.dir(Controller::Memory, rel), limits.memory_bytes) {
            write(&dir.join("memory.limit_in_bytes"), &bytes.to_string())?;
            // Swap counts too, where the kernel accounts it.
            if self.memsw {
                write(&dir.join("memory.memsw.limit_in_bytes"), &bytes.to_string())?;
            }
        }
        if let (Some(dir), Some(max)) = (self.dir(Controller::Pids, rel), self.job_pids(limits)) {
            write(&dir.join("pids.max"), &max.to_string())?;
        }
        if let Some(dir) = self.dir(Controller::Devices, rel) {
            let rules: Vec<String> = limits
                .denied
                .iter()
                .map(|d| format!("c {}:{} rwm", d.major, d.minor))
                .collect();
            write_each(&dir.join("devices.deny"), &rules)?;
        }
        Ok(())
    }

    fn limit_v2(&self, rel: &Path, cpus: &str, limits: &Limits) -> Result<(), CgroupError> {
        let Layout::V2 { root } = &self.layout else {
            return Ok(());
        };
        let dir = root.join(rel);
        if self.has(Controller::Cpuset) {
            write(&dir.join("cpuset.cpus"), cpus)?;
        }
        if let (true, Some(bytes)) = (self.has(Controller::Memory), limits.memory_bytes) {
            write(&dir.join("memory.max"), &bytes.to_string())?;
            let swap = dir.join("memory.swap.max");
            if swap.exists() {
                write(&swap, "0")?;
            }
        }
        if let (true, Some(max)) = (self.has(Controller::Pids), self.job_pids(limits)) {
            write(&dir.join("pids.max"), &max.to_string())?;
        }
        if !limits.denied.is_empty() {
            let fd = fs::File::open(&dir).map_err(|source| CgroupError::Read {
                path: dir.clone(),
                source,
            })?;
            bpf::attach(&fd, &limits.denied).map_err(CgroupError::Devices)?;
        }
        Ok(())
    }

    /// Creates a step's cgroup (in its job's, which must exist) and opens
    /// what its tasks need to join it. Steps exist only where processes
    /// are listed and killed (v1: the freezer's hierarchy); in the other
    /// v1 hierarchies a task joins its job's cgroup, which holds the
    /// limits: a cgroup costs tens of microseconds to make and remove in
    /// each hierarchy, and a step needs no limits of its own.
    pub fn create_step(&self, job: JobRun, step: StepId) -> Result<Join, CgroupError> {
        let rel = self.step_rel(job, step);
        let own = self.dir(self.kill_controller(), &rel);
        let job_rel = self.job_rel(job);
        let mut procs = Vec::new();
        for dir in self.dirs(&job_rel) {
            let dir = match &own {
                Some(step_dir) if step_dir.parent() == Some(dir.as_path()) => {
                    mkdir(step_dir)?;
                    step_dir.clone()
                }
                _ => dir,
            };
            let path = dir.join("cgroup.procs");
            let fd = fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(|source| CgroupError::Read { path, source })?;
            procs.push(OwnedFd::from(fd));
        }
        Ok(Join { procs })
    }

    /// The cgroups directly below `rel` (a job's steps), by name.
    fn children(&self, rel: &Path) -> Vec<std::ffi::OsString> {
        let Some(dir) = self.dir(self.kill_controller(), rel) else {
            return Vec::new();
        };
        fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.file_name())
            .collect()
    }

    /// Pids in the cgroup `rel` and in `children` below it.
    fn pids(&self, rel: &Path, children: &[std::ffi::OsString]) -> Vec<i32> {
        let Some(top) = self.dir(self.kill_controller(), rel) else {
            return Vec::new();
        };
        let dirs = std::iter::once(top.clone()).chain(children.iter().map(|c| top.join(c)));
        let mut out = Vec::new();
        for dir in dirs {
            if let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) {
                out.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
        }
        out
    }

    /// The hierarchy whose membership kills go by: the freezer's (v1).
    fn kill_controller(&self) -> Controller {
        if self.has(Controller::Freezer) {
            Controller::Freezer
        } else {
            Controller::Pids
        }
    }

    /// Kills every process in `rel` and its `children` and waits (up to
    /// `wait`) for them to be gone. Freezes first so nothing forks between
    /// the listing and the kill; v2 uses `cgroup.kill` where the kernel
    /// has it. True when the cgroups are empty.
    fn kill(&self, rel: &Path, children: &[std::ffi::OsString], wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        let Some(dir) = self.dir(self.kill_controller(), rel) else {
            return true;
        };
        let v2 = matches!(self.layout, Layout::V2 { .. });
        loop {
            if self.pids(rel, children).is_empty() {
                return true;
            }
            if v2 && dir.join("cgroup.kill").exists() {
                let _ = fs::write(dir.join("cgroup.kill"), "1");
            } else {
                let (file, frozen, thawed) = if v2 {
                    ("cgroup.freeze", "1", "0")
                } else {
                    ("freezer.state", "FROZEN", "THAWED")
                };
                let freeze =
                    self.has(Controller::Freezer) && fs::write(dir.join(file), frozen).is_ok();
                if freeze && !v2 {
                    // FREEZING until every task has stopped.
                    let until = Instant::now() + Duration::from_millis(100);
                    while fs::read_to_string(dir.join(file)).is_ok_and(|s| s.trim() != "FROZEN")
                        && Instant::now() < until
                    {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
                for pid in self.pids(rel, children) {
                    let _ =
                        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
                }
                if freeze {
                    let _ = fs::write(dir.join(file), thawed);
                }
            }
            if Instant::now() >= deadline {
                return self.pids(rel, children).is_empty();
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Removes `rel`'s `children` (steps: only in the kill hierarchy),
    /// then `rel` in every hierarchy. A cgroup still busy a second later
    /// stays (and is logged).
    fn remove(&self, rel: &Path, children: &[std::ffi::OsString]) {
        let steps = self.dir(self.kill_controller(), rel);
        let steps = steps
            .iter()
            .flat_map(|d| children.iter().map(|c| d.join(c)));
        for dir in steps.chain(self.dirs(rel)) {
            rmdir(&dir);
        }
    }

    /// Kills what is left of a step and removes its cgroup. True when a
    /// process of the job was killed for memory while the step ran
    /// (`baseline`: [`Cgroups::oom_kills`] when it started).
    pub fn end_step(&self, job: JobRun, step: StepId, baseline: u64) -> bool {
        let rel = self.step_rel(job, step);
        if !self.kill(&rel, &[], Duration::from_secs(5)) {
            tracing::warn!(job = %job.job, step = %step, "processes of the step survived SIGKILL");
        }
        let oom = self.oom_kills(job) > baseline;
        if let Some(dir) = self.dir(self.kill_controller(), &rel) {
            rmdir(&dir);
        }
        oom
    }

    /// Stops (`frozen`) or lets go on every process of the job's run here,
    /// its steps' too (`scontrol suspend` and `resume`): v2's
    /// `cgroup.freeze`, v1's freezer. A frozen process cannot catch or
    /// ignore it, and a task a step adds while frozen is frozen too. False
    /// when the node has no freezer or the job no cgroup.
    pub fn freeze_job(&self, job: JobRun, frozen: bool) -> bool {
        if !self.has(Controller::Freezer) {
            return false;
        }
        let Some(dir) = self.dir(Controller::Freezer, &self.job_rel(job)) else {
            return false;
        };
        let (file, value) = match (&self.layout, frozen) {
            (Layout::V2 { .. }, true) => ("cgroup.freeze", "1"),
            (Layout::V2 { .. }, false) => ("cgroup.freeze", "0"),
            (Layout::V1 { .. }, true) => ("freezer.state", "FROZEN"),
            (Layout::V1 { .. }, false) => ("freezer.state", "THAWED"),
        };
        write(&dir.join(file), value).is_ok()
    }

    /// Whether the job's cgroup is frozen now (v2: every task stopped;
    /// v1: `FROZEN`, not still `FREEZING`).
    pub fn job_frozen(&self, job: JobRun) -> bool {
        let Some(dir) = self.dir(Controller::Freezer, &self.job_rel(job)) else {
            return false;
        };
        match self.layout {
            Layout::V2 { .. } => {
                fs::read_to_string(dir.join("cgroup.events"))
                    .ok()
                    .and_then(|t| keyed(&t, "frozen"))
                    == Some(1)
            }
            Layout::V1 { .. } => {
                fs::read_to_string(dir.join("freezer.state")).is_ok_and(|s| s.trim() == "FROZEN")
            }
        }
    }

    /// Kills every process of the job's run here (all steps).
    pub fn kill_job(&self, job: JobRun) -> bool {
        let rel = self.job_rel(job);
        self.kill(&rel, &self.children(&rel), Duration::from_secs(5))
    }

    /// Kills what is left of the job and reads its usage; the cgroup
    /// stays for [`Cgroups::remove_job`] (which the agent calls after it
    /// has told ctld, to keep removal off the job's critical path).
    pub fn finish_job(&self, job: JobRun) -> Usage {
        let rel = self.job_rel(job);
        self.kill(&rel, &self.children(&rel), Duration::from_secs(5));
        self.usage(job)
    }

    /// Removes a finished job's cgroup, or keeps it as a spare for the
    /// next job ([`spare`]).
    pub fn remove_job(&self, job: JobRun) {
        let rel = self.job_rel(job);
        let steps = self.children(&rel);
        if !self.keep_spare(&rel, &steps) {
            self.remove(&rel, &steps);
        }
    }

    /// [`Cgroups::finish_job`] then [`Cgroups::remove_job`].
    pub fn end_job(&self, job: JobRun) -> Usage {
        let usage = self.finish_job(job);
        self.remove_job(job);
        usage
    }

    /// Processes of the job the kernel killed for memory so far (its
    /// tasks are in the job's memory cgroup; v2 counts its steps' too).
    pub fn oom_kills(&self, job: JobRun) -> u64 {
        self.oom_kills_at(&self.job_rel(job))
    }

    fn oom_kills_at(&self, rel: &Path) -> u64 {
        let file = match self.layout {
            Layout::V1 { .. } => "memory.oom_control",
            Layout::V2 { .. } => "memory.events",
        };
        self.dir(Controller::Memory, rel)
            .and_then(|d| fs::read_to_string(d.join(file)).ok())
            .and_then(|t| keyed(&t, "oom_kill"))
            .unwrap_or(0)
    }

    /// The job's usage so far.
    pub fn usage(&self, job: JobRun) -> Usage {
        let rel = self.job_rel(job);
        let text = |c: Controller, file: &str| {
            self.dir(c, &rel)
                .and_then(|d| fs::read_to_string(d.join(file)).ok())
        };
        let (cpu_ns, max_rss_bytes) = match self.layout {
            Layout::V1 { .. } => (
                text(Controller::Cpuacct, "cpuacct.usage")
                    .and_then(|t| t.trim().parse().ok())
                    .unwrap_or(0),
                text(Controller::Memory, "memory.max_usage_in_bytes")
                    .and_then(|t| t.trim().parse().ok())
                    .unwrap_or(0),
            ),
            Layout::V2 { .. } => (
                text(Controller::Cpuacct, "cpu.stat")
                    .and_then(|t| keyed(&t, "usage_usec"))
                    .map_or(0, |us| us.saturating_mul(1000)),
                text(Controller::Memory, "memory.peak")
                    .and_then(|t| t.trim().parse().ok())
                    .unwrap_or(0),
            ),
        };
        Usage {
            cpu_ns,
            max_rss_bytes,
        }
    }

    /// Every job cgroup left under this node (an agent that died left
    /// them): killed and removed at start.
    pub fn sweep(&self) {
        for job in self.children(&self.base) {
            let rel = self.base.join(job);
            let steps = self.children(&rel);
            self.kill(&rel, &steps, Duration::from_secs(5));
            self.remove(&rel, &steps);
        }
    }

    /// Kills every job here and removes this node's cgroup, and its
    /// parents where empty (an agent leaving the cluster).
    pub fn remove_all(&self) {
        self.sweep();
        self.remove_up();
    }

    /// Treats this node's cgroup as a cluster's parent (`corral up`'s):
    /// kills every job of every node below it and removes them all, and
    /// its parents where empty.
    pub fn remove_cluster(&self) {
        for node in self.children(&self.base) {
            let rel = self.base.join(node);
            for job in self.children(&rel) {
                let job = rel.join(job);
                let steps = self.children(&job);
                self.kill(&job, &steps, Duration::from_secs(5));
                self.remove(&job, &steps);
            }
            self.remove(&rel, &[]);
        }
        self.remove_up();
    }

    /// Removes this node's cgroup and its parents, while empty.
    fn remove_up(&self) {
        let mut rel = self.base.clone();
        loop {
            for dir in self.dirs(&rel) {
                let _ = fs::remove_dir(dir);
            }
            if !rel.pop() || rel.as_os_str().is_empty() {
                break;
            }
        }
    }
}

/// Removes an empty cgroup, waiting up to a second for processes just
/// killed to leave it; one still busy stays (and is logged). True when
/// it is gone.
fn rmdir(dir: &Path) -> bool {
    let mut tries = 0;
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return true,
            // The last task's exit is still being accounted: back off
            // from 100 µs up to 10 ms, a second in all.
            Err(e) if e.raw_os_error() == Some(nix::libc::EBUSY) && tries < 110 => {
                tries += 1;
                std::thread::sleep(Duration::from_micros(100 << tries.min(7)));
            }
            Err(e) => {
                tracing::warn!(cgroup = %dir.display(), error = %e, "cgroup left behind");
                return false;
            }
        }
    }
}

/// A new v1 cpuset has no CPUs and no memory nodes: it copies its
/// parent's.
fn cpuset_inherit(dir: &Path) -> Result<(), CgroupError> {
    for file in ["cpuset.cpus", "cpuset.mems"] {
        let mine = read(&dir.join(file))?;
        if mine.trim().is_empty() {
            let parent = read(&dir.join("..").join(file))?;
            write(&dir.join(file), parent.trim())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_round_trip() {
        assert_eq!(parse_cpu_list("0-3,8,10-11\n"), [0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpu_list(""), Vec::<u32>::new());
        let set: BTreeSet<u32> = [0, 1, 2, 3, 8, 10, 11].into();
        assert_eq!(cpu_list(&set), "0-3,8,10-11");
        assert_eq!(cpu_list(&BTreeSet::new()), "");
    }

    #[test]
    fn cgroup_names_stay_below_the_mount() {
        assert_eq!(
            relative("corral/up-1", false).unwrap(),
            Path::new("corral/up-1")
        );
        assert!(relative("", true).unwrap().as_os_str().is_empty());
        for bad in [
            "",
            "/",
            "/corral",
            "..",
            "corral/../..",
            "./x",
            "a//b",
            "corral/",
        ] {
            assert!(relative(bad, false).is_err(), "{bad:?}");
        }
        // A parent that names the hierarchy's root is refused before any
        // directory is made or any process listed.
        let layout = Layout::V2 {
            root: "/nonexistent".into(),
        };
        for (parent, node) in [("", "n0"), ("/", "n0"), ("corral", ".."), ("corral", "a/b")] {
            assert!(
                matches!(
                    Cgroups::new(layout.clone(), parent, node, None),
                    Err(CgroupError::BadName(_))
                ),
                "{parent:?} {node:?}"
            );
        }
    }

    #[test]
    fn keyed_files_are_read_by_key() {
        let t = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(keyed(t, "oom_kill"), Some(3));
        assert_eq!(keyed(t, "missing"), None);
    }

    /// A job's PIDs follow its CPUs, between a floor and the cap.
    #[test]
    fn a_jobs_pids_follow_its_cpus_between_a_floor_and_the_cap() {
        let with = |cpus: usize| Limits {
            cpus: (0..cpus as u32).collect(),
            memory_bytes: None,
            denied: vec![],
        };
        let mut cg = fake(&[0, 1, 2, 3]);
        assert_eq!(cg.job_pids(&with(2)), None, "no limit set");
        cg.pids_max = Some(32768);
        assert_eq!(cg.job_pids(&with(2)), Some(32768), "one cap for all");
        cg.pids_per_cpu = 1024;
        assert_eq!(cg.job_pids(&with(1)), Some(1024));
        assert_eq!(cg.job_pids(&with(8)), Some(8192));
        assert_eq!(cg.job_pids(&with(64)), Some(32768), "at most the cap");
        cg.pids_per_cpu = 10;
        assert_eq!(
            cg.job_pids(&with(1)),
            Some(PIDS_FLOOR),
            "at least the floor"
        );
        cg.pids_max = None;
        cg.pids_per_cpu = 1024;
        assert_eq!(cg.job_pids(&with(64)), Some(65536));
    }

    fn fake(host: &[u32]) -> Cgroups {
        Cgroups {
            layout: Layout::V2 {
                root: "/nonexistent".into(),
            },
            base: "corral/n0".into(),
            host_cpus: host.to_vec(),
            v2_controllers: Vec::new(),
            pids_max: None,
            pids_per_cpu: 0,
            memsw: false,
            spares: Default::default(),
        }
    }

    #[test]
    fn allocated_cpus_map_onto_the_hosts_and_wrap() {
        let cg = fake(&[0, 1, 4, 5]);
        assert_eq!(cg.cpuset_for(&[0, 1]), "0-1");
        assert_eq!(cg.cpuset_for(&[2, 3]), "4-5");
        // A simulated node with more CPUs than the host wraps around.
        assert_eq!(cg.cpuset_for(&[5, 6]), "1,4");
    }

    #[test]
    fn paths_name_job_run_and_step() {
        let cg = fake(&[0]);
        let job = JobRun {
            job: corral_proto::msg::JobId(42),
            run: 1,
        };
        assert_eq!(
            cg.step_rel(job, StepId::BATCH),
            Path::new("corral/n0/job_42.1/step_batch")
        );
        assert_eq!(
            cg.step_rel(job, StepId(3)),
            Path::new("corral/n0/job_42.1/step_3")
        );
    }
}
