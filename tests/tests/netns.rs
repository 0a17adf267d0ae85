//! Several hosts: ctld and two agents each in a network namespace of its
//! own, joined by a bridge, so nothing can lean on loopback. srun must
//! advertise an address the other nodes reach.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use corral_e2e::{bin_dir, is_root, out};
use corral_proto::tls::{self, Role, CTLD_NAME};

/// Namespaces and processes, torn down on drop.
struct Net {
    names: Vec<String>,
    procs: Vec<Child>,
}

fn ip(args: &[&str]) {
    let st = Command::new("ip").args(args).status().expect("running ip");
    assert!(st.success(), "ip {args:?} failed");
}

impl Net {
    /// `hosts` namespaces on one bridge: host i has 10.77.0.(10+i).
    fn new(tag: &str, hosts: usize) -> Net {
        let br = format!("cbr{tag}");
        let mut net = Net {
            names: vec![br.clone()],
            procs: Vec::new(),
        };
        ip(&["netns", "add", &br]);
        ip(&["-n", &br, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &br, "link", "set", "br0", "up"]);
        for i in 0..hosts {
            let ns = format!("cn{tag}{i}");
            ip(&["netns", "add", &ns]);
            net.names.push(ns.clone());
            let veth = format!("cv{tag}{i}");
            ip(&[
                "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ]);
            ip(&["link", "set", &veth, "netns", &br]);
            ip(&["-n", &br, "link", "set", &veth, "master", "br0", "up"]);
            let addr = format!("10.77.0.{}/24", 10 + i);
            ip(&["-n", &ns, "addr", "add", &addr, "dev", "eth0"]);
            ip(&["-n", &ns, "link", "set", "eth0", "up"]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
        }
        net
    }

    fn ns(&self, host: usize) -> &str {
        &self.names[host + 1]
    }

    fn spawn(&mut self, host: usize, program: &Path, args: &[&str], log: &Path) {
        let child = Command::new("ip")
            .args(["netns", "exec", self.ns(host)])
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).expect("log file"))
            .spawn()
            .expect("spawning in a namespace");
        self.procs.push(child);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for p in &mut self.procs {
            let _ = p.kill();
            let _ = p.wait();
        }
        for n in self.names.iter().rev() {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

#[test]
fn srun_and_sbatch_across_network_namespaces() {
    if !is_root() {
        println!("SKIPPED (needs root): network namespaces");
        return;
    }
    let tag = format!("{}", std::process::id() % 10_000);
    let mut net = Net::new(&tag, 3);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let certs = dir.join("certs");
    tls::init_ca(&certs).unwrap();
    tls::issue(&certs, CTLD_NAME, Role::Controller).unwrap();
    for n in ["worker-0", "worker-1"] {
        tls::issue(&certs, n, Role::Agent).unwrap();
    }
    let conf = dir.join("corral.toml");
    std::fs::write(
        &conf,
        format!(
            "listen = \"10.77.0.10:6817\"\ncerts = \"{}\"\n[[partition]]\nname = \"gpu\"\nnodes = \"worker-[0-1]\"\ndefault = true\n",
            certs.display()
        ),
    )
    .unwrap();
    let bins = bin_dir();
    net.spawn(
        0,
        &bins.join("corral-ctld"),
        &["--config", conf.to_str().unwrap()],
        &dir.join("ctld.log"),
    );
    for (i, name) in ["worker-0", "worker-1"].iter().enumerate() {
        let sock = dir.join(format!("{name}.sock"));
        let spool = dir.join(format!("spool-{name}"));
        net.spawn(
            i + 1,
            &bins.join("corral-agent"),
            &[
                "--name",
                name,
                // Killed with the namespaces: nothing would remove the
                // cgroups it made.
                "--cgroups",
                "off",
                "--ctld",
                "10.77.0.10:6817",
                "--certs",
                certs.to_str().unwrap(),
                "--socket",
                sock.to_str().unwrap(),
                "--spool",
                spool.to_str().unwrap(),
                "--cpus",
                "4",
                "--mem",
                "4000",
                "--sim-gpus",
                "2",
            ],
            &dir.join(format!("{name}.log")),
        );
    }
    let work = dir.join("work");
    std::fs::create_dir(&work).unwrap();
    // Slurm's command names on PATH, as on a real login node.
    let path_dir = dir.join("bin");
    std::fs::create_dir(&path_dir).unwrap();
    for c in ["srun", "sbatch", "squeue"] {
        std::os::unix::fs::symlink(bins.join("corral"), path_dir.join(c)).unwrap();
    }
    let path = format!(
        "{}:{}",
        path_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let corral_env = |host: usize, args: &[&str], extra: &[(&str, &str)]| {
        let o = Command::new("ip")
            .args(["netns", "exec", net.ns(host)])
            .arg(bins.join("corral"))
            .args(args)
            .env("CORRAL_AGENT_SOCKET", dir.join("worker-0.sock"))
            .env("PATH", &path)
            .envs(extra.iter().copied())
            .current_dir(&work)
            .stdin(Stdio::null())
            .output()
            .expect("running corral");
        out(o)
    };
    let corral = |host: usize, args: &[&str]| corral_env(host, args, &[]);
    let t0 = Instant::now();
    loop {
        let (_, o, _) = corral(1, &["sinfo", "-h", "-t", "idle"]);
        if o.contains(" 2 ") {
            break;
        }
        let logs = std::fs::read_to_string(dir.join("worker-1.log")).unwrap_or_default();
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "nodes never idle: {o}\n{logs}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (code, o, e) = corral(
        1,
        &["srun", "-N2", "-l", "sh", "-c", "echo $SLURMD_NODENAME"],
    );
    assert_eq!(code, 0, "{e}");
    let mut lines: Vec<&str> = o.lines().collect();
    lines.sort();
    assert_eq!(lines, vec!["0: worker-0", "1: worker-1"], "{o}");
    // An address the other host cannot reach: srun gives up in one line
    // instead of waiting for ever.
    let (code, _, e) = corral_env(
        1,
        &["srun", "-N2", "true"],
        &[("CORRAL_SRUN_HOST", "127.0.0.1")],
    );
    assert_eq!(code, 1, "{e}");
    assert!(e.contains("connected back"), "{e}");
    // A 2-node batch job whose srun runs on the other host too.
    std::fs::write(
        work.join("job.sh"),
        "#!/bin/sh\nsrun -l hostname >/dev/null && srun -l sh -c 'echo $SLURMD_NODENAME'\n",
    )
    .unwrap();
    let (code, id, e) = corral(1, &["sbatch", "--parsable", "-N2", "job.sh"]);
    assert_eq!(code, 0, "{e}");
    let id = id.trim().to_string();
    let t0 = Instant::now();
    loop {
        let (_, st, _) = corral(1, &["squeue", "-h", "-t", "all", "-j", &id, "-o", "%T"]);
        if st.trim() == "COMPLETED" {
            break;
        }
        let outf =
            std::fs::read_to_string(work.join(format!("slurm-{id}.out"))).unwrap_or_default();
        assert!(
            st.trim() != "FAILED" && t0.elapsed() < Duration::from_secs(30),
            "job {id} is {st}: {outf}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut lines: Vec<String> = std::fs::read_to_string(work.join(format!("slurm-{id}.out")))
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    lines.sort();
    assert_eq!(lines, vec!["0: worker-0", "1: worker-1"]);
}
