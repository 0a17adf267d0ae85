//! `corral-ctl`: the controller (`corral-ctld`) and the CLI (`corral`).
//!
//! - [`ctld`]: the controller: its state machine around `scheduler-core`,
//!   its QUIC service, scheduling loop and clock, and its configuration.
//! - [`cli`]: the Slurm commands, one file each.
//! - [`client`]: how a CLI reaches its local agent.

pub mod cli;
pub mod client;
pub mod ctld;
pub mod timefmt;
