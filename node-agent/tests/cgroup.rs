//! Jobs in real cgroups, as root, on whatever hierarchy the machine has
//! (v1 on CI), plus the v2 device program wherever a cgroup2 hierarchy
//! is mounted and writable (CI's hybrid `unified` mount holds no
//! controllers, but device programs attach to it all the same). Without
//! root each test says SKIPPED and checks nothing.
//!
//! Tasks start through the agent's own launcher, joining their step's
//! cgroup between fork and exec, exactly as jobs do.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral_agent::cgroup::{Cgroups, Controller, Denied, Layout, Limits};
use corral_agent::launch::{Io, Launcher, ProcessLauncher, TaskSpec};
use corral_proto::msg::{Ident, JobId, JobRun, StepId};

fn root_or_skip(test: &str) -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        println!("SKIPPED (needs root): {test}");
    }
    root
}

/// A node's cgroups under a parent of the test's own, removed after.
struct Node {
    cg: Cgroups,
}

impl Node {
    fn new(test: &str, layout: Layout, pids_max: Option<u64>) -> Node {
        let parent = format!("corral-test-{}-{test}", std::process::id());
        let cg = Cgroups::new(layout, &parent, "n0", pids_max).expect("the node's cgroups");
        Node { cg }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.cg.remove_all();
    }
}

fn run(job: u64) -> JobRun {
    JobRun {
        job: JobId(job),
        run: 0,
    }
}

fn me() -> Ident {
    Ident {
        uid: nix::unistd::geteuid().as_raw(),
        gid: nix::unistd::getegid().as_raw(),
    }
}

/// Runs `script` with `sh -c` in the step's cgroup, output to `out`;
/// returns its wait status once it exits (or after `secs`).
fn sh(
    node: &Node,
    job: JobRun,
    step: StepId,
    script: &str,
    out: &Path,
    secs: u64,
) -> std::process::ExitStatus {
    let join = node.cg.create_step(job, step).expect("step cgroup");
    let spec = TaskSpec {
        tty: None,
        umask: None,
        argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
        env: vec![("PATH".into(), "/usr/bin:/bin:/usr/sbin:/sbin".into())],
        cwd: "/".into(),
        user: me(),
        stdin: Io::Null,
        stdout: Io::Path(out.to_path_buf()),
        stderr: Io::Path(out.to_path_buf()),
        jail: None,
        groups: None,
        cgroup: Some(Arc::new(join)),
        pid_ns: None,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut child = ProcessLauncher.spawn(spec).expect("spawn");
        tokio::time::timeout(Duration::from_secs(secs), child.wait())
            .await
            .expect("the task ends in time")
            .expect("wait")
    })
}

fn alive(pid: i32) -> bool {
    // A zombie is dead: only its parent's wait is left.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with(|c| c != 'Z'))
        })
        .unwrap_or(false)
}

fn limits(cpus: &[u32]) -> Limits {
    Limits {
        cpus: cpus.to_vec(),
        memory_bytes: Some(256 << 20),
        denied: Vec::new(),
    }
}

#[test]
fn a_double_forked_daemon_stays_in_the_cgroup_and_dies_with_its_step() {
    if !root_or_skip("a_double_forked_daemon_stays_in_the_cgroup_and_dies_with_its_step") {
        return;
    }
    let node = Node::new("daemon", Layout::detect().expect("cgroups"), None);
    let dir = tempfile::tempdir().expect("dir");
    let (job, step) = (run(1), StepId::BATCH);
    node.cg.create_job(job, &limits(&[0])).expect("job cgroup");
    let pidfile = dir.path().join("pid");
    // The daemon leaves the task's session and process group.
    let script = format!(
        "setsid sh -c 'sleep 300 & echo $! > {}' ; exit 0",
        pidfile.display()
    );
    let st = sh(&node, job, step, &script, &dir.path().join("out"), 10);
    assert!(st.success(), "{st:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    let pid = loop {
        if let Some(p) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            break p;
        }
        assert!(Instant::now() < deadline, "the daemon never started");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(alive(pid), "the daemon outlives its parent");
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("its cgroups");
    assert!(
        cgroups.contains("/n0/job_1.0/step_batch") && cgroups.contains(":memory:/corral-test"),
        "the daemon is still in the step's cgroup: {cgroups}"
    );
    assert!(!node.cg.end_step(job, step, 0), "no OOM kill");
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) {
        assert!(Instant::now() < deadline, "the daemon survived its step");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(node.cg.oom_kills(job), 0);
    node.cg.end_job(job);
    assert!(!node.cg.job_path(job).exists(), "the job's cgroup is gone");
}

#[test]
fn a_memory_hog_is_killed_at_the_limit_and_counted_as_oom() {
    if !root_or_skip("a_memory_hog_is_killed_at_the_limit_and_counted_as_oom") {
        return;
    }
    let node = Node::new("oom", Layout::detect().expect("cgroups"), None);
    let dir = tempfile::tempdir().expect("dir");
    let job = run(2);
    let mut l = limits(&[0]);
    l.memory_bytes = Some(32 << 20);
    node.cg.create_job(job, &l).expect("job cgroup");
    // tail keeps every byte of a file with no newline: it grows until the
    // kernel kills it.
    let st = sh(
        &node,
        job,
        StepId(0),
        "exec tail /dev/zero",
        &dir.path().join("out"),
        60,
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(st.signal(), Some(9), "killed by the OOM killer: {st:?}");
    assert!(node.cg.oom_kills(job) >= 1);
    assert!(node.cg.end_step(job, StepId(0), 0), "the step's OOM kill");
    let usage = node.cg.end_job(job);
    assert!(
        usage.max_rss_bytes > 16 << 20 && usage.max_rss_bytes <= 33 << 20,
        "peak memory near the limit: {}",
        usage.max_rss_bytes
    );
    assert!(usage.cpu_ns > 0);
}

#[test]
fn a_fork_bomb_stops_at_the_pids_limit() {
    if !root_or_skip("a_fork_bomb_stops_at_the_pids_limit") {
        return;
    }
    let node = Node::new("pids", Layout::detect().expect("cgroups"), Some(16));
    let dir = tempfile::tempdir().expect("dir");
    let job = run(3);
    node.cg.create_job(job, &limits(&[0])).expect("job cgroup");
    let out = dir.path().join("out");
    let pids = node
        .cg
        .job_dir(Controller::Pids, job)
        .expect("pids controller");
    // Fifty sleepers from a subshell (which dies when a fork fails, as
    // sh does), then shell builtins only.
    let script = format!(
        "(i=0; while [ $i -lt 50 ]; do sleep 30 & i=$((i+1)); done) 2>/dev/null; \
         read n < {}/pids.current; echo current $n",
        pids.display()
    );
    let st = sh(&node, job, StepId(0), &script, &out, 30);
    let text = std::fs::read_to_string(&out).expect("output");
    assert!(st.success(), "{st:?}: {text}");
    let number = |prefix: &str| -> u32 {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {prefix:?} in {text:?}"))
    };
    // The shell and the sleepers that got a pid: forks stopped at 16.
    let current = number("current ");
    assert!(
        (8..=16).contains(&current),
        "forks stopped at the limit: {current} processes"
    );
    node.cg.end_step(job, StepId(0), 0);
    node.cg.end_job(job);
}

#[test]
fn a_task_runs_on_its_jobs_cpus_only() {
    if !root_or_skip("a_task_runs_on_its_jobs_cpus_only") {
        return;
    }
    let node = Node::new("cpus", Layout::detect().expect("cgroups"), None);
    let job = run(4);
    node.cg.create_job(job, &limits(&[1])).expect("job cgroup");
    assert_runs_on(&node, job, &[1]);
}

/// Runs a step of `job` (whose cgroup exists) that prints the CPUs it may
/// use, checks they are the host's CPUs for `cpus`, and ends the job.
fn assert_runs_on(node: &Node, job: JobRun, cpus: &[u32]) {
    let dir = tempfile::tempdir().expect("dir");
    let out = dir.path().join("out");
    let st = sh(
        node,
        job,
        StepId(0),
        "grep Cpus_allowed_list /proc/self/status",
        &out,
        10,
    );
    assert!(st.success());
    let text = std::fs::read_to_string(&out).expect("output");
    let want = node.cg.cpuset_for(cpus);
    assert_eq!(
        text.split_whitespace().nth(1),
        Some(want.as_str()),
        "{text}"
    );
    node.cg.end_step(job, StepId(0), 0);
    node.cg.end_job(job);
}

/// Makes `nvidia0` to `nvidia2` (major 195) in `dir`. No driver is
/// loaded, so an allowed open fails with ENXIO or ENODEV and a denied one
/// with EPERM: the errors tell the two apart.
fn fake_gpus(dir: &Path) -> Vec<PathBuf> {
    use nix::sys::stat::{makedev, mknod, Mode, SFlag};
    (0..3)
        .map(|i| {
            let p = dir.join(format!("nvidia{i}"));
            mknod(
                &p,
                SFlag::S_IFCHR,
                Mode::from_bits_truncate(0o666),
                makedev(195, i),
            )
            .expect("mknod");
            assert!(std::fs::metadata(&p)
                .expect("node")
                .file_type()
                .is_char_device());
            p
        })
        .collect()
}

/// A job given GPU 1 of three: what opening each device says.
fn open_gpus(node: &Node, job: JobRun) -> String {
    let dir = tempfile::tempdir().expect("dir");
    let devs = fake_gpus(dir.path());
    let mut l = limits(&[0]);
    l.denied = [0, 2]
        .into_iter()
        .map(|minor| Denied { major: 195, minor })
        .collect();
    node.cg.create_job(job, &l).expect("job cgroup");
    let out = dir.path().join("out");
    let script = format!(
        "for d in {} {} {}; do dd if=$d of=/dev/null count=1; done",
        devs[0].display(),
        devs[1].display(),
        devs[2].display()
    );
    sh(node, job, StepId(0), &script, &out, 10);
    node.cg.end_step(job, StepId(0), 0);
    node.cg.end_job(job);
    std::fs::read_to_string(&out).expect("output")
}

fn assert_only_gpu1_opens(text: &str) {
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("nvidia")).collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines[0].contains("Operation not permitted"), "{text}");
    assert!(
        lines[1].contains("No such device"),
        "the allowed GPU gets past the cgroup to the (absent) driver: {text}"
    );
    assert!(
        lines[2].contains("Operation not permitted"),
        "every denied GPU is denied: {text}"
    );
}

#[test]
fn a_job_opens_its_own_gpu_and_gets_eperm_on_another() {
    if !root_or_skip("a_job_opens_its_own_gpu_and_gets_eperm_on_another") {
        return;
    }
    let layout = Layout::detect().expect("cgroups");
    let node = Node::new("gpus", layout, None);
    assert_only_gpu1_opens(&open_gpus(&node, run(5)));
}

/// The cgroup2 mount, where one is writable.
fn cgroup2_root() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(2) == Some(&"cgroup2") && f.get(3).is_some_and(|o| o.starts_with("rw")))
            .then(|| PathBuf::from(f[1]))
    })
}

#[test]
fn the_v2_device_program_denies_other_gpus_and_cgroup_kill_empties_a_step() {
    let test = "the_v2_device_program_denies_other_gpus_and_cgroup_kill_empties_a_step";
    if !root_or_skip(test) {
        return;
    }
    let Some(root) = cgroup2_root() else {
        println!("SKIPPED (no writable cgroup2 hierarchy): {test}");
        return;
    };
    let node = Node::new("v2", Layout::V2 { root }, None);
    assert_only_gpu1_opens(&open_gpus(&node, run(6)));
    // A daemon in a v2 step goes with it too.
    let dir = tempfile::tempdir().expect("dir");
    let job = run(7);
    let mut l = limits(&[0]);
    l.memory_bytes = None;
    node.cg.create_job(job, &l).expect("job cgroup");
    let pidfile = dir.path().join("pid");
    let script = format!(
        "setsid sh -c 'sleep 300 & echo $! > {}'; exit 0",
        pidfile.display()
    );
    sh(&node, job, StepId(0), &script, &dir.path().join("out"), 10);
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .expect("pid")
        .trim()
        .parse()
        .expect("a pid");
    assert!(alive(pid));
    node.cg.end_step(job, StepId(0), 0);
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) {
        assert!(Instant::now() < deadline, "the daemon survived its v2 step");
        std::thread::sleep(Duration::from_millis(10));
    }
    node.cg.end_job(job);
}

/// The agent's start-up step: the cgroup2 root gets `favordynmods` (moving
/// a task into its cgroup then waits for no RCU grace period), the mount
/// keeps its other options, and a second start finds it on. The option is
/// machine-wide and, from Linux 6.18, stays until reboot: on a machine
/// that runs this suite that is the agent's default anyway.
#[test]
fn favordynmods_is_turned_on_once_and_the_mounts_options_stay() {
    use corral_agent::cgroup::dynmods::{favor, parse_mountinfo, Outcome};
    let test = "favordynmods_is_turned_on_once_and_the_mounts_options_stay";
    if !root_or_skip(test) {
        return;
    }
    let table = Path::new("/proc/self/mountinfo");
    let before =
        parse_mountinfo(&std::fs::read_to_string(table).expect("mountinfo")).expect("parses");
    let Some(first) = before.first().cloned() else {
        println!("SKIPPED (no cgroup2 mount): {test}");
        return;
    };
    let outcome = favor(&shared_root::Kernel, table).expect("favordynmods");
    assert!(
        matches!(outcome, Outcome::TurnedOn { .. } | Outcome::AlreadyOn),
        "{outcome:?}"
    );
    let after =
        parse_mountinfo(&std::fs::read_to_string(table).expect("mountinfo")).expect("parses");
    let m = after
        .iter()
        .find(|m| m.point == first.point)
        .expect("the mount is still there");
    assert!(m.super_options.iter().any(|o| o == "favordynmods"), "{m:?}");
    assert!(m.favors(), "{m:?}");
    for o in first.super_options.iter().chain(&first.mount_options) {
        assert!(
            m.super_options.contains(o) || m.mount_options.contains(o),
            "option {o} lost: {m:?}"
        );
    }
    assert_eq!(
        favor(&shared_root::Kernel, table).expect("again"),
        Outcome::AlreadyOn
    );
}

#[test]
fn a_job_remakes_the_nodes_cgroup_when_it_is_gone() {
    if !root_or_skip("a_job_remakes_the_nodes_cgroup_when_it_is_gone") {
        return;
    }
    let layout = Layout::detect().expect("cgroups");
    let node = Node::new("gone", layout, None);
    // The node's cgroup removed in every hierarchy (empty, so rmdir takes
    // it), as a cluster of the same parent shutting down would.
    let job = run(7);
    let mut bases: Vec<PathBuf> = Controller::ALL
        .iter()
        .filter_map(|&c| node.cg.job_dir(c, job))
        .filter_map(|d| d.parent().map(Path::to_path_buf))
        .collect();
    bases.sort();
    bases.dedup();
    assert!(!bases.is_empty());
    for b in &bases {
        std::fs::remove_dir(b).unwrap_or_else(|e| panic!("removing {}: {e}", b.display()));
    }
    // The job's cgroup comes with its node's, and its task runs in it
    // on the job's CPUs (a v1 cpuset without CPUs or memory nodes would
    // refuse it).
    assert!(node
        .cg
        .create_job(job, &limits(&[0]))
        .expect("job cgroup")
        .set_up());
    for b in &bases {
        assert!(b.is_dir(), "{} made again", b.display());
    }
    assert_runs_on(&node, job, &[0]);
}

/// The v1 layout, or a SKIPPED line: spares are v1's alone.
fn v1_or_skip(test: &str) -> Option<Layout> {
    if !root_or_skip(test) {
        return None;
    }
    let layout = Layout::detect().expect("cgroups");
    if !matches!(layout, Layout::V1 { .. }) {
        println!("SKIPPED (needs cgroup v1): {test}");
        return None;
    }
    Some(layout)
}

#[test]
fn an_ended_jobs_cgroup_is_the_next_jobs_with_nothing_of_the_last() {
    let test = "an_ended_jobs_cgroup_is_the_next_jobs_with_nothing_of_the_last";
    let Some(layout) = v1_or_skip(test) else {
        return;
    };
    let node = Node::new("spare", layout, None);
    let dir = tempfile::tempdir().expect("dir");
    let devs = fake_gpus(dir.path());
    let out = dir.path().join("out");

    // The first job: one CPU, 32 MiB, GPUs 0 and 2 denied; it burns CPU,
    // then a task of it is killed for memory.
    let first = run(10);
    let mut l = limits(&[1]);
    l.memory_bytes = Some(32 << 20);
    l.denied = [0, 2]
        .into_iter()
        .map(|minor| Denied { major: 195, minor })
        .collect();
    let made = node.cg.create_job(first, &l).expect("job cgroup");
    assert_eq!(made, corral_agent::cgroup::JobCgroup::Made);
    let busy = "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done";
    assert!(sh(&node, first, StepId(0), busy, &out, 60).success());
    node.cg.end_step(first, StepId(0), 0);
    sh(&node, first, StepId(1), "exec tail /dev/zero", &out, 60);
    assert!(node.cg.end_step(first, StepId(1), 0), "the first job's OOM");
    let used = node.cg.end_job(first);
    assert!(used.max_rss_bytes > 16 << 20, "{used:?}");
    assert!(
        !node.cg.job_path(first).exists(),
        "the first job's name is gone"
    );
    assert_eq!(node.cg.spares(), 1, "its cgroup was kept");

    // The next job gets it: one other CPU, no memory limit, every GPU.
    let next = run(11);
    let open = limits(&[0]);
    let open = Limits {
        memory_bytes: None,
        ..open
    };
    let made = node.cg.create_job(next, &open).expect("job cgroup");
    let baseline = match made {
        corral_agent::cgroup::JobCgroup::Reused { oom_kills } => oom_kills,
        other => panic!("the spare was not reused: {other:?}"),
    };
    assert!(baseline >= 1, "the OOM kill before it is its baseline");
    assert_eq!(node.cg.spares(), 0);
    assert!(node.cg.job_path(next).is_dir());
    let mem = node
        .cg
        .job_dir(Controller::Memory, next)
        .expect("memory controller");
    let script = format!(
        "grep Cpus_allowed_list /proc/self/status; cat {}/memory.limit_in_bytes; \
         for d in {} {} {}; do dd if=$d of=/dev/null count=1; done",
        mem.display(),
        devs[0].display(),
        devs[1].display(),
        devs[2].display()
    );
    sh(&node, next, StepId(0), &script, &out, 10);
    let text = std::fs::read_to_string(&out).expect("output");
    let mut lines = text.lines();
    let cpus = lines.next().and_then(|l| l.split_whitespace().nth(1));
    assert_eq!(cpus, Some(node.cg.cpuset_for(&[0]).as_str()), "{text}");
    let limit: u64 = lines
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no memory limit in {text}"));
    assert!(limit > 1 << 60, "no memory limit left: {limit}");
    let gpus: Vec<&str> = text.lines().filter(|l| l.contains("nvidia")).collect();
    assert_eq!(gpus.len(), 3, "{text}");
    assert!(
        gpus.iter().all(|l| l.contains("No such device")),
        "every GPU gets past the cgroup now: {text}"
    );
    assert!(
        !node.cg.end_step(next, StepId(0), baseline),
        "the last job's OOM kill is not the next one's"
    );
    let usage = node.cg.end_job(next);
    assert!(
        usage.cpu_ns < used.cpu_ns / 2,
        "CPU time counts this job's alone: {usage:?} after {used:?}"
    );
    assert!(
        usage.max_rss_bytes < 8 << 20,
        "the peak counts this job's alone: {usage:?} after {used:?}"
    );
    assert_eq!(node.cg.spares(), 1);

    // And the one after denies GPUs 0 and 2 again, from "allow all".
    assert_only_gpu1_opens(&open_gpus(&node, run(12)));
    assert_eq!(node.cg.spares(), 1);

    // A job with a small memory limit never starts with what a spare
    // may still be charged with: its cgroup is made.
    let small = run(13);
    let mut l = limits(&[0]);
    l.memory_bytes = Some(corral_agent::cgroup::SPARE_MIN_LIMIT - 1);
    let made = node.cg.create_job(small, &l).expect("job cgroup");
    assert_eq!(made, corral_agent::cgroup::JobCgroup::Made);
    assert_eq!(node.cg.spares(), 1, "the spare stays for another job");
    node.cg.end_job(small);
}

#[test]
fn a_frozen_or_vanished_spare_is_never_reused() {
    let test = "a_frozen_or_vanished_spare_is_never_reused";
    let Some(layout) = v1_or_skip(test) else {
        return;
    };
    let node = Node::new("spare-gone", layout, None);
    // A job whose cgroup is still frozen as it ends is removed.
    let frozen = run(20);
    node.cg
        .create_job(frozen, &limits(&[0]))
        .expect("job cgroup");
    assert!(node.cg.freeze_job(frozen, true));
    node.cg.remove_job(frozen);
    assert_eq!(node.cg.spares(), 0, "a frozen cgroup is not kept");
    assert!(!node.cg.job_path(frozen).exists(), "it was removed");

    // A spare removed behind the agent's back (with its node's cgroup)
    // is dropped, and the job's cgroup made as at start.
    let kept = run(21);
    node.cg.create_job(kept, &limits(&[0])).expect("job cgroup");
    node.cg.end_job(kept);
    assert_eq!(node.cg.spares(), 1);
    let job = run(22);
    let bases: Vec<PathBuf> = Controller::ALL
        .iter()
        .filter_map(|&c| node.cg.job_dir(c, job))
        .filter_map(|d| d.parent().map(Path::to_path_buf))
        .collect();
    for b in &bases {
        for e in std::fs::read_dir(b).expect("node cgroup").flatten() {
            if e.file_name().to_string_lossy().starts_with("spare_") {
                std::fs::remove_dir(e.path()).expect("removing the spare");
            }
        }
        let _ = std::fs::remove_dir(b);
    }
    let made = node.cg.create_job(job, &limits(&[0])).expect("job cgroup");
    assert_eq!(made, corral_agent::cgroup::JobCgroup::Made);
    assert_eq!(node.cg.spares(), 0, "the vanished spare was dropped");
    assert_runs_on(&node, job, &[0]);
}
