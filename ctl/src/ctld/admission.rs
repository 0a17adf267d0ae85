//! Admission: what a submission may ask for and what its user may still
//! queue, checked before the scheduler sees it.

use super::{Controller, CtldError, Refusal, MAX_FEATURES, MAX_FEATURE_LEN, MAX_GPUS, MAX_NICE};

use corral_proto::msg::{GpuAsk, Ident, JobKind, JobSpec};

/// Refuses text with control characters: a job's name and paths reach
/// other users' terminals through squeue and scontrol.
pub(super) fn printable(what: &'static str, s: &str) -> Result<(), Refusal> {
    if s.chars().any(corral_proto::unsafe_char) {
        return Err(CtldError::ControlCharacters { what });
    }
    Ok(())
}

/// Refuses text longer than `max` bytes: every free text a job carries
/// is kept in the store and in accounting after it ends, so none may be
/// larger than a name or a path needs (Slurm refuses the same with
/// "Pathname of a file, directory or other parameter too long").
pub(super) fn bounded(what: &'static str, s: &str, max: usize) -> Result<(), Refusal> {
    if s.len() > max {
        return Err(CtldError::TooLong { what, max });
    }
    Ok(())
}

/// Printable and at most `max` bytes.
pub(super) fn text(what: &'static str, s: &str, max: usize) -> Result<(), Refusal> {
    printable(what, s)?;
    bounded(what, s, max)
}

/// srun's task file patterns: printable, and no longer than a path.
pub(super) fn task_files(f: &corral_proto::msg::TaskFiles, max_path: usize) -> Result<(), Refusal> {
    for p in [&f.stdout, &f.stderr, &f.stdin].into_iter().flatten() {
        text("output file name", p, max_path)?;
    }
    Ok(())
}

pub(super) fn spec_bytes(spec: &JobSpec) -> u64 {
    let env: usize = spec.env.iter().map(|(k, v)| k.len() + v.len() + 16).sum();
    let kind = match &spec.kind {
        JobKind::Batch { script, args, .. } => {
            script.len() + args.iter().map(|a| a.len() + 8).sum::<usize>()
        }
        JobKind::Interactive { argv, files, .. } => {
            argv.iter().map(|a| a.len() + 8).sum::<usize>() + files.len()
        }
        JobKind::Allocation => 0,
    };
    let features: usize = spec.constraint.iter().map(|f| f.len() + 8).sum();
    let notes: usize = features
        + [
            &spec.comment,
            &spec.account,
            &spec.mail_type,
            &spec.mail_user,
            &spec.wckey,
            &spec.submit_dir,
            &spec.submit_host,
            &spec.script_path,
        ]
        .into_iter()
        .flatten()
        .map(String::len)
        .sum::<usize>();
    (env + kind + spec.work_dir.len() + spec.name.len() + notes) as u64
}

impl Controller {
    // ---- requests ----------------------------------------------------

    /// Checks what a submission may ask for and what its user may still
    /// queue, before the scheduler sees it.
    pub(super) fn admit(&self, who: Ident, spec: &JobSpec) -> Result<u64, Refusal> {
        let privileged = self.privileged(who);
        let limits = &self.cfg.limits;
        let (max_text, max_path) = (limits.max_text_len, limits.max_path_len);
        text("job name", &spec.name, max_text)?;
        text("working directory", &spec.work_dir, max_path)?;
        for p in [&spec.partition, &spec.qos, &spec.account]
            .into_iter()
            .flatten()
        {
            text("partition, QOS or account name", p, max_text)?;
        }
        if spec.constraint.len() > MAX_FEATURES
            || spec.constraint.iter().any(|f| f.len() > MAX_FEATURE_LEN)
        {
            return Err(CtldError::TooManyFeatures(spec.constraint.len()));
        }
        for f in &spec.constraint {
            printable("feature", f)?;
        }
        if let Some(t) = &spec.gpu_type {
            printable("GPU type", t)?;
            if t.len() > MAX_FEATURE_LEN {
                return Err(CtldError::TooManyFeatures(1));
            }
        }
        for (what, t, max) in [
            ("comment", &spec.comment, max_text),
            ("submit directory", &spec.submit_dir, max_path),
            ("submit host", &spec.submit_host, max_text),
            ("mail type", &spec.mail_type, max_text),
            ("mail user", &spec.mail_user, max_text),
            ("wckey", &spec.wckey, max_text),
            ("script path", &spec.script_path, max_path),
        ] {
            if let Some(t) = t {
                text(what, t, max)?;
            }
        }
        for n in spec.nodelist.iter().chain(&spec.exclude) {
            bounded("node list", n, max_text)?;
        }
        if let JobKind::Batch {
            script,
            stdout,
            stderr,
            ..
        } = &spec.kind
        {
            for p in [stdout, stderr].into_iter().flatten() {
                text("output file name", p, max_path)?;
            }
            let max = limits.max_script_size;
            if script.len() as u64 > max {
                return Err(CtldError::ScriptTooLarge {
                    size: script.len() as u64,
                    max,
                });
            }
        }
        if let JobKind::Interactive { files, .. } = &spec.kind {
            task_files(files, max_path)?;
        }
        if let GpuAsk::PerNode(g) | GpuAsk::PerTask(g) | GpuAsk::Total(g) = spec.gpus {
            if g > MAX_GPUS {
                return Err(CtldError::TooManyGpus(g));
            }
        }
        if spec.nice < 0 && !privileged {
            return Err(CtldError::NegativeNice);
        }
        if spec.nice.unsigned_abs() > MAX_NICE {
            return Err(CtldError::NiceOutOfRange);
        }
        // Each of an array's tasks counts as a job (Slurm's MaxSubmitJobs).
        // Summed wide: the array is checked only after (a hostile spec's
        // counts could overflow a u32).
        let weight = spec
            .array
            .as_ref()
            .map_or(1, |a| a.runs.iter().map(|r| u64::from(r.count)).sum());
        if self.unfinished + weight > limits.max_job_count {
            return Err(CtldError::ClusterFull(limits.max_job_count));
        }
        let bytes = spec_bytes(spec);
        let used = self.usage.get(&who.uid).copied().unwrap_or_default();
        if !privileged && used.jobs + weight > limits.max_jobs_per_user {
            return Err(CtldError::UserJobLimit {
                jobs: used.jobs,
                adding: weight,
                max: limits.max_jobs_per_user,
            });
        }
        // What the user's finished jobs still keep (their texts, until
        // they are forgotten) counts too: it is on the state disk.
        let held = used.bytes.saturating_add(used.kept).saturating_add(bytes);
        if !privileged && held > limits.max_bytes_per_user {
            return Err(CtldError::UserByteLimit {
                bytes: held,
                max: limits.max_bytes_per_user,
            });
        }
        Ok(bytes)
    }
}
