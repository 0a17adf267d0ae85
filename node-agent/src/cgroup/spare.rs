//! Spare job cgroups (v1): a job's cgroup that ended empty is renamed
//! `spare_N` instead of removed, and the next job's cgroup is a spare
//! renamed to the job's name, its limits and counters set afresh. Making
//! and removing a cgroup in v1's six hierarchies is a `mkdir` and a
//! `rmdir` in each (the kernel makes and drops every control file, and the
//! memory controller's state goes away in a worker later); a rename in
//! each is a fraction of that (`cargo bench -p benches --bench cgroup`).
//! Names stay what they were: a job's cgroup is `job_ID.RUN` whether made
//! or reused, so `/proc/PID/cgroup` and an operator see the same paths.
//!
//! What a reused cgroup could carry from its last job, and why it does
//! not:
//! - processes: only a cgroup with no process left is kept (the job's end
//!   killed them; a task cannot leave a root-owned cgroup on its own);
//! - limits: the CPUs, the memory limit (or none) and the device rules
//!   are written again, the devices from "allow all" down;
//! - counters: CPU time and peak memory are reset; OOM kills cannot be,
//!   so the count at release is kept and a step's OOM check compares with
//!   it ([`JobCgroup::oom_baseline`]);
//! - memory still charged: kernel objects of the last job's processes
//!   that the kernel frees moments later (measured 150 KiB after a shell
//!   that ran `true`, 800-900 KiB after one that ran five programs, no
//!   page cache; an idle spare reads 0 a while later), and page cache the
//!   job read. A cgroup holding more than [`SPARE_MEMORY_MAX`] is removed
//!   instead, and a job whose memory limit is below [`SPARE_MIN_LIMIT`]
//!   always gets a new cgroup, so what a job may start charged with is
//!   under 1% of its limit. Its peak memory (sacct's MaxRSS) counts from
//!   that charge, so it may read up to that much over the job's own;
//! - a frozen state: only a thawed cgroup is kept.
//!
//! Never on v2 (the unified hierarchy has no rename) or where a rename,
//! a reset or a check fails: those fall back to making and removing, as
//! before. Spares are gone with the node's cgroup ([`Cgroups::sweep`] at
//! start removes them with every other child).

use std::fs;
use std::path::{Path, PathBuf};

use super::{read, write, write_each, Cgroups, Controller, Layout, Limits};

/// Spares kept per node at most; a node ending jobs faster than it starts
/// them removes the rest.
pub const SPARES_KEPT: usize = 16;

/// The most memory a cgroup may still be charged with and be kept.
pub const SPARE_MEMORY_MAX: u64 = 2 << 20;

/// The smallest memory limit a job may have and get a spare.
pub const SPARE_MIN_LIMIT: u64 = 256 << 20;

/// A kept cgroup: its name's number and the OOM kills it had counted.
#[derive(Debug, Clone, Copy)]
struct Spare {
    n: u32,
    oom_kills: u64,
}

/// The node's spare job cgroups.
#[derive(Debug, Default)]
pub(super) struct Spares {
    kept: Vec<Spare>,
    next: u32,
}

/// What [`Cgroups::create_job`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobCgroup {
    /// Made now.
    Made,
    /// A spare renamed to the job's name, set up now.
    Reused {
        /// The OOM kills the cgroup had counted before this job.
        oom_kills: u64,
    },
    /// It was there already (a later step of the same run).
    Existed,
}

impl JobCgroup {
    /// True when this call set the job's cgroup up.
    pub fn set_up(self) -> bool {
        !matches!(self, JobCgroup::Existed)
    }

    /// What a first step's OOM check compares with: the kills counted
    /// before the job, when known without reading.
    pub fn oom_baseline(self) -> Option<u64> {
        match self {
            JobCgroup::Made => Some(0),
            JobCgroup::Reused { oom_kills } => Some(oom_kills),
            JobCgroup::Existed => None,
        }
    }
}

impl Cgroups {
    fn spare_rel(&self, n: u32) -> PathBuf {
        self.base.join(format!("spare_{n}"))
    }

    /// Spares kept now (for tests and logs).
    pub fn spares(&self) -> usize {
        self.spares.lock().kept.len()
    }

    /// Renames `from` to `to` in every hierarchy, all or none: a rename
    /// that fails puts back those done before it.
    fn rename_all(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        let pairs: Vec<(PathBuf, PathBuf)> =
            self.dirs(from).into_iter().zip(self.dirs(to)).collect();
        for (i, (a, b)) in pairs.iter().enumerate() {
            if let Err(e) = fs::rename(a, b) {
                for (a, b) in &pairs[..i] {
                    let _ = fs::rename(b, a);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Sets `rel` (the job's name) up from a spare, when one is kept and
    /// the job's cgroup does not exist yet; `None` to make it instead.
    pub(super) fn reuse_spare(&self, rel: &Path, cpus: &str, limits: &Limits) -> Option<JobCgroup> {
        if !matches!(self.layout, Layout::V1 { .. })
            || limits.memory_bytes.is_some_and(|b| b < SPARE_MIN_LIMIT)
        {
            return None;
        }
        let spare = self.spares.lock().kept.pop()?;
        let from = self.spare_rel(spare.n);
        match self.rename_all(&from, rel) {
            Ok(()) => {}
            // A later step of the same run: the spare stays for another.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                self.spares.lock().kept.push(spare);
                return None;
            }
            // Gone (the node's cgroup was removed) or stuck: dropped.
            Err(e) => {
                tracing::debug!(cgroup = %from.display(), error = %e, "spare cgroup dropped");
                self.remove(&from, &[]);
                return None;
            }
        }
        match self.reset_v1(rel, cpus, limits) {
            Ok(()) => Some(JobCgroup::Reused {
                oom_kills: spare.oom_kills,
            }),
            Err(e) => {
                tracing::warn!(error = %e, "a spare cgroup could not be set up; making one");
                self.remove(rel, &[]);
                None
            }
        }
    }

    /// A reused cgroup's limits and counters, set as a new one's would be.
    fn reset_v1(&self, rel: &Path, cpus: &str, limits: &Limits) -> Result<(), super::CgroupError> {
        if let Some(dir) = self.dir(Controller::Cpuset, rel) {
            write(&dir.join("cpuset.cpus"), cpus)?;
        }
        if let Some(dir) = self.dir(Controller::Memory, rel) {
            // With swap accounted, its limit may never be below the
            // memory limit: lifted first, set last.
            let limit = limits
                .memory_bytes
                .map_or("-1".to_string(), |b| b.to_string());
            if self.memsw {
                write(&dir.join("memory.memsw.limit_in_bytes"), "-1")?;
            }
            write(&dir.join("memory.limit_in_bytes"), &limit)?;
            if self.memsw && limits.memory_bytes.is_some() {
                write(&dir.join("memory.memsw.limit_in_bytes"), &limit)?;
            }
            // The peak starts again from what is charged now.
            write(&dir.join("memory.max_usage_in_bytes"), "0")?;
        }
        if let Some(dir) = self.dir(Controller::Devices, rel) {
            // Allowing all first drops the last job's rules.
            write(&dir.join("devices.allow"), "a")?;
            let rules: Vec<String> = limits
                .denied
                .iter()
                .map(|d| format!("c {}:{} rwm", d.major, d.minor))
                .collect();
            write_each(&dir.join("devices.deny"), &rules)?;
        }
        if let Some(dir) = self.dir(Controller::Cpuacct, rel) {
            write(&dir.join("cpuacct.usage"), "0")?;
        }
        if let (Some(dir), Some(max)) = (self.dir(Controller::Pids, rel), self.job_pids(limits)) {
            write(&dir.join("pids.max"), &max.to_string())?;
        }
        Ok(())
    }

    /// Keeps a finished job's cgroup as a spare when it may be reused:
    /// v1, room among the spares, its steps removed, no process left,
    /// thawed, little memory charged. False when the caller is to
    /// remove it.
    pub(super) fn keep_spare(&self, rel: &Path, steps: &[std::ffi::OsString]) -> bool {
        if !matches!(self.layout, Layout::V1 { .. }) || self.spares.lock().kept.len() >= SPARES_KEPT
        {
            return false;
        }
        if let Some(dir) = self.dir(self.kill_controller(), rel) {
            if !steps.iter().all(|s| super::rmdir(&dir.join(s))) {
                return false;
            }
        }
        if !self.pids(rel, &[]).is_empty() {
            return false;
        }
        let thawed = self
            .dir(Controller::Freezer, rel)
            .is_none_or(|d| read(&d.join("freezer.state")).is_ok_and(|s| s.trim() == "THAWED"));
        let light = self.dir(Controller::Memory, rel).is_none_or(|d| {
            read(&d.join("memory.usage_in_bytes"))
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok())
                .is_some_and(|b| b <= SPARE_MEMORY_MAX)
        });
        if !(thawed && light) {
            return false;
        }
        let oom_kills = self.oom_kills_at(rel);
        let n = {
            let mut s = self.spares.lock();
            s.next = s.next.wrapping_add(1);
            s.next
        };
        if self.rename_all(rel, &self.spare_rel(n)).is_err() {
            return false;
        }
        let mut s = self.spares.lock();
        if s.kept.len() >= SPARES_KEPT {
            drop(s);
            self.remove(&self.spare_rel(n), &[]);
        } else {
            s.kept.push(Spare { n, oom_kills });
        }
        true
    }
}
