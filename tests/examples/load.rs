//! Drives a local cluster with tiny jobs and prints the controller's
//! counters as they drain: `cargo run --release -p corral-e2e --example
//! load -- JOBS`.

use std::time::{Duration, Instant};

use corral_ctl::client::{pipeline_to, Client};
use corral_e2e::{tiny_job, Env, Opts};
use corral_proto::msg::{Request, Response};

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    // `load N noexec`: agents skip running the scripts (control plane).
    let no_exec = std::env::args().nth(2).is_some_and(|a| a == "noexec");
    let env = Env::start(Opts {
        nodes: 4,
        gpus: 8,
        no_exec,
        ..Opts::default()
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("rt");
    // `load N hold`: submissions only (held jobs never run).
    let hold = std::env::args().nth(2).is_some_and(|a| a == "hold");
    let spec = tiny_job(&env.work, hold);
    let sock = env.cluster.socket(0);
    let t0 = Instant::now();
    let reqs = (0..n).map(|_| Request::Submit(spec.clone())).collect();
    rt.block_on(pipeline_to(&sock, reqs)).expect("submit");
    println!(
        "submitted {n} in {:?}: {:.0}/s",
        t0.elapsed(),
        n as f64 / t0.elapsed().as_secs_f64()
    );
    if hold {
        return;
    }
    loop {
        let s = rt.block_on(async {
            let mut c = Client::connect_to(&sock).await.expect("agent");
            match c.ok(Request::Stats).await {
                Ok(Response::Stats(s)) => s,
                other => panic!("{other:?}"),
            }
        });
        println!("{:>6} ms  {s:?}", t0.elapsed().as_millis());
        if s.pending + s.running + s.completing == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    println!(
        "{n} jobs in {:?}: {:.0} jobs/s",
        t0.elapsed(),
        n as f64 / t0.elapsed().as_secs_f64()
    );
}
