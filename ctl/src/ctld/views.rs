//! What squeue, sinfo and scontrol show: views built from the job table,
//! the node registry and the scheduler's status.

use super::packed::{KindRef, SpecHead, SpecRef};
use super::wire::{core_id, job_reason, node_state, wire_id};
use super::{Controller, JobRecord, Selector};
use std::borrow::Cow;
use std::collections::HashMap;

use corral_proto::msg::{
    BareView, GpuAsk, JobAsk, JobFilter, JobId, JobReason, JobState, JobView, NodeView,
    PartitionView, StepView, JOBS_PER_PAGE,
};
use scheduler_core::JobStatus;

impl Controller {
    // ---- views -------------------------------------------------------

    /// Jobs the filter selects, one page (ids above `f.after`, at most
    /// [`JOBS_PER_PAGE`]) in id order.
    pub fn job_views(&self, f: &JobFilter, now: u64) -> Vec<JobView> {
        let Ok(mut sel) = Selector::new(f.clone()) else {
            return Vec::new();
        };
        if self.resolve_arrays(&mut sel).is_err() {
            return Vec::new();
        }
        let mut out = Vec::new();
        loop {
            let (views, next) =
                self.job_views_chunk(&sel, JOBS_PER_PAGE - out.len(), usize::MAX, now);
            out.extend(views);
            match next {
                Some(after) if out.len() < JOBS_PER_PAGE => sel.after = after,
                _ => return out,
            }
        }
    }

    /// Part of a page: at most `max_views` views of jobs above `sel.after`,
    /// looking at no more than `max_scan` jobs. Returns the views and, when
    /// it stopped early, the id to go on after (the caller may release the
    /// controller between chunks, so a large view never holds it long).
    pub fn job_views_chunk(
        &self,
        sel: &Selector,
        max_views: usize,
        max_scan: usize,
        _now: u64,
    ) -> (Vec<JobView>, Option<JobId>) {
        let mut views = Vec::new();
        let next = self.each_job_view(sel, max_views, max_scan, |v| {
            views.push(v.clone().into_owned());
            true
        });
        (views, next)
    }

    /// [`Controller::job_views_chunk`] with each view handed to `each` as
    /// it is made, its texts borrowed from the job table where they can
    /// be: a listing encodes them straight from there
    /// ([`corral_proto::msg::encode_view`]) and copies none. `each` says
    /// whether to go on (a part full of bytes stops early). Returns where
    /// to go on, as the chunk does.
    pub fn each_job_view<'a>(
        &'a self,
        sel: &Selector,
        max_views: usize,
        max_scan: usize,
        mut each: impl FnMut(&JobView<Cow<'a, str>>) -> bool,
    ) -> Option<JobId> {
        let from = JobId(sel.after.0.saturating_add(1));
        let candidates: Box<dyn Iterator<Item = &JobRecord>> = match &sel.ids {
            Some(ids) => Box::new(ids.range(from..).filter_map(|id| self.jobs.get(id))),
            None => Box::new(self.jobs.range(from..).map(|(_, j)| j)),
        };
        let mut made = 0;
        let mut statuses = self.sched.statuses();
        for (scanned, j) in Ahead::new(candidates).enumerate() {
            if made >= max_views || scanned >= max_scan {
                return Some(JobId(j.id.0 - 1));
            }
            // An array whose tasks all started is seen in its tasks.
            if j.spent_array() {
                continue;
            }
            // Read once, when the state and the sets have not already
            // ruled the job out; only the head of it for a bare view (an
            // array's needs its indices, at the spec's end).
            let bare = sel.bare && !sel.detail && j.array.is_none();
            let mut spec = None;
            if sel.matches(j.id, j.user.uid, j.shown_state(), &j.partition, || {
                spec.insert(Read::of(j, bare)).name()
            }) {
                let status = pending_status(j, |id| statuses.status(id));
                let v = match spec.unwrap_or_else(|| Read::of(j, bare)) {
                    Read::Head(h) => self.bare_view(j, h.name, h.nodes, status),
                    Read::Whole(spec) => {
                        let only = sel
                            .only
                            .get(&j.id)
                            .zip(spec.array.as_ref())
                            .map(|(only, a)| {
                                only.iter()
                                    .flat_map(|&p| a.slice(p, p + 1))
                                    .collect::<Vec<_>>()
                            });
                        let brief = sel.brief || sel.bare;
                        let mut v = self.view_of(j, &spec, status, sel.detail, brief);
                        if let (Some(waiting), Some(a)) = (only, v.array.as_mut()) {
                            a.waiting = waiting;
                        }
                        v
                    }
                };
                made += 1;
                if !each(&v) {
                    return Some(j.id);
                }
            }
        }
        None
    }

    pub(super) fn view(&self, j: &JobRecord, detail: bool, _now: u64) -> JobView {
        let status = pending_status(j, |id| self.sched.job_status(id));
        self.view_of(j, &j.spec.read(), status, detail, false)
            .into_owned()
    }

    /// A job's view from its spec read in place
    /// ([`super::packed::PackedSpec::read`]): texts borrowed from the
    /// record and the spec where they can be, and with `brief` without
    /// those few fields show ([`JobFilter::brief`]).
    fn view_of<'a>(
        &self,
        j: &'a JobRecord,
        spec: &SpecRef<'a>,
        status: Option<JobStatus>,
        detail: bool,
        brief: bool,
    ) -> JobView<Cow<'a, str>> {
        let mut v = self.bare_view(j, spec.name, spec.nodes, status);
        let cpus_per_task = spec.cpus_per_task.unwrap_or(1);
        let running = !j.alloc.is_empty();
        let num_tasks = if running {
            j.alloc.iter().map(|(_, a)| a.tasks).sum()
        } else {
            // As the core shapes it: -n, else the nodes times
            // --ntasks-per-node, else one a node.
            let nodes = spec.nodes.unwrap_or(1);
            match (spec.ntasks, spec.ntasks_per_node) {
                (Some(t), Some(tpn)) => nodes.max(t.div_ceil(tpn.max(1))).saturating_mul(tpn),
                (Some(t), None) => t,
                (None, Some(tpn)) => nodes.saturating_mul(tpn),
                (None, None) => nodes,
            }
        };
        v.num_tasks = num_tasks;
        v.cpus_per_task = cpus_per_task;
        v.num_cpus = if running {
            j.alloc.iter().map(|(_, a)| a.cpus.len() as u32).sum()
        } else {
            num_tasks * cpus_per_task
        };
        v.gpus = if running {
            j.alloc.iter().map(|(_, a)| a.gpus.len() as u32).sum()
        } else {
            match spec.gpus {
                GpuAsk::None => 0,
                GpuAsk::PerNode(g) => g * spec.nodes.unwrap_or(1),
                GpuAsk::PerTask(g) => g * num_tasks,
                GpuAsk::Total(g) => g,
            }
        };
        v.mem_mb = spec.mem_mb.unwrap_or(0);
        v.time_limit = spec.time_limit.or(v.time_limit);
        // Only an array's entry asks the scheduler which tasks wait.
        v.array = spec
            .array
            .as_ref()
            .and_then(|a| j.array_view(Some(a), self.sched.array_waiting(core_id(j.id))));
        v.ask = detail.then(|| {
            let mut a = ask(j, spec, v.reason);
            if j.state == JobState::Pending {
                if let Some(r) = self.sched.reservation(core_id(j.id)) {
                    a.sched_nodes = r.nodes.iter().map(|p| self.node_name(p.node)).collect();
                }
            }
            Box::new(a)
        });
        v.steps = j
            .steps
            .iter()
            .filter(|s| detail && s.end.is_none())
            .map(|s| StepView {
                id: s.id,
                name: s.name.clone(),
                nodes: s.nodes.clone(),
                tasks: s.tasks,
                cpus: s.cpus,
                start: s.start,
            })
            .collect();
        v.batch = matches!(spec.kind, KindRef::Batch { .. });
        v.requeue = spec.requeue;
        if brief {
            return v;
        }
        let text = |s: Option<&'a str>| s.map(Cow::Borrowed);
        (v.stdout, v.stderr, v.command) = match &spec.kind {
            // Slurm's Command: the script's path and arguments, `(null)`
            // for --wrap and standard input.
            KindRef::Batch {
                stdout,
                stderr,
                args,
                ..
            } => (
                Some(Cow::Borrowed(
                    stdout.unwrap_or(JobRecord::default_output(spec.array.is_some())),
                )),
                stderr.map(Cow::Borrowed),
                match spec.script_path {
                    Some(p) if args.is_empty() => Cow::Borrowed(p),
                    Some(p) => Cow::Owned(format!("{p} {}", args.join(" "))),
                    None => Cow::Borrowed("(null)"),
                },
            ),
            KindRef::Interactive { argv, .. } => (None, None, Cow::Owned(argv.join(" "))),
            KindRef::Allocation => (None, None, Cow::Borrowed(spec.name)),
        };
        v.work_dir = Cow::Borrowed(spec.work_dir);
        v.failure = text(j.failure.as_deref());
        v.comment = text(spec.comment);
        v.mail_type = text(spec.mail_type);
        v.mail_user = text(spec.mail_user);
        v
    }

    /// A bare view ([`JobFilter::bare`]): what the record and the
    /// scheduler know (`status`, of a pending job), with the spec's name
    /// and node count; what else the spec holds reads zero (a running
    /// job's limit is its run's).
    fn bare_view<'a>(
        &self,
        j: &'a JobRecord,
        name: &'a str,
        nodes: Option<u32>,
        status: Option<JobStatus>,
    ) -> JobView<Cow<'a, str>> {
        let (reason, priority, expected) = match status {
            Some(JobStatus::Pending {
                reason,
                expected_start,
                priority,
            }) => (job_reason(reason), priority, expected_start),
            _ => (JobReason::None, 0, None),
        };
        let reason = match (j.state, &j.failure) {
            (JobState::Pending, _) => reason,
            (JobState::Failed, Some(_)) => JobReason::JobLaunchFailure,
            (JobState::Failed, None) => JobReason::NonZeroExitCode,
            (JobState::NodeFail, _) => JobReason::NodeDown,
            (JobState::Timeout, _) => JobReason::TimeLimit,
            _ => JobReason::None,
        };
        let running = !j.alloc.is_empty();
        BareView {
            id: j.id,
            name: Cow::Borrowed(name),
            user: j.user,
            partition: Cow::Borrowed(&j.partition),
            state: j.shown_state(),
            reason,
            priority,
            submit_time: j.submit,
            start_time: j.start.get(),
            end_time: j.end.get().or(j.end_by.get()),
            expected_start: expected,
            time_limit: j
                .end_by
                .get()
                .zip(j.start.get())
                .map(|(e, s)| e.saturating_sub(s)),
            nodes: j
                .alloc
                .iter()
                .map(|(n, _)| Cow::Borrowed(n.as_str()))
                .collect(),
            num_nodes: if running {
                j.alloc.len() as u32
            } else {
                nodes.unwrap_or(1)
            },
            exit: j.exit,
            restarts: j.restarts,
            usage: j.used,
            suspension: j.suspension,
        }
        .into_view()
    }

    pub fn node_views(&self) -> Vec<NodeView> {
        // Each node's partitions, from one walk over the partitions.
        let mut member_of: HashMap<scheduler_core::NodeId, Vec<String>> = HashMap::new();
        for p in &self.cfg.partitions {
            if let Some(pid) = self.sched.partition_id(&p.name) {
                for &n in self.sched.partition_nodes(pid) {
                    member_of.entry(n).or_default().push(p.name.clone());
                }
            }
        }
        let mut out: Vec<NodeView> = self
            .nodes
            .values()
            .filter_map(|n| {
                let info = self.sched.node_info(n.id)?;
                let partitions = member_of.remove(&n.id).unwrap_or_default();
                let (reason, reason_user, reason_time) = match (&n.admin, n.not_responding) {
                    (Some((_, r, by, at)), _) => (Some(r.clone()), Some(*by), Some(*at)),
                    (None, true) => (
                        Some("Not responding".to_string()),
                        Some(0),
                        Some(n.last_seen),
                    ),
                    (None, false) => {
                        match (&n.leaving, n.problem.as_ref().or(n.check_failed.as_ref())) {
                            (Some((since, _)), _) => (
                                Some(super::nodes::LEAVING.to_string()),
                                Some(0),
                                Some(*since),
                            ),
                            (None, Some((why, since))) => {
                                (Some(format!("node_problem: {why}")), Some(0), Some(*since))
                            }
                            (None, None) => (None, None, None),
                        }
                    }
                };
                // A job ending whose clean-up here is not confirmed.
                let completing = info.jobs.iter().any(|&id| {
                    self.jobs.get(&wire_id(id)).is_some_and(|j| {
                        j.state == JobState::Completing && j.cleaning.contains(&n.reg.name)
                    })
                });
                Some(NodeView {
                    name: n.reg.name.clone(),
                    state: node_state(info.state),
                    not_responding: n.not_responding,
                    fail: matches!(n.admin, Some((corral_proto::msg::NodeUpdate::Fail, ..))),
                    completing,
                    cpus: info.cpus,
                    alloc_cpus: info.alloc_cpus,
                    memory_mb: info.memory_mb,
                    alloc_memory_mb: info.alloc_memory_mb,
                    gpus: info.gpus,
                    alloc_gpus: info.alloc_gpus,
                    gpu_model: scheduler_core::node_gpu_model(&super::wire::node_spec(&n.reg).gpus),
                    features: info.features,
                    partitions,
                    reason,
                    reason_user,
                    reason_time,
                    boot_time: n.boot,
                    last_seen: n.last_seen,
                    jobs: info.jobs.iter().copied().map(wire_id).collect(),
                    os: n.reg.os.clone(),
                })
            })
            .collect();
        out.sort_by(|a, b| natural(&a.name, &b.name));
        out
    }

    pub fn partition_views(&self) -> Vec<PartitionView> {
        self.cfg
            .partitions
            .iter()
            .map(|p| {
                let members: Vec<_> = self
                    .sched
                    .partition_id(&p.name)
                    .map(|id| self.sched.partition_nodes(id).to_vec())
                    .unwrap_or_default();
                let infos: Vec<_> = members
                    .iter()
                    .filter_map(|&id| self.sched.node_info(id))
                    .collect();
                let mut nodes: Vec<String> = infos.iter().map(|i| i.name.clone()).collect();
                nodes.sort_by(|a, b| natural(a, b));
                PartitionView {
                    name: p.name.clone(),
                    is_default: p.is_default,
                    nodes_expr: p.nodes.clone(),
                    nodes,
                    max_time: p.max_time,
                    default_time: p.default_time,
                    priority_tier: p.priority_tier,
                    total_cpus: infos.iter().map(|i| i.cpus).sum(),
                    total_gpus: infos.iter().map(|i| i.gpus).sum(),
                }
            })
            .collect()
    }
}

/// Orders names with numbers by value: worker-2 before worker-10.
/// What a job asked for beyond its shape, for squeue and scontrol.
fn ask(j: &JobRecord, spec: &SpecRef<'_>, reason: JobReason) -> JobAsk {
    // Slurm shows a dependency only while it still holds the job.
    let dependency = (j.state == JobState::Pending && !spec.dependencies.is_empty()).then(|| {
        let mark = if reason == JobReason::DependencyNeverSatisfied {
            "(failed)"
        } else {
            "(unfulfilled)"
        };
        let parts: Vec<String> = spec
            .dependencies
            .iter()
            .map(|d| format!("{d}{mark}"))
            .collect();
        parts.join(if spec.dependency_any { "?" } else { "," })
    });
    let (per_node, per_task, total) = match spec.gpus {
        GpuAsk::None => (None, None, None),
        GpuAsk::PerNode(g) => (Some(g), None, None),
        GpuAsk::PerTask(g) => (None, Some(g), None),
        GpuAsk::Total(g) => (None, None, Some(g)),
    };
    let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
    JobAsk {
        account: spec.account.map(str::to_string),
        qos: spec.qos.map(str::to_string),
        nice: spec.nice,
        dependency,
        req_nodes: owned(&spec.nodelist),
        exc_nodes: owned(&spec.exclude),
        features: (!spec.constraint.is_empty()).then(|| {
            spec.constraint
                .join(if spec.constraint_any { "|" } else { "&" })
        }),
        exclusive: spec.exclusive,
        mem_per_cpu_mb: spec.mem_per_cpu_mb,
        gpu_type: spec.gpu_type.map(str::to_string),
        gpus_per_node: per_node,
        gpus_per_task: per_task,
        gpus_total: total,
        begin: spec.begin,
        ntasks_per_node: spec.ntasks_per_node,
        nodes: spec.nodes,
        submit_host: spec.submit_host.map(str::to_string),
        sched_nodes: Vec::new(),
        wckey: spec.wckey.map(str::to_string),
        mem_per_gpu_mb: spec.mem_per_gpu_mb,
    }
}

pub fn natural(a: &str, b: &str) -> std::cmp::Ordering {
    let split = |s: &str| {
        let t = s.trim_end_matches(|c: char| c.is_ascii_digit());
        (t.len(), s[t.len()..].parse::<u64>().ok())
    };
    let ((la, na), (lb, nb)) = (split(a), split(b));
    a[..la].cmp(&b[..lb]).then(na.cmp(&nb)).then(a.cmp(b))
}

/// What the scheduler says of a pending job, asked through `ask` (a
/// running one's status would clone its allocation for nothing).
fn pending_status(
    j: &JobRecord,
    ask: impl FnOnce(scheduler_core::JobId) -> Option<JobStatus>,
) -> Option<JobStatus> {
    (j.state == JobState::Pending)
        .then(|| ask(core_id(j.id)))
        .flatten()
}

/// What a view reads of a job's spec: its head ([`JobFilter::bare`]) or
/// the whole of it. Lives on the stack for one job at a time: boxing
/// the larger would cost an allocation per job listed.
#[allow(clippy::large_enum_variant)]
enum Read<'a> {
    Head(SpecHead<'a>),
    Whole(SpecRef<'a>),
}

impl<'a> Read<'a> {
    fn of(j: &'a JobRecord, head: bool) -> Read<'a> {
        if head {
            Read::Head(j.spec.head())
        } else {
            Read::Whole(j.spec.read())
        }
    }

    fn name(&self) -> &'a str {
        match self {
            Read::Head(h) => h.name,
            Read::Whole(s) => s.name,
        }
    }
}

/// The job records a listing reads, with the memory of those a few
/// places ahead asked for early: ten thousand records and their specs,
/// each in its own allocation, left ctld waiting on memory for most of
/// a listing.
struct Ahead<'a, I> {
    jobs: I,
    queue: std::collections::VecDeque<&'a JobRecord>,
}

impl<'a, I: Iterator<Item = &'a JobRecord>> Ahead<'a, I> {
    /// How far ahead records are fetched; their specs, half as far.
    const DEPTH: usize = 8;

    fn new(jobs: I) -> Self {
        Ahead {
            jobs,
            queue: std::collections::VecDeque::with_capacity(Self::DEPTH + 1),
        }
    }
}

impl<'a, I: Iterator<Item = &'a JobRecord>> Iterator for Ahead<'a, I> {
    type Item = &'a JobRecord;

    fn next(&mut self) -> Option<&'a JobRecord> {
        while self.queue.len() < Self::DEPTH {
            let Some(j) = self.jobs.next() else { break };
            scheduler_core::prefetch(j);
            self.queue.push_back(j);
        }
        if let Some(j) = self.queue.get(Self::DEPTH / 2) {
            scheduler_core::prefetch_bytes(j.spec.bytes_at(), 64);
        }
        self.queue.pop_front()
    }
}
