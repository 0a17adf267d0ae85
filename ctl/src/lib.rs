//! `corral-ctl`: the controller (`corral-ctld`) and the CLI (`corral`).
//!
//! - [`state`]: the controller's state machine around `scheduler-core`.
//! - [`server`]: its QUIC service, scheduling loop and clock.
//! - [`cli`]: the Slurm commands, one file each.
//! - [`client`]: how a CLI reaches its local agent.

pub mod cli;
pub mod client;
pub mod config;
pub mod server;
pub mod state;
pub mod timefmt;
