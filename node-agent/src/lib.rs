//! `corral-agent`: one per node. Registers the node with ctld (CPUs and
//! memory from procfs, GPUs from a [`gpu::GpuBackend`]), runs the tasks
//! ctld assigns through one [`launch::Launcher`] seam, streams step state
//! back, and serves the CLIs of its node as their credential service and
//! relay to ctld ([`local`]).

pub mod agent;
pub mod gpu;
pub mod launch;
pub mod local;
pub mod resources;
pub mod step;

pub use agent::{Agent, AgentConfig, AgentError};
