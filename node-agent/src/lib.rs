//! `corral-agent`: one per node. Registers the node with ctld (CPUs and
//! memory from procfs, GPUs from a [`gpu::GpuBackend`]), runs the tasks
//! ctld assigns through one [`launch::Launcher`] seam, streams step state
//! back, and serves the CLIs of its node as their credential service and
//! relay to ctld ([`local`]).
//!
//! - [`agent`]: the control session with ctld and what its messages do.
//! - [`procs`]: the process table, a state machine of runs, steps and
//!   process groups (no I/O; the agent signals what it returns).
//! - [`batch`]: a batch script's life on the node; [`step`]: an
//!   interactive step, dialling srun back.
//! - [`task`]: what a task sees (Slurm's environment, output names).
//! - [`launch`]: the privileged seam that starts a task as its user; the
//!   jail will live behind it.
//! - [`spool`]: the directories a root daemon keeps files in.
//! - [`cgroup`]: a cgroup per job and step (CPUs, memory, pids, GPU
//!   devices), killing what they hold, reading what they used.
//!
//! The agent never imports the controller or the scheduler: it runs what
//! ctld says.

pub mod agent;
pub mod batch;
pub mod budget;
pub mod cgroup;
pub mod fleet;
pub mod gpu;
pub mod health;
pub mod jail;
pub mod launch;
pub mod local;
pub mod nvml;
pub mod pidns;
pub mod procs;
pub mod resources;
pub mod spawn;
pub mod spool;
pub mod step;
pub mod task;

pub use agent::{Agent, AgentConfig, AgentError, StepError};

/// The kernel as `uname -srv` names it, from `/proc/sys/kernel` (what
/// `scontrol show node` shows as `OS=`); empty where that cannot be read.
pub fn os_name() -> String {
    let read = |f: &str| {
        std::fs::read_to_string(format!("/proc/sys/kernel/{f}"))
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let parts = [read("ostype"), read("osrelease"), read("version")];
    let said: Vec<&str> = parts
        .iter()
        .map(String::as_str)
        .filter(|s| !s.is_empty())
        .collect();
    said.join(" ")
}

#[cfg(test)]
mod os_tests {
    #[test]
    fn the_os_is_the_kernels_own_words() {
        let os = super::os_name();
        assert!(os.starts_with("Linux "), "{os}");
        assert!(os.contains(
            std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap()
                .trim()
        ));
    }
}
