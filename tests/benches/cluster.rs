//! End-to-end speed of a real cluster on loopback: 4 agents × 8 simulated
//! GPUs, one corral-ctld, release binaries.
//!
//! Budgets (10× the published Slurm figures of about 1,000 submissions/s
//! and 500 tiny jobs/s, as the runtime issue asks):
//!
//! | bench                              | budget                  |
//! |------------------------------------|-------------------------|
//! | submit/pipelined_1_client          | ≥ 10,000 submissions/s  |
//! | submit/pipelined_8_clients         | ≥ 10,000 submissions/s  |
//! | submit/sbatch_process              | (a process per job: reported, no budget) |
//! | tiny_jobs/wrap_true                | ≥ 5,000 jobs/s end to end |
//! | tiny_jobs/no_exec (control plane)  | ≥ 5,000 jobs/s          |
//! | srun/N1_true                       | p50 ≤ 20 ms             |
//! | squeue/10k_pending                 | ≤ 100 ms                |
//! | squeue/10k_pending_all_codes       | ≤ 100 ms (every `%` code: views with detail) |
//! | controller memory, 10k pending     | ≤ 10 KiB per job        |
//!
//! Run: `cargo bench -p corral-e2e --bench cluster`. p50/p99 of srun and
//! the controller's memory are printed before criterion's figures.

use std::time::{Duration, Instant};

use corral_ctl::client::{pipeline_to, Client};
use corral_e2e::{tiny_job, Env, Opts};
use corral_proto::msg::{Request, Response};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

/// Every job `%` code squeue knows, in one format.
const ALL_CODES: &str = "%i %A %a %F %K %j %u %U %g %G %P %q %t %T %M %l %L %D %C %m %c %b %R %r %N %S %V %e %E %Q %p %y %o %Z %k %n %x %h %W %f %O %d %H %I %J %z %v %w %X %Y %B";

fn submit_all(
    rt: &tokio::runtime::Runtime,
    env: &Env,
    n: usize,
    clients: usize,
    hold: bool,
) -> Duration {
    let sock = env.cluster.socket(0);
    let per = n.div_ceil(clients);
    let t0 = Instant::now();
    rt.block_on(async {
        let mut hs = Vec::new();
        for c in 0..clients {
            let count = per.min(n.saturating_sub(c * per));
            let reqs = (0..count)
                .map(|_| Request::Submit(tiny_job(&env.work, hold)))
                .collect();
            let sock = sock.clone();
            hs.push(tokio::spawn(async move { pipeline_to(&sock, reqs).await }));
        }
        for h in hs {
            let resps = h.await.expect("join").expect("pipeline");
            for r in resps {
                assert!(matches!(r, Response::Submitted { .. }), "{r:?}");
            }
        }
    });
    t0.elapsed()
}

fn active(rt: &tokio::runtime::Runtime, env: &Env) -> u64 {
    rt.block_on(async {
        let mut c = Client::connect_to(&env.cluster.socket(0))
            .await
            .expect("agent");
        match c.ok(Request::Stats).await {
            Ok(Response::Stats(s)) => s.pending + s.running + s.completing,
            other => panic!("{other:?}"),
        }
    })
}

fn cancel_all(env: &Env) {
    env.ok(&["scancel", "-t", "PD"]);
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// Submits a batch of tiny jobs from four clients and times until the
/// last has finished.
fn tiny_jobs(c: &mut Criterion, rt: &tokio::runtime::Runtime, env: &Env, name: &str) {
    let mut g = c.benchmark_group("tiny_jobs");
    g.throughput(Throughput::Elements(1));
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(20));
    g.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let t0 = Instant::now();
            submit_all(rt, env, iters as usize, 4, false);
            while active(rt, env) > 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
            t0.elapsed()
        })
    });
    g.finish();
}

/// p50 and p99 of `srun -N1 true` over 100 runs, in milliseconds.
fn srun_percentiles(env: &Env) -> (f64, f64) {
    let mut lat: Vec<Duration> = (0..100)
        .map(|_| {
            let t0 = Instant::now();
            // "/" exists on the host and in any jail.
            let (code, _, e) = env.run(&["srun", "-N1", "-D", "/", "true"]);
            assert_eq!(code, 0, "{e}");
            t0.elapsed()
        })
        .collect();
    lat.sort();
    (lat[49].as_secs_f64() * 1e3, lat[98].as_secs_f64() * 1e3)
}

/// Median, least and most of a few rates.
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

impl Spread {
    fn of(mut v: Vec<f64>) -> Spread {
        v.sort_by(f64::total_cmp);
        Spread {
            median: v[v.len() / 2],
            min: v[0],
            max: v[v.len() - 1],
        }
    }

    fn show(&self) -> String {
        format!("{:.0}/s ({:.0}–{:.0})", self.median, self.min, self.max)
    }
}

/// `n` runs of each of two set-ups, alternating, so that whatever else
/// the machine does falls on both alike.
fn interleaved(
    n: usize,
    mut a: impl FnMut() -> f64,
    mut b: impl FnMut() -> f64,
) -> (Spread, Spread) {
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for _ in 0..n {
        xs.push(a());
        ys.push(b());
    }
    (Spread::of(xs), Spread::of(ys))
}

fn benches(c: &mut Criterion) {
    let env = Env::start(Opts {
        nodes: 4,
        gpus: 8,
        ..Opts::default()
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");

    // srun latency percentiles (criterion shows the mean and median too).
    let (p50, p99) = srun_percentiles(&env);
    println!("srun -N1 true over 100 runs: p50 {p50:.1} ms, p99 {p99:.1} ms (budget p50 ≤ 20 ms)");
    // The same inside the shared-root jail (needs root): what entering it
    // costs each task.
    if corral_e2e::is_root() {
        let root = tempfile::tempdir().expect("root dir");
        shared_root::scaffold::host_usr(root.path(), "bench").expect("a tiny root");
        let jailed = Env::start(Opts {
            nodes: 1,
            jail: Some(root.path().to_path_buf()),
            jail_submounts: vec!["/usr:/usr:ro".into()],
            ..Opts::default()
        });
        let (j50, j99) = srun_percentiles(&jailed);
        println!(
            "srun -N1 true in the jail over 100 runs: p50 {j50:.1} ms, p99 {j99:.1} ms \
             (+{:.1} ms at the median)",
            j50 - p50
        );
        drop(jailed);
        // With and without the job's cgroup (as root every job gets one),
        // on one-node clusters alike.
        let one = |cgroups| {
            let env = Env::start(Opts {
                nodes: 1,
                cgroups,
                ..Opts::default()
            });
            srun_percentiles(&env)
        };
        let (c50, c99) = one(true);
        let (n50, n99) = one(false);
        println!(
            "srun -N1 true on one node, with cgroups: p50 {c50:.1} ms, p99 {c99:.1} ms; \
             without: p50 {n50:.1} ms, p99 {n99:.1} ms (+{:.1} ms at the median)",
            c50 - n50
        );
    } else {
        println!("SKIPPED (needs root): srun -N1 true in the jail and without cgroups");
    }

    // What durability costs submissions: the same held submissions into a
    // controller that stores them (fsync per group commit) and into one
    // that keeps them in memory only. One run of each swings by ±15% on
    // a shared 2-core machine: five of each, interleaved, medians.
    for clients in [1, 8] {
        let rate = |durable| {
            let e = Env::start(Opts {
                nodes: 1,
                durable,
                ..Opts::default()
            });
            let n = 20_000;
            let took = submit_all(&rt, &e, n, clients, true);
            n as f64 / took.as_secs_f64()
        };
        let (on, off) = interleaved(5, || rate(true), || rate(false));
        println!(
            "submissions, {clients} pipelined client(s): {} durable, {} in memory \
             (durability costs {:.0}% at the medians; aim < 20%)",
            on.show(),
            off.show(),
            100.0 * (1.0 - on.median / off.median)
        );
    }

    // What the store and accounting cost finished jobs: tiny jobs through
    // the control plane (agents do not fork them) into a controller that
    // stores and accounts them, one that stores them only, and one that
    // keeps them in memory.
    let tiny_rate = |durable, extra: &str| {
        let e = Env::start(Opts {
            nodes: 4,
            gpus: 8,
            no_exec: true,
            durable,
            extra_config: extra.to_string(),
            ..Opts::default()
        });
        let n = 3_000;
        let t0 = Instant::now();
        submit_all(&rt, &e, n, 1, false);
        while active(&rt, &e) > 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        n as f64 / t0.elapsed().as_secs_f64()
    };
    let (mut accounted, mut stored, mut memory) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        accounted.push(tiny_rate(true, ""));
        stored.push(tiny_rate(true, "\n[accounting]\nenabled = false\n"));
        memory.push(tiny_rate(false, ""));
    }
    println!(
        "tiny jobs end to end (no exec), 3 runs each: {} stored and accounted (SQLite), \
         {} stored only, {} in memory",
        Spread::of(accounted).show(),
        Spread::of(stored).show(),
        Spread::of(memory).show()
    );

    // Controller memory with 10,000 pending jobs.
    let pid = env.cluster.ctld_pid().expect("ctld pid");
    let before = rss_kib(pid);
    submit_all(&rt, &env, 10_000, 1, true);
    std::thread::sleep(Duration::from_millis(500));
    let after = rss_kib(pid);
    println!(
        "controller RSS: {before} KiB idle, {after} KiB with 10,000 pending jobs: {:.2} KiB per job (budget ≤ 10 KiB)",
        (after.saturating_sub(before)) as f64 / 10_000.0
    );

    let mut g = c.benchmark_group("squeue");
    g.sample_size(20);
    g.bench_function("10k_pending", |b| {
        b.iter(|| {
            let o = env.cmd(&["squeue"]).output().expect("squeue");
            assert!(o.status.success());
            assert!(o.stdout.len() > 10_000 * 60);
        })
    });
    g.bench_function("10k_pending_all_codes", |b| {
        b.iter(|| {
            let o = env
                .cmd(&["squeue", "-o", ALL_CODES])
                .output()
                .expect("squeue");
            assert!(o.status.success());
            assert!(o.stdout.len() > 10_000 * 200);
        })
    });
    g.finish();
    cancel_all(&env);

    let mut g = c.benchmark_group("submit");
    g.throughput(Throughput::Elements(1));
    g.sample_size(10);
    g.bench_function("pipelined_1_client", |b| {
        b.iter_custom(|iters| submit_all(&rt, &env, iters as usize, 1, true))
    });
    cancel_all(&env);
    g.bench_function("pipelined_8_clients", |b| {
        b.iter_custom(|iters| submit_all(&rt, &env, iters as usize, 8, true))
    });
    cancel_all(&env);
    g.bench_function("sbatch_process", |b| {
        b.iter(|| {
            let o = env
                .cmd(&["sbatch", "-H", "-o", "/dev/null", "--wrap", "true"])
                .output()
                .expect("sbatch");
            assert!(o.status.success());
        })
    });
    g.finish();
    cancel_all(&env);

    tiny_jobs(c, &rt, &env, "wrap_true");

    // The control plane alone: agents report scripts done without forking
    // them, so the figure is ctld's and the wire's, not this machine's
    // fork/exec rate.
    drop(env);
    let env = Env::start(Opts {
        nodes: 4,
        gpus: 8,
        no_exec: true,
        ..Opts::default()
    });
    tiny_jobs(c, &rt, &env, "no_exec");

    let mut g = c.benchmark_group("srun");
    g.sample_size(30);
    g.bench_function("N1_true", |b| {
        b.iter(|| {
            let o = env.cmd(&["srun", "-N1", "true"]).output().expect("srun");
            assert!(o.status.success());
        })
    });
    g.finish();
}

criterion_group!(cluster, benches);
criterion_main!(cluster);
