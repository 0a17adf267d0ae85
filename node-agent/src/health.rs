//! The node's own checks: what it reports to ctld as its health. A
//! failing check is one line, `<check>: <detail>`; ctld drains the node
//! with it (`node_problem: gpu: GPU 2: XID 79`) until the same report
//! comes back clean.

use corral_proto::error_chain;

use crate::gpu::{GpuError, GpuHealth};

/// Descriptors the agent keeps free for launches (a task needs several
/// while it starts: pipes, output files, the exec error pipe).
pub const FD_RESERVE: u64 = 64;

/// XIDs after which a GPU should get no more work until someone looks:
/// double-bit ECC (48), row remapping failures (63, 64), NVLink (74),
/// fallen off the bus (79), uncontained ECC (94, 95).
pub const DRAIN_XIDS: [u32; 7] = [48, 63, 64, 74, 79, 94, 95];

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
            with(&|g| g.lost = true).as_deref(),
            Some("gpu: GPU 1 fell off the bus")
        );
        assert_eq!(
            c.problem(Ok(vec![ok(0)])).as_deref(),
            Some("gpu: 1 of 2 GPUs present")
        );
    }
}
