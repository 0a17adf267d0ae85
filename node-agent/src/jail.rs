//! How the agent uses the shared-root jail: one plan per task, built from
//! the node's jail configuration and the task's GPUs. Inside, the
//! cluster's commands are at `/run/corral/bin`, the agent's socket at
//! `/run/corral/agent.sock` and the spool (batch scripts) at
//! `/run/corral/spool`.

use std::path::{Path, PathBuf};

use std::sync::Arc;

use corral_proto::msg::Ident;
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
    /// Whose exclusive jobs get the socket: a group of the root's (none:
    /// no one's).
    pub docker_group: Option<String>,
    /// The node's GPU driver files, bound into the jail of every task
    /// with a GPU (see [`driver_files`]).
    pub driver_files: Vec<PathBuf>,
    /// Node-local files bound at the same path, besides `/etc/hosts` and
    /// `/etc/resolv.conf`.
    pub host_files: Vec<PathBuf>,
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
            docker_group: None,
            driver_files: Vec::new(),
            host_files: Vec::new(),
        }
    }

    /// The plan for one task holding `gpus` (the minor numbers of their
    /// `/dev/nvidiaN`, which are usually their indices): only
    /// those GPUs' device nodes, where the host has them (simulated GPUs
    /// have none); the Docker socket only if `docker` ([`JailConfig::docker_for`]).
    pub fn plan(&self, gpus: &[u32], docker: bool, socket: &Path, spool: &Path) -> Plan {
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
        if !gpus.is_empty() {
            plan.driver_files = self.driver_files.clone();
        }
        plan.submounts = self.submounts.clone();
        plan.host_files.extend(self.host_files.iter().cloned());
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
        if let Some(docker) = self.docker_socket.as_ref().filter(|_| docker) {
            // Read-only is about the mount; the socket still takes
            // connections.
            plan.extras.push(extra("docker.sock", docker));
        }
        plan
    }
}

impl JailConfig {
    /// Whether a task gets the Docker socket, which is root on the node:
    /// its job is exclusive and its user (of `groups`, the root's) is in
    /// `docker_group`; with no group configured, no one is.
    pub fn docker_for(&self, exclusive: bool, groups: Option<&[u32]>) -> bool {
        if !exclusive || self.docker_socket.is_none() {
            return false;
        }
        let gid = self
            .docker_group
            .as_deref()
            .and_then(|g| shared_root::users::group_id(&self.root, g));
        gid.is_some_and(|gid| groups.is_some_and(|gs| gs.contains(&gid)))
    }
}

/// Name prefixes of NVIDIA's user-space driver libraries.
const DRIVER_LIBS: [&str; 9] = [
    "libnvidia-",
    "libcuda.so",
    "libcudadebugger.so",
    "libnvcuvid.so",
    "libnvoptix.so",
    "libGLX_nvidia.so",
    "libEGL_nvidia.so",
    "libGLESv2_nvidia.so",
    "libGLESv1_CM_nvidia.so",
];

/// NVIDIA's tools a job may call.
const DRIVER_TOOLS: [&str; 5] = [
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
];

/// The driver's 64-bit libraries in `ldconfig -p` output (one path per
/// name, the first the cache lists).
pub fn driver_libraries(ldconfig: &str) -> Vec<PathBuf> {
    let mut seen = std::collections::HashSet::new();
    ldconfig
        .lines()
        .filter_map(|l| {
            // "\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1"
            let (left, path) = l.trim().split_once(" => ")?;
            let (name, flags) = left.split_once(' ')?;
            let wanted = DRIVER_LIBS.iter().any(|p| name.starts_with(p));
            (wanted && flags.contains("64") && seen.insert(name.to_string()))
                .then(|| Path::new(path.trim()).to_path_buf())
        })
        .collect()
}

/// The host's NVIDIA driver files: its libraries from the loader's cache
/// (`ldconfig -p`) and its tools from the usual directories. Empty on a
/// host without the driver.
pub fn driver_files() -> Vec<PathBuf> {
    let out = ["/sbin/ldconfig", "/usr/sbin/ldconfig"]
        .iter()
        .find_map(|l| std::process::Command::new(l).arg("-p").output().ok())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let mut files = driver_libraries(&out);
    if files.is_empty() {
        return files;
    }
    let dirs = tool_dirs(&files);
    files.extend(DRIVER_TOOLS.iter().filter_map(|t| find_tool(&dirs, t)));
    files
}

/// Where the driver's tools may be: beside its libraries (`…/lib64` →
/// `…/bin`, as drivers installed under `/usr/local/nvidia` have them),
/// then the usual directories.
fn tool_dirs(libs: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = libs
        .iter()
        .filter_map(|l| {
            let dir = l.parent()?;
            let name = dir.file_name()?.to_string_lossy();
            name.starts_with("lib")
                .then(|| dir.parent().map(|p| p.join("bin")))?
        })
        .collect();
    dirs.extend(["/usr/bin", "/usr/sbin", "/usr/local/bin"].map(PathBuf::from));
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
    dirs
}

/// The first `tool` in `dirs` that is a program rather than a script
/// (a wrapper script on the host usually execs a path the jail lacks),
/// else the first at all.
fn find_tool(dirs: &[PathBuf], tool: &str) -> Option<PathBuf> {
    use std::io::Read;
    let found: Vec<PathBuf> = dirs
        .iter()
        .map(|d| d.join(tool))
        .filter(|p| p.is_file())
        .collect();
    let script = |p: &Path| {
        let mut head = [0u8; 2];
        std::fs::File::open(p)
            .and_then(|mut f| f.read_exact(&mut head))
            .map(|()| &head == b"#!")
            .unwrap_or(false)
    };
    found.iter().find(|p| !script(p)).or(found.first()).cloned()
}

/// A user as a shared root knows them, read once per step: the name (the
/// uid as text when the root has no entry) and the groups, by the root's
/// own `/etc/passwd` and `/etc/group`.
pub fn identity(root: &Path, user: Ident) -> (String, Option<Arc<[u32]>>) {
    match shared_root::users::account(root, user.uid) {
        Some(a) => {
            let groups = shared_root::users::groups(root, &a.name, user.gid);
            (a.name, Some(groups.into()))
        }
        None => (user.uid.to_string(), Some(Arc::from([user.gid]))),
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
    fn the_docker_socket_goes_to_exclusive_jobs_of_the_docker_group_only() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("etc")).unwrap();
        std::fs::write(
            root.path().join("etc/group"),
            "root:x:0:\ndocker:x:999:alice\n",
        )
        .unwrap();
        let mut cfg = JailConfig::new(root.path().to_path_buf(), "/opt/corral/bin".into());
        cfg.docker_socket = Some("/run/docker.sock".into());
        let alice: &[u32] = &[1000, 999];
        let bob: &[u32] = &[1001];
        // No group: no one.
        assert!(!cfg.docker_for(true, Some(alice)));
        cfg.docker_group = Some("docker".into());
        assert!(cfg.docker_for(true, Some(alice)));
        assert!(!cfg.docker_for(false, Some(alice)), "a shared job");
        assert!(!cfg.docker_for(true, Some(bob)));
        assert!(!cfg.docker_for(true, None));
        cfg.docker_group = Some("1001".into());
        assert!(cfg.docker_for(true, Some(bob)), "by number");
        cfg.docker_group = Some("nosuch".into());
        assert!(!cfg.docker_for(true, Some(alice)));
    }

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

    #[test]
    fn driver_tools_are_programs_found_beside_the_libraries_first() {
        let root = tempfile::tempdir().unwrap();
        let (lib, bin, usr) = (
            root.path().join("nvidia/lib64"),
            root.path().join("nvidia/bin"),
            root.path().join("usr/bin"),
        );
        for d in [&lib, &bin, &usr] {
            std::fs::create_dir_all(d).unwrap();
        }
        let dirs = tool_dirs(&[lib.join("libnvidia-ml.so.1")]);
        assert_eq!(dirs[0], bin);
        // A wrapper script on PATH loses to the program it wraps.
        let mut dirs = vec![usr.clone(), bin.clone()];
        std::fs::write(usr.join("nvidia-smi"), "#!/bin/sh\nexec /x/nvidia-smi\n").unwrap();
        assert_eq!(find_tool(&dirs, "nvidia-smi"), Some(usr.join("nvidia-smi")));
        std::fs::write(bin.join("nvidia-smi"), b"\x7fELF....").unwrap();
        assert_eq!(find_tool(&dirs, "nvidia-smi"), Some(bin.join("nvidia-smi")));
        dirs.reverse();
        assert_eq!(find_tool(&dirs, "nvidia-smi"), Some(bin.join("nvidia-smi")));
        assert_eq!(find_tool(&dirs, "nvidia-debugdump"), None);
    }

    #[test]
    fn driver_libraries_come_from_the_loaders_cache_64_bit_once_each() {
        let out = "1234 libs found in cache `/etc/ld.so.cache'\n\
            \tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1\n\
            \tlibnvidia-ml.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libnvidia-ml.so.1\n\
            \tlibnvidia-ml.so.1 (libc6) => /lib/i386-linux-gnu/libnvidia-ml.so.1\n\
            \tlibcuda.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libcuda.so.1\n\
            \tlibcuda.so.1 (libc6,x86-64) => /usr/local/cuda/compat/libcuda.so.1\n\
            \tlibcuda.so (libc6,x86-64) => /lib/x86_64-linux-gnu/libcuda.so\n\
            \tlibcudart.so.12 (libc6,x86-64) => /usr/local/cuda/lib64/libcudart.so.12\n";
        let libs = driver_libraries(out);
        assert_eq!(
            libs,
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libnvidia-ml.so.1"),
                "/lib/x86_64-linux-gnu/libcuda.so.1".into(),
                "/lib/x86_64-linux-gnu/libcuda.so".into(),
            ]
        );
        // Only GPU tasks get them.
        let mut cfg = JailConfig::new("/srv/root".into(), "/opt/corral/bin".into());
        cfg.driver_files = libs;
        let gpu = cfg.plan(&[0], false, Path::new("/s"), Path::new("/p"));
        assert_eq!(gpu.driver_files.len(), 3);
        let cpu = cfg.plan(&[], false, Path::new("/s"), Path::new("/p"));
        assert!(cpu.driver_files.is_empty());
    }

    #[test]
    fn a_user_is_the_roots_user_name_and_groups_and_all() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("etc")).unwrap();
        std::fs::write(
            root.path().join("etc/passwd"),
            "alice:x:1000:1000::/home/alice:/bin/sh\n",
        )
        .unwrap();
        std::fs::write(
            root.path().join("etc/group"),
            "alice:x:1000:\ngpu:x:44:alice\n",
        )
        .unwrap();
        let alice = Ident {
            uid: 1000,
            gid: 1000,
        };
        let (name, groups) = identity(root.path(), alice);
        assert_eq!(
            (name.as_str(), groups.as_deref()),
            ("alice", Some(&[1000, 44][..]))
        );
        // Someone the root does not know keeps only the group they came with.
        let (name, groups) = identity(root.path(), Ident { uid: 4242, gid: 7 });
        assert_eq!((name.as_str(), groups.as_deref()), ("4242", Some(&[7][..])));
    }
}
