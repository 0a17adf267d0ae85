//! `corral-fleet`: corral-ctld under a fleet of simulated nodes.
//!
//! One corral-ctld (a real process, durable state, release build) and, in
//! this process, a fleet of simulated nodes (`corral_agent::fleet`): each
//! node its own certificate, QUIC connection, credential key, heartbeats
//! and 8 simulated GPUs; no job process is spawned. It measures, in order:
//!
//! 1. registration of every node on a fresh controller;
//! 2. heartbeat handling with nothing queued (ctld's CPU over a window,
//!    per heartbeat the fleet sent) and ctld's memory;
//! 3. submissions over the wire (`--clients` at once), every node filled
//!    by one exclusive job first so that the `--jobs` 1-CPU jobs stay
//!    pending;
//! 4. the scheduling pass over that deep queue (a pass forced by one more
//!    submission, `--probes` times), heartbeats again, memory;
//! 5. a controller killed (SIGKILL) and started again on its state: until
//!    every node registered again, and until it answers with every
//!    running job adopted;
//! 6. the filler jobs cancelled: until every pending job started (start
//!    decisions per second), then until the queue is empty.
//!
//! Run (from the workspace, after `cargo build --release -p corral-ctl
//! -p benches --bins`): `target/release/corral-fleet --nodes 1000 --jobs
//! 50000 [--json FILE]`. It prints a Markdown table.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral_agent::fleet::{job, Fleet, FleetConfig};
use corral_ctl::cli::up::{Cluster, ClusterSpec};
use corral_proto::msg::{Ident, JobFilter, JobSpec, Request, Response, Stats};

#[derive(Debug)]
struct Args {
    nodes: u32,
    jobs: u32,
    clients: usize,
    probes: usize,
    window: u64,
    heartbeat_timeout: u64,
    time_scale: f64,
    json: Option<PathBuf>,
}

fn usage() -> ! {
    eprintln!(
        "usage: corral-fleet [--nodes N] [--jobs N] [--clients N] [--probes N] [--window SECS] \
         [--heartbeat-timeout SECS] [--time-scale F] [--json FILE]"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut a = Args {
        nodes: 1000,
        jobs: 50_000,
        clients: 64,
        probes: 5,
        window: 15,
        heartbeat_timeout: 30,
        time_scale: 0.01,
        json: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let Some(v) = it.next() else { usage() };
        let bad = |what: &str| -> ! {
            eprintln!("corral-fleet: {flag}: not {what}: {v}");
            std::process::exit(2)
        };
        match flag.as_str() {
            "--nodes" => a.nodes = v.parse().unwrap_or_else(|_| bad("a count")),
            "--jobs" => a.jobs = v.parse().unwrap_or_else(|_| bad("a count")),
            "--clients" => a.clients = v.parse().unwrap_or_else(|_| bad("a count")),
            "--probes" => a.probes = v.parse().unwrap_or_else(|_| bad("a count")),
            "--window" => a.window = v.parse().unwrap_or_else(|_| bad("seconds")),
            "--heartbeat-timeout" => {
                a.heartbeat_timeout = v.parse().unwrap_or_else(|_| bad("seconds"))
            }
            "--time-scale" => a.time_scale = v.parse().unwrap_or_else(|_| bad("a number")),
            "--json" => a.json = Some(v.into()),
            _ => usage(),
        }
    }
    if a.nodes == 0 || a.clients == 0 {
        usage()
    }
    a
}

/// A process's CPU time (user and system) and resident memory, from /proc.
fn cpu_ms(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis: utime is the 12th,
    // stime the 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as u64;
    ticks * 1000 / hz
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// One measured figure: its name, value and unit.
struct Figure {
    name: String,
    value: f64,
    unit: &'static str,
}

struct Run {
    args: Args,
    fleet: Arc<Fleet>,
    cluster: Cluster,
    who: Ident,
    figures: Vec<Figure>,
}

impl Run {
    fn put(&mut self, name: &str, value: f64, unit: &'static str) {
        eprintln!("corral-fleet: {name}: {value:.3} {unit}");
        self.figures.push(Figure {
            name: name.into(),
            value,
            unit,
        });
    }

    fn ctld_pid(&self) -> u32 {
        self.cluster.ctld_pid().expect("corral-ctld runs")
    }

    async fn call(&self, node: usize, request: Request) -> Response {
        match self
            .fleet
            .request(node, self.who, request, Duration::from_secs(120))
            .await
        {
            Ok(Response::Error(e)) => panic!("ctld refused: {e}"),
            Ok(r) => r,
            Err(e) => panic!("request: {e}"),
        }
    }

    async fn stats(&self) -> Stats {
        match self.call(0, Request::Stats).await {
            Response::Stats(s) => s,
            other => panic!("stats: {other:?}"),
        }
    }

    /// Polls the controller's counters until `done` holds; returns the
    /// time it took.
    async fn until(&self, what: &str, limit: Duration, done: impl Fn(&Stats) -> bool) -> Duration {
        let t0 = Instant::now();
        loop {
            let s = self.stats().await;
            if done(&s) {
                return t0.elapsed();
            }
            assert!(
                t0.elapsed() < limit,
                "{what}: not within {limit:?}; last counts {s:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Submits `count` copies of `spec` with `clients` requests in flight,
    /// spread over the nodes as users on every node would.
    async fn submit(&self, spec: JobSpec, count: u32) -> Duration {
        let t0 = Instant::now();
        let next = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let mut tasks = Vec::new();
        for c in 0..self.args.clients {
            let (fleet, who, spec, next) =
                (self.fleet.clone(), self.who, spec.clone(), next.clone());
            let node = c % fleet.len();
            tasks.push(tokio::spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < count {
                    let r = fleet
                        .request(
                            node,
                            who,
                            Request::Submit(spec.clone()),
                            Duration::from_secs(60),
                        )
                        .await;
                    assert!(matches!(r, Ok(Response::Submitted { .. })), "submit: {r:?}");
                }
            }));
        }
        for t in tasks {
            t.await.expect("submitter");
        }
        t0.elapsed()
    }

    /// ctld's CPU per heartbeat over a window of the run's length.
    async fn heartbeat_window(&mut self, label: &str) {
        let pid = self.ctld_pid();
        let (c0, h0) = (
            cpu_ms(pid),
            self.fleet.counters.heartbeats.load(Ordering::Relaxed),
        );
        let t0 = Instant::now();
        tokio::time::sleep(Duration::from_secs(self.args.window)).await;
        let (c1, h1) = (
            cpu_ms(pid),
            self.fleet.counters.heartbeats.load(Ordering::Relaxed),
        );
        let secs = t0.elapsed().as_secs_f64();
        let beats = (h1 - h0).max(1) as f64;
        self.put(&format!("heartbeats/s ({label})"), beats / secs, "/s");
        self.put(
            &format!("ctld CPU ({label})"),
            (c1 - c0) as f64 / secs / 10.0,
            "% of a core",
        );
        self.put(
            &format!("ctld CPU per heartbeat ({label})"),
            (c1 - c0) as f64 * 1000.0 / beats,
            "µs",
        );
    }

    async fn idle_nodes(&self) -> usize {
        match self.call(0, Request::Nodes).await {
            Response::Nodes(n) => n.iter().filter(|n| !n.not_responding).count(),
            other => panic!("nodes: {other:?}"),
        }
    }

    async fn go(&mut self, t_fleet: Instant) {
        let n = self.args.nodes as usize;
        let jobs = self.args.jobs;
        // 1. Registration.
        let reg = wait_connected(&self.fleet, n, Duration::from_secs(300)).await;
        self.put(
            "register every node (fresh ctld)",
            t_fleet.elapsed().max(reg).as_secs_f64(),
            "s",
        );
        let t = Instant::now();
        while self.idle_nodes().await < n {
            assert!(
                t.elapsed() < Duration::from_secs(120),
                "nodes did not come up"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.put("ctld memory, idle", rss_mib(self.ctld_pid()), "MiB");
        // 2. Heartbeats, nothing queued.
        self.heartbeat_window("idle").await;
        // 3. Fill every node, then the deep queue.
        let work = self.cluster.spec.dir.to_string_lossy().into_owned();
        let t = self
            .submit(job("filler", &work, 7 * 86_400, true), n as u32)
            .await;
        self.put(
            "submit fillers (one exclusive job per node)",
            n as f64 / t.as_secs_f64(),
            "jobs/s",
        );
        self.until("fillers running", Duration::from_secs(300), |s| {
            s.running == n as u64
        })
        .await;
        let s0 = self.stats().await;
        let t = self.submit(job("tiny", &work, 600, false), jobs).await;
        self.put(
            &format!("submit {jobs} pending ({} in flight)", self.args.clients),
            f64::from(jobs) / t.as_secs_f64(),
            "jobs/s",
        );
        let s1 = self.stats().await;
        assert_eq!(s1.pending, u64::from(jobs), "every tiny job pending");
        self.put(
            "passes run while submitting",
            (s1.passes - s0.passes) as f64,
            "passes",
        );
        // 4. The pass over the deep queue, forced by one more job.
        let mut pass = Vec::new();
        for _ in 0..self.args.probes {
            let before = self.stats().await.passes;
            self.submit(job("probe", &work, 600, false), 1).await;
            let t = Instant::now();
            loop {
                let s = self.stats().await;
                if s.passes > before {
                    pass.push(s.last_pass_us as f64 / 1000.0);
                    break;
                }
                assert!(t.elapsed() < Duration::from_secs(60), "no pass");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        pass.sort_by(f64::total_cmp);
        let pending = jobs as usize + self.args.probes;
        self.put(
            &format!(
                "scheduling pass, {pending} pending (median of {})",
                pass.len()
            ),
            pass.get(pass.len() / 2).copied().unwrap_or(0.0),
            "ms",
        );
        self.put(
            "scheduling pass, max",
            pass.last().copied().unwrap_or(0.0),
            "ms",
        );
        let rss = rss_mib(self.ctld_pid());
        self.put(
            &format!("ctld memory, {pending} pending + {n} running"),
            rss,
            "MiB",
        );
        self.heartbeat_window("deep queue").await;
        // 5. A controller killed and started again on its state.
        let registrations = self.fleet.counters.registrations.load(Ordering::Relaxed);
        self.cluster.kill_ctld(nix::sys::signal::Signal::SIGKILL);
        let t = Instant::now();
        self.cluster.restart_ctld().expect("ctld starts again");
        let listening = t.elapsed();
        self.put(
            "restart: ctld listening again (state read)",
            listening.as_secs_f64(),
            "s",
        );
        let limit = Duration::from_secs(300);
        loop {
            let again = self.fleet.counters.registrations.load(Ordering::Relaxed) - registrations;
            if again >= n as u64 && self.fleet.connected() == n {
                break;
            }
            assert!(t.elapsed() < limit, "only {again} of {n} registered again");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.put(
            "restart: every node registered again",
            t.elapsed().as_secs_f64(),
            "s",
        );
        self.until("running adopted", limit, |s| s.running == n as u64)
            .await;
        self.put(
            "restart: every running job adopted",
            t.elapsed().as_secs_f64(),
            "s",
        );
        self.put("ctld memory after restart", rss_mib(self.ctld_pid()), "MiB");
        // 6. The fillers go: every pending job starts.
        let t = Instant::now();
        let cpu0 = cpu_ms(self.ctld_pid());
        let filter = JobFilter {
            names: vec!["filler".into()],
            ..JobFilter::default()
        };
        self.call(
            0,
            Request::Cancel {
                filter,
                signal: None,
            },
        )
        .await;
        let limit = Duration::from_secs(600);
        let started = self
            .until("every pending job started", limit, |s| s.pending == 0)
            .await;
        self.put(
            &format!("start {pending} jobs (fillers cancelled to all started)"),
            started.as_secs_f64(),
            "s",
        );
        self.put(
            "start decisions per second",
            pending as f64 / started.as_secs_f64(),
            "jobs/s",
        );
        self.until("queue empty", limit, |s| {
            s.pending == 0 && s.running == 0 && s.completing == 0
        })
        .await;
        self.put(
            &format!(
                "queue empty (jobs run {:.0} s each)",
                600.0 * self.args.time_scale
            ),
            t.elapsed().as_secs_f64(),
            "s",
        );
        self.put(
            "ctld CPU, fillers cancelled to queue empty",
            (cpu_ms(self.ctld_pid()) - cpu0) as f64 / 1000.0,
            "s",
        );
        self.put("ctld memory at the end", rss_mib(self.ctld_pid()), "MiB");
    }
}

async fn wait_connected(fleet: &Fleet, n: usize, limit: Duration) -> Duration {
    let t0 = Instant::now();
    while fleet.connected() < n {
        assert!(
            t0.elapsed() < limit,
            "{} of {n} nodes registered after {limit:?}",
            fleet.connected()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    t0.elapsed()
}

fn main() {
    let args = parse_args();
    let bin_dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .expect("the binary's directory");
    if !bin_dir.join("corral-ctld").exists() {
        eprintln!(
            "corral-fleet: no corral-ctld beside {}; build it: cargo build --release -p corral-ctl --bins",
            bin_dir.display()
        );
        std::process::exit(1);
    }
    let dir = std::env::temp_dir().join(format!("corral-fleet-{}", std::process::id()));
    let n = args.nodes;
    let spec = ClusterSpec {
        nodes: n,
        gpus_per_node: 8,
        gpu_model: Some("h200".into()),
        cpus_per_node: 64,
        mem_per_node: 1 << 20,
        heartbeat_timeout: args.heartbeat_timeout,
        kill_wait: 1,
        requeue_delay: 0,
        no_exec: true,
        agents: false,
        bin_dir,
        dir: dir.clone(),
        jail: None,
        jail_submounts: vec![],
        jail_dev: None,
        jail_docker_socket: None,
        jail_docker_group: None,
        cgroups: false,
        jail_driver_files: vec![],
        health_interval: 30,
        durable: true,
        nvml: false,
        extra_config: format!(
            "[limits]\nmax_job_count = {}\n",
            u64::from(args.jobs) * 2 + u64::from(n) + 1000
        ),
        agent_args: Vec::new(),
    };
    let t = Instant::now();
    let cluster = Cluster::start(spec).unwrap_or_else(|e| {
        eprintln!("corral-fleet: {e}");
        std::process::exit(1)
    });
    let certs = t.elapsed();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let figures = rt.block_on(async {
        let t_fleet = Instant::now();
        let fleet = Fleet::start(FleetConfig {
            ctld: cluster.addr,
            certs: dir.join("certs"),
            names: (0..n).map(Cluster::node_name).collect(),
            cpus: 64,
            memory_mb: 1 << 20,
            gpus: 8,
            gpu_model: "h200".into(),
            time_scale: args.time_scale,
            nodes_per_endpoint: 64,
        })
        .unwrap_or_else(|e| {
            eprintln!("corral-fleet: {}", corral_agent::agent::error_chain(&e));
            std::process::exit(1)
        });
        let loaded = t_fleet.elapsed();
        let who = Ident {
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
        };
        let mut run = Run {
            args,
            fleet: Arc::new(fleet),
            cluster,
            who,
            figures: Vec::new(),
        };
        run.put(
            "certificates and config for every node",
            certs.as_secs_f64(),
            "s",
        );
        run.put(
            "the fleet reads every node's certificate",
            loaded.as_secs_f64(),
            "s",
        );
        run.go(t_fleet).await;
        let cpu = cpu_ms(std::process::id());
        run.put("the fleet's own CPU, whole run", cpu as f64 / 1000.0, "s");
        run.cluster.stop();
        (run.args, run.figures)
    });
    if std::env::var_os("CORRAL_FLEET_KEEP").is_some() {
        eprintln!("corral-fleet: kept {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let (args, figures) = figures;
    println!(
        "| figure ({} nodes × 64 CPUs × 8 GPUs, {} jobs) | value |",
        args.nodes, args.jobs
    );
    println!("|---|---|");
    for f in &figures {
        println!("| {} | {:.3} {} |", f.name, f.value, f.unit);
    }
    if let Some(path) = &args.json {
        let v = serde_json::json!({
            "nodes": args.nodes,
            "jobs": args.jobs,
            "clients": args.clients,
            "heartbeat_timeout": args.heartbeat_timeout,
            "figures": figures.iter().map(|f| serde_json::json!({
                "name": f.name, "value": f.value, "unit": f.unit,
            })).collect::<Vec<_>>(),
        });
        if let Err(e) = std::fs::write(path, format!("{v:#}\n")) {
            eprintln!("corral-fleet: {}: {e}", path.display());
            std::process::exit(1);
        }
    }
}
