//! What `squeue` costs its own process with 10,000 jobs pending: the
//! listing's frames read and decoded, every job's line rendered in
//! Slurm's default layout, the lines sorted and written out. The frames
//! are those ctld sends for 10,000 held batch jobs (compact bare views,
//! `encode_listed`, in parts of 500), read from memory, so the figure
//! leaves out the process start and the controller's side; the output
//! goes to `io::sink`.
//!
//! `compare.sh` measures the whole command (about 10 ms with 10,000
//! pending, 3 Dec 2026); this is the part of it that runs in squeue's own
//! process after the connection, most of its CPU time.
//!
//! | bench              | budget   | measured (3 Dec 2026, this machine) |
//! |--------------------|----------|------------------------------------|
//! | squeue/default_10k | ≤ 6 ms   | 5.11–5.92 ms (whole views: 6.56–7.01) |
//! | squeue/wc_10k      | ≤ 6 ms   | 4.20–4.69 ms (whole views: 4.42–6.03) |
//!
//! On 4 Dec 2026, another machine of the same kind, the same code:
//! 3.48–3.58 ms and 3.56–3.73 ms (`--warm-up-time 1 --measurement-time 3`).
//!
//! `default_10k` is `squeue`, `wc_10k` is `squeue -h` (what
//! `squeue -h | wc -l` runs). The figures in brackets are this bench at
//! the code before bare listings were sent compact (`11e19c6`, every view
//! whole), the two binaries alternated three times:
//! `--warm-up-time 1 --measurement-time 4`. Before that, views decoded
//! into a list rather than borrowed (`35caa11`) measured 6.34–6.93 and
//! 6.40–6.97 ms against 5.74–5.79 and 4.00–4.29 for borrowed whole views.
//!
//! Run: `cargo bench -p benches --bench squeue`.

use corral_ctl::cli::squeue::{Layout, SqueueArgs};
use corral_proto::msg::{
    encode_listed, listing_frame, BareView, ExitStatus, Ident, JobId, JobReason, JobState, JobView,
};
use criterion::{criterion_group, criterion_main, Criterion};

const JOBS: u64 = 10_000;
/// Views per part, as ctld sends them.
const PER_PART: u64 = 500;
const NOW: u64 = 1_796_000_000;

/// A held batch job's view as ctld makes it for squeue's default layout.
fn view(id: u64) -> JobView<&'static str> {
    BareView {
        id: JobId(id),
        name: "wrap",
        user: Ident { uid: 0, gid: 0 },
        partition: "gpu",
        state: JobState::Pending,
        reason: JobReason::JobHeldUser,
        priority: 0,
        submit_time: NOW - 60 + id / 200,
        start_time: None,
        end_time: None,
        expected_start: None,
        time_limit: None,
        nodes: Vec::new(),
        num_nodes: 1,
        exit: ExitStatus::default(),
        restarts: 0,
        usage: None,
        suspension: None,
    }
    .into_view()
}

/// The listing's frames, back to back, as the agent relays them.
fn listing() -> Vec<u8> {
    let mut out = Vec::new();
    let mut body = Vec::new();
    for first in (1..=JOBS).step_by(PER_PART as usize) {
        body.clear();
        let last = (first + PER_PART - 1).min(JOBS);
        for id in first..=last {
            encode_listed(&view(id), &mut body).expect("encode");
        }
        let count = (last - first + 1) as usize;
        let frame = listing_frame(last == JOBS, true, count, &body).expect("frame");
        out.extend_from_slice(&frame);
    }
    out
}

/// One squeue's work after the connection: read, render, write.
async fn squeue(bytes: &[u8], layout: &Layout) -> usize {
    let mut table = layout.table(false, NOW);
    let mut lines = 0;
    let mut r = bytes;
    corral_ctl::client::read_job_views(&mut r, |j| {
        lines += 1;
        table.add_view(j, |_| true);
    })
    .await
    .expect("listing");
    table.write_to(&mut std::io::sink()).expect("write");
    lines
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let bytes = listing();
    let mut g = c.benchmark_group("squeue");
    for (name, args) in [
        ("default_10k", &["squeue"][..]),
        ("wc_10k", &["squeue", "-h"]),
    ] {
        let layout = Layout::of(&<SqueueArgs as clap::Parser>::parse_from(args)).expect("layout");
        assert_eq!(rt.block_on(squeue(&bytes, &layout)), JOBS as usize);
        g.bench_function(name, |b| b.iter(|| rt.block_on(squeue(&bytes, &layout))));
    }
    g.finish();
}

criterion_group!(squeue_benches, benches);
criterion_main!(squeue_benches);
