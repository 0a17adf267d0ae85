//! Admission: what a submission may ask for and what its user may still
//! queue, checked before the scheduler sees it.

use super::{Controller, Refusal, MAX_GPUS, MAX_NICE};

use corral_proto::msg::{GpuAsk, Ident, JobKind, JobSpec};

/// Refuses text with control characters: a job's name and paths reach
/// other users' terminals through squeue and scontrol.
pub(super) fn printable(what: &str, s: &str) -> Result<(), Refusal> {
    if s.chars().any(char::is_control) {
        return Err(format!(
            "Invalid {what}: control characters are not allowed"
        ));
    }
    Ok(())
}

pub(super) fn spec_bytes(spec: &JobSpec) -> u64 {
    let env: usize = spec.env.iter().map(|(k, v)| k.len() + v.len() + 16).sum();
    let kind = match &spec.kind {
        JobKind::Batch { script, args, .. } => {
            script.len() + args.iter().map(|a| a.len() + 8).sum::<usize>()
        }
        JobKind::Interactive { argv, .. } => argv.iter().map(|a| a.len() + 8).sum(),
    };
    (env + kind + spec.work_dir.len() + spec.name.len()) as u64
}

impl Controller {
    // ---- requests ----------------------------------------------------

    /// Checks what a submission may ask for and what its user may still
    /// queue, before the scheduler sees it.
    pub(super) fn admit(&self, who: Ident, spec: &JobSpec) -> Result<u64, Refusal> {
        let privileged = self.privileged(who);
        printable("job name", &spec.name)?;
        printable("working directory", &spec.work_dir)?;
        for p in [&spec.partition, &spec.qos].into_iter().flatten() {
            printable("partition or QOS name", p)?;
        }
        if let JobKind::Batch {
            script,
            stdout,
            stderr,
            ..
        } = &spec.kind
        {
            for p in [stdout, stderr].into_iter().flatten() {
                printable("output file name", p)?;
            }
            let max = self.cfg.limits.max_script_size;
            if script.len() as u64 > max {
                return Err(format!(
                    "Batch script is too large: {} bytes, the limit is {max}",
                    script.len()
                ));
            }
        }
        if let GpuAsk::PerNode(g) | GpuAsk::PerTask(g) | GpuAsk::Total(g) = spec.gpus {
            if g > MAX_GPUS {
                return Err(format!(
                    "Invalid generic resource (gres) specification: {g} GPUs, the most is {MAX_GPUS}"
                ));
            }
        }
        if spec.nice < 0 && !privileged {
            return Err(
                "Access/permission denied: only operators may set a negative nice value".into(),
            );
        }
        if spec.nice.unsigned_abs() > MAX_NICE {
            return Err(format!(
                "Invalid nice value: it must be between -{MAX_NICE} and {MAX_NICE}"
            ));
        }
        let limits = &self.cfg.limits;
        if self.unfinished >= limits.max_job_count {
            return Err(format!(
                "Resource temporarily unavailable: the cluster holds its limit of {} jobs",
                limits.max_job_count
            ));
        }
        let bytes = spec_bytes(spec);
        let used = self.usage.get(&who.uid).copied().unwrap_or_default();
        if !privileged && used.jobs >= limits.max_jobs_per_user {
            return Err(format!(
                "Job violates accounting/QOS policy (job submit limit, user's size and/or time limits): \
                 {} unfinished jobs, the limit per user is {}",
                used.jobs, limits.max_jobs_per_user
            ));
        }
        if !privileged && used.bytes.saturating_add(bytes) > limits.max_bytes_per_user {
            return Err(format!(
                "Job violates accounting/QOS policy (job submit limit, user's size and/or time limits): \
                 unfinished jobs would hold {} bytes of scripts and environment, the limit per user is {}",
                used.bytes.saturating_add(bytes),
                limits.max_bytes_per_user
            ));
        }
        Ok(bytes)
    }
}
