//! Who may talk to the cluster and as whom: mutual TLS, credentials,
//! per-user permissions, hostile frames.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use corral_e2e::{is_root, out, runtime, Env, Opts};
use corral_proto::cred::{Minter, DEFAULT_TTL_MS};
use corral_proto::msg::{CtldMsg, Ident, JobFilter, Open, Registration, Request, Response};
use corral_proto::tls::{self, CertFiles, Identity, Role, CTLD_NAME};
use corral_proto::{now_ms, read_frame, write_frame};

async fn connect(addr: SocketAddr, files: &CertFiles) -> Result<quinn::Connection, String> {
    let id = Identity::load(files).map_err(|e| e.to_string())?;
    let mut ep = tls::client_endpoint(addr).map_err(|e| e.to_string())?;
    ep.set_default_client_config(tls::client_config(&id).map_err(|e| e.to_string())?);
    let conn = ep.connect(addr, CTLD_NAME).map_err(|e| e.to_string())?;
    let conn = tokio::time::timeout(Duration::from_secs(5), conn)
        .await
        .map_err(|_| "timeout".to_string())?
        .map_err(|e| e.to_string())?;
    // The handshake completes for the client before the server has checked
    // its certificate; a refused client learns on its first exchange.
    Ok(conn)
}

async fn ask(conn: &quinn::Connection, open: &Open) -> Result<Response, String> {
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
    write_frame(&mut send, open)
        .await
        .map_err(|e| e.to_string())?;
    let _ = send.finish();
    corral_proto::msg::read_response(&mut recv)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| "closed".into())
}

async fn raw(conn: &quinn::Connection, bytes: &[u8]) -> Option<Response> {
    let (mut send, mut recv) = conn.open_bi().await.ok()?;
    let _ = tokio::io::AsyncWriteExt::write_all(&mut send, bytes).await;
    let _ = send.finish();
    tokio::time::timeout(
        Duration::from_secs(5),
        corral_proto::msg::read_response(&mut recv),
    )
    .await
    .ok()?
    .ok()?
}

fn jobs() -> Request {
    Request::Jobs(JobFilter::default())
}

#[test]
fn a_foreign_ca_or_a_borrowed_name_is_refused() {
    let env = Env::start(Opts {
        nodes: 1,
        ..Opts::default()
    });
    let addr = env.cluster.addr;
    let foreign = tempfile::tempdir().unwrap();
    tls::init_ca(foreign.path()).unwrap();
    tls::issue(foreign.path(), "worker-5", Role::Agent).unwrap();
    // A raw client with a foreign certificate gets nothing answered.
    let rt = runtime();
    let files = CertFiles::in_dir(foreign.path(), "worker-5");
    let refused = rt.block_on(async {
        match connect(addr, &files).await {
            Err(_) => true,
            Ok(conn) => ask(
                &conn,
                &Open::Request {
                    token: Minter::generate("worker-5", DEFAULT_TTL_MS)
                        .unwrap()
                        .0
                        .mint(Ident { uid: 0, gid: 0 }, now_ms())
                        .unwrap(),
                    request: jobs(),
                },
            )
            .await
            .is_err(),
        }
    });
    assert!(
        refused,
        "a client with a foreign CA's certificate was served"
    );
    // A real agent with a foreign certificate never becomes a node.
    let agent = std::process::Command::new(corral_e2e::bin_dir().join("corral-agent"))
        .args(["--name", "worker-5", "--ctld", &addr.to_string()])
        .args(["--cgroups", "off"])
        .arg("--certs")
        .arg(foreign.path())
        .arg("--socket")
        .arg(foreign.path().join("a.sock"))
        .arg("--spool")
        .arg(foreign.path().join("spool"))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let mut agent = agent;
    let _ = agent.kill();
    let _ = agent.wait();
    assert!(!env.ok(&["sinfo", "-N"]).contains("worker-5"));
    // A cluster certificate for one name cannot register another.
    let certs = env.cluster.spec.dir.join("certs");
    tls::issue(&certs, "worker-6", Role::Agent).unwrap();
    let borrowed = tempfile::tempdir().unwrap();
    std::fs::copy(certs.join("ca.pem"), borrowed.path().join("ca.pem")).unwrap();
    std::fs::copy(
        certs.join("worker-6.pem"),
        borrowed.path().join("worker-8.pem"),
    )
    .unwrap();
    std::fs::copy(
        certs.join("worker-6.key"),
        borrowed.path().join("worker-8.key"),
    )
    .unwrap();
    let o = std::process::Command::new(corral_e2e::bin_dir().join("corral-agent"))
        .args(["--name", "worker-8", "--ctld", &addr.to_string()])
        .args(["--cgroups", "off"])
        .arg("--certs")
        .arg(borrowed.path())
        .arg("--socket")
        .arg(borrowed.path().join("a.sock"))
        .arg("--spool")
        .arg(borrowed.path().join("spool"))
        .output()
        .unwrap();
    let (code, _, err) = out(o);
    assert_ne!(code, 0);
    assert!(
        err.contains("refused registration") && err.contains("worker-8"),
        "{err}"
    );
    assert!(!env.ok(&["sinfo", "-N"]).contains("worker-8"));
}

#[test]
fn forged_expired_and_replayed_credentials_are_refused() {
    let env = Env::start(Opts {
        nodes: 1,
        ..Opts::default()
    });
    let certs = env.cluster.spec.dir.join("certs");
    let files = tls::issue(&certs, "worker-7", Role::Agent).unwrap();
    let addr = env.cluster.addr;
    runtime().block_on(async move {
        let conn = connect(addr, &files).await.unwrap();
        // Register as an agent, with a key of our own.
        let (minter, key) = Minter::generate("worker-7", DEFAULT_TTL_MS).unwrap();
        let reg = Registration {
            name: "worker-7".into(),
            cpus: 1,
            memory_mb: 100,
            gpus: vec![],
            features: vec![],
            credential_key: key,
            running: vec![],
            launched: Vec::new(),
            forgot_ended_before: 0,
            instance: 1,
            agent_version: "test".into(),
            os: String::new(),
        };
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        write_frame(&mut send, &Open::Control(reg)).await.unwrap();
        let welcome = read_frame::<_, CtldMsg>(&mut recv).await.unwrap();
        assert!(
            matches!(welcome, Some(CtldMsg::Welcome { .. })),
            "{welcome:?}"
        );
        let me = Ident {
            uid: 4242,
            gid: 4242,
        };
        let good = minter.mint(me, now_ms()).unwrap();
        let r = ask(
            &conn,
            &Open::Request {
                token: good.clone(),
                request: jobs(),
            },
        )
        .await
        .unwrap();
        assert!(matches!(r, Response::Jobs(_)), "{r:?}");
        let refused = |r: Response, what: &str| match r {
            Response::Error(e) => assert!(e.contains(what), "{e}"),
            other => panic!("accepted: {other:?}"),
        };
        refused(
            ask(
                &conn,
                &Open::Request {
                    token: good,
                    request: jobs(),
                },
            )
            .await
            .unwrap(),
            "replayed",
        );
        let old = minter.mint(me, now_ms() - 10 * DEFAULT_TTL_MS).unwrap();
        refused(
            ask(
                &conn,
                &Open::Request {
                    token: old,
                    request: jobs(),
                },
            )
            .await
            .unwrap(),
            "expired",
        );
        let mut forged = minter.mint(me, now_ms()).unwrap();
        forged.claims.uid = 0;
        refused(
            ask(
                &conn,
                &Open::Request {
                    token: forged,
                    request: jobs(),
                },
            )
            .await
            .unwrap(),
            "does not verify",
        );
        let (stranger, _) = Minter::generate("worker-9", DEFAULT_TTL_MS).unwrap();
        let t = stranger.mint(me, now_ms()).unwrap();
        refused(
            ask(
                &conn,
                &Open::Request {
                    token: t,
                    request: jobs(),
                },
            )
            .await
            .unwrap(),
            "unregistered",
        );
        drop(send);
    });
    // The real cluster still serves.
    env.ok(&["squeue"]);
}

#[test]
fn users_cancel_only_their_own_jobs() {
    if !is_root() {
        println!("SKIPPED (needs root): submitting as other uids");
        return;
    }
    let env = Env::start(Opts {
        nodes: 1,
        ..Opts::default()
    });
    let as_user = |uid: u32, args: &[&str]| out(env.cmd_as(uid, args).output().unwrap());
    let (code, o, e) = as_user(23_456, &["sbatch", "--parsable", "-H", "--wrap", "id -u"]);
    assert_eq!(code, 0, "{e}");
    let id = o.trim().to_string();
    let q = env.ok(&["squeue", "-h", "-j", &id, "-o", "%u"]);
    assert_eq!(q.trim(), "23456", "the job belongs to the submitting uid");
    let (code, _, e) = as_user(23_457, &["scancel", &id]);
    assert_eq!(code, 210, "Slurm's exit status for access denied");
    assert!(e.contains("Access/permission denied"), "{e}");
    let (code, _, e) = as_user(23_457, &["scontrol", "release", &id]);
    assert_eq!(code, 1, "{e}");
    let (code, _, e) = as_user(
        23_457,
        &[
            "scontrol",
            "update",
            "NodeName=worker-0",
            "State=DRAIN",
            "Reason=x",
        ],
    );
    assert_eq!(code, 1, "{e}");
    // Its owner releases it; it runs as that uid.
    let (code, _, e) = as_user(23_456, &["scontrol", "release", &id]);
    assert_eq!(code, 0, "{e}");
    env.wait_state(id.parse().unwrap(), &["COMPLETED"], 20);
    assert_eq!(env.read(&format!("slurm-{id}.out")), "23456\n");
    let id2 = as_user(23_456, &["sbatch", "--parsable", "--wrap", "sleep 300"])
        .1
        .trim()
        .to_string();
    let (code, _, e) = as_user(23_456, &["scancel", &id2]);
    assert_eq!(code, 0, "{e}");
    env.wait_state(id2.parse().unwrap(), &["CANCELLED"], 20);
}

#[test]
fn garbage_frames_do_not_stop_the_controller() {
    let env = Env::start(Opts {
        nodes: 1,
        ..Opts::default()
    });
    let certs = env.cluster.spec.dir.join("certs");
    let files = tls::issue(&certs, "prober", Role::Agent).unwrap();
    let addr = env.cluster.addr;
    runtime().block_on(async move {
        // Raw UDP noise at the QUIC port.
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for i in 0..50u8 {
            let _ = udp.send_to(&[i; 1200], addr);
        }
        let conn = Arc::new(connect(addr, &files).await.unwrap());
        let mut oversized = u32::MAX.to_be_bytes().to_vec();
        oversized.extend([0, 1]);
        let mut other_version = 6u32.to_be_bytes().to_vec();
        other_version.extend([0xff, 0xff, 1, 2, 3, 4]);
        let mut truncated = 100u32.to_be_bytes().to_vec();
        truncated.extend([0, 1, 2, 3]);
        let garbage: Vec<u8> = (0..255u8).map(|b| b.wrapping_mul(37)).collect();
        for (what, bytes) in [
            ("oversized", oversized),
            ("version", other_version),
            ("truncated", truncated),
            ("garbage", garbage),
            ("empty", vec![]),
        ] {
            let r = raw(&conn, &bytes).await;
            match r {
                Some(Response::Error(e)) => assert!(e.starts_with("bad frame"), "{what}: {e}"),
                None => {}
                Some(other) => panic!("{what}: answered {other:?}"),
            }
        }
        // The same connection still works for a well-formed (if
        // unauthenticated) request: refused for its credential only.
        let (m, _) = Minter::generate("prober", DEFAULT_TTL_MS).unwrap();
        let token = m.mint(Ident { uid: 0, gid: 0 }, now_ms()).unwrap();
        let r = ask(
            &conn,
            &Open::Request {
                token,
                request: jobs(),
            },
        )
        .await
        .unwrap();
        assert!(
            matches!(r, Response::Error(ref e) if e.contains("credential")),
            "{r:?}"
        );
    });
    // Normal clients are served throughout.
    env.ok(&["squeue"]);
    let id = env
        .ok(&["sbatch", "--parsable", "--wrap", "true"])
        .trim()
        .parse()
        .unwrap();
    env.wait_state(id, &["COMPLETED"], 20);
}

#[test]
fn sacct_shows_users_only_their_own_jobs() {
    if !is_root() {
        println!("SKIPPED (needs root): submitting as other uids");
        return;
    }
    let env = Env::start(Opts {
        nodes: 1,
        durable: true,
        ..Opts::default()
    });
    let as_user = |uid: u32, args: &[&str]| out(env.cmd_as(uid, args).output().unwrap());
    let mut ids = Vec::new();
    for uid in [23_466, 23_467] {
        let (code, o, e) = as_user(uid, &["sbatch", "--parsable", "--wrap", "true"]);
        assert_eq!(code, 0, "{e}");
        ids.push(o.trim().to_string());
    }
    for id in &ids {
        env.wait_state(id.parse().unwrap(), &["COMPLETED"], 30);
    }
    let list = |uid: u32, extra: &[&str]| {
        let mut args = vec!["sacct", "-X", "-n", "-P", "-o", "JobID,UID"];
        args.extend_from_slice(extra);
        let (code, o, e) = as_user(uid, &args);
        assert_eq!(code, 0, "{e}");
        o.lines().map(str::to_string).collect::<Vec<_>>()
    };
    let mine = vec![format!("{}|23466", ids[0])];
    assert_eq!(list(23_466, &[]), mine);
    // Asking for everyone's still shows only one's own; for another
    // user's, or for another's job, nothing (as Slurm's private data).
    assert_eq!(list(23_466, &["--allusers"]), mine);
    assert!(list(23_466, &["-u", "23467"]).is_empty());
    assert_eq!(list(23_466, &["-u", "23467,23466"]), mine);
    assert!(list(23_466, &["-j", &ids[1]]).is_empty());
    // Root sees both.
    let all = env.ok(&["sacct", "-X", "-n", "-P", "-o", "JobID,UID"]);
    assert_eq!(all.lines().count(), 2, "{all}");
}
