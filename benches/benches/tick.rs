//! What corral-ctld's clock tick (twice a second, holding the
//! controller) costs with a deep queue: 64 nodes, 50,000 jobs pending
//! (held, so no pass starts them), 1,000 more that ended within the last
//! `min_job_age`. The tick times nodes out, times jobs out and forgets
//! jobs that ended long enough ago; none of that should cost what the
//! queue holds.
//!
//! | bench                   | budget   | measured (3 Dec 2026, this machine) |
//! |-------------------------|----------|------------------------------------|
//! | tick/50k_pending        | ≤ 50 µs  | 0.89–0.92 µs                       |
//!
//! Before, the tick walked every job three times: the controller's
//! records for those ended long enough ago, and the scheduling core's
//! for the earliest begin time and for running jobs past their limits.
//! `048e9b4` took 3.7–6.4 ms a tick here (the VM's speed varies by
//! twice within the hour), with only the first walk gone 0.8–2.7 ms.
//! Now the controller files each ended job by its end as its record is
//! taken to be stored, the core files begin times (`delayed`) and asks
//! the nodes for their running jobs, and the tick costs what is due.
//!
//! Run: `cargo bench -p benches --bench tick`.

use corral_ctl::ctld::config::Config;
use corral_ctl::ctld::Controller;
use corral_proto::msg::{Ident, JobFilter, JobKind, JobSpec};
use criterion::{criterion_group, criterion_main, Criterion};

mod common;

const PENDING: usize = 50_000;
const ENDED: usize = 1_000;
const NODES: usize = 64;

fn config() -> Config {
    let text = "operators = [1000]\n[limits]\nmax_jobs_per_user = 1000000\n\
         [[partition]]\nname = \"gpu\"\nnodes = \"worker-[0-63]\"\ndefault = true\n";
    Config::parse(std::path::Path::new("bench.toml"), text).expect("config")
}

fn spec(hold: bool) -> JobSpec {
    JobSpec {
        name: "train".into(),
        hold,
        work_dir: "/home/ada".into(),
        kind: JobKind::Batch {
            script: "#!/bin/sh\ntrue\n".into(),
            args: vec![],
            stdout: None,
            stderr: None,
        },
        ..JobSpec::default()
    }
}

fn benches(c: &mut Criterion) {
    let mut ctl = Controller::new(config()).expect("controller");
    common::register_nodes(&mut ctl, NODES, 1_000);
    let who = Ident {
        uid: 1000,
        gid: 1000,
    };
    let ended: Vec<_> = (0..ENDED)
        .map(|_| ctl.submit(who, spec(true), 1_000).expect("submit"))
        .collect();
    let ended = JobFilter {
        ids: ended,
        ..JobFilter::default()
    };
    ctl.cancel(who, &ended, None, 1_001).expect("cancel");
    for _ in 0..PENDING {
        ctl.submit(who, spec(true), 1_002).expect("submit");
    }
    ctl.take_changes();
    let mut now = 1_010;
    ctl.tick(now);
    let mut g = c.benchmark_group("tick");
    g.bench_function("50k_pending", |b| {
        b.iter(|| {
            // Within min_job_age of the cancels: nothing is forgotten,
            // every tick does the same work.
            now += 1;
            ctl.tick(now % 200 + 1_010);
        })
    });
    g.finish();
}

criterion_group!(tick, benches);
criterion_main!(tick);
