//! Corral's hostlists against a real Slurm's, list by list: thousands of
//! generated name lists, each compressed by `scontrol show hostlist` and
//! `show hostlistsorted` and by this crate, and Slurm's expression expanded
//! by both (`show hostnames`). Needs Slurm's `scontrol` on
//! `PATH` and `SLURM_CONF` naming a readable slurm.conf (no daemon need
//! run); run with `--ignored`, not in CI. How the crate's rules were
//! settled.

use std::process::Command;

use corral_hostlist::{compress, compress_sorted};

/// A small deterministic generator, so a difference can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Names in the shapes clusters use, crowded so that runs, duplicates,
/// padding and width changes meet often.
fn names(rng: &mut Rng) -> Vec<String> {
    const PREFIXES: [&str; 6] = ["n", "m", "gpu", "a1-b", "", "N"];
    let len = 1 + rng.below(12);
    let base = rng.below(120);
    (0..len)
        .map(|_| {
            let prefix = PREFIXES[rng.below(PREFIXES.len() as u64) as usize];
            if rng.below(10) == 0 {
                return format!("{prefix}x");
            }
            let v = base + rng.below(6);
            let width = rng.below(4) as usize;
            format!("{prefix}{v:0width$}")
        })
        .filter(|n| !n.is_empty())
        .collect()
}

fn scontrol(what: &str, list: &str) -> String {
    let out = Command::new("scontrol")
        .args(["show", what, list])
        .output()
        .expect("scontrol on PATH");
    assert!(out.status.success(), "scontrol show {what} {list} failed");
    String::from_utf8_lossy(&out.stdout).trim_end().to_string()
}

#[test]
#[ignore = "needs Slurm's scontrol on PATH and SLURM_CONF"]
fn compression_agrees_with_a_real_slurm() {
    let cases: u64 = std::env::var("CORRAL_HOSTLIST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut differ = Vec::new();
    for _ in 0..cases {
        let names = names(&mut rng);
        let list = names.join(",");
        let (want, want_sorted) = (
            scontrol("hostlist", &list),
            scontrol("hostlistsorted", &list),
        );
        let (got, got_sorted) = (compress(&names), compress_sorted(&names));
        // Slurm's expansion of its own expression is the list again.
        let expanded = scontrol("hostnames", &want);
        let expanded: Vec<&str> = expanded.lines().collect();
        if corral_hostlist::expand(&want).ok().as_deref() != Some(&names[..]) || expanded != names {
            differ.push(format!(
                "{list}: expanding {want} does not give the list back"
            ));
        }
        if got != want || got_sorted != want_sorted {
            differ.push(format!(
                "{list}: slurm {want} / {want_sorted}, corral {got} / {got_sorted}"
            ));
        }
    }
    println!(
        "{} of {cases} lists compressed as Slurm does",
        cases - differ.len() as u64
    );
    for d in differ.iter().take(20) {
        println!("differs: {d}");
    }
    assert!(differ.is_empty(), "{} lists differ", differ.len());
}
