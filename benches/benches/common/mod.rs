//! What the controller benches share.

use corral_ctl::ctld::Controller;
use corral_proto::msg::Registration;

/// Registers `worker-0` .. `worker-{n-1}`, 64 CPUs and 500 GB each.
pub fn register_nodes(ctl: &mut Controller, n: usize, now: u64) {
    for i in 0..n {
        let reg = Registration {
            name: format!("worker-{i}"),
            cpus: 64,
            memory_mb: 512_000,
            gpus: Vec::new(),
            features: Vec::new(),
            credential_key: vec![7; 32],
            running: Vec::new(),
            launched: Vec::new(),
            forgot_ended_before: 0,
            instance: 1,
            agent_version: "bench".into(),
            os: String::new(),
        };
        ctl.register(reg, now).expect("register");
    }
}
