//! Corral's trace replay (`corral-sim`) and the workloads its criterion
//! benches use. Reads traces, drives the real scheduler in virtual time,
//! reports and charts what happened. The scheduler itself lives in
//! `scheduler-core`; nothing here changes a decision.

pub mod chart;
pub mod cli;
pub mod replay;
pub mod synthetic;
pub mod trace;
