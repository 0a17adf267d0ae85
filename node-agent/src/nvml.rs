//! The NVML backend: a node's real NVIDIA GPUs. The NVML library
//! (`libnvidia-ml.so.1`, installed with the driver) is loaded at run time,
//! so the agent builds and runs on machines without it; there
//! [`NvmlGpus::open`] fails and the agent uses the simulated backend.
//!
//! Inventory: index, UUID, memory, and a topology group per GPU: GPUs
//! joined by active NVLinks form one group (an NVLink domain); without
//! NVLink, GPUs group by NUMA node. Health: presence (a GPU that fell off
//! the bus), temperature, uncorrectable ECC errors (volatile count), pages
//! waiting to be retired, and XID events, collected from an NVML event
//! set at each reading (the last XID of each GPU since the agent started).

use std::collections::HashMap;

use corral_proto::msg::GpuInfo;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{EventSet, Nvml};
use parking_lot::Mutex;

use crate::gpu::{GpuBackend, GpuError, GpuHealth};

/// NVLinks a GPU may have (NVML_NVLINK_MAX_LINKS).
const MAX_LINKS: u32 = 18;

/// Real GPUs through NVML.
pub struct NvmlGpus {
    /// Lives as long as the process: the event set borrows it.
    nvml: &'static Nvml,
    count: u32,
    /// XID events of every GPU (absent where the driver cannot deliver
    /// them).
    events: Option<Mutex<EventSet<'static>>>,
    /// The last XID seen per GPU UUID.
    xids: Mutex<HashMap<String, u32>>,
}

impl std::fmt::Debug for NvmlGpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlGpus")
            .field("count", &self.count)
            .field("events", &self.events.is_some())
            .finish()
    }
}

fn nvml_error(what: &str, e: NvmlError) -> GpuError {
    GpuError::Nvml(format!("{what}: {e}"))
}

impl NvmlGpus {
    /// Loads NVML and registers every GPU for XID events. Fails where
    /// the library is missing or finds no GPU.
    pub fn open() -> Result<NvmlGpus, GpuError> {
        let nvml = Nvml::init().map_err(|e| nvml_error("loading NVML", e))?;
        // The event set borrows the library handle for as long as the
        // agent runs; one handle per process, made once.
        let nvml: &'static Nvml = Box::leak(Box::new(nvml));
        let count = nvml
            .device_count()
            .map_err(|e| nvml_error("counting GPUs", e))?;
        if count == 0 {
            return Err(GpuError::Nvml("NVML sees no GPU".into()));
        }
        let mut set = nvml.create_event_set().ok();
        for i in 0..count {
            let (Some(s), Ok(dev)) = (set.take(), nvml.device_by_index(i)) else {
                break;
            };
            // A GPU that cannot report XIDs leaves the set as it was, or
            // (NVML's Unknown error) unusable: then there are no events.
            set = dev
                .register_events(EventTypes::CRITICAL_XID_ERROR, s)
                .map_err(|e| tracing::warn!(gpu = i, error = %e.error, "no XID events"))
                .ok();
        }
        Ok(NvmlGpus {
            nvml,
            count,
            events: set.map(Mutex::new),
            xids: Mutex::new(HashMap::new()),
        })
    }

    /// Takes every XID event waiting, remembering each GPU's last.
    fn drain_events(&self) {
        let Some(set) = &self.events else {
            return;
        };
        let set = set.lock();
        // Bounded: a storm of events cannot hold a reading forever.
        for _ in 0..1024 {
            let Ok(ev) = set.wait(0) else {
                return;
            };
            if let (Some(XidError::Value(x)), Ok(uuid)) = (ev.event_data, ev.device.uuid()) {
                self.xids.lock().insert(uuid, x as u32);
            }
        }
    }
}

/// Topology groups from what NVML says of each GPU: its PCI bus id, the
/// bus ids at the other end of its active NVLinks, and its NUMA node.
/// GPUs connected by NVLink (directly or through others) share a group;
/// a GPU with no NVLink peer groups with the others of its NUMA node.
/// Groups are numbered in order of their first GPU.
pub fn topology_groups(
    bus_ids: &[String],
    peers: &[Vec<String>],
    numa: &[Option<u32>],
) -> Vec<u32> {
    let n = bus_ids.len();
    let norm = |s: &str| s.trim().to_ascii_lowercase();
    let index: HashMap<String, usize> = bus_ids
        .iter()
        .enumerate()
        .map(|(i, b)| (norm(b), i))
        .collect();
    // Union-find over NVLink edges.
    let mut parent: Vec<usize> = (0..n).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    let mut linked = vec![false; n];
    for (i, ps) in peers.iter().enumerate().take(n) {
        for p in ps {
            if let Some(&j) = index.get(&norm(p)) {
                if j != i {
                    linked[i] = true;
                    linked[j] = true;
                    let (a, b) = (root(&mut parent, i), root(&mut parent, j));
                    parent[a.max(b)] = a.min(b);
                }
            }
        }
    }
    let mut names: HashMap<(bool, usize), u32> = HashMap::new();
    (0..n)
        .map(|i| {
            let key = if linked[i] {
                (true, root(&mut parent, i))
            } else {
                (false, numa.get(i).copied().flatten().unwrap_or(0) as usize)
            };
            let next = names.len() as u32;
            *names.entry(key).or_insert(next)
        })
        .collect()
}

/// The NUMA node of a PCI device, from sysfs (`-1`: none).
fn numa_of(bus_id: &str) -> Option<u32> {
    // NVML writes the domain with 8 digits, sysfs with 4.
    let id = bus_id.to_ascii_lowercase();
    let id = match id.split_once(':') {
        Some((dom, rest)) if dom.len() > 4 => format!("{}:{rest}", &dom[dom.len() - 4..]),
        _ => id,
    };
    std::fs::read_to_string(format!("/sys/bus/pci/devices/{id}/numa_node"))
        .ok()?
        .trim()
        .parse::<i64>()
        .ok()
        .and_then(|n| u32::try_from(n).ok())
}

impl GpuBackend for NvmlGpus {
    fn gpus(&self) -> Result<Vec<GpuInfo>, GpuError> {
        let mut out = Vec::new();
        let mut bus_ids = Vec::new();
        let mut peers = Vec::new();
        for i in 0..self.count {
            let dev = self
                .nvml
                .device_by_index(i)
                .map_err(|e| nvml_error(&format!("GPU {i}"), e))?;
            let uuid = dev
                .uuid()
                .map_err(|e| nvml_error(&format!("GPU {i} UUID"), e))?;
            let memory = dev
                .memory_info()
                .map_err(|e| nvml_error(&format!("GPU {i} memory"), e))?;
            let bus = dev.pci_info().map(|p| p.bus_id).unwrap_or_default();
            let linked: Vec<String> = (0..MAX_LINKS)
                .map(|l| dev.link_wrapper_for(l))
                .filter(|l| l.is_active().unwrap_or(false))
                .filter_map(|l| l.remote_pci_info().ok().map(|p| p.bus_id))
                .collect();
            out.push(GpuInfo {
                index: i,
                uuid,
                memory_mb: memory.total >> 20,
                group: 0,
                model: dev.name().map(|n| slurm_model(&n)).unwrap_or_default(),
            });
            bus_ids.push(bus);
            peers.push(linked);
        }
        let numa: Vec<Option<u32>> = bus_ids.iter().map(|b| numa_of(b)).collect();
        for (g, group) in out.iter_mut().zip(topology_groups(&bus_ids, &peers, &numa)) {
            g.group = group;
        }
        Ok(out)
    }

    fn minor(&self, index: u32) -> u32 {
        self.nvml
            .device_by_index(index)
            .and_then(|d| d.minor_number())
            .unwrap_or(index)
    }

    fn health(&self) -> Result<Vec<GpuHealth>, GpuError> {
        self.drain_events();
        let xids = self.xids.lock().clone();
        let mut out = Vec::new();
        for i in 0..self.count {
            let mut h = GpuHealth {
                index: i,
                ..GpuHealth::default()
            };
            let dev = match self.nvml.device_by_index(i) {
                Ok(d) => d,
                Err(NvmlError::GpuLost) => {
                    h.lost = true;
                    out.push(h);
                    continue;
                }
                Err(e) => return Err(nvml_error(&format!("GPU {i}"), e)),
            };
            let lost = |e: &NvmlError| matches!(e, NvmlError::GpuLost);
            match dev.temperature(TemperatureSensor::Gpu) {
                Ok(t) => h.temperature_c = Some(t),
                Err(e) if lost(&e) => h.lost = true,
                Err(_) => {}
            }
            match dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile) {
                Ok(n) => h.ecc_uncorrectable = n,
                Err(e) if lost(&e) => h.lost = true,
                Err(_) => {} // no ECC on this GPU
            }
            h.retirement_pending = dev.are_pages_pending_retired().unwrap_or(false);
            h.xid = dev.uuid().ok().and_then(|u| xids.get(&u).copied());
            out.push(h);
        }
        Ok(out)
    }
}

/// A GPU's model as Slurm's NVML detection names it for `--gres=gpu:TYPE`:
/// NVML's name in lower case, white space as `_` (`NVIDIA H200` is
/// `nvidia_h200`, `Tesla T4` is `tesla_t4`).
pub fn slurm_model(name: &str) -> String {
    name.to_ascii_lowercase()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join("_")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("00000000:{:02X}:00.0", 0x10 + i))
            .collect()
    }

    #[test]
    fn nvlinked_gpus_share_a_group_and_the_rest_group_by_numa_node() {
        let bus = ids(6);
        // 0-1-2 linked (a chain), 3-4 linked, 5 alone on NUMA node 1.
        let peers = vec![
            vec![bus[1].clone()],
            vec![bus[0].to_lowercase(), bus[2].clone()],
            vec![bus[1].clone()],
            vec![bus[4].clone()],
            vec![bus[3].clone(), "0000:ff:00.0".into()],
            vec![],
        ];
        let numa = vec![Some(0), Some(0), Some(0), Some(1), Some(1), Some(1)];
        assert_eq!(topology_groups(&bus, &peers, &numa), [0, 0, 0, 1, 1, 2]);
    }

    #[test]
    fn without_nvlink_gpus_group_by_numa_node() {
        let bus = ids(4);
        let peers = vec![vec![]; 4];
        let numa = vec![Some(0), Some(1), Some(0), None];
        assert_eq!(topology_groups(&bus, &peers, &numa), [0, 1, 0, 0]);
    }

    #[test]
    fn without_the_library_open_fails_with_a_clear_error() {
        // CI machines have no NVIDIA driver; where one is installed this
        // test has nothing to say.
        if std::path::Path::new("/dev/nvidiactl").exists() {
            println!("SKIPPED (an NVIDIA driver is present)");
            return;
        }
        let e = NvmlGpus::open().expect_err("no NVML here");
        assert!(e.to_string().starts_with("NVML: loading NVML"), "{e}");
    }

    #[test]
    fn models_are_named_as_slurm_detects_them() {
        assert_eq!(super::slurm_model("NVIDIA H200"), "nvidia_h200");
        assert_eq!(super::slurm_model("Tesla T4"), "tesla_t4");
        assert_eq!(
            super::slurm_model(" NVIDIA A100-SXM4-80GB "),
            "nvidia_a100-sxm4-80gb"
        );
    }
}
