//! A fleet of simulated nodes (`corral_agent::fleet`) against a real
//! corral-ctld: every node registers with its own certificate, jobs run
//! their scaled-down limits and end (alone on a node, in one `BatchDone`),
//! and a controller killed under them gets every node back with its
//! running jobs adopted.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use corral_agent::fleet::{Fleet, FleetConfig};
use corral_ctl::cli::up::{Cluster, ClusterSpec};
use corral_e2e::bin_dir;
use corral_proto::msg::{Ident, JobFilter, JobState, Request, Response, Stats};

const NODES: u32 = 40;

fn job(name: &str, limit: u64, exclusive: bool) -> corral_proto::msg::JobSpec {
    corral_agent::fleet::job(name, "/tmp", limit, exclusive)
}

struct Bench {
    fleet: Fleet,
    who: Ident,
}

impl Bench {
    async fn call(&self, node: usize, request: Request) -> Response {
        self.fleet
            // A node may need QUIC's idle timeout (30 s) to notice a
            // restarted controller, then a moment to register.
            .request(node, self.who, request, Duration::from_secs(60))
            .await
            .expect("an answer")
    }

    async fn stats(&self) -> Stats {
        match self.call(0, Request::Stats).await {
            Response::Stats(s) => s,
            other => panic!("stats: {other:?}"),
        }
    }

    async fn states(&self, name: &str) -> Vec<JobState> {
        let filter = JobFilter {
            names: vec![name.into()],
            ..JobFilter::default()
        };
        match self.call(0, Request::Jobs(filter)).await {
            Response::Jobs(v) => v.iter().map(|j| j.state).collect(),
            other => panic!("jobs: {other:?}"),
        }
    }

    async fn until(&self, what: &str, secs: u64, f: impl Fn(&Stats, &Fleet) -> bool) {
        let t0 = Instant::now();
        loop {
            let s = self.stats().await;
            if f(&s, &self.fleet) {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(secs),
                "{what}: not within {secs} s: {s:?}, fleet {:?}",
                self.fleet
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[test]
fn a_fleet_runs_jobs_and_comes_back_after_a_controller_restart() {
    let tmp = tempfile::Builder::new()
        .prefix("corral-fleet-")
        .tempdir()
        .expect("temp dir");
    let mut cluster = Cluster::start(ClusterSpec {
        nodes: NODES,
        gpus_per_node: 8,
        gpu_model: None,
        cpus_per_node: 4,
        mem_per_node: 16_000,
        heartbeat_timeout: 30,
        kill_wait: 1,
        requeue_delay: 0,
        no_exec: true,
        agents: false,
        bin_dir: bin_dir().to_path_buf(),
        dir: tmp.path().join("cluster"),
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
        extra_config: String::new(),
        agent_args: Vec::new(),
    })
    .expect("controller starts");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let fleet = Fleet::start(FleetConfig {
            ctld: cluster.addr,
            certs: cluster.spec.dir.join("certs"),
            names: (0..NODES).map(Cluster::node_name).collect(),
            cpus: 4,
            memory_mb: 16_000,
            gpus: 8,
            gpu_model: String::new(),
            // A 60 s limit runs 1.2 s; a day's, half an hour.
            time_scale: 0.02,
            nodes_per_endpoint: 16,
        })
        .expect("fleet starts");
        let b = Bench {
            fleet,
            who: Ident {
                uid: nix::unistd::getuid().as_raw(),
                gid: nix::unistd::getgid().as_raw(),
            },
        };
        b.until("every node registered", 60, |_, f| {
            f.connected() == NODES as usize
        })
        .await;
        // Half the nodes held by long exclusive jobs, the other half's
        // CPUs running short ones, four at a time per node.
        for _ in 0..NODES / 2 {
            let r = b.call(0, Request::Submit(job("long", 86_400, true))).await;
            assert!(matches!(r, Response::Submitted { .. }), "{r:?}");
        }
        for i in 0..200 {
            let r = b
                .call(i % NODES as usize, Request::Submit(job("short", 60, false)))
                .await;
            assert!(matches!(r, Response::Submitted { .. }), "{r:?}");
        }
        b.until("long jobs running", 30, |s, f| {
            s.running >= u64::from(NODES / 2) && f.runs() >= NODES as usize / 2
        })
        .await;

        // The controller dies with jobs running and pending.
        let before = b.fleet.registrations_by_node();
        cluster.kill_ctld(nix::sys::signal::Signal::SIGKILL);
        cluster.restart_ctld().expect("controller starts again");
        // Every node on a new connection. (Counting registrations over
        // the fleet passed once while node 0 still held its connection to
        // the dead controller, whose probes had backed off while it was
        // down: such a node notices within QUIC's idle timeout, 30 s.)
        b.until("every node registered again", 90, |_, f| {
            f.connected() == NODES as usize
                && f.registrations_by_node()
                    .iter()
                    .zip(&before)
                    .all(|(now, then)| now > then)
        })
        .await;
        // The long jobs were adopted where they ran; nothing was lost.
        b.until("long jobs adopted", 30, |s, _| {
            s.running >= u64::from(NODES / 2)
        })
        .await;
        let long = b.states("long").await;
        assert_eq!(long.len(), NODES as usize / 2);
        assert!(long.iter().all(|s| *s == JobState::Running), "{long:?}");
        // The short ones all ran to the end, across the restart.
        let t0 = Instant::now();
        loop {
            let short = b.states("short").await;
            assert_eq!(short.len(), 200, "every short job known");
            if short.iter().all(|s| *s == JobState::Completed) {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(90),
                "short jobs not all completed: {short:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Each alone on its node, every short job ended there in one
        // message, kept by its node (those that ended while the controller
        // was down were heard again from there); none needed a terminate.
        let done = b.fleet.counters.done.load(Ordering::Relaxed);
        assert!(done >= 200, "{done} BatchDone sent");
        assert_eq!(b.fleet.counters.exits.load(Ordering::Relaxed), 0);
        assert_eq!(b.fleet.ended(), 200, "one ended run kept per short job");
        // Cancelled, the long jobs leave nothing on the nodes.
        let filter = JobFilter {
            names: vec!["long".into()],
            ..JobFilter::default()
        };
        let r = b
            .call(
                0,
                Request::Cancel {
                    filter,
                    signal: None,
                },
            )
            .await;
        assert!(
            matches!(r, Response::Affected { ref jobs } if jobs.len() == NODES as usize / 2),
            "{r:?}"
        );
        b.until("queue empty", 30, |s, f| {
            s.pending == 0 && s.running == 0 && s.completing == 0 && f.runs() == 0
        })
        .await;
        let long = b.states("long").await;
        assert!(long.iter().all(|s| *s == JobState::Cancelled), "{long:?}");
    });
    cluster.stop();
}
