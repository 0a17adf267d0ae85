//! CPUs and memory of the machine, read from procfs, optionally capped.

/// What the node offers to jobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resources {
    pub cpus: u32,
    pub memory_mb: u64,
}

/// Reads the machine's CPUs (those this process may run on) and total
/// memory; `cpus` and `memory_mb` override them (a simulated node may
/// claim more than the machine has).
pub fn detect(cpus: Option<u32>, memory_mb: Option<u64>) -> Resources {
    let cpus = cpus.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1)
    });
    let memory_mb = memory_mb.unwrap_or_else(|| {
        use procfs::Current;
        procfs::Meminfo::current()
            .map(|m| m.mem_total / (1024 * 1024))
            .unwrap_or(1024)
    });
    Resources { cpus, memory_mb }
}

#[cfg(test)]
mod tests {
    #[test]
    fn detects_something_and_honours_caps() {
        let r = super::detect(None, None);
        assert!(r.cpus >= 1 && r.memory_mb >= 1);
        let r = super::detect(Some(64), Some(512_000));
        assert_eq!((r.cpus, r.memory_mb), (64, 512_000));
    }
}
