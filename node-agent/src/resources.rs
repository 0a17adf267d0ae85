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
        let total = procfs::Meminfo::current()
            .map(|m| m.mem_total / (1024 * 1024))
            .unwrap_or(1024);
        total.saturating_sub(system_reserve_mb(total))
    });
    Resources { cpus, memory_mb }
}

/// What a machine of `total_mb` keeps from jobs for the agent, the
/// kernel and the system (Slurm's `MemSpecLimit`): a twentieth, at least
/// 512 MB and at most 4 GB.
pub fn system_reserve_mb(total_mb: u64) -> u64 {
    (total_mb / 20).clamp(512, 4096).min(total_mb / 2)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_system_keeps_a_twentieth_between_half_a_and_four_gigabytes() {
        use super::system_reserve_mb;
        assert_eq!(system_reserve_mb(1_000), 500, "never over half");
        assert_eq!(system_reserve_mb(8_000), 512);
        assert_eq!(system_reserve_mb(24_000), 1_200);
        assert_eq!(system_reserve_mb(2_000_000), 4_096);
    }

    #[test]
    fn detects_something_and_honours_caps() {
        let r = super::detect(None, None);
        assert!(r.cpus >= 1 && r.memory_mb >= 1);
        let r = super::detect(Some(64), Some(512_000));
        assert_eq!((r.cpus, r.memory_mb), (64, 512_000));
    }
}
