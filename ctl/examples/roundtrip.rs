//! Round trips through the local agent to ctld as one-shot commands make
//! them, without the process start: a ping (ctld answers at once) or a
//! held submission (one durable commit), `N` times, each after `PAUSE_MS`
//! of idleness, over one connection or (`new`) a new one each time.
//! Prints the median and the 90th percentile in microseconds.
//!
//! ```text
//! eval "$(corral up ... | grep '^export')"   # or any CORRAL_AGENT_SOCKET
//! cargo run --release -p corral-ctl --example roundtrip -- ping 200 0
//! cargo run --release -p corral-ctl --example roundtrip -- ping 200 5 new
//! cargo run --release -p corral-ctl --example roundtrip -- submit 300 0
//! ```
//!
//! Held submissions stay in the queue: `scancel -u $USER` after.

use std::time::{Duration, Instant};

use corral_ctl::client::Client;
use corral_proto::msg::{JobKind, JobSpec, Request, Response};

fn held_job() -> JobSpec {
    JobSpec {
        name: "roundtrip".into(),
        work_dir: "/tmp".into(),
        hold: true,
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        kind: JobKind::Batch {
            script: b"#!/bin/sh\ntrue\n".to_vec(),
            args: vec![],
            stdout: Some("/dev/null".into()),
            stderr: None,
        },
        ..JobSpec::default()
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: roundtrip ping|submit [N] [PAUSE_MS] [new]";
    let submit = match args.first().map(String::as_str) {
        Some("ping") => false,
        Some("submit") => true,
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    let number = |i: usize, default: u64| match args.get(i) {
        None => default,
        Some(s) => s.parse().unwrap_or_else(|_| {
            eprintln!("roundtrip: not a number: {s}\n{usage}");
            std::process::exit(2);
        }),
    };
    let n = number(1, 200).clamp(1, 100_000) as usize;
    let pause = Duration::from_millis(number(2, 0).min(10_000));
    let fresh = args.get(3).is_some_and(|a| a == "new");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let mut took = rt.block_on(async {
        let mut client = None;
        let mut took = Vec::with_capacity(n);
        for _ in 0..n {
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
            let req = if submit {
                Request::Submit(held_job())
            } else {
                Request::Ping
            };
            let t0 = Instant::now();
            if fresh || client.is_none() {
                client = Some(Client::connect().await.unwrap_or_else(|e| {
                    eprintln!("roundtrip: {e}");
                    std::process::exit(1);
                }));
            }
            let c = client.as_mut().expect("connected above");
            match c.call(req).await {
                Ok(Response::Done | Response::Submitted { .. }) => {}
                other => {
                    eprintln!("roundtrip: unexpected answer {other:?}");
                    std::process::exit(1);
                }
            }
            took.push(t0.elapsed());
        }
        took
    });
    took.sort_unstable();
    let at = |p: usize| took[(took.len() - 1) * p / 100].as_micros();
    println!(
        "{} x{n}, {} ms idle before each, {}: p50 {} us, p90 {} us",
        if submit { "held submit" } else { "ping" },
        pause.as_millis(),
        if fresh {
            "a new connection each"
        } else {
            "one connection"
        },
        at(50),
        at(90)
    );
}
