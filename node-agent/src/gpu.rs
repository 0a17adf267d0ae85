//! GPU backends: what GPUs a node has and how they are. [`crate::nvml`]
//! reads real NVIDIA GPUs; the simulated backend here stands in on
//! machines without them.

use std::path::{Path, PathBuf};

use corral_proto::msg::GpuInfo;
use serde::Deserialize;

/// Why the GPUs could not be read.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("{path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: bad gpu description")]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("{path}: gpu index {index} repeated")]
    Repeated { path: PathBuf, index: u32 },
    #[error("NVML: {0}")]
    Nvml(String),
}

/// One GPU's health readings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuHealth {
    pub index: u32,
    /// The last XID error the driver reported, if any.
    pub xid: Option<u32>,
    /// Uncorrectable ECC errors counted so far.
    pub ecc_uncorrectable: u64,
    pub temperature_c: Option<u32>,
    /// The GPU is gone (fell off the bus).
    pub lost: bool,
    /// Memory pages wait to be retired: the GPU needs a reset.
    pub retirement_pending: bool,
}

/// A source of GPU inventory and health.
pub trait GpuBackend: Send + Sync + std::fmt::Debug {
    fn gpus(&self) -> Result<Vec<GpuInfo>, GpuError>;
    /// The minor number of GPU `index`'s device node (`/dev/nvidiaN`):
    /// usually the index, but the driver decides.
    fn minor(&self, index: u32) -> u32 {
        index
    }
    /// Current readings of every GPU still present.
    fn health(&self) -> Result<Vec<GpuHealth>, GpuError>;
    /// What the backend is, in a few words.
    fn describe(&self) -> String {
        format!("{self:?}")
    }
}

/// Simulated GPUs: a fixed list, or a file re-read for every health
/// reading, so a test (or a person) injects a fault by editing it.
#[derive(Clone, Debug, Default)]
pub struct SimGpus {
    gpus: Vec<GpuInfo>,
    file: Option<(String, PathBuf)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GpuFile {
    #[serde(default)]
    gpu: Vec<GpuEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GpuEntry {
    index: u32,
    uuid: Option<String>,
    #[serde(default = "default_memory")]
    memory_mb: u64,
    #[serde(default)]
    group: u32,
    /// The model jobs name it by (`h200`); none: untyped.
    model: Option<String>,
    // Injected faults.
    xid: Option<u32>,
    #[serde(default)]
    ecc_uncorrectable: u64,
    temperature_c: Option<u32>,
    #[serde(default)]
    lost: bool,
}

fn default_memory() -> u64 {
    141 * 1024
}

/// NVIDIA's character-device major: `/dev/nvidiaN` is `195:N`.
pub const NVIDIA_MAJOR: u32 = 195;

/// The device numbers of GPU `index` of this node: those of
/// `DEV/nvidiaN` where it exists as a character device, else NVIDIA's
/// convention (`195:N`), so a GPU's device is denied even before its node
/// exists.
pub fn device_numbers(dev: &Path, index: u32) -> crate::cgroup::Denied {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    match std::fs::metadata(dev.join(format!("nvidia{index}"))) {
        Ok(m) if m.file_type().is_char_device() => {
            let rdev = m.rdev();
            crate::cgroup::Denied {
                major: nix::sys::stat::major(rdev) as u32,
                minor: nix::sys::stat::minor(rdev) as u32,
            }
        }
        _ => crate::cgroup::Denied {
            major: NVIDIA_MAJOR,
            minor: index,
        },
    }
}

impl SimGpus {
    /// `count` GPUs of `memory_mb` each, in topology groups of `per_group`
    /// (0: one group), with UUIDs derived from the node name.
    pub fn uniform(node: &str, count: u32, per_group: u32, memory_mb: u64) -> Self {
        SimGpus {
            gpus: (0..count)
                .map(|i| GpuInfo {
                    index: i,
                    uuid: sim_uuid(node, i),
                    memory_mb,
                    group: i.checked_div(per_group).unwrap_or(0),
                    model: String::new(),
                })
                .collect(),
            file: None,
        }
    }

    fn read(path: &Path) -> Result<Vec<GpuEntry>, GpuError> {
        let text = std::fs::read_to_string(path).map_err(|source| GpuError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let file: GpuFile = toml::from_str(&text).map_err(|source| GpuError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(file.gpu)
    }

    /// From a TOML file of `[[gpu]]` tables (`index`, `uuid`, `memory_mb`,
    /// `group`, `model`).
    pub fn from_file(node: &str, path: &Path) -> Result<Self, GpuError> {
        let mut gpus: Vec<GpuInfo> = Self::read(path)?
            .into_iter()
            .map(|g| GpuInfo {
                index: g.index,
                uuid: g.uuid.unwrap_or_else(|| sim_uuid(node, g.index)),
                memory_mb: g.memory_mb,
                group: g.group,
                model: g.model.unwrap_or_default(),
            })
            .collect();
        gpus.sort_by_key(|g| g.index);
        if let Some(w) = gpus.windows(2).find(|w| w[0].index == w[1].index) {
            return Err(GpuError::Repeated {
                path: path.to_path_buf(),
                index: w[0].index,
            });
        }
        Ok(SimGpus {
            gpus,
            file: Some((node.to_string(), path.to_path_buf())),
        })
    }
}

/// A stable UUID-shaped identifier for a simulated GPU.
fn sim_uuid(node: &str, index: u32) -> String {
    let h = node.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    format!(
        "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        (h >> 32) as u32,
        (h >> 16) as u16,
        h as u16,
        index,
        h & 0xffff_ffff_ffff
    )
}

impl GpuBackend for SimGpus {
    fn describe(&self) -> String {
        match &self.file {
            Some((_, path)) => format!("simulated, from {}", path.display()),
            None => format!("simulated, {} GPUs", self.gpus.len()),
        }
    }

    fn gpus(&self) -> Result<Vec<GpuInfo>, GpuError> {
        Ok(self.gpus.clone())
    }

    fn health(&self) -> Result<Vec<GpuHealth>, GpuError> {
        let Some((_, path)) = &self.file else {
            return Ok(self
                .gpus
                .iter()
                .map(|g| GpuHealth {
                    index: g.index,
                    ..GpuHealth::default()
                })
                .collect());
        };
        Ok(Self::read(path)?
            .into_iter()
            .map(|g| GpuHealth {
                index: g.index,
                xid: g.xid,
                ecc_uncorrectable: g.ecc_uncorrectable,
                temperature_c: g.temperature_c,
                lost: g.lost,
                retirement_pending: false,
            })
            .collect())
    }
}

/// What `corral-agent --show-gpus` prints: the backend, then a line per
/// GPU with its inventory and its current health readings.
pub fn describe(backend: &dyn GpuBackend, inventory: &[GpuInfo]) -> Result<String, GpuError> {
    use std::fmt::Write;
    let health = backend.health()?;
    let mut out = format!("backend: {}\n", backend.describe());
    for g in inventory {
        let _ = write!(
            out,
            "gpu {} uuid={} memory={}M group={} device=/dev/nvidia{}",
            g.index,
            g.uuid,
            g.memory_mb,
            g.group,
            backend.minor(g.index)
        );
        match health.iter().find(|h| h.index == g.index) {
            Some(h) => {
                let temp = h
                    .temperature_c
                    .map_or_else(|| "unknown".to_string(), |t| format!("{t}C"));
                let xid = h.xid.map_or_else(|| "none".to_string(), |x| x.to_string());
                let _ = writeln!(
                    out,
                    " temperature={temp} ecc_uncorrectable={} xid={xid} retirement_pending={} lost={}",
                    h.ecc_uncorrectable,
                    yes_no(h.retirement_pending),
                    yes_no(h.lost)
                );
            }
            None => out.push_str(" health=absent\n"),
        }
    }
    Ok(out)
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_groups_and_distinct_uuids() {
        let g = SimGpus::uniform("worker-0", 8, 4, 1000).gpus().unwrap();
        assert_eq!(g.len(), 8);
        assert_eq!(g[3].group, 0);
        assert_eq!(g[4].group, 1);
        let mut uuids: Vec<_> = g.iter().map(|g| &g.uuid).collect();
        uuids.dedup();
        assert_eq!(uuids.len(), 8);
        let other = SimGpus::uniform("worker-1", 1, 0, 1000).gpus().unwrap();
        assert_ne!(other[0].uuid, g[0].uuid);
    }

    #[test]
    fn file_backend_reads_and_refuses_repeats() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("gpus.toml");
        std::fs::write(
            &p,
            "[[gpu]]\nindex = 1\ngroup = 1\n[[gpu]]\nindex = 0\nuuid = \"GPU-x\"\n",
        )
        .unwrap();
        let g = SimGpus::from_file("n", &p).unwrap().gpus().unwrap();
        assert_eq!((g[0].index, g[0].uuid.as_str()), (0, "GPU-x"));
        assert_eq!(g[1].group, 1);
        std::fs::write(&p, "[[gpu]]\nindex = 1\n[[gpu]]\nindex = 1\n").unwrap();
        assert!(matches!(
            SimGpus::from_file("n", &p),
            Err(GpuError::Repeated { .. })
        ));
        std::fs::write(&p, "[[gpu]]\nindx = 1\n").unwrap();
        assert!(matches!(
            SimGpus::from_file("n", &p),
            Err(GpuError::Parse { .. })
        ));
    }

    #[test]
    fn describe_prints_inventory_and_readings() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("gpus.toml");
        std::fs::write(
            &p,
            "[[gpu]]\nindex = 0\nuuid = \"GPU-a\"\nmemory_mb = 80\ntemperature_c = 41\n\
             [[gpu]]\nindex = 1\nuuid = \"GPU-b\"\nmemory_mb = 80\ngroup = 1\nxid = 79\necc_uncorrectable = 2\n",
        )
        .unwrap();
        let sim = SimGpus::from_file("n", &p).unwrap();
        let text = describe(&sim, &sim.gpus().unwrap()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with("backend: simulated, from "), "{text}");
        assert_eq!(
            lines[1],
            "gpu 0 uuid=GPU-a memory=80M group=0 device=/dev/nvidia0 temperature=41C \
             ecc_uncorrectable=0 xid=none retirement_pending=no lost=no"
        );
        assert_eq!(
            lines[2],
            "gpu 1 uuid=GPU-b memory=80M group=1 device=/dev/nvidia1 temperature=unknown \
             ecc_uncorrectable=2 xid=79 retirement_pending=no lost=no"
        );
    }
}
