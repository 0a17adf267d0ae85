//! `scheduler-core`: Corral's scheduling, as a library with no I/O, no
//! async runtime, no clock and no randomness.
//!
//! It takes events (nodes registering and changing state, jobs submitted,
//! cancelled, held, finished) and answers with decisions (start this job
//! now on these nodes, with these exact CPUs and GPUs) and, for every job
//! still pending, a reason in Slurm's words and the start its reservation
//! promises. The same calls in the same order give the same decisions, so
//! it can be embedded in any driver, replayed from a trace, property-tested
//! and benchmarked alone.
//!
//! # Order of calls
//!
//! ```
//! use scheduler_core::*;
//!
//! let mut s = Scheduler::new(SchedulerConfig::default());
//! // 1. Partitions (from configuration).
//! let mut gpu = PartitionSpec::new("gpu", "node-[0-1]");
//! gpu.is_default = true;
//! s.add_partition(gpu).unwrap();
//! // 2. Nodes, as they register.
//! for i in 0..2 {
//!     s.handle_node_added(NodeSpec::new(format!("node-{i}"), 64, 512_000).with_gpus(8, 4))
//!         .unwrap();
//! }
//! // 3. Jobs, as users submit them.
//! let mut req = JobRequest::new(UserId(1000));
//! req.gpus = GpuRequest::PerNode(2);
//! req.time_limit = Some(3600);
//! s.submit(0, JobId(1), req).unwrap();
//! // 4. A pass: decisions to carry out.
//! let starts = s.schedule(0);
//! assert_eq!(starts[0].nodes[0].gpus.len(), 2);
//! // 5. Report the end; the next pass sees the GPUs free again.
//! s.handle_job_finished(600, JobId(1), JobOutcome::Completed).unwrap();
//! ```
//!
//! # Names
//!
//! Events that happened outside are `handle_*` (`handle_node_added`,
//! `handle_job_finished`); what a user or operator asks for is a plain verb
//! (`submit`, `cancel`, `hold`, `release`, `add_partition`); `schedule` runs
//! a pass; queries are nouns (`job_status`, `node_info`, `reservation`).
//!
//! # Where things live
//!
//! The [`Scheduler`] is one type whose `impl` is split by concern:
//! `scheduler/mod.rs` (the state, control and status), `nodes.rs`
//! (partitions and the node registry), `admission.rs` (a request becomes an
//! admitted job or a [`SubmitError`]), `ranking.rs` (who goes first, and
//! why a job waits), `pass.rs` (the pass: classes, keeping the previous
//! plan, committing), `search.rs` (one job's earliest start) and
//! `audit.rs`. With the `testing` feature, `testing` holds the operation
//! vocabulary, driver and invariant checks that the property tests, the
//! fuzz target and the scenario harness share.
//!
//! # Policy
//!
//! - Priority: multifactor (age, size, partition tier, QOS, fair-share with
//!   decayed usage, nice); see [`PriorityWeights`].
//! - Backfill: [`BackfillPolicy::Conservative`] gives every waiting job a
//!   reservation on a per-node availability profile that holds CPUs, memory
//!   and individual GPUs; a job starts early only where it delays none.
//!   Every pass looks at the whole queue.
//! - Placement: filter, then score ([`Packing`]): best fit on GPUs keeps
//!   whole nodes and whole topology groups free.
//! - Gang: a multi-node job starts on all its nodes at once or not at all.

mod error;
mod fetch;
mod hash;
mod model;
mod placement;
mod priority;
mod quad_heap;
mod scheduler;
#[cfg(feature = "testing")]
pub mod testing;
mod timeline;

/// Hostlist expressions, from the `corral-hostlist` leaf crate.
pub use corral_hostlist as hostlist;
pub use error::{ControlError, SubmitError, UpdateError};
pub use fetch::{prefetch, prefetch_bytes};
pub use model::*;
pub use placement::Packing;
pub use priority::PriorityWeights;
pub use scheduler::{
    AdoptError, BackfillPolicy, Cancelled, DefaultMemory, Scheduler, SchedulerConfig, ShareUsage,
    Statuses,
};
