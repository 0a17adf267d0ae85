//! `sacct` over 100,000 finished jobs in SQLite (the default accounting
//! database): 10,000 a day over ten days, each with a batch step and an
//! srun step. Measured is the database's part of a query, every page of
//! it, as corral-ctld runs it for sacct:
//!
//! - `default`: sacct with no options, as root: every job since midnight
//!   (a day's 10,000 and their 20,000 steps);
//! - `one_day`: `-S`/`-E` around a day five days back (also ~10,000);
//! - `one_user_X`: `-X -u` one user of 100 over the ten days (~1,000
//!   jobs, no steps).
//!
//! | bench              | budget   |
//! |--------------------|----------|
//! | sacct/default      | ≤ 500 ms |
//! | sacct/one_day      | ≤ 500 ms |
//! | sacct/one_user_X   | ≤ 100 ms |
//!
//! Run: `cargo bench -p benches --bench sacct`.

use std::time::Duration;

use corral_ctl::ctld::acctdb::AcctDb;
use corral_proto::msg::{
    AcctJob, AcctQuery, AcctStep, ExitStatus, Ident, JobId, JobReason, JobState, JobUsage, StepId,
};
use criterion::{criterion_group, criterion_main, Criterion};

const JOBS: u64 = 100_000;
const DAY: u64 = 86_400;
/// Midnight of the last day: "today".
const TODAY: u64 = 1_796_000_000 / DAY * DAY;

fn record(i: u64) -> AcctJob {
    // Ten days, the last of them today.
    let end = TODAY - 9 * DAY + i * (10 * DAY) / JOBS + 60;
    let step = |step, name: &str, start| AcctStep {
        step,
        name: name.into(),
        nodelist: "worker-[0-1]".into(),
        nodes: 2,
        tasks: 8,
        cpus: 16,
        start,
        end: Some(end),
        state: JobState::Completed,
        exit: ExitStatus::default(),
    };
    AcctJob {
        id: JobId(i + 1),
        array: None,
        run: 0,
        name: format!("train-{}", i % 97),
        user: Ident {
            uid: 1000 + (i % 100) as u32,
            gid: 100,
        },
        account: "ml".into(),
        partition: "gpu".into(),
        nodelist: "worker-[0-1]".into(),
        alloc_nodes: 2,
        alloc_cpus: 16,
        alloc_mem_mb: 64_000,
        alloc_gpus: 8,
        req_nodes: 2,
        req_cpus: 16,
        req_mem_mb: 64_000,
        req_gpus: 8,
        submit: end - 600,
        eligible: end - 600,
        start: Some(end - 500),
        end: Some(end),
        time_limit: Some(3600),
        state: JobState::Completed,
        reason: JobReason::None,
        exit: ExitStatus::default(),
        cancelled_by: None,
        usage: Some(JobUsage {
            cpu_ms: 8_000_000,
            max_rss_kb: 1 << 20,
        }),
        work_dir: "/home/ml/project".into(),
        comment: String::new(),
        wckey: String::new(),
        steps: vec![
            step(StepId::BATCH, "batch", end - 500),
            step(StepId(0), "python", end - 490),
        ],
    }
}

async fn all_pages(db: &AcctDb, mut q: AcctQuery, users: &[u32]) -> usize {
    let mut n = 0;
    loop {
        let (page, next) = db.query(&q, users).await.expect("query");
        n += page.len();
        match next {
            Some(after) => q.after = after,
            None => return n,
        }
    }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tmp");
    let url = format!("sqlite://{}", dir.path().join("acct.sqlite").display());
    let db = rt.block_on(async {
        let db = AcctDb::connect(&url, "bench", Duration::from_secs(10))
            .await
            .expect("connect");
        let all: Vec<AcctJob> = (0..JOBS).map(record).collect();
        for chunk in all.chunks(1000) {
            db.write(chunk).await.expect("write");
        }
        db
    });
    let default = AcctQuery {
        start: Some(TODAY),
        ..AcctQuery::default()
    };
    let one_day = AcctQuery {
        start: Some(TODAY - 5 * DAY),
        end: Some(TODAY - 4 * DAY),
        ..AcctQuery::default()
    };
    let one_user = AcctQuery {
        allocations: true,
        ..AcctQuery::default()
    };
    // What each selects, once, so the figures have a size beside them.
    for (name, q, users) in [
        ("default", &default, &[][..]),
        ("one_day", &one_day, &[]),
        ("one_user_X", &one_user, &[1042]),
    ] {
        let n = rt.block_on(all_pages(&db, q.clone(), users));
        println!("sacct/{name}: {n} jobs");
    }
    let mut g = c.benchmark_group("sacct");
    g.sample_size(10);
    g.bench_function("default", |b| {
        b.iter(|| rt.block_on(all_pages(&db, default.clone(), &[])))
    });
    g.bench_function("one_day", |b| {
        b.iter(|| rt.block_on(all_pages(&db, one_day.clone(), &[])))
    });
    g.bench_function("one_user_X", |b| {
        b.iter(|| rt.block_on(all_pages(&db, one_user.clone(), &[1042])))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
