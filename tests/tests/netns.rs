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
    /// `/etc/netns/<ns>` directories made for `ip netns exec` to bind
    /// over `/etc` (each host's own `/etc/hosts`).
    etc: Vec<std::path::PathBuf>,
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
            etc: Vec::new(),
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

    /// Gives every host the same `/etc/hosts` naming the hosts (what a
    /// cluster's DNS would do): `ip netns exec` binds it over `/etc/hosts`.
    fn hosts_file(&mut self, text: &str) {
        for ns in &self.names[1..] {
            let dir = Path::new("/etc/netns").join(ns);
            std::fs::create_dir_all(&dir).expect("/etc/netns dir");
            std::fs::write(dir.join("hosts"), text).expect("hosts file");
            self.etc.push(dir);
        }
    }

    /// Runs `program` in host `host`'s network namespace and a UTS
    /// namespace of its own, named `hostname`.
    fn spawn_named(
        &mut self,
        host: usize,
        hostname: &str,
        program: &Path,
        args: &[&str],
        log: &Path,
    ) {
        let child = Command::new("ip")
            .args(["netns", "exec", self.ns(host)])
            .args([
                "unshare",
                "--uts",
                "sh",
                "-c",
                "hostname \"$0\" && exec \"$@\"",
            ])
            .arg(hostname)
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).expect("log file"))
            .spawn()
            .expect("spawning in a namespace");
        self.procs.push(child);
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
        for d in &self.etc {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// A cluster across namespaces: ctld on host 0, worker-0 and worker-1
/// on hosts 1 and 2 (each with its own host name), and a login shell's
/// environment on host 1.
struct Hosts {
    net: Net,
    tmp: tempfile::TempDir,
    path: String,
    /// Where jobs are submitted from (and write their output).
    work: std::path::PathBuf,
}

/// `agent_extra`: the agents' extra flags (a jail to run every task in);
/// `work`: the submission directory (default: a new one).
fn start(tag_salt: usize, agent_extra: &[String], work: Option<&Path>) -> Hosts {
    let tag = format!("{}", (std::process::id() as usize * 2 + tag_salt) % 10_000);
    let mut net = Net::new(&tag, 3);
    net.hosts_file(
        "127.0.0.1 localhost\n10.77.0.10 ctld\n10.77.0.11 worker-0\n10.77.0.12 worker-1\n",
    );
    let tmp = tempfile::tempdir().expect("test setup");
    let dir = tmp.path();
    let certs = dir.join("certs");
    tls::init_ca(&certs).expect("test setup");
    tls::issue(&certs, CTLD_NAME, Role::Controller).expect("test setup");
    for n in ["worker-0", "worker-1"] {
        tls::issue(&certs, n, Role::Agent).expect("test setup");
    }
    let conf = dir.join("corral.toml");
    std::fs::write(
        &conf,
        format!(
            "listen = \"10.77.0.10:6817\"\ncerts = \"{}\"\n[[partition]]\nname = \"gpu\"\nnodes = \"worker-[0-1]\"\ndefault = true\n",
            certs.display()
        ),
    )
    .expect("config");
    let bins = bin_dir();
    net.spawn(
        0,
        &bins.join("corral-ctld"),
        &["--config", conf.to_str().expect("test setup")],
        &dir.join("ctld.log"),
    );
    for (i, name) in ["worker-0", "worker-1"].iter().enumerate() {
        let sock = dir.join(format!("{name}.sock"));
        let spool = dir.join(format!("spool-{name}"));
        let mut args: Vec<String> = [
            "--name",
            name,
            // Killed with the namespaces: nothing would remove the
            // cgroups it made.
            "--cgroups",
            "off",
            "--ctld",
            "10.77.0.10:6817",
            "--certs",
            certs.to_str().expect("test setup"),
            "--socket",
            sock.to_str().expect("test setup"),
            "--spool",
            spool.to_str().expect("test setup"),
            "--cpus",
            "4",
            "--mem",
            "4000",
            "--sim-gpus",
            "2",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        args.extend(agent_extra.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        net.spawn_named(
            i + 1,
            name,
            &bins.join("corral-agent"),
            &args,
            &dir.join(format!("{name}.log")),
        );
    }
    let work = work.map_or_else(|| dir.join("work"), Path::to_path_buf);
    std::fs::create_dir_all(&work).expect("test setup");
    // Slurm's command names on PATH, as on a real login node.
    let path_dir = dir.join("bin");
    std::fs::create_dir(&path_dir).expect("test setup");
    for c in ["srun", "sbatch", "squeue", "scontrol"] {
        std::os::unix::fs::symlink(bins.join("corral"), path_dir.join(c)).expect("test setup");
    }
    let path = format!(
        "{}:{}",
        path_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let hosts = Hosts {
        net,
        tmp,
        path,
        work,
    };
    let t0 = Instant::now();
    loop {
        let (_, o, _) = hosts.corral(1, &["sinfo", "-h", "-t", "idle"], &[]);
        if o.contains(" 2 ") {
            break;
        }
        let logs = std::fs::read_to_string(hosts.dir().join("worker-1.log")).unwrap_or_default();
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "nodes never idle: {o}\n{logs}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    hosts
}

impl Hosts {
    fn dir(&self) -> &Path {
        self.tmp.path()
    }

    fn work(&self) -> std::path::PathBuf {
        self.work.clone()
    }

    /// A command on host `host`, through worker-0's agent socket.
    fn corral(&self, host: usize, args: &[&str], extra: &[(&str, &str)]) -> (i32, String, String) {
        let o = Command::new("ip")
            .args(["netns", "exec", self.net.ns(host)])
            .arg(bin_dir().join("corral"))
            .args(args)
            .env("CORRAL_AGENT_SOCKET", self.dir().join("worker-0.sock"))
            .env("PATH", &self.path)
            .envs(extra.iter().copied())
            .current_dir(self.work())
            .stdin(Stdio::null())
            .output()
            .expect("running corral");
        out(o)
    }

    /// Submits a batch script and waits for it to complete; returns its
    /// output, sorted by line.
    fn batch(&self, args: &[&str], script: &str) -> Vec<String> {
        std::fs::write(self.work().join("job.sh"), script).expect("test setup");
        let mut all = vec!["sbatch", "--parsable"];
        all.extend_from_slice(args);
        all.push("job.sh");
        let (code, id, e) = self.corral(1, &all, &[]);
        assert_eq!(code, 0, "{e}");
        let id = id.trim().to_string();
        let outf = self.work().join(format!("slurm-{id}.out"));
        let t0 = Instant::now();
        loop {
            let (_, st, _) = self.corral(
                1,
                &["squeue", "-h", "-t", "all", "-j", &id, "-o", "%T"],
                &[],
            );
            if st.trim() == "COMPLETED" {
                break;
            }
            if st.trim() == "FAILED" || t0.elapsed() > Duration::from_secs(30) {
                let text = std::fs::read_to_string(&outf).unwrap_or_default();
                let (_, job, _) = self.corral(1, &["scontrol", "show", "job", &id], &[]);
                let logs: String = ["ctld", "worker-0", "worker-1"]
                    .iter()
                    .map(|n| {
                        std::fs::read_to_string(self.dir().join(format!("{n}.log")))
                            .unwrap_or_default()
                    })
                    .collect();
                panic!("job {id} is {st}: {text}\n{job}\n{logs}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut lines: Vec<String> = std::fs::read_to_string(&outf)
            .expect("the job's output")
            .lines()
            .map(String::from)
            .collect();
        lines.sort();
        lines
    }
}

#[test]
fn srun_and_sbatch_across_network_namespaces() {
    if !is_root() {
        println!("SKIPPED (needs root): network namespaces");
        return;
    }
    let hosts = start(0, &[], None);
    let (code, o, e) = hosts.corral(
        1,
        &[
            "srun",
            "-N2",
            "-l",
            "sh",
            "-c",
            "echo $SLURMD_NODENAME $(hostname)",
        ],
        &[],
    );
    assert_eq!(code, 0, "{e}");
    let mut lines: Vec<&str> = o.lines().collect();
    lines.sort();
    // Each host has its own host name (a UTS namespace of its own).
    assert_eq!(
        lines,
        vec!["0: worker-0 worker-0", "1: worker-1 worker-1"],
        "{o}"
    );
    // An address the other host cannot reach: srun gives up in one line
    // instead of waiting for ever.
    let (code, _, e) = hosts.corral(
        1,
        &["srun", "-N2", "true"],
        &[("CORRAL_SRUN_HOST", "127.0.0.1")],
    );
    assert_eq!(code, 1, "{e}");
    assert!(e.contains("connected back"), "{e}");
    // A 2-node batch job whose srun runs on the other host too.
    let lines = hosts.batch(
        &["-N2"],
        "#!/bin/sh\nsrun -l hostname >/dev/null && srun -l sh -c 'echo $SLURMD_NODENAME'\n",
    );
    assert_eq!(lines, vec!["0: worker-0", "1: worker-1"]);
    // A launcher as torchrun's wrappers write one: the rendezvous address
    // from the first node of the job, ranks and counts from SLURM_*, and
    // every rank meets rank 0 over TCP across the hosts; each task's
    // SLURM_TASK_PID is its own pid.
    std::fs::write(hosts.work().join("rdzv.pl"), RENDEZVOUS).expect("test setup");
    let lines = hosts.batch(
        &["-N2", "--ntasks-per-node=2"],
        "#!/bin/sh\n\
         export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\n\
         export MASTER_PORT=$((20000 + SLURM_JOB_ID % 10000))\n\
         srun sh -c 'WORLD_SIZE=$SLURM_NTASKS RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID \\\n\
           NODE_RANK=$SLURM_NODEID exec perl rdzv.pl'\n",
    );
    assert_eq!(
        lines,
        vec![
            "rank 0 local 0 node 0 on worker-0 pid-ok",
            "rank 1 heard go 4",
            "rank 1 local 1 node 0 on worker-0 pid-ok",
            "rank 2 heard go 4",
            "rank 2 local 0 node 1 on worker-1 pid-ok",
            "rank 3 heard go 4",
            "rank 3 local 1 node 1 on worker-1 pid-ok",
        ]
    );
}

/// Every rank tells rank 0 who it is; rank 0 prints them all and answers
/// each with the world's size (a rendezvous, as torch.distributed's).
const RENDEZVOUS: &str = r#"use strict; use IO::Socket::INET;
my ($rank, $local, $node, $world) = @ENV{qw(RANK LOCAL_RANK NODE_RANK WORLD_SIZE)};
my $pid = ($ENV{SLURM_TASK_PID} // '') eq $$ ? 'pid-ok' : 'pid-bad';
chomp(my $host = `hostname`);
my $me = "rank $rank local $local node $node on $host $pid";
my ($addr, $port) = ($ENV{MASTER_ADDR}, $ENV{MASTER_PORT});
if ($rank == 0) {
    my $s = IO::Socket::INET->new(LocalAddr => $addr, LocalPort => $port, Listen => 8, ReuseAddr => 1)
        or die "listen: $!";
    my (@peers, @seen);
    push @seen, $me;
    for (2 .. $world) {
        my $c = $s->accept or die "accept: $!";
        my $l = <$c>;
        chomp $l;
        push @seen, $l;
        push @peers, $c;
    }
    print "$_\n" for sort @seen;
    print {$_} "go $world\n" for @peers;
} else {
    my $c;
    for (1 .. 100) {
        $c = IO::Socket::INET->new(PeerAddr => $addr, PeerPort => $port) and last;
        select(undef, undef, undef, 0.1);
    }
    $c or die "connect: $!";
    print $c "$me\n";
    my $go = <$c>;
    print "rank $rank heard $go";
}
"#;

#[test]
fn a_two_node_job_in_the_shared_root_talks_over_tcp_by_node_name() {
    if !is_root() {
        println!("SKIPPED (needs root): network namespaces and a jail");
        return;
    }
    // The shared root: a tiny one borrowing the host's /usr, with name
    // lookup in files (the host's /etc/hosts is bound in per node).
    let root = tempfile::tempdir().unwrap();
    shared_root::scaffold::host_usr(root.path(), "corral-netns").unwrap();
    std::fs::write(root.path().join("etc/nsswitch.conf"), "hosts: files\n").unwrap();
    let jail_bin = root.path().with_extension("bin");
    corral_ctl::cli::up::jail_bin(&bin_dir().join("corral"), &jail_bin).unwrap();
    // The submission directory is shared storage, at the same path in the
    // jail on every node (not under /tmp: each task has its own /tmp).
    let work = tempfile::tempdir_in("/var/tmp").unwrap();
    let inside = root.path().join(work.path().strip_prefix("/").unwrap());
    std::fs::create_dir_all(&inside).unwrap();
    let share = format!("{0}:{0}", work.path().display());
    let extra: Vec<String> = [
        "--jail",
        root.path().to_str().unwrap(),
        "--jail-bin",
        jail_bin.to_str().unwrap(),
        "--jail-submount",
        "/usr:/usr:ro",
        "--jail-submount",
        &share,
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let hosts = start(1, &extra, Some(work.path()));
    // Task 0 listens on the job's first node; task 1 finds that node by
    // name from SLURM_JOB_NODELIST and says hello over TCP.
    let script = r#"#!/bin/sh
srun -l sh -c '
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
if [ "$SLURM_PROCID" = 0 ]; then
  perl -MIO::Socket::INET -e "\$s = IO::Socket::INET->new(LocalPort => 7777, Listen => 1, ReuseAddr => 1) or die; \$c = \$s->accept; print qq(heard: ), scalar <\$c>;"
else
  for i in 1 2 3 4 5 6 7 8 9 10; do
    perl -MIO::Socket::INET -e "\$c = IO::Socket::INET->new(PeerAddr => shift, PeerPort => 7777) or exit 1; print \$c qq(hello from ), qx(hostname);" "$first" && break
    sleep 0.3
  done
  cat /etc/os-release
fi
'
"#;
    let lines = hosts.batch(&["-N2"], script);
    assert_eq!(
        lines,
        vec!["0: heard: hello from worker-1", "1: ID=corral-netns"],
        "the jail's root, and a message across hosts by node name"
    );
    let _ = std::fs::remove_dir_all(&jail_bin);
}
