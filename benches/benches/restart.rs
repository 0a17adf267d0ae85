//! How long corral-ctld takes to read its state back: a store holding
//! 100,000 pending jobs (a one-line script each) on 64 nodes, opened and
//! loaded, the controller rebuilt from it (`Store::load` +
//! `Controller::restore`), and its 64 nodes registering again (which ends
//! the recovery and queues the jobs again in the scheduler).
//!
//! | bench                        | budget  |
//! |------------------------------|---------|
//! | restart/100k_pending         | ≤ 2 s   |
//!
//! Run: `cargo bench -p benches --bench restart`.

use corral_ctl::ctld::config::Config;
use corral_ctl::ctld::store::Store;
use corral_ctl::ctld::Controller;
use corral_proto::msg::{Ident, JobKind, JobSpec};
use criterion::{criterion_group, criterion_main, Criterion};

mod common;

const JOBS: usize = 100_000;
const NODES: usize = 64;

fn config(state: &std::path::Path) -> Config {
    let text = format!(
        "operators = [1000]\nstate_dir = \"{}\"\n[limits]\nmax_jobs_per_user = 1000000\n\
         [[partition]]\nname = \"gpu\"\nnodes = \"worker-[0-63]\"\ndefault = true\n",
        state.display()
    );
    Config::parse(std::path::Path::new("bench.toml"), &text).expect("config")
}

fn benches(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("dir");
    let state = dir.path().join("state");
    let store = Store::open(&state).expect("store");
    let mut ctl = Controller::new(config(&state)).expect("controller");
    common::register_nodes(&mut ctl, NODES, 1_000);
    let who = Ident {
        uid: 1000,
        gid: 1000,
    };
    // Written in batches, as group commits would.
    for chunk in 0..(JOBS / 1000) {
        for _ in 0..1000 {
            let spec = JobSpec {
                name: "train".into(),
                hold: true,
                work_dir: "/home/ada".into(),
                env: vec![("PATH".into(), "/usr/bin:/bin".into())],
                kind: JobKind::Batch {
                    script: "#!/bin/sh\nsrun python train.py\n".into(),
                    args: vec![],
                    stdout: None,
                    stderr: None,
                },
                ..JobSpec::default()
            };
            ctl.submit(who, spec, 1_000 + chunk as u64).expect("submit");
        }
        store.commit(&[ctl.take_changes()]).expect("commit");
    }
    drop(store);
    let mut g = c.benchmark_group("restart");
    g.sample_size(10);
    g.bench_function("100k_pending", |b| {
        b.iter(|| {
            let store = Store::open(&state).expect("store");
            let loaded = store.load().expect("load");
            assert_eq!(loaded.jobs.len(), JOBS);
            let mut ctl = Controller::new(config(&state)).expect("controller");
            ctl.restore(loaded, 2_000).expect("restore");
            common::register_nodes(&mut ctl, NODES, 2_000);
            assert_eq!(ctl.stats().pending, JOBS as u64);
            ctl
        })
    });
    g.finish();
}

criterion_group!(restart, benches);
criterion_main!(restart);
