//! The node's own checks: what it reports to ctld as its health. A
//! failing check is one line, `<check>: <detail>`; ctld drains the node
//! with it (`node_problem: gpu: GPU 2: XID 79`) until the same report
//! comes back clean.

use corral_proto::error_chain;

use corral_proto::msg::{CommandCheck, HealthConfig};

use crate::gpu::{GpuError, GpuHealth};

/// Descriptors the agent keeps free for launches (a task needs several
/// while it starts: pipes, output files, the exec error pipe).
pub const FD_RESERVE: u64 = 64;

pub use corral_proto::msg::DEFAULT_DRAIN_XIDS as DRAIN_XIDS;

/// The built-in GPU checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuChecks {
    /// GPUs the node registered with; fewer present is a problem.
    pub expected: usize,
    pub drain_xids: Vec<u32>,
    pub max_temperature_c: u32,
}

impl GpuChecks {
    pub fn new(expected: usize) -> Self {
        GpuChecks {
            expected,
            drain_xids: DRAIN_XIDS.to_vec(),
            max_temperature_c: 90,
        }
    }

    /// The same checks with the thresholds ctld configured.
    pub fn configured(&self, cfg: &HealthConfig) -> Self {
        GpuChecks {
            expected: self.expected,
            drain_xids: cfg.drain_xids.clone(),
            max_temperature_c: cfg.max_temperature_c,
        }
    }

    /// The first failing GPU check, if any.
    pub fn problem(&self, readings: Result<Vec<GpuHealth>, GpuError>) -> Option<String> {
        let readings = match readings {
            Ok(r) => r,
            Err(e) => return Some(format!("gpu: cannot read the GPUs: {}", error_chain(&e))),
        };
        if let Some(g) = readings.iter().find(|g| g.lost) {
            return Some(format!("gpu: GPU {} fell off the bus", g.index));
        }
        if readings.len() < self.expected {
            return Some(format!(
                "gpu: {} of {} GPUs present",
                readings.len(),
                self.expected
            ));
        }
        for g in &readings {
            if g.ecc_uncorrectable > 0 {
                return Some(format!(
                    "gpu: GPU {}: {} uncorrectable ECC errors",
                    g.index, g.ecc_uncorrectable
                ));
            }
            if let Some(x) = g.xid.filter(|x| self.drain_xids.contains(x)) {
                return Some(format!("gpu: GPU {}: XID {x}", g.index));
            }
            if g.retirement_pending {
                return Some(format!(
                    "gpu: GPU {}: retired pages pending a reset",
                    g.index
                ));
            }
            if let Some(t) = g.temperature_c.filter(|&t| t > self.max_temperature_c) {
                return Some(format!(
                    "gpu: GPU {}: {t} °C, over {} °C",
                    g.index, self.max_temperature_c
                ));
            }
        }
        None
    }
}

/// Most bytes of a command check's output read (its first line is the
/// detail).
const OUTPUT_LIMIT: usize = 4096;

/// Runs an operator's command check once, as the agent (root), with
/// `/bin/sh -c` and `CORRAL_NODE_NAME` set, in a process group of its own
/// that is killed when it times out. `None` when it exits 0; else
/// `<name>: <detail>`, the detail being the first line of its standard
/// output, or how it ended.
pub async fn run_command(check: &CommandCheck, node: &str) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut child = match tokio::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(&check.command)
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("CORRAL_NODE_NAME", node)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return Some(format!("{}: cannot run: {e}", check.name)),
    };
    let pgid = child.id();
    let mut out = child.stdout.take();
    let run = async {
        let mut buf = Vec::new();
        if let Some(o) = out.as_mut() {
            let _ = o.take(OUTPUT_LIMIT as u64).read_to_end(&mut buf).await;
        }
        (child.wait().await, buf)
    };
    let timeout = std::time::Duration::from_millis(check.timeout_ms);
    let (status, buf) = match tokio::time::timeout(timeout, run).await {
        Ok(r) => r,
        Err(_) => {
            if let Some(g) = pgid {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(g as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            return Some(format!(
                "{}: timed out after {} s",
                check.name,
                check.timeout_ms.div_ceil(1000)
            ));
        }
    };
    let status = match status {
        Ok(s) if s.success() => return None,
        Ok(s) => s,
        Err(e) => return Some(format!("{}: {e}", check.name)),
    };
    let text = String::from_utf8_lossy(&buf);
    let line: String = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or_default()
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect();
    let detail = if line.is_empty() {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(code), _) => format!("exit code {code}"),
            (_, Some(sig)) => format!("killed by signal {sig}"),
            _ => "failed".into(),
        }
    } else {
        line
    };
    Some(format!("{}: {detail}", check.name))
}

/// Whether the agent is short of file descriptors (a node that cannot
/// launch would otherwise fail every job sent to it).
pub fn fd_problem() -> Option<String> {
    let limit = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(soft, _)| soft)
        .ok()?;
    let open = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    (open + FD_RESERVE > limit)
        .then(|| format!("agent: too many open files: {open} of {limit} in use"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(command: &str, timeout_ms: u64) -> CommandCheck {
        CommandCheck {
            name: "scratch".into(),
            command: command.into(),
            interval_ms: 1000,
            timeout_ms,
        }
    }

    #[tokio::test]
    async fn a_command_check_is_healthy_on_exit_0_and_says_why_otherwise() {
        assert_eq!(
            run_command(&check("test $CORRAL_NODE_NAME = n0", 5000), "n0").await,
            None
        );
        assert_eq!(
            run_command(
                &check("echo; echo ' /scratch 99% full '; exit 1", 5000),
                "n0"
            )
            .await
            .as_deref(),
            Some("scratch: /scratch 99% full")
        );
        assert_eq!(
            run_command(&check("exit 3", 5000), "n0").await.as_deref(),
            Some("scratch: exit code 3")
        );
        assert_eq!(
            run_command(&check("kill -9 $$", 5000), "n0")
                .await
                .as_deref(),
            Some("scratch: killed by signal 9")
        );
    }

    #[tokio::test]
    async fn a_hung_command_check_times_out_and_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let pid = dir.path().join("pid");
        let cmd = format!("sleep 30 & echo $! > {}; wait", pid.display());
        let t0 = std::time::Instant::now();
        assert_eq!(
            run_command(&check(&cmd, 300), "n0").await.as_deref(),
            Some("scratch: timed out after 1 s")
        );
        assert!(t0.elapsed() < std::time::Duration::from_secs(5));
        // Its whole process group went with it.
        let sleeper: i32 = std::fs::read_to_string(&pid)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let t0 = std::time::Instant::now();
        while std::fs::read_to_string(format!("/proc/{sleeper}/stat")).is_ok_and(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        }) {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(5),
                "sleep survived"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    fn ok(index: u32) -> GpuHealth {
        GpuHealth {
            index,
            temperature_c: Some(40),
            ..GpuHealth::default()
        }
    }

    #[test]
    fn each_gpu_fault_is_one_line_naming_the_gpu() {
        let c = GpuChecks::new(2);
        assert_eq!(c.problem(Ok(vec![ok(0), ok(1)])), None);
        let with = |f: &dyn Fn(&mut GpuHealth)| {
            let mut g = ok(1);
            f(&mut g);
            c.problem(Ok(vec![ok(0), g]))
        };
        assert_eq!(
            with(&|g| g.xid = Some(79)).as_deref(),
            Some("gpu: GPU 1: XID 79")
        );
        // An XID that is not on the drain list is no reason.
        assert_eq!(with(&|g| g.xid = Some(13)), None);
        assert_eq!(
            with(&|g| g.ecc_uncorrectable = 2).as_deref(),
            Some("gpu: GPU 1: 2 uncorrectable ECC errors")
        );
        assert_eq!(
            with(&|g| g.temperature_c = Some(97)).as_deref(),
            Some("gpu: GPU 1: 97 °C, over 90 °C")
        );
        assert_eq!(
            with(&|g| g.retirement_pending = true).as_deref(),
            Some("gpu: GPU 1: retired pages pending a reset")
        );
        assert_eq!(
            with(&|g| g.lost = true).as_deref(),
            Some("gpu: GPU 1 fell off the bus")
        );
        assert_eq!(
            c.problem(Ok(vec![ok(0)])).as_deref(),
            Some("gpu: 1 of 2 GPUs present")
        );
    }
}
