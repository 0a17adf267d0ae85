//! What a task sees: Slurm's environment ([`task_env`]) and output file
//! names ([`expand_pattern`]). Pure functions of a launch; no I/O but the
//! user name lookup.

use corral_hostlist as hostlist;
use corral_proto::msg::{Launch, LaunchKind};
pub use corral_proto::pattern::{expand_pattern, PatternVars};

/// The file mode mask a job's tasks start with: its submitter's, as
/// `SLURM_UMASK` says (octal); `None` when absent or not a mask.
pub fn umask_of(env: &[(String, String)]) -> Option<u32> {
    let (_, v) = env.iter().rev().find(|(k, _)| k == "SLURM_UMASK")?;
    u32::from_str_radix(v, 8).ok().filter(|&m| m <= 0o777)
}

/// The user's name, or the uid as text when the node does not know it.
pub fn user_name(uid: u32) -> String {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_else(|| uid.to_string())
}

fn join(v: &[u32]) -> String {
    v.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// Counts per node as Slurm writes them: runs of one count folded,
/// `2(x3),1`.
pub fn per_node(counts: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < counts.len() {
        let n = counts[i..].iter().take_while(|&&c| c == counts[i]).count();
        parts.push(if n > 1 {
            format!("{}(x{n})", counts[i])
        } else {
            counts[i].to_string()
        });
        i += n;
    }
    parts.join(",")
}

/// The environment of task `local` (0-based on this node) of a launch:
/// the submitter's exported variables, then Slurm's.
pub fn task_env(
    l: &Launch,
    node: &str,
    user: &str,
    local: u32,
    agent_socket: &str,
    cluster: &str,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = l.env.clone();
    if !env.iter().any(|(k, _)| k == "PATH") {
        env.push(("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()));
    }
    // In the job's own node order (SLURM_NODEID counts along it), so that
    // expanding the list names node 0 first.
    let nodelist = hostlist::compress(&l.job_nodes);
    let job = l.job.to_string();
    let batch = matches!(l.what, LaunchKind::Batch { .. });
    // A step that asked for its own GPUs sees only those.
    let step_gpus = l.step_gpus.as_deref().unwrap_or(&l.gpus);
    let gpus: Vec<u32> = match l.gpus_per_task {
        Some(g) if !batch => {
            let (a, b) = ((local * g) as usize, ((local + 1) * g) as usize);
            step_gpus.get(a..b).map(<[u32]>::to_vec).unwrap_or_default()
        }
        _ => step_gpus.to_vec(),
    };
    // srun's `-m` set it; otherwise what Corral does.
    let distribution_given = env.iter().any(|(k, _)| k == "SLURM_DISTRIBUTION");
    let mut set = |k: &str, v: String| {
        env.retain(|(key, _)| key != k);
        env.push((k.to_string(), v));
    };
    set("SLURM_CLUSTER_NAME", cluster.to_string());
    set("SLURM_JOB_ID", job.clone());
    set("SLURM_JOBID", job);
    set("SLURM_JOB_NAME", l.name.clone());
    if let Some(a) = &l.array {
        set("SLURM_ARRAY_JOB_ID", a.job.to_string());
        set("SLURM_ARRAY_TASK_ID", a.task.to_string());
        set("SLURM_ARRAY_TASK_COUNT", a.count.to_string());
        set("SLURM_ARRAY_TASK_MIN", a.min.to_string());
        set("SLURM_ARRAY_TASK_MAX", a.max.to_string());
        set("SLURM_ARRAY_TASK_STEP", a.step.to_string());
    }
    set("SLURM_JOB_NODELIST", nodelist.clone());
    set("SLURM_NODELIST", nodelist);
    set("SLURM_JOB_NUM_NODES", l.job_nodes.len().to_string());
    set("SLURM_NNODES", l.step_nodes.to_string());
    set("SLURM_NTASKS", l.ntasks.to_string());
    set("SLURM_NPROCS", l.ntasks.to_string());
    set("SLURM_PROCID", (l.first_task + local).to_string());
    set("SLURM_LOCALID", local.to_string());
    set("SLURM_NODEID", l.node_index.to_string());
    if l.shape.cpus_per_task_given {
        set("SLURM_CPUS_PER_TASK", l.cpus_per_task.to_string());
    }
    set("SLURM_CPUS_ON_NODE", l.cpus.len().to_string());
    // Where sbatch ran, whatever `-D` said.
    set(
        "SLURM_SUBMIT_DIR",
        l.shape
            .submit_dir
            .clone()
            .unwrap_or_else(|| l.work_dir.clone()),
    );
    if let Some(h) = &l.shape.submit_host {
        set("SLURM_SUBMIT_HOST", h.clone());
    }
    if let Some(q) = &l.shape.qos {
        set("SLURM_JOB_QOS", q.clone());
    }
    if let Some(a) = &l.shape.account {
        set("SLURM_JOB_ACCOUNT", a.clone());
    }
    set("SLURM_JOB_CPUS_PER_NODE", per_node(&l.shape.job_cpus));
    if let Some(n) = l.shape.ntasks_per_node {
        set("SLURM_NTASKS_PER_NODE", n.to_string());
    }
    set(
        "SLURM_GTIDS",
        (l.first_task..l.first_task + l.tasks_here)
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(","),
    );
    set("SLURM_JOB_PARTITION", l.partition.clone());
    // Only once requeued, as Slurm's (measured on 22.05: unset in a
    // job's first run, 1 in its second).
    if l.run > 0 {
        set("SLURM_RESTART_COUNT", l.run.to_string());
    }
    set("SLURM_JOB_UID", l.user.uid.to_string());
    set("SLURM_JOB_GID", l.user.gid.to_string());
    set("SLURM_JOB_USER", user.to_string());
    set("SLURMD_NODENAME", node.to_string());
    set("SLURM_TOPOLOGY_ADDR", node.to_string());
    // A flat topology, and no node known by another address (Slurm's
    // words for them).
    set("SLURM_TOPOLOGY_ADDR_PATTERN", "node".into());
    set("SLURM_NODE_ALIASES", "(null)".into());
    if batch {
        // The batch script sees the allocation; it is no step of its own
        // to Slurm's launchers (no SLURM_STEP_ID).
        set("SLURM_TASKS_PER_NODE", per_node(&l.shape.job_tasks));
    } else {
        // The job's first nodes, unless the launch names others.
        let steps_nodes = match l.shape.step_nodes.as_slice() {
            [] => l.job_nodes.get(..l.shape.step_tasks.len()).unwrap_or(&[]),
            named => named,
        };
        set("SLURM_STEP_ID", l.step.to_string());
        set("SLURM_STEPID", l.step.to_string());
        set("SLURM_STEP_NUM_NODES", l.step_nodes.to_string());
        set("SLURM_STEP_NUM_TASKS", l.ntasks.to_string());
        set("SLURM_STEP_NODELIST", hostlist::compress(steps_nodes));
        set("SLURM_TASKS_PER_NODE", per_node(&l.shape.step_tasks));
        set("SLURM_STEP_TASKS_PER_NODE", per_node(&l.shape.step_tasks));
        if !distribution_given {
            set("SLURM_DISTRIBUTION", "block".into());
        }
        set(
            "SLURM_JOB_CPUS_PER_NODE_PACK_GROUP_0",
            per_node(&l.shape.job_cpus),
        );
        // Unset, not empty, in a step without GPUs (as Slurm's).
        if !gpus.is_empty() {
            set("SLURM_STEP_GPUS", join(&gpus));
        }
        if let LaunchKind::Step { io, .. } = &l.what {
            set("SLURM_LAUNCH_NODE_IPADDR", io.addr.ip().to_string());
            set("SLURM_SRUN_COMM_HOST", io.addr.ip().to_string());
        }
    }
    if let Some(t) = l.time_limit {
        set("SLURM_JOB_TIME_LIMIT", t.to_string());
    }
    set("CUDA_VISIBLE_DEVICES", join(&gpus));
    set("GPU_DEVICE_ORDINAL", join(&gpus));
    if !l.gpus.is_empty() {
        set("SLURM_JOB_GPUS", join(&l.gpus));
        set("SLURM_GPUS_ON_NODE", l.gpus.len().to_string());
    }
    set("CORRAL_AGENT_SOCKET", agent_socket.to_string());
    env
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_proto::msg::{Ident, JobId, LaunchShape, StepId, StepIo};

    fn vars() -> PatternVars<'static> {
        PatternVars {
            job: 42,
            name: "train",
            node: "worker-3",
            user: "alice",
            step: None,
            array: None,
            task: None,
            node_index: None,
        }
    }

    #[test]
    fn patterns_expand_like_slurm() {
        assert_eq!(expand_pattern("slurm-%j.out", &vars()), "slurm-42.out");
        assert_eq!(
            expand_pattern("%x-%N-%u-%A_%a.%%", &vars()),
            "train-worker-3-alice-42_4294967294.%"
        );
        assert_eq!(expand_pattern("%5j-%J-%s", &vars()), "00042-42-batch");
        assert_eq!(expand_pattern("odd%q%", &vars()), "odd%q%");
        // A task of an array: its array's id and its own index.
        let task = PatternVars {
            array: Some((40, 7)),
            ..vars()
        };
        assert_eq!(expand_pattern("slurm-%A_%a.out", &task), "slurm-40_7.out");
        assert_eq!(expand_pattern("%j-%3a", &task), "42-007");
        let rank = PatternVars {
            task: Some(3),
            node_index: Some(1),
            step: Some(2),
            ..vars()
        };
        assert_eq!(
            expand_pattern("out-%j.%s-%2t-%n-%N", &rank),
            "out-42.2-03-1-worker-3"
        );
        assert_eq!(expand_pattern("%J", &rank), "42.2");
    }

    fn launch(gpus_per_task: Option<u32>) -> Launch {
        Launch {
            job: JobId(7),
            run: 0,
            step: StepId(0),
            name: "n".into(),
            user: Ident { uid: 0, gid: 0 },
            partition: "gpu".into(),
            work_dir: "/tmp".into(),
            env: vec![
                ("HOME".into(), "/root".into()),
                ("SLURM_PROCID".into(), "99".into()),
            ],
            job_nodes: vec!["worker-0".into(), "worker-1".into()],
            node_index: 1,
            step_nodes: 2,
            ntasks: 4,
            first_task: 2,
            tasks_here: 2,
            cpus_per_task: 1,
            cpus: vec![0, 1],
            gpus: vec![2, 3, 5, 6],
            gpus_per_task,
            memory_mb: 0,
            time_limit: Some(60),
            exclusive: false,
            what: LaunchKind::Step {
                argv: vec!["true".into()],
                io: StepIo {
                    addr: "127.0.0.1:1".parse().unwrap(),
                    cert_sha256: [0; 32],
                    secret: [0; 32],
                },
                files: Default::default(),
            },
            step_gpus: None,
            shape: LaunchShape {
                job_tasks: vec![2, 2, 1],
                job_cpus: vec![4, 4, 2],
                step_tasks: vec![2, 2],
                ntasks_per_node: None,
                cpus_per_task_given: false,
                submit_dir: Some("/home/ada".into()),
                submit_host: Some("login-1".into()),
                qos: None,
                account: Some("ml".into()),
                step_nodes: vec![],
            },
            array: None,
        }
    }

    fn get<'a>(env: &'a [(String, String)], k: &str) -> &'a str {
        let all: Vec<_> = env.iter().filter(|(key, _)| key == k).collect();
        assert_eq!(all.len(), 1, "{k} set once");
        &all[0].1
    }

    #[test]
    fn env_names_task_node_and_gpus() {
        let env = task_env(&launch(None), "worker-1", "root", 1, "/run/a.sock", "c");
        assert_eq!(get(&env, "SLURM_PROCID"), "3");
        assert_eq!(get(&env, "SLURM_LOCALID"), "1");
        assert_eq!(get(&env, "SLURM_NODEID"), "1");
        assert_eq!(get(&env, "SLURM_JOB_NODELIST"), "worker-[0-1]");
        assert_eq!(get(&env, "SLURMD_NODENAME"), "worker-1");
        assert_eq!(get(&env, "CUDA_VISIBLE_DEVICES"), "2,3,5,6");
        assert_eq!(get(&env, "HOME"), "/root");
        let env = task_env(&launch(Some(2)), "worker-1", "root", 1, "/run/a.sock", "c");
        assert_eq!(get(&env, "CUDA_VISIBLE_DEVICES"), "5,6");
        assert_eq!(get(&env, "SLURM_STEP_GPUS"), "5,6");
        assert_eq!(get(&env, "SLURM_GPUS_ON_NODE"), "4");
        // A step with its own GPUs sees those only.
        let mut l = launch(None);
        l.step_gpus = Some(vec![5]);
        let env = task_env(&l, "worker-1", "root", 0, "/run/a.sock", "c");
        assert_eq!(get(&env, "CUDA_VISIBLE_DEVICES"), "5");
        assert_eq!(get(&env, "SLURM_JOB_GPUS"), "2,3,5,6");
        assert!(env.iter().all(|(k, _)| !k.starts_with("SLURM_ARRAY")));
        // SLURM_RESTART_COUNT only once the job was requeued.
        assert!(env.iter().all(|(k, _)| k != "SLURM_RESTART_COUNT"));
        l.run = 2;
        let env = task_env(&l, "worker-1", "root", 0, "/run/a.sock", "c");
        assert_eq!(get(&env, "SLURM_RESTART_COUNT"), "2");
    }

    #[test]
    fn a_step_on_some_of_the_jobs_nodes_names_them() {
        let mut l = launch(None);
        l.job_nodes = vec!["worker-0".into(), "worker-1".into(), "worker-2".into()];
        l.shape.step_tasks = vec![2, 2];
        l.shape.step_nodes = vec!["worker-0".into(), "worker-2".into()];
        let env = task_env(&l, "worker-2", "root", 0, "/run/a.sock", "c");
        assert_eq!(get(&env, "SLURM_STEP_NODELIST"), "worker-[0,2]");
        assert_eq!(get(&env, "SLURM_JOB_NODELIST"), "worker-[0-2]");
        // No GPUs: SLURM_STEP_GPUS is unset, not empty.
        l.gpus.clear();
        let env = task_env(&l, "worker-2", "root", 0, "/run/a.sock", "c");
        assert!(!env.iter().any(|(k, _)| k == "SLURM_STEP_GPUS"));
    }

    #[test]
    fn a_task_of_an_array_sees_its_array() {
        let mut l = launch(None);
        l.array = Some(corral_proto::msg::ArrayEnv {
            job: JobId(5),
            task: 12,
            count: 4,
            min: 0,
            max: 12,
            step: 4,
        });
        let env = task_env(&l, "worker-1", "root", 0, "/run/a.sock", "c");
        assert_eq!(get(&env, "SLURM_JOB_ID"), "7");
        assert_eq!(get(&env, "SLURM_ARRAY_JOB_ID"), "5");
        assert_eq!(get(&env, "SLURM_ARRAY_TASK_ID"), "12");
        assert_eq!(get(&env, "SLURM_ARRAY_TASK_COUNT"), "4");
        assert_eq!(get(&env, "SLURM_ARRAY_TASK_MIN"), "0");
        assert_eq!(get(&env, "SLURM_ARRAY_TASK_MAX"), "12");
        assert_eq!(get(&env, "SLURM_ARRAY_TASK_STEP"), "4");
    }

    /// What launchers compute ranks from, in a step and in the batch
    /// script.
    #[test]
    fn env_describes_the_job_and_the_step_over_their_nodes() {
        let mut l = launch(None);
        l.job_nodes.push("worker-2".into());
        let env = task_env(&l, "worker-1", "root", 0, "/run/a.sock", "c");
        assert_eq!(get(&env, "SLURM_TASKS_PER_NODE"), "2(x2)");
        assert_eq!(get(&env, "SLURM_STEP_TASKS_PER_NODE"), "2(x2)");
        assert_eq!(get(&env, "SLURM_STEP_NODELIST"), "worker-[0-1]");
        assert_eq!(get(&env, "SLURM_JOB_NODELIST"), "worker-[0-2]");
        assert_eq!(get(&env, "SLURM_JOB_CPUS_PER_NODE"), "4(x2),2");
        assert_eq!(get(&env, "SLURM_GTIDS"), "2,3");
        assert_eq!(get(&env, "SLURM_SUBMIT_DIR"), "/home/ada");
        assert_eq!(get(&env, "SLURM_SUBMIT_HOST"), "login-1");
        assert_eq!(get(&env, "SLURM_JOB_ACCOUNT"), "ml");
        assert_eq!(get(&env, "SLURM_LAUNCH_NODE_IPADDR"), "127.0.0.1");
        assert_eq!(get(&env, "SLURM_STEP_ID"), "0");
        // As a Slurm 22.05 step's.
        assert_eq!(get(&env, "SLURM_DISTRIBUTION"), "block");
        assert_eq!(get(&env, "SLURM_JOB_CPUS_PER_NODE_PACK_GROUP_0"), "4(x2),2");
        assert_eq!(get(&env, "SLURM_TOPOLOGY_ADDR_PATTERN"), "node");
        assert_eq!(get(&env, "SLURM_NODE_ALIASES"), "(null)");
        assert!(!env.iter().any(|(k, _)| k == "SLURM_NTASKS_PER_NODE"));
        assert!(
            !env.iter().any(|(k, _)| k == "SLURM_CPUS_PER_TASK"),
            "no -c"
        );
        l.shape.cpus_per_task_given = true;
        let env = task_env(&l, "worker-1", "root", 0, "/run/a.sock", "c");
        assert_eq!(get(&env, "SLURM_CPUS_PER_TASK"), "1");
        l.shape.ntasks_per_node = Some(2);
        l.what = LaunchKind::Batch {
            script: Vec::new(),
            args: vec![],
            stdout: "o".into(),
            stderr: None,
            append: false,
        };
        (l.first_task, l.tasks_here) = (0, 1);
        let env = task_env(&l, "worker-0", "root", 0, "/run/a.sock", "c");
        assert_eq!(get(&env, "SLURM_TASKS_PER_NODE"), "2(x2),1");
        assert_eq!(get(&env, "SLURM_NTASKS_PER_NODE"), "2");
        assert_eq!(get(&env, "SLURM_GTIDS"), "0");
        assert_eq!(get(&env, "SLURM_TOPOLOGY_ADDR_PATTERN"), "node");
        assert_eq!(get(&env, "SLURM_NODE_ALIASES"), "(null)");
        for absent in [
            "SLURM_DISTRIBUTION",
            "SLURM_JOB_CPUS_PER_NODE_PACK_GROUP_0",
            "SLURM_STEP_ID",
            "SLURM_STEP_NODELIST",
            "SLURM_LAUNCH_NODE_IPADDR",
        ] {
            assert!(
                !env.iter().any(|(k, _)| k == absent),
                "{absent} in a batch script"
            );
        }
    }

    #[test]
    fn counts_per_node_fold_like_slurm() {
        assert_eq!(per_node(&[]), "");
        assert_eq!(per_node(&[3]), "3");
        assert_eq!(per_node(&[3, 1]), "3,1");
        assert_eq!(per_node(&[2, 2]), "2(x2)");
        assert_eq!(per_node(&[1, 2, 2, 2, 1, 1]), "1,2(x3),1(x2)");
    }
}
