//! How the agent uses the shared-root jail: one plan per task, built from
//! the node's jail configuration and the task's GPUs. Inside, the
//! cluster's commands are at `/run/corral/bin`, the agent's socket at
//! `/run/corral/agent.sock` and the spool (batch scripts) at
//! `/run/corral/spool`.

use std::path::{Path, PathBuf};

use shared_root::{Extra, Plan, Submount};

/// The cluster's commands inside a jail.
pub const BIN: &str = "/run/corral/bin";
/// The agent's socket inside a jail.
pub const SOCKET: &str = "/run/corral/agent.sock";
/// The spool inside a jail.
pub const SPOOL: &str = "/run/corral/spool";
/// The node's Docker socket inside an exclusive job's jail.
pub const DOCKER: &str = "/run/corral/docker.sock";

/// A node's jail: the shared root and what every task gets in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JailConfig {
    pub root: PathBuf,
    pub submounts: Vec<Submount>,
    /// A host directory with `corral` and its command links (relative
    /// links: they are followed inside the jail).
    pub bin: PathBuf,
    /// Where the host's device nodes are.
    pub host_dev: PathBuf,
    /// The node's Docker socket, given to exclusive jobs only: containers
    /// Docker starts escape the job's limits.
    pub docker_socket: Option<PathBuf>,
}

/// NVIDIA's device nodes every GPU job needs beside its own GPUs.
const NVIDIA_SHARED: [&str; 3] = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"];

impl JailConfig {
    pub fn new(root: PathBuf, bin: PathBuf) -> Self {
        JailConfig {
            root,
            submounts: Vec::new(),
            bin,
            host_dev: "/dev".into(),
            docker_socket: None,
        }
    }

    /// The plan for one task holding `gpus` (indices on this node): only
    /// those GPUs' device nodes, where the host has them (simulated GPUs
    /// have none); the Docker socket only if the job is `exclusive`.
    pub fn plan(&self, gpus: &[u32], exclusive: bool, socket: &Path, spool: &Path) -> Plan {
        let mut plan = Plan::new(&self.root);
        plan.host_dev = self.host_dev.clone();
        let mut devices: Vec<PathBuf> = gpus
            .iter()
            .map(|g| self.host_dev.join(format!("nvidia{g}")))
            .collect();
        if !devices.is_empty() {
            devices.extend(NVIDIA_SHARED.iter().map(|d| self.host_dev.join(d)));
        }
        plan.devices = devices.into_iter().filter(|d| d.exists()).collect();
        plan.submounts = self.submounts.clone();
        let extra = |name: &str, source: &Path| Extra {
            name: name.into(),
            source: source.to_path_buf(),
            read_only: true,
        };
        plan.extras = vec![
            extra("bin", &self.bin),
            extra("agent.sock", socket),
            extra("spool", spool),
        ];
        if let Some(docker) = self.docker_socket.as_ref().filter(|_| exclusive) {
            // Read-only is about the mount; the socket still takes
            // connections.
            plan.extras.push(extra("docker.sock", docker));
        }
        plan
    }
}

/// A script in the host's spool, as the jail sees it.
pub fn spool_path(script: &Path) -> PathBuf {
    Path::new(SPOOL).join(script.file_name().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_gets_only_its_gpus_devices_and_the_clusters_commands() {
        let dev = tempfile::tempdir().unwrap();
        for d in ["nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm"] {
            std::fs::write(dev.path().join(d), "").unwrap();
        }
        let mut cfg = JailConfig::new("/srv/root".into(), "/opt/corral/bin".into());
        cfg.host_dev = dev.path().to_path_buf();
        cfg.docker_socket = Some("/run/docker.sock".into());
        let plan = cfg.plan(
            &[1, 2],
            false,
            Path::new("/run/a.sock"),
            Path::new("/var/spool/c"),
        );
        let names: Vec<String> = plan
            .devices
            .iter()
            .map(|d| d.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        // nvidia-uvm-tools is absent on this "host": left out.
        assert_eq!(names, ["nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm"]);
        let extras: Vec<(&str, &Path)> = plan
            .extras
            .iter()
            .map(|e| (e.name.as_str(), e.source.as_path()))
            .collect();
        assert_eq!(
            extras,
            [
                ("bin", Path::new("/opt/corral/bin")),
                ("agent.sock", Path::new("/run/a.sock")),
                ("spool", Path::new("/var/spool/c")),
            ]
        );
        // A CPU job sees no NVIDIA device at all.
        let cpu_job = cfg.plan(&[], false, Path::new("/s"), Path::new("/p"));
        assert!(cpu_job.devices.is_empty());
        // Only an exclusive job gets the Docker socket.
        let exclusive = cfg.plan(&[], true, Path::new("/s"), Path::new("/p"));
        let last = exclusive
            .extras
            .last()
            .map(|e| (e.name.as_str(), e.source.as_path()));
        assert_eq!(last, Some(("docker.sock", Path::new("/run/docker.sock"))));
        assert_eq!(
            spool_path(Path::new("/var/spool/c/job7.0.sh")),
            Path::new("/run/corral/spool/job7.0.sh")
        );
    }
}
