//! What starting one task costs the agent: `ProcessLauncher::spawn` of
//! `/bin/true` and the wait for it, against a plain fork/exec of the same
//! command from the same process (tokio's `Command` with a `pre_exec`,
//! which makes the standard library fork, as the agent's launcher did
//! before it started tasks through `spawn::spawn`).
//!
//! A fork copies the page tables of the process that forks, so the bench
//! first makes itself about as large as an agent: 10 MiB of heap,
//! written (an agent of `corral up` held 8.2–9.6 MiB resident after 20
//! sruns, `ps -o rss`).
//!
//! | bench             | budget    | measured (2 Dec 2026, this machine) |
//! |-------------------|-----------|-------------------------------------|
//! | launch/clone_true | ≤ 1 ms    | 0.58–0.60 ms |
//! | launch/fork_true  | (the old way, for comparison) | 1.24–1.32 ms |
//! | launch/clone_true_in_pid_namespace (root) | ≤ clone_true + 50 µs | 688 µs beside clone_true's 697 µs (7 Dec 2026, same run) |
//! | launch/pid_namespace_made_and_ended (root; a `sleep` as its holder) | ≤ 1 ms | 280 µs |
//!
//! The old way also waited through tokio's SIGCHLD handling rather than
//! a pidfd: the difference is the fork and the wait together, as the
//! agent paid them.
//!
//! Run: `cargo bench -p benches --bench launch` (any user: the task runs
//! as the one running the bench).

use corral_agent::launch::{Io, Launcher, ProcessLauncher, TaskSpec};
use corral_agent::pidns::PidNamespace;
use criterion::{criterion_group, criterion_main, Criterion};

fn spec(dir: &std::path::Path) -> TaskSpec {
    TaskSpec {
        tty: None,
        umask: None,
        argv: vec!["/bin/true".into()],
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        cwd: dir.to_path_buf(),
        user: corral_proto::msg::Ident {
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
        },
        stdin: Io::Null,
        stdout: Io::Null,
        stderr: Io::Null,
        jail: None,
        groups: None,
        cgroup: None,
        pid_ns: None,
    }
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("dir");
    // About an agent's size: pages a fork has to copy the tables of.
    let ballast: Vec<u8> = (0..10usize << 20).map(|i| i as u8).collect();
    let mut g = c.benchmark_group("launch");
    g.bench_function("clone_true", |b| {
        b.iter(|| {
            rt.block_on(async {
                let mut task = ProcessLauncher.spawn(spec(dir.path())).expect("spawn");
                assert!(task.wait().await.expect("wait").success());
            })
        })
    });
    // As root: the same task in a job's PID namespace (each spawn enters
    // it for the clone and comes back), and what a namespace costs to
    // make (its holder's start) and end.
    if nix::unistd::geteuid().is_root() {
        let ns = std::sync::Arc::new(
            PidNamespace::held_by("/bin/sleep".as_ref(), &["100000".into()]).expect("holder"),
        );
        g.bench_function("clone_true_in_pid_namespace", |b| {
            b.iter(|| {
                rt.block_on(async {
                    let mut s = spec(dir.path());
                    s.pid_ns = Some(ns.clone());
                    let mut task = ProcessLauncher.spawn(s).expect("spawn");
                    assert!(task.wait().await.expect("wait").success());
                })
            })
        });
        g.bench_function("pid_namespace_made_and_ended", |b| {
            b.iter(|| {
                rt.block_on(async {
                    let ns = PidNamespace::held_by("/bin/sleep".as_ref(), &["100000".into()])
                        .expect("holder");
                    ns.end().await;
                })
            })
        });
    }
    g.bench_function("fork_true", |b| {
        b.iter(|| {
            rt.block_on(async {
                let mut cmd = tokio::process::Command::new("/bin/true");
                cmd.current_dir(dir.path());
                // SAFETY: the hook does nothing; its presence alone makes
                // the standard library fork rather than posix_spawn.
                #[allow(unsafe_code)]
                unsafe {
                    cmd.pre_exec(|| Ok(()));
                }
                let st = cmd.status().await.expect("fork");
                assert!(st.success());
            })
        })
    });
    g.finish();
    std::hint::black_box(&ballast);
}

criterion_group!(launch, benches);
criterion_main!(launch);
